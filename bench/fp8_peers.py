#!/usr/bin/env python3
"""sparsek's fp8 (e4m3) block-sparse product beside torch's dense fp8 GEMM (torch._scaled_mm), in one
process on the same quantized data: a mixture-of-experts speed row and an accuracy row.

    PYTHONPATH=build-gpu/python:python python3 bench/fp8_peers.py --json fp8_peers.json
    PYTHONPATH=build-nocuda/python:python python3 bench/fp8_peers.py --device cpu --small   # CPU check

sparsek's product is the DSD C = A·B (sparsek.bsr_mm): A the e4m3 BSR weight with one fp32 scale per
stored block (BSRMatrix.quantize()), B e4m3 activations with one fp32 scale per token (column of B).
The activations are quantized tokens-major, x8 [tokens, K] with one scale per row
(sparsek.quantize_e4m3(x)), and B = x8.T reads them column-major in place, the layout the fp8 kernel
takes without a transpose. In both libraries an element's value is scale * code (sparsek's scales
and _scaled_mm's scale_a / scale_b multiply); the fp64 reference is built that way and checks it.

Experts: 8 experts, expert e a dense E_n x E_k e4m3 matrix on the diagonal of a block-diagonal BSR
weight (default 16384 x 16384, 128x128 blocks, 16x16 stored blocks each), times B of --tokens columns
(expert e reads its own E_k x tokens slice of B). Each block holds one element at its expert's amax,
so all blocks of an expert get the same scale and one scale per expert is exact. The token scales
are one per column of the whole B, shared by the experts' slices (sparsek's fp8 kernel takes one
scale per token, not per token and 128-wide group of K). bf16 out. Contenders:
  sparsek          sparsek.bsr_mm(W8, x8.T, b_scales=xs, out_dtype=bf16), one call
  _scaled_mm loop  per expert torch._scaled_mm(W_e, x_e.T, scale_a [E_n, 1], scale_b [1, tokens],
                   out_dtype=bf16) in a Python loop; W_e the expert's codes (row-major), x_e its
                   contiguous slice of x8 (x_e.T column-major, as _scaled_mm requires); rowwise scales
  _scaled_grouped  torch._scaled_grouped_mm on the stacked experts (3-D x 3-D), scale_a [E, E_n],
                   scale_b [E, tokens]; a row saying why where torch has none or it fails
Times: warm-up, then the median of --reps single calls timed by CUDA events (host overhead
included: the loop's launches count). Effective TFLOPS = 2 * nnzb * 128 * 128 * tokens / time, the
same work for all. Every output is checked against fp64, sparsek's and the grouped peer's against
the loop's (max |diff| / max |ref| < --tol) before a ratio (peer time / sparsek time, target >= 1.0).

Accuracy: C = A·B at M x N x K (default 4096^3), A 128x128 blocks at 12.5% (each block row the same
number of random blocks) with the block scales constant along each block row (so one scale per row
of A: _scaled_mm's rowwise scale_a [M, 1]; B's token scales its scale_b [1, N]). The peer multiplies
the densified codes (zeros where sparsek stores no block). Against fp64 on the dequantized inputs:
||C - C_ref||_F / ||C_ref||_F and max |C - C_ref| / max |C_ref|, the worst of --acc-seeds seeds;
ratio sparsek / _scaled_mm, target <= 1.5.

Without CUDA (--device cpu, or no GPU) both rows run on sparsek's CPU backend (use --small); a torch
peer that torch's CPU build lacks is a row saying so. CPU times say nothing about the GPU.
"""
import argparse
import json
import statistics
import sys
import time

import torch

