// Internal: the CPU backends' threads (products in gemm_cpu.cpp, attention in attention_cpu.cpp).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "plan/backends.hpp"  // cpu_threads
#include "sparsek/gemm.hpp"   // Options

namespace sparsek {

// The most workers a run starts, whatever Options::threads asks: each has its own scratch and
// OpenMP thread, so a count such as INT_MAX must not become as many of either. (Results do not
// depend on the count.)
constexpr int kMaxThreads = 1024;

// Threads for `flops` of work: Options::threads, else OpenMP's default (cpu_threads()), but at
// most one per ~4 MFLOP and kMaxThreads. o.threads >= 0: plan() rejects negative counts
// (resolve_backend).
inline int thread_count(const Options& o, double flops) {
  const int t = std::min(cpu_threads(o.threads), kMaxThreads);
  // Waking a thread costs microseconds: give each at least ~4 MFLOP of work.
  int64_t by_work = int64_t(flops / 4e6) + 1;
  return int(std::min<int64_t>(t, by_work));
}

// Runs f(item, worker) for item in [0, n) on up to `threads` OpenMP workers, worker in
// [0, threads). Items are handed out dynamically (they differ in length); the first exception is
// rethrown once all workers are done.
template <class F>
void parallel_for(int64_t n, int threads, const F& f) {
  if (n <= 0) return;
  const int t = int(std::min<int64_t>(std::max(threads, 1), n));
  if (t == 1) {
    for (int64_t i = 0; i < n; ++i) f(i, 0);
    return;
  }
#ifdef _OPENMP
  std::exception_ptr err;
  std::mutex mu;
  std::atomic<bool> failed{false};
#pragma omp parallel for schedule(dynamic, 1) num_threads(t)
  for (int64_t i = 0; i < n; ++i) {
    if (failed.load(std::memory_order_relaxed)) continue;  // stop early after a failure
    try {
      f(i, omp_get_thread_num());
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
      failed = true;
    }
  }
  if (err) std::rethrow_exception(err);
#else
  for (int64_t i = 0; i < n; ++i) f(i, 0);
#endif
}

}  // namespace sparsek
