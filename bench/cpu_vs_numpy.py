"""The CPU backend's block-sparse product beside NumPy's dense A @ B, in one process.

    PYTHONPATH=build/python python3 bench/cpu_vs_numpy.py [--sizes 1024,2048,4096]
        [--blocks 64,128] [--density 0.125] [--reps 5] [--dtype float32]

For every size S and square block b: A is S x S block-sparse (each block row keeps
round(density * S/b) blocks at random columns), B is S x S dense; it times sparsek.bsr_mm(A, B)
(DSD on the CPU backend) and NumPy's dense A_dense @ B, alternating the two, and prints the medians
and their ratio. Both use every core by default (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS set them).
The result of the sparse product is checked against the dense one.

Idle threads: after a call, NumPy's OpenBLAS workers spin for a while before they sleep, and so do
the CPU backend's OpenMP threads; alternating the two products then makes each run beside the
other's spinning threads (on 2 cores this cost sparsek 30-50% of its time). Unless set already,
OPENBLAS_THREAD_TIMEOUT=4 and OMP_WAIT_POLICY=passive make both sleep at once (set before NumPy and
sparsek load; --spin keeps the defaults).
"""
import argparse
import os
import statistics
import sys
import time

if "--spin" not in sys.argv:
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402

import sparsek  # noqa: E402


def pattern(rng, mb, kb, per_row):
    mask = np.zeros((mb, kb), bool)
    for i in range(mb):
        mask[i, rng.choice(kb, per_row, replace=False)] = True
    return mask


def timed(f):
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--blocks", default="64,128")
    ap.add_argument("--density", type=float, default=0.125)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32"])
    ap.add_argument("--spin", action="store_true", help="leave the idle threads' spin-waits at their defaults")
    args = ap.parse_args()
    print("OPENBLAS_THREAD_TIMEOUT=%s OMP_WAIT_POLICY=%s OMP_NUM_THREADS=%s" % tuple(
        os.environ.get(v, "(unset)") for v in ("OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")))
    rng = np.random.default_rng(0)
    print(f"{'size':>6} {'block':>7} {'density':>8} {'sparsek ms':>11} {'numpy ms':>9} {'numpy/sparsek':>14}")
    for s in (int(x) for x in args.sizes.split(",")):
        B = rng.standard_normal((s, s), dtype=np.float32)
        for b in (int(x) for x in args.blocks.split(",")):
            per_row = max(1, round(args.density * (s // b)))
            mask = pattern(rng, s // b, s // b, per_row)
            dense = rng.standard_normal((s, s), dtype=np.float32) * np.kron(mask, np.ones((b, b), np.float32))
            Ab = sparsek.BSRMatrix.from_dense(dense, block=(b, b), mask=mask)
            out = sparsek.bsr_mm(Ab, B)  # warm-up: plans the pattern, touches the pages
            ref = dense @ B
            err = float(np.abs(out - ref).max() / np.abs(ref).max())
            if err > 1e-5:
                raise SystemExit(f"size {s} block {b}: sparse product differs from the dense one (rel err {err:.2e})")
            ts, tn = [], []
            for _ in range(args.reps):
                ts.append(timed(lambda: sparsek.bsr_mm(Ab, B, out=out)))
                tn.append(timed(lambda: np.matmul(dense, B, out=ref)))
            ms, mn = statistics.median(ts), statistics.median(tn)
            print(f"{s:>6} {b:>3}x{b:<3} {Ab.density:>8.4f} {ms:>11.2f} {mn:>9.2f} {mn / ms:>13.2f}x", flush=True)


if __name__ == "__main__":
    main()
