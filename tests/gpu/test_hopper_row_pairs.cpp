// Row pairs on the Hopper variant: 64-row blocks whose neighbouring block rows share most columns
// (banded, lower-triangular, block-diagonal) run on the 128-row kernel, two block rows per tile
// over the union of their columns (SPARSEK_HOPPER_ROW_PAIRS = on | off forces the choice). Against
// the fp64 oracle with NaN-poisoned C and C's padding checked: every pattern kind, an odd number of
// block rows, ragged N, bk 32 / 64 / 128, both B and C layouts, padded C that the TMA cannot store,
// beta, CTA pairs on and off, a half-row without any block (with alpha = Inf), the two rows of a
// pair on disjoint columns, many items per CTA, pairs longer than the producer's stash, the layer
// forward (DDS x * W^T), B values that only one row of a pair reads being infinite; bit-identical
// repeats; plan()'s default choice. Also plan()'s choice of CTA pairs for 128-row blocks whose
// neighbouring rows are identical.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "cpu/oracle.hpp"
#include "gpu/device_case.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

// A fresh plan through "hopper" (prepare() reads the switches; the one-shot cache would not), run
// once; C downloaded into the case. Returns C's bytes.
std::vector<uint8_t> run_hopper(GemmCase& gc) {
  DeviceCase dc(gc);
  Options o;
  o.backend = Backend::cuda;
  o.variant = "hopper";
  const Plan p = plan(dc.args, o);
  run(p, dc.args, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "hopper kernel";
  dc.download(gc);
  return gc.c->bytes;
}

// prepare()'s verbose line for the case (what plan() chose).
std::string plan_line(GemmCase& gc) {
  EnvFor verbose("SPARSEK_HOPPER_VERBOSE", "1");
  DeviceCase dc(gc);
  Options o;
  o.backend = Backend::cuda;
  o.variant = "hopper";
  testing::internal::CaptureStderr();
  { const Plan p = plan(dc.args, o); }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("hopper: bm="), std::string::npos) << "no verbose line: " << err;
  return err;
}
// Whether plan() chose row pairs for the case.
bool plans_row_pairs(GemmCase& gc) { return plan_line(gc).find("(row pairs)") != std::string::npos; }

// Row pairs run on 256-column tiles only; N <= 128 would take a narrow tile and no pairs.
constexpr const char* kWideTiles = "256";

// Runs the case with row pairs forced on (and checks that they ran): right against the oracle,
// C's padding untouched, and the same bytes on a second run.
void check_pairs(const CaseSpec& s, const char* cluster = nullptr) {
  SCOPED_TRACE(describe(s) + (cluster ? std::string(" SPARSEK_HOPPER_CLUSTER=") + cluster : std::string()));
  EnvFor pairs("SPARSEK_HOPPER_ROW_PAIRS", "on");
  EnvFor wide("SPARSEK_HOPPER_TILE_N", kWideTiles);
  EnvFor clu("SPARSEK_HOPPER_CLUSTER", cluster);
  auto gc = make_case(s);
  EXPECT_TRUE(plans_row_pairs(*gc)) << "row pairs did not run";
  const std::vector<double> ref = oracle(gc->args);
  const std::vector<uint8_t> before = gc->c->bytes;
  const std::vector<uint8_t> first = run_hopper(*gc);
  expect_output_matches(*gc, ref, before);
  gc->c->bytes = before;
  EXPECT_TRUE(run_hopper(*gc) == first) << "repeat differs";
}

CaseSpec pair_case(PatternKind kind, int64_t mb, int64_t kb, int bk, int64_t n, double density, uint64_t seed) {
  CaseSpec s;
  s.pattern = kind;
  s.density = density;
  s.bm = 64;
  s.bk = bk;
  s.rows = mb * 64;
  s.cols = kb * bk;
  s.free = n;
  s.in = DType::f16;
  s.out = DType::f32;
  s.alpha = 1.25f;
  s.seed = seed;
  return s;
}

