"""The GPU kernel-map builder validates the indices on the device: only a few numbers travel to the host, never
the indices themselves (unless a check fails and the message needs the row)."""
import pytest
import torch

import spconv._backend  # noqa: F401

from support.sites import coords


def host_copies_of(prof, shape):
    return [e.name for e in prof.events()
            if e.name in ("aten::to", "aten::_to_copy", "aten::cpu") and any(list(s) == list(shape)
                                                                           for s in e.input_shapes)]


@pytest.mark.parametrize("subm", [True, False])
def test_indices_stay_on_the_device(subm, gpu_place):
    """Before: get_indice_pairs copied every index row to the host to check it."""
    shape = [9, 8, 7]
    idx = gpu_place.to(coords(shape, 2, 200, seed=3))
    out_shape = shape if subm else [(v + 2 - 2 - 1) // 2 + 1 for v in shape]
    args = (idx, 2, shape, out_shape, [3] * 3, [1 if subm else 2] * 3, [1] * 3, [1] * 3, subm, False)
    with torch.profiler.profile(record_shapes=True) as prof:
        gpu_place.ops.get_indice_pairs(*args)
    assert not host_copies_of(prof, idx.shape)
    bad = idx.clone()
    bad[17, 2] = shape[1]
    with pytest.raises(ValueError, match="indices row 17"):
        gpu_place.ops.get_indice_pairs(bad, *args[1:])
