"""spconv's stand-in for cumm: only ``cumm.tensorview``'s host-tensor basics that spconv 2.x users call.

Served as ``cumm`` only where no real cumm is importable (see spconv/_cumm/finder.py). Not a cumm replacement:
no GPU kernels, no NVRTC, no gemm beyond the ``Activation`` enum.
"""
SPCONV_CUMM_SHIM = True
__version__ = "0.0.0+spconv.shim"
