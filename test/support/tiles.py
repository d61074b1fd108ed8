"""Random fp16 / bf16 tiles as raw bits, and the plain products the matrix-core emulators are checked against."""
import numpy as np

U = 2.0 ** -24  # unit roundoff of fp32


def bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def to_bits(x, dtype):
    x = np.asarray(x, dtype=np.float32)
    return x.astype(np.float16).view(np.uint16) if dtype == "f16" else bf16_bits(x)


def from_bits(bits, dtype):
    bits = np.asarray(bits, dtype=np.uint16)
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def random_bits(rng, dtype, shape):
    """Normal values with some signed zeros and subnormals mixed in (the widening must get those right too)."""
    bits = to_bits(rng.standard_normal(shape), dtype)
    special = rng.random(shape)
    sub_max = 0x400 if dtype == "f16" else 0x80
    sign = (rng.integers(0, 2, shape) << 15).astype(np.uint16)
    bits = np.where(special < 0.03, sign | rng.integers(1, sub_max, shape).astype(np.uint16), bits)
    bits = np.where((special >= 0.03) & (special < 0.05), sign, bits)
    return bits.astype(np.uint16)


def exact_fp32_product(a, b, c):
    """c + sum_s a[s] @ b[s] in fp32, each product exact, added one at a time in (s, k) order."""
    d = np.broadcast_to(np.asarray(c, dtype=np.float32), (a.shape[1], b.shape[2])).copy()
    for s in range(a.shape[0]):
        for k in range(a.shape[2]):
            d = d + a[s, :, k, None].astype(np.float32) * b[s, None, k, :].astype(np.float32)
    return d


def within_fp32_rounding(d, a, b, c):
    """|d - (c + sum a b)| within the error bound of an fp32 sum of exact products (fp64 reference)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.asarray(c, dtype=np.float64) + np.einsum("sik,skj->ij", a64, b64)
    mag = np.abs(np.asarray(c, dtype=np.float64)) + np.einsum("sik,skj->ij", np.abs(a64), np.abs(b64))
    n = a.shape[0] * a.shape[2] + 1
    bound = 1.01 * n * U * mag + n * 2.0 ** -149
    err = np.abs(d.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"error {err[worst]} over the bound {bound[worst]} at {worst}"
