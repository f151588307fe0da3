// The floor of a memory-bound call on this GPU, timed as `sparsek bench` times a product (its
// time_gpu(): CUDA events between calls issued back to back, the stream held, median): an empty
// kernel, and a kernel that only reads N bytes once (16-byte streaming loads, several in flight per
// thread, inputs rotating over copies so that L2 holds none of them).
//   cmake --build build --target read_floor
//   build/read_floor [MB ...]      (default: 29.36, the decode rows' stored weights, and 117.44, dense W)
// For each size the best of a few grid shapes is reported beside the bytes per second it implies.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "timer.cuh"

using namespace sparsek;

__global__ void empty_kernel() {}

// Each thread reads UNROLL 16-byte words per step, a grid-stride apart; the sum keeps the loads live.
template <int UNROLL>
__global__ void read_kernel(const uint4* __restrict__ p, size_t words, unsigned* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (UNROLL - 1) * stride < words; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < words; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;  // practically never; keeps the loads
}

// Median time per call in us of 200 timings of `calls` calls each (call(k): on input set k of
// `sets`), after 10 warm-up calls; held: the stream held until each batch is enqueued (else the
// host's launch rate is timed too, where it is the slower).
double median_us(const std::function<void(int)>& call, int sets, int calls = 1, bool held = true) {
  return 1000.0 * timing::median(timing::time_gpu(call, 10, 200, sets, calls, nullptr, held));
}

int timer_main(int argc, char** argv) {
  std::vector<double> mbs;
  for (int i = 1; i < argc; ++i) mbs.push_back(std::atof(argv[i]));
  if (mbs.empty()) mbs = {29.36, 117.44};
  cudaDeviceProp prop{};
  SPARSEK_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, L2 %.0f MB\n", prop.name, sms, prop.l2CacheSize / 1e6);
  auto empty = [](int) { empty_kernel<<<1, 32>>>(); };
  std::printf("empty kernel: %.2f us (host's launch rate included: %.2f us; 8 in a row: %.2f us a call)\n",
              median_us(empty, 1), median_us(empty, 1, 1, false), median_us(empty, 1, 8));
  unsigned* out = nullptr;
  SPARSEK_CHECK_CUDA(cudaMalloc(&out, 4));
  for (double mb : mbs) {
    const size_t bytes = size_t(mb * 1e6) / 16 * 16, words = bytes / 16;
    const int copies = int(std::max<size_t>(2, (size_t(2.5 * prop.l2CacheSize) + bytes - 1) / bytes));
    std::vector<uint4*> buf(static_cast<size_t>(copies));
    for (auto& b : buf) {
      SPARSEK_CHECK_CUDA(cudaMalloc(&b, bytes));
      SPARSEK_CHECK_CUDA(cudaMemset(b, 1, bytes));
    }
    double best = 1e30;
    int best_bps = 0, best_u = 0;
    for (int bps : {1, 2, 4, 8})
      for (int u : {4, 8}) {
        const int grid = sms * bps;
        auto call = [&](int k) {
          const uint4* p = buf[size_t(k)];
          if (u == 4) read_kernel<4><<<grid, 256>>>(p, words, out);
          else read_kernel<8><<<grid, 256>>>(p, words, out);
        };
        const double us = median_us(call, copies);
        if (us < best) best = us, best_bps = bps, best_u = u;
      }
    auto best_call = [&](int k) {
      const uint4* p = buf[size_t(k)];
      if (best_u == 4) read_kernel<4><<<sms * best_bps, 256>>>(p, words, out);
      else read_kernel<8><<<sms * best_bps, 256>>>(p, words, out);
    };
    const double ungated = median_us(best_call, copies, 1, false), stream8 = median_us(best_call, copies, 8);
    SPARSEK_CHECK_CUDA(cudaGetLastError());
    std::printf("read %.2f MB once: %.2f us (%.2f TB/s; %d CTAs of 256 per SM, %d loads in flight per thread, %d copies); "
                "host's launch rate included: %.2f us; 8 in a row: %.2f us a call (%.2f TB/s)\n",
                bytes / 1e6, best, bytes / best / 1e6, best_bps, best_u, copies, ungated, stream8, bytes / stream8 / 1e6);
    for (auto& b : buf) SPARSEK_CHECK_CUDA(cudaFree(b));
  }
  SPARSEK_CHECK_CUDA(cudaFree(out));
  return 0;
}

int main(int argc, char** argv) {
  return bench::run_timer("read_floor", [&] { return timer_main(argc, argv); });
}
