"""Loading sparse-conv weights saved in another layout (spconv 1.x checkpoints, SPCONV_SAVED_WEIGHT_LAYOUT).

spconv 2.x stores KRSC ``[Cout, *k, Cin]``; spconv 1.x stored RSCK ``[*k, Cin, Cout]``; some exports use RSKC
``[*k, Cout, Cin]``. With ``SPCONV_SAVED_WEIGHT_LAYOUT`` set, the saved weight is permuted from that layout
(spconv 2.3.8 permutes twice there, so such loads always fail; here they work). Unset, the layout is read off
the shape: a weight already shaped like the module's is kept, else a RSCK (then RSKC) shape is converted. A
shape that fits both KRSC and another layout (Cin == Cout == every kernel size) is taken as KRSC: set the
variable for such spconv 1.x checkpoints.

This runs as a load_state_dict pre-hook, as spconv 2.x's does, and the conv classes keep torch's
``_load_from_state_dict``: a replacement installed on ``SparseModule`` (mmdetection3d permutes mmcv's spconv 1.x
weights there when a checkpoint's metadata version is not 2) reaches every conv as in spconv 2.x. While such a
replacement is installed it owns the weight layout and the shape-based conversion here stands aside (both would
permute the same weight).
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


def load_pre_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """``Module._register_load_state_dict_pre_hook(..., with_module=True)`` hook of the sparse convs and pools."""
    fix_voxel_counter(module, state_dict, prefix)
    if type(module)._load_from_state_dict is torch.nn.Module._load_from_state_dict:
        convert_saved_weight(module, state_dict, prefix)


def fix_voxel_counter(module, state_dict: Dict[str, torch.Tensor], prefix: str) -> None:
    """Checkpoints with and without record_voxel_count's counter load into modules with and without it."""
    counter = prefix + _MAX_NUM_VOXELS_DURING_TRAINING
    mine = getattr(module, _MAX_NUM_VOXELS_DURING_TRAINING, None)
    if counter in state_dict and mine is None:
        del state_dict[counter]
    elif counter not in state_dict and mine is not None:
        state_dict[counter] = torch.zeros_like(mine)


def convert_saved_weight(module, state_dict: Dict[str, torch.Tensor], prefix: str) -> None:
    """Rewrites ``state_dict[prefix + "weight"]`` to the module's KRSC layout, in place."""
    key = prefix + "weight"
    weight = state_dict.get(key)
    if not isinstance(weight, torch.Tensor):
        return
    # A grouped conv's weight holds Cin/groups input channels per output channel, in every layout.
    ndim, cout, cin = module.ndim, module.out_channels, module.in_channels // getattr(module, "groups", 1)
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
