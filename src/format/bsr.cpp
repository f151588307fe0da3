// The owning BSR matrix and the host conversions: dense, CSR, COO, transpose,
// Blocked-ELL. Every builder ends in the BsrMatrix constructor, so every result is validated.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/format_internal.hpp"
#include "kernels/quant/rule.hpp"
#include "sparsek/bsr.hpp"
#include "sparsek/quantize.hpp"

namespace sparsek {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }
std::string s(int64_t v) { return std::to_string(v); }

// Builds a BSR matrix from scalar triplets whose indices are already range-checked: every block
// touched by an entry is stored, duplicates are summed (in double, rounded once to dtype).
BsrMatrix from_triplets(int64_t rows, int64_t cols, int bm, int bk, DType dtype, const std::vector<int32_t>& ri,
                        const std::vector<int32_t>& ci, const std::vector<float>& vals) {
  // e4m3 needs a scale per block, which needs the whole block: build in f32, then quantize.
  if (dtype == DType::e4m3) return quantize_e4m3(from_triplets(rows, cols, bm, bk, DType::f32, ri, ci, vals));
  const int64_t mb = rows / bm, kb = cols / bk;
  // Distinct block keys (block row major), sorted: gives row_ptr and sorted col_idx directly.
  std::vector<int64_t> keys(ri.size());
  for (size_t e = 0; e < ri.size(); ++e) keys[e] = int64_t(ri[e] / bm) * kb + ci[e] / bk;
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  if (int64_t(keys.size()) > INT32_MAX) bad("nnzb=" + s(int64_t(keys.size())) + " overflows int32 indices");
  std::vector<int32_t> row_ptr(size_t(mb + 1), 0), col_idx(keys.size());
  for (size_t b = 0; b < keys.size(); ++b) {
    row_ptr[size_t(keys[b] / kb) + 1]++;
    col_idx[b] = int32_t(keys[b] % kb);
  }
  for (int64_t i = 0; i < mb; ++i) row_ptr[size_t(i + 1)] += row_ptr[size_t(i)];
  BsrMatrix m(rows, cols, bm, bk, std::move(row_ptr), std::move(col_idx), dtype);
  // acc: [nnzb][bm][bk]
  std::vector<double> acc(keys.size() * size_t(bm) * size_t(bk), 0.0);
  for (size_t e = 0; e < ri.size(); ++e) {
    int64_t key = int64_t(ri[e] / bm) * kb + ci[e] / bk;
    int64_t b = std::lower_bound(keys.begin(), keys.end(), key) - keys.begin();
    acc[(size_t(b) * bm + size_t(ri[e] % bm)) * bk + size_t(ci[e] % bk)] += double(vals[e]);
  }
  void* out = m.value_bytes().data();
  for (size_t i = 0; i < acc.size(); ++i) store_from_float(out, dtype, int64_t(i), float(acc[i]));
  return m;
}

