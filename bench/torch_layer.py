#!/usr/bin/env python3
"""sparsek from PyTorch on one GPU: host time per call, and BlockSparseLinear against nn.Linear.

1. Host time per call of sparsek.bsr_mm(A, B) for a 4096 x 64 x 4096 product (A: 64x64 blocks,
   12.5%), after the first call planned it: eager (wall time to issue --calls calls, divided by
   the count; the GPU work is timed separately and must be shorter for the figure to be the host's)
   and inside a CUDA graph of --calls products (host time of graph.replay() per product, and
   replay + synchronize per product).
2. BlockSparseLinear(4096 -> 14336) on 4096 tokens, bf16, forward, backward (dx and the weight
   gradient) and both, against nn.Linear of the same shape in the same run: 128x128 blocks at 25%
   and 64x64 at 12.5%. Median of --reps CUDA-event timings after warm-up; each layer's method
   (dds or dsd) is the one its first forward measured, and both methods' times are printed.

    python3 bench/torch_layer.py [--json out.json]
"""
import argparse
import json
import statistics
import time

import torch

import sparsek
from sparsek.nn import BlockSparseLinear


def median_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def host_time(calls, reps):
    gen = torch.Generator(device="cuda").manual_seed(0)
    M = K = 4096
    N, b, density = 64, 64, 0.125
    mb, kb = M // b, K // b
    k = round(density * kb)
    cols = torch.rand(mb, kb, generator=gen, device="cuda").argsort(dim=1)[:, :k]
    mask = torch.zeros(mb, kb, dtype=torch.bool, device="cuda").scatter_(1, cols, True)
    dense = (torch.rand(M, K, generator=gen, device="cuda") - 0.5) * mask.repeat_interleave(b, 0).repeat_interleave(b, 1)
    A = sparsek.BSRMatrix.from_dense(dense.half(), block=(b, b))
    B = torch.randn(K, N, device="cuda", dtype=torch.half)
    C = sparsek.bsr_mm(A, B)  # plans
    err = float((C.float() - dense @ B.float()).abs().max() / (dense @ B.float()).abs().max())
    gpu_ms = median_ms(lambda: sparsek.bsr_mm(A, B), reps)
    eager = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            sparsek.bsr_mm(A, B)
        eager.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparsek.bsr_mm(A, B)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            sparsek.bsr_mm(A, B)
    replay_host, replay_wall = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        g.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        replay_host.append((t1 - t) / calls * 1e6)
        replay_wall.append((t2 - t) / calls * 1e6)
    return {"shape": "4096x64x4096, 64x64 blocks, 12.5%", "rel_err": err,
            "gpu_us_per_call": gpu_ms * 1e3, "eager_host_us_per_call": statistics.median(eager),
            "graph_replay_host_us_per_product": statistics.median(replay_host),
            "graph_replay_wall_us_per_product": statistics.median(replay_wall)}


def layer_case(block, density, tokens, reps):
    torch.manual_seed(0)
    dt = torch.bfloat16
    lin = torch.nn.Linear(4096, 14336, bias=False, device="cuda", dtype=dt)
    layer = BlockSparseLinear(4096, 14336, block=block, density=density, bias=False, device="cuda", dtype=dt)
    x = torch.randn(tokens, 4096, device="cuda", dtype=dt, requires_grad=True)
    layer(x)  # plans and measures dds vs dsd
    out = {"block": f"{block[0]}x{block[1]}", "density": density, "method": layer.method,
           "method_ms": layer.measured_ms}
    # correctness of the chosen path against the dense weight
    ref = x.detach().float() @ layer.to_dense().float().T
    got = layer(x).float()
    out["rel_err"] = float((got - ref).abs().max() / ref.abs().max())
    for name, mod in (("dense", lin), ("sparsek", layer)):
        g = torch.randn(tokens, 14336, device="cuda", dtype=dt)

        def fwd():
            return mod(x)

        def bwd_setup():
            return mod(x)

        def fwd_bwd():
            y = mod(x)
            torch.autograd.grad(y, (x, *mod.parameters()), g)

        t_f = median_ms(fwd, reps)
        t_fb = median_ms(fwd_bwd, reps)
        # backward alone: timed around autograd.grad on a graph made before the timer starts
        times = []
        for _ in range(reps + 2):
            y = bwd_setup()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.autograd.grad(y, (x, *mod.parameters()), g)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        out[name] = {"fwd_ms": t_f, "bwd_ms": statistics.median(times[2:]), "fwd_bwd_ms": t_fb}
    for k in ("fwd_ms", "bwd_ms", "fwd_bwd_ms"):
        out["speedup_" + k.replace("_ms", "")] = out["dense"][k] / out["sparsek"][k]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_layer.py needs a CUDA device")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "sparsek": sparsek.__version__}
    h = host_time(args.calls, args.reps)
    res["host_time"] = h
    print(f"host time, {h['shape']} (rel err {h['rel_err']:.1e}; GPU {h['gpu_us_per_call']:.1f} us/call):")
    print(f"  eager {h['eager_host_us_per_call']:.2f} us/call (target <= 15); CUDA graph replay "
          f"{h['graph_replay_host_us_per_product']:.3f} us host, {h['graph_replay_wall_us_per_product']:.2f} "
          f"us wall per product (target <= 3)")
    res["layers"] = []
    print(f"\nBlockSparseLinear(4096 -> 14336), {args.tokens} tokens, bf16, vs nn.Linear (median ms):")
    print(f"{'block':>8} {'dens':>6} {'method':>6} | {'dense f/b/fb':>22} | {'sparsek f/b/fb':>22} | speedup f / b / fb")
    for block, density, target in (((128, 128), 0.25, 2.5), ((64, 64), 0.125, 3.5)):
        r = layer_case(block, density, args.tokens, args.reps)
        r["target_speedup_fwd_bwd"] = target
        res["layers"].append(r)
        d, s = r["dense"], r["sparsek"]
        print(f"{r['block']:>8} {density:>6.3f} {r['method']:>6} | {d['fwd_ms']:6.3f} {d['bwd_ms']:6.3f} "
              f"{d['fwd_bwd_ms']:7.3f} | {s['fwd_ms']:6.3f} {s['bwd_ms']:6.3f} {s['fwd_bwd_ms']:7.3f} | "
              f"{r['speedup_fwd']:.2f} / {r['speedup_bwd']:.2f} / {r['speedup_fwd_bwd']:.2f} "
              f"(target fb >= {target}; rel err {r['rel_err']:.1e}; dds {r['method_ms']['dds']:.2f} ms, "
              f"dsd {r['method_ms']['dsd']:.2f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
