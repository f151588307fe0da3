// Internal: e4m3 quantization on the GPU (quant.cu), for device arrays. The public functions
// (src/format/quantize.cpp) validate and map their operands onto a GroupMap; these only launch, on
// `stream`, unsynchronized: one launch per call, none when there is nothing to do.
#pragma once
#include <cstdint>

#include "sparsek/types.hpp"

namespace sparsek::quant {

// A matrix seen as tokens x K: a dense operand (tokens are its rows or its columns), or a BSR
// matrix's stored blocks (one block per token, its bm * bk elements the K). Element (t, k) of the
// source is at src[t * t_stride + k * k_stride], of the destination at dst[t * out_t_stride +
// k * out_k_stride]. One scale per token and run of `group` consecutive k (group = K: one per
// token), stored [tokens][groups] with groups = ceil(K / group).
struct GroupMap {
  int64_t tokens = 0, k = 0;
  int64_t t_stride = 0, k_stride = 0;
  int64_t out_t_stride = 0, out_k_stride = 0;
  int64_t group = 1;
  SPARSEK_HOST_DEVICE int64_t groups() const { return group > 0 ? (k + group - 1) / group : 0; }
};

// src: f32/f16/bf16 (dtype) -> codes (e4m3) and scales [tokens][groups]. The host's quantize_groups
// (quantize.cpp) gives the same bits.
void quantize_gpu(const void* src, DType dtype, const GroupMap& m, uint8_t* codes, float* scales, void* stream);
// codes with scales [tokens][groups] -> dst in dtype (f32/f16/bf16).
void dequantize_gpu(const uint8_t* codes, const float* scales, const GroupMap& m, void* dst, DType dtype,
                    void* stream);

}  // namespace sparsek::quant
