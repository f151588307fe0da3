"""The installed shape of the package: one version, the CUDA libraries' lookup, the `sparsek` command."""
import os
import re
import subprocess
import sys

import pytest

import sparsek
from sparsek import _cuda_libs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
cuda_build = pytest.mark.skipif(not _cuda_libs.BUILT_WITH_CUDA,
                                reason="built without CUDA (SPARSEK_CUDA=OFF): no CUDA libraries to find")


def test_version_comes_from_the_header():
    text = open(os.path.join(ROOT, "include", "sparsek", "version.h")).read()
    parts = [re.search(rf"#define SPARSEK_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    assert sparsek.__version__ == ".".join(parts)


@cuda_build
def test_every_cuda_library_is_found():
    found = _cuda_libs.find()
    assert list(found) == list(_cuda_libs.LIBS)
    for name, where in found.items():
        assert where is None or os.path.exists(os.path.join(where, name))


@cuda_build
def test_nvidia_wheels_come_first(monkeypatch, tmp_path):
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in _cuda_libs.LIBS:
        (lib / name).write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert _cuda_libs.find() == {name: str(lib) for name in _cuda_libs.LIBS}
    assert _cuda_libs.library_path() == [str(lib)]


@cuda_build
def test_missing_libraries_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(_cuda_libs, "_loadable_by_name", lambda name: False)
    monkeypatch.setattr(_cuda_libs, "toolkit_dirs", lambda: [])
    with pytest.raises(ImportError, match=r"libcudart\.so\.13, .*libcusparse\.so\.12.*pip install nvidia-cuda-runtime"):
        _cuda_libs.find()


@pytest.mark.skipif(_cuda_libs.BUILT_WITH_CUDA, reason="a build with CUDA: its libraries are looked up")
def test_without_cuda_no_library_is_looked_up(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])  # no NVIDIA wheels, no toolkit: still nothing missing
    monkeypatch.setattr(_cuda_libs, "toolkit_dirs", lambda: [])
    assert _cuda_libs.find() == {}
    assert _cuda_libs.library_path() == []


def test_sparsek_command_runs_the_cli():
    exe = os.path.join(os.path.dirname(sparsek.__file__), "bin", "sparsek")
    if not os.path.exists(exe):
        pytest.skip(f"no CLI at {exe} (this sparsek was built without it)")
    out = subprocess.run([sys.executable, "-c", "from sparsek._cli import main; main()", "doctor"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"sparsek {sparsek.__version__} doctor" in out.stdout


def test_python_example_runs():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "dsd.py")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "max |C - A @ B| = 0.0" in out.stdout and "error, as expected:" in out.stdout
