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

#include "read_floor.hpp"
#include "timer.cuh"

using namespace sparsek;

__global__ void empty_kernel() {}

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
  for (double mb : mbs) {
    const size_t bytes = size_t(mb * 1e6) / 16 * 16;
    // The read kernel and its search are the ones `sparsek bench --op decode` uses (read_floor.hpp).
    const timing::ReadFloor best = timing::read_floor(bytes, 10, 200);
    const double ungated = timing::read_time(bytes, best.config, 10, 200, 1, false).us;
    const double stream8 = timing::read_time(bytes, best.config, 10, 200, 8).us;
    std::printf("read %.2f MB once: %.2f us (%.2f TB/s; %d CTAs of 256 per SM, %d loads in flight per thread, %d copies); "
                "host's launch rate included: %.2f us; 8 in a row: %.2f us a call (%.2f TB/s)\n",
                bytes / 1e6, best.us, bytes / best.us / 1e6, best.config.ctas_per_sm, best.config.unroll, best.copies,
                ungated, stream8, bytes / stream8 / 1e6);
  }
  return 0;
}

int main(int argc, char** argv) {
  return bench::run_timer("read_floor", [&] { return timer_main(argc, argv); });
}
