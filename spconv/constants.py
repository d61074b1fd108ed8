"""Public flags. Environment variables are read once, when spconv is imported."""
import os


def _env_flag(name: str, default: str = "0") -> bool:
    return os.getenv(name, default).strip().lower() in ("1", "true", "yes", "on")


# Route policy: SPCONV_FORCE_NATIVE=1 disables the fused GPU route (forward, dinput, dfilter).
SPCONV_FORCE_NATIVE = _env_flag("SPCONV_FORCE_NATIVE")
# spconv 2.x's TF32 switch (settable, read at every call): FP32 layers of the fused route take TF32 operands on
# NVIDIA sm_80+ when this or torch.backends.cuda.matmul.allow_tf32 is set; the native route's FP32 GEMMs (at::mm)
# follow torch's flag only. Off by default.
SPCONV_ALLOW_TF32 = _env_flag("SPCONV_ALLOW_TF32")
# Check that a regular/transposed conv's input has unique coordinates (costs a sort per layer; off by default,
# duplicates then act as one site holding their summed features). Submanifold convs always check. Settable.
SPCONV_CHECK_DUPLICATES = _env_flag("SPCONV_CHECK_DUPLICATES")
# Weight layout of spconv 2.x (KRSC: [Cout, *kernel, Cin]); spconv 1.x saved [*kernel, Cin, Cout].
FILTER_HWIO = False
ALL_WEIGHT_IS_KRSC = True
SAVED_WEIGHT_LAYOUT = os.getenv("SPCONV_SAVED_WEIGHT_LAYOUT", "")
SPCONV_FX_TRACE_MODE = _env_flag("SPCONV_FX_TRACE_MODE")
SPCONV_DEBUG_SAVE_PATH = os.getenv("SPCONV_DEBUG_SAVE_PATH", "")

# ---- spconv 2.x public constants (names kept so code that reads or sets them keeps working) ----
from pathlib import Path  # noqa: E402

PACKAGE_NAME = "spconv"
PACKAGE_ROOT = Path(__file__).parent.resolve()
EDITABLE_INSTALLED = False
BOOST_ROOT = None
NDIM_DONT_CARE = 3

# Layout of the weights in a checkpoint being loaded: "" (detect from the shape: spconv 2.x KRSC
# [Cout, *k, Cin] or spconv 1.x RSCK [*k, Cin, Cout]), "KRSC", "RSKC" ([*k, Cout, Cin]) or "RSCK".
# Set it when a shape is ambiguous (Cin == Cout == every kernel size); see spconv/pytorch/_checkpoint.py.
if SAVED_WEIGHT_LAYOUT not in ("", "KRSC", "RSKC", "RSCK"):
    raise ValueError(f"SPCONV_SAVED_WEIGHT_LAYOUT must be one of KRSC, RSKC, RSCK (or unset), "
                     f"got {SAVED_WEIGHT_LAYOUT!r}")

# Flags of spconv 2.3.8's CUDA build (every SPCONV_* name of its spconv.constants is here): code that reads or
# sets them keeps working, but they have no effect on this package's routes or results. The ones above
# (SPCONV_ALLOW_TF32, SPCONV_FX_TRACE_MODE, SAVED_WEIGHT_LAYOUT) do take effect.
import enum  # noqa: E402


class NVRTCMode(enum.Enum):
    """spconv 2.x's (cumm's) NVRTC kernel modes; only the names are kept (no NVRTC here)."""

    Disabled = 0
    Direct = 1
    DynamicParallism = 2
    KernelAndCPU = 3
    ConstantMemory = 4
    Static = 5


DISABLE_JIT = _env_flag("SPCONV_DISABLE_JIT")
SPCONV_BWD_SPLITK = [int(v) for v in os.getenv("SPCONV_BWD_SPLITK", "1,2,4,8,16,32,64").split(",") if v.strip()]
SPCONV_NVRTC_MODE = NVRTCMode.ConstantMemory
SPCONV_DEBUG_NVRTC_KERNELS = False
SPCONV_DEBUG_CPP_ONLY = False
SPCONV_DEBUG_WEIGHT = False
SPCONV_CPP_INDICE_PAIRS = True
SPCONV_CPP_INDICE_PAIRS_IGEMM = _env_flag("SPCONV_CPP_INDICE_PAIRS_IGEMM")
SPCONV_CPP_GEMM = True
SPCONV_USE_DIRECT_TABLE = True
SPCONV_DIRECT_TABLE_HASH_SIZE_SCALE = 1.1
SPCONV_INT8_DEBUG = _env_flag("SPCONV_INT8_DEBUG")
SPCONV_DO_SORT = _env_flag("SPCONV_DO_SORT", "1")


class AllocKeys:
    """Names of spconv 2.x's allocator slots (kept for imports; this package allocates through torch)."""

    PairBwd = "PairBwd"
    IndiceNumPerLoc = "IndiceNumPerLoc"
    PairMask = "PairMask"
    MaskArgSort = "MaskArgSort"
    OutIndices = "OutIndices"
    PairFwd = "PairFwd"
    PairMaskBwd = "PairMaskBwd"
    MaskArgSortBwd = "MaskArgSortBwd"
    MaskOutputFwd = "MaskOutputFwd"
    OutFeatures = "OutFeatures"
    Features = "Features"
    Filters = "Filters"
    OutBp = "OutBp"
    DIn = "DIn"
    DFilters = "DFilters"
    InpBuffer = "InpBuffer"
    OutBuffer = "OutBuffer"
    IndicePairsUniq = "IndicePairsUniq"
    IndicePairsUniqBackup = "IndicePairsUniqBackup"
    HashKOrKV = "HashKOrKV"
    HashV = "HashV"
    ThrustTemp = "ThrustTemp"
    TightUniqueCount = "TightUniqueCount"
