// BSR building and conversions (dense, CSR, COO, transpose, Blocked-ELL) and the pattern
// generators.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "sparsek/bsr.hpp"
#include "test_util.hpp"

namespace sparsek {
namespace {

const PatternKind kAllKinds[] = {PatternKind::fixed_k, PatternKind::bernoulli,      PatternKind::power_law,
                                 PatternKind::banded,  PatternKind::block_diagonal, PatternKind::causal};

using test::expect_invalid;

// A rows x cols row-major dense matrix of small non-zero integers (exact in f16/bf16) in which the
// blocks with (i * 7 + j * 3) % 4 == 0 are zero, so that some blocks (and whole block rows, when
// the grid is narrow) are empty.
std::vector<float> blocky_dense(int64_t rows, int64_t cols, int bm, int bk, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> d(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r / bm, j = c / bk;
      const bool zero_block = (i * 7 + j * 3) % 4 == 0;
      d[size_t(r * cols + c)] = zero_block ? 0.f : float(int64_t(rng() % 8) + 1) * ((rng() & 1) ? 1.f : -1.f);
    }
  return d;
}

bool same(const BsrMatrix& a, const BsrMatrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && a.bm() == b.bm() && a.bk() == b.bk() &&
         a.dtype() == b.dtype() && a.row_ptr() == b.row_ptr() && a.col_idx() == b.col_idx() &&
         a.value_bytes() == b.value_bytes();
}

// ---- dense <-> BSR ----

TEST(BsrFormat, DenseRoundTripOverBlockShapesAndDtypes) {
  const std::vector<std::pair<int, int>> shapes = {{16, 16}, {16, 32}, {32, 16}, {64, 128}, {128, 64}, {128, 128}};
  for (auto [bm, bk] : shapes)
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      SCOPED_TRACE(std::to_string(bm) + "x" + std::to_string(bk) + " " + to_string(dt));
      const int64_t rows = bm * 3, cols = bk * 5;
      std::vector<float> d = blocky_dense(rows, cols, bm, bk, 1);
      BsrMatrix a = bsr_from_dense(d.data(), rows, cols, bm, bk, dt);
      EXPECT_EQ(a.mb(), 3);
      EXPECT_EQ(a.kb(), 5);
      // Exactly the non-zero blocks are stored.
      int64_t expect_nnzb = 0;
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 5; ++j) expect_nnzb += (i * 7 + j * 3) % 4 != 0;
      EXPECT_EQ(a.nnzb(), expect_nnzb);
      EXPECT_EQ(bsr_to_dense(a), d);
    }
}

