// Device dtype helpers shared by the CUDA kernels: float <-> storage type, and two adjacent
// elements as one access.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sparsek::dev {

template <class T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float(float v) { return v; }
template <> __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float(float v) { return v; }
template <> __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

// Two adjacent elements as one access (the caller checked alignment).
template <class T> struct Pair;
template <> struct Pair<float> { using type = float2; };
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

template <class T>
__device__ __forceinline__ typename Pair<T>::type make_pair2(float a, float b) {
  typename Pair<T>::type v;
  T* e = reinterpret_cast<T*>(&v);
  e[0] = from_float<T>(a);
  e[1] = from_float<T>(b);
  return v;
}

// Two floats as one 32-bit register of two 16-bit values (first in the low half), e.g. a wgmma A
// fragment register built from accumulators.
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Output elements whose 16-bit dtype is chosen at run time: one kernel writes f16 or bf16 (`bf16`
// says which; both are 2 bytes, so tiles, boxes and addresses are the same) and f32 needs no
// choice. Overloaded on the storage type: float (f32) or uint16_t (f16 / bf16 bits).
__device__ __forceinline__ float out_load(const float* p, bool) { return *p; }
__device__ __forceinline__ float out_load(const uint16_t* p, bool bf16) {
  return bf16 ? __uint_as_float(uint32_t(*p) << 16) : __half2float(__ushort_as_half(*p));
}
__device__ __forceinline__ void out_store(float* p, float v, bool) { *p = v; }
__device__ __forceinline__ void out_store(uint16_t* p, float v, bool bf16) {
  *p = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}
// Two adjacent elements as one access (the caller checked alignment).
__device__ __forceinline__ float2 out_load2(const float* p, bool) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 out_load2(const uint16_t* p, bool bf16) {
  const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
  if (bf16) return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
__device__ __forceinline__ void out_store2(float* p, float v0, float v1, bool) {
  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
}
__device__ __forceinline__ void out_store2(uint16_t* p, float v0, float v1, bool bf16) {
  *reinterpret_cast<uint32_t*>(p) = bf16 ? pack2<true>(v0, v1) : pack2<false>(v0, v1);
}

}  // namespace sparsek::dev
