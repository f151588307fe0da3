// Internal: the double-precision dot product of the CPU attention backends (attention_cpu.cpp,
// decode_cpu.cpp), in one place so both sum in the same fixed order.
#pragma once
#include <cstdint>

namespace sparsek {

// x . y over n floats (n a multiple of 4: D is 64 or 128) in double, four partial sums: a fixed
// order with room for the pipeline.
inline double dot_f64(const float* x, const float* y, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t d = 0; d < n; d += 4) {
    s0 += double(x[d]) * double(y[d]);
    s1 += double(x[d + 1]) * double(y[d + 1]);
    s2 += double(x[d + 2]) * double(y[d + 2]);
    s3 += double(x[d + 3]) * double(y[d + 3]);
  }
  return (s0 + s1) + (s2 + s3);
}

}  // namespace sparsek
