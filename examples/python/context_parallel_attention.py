"""Block-sparse attention over one long sequence split across every GPU of this machine
(context parallelism), with a torch.distributed NCCL process group:

    torchrun --nproc_per_node=2 examples/python/context_parallel_attention.py

Every rank builds the same causal top-k layout and the same q, k, v (a fixed seed), keeps only the
rows the plan gives it, and runs the forward and backward; each rank receives only the key/value
blocks its query rows name. Rank by rank, its o and dq are checked against the one-GPU attention on
the whole sequence (equal up to bf16 rounding: the split merges two partial results).
"""
import os

import torch
import torch.distributed as dist

import sparsek
import sparsek.distributed


def causal_topk(heads, blocks, picks, gen):
    """The diagonal block and `picks` random earlier ones per query block and head."""
    num = torch.zeros(1, heads, blocks, dtype=torch.int32)
    idx = torch.zeros(1, heads, blocks, picks + 1, dtype=torch.int32)
    for h in range(heads):
        for i in range(blocks):
            chosen = sorted({i, *torch.randint(0, i + 1, (picks,), generator=gen).tolist()})
            num[0, h, i] = len(chosen)
            idx[0, h, i, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return sparsek.BlockLayout(num, idx, block=128)


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < world or local_rank >= gpus:
        raise SystemExit(f"this example needs {world} GPU{'s' if world > 1 else ''} (one per rank); this machine "
                         f"has {gpus}. Run it as: torchrun --nproc_per_node=<GPUs> {__file__}")
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()

    B, H, S, D = 1, 8, 16384, 128
    gen = torch.Generator().manual_seed(0)  # the same layout and inputs on every rank
    layout = causal_topk(H, S // 128, 15, gen)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen).to("cuda", torch.bfloat16) for _ in range(4))

    cp = sparsek.distributed.ContextParallelAttention(layout, (B, H, S, D), dtype=torch.bfloat16, causal=True)
    (a, b), (c, d) = cp.q_rows(), cp.kv_rows()
    mine = [t[:, :, a:b].contiguous() for t in (q, dout)] + [t[:, :, c:d].contiguous() for t in (k, v)]
    q_r, dout_r, k_r, v_r = mine
    o_r, lse_r = cp.forward(q_r, k_r, v_r)
    dq_r, dk_r, dv_r = cp.backward(q_r, k_r, v_r, o_r, lse_r, dout_r)
    torch.cuda.synchronize()

    # The one-GPU result on the whole sequence, for this rank's rows.
    qg = q.clone().requires_grad_()
    o, _ = sparsek.attention(qg, k, v, layout.to("cuda"), causal=True)
    o.backward(dout)
    err_o = (o_r.float() - o[:, :, a:b].float()).abs().max().item()
    err_dq = (dq_r.float() - qg.grad[:, :, a:b].float()).abs().max().item()
    ok = err_o <= 2e-2 and err_dq <= 5e-2 * (1 + qg.grad.float().abs().max().item())
    print(f"rank {rank}/{world}: query rows [{a}, {b}), key/value rows [{c}, {d}), received "
          f"{cp.recv_bytes() / 1e6:.1f} MB; vs one GPU: max |o diff| {err_o:.3g}, max |dq diff| {err_dq:.3g}"
          f"{'' if ok else ' FAILED'}")
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
