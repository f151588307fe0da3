#!/usr/bin/env python3
"""sparsek against torch on the same tensors, on one GPU: the three products of a block-sparse layer, and (--attention)
block-sparse attention forward and backward against FlexAttention and SDPA, plus the gate.

  dsd  C = A_bsr @ B            (A: M x K block-sparse)
  dds  y = x @ W_bsr^T          (the layer forward; W: N x K block-sparse, x: M x K)
  sdd  dW = (dy^T @ x) on W's blocks   (the weight gradient; W: M x N, dy: K x M, x: K x N)

Contenders, each timed on identical inputs in this one process:
  sparsek      dsd: sparsek.bsr_mm(BSRMatrix.from_dense(A, block), B)
               dds: sparsek.dense_bsr_mm(x, BSRMatrix.from_dense(W, block).T)
               sdd: sparsek.sampled_mm(dy.T, x, pattern)   (dy.T: a column-major view, no copy)
  torch dense  the dense product (cuBLAS): A @ B, x @ W.T, dy.T @ x (sdd: the whole M x N product)
  torch BSR    torch's Triton bsr_dense_mm: A_bsr @ B, (W_bsr @ x.T).T; sdd: torch has no CUDA BSR
               sampled_addmm, so the row is torch.sparse.sampled_addmm on W's pattern as CSR (cuSPARSE)

The sparse operand holds exactly k = round(density * cols/bk) random block columns in every block
row (the workload table of `sparsek bench`), values uniform in [-1, 1). Timing: warm-up, then the median of --reps
CUDA-event timings of single calls; inputs are rotated through enough copies that the working set
exceeds L2 (so nothing is timed from a warm cache). Effective TFLOPS count the stored blocks only:
2 * nnzb * bm * bk * (the dense extent) / time, for torch dense too, so the columns compare; the
dense column also shows its own full-matrix rate. Every contender's result is checked against
torch dense (max |diff| / max |ref|; sdd: on the pattern's blocks) before its time is reported.

    python3 bench/torch_peers.py                       # the dsd workload table and the layer's dds, sdd
    python3 bench/torch_peers.py --op dds --case 4096,14336,4096,64,0.25 --dtype bf16 --json out.json
    python3 bench/torch_peers.py --attention --json attn.json   # attention rows (bf16), one run

Attention (--attention): B=1, Hq=16, S=16384, bf16, a random top-k layout (every query block
keeps round(density * S/128) random key blocks, 128x128) for D=128 at 12.5% and 25%, D=64 at
12.5%, GQA 16 query / 2 key-value heads at 12.5%, and causal top-k 12.5%. Contenders: sparsek
(sparsek.attention), FlexAttention (torch.compile'd flex_attention with a BlockMask of the same
blocks) and SDPA dense (FlashAttention-class, the whole S x S). Effective TFLOPS = 4 * D * (unmasked
score elements) / time, forward; the backward counts 2.5x that (FlashAttention's convention) and
times torch.autograd.grad of (q, k, v) for a fixed dO. A training step ("step") is the forward with
gradients enabled and that backward timed as one (events before the forward and after the backward),
as a training loop runs them: the host work of the backward call overlaps the forward's GPU time
there, which it cannot in the single-call figures (whose sum is also reported). The gate row times sparsek.gate (top-k chosen
so the layout has the case's density) against sparsek's forward, and against reading Q and K once
at the copy bandwidth measured here. Every O is checked against FlexAttention's before its time is
reported; a backward that this build does not have is reported as an error, not fatal.
"""
import argparse
import json
import math
import statistics
import sys

import torch

import sparsek

