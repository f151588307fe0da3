"""Framework helpers: which framework an array comes from, its current CUDA stream, allocation in it.

sparsek never copies data between frameworks: outputs are allocated by the framework of the inputs,
on the inputs' device, and device work is enqueued on that framework's current stream.
"""
import sys

import numpy as np

try:
    import torch
except ImportError:  # torch is optional
    torch = None

SUPPORTED = "float32, float16 or bfloat16"


def is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def _is_cupy(x):
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(x, cp.ndarray)


def framework(x, name="array"):
    """'numpy', 'torch' or 'cupy'; TypeError for anything else."""
    if is_torch(x):
        return "torch"
    if isinstance(x, np.ndarray):
        return "numpy"
    if _is_cupy(x):
        return "cupy"
    raise TypeError(f"{name} must be a NumPy array, torch tensor or CuPy array, got {type(x).__name__}")


def same_framework(pairs):
    """pairs: [(name, array or None)]; all arrays must come from one framework. Returns it."""
    fw, first = None, None
    for name, x in pairs:
        if x is None:
            continue
        f = framework(x, name)
        if fw is None:
            fw, first = f, name
        elif f != fw:
            raise TypeError(f"{name} is a {f} array but {first} is a {fw} array; "
                            "sparsek does not convert between frameworks")
    return fw


def xp(x):
    """The NumPy-compatible module of a NumPy or CuPy array."""
    return sys.modules["cupy"] if _is_cupy(x) else np


def stream_of(x):
    """The caller's current CUDA stream for x's device, as an integer (0 for host arrays)."""
    if is_torch(x):
        return torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0
    if _is_cupy(x):
        with x.device:
            return sys.modules["cupy"].cuda.get_current_stream().ptr
    return 0


def empty(like, shape, dtype):
    """An uninitialized array in like's framework and on like's device."""
    if is_torch(like):
        return torch.empty(shape, dtype=dtype, device=like.device)
    if _is_cupy(like):
        with like.device:
            return sys.modules["cupy"].empty(shape, dtype=dtype)
    return np.empty(shape, dtype=dtype)


def dtype_name(x):
    return str(x.dtype).replace("torch.", "")


def check_value_dtype(x, what):
    if dtype_name(x) not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"{what} dtype {dtype_name(x)} is not supported ({SUPPORTED})")


def shape_of(x):
    return tuple(int(s) for s in x.shape)
