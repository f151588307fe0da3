// sparsek — basic types shared by every layer: dtypes, layouts, status and errors,
// and host-side fp16/bf16 conversions (round to nearest even).
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };
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

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline bfloat16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // nearest even
  return {uint16_t(u >> 16)};
}
inline float bf16_to_float(bfloat16_t h) { return bits_float(uint32_t(h.bits) << 16); }

inline half_t float_to_half(float f) {
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
inline float half_to_float(half_t h) {
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

// Load / store one element of any dtype as float.
inline float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f16: return half_to_float(static_cast<const half_t*>(p)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const bfloat16_t*>(p)[i]);
  }
  return 0.f;
}
inline void store_from_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::f16: static_cast<half_t*>(p)[i] = float_to_half(v); break;
    case DType::bf16: static_cast<bfloat16_t*>(p)[i] = float_to_bf16(v); break;
  }
}

}  // namespace sparsek
#pragma GCC visibility pop
