"""C = A @ B over every GPU of this machine, with a torch.distributed NCCL process group:

    torchrun --nproc_per_node=2 examples/python/distributed_dsd.py

Every rank builds the same block-sparse A (power-law rows: the ranks still get equal work) and B,
runs the distributed product (planned once, then run many times), and checks its C, gathered
from all ranks, against its own one-GPU sparsek product (equal up to the order of fp32 sums: a
shard's plan may cut long rows into pieces where the whole matrix's plan does not).
"""
import os

import torch
import torch.distributed as dist

import sparsek
import sparsek.distributed


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < world or local_rank >= gpus:
        # Say what is missing instead of failing inside CUDA or NCCL.
        raise SystemExit(f"this example needs {world} GPU{'s' if world > 1 else ''} (one per rank); this machine "
                         f"has {gpus}. Run it as: torchrun --nproc_per_node=<GPUs> {__file__}")
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same A and B on every rank
    m, k, n, blk = 4096, 2048, 1024, 128
    lengths = (torch.rand(m // blk) ** 4 * (k // blk)).long().clamp(min=0)  # skewed row lengths
    mask = torch.arange(k // blk)[None, :] < lengths[:, None]
    dense = torch.randn(m, k) * mask.repeat_interleave(blk, 0).repeat_interleave(blk, 1)
    A = sparsek.BSRMatrix.from_dense(dense.half().cuda(), block=(blk, blk))
    B = torch.randn(k, n, dtype=torch.half, device="cuda")

    mm = sparsek.distributed.DistributedDSD(A, all_gather=True)
    for _ in range(3):
        C = mm(B)
    torch.cuda.synchronize()
    first, end = mm.rows
    want = sparsek.bsr_mm(A, B)
    err = (C.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    ok = err <= 1e-2 * (1 + scale)
    print(f"rank {rank}/{world}: rows [{first}, {end}) of {m}, {A.nnzb} blocks in all; gathered C vs the "
          f"one-GPU product: max |diff| {err:.3g} (max |C| {scale:.3g}){'' if ok else ' FAILED'}")
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
