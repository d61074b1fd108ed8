"""tools/mfma_budget.py's rules on hand-made gfx90a listings (the compile check runs it on hipcc's ISA): the main
loops (16-byte global loads, LDS writes, a barrier, MFMAs) within their budgets per m16n8k16-equivalent, the one
with the most MFMAs at 4, the others at 5; the scalar-copy loop printed, not held; a missing main loop or scratch
fails. And the MFMA forward body itself, when hipcc is
here (the compile check installs it), within its budget."""
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import mfma_budget  # noqa: E402

MFMA = "v_mfma_f32_16x16x16f16 a[0:3], v[2:3], v[4:5], a[0:3]"


def _kernel(*bodies, scratch=0):
    """A listing of one kernel whose loops have the given bodies, each closed by a backward branch."""
    lines = ["_Z6kernelv:", "\ts_load_dwordx2 s[0:1], s[4:5], 0x0"]
    for n, body in enumerate(bodies):
        lines.append(f".LBB0_{n}:")
        lines += ["\t" + s for s in body] + [f"\ts_cbranch_scc1 .LBB0_{n}"]
    lines += ["\ts_endpgm", ".Lfunc_end0:", "\t.amdhsa_group_segment_fixed_size 18948",
              f"; ScratchSize: {scratch}", "; NumVgprs: 80"]
    return mfma_budget.kernels("\n".join(lines))["_Z6kernelv"]


def _body(mfma, other, loads=("global_load_dwordx4 v[2:5], v[6:7], off",) * 2, writes=9, barrier=True):
    return ([MFMA] * mfma + list(loads) + ["ds_write_b16 v1, v2"] * writes + ["s_barrier"] * barrier
            + ["v_add_u32_e32 v1, 32, v1"] * other)


BUDGET = (4.0, 5.0)


def test_main_loops_within_budget_and_scalar_path_not_held():
    ins, labels, meta = _kernel(_body(16, 80, writes=18), _body(8, 50),
                                _body(8, 300, loads=("global_load_ushort v2, v[6:7], off",) * 16))
    lines, failures = mfma_budget.check_kernel("k", ins, labels, meta, BUDGET)
    assert failures == []
    assert sum(line.startswith("  ok") for line in lines) == 2
    assert any("the scalar-copy path" in line for line in lines)
    assert "LDS 18948" in lines[0] and "ScratchSize 0" in lines[0]


def test_counts_mfma_as_two_mma_each():
    f = mfma_budget.figures([MFMA] * 8 + ["s_nop 0"] * 8)
    assert f["MFMA"] == 8 and f["mma_equivalents"] == 16


def test_main_loops_over_budget_fail():
    ins, labels, meta = _kernel(_body(16, 120), _body(8, 50))  # (16 + 2 + 9 + 1 + 120 + 1) / 32 = 4.7
    _, failures = mfma_budget.check_kernel("k", ins, labels, meta, BUDGET)
    assert len(failures) == 1 and "budget 4" in failures[0]
    ins, labels, meta = _kernel(_body(16, 60), _body(8, 80))  # (8 + 2 + 9 + 1 + 80 + 1) / 16 = 6.3
    _, failures = mfma_budget.check_kernel("k", ins, labels, meta, BUDGET)
    assert len(failures) == 1 and "budget 5" in failures[0]


def test_missing_main_loop_or_scratch_fails():
    ins, labels, meta = _kernel(_body(8, 10, barrier=False))
    _, failures = mfma_budget.check_kernel("k", ins, labels, meta, BUDGET)
    assert any("no loop" in f for f in failures)
    ins, labels, meta = _kernel(_body(8, 10), scratch=64)
    _, failures = mfma_budget.check_kernel("k", ins, labels, meta, BUDGET)
    assert any("scratch" in f for f in failures)
    _, failures = mfma_budget.check_kernel("k", ins, labels, meta, None)  # not held: nothing fails
    assert failures == []


@pytest.mark.skipif(not (os.environ.get("HIPCC") or shutil.which("hipcc")),
                    reason="needs hipcc (tools/compile_check_gpu.sh installs it and runs this check too)")
def test_mfma_forward_body_within_budget():
    lines, failures = mfma_budget.check_arch("gfx90a")
    assert failures == [], "\n".join(lines + failures)
    assert sum(line.startswith("  ok") for line in lines) == 4  # fp16 and bf16, 32- and 64-channel steps