// Uniform random bits -> exact values. Hand-rolled (not std::uniform_*_distribution) so that the
// numbers are the same with every standard library, not just the one we built with.
float uniform_pm1(uint64_t bits) {  // [-1, 1): 24 random bits, exact in float
  return float(int64_t(bits >> 40)) * (1.0f / 8388608.0f) - 1.0f;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// BsrMatrix

BsrMatrix::BsrMatrix(int64_t rows, int64_t cols, int bm, int bk, std::vector<int32_t> row_ptr,
                     std::vector<int32_t> col_idx, DType dtype)
    : rows_(rows), cols_(cols), bm_(bm), bk_(bk), row_ptr_(std::move(row_ptr)), col_idx_(std::move(col_idx)),
      dtype_(dtype) {
  // Cheap checks first (they make mb() meaningful), then the sizes, then the O(nnzb) checks.
  // Values are allocated only once the shape is known to be sane; until then a placeholder
  // pointer stands in for them (validate never reads values). e4m3 scales (one per entry of
  // col_idx, which exists already) start at 1.
  if (dtype_ == DType::e4m3) scales_.assign(col_idx_.size(), 1.f);
  BsrView v = view();
  if (v.nnzb > 0) v.values = col_idx_.data();
  validate(v, /*check_indices=*/false);
  if (int64_t(row_ptr_.size()) != mb() + 1)
    bad("row_ptr has " + s(int64_t(row_ptr_.size())) + " entries but needs mb+1=" + s(mb() + 1) +
        " (rows=" + s(rows) + ", bm=" + s(bm) + ")");
  validate(v, /*check_indices=*/true);
  values_.assign(size_t(nnzb()) * size_t(bm_) * size_t(bk_) * dtype_size(dtype_), 0);
}

double BsrMatrix::density() const {
  const int64_t all = mb() * kb();
  return all > 0 ? double(nnzb()) / double(all) : 0.0;
}

namespace {
int64_t element_index(const BsrMatrix& m, int64_t block, int r, int c) {
  if (block < 0 || block >= m.nnzb() || r < 0 || r >= m.bm() || c < 0 || c >= m.bk())
    bad("element (block=" + s(block) + ", r=" + s(r) + ", c=" + s(c) + ") is outside " + s(m.nnzb()) +
        " blocks of " + s(m.bm()) + "x" + s(m.bk()));
  return (block * m.bm() + r) * m.bk() + c;
}
}  // namespace

float BsrMatrix::value(int64_t block, int r, int c) const {
  const int64_t e = element_index(*this, block, r, c);
  if (dtype_ == DType::e4m3) return quant::value_of(values_[size_t(e)], scales_[size_t(block)]);
  return load_as_float(values_.data(), dtype_, e);
}

void BsrMatrix::set_value(int64_t block, int r, int c, float v) {
  const int64_t e = element_index(*this, block, r, c);
  if (dtype_ == DType::e4m3) {
    const float sc = scales_[size_t(block)];
    if (sc == 0.f && v != 0.f)
      bad("set_value: block " + s(block) + " has scale 0, so it holds only zeros (got " + std::to_string(v) +
          "): set scales()[" + s(block) + "] first, or build the matrix with quantize_e4m3");
    values_[size_t(e)] = quant::code_of(v, sc);
    return;
  }
  store_from_float(values_.data(), dtype_, e, v);
}

BsrView BsrMatrix::view() {
  BsrView v;
  v.rows = rows_;
  v.cols = cols_;
  v.bm = bm_;
  v.bk = bk_;
  v.nnzb = nnzb();
  v.row_ptr = row_ptr_.data();
  v.col_idx = col_idx_.empty() ? nullptr : col_idx_.data();
  v.values = values_.empty() ? nullptr : values_.data();
  v.dtype = dtype_;
  v.memory = Memory::host;
  v.scales = scales_.empty() ? nullptr : scales_.data();
  return v;
}

BsrView BsrMatrix::view() const { return const_cast<BsrMatrix*>(this)->view(); }

void BsrMatrix::fill_random(uint64_t seed, bool integers) {
  std::mt19937_64 rng(seed);
  std::fill(scales_.begin(), scales_.end(), 1.f);  // e4m3: the codes are the values
  const int64_t n = nnzb() * bm_ * bk_;
  void* p = values_.data();
  for (int64_t i = 0; i < n; ++i) {
    // rng() % 9 has a bias of ~1e-18: irrelevant for test data.
    float v = integers ? float(int64_t(rng() % 9) - 4) : uniform_pm1(rng());
    store_from_float(p, dtype_, i, v);
  }
}

// ---------------------------------------------------------------------------------------------
// Dense <-> BSR

BsrMatrix bsr_from_dense(const float* dense, int64_t rows, int64_t cols, int bm, int bk, DType dtype,
                         const uint8_t* mask) {
  validate_shape(rows, cols, bm, bk, dtype);
  if (dtype == DType::e4m3) return quantize_e4m3(bsr_from_dense(dense, rows, cols, bm, bk, DType::f32, mask));
  if (!dense && rows > 0 && cols > 0) bad("dense is null for a " + s(rows) + "x" + s(cols) + " matrix");
  const int64_t mb = rows / bm, kb = cols / bk;
  std::vector<int32_t> row_ptr(size_t(mb + 1), 0), col_idx;
  for (int64_t i = 0; i < mb; ++i) {
    for (int64_t j = 0; j < kb; ++j) {
      bool keep;
      if (mask) {
        keep = mask[i * kb + j] != 0;
      } else {
        keep = false;  // any element that is not exactly zero (NaN included) keeps the block
        for (int r = 0; r < bm && !keep; ++r) {
          const float* row = dense + (i * bm + r) * cols + j * bk;
          for (int c = 0; c < bk; ++c)
            if (row[c] != 0.f) { keep = true; break; }
        }
      }
      if (keep) col_idx.push_back(int32_t(j));
    }
    row_ptr[size_t(i + 1)] = int32_t(col_idx.size());
  }
  BsrMatrix m(rows, cols, bm, bk, std::move(row_ptr), std::move(col_idx), dtype);
  void* out = m.value_bytes().data();
  for (int64_t i = 0; i < mb; ++i)
    for (int32_t b = m.row_ptr()[size_t(i)]; b < m.row_ptr()[size_t(i + 1)]; ++b) {
      const int64_t j = m.col_idx()[size_t(b)];
      for (int r = 0; r < bm; ++r)
        for (int c = 0; c < bk; ++c)
          store_from_float(out, dtype, (int64_t(b) * bm + r) * bk + c, dense[(i * bm + r) * cols + j * bk + c]);
    }
  return m;
}

std::vector<float> bsr_to_dense(const BsrMatrix& a) {
  std::vector<float> d(size_t(a.rows() * a.cols()), 0.f);
  const int bm = a.bm(), bk = a.bk();
  const void* v = a.value_bytes().data();
  for (int64_t i = 0; i < a.mb(); ++i)
    for (int32_t b = a.row_ptr()[size_t(i)]; b < a.row_ptr()[size_t(i + 1)]; ++b) {
      const int64_t j = a.col_idx()[size_t(b)];
      for (int r = 0; r < bm; ++r)
        for (int c = 0; c < bk; ++c)
          d[size_t((i * bm + r) * a.cols() + j * bk + c)] =
              a.dtype() == DType::e4m3
                  ? quant::value_of(a.value_bytes()[size_t((int64_t(b) * bm + r) * bk + c)], a.scales()[size_t(b)])
                  : load_as_float(v, a.dtype(), (int64_t(b) * bm + r) * bk + c);
    }
  return d;
}

// ---------------------------------------------------------------------------------------------
// CSR / COO -> BSR

BsrMatrix bsr_from_csr(int64_t rows, int64_t cols, const std::vector<int32_t>& row_ptr,
                       const std::vector<int32_t>& col_idx, const std::vector<float>& vals, int bm, int bk,
                       DType dtype) {
  validate_shape(rows, cols, bm, bk, dtype);
  if (int64_t(row_ptr.size()) != rows + 1)
    bad("CSR row_ptr has " + s(int64_t(row_ptr.size())) + " entries but needs rows+1=" + s(rows + 1));
  if (vals.size() != col_idx.size())
    bad("CSR vals has " + s(int64_t(vals.size())) + " entries but col_idx has " + s(int64_t(col_idx.size())));
  const int64_t nnz = int64_t(col_idx.size());
  if (row_ptr[0] != 0) bad("CSR row_ptr[0] must be 0, got " + s(row_ptr[0]));
  for (int64_t i = 1; i <= rows; ++i)
    if (row_ptr[size_t(i)] < row_ptr[size_t(i - 1)])
      bad("CSR row_ptr must be non-decreasing: row_ptr[" + s(i) + "]=" + s(row_ptr[size_t(i)]) + " < row_ptr[" +
          s(i - 1) + "]=" + s(row_ptr[size_t(i - 1)]));
  if (row_ptr[size_t(rows)] != nnz)
    bad("CSR row_ptr[" + s(rows) + "] must equal nnz=" + s(nnz) + " (the length of col_idx), got " +
        s(row_ptr[size_t(rows)]));
  std::vector<int32_t> ri(static_cast<size_t>(nnz));
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t e = row_ptr[size_t(r)]; e < row_ptr[size_t(r + 1)]; ++e) {
      const int32_t c = col_idx[size_t(e)];
      if (c < 0 || c >= cols)
        bad("CSR col_idx[" + s(e) + "]=" + s(c) + " is out of range [0, " + s(cols) + ") (row " + s(r) + ")");
      ri[size_t(e)] = int32_t(r);
    }
  return from_triplets(rows, cols, bm, bk, dtype, ri, col_idx, vals);
}

