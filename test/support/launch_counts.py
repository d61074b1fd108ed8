"""Counts of the launches and host waits of a call into the GPU code run on the CPU (HIP CPU build); used by
the tests of launch budgets and by tools/map_build_counts.py.
  project ops     the op library's operators called (torch.ops.<namespace>.*)
  kernels         project kernel launches (the HIP CPU build's launch ledger, debug_launch_ledger: every launch
                  goes through launch_kernel in csrc/hip/hip_compat.h)
  aten            ATen ops called anywhere (Python or the glue) that do device work: an op whose profiler
                  subtree holds an op other than allocation, views and metadata (zeros = 1, to(dtype) = 1)
  waits           the glue's device->host copies (host_copy_count) plus ATen ops that wait for a GPU
"""
import torch

from spconv._backend import debug_library

# ATen ops with no device work of their own (allocation, views, metadata); a wrapper listed here still counts
# when one of its children does work (aten::to -> aten::copy_).
NO_WORK = {
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::reshape", "aten::_reshape_alias",
    "aten::select", "aten::narrow", "aten::slice", "aten::t", "aten::transpose", "aten::as_strided",
    "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::detach", "aten::alias",
    "aten::resize_", "aten::lift_fresh", "aten::_unsafe_view", "aten::contiguous", "aten::to", "aten::lift",
    "aten::set_", "aten::result_type", "aten::is_nonzero", "aten::clone_if_needed", "aten::unbind",
    "aten::split", "aten::chunk", "aten::numpy_T", "aten::flatten", "aten::unflatten", "aten::view_as",
    "aten::expand_as", "aten::_to_copy_if_needed", "detach", "aten::dim", "aten::size", "aten::stride",
    "aten::detach_", "detach_", "aten::resolve_conj", "aten::resolve_neg",
}
SYNCING = {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique",
           "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::bincount",
           "aten::repeat_interleave", "aten::equal", "aten::allclose"}
# Every ATen op that waits for the GPU (a result size or value read on the host), the wrapper aten::is_nonzero
# (bool(t)) included: what the tests that allow no host wait look for. aten::_local_scalar_dense is every
# .item() / int(t) / bool(t).
SYNCING_OPS = SYNCING | {"aten::is_nonzero"}


def _has_work(ev) -> bool:
    if ev.name not in NO_WORK:
        return True
    return any(_has_work(c) for c in ev.cpu_children)


def count(lib, fn):
    """Counts of one call of fn() (see the module docstring)."""
    ns = lib.name
    debug = debug_library(lib)
    debug.debug_check_pending_maps()  # earlier calls' deferred checks are not this call's work
    k0 = debug.debug_launch_ledger()[0]
    h0 = debug.host_copy_count()
    with torch.profiler.profile() as prof:
        fn()
    copies = debug.host_copy_count() - h0
    kernels = debug.debug_launch_ledger()[0] - k0
    events = prof.events()
    project = [e for e in events if e.name.startswith(ns + "::")]
    aten_top = [e for e in events if e.name.startswith("aten::") and
                (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    launches = sum(1 for e in aten_top if _has_work(e))
    syncing = sum(1 for e in events if e.name in SYNCING)
    return dict(project=len(project), kernels=kernels, aten=launches, waits=copies + syncing,
                ops=sorted(e.name for e in aten_top if _has_work(e)))
