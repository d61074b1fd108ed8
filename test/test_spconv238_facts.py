"""This package against facts captured from the real spconv 2.3.8 (test/data/spconv238_facts.json): constructor
signatures, print(model) text, state_dict keys and buffers, public names, constants, spconv.test_utils, version.

Always on: the captured file is the reference. With ``SPCONV_REFERENCE_PYTHON`` set to an interpreter that imports
the real spconv, ``test_live_facts`` reads the same facts there (same collector) and checks the file is current.
"""
import importlib
import importlib.util
import inspect
import json
import os
import re
import tempfile

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "spconv238_facts.json")
WORKER = os.path.join(HERE, "support", "reference_worker.py")

# Keyword-only parameters this package adds after spconv's own (a positional call means what it means there).
# groups: keyword-only on the inverse convs, whose spconv 2.x signature lacks it (the other convs have it).
ALLOWED_EXTRA_KEYWORDS = {"act_type", "act_alpha", "act_beta", "output_padding", "groups"}

# spconv 2.3.8 names deliberately absent here, with the reason. Anything else spconv defines must resolve.
ABSENT = {
    # the compiled CUDA/cumm machinery and its build helpers
    "spconv": {"build", "core_cc", "cppconstants", "debug_utils", "tools"},
    "spconv.pytorch": {"cppcore"},
    "spconv.pytorch.ops": {"CUDAKernelTimer", "ConvGemmOps", "ExternalAllocator", "InferenceOps", "SpconvOps",
                           "ThrustSortAllocator", "TorchAllocator", "TorchSpconvMatmul", "fused_indice_conv",
                           "get_arch", "get_current_stream", "torch_tensor_to_tv", "nullcontext"},
    "spconv.pytorch.core": {"CUDAKernelTimer", "ThrustSortAllocator"},
    "spconv.pytorch.functional": {"CUDAKernelTimer", "identity_decorator", "spconv_save_debug_data"},
    "spconv.pytorch.utils": {"SpconvOps", "get_current_stream", "torch_tensor_to_tv"},
    "spconv.pytorch.hash": {"get_current_stream", "main", "torch_tensor_to_tv"},
    # debug helpers and stdlib/torch re-exports
    "spconv.pytorch.conv": {"nullcontext", "spconv", "spconv_save_debug_data"},
    "spconv.pytorch.pool": {"nullcontext", "spconv"},
    "spconv.pytorch.modules": {"PrintCurrentTime", "PrintTensorMeta", "spconv"},
    "spconv.pytorch.tables": {"F"},
    # box ops (rotated IoU / NMS), not sparse convolution; CenterPoint imports them inside try/except
    "spconv.utils": {"BoxOps", "non_max_suppression_cpu", "rbbox_intersection", "rbbox_iou", "rbbox_iou_loss",
                     "rotate_non_max_suppression_cpu", "nullcontext"},
}

# Signatures that differ on purpose.
SIGNATURE_EXCEPTIONS = {
    # spconv's compiled Point2VoxelCPU has no Python signature to compare (its arguments are checked by tests).
    "spconv.utils.Point2VoxelCPU1d", "spconv.utils.Point2VoxelCPU3d",
}


def _load_worker():
    spec = importlib.util.spec_from_file_location("_reference_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def captured():
    with open(DATA) as fh:
        return json.load(fh)["facts"]


@pytest.fixture(scope="module")
def ours():
    return _load_worker().collect_facts()


def _split(sig):
    positional = [p for p in sig if p[1] != "KEYWORD_ONLY"]
    keyword = {p[0]: p for p in sig if p[1] == "KEYWORD_ONLY"}
    return positional, keyword


# The capture ran torch 2.13 (see the file's _about): what spconv's classes inherit from torch.nn follows the
# running torch instead, as the real spconv's would (torch 2.13's BatchNorm added the keyword-only bias=).
CAPTURED_BATCHNORM_EXTRA = "16, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True"


def _from_running_torch(cls_path, name):
    """True when keyword ``name`` of the class comes from a torch.nn base that lacks it under the running torch."""
    module, _, attr = cls_path.rpartition(".")
    cls = getattr(importlib.import_module(module), attr)
    bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("torch.nn.") and b is not torch.nn.Module]
    return bool(bases) and name not in inspect.signature(bases[0].__init__).parameters


def _as_running_torch(text):
    return text.replace(CAPTURED_BATCHNORM_EXTRA, torch.nn.BatchNorm1d(16).extra_repr())


