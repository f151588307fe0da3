"""The ``sparsek`` command that pip installs: runs the CLI program shipped in the wheel
(``sparsek/bin/sparsek``) with the CUDA libraries that ``_cuda_libs`` found on its loader path."""
import os
import sys

from . import _cuda_libs


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "sparsek")
    if not os.access(exe, os.X_OK):
        sys.exit(f"sparsek: the command-line program is missing from this installation ({exe}); "
                 "reinstall the package (pip install --force-reinstall sparsek)")
    env = dict(os.environ)
    path = _cuda_libs.library_path() + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(path)
    os.execve(exe, [exe] + sys.argv[1:], env)


if __name__ == "__main__":
    main()
