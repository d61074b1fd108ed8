"""Tests of ``python -m spconv.benchmark``: workload generators, FLOP counting, report formatting, the compare
plumbing, and one end-to-end ``--quick`` run whose correctness lines must pass. Speed is never asserted here."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import spconv
import spconv.pytorch
from support.reference import random_sparse
from spconv.benchmark import baseline, compare, network, reference, report, scenes
from spconv.benchmark.cli import note_parallel_regions, parse_args, pick_dtypes, pick_workloads
from spconv.benchmark.flops import ConvLayer, conv_flops, layer_flops, total_flops
from spconv.benchmark.results import Check, Measurement, Record
from spconv.benchmark.timing import Plan, Stats, time_fn
from spconv.benchmark.workloads.indices import reference_pairs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- scenes: the synthetic LiDAR scan

@pytest.fixture(scope="module")
def default_scan():
    return scenes.synthetic_scan()


def test_default_scan_is_bench_basic_sized(default_scan):
    f, idx, shape = default_scan
    assert shape == [80, 1600, 1600]
    assert 100_000 <= len(idx) <= 150_000  # "about 125k voxels", like spconv's bench_basic input
    assert f.dtype == np.float32 and f.shape == (len(idx), 3)
    assert idx.dtype == np.int32 and idx.shape == (len(idx), 4)
    assert (idx[:, 0] == 0).all()
    assert (idx[:, 1:] >= 0).all() and (idx[:, 1:] < np.array(shape)).all()
    keys = (idx[:, 1].astype(np.int64) * 1600 + idx[:, 2]) * 1600 + idx[:, 3]
    assert np.unique(keys).size == len(keys)  # no duplicate voxels


def test_default_scan_looks_like_a_sweep(default_scan):
    f, idx, _ = default_scan
    r = np.linalg.norm(f[:, :2], axis=1)
    ground = f[:, 2] < -1.5  # the ground plane sits 1.73 m below the sensor
    assert 0.1 < ground.mean() < 0.6
    assert (f[:, 2] > 0.5).mean() > 0.1  # vertical structure: walls, cars, poles
    assert r.max() > 40 and np.median(r) < 30  # dense near the sensor, sparse far away
    # features are the mean point of each voxel, so they lie inside the voxel
    lo = np.array([-80.0, -80.0, -2.0]) + idx[:, [3, 2, 1]] * 0.1
    assert ((f >= lo - 1e-4) & (f <= lo + 0.1 + 1e-4)).all()


def test_scan_is_reproducible_and_seeded():
    a = scenes.scan_points(scenes.QUICK_SCANNER, seed=3)
    b = scenes.scan_points(scenes.QUICK_SCANNER, seed=3)
    c = scenes.scan_points(scenes.QUICK_SCANNER, seed=4)
    np.testing.assert_array_equal(a, b)
    assert a.shape != c.shape or not np.array_equal(a, c)


def test_quick_scan_is_smaller_and_survives_six_poolings():
    f, idx, shape = scenes.synthetic_scan(quick=True)
    assert shape == [64, 400, 400] and min(shape) >= 2 ** 6
    assert 3_000 <= len(idx) <= 40_000


def test_voxelize_means_points_and_drops_outside():
    grid = scenes.Grid(coors_range=(0.0, 0.0, 0.0, 2.0, 2.0, 2.0), vsize=(1.0, 1.0, 1.0))
    pts = np.array([[0.2, 0.2, 0.2], [0.4, 0.6, 0.8], [1.5, 0.5, 1.5], [5.0, 0.0, 0.0]], np.float32)
    f, idx, shape = scenes.voxelize(pts, grid)
    assert shape == [2, 2, 2]
    np.testing.assert_array_equal(idx, [[0, 0, 0, 0], [0, 1, 0, 1]])  # (batch, z, y, x), sorted
    np.testing.assert_allclose(f, [[0.3, 0.4, 0.5], [1.5, 0.5, 1.5]], rtol=1e-6)


def test_replicate_sweep_shifts_copies_along_y():
    pts = np.array([[1.0, 2.0, 3.0]], np.float32)
    rep = scenes.replicate_sweep(pts, copies=3, shift_m=1.0)
    np.testing.assert_array_equal(rep[:, 1], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(pts, [[1.0, 2.0, 3.0]])  # the input is left alone


def test_crop_reindexes_to_the_window():
    idx = np.array([[0, 5, 5, 5], [0, 6, 7, 8], [0, 20, 5, 5]], np.int32)
    f = np.arange(6, dtype=np.float32).reshape(3, 2)
    cf, ci, shape = scenes.crop(f, idx, origin=(4, 4, 4), size=(8, 8, 8))
    assert shape == [8, 8, 8]
    np.testing.assert_array_equal(ci, [[0, 1, 1, 1], [0, 2, 3, 4]])
    np.testing.assert_array_equal(cf, f[:2])
    origin = scenes.crop_window(idx, (4, 4, 4))
    assert len(scenes.crop(f, idx, origin, (4, 4, 4))[1]) >= 1


def test_lidar_voxels_returns_the_requested_count():
    f, idx, shape = scenes.lidar_voxels(5_000, quick=True)
    assert len(idx) == len(f) == 5_000
    assert shape == [64, 400, 400]


def test_load_voxels_npz_roundtrip_and_errors(tmp_path):
    path = str(tmp_path / "scan.npz")
    idx = np.array([[0, 1, 2, 3]], np.int32)
    np.savez(path, features=np.ones((1, 3), np.float32), indices=idx, spatial_shape=np.array([4, 4, 4]))
    f, i, s = scenes.load_voxels_npz(path)
    assert s == [4, 4, 4] and i.dtype == np.int32 and f.shape == (1, 3)
    bad = str(tmp_path / "bad.npz")
    np.savez(bad, features=np.ones((1, 3), np.float32))
    with pytest.raises(ValueError, match="missing arrays"):
        scenes.load_voxels_npz(bad)
    with pytest.raises(ValueError, match="'pc'"):
        scenes.load_points_npz(bad)


# ---------------------------------------------------------------- network and FLOPs

def test_basic_network_is_bench_basic():
    specs = network.basic_layer_specs(3)
    subm = [s for s in specs if s[0] == "subm"]
    assert len(subm) == 14 and sum(s[0] == "pool" for s in specs) == 6
    assert [(s[1], s[2]) for s in subm][:3] == [(3, 64), (64, 64), (64, 96)]
    assert subm[-1][1:3] == (256, 256) and specs[-1][0] == "subm"  # no pool after the last pair
    assert subm[0][3] == subm[1][3] != subm[2][3]  # pairs share an indice_key
    import spconv.pytorch as sp
    net = network.build_basic_net(sp)
    assert sum(isinstance(m, sp.SubMConv3d) for m in net.children()) == 14
    assert all(m.bias is None for m in net.children() if isinstance(m, sp.SubMConv3d))


def test_flop_counting():
    assert conv_flops(10, 3, 4) == 240
    layer = ConvLayer("l", cin=8, cout=16, pairs=100, n_in=50, n_out=50)
    fwd = 2 * 100 * 8 * 16
    assert layer_flops(layer, "forward") == fwd
    assert layer_flops(layer, "backward") == 2 * fwd  # dW and dX
    assert layer_flops(layer, "forward_backward") == 3 * fwd
    first = ConvLayer("l0", 3, 16, 100, 50, 50, input_grad=False)  # network input: no dX
    assert layer_flops(first, "backward") == 2 * 100 * 3 * 16
    assert total_flops([layer, first], "forward") == fwd + 2 * 100 * 3 * 16
    with pytest.raises(ValueError):
        layer_flops(layer, "sideways")


def test_mm_yardstick_does_the_same_flops():
    layer = ConvLayer("l", cin=8, cout=16, pairs=100, n_in=50, n_out=50)
    for pass_name in ("forward", "backward", "forward_backward"):
        shapes = baseline.mm_shapes(layer, pass_name)
        assert sum(2 * m * k * n for m, k, n in shapes) == layer_flops(layer, pass_name)
    mm = baseline.MMBaseline(torch.device("cpu"), torch.float32, Plan(0, 1))
    assert mm.pass_ms([layer], "forward") > 0
    assert mm.product_ms((0, 8, 16)) == 0.0


def test_mm_yardstick_caps_the_long_dimension_and_scales(monkeypatch):
    timed = []

    def fake_time_fn(fn, device, plan):
        timed.append(tuple(fn().shape))
        return Stats([2.0])

    monkeypatch.setattr(baseline, "time_fn", fake_time_fn)
    mm = baseline.MMBaseline(torch.device("cpu"), torch.float32, Plan(0, 1))
    mm.row_cap = 100
    assert mm.product_ms((1000, 8, 16)) == pytest.approx(20.0)  # forward / dX: rows capped
    assert mm.product_ms((8, 1000, 16)) == pytest.approx(20.0)  # dW: reduction length capped
    assert mm.product_ms((50, 8, 16)) == pytest.approx(2.0)  # small products are timed whole
    assert timed == [(100, 16), (8, 16), (50, 16)]


def test_fma_peak_loop_counts_its_flops_and_checks_its_arguments():
    lanes = {"avx512": 16, "avx2": 8, "generic": 1}[spconv.build_info()["cpu_isa"]]
    threads = torch.get_num_threads()
    for dtype, per_vector in ((torch.float32, lanes), (torch.float64, max(lanes // 2, 1))):
        # 12 chains of one vector each, 2 FLOPs per lane and step, on every intra-op thread
        assert torch.ops.spconv_debug.cpu_fma_peak_loop(1000, dtype) == threads * 1000 * 2 * 12 * per_vector
    with pytest.raises(ValueError, match="iters"):
        torch.ops.spconv_debug.cpu_fma_peak_loop(0, torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        torch.ops.spconv_debug.cpu_fma_peak_loop(10, torch.int32)
    assert baseline.fma_loop_gflops(torch.float32, Plan(0, 1), threads=1) > 0
    assert torch.get_num_threads() == threads  # restored


def test_peak_is_the_best_of_the_big_product_and_the_fma_loop(monkeypatch):
    monkeypatch.setattr(baseline, "quiet_time_fn", lambda fn, device, plan: Stats([2 * 2048 ** 3 / 100e6]))
    for fma, source in ((300.0, "FMA loop"), (50.0, "torch.mm 2048^3")):
        monkeypatch.setattr(baseline, "fma_loop_gflops", lambda dtype, plan, threads=None, r=fma: r)
        mm = baseline.MMBaseline(torch.device("cpu"), torch.float32, Plan(0, 1))
        assert mm.peak_gflops() == pytest.approx(max(100.0, fma))
        assert mm.peak_source().startswith(source)
        m = _measurement(peak_gflops=mm.peak_gflops())
        rec = Record(meta={"peak_sources": {"cpu/fp32": mm.peak_parts}}, measurements=[m])
        header = [ln for ln in report.format_measurements(rec).splitlines() if ln.startswith("peak")]
        assert header == [f"peak (best timed run, this run): fp32 {m.peak_gflops:.1f} GFLOP/s = "
                          + baseline.describe_peak(mm.peak_parts)] and f"= {source}" in header[0], header
    # FP16 has no FMA loop: the big product alone
    mm = baseline.MMBaseline(torch.device("cpu"), torch.float16, Plan(0, 1))
    assert mm.peak_gflops() == pytest.approx(100.0) and list(mm.peak_parts) == ["torch.mm 2048^3"]


def test_reference_pairs_match_brute_force():
    rng = np.random.default_rng(0)
    zyx = np.unique(rng.integers(0, 6, size=(40, 3)), axis=0)
    idx = np.concatenate([np.zeros((len(zyx), 1), int), zyx], 1).astype(np.int32)
    shape = [6, 6, 6]
    counts, n_out = reference_pairs(idx, shape, [3] * 3, [1] * 3, [1] * 3, subm=True)
    present = {tuple(c) for c in zyx}
    offs = [(a, b, c) for a in range(3) for b in range(3) for c in range(3)]
    brute = [sum(tuple(np.add(c, o) - 1) in present for c in zyx) for o in offs]
    assert counts.tolist() == brute and n_out == len(zyx)
    counts, n_out = reference_pairs(idx, shape, [3] * 3, [2] * 3, [1] * 3, subm=False)
    outs = set()
    brute = [0] * 27
    for c in zyx:
        for k, o in enumerate(offs):
            num = c + 1 - np.array(o)
            if (num % 2 == 0).all() and ((num // 2 >= 0) & (num // 2 < 3)).all():
                brute[k] += 1
                outs.add(tuple(num // 2))
    assert counts.tolist() == brute and n_out == len(outs)


def test_dense_maxpool_follows_spconv_semantics():
    x = torch.tensor([-3.0, -1.0, 0.0, 0.0, 2.0, -5.0, 0.0, 0.0]).reshape(1, 1, 2, 2, 2)
    mask = torch.tensor([1, 1, 0, 0, 0, 0, 0, 0], dtype=torch.bool).reshape(1, 1, 2, 2, 2)
    y, m = reference.dense_maxpool(x, mask, 2, 2)
    assert m.item() and y.item() == 0.0  # all active inputs negative: max(0, ...) = 0
    mask[...] = False
    y, m = reference.dense_maxpool(x, mask, 2, 2)
    assert not m.item() and y.item() == 0.0


def test_rel_error():
    ref = torch.tensor([1.0, -2.0])
    assert reference.rel_error(ref, ref) == 0.0
    assert reference.rel_error(torch.tensor([1.0, -1.0]), ref) == pytest.approx(0.5)
    assert np.isnan(reference.rel_error(torch.zeros(3), ref))  # shape mismatch never passes


# ---------------------------------------------------------------- timing, results, report

def test_time_fn_runs_warmups_and_iterations():
    calls = []
    stats = time_fn(lambda: calls.append(1), torch.device("cpu"), Plan(2, 3))
    assert len(calls) == 5 and len(stats.samples_ms) == 3
    s = Stats([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.max) == (2.0, 1.0, 3.0)


def _measurement(**kw):
    base = dict(workload="basic", case="scan", route="cpu", chosen=True, dtype="fp32", pass_name="forward",
                voxels=1000, flops=4 * 10 ** 9, median_ms=2000.0, min_ms=1900.0, max_ms=2100.0, iters=3,
                mm_ms=500.0)
    base.update(kw)
    return Measurement(**base)


def test_measurement_rates():
    m = _measurement()
    assert m.gflops == pytest.approx(2.0)
    assert m.mm_ratio == pytest.approx(0.25)
    assert np.isnan(_measurement(mm_ms=None).mm_ratio)
    d = m.to_dict()
    assert d["gflops"] == pytest.approx(2.0) and d["mm_ratio"] == pytest.approx(0.25)


def test_checks_and_record_json():
    ok = Check("basic", "x", 1e-7, 1e-4)
    bad = Check("basic", "y", float("nan"), 1e-4)
    assert ok.ok and not bad.ok
    rec = Record(meta={"version": "t"}, measurements=[_measurement()], checks=[ok, bad])
    d = json.loads(json.dumps(rec.to_dict()))  # strictly JSON: NaN written as null
    assert d["all_checks_passed"] is False and d["checks"][1]["error"] is None
    text = report.format_checks(rec.checks)
    assert text.splitlines()[0].startswith("PASS") and text.splitlines()[1].startswith("FAIL")


def test_format_num_and_table():
    assert report.fmt_num(None) == "-" and report.fmt_num(float("nan")) == "-"
    assert report.fmt_num(12345.6) == "12,346" and report.fmt_num(123.45) == "123.5"
    assert report.fmt_num(1.2345) == "1.234" and report.fmt_num(0.00012) == "1.2e-04"
    table = report.format_table(["name", "ms"], [["a", "1.0"], ["long name", "10.0"]]).splitlines()
    assert table[0].startswith("name") and set(table[1]) <= {"-", " "}
    assert table[2].endswith(" 1.0") and len(table[2]) == len(table[3])  # numbers right-aligned


def test_measurement_table_shows_route_and_ratio():
    rec = Record(measurements=[_measurement(), _measurement(pass_name="forward_backward", chosen=False)])
    text = report.format_measurements(rec)
    assert "== basic" in text and "cpu*" in text and "fwd+bwd" in text and "0.25x" in text


def test_compare_table_ratios():
    ours = [_measurement(median_ms=1000.0)]
    theirs = [_measurement(median_ms=5000.0, library="other 1.0"),
              _measurement(pass_name="backward", library="other 1.0")]
    text = report.format_compare(ours, theirs, "other 1.0")
    row = text.splitlines()[2]
    assert "1,000" in row and "5,000" in row and "0.20x" in row and "5.00x" in row
    assert "only in other 1.0" in text


def test_gemm_floor_note():
    ours = [_measurement(median_ms=1000.0)]
    ours[0].mm_ms = 500.0
    theirs = [_measurement(median_ms=2000.0, library="other 1.0"),
              _measurement(pass_name="backward", library="other 1.0")]
    notes = compare.gemm_floor_notes(ours, theirs, "other 1.0")
    assert len(notes) == 1 and "take 500 ms" in notes[0] and "0.25x other 1.0" in notes[0] and "0.50x" in notes[0]
    ours[0].mm_ms = None
    assert compare.gemm_floor_notes(ours, theirs, "other 1.0") == []


# ---------------------------------------------------------------- CLI and compare plumbing

def test_cli_defaults():
    args = parse_args([])
    assert pick_workloads(args) == ["basic", "layers", "indices", "backbone"]
    assert pick_dtypes(args, torch.device("cpu")) == ["fp32"]
    assert "large" in pick_workloads(parse_args(["--full"]))
    assert "large" in pick_workloads(parse_args(["--points", "x.npz"]))
    assert pick_dtypes(parse_args(["--dtypes", "fp32,bf16"]), torch.device("cpu")) == ["fp32", "bf16"]
    with pytest.raises(SystemExit):
        pick_dtypes(parse_args(["--dtypes", "fp8"]), torch.device("cpu"))
    with pytest.raises(SystemExit):
        pick_workloads(parse_args(["--workloads", "nope"]))


def test_resolve_compare_target(tmp_path):
    env = {"PYTHONPATH": "/somewhere", "HOME": "/root"}
    t = compare.resolve_target(sys.executable, environ=env)
    assert t.python == sys.executable and "PYTHONPATH" not in t.env and t.module == "spconv.pytorch"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    t = compare.resolve_target(str(venv), environ=env)
    assert t.python == str(venv / "bin" / "python") and "PYTHONPATH" not in t.env
    src = tmp_path / "src"
    src.mkdir()
    t = compare.resolve_target(str(src), environ=env)
    assert t.python == sys.executable and t.env["PYTHONPATH"] == str(src)
    t = compare.resolve_target("spconv_other.pytorch", environ=env)
    assert t.module == "spconv_other.pytorch" and t.env["PYTHONPATH"] == "/somewhere"
    with pytest.raises(ValueError):
        compare.resolve_target(str(tmp_path / "missing" / "python"), environ=env)


@pytest.mark.slow
def test_compare_worker_against_ourselves():
    """The worker runs in a subprocess with only its own imports; pointed at this spconv it must agree."""
    from spconv.benchmark.workloads import basic
    f, idx, shape = scenes.synthetic_scan(quick=True)
    cf, ci, cshape = scenes.crop(f, idx, scenes.crop_window(idx, (64, 64, 64)), (64, 64, 64))
    scan = basic.Scan("crop", cf, ci, cshape)
    net = basic.build_net(torch.device("cpu"), torch.float32)
    target = compare.resolve_target("spconv.pytorch")
    result, outputs = compare.run_compare(target, scan, net.state_dict(), ["fp32"], torch.device("cpu"), 0, 1,
                                          backward=True, timeout_s=300)
    run = result["runs"][0]
    assert result["library"].startswith("spconv") and not run["errors"]
    assert set(run["times"]) == {"forward", "backward", "forward_backward"}
    import spconv.pytorch as sp
    with torch.no_grad():
        ours = net(sp.SparseConvTensor(torch.from_numpy(cf), torch.from_numpy(ci), cshape, 1))
    check = compare.output_check("basic", "self", "fp32", ours, outputs["fp32"])
    assert check.ok, check
    # checked output from one thread, a second output at the timed thread count beside it; ours agree
    assert os.path.exists(outputs["fp32"][:-4] + "_threaded.npz")
    assert compare.threaded_output_note("self", "fp32", outputs["fp32"], 2) is None


def test_threaded_output_note_flags_a_nondeterministic_other(tmp_path):
    """spconv 2.3.8's CPU scatter races at 2 torch threads: the note says so, the check uses the 1-thread run."""
    idx = np.array([[0, 0, 0, 0], [0, 1, 2, 3]], np.int32)
    single = tmp_path / "output_fp32.npz"
    np.savez(single, features=np.ones((2, 4), np.float32), indices=idx, spatial_shape=np.array([4, 4, 4]))
    np.savez(tmp_path / "output_fp32_threaded.npz", features=np.full((2, 4), 1.5, np.float32), indices=idx,
             spatial_shape=np.array([4, 4, 4]))
    note = compare.threaded_output_note("other 1.0", "fp32", str(single), 2)
    assert note and "differs from its 1-thread output" in note
    assert compare.threaded_output_note("other 1.0", "fp32", str(single), 1) is None


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path):
    """The smoke run: every workload, every correctness line PASS, a complete JSON file."""
    out = tmp_path / "quick.json"
    # One thread: the suite may run beside other jobs on a small machine; thread scaling is the benchmark's
    # business, not this test's.
    cmd = [sys.executable, "-m", "spconv.benchmark", "--quick", "--no-progress", "--threads", "1",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for section in ("== basic", "== layers", "== indices", "== backbone", "== correctness", "== per layer"):
        assert section in text
    check_lines = [ln for ln in text.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert check_lines and all(ln.startswith("PASS") for ln in check_lines)
    data = json.loads(out.read_text())
    assert data["all_checks_passed"]
    assert {c["workload"] for c in data["checks"]} >= {"basic", "layers", "indices", "backbone"}
    assert any("dense" in c["what"] for c in data["checks"] if c["workload"] == "basic")
    passes = {(m["workload"], m["pass_name"]) for m in data["measurements"]}
    assert {("basic", "forward"), ("basic", "forward_backward"), ("layers", "forward"), ("backbone", "forward"),
            ("backbone", "forward_backward")} <= passes
    backbone = [m for m in data["measurements"] if m["workload"] == "backbone"]
    assert all(m["flops"] > 0 and m["median_ms"] > 0 and "VoxelBackBone8x" in m["case"] for m in backbone)
    assert any(k.startswith("FMA loop") for k in data["meta"]["peak_sources"]["cpu/fp32"])
    fwd = next(m for m in data["measurements"] if m["workload"] == "basic" and m["pass_name"] == "forward")
    assert fwd["flops"] > 0 and fwd["mm_ms"] > 0 and len(fwd["samples_ms"]) == fwd["iters"]
    regions = data["meta"]["cpu_parallel_regions"]  # one thread: no parallel region at all
    assert 0 <= regions["finished_on_caller"] <= regions["started_on_caller"] and regions["closed"] >= 0


def test_parallel_regions_note_counts_this_process():
    x = random_sparse(3, [32, 32, 16], 1, 16, density=0.3, seed=4)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            spconv.pytorch.SubMConv3d(16, 16, 3)(x)
    finally:
        torch.set_num_threads(saved)
    record = Record()
    note_parallel_regions(record, torch.device("cpu"))
    assert record.meta["cpu_parallel_regions"]["closed"] > 0
    assert any(n.startswith("native CPU parallel regions this run") for n in record.notes)


def test_fused_tf32_rows_say_they_are_fp32():
    """TF32 runs only on the native route: a fused row under the tf32 column is plain FP32."""
    kw = dict(workload="layers", case="subm 64->64", chosen=True, pass_name="forward", voxels=10, flops=1.0,
              median_ms=1.0, min_ms=1.0, max_ms=1.0, iters=1, mm_ms=None, samples_ms=[1.0])
    fused = report.measurement_rows([Measurement(route="fused", dtype="tf32", **kw)])[0]
    native = report.measurement_rows([Measurement(route="native", dtype="tf32", **kw)])[0]
    assert "fp32" in fused[2] and "no tf32" in fused[2]
    assert native[2] == "tf32"


@pytest.mark.slow
def test_backbone_dense_check_passes_and_catches_a_wrong_reference(monkeypatch):
    from types import SimpleNamespace

    from spconv.benchmark import reference
    from spconv.benchmark.routes import available_routes
    from spconv.benchmark.workloads import backbone, basic
    ctx = SimpleNamespace(seed=0)
    scan = basic.basic_scan(None, True, 0)
    route = available_routes(torch.device("cpu"))[0]
    check = backbone._dense_check(ctx, scan, route, "fp64")
    assert check.ok and check.error < 1e-12, check
    flipped = reference.dense_weight
    monkeypatch.setattr(reference, "dense_weight", lambda w: flipped(w).flip(2))  # kernel upside down in z
    assert not backbone._dense_check(ctx, scan, route, "fp64").ok
