// Every validation rule (the BSR invariants, dense operands, GemmArgs) is rejected with an
// invalid_argument Error whose message names the array / argument and the offending index or
// value. Each test breaks exactly one rule of an otherwise valid input, so removing the rule makes
// the test fail (no throw, or a message about something else).
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"
#include "test_util.hpp"

namespace sparsek {
namespace {

using test::expect_invalid;

// A valid 64x64 BSR with 16x16 blocks (mb = kb = 4) whose arrays the tests then break:
//   row 0: cols 0, 2   row 1: col 1   row 2: empty   row 3: cols 0, 3
struct Fixture {
  std::vector<int32_t> row_ptr{0, 2, 3, 3, 5};
  std::vector<int32_t> col_idx{0, 2, 1, 0, 3};
  std::vector<float> values = std::vector<float>(5 * 16 * 16, 1.f);
  BsrView v() {
    BsrView a;
    a.rows = 64;
    a.cols = 64;
    a.bm = 16;
    a.bk = 16;
    a.nnzb = int64_t(col_idx.size());
    a.row_ptr = row_ptr.data();
    a.col_idx = col_idx.data();
    a.values = values.data();
    return a;
  }
};

TEST(ValidateBsr, ValidInputPasses) {
  Fixture f;
  EXPECT_NO_THROW(validate(f.v()));
  // nnzb = 0 with null col_idx / values is fine.
  std::vector<int32_t> zeros(5, 0);
  BsrView e = f.v();
  e.nnzb = 0;
  e.row_ptr = zeros.data();
  e.col_idx = nullptr;
  e.values = nullptr;
  EXPECT_NO_THROW(validate(e));
}

TEST(ValidateBsr, RowPtrFirstNotZero) {
  Fixture f;
  f.row_ptr[0] = 1;
  expect_invalid([&] { validate(f.v()); }, {"row_ptr[0]", "got 1"});
}

TEST(ValidateBsr, RowPtrDecreasing) {
  Fixture f;
  f.row_ptr = {0, 3, 2, 3, 5};
  expect_invalid([&] { validate(f.v()); }, {"non-decreasing", "row_ptr[2]=2", "row_ptr[1]=3"});
}

TEST(ValidateBsr, RowPtrLastNotNnzb) {
  Fixture f;
  f.row_ptr[4] = 4;
  expect_invalid([&] { validate(f.v()); }, {"row_ptr[4]", "nnzb=5", "got 4"});
}

TEST(ValidateBsr, ColumnOutOfRange) {
  Fixture f;
  f.col_idx[4] = 4;  // kb = 4
  expect_invalid([&] { validate(f.v()); }, {"col_idx[4]=4", "out of range", "[0, 4)", "block row 3"});
}

TEST(ValidateBsr, NegativeColumn) {
  Fixture f;
  f.col_idx[2] = -1;
  expect_invalid([&] { validate(f.v()); }, {"col_idx[2]=-1", "out of range"});
}

TEST(ValidateBsr, UnsortedColumns) {
  Fixture f;
  f.col_idx = {2, 0, 1, 0, 3};
  expect_invalid([&] { validate(f.v()); }, {"sorted", "col_idx[1]=0", "col_idx[0]=2", "block row 0"});
}

TEST(ValidateBsr, DuplicateColumns) {
  Fixture f;
  f.col_idx = {0, 2, 1, 3, 3};
  expect_invalid([&] { validate(f.v()); }, {"unique", "col_idx[4]=3", "block row 3"});
}

TEST(ValidateBsr, RowsNotDivisible) {
  Fixture f;
  BsrView a = f.v();
  a.rows = 72;
  expect_invalid([&] { validate(a); }, {"rows=72", "bm=16"});
}

TEST(ValidateBsr, ColsNotDivisible) {
  Fixture f;
  BsrView a = f.v();
  a.cols = 40;
  expect_invalid([&] { validate(a); }, {"cols=40", "bk=16"});
}

TEST(ValidateBsr, BadBlockShape) {
  Fixture f;
  BsrView a = f.v();
  a.bm = 48;
  a.rows = 48 * 4;
  expect_invalid([&] { validate(a); }, {"bm=48", "16, 32, 64, 128"});
  a = f.v();
  a.bk = 8;
  a.cols = 32;
  expect_invalid([&] { validate(a); }, {"bk=8"});
}

TEST(ValidateBsr, NegativeDims) {
  Fixture f;
  BsrView a = f.v();
  a.rows = -16;
  expect_invalid([&] { validate(a); }, {"rows=-16", "negative"});
  a = f.v();
  a.cols = -16;
  expect_invalid([&] { validate(a); }, {"cols=-16", "negative"});
}

TEST(ValidateBsr, NullPointersWithBlocks) {
  Fixture f;
  BsrView a = f.v();
  a.row_ptr = nullptr;
  expect_invalid([&] { validate(a); }, {"row_ptr is null"});
  a = f.v();
  a.col_idx = nullptr;
  expect_invalid([&] { validate(a); }, {"col_idx is null", "nnzb=5"});
  a = f.v();
  a.values = nullptr;
  expect_invalid([&] { validate(a); }, {"values is null", "nnzb=5"});
}

TEST(ValidateBsr, NegativeNnzb) {
  Fixture f;
  BsrView a = f.v();
  a.nnzb = -1;
  expect_invalid([&] { validate(a); }, {"nnzb=-1", "negative"});
}

TEST(ValidateBsr, NnzbBeyondGrid) {
  Fixture f;
  BsrView a = f.v();
  a.nnzb = 17;  // 4x4 grid
  expect_invalid([&] { validate(a); }, {"nnzb=17", "16 block positions"});
}

TEST(ValidateBsr, BadDtypeAndMemory) {
  Fixture f;
  BsrView a = f.v();
  a.dtype = DType(7);
  expect_invalid([&] { validate(a); }, {"dtype 7"});
  a = f.v();
  a.memory = Memory(3);
  expect_invalid([&] { validate(a); }, {"memory 3"});
}

TEST(ValidateBsr, DeviceValuesMisaligned) {
  Fixture f;
  BsrView a = f.v();
  a.memory = Memory::device;
  a.values = reinterpret_cast<char*>(f.values.data()) + 4;
  // The index checks are for the caller (host copy); the alignment check is cheap and always runs.
  expect_invalid([&] { validate(a); }, {"16-byte aligned", "% 16 = "});
}

TEST(ValidateBsr, IndexChecksCanBeSkipped) {
  Fixture f;
  f.col_idx[4] = 99;
  BsrView a = f.v();
  EXPECT_NO_THROW(validate(a, /*check_indices=*/false));
  expect_invalid([&] { validate(a, true); }, {"col_idx[4]=99"});
}

TEST(ValidateBsr, ConstructorRejectsBadArrays) {
  // The owning matrix validates too, and checks the row_ptr length before reading it.
  expect_invalid([] { BsrMatrix(64, 64, 16, 16, {0, 1, 1}, {0}, DType::f32); }, {"row_ptr has 3 entries", "mb+1=5"});
  expect_invalid([] { BsrMatrix(64, 64, 16, 16, {0, 1, 2, 2, 2}, {0, 5}, DType::f32); }, {"col_idx[1]=5"});
  expect_invalid([] { BsrMatrix(64, 64, 16, 16, {0, 2, 2, 2, 2}, {1, 1}, DType::f32); }, {"col_idx[1]=1", "unique"});
}

// ---- dense operands ----

DenseView dense_view(std::vector<float>& buf, int64_t rows, int64_t cols, Layout l = Layout::row_major) {
  DenseView d;
  d.rows = rows;
  d.cols = cols;
  d.layout = l;
  d.ld = l == Layout::row_major ? cols : rows;
  buf.assign(size_t(std::max<int64_t>(rows * cols, 1)), 0.f);
  d.data = buf.data();
  return d;
}

TEST(ValidateDense, ValidPasses) {
  std::vector<float> buf;
  EXPECT_NO_THROW(validate(dense_view(buf, 8, 4), "B"));
  EXPECT_NO_THROW(validate(dense_view(buf, 8, 4, Layout::col_major), "B"));
  DenseView empty = dense_view(buf, 0, 4);
  empty.data = nullptr;  // nothing to read
  EXPECT_NO_THROW(validate(empty, "B"));
}

TEST(ValidateDense, LdTooSmall) {
  std::vector<float> buf;
  DenseView d = dense_view(buf, 8, 4);
  d.ld = 3;
  expect_invalid([&] { validate(d, "B"); }, {"B ld=3", "cols=4"});
  DenseView c = dense_view(buf, 8, 4, Layout::col_major);
  c.ld = 7;
  expect_invalid([&] { validate(c, "C"); }, {"C ld=7", "rows=8", "col-major"});
}

TEST(ValidateDense, NullData) {
  std::vector<float> buf;
  DenseView d = dense_view(buf, 8, 4);
  d.data = nullptr;
  expect_invalid([&] { validate(d, "A"); }, {"A data is null", "8x4"});
}

TEST(ValidateDense, NegativeDims) {
  std::vector<float> buf;
  DenseView d = dense_view(buf, 8, 4);
  d.rows = -2;
  expect_invalid([&] { validate(d, "B"); }, {"B rows=-2", "negative"});
  d = dense_view(buf, 8, 4);
  d.cols = -3;
  expect_invalid([&] { validate(d, "B"); }, {"B cols=-3", "negative"});
}

// ---- GemmArgs (src/format/validate.cpp) ----

// A valid host DSD: A 64x64 BSR (the Fixture) times B 64x8 into C 64x8, all f32.
struct GemmFixture {
  Fixture f;
  std::vector<float> bbuf, cbuf, abuf;
  GemmArgs g;
  GemmFixture() {
    g.kind = OpKind::dsd;
    g.sparse = f.v();
    g.b = dense_view(bbuf, 64, 8);
    g.c = dense_view(cbuf, 64, 8);
  }
  // SDD: A 64x32 times B 32x64 into the 64x64 BSR C.
  void make_sdd() {
    g.kind = OpKind::sdd;
    g.a = dense_view(abuf, 64, 32);
    g.b = dense_view(bbuf, 32, 64);
    g.c = DenseView{};
  }
};

TEST(ValidateGemm, ValidPasses) {
  GemmFixture t;
  EXPECT_NO_THROW(validate(t.g));
  t.g.op = Op::trans;  // 64x64 A: op(A) is 64x64 too
  EXPECT_NO_THROW(validate(t.g));
  GemmFixture s;
  s.make_sdd();
  EXPECT_NO_THROW(validate(s.g));
}

TEST(ValidateGemm, BShapeMismatch) {
  GemmFixture t;
  t.g.b = dense_view(t.bbuf, 32, 8);  // K = 64
  expect_invalid([&] { validate(t.g); }, {"B must be 64x8", "is 32x8"});
}

TEST(ValidateGemm, CShapeMismatch) {
  GemmFixture t;
  t.g.c = dense_view(t.cbuf, 64, 4);
  expect_invalid([&] { validate(t.g); }, {"C must be 64x8", "is 64x4"});
}

TEST(ValidateGemm, SddShapeMismatch) {
  GemmFixture t;
  t.make_sdd();
  t.g.b = dense_view(t.bbuf, 16, 64);  // K = A.cols = 32
  expect_invalid([&] { validate(t.g); }, {"B must be 32x64", "is 16x64"});
}

TEST(ValidateGemm, DtypeMismatch) {
  GemmFixture t;
  t.g.b.dtype = DType::f16;
  expect_invalid([&] { validate(t.g); }, {"B dtype f16", "A's f32"});
}

TEST(ValidateGemm, F32InputsWithHalfOutput) {
  GemmFixture t;
  t.g.c.dtype = DType::f16;
  expect_invalid([&] { validate(t.g); }, {"output dtype must be f32", "f16"});
  // Half inputs may write f32 (and half) output.
  GemmFixture h;
  h.g.sparse.dtype = DType::bf16;
  h.g.b.dtype = DType::bf16;
  EXPECT_NO_THROW(validate(h.g));
}

TEST(ValidateGemm, MixedMemory) {
  GemmFixture t;
  t.g.c.memory = Memory::device;
  expect_invalid([&] { validate(t.g); }, {"C is in device memory", "host memory"});
}

TEST(ValidateGemm, TransOnSdd) {
  GemmFixture t;
  t.make_sdd();
  t.g.op = Op::trans;
  expect_invalid([&] { validate(t.g); }, {"op must be none for sdd"});
}

TEST(ValidateGemm, SparseErrorsNameTheOperand) {
  GemmFixture t;
  t.f.col_idx[1] = 9;
  t.g.sparse = t.f.v();
  expect_invalid([&] { validate(t.g); }, {"A (sparse)", "col_idx[1]=9"});
}

TEST(ValidateGemm, NanAlpha) {
  GemmFixture t;
  t.g.alpha = std::numeric_limits<float>::quiet_NaN();
  expect_invalid([&] { validate(t.g); }, {"alpha and beta must not be NaN"});
}

}  // namespace
}  // namespace sparsek
