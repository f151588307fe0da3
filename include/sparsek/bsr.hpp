// sparsek — block-sparse (BSR) and dense operand descriptions, conversions, validation and
// pattern generators.
//
// BSR layout: row_ptr int32[mb+1], col_idx int32[nnzb], values[nnzb][bm][bk], each
// block row-major. rows = mb*bm, cols = kb*bk.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sparsek/types.hpp"

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

// Non-owning view of a BSR matrix (host or device pointers). values may be written through when
// the matrix is an output (SDD).
//
// e4m3 values carry one fp32 scale per stored block: `scales` points to nnzb floats, in the same
// memory (host or device) as the values, and element (r, c) of block j stands for
// scales[j] * e4m3_to_float(values[j][r][c]). Scales must be finite and >= 0 (0: an all-zero
// block). Values of any other dtype carry no scales (`scales` must be null).
struct BsrView {
  int64_t rows = 0, cols = 0;  // full matrix shape
  int bm = 0, bk = 0;          // block shape
  int64_t nnzb = 0;            // number of stored blocks
  const int32_t* row_ptr = nullptr;
  const int32_t* col_idx = nullptr;
  void* values = nullptr;
  DType dtype = DType::f32;
  Memory memory = Memory::host;
  const float* scales = nullptr;  // e4m3 only: [nnzb], one per stored block (see above)

  int64_t mb() const { return bm ? rows / bm : 0; }
  int64_t kb() const { return bk ? cols / bk : 0; }
};

// Non-owning view of a dense matrix of `rows x cols` as stored (before any op), with leading
// dimension ld (row-major: elements between rows; column-major: between columns).
//
// An e4m3 dense input carries fp32 scales along its non-reduction dimension, one per token:
//   the A of a DDS (M x K): one scale per row, index m;  the B of a DSD (K x N): one per column, n.
// scale_group = 0: one scale per token, `scales` holds [M] (or [N]) floats.
// scale_group = 128: one scale per token and per 128-wide group of K as well, `scales` holds
//   [M or N][ceil(K / 128)] floats, row-major: the scale of A(m, k) is scales[m * ceil(K/128) + k/128].
// Element value = scale * e4m3_to_float(element). Scales live in the same memory as `data`, are
// finite and >= 0. Other dtypes carry no scales (`scales` null, scale_group 0); an output never has
// any.
struct DenseView {
  void* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  Layout layout = Layout::row_major;
  DType dtype = DType::f32;
  Memory memory = Memory::host;
  const float* scales = nullptr;  // e4m3 only: per token (see above)
  int scale_group = 0;            // 0 or 128: the scales' group width along K (see above)

  int64_t index(int64_t r, int64_t c) const {
    return layout == Layout::row_major ? r * ld + c : c * ld + r;
  }
};

// Owning host BSR matrix. Values are stored in `dtype` as raw bytes; an e4m3 matrix also owns
// its block scales (one per stored block, 1 in a new matrix), which view() passes on.
class BsrMatrix {
 public:
  BsrMatrix() = default;
  // An all-structure constructor; validates (throws sparsek::Error on bad input).
  BsrMatrix(int64_t rows, int64_t cols, int bm, int bk, std::vector<int32_t> row_ptr,
            std::vector<int32_t> col_idx, DType dtype);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int bm() const { return bm_; }
  int bk() const { return bk_; }
  int64_t mb() const { return bm_ ? rows_ / bm_ : 0; }
  int64_t kb() const { return bk_ ? cols_ / bk_ : 0; }
  int64_t nnzb() const { return int64_t(col_idx_.size()); }
  DType dtype() const { return dtype_; }
  double density() const;  // stored blocks / all blocks

  const std::vector<int32_t>& row_ptr() const { return row_ptr_; }
  const std::vector<int32_t>& col_idx() const { return col_idx_; }
  std::vector<uint8_t>& value_bytes() { return values_; }
  const std::vector<uint8_t>& value_bytes() const { return values_; }
  // e4m3: the block scales, [nnzb] (empty for other dtypes).
  std::vector<float>& scales() { return scales_; }
  const std::vector<float>& scales() const { return scales_; }
  // Element (r, c) of stored block `block` (e4m3: its scale times the decoded value).
  float value(int64_t block, int r, int c) const;
  // e4m3: stores v / the block's scale, rounded to e4m3 (saturating); a block whose scale is 0
  // takes only zeros (anything else throws: give the block a scale first, or use quantize_e4m3).
  void set_value(int64_t block, int r, int c, float v);

  BsrView view();
  BsrView view() const;  // values pointer is const-cast; do not write through it

