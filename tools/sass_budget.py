"""The static budget of the pipelined tensor-core bodies, checked on the SASS nvcc makes (no GPU needed): part of
tools/compile_check_gpu.sh, whose log shows the figures.

For the fp16 and bf16 fused forward kernels that run the pipelined sm_80 body (the `Pipelined` instantiation,
`fused_forward_kernel<T, true>`), on sm_80 and sm_90a:
  * every innermost loop that copies with cp.async (LDGSTS) and multiplies (HMMA), i.e. the main loop of each
    K-step shape, spends at most 8 instructions per m16n8k16 MMA, and the one with the most MMAs per iteration
    (the 64-channel K step, which every cin above 96 takes: the large layers) at most 4;
  * there is such a loop (the asynchronous copies are there);
  * the kernel uses no local memory: no spills, no LDL/STL.
For the fp16 and bf16 dfilter kernels of the same instantiation (its sm_80 body), on the same targets: the main loop with
the most MMAs per iteration (the pairs-mode step loop) at most 8 instructions per MMA, such a loop present, no
local memory; its other main loops (the table mode's, a block-wide scan per step) are printed, not held.
The scalar-copy path (channels not a multiple of 8: ordinary loads) is printed, not held.

Usage:  python3 tools/sass_budget.py [--arch sm_80 --arch sm_90a]    exit status 1 when a budget is missed
        python3 tools/sass_budget.py --find                          exit status 1 when cuobjdump is missing
"""
import argparse
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_loops  # noqa: E402

SOURCE = os.path.join(sass_loops.REPO, "csrc", "hip", "fused_conv.cu")
DEFINES = []
LARGEST, OTHERS = 4.0, 8.0  # instructions per MMA: the largest K step's main loop, every other main loop
# (kernel regex, budget of the main loop with the most MMAs, of the other main loops: None = not held)
KERNELS = [(r"fused_forward_kernel<(__half|[\w:]*bf16_t), true>", LARGEST, OTHERS),
           (r"dfilter_kernel<(__half|[\w:]*bf16_t), true>", 8.0, None)]


def check_kernel(name: str, ins, usage: str, largest: float = LARGEST, others=OTHERS):
    """(report lines, failures) of one kernel."""
    lines, failures = [], []
    mma_loops = [(start, sass_loops.loop_figures(body)) for start, _, body in sass_loops.innermost(sass_loops.loops(ins))]
    mma_loops = [(start, c) for start, c in mma_loops if c["MMA"]]
    main = [(start, c) for start, c in mma_loops if c["LDGSTS"]]
    most = max((c["MMA"] for _, c in main), default=0)
    for start, c in main:
        per = c["instructions"] / c["MMA"]
        limit = largest if c["MMA"] == most else others
        ok = limit is None or per <= limit
        mark, budget = ("    ", "not held") if limit is None else ("ok  " if ok else "FAIL", f"budget {limit:g}")
        lines.append(f"  {mark} main loop {start:#06x}: {c['MMA']} MMA, {c['LDGSTS']} cp.async, "
                     f"{c['instructions']} instructions: {per:.1f} per MMA ({budget})")
        if not ok:
            failures.append(f"{name}: {per:.1f} instructions per MMA in the loop at {start:#06x} (budget {limit:g})")
    rest = [c["instructions"] / c["MMA"] for _, c in mma_loops if not c["LDGSTS"]]
    if rest:
        lines.append(f"       {len(rest)} other MMA loops (the last steps, the scalar-copy path), not held: "
                     f"{min(rest):.1f} to {max(rest):.1f} per MMA")
    if not main:
        failures.append(f"{name}: no loop with cp.async and MMA")
    local = sass_loops.local_accesses(ins)
    spills = re.search(r"spill stores (\d+) B, spill loads (\d+) B", usage)
    if local or (spills and (int(spills.group(1)) or int(spills.group(2)))):
        failures.append(f"{name}: local memory ({local} LDL/STL; {usage})")
    return [f"{name}: {len(ins)} instructions, {local} LDL/STL; {usage}"] + lines, failures


def check_arch(arch: str):
    sass, usage = sass_loops.disassemble(SOURCE, arch, DEFINES)
    ks = sass_loops.kernels(sass)
    names = sass_loops.demangle(list(ks))
    lines, failures = [f"== {arch}"], []
    for pattern, largest, others in KERNELS:
        seen = 0
        for mangled, ins in sorted(ks.items(), key=lambda kv: names[kv[0]]):
            name = names[mangled].replace("spconv::gpu::(anonymous namespace)::", "").split("(")[0]
            if not re.search(pattern, name):
                continue
            seen += 1
            out, bad = check_kernel(f"{name} {arch}", ins, usage.get(mangled, ""), largest, others)
            lines += out
            failures += bad
        if seen != 2:
            failures.append(f"{arch}: expected the fp16 and bf16 kernels matching {pattern}, found {seen}")
    return lines, failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", help="default: sm_80 and sm_90a")
    ap.add_argument("--find", action="store_true", help="only say whether cuobjdump (with nvdisasm) is there")
    args = ap.parse_args(argv)
    if args.find:
        tool = sass_loops.find_cuobjdump(required=False)
        print(tool or "sass_budget: no cuobjdump")
        return 0 if tool else 1
    archs = args.arch or ["sm_80", "sm_90a"]
    with ThreadPoolExecutor(len(archs)) as pool:
        results = list(pool.map(check_arch, archs))
    failures = []
    for lines, bad in results:
        print("\n".join(lines))
        failures += bad
    for f in failures:
        print("FAIL " + f)
    print(f"sass_budget: {'ok' if not failures else 'FAILED'} ({', '.join(archs)})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
