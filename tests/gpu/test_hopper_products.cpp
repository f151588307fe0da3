// GPU tests of the Hopper (sm_90a) variant "hopper" beyond DSD with row-major operands (which
// test_hopper.cpp covers): DSD with op(A) = A^T, column-major B and C (the column-major TMA-store
// epilogue), DDS (the DSD on the transposes) and SDD (its own kernel), against the fp64 oracle on
// NaN-poisoned outputs with C's padding checked: every block shape, both input dtypes, every
// output dtype, beta, integer data (exact), nnzb = 0, empty rows, N = 1 / M = 1 / K = 1, sizes
// that are not tile multiples, a very long row, split rows, CTA pairs, bit-identical repeats.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/oracle.hpp"
#include "gpu/device_case.hpp"
#include "plan/variant.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

const int kBlocks[] = {32, 64, 128};
const Layout kLayouts[] = {Layout::row_major, Layout::col_major};

// A Bernoulli pattern with some block rows forced empty and some full (-1: the last row).
Pattern pattern_with(int64_t mb, int64_t kb, double density, uint64_t seed, const std::vector<int64_t>& empty,
                     const std::vector<int64_t>& full) {
  const Pattern p = make_pattern(PatternKind::bernoulli, mb, kb, density, seed);
  Pattern out;
  out.mb = mb;
  out.kb = kb;
  out.row_ptr.push_back(0);
  auto listed = [&](const std::vector<int64_t>& v, int64_t r) {
    for (int64_t x : v)
      if ((x < 0 ? mb + x : x) == r) return true;
    return false;
  };
  for (int64_t r = 0; r < mb; ++r) {
    if (listed(full, r)) {
      for (int32_t c = 0; c < kb; ++c) out.col_idx.push_back(c);
    } else if (!listed(empty, r)) {
      for (int32_t j = p.row_ptr[size_t(r)]; j < p.row_ptr[size_t(r + 1)]; ++j) out.col_idx.push_back(p.col_idx[size_t(j)]);
    }
    out.row_ptr.push_back(int32_t(out.col_idx.size()));
  }
  return out;
}

CaseSpec spec(OpKind kind, Op op, int bm, int bk, int64_t mb, int64_t kb, int64_t free, uint64_t seed) {
  return block_case(kind, op, bm, bk, mb, kb, free, seed, DType::f32);
}

// Runs the case on the device through `hopper` (which must support it), checks it against the
// oracle (and C's padding) and returns the output bytes.
std::vector<uint8_t> check(const CaseSpec& s) {
  SCOPED_TRACE(describe(s));
  auto gc = make_case(s);
  const std::vector<double> ref = oracle(gc->args);  // on the host, before C changes
  const std::vector<uint8_t> before = gc->c ? gc->c->bytes : std::vector<uint8_t>();
  DeviceCase dc(*gc);
  const Variant* v = find_variant("hopper");
  EXPECT_EQ(v->why_not(dc.args), "") << "hopper does not take this case";
  Options o;
  o.variant = "hopper";
  clear_one_shot_plan_cache();  // plan anew: the tests change the variant's switches between runs
  gemm(dc.args, o);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.download(*gc);
  expect_output_matches(*gc, ref, before);
  return gc->args.kind == OpKind::sdd ? gc->sparse.value_bytes() : gc->c->bytes;
}

// ---- DSD: op(A) = A^T, column-major B, column-major C ----

TEST(HopperProducts, DsdTransposedEveryBlockShapeAndBLayout) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (int bm : kBlocks)
    for (int bk : kBlocks)
      for (Layout lb : kLayouts) {
        CaseSpec s = spec(OpKind::dsd, Op::trans, bm, bk, 3, 4, 200, uint64_t(100 + n));
        s.lb = lb;
        s.in = n % 2 ? DType::bf16 : DType::f16;
        s.out = n % 3 == 0 ? DType::f32 : s.in;
        ++n;
        check(s);
      }
}

TEST(HopperProducts, DsdColumnMajorBEveryBlockShape) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (int bm : kBlocks)
    for (int bk : kBlocks) {
      CaseSpec s = spec(OpKind::dsd, Op::none, bm, bk, 4, 3, 264, uint64_t(200 + n++));
      s.lb = Layout::col_major;
      s.pad_b = 8;  // K + 8: still 16-byte lines
      s.in = DType::bf16;
      s.out = DType::bf16;
      s.beta = 0.5f;
      check(s);
    }
}

