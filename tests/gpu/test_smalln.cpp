// GPU tests of the small-N streaming DSD variant "smalln" against the fp64 oracle: every N class
// (1, 2, 3, 7, 8, 15, 16, 17, 63, 64 and two N tiles up to 128), every block shape, f16 / bf16 in
// and every output dtype, B and C row- or column-major with padded or odd leading dimensions and
// misaligned pointers (each way of reading B), beta != 0 and beta = 0 over NaN, empty rows,
// nnzb = 0, very long rows cut into pieces (the second, reducing launch), bit-identical repeats,
// and what why_not() rejects.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cpu/oracle.hpp"
#include "gpu/device_case.hpp"
#include "plan/variant.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

const int kBlocks[] = {16, 32, 64, 128};

Options smalln() {
  Options o;
  o.backend = Backend::cuda;
  o.variant = "smalln";
  return o;
}

// Runs the case through `smalln` (dense pointers moved by dense_offset bytes) and returns C's bytes.
std::vector<uint8_t> run_smalln(GemmCase& gc, size_t dense_offset = 0) {
  DeviceCase dc(gc, dense_offset);
  gemm(dc.args, smalln());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "smalln kernel";
  std::vector<uint8_t> got(gc.c->bytes.size());
  dc.c->download(got.data());
  return got;
}

// Copies a run's C bytes into the case's own storage: the case's views (gc.c->view, gc.args.c)
// point at that storage, so it must be written in place, never replaced (a moved-in vector
// would leave them reading freed memory).
void set_output(GemmCase& gc, const std::vector<uint8_t>& got) {
  ASSERT_EQ(got.size(), gc.c->bytes.size());
  std::copy(got.begin(), got.end(), gc.c->bytes.begin());
}

// Builds the case, runs it, checks it against the oracle (C's padding must stay untouched).
void check(const CaseSpec& s, size_t dense_offset = 0) {
  SCOPED_TRACE(describe(s) + (dense_offset ? " dense pointers +" + std::to_string(dense_offset) + " B" : ""));
  auto gc = make_case(s);
  const std::vector<double> ref = oracle(gc->args);
  const std::vector<uint8_t> before = gc->c->bytes;
  set_output(*gc, run_smalln(*gc, dense_offset));
  expect_output_matches(*gc, ref, before);
}

CaseSpec dsd(int bm, int bk, int64_t n, uint64_t seed) {
  CaseSpec s;
  s.bm = bm;
  s.bk = bk;
  s.rows = 5 * bm;
  s.cols = 6 * bk;
  s.density = 0.5;
  s.free = n;
  s.in = seed % 2 ? DType::bf16 : DType::f16;
  s.out = DType::f32;
  s.alpha = 0.75f;
  s.seed = seed;
  return s;
}

// ---- why_not: runs anywhere (no device memory is touched) ----

GemmArgs fake_args(int bm, int bk, int64_t n, DType dt) {
  alignas(256) static char storage[1 << 12];
  static const int32_t rp[3] = {0, 1, 1}, ci[1] = {0};
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.sparse.rows = 2 * bm;
  g.sparse.cols = bk;
  g.sparse.bm = bm;
  g.sparse.bk = bk;
  g.sparse.nnzb = 1;
  g.sparse.row_ptr = rp;
  g.sparse.col_idx = ci;
  g.sparse.values = storage;
  g.sparse.dtype = dt;
  g.sparse.memory = Memory::device;
  g.b = DenseView{storage, bk, n, n, Layout::row_major, dt, Memory::device};
  g.c = DenseView{storage, 2 * bm, n, n, Layout::row_major, DType::f32, Memory::device};
  return g;
}

TEST(SmallN, WhyNotRejects) {
  const Variant* v = find_variant("smalln");
  ASSERT_NE(v, nullptr);
  auto has = [&](const GemmArgs& g, const char* part) {
    const std::string w = v->why_not(g);
    EXPECT_NE(w.find(part), std::string::npos) << "'" << w << "' lacks '" << part << "'";
  };
  GemmArgs g = fake_args(64, 64, 16, DType::f16);
  g.kind = OpKind::dds;
  has(g, "dsd only");
  g = fake_args(64, 64, 16, DType::f16);
  g.op = Op::trans;
  has(g, "trans");
  has(fake_args(64, 64, 16, DType::f32), "f16 or bf16");
  has(fake_args(48, 64, 16, DType::f16), "bm=48");
  has(fake_args(64, 8, 16, DType::bf16), "bk=8");
  has(fake_args(64, 64, 129, DType::f16), "N=129");
  g = fake_args(64, 64, 16, DType::f16);
  g.sparse.values = static_cast<char*>(g.sparse.values) + 4;
  has(g, "8-byte aligned (address % 8 = 4)");
  g = fake_args(64, 64, 16, DType::f16);
  g.c.memory = Memory::host;
  has(g, "device memory");
  // Supported: "" on a GPU of compute capability 8.0+, else a reason naming the device.
  g = fake_args(16, 128, 128, DType::bf16);
  const auto& d = device_info();
  if (d.available && d.cc_major >= 8)
    EXPECT_EQ(v->why_not(g), "");
  else
    EXPECT_FALSE(v->why_not(g).empty());
}