BsrMatrix bsr_from_coo(int64_t rows, int64_t cols, const std::vector<int32_t>& row_idx,
                       const std::vector<int32_t>& col_idx, const std::vector<float>& vals, int bm, int bk,
                       DType dtype) {
  validate_shape(rows, cols, bm, bk, dtype);
  if (row_idx.size() != col_idx.size() || vals.size() != col_idx.size())
    bad("COO arrays differ in length: row_idx has " + s(int64_t(row_idx.size())) + ", col_idx " +
        s(int64_t(col_idx.size())) + ", vals " + s(int64_t(vals.size())) + " entries");
  for (size_t e = 0; e < row_idx.size(); ++e) {
    if (row_idx[e] < 0 || row_idx[e] >= rows)
      bad("COO row_idx[" + s(int64_t(e)) + "]=" + s(row_idx[e]) + " is out of range [0, " + s(rows) + ")");
    if (col_idx[e] < 0 || col_idx[e] >= cols)
      bad("COO col_idx[" + s(int64_t(e)) + "]=" + s(col_idx[e]) + " is out of range [0, " + s(cols) + ")");
  }
  return from_triplets(rows, cols, bm, bk, dtype, row_idx, col_idx, vals);
}

// ---------------------------------------------------------------------------------------------
// Transpose: block (i, j) of A is block (j, i) of A^T, its bm x bk values transposed to bk x bm.