TEST(BsrFormat, FromDenseWithMaskKeepsExactlyTheMaskedBlocks) {
  const int bm = 16, bk = 32;
  const int64_t rows = 32, cols = 64;  // 2x2 grid
  std::vector<float> d = blocky_dense(rows, cols, bm, bk, 2);  // block (0,0) is zero
  const uint8_t mask[4] = {1, 0, 0, 1};  // keeps the zero block (0,0), drops the non-zero (0,1)
  BsrMatrix a = bsr_from_dense(d.data(), rows, cols, bm, bk, DType::f32, mask);
  EXPECT_EQ(a.row_ptr(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(a.col_idx(), (std::vector<int32_t>{0, 1}));
  std::vector<float> back = bsr_to_dense(a);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const bool kept = mask[(r / bm) * 2 + c / bk];
      EXPECT_EQ(back[size_t(r * cols + c)], kept ? d[size_t(r * cols + c)] : 0.f);
    }
}

TEST(BsrFormat, FromDenseKeepsBlockWithSingleNonZeroOrNan) {
  std::vector<float> d(32 * 32, 0.f);
  d[17 * 32 + 3] = 0.5f;                                   // block (1, 0)
  d[5 * 32 + 30] = std::numeric_limits<float>::quiet_NaN();  // block (0, 1)
  BsrMatrix a = bsr_from_dense(d.data(), 32, 32, 16, 16, DType::f32);
  EXPECT_EQ(a.row_ptr(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(a.col_idx(), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(a.value(1, 1, 3), 0.5f);
  EXPECT_TRUE(std::isnan(a.value(0, 5, 14)));
  // All-zero dense: nnzb = 0, and it converts back.
  std::vector<float> z(32 * 32, 0.f);
  BsrMatrix e = bsr_from_dense(z.data(), 32, 32, 16, 16, DType::f16);
  EXPECT_EQ(e.nnzb(), 0);
  EXPECT_EQ(e.density(), 0.0);
  EXPECT_EQ(bsr_to_dense(e), z);
}

TEST(BsrFormat, EmptyShapes) {
  BsrMatrix a = bsr_from_dense(nullptr, 0, 64, 16, 16, DType::f32);
  EXPECT_EQ(a.mb(), 0);
  EXPECT_EQ(a.row_ptr(), (std::vector<int32_t>{0}));
  EXPECT_TRUE(bsr_to_dense(a).empty());
  BsrMatrix t = bsr_transpose(a);
  EXPECT_EQ(t.rows(), 64);
  EXPECT_EQ(t.cols(), 0);
  EXPECT_EQ(t.row_ptr(), std::vector<int32_t>(5, 0));
  BlockedEll e = bsr_to_blocked_ell(t);
  EXPECT_EQ(e.ell_cols, 0);
  EXPECT_TRUE(same(bsr_from_blocked_ell(e), t));
}

TEST(BsrFormat, ValueAccessAndBounds) {
  BsrMatrix a(32, 64, 16, 32, {0, 1, 2}, {1, 0}, DType::bf16);
  EXPECT_EQ(a.value_bytes().size(), size_t(2 * 16 * 32 * 2));
  a.set_value(1, 15, 31, -2.5f);
  EXPECT_EQ(a.value(1, 15, 31), -2.5f);
  EXPECT_EQ(a.value(0, 0, 0), 0.f);  // values start zeroed
  EXPECT_EQ(bsr_to_dense(a)[size_t(31 * 64 + 31)], -2.5f);
  expect_invalid([&] { a.value(2, 0, 0); }, {"block=2"});
  expect_invalid([&] { a.set_value(0, 16, 0, 1.f); }, {"r=16"});
  expect_invalid([&] { a.value(0, 0, -1); }, {"c=-1"});
  EXPECT_DOUBLE_EQ(a.density(), 0.5);
  BsrView v = a.view();
  EXPECT_EQ(v.nnzb, 2);
  EXPECT_EQ(v.bk, 32);
  EXPECT_EQ(v.memory, Memory::host);
  EXPECT_EQ(v.values, static_cast<void*>(a.value_bytes().data()));
}

TEST(BsrFormat, FillRandomIsSeededAndInRange) {
  auto make = [] { return BsrMatrix(64, 64, 32, 32, {0, 2, 3}, {0, 1, 1}, DType::f32); };
  BsrMatrix a = make(), b = make(), c = make();
  a.fill_random(5);
  b.fill_random(5);
  c.fill_random(6);
  EXPECT_EQ(a.value_bytes(), b.value_bytes());
  EXPECT_NE(a.value_bytes(), c.value_bytes());
  float lo = 1, hi = -1;
  for (int64_t blk = 0; blk < a.nnzb(); ++blk)
    for (int r = 0; r < 32; ++r)
      for (int col = 0; col < 32; ++col) {
        float v = a.value(blk, r, col);
        EXPECT_TRUE(v >= -1.f && v < 1.f) << v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  EXPECT_LT(lo, -0.9f);  // spread over the range, not stuck
  EXPECT_GT(hi, 0.9f);
  BsrMatrix i = make();
  i.fill_random(5, /*integers=*/true);
  std::set<float> seen;
  for (int64_t blk = 0; blk < i.nnzb(); ++blk)
    for (int r = 0; r < 32; ++r)
      for (int col = 0; col < 32; ++col) seen.insert(i.value(blk, r, col));
  EXPECT_EQ(seen, (std::set<float>{-4, -3, -2, -1, 0, 1, 2, 3, 4}));
}

TEST(BsrFormat, ConversionArgumentErrors) {
  std::vector<float> d(64 * 64, 1.f);
  expect_invalid([&] { bsr_from_dense(d.data(), 64, 64, 48, 16, DType::f32); }, {"bm=48", "16, 32, 64, 128"});
  expect_invalid([&] { bsr_from_dense(d.data(), 64, 64, 16, 24, DType::f32); }, {"bk=24"});
  expect_invalid([&] { bsr_from_dense(d.data(), 64, 40, 16, 16, DType::f32); }, {"cols=40", "bk=16"});
  expect_invalid([&] { bsr_from_dense(d.data(), -16, 64, 16, 16, DType::f32); }, {"rows=-16", "negative"});
  expect_invalid([&] { bsr_from_dense(nullptr, 64, 64, 16, 16, DType::f32); }, {"dense is null", "64x64"});
  expect_invalid([&] { random_bsr(PatternKind::bernoulli, 64, 64, 16, 12, 0.5, DType::f32, 1); }, {"bk=12"});
  expect_invalid([&] { random_bsr(PatternKind::bernoulli, 60, 64, 16, 16, 0.5, DType::f32, 1); }, {"rows=60"});
}

// ---- transpose ----

TEST(BsrFormat, TransposeMatchesDenseTranspose) {
  for (DType dt : {DType::f32, DType::f16}) {
    const int bm = 16, bk = 64;
    const int64_t rows = 4 * bm, cols = 3 * bk;
    std::vector<float> d = blocky_dense(rows, cols, bm, bk, 3);
    BsrMatrix a = bsr_from_dense(d.data(), rows, cols, bm, bk, dt);
    BsrMatrix t = bsr_transpose(a);
    EXPECT_EQ(t.rows(), cols);
    EXPECT_EQ(t.cols(), rows);
    EXPECT_EQ(t.bm(), bk);
    EXPECT_EQ(t.bk(), bm);
    EXPECT_EQ(t.nnzb(), a.nnzb());
    EXPECT_NO_THROW(validate(t.view()));  // sorted columns, consistent row_ptr
    std::vector<float> td = bsr_to_dense(t);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(td[size_t(c * rows + r)], d[size_t(r * cols + c)]);
  }
}

TEST(BsrFormat, TransposeTwiceIsIdentity) {
  for (PatternKind k : kAllKinds) {
    SCOPED_TRACE(to_string(k));
    BsrMatrix a = random_bsr(k, 128, 256, 32, 16, 0.3, DType::bf16, 11);
    EXPECT_TRUE(same(bsr_transpose(bsr_transpose(a)), a));
  }
}

// ---- Blocked-ELL ----

TEST(BsrFormat, BlockedEllRoundTrip) {
  for (PatternKind k : kAllKinds) {
    SCOPED_TRACE(to_string(k));
    BsrMatrix a = random_bsr(k, 256, 128, 32, 16, 0.25, DType::f16, 12);
    BlockedEll e = bsr_to_blocked_ell(a);
    int64_t max_row = 0;
    for (int64_t i = 0; i < a.mb(); ++i) max_row = std::max<int64_t>(max_row, a.row_ptr()[i + 1] - a.row_ptr()[i]);
    EXPECT_EQ(e.ell_cols, max_row);
    EXPECT_EQ(int64_t(e.col_idx.size()), a.mb() * e.ell_cols);
    EXPECT_EQ(std::count(e.col_idx.begin(), e.col_idx.end(), -1), a.mb() * e.ell_cols - a.nnzb());
    EXPECT_TRUE(same(bsr_from_blocked_ell(e), a));
  }
}

TEST(BsrFormat, BlockedEllPaddingIsZeroAndSlotsMayBeUnsorted) {
  // 2 block rows, 3 slots each; row 0: cols {2, -1, 0}; row 1: {-1, -1, 1}.
  BlockedEll e;
  e.rows = 32;
  e.cols = 48;
  e.bm = e.bk = 16;
  e.ell_cols = 3;
  e.col_idx = {2, -1, 0, -1, -1, 1};
  e.values.assign(6 * 16 * 16 * 4, 0);
  for (int slot = 0; slot < 6; ++slot) store_from_float(e.values.data(), DType::f32, slot * 256, float(slot + 1));
  BsrMatrix a = bsr_from_blocked_ell(e);
  EXPECT_EQ(a.row_ptr(), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(a.col_idx(), (std::vector<int32_t>{0, 2, 1}));
  EXPECT_EQ(a.value(0, 0, 0), 3.f);  // col 0 came from slot 2
  EXPECT_EQ(a.value(1, 0, 0), 1.f);
  EXPECT_EQ(a.value(2, 0, 0), 6.f);
  // Back to ELL: sorted slots, padding last with col -1 and zero values.
  BlockedEll f = bsr_to_blocked_ell(a);
  EXPECT_EQ(f.ell_cols, 2);
  EXPECT_EQ(f.col_idx, (std::vector<int32_t>{0, 2, 1, -1}));
  EXPECT_TRUE(std::all_of(f.values.begin() + 3 * 1024, f.values.end(), [](uint8_t b) { return b == 0; }));
}

TEST(BsrFormat, BlockedEllErrors) {
  BlockedEll e;
  e.rows = 32;
  e.cols = 32;
  e.bm = e.bk = 16;
  e.ell_cols = 2;
  e.col_idx = {0, 1, 1, 1};
  e.values.assign(4 * 256 * 4, 0);
  expect_invalid([&] { bsr_from_blocked_ell(e); }, {"col_idx[3]=1", "repeats", "block row 1"});
  e.col_idx = {0, 2, -1, -1};
  expect_invalid([&] { bsr_from_blocked_ell(e); }, {"col_idx[1]=2", "out of range"});
  e.col_idx = {0, -2, -1, -1};
  expect_invalid([&] { bsr_from_blocked_ell(e); }, {"col_idx[1]=-2"});
  e.col_idx = {0, 1, -1};
  expect_invalid([&] { bsr_from_blocked_ell(e); }, {"col_idx has 3 entries", "mb*ell_cols=4"});
  e.col_idx = {0, 1, -1, -1};
  e.values.resize(100);
  expect_invalid([&] { bsr_from_blocked_ell(e); }, {"values has 100 bytes"});
}

// ---- CSR / COO ----

// Scalar CSR of a dense row-major matrix (entries that are not zero, columns in order).
void dense_to_csr(const std::vector<float>& d, int64_t rows, int64_t cols, std::vector<int32_t>& rp,
                  std::vector<int32_t>& ci, std::vector<float>& v) {
  rp.assign(1, 0);
  ci.clear();
  v.clear();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      if (d[size_t(r * cols + c)] != 0.f) {
        ci.push_back(int32_t(c));
        v.push_back(d[size_t(r * cols + c)]);
      }
    rp.push_back(int32_t(ci.size()));
  }
}

TEST(BsrFormat, CsrEqualsFromDense) {
  const int bm = 32, bk = 16;
  const int64_t rows = 4 * bm, cols = 6 * bk;
  std::vector<float> d = blocky_dense(rows, cols, bm, bk, 4);
  std::vector<int32_t> rp, ci;
  std::vector<float> v;
  dense_to_csr(d, rows, cols, rp, ci, v);
  for (DType dt : {DType::f32, DType::bf16})
    EXPECT_TRUE(same(bsr_from_csr(rows, cols, rp, ci, v, bm, bk, dt), bsr_from_dense(d.data(), rows, cols, bm, bk, dt)));
  // Columns within a CSR row need not be sorted.
  std::reverse(ci.begin() + rp[1], ci.begin() + rp[2]);
  std::reverse(v.begin() + rp[1], v.begin() + rp[2]);
  EXPECT_TRUE(same(bsr_from_csr(rows, cols, rp, ci, v, bm, bk, DType::f32),
                   bsr_from_dense(d.data(), rows, cols, bm, bk, DType::f32)));
}

TEST(BsrFormat, CooShuffledEqualsFromDenseAndSumsDuplicates) {
  const int bm = 16, bk = 16;
  const int64_t rows = 5 * bm, cols = 3 * bk;
  std::vector<float> d = blocky_dense(rows, cols, bm, bk, 5);
  std::vector<std::tuple<int32_t, int32_t, float>> entries;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float x = d[size_t(r * cols + c)];
      if (x == 0.f) continue;
      if (x == 2.f) {  // split into duplicates 1.5 + 0.5: must be summed back
        entries.emplace_back(int32_t(r), int32_t(c), 1.5f);
        entries.emplace_back(int32_t(r), int32_t(c), 0.5f);
      } else {
        entries.emplace_back(int32_t(r), int32_t(c), x);
      }
    }
  std::shuffle(entries.begin(), entries.end(), std::mt19937_64(9));
  std::vector<int32_t> ri, ci;
  std::vector<float> v;
  for (auto& [r, c, x] : entries) {
    ri.push_back(r);
    ci.push_back(c);
    v.push_back(x);
  }
  EXPECT_TRUE(same(bsr_from_coo(rows, cols, ri, ci, v, bm, bk, DType::f16),
                   bsr_from_dense(d.data(), rows, cols, bm, bk, DType::f16)));
  // An explicit zero entry still stores its block (structure, not values, decides).
  BsrMatrix z = bsr_from_coo(32, 32, {20}, {3}, {0.f}, 16, 16, DType::f32);
  EXPECT_EQ(z.row_ptr(), (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(z.col_idx(), (std::vector<int32_t>{0}));
}

TEST(BsrFormat, CsrErrors) {
  // 32x32 scalar matrix, one entry per row would need 33 row_ptr entries.
  std::vector<int32_t> rp(33, 0), ci;
  std::vector<float> v;
  expect_invalid([&] { bsr_from_csr(32, 32, std::vector<int32_t>(32, 0), ci, v, 16, 16, DType::f32); },
                 {"row_ptr has 32 entries", "rows+1=33"});
  expect_invalid([&] { bsr_from_csr(32, 32, rp, {1}, {}, 16, 16, DType::f32); }, {"vals has 0 entries", "col_idx has 1"});
  std::vector<int32_t> rp1(33, 1);
  rp1[0] = 0;
  expect_invalid([&] { bsr_from_csr(32, 32, rp1, {32}, {1.f}, 16, 16, DType::f32); },
                 {"col_idx[0]=32", "out of range", "[0, 32)"});
  expect_invalid([&] { bsr_from_csr(32, 32, rp1, {1, 2}, {1.f, 2.f}, 16, 16, DType::f32); },
                 {"row_ptr[32]", "nnz=2", "got 1"});
  std::vector<int32_t> rp2(33, 1);
  rp2[0] = 0;
  rp2[5] = 0;
  expect_invalid([&] { bsr_from_csr(32, 32, rp2, {1}, {1.f}, 16, 16, DType::f32); }, {"row_ptr[5]=0", "non-decreasing"});
  rp2[5] = 1;
  rp2[0] = 1;
  expect_invalid([&] { bsr_from_csr(32, 32, rp2, {1}, {1.f}, 16, 16, DType::f32); }, {"row_ptr[0]", "got 1"});
  expect_invalid([&] { bsr_from_csr(32, 32, rp, ci, v, 32, 64, DType::f32); }, {"cols=32", "bk=64"});
}

TEST(BsrFormat, CooErrors) {
  expect_invalid([] { bsr_from_coo(32, 48, {0, 32}, {0, 1}, {1.f, 2.f}, 16, 16, DType::f32); },
                 {"row_idx[1]=32", "out of range", "[0, 32)"});
  expect_invalid([] { bsr_from_coo(32, 48, {0, 1, 2}, {0, 1, -3}, {1.f, 2.f, 3.f}, 16, 16, DType::f32); },
                 {"col_idx[2]=-3", "[0, 48)"});
  expect_invalid([] { bsr_from_coo(32, 48, {0, 1}, {0}, {1.f, 2.f}, 16, 16, DType::f32); },
                 {"row_idx has 2", "col_idx 1"});
  expect_invalid([] { bsr_from_coo(32, 48, {0}, {0}, {1.f}, 128, 16, DType::f32); }, {"rows=32", "bm=128"});
}

// ---- pattern generators ----

TEST(Patterns, NamesRoundTripAndUnknownNameListsValidOnes) {
  for (PatternKind k : kAllKinds) EXPECT_EQ(pattern_kind_from_string(to_string(k)), k);
  expect_invalid([] { pattern_kind_from_string("diagonal"); },
                 {"'diagonal'", "fixed_k", "bernoulli", "power_law", "banded", "block_diagonal", "causal"});
}

TEST(Patterns, DensityOutsideUnitIntervalRejected) {
  for (double bad : {0.0, -0.5, 1.01, std::numeric_limits<double>::quiet_NaN()})
    for (PatternKind k : kAllKinds) expect_invalid([&] { make_pattern(k, 4, 4, bad, 1); }, {"density=", "(0, 1]"});
  expect_invalid([] { make_pattern(PatternKind::bernoulli, -1, 4, 0.5, 1); }, {"mb=-1"});
  expect_invalid([] { random_bsr(PatternKind::fixed_k, 64, 64, 16, 16, 2.0, DType::f32, 1); }, {"density=2"});
}

TEST(Patterns, EveryPatternValidatesOverShapes) {
  const std::vector<std::pair<int64_t, int64_t>> grids = {{1, 1}, {1, 9}, {9, 1}, {7, 13}, {32, 32}, {40, 8}, {0, 5}, {5, 0}};
  for (PatternKind k : kAllKinds)
    for (auto [mb, kb] : grids)
      for (double dens : {0.01, 0.3, 1.0}) {
        SCOPED_TRACE(std::string(to_string(k)) + " " + std::to_string(mb) + "x" + std::to_string(kb) + " d=" +
                     std::to_string(dens));
        Pattern p = make_pattern(k, mb, kb, dens, 21);
        EXPECT_EQ(p.mb, mb);
        EXPECT_EQ(p.kb, kb);
        ASSERT_EQ(int64_t(p.row_ptr.size()), mb + 1);
        // Validate through the owning matrix (16x16 blocks).
        EXPECT_NO_THROW(BsrMatrix(mb * 16, kb * 16, 16, 16, p.row_ptr, p.col_idx, DType::f32));
      }
}

TEST(Patterns, ReproducibleWithSeedAndDifferentWithAnother) {
  for (PatternKind k : kAllKinds) {
    SCOPED_TRACE(to_string(k));
    Pattern a = make_pattern(k, 64, 48, 0.2, 42), b = make_pattern(k, 64, 48, 0.2, 42);
    EXPECT_EQ(a.row_ptr, b.row_ptr);
    EXPECT_EQ(a.col_idx, b.col_idx);
    BsrMatrix x = random_bsr(k, 64 * 16, 48 * 32, 16, 32, 0.2, DType::f16, 42);
    BsrMatrix y = random_bsr(k, 64 * 16, 48 * 32, 16, 32, 0.2, DType::f16, 42);
    EXPECT_TRUE(same(x, y));
    BsrMatrix z = random_bsr(k, 64 * 16, 48 * 32, 16, 32, 0.2, DType::f16, 43);
    EXPECT_NE(x.value_bytes(), z.value_bytes());  // values always depend on the seed
  }
  // The random kinds also change their structure with the seed.
  for (PatternKind k : {PatternKind::fixed_k, PatternKind::bernoulli, PatternKind::power_law}) {
    SCOPED_TRACE(to_string(k));
    EXPECT_NE(make_pattern(k, 64, 48, 0.2, 42).col_idx, make_pattern(k, 64, 48, 0.2, 43).col_idx);
  }
}

TEST(Patterns, RandomBsrIsPatternPlusFillRandom) {
  BsrMatrix a = random_bsr(PatternKind::power_law, 512, 256, 64, 32, 0.4, DType::f32, 8, /*integers=*/true);
  Pattern p = make_pattern(PatternKind::power_law, 8, 8, 0.4, 8);
  BsrMatrix b(512, 256, 64, 32, p.row_ptr, p.col_idx, DType::f32);
  b.fill_random(8, true);
  EXPECT_TRUE(same(a, b));
}

TEST(Patterns, FixedKHasExactlyKDistinctColumnsPerRow) {
  struct Case { int64_t kb; double d; int64_t k; };
  for (Case c : {Case{64, 0.125, 8}, Case{10, 0.25, 3}, Case{100, 0.001, 1}, Case{16, 1.0, 16}, Case{1, 0.5, 1}}) {
    Pattern p = make_pattern(PatternKind::fixed_k, 50, c.kb, c.d, 3);
    for (int64_t i = 0; i < 50; ++i) ASSERT_EQ(p.row_ptr[i + 1] - p.row_ptr[i], c.k) << "row " << i << " kb " << c.kb;
  }
  // Different rows get different columns (not one column set repeated).
  Pattern p = make_pattern(PatternKind::fixed_k, 50, 64, 0.125, 3);
  std::set<std::vector<int32_t>> rows;
  for (int64_t i = 0; i < 50; ++i) rows.emplace(p.col_idx.begin() + p.row_ptr[i], p.col_idx.begin() + p.row_ptr[i + 1]);
  EXPECT_GT(rows.size(), 40u);
  // And all columns get used.
  EXPECT_EQ(std::set<int32_t>(p.col_idx.begin(), p.col_idx.end()).size(), 64u);
}

TEST(Patterns, BernoulliDensityNearTarget) {
  Pattern p = make_pattern(PatternKind::bernoulli, 200, 100, 0.1, 4);
  // 20000 trials, p = 0.1: sd = 42 blocks; allow 5 sd.
  EXPECT_NEAR(double(p.nnzb()), 2000.0, 5 * 42.5);
}

// Coefficient of variation (sd / mean) of a pattern's row lengths.
double row_length_cv(const Pattern& p) {
  const double mean = double(p.nnzb()) / double(p.mb);
  double var = 0;
  for (int64_t i = 0; i < p.mb; ++i) var += std::pow(double(p.row_ptr[i + 1] - p.row_ptr[i]) - mean, 2);
  return std::sqrt(var / double(p.mb)) / mean;
}

TEST(Patterns, PowerLawNnzbNearTargetAndSkewed) {
  for (double dens : {0.05, 0.125, 0.5}) {
    SCOPED_TRACE(dens);
    const int64_t mb = 256, kb = 128;
    Pattern p = make_pattern(PatternKind::power_law, mb, kb, dens, 5);
    const double target = dens * mb * kb;
    EXPECT_NEAR(double(p.nnzb()), target, 0.01 * target + 1);
    for (int64_t i = 0; i < mb; ++i) EXPECT_LE(p.row_ptr[i + 1] - p.row_ptr[i], kb);
    // Skewed rows: row lengths vary far more than Bernoulli's binomial spread at the same density
    // (measured: power_law cv 2.3 / 1.5 / 0.59 vs Bernoulli ~0.39 / 0.23 / 0.09).
    const double cv = row_length_cv(p), cv_b = row_length_cv(make_pattern(PatternKind::bernoulli, mb, kb, dens, 5));
    EXPECT_GT(cv, 3 * cv_b) << "power_law cv " << cv << ", bernoulli cv " << cv_b;
  }
  // Rows in random order: the longest row is not always the same row.
  std::set<int64_t> argmax;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    Pattern p = make_pattern(PatternKind::power_law, 64, 64, 0.1, seed);
    int64_t best = 0;
    for (int64_t i = 1; i < 64; ++i)
      if (p.row_ptr[i + 1] - p.row_ptr[i] > p.row_ptr[best + 1] - p.row_ptr[best]) best = i;
    argmax.insert(best);
  }
  EXPECT_GT(argmax.size(), 1u);
}

TEST(Patterns, BandedIsADiagonalBand) {
  Pattern p = make_pattern(PatternKind::banded, 20, 20, 0.25, 0);  // width 5: diagonal +- 2
  for (int64_t i = 0; i < 20; ++i) {
    std::vector<int32_t> row(p.col_idx.begin() + p.row_ptr[i], p.col_idx.begin() + p.row_ptr[i + 1]);
    std::vector<int32_t> want;
    for (int64_t j = std::max<int64_t>(0, i - 2); j <= std::min<int64_t>(19, i + 2); ++j) want.push_back(int32_t(j));
    EXPECT_EQ(row, want) << "row " << i;
  }
}

TEST(Patterns, BlockDiagonalGroups) {
  // density 1/4 on a 16x32 grid: 4 groups of 4 rows x 8 cols.
  Pattern p = make_pattern(PatternKind::block_diagonal, 16, 32, 0.25, 0);
  EXPECT_EQ(p.nnzb(), 16 * 8);
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t g = i / 4;
    ASSERT_EQ(p.row_ptr[i + 1] - p.row_ptr[i], 8);
    for (int32_t b = p.row_ptr[i]; b < p.row_ptr[i + 1]; ++b) EXPECT_EQ(p.col_idx[b] / 8, g) << "row " << i;
  }
  // Density that does not divide: still a partition of the columns by group, nothing off-diagonal.
  Pattern q = make_pattern(PatternKind::block_diagonal, 10, 10, 0.3, 0);  // 3 groups
  std::vector<int> owner(10, -1);
  for (int64_t i = 0; i < 10; ++i)
    for (int32_t b = q.row_ptr[i]; b < q.row_ptr[i + 1]; ++b) {
      const int g = int(i * 3 / 10);
      EXPECT_TRUE(owner[q.col_idx[b]] == -1 || owner[q.col_idx[b]] == g);
      owner[q.col_idx[b]] = g;
    }
  EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
}

TEST(Patterns, CausalIsLowerTriangular) {
  Pattern p = make_pattern(PatternKind::causal, 12, 12, 1.0, 0);
  EXPECT_EQ(p.nnzb(), 12 * 13 / 2);
  for (int64_t i = 0; i < 12; ++i) {
    std::vector<int32_t> row(p.col_idx.begin() + p.row_ptr[i], p.col_idx.begin() + p.row_ptr[i + 1]);
    std::vector<int32_t> want(size_t(i + 1));
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(row, want) << "row " << i;
  }
  // Non-square grid: col <= i*kb/mb; density does not change it.
  Pattern q = make_pattern(PatternKind::causal, 4, 8, 0.1, 0);
  EXPECT_EQ(q.row_ptr, (std::vector<int32_t>{0, 1, 4, 9, 16}));
}

}  // namespace
}  // namespace sparsek
