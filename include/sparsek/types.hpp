// sparsek — basic types shared by every layer: dtypes, layouts, status and errors,
// and fp16/bf16/e4m3 conversions (round to nearest even).
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

// The scalar conversions below are also device functions when compiled by nvcc, so that a kernel
// rounds exactly as the host does (sparsek's quantization kernels rely on it).
#if defined(__CUDACC__)
#define SPARSEK_HOST_DEVICE __host__ __device__
#else
#define SPARSEK_HOST_DEVICE
#endif

namespace sparsek {

// e4m3: 8-bit float (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; the "fn" variant: no
// infinities, 0x7F/0xFF are NaN, largest finite value 448). Only the block-sparse products take
// it, always with fp32 scales beside the values (BsrView::scales, DenseView::scales).
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2, e4m3 = 3 };
enum class Layout : int { row_major = 0, col_major = 1 };
enum class Op : int { none = 0, trans = 1 };
// Where the data of an operand lives. Host data runs on the CPU backend, device data on CUDA.
enum class Memory : int { host = 0, device = 1 };
enum class Backend : int { automatic = 0, cpu = 1, cuda = 2 };

// Numbers are the C API's status codes (sparsek.h); keep them in step.
enum class Status : int {
  ok = 0,
  invalid_argument = 1,  // bad shape, pointer, index, dtype ... (message names the argument)
  unsupported = 2,       // valid input that no (chosen) variant can run
  cuda_error = 3,        // a CUDA / cuBLAS / cuSPARSE call failed (message carries its text)
  no_device = 4,         // a GPU was needed and none answered
  io_error = 5,          // cache or file problems
  internal = 6,          // a bug in sparsek
  nccl_error = 7,        // an NCCL call failed (message names the call and carries NCCL's text)
};

const char* to_string(Status s);
const char* to_string(DType d);
const char* to_string(Layout l);
const char* to_string(Op o);
const char* to_string(Memory m);
size_t dtype_size(DType d);

// Every failure in the C++ API is thrown as sparsek::Error; the C API turns it into a status.
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& what) : std::runtime_error(what), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

// ---- host fp16 / bf16 (storage types; arithmetic happens in float) ----
struct half_t { uint16_t bits; };
struct bfloat16_t { uint16_t bits; };

SPARSEK_HOST_DEVICE inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
SPARSEK_HOST_DEVICE inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

SPARSEK_HOST_DEVICE inline bfloat16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // nearest even
  return {uint16_t(u >> 16)};
}
SPARSEK_HOST_DEVICE inline float bf16_to_float(bfloat16_t h) { return bits_float(uint32_t(h.bits) << 16); }

SPARSEK_HOST_DEVICE inline half_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};  // NaN
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // overflow (incl. rounding up) -> inf
  if (a < 0x38800000u) {                                     // subnormal half or zero
    // value = a_float; half subnormal unit is 2^-24. Add 0.5 (in float) so the FPU rounds for us.
    float v = bits_float(a) + 0.5f;                          // 0.5 = 2^-1: shifts mantissa to 2^-24 units
    uint32_t r = float_bits(v) - 0x3f000000u;
    return {uint16_t(sign | r)};
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return {uint16_t(sign | (a >> 13))};
}
SPARSEK_HOST_DEVICE inline float half_to_float(half_t h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {  // zero / subnormal: mant * 2^-24
    float v = float(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// ---- host e4m3 (storage type; arithmetic happens in float) ----
struct e4m3_t { uint8_t bits; };

// float -> e4m3, rounding to nearest even. Saturating: anything beyond +-448 (infinities too)
// becomes +-448, since e4m3 has no infinity. NaN becomes 0x7F. The sign of zero is kept (-0 and
// negative values that round to zero give 0x80).
SPARSEK_HOST_DEVICE inline e4m3_t float_to_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {0x7f};                     // NaN
  if (a >= 0x43e00000u) return {uint8_t(sign | 0x7eu)};  // >= 448 (incl. inf): saturate
  if (a < 0x3c800000u) {                                   // below 2^-6: a multiple of 2^-9 (subnormal)
    // v = |f| * 2^9 in [0, 8) is exact (a power-of-two scale); round it to an integer, ties to even.
    const float v = bits_float(a) * 512.f;
    uint32_t m = uint32_t(v);  // floor (v >= 0)
    const float frac = v - float(m);  // exact: v and m share their binade or m = 0
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) ++m;
    return {uint8_t(sign | m)};  // m = 8 is the smallest normal, 0x08: the encoding carries over
  }
  // Normal: keep 3 of float's 23 mantissa bits, ties to even; a carry out of the mantissa bumps
  // the exponent, which the addition does by itself. Below 448 the result stays <= 0x7E.
  const uint32_t exp = (a >> 23) - 127 + 7;  // 1..15
  const uint32_t rest = a & 0xfffffu;        // the 20 dropped mantissa bits
  uint32_t code = (exp << 3) | ((a >> 20) & 7u);
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;
  return {uint8_t(sign | code)};
}
// e4m3 -> float, exact for every code (subnormals included); 0x7F and 0xFF give NaN.
SPARSEK_HOST_DEVICE inline float e4m3_to_float(e4m3_t h) {
  const uint32_t sign = uint32_t(h.bits & 0x80u) << 24;
  const uint32_t exp = (h.bits >> 3) & 0xfu, mant = h.bits & 7u;
  if (exp == 0xf && mant == 7) return bits_float(sign | 0x7fc00000u);
  if (exp == 0) {  // zero / subnormal: mant * 2^-9
    const float v = float(mant) * 0.001953125f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 120u) << 23) | (mant << 20));
}

// Load / store one element of any dtype as float. e4m3 elements are the raw codes: their scales
// are applied by the caller.
inline float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f16: return half_to_float(static_cast<const half_t*>(p)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const bfloat16_t*>(p)[i]);
    case DType::e4m3: return e4m3_to_float(static_cast<const e4m3_t*>(p)[i]);
  }
  return 0.f;
}
inline void store_from_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::f16: static_cast<half_t*>(p)[i] = float_to_half(v); break;
    case DType::bf16: static_cast<bfloat16_t*>(p)[i] = float_to_bf16(v); break;
    case DType::e4m3: static_cast<e4m3_t*>(p)[i] = float_to_e4m3(v); break;
  }
}

}  // namespace sparsek
#pragma GCC visibility pop
