// Internal: e4m3 operands of the CPU backend (gemm_cpu.cpp) decoded to fp32 with their scales
// applied, so that the backend's fp32 loops run on them unchanged. Element value =
// scale * e4m3_to_float(code), one fp32 multiplication (as dequantize() computes it).
#pragma once
#include <cstdint>

#include "sparsek/bsr.hpp"

namespace sparsek {

// The stored blocks of `a` (e4m3 values, one scale per block) as fp32 blocks: output block t is
// stored block src[t] (t when src is null), bm x bk row-major, or bk x bm (its transpose) when
// `transpose`. out: [nnzb][bm * bk].
void decode_e4m3_blocks(const BsrView& a, const int32_t* src, bool transpose, float* out, int threads);

// A dense e4m3 operand in the backend's row-product frame: d is K x tokens (a DSD's B, or a DDS's
// A seen transposed), one scale per column (token) or per column and 128-row group of K (scale_group
// 128, scales [tokens][ceil(K / 128)]). out: d.rows x ld row-major fp32; columns d.cols..ld-1 are
// not written.
void decode_e4m3_panel(const DenseView& d, float* out, int64_t ld, int threads);

}  // namespace sparsek
