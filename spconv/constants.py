"""Public flags. Environment variables are read once, when spconv is imported."""
import os


def _env_flag(name: str, default: str = "0") -> bool:
    return os.getenv(name, default).strip().lower() in ("1", "true", "yes", "on")


# Route policy: SPCONV_FORCE_NATIVE=1 disables the fused GPU route (forward, dinput, dfilter).
SPCONV_FORCE_NATIVE = _env_flag("SPCONV_FORCE_NATIVE")
# Allow TF32 tensor cores for FP32 convolutions on NVIDIA GPUs (like torch.backends.cuda.matmul.allow_tf32).
SPCONV_ALLOW_TF32 = _env_flag("SPCONV_ALLOW_TF32")
# Weight layout of spconv 2.x (KRSC: [Cout, *kernel, Cin]); spconv 1.x saved [*kernel, Cin, Cout].
FILTER_HWIO = False
ALL_WEIGHT_IS_KRSC = True
SAVED_WEIGHT_LAYOUT = os.getenv("SPCONV_SAVED_WEIGHT_LAYOUT", "")
SPCONV_FX_TRACE_MODE = _env_flag("SPCONV_FX_TRACE_MODE")
SPCONV_DEBUG_SAVE_PATH = os.getenv("SPCONV_DEBUG_SAVE_PATH", "")
