// The benchmarks' timing (see timing.hpp).
#include "timing.hpp"

#include "core/cuda_host.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <thread>

namespace sparsek::timing {

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool stream_held() {
  const char* e = std::getenv("SPARSEK_BENCH_GATE");
  return !(e && std::string(e) == "off");
}

namespace {

struct Events {
  std::vector<cudaEvent_t> ev;
  explicit Events(int reps) : ev(size_t(2 * reps)) {
    for (auto& e : ev) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~Events() {
    for (auto& e : ev) cudaEventDestroy(e);
  }
};

// Holds the stream (a host function that waits) until the host has enqueued a batch of timed runs,
// so that the events measure the GPU's work and not how fast the host launches: a call whose host
// side (argument checks, tensor maps, the launch) takes longer than its kernel would otherwise be
// timed at the host's rate. nvbench holds its stream the same way (with a kernel). The wait gives
// up after kGateTimeout, so a run() that waits for the GPU cannot hang the timer: it is then timed
// as before, and time_gpu() says so on stderr.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> gave_up{false};
};
constexpr auto kGateTimeout = std::chrono::milliseconds(500);
void CUDART_CB hold_until_open(void* p) {
  auto* g = static_cast<Gate*>(p);
  const auto until = std::chrono::steady_clock::now() + kGateTimeout;
  while (!g->open.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() > until) {
      g->gave_up.store(true);
      return;
    }
    std::this_thread::yield();
  }
}

}  // namespace

std::vector<double> time_gpu(const std::function<void(int)>& run, int warmup, int reps, int sets, int calls,
                             void* stream, bool hold) {
  const auto st = static_cast<cudaStream_t>(stream);
  int next = 0;  // the input set of the next run
  auto run_next = [&] {
    run(next);
    next = (next + 1) % sets;
  };
  for (int i = 0; i < warmup; ++i) run_next();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  Events t(reps);
  // A batch stays well inside the launch queue, which the host must not fill while the stream is
  // held (it would wait for the GPU, and the GPU for it, until the gate gives up).
  const int batch = hold ? std::max(1, 96 / (calls + 2)) : reps;
  std::vector<std::unique_ptr<Gate>> gates;
  try {
    for (int first = 0; first < reps; first += batch) {
      if (hold) {
        gates.push_back(std::make_unique<Gate>());
        check_cuda(cudaLaunchHostFunc(st, &hold_until_open, gates.back().get()), "cudaLaunchHostFunc(hold the stream)");
      }
      for (int i = first; i < std::min(reps, first + batch); ++i) {
        check_cuda(cudaEventRecord(t.ev[size_t(2 * i)], st), "cudaEventRecord");
        for (int c = 0; c < calls; ++c) run_next();
        check_cuda(cudaEventRecord(t.ev[size_t(2 * i + 1)], st), "cudaEventRecord");
      }
      if (hold) gates.back()->open.store(true, std::memory_order_release);
    }
    check_cuda(cudaEventSynchronize(t.ev.back()), "timed runs");
  } catch (...) {
    // A run failed mid-batch: let the held stream go, and leave the gates to the host functions
    // that may still read them (after a device error they may never run; a few bytes stay behind).
    for (auto& g : gates) g.release()->open.store(true, std::memory_order_release);
    cudaDeviceSynchronize();
    throw;
  }
  const auto gave_up = std::count_if(gates.begin(), gates.end(), [](const auto& g) { return g->gave_up.load(); });
  if (gave_up > 0)
    std::fprintf(stderr, "note: %d of %d batches were enqueued slower than %d ms; their timings include the host's launch rate\n",
                 int(gave_up), int(gates.size()), int(kGateTimeout.count()));
  std::vector<double> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float x = 0;
    check_cuda(cudaEventElapsedTime(&x, t.ev[size_t(2 * i)], t.ev[size_t(2 * i + 1)]), "cudaEventElapsedTime");
    ms[size_t(i)] = double(x) / calls;
  }
  return ms;
}

std::vector<double> time_host(const std::function<void()>& run, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return ms;
}

}  // namespace sparsek::timing
