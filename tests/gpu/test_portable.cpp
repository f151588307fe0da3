// The portable sm80 variant against the fp64 oracle: operands are built on the host (format
// generators, NaN-poisoned outputs), copied to the device, run with variant "portable", copied
// back and checked exactly (integer-valued inputs) or within the output dtype's rounding.
#include <cuda_runtime.h>

#include <cstring>
#include <limits>
#include <string>

#include "cpu/oracle.hpp"
#include "gpu/device_case.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

const int kBlocks[] = {16, 32, 64, 128};

void cuda_ok(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

Options portable() {
  Options o;
  o.variant = "portable";
  return o;
}

// Builds the case, runs it on the GPU through the portable variant, checks it.
void check(const CaseSpec& s, size_t dense_offset = 0) {
  SCOPED_TRACE(describe(s));
  auto gc = make_case(s);
  const std::vector<double> ref = oracle(gc->args);  // on the host, before C changes
  const std::vector<uint8_t> before = gc->c ? gc->c->bytes : std::vector<uint8_t>();
  DeviceCase dc(*gc, dense_offset);
  gemm(dc.args, portable());
  cuda_ok(cudaDeviceSynchronize(), "portable kernel");
  dc.download(*gc);
  expect_output_matches(*gc, ref, before);
}

CaseSpec base(OpKind kind, Op op, int bm, int bk, uint64_t seed) {
  CaseSpec s;
  s.kind = kind;
  s.op = op;
  s.bm = bm;
  s.bk = bk;
  s.rows = 3 * bm;
  s.cols = 3 * bk;
  s.density = 0.5;
  s.in = DType::f16;
  s.out = DType::f32;
  s.seed = seed;
  return s;
}

// Every (bm, bk) in {16..128}^2: 3x3 blocks, half of them stored, a free extent that is not a
// multiple of any tile (N tails; SDD: K = 40, a K tail), real values.
void all_block_shapes(OpKind kind, Op op, DType in, DType out, uint64_t seed) {
  for (int bm : kBlocks)
    for (int bk : kBlocks) {
      CaseSpec s = base(kind, op, bm, bk, seed + uint64_t(bm * 1000 + bk));
      s.free = kind == OpKind::sdd ? 40 : 21;
      s.in = in;
      s.out = out;
      s.alpha = 0.75f;
      check(s);
    }
}

TEST(Portable, DsdAllBlockShapes) {
  SPARSEK_REQUIRE_GPU();
  all_block_shapes(OpKind::dsd, Op::none, DType::f16, DType::f32, 100);
}
TEST(Portable, DsdTransAllBlockShapes) {
  SPARSEK_REQUIRE_GPU();
  all_block_shapes(OpKind::dsd, Op::trans, DType::bf16, DType::f32, 200);
}
TEST(Portable, DdsAllBlockShapes) {
  SPARSEK_REQUIRE_GPU();
  all_block_shapes(OpKind::dds, Op::none, DType::f16, DType::f16, 300);
}
TEST(Portable, DdsTransAllBlockShapes) {
  SPARSEK_REQUIRE_GPU();
  all_block_shapes(OpKind::dds, Op::trans, DType::bf16, DType::bf16, 400);
}
TEST(Portable, SddAllBlockShapes) {
  SPARSEK_REQUIRE_GPU();
  all_block_shapes(OpKind::sdd, Op::none, DType::f16, DType::f32, 500);
}

// Integer-valued inputs, every input x output dtype, kind and op: bit-exact against the rounded
// exact result (alpha, beta integers keep alpha*acc + beta*C exact in f32).
TEST(Portable, DtypesExactIntegers) {
  SPARSEK_REQUIRE_GPU();
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (Op op : {Op::none, Op::trans}) {
      if (kind == OpKind::sdd && op == Op::trans) continue;
      for (DType in : {DType::f16, DType::bf16})
        for (DType out : {DType::f32, DType::f16, DType::bf16}) {
          CaseSpec s = base(kind, op, 32, 16, 700 + uint64_t(n++));
          s.rows = 96;
          s.cols = 64;
          s.free = kind == OpKind::sdd ? 48 : 19;
          s.in = in;
          s.out = out;
          s.integers = true;
          s.alpha = 2.f;
          s.beta = -1.f;
          check(s);
        }
    }
}

// Row/column-major dense operands with leading dimensions: pad 0 (tight), 8 (aligned, the
// cp.async path) and 5 (odd leading dimension: the element-load path).
TEST(Portable, LayoutsAndLeadingDims) {
  SPARSEK_REQUIRE_GPU();
  const Layout L[] = {Layout::row_major, Layout::col_major};
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (Op op : {Op::none, Op::trans}) {
      if (kind == OpKind::sdd && op == Op::trans) continue;
      for (Layout l1 : L)
        for (Layout l2 : L)
          for (int64_t pad : {0, 8, 5}) {
            CaseSpec s = base(kind, op, 32, 64, 900 + uint64_t(n++));
            if (kind == OpKind::dsd) { s.lb = l1; s.lc = l2; }
            if (kind == OpKind::dds) { s.la = l1; s.lc = l2; }
            if (kind == OpKind::sdd) { s.la = l1; s.lb = l2; }
            s.rows = 96;
            s.cols = 128;
            s.free = 136;
            s.pad = pad;
            s.in = n % 2 ? DType::bf16 : DType::f16;
            s.out = n % 3 == 0 ? DType::f32 : n % 3 == 1 ? DType::f16 : DType::bf16;
            s.integers = true;
            s.beta = 3.f;
            check(s);
          }
    }
}

// Misaligned dense pointers (2 bytes off 16): every dense load takes the element path and the
// output the scalar path, with the same results.
TEST(Portable, MisalignedDensePointers) {
  SPARSEK_REQUIRE_GPU();
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (Layout l : {Layout::row_major, Layout::col_major}) {
      CaseSpec s = base(kind, n % 2 ? Op::trans : Op::none, 64, 32, 1100 + uint64_t(n++));
      if (kind == OpKind::sdd) s.op = Op::none;
      s.la = s.lb = s.lc = l;
      s.free = 50;
      s.out = DType::f16;
      s.integers = true;
      s.beta = 1.f;
      check(s, /*dense_offset=*/2);
    }
}

// Thin products: N = 1 (DSD), M = 1 (DDS), K = 1 and K = 17 (SDD, not a multiple of 16), and a
// free extent just past one 128-column tile.
TEST(Portable, ThinAndTailExtents) {
  SPARSEK_REQUIRE_GPU();
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (int64_t free : {1, 17, 129, 300})
      for (Op op : {Op::none, Op::trans}) {
        if (kind == OpKind::sdd && op == Op::trans) continue;
        CaseSpec s = base(kind, op, 16, 32, 1200 + uint64_t(n++));
        s.rows = 64;
        s.cols = 96;
        s.free = free;
        s.integers = true;
        s.alpha = -1.f;
        check(s);
      }
}

// nnzb = 0: C = beta * C (zeros for beta = 0 with NaN in C); SDD has nothing to write.
TEST(Portable, NoStoredBlocks) {
  SPARSEK_REQUIRE_GPU();
  Pattern empty;
  empty.mb = 4;
  empty.kb = 3;
  empty.row_ptr.assign(5, 0);
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (float beta : {0.f, 2.f})
      for (Op op : {Op::none, Op::trans}) {
        if (kind == OpKind::sdd && op == Op::trans) continue;
        CaseSpec s = base(kind, op, 32, 64, 1300);
        s.rows = 4 * 32;
        s.cols = 3 * 64;
        s.custom = &empty;
        s.free = 37;
        s.beta = beta;
        s.integers = true;
        check(s);
      }
}

// 5 block rows x 4 block cols; rows 0, 2, 4 empty; block column 1 empty.
Pattern gapped_pattern() {
  Pattern p;
  p.mb = 5;
  p.kb = 4;
  p.row_ptr = {0, 0, 3, 3, 5, 5};
  p.col_idx = {0, 2, 3, 0, 3};
  return p;
}

// Empty block rows (and, transposed, empty block columns) between full ones; beta = 0 with
// NaN-poisoned C must give exact zeros there.
TEST(Portable, EmptyRowsAndNaNPoisonedC) {
  SPARSEK_REQUIRE_GPU();
  const Pattern p = gapped_pattern();
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (Op op : {Op::none, Op::trans})
      for (DType out : {DType::f32, DType::bf16}) {
        if (kind == OpKind::sdd && op == Op::trans) continue;
        CaseSpec s = base(kind, op, 16, 128, 1400 + uint64_t(n++));
        s.rows = 5 * 16;
        s.cols = 4 * 128;
        s.custom = &p;
        s.free = 45;
        s.out = out;
        s.beta = 0.f;  // make_case poisons C with NaN
        check(s);
      }
}

// alpha = +-Inf: output elements no stored block reaches stay beta*C (the oracle's and the CPU
// backend's semantics), not Inf * 0 = NaN.
TEST(Portable, InfiniteAlphaLeavesEmptyRowsBetaC) {
  SPARSEK_REQUIRE_GPU();
  const Pattern p = gapped_pattern();
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds})
    for (Op op : {Op::none, Op::trans})
      for (float beta : {0.f, 2.f}) {
        CaseSpec s = base(kind, op, 16, 32, 1450 + uint64_t(n++));
        s.rows = 5 * 16;
        s.cols = 4 * 32;
        s.custom = &p;
        s.free = 19;
        s.alpha = -std::numeric_limits<float>::infinity();
        s.beta = beta;
        check(s);
      }
}

