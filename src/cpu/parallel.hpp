// Internal: the CPU backends' threads (products in gemm_cpu.cpp, attention in attention_cpu.cpp).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "sparsek/gemm.hpp"  // Options

namespace sparsek {

// Threads for `flops` of work: Options::threads (0 = hardware concurrency), but at most one per
// ~4 MFLOP. o.threads >= 0: plan() rejects negative counts (resolve_backend).
inline int thread_count(const Options& o, double flops) {
  int t = o.threads;
  if (t == 0) t = int(std::thread::hardware_concurrency());
  if (t <= 0) t = 1;
  // Starting a thread costs tens of microseconds: give each at least ~4 MFLOP of work.
  int64_t by_work = int64_t(flops / 4e6) + 1;
  return int(std::min<int64_t>(t, by_work));
}

// Runs f(item, worker) for item in [0, n) on up to `threads` workers (the caller is worker 0).
// Items are handed out dynamically; the first exception is rethrown after all workers joined.
template <class F>
void parallel_for(int64_t n, int threads, const F& f) {
  if (n <= 0) return;
  const int t = int(std::min<int64_t>(std::max(threads, 1), n));
  if (t == 1) {
    for (int64_t i = 0; i < n; ++i) f(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr err;
  std::mutex mu;
  auto worker = [&](int w) {
    try {
      for (int64_t i = next++; i < n; i = next++) f(i, w);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
      next = n;  // stop the others early
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(size_t(t - 1));
  try {
    for (int w = 1; w < t; ++w) pool.emplace_back(worker, w);
  } catch (...) {
    // Could not start more threads: the ones running (and this one) finish the work.
  }
  worker(0);
  for (std::thread& th : pool) th.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace sparsek