TEST(HopperRowPairs, EveryPatternKindAgainstTheOracle) {
  SPARSEK_REQUIRE_SM90();
  // 9 block rows (the last pair has one row), N = 300 (two 256-column tiles, the second ragged).
  for (PatternKind kind : {PatternKind::banded, PatternKind::causal, PatternKind::block_diagonal,
                           PatternKind::bernoulli, PatternKind::power_law})
    check_pairs(pair_case(kind, 9, 12, 64, 300, 0.3, uint64_t(kind) + 1));
}

TEST(HopperRowPairs, BlockDepthsDtypesLayoutsAndBeta) {
  SPARSEK_REQUIRE_SM90();
  uint64_t seed = 100;
  for (int bk : {32, 64, 128})
    for (DType out : {DType::f32, DType::f16, DType::bf16})
      for (float beta : {0.f, 0.5f}) {
        CaseSpec s = pair_case(PatternKind::banded, 6, 8, bk, 520, 0.4, ++seed);
        s.in = out == DType::bf16 ? DType::bf16 : DType::f16;
        s.out = out;
        s.beta = beta;
        check_pairs(s);
      }
  // B and C column-major, and C padded so that its lines are not 16-byte multiples (the epilogue
  // then copies the boxes with the threads: rows past M must be skipped there too).
  for (Layout lb : {Layout::row_major, Layout::col_major})
    for (Layout lc : {Layout::row_major, Layout::col_major})
      for (int64_t pad_c : {int64_t(0), int64_t(3)}) {
        CaseSpec s = pair_case(PatternKind::causal, 7, 6, 64, 260, 0.4, ++seed);
        s.lb = lb;
        s.lc = lc;
        s.pad_c = pad_c;
        s.beta = pad_c ? 0.75f : 0.f;
        check_pairs(s);
      }
}

TEST(HopperRowPairs, WithAndWithoutCtaPairs) {
  SPARSEK_REQUIRE_SM90();
  // Four N tiles: CTA pairs by default; forced off and on (an odd tile count: one CTA of a pair
  // computes a tile past N).
  for (const char* cluster : {static_cast<const char*>(nullptr), "1", "2"}) {
    check_pairs(pair_case(PatternKind::banded, 8, 10, 64, 1024, 0.3, 7), cluster);
    check_pairs(pair_case(PatternKind::block_diagonal, 5, 8, 128, 700, 0.5, 8), cluster);
  }
}

// One row of a pair without any stored block, alpha = +Inf: that row stays beta * C (no Inf * 0),
// while its neighbour gets alpha * its sum.
TEST(HopperRowPairs, HalfRowWithoutBlocksAndInfiniteAlpha) {
  SPARSEK_REQUIRE_SM90();
  const Pattern p = pattern_of(4, {{0, 2}, {}, {}, {1, 3}, {0, 1, 2, 3}});
  for (float alpha : {1.5f, std::numeric_limits<float>::infinity()})
    for (float beta : {0.f, 0.75f}) {
      CaseSpec s = pair_case(PatternKind::bernoulli, 5, 4, 64, 100, 0.5, 21);
      s.custom = &p;
      s.alpha = alpha;
      s.beta = beta;
      if (std::isinf(alpha)) {
        // Only rows without any block can be compared: the others are +-Inf or NaN (Inf * sums).
        SCOPED_TRACE(describe(s));
        EnvFor pairs("SPARSEK_HOPPER_ROW_PAIRS", "on");
        EnvFor wide("SPARSEK_HOPPER_TILE_N", kWideTiles);
        auto gc = make_case(s);
        EXPECT_TRUE(plans_row_pairs(*gc)) << "row pairs did not run";
        const std::vector<double> ref = oracle(gc->args);
        run_hopper(*gc);
        const DenseView& c = gc->c->view;
        for (int64_t r = 64; r < 192; ++r)  // block rows 1 and 2
          for (int64_t n = 0; n < c.cols; ++n) {
            const double want = ref[size_t(r * c.cols + n)];
            ASSERT_TRUE(std::isfinite(want));
            ASSERT_NEAR(gc->c->get(r, n), want, 1e-5 * (1 + std::fabs(want))) << "row " << r << " col " << n;
          }
      } else {
        check_pairs(s);
      }
    }
}

