"""Framework helpers: which framework an array comes from, its current CUDA stream, allocation in it.

sparsek never copies data between frameworks: outputs are allocated by the framework of the inputs,
on the inputs' device, and device work is enqueued on that framework's current stream.

torch is never imported here (``import sparsek`` stays a NumPy-only import): a torch tensor can only
exist once the caller imported torch, so ``torch`` below is picked up from ``sys.modules`` then.
"""
import sys

import numpy as np

SUPPORTED = "float32, float16 or bfloat16"

torch = None  # the torch module, once the caller has imported it (see torch_loaded)


def torch_loaded():
    """The torch module if the caller imported it (also registers sparsek's torch ops), else None."""
    global torch
    if torch is None and "torch" in sys.modules:
        torch = sys.modules["torch"]
        from . import _ops  # noqa: F401  (registers torch.ops.sparsek.* on first sight of torch)
        _ops.torch_ops()
    return torch


def is_torch(x):
    t = torch if torch is not None else torch_loaded()
    return t is not None and isinstance(x, t.Tensor)


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


def scalar(value, name):
    """A real number argument (alpha, beta): ints and floats (and 0-d NumPy numbers), never strings
    or bools. TypeError naming the argument otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def dim(value, name, most=INT64_MAX):
    """A matrix dimension or block size: an int (or an integer NumPy scalar) in [0, most]; 64.7,
    '64' and True are refused with a message naming the argument. ``most`` is what the library's
    integer type holds (int64 by default; INT32_MAX for counts it keeps in an int), so that a huge
    value is refused here by name rather than by the binding's argument conversion."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if value > most:
        raise ValueError(f"{name}={value} is too large (at most {most})")
    return int(value)


def flag(value, name):
    """A boolean argument: True or False (or a NumPy bool). Anything else, including the strings
    "False" and "0", 0/1 and None, is refused by name: truthiness would turn causal="False" into
    causal attention."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def check_writable(x, name):
    """Outputs are written in place: a read-only NumPy array (np.broadcast_to, a frozen buffer) is
    refused by name."""
    flags = getattr(x, "flags", None)
    if isinstance(x, np.ndarray) and not flags.writeable:
        raise ValueError(f"{name} is a read-only array (shape {shape_of(x)}); pass a writable one")


def pair(value, name, most=INT64_MAX):
    """(a, b) of dims from a sequence of exactly two ints (ValueError when it is not a pair)."""
    if isinstance(value, (str, bytes)) or not (hasattr(value, "__len__") and hasattr(value, "__iter__")):
        raise ValueError(f"{name} must be a pair of ints, got {type(value).__name__} {value!r}")
    items = tuple(value)
    if len(items) != 2:
        raise ValueError(f"{name} must be a pair of ints, got {len(items)} entries: {value!r}")
    return dim(items[0], f"{name}[0]", most), dim(items[1], f"{name}[1]", most)
