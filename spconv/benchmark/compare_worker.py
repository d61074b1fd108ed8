"""Runs the ``basic`` network with another spconv-compatible implementation, in that implementation's own
environment, and writes its timings and output to the job folder.

Started by ``compare.py`` as ``python compare_worker.py JOB_DIR`` under the other environment's interpreter, so it
imports nothing from this project: only torch, numpy, the other ``spconv.pytorch`` (or the module named in the
job), and two standalone files beside it (network.py, timing.py) loaded by path.
"""
import importlib
import importlib.util
import json
import os
import sys
import traceback


def _load_sibling(name):
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(f"_spconv_bench_{name}", os.path.join(here, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _library_label(module_name):
    top = module_name.split(".")[0]
    try:
        from importlib import metadata
        for dist in metadata.distributions():
            if top in (dist.read_text("top_level.txt") or "").split():
                return f"{dist.metadata['Name']} {dist.version}"
    except Exception:
        pass
    pkg = importlib.import_module(top)
    return f"{top} {getattr(pkg, '__version__', '?')}"


def main(job_dir):
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # never resolve imports against this project's files
    with open(os.path.join(job_dir, "job.json")) as fh:
        job = json.load(fh)
    import numpy as np
    import torch
    network = _load_sibling("network")
    timing = _load_sibling("timing")
    sp = importlib.import_module(job["module"])
    torch.set_num_threads(job["threads"])
    device = torch.device(job["device"])
    plan = timing.Plan(job["warmup"], job["iters"])
    result = {"library": _library_label(job["module"]), "module": job["module"],
              "module_file": getattr(sp, "__file__", None), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "runs": []}
    data = np.load(os.path.join(job_dir, "input.npz"))
    for dtype_name in job["dtypes"]:
        dtype = getattr(torch, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[dtype_name])
        run = {"dtype": dtype_name, "times": {}, "errors": {}}
        try:
            net = network.build_basic_net(sp, int(data["features"].shape[1]))
            net.load_state_dict({k[2:]: torch.from_numpy(data[k]) for k in data.files if k.startswith("w:")})
            net = net.to(device, dtype)
            feats = torch.from_numpy(data["features"]).to(device, dtype)
            x = sp.SparseConvTensor(feats, torch.from_numpy(data["indices"]).to(device),
                                    [int(s) for s in data["spatial_shape"]], 1)
            with torch.no_grad():
                # The output checked for correctness comes from a single-threaded run: spconv 2.3.8's CPU
                # scatter_add_cpu races under torch's intra-op threads (outputs change run to run). The output at
                # the timed thread count is saved beside it so that the report can say when the two differ.
                for suffix, n_threads in (("", 1), ("_threaded", job["threads"])):
                    torch.set_num_threads(n_threads)
                    y = net(x)
                    out = {"features": y.features.float().cpu().numpy(), "indices": y.indices.cpu().numpy(),
                           "spatial_shape": np.asarray(y.spatial_shape)}
                    np.savez(os.path.join(job_dir, f"output_{dtype_name}{suffix}.npz"), **out)
                stats = timing.time_fn(lambda: net(x), device, timing.Plan(max(plan.warmup - 1, 0), plan.iters))
            run["times"]["forward"] = stats.samples_ms
        except Exception as e:
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            run["errors"]["forward"] = f"{type(e).__name__}: {msg}"
            run["traceback"] = traceback.format_exc()[-2000:]
            result["runs"].append(run)
            continue
        if job["backward"]:
            try:
                gen = torch.Generator(device="cpu").manual_seed(1)
                cache = {}

                def grad(o):
                    if o.shape not in cache:
                        cache[o.shape] = torch.randn(*o.shape, generator=gen).to(o.device, o.dtype)
                    return cache[o.shape]

                rec = timing.time_train_step(lambda: net(x).features, grad, device, plan,
                                             zero_grad=lambda: net.zero_grad(set_to_none=True))
                for k in ("backward", "forward_backward"):
                    run["times"][k] = rec[k].samples_ms
            except Exception as e:
                msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
                run["errors"]["backward"] = f"{type(e).__name__}: {msg}"
        result["runs"].append(run)
    with open(os.path.join(job_dir, "result.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1])
