"""A small stand-in for cumm (``cumm.tensorview``), served only where no real cumm is importable.

spconv 2.x users import ``cumm.tensorview as tv`` beside spconv (OpenPCDet's data pipeline calls
``Point2VoxelCPU3d(...).point_to_voxel(tv.from_numpy(points))``). The stand-in package lives in ``shim/cumm``; the
meta-path finder in ``finder.py`` serves it under the name ``cumm``, and only when no other finder can supply a
``cumm``, so a real cumm always wins and is never touched. The finder is installed at interpreter start by the
``spconv_cumm_shim.pth`` file placed in site-packages by an install, and again by ``import spconv`` (source
checkouts, in-place builds).
"""
from spconv._cumm.finder import install, is_shim, uninstall  # noqa: F401
