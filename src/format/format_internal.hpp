// Internal: pattern work that several layers share (the BSR transpose, the CPU backend, the
// portable kernel's DDS / op(A) = A^T path).
#pragma once
#include <cstdint>
#include <vector>

namespace sparsek {

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
