#!/usr/bin/env python3
"""sparsek against torch on the same tensors, on one GPU: DSD  C = A_bsr @ B.

Contenders, each timed on identical inputs in this one process:
  sparsek      sparsek.bsr_mm(BSRMatrix.from_dense(A, block), B)     (torch.ops.sparsek.bsr_mm)
  torch dense  A_dense @ B                                           (cuBLAS on the densified A)
  torch BSR    A.to_sparse_bsr(block) @ B                            (torch's Triton bsr_dense_mm)

A is M x K with exactly k = round(density * K/bk) random block columns in every block row (the
SPEC §6 workload), values uniform in [-1, 1); B is K x N. Timing: warm-up, then the median of
--reps CUDA-event timings of single calls; inputs are rotated through enough copies that the
working set exceeds L2 (so nothing is timed from a warm cache). Effective TFLOPS count the stored
blocks only: 2 * nnzb * bm * bk * N / time (for torch dense too, so the columns compare); the dense
column also shows its own full-matrix rate. Every contender's result is checked against torch dense
(max |diff| / max |ref|) before its time is reported.

    python3 bench/torch_peers.py                       # the SPEC §6 table, fp16
    python3 bench/torch_peers.py --case 4096,4096,4096,64,0.125 --dtype bf16 --json out.json
"""
import argparse
import json
import math
import statistics
import sys

import torch

import sparsek

SPEC_CASES = [  # M, N, K, block, density (SPEC §6)
    (8192, 8192, 8192, 128, 0.125),
    (8192, 8192, 8192, 64, 0.125),
    (8192, 8192, 8192, 32, 0.125),
    (4096, 4096, 4096, 64, 0.125),
    (8192, 8192, 8192, 128, 0.25),
]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def fixed_k_dense(M, K, b, density, dtype, gen):
    """Dense A (M x K) whose every block row holds exactly k random (b x b) blocks."""
    mb, kb = M // b, K // b
    k = max(1, round(density * kb))
    cols = torch.rand(mb, kb, generator=gen, device="cuda").argsort(dim=1)[:, :k]
    mask = torch.zeros(mb, kb, dtype=torch.bool, device="cuda")
    mask.scatter_(1, cols, True)
    vals = torch.rand(M, K, generator=gen, device="cuda") * 2 - 1
    A = vals * mask.repeat_interleave(b, 0).repeat_interleave(b, 1)
    return A.to(dtype), int(mask.sum())


def time_ms(fn, n_inputs, warmup, reps):
    """Median of `reps` single-call CUDA-event timings, cycling through n_inputs input sets."""
    for i in range(warmup):
        fn(i % n_inputs)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i % n_inputs)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def rel_err(x, ref):
    return float((x.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def run_case(M, N, K, b, density, dtype, args, l2_bytes):
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    A, nnzb = fixed_k_dense(M, K, b, density, dtype, gen)
    eff_flops = 2.0 * nnzb * b * b * N
    esize = torch.finfo(dtype).bits // 8
    # Bytes one call touches (largest contender: the dense one reads all of A).
    per_set = (M * K + K * N + M * N) * esize
    n_sets = max(1, min(args.max_sets, math.ceil(2 * l2_bytes / per_set)))
    As = [A] + [A.clone() for _ in range(n_sets - 1)]
    Bs = [(torch.rand(K, N, generator=gen, device="cuda") * 2 - 1).to(dtype) for _ in range(n_sets)]
    ref = (A @ Bs[0]).float()

    rec = {"M": M, "N": N, "K": K, "block": [b, b], "density": density, "nnzb": nnzb,
           "dtype": str(dtype).replace("torch.", ""), "input_sets": n_sets,
           "effective_flops": eff_flops, "results": {}}

    def measure(name, prepare, call):
        try:
            ops = [prepare(a) for a in As]
            out = call(ops[0], Bs[0])
            err = rel_err(out.to_dense() if out.layout != torch.strided else out, ref)
            if not err < args.tol:
                rec["results"][name] = {"error": f"wrong result: max rel diff {err:.3g} > {args.tol}"}
                return
            ms = time_ms(lambda i: call(ops[i], Bs[i]), n_sets, args.warmup, args.reps)
            rec["results"][name] = {"ms": ms, "eff_tflops": eff_flops / ms / 1e9, "max_rel_diff": err}
        except Exception as e:  # a contender that cannot run this case is reported, not fatal
            rec["results"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
        finally:
            torch.cuda.empty_cache()

    measure("sparsek", lambda a: sparsek.BSRMatrix.from_dense(a, block=(b, b)),
            lambda a, x: sparsek.bsr_mm(a, x))
    measure("torch_dense", lambda a: a, lambda a, x: a @ x)
    if "torch_dense" in rec["results"] and "ms" in rec["results"]["torch_dense"]:
        rec["results"]["torch_dense"]["dense_tflops"] = 2.0 * M * N * K / rec["results"]["torch_dense"]["ms"] / 1e9
    measure("torch_bsr", lambda a: a.to_sparse_bsr((b, b)), lambda a, x: a @ x)
    return rec


def fmt(r, key="eff_tflops"):
    if "error" in r:
        return "n/a"
    return f"{r['ms']:.3f} ms {r[key]:7.1f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", action="append", default=[],
                   help="M,N,K,block,density (repeatable; default: the SPEC §6 cases)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-sets", type=int, default=8, help="most input copies used to defeat L2")
    p.add_argument("--tol", type=float, default=2e-2, help="max rel diff to torch dense to accept a result")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the records to this file")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_peers.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    cases = [tuple(float(v) if i == 4 else int(v) for i, v in enumerate(c.split(","))) for c in args.case] \
        or SPEC_CASES
    dtype = DTYPES[args.dtype]
    prop = torch.cuda.get_device_properties(0)
    l2 = getattr(prop, "L2_cache_size", 50 << 20)
    header = {"gpu": prop.name, "sm_count": prop.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda, "sparsek": sparsek.__version__, "dtype": args.dtype,
              "reps": args.reps, "command": " ".join(sys.argv)}
    print(f"# {prop.name} ({prop.multi_processor_count} SMs), torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"sparsek {sparsek.__version__}, {args.dtype}, median of {args.reps}")
    print("# effective TFLOPS = 2*nnzb*bm*bk*N / time (stored blocks only); dense: (its own full-matrix TFLOPS)")
    print("# vs X = X's time / sparsek's time (> 1: sparsek is faster)")
    cols = f"{'M x N x K':>17} {'block':>7} {'dens':>5} | {'sparsek':>19} | {'torch dense':>19} {'(dense)':>8} | " \
           f"{'torch BSR':>19} | {'vs dense':>8} {'vs BSR':>7}"
    print(cols)
    print("-" * len(cols))
    records = []
    for M, N, K, b, density in cases:
        rec = run_case(M, N, K, b, density, dtype, args, l2)
        records.append(rec)
        r = rec["results"]
        s, d, t = r["sparsek"], r["torch_dense"], r["torch_bsr"]
        vs = lambda o: f"{o['ms'] / s['ms']:.2f}x" if "ms" in s and "ms" in o else "n/a"  # noqa: E731
        dense_own = f"({d['dense_tflops']:6.1f})" if "dense_tflops" in d else ""
        print(f"{f'{M}x{N}x{K}':>17} {f'{b}x{b}':>7} {density:5.3f} | {fmt(s):>19} | {fmt(d):>19} {dense_own:>8} | "
              f"{fmt(t):>19} | {vs(d):>8} {vs(t):>7}")
        for name, res in r.items():
            if "error" in res:
                print(f"    {name}: {res['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "records": records}, f, indent=1)
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