// Column-major C goes out through TMA boxes down C's columns (16-byte aligned lines), every
// block height (bm = 32: the swapped tile, 64-byte lines for 16-bit C), every output dtype, beta;
// an odd leading dimension takes the direct epilogue.
TEST(HopperProducts, ColumnMajorC) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (int bm : kBlocks)
    for (DType out : {DType::f16, DType::bf16, DType::f32})
      for (float beta : {0.f, 0.75f}) {
        CaseSpec s = spec(OpKind::dsd, n % 2 ? Op::trans : Op::none, bm, 64, 3, 3, 328, uint64_t(300 + n));
        if (s.op == Op::trans) {  // op(A)'s blocks are bm tall
          s.bm = 64;
          s.bk = bm;
          s.rows = 3 * s.bm;
          s.cols = 3 * s.bk;
        }
        s.lc = Layout::col_major;
        s.pad_c = n % 4 == 3 ? 3 : 8;
        s.in = out == DType::bf16 ? DType::bf16 : DType::f16;
        s.out = out;
        s.beta = beta;
        ++n;
        check(s);
      }
}

// ---- DDS: C = A * op(B) as the DSD on the transposes ----

TEST(HopperProducts, DdsEveryOpAndLayout) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (Op op : {Op::none, Op::trans})
    for (Layout la : kLayouts)
      for (Layout lc : kLayouts)
        for (auto [bm, bk] : {std::pair{64, 64}, std::pair{32, 128}, std::pair{128, 32}}) {
          CaseSpec s = spec(OpKind::dds, op, bm, bk, 3, 3, 136, uint64_t(400 + n));
          s.la = la;
          s.lc = lc;
          s.in = n % 2 ? DType::bf16 : DType::f16;
          s.out = n % 3 == 0 ? DType::f32 : n % 3 == 1 ? DType::f16 : DType::bf16;
          s.beta = n % 4 == 0 ? 1.f : 0.f;
          ++n;
          check(s);
        }
}

// Decode through DDS, y = x * W^T with a few rows of x (the DSD view: N = tokens, B = x^T
// column-major, C^T column-major): 64- and 128-column tiles, x and y in both layouts, every output
// dtype.
TEST(HopperProducts, DdsFewRowsOnNarrowTiles) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (int64_t tokens : {1, 3, 16, 64, 65, 100, 128})
    for (Layout la : kLayouts)
      for (Layout lc : kLayouts)
        for (int b : {64, 128}) {
          CaseSpec s = spec(OpKind::dds, Op::trans, b, b, 3, 4, tokens, uint64_t(1600 + n));
          s.la = la;
          s.lc = lc;
          s.in = n % 2 ? DType::bf16 : DType::f16;
          s.out = n % 3 == 0 ? DType::f32 : n % 3 == 1 ? DType::f16 : DType::bf16;
          s.beta = n % 4 == 0 ? 0.5f : 0.f;
          ++n;
          check(s);
        }
}

// Integer data, alpha = 2, beta = -1, f32 output: exact for DSD (both ops and B layouts), DDS
// and SDD (both layouts of each dense input).
TEST(HopperProducts, IntegerDataIsExact) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  auto exact = [&](CaseSpec s) {
    s.integers = true;
    s.alpha = 2.f;
    s.beta = -1.f;
    s.in = n % 2 ? DType::bf16 : DType::f16;
    s.seed = uint64_t(500 + n++);
    check(s);
  };
  for (Op op : {Op::none, Op::trans})
    for (Layout l1 : kLayouts)
      for (Layout l2 : kLayouts) {
        CaseSpec d = spec(OpKind::dsd, op, 64, 128, 3, 4, 72, 0);
        d.lb = l1;
        d.lc = l2;
        exact(d);
        CaseSpec e = spec(OpKind::dds, op, 128, 64, 2, 5, 96, 0);
        e.la = l1;
        e.lc = l2;
        exact(e);
      }
  for (Layout la : kLayouts)
    for (Layout lb : kLayouts) {
      CaseSpec s = spec(OpKind::sdd, Op::none, 64, 32, 4, 9, 136, 0);
      s.la = la;
      s.lb = lb;
      exact(s);
    }
}

// ---- SDD ----

