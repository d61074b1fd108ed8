"""The cumm stand-in: what ``cumm.tensorview`` users call, the finder that serves it only where no real cumm is
importable, the .pth that installs the finder at interpreter start, and its packaging."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import spconv
from spconv._cumm import finder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTH = os.path.join(ROOT, "spconv", "_cumm", "spconv_cumm_shim.pth")


def _run(code: str, pythonpath, cwd):
    """Runs ``code`` in a fresh interpreter with only ``pythonpath`` added (no checkout on the path otherwise)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def _fake_real_cumm(folder):
    """A package named cumm that is not the stand-in (stands for a real cumm install)."""
    pkg = folder / "cumm"
    (pkg / "tensorview").mkdir(parents=True)
    (pkg / "__init__.py").write_text("REAL = True\n")
    (pkg / "tensorview" / "__init__.py").write_text(textwrap.dedent("""
        class Tensor:
            def __init__(self, a):
                self.a = a
                self.device = -1
            def numpy_view(self):
                return self.a
            def numpy(self):
                return self.a.copy()
            def cpu(self):
                return self
        def from_numpy(a):
            return Tensor(a)
    """))
    return folder


def test_served_here_when_no_real_cumm():
    import cumm
    import cumm.tensorview as tv
    if finder._real_cumm_findable():
        assert not finder.is_shim(cumm)  # a real cumm is installed: it is the one imported
    else:
        assert finder.is_shim(cumm) and finder.is_shim(tv)
        assert cumm.__file__.startswith(os.path.join(os.path.dirname(spconv.__file__), "_cumm"))


def test_tensor_semantics():
    from spconv._cumm.shim.cumm import tensorview as tv
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = tv.from_numpy(a)
    assert t.shape == [3, 4] and isinstance(t.shape, list) and t.ndim == 2 and t.size == 12 and t.dim(1) == 4
    assert t.dtype == tv.float32 == 0 and t.device == -1 and t.itemsize == 4 and t.is_contiguous()
    copy = t.numpy()
    copy[0, 0] = 100  # numpy() copies
    assert a[0, 0] == 0
    t.numpy_view()[0, 1] = 7  # numpy_view() shares memory
    assert a[0, 1] == 7
    codes = {np.int32: tv.int32, np.int64: tv.int64, np.float64: tv.float64, np.uint8: tv.uint8,
             np.float16: tv.float16, np.bool_: tv.bool_, np.int8: tv.int8}
    for np_dtype, code in codes.items():
        assert tv.from_numpy(np.zeros(2, np_dtype)).dtype == code
    assert (tv.int32, tv.int64, tv.bool_) == (1, 8, 5)  # cumm's codes
    assert tv.zeros([2, 3], tv.int32).numpy().dtype == np.int32 and tv.full([2], 3.5).numpy().tolist() == [3.5, 3.5]
    assert t.cpu() is t and t.clone().numpy_view() is not a
    assert tv.gemm.Activation.ReLU.value == 1 and tv.gemm.Activation.None_.value == 0


def test_bad_input_names_the_argument():
    from spconv._cumm.shim.cumm import tensorview as tv
    with pytest.raises(TypeError, match="arr must be a numpy.ndarray"):
        tv.from_numpy([1, 2])
    with pytest.raises(TypeError, match="dtype"):
        tv.from_numpy(np.zeros(2, np.complex64))
    with pytest.raises(ValueError, match="device"):
        tv.zeros([2], tv.float32, 0)
    with pytest.raises(ValueError, match="dtype"):
        tv.zeros([2], tv.bfloat16)


def test_activation_from_the_stand_in_is_accepted_by_convs():
    import spconv.pytorch as sp
    from spconv._cumm.shim.cumm.tensorview import gemm
    conv = sp.SubMConv3d(2, 3, 3, act_type=gemm.Activation.LeakyReLU, act_alpha=0.1)
    assert conv._act == "LeakyReLU" and "act=Activation.LeakyReLU" in repr(conv)


@pytest.mark.slow
def test_finder_yields_to_a_real_cumm(tmp_path):
    # Real cumm on sys.path: `import spconv` installs the finder, yet `import cumm` is the real package.
    fake = _fake_real_cumm(tmp_path / "real")
    out = _run("""
        import spconv, cumm, cumm.tensorview as tv, numpy as np
        import spconv.utils as su
        print(getattr(cumm, "REAL", False), getattr(cumm, "SPCONV_CUMM_SHIM", False))
        res = su.Point2VoxelCPU3d([1, 1, 1], [0, 0, 0, 4, 4, 4], 3, 10, 2).point_to_voxel(
            tv.from_numpy(np.random.rand(20, 3).astype(np.float32) * 4))
        print(all(type(r) is tv.Tensor for r in res))  # results are the real cumm's tensors
    """, [str(fake), ROOT], str(tmp_path))
    assert out.split() == ["True", "False", "True"]


