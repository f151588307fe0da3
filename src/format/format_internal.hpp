// Internal: pattern work that several layers share (the BSR transpose, the CPU backend, the
// portable kernel's DDS / op(A) = A^T path), and the byte ranges the aliasing check compares.
#pragma once
#include <cstdint>
#include <vector>

#include "sparsek/bsr.hpp"

namespace sparsek {

// The bytes an operand's elements span, [begin, end) (padding between rows included); empty
// (begin == end) when it has no elements. Only for views that passed validation (no overflow).
struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const ByteRange& o) const { return begin < end && o.begin < o.end && begin < o.end && o.begin < end; }
};
ByteRange byte_range(const DenseView& d);
ByteRange byte_range(const void* p, int64_t bytes);

// The pattern of A^T for A with mb x kb blocks: block row c of A^T holds the blocks of A's block
// column c. Entries come out sorted within each row (a counting sort that walks A's rows in order),
// so the result is deterministic.
struct PatternTranspose {
  std::vector<int32_t> row_ptr;  // [kb + 1]
  std::vector<int32_t> col_idx;  // [nnzb]: the block row of A each entry came from
  std::vector<int32_t> src;      // [nnzb]: the entry's position in A's col_idx / values
};
// row_ptr [mb + 1] and col_idx [row_ptr[mb]] on the host, already validated.
PatternTranspose transpose_pattern(const int32_t* row_ptr, const int32_t* col_idx, int64_t mb, int64_t kb);

}  // namespace sparsek
