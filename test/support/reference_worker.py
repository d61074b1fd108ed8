"""Collects spconv facts (signatures, repr text, state_dict keys, names, constants) and runs the client-shaped
networks, under whichever spconv the running interpreter imports.

Two uses: the tests load this file in-process and call ``collect_facts()`` on this package; and, where
``SPCONV_REFERENCE_PYTHON`` names an interpreter with the real spconv 2.3.8, ``spconv.benchmark.compare.run_worker``
runs it there (``python reference_worker.py JOB_DIR``) so that both sides are read by the same code. It imports
nothing from this project: only spconv, torch, numpy and ``client_nets.py`` beside it (loaded by path).
"""
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import types

# Modules whose public names are compared; the names kept are spconv's own (classes, functions, submodules).
NAME_MODULES = ["spconv", "spconv.core", "spconv.constants", "spconv.utils", "spconv.test_utils", "spconv.pytorch",
                "spconv.pytorch.conv", "spconv.pytorch.pool", "spconv.pytorch.functional", "spconv.pytorch.core",
                "spconv.pytorch.modules", "spconv.pytorch.ops", "spconv.pytorch.utils", "spconv.pytorch.tables",
                "spconv.pytorch.hash", "spconv.pytorch.identity"]

# Layers whose print(model) text is compared, as constructor calls (``sp`` is spconv.pytorch). The convs and max
# pools name algo=Native: spconv's CPU-only build accepts nothing else (its GPU build defaults to implicit GEMM).
REPR_SPECS = [
    "sp.SubMConv3d(4, 8, 3, indice_key='subm1', algo=ConvAlgo.Native)",
    "sp.SubMConv3d(16, 16, 3, padding=1, bias=False, indice_key='subm1', algo=ConvAlgo.Native)",
    "sp.SubMConv2d(2, 3, 1, algo=ConvAlgo.Native)",
    "sp.SubMConv4d(2, 3, (3, 3, 1, 1), dilation=2, algo=ConvAlgo.Native)",
    "sp.SparseConv3d(16, 32, 3, 2, padding=1, bias=False, indice_key='spconv2', algo=ConvAlgo.Native)",
    "sp.SparseConv3d(64, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, algo=ConvAlgo.Native)",
    "sp.SparseConv1d(2, 3, [3], dilation=2, algo=ConvAlgo.Native)",
    "sp.SparseConv2d(4, 4, 2, 2, record_voxel_count=True, algo=ConvAlgo.Native)",
    "sp.SparseConvTranspose3d(8, 16, 3, 2, 1, algo=ConvAlgo.Native)",
    "sp.SparseConvTranspose2d(8, 4, 2, 2, bias=False, algo=ConvAlgo.Native)",
    "sp.SparseInverseConv3d(16, 8, 3, indice_key='spconv2', algo=ConvAlgo.Native)",
    "sp.SparseInverseConv3d(16, 8, 3, indice_key='spconv2', bias=False, algo=ConvAlgo.Native)",
    "sp.SparseMaxPool3d(2, 2, algo=ConvAlgo.Native)",
    "sp.SparseMaxPool3d(3, 1, 1, 2, indice_key='p', record_voxel_count=True, algo=ConvAlgo.Native)",
    "sp.SparseMaxPool2d([2, 3], algo=ConvAlgo.Native)",
    "sp.SparseAvgPool3d(2)",
    "sp.SparseAvgPool2d(3, 1, 1)",
    "sp.SparseAvgPool1d(2, algo=ConvAlgo.Native)",
    "sp.SparseGlobalMaxPool()", "sp.SparseGlobalAvgPool()",
    "sp.SparseBatchNorm(16)", "sp.SparseReLU()", "sp.SparseIdentity()", "sp.Identity()",
    "sp.ToDense()", "sp.RemoveGrid()", "sp.JoinTable()", "sp.AddTable()", "sp.ConcatTable()",
    "sp.SparseSequential(sp.SubMConv3d(4, 16, 3, bias=False, indice_key='subm1', algo=ConvAlgo.Native), "
    "torch.nn.BatchNorm1d(16), torch.nn.ReLU())",
    # the base class, with a fused activation (cumm's tv.gemm.Activation) and a transposed output_padding
    "sp.conv.SparseConvolution(3, 4, 8, 3, subm=True, act_type=tv.gemm.Activation.ReLU, algo=ConvAlgo.Native)",
    "sp.conv.SparseConvolution(3, 4, 8, 3, subm=True, act_type=tv.gemm.Activation.LeakyReLU, act_alpha=0.1, "
    "algo=ConvAlgo.Native)",
    "sp.conv.SparseConvolution(2, 4, 8, 2, stride=2, transposed=True, output_padding=1, algo=ConvAlgo.Native)",
]
# Built with the default algo: compared with the algo left out (the CPU-only build forces Native).
DEFAULT_ALGO_REPR_SPECS = [
    "sp.SubMConv3d(4, 8, 3)", "sp.SubMConv3d(4, 8, 5)", "sp.SparseConv3d(4, 8, 3, 2, 1)",
    "sp.SparseInverseConv3d(8, 4, 3, indice_key='k')", "sp.SparseMaxPool3d(2)",
]
# Layers whose state_dict keys, buffers and get_max_num_voxels() are compared.
STATE_SPECS = [
    "sp.SparseConv3d(2, 3, 3, record_voxel_count=True, algo=ConvAlgo.Native)",
    "sp.SparseConv3d(2, 3, 3, algo=ConvAlgo.Native)",
    "sp.SparseConvTranspose3d(2, 3, 3, bias=False, record_voxel_count=True, algo=ConvAlgo.Native)",
    "sp.SubMConv3d(2, 3, 3, algo=ConvAlgo.Native)",
    "sp.SparseInverseConv3d(2, 3, 3, indice_key='k', algo=ConvAlgo.Native)",
    "sp.SparseMaxPool3d(2, record_voxel_count=True, algo=ConvAlgo.Native)",
    "sp.SparseAvgPool3d(2, record_voxel_count=True)",
    "sp.SparseMaxPool3d(2, algo=ConvAlgo.Native)",
]
# Classes whose constructor signatures are compared, beyond every class spconv.pytorch exports.
EXTRA_SIGNATURE_CLASSES = ["spconv.pytorch.conv.SparseConvolution", "spconv.pytorch.conv.SparseConvolutionBase",
                           "spconv.pytorch.pool.SparseMaxPool", "spconv.pytorch.pool.SparseAvgPool",
                           "spconv.pytorch.pool.SparseGlobalMaxOrAvgPool", "spconv.pytorch.tables.AddTableMisaligned",
                           "spconv.pytorch.modules.SparseSyncBatchNorm"]


