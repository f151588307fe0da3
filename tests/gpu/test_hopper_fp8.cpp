// GPU tests of the Hopper fp8 variant `hopper_fp8`: e4m3 DSD (B column-major, read in place; B
// row-major, transposed first) and DDS (a layer's x * W^T), one scale per stored block and one per
// token, against the fp64 oracle on NaN-poisoned outputs with C's padding checked: every block
// shape it builds, every output dtype, beta, C stored by TMA or by the threads, integer data
// (exact), empty rows, no stored block, N not a tile multiple; and what it refuses, by name.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cpu/oracle.hpp"
#include "gpu/device_case.hpp"
#include "plan/variant.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

// block_case with e4m3 inputs: density 0.4, alpha 1.25.
CaseSpec fp8_spec(OpKind kind, Op op, int bm, int bk, int64_t mb, int64_t kb, int64_t free, DType out, uint64_t seed) {
  CaseSpec s = block_case(kind, op, bm, bk, mb, kb, free, seed, out);
  s.density = 0.4;
  s.in = DType::e4m3;
  s.alpha = 1.25f;
  return s;
}

// Runs the case through hopper_fp8 and checks it against the oracle; returns the relative error.
double check(const CaseSpec& s) {
  SCOPED_TRACE(describe(s));
  auto gc = make_case(s);
  const std::vector<double> ref = oracle(gc->args);
  const std::vector<uint8_t> before = gc->c->bytes;
  DeviceCase dc(*gc);
  const Variant* v = find_variant("hopper_fp8");
  EXPECT_NE(v, nullptr);
  if (!v) return 1.0;
  EXPECT_EQ(v->why_not(dc.args), "") << "hopper_fp8 does not take this case";
  Options o;
  o.variant = "hopper_fp8";
  gemm(dc.args, o);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.download(*gc);
  expect_output_matches(*gc, ref, before);
  return max_rel_error(gc->args, ref);
}

TEST(HopperFp8, DsdEveryBlockShapeBothBLayoutsAndOutputs) {
  SPARSEK_REQUIRE_SM90();
  double worst = 0;
  for (int bm : {64, 128})
    for (int bk : {64, 128})
      for (Layout lb : {Layout::col_major, Layout::row_major})
        for (DType out : {DType::f16, DType::bf16}) {
          CaseSpec s = fp8_spec(OpKind::dsd, Op::none, bm, bk, 6, 5, 200, out, uint64_t(bm + bk));
          s.lb = lb;
          worst = std::max(worst, check(s));
        }
  std::printf("hopper_fp8 DSD, random e4m3 data: largest relative error vs fp64 %.3g\n", worst);
}

// A row-major B is transposed first: whole 64 x 64 tiles with 16-byte aligned rows move in 16-byte
// words, edge tiles and unaligned rows byte by byte. N = 256, K = 512 (every tile whole and
// aligned); N = 200 with ld 208 (aligned rows, a partial edge tile); N = 200 with ld 201 (K = 512)
// and with ld 200 (K = 384): unaligned rows; N = 256 with K = 384.
TEST(HopperFp8, RowMajorBTransposeEveryTileKind) {
  SPARSEK_REQUIRE_SM90();
  struct Shape {
    int64_t kb, free, pad;
  };
  for (Shape sh : {Shape{4, 256, 0}, Shape{4, 200, 8}, Shape{4, 200, 1}, Shape{3, 256, 0}, Shape{3, 200, 0}}) {
    CaseSpec s = fp8_spec(OpKind::dsd, Op::none, 128, 128, 3, sh.kb, sh.free, DType::bf16,
                          uint64_t(sh.kb + sh.free + sh.pad));
    s.lb = Layout::row_major;
    s.pad_b = sh.pad;
    check(s);
  }
}

// 16-bit row-major C with beta = 0 leaves through TMA stores of 64 x 64 boxes when its rows are
// 16-byte aligned, else from the threads: N = 256 (whole boxes), N = 200 with ld 208 (boxes clipped
// at N, the padding must stay untouched), N = 200 with ld 200, N = 100 with ld 101 (the threads),
// each at both block heights (128 rows: two consumers by rows; 64: by columns).
TEST(HopperFp8, SixteenBitCThroughTmaStoresAndNot) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {64, 128})
    for (auto [free, pad] : {std::pair<int64_t, int64_t>{256, 0}, {200, 8}, {200, 0}, {100, 1}}) {
      CaseSpec s = fp8_spec(OpKind::dsd, Op::none, bm, 128, 5, 4, free, DType::f16, uint64_t(bm + free + pad));
      s.lb = Layout::col_major;
      s.pad_c = pad;
      check(s);
    }
}

TEST(HopperFp8, IntegerDataIsExact) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {64, 128})
    for (int bk : {64, 128})
      for (Layout lb : {Layout::col_major, Layout::row_major}) {
        CaseSpec s = fp8_spec(OpKind::dsd, Op::none, bm, bk, 5, 9, 131, DType::f32, uint64_t(7 * bm + bk));
        s.integers = true;
        s.alpha = 1.f;
        s.lb = lb;
        check(s);
      }
}