sparsek = None  # imported in main(), after the arguments (a missing build is then one clear line)
BLOCK = 128
F8, U8 = torch.float8_e4m3fn, torch.uint8
OUT = {"bf16": torch.bfloat16, "f32": torch.float32}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--small", action="store_true", help="small shapes (for the CPU backend)")
    p.add_argument("--rows", default="experts,accuracy", help="which rows: experts, accuracy (comma-separated)")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--expert-n", type=int, default=2048, help="E_n: output rows of one expert (multiple of 128)")
    p.add_argument("--expert-k", type=int, default=2048, help="E_k: reduced dimension of one expert (multiple of 128)")
    p.add_argument("--tokens", type=int, default=4096, help="columns of B (multiple of 16)")
    p.add_argument("--acc-shape", default="4096,4096,4096", help="accuracy row M,N,K")
    p.add_argument("--acc-density", type=float, default=0.125)
    p.add_argument("--acc-seeds", type=int, default=3)
    p.add_argument("--acc-out", choices=sorted(OUT), default="bf16", help="output dtype of the accuracy row")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--tol", type=float, default=2e-2, help="max |diff| / max |ref| to accept an answer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the records to this file")
    a = p.parse_args()
    if a.small:
        a.expert_n, a.expert_k, a.tokens, a.acc_shape = 256, 256, 128, "1024,512,2048"
    a.acc_shape = tuple(int(v) for v in a.acc_shape.split(","))
    a.rows = {s.strip() for s in a.rows.split(",") if s.strip()}
    M, N, K = a.acc_shape
    if a.expert_n % BLOCK or a.expert_k % BLOCK or a.tokens % 16 or M % BLOCK or K % BLOCK or N % 16:
        p.error("E_n, E_k, M and K must be multiples of 128, --tokens and N multiples of 16")
    if a.rows - {"experts", "accuracy"}:
        p.error(f"--rows: unknown {', '.join(sorted(a.rows - {'experts', 'accuracy'}))}")
    return a


