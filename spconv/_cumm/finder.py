"""The meta-path finder that serves this package's ``cumm`` stand-in when no real cumm is importable.

Standard library only: ``spconv_cumm_shim.pth`` loads this file by path at interpreter start, before (and
without) importing spconv or torch.
"""
import importlib.machinery
import os
import sys

# The folder holding the stand-in package ``cumm`` (its submodules resolve through that package's __path__).
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")
_MARK = "_spconv_cumm_shim"  # set on our finders, so copies loaded by path and by import are told apart from others


class CummShimFinder:
    """Finds ``cumm`` in SHIM_DIR, but only when no other finder on sys.meta_path finds one."""

    _spconv_cumm_shim = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "cumm" or _real_cumm_findable():
            return None
        return importlib.machinery.PathFinder.find_spec("cumm", [SHIM_DIR])

    def invalidate_caches(self):
        pass


def _real_cumm_findable() -> bool:
    # This finder sits last on sys.meta_path, so usually a real cumm is found before it is asked; this also covers
    # finders appended after it (e.g. an editable install's, added by a .pth file read later).
    for finder in list(sys.meta_path):
        if getattr(finder, _MARK, False):
            continue
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            if find_spec("cumm", None) is not None:
                return True
        except Exception:  # a broken third-party finder must not break `import cumm`
            continue
    return False


def install() -> None:
    """Appends the finder to sys.meta_path unless one (from any copy of this file) is there already."""
    if not any(getattr(f, _MARK, False) for f in sys.meta_path):
        sys.meta_path.append(CummShimFinder())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, _MARK, False)]


def is_shim(module) -> bool:
    """Whether a ``cumm`` / ``cumm.tensorview`` module object is this package's stand-in."""
    return bool(getattr(module, "SPCONV_CUMM_SHIM", False))