TEST(HopperFp8, DdsLayerForwardEveryOutputAndColumnMajorC) {
  SPARSEK_REQUIRE_SM90();
  // y = x * W^T: W (N_out x K) block-sparse, x (M tokens x K) row-major: the DSD view reads x^T
  // K-major in place.
  for (int b : {64, 128})
    for (DType out : {DType::f16, DType::bf16, DType::f32})
      for (Layout lc : {Layout::row_major, Layout::col_major}) {
        CaseSpec s = fp8_spec(OpKind::dds, Op::trans, b, b, 4, 6, 77, out, uint64_t(b) + 3);
        s.lc = lc;
        s.pad = 16;
        if (out == DType::f32) s.integers = true;
        check(s);
      }
}

TEST(HopperFp8, BetaEmptyRowsAndNoBlocks) {
  SPARSEK_REQUIRE_SM90();
  const Pattern p = pattern_of(4, {{0, 2}, {}, {1, 2, 3}, {}});
  for (float beta : {0.f, 0.5f}) {
    CaseSpec s = fp8_spec(OpKind::dsd, Op::none, 128, 128, 4, 4, 96, DType::bf16, 5);
    s.custom = &p;
    s.beta = beta;
    check(s);
  }
  const Pattern none = pattern_of(3, {{}, {}});
  for (float beta : {0.f, 2.f}) {
    CaseSpec s = fp8_spec(OpKind::dsd, Op::none, 64, 64, 2, 3, 40, DType::f16, 6);
    s.custom = &none;
    s.beta = beta;
    check(s);
  }
}

// A block row with no stored block is beta * C whatever alpha is: alpha = +-Inf must not put
// Inf * 0 = NaN there (the kernel takes alpha as 0 for such rows). Rows with blocks are not
// compared (they are +-Inf or NaN by the product's own arithmetic).
TEST(HopperFp8, InfiniteAlphaLeavesEmptyRowsAtBetaC) {
  SPARSEK_REQUIRE_SM90();
  const Pattern p = pattern_of(4, {{0, 2}, {}, {1, 2, 3}, {}});
  for (float alpha : {INFINITY, -INFINITY})
    for (int b : {64, 128}) {
      CaseSpec s = fp8_spec(OpKind::dsd, Op::none, b, b, 4, 4, 96, DType::bf16, uint64_t(b) + 11);
      s.custom = &p;
      s.alpha = alpha;
      s.beta = 0.5f;
      SCOPED_TRACE(describe(s));
      auto gc = make_case(s);
      std::vector<float> before;
      for (int64_t r = 0; r < gc->c->view.rows; ++r)
        for (int64_t c = 0; c < gc->c->view.cols; ++c) before.push_back(gc->c->get(r, c));
      DeviceCase dc(*gc);
      Options o;
      o.variant = "hopper_fp8";
      gemm(dc.args, o);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      dc.download(*gc);
      int bad = 0;
      for (int64_t r = 0; r < gc->c->view.rows && bad < 5; ++r) {
        if ((r / b) % 2 == 0) continue;  // block rows 1 and 3 store nothing
        for (int64_t c = 0; c < gc->c->view.cols && bad < 5; ++c) {
          const float want = 0.5f * before[size_t(r * gc->c->view.cols + c)];  // exact in bf16
          if (!(gc->c->get(r, c) == want)) {
            ADD_FAILURE() << "C[" << r << ", " << c << "] = " << gc->c->get(r, c) << ", want beta * C = " << want;
            ++bad;
          }
        }
      }
    }
}

TEST(HopperFp8, WhyNotNamesWhatIsNotBuilt) {
  auto why = [](const CaseSpec& s) {
    auto gc = make_case(s);
    GemmArgs g = gc->args;
    g.sparse.memory = g.a.memory = g.b.memory = g.c.memory = Memory::device;
    return find_variant("hopper_fp8")->why_not(g);
  };
  CaseSpec s = fp8_spec(OpKind::dds, Op::none, 64, 64, 2, 2, 16, DType::bf16, 1);
  EXPECT_NE(why(s).find("as stored"), std::string::npos) << why(s);
  s = fp8_spec(OpKind::dsd, Op::none, 32, 64, 2, 2, 16, DType::bf16, 1);
  EXPECT_NE(why(s).find("32x64"), std::string::npos) << why(s);
  s = fp8_spec(OpKind::dsd, Op::none, 64, 64, 2, 2, 16, DType::bf16, 1);
  s.scale_group = 128;
  EXPECT_NE(why(s).find("128 group"), std::string::npos) << why(s);
  s = fp8_spec(OpKind::dsd, Op::none, 64, 64, 2, 2, 16, DType::bf16, 1);
  s.in = DType::f16;
  EXPECT_NE(why(s).find("needs e4m3"), std::string::npos) << why(s);
}

}  // namespace
}  // namespace sparsek::test