// ---- correctness on the device ----

// Every N class of the list (one, two, four and eight n8 tiles, ragged and whole) on four
// block shapes, f16 and bf16, every output dtype.
TEST(SmallN, EveryNClass) {
  SPARSEK_REQUIRE_GPU();
  const int shapes[][2] = {{16, 16}, {32, 128}, {64, 64}, {128, 32}};
  uint64_t seed = 1;
  for (int64_t n : {1, 2, 3, 7, 8, 15, 16, 17, 63, 64})
    for (const auto& sh : shapes) {
      CaseSpec s = dsd(sh[0], sh[1], n, seed++);
      s.out = seed % 3 == 0 ? DType::f32 : seed % 3 == 1 ? DType::f16 : DType::bf16;
      check(s);
    }
}

// Every (bm, bk) in {16..128}^2, at a decode-like N, a ragged N and two N tiles (65, 128).
TEST(SmallN, EveryBlockShape) {
  SPARSEK_REQUIRE_GPU();
  uint64_t seed = 100;
  for (int bm : kBlocks)
    for (int bk : kBlocks)
      for (int64_t n : {16, 37, 65, 128}) check(dsd(bm, bk, n, seed++));
}

// B and C row- or column-major, with tight, padded (ld > N) and odd leading dimensions, beta != 0
// (C read), and dense pointers moved by 2 bytes: B is read by 8-byte k runs (column-major),
// NT-column row loads (row-major) or element by element (odd ld, misaligned, ragged N).
TEST(SmallN, LayoutsLeadingDimensionsAndAlignment) {
  SPARSEK_REQUIRE_GPU();
  uint64_t seed = 300;
  for (Layout lb : {Layout::row_major, Layout::col_major})
    for (Layout lc : {Layout::row_major, Layout::col_major})
      for (int64_t pad : {0, 3, 8})
        for (int64_t n : {1, 16, 40}) {
          CaseSpec s = dsd(64, 32, n, seed++);
          s.lb = lb;
          s.lc = lc;
          s.pad = pad;
          s.beta = 0.5f;
          s.out = DType::f16;
          check(s);
          if (pad == 0 && n != 40) check(s, 2);  // misaligned B and C: element-wise reads of B
        }
}

// Integer-valued inputs give exact sums: alpha, beta != 0, f32 and bf16 outputs, both B layouts.
TEST(SmallN, IntegerDataIsExact) {
  SPARSEK_REQUIRE_GPU();
  uint64_t seed = 400;
  for (int64_t n : {1, 8, 16, 33, 64, 96})
    for (Layout lb : {Layout::row_major, Layout::col_major}) {
      CaseSpec s = dsd(32, 64, n, seed++);
      s.integers = true;
      s.alpha = 2.f;
      s.beta = -1.f;
      s.lb = lb;
      s.out = n % 2 ? DType::bf16 : DType::f32;
      check(s);
    }
}

// Rows with no stored block give beta * C (zeros over NaN when beta = 0); no stored block at all.
TEST(SmallN, EmptyRowsAndNoStoredBlocks) {
  SPARSEK_REQUIRE_GPU();
  Pattern p;
  p.mb = 6;
  p.kb = 5;
  p.row_ptr = {0, 0, 3, 3, 5, 5, 5};  // rows 0, 2, 4, 5 empty
  p.col_idx = {0, 2, 4, 1, 3};
  Pattern none;
  none.mb = 4;
  none.kb = 3;
  none.row_ptr = {0, 0, 0, 0, 0};
  for (const Pattern* pat : {&p, &none})
    for (float beta : {0.f, 0.75f})
      for (int64_t n : {1, 16, 70}) {
        CaseSpec s = dsd(32, 64, n, uint64_t(500 + n));
        s.custom = pat;
        s.rows = pat->mb * 32;
        s.cols = pat->kb * 64;
        s.beta = beta;
        check(s);
      }
}

