"""sparsek from Python: C = A @ B with A block-sparse, on NumPy arrays (the CPU backend); torch
and CuPy arrays on a GPU go through the same calls. Bad input raises ValueError naming the argument."""
import numpy as np

import sparsek

rng = np.random.default_rng(0)
A = rng.integers(-3, 4, size=(512, 512)).astype(np.float32)
A[:, 256:] = 0                                           # half of the 64x64 blocks are zero
B = rng.integers(-3, 4, size=(512, 64)).astype(np.float32)

Ab = sparsek.BSRMatrix.from_dense(A, block=(64, 64))     # stores only the non-zero blocks
C = sparsek.bsr_mm(Ab, B)                                # == A @ B
print(f"sparsek {sparsek.__version__}: {Ab.nnzb} blocks stored, max |C - A @ B| = {np.abs(C - A @ B).max()}")
assert np.array_equal(C, A @ B)                          # small integers: exact

try:
    sparsek.bsr_mm(Ab, B[:100])                          # B has the wrong number of rows
except ValueError as e:
    print("error, as expected:", e)
