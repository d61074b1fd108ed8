"""tools/sass_budget.py's rules on hand-made instruction lists (the compile check runs it on nvcc's SASS): the main
loops (cp.async and MMA) within their budgets, the largest at 4 per MMA, the others at 8 (dfilter: the largest at 8,
the others not held); a missing pipelined loop or local memory fails."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import sass_budget  # noqa: E402

CLEAN = "104 registers, 39440 B static smem, stack frame 0 B, spill stores 0 B, spill loads 0 B"


def _loop(start, mma, copies, other, plain_loads=0):
    """A backward branch at the end of a body of mma HMMA, copies LDGSTS, plain loads and other instructions."""
    body = (["HMMA.16816.F32 R0, R4, R8, R0"] * mma + ["LDGSTS.E.BYPASS.128 [R1], [R2.64]"] * copies
            + ["LDG.E.U16 R3, [R2.64]"] * plain_loads + ["IADD3 R1, R1, 0x10, RZ"] * other)
    ins = [(start + 16 * i, t) for i, t in enumerate(body)]
    return ins + [(start + 16 * len(body), f"BRA 0x{start:x}")]


def _check(*loops, usage=CLEAN, extra=()):
    ins = [i for lp in loops for i in lp] + list(extra)
    return sass_budget.check_kernel("k", ins, usage)


def test_main_loops_within_budget():
    lines, failures = _check(_loop(0x1000, 32, 8, 72), _loop(0x4000, 16, 4, 58), _loop(0x8000, 16, 0, 500, 78))
    assert failures == []
    assert sum("ok   main loop" in line for line in lines) == 2  # the scalar-copy loop is reported, not held
    assert any("other MMA loops" in line for line in lines)


def test_largest_main_loop_over_four_fails():
    _, failures = _check(_loop(0x1000, 32, 8, 100), _loop(0x4000, 16, 4, 58))  # 4.4 per MMA
    assert len(failures) == 1 and "budget 4" in failures[0]


def test_smaller_main_loop_over_eight_fails():
    _, failures = _check(_loop(0x1000, 32, 8, 72), _loop(0x4000, 16, 4, 120))  # 8.75 per MMA
    assert len(failures) == 1 and "budget 8" in failures[0]


def test_nested_loops_hold_only_the_innermost():
    inner = _loop(0x1010, 32, 8, 72)
    outer = [(0x1000, "IADD3 R5, R5, 0x1, RZ")] + inner + [(0x2000, "IADD3 R6, R6, 0x1, RZ"), (0x2010, "BRA 0x1000")]
    lines, failures = _check(outer)
    assert failures == [] and sum("main loop" in line for line in lines) == 1


def test_no_async_copies_fails():
    _, failures = _check(_loop(0x1000, 32, 0, 40))
    assert failures == ["k: no loop with cp.async and MMA"]


def test_local_memory_fails():
    _, failures = _check(_loop(0x1000, 32, 8, 72), extra=[(0x9000, "STL.64 [R1+0x8], R4")])
    assert len(failures) == 1 and "local memory" in failures[0]
    _, failures = _check(_loop(0x1000, 32, 8, 72), usage=CLEAN.replace("spill stores 0 B", "spill stores 8 B"))
    assert len(failures) == 1 and "local memory" in failures[0]


def test_dfilter_budget_holds_only_the_largest_main_loop():
    """The dfilter kernel's rule: its pairs-mode loop (the most MMAs) at most 8 per MMA; the table mode's loop
    (a block-wide scan per step) printed, not held."""
    largest, others = next((b, o) for p, b, o in sass_budget.KERNELS if p.startswith("dfilter"))
    ins = _loop(0x1000, 16, 4, 100) + _loop(0x4000, 8, 2, 220)  # 7.5 and 28.8 per MMA
    lines, failures = sass_budget.check_kernel("k", ins, CLEAN, largest, others)
    assert failures == [] and any("not held" in line for line in lines)
    ins = _loop(0x1000, 16, 4, 120) + _loop(0x4000, 8, 2, 220)  # 8.75 per MMA
    _, failures = sass_budget.check_kernel("k", ins, CLEAN, largest, others)
    assert len(failures) == 1 and "budget 8" in failures[0]
