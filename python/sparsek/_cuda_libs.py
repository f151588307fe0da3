"""Finds the CUDA libraries the extension links before it is loaded.

The wheel's libraries look for them next to the package, in NVIDIA's runtime wheels
(``site-packages/nvidia/cu13/lib``: nvidia-cuda-runtime, nvidia-cublas, nvidia-cusparse, which
pip installs with sparsek), then on the loader's usual path. This module covers the other
layouts: those wheels in another ``sys.path`` entry (a user site, a ``--system-site-packages``
venv), or a CUDA 13 toolkit that is not on the loader's path ($CUDA_HOME, $CUDA_PATH,
/usr/local/cuda). Loading a library by its full path first makes the extension's own lookup by
name find it. A build without CUDA (SPARSEK_CUDA=OFF) links none of them: nothing is looked up.
"""
import ctypes
import os
import sys

try:
    from ._build import CUDA as BUILT_WITH_CUDA
except ImportError:  # not a build (the source tree): assume the default build, with CUDA
    BUILT_WITH_CUDA = True

# In dependency order (cuBLAS needs cuBLASLt, cuSPARSE needs nvJitLink).
LIBS = ("libcudart.so.13", "libnvJitLink.so.13", "libcublasLt.so.13", "libcublas.so.13", "libcusparse.so.12")


def wheel_dirs():
    """``nvidia/cu13/lib`` directories of NVIDIA's wheels on ``sys.path``."""
    dirs = []
    for entry in sys.path:
        d = os.path.join(entry or os.getcwd(), "nvidia", "cu13", "lib")
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


def toolkit_dirs():
    """Library directories of a CUDA toolkit named by the environment, or the default one."""
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    dirs = []
    for d in (os.path.join(r, sub) for r in roots if r for sub in ("lib64", "lib")):
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


def _loadable_by_name(name):
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def find():
    """{library name: directory it is loaded from, or None when the loader finds it by name}.

    Raises ImportError naming what is missing and where it looked. Empty without CUDA."""
    if not BUILT_WITH_CUDA:
        return {}
    found, missing = {}, []
    wheels, toolkits = wheel_dirs(), toolkit_dirs()
    for name in LIBS:
        where = next((d for d in wheels if os.path.exists(os.path.join(d, name))), None)
        if where is None and not _loadable_by_name(name):
            where = next((d for d in toolkits if os.path.exists(os.path.join(d, name))), None)
            if where is None:
                missing.append(name)
                continue
        found[name] = where
    if missing:
        raise ImportError(
            "sparsek needs the CUDA 13 libraries " + ", ".join(missing) + ", found neither in NVIDIA's "
            "wheels on sys.path (pip install nvidia-cuda-runtime nvidia-cublas nvidia-cusparse), nor on the "
            "loader's path (LD_LIBRARY_PATH, ldconfig), nor in a toolkit (" +
            (", ".join(toolkits) or "$CUDA_HOME, $CUDA_PATH and /usr/local/cuda are absent") + ")")
    return found


def preload():
    """Loads every library found in a directory (RTLD_GLOBAL), in dependency order."""
    for name, where in find().items():
        if where is not None:
            ctypes.CDLL(os.path.join(where, name), mode=ctypes.RTLD_GLOBAL)


def library_path():
    """The directories found, for the LD_LIBRARY_PATH of a child process (the CLI)."""
    dirs = []
    for where in find().values():
        if where is not None and where not in dirs:
            dirs.append(where)
    return dirs


preload()
