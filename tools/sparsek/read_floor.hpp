// The floor of a memory-bound call on this GPU: the time of a kernel that only reads N bytes once
// (16-byte streaming loads, several in flight per thread), timed as the benchmarks time a call
// (time_gpu(): CUDA events, the stream held unless told otherwise, median), the inputs rotating
// over copies so that L2 holds none of them. `sparsek bench --op decode` sets decode attention
// against it; bench/read_floor.cu and bench/decode_timer.cu report it (built into the
// sparsek_timing library so that all of them share one kernel).
#pragma once
#include <cstddef>
#include <vector>

#include "timing.hpp"

namespace sparsek::timing {

// One way to launch the read: CTAs of 256 threads per SM, loads in flight per thread (4 or 8).
struct ReadConfig {
  int ctas_per_sm = 4;
  int unroll = 4;
};

struct ReadFloor {
  double us = 0;     // median time of one read of the bytes
  std::vector<double> times_ms;  // every timing (ms per call), as time_gpu() returns them
  ReadConfig config;  // the fastest launch (read_floor())
  int copies = 0;     // copies of the bytes rotated over
};

// Reads `bytes` (rounded down to 16) with `config`: warmup untimed calls, then the median of
// `reps` timings of `calls` calls each (time_gpu()), on the stream `stream` (null: the legacy
// default stream).
ReadFloor read_time(size_t bytes, ReadConfig config, int warmup, int reps, int calls = 1, bool held = stream_held(),
                    void* stream = nullptr);
// The fastest of a few launches (1, 2, 4, 8 CTAs per SM x 4, 8 loads in flight), as read_time().
ReadFloor read_floor(size_t bytes, int warmup, int reps, int calls = 1, bool held = stream_held(),
                     void* stream = nullptr);

}  // namespace sparsek::timing
