"""The CPU backend's BLAS path from Python: the OPENBLAS_CORETYPE hint set while the extension
loads, and products on the tiles the BLAS path cuts (64 x 64 blocks, several column chunks)."""
import os

import numpy as np

import sparsek
from sparsek import _openblas


def test_coretype_from_flags():
    assert _openblas.coretype({"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"}) == "SkylakeX"
    assert _openblas.coretype({"avx512f", "avx2", "fma"}) == "Haswell"  # AVX-512 without BW/DQ/VL
    assert _openblas.coretype({"avx2", "fma"}) == "Haswell"
    assert _openblas.coretype({"sse4_2"}) is None


def test_hint_leaves_the_environment_as_it_was(monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.setattr(_openblas, "cpu_flags", lambda: {"avx2", "fma"})
    with _openblas.hint():
        assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"
    assert "OPENBLAS_CORETYPE" not in os.environ
    # A caller's own choice is kept, during and after.
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    with _openblas.hint():
        assert os.environ["OPENBLAS_CORETYPE"] == "Zen"
    assert os.environ["OPENBLAS_CORETYPE"] == "Zen"


def test_product_on_blas_tiles(rng):
    # 64 x 64 blocks, N = 600: three 256-column chunks, the last partial; alpha and beta.
    mb, kb, b, n = 6, 5, 64, 600
    mask = rng.random((mb, kb)) < 0.4
    mask[0, 0] = True
    a = rng.standard_normal((mb * b, kb * b)).astype(np.float32) * np.kron(mask, np.ones((b, b), np.float32))
    x = rng.standard_normal((kb * b, n)).astype(np.float32)
    c = rng.standard_normal((mb * b, n)).astype(np.float32)
    ab = sparsek.BSRMatrix.from_dense(a, block=(b, b), mask=mask)
    want = 1.5 * (a.astype(np.float64) @ x) + 0.5 * c
    got = sparsek.bsr_mm(ab, x, alpha=1.5, beta=0.5, out=c.copy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    # The transposed view (the S^T traversal) on the same tiles.
    y = rng.standard_normal((mb * b, n)).astype(np.float32)
    np.testing.assert_allclose(sparsek.bsr_mm(ab.T, y), a.T.astype(np.float64) @ y, rtol=1e-4, atol=1e-3)


def test_bench_script_runs():
    # bench/cpu_vs_numpy.py on a tiny problem: it runs, checks its product and prints its table.
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "cpu_vs_numpy.py"
    out = subprocess.run([sys.executable, str(script), "--sizes", "256", "--blocks", "32", "--reps", "1"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert "OPENBLAS_THREAD_TIMEOUT=" in out.stdout
    assert "   256  32x32" in out.stdout