def test_signatures(captured, ours):
    for cls, theirs in captured["signatures"].items():
        if cls in SIGNATURE_EXCEPTIONS:
            continue
        mine = ours["signatures"].get(cls)
        assert mine is not None, f"{cls} is missing"
        t_pos, t_kw = _split(theirs)
        m_pos, m_kw = _split(mine)
        assert m_pos == t_pos, f"{cls}: positional parameters differ from spconv 2.3.8"
        for name, p in t_kw.items():
            if name not in m_kw and _from_running_torch(cls, name):
                continue
            assert m_kw.get(name) == p, f"{cls}: keyword-only {name} differs"
        extra = set(m_kw) - set(t_kw)
        assert extra <= ALLOWED_EXTRA_KEYWORDS, f"{cls}: unexpected keyword-only additions {extra}"


def test_conv_signature_example_from_spconv(ours):
    # The exact spconv 2.3.8 SubMConv3d signature, spelled out.
    names = [p[0] for p in ours["signatures"]["spconv.pytorch.SubMConv3d"] if p[1] != "KEYWORD_ONLY"]
    assert names == ["in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias",
                     "indice_key", "algo", "fp32_accum", "large_kernel_fast_algo", "name"]
    names = [p[0] for p in ours["signatures"]["spconv.pytorch.SparseConv3d"]]
    assert names.index("record_voxel_count") + 1 == names.index("large_kernel_fast_algo")


def test_print_model_text(captured, ours):
    for spec, text in captured["reprs"].items():
        assert ours["reprs"][spec] == _as_running_torch(text), spec
    for spec, text in captured["default_algo_reprs"].items():
        assert ours["default_algo_reprs"][spec] == _as_running_torch(text), spec


def test_default_algo_is_spconv_gpu_builds():
    # spconv's CPU-only build forces Native; its GPU build (whose text users diff) picks implicit GEMM up to kernel
    # volume 32 for convs (128 with large_kernel_fast_algo, and for max pools); here the GPU build's choice.
    import spconv.pytorch as sp
    from spconv.core import ConvAlgo
    assert sp.SubMConv3d(4, 8, 3).algo == ConvAlgo.MaskImplicitGemm
    assert re.search(r"algo=ConvAlgo\.MaskImplicitGemm\)$", repr(sp.SubMConv3d(4, 8, 3)))
    assert sp.SubMConv3d(4, 8, 5).algo == ConvAlgo.Native
    assert sp.SubMConv3d(4, 8, 5, large_kernel_fast_algo=True).algo == ConvAlgo.MaskImplicitGemm
    assert sp.SparseMaxPool3d(5).algo == ConvAlgo.MaskImplicitGemm and sp.SparseMaxPool3d(6).algo == ConvAlgo.Native
    assert sp.SparseAvgPool3d(2, algo=ConvAlgo.Native).algo == ConvAlgo.MaskImplicitGemm  # as spconv: always
    with pytest.raises(TypeError, match="algo"):
        sp.SubMConv3d(4, 8, 3, algo="Native")


def test_state_dicts_and_voxel_counters(captured, ours):
    for spec, facts in captured["state_dicts"].items():
        assert ours["state_dicts"][spec] == facts, spec


def test_public_names(captured, ours):
    for mod, names in captured["names"].items():
        missing = set(names) - set(ours["names"][mod]) - ABSENT.get(mod, set())
        assert not missing, f"{mod} lacks spconv 2.3.8's {sorted(missing)}"


def test_constants(captured, ours):
    for name, value in captured["constants"].items():
        assert name in ours["constants"], name
        if name not in os.environ:  # both read some from the environment at import; the capture had none set
            assert ours["constants"][name] == value, name


def test_test_utils_and_version_and_module_version(captured, ours):
    assert ours["test_utils"] == captured["test_utils"]
    assert ours["version"] == captured["version"]
    assert ours["sparse_module_version"] == captured["sparse_module_version"]


def test_live_facts():
    python = os.environ.get("SPCONV_REFERENCE_PYTHON")
    if not python:
        pytest.skip("SPCONV_REFERENCE_PYTHON is not set (an interpreter importing the real spconv 2.3.8)")
    from spconv.benchmark import compare
    result = compare.run_worker(compare.resolve_target(python), WORKER, tempfile.mkdtemp(prefix="spconv238_"),
                                {"task": "facts"}, timeout_s=600)
    if os.environ.get("SPCONV_RECAPTURE") == "1":
        with open(DATA) as fh:
            doc = json.load(fh)
        doc.update(reference_version=result["version"], facts=result["facts"])
        with open(DATA, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
    with open(DATA) as fh:
        assert json.load(fh)["facts"] == result["facts"], "test/data/spconv238_facts.json is stale"
