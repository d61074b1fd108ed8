"""The static budget of the MFMA forward body, checked on the gfx90a ISA hipcc makes (no GPU needed): part of
tools/compile_check_gpu.sh, whose log shows the figures.

For the fp16 and bf16 fused forward kernel (csrc/hip/fused_conv_mfma.cuh) on gfx90a:
  * every main loop, an innermost loop that loads 16-byte vectors from global memory, writes LDS, waits at a
    barrier and runs MFMAs (one K step of one shape), spends at most OTHERS instructions per m16n8k16-equivalent
    MMA (a v_mfma_f32_16x16x16 is two: 4096 multiply-adds), and the one with the most MFMAs per iteration (the
    64-channel step, which every cin above 96 takes: the large layers) at most LARGEST;
  * there is such a loop;
  * the kernel uses no scratch memory (no spills).
The scalar-copy path (channels not a multiple of 8: element loads) and the dfilter kernel's MFMA loops are
printed, not held. Registers, LDS and the compiler's occupancy are printed.

Usage:  python3 tools/mfma_budget.py [--arch gfx90a]    exit status 1 when a budget is missed
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO, "csrc", "hip", "fused_conv.cu")
LARGEST, OTHERS = 4.0, 5.0  # instructions per m16n8k16-equivalent: the 64-channel K step, the 32-channel one
# (kernel regex, (budget of the main loop with the most MFMAs, of the other main loops) or None: not held)
KERNELS = [(r"fused_forward_kernel<(__half|.*bf16)", (LARGEST, OTHERS)), (r"dfilter_kernel<(__half|.*bf16)", None)]
# (group, instruction prefix) counted in a loop
COUNTED = (("MFMA", "v_mfma"), ("global", "global_load"), ("ds_read", "ds_read"), ("ds_write", "ds_write"),
           ("barrier", "s_barrier"))
MACS_PER_MMA = 16 * 8 * 16  # m16n8k16


def compile_isa(source: str, arch: str, hipcc: str = "") -> str:
    """The device assembly hipcc writes for `source` (-O3, --save-temps)."""
    hipcc = hipcc or os.environ.get("HIPCC") or shutil.which("hipcc") or "hipcc"
    inc = [f"-I{os.path.join(REPO, 'csrc', 'hip')}", f"-I{os.path.join(REPO, 'csrc', 'include')}"]
    env = dict(os.environ, HIP_PLATFORM="amd")  # nvcc on the PATH would make hipcc pick the NVIDIA platform
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [hipcc, "-std=c++17", "-O3", "-x", "hip", f"--offload-arch={arch}", "--save-temps", *inc, "-c", source,
               "-o", os.path.join(tmp, "k.o")]
        subprocess.run(cmd, cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        name = [f for f in os.listdir(tmp) if f.endswith(f"-{arch}.s")]
        if len(name) != 1:
            raise RuntimeError(f"mfma_budget: no {arch} assembly from hipcc (got {sorted(os.listdir(tmp))})")
        with open(os.path.join(tmp, name[0])) as fh:
            return fh.read()


def kernels(text: str) -> Dict[str, Tuple[List[str], Dict[int, str], Dict[str, str]]]:
    """mangled name -> (instructions, {index of the first instruction after a label: label}, metadata)."""
    out = {}
    cur = last = None
    for line in text.splitlines():
        m = re.match(r"^(_Z\S+):", line)
        if m:
            cur = last = m.group(1)
            out[cur] = ([], {}, {})
            continue
        # the kernel's figures follow its code
        m = re.match(r"^\s*;\s*(NumVgprs|NumAgprs|NumSgprs|ScratchSize|Occupancy):\s*(\d+)", line)
        if m and last:
            out[last][2][m.group(1)] = m.group(2)
        m = re.match(r"^\s*\.amdhsa_group_segment_fixed_size\s+(\d+)", line)
        if m and last:
            out[last][2]["LDS"] = m.group(1)
        if cur is None:
            continue
        if line.startswith(".Lfunc_end"):
            cur = None
            continue
        s = line.strip()
        m = re.match(r"^(\.LBB\d+_\d+):", s)
        if m:
            out[cur][1][len(out[cur][0])] = m.group(1)
            continue
        if not s or s.startswith((";", ".")):
            continue
        out[cur][0].append(s.split(";")[0].strip())
    return out


def loops(ins: List[str], labels: Dict[int, str], first_latch: bool = False) -> List[Tuple[int, int]]:
    """(first, last) instruction of each loop: a label some later branch jumps back to, up to the last such
    branch (a loop the compiler laid out with its entry in the middle has several), or up to the first one."""
    at = {name: i for i, name in labels.items()}
    end: Dict[int, int] = {}
    for j, s in enumerate(ins):
        m = re.match(r"^s_(?:c?branch\w*)\s+(\.LBB\d+_\d+)", s)
        if m and m.group(1) in at and at[m.group(1)] <= j and not (first_latch and at[m.group(1)] in end):
            end[at[m.group(1)]] = j
    return sorted(end.items())


def innermost(spans: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    return [(i, j) for i, j in spans if not any(i <= a and b <= j and (a, b) != (i, j) for a, b in spans)]


def figures(body: List[str]) -> Dict[str, int]:
    f = {name: sum(1 for s in body if s.startswith(prefix)) for name, prefix in COUNTED}
    f["vector_loads"] = sum(1 for s in body if s.startswith("global_load_dwordx4"))
    f["instructions"] = len(body)
    f["mma_equivalents"] = sum(_macs(s) for s in body if s.startswith("v_mfma")) // MACS_PER_MMA
    return f


def _macs(mnemonic_line: str) -> int:
    m = re.match(r"v_mfma_\w+?_(\d+)x(\d+)x(\d+)", mnemonic_line)
    return int(m.group(1)) * int(m.group(2)) * int(m.group(3)) if m else 0


def check_kernel(name: str, ins: List[str], labels: Dict[int, str], meta: Dict[str, str], budget):
    """(report lines, failures) of one kernel."""
    lines = [f"{name}: {len(ins)} instructions; " + ", ".join(f"{k} {v}" for k, v in sorted(meta.items()))]
    failures = []
    found = [(i, figures(ins[i:j + 1])) for i, j in innermost(loops(ins, labels))]
    found = [(i, f) for i, f in found if f["MFMA"]]
    if not found:  # MFMAs only in loops around others (dfilter's table scan): the path to the first latch
        spans = [(i, figures(ins[i:j + 1])) for i, j in loops(ins, labels, first_latch=True)]
        found = [min(((i, f) for i, f in spans if f["MFMA"]), key=lambda x: x[1]["instructions"], default=None)]
        found = [x for x in found if x]
    main = [(i, f) for i, f in found
            if f["global"] == f["vector_loads"] > 0 and f["ds_write"] and f["barrier"]]
    most = max((f["MFMA"] for _, f in main), default=0)
    for i, f in found:
        per = f["instructions"] / f["mma_equivalents"]
        held = budget is not None and (i, f) in main
        limit = (budget[0] if f["MFMA"] == most else budget[1]) if held else None
        ok = not held or per <= limit
        mark = ("ok  " if ok else "FAIL") if held else "    "
        scalar = budget is not None and f["global"] != f["vector_loads"]
        what = f"budget {limit:g}" if held else "not held" + (": the scalar-copy path" if scalar else "")
        lines.append(f"  {mark} loop at {i}: {f['MFMA']} MFMA ({f['mma_equivalents']} m16n8k16), {f['global']} global "
                     f"loads, {f['ds_read']} LDS reads, {f['ds_write']} LDS writes, {f['barrier']} barriers, "
                     f"{f['instructions']} instructions: {per:.2f} per m16n8k16 ({what})")
        if not ok:
            failures.append(f"{name}: {per:.2f} instructions per m16n8k16 in the loop at {i} (budget {limit:g})")
    if budget is not None and not main:
        failures.append(f"{name}: no loop with global loads, LDS writes, a barrier and MFMAs")
    if budget is not None and int(meta.get("ScratchSize", "0")):
        failures.append(f"{name}: scratch memory ({meta['ScratchSize']} B: spills)")
    return lines, failures


def demangle(names: List[str]) -> Dict[str, str]:
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt")
    if not tool:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def check_arch(arch: str, text: str = ""):
    ks = kernels(text or compile_isa(SOURCE, arch))
    names = demangle(list(ks))
    lines, failures = [f"== {arch}"], []
    for pattern, budget in KERNELS:
        seen = 0
        for mangled, (ins, labels, meta) in sorted(ks.items(), key=lambda kv: names[kv[0]]):
            name = names[mangled].replace("spconv::gpu::(anonymous namespace)::", "").split("(")[0]
            if not re.search(pattern, name):
                continue
            seen += 1
            out, bad = check_kernel(f"{name} {arch}", ins, labels, meta, budget)
            lines += out
            failures += bad
        if seen != 2:
            failures.append(f"{arch}: expected the fp16 and bf16 kernels matching {pattern}, found {seen}")
    return lines, failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="gfx90a")
    args = ap.parse_args(argv)
    lines, failures = check_arch(args.arch)
    print("\n".join(lines))
    for f in failures:
        print("FAIL " + f)
    print(f"mfma_budget: {'ok' if not failures else 'FAILED'} ({args.arch})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
