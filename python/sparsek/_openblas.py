"""Names OpenBLAS's kernels for this CPU while the extension loads OpenBLAS.

The CPU backend's block products run through OpenBLAS (when the library was built with it). An
OpenBLAS older than the CPU model (Debian 12 ships 0.3.21) does not recognise it and falls back to
its generic SSE3 kernels, several times slower. OPENBLAS_CORETYPE, read once when OpenBLAS loads,
names the kernels instead. When the caller has not set it, ``hint()`` sets it from the CPU's flags
(AVX-512 -> SkylakeX, AVX2 + FMA -> Haswell) for the duration of the import only: the environment
is as it was afterwards. An OpenBLAS already loaded (by another package) is not affected.
"""
import contextlib
import os


def coretype(flags):
    """The OPENBLAS_CORETYPE for a set of /proc/cpuinfo flags, or None."""
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@contextlib.contextmanager
def hint():
    name = None if "OPENBLAS_CORETYPE" in os.environ else coretype(cpu_flags())
    if name:
        os.environ["OPENBLAS_CORETYPE"] = name
    try:
        yield
    finally:
        if name:
            os.environ.pop("OPENBLAS_CORETYPE", None)
