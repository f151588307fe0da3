// The e4m3 quantization rule, one copy for the host functions (src/format/quantize.cpp) and the
// CUDA kernels (quant.cu), so that both give the same bits: every step is an exactly rounded fp32
// operation or a bit manipulation (sparsek/quantize.hpp states the rule).
#pragma once
#include <cstdint>

#include "sparsek/types.hpp"

namespace sparsek::quant {

constexpr float kE4m3Max = 448.f;

// The group's running maximum is kept as the bits of |x|: for non-negative floats the integer
// order is the numeric order, a NaN's bits lie above +inf's, and an integer max cannot drop a NaN
// the way fmaxf does, so any NaN or infinity in a group shows in its maximum.
SPARSEK_HOST_DEVICE inline uint32_t abs_bits(float x) { return float_bits(x) & 0x7fffffffu; }

// The scale of a group from its maximum |x| (as bits): amax / 448, NaN for a group holding NaN or
// an infinity.
SPARSEK_HOST_DEVICE inline float scale_of(uint32_t amax_bits) {
  if (amax_bits >= 0x7f800000u) return bits_float(0x7fc00000u);
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(bits_float(amax_bits), kE4m3Max);  // IEEE division whatever the math flags
#else
  return bits_float(amax_bits) / kE4m3Max;
#endif
}

// One value's code under its group's scale. A zero scale (zero group, or amax / 448 below fp32's
// range) gives zero codes: x / 0 would be inf or NaN. A NaN scale gives NaN (0x7F).
SPARSEK_HOST_DEVICE inline uint8_t code_of(float x, float scale) {
  if (scale == 0.f) return 0;
#if defined(__CUDA_ARCH__)
  return float_to_e4m3(__fdiv_rn(x, scale)).bits;
#else
  return float_to_e4m3(x / scale).bits;
#endif
}

// One value back: scale * decoded, in fp32. A NaN result (a NaN code or scale) is made the one
// quiet NaN 0x7FC00000: the host propagates a NaN operand's bits, the GPU returns its own
// canonical NaN, and the two must give the same bits.
SPARSEK_HOST_DEVICE inline float value_of(uint8_t code, float scale) {
#if defined(__CUDA_ARCH__)
  const float v = __fmul_rn(scale, e4m3_to_float({code}));  // never fused into a neighbouring add
#else
  const float v = scale * e4m3_to_float({code});
#endif
  return v == v ? v : bits_float(0x7fc00000u);
}

}  // namespace sparsek::quant
