// The memory-bound kernels of context-parallel attention (cp.hpp).
#include "kernels/cp/cp.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/device.hpp"
#include "kernels/dtype.cuh"

namespace sparsek::cp_gpu {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkBytes = kThreads * 16;  // one 16-byte vector per thread per chunk

// Span blockIdx.x, its chunks blockIdx.y, blockIdx.y + gridDim.y, ...
__global__ void copy_kernel(const Span* spans, const char* src, char* dst) {
  const Span s = spans[blockIdx.x];
  for (int64_t c = blockIdx.y; c * kChunkBytes < s.n; c += gridDim.y) {
    const int64_t at = c * kChunkBytes + int64_t(threadIdx.x) * 16;
    if (at < s.n)
      *reinterpret_cast<uint4*>(dst + s.to + at) = *reinterpret_cast<const uint4*>(src + s.from + at);
  }
}

// Eight elements (16 bytes) per thread per chunk; a span's length is a multiple of eight.
template <class T>
__global__ void add_kernel(const Span* spans, const T* src, T* dst) {
  const Span s = spans[blockIdx.x];
  constexpr int64_t chunk = kThreads * 8;
  for (int64_t c = blockIdx.y; c * chunk < s.n; c += gridDim.y) {
    const int64_t at = c * chunk + int64_t(threadIdx.x) * 8;
    if (at >= s.n) continue;
    uint4 a = *reinterpret_cast<const uint4*>(dst + s.to + at);
    const uint4 b = *reinterpret_cast<const uint4*>(src + s.from + at);
    T* x = reinterpret_cast<T*>(&a);
    const T* y = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = dev::from_float<T>(dev::to_float(x[e]) + dev::to_float(y[e]));
    *reinterpret_cast<uint4*>(dst + s.to + at) = a;
  }
}

// A warp per row, each lane d / 32 elements.
template <class T>
__global__ void merge_kernel(T* o, float* lse, const T* o2, const float* lse2, int64_t rows, int64_t d) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const float l1 = lse[row], l2 = lse2[row], m = fmaxf(l1, l2);
  float w1 = 0.f, w2 = 0.f, l = -INFINITY;
  if (m != -INFINITY) {
    w1 = expf(l1 - m), w2 = expf(l2 - m);
    const float sum = w1 + w2;
    l = m + logf(sum);
    w1 /= sum, w2 /= sum;
  }
  for (int64_t e = lane; e < d; e += 32) {
    const int64_t at = row * d + e;
    o[at] = dev::from_float<T>(w1 * dev::to_float(o[at]) + w2 * dev::to_float(o2[at]));
  }
  __syncwarp();
  if (lane == 0) lse[row] = l;
}

dim3 grid_of(int64_t count, int64_t longest, int64_t chunk) {
  const int64_t chunks = std::max<int64_t>(1, (longest + chunk - 1) / chunk);
  return dim3(unsigned(count), unsigned(std::min<int64_t>(chunks, 65535)));
}

}  // namespace

void copy(const Span* spans, int64_t count, int64_t longest, const void* src, void* dst, void* stream) {
  if (count == 0) return;
  copy_kernel<<<grid_of(count, longest, kChunkBytes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      spans, static_cast<const char*>(src), static_cast<char*>(dst));
  check_cuda(cudaGetLastError(), "context-parallel block copy");
}

void add(const Span* spans, int64_t count, int64_t longest, const void* src, void* dst, DType dtype, void* stream) {
  if (count == 0) return;
  const dim3 grid = grid_of(count, longest, kThreads * 8);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::bf16)
    add_kernel<<<grid, kThreads, 0, s>>>(spans, static_cast<const __nv_bfloat16*>(src), static_cast<__nv_bfloat16*>(dst));
  else
    add_kernel<<<grid, kThreads, 0, s>>>(spans, static_cast<const __half*>(src), static_cast<__half*>(dst));
  check_cuda(cudaGetLastError(), "context-parallel gradient sum");
}

void merge(void* o, float* lse, const void* o2, const float* lse2, int64_t rows, int64_t d, DType dtype, void* stream) {
  if (rows == 0) return;
  const unsigned blocks = unsigned((rows + kThreads / 32 - 1) / (kThreads / 32));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::bf16)
    merge_kernel<<<blocks, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(o), lse, static_cast<const __nv_bfloat16*>(o2),
                                             lse2, rows, d);
  else
    merge_kernel<<<blocks, kThreads, 0, s>>>(static_cast<__half*>(o), lse, static_cast<const __half*>(o2), lse2, rows, d);
  check_cuda(cudaGetLastError(), "context-parallel merge");
}

}  // namespace sparsek::cp_gpu
