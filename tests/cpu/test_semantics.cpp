// The semantics users rely on (docs/guide-cpp.md, "What it computes"), on the CPU backend: beta = 0 never
// reads C, beta != 0 accumulates, empty block rows give beta*C, nnzb = 0, one block, fully dense, N = 1, dense extents
// that are not multiples of anything, one very long row, and bit-identical results for any thread
// count.
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/blas_cpu.hpp"
#include "plan/variant.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

const OpKind kKinds[] = {OpKind::dsd, OpKind::dds, OpKind::sdd};

// Ops worth running for a kind (sdd has no op).
std::vector<Op> ops_for(OpKind k) { return k == OpKind::sdd ? std::vector<Op>{Op::none} : std::vector<Op>{Op::none, Op::trans}; }

CaseSpec base(OpKind kind, Op op, uint64_t seed) {
  CaseSpec s;
  s.kind = kind;
  s.op = op;
  s.bm = 16;
  s.bk = 32;
  s.rows = 96;
  s.cols = 128;
  s.free = 24;
  s.integers = true;
  s.seed = seed;
  return s;
}

TEST(Semantics, BetaZeroNeverReadsNaNInC) {
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind))
      for (DType out : {DType::f32, DType::f16, DType::bf16}) {
        CaseSpec s = base(kind, op, 10 + uint64_t(out));
        s.in = out;
        s.out = out;
        s.beta = 0.f;  // make_case poisons C (dense or BSR values) with NaN
        SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op) + " out=" + to_string(out));
        auto gc = make_case(s);
        gemm(gc->args);
        for (float v : output_values(*gc)) ASSERT_FALSE(std::isnan(v)) << "NaN from C leaked into the output";
        run_and_check(*gc);  // and the values are right
      }
}

TEST(Semantics, BetaNonZeroAccumulates) {
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind)) {
      SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op));
      CaseSpec s = base(kind, op, 20);
      s.alpha = 1.f;
      s.beta = 1.f;
      auto gc = make_case(s);
      const std::vector<float> c0 = output_values(*gc);
      const std::vector<double> once = oracle(gc->args);  // C0 + AB
      gemm(gc->args);
      gemm(gc->args);  // C0 + 2 AB
      const std::vector<float> got = output_values(*gc);
      ASSERT_EQ(got.size(), once.size());
      for (size_t e = 0; e < got.size(); ++e)
        ASSERT_EQ(double(got[e]), 2.0 * once[e] - double(c0[e])) << "element " << e;
    }
}

TEST(Semantics, AlphaZeroScalesC) {
  for (OpKind kind : kKinds) {
    CaseSpec s = base(kind, Op::none, 30);
    s.alpha = 0.f;
    s.beta = -2.f;
    auto gc = make_case(s);
    const std::vector<float> c0 = output_values(*gc);
    gemm(gc->args);
    const std::vector<float> got = output_values(*gc);
    for (size_t e = 0; e < got.size(); ++e) ASSERT_EQ(got[e], -2.f * c0[e]) << to_string(kind) << " element " << e;
  }
}

// Block rows 0, 2 and 5 of the sparse operand hold nothing.
TEST(Semantics, EmptyBlockRowsGiveBetaC) {
  const Pattern p = pattern_of(4, {{}, {0, 3}, {}, {1}, {0, 1, 2, 3}, {}});
  for (float beta : {0.f, 2.f}) {
    // dsd, op none: C rows of an empty block row are beta*C exactly.
    CaseSpec s = base(OpKind::dsd, Op::none, 40);
    s.custom = &p;
    s.rows = 6 * 16;
    s.cols = 4 * 32;
    s.beta = beta;
    auto gc = make_case(s);
    std::vector<float> c0 = output_values(*gc);
    gemm(gc->args);
    const std::vector<float> got = output_values(*gc);
    const int64_t N = s.free;
    for (int64_t br : {0, 2, 5})
      for (int64_t r = br * 16; r < br * 16 + 16; ++r)
        for (int64_t n = 0; n < N; ++n) {
          const float want = beta == 0.f ? 0.f : beta * c0[size_t(r * N + n)];
          ASSERT_EQ(got[size_t(r * N + n)], want) << "beta=" << beta << " C(" << r << "," << n << ")";
        }
    // dds, op trans: C = A * B^T, so C's columns of B's empty block rows are beta*C.
    CaseSpec d = s;
    d.kind = OpKind::dds;
    d.op = Op::trans;
    auto gd = make_case(d);
    c0 = output_values(*gd);
    gemm(gd->args);
    const std::vector<float> gotd = output_values(*gd);
    const int64_t Nd = 6 * 16;
    for (int64_t m = 0; m < d.free; ++m)
      for (int64_t br : {0, 2, 5})
        for (int64_t n = br * 16; n < br * 16 + 16; ++n) {
          const float want = beta == 0.f ? 0.f : beta * c0[size_t(m * Nd + n)];
          ASSERT_EQ(gotd[size_t(m * Nd + n)], want) << "beta=" << beta << " C(" << m << "," << n << ")";
        }
  }
  // And the whole result against the oracle, for every kind and op.
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind)) {
      CaseSpec s = base(kind, op, 41);
      s.custom = &p;
      s.rows = 6 * 16;
      s.cols = 4 * 32;
      s.beta = 3.f;
      SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op));
      auto gc = make_case(s);
      run_and_check(*gc);
    }
}

