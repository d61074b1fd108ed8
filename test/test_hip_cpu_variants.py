"""Every HIP CPU build variant (tools/hip_cpu_build.py VARIANTS: plain SIMT, emulated WMMA, emulated MFMA)
runs the fused forward, dinput and dfilter of FP16/BF16 within tolerance of an FP64 reference. A variant
is skipped until the tree enables it (the emulation headers under csrc/hip/emu)."""
import sys

import pytest
import torch

from conftest import _TOOLS, hip_cpu_library
from test_hip_cpu_ops import TOL, as_maps, fused_inputs, geometry, native_f64, rel_err

sys.path.insert(0, _TOOLS)
import hip_cpu_build  # noqa: E402

pytestmark = pytest.mark.hip_cpu

cpu = torch.ops.spconv


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("channels", [(40, 72), (13, 70)], ids=["vec", "scalar"])
@pytest.mark.parametrize("variant", sorted(hip_cpu_build.VARIANTS))
def test_variant_fused_low_precision(variant, channels, dtype):
    ops = hip_cpu_library(variant)
    cin, cout = channels
    idx, args = geometry(shape=[6, 7, 5], batch=2, n=120, ksize=3)
    m = as_maps(cpu.get_indice_pairs(idx, *args), idx.shape[0])
    x, w, dy = fused_inputs(m, cin, cout, dtype)
    y = ops.fused_conv(x, w, *ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 2))
    dx = ops.fused_conv(dy, w.transpose(1, 2).contiguous(),
                        *ops.build_fused_map(m.pair_out, m.pair_in, m.pair_offsets, m.num_in, 2))
    dw = ops.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets)
    for what, got, ref in zip(("forward", "dinput", "dfilter"), (y, dx, dw), native_f64(x, w, dy, m)):
        assert rel_err(got, ref) < TOL[dtype], "%s %s: relative error %g" % (variant, what, rel_err(got, ref))
