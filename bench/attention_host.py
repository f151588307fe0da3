#!/usr/bin/env python3
"""Host time and GPU time of one attention call, sparsek beside FlashAttention-4's block-sparse
attention (when flash-attn-4 imports), in one process on the same inputs and blocks:

    PYTHONPATH=build/python:python python3 bench/attention_host.py

B = 1, Hq = Hkv = 16, S = 16384, bf16, 12.5% random top-k, 128x128 blocks, D = 128 and 64.
- host us: wall time of the Python call (perf_counter, median of 5 rounds of 20 calls) while a long
  sleep kernel queued first keeps the GPU busy, so no launch waits for the GPU: what a call costs the
  CPU (forward without grad, forward recording autograd, one torch.autograd.grad backward call, and a
  training step = forward + backward).
- GPU ms (host ahead): CUDA events around the same call with a sleep kernel queued before the first
  event, so the host has enqueued everything before the GPU reaches it: the GPU's time alone, what a
  training loop whose host runs ahead sees (median of 20).
bench/torch_peers.py times calls from an idle GPU instead, so its figures include each library's
host time before its first kernel; this script separates the two.
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_peers, fa4_layout
import sparsek
from torch_peers import topk_layout, load_fa4
from fa4_layout import fa4_block_sparse_tensors, fa4_lists

def host_us(fn, n=20, reps=5):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(3e8))  # ~0.15 s of GPU time queued ahead
        t0 = time.perf_counter()
        for _ in range(n): fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)

def gpu_ms(fn, n=20):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e7))
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)

def case(D, H=16, S=16384):
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    for x in (q, k, v): x.requires_grad_(True)
    layout, mask = topk_layout(H, S // 128, 0.125, False, gen)
    peers = {"sparsek": (lambda q, k, v: sparsek.attention(q, k, v, layout)[0], (q, k, v, do))}
    fa4, why = load_fa4()
    if fa4 is not None:
        fwd_bs, bwd_bs = fa4_block_sparse_tensors(fa4_lists(mask, q_len=S, kv_len=S, causal=False))
        qt, kt, vt, dt = (x.detach().transpose(1, 2).contiguous() for x in (q, k, v, do))
        for x in (qt, kt, vt): x.requires_grad_(True)
        peers["fa4"] = (lambda q, k, v: fa4(q, k, v, causal=False, block_sparse_tensors=fwd_bs,
                                            block_sparse_tensors_bwd=bwd_bs)[0], (qt, kt, vt, dt))
    else:
        print("FA4:", why)
    for who, (fn, (qi, ki, vi, di)) in peers.items():
        def step(): o = fn(qi, ki, vi); torch.autograd.grad(o, (qi, ki, vi), di)
        def fwd_ng():
            with torch.no_grad(): fn(qi, ki, vi)
        for _ in range(3): step(); fwd_ng()
        o = fn(qi, ki, vi)
        bwd = lambda: torch.autograd.grad(o, (qi, ki, vi), di, retain_graph=True)
        print(f"D{D} {who:8s} host us: fwd no-grad {host_us(fwd_ng):7.1f}, fwd+autograd {host_us(lambda: fn(qi, ki, vi)):7.1f}, "
              f"backward call {host_us(bwd):7.1f}, step {host_us(step):7.1f} | GPU ms (host ahead): fwd {gpu_ms(fwd_ng):.3f}, "
              f"backward {gpu_ms(bwd):.3f}, step {gpu_ms(step):.3f}", flush=True)

print(torch.cuda.get_device_name(), torch.__version__)
case(128)
case(64)