TEST(Semantics, NoStoredBlocks) {
  const Pattern p = pattern_of(3, {{}, {}, {}, {}});
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind))
      for (float beta : {0.f, 0.5f}) {
        CaseSpec s = base(kind, op, 50);
        s.custom = &p;
        s.rows = 4 * 16;
        s.cols = 3 * 32;
        s.beta = beta;
        s.integers = false;
        SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op) + " beta=" + std::to_string(beta));
        auto gc = make_case(s);
        const std::vector<float> c0 = output_values(*gc);
        gemm(gc->args);
        const std::vector<float> got = output_values(*gc);
        for (size_t e = 0; e < got.size(); ++e) ASSERT_EQ(got[e], beta == 0.f ? 0.f : beta * c0[e]);
      }
}

// K = 0 (the sparse operand has no block columns, or sdd's inner extent is 0): C = beta*C.
TEST(Semantics, EmptyReduction) {
  const Pattern p = pattern_of(0, {{}, {}});
  for (OpKind kind : {OpKind::dsd, OpKind::dds}) {
    CaseSpec s = base(kind, kind == OpKind::dsd ? Op::none : Op::trans, 55);
    s.custom = &p;
    s.rows = 2 * 16;
    s.cols = 0;
    auto gc = make_case(s);
    run_and_check(*gc);
    for (float v : output_values(*gc)) ASSERT_EQ(v, 0.f);
  }
  CaseSpec s = base(OpKind::sdd, Op::none, 56);
  s.free = 0;
  s.beta = 2.f;
  auto gc = make_case(s);
  run_and_check(*gc);
}

TEST(Semantics, OneBlock) {
  const Pattern p = pattern_of(3, {{}, {2}, {}});
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind)) {
      CaseSpec s = base(kind, op, 60);
      s.custom = &p;
      s.rows = 3 * 16;
      s.cols = 3 * 32;
      s.beta = -1.f;
      SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op));
      auto gc = make_case(s);
      run_and_check(*gc);
    }
}

TEST(Semantics, FullyDense) {
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind)) {
      CaseSpec s = base(kind, op, 70);
      s.density = 1.0;
      SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op));
      auto gc = make_case(s);
      ASSERT_EQ(gc->sparse.nnzb(), (s.rows / s.bm) * (s.cols / s.bk));
      run_and_check(*gc);
    }
}

// The oracle itself against a plain dense triple loop over bsr_to_dense (DSD, both ops), so a
// mistake shared by oracle and backend cannot hide.
TEST(Semantics, OracleMatchesDenseProduct) {
  for (Op op : {Op::none, Op::trans}) {
    CaseSpec s = base(OpKind::dsd, op, 75);
    s.density = 0.5;
    auto gc = make_case(s);
    const std::vector<float> a = bsr_to_dense(gc->sparse);  // rows x cols
    const int64_t M = gc->args.m(), N = gc->args.n(), K = gc->args.k();
    const std::vector<double> ref = oracle(gc->args);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          const float av = op == Op::none ? a[size_t(m * s.cols + k)] : a[size_t(k * s.cols + m)];
          sum += double(av) * double(gc->b->get(k, n));
        }
        ASSERT_EQ(ref[size_t(m * N + n)], sum) << "op=" << to_string(op) << " (" << m << "," << n << ")";
      }
    gemm(gc->args);
    EXPECT_EQ(max_rel_error(gc->args, ref), 0.0);
  }
}

