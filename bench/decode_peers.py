#!/usr/bin/env python3
"""The serving decode workload beside its peers, on the same inputs in one process: sparsek's paged
decode attention on a Quest page selection and over the whole context, FlashAttention-4's dense
paged decode, FlexAttention on the same selection, and the read floor of the bytes each reads.

    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARSEK_CUDA_GENCODE=90a \\
        -DSPARSEK_BUILD_PYTHON=ON && cmake --build build-gpu --target _sparsek   # as scripts/gpu-fa4.sh
    PYTHONPATH=/tmp/fa4/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4:$PWD/build-gpu/python:$PWD/python \\
        python3 -u bench/decode_peers.py --new-tokens 1,4 --json decode_peers.json

Workload (flags change each): 32 requests x 32768 tokens of context, Hq 32 / Hkv 8, D 128, bf16,
pages of 64 tokens in shuffled physical order (page_table int32 [B, max_pages], seq_lens int32 [B]),
1 new token per request (--new-tokens 4: q [T, Hq, D] packed, cu_seqlens_q). The selection is
sparsek.select_pages on summaries from sparsek.update_page_summaries(all_pages=True): 12.5% of each
(request, KV head)'s pages, sink 1, local 1.

Rows: sparsek decode on the selection (plan_decode + run, the serving path; the one-shot
decode_attention beside it), select_pages and update_page_summaries, sparsek over the whole context,
FA4 flash_attn_varlen_func over the whole paged context (each --splits value FA4 accepts; the fastest
is named), FlexAttention with a BlockMask of the same pages (K/V gathered once into [B, Hkv, S, D],
outside the timing; once with enable_gqa and a mask per query head, once with the group folded into
the query rows and a mask per KV head, which FlexAttention's decoding kernel takes). The read floor
mirrors build/decode_timer: the K/V bytes read (tokens of the pages read, per KV head) over the HBM
read bandwidth, measured here as a device-to-device copy (2 x bytes / time). Timing: torch_peers.time_ms
(CUDA events around single calls, median; host overhead included) and the same over --burst calls
back to back (the host's time hidden behind the GPU's). Answers are checked before times count:
FA4's O against sparsek's dense O, FlexAttention's against sparsek's selected O.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_peers.py beside this file
try:
    import torch
except ImportError:
    torch = None

sparsek = time_ms = load_fa4 = rel_err = wall_s = None  # bound in main() once a GPU answers
SEL_ROW, DENSE_ROW = "sparsek decode, selected pages", "sparsek decode, whole context"


def ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--context", type=int, default=32768, help="tokens in each request's cache, new ones included")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--new-tokens", type=ints, default=[1], help="new tokens per request, e.g. 1 or 1,4 (1..16)")
    p.add_argument("--fraction", type=float, default=0.125, help="pages selected per (request, KV head)")
    p.add_argument("--sink", type=int, default=1)
    p.add_argument("--local", type=int, default=1)
    p.add_argument("--splits", type=ints, default=[1, 0, 4, 8, 16],
                   help="FA4 num_splits values to try (0: FA4's heuristic); the fastest accepted is reported")
    p.add_argument("--peers", default="fa4,flex", help="who runs beside sparsek: fa4, flex (comma-separated)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--burst", type=int, default=10, help="calls back to back in the second timing")
    p.add_argument("--copy-mb", type=int, default=1024, help="buffer of the copy that measures the bandwidth")
    p.add_argument("--tol", type=float, default=2e-2, help="max |O - O_ref| / max |O_ref| to accept a peer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the records to this file")
    return p.parse_args()


def timed(fn, args):
    """Microseconds of one call: single calls (time_ms), and per call over --burst back to back."""
    single = time_ms(lambda i: fn(), 1, args.warmup, args.reps)

    def burst(i):
        for _ in range(args.burst):
            fn()
    b2b = time_ms(burst, 1, 2, args.reps) / args.burst
    return {"us": 1e3 * single, "b2b_us": 1e3 * b2b}


def error_text(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def contiguous_kv(cache, page_table, S):
    """[num_pages, ps, Hkv, D] cache -> [B, Hkv, S, D], each request's pages in logical order."""
    x = cache[page_table.long()]  # [B, max_pages, ps, Hkv, D]
    return x.flatten(1, 2)[:, :S].transpose(1, 2).contiguous()