// Rows longer than the kernel stages in shared memory at once (1024 blocks): the K loop runs in
// segments.
TEST(Portable, VeryLongRow) {
  SPARSEK_REQUIRE_GPU();
  for (Op op : {Op::none, Op::trans}) {
    CaseSpec s = base(OpKind::dsd, op, 16, 16, 1500);
    // op(A) has 2 block rows of 1100 blocks: A is 2 x 1100 blocks, or 1100 x 2 transposed.
    s.rows = 16 * (op == Op::none ? 2 : 1100);
    s.cols = 16 * (op == Op::none ? 1100 : 2);
    s.pattern = PatternKind::fixed_k;
    s.density = 1.0;
    s.free = 24;
    s.integers = true;
    check(s);
  }
}

// Every pattern generator, every kind.
TEST(Portable, PatternGenerators) {
  SPARSEK_REQUIRE_GPU();
  int n = 0;
  for (PatternKind pk : {PatternKind::fixed_k, PatternKind::bernoulli, PatternKind::power_law,
                         PatternKind::banded, PatternKind::block_diagonal, PatternKind::causal})
    for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
      CaseSpec s = base(kind, (n % 2) && kind != OpKind::sdd ? Op::trans : Op::none, 32, 32, 1600 + uint64_t(n++));
      s.pattern = pk;
      s.density = 0.25;
      s.rows = 32 * 12;
      s.cols = 32 * 10;
      s.free = 70;
      s.in = DType::bf16;
      s.out = DType::bf16;
      s.alpha = 1.25f;
      s.beta = -0.5f;
      check(s);
    }
}

