"""Every instruction-set path of the hand-written CPU kernels gives the others' results: SPCONV_CPU_ISA caps the
run-time choice (avx512, avx2, generic), and the same layers run in a subprocess under each cap. The depthwise
loops and the fused gather-GEMM-scatter kernels run the same FMA chains on AVX2 and AVX-512 (same bits); the
other kernels may sum in another order per ISA (results are bitwise reproducible on one machine, for any thread
count, not across instruction sets)."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN = r"""
import sys
import torch
import spconv.pytorch as spconv
from spconv import _backend

torch.manual_seed(0)
shape = [14, 13, 12]
coords = torch.unique(torch.randint(0, 12, (900, 3), dtype=torch.int32), dim=0)
idx = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), coords], 1)
layers = {
    "depthwise": spconv.SubMConv3d(32, 32, 3, groups=32, indice_key="s"),
    "groups4": spconv.SubMConv3d(16, 32, 3, groups=4, indice_key="s"),
    "groups2_wide": spconv.SubMConv3d(64, 64, 3, groups=2, indice_key="s"),
    "strided_groups8": spconv.SparseConv3d(32, 32, 3, 2, 1, groups=8),
    "dense_subm": spconv.SubMConv3d(16, 24, 3, indice_key="s"),
    # gather-GEMM-scatter: the fused kernel (AVX-512: cout % 16 == 0, AVX2: cout % 8 == 0) or the vendor GEMM,
    # forward and dinput; dW: fused on AVX-512 (cout % 16 == 0) and AVX2 (cout % 8 == 0, <= 64)
    "gemm_subm": spconv.SubMConv3d(64, 80, 3, indice_key="s"),
    "gemm_strided": spconv.SparseConv3d(48, 32, 3, 2, 1),
    "gemm_cout8": spconv.SubMConv3d(40, 24, 3, indice_key="s"),
    # FP64: the fused kernels on AVX-512 (Cout a multiple of 8), the vendor GEMM under the caps
    "gemm_subm_fp64": spconv.SubMConv3d(48, 40, 3, indice_key="s").double(),
    "gemm_strided_fp64": spconv.SparseConv3d(40, 32, 3, 2, 1).double(),
    "maxpool": spconv.SparseMaxPool3d(3, 2, 1),
}
out = {}
for name, layer in layers.items():
    cin = layer.in_channels if hasattr(layer, "in_channels") else 16
    x = torch.randn(len(idx), cin, dtype=next(iter(layer.parameters()), torch.empty(0)).dtype, requires_grad=True)
    y = layer(spconv.SparseConvTensor(x, idx, shape, 1)).features
    y.backward(torch.randn_like(y))
    out[name] = [y.detach(), x.grad] + [p.grad for p in layer.parameters()]
# Depthwise output and dinput of over 32 MB: AVX-512 stores them past the cache (the same values).
big = torch.unique(torch.randint(0, 48, (200000, 3), dtype=torch.int32), dim=0)[:66000]
big = torch.cat([torch.zeros(len(big), 1, dtype=torch.int32), big], 1)
layer = spconv.SubMConv3d(128, 128, 3, groups=128, bias=False, indice_key="b")
x = torch.randn(len(big), 128, requires_grad=True)
y = layer(spconv.SparseConvTensor(x, big, [48] * 3, 1)).features
y.backward(torch.randn_like(y))
out["depthwise_streamed"] = [y.detach(), x.grad, layer.weight.grad]
# Weight layouts of 4-byte elements (whole 16 x 16 tiles through registers, and the edges): raw bits, NaN
# payloads included, next to the permute they stand for.
bits = torch.randint(-2**31, 2**31 - 1, (40, 3, 3, 3, 33), dtype=torch.int32)
f = torch.ops.spconv.weight_to_filters(bits.view(torch.float32), 2)
small = bits[:17, ..., :19].contiguous()
out["weight_layout"] = [
    f.view(torch.int32), bits.reshape(2, 20, 27, 33).permute(2, 0, 3, 1).contiguous(),
    torch.ops.spconv.filters_to_weight(f, [3, 3, 3]).view(torch.int32), bits,
    torch.ops.spconv.weight_to_filters(small.view(torch.float32), 1).view(torch.int32),
    small.reshape(1, 17, 27, 19).permute(2, 0, 3, 1).contiguous()]
out["cpu_isa"] = _backend.build_info()["cpu_isa"]
torch.save(out, sys.argv[1])
"""


def run_under(isa, tmp_path):
    env = dict(os.environ)
    env.pop("SPCONV_CPU_ISA", None)
    if isa is not None:
        env["SPCONV_CPU_ISA"] = isa
    path = str(tmp_path / ("out_%s.pt" % isa))
    subprocess.run([sys.executable, "-c", RUN, path], cwd=ROOT, env=env, check=True, timeout=300)
    return torch.load(path)


@pytest.mark.slow
def test_instruction_set_paths_agree(tmp_path):
    best = run_under(None, tmp_path)
    if best.pop("cpu_isa") == "generic":
        pytest.skip("this CPU has no AVX2/FMA: only the portable loops exist here")
    avx2 = run_under("avx2", tmp_path)
    generic = run_under("generic", tmp_path)
    assert avx2.pop("cpu_isa") == "avx2" and generic.pop("cpu_isa") == "generic"  # the cap took effect
    # Same bits on AVX-512 and AVX2: the depthwise loops (all results), the fused kernels (output and dinput;
    # dW where both have a fused kernel: AVX-512 cout % 16 == 0, AVX2 cout % 8 == 0 and <= 64, as gemm_strided's
    # 32). The wide-group forward (at least 16 channels per group) buckets the pairs by offset on both: the same
    # chains (groups2_wide's output).
    same_bits = {"depthwise": 4, "depthwise_streamed": 3, "gemm_subm": 2, "gemm_strided": 3, "gemm_cout8": 2,
                 "groups2_wide": 1, "weight_layout": 6}
    for res in (best, avx2, generic):  # the layouts move bits: each equals its permute, and its inverse the weight
        layout = res["weight_layout"]
        assert torch.equal(layout[0], layout[1]) and torch.equal(layout[2], layout[3])
        assert torch.equal(layout[4], layout[5])
    for name in best:
        for i, (a, b, c) in enumerate(zip(best[name], avx2[name], generic[name])):
            if i < same_bits.get(name, 0):
                assert torch.equal(a, b), (name, i)
            # Another summation order: within 1e-5 of the tensor's scale (a dW element sums thousands of
            # products of magnitude ~1 into values up to ~100).
            tol = 1e-12 if a.dtype == torch.float64 else 1e-5
            atol = tol * max(1.0, float(a.abs().max()))
            torch.testing.assert_close(b, a, atol=atol, rtol=tol, msg=lambda m: f"{name}[{i}]: {m}")
            torch.testing.assert_close(c, a, atol=atol, rtol=tol, msg=lambda m: f"{name}[{i}]: {m}")
