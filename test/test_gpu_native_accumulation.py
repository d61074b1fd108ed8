"""The native GPU route accumulates 16-bit convolutions in FP32 across kernel offsets, as the CPU route does:
each offset's GEMM result is not rounded to 16 bits before it is added."""
import pytest
import torch

import spconv._backend  # noqa: F401

cpu = torch.ops.spconv

# Per offset, 1 * big + 1 * big + 1 * 1 = 2 big + 1 is not representable in the dtype (it rounds to 2 big);
# three offsets sum exactly to 6 big + 3 in FP32, which rounds to 6 big + 4. Rounding each offset first gives
# 6 big. Every FP32 step is exact (small integers), so the routes must agree bit for bit.
BIG = {torch.float16: 1024.0, torch.bfloat16: 128.0}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_offsets_accumulate_in_fp32(dtype, gpu_place):
    """Before: 6 big (each offset's GEMM rounded to 16 bits before the FP32 scatter); the CPU gives 6 big + 4."""
    big = BIG[dtype]
    kvol = 3
    offsets = torch.arange(kvol + 1, dtype=torch.int64)
    # forward: inputs 0, 1, 2 feed output 0 through offsets 0, 1, 2; cin 3, cout 1
    x = torch.ones(3, 3, dtype=dtype)
    w = torch.tensor([big, big, 1.0], dtype=dtype).reshape(1, 3, 1).repeat(kvol, 1, 1)
    pin, pout = torch.arange(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    on = gpu_place.to
    y = gpu_place.ops.indice_conv(on(x), on(w), on(pin), on(pout), on(offsets), 1).cpu()
    assert torch.equal(y, cpu.indice_conv(x, w, pin, pout, offsets, 1))
    assert float(y) == 6 * big + 4
    # dinput: output rows 0, 1, 2 reach input 0 through offsets 0, 1, 2; cin 1, cout 3
    x1 = torch.ones(1, 1, dtype=dtype)
    w1 = torch.tensor([big, big, 1.0], dtype=dtype).reshape(1, 1, 3).repeat(kvol, 1, 1)
    dy = torch.ones(3, 3, dtype=dtype)
    pin1, pout1 = torch.zeros(3, dtype=torch.int32), torch.arange(3, dtype=torch.int32)
    dx, dw = (t.cpu() for t in gpu_place.ops.indice_conv_backward(on(x1), on(w1), on(dy), on(pin1), on(pout1),
                                                                   on(offsets)))
    dx_ref, dw_ref = cpu.indice_conv_backward(x1, w1, dy, pin1, pout1, offsets)
    assert torch.equal(dx, dx_ref) and float(dx) == 6 * big + 4
    assert torch.equal(dw, dw_ref)
