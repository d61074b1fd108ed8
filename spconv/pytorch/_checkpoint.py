"""Loading sparse-conv weights saved in another layout (spconv 1.x checkpoints, SPCONV_SAVED_WEIGHT_LAYOUT).

spconv 2.x stores KRSC ``[Cout, *k, Cin]``; spconv 1.x stored RSCK ``[*k, Cin, Cout]``; some exports use RSKC
``[*k, Cout, Cin]``. With ``SPCONV_SAVED_WEIGHT_LAYOUT`` set, the saved weight is permuted from that layout
(spconv 2.3.8 permutes twice there, so such loads always fail; here they work). Unset, the layout is read off
the shape: a weight already shaped like the module's is kept, else a RSCK (then RSKC) shape is converted. A
shape that fits both KRSC and another layout (Cin == Cout == every kernel size) is taken as KRSC: set the
variable for such spconv 1.x checkpoints.
"""
from typing import Dict, List

import torch

from spconv import constants

_MAX_NUM_VOXELS_DURING_TRAINING = "max_num_voxels_during_training"


def _permutation(layout: str, ndim: int) -> List[int]:
    """Axes that turn a weight saved in ``layout`` into KRSC."""
    if layout == "RSCK":  # [*k, Cin, Cout]
        return [ndim + 1, *range(ndim), ndim]
    if layout == "RSKC":  # [*k, Cout, Cin]
        return [ndim, *range(ndim), ndim + 1]
    return list(range(ndim + 2))


def _saved_shape(layout: str, cout: int, ksize: List[int], cin: int) -> List[int]:
    return {"KRSC": [cout, *ksize, cin], "RSCK": [*ksize, cin, cout], "RSKC": [*ksize, cout, cin]}[layout]


def convert_saved_weight(module, state_dict: Dict[str, torch.Tensor], prefix: str) -> None:
    """Rewrites ``state_dict[prefix + "weight"]`` to the module's KRSC layout, in place."""
    # spconv 2.x modules built with record_voxel_count save a counter buffer this module may not have.
    counter = prefix + _MAX_NUM_VOXELS_DURING_TRAINING
    if counter in state_dict and not hasattr(module, _MAX_NUM_VOXELS_DURING_TRAINING):
        del state_dict[counter]
    key = prefix + "weight"
    weight = state_dict.get(key)
    if not isinstance(weight, torch.Tensor):
        return
    ndim, cout, cin = module.ndim, module.out_channels, module.in_channels
    ksize = list(module.kernel_size)
    layout = constants.SAVED_WEIGHT_LAYOUT
    if not layout:
        layout = next((lay for lay in ("KRSC", "RSCK", "RSKC")
                       if list(weight.shape) == _saved_shape(lay, cout, ksize, cin)), "")
        if not layout:
            return  # no known layout fits: the regular size-mismatch error names the key
    elif list(weight.shape) != _saved_shape(layout, cout, ksize, cin):
        raise RuntimeError(f"{key}: SPCONV_SAVED_WEIGHT_LAYOUT={layout} expects shape "
                           f"{_saved_shape(layout, cout, ksize, cin)}, the checkpoint has {list(weight.shape)}")
    if layout != "KRSC":
        state_dict[key] = weight.permute(*_permutation(layout, ndim)).contiguous()
