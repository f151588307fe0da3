// e4m3 quantization kernels for device arrays (any sm_80+ GPU; ordinary CUDA). Two launches
// serve every case (dense operands per token or per 128-wide group, BSR values per block), each
// through the GroupMap the host built:
//
//   quantize_kernel    one CTA per group (grid-stride over tokens x groups): the group's maximum
//                      |x| as integer bits (warp max, then across warps in shared memory), the
//                      scale, then every code; thread 0 writes the scale.
//   dequantize_kernel  one thread per element (grid-stride): scale * decoded, stored in the dtype.
//
// Every number is computed by the same functions as on the host (kernels/quant/rule.hpp,
// sparsek/types.hpp), exactly rounded fp32 steps: the results are the host's bits. The maximum is
// an integer max, so its value does not depend on the reduction order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/device.hpp"
#include "kernels/quant/quant.hpp"
#include "kernels/quant/rule.hpp"

namespace sparsek::quant {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kMaxGrid = int64_t(1) << 20;  // grid-stride beyond this many CTAs

template <class Storage>
__device__ __forceinline__ float load_t(const void* p, int64_t i);
template <>
__device__ __forceinline__ float load_t<float>(const void* p, int64_t i) {
  return static_cast<const float*>(p)[i];
}
template <>
__device__ __forceinline__ float load_t<half_t>(const void* p, int64_t i) {
  return half_to_float(static_cast<const half_t*>(p)[i]);
}
template <>
__device__ __forceinline__ float load_t<bfloat16_t>(const void* p, int64_t i) {
  return bf16_to_float(static_cast<const bfloat16_t*>(p)[i]);
}

template <class Storage>
__global__ void __launch_bounds__(kMaxThreads)
    quantize_kernel(const void* __restrict__ src, GroupMap m, uint8_t* __restrict__ codes,
                    float* __restrict__ scales) {
  __shared__ uint32_t warp_max[kMaxThreads / 32];
  const int64_t groups = m.groups(), items = m.tokens * groups;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t t = item / groups, g = item % groups;
    const int64_t k0 = g * m.group, k1 = min(m.k, k0 + m.group);
    const int64_t s0 = t * m.t_stride, d0 = t * m.out_t_stride;
    uint32_t amax = 0;
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x)
      amax = max(amax, abs_bits(load_t<Storage>(src, s0 + k * m.k_stride)));
    amax = __reduce_max_sync(0xffffffffu, amax);
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    amax = 0;
    for (int w = 0; w < warps; ++w) amax = max(amax, warp_max[w]);
    const float scale = scale_of(amax);
    if (threadIdx.x == 0) scales[item] = scale;
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x)
      codes[d0 + k * m.out_k_stride] = code_of(load_t<Storage>(src, s0 + k * m.k_stride), scale);
    __syncthreads();  // warp_max is rewritten by the next item
  }
}

template <class Storage>
__device__ __forceinline__ void store_t(void* p, int64_t i, float v);
template <>
__device__ __forceinline__ void store_t<float>(void* p, int64_t i, float v) {
  static_cast<float*>(p)[i] = v;
}
template <>
__device__ __forceinline__ void store_t<half_t>(void* p, int64_t i, float v) {
  static_cast<half_t*>(p)[i] = float_to_half(v);
}
template <>
__device__ __forceinline__ void store_t<bfloat16_t>(void* p, int64_t i, float v) {
  static_cast<bfloat16_t*>(p)[i] = float_to_bf16(v);
}

template <class Storage>
__global__ void __launch_bounds__(kMaxThreads)
    dequantize_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales, GroupMap m,
                      void* __restrict__ dst) {
  const int64_t groups = m.groups(), n = m.tokens * m.k;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / m.k, k = e % m.k;
    const float scale = scales[t * groups + k / m.group];
    store_t<Storage>(dst, t * m.out_t_stride + k * m.out_k_stride, value_of(codes[t * m.t_stride + k * m.k_stride], scale));
  }
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  check_cuda(int(e), what);
}

}  // namespace

void quantize_gpu(const void* src, DType dtype, const GroupMap& m, uint8_t* codes, float* scales, void* stream) {
  const int64_t items = m.tokens * m.groups();
  if (items == 0) return;
  // A warp per 32 elements of a group, up to 8 warps: a 128-wide group takes 4.
  const int threads = int(std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, (m.group + 31) / 32 * 32)));
  const unsigned grid = unsigned(std::min(items, kMaxGrid));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::f16: quantize_kernel<half_t><<<grid, threads, 0, s>>>(src, m, codes, scales); break;
    case DType::bf16: quantize_kernel<bfloat16_t><<<grid, threads, 0, s>>>(src, m, codes, scales); break;
    default: quantize_kernel<float><<<grid, threads, 0, s>>>(src, m, codes, scales); break;
  }
  check_launch("quantize_e4m3 kernel launch");
}

void dequantize_gpu(const uint8_t* codes, const float* scales, const GroupMap& m, void* dst, DType dtype,
                    void* stream) {
  const int64_t n = m.tokens * m.k;
  if (n == 0) return;
  const unsigned grid = unsigned(std::min((n + kMaxThreads - 1) / kMaxThreads, kMaxGrid));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::f16: dequantize_kernel<half_t><<<grid, kMaxThreads, 0, s>>>(codes, scales, m, dst); break;
    case DType::bf16: dequantize_kernel<bfloat16_t><<<grid, kMaxThreads, 0, s>>>(codes, scales, m, dst); break;
    default: dequantize_kernel<float><<<grid, kMaxThreads, 0, s>>>(codes, scales, m, dst); break;
  }
  check_launch("dequantize kernel launch");
}

}  // namespace sparsek::quant
