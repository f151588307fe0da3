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

Attention (--attention): B=1, bf16, a random top-k layout (every query block keeps
round(density * S/128) random key blocks, 128x128). Cases (--cases, by key): d128 (Hq=16, S=16384,
D=128, 12.5%), d128-25 (25%, forward only), d64 (D=64, 12.5%), gqa (32 query / 8 key-value heads,
S=8192, 12.5%); with --cases all also gqa16-2 (16/2, S=16384) and causal (causal top-k 12.5%).
Contenders, in one process on the same q, k, v, dO and the same blocks: sparsek (sparsek.attention),
FlashAttention-4 block-sparse (flash_attn.cute.interface.flash_attn_func with block_sparse_tensors
and their transposed lists for the backward, built by bench/fa4_layout.py from the same block mask;
q, k, v as contiguous [B, S, H, D] copies; optional: "FA4 not installed" when flash-attn-4 does not
import), FlexAttention (torch.compile'd flex_attention with a BlockMask of the same blocks) and
SDPA dense (FlashAttention-class, the whole S x S). --peers picks who runs beside sparsek.

Effective TFLOPS = 4 * D * (unmasked score elements) / time, forward; the backward counts 2.5x that
(FlashAttention's convention), over the training step's time minus the forward's ("bwd") and over one
torch.autograd.grad(q, k, v) call for a fixed dO ("1 call"). A training step ("step") is the forward
with gradients enabled and that backward timed as one (events before the forward and after the
backward), as a training loop runs them. sk/FA4 ratios are FA4's time over sparsek's (> 1: sparsek
faster). First calls (FA4's CuTe DSL JIT compile, torch.compile's) are timed apart (wall seconds) and
never enter the kernel times. Answers are checked before any ratio is shown: sparsek's O (and dq, dk,
dv) against FlexAttention's, FA4's against sparsek's (max |diff| printed); a mismatch is marked '*'
and gets no ratio. The gate row times sparsek.gate (top-k chosen so the layout has the case's
density) against sparsek's forward, and against reading Q and K once at the copy bandwidth measured
here: once as an eager Python call ("gate ms", host overhead included) and once replayed from a CUDA
graph ("graph ms": the GPU's time, as inside a captured training step). A contender that cannot run a case is reported as an error, not fatal.
"""
import argparse
import json
import math
import statistics
import sys
import traceback
import time

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

# key, name, Hq, Hkv, S, D, density, causal, backward. The default set: forward D=128 at 12.5% and
# 25%, D=64 at 12.5%, GQA 32/8 at S=8192; backward (and the training step) where the last field says.
ATTN_CASES = [
    ("d128", "D128 12.5%", 16, 16, 16384, 128, 0.125, False, True),
    ("d128-25", "D128 25%", 16, 16, 16384, 128, 0.25, False, False),
    ("d64", "D64 12.5%", 16, 16, 16384, 64, 0.125, False, True),
    ("gqa", "GQA 32/8 12.5%", 32, 8, 8192, 128, 0.125, False, True),
]
EXTRA_ATTN_CASES = [  # --cases all (or by key)
    ("gqa16-2", "GQA 16/2 12.5%", 16, 2, 16384, 128, 0.125, False, True),
    ("causal", "causal 12.5%", 16, 16, 16384, 128, 0.125, True, True),
]


def load_fa4():
    """(flash_attn_func, version) of FlashAttention-4 (flash-attn-4, CuTe DSL), or (None, why not)."""
    try:
        from flash_attn.cute.interface import flash_attn_func
        from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch  # noqa: F401
    except Exception as e:  # noqa: BLE001  (ImportError, or the CuTe DSL failing to load)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    try:
        import importlib.metadata
        version = importlib.metadata.version("flash-attn-4")
    except Exception:  # noqa: BLE001
        version = "(version unknown)"
    return flash_attn_func, version


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


def max_abs(x, ref):
    return float((x.float() - ref.float()).abs().max())


def wall_s(fn):
    """Wall seconds of one call, GPU work included (a first call: compiles, plans, caches)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def run_attention_case(case, args, fa4):
    from torch.nn.attention.flex_attention import flex_attention
    from fa4_layout import fa4_block_sparse_tensors, fa4_lists
    key, name, Hq, Hkv, S, D, density, causal, backward = case
    S, B, dtype = args.seq or S, 1, torch.bfloat16
    t_case = time.perf_counter()
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=gen)
    dout = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=gen)
    layout, mask = topk_layout(Hq, S // 128, density, causal, gen)
    gqa = Hq != Hkv
    elems = unmasked_elements(mask, S, causal)
    fwd_flops = 4.0 * D * elems
    dense_flops = 4.0 * D * S * S * Hq * (0.5 if causal else 1.0)
    rec = {"case": name, "key": key, "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "density": density,
           "causal": causal, "backward": backward, "dtype": "bfloat16", "unmasked_elements": elems,
           "effective_flops_fwd": fwd_flops, "results": {}}
    bhsd = lambda x: x  # noqa: E731
    # Each peer: (call on its own q, k, v; its q, k, v, dO; its tensors back to [B, H, S, D]).
    peers = {}
    if "flex" in args.peers:
        bm = sparsek.block_mask_from_layout(layout, S, S, causal=causal)
        flex = torch.compile(flex_attention)
        peers["flex"] = (lambda q, k, v: flex(q, k, v, block_mask=bm, enable_gqa=gqa), (q, k, v, dout), bhsd)
    peers["sparsek"] = (lambda q, k, v: sparsek.attention(q, k, v, layout, causal=causal)[0], (q, k, v, dout), bhsd)
    if "fa4" in args.peers:
        if fa4[0] is None:
            rec["results"]["fa4"] = {"error": f"FA4 not installed ({fa4[1]})"}
        else:
            # FA4 takes [B, S, H, D]: contiguous copies made once (a strided view would be copied per call).
            # The lists come from the same block mask; whole blocks are FA4 "full" blocks, the causal
            # diagonal its "mask" blocks (bench/fa4_layout.py).
            fwd_bs, bwd_bs = fa4_block_sparse_tensors(fa4_lists(mask, q_len=S, kv_len=S, causal=causal))
            call = fa4[0]
            peers["fa4"] = (lambda q, k, v: call(q, k, v, causal=causal, block_sparse_tensors=fwd_bs,
                                                 block_sparse_tensors_bwd=bwd_bs)[0],
                            tuple(x.transpose(1, 2).contiguous() for x in (q, k, v, dout)),
                            lambda x: x.transpose(1, 2))
    if "sdpa" in args.peers:
        peers["sdpa_dense"] = (lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=gqa), (q, k, v, dout), bhsd)
    # Who each answer is checked against: sparsek against FlexAttention, FA4 against sparsek (so no
    # sparsek/FA4 ratio compares different answers). SDPA computes the dense attention: not checked.
    check_against = {"sparsek": "flex", "fa4": "sparsek"}
    outs, grads = {}, {}
    for who, (fn, (qi, ki, vi, di), back) in peers.items():
        res = rec["results"][who] = {}
        flops = dense_flops if who == "sdpa_dense" else fwd_flops
        ref = check_against.get(who)

        def check(what, mine, theirs, tol):
            err = rel_err(mine, theirs)
            res[f"max_abs_diff_{what}"] = max_abs(mine, theirs)
            res[f"max_rel_diff_{what}"] = err
            if not err < tol:
                res.setdefault("mismatch", []).append(f"{what}: max rel diff to {ref} {err:.3g} > {tol}")
        try:
            with torch.no_grad():
                o, res["first_fwd_s"] = wall_s(lambda: fn(qi, ki, vi))
            outs[who] = back(o)
            if ref in outs:
                check("o", outs[who], outs[ref], args.tol)
            with torch.no_grad():
                ms = time_ms(lambda i: fn(qi, ki, vi), 1, args.warmup, args.reps)
            res.update({"fwd_ms": ms, "fwd_eff_tflops": fwd_flops / ms / 1e9, "fwd_own_tflops": flops / ms / 1e9})
        except Exception as e:  # noqa: BLE001  (a contender that cannot run is reported, not fatal)
            res["error"] = f"forward: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            continue
        finally:
            torch.cuda.empty_cache()
        if not backward:
            continue
        try:
            qg, kg, vg = (x.detach().requires_grad_(True) for x in (qi, ki, vi))

            def first():
                o = fn(qg, kg, vg)
                return o, torch.autograd.grad(o, (qg, kg, vg), di, retain_graph=True)
            (o, g), res["first_step_s"] = wall_s(first)
            grads[who] = tuple(back(x) for x in g)
            if ref in grads:
                for what, mine, theirs in zip(("dq", "dk", "dv"), grads[who], grads[ref]):
                    check(what, mine, theirs, args.grad_tol)
            ms = time_ms(lambda i: torch.autograd.grad(o, (qg, kg, vg), di, retain_graph=True), 1, args.warmup,
                         args.reps)
            res.update({"bwd_ms": ms, "bwd_eff_tflops": 2.5 * fwd_flops / ms / 1e9,
                        "bwd_own_tflops": 2.5 * flops / ms / 1e9})
            del o, g

            def step(i):
                o_step = fn(qg, kg, vg)
                torch.autograd.grad(o_step, (qg, kg, vg), di)
            res["step_ms"] = time_ms(step, 1, args.warmup, args.reps)
            # The backward as a training step sees it: the step minus the forward.
            if res["step_ms"] > res["fwd_ms"]:
                res["bwd_step_eff_tflops"] = 2.5 * fwd_flops / (res["step_ms"] - res["fwd_ms"]) / 1e9
        except Exception as e:  # noqa: BLE001
            res["bwd_error"] = f"backward: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            # where it failed (a peer's internals): the last frames, for the log
            print("".join(traceback.format_exc().splitlines(keepends=True)[-12:]), file=sys.stderr)
        finally:
            torch.cuda.empty_cache()
    del outs, grads
    # The gate at this density: top-k so that topk + sink + local blocks are kept.
    nb = S // 128
    topk = max(0, round(density * nb) - 2)
    if "gate" in args.peers:
        try:
            sparsek.gate(q, k, topk, block=128, causal=causal)
            gms = time_ms(lambda i: sparsek.gate(q, k, topk, block=128, causal=causal), 1, args.warmup, args.reps)
            # The same call captured in a CUDA graph: the GPU's time without the Python call's overhead
            # (an eager call from Python costs more host time than the kernels take).
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                sparsek.gate(q, k, topk, block=128, causal=causal)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                sparsek.gate(q, k, topk, block=128, causal=causal)
            graph_ms = time_ms(lambda i: graph.replay(), 1, args.warmup, args.reps)
            del graph
            big = torch.empty((q.numel() + k.numel()) * 2, dtype=torch.uint8, device="cuda")
            copy_ms = time_ms(lambda i: big.clone(), 1, args.warmup, args.reps)
            read_once_ms = copy_ms / 2  # a clone reads and writes the bytes once each
            attn_ms = rec["results"]["sparsek"].get("fwd_ms")
            rec["gate"] = {"topk": topk, "ms": gms, "graph_ms": graph_ms, "read_qk_once_ms": read_once_ms,
                           "vs_attention": gms / attn_ms if attn_ms else None,
                           "graph_vs_attention": graph_ms / attn_ms if attn_ms else None}
        except Exception as e:  # noqa: BLE001
            rec["gate"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    rec["case_s"] = time.perf_counter() - t_case
    return rec


def attention_cases(spec):
    every = ATTN_CASES + EXTRA_ATTN_CASES
    if spec in (None, "", "default"):
        return ATTN_CASES
    if spec == "all":
        return every
    keys = [s.strip() for s in spec.split(",") if s.strip()]
    known = {c[0]: c for c in every}
    bad = [k for k in keys if k not in known]
    if bad:
        sys.exit(f"--cases: unknown {', '.join(bad)} (known: {', '.join(known)}, default, all)")
    return [known[k] for k in keys]


def attention_main(args, header):
    header["dtype"] = "bfloat16"  # every attention case runs in bf16, whatever --dtype says
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
    cases = attention_cases(args.cases)
    fa4 = load_fa4() if "fa4" in args.peers else (None, "skipped (--peers)")
    header["fa4"] = fa4[1] if fa4[0] is not None else f"not installed: {fa4[1]}"
    t_all = time.perf_counter()
    print(f"# {header['gpu']}, torch {header['torch']}, sparsek {header['sparsek']}, bf16, B=1, 128x128 blocks, "
          f"median of {args.reps}")
    print(f"# FA4 (flash-attn-4, block-sparse, its default non-deterministic backward): "
          f"{fa4[1] if fa4[0] is not None else 'FA4 not installed (' + fa4[1] + ')'}")
    print("# effective TFLOPS = 4*D*unmasked / time; bwd = 2.5x that work over (step - fwd) ms, '1 call': over one "
          "backward call; SDPA dense: (its own dense TFLOPS)")
    print("# sk/X = X's time / sparsek's time (> 1: sparsek faster); '*' marks an answer that differs from its "
          "reference (no ratio then)")
    r_ = lambda res, key: f"{res[key]:.1f}" if key in res else "n/a"  # noqa: E731

    def ratio(r, other, key):  # sparsek's speed over other's, from times
        a, b = r.get("sparsek", {}), r.get(other, {})
        if "mismatch" in a or "mismatch" in b:
            return "*"
        if key == "bwd_step":
            ta = a.get("step_ms", 0) - a.get("fwd_ms", 0) if "bwd_step_eff_tflops" in a else 0
            tb = b.get("step_ms", 0) - b.get("fwd_ms", 0) if "bwd_step_eff_tflops" in b else 0
        else:
            ta, tb = a.get(key), b.get(key)
        return f"{tb / ta:.2f}" if ta and tb else "n/a"

    cols1 = (f"{'case':>15} | {'fwd: sparsek':>12} {'fa4':>6} {'flex':>6} {'sdpa (own)':>14} {'sk/fa4':>6} | "
             f"{'bwd: sparsek':>12} {'fa4':>6} {'flex':>6} {'sk/fa4':>6} | {'1 call: sparsek':>15} {'fa4':>6} "
             f"{'flex':>6} {'sk/fa4':>6} | {'step ms: sparsek':>16} {'fa4':>7} {'flex':>7} {'sk/fa4':>6} "
             f"{'sk/flex':>7}")
    cols2 = (f"{'case':>15} | {'FA4 vs sparsek max|diff|: O':>27} {'dq':>8} {'dk':>8} {'dv':>8} | "
             f"{'first call s: fa4 fwd':>21} {'step':>6} {'flex fwd':>8} {'step':>6} | {'gate ms':>7} "
             f"{'gate/attn':>9} {'graph ms':>8} {'/attn':>6} {'Q+K floor':>9} | {'case s':>6}")
    records, lines2 = [], []
    print(cols1)
    print("-" * len(cols1))
    for case in cases:
        rec = run_attention_case(case, args, fa4)
        records.append(rec)
        if args.json:  # after every case: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"header": header, "records": records}, f, indent=1)
        r = rec["results"]
        g = lambda who: r.get(who, {})  # noqa: E731
        star = lambda who: "*" if "mismatch" in g(who) else ""  # noqa: E731
        t = lambda who, key: (r_(g(who), key) + star(who)) if who in r else "-"  # noqa: E731
        sd = g("sdpa_dense")
        own = f"({sd['fwd_own_tflops']:.1f})" if "fwd_own_tflops" in sd else ""
        ms3 = lambda who: (f"{g(who)['step_ms']:.3f}" + star(who)) if "step_ms" in g(who) else "n/a"  # noqa: E731
        print(f"{rec['case']:>15} | {t('sparsek', 'fwd_eff_tflops'):>12} {t('fa4', 'fwd_eff_tflops'):>6} "
              f"{t('flex', 'fwd_eff_tflops'):>6} {t('sdpa_dense', 'fwd_eff_tflops'):>7} {own:>6} "
              f"{ratio(r, 'fa4', 'fwd_ms'):>6} | {t('sparsek', 'bwd_step_eff_tflops'):>12} "
              f"{t('fa4', 'bwd_step_eff_tflops'):>6} {t('flex', 'bwd_step_eff_tflops'):>6} "
              f"{ratio(r, 'fa4', 'bwd_step'):>6} | {t('sparsek', 'bwd_eff_tflops'):>15} {t('fa4', 'bwd_eff_tflops'):>6} "
              f"{t('flex', 'bwd_eff_tflops'):>6} {ratio(r, 'fa4', 'bwd_ms'):>6} | {ms3('sparsek'):>16} "
              f"{ms3('fa4'):>7} {ms3('flex'):>7} {ratio(r, 'fa4', 'step_ms'):>6} {ratio(r, 'flex', 'step_ms'):>7}")
        for who, res in r.items():
            for k in ("error", "bwd_error"):
                if k in res:
                    print(f"    {who}: {res[k]}")
            for m in res.get("mismatch", []):
                print(f"    {who}: DIFFERENT ANSWER: {m}")
        fa = g("fa4")
        d = lambda key: f"{fa[key]:.2e}" if key in fa else "n/a"  # noqa: E731
        s = lambda res, key: f"{res[key]:.1f}" if key in res else "n/a"  # noqa: E731
        gt = rec.get("gate", {})
        gate_cols = (f"{gt['ms']:7.3f} {gt['vs_attention'] or 0:9.3f} {gt['graph_ms']:8.3f} "
                     f"{gt['graph_vs_attention'] or 0:6.3f} {gt['read_qk_once_ms']:9.3f}" if "ms" in gt
                     else f"{'n/a':>7} {'':>9} {'':>8} {'':>6} {'':>9}")
        lines2.append(f"{rec['case']:>15} | {d('max_abs_diff_o'):>27} {d('max_abs_diff_dq'):>8} "
                      f"{d('max_abs_diff_dk'):>8} {d('max_abs_diff_dv'):>8} | {s(fa, 'first_fwd_s'):>21} "
                      f"{s(fa, 'first_step_s'):>6} {s(g('flex'), 'first_fwd_s'):>8} {s(g('flex'), 'first_step_s'):>6} | "
                      f"{gate_cols} | {rec['case_s']:6.1f}")
        if "error" in gt:
            lines2.append(f"    gate: {gt['error']}")
    print()
    print("# FA4's answers against sparsek's (max |diff|, bf16); first calls (FA4: its CuTe DSL JIT compile; "
          "flex: torch.compile), wall s, apart from the kernel times above; the gate (eager call, CUDA-graph "
          "replay); the case's wall time")
    print(cols2)
    print("-" * len(cols2))
    for line in lines2:
        print(line)
    total = time.perf_counter() - t_all
    header["attention_wall_s"] = total
    print(f"# {len(cases)} cases in {total:.0f} s")
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
    p.add_argument("--seq", type=int, default=None, help="attention: sequence length of every case (default: the case's)")
    p.add_argument("--cases", default="default",
                   help="attention: comma-separated case keys (" + ", ".join(c[0] for c in ATTN_CASES + EXTRA_ATTN_CASES)
                   + "), 'default' (the first four) or 'all'")
    p.add_argument("--peers", default="fa4,flex,sdpa,gate",
                   help="attention: who runs beside sparsek, comma-separated from fa4, flex, sdpa, gate (default: all)")
    p.add_argument("--grad-tol", type=float, default=5e-2,
                   help="attention: max rel diff of dq, dk, dv to the reference's to accept a backward")
    args = p.parse_args()
    args.peers = {s.strip() for s in args.peers.split(",") if s.strip()}
    if args.peers - {"fa4", "flex", "sdpa", "gate"}:
        sys.exit(f"--peers: unknown {', '.join(sorted(args.peers - {'fa4', 'flex', 'sdpa', 'gate'}))} "
                 "(known: fa4, flex, sdpa, gate)")
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