def selection_block_mask(sel_idx, sel_cnt, rep, rows, n, S, ps):
    """A BlockMask (KV blocks = pages) of the selection for `rows` query rows whose token is q_idx % n.

    sel_idx [B, Hkv, kmax] / sel_cnt [B, Hkv], each head row repeated `rep` times (the query heads
    of a group with enable_gqa; 1 with the group folded into the rows). A page that every new token
    sees whole is a "full" block (no mask_mod); the newest page(s) with n > 1 are partial blocks
    under the causal mask_mod, as sparsek's causal_new."""
    from torch.nn.attention.flex_attention import BlockMask
    kmax, cols, q_block = sel_idx.shape[-1], -(-S // ps), 128
    idx = sel_idx.repeat_interleave(rep, dim=1).long()
    cnt = sel_cnt.repeat_interleave(rep, dim=1)
    valid = torch.arange(kmax, device=idx.device) < cnt[..., None]
    whole = valid & ((idx + 1) * ps <= S - n + 1)  # its last position <= the first new token's
    q_blocks = -(-rows // q_block)

    def ordered(m):  # (num [B, H, q_blocks], indices [B, H, q_blocks, cols]): chosen pages first
        num = m.sum(-1).to(torch.int32)
        lst = torch.where(m, idx, cols).sort(-1).values
        lst = torch.nn.functional.pad(torch.where(lst == cols, 0, lst), (0, cols - kmax)).to(torch.int32)
        return (num[..., None].expand(-1, -1, q_blocks).contiguous(),
                lst[:, :, None, :].expand(-1, -1, q_blocks, -1).contiguous())

    def causal_new(b, h, q_idx, kv_idx):
        return kv_idx <= (S - n) + q_idx % n

    num, lst = ordered(valid & ~whole)
    full_num, full_lst = ordered(whole)
    return BlockMask.from_kv_blocks(num, lst, full_num, full_lst, BLOCK_SIZE=(q_block, ps), mask_mod=causal_new,
                                    seq_lengths=(rows, S))


def run_workload(n, args, c, fa4, bw, rec):
    """Every row for n new tokens per request; fills rec["rows"], returns nothing."""
    B, S, Hq, Hkv, D, ps = args.requests, args.context, args.hq, args.hkv, args.head_dim, args.page_size
    G, T, esize, scale = Hq // Hkv, B * n, c["k"].element_size(), 1.0 / math.sqrt(D)
    k, v, pt, lens = c["k"], c["v"], c["page_table"], c["seq_lens"]
    gen = torch.Generator(device="cuda").manual_seed(args.seed + n)
    q = torch.randn(T, Hq, D, device="cuda", dtype=k.dtype, generator=gen)
    cu = (torch.arange(B + 1, device="cuda", dtype=torch.int32) * n).contiguous()
    rows = rec["rows"]
    floor = lambda nbytes: nbytes / bw * 1e6  # noqa: E731  (us)

    # The selection: every page's summary once (as after a prefill), then Quest's top-k per KV head.
    pages_per = pt.shape[1]
    kmax = min(pages_per, max(args.sink + args.local, round(args.fraction * pages_per)))
    topk = kmax - args.sink - args.local
    sums = sparsek.update_page_summaries(sparsek.page_summaries(k), k, pt, lens, cu, all_pages=True)
    sel = sparsek.select_pages(q, sums, pt, lens, cu, topk, args.sink, args.local, page_size=ps, kmax=kmax)
    sel_idx, sel_cnt = sel
    # Bytes read on the selection: the tokens of each selected page (a last page may hold fewer), per KV head.
    slots = torch.arange(kmax, device="cuda") < sel_cnt[..., None]
    tokens = ((lens[:, None, None].long() - sel_idx.long() * ps).clamp(0, ps) * slots).sum().item()
    sel_bytes, dense_bytes = tokens * D * esize * 2, int(lens.long().sum().item()) * Hkv * D * esize * 2
    sum_bytes = B * pages_per * Hkv * 2 * D * esize  # the summaries select_pages reads
    rec.update({"T": T, "kmax": kmax, "topk": topk, "selected_tokens": tokens,
                "selected_kv_bytes": sel_bytes, "dense_kv_bytes": dense_bytes,
                "floor_selected_us": floor(sel_bytes), "floor_dense_us": floor(dense_bytes)})

    # sparsek: plans made once (run() allocates nothing, as a serving loop calls it), outputs kept.
    stream = torch.cuda.current_stream().cuda_stream
    outs = {}
    for name, s, nbytes in ((SEL_ROW, sel, sel_bytes), (DENSE_ROW, None, dense_bytes)):
        o, lse = torch.empty_like(q), torch.empty(T, Hq, device="cuda", dtype=torch.float32)
        plan = sparsek.plan_decode(q, k, v, o, lse, pt, lens, cu, selection=s, scale=scale)
        si, sc = s if s is not None else (None, None)
        run = lambda p=plan, o=o, lse=lse, si=si, sc=sc: p.run(q, k, v, o, lse, pt, lens, cu, si, sc, stream)  # noqa: E731
        run()
        torch.cuda.synchronize()
        outs[name] = o.clone()
        rows[name] = dict(timed(run, args), bytes=nbytes, floor_us=floor(nbytes), kv_splits=plan.kv_splits,
                          lse_finite=bool(torch.isfinite(lse).all()))
        one_shot = lambda s=s: sparsek.decode_attention(q, k, v, pt, lens, cu, selection=s, scale=scale,  # noqa: E731
                                                        check_indices=False)
        rows[name]["one_shot_us"] = 1e3 * time_ms(lambda i: one_shot(), 1, args.warmup, args.reps)
    rows["sparsek select_pages"] = dict(timed(lambda: sparsek.select_pages(
        q, sums, pt, lens, cu, topk, args.sink, args.local, page_size=ps, kmax=kmax, check_indices=False), args),
        bytes=sum_bytes, floor_us=floor(sum_bytes))
    rows["sparsek update_page_summaries"] = timed(
        lambda: sparsek.update_page_summaries(sums, k, pt, lens, cu, check_indices=False), args)

    # FA4: dense paged decode of the whole context, each num_splits it accepts, checked first.
    # NOTE: on sm90 FA4's interface asserts "SplitKV not supported on SM 9.0" for num_splits > 1, and
    # its heuristic (0) gives 1 here (B * Hkv = 256 tiles of packed GQA rows > 132 SMs).
    fa_splits = []
    if fa4[0] is None:
        rows["FA4 dense"] = {"error": f"FA4 not installed/failed: {fa4[1]}"}
    else:
        try:
            from flash_attn.cute.interface import flash_attn_varlen_func
            fa_splits = args.splits
        except Exception as e:  # noqa: BLE001
            rows["FA4 dense"] = {"error": f"FA4 not installed/failed: {error_text(e)}"}
        for splits in fa_splits:
            name = f"FA4 dense, num_splits={splits}" + (" (FA4's heuristic)" if splits == 0 else "")
            call = lambda s=splits: flash_attn_varlen_func(  # noqa: E731
                q, k, v, cu_seqlens_q=cu, max_seqlen_q=n, seqused_k=lens, page_table=pt, softmax_scale=scale,
                causal=True, pack_gqa=True, num_splits=s)[0]
            try:
                o, first_s = wall_s(call)
                err = rel_err(o, outs[DENSE_ROW])
                if not err < args.tol:
                    rows[name] = {"error": f"DIFFERENT ANSWER: max |O - sparsek dense O| / max |O| = {err:.3g}"}
                    continue
                rows[name] = dict(timed(call, args), bytes=dense_bytes, floor_us=floor(dense_bytes),
                                  first_call_s=first_s, max_rel_diff=err)
            except Exception as e:  # noqa: BLE001  (a value FA4 rejects on this GPU, or FA4 failing)
                rows[name] = {"error": f"FA4 failed: {error_text(e)}"}
            finally:
                torch.cuda.empty_cache()

    # FlexAttention on the same pages, over K/V gathered once (outside the timing) per request.
    if "flex" in args.peers:
        try:
            from torch.nn.attention.flex_attention import flex_attention
            if "kv" not in c:
                c["kv"] = (contiguous_kv(k, pt, S), contiguous_kv(v, pt, S))
            kc, vc = c["kv"]
            qh = q.view(B, n, Hq, D).transpose(1, 2).contiguous()  # [B, Hq, n, D]
            qf = q.view(B, n, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * n, D)  # row g*n + j
            variants = (  # name, q, block mask heads repeated, rows, enable_gqa, O back to [T, Hq, D]
                ("flex selected, enable_gqa", qh, G, n, True, lambda o: o.transpose(1, 2).reshape(T, Hq, D)),
                ("flex selected, group folded into rows", qf, 1, G * n, False,
                 lambda o: o.view(B, Hkv, G, n, D).permute(0, 3, 1, 2, 4).reshape(T, Hq, D)))
        except Exception as e:  # noqa: BLE001
            rows["flex"], variants = {"error": f"FlexAttention failed: {error_text(e)}"}, ()
        for name, qx, rep, nrows, gqa, back in variants:
            try:
                bm = selection_block_mask(sel_idx, sel_cnt, rep, nrows, n, S, ps)
                fl = torch.compile(flex_attention, dynamic=False)  # static shapes: its decoding kernel needs them
                call = lambda fl=fl, qx=qx, bm=bm, gqa=gqa: fl(qx, kc, vc, block_mask=bm, scale=scale,  # noqa: E731
                                                              enable_gqa=gqa)
                o, first_s = wall_s(call)
                err = rel_err(back(o), outs[SEL_ROW])
                if not err < args.tol:
                    rows[name] = {"error": f"DIFFERENT ANSWER: max |O - sparsek selected O| / max |O| = {err:.3g}"}
                    continue
                rows[name] = dict(timed(call, args), bytes=sel_bytes, floor_us=floor(sel_bytes),
                                  first_call_s=first_s, max_rel_diff=err)
            except Exception as e:  # noqa: BLE001
                rows[name] = {"error": f"FlexAttention failed: {error_text(e)}"}
            finally:
                torch.cuda.empty_cache()


def report(n, rec):
    rows = rec["rows"]
    print(f"\n## {n} new token(s) per request (T = {rec['T']}): {rec['kmax']} pages selected per (request, KV head) "
          f"(top-k {rec['topk']} + sink + local); K/V read: selected {rec['selected_kv_bytes'] / 1e6:.1f} MB, "
          f"whole context {rec['dense_kv_bytes'] / 1e6:.1f} MB")
    cols = f"{'row':<46} {'single us':>10} {'burst us':>9} {'floor us':>9} {'x floor':>8} {'(burst)':>8}  notes"
    print(cols)
    print("-" * len(cols))
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<46} {r['error']}")
            continue
        fl = r.get("floor_us")
        xf = lambda key: f"{r[key] / fl:.2f}" if fl else "-"  # noqa: E731
        notes = []
        if "one_shot_us" in r:
            notes.append(f"one-shot decode_attention {r['one_shot_us']:.1f} us; {r['kv_splits']} KV chunks; "
                         f"LSE {'finite' if r['lse_finite'] else 'NOT FINITE'}")
        if "max_rel_diff" in r:
            notes.append(f"max rel diff {r['max_rel_diff']:.2e}; first call {r['first_call_s']:.1f} s")
        print(f"{name:<46} {r['us']:>10.1f} {r['b2b_us']:>9.1f} {f'{fl:.1f}' if fl else '-':>9} {xf('us'):>8} "
              f"{xf('b2b_us'):>8}  {'; '.join(notes)}")
    timed_rows = lambda prefix: [(k, r) for k, r in rows.items() if k.startswith(prefix) and "us" in r]  # noqa: E731
    sk, dense = rows[SEL_ROW], rows[DENSE_ROW]
    sel, upd = rows["sparsek select_pages"], rows["sparsek update_page_summaries"]
    ratios = {"selected / read floor": (sk["us"] / sk["floor_us"], sk["b2b_us"] / sk["floor_us"]),
              "select / decode": (sel["us"] / sk["us"], sel["b2b_us"] / sk["b2b_us"]),
              "(select + update) / decode": ((sel["us"] + upd["us"]) / sk["us"],
                                             (sel["b2b_us"] + upd["b2b_us"]) / sk["b2b_us"])}
    fa = timed_rows("FA4")
    if fa:
        best_name, best = min(fa, key=lambda kr: kr[1]["us"])
        rec["fa4_fastest"] = best_name
        ratios[f"{best_name} / sparsek selected (x faster than FA4 dense paged decode)"] = (
            best["us"] / sk["us"], best["b2b_us"] / sk["b2b_us"])
        ratios[f"sparsek dense / {best_name}"] = (dense["us"] / best["us"], dense["b2b_us"] / best["b2b_us"])
    for name, r in timed_rows("flex"):
        ratios[f"{name} / sparsek selected"] = (r["us"] / sk["us"], r["b2b_us"] / sk["b2b_us"])
    rec["ratios"] = {k: {"single": a, "burst": b} for k, (a, b) in ratios.items()}
    print("ratios (single calls; back to back):")
    for k, (a, b) in ratios.items():
        print(f"  {k}: {a:.2f}; {b:.2f}")


def main():
    global sparsek, time_ms, load_fa4, rel_err, wall_s
    args = parse_args()
    args.peers = {s.strip() for s in args.peers.split(",") if s.strip()}
    if torch is None:
        sys.exit("decode_peers.py needs torch (import torch failed)")
    if not torch.cuda.is_available():
        sys.exit("decode_peers.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    try:
        import sparsek as sk_module
        from torch_peers import load_fa4 as lf, rel_err as re_, time_ms as tm, wall_s as ws
    except (ImportError, OSError) as e:
        sys.exit(f"decode_peers.py: {e}; build the extension (cmake -DSPARSEK_BUILD_PYTHON=ON, target _sparsek) "
                 "and put <build>/python on PYTHONPATH")
    sparsek, load_fa4, rel_err, time_ms, wall_s = sk_module, lf, re_, tm, ws
    if any(not 1 <= n <= 16 for n in args.new_tokens) or args.hq % args.hkv:
        sys.exit("--new-tokens must lie in 1..16 and --hq be a multiple of --hkv")
    import torch._dynamo as dynamo  # two compiled variants per new-token count: stay clear of the recompile limit
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(dynamo.config, knob):
            setattr(dynamo.config, knob, 256)

    B, S, Hkv, D, ps = args.requests, args.context, args.hkv, args.head_dim, args.page_size
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    prop = torch.cuda.get_device_properties(0)
    l2 = getattr(prop, "L2_cache_size", 50 << 20)
    fa4 = load_fa4() if "fa4" in args.peers else (None, "skipped (--peers)")
    header = {"gpu": prop.name, "sm_count": prop.multi_processor_count, "l2_bytes": l2, "torch": torch.__version__,
              "cuda": torch.version.cuda, "sparsek": sparsek.__version__,
              "fa4": fa4[1] if fa4[0] is not None else f"not installed/failed: {fa4[1]}",
              "command": " ".join(sys.argv), "args": {k: (sorted(v) if isinstance(v, set) else v)
                                                      for k, v in vars(args).items()}}

    # The cache: every request's pages, the physical pages a random permutation.
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    pages_per = -(-S // ps)
    c = {"k": torch.randn(B * pages_per, ps, Hkv, D, device="cuda", dtype=dtype, generator=gen),
         "v": torch.randn(B * pages_per, ps, Hkv, D, device="cuda", dtype=dtype, generator=gen),
         "page_table": torch.randperm(B * pages_per, device="cuda", generator=gen).view(B, pages_per).to(torch.int32),
         "seq_lens": torch.full((B,), S, device="cuda", dtype=torch.int32)}
    # HBM read bandwidth, named and used as build/decode_timer's (read floor = bytes / it), measured
    # here as a device-to-device copy of --copy-mb (a copy reads and writes each byte: 2 x bytes / time).
    # decode_timer's pure streaming read is usually a few % faster, so this floor is a little lower bar.
    src = torch.empty(args.copy_mb << 20, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    bw = 2 * src.numel() / (time_ms(lambda i: dst.copy_(src), 1, args.warmup, args.reps) * 1e-3)  # bytes / s
    del src, dst
    header["hbm_read_bandwidth"] = bw
    cache_bytes = 2 * c["k"].numel() * c["k"].element_size()
    print(f"# {prop.name} ({prop.multi_processor_count} SMs), torch {torch.__version__}, sparsek {sparsek.__version__}; "
          f"FA4: {header['fa4']}")
    print(f"# decode: {B} requests x {S} tokens, Hq {args.hq} / Hkv {Hkv}, D {D}, {args.dtype}, page {ps}, physical "
          f"pages shuffled; selection {args.fraction:.1%} of pages, sink {args.sink}, local {args.local} "
          "(sparsek.select_pages on all pages' summaries)")
    print(f"# HBM read bandwidth (measured, {args.copy_mb} MiB device-to-device copy, 2 x bytes / time): "
          f"{bw / 1e12:.2f} TB/s; read floor = K/V bytes read / that")
    print(f"# one input set: the K/V cache is {cache_bytes / 1e9:.1f} GB, the L2 {l2 / 1e6:.0f} MB, so a warm L2 "
          "holds little of what any row reads")
    print(f"# times: median of {args.reps} single calls (CUDA events, host overhead included) and per call over "
          f"{args.burst} back to back; FlexAttention reads K/V gathered once into [B, Hkv, S, D] outside the timing")

    records = []
    for n in args.new_tokens:
        rec = {"new_tokens": n, "rows": {}}
        run_workload(n, args, c, fa4, bw, rec)
        report(n, rec)
        records.append(rec)
        if args.json:  # after each workload: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"header": header, "records": records}, f, indent=1)
    if args.json:
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
