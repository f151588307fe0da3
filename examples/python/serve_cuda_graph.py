#!/usr/bin/env python3
"""Serve a block-sparse MLP forward from a CUDA graph.

The first call on each pattern plans it (checks, schedule, upload); after that a sparsek product
only launches kernels, so the forward can be captured once into a CUDA graph and replayed for each
batch with no per-call Python or launch overhead. Compares the replayed output with the eager one.
Needs a CUDA device (exits with a message otherwise).

    python3 examples/python/serve_cuda_graph.py [--batch 64] [--requests 20]
"""
import argparse
import time

import torch

from sparsek.nn import BlockSparseLinear


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("serve_cuda_graph: no CUDA device (torch.cuda.is_available() is False)")
    torch.manual_seed(0)
    dt = torch.bfloat16
    model = torch.nn.Sequential(
        BlockSparseLinear(1024, 4096, block=(64, 64), density=0.25, method="dds"),
        torch.nn.GELU(),
        BlockSparseLinear(4096, 1024, block=(64, 64), density=0.25, method="dds"),
    ).to("cuda", dt).eval()

    static_x = torch.randn(args.batch, 1024, device="cuda", dtype=dt)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):  # warm-up: the first call plans every product
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = model(static_x)

    worst = 0.0
    start = time.perf_counter()
    for _ in range(args.requests):
        batch = torch.randn(args.batch, 1024, device="cuda", dtype=dt)
        static_x.copy_(batch)
        graph.replay()
        with torch.no_grad():
            want = model(batch)
        err = float((static_y.float() - want.float()).abs().max() / want.float().abs().max())
        worst = max(worst, err)
    torch.cuda.synchronize()
    print(f"{args.requests} requests of {args.batch} tokens served from one CUDA graph "
          f"({(time.perf_counter() - start) * 1e3:.1f} ms incl. the eager checks); "
          f"max relative difference to eager {worst:.2e}")
    if worst > 0:
        raise SystemExit("the replayed graph differs from the eager forward")


if __name__ == "__main__":
    main()