// A larger real-valued product (several CTAs per SM, deep K loops) in both half dtypes.
TEST(Portable, LargerRealValued) {
  SPARSEK_REQUIRE_GPU();
  int n = 0;
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (DType in : {DType::f16, DType::bf16}) {
      CaseSpec s = base(kind, n % 2 ? Op::trans : Op::none, 128, 32, 1700 + uint64_t(n++));
      if (kind == OpKind::sdd) s.op = Op::none;
      s.rows = 1024;
      s.cols = 1024;
      s.pattern = PatternKind::fixed_k;
      s.density = 0.25;
      s.free = 384;
      s.in = in;
      s.out = in;
      check(s);
    }
}

// Same inputs, same GPU: bit-identical output on every repeat (no atomics, fixed order).
TEST(Portable, RepeatRunsBitIdentical) {
  SPARSEK_REQUIRE_GPU();
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
    CaseSpec s = base(kind, kind == OpKind::dds ? Op::none : Op::none, 64, 64, 1800);
    s.rows = 512;
    s.cols = 512;
    s.free = 200;
    s.density = 0.3;
    s.out = DType::f32;
    auto gc = make_case(s);
    DeviceCase dc(*gc);
    std::vector<uint8_t> first;
    for (int rep = 0; rep < 3; ++rep) {
      gemm(dc.args, portable());
      cuda_ok(cudaDeviceSynchronize(), "portable kernel");
      dc.download(*gc);
      const std::vector<uint8_t>& now = kind == OpKind::sdd ? gc->sparse.value_bytes() : gc->c->bytes;
      if (rep == 0) first = now;
      else EXPECT_EQ(std::memcmp(first.data(), now.data(), first.size()), 0) << to_string(kind) << " repeat " << rep;
    }
  }
}