  // Fill values with uniform random numbers in [-1, 1) (or random integers in [-4, 4] when
  // `integers`, so that products can be compared exactly), seeded. e4m3: the codes of those
  // numbers (rounded to e4m3; integers in [-4, 4] are exact), with every block scale set to 1.
  void fill_random(uint64_t seed, bool integers = false);

 private:
  int64_t rows_ = 0, cols_ = 0;
  int bm_ = 0, bk_ = 0;
  std::vector<int32_t> row_ptr_{0}, col_idx_;
  std::vector<uint8_t> values_;
  std::vector<float> scales_;  // e4m3 only: [nnzb]
  DType dtype_ = DType::f32;
};

// ---- validation. Throws Error(invalid_argument) naming the array, the first offending
// index and its value. `check_indices` runs the O(nnzb) checks (host memory only: for device
// memory the indices are copied to the host first by the caller).
void validate(const BsrView& a, bool check_indices = true);
void validate(const DenseView& d, const char* name);
// The shape checks alone (dtype, block shape, non-negative dims divisible by it), with validate()'s
// messages: for builders that have no arrays yet.
void validate_shape(int64_t rows, int64_t cols, int bm, int bk, DType dtype = DType::f32);

// ---- conversions (all on the host) ----
// The builders below that take a dtype accept e4m3 too: the values are quantized per stored block
// (quantize_e4m3 in quantize.hpp). Blocked-ELL has no scales: it takes f32, f16 and bf16 only.
//
// Dense (rows x cols, row-major float) -> BSR. With `mask` (mb*kb bytes, row-major over block
// positions) keep exactly the masked blocks; without, keep blocks holding any non-zero.
BsrMatrix bsr_from_dense(const float* dense, int64_t rows, int64_t cols, int bm, int bk, DType dtype,
                         const uint8_t* mask = nullptr);
std::vector<float> bsr_to_dense(const BsrMatrix& a);  // row-major rows x cols (e4m3: scaled)
// CSR / COO of a scalar matrix -> BSR (blocks touched by any entry are stored; duplicates summed).
BsrMatrix bsr_from_csr(int64_t rows, int64_t cols, const std::vector<int32_t>& row_ptr,
                       const std::vector<int32_t>& col_idx, const std::vector<float>& vals, int bm,
                       int bk, DType dtype);
BsrMatrix bsr_from_coo(int64_t rows, int64_t cols, const std::vector<int32_t>& row_idx,
                       const std::vector<int32_t>& col_idx, const std::vector<float>& vals, int bm,
                       int bk, DType dtype);
BsrMatrix bsr_transpose(const BsrMatrix& a);  // BSR of A^T: block shape (bk, bm); scales follow their blocks

// Blocked-ELL (cuSPARSE's): every block row holds `ell_cols` slots; col index -1 marks padding.
// Block shape must be square for cuSPARSE, but the format itself does not need it.
struct BlockedEll {
  int64_t rows = 0, cols = 0;
  int bm = 0, bk = 0;
  int64_t ell_cols = 0;              // slots per block row
  std::vector<int32_t> col_idx;      // [mb][ell_cols], -1 = empty slot
  std::vector<uint8_t> values;       // [mb][ell_cols][bm][bk] in `dtype`, padding zeros
  DType dtype = DType::f32;
};
BlockedEll bsr_to_blocked_ell(const BsrMatrix& a);
BsrMatrix bsr_from_blocked_ell(const BlockedEll& e);  // padding slots dropped

// ---- pattern generators. All seeded and reproducible. Return row_ptr/col_idx. ----
struct Pattern {
  int64_t mb = 0, kb = 0;
  std::vector<int32_t> row_ptr, col_idx;
  int64_t nnzb() const { return int64_t(col_idx.size()); }
};
enum class PatternKind { fixed_k, bernoulli, power_law, banded, block_diagonal, causal };
const char* to_string(PatternKind k);
PatternKind pattern_kind_from_string(const std::string& s);  // throws invalid_argument

// `density` in (0, 1] is the target fraction of stored blocks. fixed_k: round(density*kb) blocks
// in every row (at least 1); bernoulli: each block independently; power_law: row lengths follow a
// Zipf-like law with the same expected nnzb; banded: a diagonal band of that width;
// block_diagonal: square-ish diagonal groups (MoE experts); causal: lower triangle (density ignored
// beyond choosing nothing: every block with col <= row * kb / mb is kept).
Pattern make_pattern(PatternKind kind, int64_t mb, int64_t kb, double density, uint64_t seed);

// Convenience: a random BSR of the given pattern, values filled by fill_random(seed).
BsrMatrix random_bsr(PatternKind kind, int64_t rows, int64_t cols, int bm, int bk, double density,
                     DType dtype, uint64_t seed, bool integers = false);

}  // namespace sparsek
#pragma GCC visibility pop