// Every block shape x both layouts of A and B; K = 200 (the last stage's K tail is zero-filled);
// random rows give partial groups of blocks.
TEST(HopperProducts, SddEveryBlockShapeAndLayout) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (int bm : kBlocks)
    for (int bk : kBlocks)
      for (Layout la : kLayouts)
        for (Layout lb : kLayouts) {
          CaseSpec s = spec(OpKind::sdd, Op::none, bm, bk, 3, 5, 200, uint64_t(600 + n));
          s.la = la;
          s.lb = lb;
          s.in = n % 2 ? DType::bf16 : DType::f16;
          s.out = n % 3 == 0 ? DType::f32 : n % 3 == 1 ? DType::f16 : DType::bf16;
          s.beta = n % 4 == 1 ? 0.5f : 0.f;
          ++n;
          check(s);
        }
}

// A row holding every block column (groups of 8, 8 and 4 at bk = 32), empty rows, small K (8)
// and K = 1 (padded to 16-byte lines).
TEST(HopperProducts, SddFullAndEmptyRowsAndSmallK) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (int bk : kBlocks)
    for (int64_t K : {8, 1}) {
      const Pattern p = pattern_with(5, 20, 0.3, uint64_t(700 + n), {0, 3}, {2});
      CaseSpec s = spec(OpKind::sdd, Op::none, 64, bk, 5, 20, K, uint64_t(700 + n));
      s.custom = &p;
      s.la = n % 2 ? Layout::col_major : Layout::row_major;
      s.lb = n % 3 ? Layout::row_major : Layout::col_major;
      // K = 1: lines that are K long (row-major A, column-major B) padded to 16 bytes
      s.pad_a = K == 1 && s.la == Layout::row_major ? 7 : 0;
      s.pad_b = K == 1 && s.lb == Layout::col_major ? 7 : 0;
      s.beta = n % 2 ? 2.f : 0.f;
      ++n;
      check(s);
    }
}

// ---- edge cases of every kind ----

TEST(HopperProducts, NoStoredBlocks) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (float beta : {0.f, 2.f}) {
      const Pattern p = pattern_with(3, 4, 0.5, 1, {0, 1, 2}, {});
      CaseSpec s = spec(kind, kind == OpKind::sdd ? Op::none : Op::trans, 64, 32, 3, 4, 64, uint64_t(800 + n++));
      s.custom = &p;
      s.beta = beta;
      s.out = DType::bf16;
      check(s);
    }
}

// Empty block rows give beta * C; a very long row (every block column: the transposed pattern of
// op T has it as one long row when the column is full) among short ones; N = 1 (DSD) and M = 1
// (DDS) with 16-byte padded lines.
TEST(HopperProducts, EmptyRowsLongRowsAndUnitExtents) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (Op op : {Op::none, Op::trans})
    for (float beta : {0.f, 0.5f}) {
      const Pattern p = pattern_with(40, 24, 0.05, uint64_t(900 + n), {1, 5, -1}, {7});
      CaseSpec d = spec(OpKind::dsd, op, 64, 64, 40, 24, 136, uint64_t(900 + n));
      d.custom = &p;
      d.beta = beta;
      d.lb = n % 2 ? Layout::col_major : Layout::row_major;
      check(d);
      d.free = 1;  // N = 1
      d.pad_b = d.lb == Layout::row_major ? 7 : 0;
      d.pad_c = 7;
      check(d);
      CaseSpec e = spec(OpKind::dds, op, 32, 64, 40, 24, 1, uint64_t(950 + n));  // M = 1
      const Pattern q = pattern_with(40, 24, 0.05, uint64_t(950 + n), {2}, {-1});
      e.custom = &q;
      e.la = n % 2 ? Layout::row_major : Layout::col_major;
      e.pad_a = e.la == Layout::col_major ? 7 : 0;
      e.beta = beta;
      check(e);
      ++n;
    }
}

