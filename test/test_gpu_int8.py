"""int8 inference on a real GPU: quantized_conv against the plain integer reference (and the CPU op where the
extension has one), bit for bit over channel tails, kernel volumes, table rounds and epilogue options; map_info
without a host copy; the body named by quantized_conv_path; int8 max pooling against the CPU float max pooling.
Skips where no GPU (or no GPU kernels) is present."""
import pytest
import torch

from support.int8_reference import int8_conv_reference, random_table
from support.sites import coords

pytestmark = pytest.mark.gpu  # skipped without a GPU (conftest)

ops = torch.ops.spconv
DEV = "cuda"


def _int8(shape, g):
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int32).to(torch.int8)


def _case(cin, cout, kvol, rounds, n_in=300, n_out=400, seed=0, fill=0.5):
    g = torch.Generator().manual_seed(seed)
    x, w = _int8((n_in, cin), g), _int8((kvol, cin, cout), g)
    nbr = random_table(n_in, n_out, kvol, rounds, fill, g)
    spread = 127.0 * 128.0 * max(1.0, (kvol * rounds * fill * cin) ** 0.5)
    scale = ((torch.rand(cout, generator=g) * 4 + 0.5) * 40.0 / spread).float()
    bias = ((torch.rand(cout, generator=g) - 0.5) * 60).float()
    res = _int8((n_out, cout), g)
    return x, w, nbr, scale, bias, res


def _cpu_has_op():
    try:
        ops.quantized_conv(torch.zeros(1, 1, dtype=torch.int8), torch.zeros(1, 1, 1, dtype=torch.int8),
                           torch.zeros(1, 1, dtype=torch.int32), torch.ones(1), None, None, 1.0, 0, 0.0)
        return True
    except (NotImplementedError, RuntimeError):
        return False


@pytest.mark.parametrize("cin,cout,kvol,rounds", [(1, 1, 1, 1), (3, 16, 27, 1), (17, 33, 27, 2), (64, 64, 27, 1),
                                                  (96, 128, 8, 2), (128, 200, 27, 1), (256, 256, 1, 1)])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_matches_reference(cin, cout, kvol, rounds, act):
    x, w, nbr, scale, bias, res = _case(cin, cout, kvol, rounds, seed=cin + cout + act)
    want = int8_conv_reference(x, w, nbr, scale, bias, res, 0.37, act, 0.1)
    got = ops.quantized_conv(x.to(DEV), w.to(DEV), nbr.to(DEV), scale.to(DEV), bias.to(DEV), res.to(DEV), 0.37, act,
                             0.1).cpu()
    assert torch.equal(got, want)
    if _cpu_has_op():
        assert torch.equal(ops.quantized_conv(x, w, nbr, scale, bias, res, 0.37, act, 0.1), got)


def test_large_and_empty():
    x, w, nbr, scale, bias, _ = _case(64, 96, 27, 1, n_in=20000, n_out=30000, seed=5)
    want = int8_conv_reference(x, w, nbr, scale, bias, None, 1.0, 1, 0.0)
    got = ops.quantized_conv(x.cuda(), w.cuda(), nbr.cuda(), scale.cuda(), bias.cuda(), None, 1.0, 1, 0.0)
    assert torch.equal(got.cpu(), want)
    again = ops.quantized_conv(x.cuda(), w.cuda(), nbr.cuda(), scale.cuda(), bias.cuda(), None, 1.0, 1, 0.0)
    assert torch.equal(again, got)  # run to run
    assert ops.quantized_conv(x.cuda(), w.cuda(), nbr[:0].cuda(), scale.cuda(), None, None, 1.0, 0, 0.0).shape == (0, 96)


def test_path_names_a_body():
    name = ops.quantized_conv_path(torch.zeros(1, 4, dtype=torch.int8, device=DEV))
    assert name in {"sdot4", "dp4a", "mfma_i8", "mma_s8", "simt"}
    if torch.version.cuda is not None:  # integer MMA from sm_80, dp4a from sm_61
        cap = torch.cuda.get_device_capability()
        assert name == ("mma_s8" if cap >= (8, 0) else "dp4a" if cap >= (6, 1) else "simt")
    elif torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        want = {"gfx906": "sdot4", "gfx908": "sdot4", "gfx90a": "mfma_i8", "gfx940": "mfma_i8", "gfx941": "mfma_i8",
                "gfx942": "mfma_i8"}
        assert name == want.get(arch, "simt"), arch


def test_map_info_and_bad_table():
    shape = [20, 20, 20]
    idx = coords(shape, 1, 2000, seed=4).to(DEV)
    _, _, _, _, info, table = ops.get_indice_pairs(idx, 1, shape, shape, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True,
                                                   False)
    g = torch.Generator().manual_seed(1)
    x, w = _int8((idx.shape[0], 32), g).to(DEV), _int8((27, 32, 32), g).to(DEV)
    scale = torch.full((32,), 2e-4, device=DEV)
    want = int8_conv_reference(x.cpu(), w.cpu(), table.cpu(), scale.cpu(), None, None, 1.0, 0, 0.0)
    got = ops.quantized_conv(x, w, table, scale, None, None, 1.0, 0, 0.0, info)
    assert torch.equal(got.cpu(), want)
    bad = table.clone()
    bad[0, 0] = idx.shape[0]
    with pytest.raises(ValueError, match="nbr entries"):
        ops.quantized_conv(x, w, bad, scale, None, None, 1.0, 0, 0.0)


def test_int8_maxpool_matches_cpu_float():
    shape = [16, 16, 16]
    idx = coords(shape, 2, 1500, seed=8)
    args = (2, shape, [8, 8, 8], [2] * 3, [2] * 3, [0] * 3, [1] * 3, False, False)
    out_idx, pin, pout, poff, info, _ = ops.get_indice_pairs(idx, *args)
    x = _int8((idx.shape[0], 35), torch.Generator().manual_seed(2))
    want = ops.indice_maxpool(x.float(), pin, pout, poff, out_idx.shape[0])
    d = [t.to(DEV) for t in (x, pin, pout, poff)]
    got = ops.indice_maxpool(*d, out_idx.shape[0], info)
    assert got.dtype == torch.int8 and torch.equal(got.cpu().float(), want)