// The portable result agrees with the CPU variant on the same inputs (within the f32
// accumulation-order difference).
TEST(Portable, AgreesWithCpuVariant) {
  SPARSEK_REQUIRE_GPU();
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
    CaseSpec s = base(kind, kind == OpKind::dsd ? Op::trans : Op::none, 64, 128, 1900);
    s.rows = 256;
    s.cols = 512;
    s.free = 100;
    s.pattern = PatternKind::power_law;
    s.density = 0.3;
    s.beta = 0.5f;
    auto gc = make_case(s);
    DeviceCase dc(*gc);
    gemm(dc.args, portable());
    cuda_ok(cudaDeviceSynchronize(), "portable kernel");
    gemm(gc->args);  // host operands: the CPU variant
    const std::vector<float> cpu = output_values(*gc);
    dc.download(*gc);
    const std::vector<float> gpu = output_values(*gc);
    ASSERT_EQ(cpu.size(), gpu.size());
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < cpu.size(); ++i) {
      worst = std::max(worst, double(std::fabs(cpu[i] - gpu[i])));
      scale = std::max(scale, double(std::fabs(cpu[i])));
    }
    EXPECT_LE(worst / scale, 1e-5) << to_string(kind);
  }
}

// why_not() reasons (no device work: runs without a GPU too).
TEST(Portable, UnsupportedReasons) {
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.sparse.rows = g.sparse.cols = 32;
  g.sparse.bm = g.sparse.bk = 16;
  g.sparse.memory = Memory::device;
  g.sparse.dtype = DType::f32;
  g.b.rows = 32;
  g.b.cols = 8;
  g.b.dtype = DType::f32;
  g.c.rows = 32;
  g.c.cols = 8;
  auto reason = [&]() {
    for (const std::string& r : unsupported_reasons(g))
      if (r.rfind("portable: ", 0) == 0) return r.substr(10);
    return std::string();
  };
  EXPECT_EQ(reason(), "f32 inputs: tensor-core variants need f16/bf16");
  g.sparse.memory = Memory::host;
  g.sparse.dtype = g.b.dtype = DType::f16;
  EXPECT_NE(reason().find("host memory"), std::string::npos) << reason();
  g.sparse.memory = Memory::device;
  g.sparse.bm = 48;
  EXPECT_EQ(reason(), "bm=48 not in {16,32,64,128}");
  g.sparse.bm = 16;
  g.sparse.bk = 8;
  EXPECT_EQ(reason(), "bk=8 not in {16,32,64,128}");
}

}  // namespace
}  // namespace sparsek::test
