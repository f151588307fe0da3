"""Packed sequences (varlen) on the GPU, sparsek beside its peers in one process, same data.

  python bench/packed_peers.py [--dim 128] [--heads 16] [--density 0.125] [--reps 20] [--json F]

Eight sequences of mixed lengths (1k to 29k tokens, 64k in all, each a multiple of 128 so that a
per-sequence block is also a block of the packed batch), bf16, 128x128 blocks, a per-sequence
top-k layout: every query block keeps round(density * its sequence's blocks) random key blocks of
its own sequence (with causal: the diagonal block and blocks before it). Rows, not causal and causal:
  sparsek   attention(..., cu_seqlens=...) forward, and the training step (forward + backward,
            torch autograd) over the packed batch
  flex      FlexAttention (torch.compile) with a BlockMask of the same blocks over the packed batch
            and a document mask_mod (blocks inside one document given as full blocks)
  fa4       FlashAttention-4's flash_attn_varlen_func with varlen block-sparse lists (forward only:
            its varlen interface takes no backward lists); "FA4 not installed" when absent
  equal     sparsek on the equal-length batch B=8 S=8192 at the same per-sequence density (the
            rate packed sequences should keep)
Effective FLOPs: 4 * D * unmasked score elements (the training step: 3.5 x the forward's).
Answers: sparsek's O against FlexAttention's, FA4's against sparsek's (max |diff|).
"""
import argparse
import json
import sys

import torch

import sparsek
import torch_peers  # the shared timer (this script's folder is on sys.path)

LENS = [1024, 1536, 2560, 3968, 6016, 8960, 12032, 29440]
BLOCK = 128


def seq_layout(H, lens, density, causal, gen):
    """Boolean [1, H, M, M] block mask over the packed batch: per sequence, per query block, the
    top-k random key blocks of that sequence (causal: the diagonal always, none after it)."""
    M = sum(lens) // BLOCK
    mask = torch.zeros(1, H, M, M, dtype=torch.bool, device="cuda")
    m0 = 0
    for n in lens:
        m = n // BLOCK
        k = max(1, round(density * m))
        r = torch.rand(H, m, m, generator=gen, device="cuda")
        if causal:
            r = r.masked_fill(torch.ones(m, m, dtype=torch.bool, device="cuda").triu(1), -1.0)
            r[:, torch.arange(m), torch.arange(m)] = 2.0
        top = r.topk(min(k, m), dim=-1).indices
        mask[0, :, m0:m0 + m, m0:m0 + m] = torch.zeros_like(r, dtype=torch.bool).scatter_(-1, top, True) & (r >= 0)
        m0 += m
    return mask


def unmasked(mask, causal):
    blocks = mask.sum().item()
    if not causal:
        return float(blocks * BLOCK * BLOCK)
    M = mask.shape[-1]
    diag = mask[..., torch.arange(M), torch.arange(M)].sum().item()
    return float(blocks * BLOCK * BLOCK - diag * (BLOCK * (BLOCK - 1) // 2))


def time_ms(fn, warmup, reps):
    """torch_peers' CUDA-event median of single calls, on one input set (fn takes no set index)."""
    return torch_peers.time_ms(lambda _set: fn(), 1, warmup, reps)


def flex_block_mask(mask, lens, causal):
    from torch.nn.attention.flex_attention import BlockMask
    T = sum(lens)
    doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))

    def mask_mod(b, h, q, kv):
        same = doc[q] == doc[kv]
        return same & (kv <= q) if causal else same

    M = mask.shape[-1]
    # Blocks inside one document are full unless the causal diagonal cuts them; lengths are block
    # multiples, so every kept block is inside one document: only the diagonal needs mask_mod.
    diag = torch.eye(M, dtype=torch.bool, device="cuda").expand_as(mask)
    partial = mask & diag if causal else torch.zeros_like(mask)
    full = mask & ~partial

    def lists(m):
        cnt = m.sum(-1, dtype=torch.int32)
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return cnt, idx

    kn, ki = lists(partial)
    fn, fi = lists(full)
    return BlockMask.from_kv_blocks(kn, ki, fn, fi, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(T, T))