def _load_sibling(name):
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(f"_spconv_reference_{name}", os.path.join(here, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _signature(cls):
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None  # a compiled class without one
    return [[p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default)] for p in params]


def _resolve(path):
    mod, _, name = path.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def _own_names(mod):
    out = []
    for n in dir(mod):
        if n.startswith("_"):
            continue
        obj = getattr(mod, n)
        if isinstance(obj, types.ModuleType):
            if obj.__name__.startswith("spconv"):
                out.append(n)
        elif str(getattr(obj, "__module__", None) or "").startswith("spconv") and callable(obj):
            out.append(n)
        elif mod.__name__ == "spconv.constants" and n.isupper():
            out.append(n)
    return sorted(out)


def _value(v):
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if hasattr(v, "name") and hasattr(type(v), "__members__"):
        return f"{type(v).__name__}.{v.name}"
    return f"<{type(v).__name__}>"


def _float_or_none(text):
    try:
        return float(text)
    except ValueError:
        return None


def collect_facts():
    import numpy as np
    import torch
    import spconv
    import spconv.pytorch as sp
    from spconv.core import ConvAlgo
    import cumm.tensorview as tv  # the real cumm beside spconv 2.3.8; this package's stand-in here
    ns = {"sp": sp, "torch": torch, "ConvAlgo": ConvAlgo, "tv": tv}
    facts = {}
    v = spconv.__version__
    digits = [int(x) for x in v.split(".")] if re.fullmatch(r"[\d.]+", v) else None
    facts["version"] = {"digits_only": bool(re.fullmatch(r"\d+\.\d+\.\d+", v)),
                        "numbers": list(getattr(spconv, "SPCONV_VERSION_NUMBERS", [])) == digits,
                        "openpcdet_float_ge_2_2": _float_or_none(v[2:]) is not None and float(v[2:]) >= 2.2,
                        "mmdet3d_str_ge_2_0_0": v >= "2.0.0"}
    classes = {f"spconv.pytorch.{n}": getattr(sp, n) for n in dir(sp)
               if inspect.isclass(getattr(sp, n)) and getattr(getattr(sp, n), "__module__", "").startswith("spconv")}
    classes.update({p: _resolve(p) for p in EXTRA_SIGNATURE_CLASSES})
    classes.update({f"spconv.utils.{n}": getattr(importlib.import_module("spconv.utils"), n)
                    for n in ("Point2VoxelCPU1d", "Point2VoxelCPU3d")})
    facts["signatures"] = {k: _signature(c) for k, c in sorted(classes.items())}
    facts["reprs"] = {s: repr(eval(s, ns)) for s in REPR_SPECS}
    facts["default_algo_reprs"] = {s: re.sub(r", algo=ConvAlgo\.\w+", "", repr(eval(s, ns)))
                                   for s in DEFAULT_ALGO_REPR_SPECS}
    states = {}
    for s in STATE_SPECS:
        m = eval(s, ns)
        sd = m.state_dict()
        counter = m.get_max_num_voxels() if hasattr(m, "get_max_num_voxels") else "no method"
        states[s] = {"keys": list(sd.keys()),
                     "buffers": {k: [str(b.dtype), list(b.shape)] for k, b in m.named_buffers()},
                     "get_max_num_voxels": None if counter is None else
                     (counter if isinstance(counter, str) else [str(counter.dtype), counter.tolist()])}
    facts["state_dicts"] = states
    facts["names"] = {m: _own_names(importlib.import_module(m)) for m in NAME_MODULES}
    constants = importlib.import_module("spconv.constants")
    facts["constants"] = {n: _value(getattr(constants, n)) for n in dir(constants) if n.startswith("SPCONV_")}
    tu = importlib.import_module("spconv.test_utils")
    np.random.seed(0)
    data = tu.generate_sparse_data([5, 6, 7], [10, 12], 3)
    facts["test_utils"] = {"params_grid": tu.params_grid([1, 2], ["a", "b", "c"], [True]),
                           "generate_sparse_data": {k: [str(a.dtype), list(a.shape)] for k, a in sorted(data.items())},
                           "batch_column": int(data["indices"][:10, -1].max()),
                           "TestCase": sorted(n for n in ("assertAllClose", "assertAllEqual")
                                              if hasattr(tu.TestCase, n))}
    facts["sparse_module_version"] = getattr(sp.SparseModule, "_version", None)
    return facts


def _builders():
    return {**_load_sibling("client_nets").BUILDERS, **_load_sibling("client_backbones").BUILDERS}


def _cpu_stream_shim(ops):
    """spconv 2.3.8's CPU-only build asks torch.cuda for the current stream in its conv backward
    (ops.indice_conv_backward -> cppcore.get_current_stream), which raises "Torch not compiled with CUDA enabled";
    its CPU kernels take no stream, so a null handle lets its own backward run."""
    import torch
    if not torch.cuda.is_available() and hasattr(ops, "get_current_stream"):
        ops.get_current_stream = lambda: 0
        return True
    return False


def run_forward(job_dir, job):
    """Runs each named client network (client_nets' fixed weights and inputs); saves its outputs and, with
    ``backward``, the gradients of client_nets.run_net's fixed loss."""
    import numpy as np
    import torch
    import spconv.pytorch as sp
    nets = _load_sibling("client_nets")
    builders = _builders()
    torch.set_num_threads(1)  # spconv 2.3.8's CPU scatter-add races under more threads
    shim = _cpu_stream_shim(importlib.import_module("spconv.pytorch.ops")) if job.get("backward") else False
    for dtype_name in job["dtypes"]:
        dtype = getattr(torch, dtype_name)
        arrays, grads = {}, {}
        for name in job["nets"]:
            out, grad = nets.run_net(sp, builders, name, dtype, backward=bool(job.get("backward")))
            arrays.update({f"{name}/{k}": v for k, v in out.items()})
            grads.update({f"{name}/{k}": v for k, v in grad.items()})
        np.savez_compressed(os.path.join(job_dir, f"forward_{dtype_name}.npz"), **arrays)
        if job.get("backward"):
            np.savez_compressed(os.path.join(job_dir, f"grads_{dtype_name}.npz"), **grads)
    return {"nets": job["nets"], "dtypes": job["dtypes"], "backward_stream_shim": shim}


def run_autocast(job_dir, job):
    """What the CPU autocast (bfloat16) forward of each named network does here: its output dtypes, or the error."""
    import torch
    import spconv.pytorch as sp
    nets = _load_sibling("client_nets")
    builders = _builders()
    result = {}
    for name in job["nets"]:
        try:
            out, _ = nets.run_net(sp, builders, name, torch.float32, autocast_dtype=torch.bfloat16)
            result[name] = {"ok": sorted(out)}
        except Exception as e:  # the finding is recorded as it is
            result[name] = {"error": f"{type(e).__name__}: {e}"}
    return result


def environment():
    import numpy as np
    import torch
    import spconv
    out = {"spconv": spconv.__version__, "torch": torch.__version__, "numpy": np.__version__,
           "python": sys.version.split()[0]}
    try:
        import cumm
        out["cumm"] = cumm.__version__
    except ImportError:
        out["cumm"] = None
    return out


def run_mmdet3d_load(job_dir, job):
    """Loads an mmcv spconv 1.x checkpoint through an mmdetection3d-style SparseModule._load_from_state_dict; saves
    the loaded state and the source state."""
    import numpy as np
    import torch
    import spconv.pytorch as sp
    nets = _load_sibling("client_nets")
    src = nets.Spconv1Checkpoint(sp)
    src.load_state_dict(nets.deterministic_state(src, torch.float32))
    v1 = nets.spconv1_state(src)
    sp.SparseModule._version = 2
    sp.SparseModule._load_from_state_dict = nets.mmdet3d_style_load
    dst = nets.Spconv1Checkpoint(sp)
    dst.load_state_dict(v1, strict=True)
    arrays = {f"src/{k}": v.numpy() for k, v in src.state_dict().items()}
    arrays.update({f"loaded/{k}": v.numpy() for k, v in dst.state_dict().items()})
    np.savez(os.path.join(job_dir, "mmdet3d_load.npz"), **arrays)
    return {"metadata_version": dst.state_dict()._metadata["a"].get("version")}


def run_voxels(job_dir, job):
    import numpy as np
    import cumm.tensorview as tv
    import spconv.utils as su
    points = np.load(job["points"])[job.get("key", "pc")]
    for i, (ndim, vsize, rng, max_voxels, max_points) in enumerate(job["configs"]):
        gen = getattr(su, f"Point2VoxelCPU{ndim}d")(vsize, rng, points.shape[1], max_voxels, max_points)
        v, c, n = gen.point_to_voxel(tv.from_numpy(points))
        np.savez(os.path.join(job_dir, f"vox_{i}.npz"), voxels=v.numpy(), coords=c.numpy(), num=n.numpy(),
                 grid_size=np.asarray(gen.grid_size))
    return {"configs": len(job["configs"])}


def main(job_dir):
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # never resolve spconv against this project's files
    with open(os.path.join(job_dir, "job.json")) as fh:
        job = json.load(fh)
    import spconv
    result = {"spconv_file": spconv.__file__, "version": spconv.__version__, "environment": environment()}
    if job["task"] == "facts":
        result["facts"] = collect_facts()
    elif job["task"] == "forward":
        result["forward"] = run_forward(job_dir, job)
    elif job["task"] == "autocast":
        result["autocast"] = run_autocast(job_dir, job)
    elif job["task"] == "mmdet3d_load":
        result["mmdet3d_load"] = run_mmdet3d_load(job_dir, job)
    elif job["task"] == "voxels":
        result["voxels"] = run_voxels(job_dir, job)
    else:
        raise ValueError(f"unknown task {job['task']!r}")
    with open(os.path.join(job_dir, "result.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1])