// Bytes smalln's prepare() holds on the device for the case (the schedule, plus partial tiles
// when it cut a row into pieces).
size_t smalln_workspace(GemmCase& gc) {
  DeviceCase dc(gc);
  return find_variant("smalln")->prepare(dc.args, smalln())->workspace_bytes();
}

// One very long row among short ones is cut into pieces that write partial sums, which a second
// launch adds in a fixed order: exact on integers, bit-identical over repeats (real values), for
// the smallest, the decode and the largest block shape.
TEST(SmallN, VeryLongRowIsSplitAndRepeatsBitIdentical) {
  SPARSEK_REQUIRE_GPU();
  for (const auto& sh : {std::pair{16, 16}, std::pair{64, 64}, std::pair{128, 128}}) {
    const int bm = sh.first, bk = sh.second;
    const int64_t mb = 40, kb = 8192 / bk;  // K = 8192
    Pattern p;
    p.mb = mb;
    p.kb = kb;
    for (int64_t r = 0; r < mb; ++r) {
      if (r == 7)
        for (int64_t c = 0; c < kb; ++c) p.col_idx.push_back(int32_t(c));  // the whole of K
      else if (r % 5 != 3)
        p.col_idx.push_back(int32_t((r * 7) % kb));
      p.row_ptr.push_back(int32_t(p.col_idx.size()));
    }
    p.row_ptr.insert(p.row_ptr.begin(), 0);
    for (bool integers : {true, false}) {
      CaseSpec s = dsd(bm, bk, 16, uint64_t(600 + bm));
      s.custom = &p;
      s.rows = mb * bm;
      s.cols = kb * bk;
      s.integers = integers;
      s.out = DType::f32;
      SCOPED_TRACE(describe(s));
      auto gc = make_case(s);
      // The row is ~60% of all stored blocks: far above one SM's share, so it is cut and the
      // partial tiles (at least two of bm x 16 floats) join the workspace.
      EXPECT_GE(smalln_workspace(*gc), size_t(2 * bm * 16 * 4)) << "the long row was not cut";
      if (integers) {
        check(s);
        continue;
      }
      const std::vector<uint8_t> first = run_smalln(*gc);
      for (int rep = 0; rep < 3; ++rep) EXPECT_TRUE(run_smalln(*gc) == first) << "run " << rep << " differs";
      const std::vector<double> ref = oracle(gc->args);
      set_output(*gc, first);
      EXPECT_LE(max_rel_error(gc->args, ref), 1e-4);
    }
  }
}

// Decode shape in miniature, default variant choice. Where hopper applies (an sm_90 GPU) it is
// chosen for 64x64 blocks at every N (its 64-column tiles) and smalln keeps 32x32 blocks up to one
// 64-column tile; elsewhere smalln takes every N <= 128. smalln's picks bit-identical to a forced
// smalln run.
TEST(SmallN, DefaultChoiceBySmallN) {
  SPARSEK_REQUIRE_GPU();
  // The heuristic's choice: a tuning cache on the machine may rightly choose otherwise.
  SavedEnv saved("SPARSEK_TUNE");
  setenv("SPARSEK_TUNE", "off", 1);
  for (int blk : {32, 64})
    for (int64_t n : {1, 16, 64, 128}) {
      CaseSpec s = dsd(blk, blk, n, uint64_t(700 + n + blk));
      s.rows = 1024;
      s.cols = 512;
      s.density = 0.25;
      s.pattern = PatternKind::fixed_k;
      auto gc = make_case(s);
      DeviceCase dc(*gc);
      Options o;
      o.backend = Backend::cuda;
      const Plan p = plan(dc.args, o);
      const bool hopper = find_variant("hopper")->why_not(dc.args).empty();
      const bool want_smalln = !hopper || (blk == 32 && n <= 64);
      EXPECT_EQ(p.variant(), want_smalln ? "smalln" : "hopper") << blk << "x" << blk << " N=" << n;
      if (p.variant() == "smalln") {
        run(p, dc.args, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint8_t> got(gc->c->bytes.size());
        dc.c->download(got.data());
        EXPECT_TRUE(got == run_smalln(*gc)) << "N=" << n;
      }
    }
}

}  // namespace
}  // namespace sparsek::test