def fa4_varlen_lists(mask, lens, causal):
    """FA4's varlen block-sparse forward lists: counts [H, total_m_blocks], indices [H, sum m_b^2]
    (sequence b's rows of width m_b at cu_block_idx_offsets[b]), sequence-relative key blocks."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    H = mask.shape[1]
    cnt_m, cnt_f, idx_m, idx_f, cu_m, cu_i = [], [], [], [], [0], [0]
    m0 = 0
    for n in lens:
        m = n // BLOCK
        sub = mask[0, :, m0:m0 + m, m0:m0 + m]
        diag = torch.eye(m, dtype=torch.bool, device="cuda").expand_as(sub)
        part = sub & diag if causal else torch.zeros_like(sub)
        full = sub & ~part
        for lst_c, lst_i, b in ((cnt_m, idx_m, part), (cnt_f, idx_f, full)):
            lst_c.append(b.sum(-1, dtype=torch.int32))
            lst_i.append(torch.argsort((~b).to(torch.int8), dim=-1, stable=True).to(torch.int32).reshape(H, m * m))
        cu_m.append(cu_m[-1] + m)
        cu_i.append(cu_i[-1] + m * m)
        m0 += m
    t = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    return BlockSparseTensorsTorch(torch.cat(cnt_m, 1).contiguous(), torch.cat(idx_m, 1).contiguous(),
                                   torch.cat(cnt_f, 1).contiguous(), torch.cat(idx_f, 1).contiguous(),
                                   cu_total_m_blocks=t(cu_m), cu_block_idx_offsets=t(cu_i), block_size=(BLOCK, BLOCK))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--density", type=float, default=0.125)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-fa4", action="store_true")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("packed_peers.py needs a CUDA GPU")
    H, D, T = a.heads, a.dim, sum(LENS)
    fa4_call, fa4_why = None, "skipped (--no-fa4)"
    if not a.no_fa4:
        try:
            from flash_attn.cute.interface import flash_attn_varlen_func as fa4_call
            fa4_why = "flash-attn-4"
        except Exception as e:  # noqa: BLE001
            fa4_why = f"FA4 not installed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, sparsek {sparsek.__version__}; "
          f"H={H} D={D} bf16, 128x128 blocks, per-sequence top-k {100 * a.density:g}%, "
          f"lengths {LENS} (T={T}); median of {a.reps} (CUDA events)")
    print(f"# FA4: {fa4_why}")
    rows = []
    for causal in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(a.seed)
        q, k, v, do = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        mask = seq_layout(H, LENS, a.density, causal, gen)
        layout = sparsek.BlockLayout.from_dense(mask, block=BLOCK)
        cu = torch.tensor([0] + list(torch.tensor(LENS).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
        flops = 4.0 * D * unmasked(mask, causal)
        row = {"causal": causal, "effective_flops_fwd": flops, "results": {}}
        res = row["results"]

        def rate(ms, mult=1.0):
            return mult * flops / (ms * 1e9)

        # sparsek: forward, then the step through autograd.
        sk = lambda: sparsek.attention(q, k, v, layout, causal=causal, cu_seqlens=cu)[0]  # noqa: E731
        o_sk = sk()
        ms = time_ms(sk, a.warmup, a.reps)
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

        def sk_step():
            sparsek.attention(qg, kg, vg, layout, causal=causal, cu_seqlens=cu)[0].backward(do)

        ms_step = time_ms(sk_step, a.warmup, a.reps)
        res["sparsek"] = {"fwd_ms": ms, "fwd_eff_tflops": rate(ms), "step_ms": ms_step,
                          "step_eff_tflops": rate(ms_step, 3.5)}
        # FlexAttention with a document mask.
        try:
            bm = flex_block_mask(mask, LENS, causal)
            fl = lambda: flex(q, k, v, block_mask=bm)  # noqa: E731
            o_fl = fl()
            ms = time_ms(fl, a.warmup, a.reps)
            qf, kf, vf = (x.detach().requires_grad_() for x in (q, k, v))
            ms_step = time_ms(lambda: flex(qf, kf, vf, block_mask=bm).backward(do), a.warmup, a.reps)
            res["flex"] = {"fwd_ms": ms, "fwd_eff_tflops": rate(ms), "step_ms": ms_step,
                           "step_eff_tflops": rate(ms_step, 3.5)}
            res["sparsek"]["max_abs_diff_o_vs_flex"] = float((o_sk.float() - o_fl.float()).abs().max())
        except Exception as e:  # noqa: BLE001
            res["flex"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        # FA4 varlen block-sparse (forward).
        if fa4_call is None:
            res["fa4"] = {"error": fa4_why}
        else:
            try:
                qs, ks, vs = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))  # [T, H, D]
                bs = fa4_varlen_lists(mask, LENS, causal)
                fa = lambda: fa4_call(qs, ks, vs, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(LENS),  # noqa: E731
                                      max_seqlen_k=max(LENS), causal=causal, block_sparse_tensors=bs)[0]
                o_fa = fa()
                ms = time_ms(fa, a.warmup, a.reps)
                res["fa4"] = {"fwd_ms": ms, "fwd_eff_tflops": rate(ms),
                              "max_abs_diff_o_vs_sparsek": float((o_fa.transpose(0, 1)[None].float() - o_sk.float()).abs().max())}
            except Exception as e:  # noqa: BLE001
                res["fa4"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        # sparsek on the equal-length batch at the same per-sequence density.
        Be, Se = 8, T // 8
        qe, ke, ve, de = (x.reshape(1, H, Be, Se, D)[0].transpose(0, 1).contiguous() for x in (q, k, v, do))
        me = torch.cat([seq_layout(H, [Se], a.density, causal, gen) for _ in range(Be)], 0)
        le = sparsek.BlockLayout.from_dense(me, block=BLOCK)
        fe = 4.0 * D * unmasked(me, causal)
        eq = lambda: sparsek.attention(qe, ke, ve, le, causal=causal)[0]  # noqa: E731
        ms = time_ms(eq, a.warmup, a.reps)
        qq, kk, vv = (x.detach().requires_grad_() for x in (qe, ke, ve))
        ms_step = time_ms(lambda: sparsek.attention(qq, kk, vv, le, causal=causal)[0].backward(de), a.warmup, a.reps)
        res["equal"] = {"fwd_ms": ms, "fwd_eff_tflops": fe / (ms * 1e9), "step_ms": ms_step,
                        "step_eff_tflops": 3.5 * fe / (ms_step * 1e9)}
        rows.append(row)
        f = lambda who, key: (f"{res[who][key]:.1f}" if key in res.get(who, {}) else "-")  # noqa: E731
        print(f"{'causal' if causal else 'not causal':>10} | fwd eff TFLOPS: sparsek {f('sparsek', 'fwd_eff_tflops')}"
              f"  fa4 {f('fa4', 'fwd_eff_tflops')}  flex {f('flex', 'fwd_eff_tflops')}  equal-length {f('equal', 'fwd_eff_tflops')}"
              f" | step: sparsek {f('sparsek', 'step_eff_tflops')}  flex {f('flex', 'step_eff_tflops')}"
              f"  equal-length {f('equal', 'step_eff_tflops')}")
        for who in ("sparsek", "fa4", "flex", "equal"):
            extra = {k: v for k, v in res.get(who, {}).items() if "diff" in k or k == "error"}
            if extra:
                print(f"{'':>10}   {who}: {extra}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"lens": LENS, "heads": H, "dim": D, "density": a.density, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