SPEC_CASES = [  # M, N, K, block, density: the workload table of `sparsek bench`
    (8192, 8192, 8192, 128, 0.125),
    (8192, 8192, 8192, 64, 0.125),
    (8192, 8192, 8192, 32, 0.125),
    (4096, 4096, 4096, 64, 0.125),
    (8192, 8192, 8192, 128, 0.25),
]
# A block-sparse layer W (14336 x 4096, 64x64 blocks, 25%) with 4096 tokens, and 8192^3 128x128
LAYER_CASES = {  # M, N, K, block, density
    "dds": [(4096, 14336, 4096, 64, 0.25), (8192, 8192, 8192, 128, 0.125)],
    "sdd": [(14336, 4096, 4096, 64, 0.25), (8192, 8192, 8192, 128, 0.125)],
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def fixed_k_mask(M, K, b, density, gen):
    """(M/b x K/b) block mask whose every block row holds exactly k random blocks."""
    mb, kb = M // b, K // b
    k = max(1, round(density * kb))
    cols = torch.rand(mb, kb, generator=gen, device="cuda").argsort(dim=1)[:, :k]
    mask = torch.zeros(mb, kb, dtype=torch.bool, device="cuda")
    mask.scatter_(1, cols, True)
    return mask


def expand(mask, b):
    return mask.repeat_interleave(b, 0).repeat_interleave(b, 1)


def fixed_k_dense(M, K, b, density, dtype, gen):
    """Dense A (M x K) whose every block row holds exactly k random (b x b) blocks."""
    mask = fixed_k_mask(M, K, b, density, gen)
    vals = torch.rand(M, K, generator=gen, device="cuda") * 2 - 1
    A = vals * expand(mask, b)
    return A.to(dtype), int(mask.sum())


def uniform(shape, gen, dtype):
    return (torch.rand(*shape, generator=gen, device="cuda") * 2 - 1).to(dtype)


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


def n_sets_for(per_set, args, l2_bytes):
    return max(1, min(args.max_sets, math.ceil(2 * l2_bytes / per_set)))


def run_case(op, M, N, K, b, density, dtype, args, l2_bytes):
    """One workload: builds the inputs, the reference and the contenders of `op`, times them."""
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    esize = torch.finfo(dtype).bits // 8
    # Bytes one call touches (largest contender: the dense one reads all of the sparse operand).
    n_sets = n_sets_for((M * K + K * N + M * N) * esize, args, l2_bytes)
    if op == "dsd":  # C = A @ B, A: M x K sparse
        A, nnzb = fixed_k_dense(M, K, b, density, dtype, gen)
        sparse = [A] + [A.clone() for _ in range(n_sets - 1)]
        dense = [uniform((K, N), gen, dtype) for _ in range(n_sets)]
        ref = (A @ dense[0]).float()
        eff_flops = 2.0 * nnzb * b * b * N
        contenders = [
            ("sparsek", lambda a: sparsek.BSRMatrix.from_dense(a, block=(b, b)), lambda a, x: sparsek.bsr_mm(a, x)),
            ("torch_dense", lambda a: a, lambda a, x: a @ x),
            ("torch_bsr", lambda a: a.to_sparse_bsr((b, b)), lambda a, x: a @ x),
        ]
    elif op == "dds":  # y = x @ W^T, W: N x K sparse, x: M x K
        W, nnzb = fixed_k_dense(N, K, b, density, dtype, gen)
        sparse = [W] + [W.clone() for _ in range(n_sets - 1)]
        dense = [uniform((M, K), gen, dtype) for _ in range(n_sets)]
        ref = (dense[0] @ W.t()).float()
        eff_flops = 2.0 * nnzb * b * b * M
        contenders = [
            ("sparsek", lambda w: sparsek.BSRMatrix.from_dense(w, block=(b, b)).T,
             lambda wt, x: sparsek.dense_bsr_mm(x, wt)),
            ("torch_dense", lambda w: w, lambda w, x: x @ w.t()),
            ("torch_bsr", lambda w: w.to_sparse_bsr((b, b)), lambda wb, x: (wb @ x.t()).t()),
        ]
    else:  # sdd: dW = (dy^T @ x) on W's blocks, W: M x N, dy: K x M, x: K x N
        mask = fixed_k_mask(M, N, b, density, gen)
        nnzb = int(mask.sum())
        pattern = sparsek.BSRMatrix.from_dense(torch.zeros(M, N, dtype=dtype, device="cuda"), block=(b, b),
                                               mask=mask)
        dense_mask = expand(mask, b)
        sparse = [None] * n_sets  # the sparse operand is the output: nothing to rotate
        dense = [(uniform((K, M), gen, dtype), uniform((K, N), gen, dtype)) for _ in range(n_sets)]
        dy0, x0 = dense[0]
        ref = (dy0.t() @ x0).float() * dense_mask
        eff_flops = 2.0 * nnzb * b * b * K
        csr = dense_mask.to(dtype).to_sparse_csr()
        contenders = [
            ("sparsek", lambda _: pattern, lambda p, dx: sparsek.sampled_mm(dx[0].t(), dx[1], p)),
            ("torch_dense", lambda _: None, lambda _, dx: dx[0].t() @ dx[1]),
            ("torch_bsr", lambda _: csr, lambda c, dx: torch.sparse.sampled_addmm(c, dx[0].t(), dx[1], beta=0.0)),
        ]

    rec = {"op": op, "M": M, "N": N, "K": K, "block": [b, b], "density": density, "nnzb": nnzb,
           "dtype": str(dtype).replace("torch.", ""), "input_sets": n_sets,
           "effective_flops": eff_flops, "results": {}}

    def as_dense(out):
        if isinstance(out, sparsek.BSRMatrix):
            return out.to_dense()
        if out.layout != torch.strided:
            return out.to_dense()
        return out * dense_mask if op == "sdd" else out  # the dense peer computes every block

    def measure(name, prepare, call):
        try:
            ops = [prepare(a) for a in sparse]
            out = call(ops[0], dense[0])
            err = rel_err(as_dense(out), ref)
            if not err < args.tol:
                rec["results"][name] = {"error": f"wrong result: max rel diff {err:.3g} > {args.tol}"}
                return
            ms = time_ms(lambda i: call(ops[i], dense[i]), n_sets, args.warmup, args.reps)
            rec["results"][name] = {"ms": ms, "eff_tflops": eff_flops / ms / 1e9, "max_rel_diff": err}
        except Exception as e:  # a contender that cannot run this case is reported, not fatal
            rec["results"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
        finally:
            torch.cuda.empty_cache()

    for name, prepare, call in contenders:
        measure(name, prepare, call)
    if "ms" in rec["results"].get("torch_dense", {}):
        rec["results"]["torch_dense"]["dense_tflops"] = 2.0 * M * N * K / rec["results"]["torch_dense"]["ms"] / 1e9
    return rec


# ---------------------------------------------------------------- attention

ATTN_CASES = [  # name, Hq, Hkv, D, density, causal
    ("D128 12.5%", 16, 16, 128, 0.125, False),
    ("D128 25%", 16, 16, 128, 0.25, False),
    ("D64 12.5%", 16, 16, 64, 0.125, False),
    ("GQA 16/2 12.5%", 16, 2, 128, 0.125, False),
    ("causal 12.5%", 16, 16, 128, 0.125, True),
]


def topk_layout(Hq, nblocks, density, causal, gen):
    """Every query block keeps k random key blocks (allowed ones: at or before the diagonal with causal)."""
    k = max(1, round(density * nblocks))
    r = torch.rand(1, Hq, nblocks, nblocks, generator=gen, device="cuda")
    if causal:
        r = r.masked_fill(torch.ones(nblocks, nblocks, dtype=torch.bool, device="cuda").triu(1), -1.0)
        r[..., torch.arange(nblocks), torch.arange(nblocks)] = 2.0  # the diagonal always
    top = r.topk(min(k, nblocks), dim=-1).indices
    mask = torch.zeros_like(r, dtype=torch.bool).scatter_(-1, top, True) & (r >= 0)
    return sparsek.BlockLayout.from_dense(mask, block=128), mask


def unmasked_elements(mask, S, causal, b=128):
    """Score elements the layout attends (summed over heads)."""
    per_block = mask.sum().item() * b * b
    if not causal:
        return float(per_block)
    diag = mask[..., torch.arange(mask.shape[-1]), torch.arange(mask.shape[-1])].sum().item()
    return float(per_block - diag * (b * (b - 1) // 2))


def run_attention_case(name, Hq, Hkv, D, density, causal, args):
    from torch.nn.attention.flex_attention import flex_attention
    S, B = args.seq, 1
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=gen)
    dout = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=gen)
    layout, mask = topk_layout(Hq, S // 128, density, causal, gen)
    bm = sparsek.block_mask_from_layout(layout, S, S, causal=causal)
    flex = torch.compile(flex_attention)
    gqa = Hq != Hkv
    elems = unmasked_elements(mask, S, causal)
    fwd_flops = 4.0 * D * elems
    dense_flops = 4.0 * D * S * S * Hq * (0.5 if causal else 1.0)
    rec = {"case": name, "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "density": density, "causal": causal,
           "dtype": "bfloat16", "unmasked_elements": elems, "effective_flops_fwd": fwd_flops, "results": {}}
    calls = {
        "sparsek": lambda q, k, v: sparsek.attention(q, k, v, layout, causal=causal)[0],
        "flex": lambda q, k, v: flex(q, k, v, block_mask=bm, enable_gqa=gqa),
        "sdpa_dense": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=gqa),
    }
    ref = None
    for who, fn in calls.items():
        res = rec["results"][who] = {}
        flops = dense_flops if who == "sdpa_dense" else fwd_flops
        try:
            with torch.no_grad():
                o = fn(q, k, v)
            if who == "flex":
                ref = o
            elif who == "sparsek" and ref is None:
                ref = calls["flex"](q, k, v)
            if who != "sdpa_dense":
                err = rel_err(o, ref if who == "sparsek" else o)
                res["max_rel_diff_vs_flex"] = err
                if not err < args.tol:
                    res["error"] = f"wrong result: max rel diff to FlexAttention {err:.3g} > {args.tol}"
                    continue
            with torch.no_grad():
                ms = time_ms(lambda i: fn(q, k, v), 1, args.warmup, args.reps)
            res.update({"fwd_ms": ms, "fwd_eff_tflops": fwd_flops / ms / 1e9, "fwd_own_tflops": flops / ms / 1e9})
        except Exception as e:  # noqa: BLE001  (a contender that cannot run is reported, not fatal)
            res["error"] = f"forward: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        try:
            qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
            o = fn(qg, kg, vg)
            torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)
            ms = time_ms(lambda i: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True), 1, args.warmup,
                         args.reps)
            res.update({"bwd_ms": ms, "bwd_eff_tflops": 2.5 * fwd_flops / ms / 1e9,
                        "bwd_own_tflops": 2.5 * flops / ms / 1e9})

            def step(i):
                o_step = fn(qg, kg, vg)
                torch.autograd.grad(o_step, (qg, kg, vg), dout)
            res["step_ms"] = time_ms(step, 1, args.warmup, args.reps)
        except Exception as e:  # noqa: BLE001
            res["bwd_error"] = f"backward: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        finally:
            torch.cuda.empty_cache()
    # The gate at this density: top-k so that topk + sink + local blocks are kept.
    nb = S // 128
    topk = max(0, round(density * nb) - 2)
    try:
        sparsek.gate(q, k, topk, block=128, causal=causal)
        gms = time_ms(lambda i: sparsek.gate(q, k, topk, block=128, causal=causal), 1, args.warmup, args.reps)
        big = torch.empty((q.numel() + k.numel()) * 2, dtype=torch.uint8, device="cuda")
        copy_ms = time_ms(lambda i: big.clone(), 1, args.warmup, args.reps)
        read_once_ms = copy_ms / 2  # a clone reads and writes the bytes once each
        attn_ms = rec["results"]["sparsek"].get("fwd_ms")
        rec["gate"] = {"topk": topk, "ms": gms, "read_qk_once_ms": read_once_ms,
                       "vs_attention": gms / attn_ms if attn_ms else None}
    except Exception as e:  # noqa: BLE001
        rec["gate"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    return rec


def attention_main(args, header):
    # Every case compiles flex_attention anew (shapes, GQA, grad mode): past torch's default limit of
    # 8 recompilations it silently falls back to the unfused eager path (slow, and bf16 throughout, so
    # it no longer serves as the reference either).
    import torch._dynamo
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    # The backward is timed as repeated torch.autograd.grad(..., retain_graph=True) on one forward.
    # A compiled backward that donates its saved buffers refuses retain_graph ("compiled with non-empty
    # donated buffers"), which some runs of torch 2.11 chose for FlexAttention: keep the buffers.
    import torch._functorch.config
    if hasattr(torch._functorch.config, "donated_buffer"):
        torch._functorch.config.donated_buffer = False
    print(f"# {header['gpu']}, torch {header['torch']}, sparsek {header['sparsek']}, bf16, B=1, S={args.seq}, "
          f"median of {args.reps}; effective TFLOPS = 4*D*unmasked / time (backward: 2.5x); "
          "SDPA dense: (its own dense TFLOPS)")
    cols = f"{'case':>16} | {'sparsek fwd':>11} {'flex fwd':>9} {'sdpa fwd':>14} | {'sparsek bwd':>11} " \
           f"{'flex bwd':>9} {'sdpa bwd':>14} | {'step ms':>7} {'flex':>7} {'x':>5} {'sum x':>5} | " \
           f"{'gate ms':>8} {'gate/attn':>9} {'Q+K floor':>9}"
    print(cols)
    print("-" * len(cols))
    records = []
    for case in ATTN_CASES:
        rec = run_attention_case(*case, args)
        records.append(rec)
        r = rec["results"]
        t = lambda who, key: f"{r[who][key]:.1f}" if key in r[who] else "n/a"  # noqa: E731
        own = lambda key: f"{r['sdpa_dense'][key.replace('eff', 'own')]:.1f}" if key in r["sdpa_dense"] else ""  # noqa: E731
        g = rec.get("gate", {})
        gate_cols = (f"{g['ms']:8.3f} {g['vs_attention'] or 0:9.3f} {g['read_qk_once_ms']:9.3f}" if "ms" in g
                     else f"{'n/a':>8} {'':>9} {'':>9}")
        # The training step against FlexAttention: timed as one, and as the sum of the single calls.
        sk, fx = r["sparsek"], r["flex"]
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "n/a"  # noqa: E731
        ms3 = lambda who: f"{r[who]['step_ms']:.3f}" if "step_ms" in r[who] else "n/a"  # noqa: E731
        step_cols = (f"{ms3('sparsek'):>7} {ms3('flex'):>7} "
                     f"{ratio(fx.get('step_ms'), sk.get('step_ms')):>5} "
                     f"{ratio(fx.get('fwd_ms', 0) + fx.get('bwd_ms', 0), sk.get('fwd_ms', 0) + sk.get('bwd_ms', 0)):>5}")
        print(f"{rec['case']:>16} | {t('sparsek', 'fwd_eff_tflops'):>11} {t('flex', 'fwd_eff_tflops'):>9} "
              f"{t('sdpa_dense', 'fwd_eff_tflops'):>6} ({own('fwd_eff_tflops'):>5}) | "
              f"{t('sparsek', 'bwd_eff_tflops'):>11} {t('flex', 'bwd_eff_tflops'):>9} "
              f"{t('sdpa_dense', 'bwd_eff_tflops'):>6} ({own('bwd_eff_tflops'):>5}) | {step_cols} | {gate_cols}")
        for who, res in r.items():
            for key in ("error", "bwd_error"):
                if key in res:
                    print(f"    {who}: {res[key]}")
        if "error" in g:
            print(f"    gate: {g['error']}")
    return records


def fmt(r, key="eff_tflops"):
    if "error" in r:
        return "n/a"
    return f"{r['ms']:.3f} ms {r[key]:7.1f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", choices=["all", "dsd", "dds", "sdd"], default="all",
                   help="which product (default: all; dsd runs the workload table, dds/sdd the layer's)")
    p.add_argument("--case", action="append", default=[],
                   help="M,N,K,block,density (repeatable; needs one --op; default: the op's table)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-sets", type=int, default=8, help="most input copies used to defeat L2")
    p.add_argument("--tol", type=float, default=2e-2, help="max rel diff to torch dense to accept a result")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the records to this file")
    p.add_argument("--attention", action="store_true", help="the attention rows instead of the DSD table")
    p.add_argument("--seq", type=int, default=16384, help="attention: sequence length")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_peers.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    ops = ["dsd", "dds", "sdd"] if args.op == "all" else [args.op]
    if args.case and len(ops) != 1:
        sys.exit("--case needs one --op (dsd, dds or sdd)")
    given = [tuple(float(v) if i == 4 else int(v) for i, v in enumerate(c.split(","))) for c in args.case]
    cases = [(op, *c) for op in ops for c in (given or (SPEC_CASES if op == "dsd" else LAYER_CASES[op]))]
    dtype = DTYPES[args.dtype]
    prop = torch.cuda.get_device_properties(0)
    l2 = getattr(prop, "L2_cache_size", 50 << 20)
    header = {"gpu": prop.name, "sm_count": prop.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda, "sparsek": sparsek.__version__, "dtype": args.dtype,
              "reps": args.reps, "command": " ".join(sys.argv)}
    if args.attention:
        records = attention_main(args, header)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"header": header, "records": records}, f, indent=1)
            print(f"# wrote {args.json}")
        return
    print(f"# {prop.name} ({prop.multi_processor_count} SMs), torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"sparsek {sparsek.__version__}, {args.dtype}, median of {args.reps}")
    print("# effective TFLOPS = 2*nnzb*bm*bk*N / time (stored blocks only); dense: (its own full-matrix TFLOPS)")
    print("# vs X = X's time / sparsek's time (> 1: sparsek is faster)")
    print("# sdd: 'torch BSR' is torch.sparse.sampled_addmm on the pattern as CSR (torch has no CUDA BSR one)")
    cols = f"{'op':>3} {'M x N x K':>17} {'block':>7} {'dens':>5} | {'sparsek':>19} | {'torch dense':>19} " \
           f"{'(dense)':>8} | {'torch BSR':>19} | {'vs dense':>8} {'vs BSR':>7}"
    print(cols)
    print("-" * len(cols))
    records = []
    for op, M, N, K, b, density in cases:
        rec = run_case(op, M, N, K, b, density, dtype, args, l2)
        records.append(rec)
        r = rec["results"]
        s, d, t = r["sparsek"], r["torch_dense"], r["torch_bsr"]
        vs = lambda o: f"{o['ms'] / s['ms']:.2f}x" if "ms" in s and "ms" in o else "n/a"  # noqa: E731
        dense_own = f"({d['dense_tflops']:6.1f})" if "dense_tflops" in d else ""
        print(f"{op:>3} {f'{M}x{N}x{K}':>17} {f'{b}x{b}':>7} {density:5.3f} | {fmt(s):>19} | {fmt(d):>19} {dense_own:>8} | "
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
