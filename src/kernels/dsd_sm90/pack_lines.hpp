// Internal: packs a strided matrix of 16-bit elements into aligned lines (pack_lines.cu), so that
// the TMA can read it: the Hopper product does this for a dense operand whose base address or
// leading dimension is not a multiple of 16 bytes.
#pragma once
#include <cstdint>

namespace sparsek {

// Elements of a 16-bit line padded to a whole number of `align`-element pieces (8: 16-byte
// granules, what the TMA needs; 64: 128-byte L2 lines).
inline int64_t packed_line_elems(int64_t len, int64_t align = 8) { return (len + align - 1) / align * align; }

// The Hopper product's copy stride for a line of `len` elements: whole 128-byte L2 lines for lines
// longer than 64 elements, else the next power of two of at least 8 elements (16, 32, 64 or 128
// bytes): no line of the copy straddles two L2 lines (docs/history/products.md, "B's lines and L2 lines").
inline int64_t aligned_line_elems(int64_t len) {
  if (len > 64) return packed_line_elems(len, 64);
  int64_t p = 8;
  while (p < len) p *= 2;
  return p;
}

// dst[i * ldp + j] = src[i * ld + j] for i < lines, j < len, enqueued on `stream` (a cudaStream_t).
// src needs only 2-byte alignment; dst must be 16-byte aligned and hold lines * ldp elements, ldp a
// multiple of 8 and >= len; the padding past len in each line is written as zeros. One launch, no
// allocation, no synchronization (capturable in a CUDA graph).
void pack_lines_16bit(const void* src, int64_t ld, void* dst, int64_t ldp, int64_t lines, int64_t len, void* stream);

}  // namespace sparsek
