"""tools/device_peers.py (the device check's comparison with spconv 2.3.8 and spconv-Triton) end to end on the
CPU in its dry mode: the same case code as on a GPU, ours timed on tiny inputs, the peers null; the JSON the
device check writes and the table it prints last."""
import json
import os
import re
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import device_peers  # noqa: E402

REQUIRED = ["subm_map_50k", "subm_map_1m", "strided_map_50k", "maxpool_28k", "subm_cached_212", "basic_fp16_fwd",
            "basic_fp16_fwdbwd", "backbone8x_amp_train_step", "subm_c256_fp16_fwd", "subm_c256_fp16_bwd",
            "subm_c128_fp16_fwd", "subm_c64_fp16_fwd"]


def test_dry_run_writes_the_schema(tmp_path):
    out = tmp_path / "peers.json"
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, os.path.join("tools", "device_peers.py"), "--device", "cpu", "--dry-run",
                        "--json", str(out), "--peers", str(tmp_path / "no-peers")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    d = json.loads(out.read_text())
    assert {"gpu", "commit", "cases"} <= set(d)
    assert d["gpu"] == "cpu"
    assert d["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", d["commit"])
    assert [c["name"] for c in d["cases"]] == REQUIRED
    for c in d["cases"]:
        assert set(c) == {"name", "ours_ms", "spconv238_ms", "spconv_triton_ms", "ours_sm80_ms"}, c
        assert isinstance(c["ours_ms"], float) and c["ours_ms"] > 0, (c, d.get("notes"))
        assert c["spconv238_ms"] is None and c["spconv_triton_ms"] is None and c["ours_sm80_ms"] is None
    # The table comes last: a header, then one row per case in order, with nulls for the peers.
    lines = r.stdout.strip().splitlines()
    rows = lines[-len(REQUIRED):]
    assert [ln.split()[0] for ln in rows] == REQUIRED
    assert all("null" in ln for ln in rows)
    assert "ours" in lines[-len(REQUIRED) - 1] and "spconv238" in lines[-len(REQUIRED) - 1]


def test_inputs_pool_replicate_and_round_trip(tmp_path):
    shape = [40, 64, 64]
    idx = device_peers.random_scan(4000, shape, seed=3)
    assert len(np.unique(idx, axis=0)) == len(idx) == 4000
    # Two 2x2 pools: every output is the floor-half of an input twice, inside the pooled grid.
    p, pshape = device_peers.pooled(idx, shape, 2)
    assert pshape == [(((s - 2) // 2 + 1) - 2) // 2 + 1 for s in shape]
    assert len(np.unique(p, axis=0)) == len(p) and (p[:, 1:] < pshape).all()
    expect = {tuple(c) for c in idx[:, 1:] // 4 if (c // 4 < pshape).all()}
    assert {tuple(c) for c in p[:, 1:]} == expect
    # bench_large's replication: copies shifted along y, the grid grown to hold them.
    big, bshape = device_peers.replicate(idx, shape, 4, 70)
    assert bshape == [40, 64 + 3 * 70, 64] and len(big) == 4 * len(idx)
    assert (big[:, 1:] < bshape).all()
    near = device_peers.nearest(idx, 100)
    assert len(near) == 100
    inputs = {"a": (p, pshape), "b": (big, bshape)}
    path = str(tmp_path / "in.npz")
    device_peers.save_inputs(inputs, path)
    back = device_peers.read_inputs(path)
    assert back.keys() == inputs.keys()
    for k in inputs:
        assert np.array_equal(back[k][0], inputs[k][0]) and back[k][1] == inputs[k][1]
