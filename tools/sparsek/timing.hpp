// How sparsek's benchmarks time work: `sparsek bench` and `sparsek tune` and the timers in bench/
// (built as the sparsek_timing library). GPU work is timed with CUDA events after a warm-up, the
// stream held until a batch of timed runs is enqueued; host work with the steady clock. Results are
// reported as the median.
#pragma once
#include <functional>
#include <vector>

#include "tools_internal.hpp"

// Checks a CUDA runtime call: a failure throws sparsek::Error(cuda_error) naming the call and the
// error (check_cuda()).
#define SPARSEK_CHECK_CUDA(call) ::sparsek::check_cuda(static_cast<int>(call), #call)

namespace sparsek::timing {

double median(std::vector<double> v);  // NaN when empty

// Whether time_gpu() holds the stream by default: SPARSEK_BENCH_GATE=off times the runs as the
// host issues them (the host's launch rate included where it is the slower).
bool stream_held();

// Warm-up, then `reps` timings, each bracketing `calls` consecutive runs with CUDA events on
// `stream` (a cudaStream_t; null: the legacy default stream); run(set) enqueues one run on input
// set `set` (rotated over `sets` from run to run). Returns the time per run of each timing in ms.
// calls > 1 measures a stream of calls (a decode step's layers), where one call may start while the
// previous one ends; with calls = 1 the events sit between the runs and each run is timed alone.
// With `hold` the stream waits (a host function) until each batch of timed runs is enqueued, so the
// events time the GPU's work and not how fast the host launches it.
std::vector<double> time_gpu(const std::function<void(int set)>& run, int warmup, int reps, int sets,
                             int calls = 1, void* stream = nullptr, bool hold = stream_held());

// Wall-clock milliseconds of each of `reps` runs after `warmup` untimed ones.
std::vector<double> time_host(const std::function<void()>& run, int warmup, int reps);

}  // namespace sparsek::timing