// The two rows of a pair on disjoint columns, longer than the ring (4 stages at 64-deep stages, 8 at
// 32): each consumer skips a long run of stages while the other computes (regression: a consumer
// held its last slot while skipping and waited on that slot's refill).
TEST(HopperRowPairs, DisjointRowsLongerThanTheRing) {
  SPARSEK_REQUIRE_SM90();
  std::vector<std::vector<int32_t>> rows(4);
  for (int r = 0; r < 4; ++r) {
    const int lo = r % 2 == 0 ? 0 : 12, len = r < 2 ? 12 : 9;  // rows 2, 3: runs of 9 with gaps
    for (int c = lo; c < lo + len; ++c) rows[size_t(r)].push_back(int32_t(c));
  }
  const Pattern p = pattern_of(24, rows);
  for (int bk : {32, 64, 128})
    for (const char* cluster : {"1", "2"}) {
      CaseSpec s = pair_case(PatternKind::bernoulli, 4, 24, bk, 512, 0.5, uint64_t(40 + bk));
      s.custom = &p;
      check_pairs(s, cluster);
    }
}

// Many items per CTA (200 pairs on one 256-column tile: the producer fills the next item's stages
// while the consumers store the last one), and pairs longer than the producer's 32-position stash.
TEST(HopperRowPairs, ManyItemsPerCtaAndLongPairs) {
  SPARSEK_REQUIRE_SM90();
  check_pairs(pair_case(PatternKind::banded, 400, 400, 64, 256, 3.0 / 400.0, 51));
  std::vector<std::vector<int32_t>> rows(3);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 80; ++c)
      if (r == 0 ? c % 2 == 0 : r == 1 ? c < 70 : c % 3 == 1) rows[size_t(r)].push_back(int32_t(c));
  const Pattern p = pattern_of(80, rows);
  for (int bk : {64, 128}) {  // pair 0: 75 positions (one or two stages each); pair 1: one row
    CaseSpec s = pair_case(PatternKind::bernoulli, 3, 80, bk, 300, 0.5, uint64_t(52 + bk));
    s.custom = &p;
    check_pairs(s);
  }
}

// The layer forward y = x * W^T with W's 64x64 blocks banded: the product runs as the DSD on the
// transposes (C^T = W * x^T), so W's block rows pair and C is written column-major.
TEST(HopperRowPairs, LayerForwardDds) {
  SPARSEK_REQUIRE_SM90();
  for (float beta : {0.f, 0.5f}) {
    CaseSpec s = pair_case(PatternKind::banded, 10, 12, 64, 300, 0.25, uint64_t(60 + int(beta * 2)));
    s.kind = OpKind::dds;
    s.op = Op::trans;
    s.beta = beta;
    check_pairs(s);
  }
}

// B rows that only row 2g reads hold +Inf: row 2g + 1 (whose half of the tile is skipped at those
// columns, not multiplied by zeros) must stay finite and right.
TEST(HopperRowPairs, InfiniteBOnlyReadByOneRowOfAPair) {
  SPARSEK_REQUIRE_SM90();
  const Pattern p = pattern_of(3, {{0, 1}, {2}});
  CaseSpec s = pair_case(PatternKind::bernoulli, 2, 3, 64, 64, 0.5, 31);
  s.custom = &p;
  SCOPED_TRACE(describe(s));
  EnvFor pairs("SPARSEK_HOPPER_ROW_PAIRS", "on");
  EnvFor wide("SPARSEK_HOPPER_TILE_N", kWideTiles);
  auto gc = make_case(s);
  EXPECT_TRUE(plans_row_pairs(*gc)) << "row pairs did not run";
  for (int64_t k = 0; k < 64; ++k) gc->b->set(k, 5, std::numeric_limits<float>::infinity());  // block column 0
  gc->args.b = gc->b->view;
  const std::vector<double> ref = oracle(gc->args);
  run_hopper(*gc);
  const DenseView& c = gc->c->view;
  for (int64_t r = 64; r < 128; ++r)
    for (int64_t n = 0; n < c.cols; ++n) {
      const double want = ref[size_t(r * c.cols + n)];
      ASSERT_TRUE(std::isfinite(gc->c->get(r, n))) << "row " << r << " col " << n;
      ASSERT_NEAR(gc->c->get(r, n), want, 2e-5 * (1 + std::fabs(want))) << "row " << r << " col " << n;
    }
  EXPECT_FALSE(std::isfinite(gc->c->get(0, 5))) << "row 0 reads the infinite column";
}