// N = 1 for dsd, M = 1 for dds, K = 1 for sdd, in both layouts.
TEST(Semantics, ExtentOne) {
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind))
      for (Layout l : {Layout::row_major, Layout::col_major}) {
        CaseSpec s = base(kind, op, 80);
        s.free = 1;
        s.la = s.lb = s.lc = l;
        s.beta = 2.f;
        SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op) + " " + to_string(l));
        auto gc = make_case(s);
        run_and_check(*gc);
      }
}

TEST(Semantics, DenseExtentsNotMultiples) {
  for (OpKind kind : kKinds)
    for (int64_t free : {3, 15, 17, 65}) {
      CaseSpec s = base(kind, kind == OpKind::sdd ? Op::none : Op::trans, 90 + uint64_t(free));
      s.free = free;
      s.pad = 3;
      SCOPED_TRACE(std::string(to_string(kind)) + " free=" + std::to_string(free));
      auto gc = make_case(s);
      run_and_check(*gc);
    }
}

// One block row holds every block column, the others one or none: load balance must not change
// the result.
TEST(Semantics, OneVeryLongRow) {
  std::vector<std::vector<int32_t>> rows(8);
  for (int32_t c = 0; c < 64; ++c) rows[3].push_back(c);
  rows[0] = {5};
  rows[6] = {63};
  const Pattern p = pattern_of(64, rows);
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind)) {
      CaseSpec s = base(kind, op, 100);
      s.custom = &p;
      s.bm = 16;
      s.bk = 16;
      s.rows = 8 * 16;
      s.cols = 64 * 16;
      s.free = 40;
      s.beta = 1.f;
      SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op));
      auto gc = make_case(s);
      Options o;
      o.threads = 2;
      run_and_check(*gc, o);
    }
}

// Same inputs -> the same bits for every thread count (real-valued data, so a different summation
// order would show).
TEST(Semantics, DeterministicAcrossThreadCounts) {
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind)) {
      CaseSpec s = base(kind, op, 110);
      s.integers = false;
      s.in = DType::f32;
      s.bm = 32;
      s.bk = 16;
      s.rows = 512;
      s.cols = 512;
      s.free = kind == OpKind::sdd ? 300 : 200;
      s.pattern = PatternKind::power_law;
      s.density = 0.3;
      s.beta = 0.25f;
      std::vector<uint8_t> first;
      for (int threads : {1, 2, 3, 8, 16, 0}) {  // 0: OpenMP's default (OMP_NUM_THREADS or every core)
        auto gc = make_case(s);
        Options o;
        o.threads = threads;
        gemm(gc->args, o);
        const std::vector<uint8_t>& bytes = gc->c ? gc->c->bytes : gc->sparse.value_bytes();
        if (first.empty()) {
          first = bytes;
        } else {
          ASSERT_EQ(bytes.size(), first.size());
          EXPECT_EQ(std::memcmp(bytes.data(), first.data(), bytes.size()), 0)
              << to_string(kind) << " op=" << to_string(op) << ": threads=" << threads
              << " differs from threads=1";
        }
      }
    }
}

// A NaN in one block row stays in that row: the next work item on the same thread reuses the
// scratch of a NaN row (the BLAS path does not zero it; its first call has beta = 0, which must
// not read it). One thread, every block stored, so the rows run in order on one scratch.
TEST(Semantics, ANaNInOneBlockRowStaysThere) {
  CaseSpec s = base(OpKind::dsd, Op::none, 130);
  s.bm = 64;
  s.bk = 64;
  s.rows = 256;
  s.cols = 192;
  s.free = 300;
  s.density = 1.0;
  auto clean = make_case(s), poisoned = make_case(s);
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(poisoned->sparse.value_bytes().data(), &nan, sizeof nan);  // block row 0, element (0, 0)
  Options o;
  o.threads = 1;
  gemm(clean->args, o);
  gemm(poisoned->args, o);
  const std::vector<uint8_t>&x = clean->c->bytes, &y = poisoned->c->bytes;
  ASSERT_EQ(x.size(), y.size());
  const size_t row0 = size_t(s.free) * sizeof(float);  // C's first row (row-major, no padding)
  float first;
  std::memcpy(&first, y.data(), sizeof first);
  EXPECT_TRUE(std::isnan(first));
  const size_t rows1 = size_t(s.bm) * row0;  // block row 0 ends here
  EXPECT_EQ(std::memcmp(x.data() + rows1, y.data() + rows1, x.size() - rows1), 0)
      << "the NaN of block row 0 reached another block row";
}

