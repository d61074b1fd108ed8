"""Mutation check of the hip_cpu tests: each mutation below is applied alone to a temporary copy of csrc/,
the HIP CPU library is rebuilt from that copy (tools/hip_cpu_build.py, source-root argument) and the relevant
hip_cpu tests run against it in a fresh process. Every mutation must make them FAIL; a mutation the tests
miss is reported as SURVIVED and the script exits non-zero.

Besides the hand-written MUTATIONS, every csrc/hip/*.cu file gets generated ones (generated_mutations): each
__syncthreads() removed, one at a time, and in each kernel the bound of its first loop lowered by one (the last
element is then never written or read). Their tests run with the kernels' threads in descending order
(SPCONV_HIP_CPU_THREAD_ORDER=descending, csrc/hip/hip_cpu_thread_order.h): in the runtime's ascending order a
missing barrier between a write by a low thread and reads by higher ones goes unseen. A barrier inside an
`#if defined(SPCONV_FORWARD_SM80)` branch (code of the sm_80 bodies only) is tested on the sm80 variant.

Usage:  python3 tools/hip_cpu_mutation.py [--only NAME ...] [--match TEXT] [--list] [--jobs N]
(slow-ish: one object rebuild and one test run per mutation; objects of unchanged files come from the cache)
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hip_cpu_build  # noqa: E402

REPO = hip_cpu_build.REPO


class Mutation(NamedTuple):
    name: str
    path: str  # relative to the repo root
    old: str  # must occur exactly `occurrence` + 1 times or more; the occurrence-th one is replaced
    new: str
    tests: List[str]  # pytest arguments selecting the tests that must catch it
    occurrence: int = 0
    requires: Optional[str] = None  # path that must exist (else the mutation is skipped)
    why: str = ""
    variant: str = "simt"  # the build the tests run on (built first: a mutant that does not build is an error)
    descending: bool = False  # run the tests with each block's threads in descending order


_FWD_LOOP_BARRIER = """        Bs[kk][n] = (c < a.cin && col < a.cout) ? to_float(wk[c * a.cout + col]) : 0.f;
      }
      __syncthreads();"""
_FWD_LOOP_END_BARRIER = """      simt_fma_tile(As, Bs, tx, ty, acc);
      __syncthreads();"""
_SUBM_OFFSET = """    unravel_offset(k, g.ksize, g.ndim, koff);
    if (!subm_neighbor(g, row + 1, koff, nb)) continue;"""
_SUBM_MIRROR = "    if (mirrored && k != kvol - 1 - k) record_pair("
_CONV_OFFSET = """      unravel_offset(k, g.ksize, g.ndim, koff);
      const bool ok ="""
_FUSED_TESTS = ["test/test_gpu_code_ops.py", "-k", "fused_forward_dinput_dfilter and f32"]
_MAP_TESTS = ["test/test_gpu_code_ops.py", "-k", "kernel_map_pairs"]
_CONV_MAP_TESTS = ["test/test_gpu_code_conv_map.py", "-k", "cpu_route"]
_INT8_TESTS = ["test/test_gpu_code_int8.py"]
_SM80_DFILTER_TESTS = ["test/test_hip_cpu_variants.py", "-k", "sm80 and same_bits"]

MUTATIONS = [
    Mutation("fwd_barrier_after_load", "csrc/hip/fused_conv.cu", _FWD_LOOP_BARRIER,
             _FWD_LOOP_BARRIER.replace("__syncthreads();", "/* barrier removed */"), _FUSED_TESTS,
             why="SIMT forward K loop: the tiles are read before the other threads have stored them"),
    Mutation("fwd_barrier_after_compute", "csrc/hip/fused_conv.cu", _FWD_LOOP_END_BARRIER,
             _FWD_LOOP_END_BARRIER.replace("__syncthreads();", "/* barrier removed */"), _FUSED_TESTS,
             why="SIMT forward K loop: the next K step overwrites tiles other threads still read (Cin > 32)"),
    Mutation("fwd_offsets_short", "csrc/hip/fused_conv.cu", "for (int k = a.k0; k < a.k1; ++k) {",
             "for (int k = a.k0; k < a.k1 - 1; ++k) {", _FUSED_TESTS,
             why="SIMT forward (fused_forward_kernel's body): the last kernel offset of the split is skipped"),
    Mutation("dfilter_pairs_short", "csrc/hip/fused_conv.cu", "df_load_pairs(a, st, p0, t.pe);",
             "df_load_pairs(a, st, p0, t.pe - 1);", ["test/test_gpu_code_ops.py", "-k", "dfilter and f32"],
             why="SIMT dfilter (dfilter_kernel's body): the last pair of each split is dropped"),
    Mutation("subm_offset_off_by_one", "csrc/hip/subm_map.cu", _SUBM_OFFSET,
             _SUBM_OFFSET.replace("koff);", "koff);\n    if (k == 0) koff[g.ndim - 1] -= 1;"), _MAP_TESTS,
             why="SubM neighbours: the first kernel offset looks one cell short along the last axis"),
    Mutation("subm_mirror_dropped", "csrc/hip/subm_map.cu", _SUBM_MIRROR,
             "    if (false && k != kvol - 1 - k) record_pair(", ["test/test_gpu_code_subm_map.py", "-k", "cpu_route"],
             why="SubM map: the hits of offsets 0..kvol/2 no longer give their mirrors (offsets past kvol/2 empty)"),
    Mutation("conv_offset_off_by_one", "csrc/hip/kernel_map.cu", _CONV_OFFSET,
             _CONV_OFFSET.replace("koff);", "koff);\n      if (k == 0) koff[0] += 1;"), _CONV_MAP_TESTS,
             why="regular/transposed candidates: the first kernel offset is shifted one cell along the first axis"),
    Mutation("mfma_lane", "csrc/hip/fused_conv.cu", "lr = lane % 16, lq = lane / 16",
             "lr = (lane + 1) % 16, lq = lane / 16", ["test", "-m", "hip_cpu", "-k", "mfma"],
             requires="csrc/hip/emu", variant="mfma", why="MFMA body: each lane reads its neighbour's row / column"),
    Mutation("mfma_a_lane_roles_swapped", "csrc/hip/fused_conv_mfma.cuh",
             "&b.a[wave * 16 + lr][ks + 4 * lq]", "&b.a[wave * 16 + 4 * lq][ks + lr]",
             ["test/test_hip_cpu_variants.py", "test/test_gpu_code_network.py", "-k", "mfma"],
             requires="csrc/hip/emu", variant="mfma",
             why="MFMA forward: the A operand load swaps the roles of lane % 16 and lane / 16 (a transposed sub-tile)"),
    Mutation("simt_skip_other_rows", "csrc/hip/fused_conv.cu", "rows_have_source(st, ty * 4, 4)",
             "rows_have_source(st, (ty ^ 1) * 4, 4)", ["test/test_gpu_code_ops.py", "-k", "fused"],
             why="SIMT forward: a thread skips an offset by another thread's rows (the skip of rows without a source)"),
    Mutation("wmma_skip_other_rows", "csrc/hip/fused_conv.cu", "rows_have_source(st, wm * 16, 16)",
             "rows_have_source(st, (wm ^ 1) * 16, 16)", ["test/test_hip_cpu_variants.py", "-k", "wmma"],
             requires="csrc/hip/emu", variant="wmma",
             why="WMMA forward: a warp skips an offset by another warp's rows"),
    Mutation("mfma_b_halves_swapped", "csrc/hip/fused_conv_mfma.cuh",
             "b.bt[bn + 2 * i][bkk] = static_cast<uint16_t>(v[i]);",
             "b.bt[bn + 2 * i][bkk] = static_cast<uint16_t>(v[i] >> 16);",
             ["test/test_hip_cpu_variants.py", "-k", "mfma"], requires="csrc/hip/emu", variant="mfma",
             why="MFMA forward: the transposed filter tile takes a column's neighbour for even columns"),
    Mutation("mfma_dfilter_pairs_crossed", "csrc/hip/fused_conv.cu", "b.bt[c + i][p] = vb[i];",
             "b.bt[c + i][p ^ 1] = vb[i];", ["test/test_hip_cpu_variants.py", "-k", "mfma"],
             requires="csrc/hip/emu", variant="mfma",
             why="MFMA dfilter: each pair's dy row is multiplied with its neighbour pair's x row"),
    Mutation("mfma_stash_into_read_buffer", "csrc/hip/fused_conv_mfma.cuh", "mfma_stash(p, sm.buf[b ^ 1]);",
             "mfma_stash(p, sm.buf[b]);", ["test/test_hip_cpu_variants.py", "-k", "mfma"], requires="csrc/hip/emu",
             variant="mfma", why="MFMA forward: the next step's pieces overwrite the buffer being multiplied"),
    Mutation("mfma_dfilter_pairs_barrier_removed", "csrc/hip/fused_conv.cu",
             "    __syncthreads();  // the step's tile is stored; the other buffer's last reads are done\n", "",
             ["test/test_hip_cpu_variants.py", "-k", "mfma"], requires="csrc/hip/emu", variant="mfma", descending=True,
             why="pipelined MFMA dfilter: a step's tile is read before the other threads have stored it"),
    Mutation("mfma_dfilter_pairs_prefetch_same_step", "csrc/hip/fused_conv.cu",
             "if (p0 + BP < t.pe) fetch(p0 + BP, va, vb);", "if (p0 + BP < t.pe) fetch(p0, va, vb);",
             ["test/test_hip_cpu_variants.py", "-k", "mfma"], requires="csrc/hip/emu", variant="mfma",
             why="pipelined MFMA dfilter: the prefetch reads the current step's pairs again"),
    Mutation("mfma_last_step_dropped", "csrc/hip/fused_conv_mfma.cuh",
             "    mfma_multiply<T>(sm.buf[b], wave, lr, lq, acc);  // the last step", "",
             ["test/test_hip_cpu_variants.py", "-k", "mfma"], requires="csrc/hip/emu", variant="mfma",
             why="MFMA forward: the pipeline's last step is never multiplied"),
    Mutation("map_fill_last_writer", "csrc/hip/fused_conv.cu",
             "if (atomicCAS(nbr + int64_t(pair_out[p]) * kvol + lo, -1, pair_in[p]) != -1 && repeated) "
             "atomicExch(repeated, 1);",
             "nbr[int64_t(pair_out[p]) * kvol + lo] = pair_in[p];",
             ["test/test_duplicate_coords.py", "-k", "hip_cpu_build_fused_map"],
             why="fused table: a second pair of one (output, offset) silently replaces the first"),
    Mutation("inputs_visited_in_row_order", "csrc/hip/kernel_map.cu",
             "? pack_key(row[0], row + 1, g.in_shape, g.ndim) : kBadKey;", "? i : kBadKey;",
             ["test/test_gpu_map_order.py"],
             why="regular conv outputs numbered in first-seen order over the rows instead of the CPU route's "
                 "(coordinate key, row) order"),
    Mutation("pairs_in_key_order", "csrc/hip/kernel_map.cu", "b.flags[total + k * n + order[r]] = s >= 0;",
             "b.flags[total + k * n + r] = s >= 0;", ["test/test_gpu_map_order.py"],
             why="regular conv pairs of one offset in input key order instead of input row order"),
    Mutation("dfilter_table_last_scan", "csrc/hip/fused_conv.cu", "st.more = st.base < a.rows && st.seen < t.pe;",
             "st.more = st.base + kThreads < a.rows && st.seen < t.pe;", ["test/test_gpu_code_fused_backward.py"],
             why="dfilter on a table: the pairs of the column's last kThreads rows are never scanned"),
    Mutation("dinput_mirror_column", "csrc/hip/fused_conv.cu", "return a.mirror ? a.kvol - 1 - k : k;",
             "return k;", ["test/test_gpu_code_fused_backward.py"],
             why="dinput on a mirrored map reads the forward table's own column instead of its mirror"),
    Mutation("native_16bit_offset_results", "csrc/ops/gpu/conv_gpu.cpp",
             "at::empty({rows, c_dst}, src.options().dtype(acc.scalar_type()))",
             "at::empty({rows, c_dst}, src.options())", ["test/test_gpu_native_accumulation.py"],
             why="native route: each offset's FP16/BF16 GEMM result is rounded to 16 bits before the FP32 scatter"),
    Mutation("fused_order_unchecked", "csrc/ops/gpu/fused_gpu.cpp", "  check_fused_tables(nbr, order, x.size(0), map_info);\n",
             "", ["test/test_fused_table_checks.py"], why="fused_conv reads nbr / order without checking them"),
    Mutation("hash_insert_unbounded", "csrc/hip/coord_hash.h", "for (int64_t probe = 0; probe < cap; ++probe) {",
             "for (int64_t probe = 0;; ++probe) {", ["test/test_gpu_hash_bounds.py", "-k", "full_hash_table"],
             why="kernel-map hash insert probes forever once the table is full"),
    Mutation("map_info_ignored", "csrc/ops/checks.cpp", "  if (auto info = read_map_info(map_info, kvol, npairs)) {",
             "  if (auto info = std::optional<MapInfo>()) {", ["test/test_hip_cpu_host_syncs.py"],
             why="the ops copy the pairs' extremes to the host on every call although the map's record is given"),
    Mutation("int8_epilogue_truncates", "csrc/hip/quantized_conv.cu",
             "fminf(fmaxf(round_even(v), -128.f), 127.f)", "fminf(fmaxf(truncf(v), -128.f), 127.f)",
             _INT8_TESTS, why="int8 epilogue: the value is truncated toward zero instead of rounded to nearest even"),
    Mutation("int8_filter_column_wrapped", "csrc/hip/quantized_conv.cu", "a.w + (j % a.kvol) * a.k4 * a.cout",
             "a.w + (j % (a.kvol > 1 ? a.kvol - 1 : 1)) * a.k4 * a.cout", _INT8_TESTS,
             why="int8 conv: table column j multiplies the filters of the wrong offset (j mod kvol - 1)"),
    Mutation("int8_tail_words_dropped", "csrc/hip/quantized_conv.cu",
             "body.step(As, Bs, a.k4 - kw < kWords ? static_cast<int>(a.k4 - kw) : kWords);",
             "body.step(As, Bs, a.k4 - kw < kWords ? static_cast<int>(a.k4 - kw) - 1 : kWords);", _INT8_TESTS,
             why="int8 conv: the last K step skips its final word (the input-channel tail)"),
    Mutation("int8_mfma_lane", "csrc/hip/quantized_conv.cu", "const int av = As[rb + lr][ks + lq];",
             "const int av = As[rb + (lr + 1) % 16][ks + lq];", ["test/test_gpu_code_int8.py", "-k", "mfma"],
             requires="csrc/hip/emu", variant="mfma", why="int8 MFMA body: each lane reads its neighbour's row"),
    Mutation("int8_mma_b_k_halves", "csrc/hip/quantized_conv.cu",
             "static_cast<uint32_t>(Bs[ks + t][c]), static_cast<uint32_t>(Bs[ks + 4 + t][c])",
             "static_cast<uint32_t>(Bs[ks + 4 + t][c]), static_cast<uint32_t>(Bs[ks + t][c])",
             ["test/test_gpu_code_int8.py", "-k", "wmma"], requires="csrc/hip/emu", variant="wmma",
             why="NVIDIA integer MMA body: the two K halves of the B fragment are swapped"),
    Mutation("sm80_wait_one_group_short", "csrc/hip/fused_conv_sm80.cuh", "tc::cp_async_wait_group<S - 2>();",
             "tc::cp_async_wait_group<S - 1>();", ["test/test_hip_cpu_variants.py", "-k", "sm80"],
             requires="csrc/hip/emu", variant="sm80",
             why="pipelined sm_80 body: a K step is multiplied before its cp.async group is waited for"),
    Mutation("sm80_step_barrier_removed", "csrc/hip/fused_conv_sm80.cuh",
             "  __syncthreads();                   // everyone's have; step i - 1's stage is free\n", "",
             ["test/test_hip_cpu_variants.py", "-k", "sm80"], requires="csrc/hip/emu", variant="sm80",
             why="pipelined sm_80 body: no barrier between the threads' cp.async waits and the fragment loads"),
    Mutation("sm80_run_past_offset", "csrc/hip/fused_conv_sm80.cuh", "const int run = left < rest ? left : rest;",
             "const int run = rest;", ["test/test_hip_cpu_variants.py", "-k", "sm80"], requires="csrc/hip/emu",
             variant="sm80", why="pipelined sm_80 body: a run of copies goes past its offset's channels"),
    Mutation("sm80_skip_vote_one_step_late", "csrc/hip/fused_conv_sm80.cuh",
             "constexpr unsigned int kDue = 1u << (S - 1);", "constexpr unsigned int kDue = 1u << S;",
             ["test/test_hip_cpu_variants.py", "-k", "sm80"], requires="csrc/hip/emu", variant="sm80",
             why="pipelined sm_80 body: a step is skipped or multiplied by the vote of the step before it"),
    Mutation("sm80_skip_vote_per_lane", "csrc/hip/fused_conv_sm80.cuh", "is.busy = tc::warp_any(is.a_live);",
             "is.busy = is.a_live;", ["test/test_hip_cpu_variants.py", "-k", "sm80"], requires="csrc/hip/emu",
             variant="sm80", why="pipelined sm_80 body: a lane skips by its own copied row, not by its warp's rows"),
    Mutation("sm80_dfilter_step_barrier_removed", "csrc/hip/fused_conv.cu",
             "  __syncthreads();                           // everyone's have; stage (i - 1) % S is free\n", "",
             _SM80_DFILTER_TESTS, requires="csrc/hip/emu", variant="sm80",
             why="pipelined sm_80 dfilter: no barrier between the threads' cp.async waits and the fragment loads"),
    Mutation("sm80_dfilter_wait_one_group_short", "csrc/hip/fused_conv.cu",
             "tc::cp_async_wait_group<kDfStages - 2>();", "tc::cp_async_wait_group<kDfStages - 1>();",
             _SM80_DFILTER_TESTS, requires="csrc/hip/emu", variant="sm80",
             why="pipelined sm_80 dfilter: a step is multiplied before its cp.async group is waited for"),
    Mutation("sm80_dfilter_last_step_skipped", "csrc/hip/fused_conv.cu",
             "for (; int(i) < steps; ++i) {  // the last S - 1 steps",
             "for (; int(i) < steps - 1; ++i) {  // the last S - 1 steps", _SM80_DFILTER_TESTS,
             requires="csrc/hip/emu", variant="sm80",
             why="pipelined sm_80 dfilter (pairs): the loop stops one step short (the split's last pairs)"),
    Mutation("sm80_dfilter_table_last_step_skipped", "csrc/hip/fused_conv.cu",
             "for (int i = 0; i < issued; ++i) {", "for (int i = 0; i + 1 < issued; ++i) {",
             ["test/test_gpu_code_fused_backward.py", "-k", "sm80"], requires="csrc/hip/emu", variant="sm80",
             why="pipelined sm_80 dfilter (table): the loop stops one step short (the split's last pairs)"),
]


# The tests that look at each kernel file's outputs (both thread orders where the file parametrizes them).
KERNEL_TESTS = {
    "fused_conv.cu": ["test/test_gpu_code_ops.py", "test/test_hip_cpu_variants.py", "-k", "fused or same_bits"],
    "quantized_conv.cu": ["test/test_gpu_code_int8.py"],
    "grouped_conv.cu": ["test/test_gpu_code_grouped.py"],
    "kernel_map.cu": ["test/test_gpu_code_conv_map.py"],
    "subm_map.cu": ["test/test_gpu_code_subm_map.py"],
    "gather_scatter.cu": ["test/test_gpu_code_ops.py", "test/test_gpu_code_grouped.py", "-k",
                          "native_route or routes_match_cpu"],  # the grouped native route scatter-adds
    "hash_table_ops.cu": ["test/test_gpu_code_ops.py", "-k", "hash_table"],
    "point_to_voxel.cu": ["test/test_gpu_code_ops.py", "-k", "point_to_voxel"],
    "pool.cu": ["test/test_gpu_code_ops.py", "test/test_pool_gpu_code.py", "-k", "pooling or pool_ops or hip_cpu"],
}
# Code in this preprocessor branch is compiled only where the sm_80 bodies are (the emulated sm80 variant).
_SM80_IF = "#if defined(SPCONV_FORWARD_SM80)"


def _sm80_lines(text: str) -> set:
    """The (1-based) lines inside an `#if defined(SPCONV_FORWARD_SM80)` branch (before its #else / #elif)."""
    stack, out = [], set()
    for n, line in enumerate(text.splitlines(), 1):
        d = line.strip()
        if d.startswith(("#if ", "#ifdef", "#ifndef")):
            stack.append(d == _SM80_IF)
        elif d.startswith(("#else", "#elif")) and stack:
            stack[-1] = False
        elif d.startswith("#endif") and stack:
            stack.pop()
        elif any(stack):
            out.add(n)
    return out


# A kernel's first loop: a for header's `i < bound` or a loop macro's element count (SPCONV_POOL_LOOP(m, c)).
_FIRST_BOUND = re.compile(r"for \(([^;]*);\s*(\w+) < ([^;]+);|(SPCONV_\w+_LOOP)\(([^,()]+),")


def _body_end(text: str, start: int) -> int:
    """The position of the brace that closes the block opened just before ``start``."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def generated_mutations(root: str = REPO) -> List[Mutation]:
    """Each barrier of each kernel file removed, and each kernel's first loop bound lowered by one."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, "csrc", "hip", "*.cu"))):
        name = os.path.basename(path)
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        stem = name[:-len(".cu")]
        with open(path) as f:
            text = f.read()
        if "__global__" in text and name not in KERNEL_TESTS:
            raise RuntimeError("%s has kernels but no tests listed in KERNEL_TESTS" % rel)
        tests = KERNEL_TESTS.get(name)
        sm80 = _sm80_lines(text)
        for i, hit in enumerate(re.finditer(re.escape("__syncthreads();"), text)):
            line = _line_of(text, hit.start())
            if line in sm80:  # code of the sm80 variant only
                extra = dict(variant="sm80", requires="csrc/hip/emu")
                kernel_tests = ["test/test_hip_cpu_variants.py", "test/test_gpu_code_fused_backward.py", "-k", "sm80"]
            else:
                extra, kernel_tests = {}, tests
            out.append(Mutation("%s_barrier_L%d" % (stem, line), rel, "__syncthreads();", "/* barrier removed */",
                                kernel_tests, occurrence=i, descending=True,
                                why="%s:%d: the barrier removed" % (rel, line), **extra))
        for kernel in re.finditer(r"__global__[^{;]*?(\w+)\s*\([^(){};]*\)\s*\{", text):
            loop = _FIRST_BOUND.search(text, kernel.end(), _body_end(text, kernel.end()))
            if loop is None:
                continue  # no loop in its own body: one thread, or a body function (hand-written mutations)
            old = loop.group(0)
            if loop.group(4):  # a loop macro: one row of elements fewer
                bound, new = loop.group(5), "%s((%s) - 1," % (loop.group(4), loop.group(5))
            else:
                bound, new = loop.group(3), "for (%s; %s < (%s) - 1;" % (loop.group(1), loop.group(2), loop.group(3))
            out.append(Mutation("%s_%s_bound" % (stem, kernel.group(1)), rel, old, new, tests,
                                occurrence=text.count(old, 0, loop.start()), descending=True,
                                why="%s:%d: %s's loop stops one short of %s" % (
                                    rel, _line_of(text, loop.start()), kernel.group(1), bound.strip())))
    return out


def all_mutations() -> List[Mutation]:
    return MUTATIONS + generated_mutations()


def apply(m: Mutation, root: str):
    path = os.path.join(root, m.path)
    with open(path) as f:
        s = f.read()
    at = -1
    for _ in range(m.occurrence + 1):
        at = s.find(m.old, at + 1)
        if at < 0:
            raise RuntimeError("%s: anchor not found in %s (the source changed; update the mutation)" % (m.name,
                                                                                                       m.path))
    with open(path, "w") as f:
        f.write(s[:at] + m.new + s[at + len(m.old):])


def run_one(m: Mutation, jobs: Optional[int]) -> str:
    if m.requires and not os.path.exists(os.path.join(REPO, m.requires)):
        return "skipped (%s does not exist yet)" % m.requires
    tmp = tempfile.mkdtemp(prefix="spconv-mutant-")
    try:
        shutil.copytree(os.path.join(REPO, "csrc"), os.path.join(tmp, "csrc"))
        # csrc/ops/build_info.cpp includes the public header shipped inside the package
        shutil.copytree(os.path.join(REPO, "spconv", "include"), os.path.join(tmp, "spconv", "include"))
        apply(m, tmp)
        t0 = time.time()
        try:
            hip_cpu_build.build(m.variant, tmp, jobs=jobs)
        except hip_cpu_build.BuildError as e:
            return "ERROR (mutant does not build: %s)" % str(e).splitlines()[0]
        env = dict(os.environ, SPCONV_HIP_CPU_SOURCE_ROOT=tmp)
        if m.descending:
            env["SPCONV_HIP_CPU_THREAD_ORDER"] = "descending"
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"] + m.tests
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        tail = (r.stdout.strip().splitlines() or [""])[-1]
        took = "%.0f s" % (time.time() - t0)
        if r.returncode == 1:
            return "caught (%s; %s)" % (tail, took)
        if r.returncode == 0:
            return "SURVIVED (%s; %s)" % (tail, took)
        return "ERROR (pytest exit %d: %s)" % (r.returncode, tail)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="mutation names")
    ap.add_argument("--match", default=None, help="only the mutations whose name contains this text")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args(argv)
    every = all_mutations()
    unknown = set(a.only or []) - {m.name for m in every}
    if unknown:
        print("hip_cpu_mutation: no mutation named %s (--list shows them)" % ", ".join(sorted(unknown)), file=sys.stderr)
        return 2
    chosen = [m for m in every if (not a.only or m.name in a.only) and (not a.match or a.match in m.name)]
    if a.list:
        for m in chosen:
            print("%-40s %s: %s" % (m.name, m.path, m.why))
        return 0
    why = hip_cpu_build.missing_requirements()
    if why:
        print("hip_cpu_mutation: " + why, file=sys.stderr)
        return 2
    bad = 0
    for m in chosen:
        res = run_one(m, a.jobs)
        print("%-40s %s" % (m.name, res), flush=True)
        bad += res.startswith(("SURVIVED", "ERROR"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