TEST(HopperRowPairs, PlanPairsSharedColumnsOnly) {
  SPARSEK_REQUIRE_SM90();
  // 64x64 blocks, 32 block rows of 64 columns, N = 512: banded and lower-triangular rows pair,
  // random rows at 12.5% do not; other block heights never do.
  auto chosen = [](PatternKind kind, int bm) {
    CaseSpec s = pair_case(kind, 32, 64, 64, 512, 0.125, 5);
    s.bm = bm;
    s.rows = 32 * bm;
    auto gc = make_case(s);
    return plans_row_pairs(*gc);
  };
  EXPECT_TRUE(chosen(PatternKind::banded, 64));
  EXPECT_TRUE(chosen(PatternKind::causal, 64));
  EXPECT_TRUE(chosen(PatternKind::block_diagonal, 64));
  EXPECT_FALSE(chosen(PatternKind::bernoulli, 64));
  EXPECT_FALSE(chosen(PatternKind::banded, 128));
  EXPECT_FALSE(chosen(PatternKind::banded, 32));
  {
    EnvFor off("SPARSEK_HOPPER_ROW_PAIRS", "off");
    EXPECT_FALSE(chosen(PatternKind::banded, 64));
  }
  // Decode widths keep the 64-column tiles (no pairs there).
  CaseSpec s = pair_case(PatternKind::banded, 32, 64, 64, 16, 0.125, 5);
  auto gc = make_case(s);
  EXPECT_FALSE(plans_row_pairs(*gc));
}

// 128-row blocks whose every two neighbouring block rows have the same columns (block-diagonal
// experts) run without CTA pairs by default (the pairs share A, which such rows do not need);
// one row that differs brings the pairs back; SPARSEK_HOPPER_CLUSTER=2 forces them. Each plan's
// product right against the oracle.
TEST(HopperRowPairs, IdenticalNeighbourRowsRunWithoutCtaPairs) {
  SPARSEK_REQUIRE_SM90();
  std::vector<std::vector<int32_t>> rows(16);  // 4 experts of 4 block rows x 4 block columns
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 4; ++c) rows[size_t(r)].push_back(int32_t(4 * (r / 4) + c));
  const Pattern experts = pattern_of(16, rows);
  Pattern one_off = experts;
  one_off.col_idx[size_t(one_off.row_ptr[5])] = 8;  // row 5: {8, 5, 6, 7} -> sorted below
  std::sort(one_off.col_idx.begin() + one_off.row_ptr[5], one_off.col_idx.begin() + one_off.row_ptr[6]);
  auto check = [](const Pattern& p, const char* cluster, const char* want) {
    EnvFor clu("SPARSEK_HOPPER_CLUSTER", cluster);
    CaseSpec s = pair_case(PatternKind::bernoulli, 16, 16, 128, 1024, 0.25, 77);  // 4 N tiles
    s.custom = &p;
    s.bm = 128;
    s.rows = 16 * 128;
    s.beta = 0.5f;
    SCOPED_TRACE(describe(s) + " SPARSEK_HOPPER_CLUSTER=" + (cluster ? cluster : "(unset)"));
    auto gc = make_case(s);
    const std::string line = plan_line(*gc);
    EXPECT_NE(line.find(want), std::string::npos) << line;
    const std::vector<double> ref = oracle(gc->args);
    const std::vector<uint8_t> before = gc->c->bytes;
    run_hopper(*gc);
    expect_output_matches(*gc, ref, before);
  };
  check(experts, nullptr, "cluster=1");
  check(one_off, nullptr, "cluster=2");
  check(experts, "2", "cluster=2");
}

}  // namespace
}  // namespace sparsek::test