def time_ms(fn, warmup, reps, cuda):
    """Median of `reps` single calls: CUDA events on a GPU, host wall-clock on the CPU."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def error_text(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def rel_err(x, ref):
    """max |x - ref| / max |ref|, in float64."""
    d = (x.double() - ref.double()).abs().max()
    return float(d / ref.double().abs().max().clamp_min(1e-300))


def fro_err(x, ref):
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def blocks_with_amax(amax, gen):
    """float32 blocks (len(amax), 128, 128), uniform in [-amax_i, amax_i), with element [0, 0] set to
    amax_i: every block's amax is exactly amax_i, so quantize() gives it scale amax_i / 448 (the same
    float for every block of equal amax_i)."""
    v = torch.rand(amax.numel(), BLOCK, BLOCK, generator=gen, device=amax.device) * 2 - 1
    v *= amax[:, None, None]
    v[:, 0, 0] = amax
    return v


def tokens_e4m3(T, K, gen, dev):
    """(x8 [T, K] e4m3 row-major, xs [T] float32): random tokens whose magnitudes span 2^-4..2^4,
    quantized by sparsek.quantize_e4m3 (one scale per row = per token; value = xs[t] * code)."""
    mag = 2.0 ** (torch.rand(T, 1, generator=gen, device=dev) * 8 - 4)
    x = (torch.rand(T, K, generator=gen, device=dev) * 2 - 1) * mag
    return sparsek.quantize_e4m3(x, per="row")


def unblock(v, nbr, nbc):
    """(nbr*nbc, bm, bk) blocks in row-major block order -> the (nbr*bm, nbc*bk) matrix (fp8 moved
    as uint8 codes: torch copies bytes for every dtype)."""
    fp8 = v.dtype == F8
    u = v.view(U8) if fp8 else v
    bm, bk = u.shape[1:]
    d = u.reshape(nbr, nbc, bm, bk).permute(0, 2, 1, 3).reshape(nbr * bm, nbc * bk)
    return d.view(F8) if fp8 else d


def densify(m, values):
    """The (rows x cols) matrix of m's pattern with `values` [nnzb, bm, bk] (zeros where no block)."""
    (rows, cols), (bm, bk) = m.shape, m.block
    block_row = torch.repeat_interleave(torch.arange(rows // bm, device=values.device), m.row_ptr.diff().long())
    fp8 = values.dtype == F8
    out = torch.zeros(rows // bm, cols // bk, bm, bk, dtype=U8 if fp8 else values.dtype, device=values.device)
    out[block_row, m.col_idx.long()] = values.view(U8) if fp8 else values
    out = out.permute(0, 2, 1, 3).reshape(rows, cols)
    return out.view(F8) if fp8 else out


def dequant_blocks(m, lo=0, hi=None):
    """float64 values of stored blocks lo..hi of an e4m3 BSRMatrix: code * block scale (both exact)."""
    return m.values[lo:hi].float().double() * m.scales[lo:hi].double()[:, None, None]


def peer_error(e, dev, what):
    if dev == "cpu":
        return f"{what} needs CUDA here ({error_text(e)})"
    return f"{what} failed: {error_text(e)}"


def experts_row(a, dev):
    E, En, Ek, T = a.experts, a.expert_n, a.expert_k, a.tokens
    nbr, nbc = En // BLOCK, Ek // BLOCK
    bpe, cuda = nbr * nbc, dev == "cuda"
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    amp = 2.0 ** (torch.rand(E, generator=gen, device=dev) * 6 - 3)  # one amax per expert
    values = blocks_with_amax(amp.repeat_interleave(bpe), gen)
    # Block-diagonal pattern: block row r of expert e holds its nbc blocks, in column order.
    row_ptr = torch.arange(E * nbr + 1, dtype=torch.int32, device=dev) * nbc
    col_idx = (torch.arange(E, device=dev).repeat_interleave(bpe) * nbc + torch.arange(nbc, device=dev).repeat(E * nbr))
    W8 = sparsek.BSRMatrix(row_ptr, col_idx.to(torch.int32), values, (E * En, E * Ek)).quantize()
    del values
    sc = W8.scales.view(E, bpe)
    if not bool((sc == sc[:, :1]).all()):
        raise RuntimeError("the blocks of one expert got different scales: the per-expert peer would not be exact")
    x8, xs = tokens_e4m3(T, E * Ek, gen, dev)
    B = x8.t()  # (E*Ek) x T, column-major: the tokens-major activations read in place
    flops = 2.0 * W8.nnzb * BLOCK * BLOCK * T
    # The peers' operands, made once outside the timing.
    w_e = [unblock(W8.values[e * bpe:(e + 1) * bpe], nbr, nbc) for e in range(E)]  # En x Ek row-major
    x_e = [x8.view(U8)[:, e * Ek:(e + 1) * Ek].contiguous().view(F8) for e in range(E)]  # T x Ek; .t(): col-major
    sa_e = [sc[e, :1].expand(En).reshape(En, 1).contiguous() for e in range(E)]
    sb = xs.reshape(1, T).contiguous()
    # fp64 reference from the per-block scales (not the per-expert ones the peers assume).
    ref = torch.cat([unblock(dequant_blocks(W8, e * bpe, (e + 1) * bpe), nbr, nbc)
                     @ (x_e[e].float().double() * xs.double()[:, None]).t() for e in range(E)])

    def loop():
        return [torch._scaled_mm(w_e[e], x_e[e].t(), sa_e[e], sb, out_dtype=torch.bfloat16) for e in range(E)]

    def grouped():
        ga = torch.stack([w.view(U8) for w in w_e]).view(F8)  # E x En x Ek, row-major
        gb = torch.stack([x.view(U8) for x in x_e]).view(F8).transpose(1, 2)  # E x Ek x T, column-major
        sa, sbg = sc[:, :1].expand(E, En).contiguous(), xs.expand(E, T).contiguous()
        return lambda: torch._scaled_grouped_mm(ga, gb, sa, sbg, out_dtype=torch.bfloat16).reshape(E * En, T)

    SK, LOOP, GROUPED = "sparsek bsr_mm (one DSD)", "torch._scaled_mm loop", "torch._scaled_grouped_mm"
    contenders = {SK: lambda: lambda: sparsek.bsr_mm(W8, B, b_scales=xs, out_dtype=torch.bfloat16),
                  LOOP: lambda: lambda: torch.cat(loop()), GROUPED: grouped}
    peer_op = {LOOP: "_scaled_mm", GROUPED: "_scaled_grouped_mm"}
    rows, outs = {}, {}
    for name, make in contenders.items():
        if name in peer_op and not hasattr(torch, peer_op[name]):
            rows[name] = {"error": f"torch.{peer_op[name]} is not in torch {torch.__version__}"}
            continue
        try:
            fn = make()
            outs[name] = out = fn()
            err = rel_err(out, ref)
            if not err < a.tol:
                rows[name] = {"error": f"DIFFERENT ANSWER: max |C - C_fp64| / max |C_fp64| = {err:.3g}"}
                continue
            # The loop peer is timed as the loop (its E launches), not with the concatenation.
            ms = time_ms(loop if name == LOOP else fn, a.warmup, a.reps, cuda)
            rows[name] = {"ms": ms, "eff_tflops": flops / ms / 1e9, "rel_err_fp64": err}
        except Exception as e:  # noqa: BLE001  (a contender that cannot run is a row, not a crash)
            rows[name] = {"error": peer_error(e, dev, "torch." + peer_op[name]) if name in peer_op
                          else f"sparsek failed: {error_text(e)}"}
        finally:
            if cuda:
                torch.cuda.empty_cache()
    for name in (SK, GROUPED):  # the answers against the loop peer's, before any ratio
        if name in outs and LOOP in outs and "ms" in rows[name]:
            rows[name]["rel_diff_vs_loop"] = d = rel_err(outs[name], outs[LOOP])
            if not d < a.tol:
                rows[name]["mismatch"] = f"max |C - C_loop| / max |C_loop| = {d:.3g}"
    ok = lambda n: "ms" in rows[n] and "mismatch" not in rows[n]  # noqa: E731
    ratios = {f"{n} / sparsek": rows[n]["ms"] / rows[SK]["ms"] for n in (LOOP, GROUPED) if ok(SK) and ok(n)}
    return {"row": "experts", "experts": E, "expert_n": En, "expert_k": Ek, "tokens": T, "block": BLOCK,
            "nnzb": W8.nnzb, "shape": list(W8.shape), "effective_flops": flops, "results": rows, "ratios": ratios}


def accuracy_row(a, dev):
    M, N, K = a.acc_shape
    mb, kb = M // BLOCK, K // BLOCK
    k = max(1, round(a.acc_density * kb))
    out_dtype, worst = OUT[a.acc_out], {}
    for seed in range(a.seed, a.seed + a.acc_seeds):
        gen = torch.Generator(device=dev).manual_seed(seed)
        cols = torch.rand(mb, kb, generator=gen, device=dev).argsort(1)[:, :k].sort(1).values
        row_ptr = torch.arange(mb + 1, dtype=torch.int32, device=dev) * k
        amp = 2.0 ** (torch.rand(mb, generator=gen, device=dev) * 6 - 3)  # one amax per block row
        values = blocks_with_amax(amp.repeat_interleave(k), gen)
        A8 = sparsek.BSRMatrix(row_ptr, cols.flatten().to(torch.int32), values, (M, K)).quantize()
        rs = A8.scales.view(mb, k)
        if not bool((rs == rs[:, :1]).all()):
            raise RuntimeError("the blocks of one block row got different scales: scale_a would not be exact")
        x8, xs = tokens_e4m3(N, K, gen, dev)
        ref = densify(A8, dequant_blocks(A8)) @ (x8.float().double() * xs.double()[:, None]).t()
        sa = rs[:, 0].repeat_interleave(BLOCK).reshape(M, 1).contiguous()
        calls = {"sparsek bsr_mm": lambda: sparsek.bsr_mm(A8, x8.t(), b_scales=xs, out_dtype=out_dtype),
                 "torch._scaled_mm": lambda: torch._scaled_mm(densify(A8, A8.values), x8.t(), sa,
                                                              xs.reshape(1, N).contiguous(), out_dtype=out_dtype)}
        for name, call in calls.items():
            w = worst.setdefault(name, {"rel_fro": 0.0, "max_abs_rel": 0.0, "seeds": 0})
            if "error" in w:
                continue
            try:
                c = call()
                w["rel_fro"] = max(w["rel_fro"], fro_err(c, ref))
                w["max_abs_rel"] = max(w["max_abs_rel"], rel_err(c, ref))
                w["seeds"] += 1
            except Exception as e:  # noqa: BLE001
                w["error"] = (peer_error(e, dev, "torch._scaled_mm") if name.startswith("torch")
                              else f"sparsek failed: {error_text(e)}")
        del A8, values, x8, ref
    s, p = worst["sparsek bsr_mm"], worst["torch._scaled_mm"]
    ratios = {}
    if "error" not in s and "error" not in p:
        ratios = {m: s[m] / p[m] if p[m] else float("inf") for m in ("rel_fro", "max_abs_rel")}
    return {"row": "accuracy", "M": M, "N": N, "K": K, "block": BLOCK, "density": k / kb, "blocks_per_row": k,
            "out": a.acc_out, "seeds": list(range(a.seed, a.seed + a.acc_seeds)), "results": worst, "ratios": ratios}


def report_experts(r):
    print(f"\n## experts: {r['experts']} x ({r['expert_n']} x {r['expert_k']}) e4m3 on the diagonal of a "
          f"{r['shape'][0]} x {r['shape'][1]} BSR (128x128 blocks, {r['nnzb']} stored), {r['tokens']} tokens "
          "per expert, bf16 out")
    cols = f"{'row':<28} {'ms':>9} {'eff TFLOPS':>11} {'vs fp64':>9} {'vs loop':>9}  notes"
    print(cols)
    print("-" * len(cols))
    for name, x in r["results"].items():
        if "error" in x:
            print(f"{name:<28} {x['error']}")
            continue
        vl = f"{x['rel_diff_vs_loop']:.2e}" if "rel_diff_vs_loop" in x else "-"
        note = f"DIFFERENT ANSWER: {x['mismatch']}" if "mismatch" in x else ""
        print(f"{name:<28} {x['ms']:>9.3f} {x['eff_tflops']:>11.4g} {x['rel_err_fp64']:>9.2e} {vl:>9}  {note}")
    print("peer time / sparsek time (target >= 1.0; only where the answers agree):")
    for k, v in r["ratios"].items():
        print(f"  {k}: {v:.2f}{'' if v >= 1.0 else '  (below target)'}")
    if not r["ratios"]:
        print("  none (no peer ran, or an answer differed)")


def report_accuracy(r):
    print(f"\n## accuracy: C = A·B, {r['M']} x {r['N']} x {r['K']}, A 128x128 blocks at {r['density']:.1%} "
          f"({r['blocks_per_row']} per block row), {r['out']} out; worst of seeds {r['seeds']} against fp64 "
          "on the dequantized inputs")
    cols = f"{'row':<20} {'||C-ref||_F/||ref||_F':>22} {'max|C-ref|/max|ref|':>20}"
    print(cols)
    print("-" * len(cols))
    for name, x in r["results"].items():
        if "error" in x:
            print(f"{name:<20} {x['error']}")
        else:
            print(f"{name:<20} {x['rel_fro']:>22.3e} {x['max_abs_rel']:>20.3e}")
    if r["ratios"]:
        f, m = r["ratios"]["rel_fro"], r["ratios"]["max_abs_rel"]
        ok = "meets" if f <= 1.5 else "ABOVE"
        print(f"sparsek / torch._scaled_mm: Frobenius {f:.2f}, max-abs {m:.2f} (target <= 1.5: {ok})")
    else:
        print("sparsek / torch._scaled_mm: n/a (a product did not run)")


def main():
    global sparsek
    a = parse_args()
    dev = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("fp8_peers.py: --device cuda, but torch.cuda.is_available() is False")
    try:
        import sparsek as sk
    except (ImportError, OSError) as e:
        sys.exit(f"fp8_peers.py: {e}; build the extension (cmake -DSPARSEK_BUILD_PYTHON=ON, target _sparsek) "
                 "and put <build>/python on PYTHONPATH")
    sparsek = sk
    name = torch.cuda.get_device_name() if dev == "cuda" else "CPU (sparsek's CPU backend)"
    header = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "sparsek": sparsek.__version__,
              "command": " ".join(sys.argv), "args": {k: sorted(v) if isinstance(v, set) else v
                                                      for k, v in vars(a).items()}}
    print(f"# {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, sparsek {sparsek.__version__}; "
          f"median of {a.reps} single calls ({'CUDA events' if dev == 'cuda' else 'host wall-clock'})")
    print("# e4m3 values = scale * code in both libraries; effective TFLOPS count the stored blocks only")
    if dev == "cpu":
        print("# CPU run: a check of the data, the products and the metrics; its times say nothing about the GPU"
              + ("" if a.small else " (without --small it runs the GPU's shapes: slow)"))
    records = []
    for row, fn, rep in (("experts", experts_row, report_experts), ("accuracy", accuracy_row, report_accuracy)):
        if row not in a.rows:
            continue
        rec = fn(a, dev)
        rep(rec)
        records.append(rec)
        if a.json:  # after each row: a run cut short keeps what it measured
            with open(a.json, "w") as f:
                json.dump({"header": header, "records": records}, f, indent=1)
    if a.json:
        print(f"# wrote {a.json}")


if __name__ == "__main__":
    main()