// Split rows (forced pieces of 3 stages) and CTA pairs (128-row op(A) blocks) with the new layouts
// and DDS: right against the oracle, the pairs bit-identical to single CTAs, repeats bit-identical.
TEST(HopperProducts, SplitRowsPairsAndRepeats) {
  SPARSEK_REQUIRE_SM90();
  struct Shape {
    OpKind kind;
    Op op;
    int bm, bk;
    Layout l1, l2;  // dsd: B, C; dds: A, C
    DType out;
  };
  int n = 0;
  for (const Shape& sh : {Shape{OpKind::dsd, Op::trans, 128, 128, Layout::row_major, Layout::col_major, DType::f32},
                          Shape{OpKind::dsd, Op::none, 128, 64, Layout::col_major, Layout::row_major, DType::f16},
                          Shape{OpKind::dds, Op::trans, 128, 128, Layout::row_major, Layout::row_major, DType::bf16},
                          Shape{OpKind::dds, Op::none, 64, 32, Layout::col_major, Layout::row_major, DType::f32},
                          Shape{OpKind::dsd, Op::trans, 32, 64, Layout::col_major, Layout::col_major, DType::f16}}) {
    const bool dds = sh.kind == OpKind::dds;
    CaseSpec s = spec(sh.kind, sh.op, sh.bm, sh.bk, 12, 12, 1000, uint64_t(1000 + n++));
    const Pattern p = pattern_with(12, 12, 0.3, s.seed, {4}, {2});
    s.custom = &p;
    (dds ? s.la : s.lb) = sh.l1;
    s.lc = sh.l2;
    s.out = sh.out;
    s.in = sh.out == DType::bf16 ? DType::bf16 : DType::f16;
    std::vector<uint8_t> single, paired;
    {
      // The automatic row split depends on the lists and the tile width, which pairs change: the
      // modes are compared with rows whole (each mode's split is checked on its own below).
      EnvFor whole("SPARSEK_HOPPER_SPLIT", "off");
      EnvFor one("SPARSEK_HOPPER_CLUSTER", "1");
      single = check(s);
    }
    {
      EnvFor whole("SPARSEK_HOPPER_SPLIT", "off");
      EnvFor two("SPARSEK_HOPPER_CLUSTER", "2");
      paired = check(s);
    }
    EXPECT_TRUE(single == paired) << describe(s) << ": CTA pairs differ from single CTAs";
    EnvFor split("SPARSEK_HOPPER_SPLIT", "3");
    const std::vector<uint8_t> first = check(s);
    EXPECT_TRUE(check(s) == first) << describe(s) << ": a repeat with split rows differs";
  }
  // SDD repeats
  CaseSpec s = spec(OpKind::sdd, Op::none, 128, 64, 10, 12, 520, 1100);
  s.la = Layout::col_major;
  const std::vector<uint8_t> first = check(s);
  EXPECT_TRUE(check(s) == first) << "an SDD repeat differs";
}

// ---- variant choice and reasons ----

TEST(HopperProducts, DefaultVariantForEveryKind) {
  SPARSEK_REQUIRE_SM90();
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
    CaseSpec s = spec(kind, kind == OpKind::sdd ? Op::none : Op::trans, 64, 64, 2, 2, 64, 1);
    s.in = DType::f16;
    auto gc = make_case(s);
    DeviceCase dc(*gc);
    const std::vector<std::string> names = supported_variants(dc.args);
    ASSERT_FALSE(names.empty());
    EXPECT_EQ(names.front(), "hopper") << to_string(kind);
  }
}

// Runs without a GPU: the reasons name the caller's operands (DDS's dense input is A) and values.
TEST(HopperProducts, WhyNotNamesTheOperand) {
  const Variant* v = find_variant("hopper");
  ASSERT_NE(v, nullptr);
  alignas(256) static char storage[1 << 12];
  GemmArgs g;
  g.kind = OpKind::dds;
  g.sparse = one_block_device_view(storage);
  g.a = DenseView{storage, 40, 128, 128, Layout::row_major, DType::f16, Memory::device};
  g.c = DenseView{storage, 40, 64, 64, Layout::row_major, DType::f32, Memory::device};
  // DDS's sparse operand is B (a dense A that is not 16-byte aligned is packed by run():
  // test_hopper_unaligned.cpp).
  g.sparse.values = storage + 8;
  std::string why = v->why_not(g);
  EXPECT_NE(why.find("B values must be 16-byte aligned"), std::string::npos) << why;
  g.sparse.values = storage;
  // SDD: K = 0, and a misaligned B.
  GemmArgs s;
  s.kind = OpKind::sdd;
  s.sparse = g.sparse;
  s.a = DenseView{storage, 128, 0, 8, Layout::row_major, DType::f16, Memory::device};
  s.b = DenseView{storage, 0, 64, 64, Layout::row_major, DType::f16, Memory::device};
  why = v->why_not(s);
  EXPECT_NE(why.find("K = 0"), std::string::npos) << why;
  s.a.cols = 16;
  s.b.rows = 16;
  s.b.data = storage + 4;
  why = v->why_not(s);
  EXPECT_NE(why.find("B must be 16-byte aligned"), std::string::npos) << why;
  s.b.data = storage;
  s.sparse.bm = 16;
  why = v->why_not(s);
  EXPECT_NE(why.find("bm=16"), std::string::npos) << why;
}

}  // namespace
}  // namespace sparsek::test
