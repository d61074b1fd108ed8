"""Static figures of GPU kernels without a GPU: compiles a csrc/hip source with nvcc for one NVIDIA target,
disassembles it, and prints each matching kernel's loops (a backward branch and its body) with their counts of
instructions, FP32/FP64 multiply-adds, multiplies and adds, tensor-core ops and global loads, and per
multiply-add (an FMA, or a multiply with its add) the instructions and global loads.

Per multiply-add of the inner loop, instructions and loads say how far a kernel is from the FMA units' rate
before any memory effect: what a first GPU run would show, measured on a machine without one.

Usage:  python3 tools/sass_loops.py csrc/hip/grouped_conv.cu [--kernel REGEX] [--arch sm_90] [-D NAME[=VALUE]]...
        (an older version: git show REV:csrc/hip/X.cu > /tmp/X.cu; the headers come from csrc/hip)
Needs nvcc and cuobjdump (on the PATH, in $CUDA_HOME/bin, pip's nvidia-cuda-cuobjdump with
nvidia-cuda-nvdisasm, or the copy triton bundles).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Opcode families counted per loop (the regex matches the opcode without its predicate).
COUNTS = [("FMA", r"^(FFMA|DFMA|HFMA2)"), ("MUL", r"^(FMUL|DMUL|HMUL2)"), ("ADD", r"^(FADD|DADD|HADD2)(?!\.F32)"),
          ("MMA", r"^(HMMA|IMMA|HGMMA)"), ("LDG", r"^LDG(?!STS|DEPBAR)"), ("LDGSTS", r"^LDGSTS"),
          ("LDS", r"^LDS")]  # LDGSTS: cp.async (global -> shared); LDS also counts LDSM (ldmatrix)


def find_cuobjdump(required: bool = True) -> str:
    """cuobjdump's path ('' when missing and not required); its folder must also hold nvdisasm (-sass runs it)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "")
    candidates = [os.path.join(home, "bin", "cuobjdump")] if home else []
    for site in sys.path:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "cuobjdump")))  # pip's packages
        candidates += glob.glob(os.path.join(site, "triton", "backends", "nvidia", "bin", "cuobjdump"))
    for c in candidates:
        if os.access(c, os.X_OK) and os.access(os.path.join(os.path.dirname(c), "nvdisasm"), os.X_OK):
            return c
    if required:
        sys.exit("sass_loops: cuobjdump not found (PATH, $CUDA_HOME/bin or a bundled copy)")
    return ""


def disassemble(source: str, arch: str, defines=()) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        res = subprocess.run(["nvcc", "-cubin", "-std=c++17", "-O3", "-x", "cu", "--expt-relaxed-constexpr", f"-arch={arch}",
                        "-Xptxas", "-v"] + [f"-D{d}" for d in defines] + [
                        "-I" + os.path.join(REPO, "csrc", "include"), "-I" + os.path.join(REPO, "csrc"),
                        "-I" + os.path.join(REPO, "csrc", "hip"), source,
                        "-o", cubin], check=True, capture_output=True, text=True)
        tool = find_cuobjdump()
        env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
        sass = subprocess.run([tool, "-sass", cubin], check=True, capture_output=True, text=True, env=env).stdout
        return sass, ptxas_usage(res.stdout + res.stderr)


def ptxas_usage(log: str):
    """{mangled name: 'N registers, S bytes spill stores, L bytes spill loads, M bytes smem'} from ptxas -v."""
    out, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
            out[cur] = ""
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            out[cur] = f"stack frame {m.group(1)} B, spill stores {m.group(2)} B, spill loads {m.group(3)} B"
        m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
        if m and cur:
            out[cur] = f"{m.group(1)} registers, {m.group(2)} B static smem, " + out[cur]
    return out


def kernels(sass: str):
    """{mangled name: [(address, instruction without predicate)]}"""
    out, cur = {}, None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), re.sub(r"^@!?U?P\w+\s+", "", m.group(2))))
    return out


def demangle(names):
    filt = shutil.which("c++filt")
    if not filt:
        return {n: n for n in names}
    res = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, res))


def loops(ins):
    """(start, end, body) per backward branch, innermost (shortest) first."""
    found = []
    for addr, text in ins:
        m = re.match(r"BRA\s+(?:`\(\S+\)\s*)?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            found.append((start, addr, [t for a, t in ins if start <= a <= addr]))
    return sorted(found, key=lambda f: len(f[2]))


def loop_figures(body):
    """{family: count} of one loop's instructions (COUNTS), plus "instructions"."""
    c = {k: sum(1 for t in body if re.match(p, t)) for k, p in COUNTS}
    c["instructions"] = len(body)
    return c


def innermost(found):
    """The loops of loops() that hold no other loop."""
    return [f for f in found if not any(g is not f and f[0] <= g[0] and g[1] <= f[1] for g in found)]


def local_accesses(ins) -> int:
    return sum(1 for _, t in ins if re.match(r"^(LDL|STL)", t))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("--kernel", default=".", help="regex on the demangled kernel name")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-D", "--define", action="append", default=[], metavar="NAME[=VALUE]",
                    help="a macro for the compile (repeatable), e.g. -D NDEBUG")
    args = ap.parse_args()
    sass, usage = disassemble(args.source, args.arch, args.define)
    ks = kernels(sass)
    names = demangle(list(ks))
    for mangled, ins in sorted(ks.items(), key=lambda kv: names[kv[0]]):
        name = names[mangled].replace("spconv::gpu::(anonymous namespace)::", "")
        if not re.search(args.kernel, name):
            continue
        local = local_accesses(ins)
        print(f"{name.split('(')[0]}: {len(ins)} instructions, {local} local loads/stores (LDL/STL); "
              + usage.get(mangled, ""))
        for start, end, body in loops(ins):
            c = loop_figures(body)
            mac = c["FMA"] + c["MUL"]  # multiply-adds: an FMA, or a multiply and its add (never contracted)
            if mac < 2 and not c["MMA"]:
                continue
            per = f"; per multiply-add {len(body) / mac:.1f} instructions, {c['LDG'] / mac:.2f} loads" if mac else ""
            per += f"; per MMA {len(body) / c['MMA']:.1f} instructions" if c["MMA"] else ""
            print(f"  loop {start:#06x}-{end:#06x}: {len(body)} instructions, "
                  + ", ".join(f"{k} {c[k]}" for k, _ in COUNTS) + per)


if __name__ == "__main__":
    main()
