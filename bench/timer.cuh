// What the timers in bench/ share beside the one timing helper (tools/sparsek/timing.hpp: events,
// warm-up, the held stream, the median, SPARSEK_CHECK_CUDA): inputs written on the device, uniform
// in [-1, 1) from a hash of the index (reproducible, never all zeros, no host copy of large
// inputs), 16-bit elements read back on the host, and a main() that reports an error and exits 1.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <exception>

#include "sparsek/types.hpp"
#include "timing.hpp"

namespace sparsek::bench {

template <typename T>
__global__ void fill_uniform_kernel(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32) * 40503u ^ seed * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    const float v = float(h >> 8) * (1.f / 8388608.f) - 1.f;  // 24 bits over [-1, 1)
    if constexpr (sizeof(T) == 4) p[i] = v;
    else p[i] = T(v);
  }
}

// n elements of dtype t at device address p.
inline void fill_uniform(void* p, DType t, int64_t n, uint32_t seed) {
  if (t == DType::f16) fill_uniform_kernel<<<1024, 256>>>(static_cast<__half*>(p), n, seed);
  else if (t == DType::bf16) fill_uniform_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  else fill_uniform_kernel<<<1024, 256>>>(static_cast<float*>(p), n, seed);
  SPARSEK_CHECK_CUDA(cudaGetLastError());
}

// A 16-bit element (the bits of an f16, or of a bf16) as float.
inline float to_f(uint16_t bits, bool bf16) {
  return bf16 ? bf16_to_float(bfloat16_t{bits}) : half_to_float(half_t{bits});
}

// A timer's main(): body() returns the exit code; an error it throws (a failed CUDA call, a
// library error) is printed with the timer's name and exits with 1.
template <class Body>
int run_timer(const char* name, const Body& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace sparsek::bench