@pytest.mark.slow
def test_finder_yields_to_a_cumm_found_by_a_later_finder(tmp_path):
    # Editable installs put their own finder on sys.meta_path, possibly after ours: that cumm wins too.
    fake = _fake_real_cumm(tmp_path / "elsewhere")
    out = _run(f"""
        import importlib.machinery, sys
        import spconv

        class LateFinder:
            def find_spec(self, name, path=None, target=None):
                if name == "cumm":
                    return importlib.machinery.PathFinder.find_spec("cumm", [{str(fake)!r}])
                return None

        sys.meta_path.append(LateFinder())
        import cumm
        print(getattr(cumm, "REAL", False))
    """, [ROOT], str(tmp_path))
    assert out.split() == ["True"]


def test_finder_installs_once_and_uninstalls():
    before = [f for f in sys.meta_path if getattr(f, "_spconv_cumm_shim", False)]
    assert len(before) == 1  # import spconv installed exactly one
    finder.install()
    assert len([f for f in sys.meta_path if getattr(f, "_spconv_cumm_shim", False)]) == 1
    finder.uninstall()
    try:
        assert not any(getattr(f, "_spconv_cumm_shim", False) for f in sys.meta_path)
        assert finder.CummShimFinder().find_spec("numpy") is None  # only `cumm` is ever served
    finally:
        finder.install()


def test_pth_serves_cumm_before_spconv_is_imported(tmp_path):
    # As in an install: the .pth in a site dir installs the finder at startup; OpenPCDet's datasets package
    # imports cumm.tensorview before spconv, and neither spconv nor torch gets imported by it.
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "spconv_cumm_shim.pth").write_text(open(PTH).read())
    out = _run(f"""
        import site, sys
        site.addsitedir({str(site_dir)!r})
        import cumm.tensorview as tv
        print(getattr(tv, "SPCONV_CUMM_SHIM", False), "spconv" in sys.modules, "torch" in sys.modules)
        print(tv.from_numpy(__import__("numpy").zeros((2, 3))).shape)
    """, [ROOT], str(tmp_path))
    assert out.split("\n")[0].split() == ["True", "False", "False"]
    assert out.split("\n")[1] == "[2, 3]"


def test_pth_is_harmless_without_spconv(tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "spconv_cumm_shim.pth").write_text(open(PTH).read())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = f"import site; site.addsitedir({str(site_dir)!r}); print('ok')"
    # -I: no user site, no cwd, no PYTHONPATH, so spconv may not be importable; the .pth must then do nothing.
    res = subprocess.run([sys.executable, "-I", "-c", code], env=env, cwd=str(tmp_path), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok" and "Error processing" not in res.stderr


def test_build_puts_the_pth_at_the_top_of_the_wheel(tmp_path):
    # build_py is what a wheel is made of: the .pth must land at its top (-> site-packages), the stand-in inside.
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "spconv_cumm_shim.pth").read_text() == open(PTH).read()
    for rel in ("spconv/_cumm/finder.py", "spconv/_cumm/shim/cumm/__init__.py",
                "spconv/_cumm/shim/cumm/tensorview/__init__.py", "spconv/_cumm/shim/cumm/tensorview/gemm.py"):
        assert (tmp_path / rel).is_file(), rel


@pytest.mark.slow
def test_a_broken_real_cumm_is_left_alone_and_voxelization_still_works(tmp_path):
    # A real cumm that fails to import (e.g. a missing dependency) keeps failing as it would without spconv: the
    # stand-in never hides it; spconv.utils falls back to the stand-in's tensors for its own results.
    broken = tmp_path / "broken" / "cumm"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("import a_module_that_is_not_installed\n")
    out = _run("""
        import numpy as np
        import spconv.utils as su
        try:
            import cumm
            print("imported")
        except ImportError:
            print("ImportError")
        res = su.Point2VoxelCPU3d([1, 1, 1], [0, 0, 0, 4, 4, 4], 3, 10, 2).point_to_voxel(
            np.random.rand(20, 3).astype(np.float32) * 4)
        print(type(res[0]).__module__, res[1].shape[1])
    """, [str(tmp_path / "broken"), ROOT], str(tmp_path))
    assert out.split() == ["ImportError", "spconv._cumm.shim.cumm.tensorview", "3"]
