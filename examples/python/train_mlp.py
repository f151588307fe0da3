#!/usr/bin/env python3
"""Train a two-layer MLP whose linear layers are block-sparse (sparsek.nn.BlockSparseLinear).

The task is synthetic: the targets come from a fixed random two-layer "teacher" network, so the
loss has somewhere to fall. Runs on the GPU when one is present (bfloat16 under autocast), else on
the CPU (float32). Prints the loss of every step.

    python3 examples/python/train_mlp.py [--steps 50] [--cpu]
"""
import argparse

import torch

from sparsek.nn import BlockSparseLinear


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    ap.add_argument("--hidden", type=int, default=512)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    torch.manual_seed(0)
    d_in, d_out = 256, 64

    teacher = torch.nn.Sequential(torch.nn.Linear(d_in, 128), torch.nn.Tanh(), torch.nn.Linear(128, d_out))
    model = torch.nn.Sequential(
        BlockSparseLinear(d_in, args.hidden, block=(32, 32), density=0.25),
        torch.nn.GELU(),
        BlockSparseLinear(args.hidden, d_out, block=(32, 32), density=0.5),
    ).to(device)
    teacher.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stored = sum(m.values.numel() for m in model if isinstance(m, BlockSparseLinear))
    dense = d_in * args.hidden + args.hidden * d_out
    print(f"device {device}; weights stored: {stored} of {dense} ({stored / dense:.0%})")

    first = last = None
    for step in range(args.steps):
        x = torch.randn(512, d_in, device=device)
        with torch.no_grad():
            y = teacher(x)
        # bfloat16 products on the GPU (its kernels are tensor-core kernels); float32 on the CPU.
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            pred = model(x)
        loss = torch.nn.functional.mse_loss(pred.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = float(loss)
        first = last if first is None else first
        print(f"step {step:3d}  loss {last:.5f}")
    print(f"loss {first:.5f} -> {last:.5f}")
    if not last < first:
        raise SystemExit("the loss did not fall")


if __name__ == "__main__":
    main()