// The same on the tiles the block products are cut into when they run through BLAS (64 x 64 and
// 128 x 32 blocks, a free extent of several column chunks with a partial last one, f16 inputs,
// a column-major C); the one-thread run is also checked against the fp64 reference.
TEST(Semantics, DeterministicAcrossThreadCountsOnBlasTiles) {
  SCOPED_TRACE("CPU BLAS: " + cpu_blas_description());
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind))
      for (int blk : {0, 1}) {
        CaseSpec s = base(kind, op, 120 + uint64_t(blk));
        s.integers = false;
        s.in = blk ? DType::f32 : DType::f16;
        s.bm = blk ? 128 : 64;
        s.bk = blk ? 32 : 64;
        s.rows = 512;
        s.cols = 512;
        s.free = kind == OpKind::sdd ? 200 : 600;
        s.lc = blk ? Layout::col_major : Layout::row_major;
        s.density = 0.25;
        s.alpha = 1.5f;
        s.beta = 0.25f;
        std::vector<uint8_t> first;
        for (int threads : {1, 2, 4}) {
          SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op) + " block " + std::to_string(s.bm) + "x" +
                       std::to_string(s.bk) + " threads=" + std::to_string(threads));
          auto gc = make_case(s);
          Options o;
          o.threads = threads;
          if (threads == 1)
            run_and_check(*gc, o);
          else
            gemm(gc->args, o);
          const std::vector<uint8_t>& bytes = gc->c ? gc->c->bytes : gc->sparse.value_bytes();
          if (first.empty()) {
            first = bytes;
          } else {
            ASSERT_EQ(bytes.size(), first.size());
            EXPECT_EQ(std::memcmp(bytes.data(), first.data(), bytes.size()), 0) << "differs from threads=1";
          }
        }
      }
}

TEST(Semantics, NegativeThreadCountIsRejected) {
  auto gc = make_case(base(OpKind::dsd, Op::none, 120));
  Options o;
  o.threads = -3;
  try {
    gemm(gc->args, o);
    FAIL() << "threads=-3 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("threads=-3"), std::string::npos) << e.what();
  }
}

// plan() rejects it too, rather than making a plan whose every run would fail.
TEST(Semantics, NegativeThreadCountIsRejectedByPlan) {
  auto gc = make_case(base(OpKind::dsd, Op::none, 121));
  Options o;
  o.threads = -1;
  try {
    plan(gc->args, o);
    FAIL() << "threads=-1 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("options.threads=-1"), std::string::npos) << e.what();
  }
}

TEST(Semantics, CpuVariantIsRegisteredForHostMemory) {
  auto gc = make_case(base(OpKind::dsd, Op::none, 130));
  const std::vector<std::string> names = supported_variants(gc->args);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "cpu");
  // In device memory the cpu variant declines and says why.
  GemmArgs dev = gc->args;
  dev.sparse.memory = dev.b.memory = dev.c.memory = Memory::device;
  bool found = false;
  for (const std::string& r : unsupported_reasons(dev))
    if (r.rfind("cpu: ", 0) == 0) {
      found = true;
      EXPECT_NE(r.find("host memory"), std::string::npos) << r;
    }
  EXPECT_TRUE(found) << "no reason given for the cpu variant on device memory";
}

// The variant also runs without prepare() (it then builds its pattern state itself).
TEST(Semantics, RunWithoutPrepare) {
  const Variant* v = find_variant("cpu");
  ASSERT_NE(v, nullptr);
  for (OpKind kind : kKinds)
    for (Op op : ops_for(kind)) {
      auto gc = make_case(base(kind, op, 140));
      const std::vector<double> ref = oracle(gc->args);
      v->run(gc->args, Options{}, nullptr);
      EXPECT_EQ(max_rel_error(gc->args, ref), 0.0) << to_string(kind) << " op=" << to_string(op);
    }
}

}  // namespace
}  // namespace sparsek::test