PatternTranspose transpose_pattern(const int32_t* row_ptr, const int32_t* col_idx, int64_t mb, int64_t kb) {
  const int64_t nnzb = row_ptr[mb];
  PatternTranspose t;
  t.row_ptr.assign(size_t(kb + 1), 0);
  t.col_idx.resize(size_t(nnzb));
  t.src.resize(size_t(nnzb));
  for (int64_t j = 0; j < nnzb; ++j) t.row_ptr[size_t(col_idx[j]) + 1]++;
  for (int64_t c = 0; c < kb; ++c) t.row_ptr[size_t(c + 1)] += t.row_ptr[size_t(c)];
  std::vector<int32_t> next(t.row_ptr.begin(), t.row_ptr.end() - 1);
  for (int64_t i = 0; i < mb; ++i)
    for (int32_t j = row_ptr[i]; j < row_ptr[i + 1]; ++j) {
      const int32_t pos = next[size_t(col_idx[j])]++;
      t.col_idx[size_t(pos)] = int32_t(i);
      t.src[size_t(pos)] = j;
    }
  return t;
}

BsrMatrix bsr_transpose(const BsrMatrix& a) {
  const int64_t nnzb = a.nnzb();
  const int bm = a.bm(), bk = a.bk();
  PatternTranspose pt = transpose_pattern(a.row_ptr().data(), a.col_idx().data(), a.mb(), a.kb());
  const std::vector<int32_t> src = std::move(pt.src);
  BsrMatrix t(a.cols(), a.rows(), bk, bm, std::move(pt.row_ptr), std::move(pt.col_idx), a.dtype());
  // Copy element bytes (no float round trip: bit-exact, NaN payloads included).
  const size_t es = dtype_size(a.dtype());
  const uint8_t* in = a.value_bytes().data();
  uint8_t* out = t.value_bytes().data();
  for (int64_t p = 0; p < nnzb; ++p) {
    const uint8_t* sb = in + size_t(src[size_t(p)]) * bm * bk * es;  // [bm][bk]
    uint8_t* db = out + size_t(p) * bm * bk * es;                      // [bk][bm]
    for (int r = 0; r < bm; ++r)
      for (int c = 0; c < bk; ++c) std::memcpy(db + (size_t(c) * bm + r) * es, sb + (size_t(r) * bk + c) * es, es);
    if (a.dtype() == DType::e4m3) t.scales()[size_t(p)] = a.scales()[size_t(src[size_t(p)])];
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Blocked-ELL

namespace {
void no_ell_scales(DType d) {
  if (d == DType::e4m3)
    bad("Blocked-ELL holds no block scales, so it takes f32, f16 or bf16 values, not e4m3 (dequantize first)");
}
}  // namespace

BlockedEll bsr_to_blocked_ell(const BsrMatrix& a) {
  no_ell_scales(a.dtype());
  BlockedEll e;
  e.rows = a.rows();
  e.cols = a.cols();
  e.bm = a.bm();
  e.bk = a.bk();
  e.dtype = a.dtype();
  const int64_t mb = a.mb();
  for (int64_t i = 0; i < mb; ++i)
    e.ell_cols = std::max<int64_t>(e.ell_cols, a.row_ptr()[size_t(i + 1)] - a.row_ptr()[size_t(i)]);
  const size_t block_bytes = size_t(a.bm()) * a.bk() * dtype_size(a.dtype());
  e.col_idx.assign(size_t(mb * e.ell_cols), -1);
  e.values.assign(size_t(mb * e.ell_cols) * block_bytes, 0);
  for (int64_t i = 0; i < mb; ++i)
    for (int32_t b = a.row_ptr()[size_t(i)]; b < a.row_ptr()[size_t(i + 1)]; ++b) {
      const size_t slot = size_t(i * e.ell_cols + (b - a.row_ptr()[size_t(i)]));
      e.col_idx[slot] = a.col_idx()[size_t(b)];
      std::memcpy(e.values.data() + slot * block_bytes, a.value_bytes().data() + size_t(b) * block_bytes, block_bytes);
    }
  return e;
}

BsrMatrix bsr_from_blocked_ell(const BlockedEll& e) {
  validate_shape(e.rows, e.cols, e.bm, e.bk, e.dtype);
  no_ell_scales(e.dtype);
  const int64_t mb = e.rows / e.bm, kb = e.cols / e.bk;
  if (e.ell_cols < 0) bad("ell_cols=" + s(e.ell_cols) + " is negative");
  if (int64_t(e.col_idx.size()) != mb * e.ell_cols)
    bad("Blocked-ELL col_idx has " + s(int64_t(e.col_idx.size())) + " entries but needs mb*ell_cols=" +
        s(mb * e.ell_cols));
  const size_t block_bytes = size_t(e.bm) * e.bk * dtype_size(e.dtype);
  if (e.values.size() != e.col_idx.size() * block_bytes)
    bad("Blocked-ELL values has " + s(int64_t(e.values.size())) + " bytes but needs " +
        s(int64_t(e.col_idx.size() * block_bytes)) + " (mb*ell_cols*bm*bk*" + s(int64_t(dtype_size(e.dtype))) + ")");
  // Slots may come in any order; padding (-1) may sit anywhere. Sort the real ones per row.
  std::vector<int32_t> row_ptr(size_t(mb + 1), 0), col_idx;
  std::vector<int64_t> src;  // slot of each kept block
  std::vector<std::pair<int32_t, int64_t>> row;  // (col, slot)
  for (int64_t i = 0; i < mb; ++i) {
    row.clear();
    for (int64_t k = 0; k < e.ell_cols; ++k) {
      const int64_t slot = i * e.ell_cols + k;
      const int32_t c = e.col_idx[size_t(slot)];
      if (c == -1) continue;
      if (c < 0 || c >= kb)
        bad("Blocked-ELL col_idx[" + s(slot) + "]=" + s(c) + " is out of range [0, " + s(kb) +
            ") and not -1 (padding) (block row " + s(i) + ")");
      row.emplace_back(c, slot);
    }
    std::sort(row.begin(), row.end());
    for (size_t k = 1; k < row.size(); ++k)
      if (row[k].first == row[k - 1].first)
        bad("Blocked-ELL col_idx[" + s(std::max(row[k].second, row[k - 1].second)) + "]=" + s(row[k].first) +
            " repeats a column of block row " + s(i));
    for (auto& p : row) {
      col_idx.push_back(p.first);
      src.push_back(p.second);
    }
    row_ptr[size_t(i + 1)] = int32_t(col_idx.size());
  }
  BsrMatrix m(e.rows, e.cols, e.bm, e.bk, std::move(row_ptr), std::move(col_idx), e.dtype);
  for (size_t b = 0; b < src.size(); ++b)
    std::memcpy(m.value_bytes().data() + b * block_bytes, e.values.data() + size_t(src[b]) * block_bytes, block_bytes);
  return m;
}

}  // namespace sparsek
