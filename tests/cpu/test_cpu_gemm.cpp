// CPU backend against the fp64 oracle: randomized DSD / DDS / SDD over every block shape, dtype,
// op, layout (with padded leading dimensions) and pattern generator.
#include <limits>
#include <string>

#include "cpu/parallel.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

const int kBlocks[] = {16, 32, 64, 128};
const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

void check(const CaseSpec& s, const Options& opt = {}) {
  SCOPED_TRACE(describe(s));
  auto gc = make_case(s);
  run_and_check(*gc, opt);
}

// Every (bm, bk) in {16..128}^2 for one kind/op; 3 block rows x 3 block cols (the transpose sees
// the same), a free extent that is not a multiple of 16, real values.
void all_block_shapes(OpKind kind, Op op, uint64_t seed) {
  for (int bm : kBlocks)
    for (int bk : kBlocks) {
      CaseSpec s;
      s.kind = kind;
      s.op = op;
      s.bm = bm;
      s.bk = bk;
      s.rows = 3 * bm;
      s.cols = 3 * bk;
      s.free = kind == OpKind::sdd ? 40 : 21;
      s.density = 0.5;
      s.alpha = 0.75f;
      s.seed = seed + uint64_t(bm * 1000 + bk);
      check(s);
    }
}

TEST(CpuGemm, DsdAllBlockShapes) { all_block_shapes(OpKind::dsd, Op::none, 100); }
TEST(CpuGemm, DsdTransAllBlockShapes) { all_block_shapes(OpKind::dsd, Op::trans, 200); }
TEST(CpuGemm, DdsAllBlockShapes) { all_block_shapes(OpKind::dds, Op::none, 300); }
TEST(CpuGemm, DdsTransAllBlockShapes) { all_block_shapes(OpKind::dds, Op::trans, 400); }
TEST(CpuGemm, SddAllBlockShapes) { all_block_shapes(OpKind::sdd, Op::none, 500); }

// dtype x kind x op: integer-valued inputs, so every output dtype must match the exactly-rounded
// result bit for bit; alpha and beta integers too, so beta*C stays exact.
TEST(CpuGemm, DtypesExactIntegers) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (Op op : {Op::none, Op::trans}) {
      if (kind == OpKind::sdd && op == Op::trans) continue;
      for (DType in : kDtypes)
        for (DType out : kDtypes) {
          if (in == DType::f32 && out != DType::f32) continue;
          CaseSpec s;
          s.kind = kind;
          s.op = op;
          s.bm = 32;
          s.bk = 16;
          s.rows = 96;
          s.cols = 64;
          s.free = 19;
          s.in = in;
          s.out = out;
          s.integers = true;
          s.alpha = 2.f;
          s.beta = -1.f;
          s.seed = 7 + uint64_t(int(kind) * 100 + int(op) * 10 + int(in) * 3 + int(out));
          check(s);
        }
    }
}

// Real-valued half inputs: accumulation in f32 means an f32 output is as good as for f32 inputs
// (the oracle reads the same rounded inputs); f16/bf16 outputs are within their rounding.
TEST(CpuGemm, DtypesRealValued) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (DType in : {DType::f16, DType::bf16})
      for (DType out : kDtypes) {
        CaseSpec s;
        s.kind = kind;
        s.op = kind == OpKind::dds ? Op::trans : Op::none;
        s.bm = 64;
        s.bk = 32;
        s.rows = 128;
        s.cols = 256;
        s.free = 50;
        s.in = in;
        s.out = out;
        s.alpha = 1.5f;
        s.beta = 0.5f;
        s.seed = 31 + uint64_t(int(kind) * 9 + int(in) * 3 + int(out));
        check(s);
      }
}

// Every combination of row/col-major dense operands, with padded leading dimensions, for every
// kind and op; mixed dtypes so the typed conversion paths are all exercised.
TEST(CpuGemm, LayoutsAndPaddedLeadingDims) {
  const Layout L[] = {Layout::row_major, Layout::col_major};
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (Op op : {Op::none, Op::trans}) {
      if (kind == OpKind::sdd && op == Op::trans) continue;
      for (Layout l1 : L)
        for (Layout l2 : L) {
          CaseSpec s;
          s.kind = kind;
          s.op = op;
          // The two dense operands of this kind take l1 and l2.
          if (kind == OpKind::dsd) { s.lb = l1; s.lc = l2; }
          if (kind == OpKind::dds) { s.la = l1; s.lc = l2; }
          if (kind == OpKind::sdd) { s.la = l1; s.lb = l2; }
          s.bm = 16;
          s.bk = 32;
          s.rows = 64;
          s.cols = 96;
          s.free = 23;
          s.pad = 5;
          s.in = (n % 3 == 0) ? DType::f32 : (n % 3 == 1) ? DType::f16 : DType::bf16;
          s.out = DType::f32;
          s.integers = true;
          s.beta = 3.f;
          s.seed = 1000 + uint64_t(n++);
          check(s);
        }
    }
}

// Every pattern generator, for every kind.
TEST(CpuGemm, PatternGenerators) {
  int n = 0;
  for (PatternKind pk : {PatternKind::fixed_k, PatternKind::bernoulli, PatternKind::power_law,
                         PatternKind::banded, PatternKind::block_diagonal, PatternKind::causal})
    for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
      CaseSpec s;
      s.kind = kind;
      s.op = (n % 2) && kind != OpKind::sdd ? Op::trans : Op::none;
      s.pattern = pk;
      s.density = 0.25;
      s.bm = 16;
      s.bk = 16;
      s.rows = 16 * 12;
      s.cols = 16 * 10;
      s.free = 17;
      s.seed = 2000 + uint64_t(n++);
      check(s);
    }
}

// The row-product path works in 128-column chunks of the dense side: cross chunk borders with
// an extent just past them, and a wider problem with several block rows per thread.
TEST(CpuGemm, WideDenseSideCrossesChunks) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds})
    for (int64_t free : {127, 129, 300}) {
      CaseSpec s;
      s.kind = kind;
      s.op = Op::trans;
      s.bm = 32;
      s.bk = 64;
      s.rows = 128;
      s.cols = 256;
      s.free = free;
      s.integers = true;
      s.seed = 3000 + uint64_t(free);
      check(s);
    }
}

// Several thread counts give correct results (determinism is in test_semantics).
TEST(CpuGemm, ThreadCounts) {
  for (int threads : {1, 2, 5}) {
    Options o;
    o.threads = threads;
    for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
      CaseSpec s;
      s.kind = kind;
      s.bm = 16;
      s.bk = 16;
      s.rows = 512;
      s.cols = 256;
      s.free = 200;
      s.density = 0.2;
      s.seed = 4000 + uint64_t(threads);
      check(s, o);
    }
  }
}

TEST(CpuThreads, ARequestedCountIsCapped) {
  // Options::threads = INT_MAX on a large problem must not start (or allot scratch for) INT_MAX
  // workers; small requests and small problems are what they were.
  Options o;
  o.threads = std::numeric_limits<int>::max();
  EXPECT_EQ(thread_count(o, 1e18), kMaxThreads);
  EXPECT_EQ(thread_count(o, 1.0), 1);  // one per ~4 MFLOP
  o.threads = 3;
  EXPECT_EQ(thread_count(o, 1e18), 3);
}

}  // namespace
}  // namespace sparsek::test
