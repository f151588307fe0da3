// Internal: pattern work that several layers share (the BSR transpose, the CPU backend, the
// portable kernel's DDS / op(A) = A^T path), the byte ranges the aliasing checks compare, a
// product's validation beyond the public validate(), and index arrays read on the host.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"

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

// ---- a product's validation (validate.cpp) ----

// The enum fields of g's kind, op and used operands are in range (else Error naming the field
// and the number): what must hold before any message prints one by name.
void check_enums(const GemmArgs& g);

// validate(g) but for the aliasing check: for a problem described with placeholder pointers
// (the tuner's, which runs on operands of its own).
void validate_description(const GemmArgs& g, bool check_indices);

// ---- index arrays read on the host (host_copy.cpp) ----

// Whether work enqueued on `stream` now would be captured into a CUDA graph (an error reads as no,
// except cudaErrorStreamCaptureImplicit: the legacy stream while another stream captures globally).
bool stream_is_capturing(void* stream);

// One device int32 array to copy into *dst (count entries; nothing when src is null or count 0).
// `what` names the copy in an error ("cudaMemcpy(row_ptr to host)").
struct HostCopy {
  const int32_t* src;
  int64_t count;
  std::vector<int32_t>* dst;
  const char* what;
};
// The one way device index arrays (a BSR pattern, an attention layout) reach the host. Refuses
// with Error(invalid_argument, capture_refusal) when `stream` is being captured into a CUDA graph:
// the copies synchronize, which a capture cannot contain (CUDA would invalidate the whole capture),
// so nothing is touched. Then waits for `stream` (a cudaStream_t, may be null): the caller may have
// written the arrays there, and the copies run on the legacy default stream, which does not order
// itself after non-blocking streams. A failed CUDA call is cleared before it is thrown (it must not
// surface again at the caller's next CUDA call).
void copy_to_host(void* stream, const char* capture_refusal, std::initializer_list<HostCopy> copies);

// The sparse operand's pattern, readable on the host: a view of host memory, or a copy of
// device memory.
struct HostPattern {
  const int32_t* row_ptr = nullptr;  // [mb + 1]
  const int32_t* col_idx = nullptr;  // [nnzb] (nullptr when not fetched or nnzb = 0)
  std::vector<int32_t> row_ptr_copy, col_idx_copy;
};
// s passed the cheap checks. Device memory is copied through copy_to_host() (synchronously,
// after `stream`); col_idx only when asked.
HostPattern host_pattern(const BsrView& s, bool with_col_idx = true, void* stream = nullptr);

// The O(nnzb) index checks of g's sparse operand read through hp; errors name the operand. With
// check_scales, also the values of e4m3 scales (the sparse operand's and the dense input's: finite,
// >= 0; device arrays are copied to the host), which change with the values: the tuner, which runs
// on operands of its own, leaves them out.
void validate_pattern(const GemmArgs& g, const HostPattern& hp, bool check_scales = true);

// The pattern of s's transpose (transpose_pattern) read through host_pattern(). The indices are
// range-checked first, cheaply: a kernel's set-up must not write out of bounds on a pattern that
// skipped the O(nnzb) validation (Options::check_indices = false).
PatternTranspose transposed_pattern(const BsrView& s);

}  // namespace sparsek
