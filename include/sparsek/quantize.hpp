// sparsek — fp8 (e4m3) operands for the block-sparse products: quantization from f32, f16 or
// bf16 values, and back.
//
// The rule, everywhere: a group of values (one stored block of a BSR matrix; one token of a dense
// matrix, or one token's 128-wide slice of K) gets the scale
//     scale = amax / 448          (amax: the group's largest |x|, 448: e4m3's largest value)
// computed in fp32, and each value becomes the e4m3 code of x / scale (fp32 division, rounded to
// nearest even, saturating at +-448), so that x ~ scale * e4m3_to_float(code). A group of zeros
// gets scale 0 and zero codes (as does one whose amax / 448 underflows fp32 to 0). Host and
// device functions give the same bits.
//
// Inputs must be finite. On host memory a NaN or infinite element is refused (Error naming the
// element and its value). Device kernels cannot report without a synchronization, so there the
// group holding such an element gets a NaN scale (and NaN codes, 0x7F): every product refuses a
// NaN scale with its index, and dequantize() gives NaN for the group.
//
// dequantize() computes scale * e4m3_to_float(code) in fp32 and rounds it to the output dtype.
//
// Device work is enqueued on `stream` (a cudaStream_t; null: the default stream) and not
// synchronized; it runs on any GPU of compute capability 8.0 or newer.
#pragma once
#include <cstdint>

#include "sparsek/bsr.hpp"

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

// Which dimension of a dense matrix holds the tokens, one scale each (the other one is K, the
// products' reduction dimension):
//   rows: one scale per row      (the A of a DDS, M x K: y = x * W^T with x's rows the tokens)
//   cols: one scale per column   (the B of a DSD, K x N)
enum class ScaleDim : int { rows = 0, cols = 1 };

// Scales of `tokens` tokens with reduction length k: tokens for scale_group 0, else
// tokens * ceil(k / 128) (scale_group 128). Throws Error(invalid_argument) for another group or
// a count whose byte size overflows 64 bits.
int64_t scale_count(int64_t tokens, int64_t k, int scale_group);

// ---- block-sparse ----

// Owning host matrices: f32/f16/bf16 -> e4m3 with one scale per stored block, and back (to f32,
// f16 or bf16). The pattern is copied.
BsrMatrix quantize_e4m3(const BsrMatrix& a);
BsrMatrix dequantize(const BsrMatrix& a, DType dtype = DType::f32);

// Views, host or device memory. quantize_e4m3: `in` holds f32/f16/bf16 values; `values` receives
// nnzb*bm*bk e4m3 codes (block layout as in.values), `scales` nnzb floats; both in in.memory.
// dequantize: `in` is e4m3 with its scales; `values` receives nnzb*bm*bk elements of `dtype` (f32,
// f16 or bf16) in in.memory. The pattern (row_ptr, col_idx) is not read. Outputs must not overlap
// the inputs.
void quantize_e4m3(const BsrView& in, void* values, float* scales, void* stream = nullptr);
void dequantize(const BsrView& in, void* values, DType dtype, void* stream = nullptr);

// ---- dense ----

// in: f32/f16/bf16, rows x cols, any layout and ld. out: e4m3, the same shape, in the same memory,
// its own layout and ld. scales: scale_count(tokens, K, scale_group) floats, laid out as a product
// reads them ([tokens][ceil(K / 128)] for scale_group 128). On return out.scales = scales and
// out.scale_group = scale_group, so `out` is ready to pass to a product.
void quantize_e4m3(const DenseView& in, DenseView& out, float* scales, ScaleDim dim, int scale_group = 0,
                   void* stream = nullptr);
// in: e4m3 with scales (in.scales, in.scale_group); out: f32/f16/bf16, the same shape and memory.
void dequantize(const DenseView& in, const DenseView& out, ScaleDim dim, void* stream = nullptr);

}  // namespace sparsek
#pragma GCC visibility pop
