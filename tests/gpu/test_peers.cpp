// The peer variants (cuSPARSE BSR / Blocked-ELL SpMM and BSR SDDMM, cuBLAS on the densified sparse
// operand, cuBLAS batched over block-diagonal experts) against the fp64 oracle, their why_not() reasons, and the library-status -> Error mapping.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/oracle.hpp"
#include "kernels/peers/peers.hpp"
#include "gpu/device_case.hpp"
#include "plan/variant.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

const char* const kPeers[] = {"cusparse_bsr", "cusparse_ell", "cublas_dense"};

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t n) {
    if (n) check_cuda(cudaMalloc(&p, n), "cudaMalloc");
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  void put(const void* src, size_t n) { check_cuda(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice), "upload"); }
  void get(void* dst, size_t n) const { check_cuda(cudaMemcpy(dst, p, n, cudaMemcpyDeviceToHost), "download"); }
};

struct Problem {
  int64_t m = 256, k = 192, n = 96;
  int bm = 32, bk = 32;
  double density = 0.25;
  PatternKind pattern = PatternKind::fixed_k;
  DType in = DType::f16, out = DType::f16;
  Layout lb = Layout::row_major, lc = Layout::row_major;
  int64_t pb = 0, pc = 0;
  Op op = Op::none;
  float alpha = 1.f, beta = 0.f;
  bool integers = false;
  bool empty_rows = false;  // drop every third block row
  bool no_blocks = false;   // nnzb = 0
  uint64_t seed = 7;
};

double tolerance(DType out) { return out == DType::bf16 ? 1.6e-2 : out == DType::f16 ? 2e-3 : 1e-4; }

// Runs variant `name` through the public gemm() on device copies of a random problem and returns
// the max relative error against the oracle. C is NaN when beta = 0 (must not leak) and its
// padding must come back untouched.
double run_peer(const std::string& name, const Problem& p, bool split = false) {
  const int64_t rows = p.op == Op::none ? p.m : p.k, cols = p.op == Op::none ? p.k : p.m;
  BsrMatrix a = random_bsr(p.pattern, rows, cols, p.bm, p.bk, p.density, p.in, p.seed, p.integers);
  if (p.empty_rows || p.no_blocks) {
    std::vector<int32_t> rp{0}, ci;
    for (int64_t i = 0; i < a.mb(); ++i) {
      if (!p.no_blocks && i % 3 != 1)
        for (int32_t j = a.row_ptr()[size_t(i)]; j < a.row_ptr()[size_t(i + 1)]; ++j) ci.push_back(a.col_idx()[size_t(j)]);
      rp.push_back(int32_t(ci.size()));
    }
    a = BsrMatrix(rows, cols, p.bm, p.bk, rp, ci, p.in);
    a.fill_random(p.seed + 1, p.integers);
  }
  HostDense b(p.k, p.n, p.in, p.lb, p.pb), c(p.m, p.n, p.out, p.lc, p.pc);
  b.fill_random(p.seed + 2, p.integers);
  if (p.beta == 0.f)
    c.fill(nan_value());
  else
    c.fill_random(p.seed + 3, p.integers);
  const std::vector<uint8_t> c0 = c.bytes;

  GemmArgs h;
  h.kind = OpKind::dsd;
  h.op = p.op;
  h.alpha = p.alpha;
  h.beta = p.beta;
  h.sparse = a.view();
  h.b = b.view;
  h.c = c.view;
  std::vector<double> ref = oracle(h);

  Dev rp(a.row_ptr().size() * 4), ci(a.col_idx().size() * 4), vals(a.value_bytes().size()), db(b.bytes.size()),
      dc(c.bytes.size());
  rp.put(a.row_ptr().data(), a.row_ptr().size() * 4);
  if (a.nnzb()) {
    ci.put(a.col_idx().data(), a.col_idx().size() * 4);
    vals.put(a.value_bytes().data(), a.value_bytes().size());
  }
  db.put(b.bytes.data(), b.bytes.size());
  dc.put(c.bytes.data(), c.bytes.size());
  GemmArgs g = h;
  g.sparse.row_ptr = static_cast<const int32_t*>(rp.p);
  g.sparse.col_idx = a.nnzb() ? static_cast<const int32_t*>(ci.p) : nullptr;
  g.sparse.values = a.nnzb() ? vals.p : nullptr;
  g.sparse.memory = Memory::device;
  g.b.data = db.p;
  g.b.memory = Memory::device;
  g.c.data = dc.p;
  g.c.memory = Memory::device;

  const Variant* v = find_variant(name);
  if (!v) throw std::runtime_error("no variant " + name);
  std::string why = v->why_not(g);
  EXPECT_EQ(why, "") << name;
  Options o;
  o.backend = Backend::cuda;
  o.variant = name;
  if (split) {  // the benchmark's path: convert once, then the core call
    auto st = v->prepare(g, o);
    auto* ps = static_cast<peers::PeerState*>(st.get());
    ps->convert(g, o.stream);
    ps->core(g, o.stream);
    check_cuda(cudaDeviceSynchronize(), "split run");
  } else {
    gemm(g, o);
  }
  check_cuda(cudaDeviceSynchronize(), name.c_str());
  dc.get(c.bytes.data(), c.bytes.size());
  // Padding of C untouched (nothing is written outside C).
  const size_t es = dtype_size(p.out);
  const int64_t minor = p.lc == Layout::row_major ? p.n : p.m;
  for (size_t e = 0; e < c.bytes.size() / es; ++e)
    if (int64_t(e) % c.view.ld >= minor)
      EXPECT_EQ(0, std::memcmp(&c.bytes[e * es], &c0[e * es], es)) << name << ": padding element " << e << " written";
  return max_rel_error(h, ref);
}

// Expects run_peer() within tolerance; a thrown Error is reported (not propagated) so that one
// rejected combination does not hide the others.
void expect_ok(const std::string& name, const Problem& p, const std::string& what, bool split = false,
               double tol = -1) {
  if (tol < 0) tol = tolerance(p.out);
  try {
    double err = run_peer(name, p, split);
    EXPECT_LE(err, tol) << name << " " << what;
  } catch (const Error& e) {
    ADD_FAILURE() << name << " " << what << ": " << to_string(e.status()) << ": " << e.what();
  }
}

// ---- correctness against the oracle ----

struct DtypeCase {
  DType in, out;
};
class PeerDtypes : public ::testing::TestWithParam<std::tuple<std::string, DtypeCase>> {};

GemmArgs device_dsd(int bm, int bk, DType in, DType out);

TEST_P(PeerDtypes, SmallRandomMatchesOracle) {
  Problem p;
  p.in = std::get<1>(GetParam()).in;
  p.out = std::get<1>(GetParam()).out;
  const std::string name = std::get<0>(GetParam());
  if (name == "cusparse_ell" && p.in == DType::f32) {  // reduced precision: refused, with the reason
    std::string why = find_variant(name)->why_not(device_dsd(32, 32, p.in, p.out));
    EXPECT_NE(why.find("TF32"), std::string::npos) << why;
    return;
  }
  SPARSEK_REQUIRE_GPU();
  expect_ok(name, p, "");
}

INSTANTIATE_TEST_SUITE_P(Peers, PeerDtypes,
                         ::testing::Combine(::testing::Values("cusparse_bsr", "cusparse_ell", "cublas_dense"),
                                            ::testing::Values(DtypeCase{DType::f16, DType::f16},
                                                              DtypeCase{DType::f16, DType::f32},
                                                              DtypeCase{DType::bf16, DType::bf16},
                                                              DtypeCase{DType::bf16, DType::f32},
                                                              DtypeCase{DType::f32, DType::f32})),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + to_string(std::get<1>(info.param).in) + "_" +
                                  to_string(std::get<1>(info.param).out);
                         });

TEST(Peers, SmallIntegerInputsExactWithF32Output) {
  SPARSEK_REQUIRE_GPU();
  for (const char* name : kPeers) {
    Problem p;
    p.integers = true;
    p.out = DType::f32;
    p.alpha = 2.f;
    p.beta = -0.5f;
    expect_ok(name, p, "integers, exact", false, 0.0);
  }
}

TEST(Peers, SmallAlphaBetaAndNaNInCWithBetaZero) {
  SPARSEK_REQUIRE_GPU();
  for (const char* name : kPeers) {
    Problem p;
    p.alpha = -0.75f;
    p.beta = 1.5f;
    expect_ok(name, p, "beta != 0");
    p.beta = 0.f;  // C is NaN: must be neither read nor leaked
    expect_ok(name, p, "beta = 0 over NaN");
  }
}

TEST(Peers, SmallEveryLayoutWithPaddedLeadingDimensions) {
  SPARSEK_REQUIRE_GPU();
  for (const char* name : kPeers)
    for (Layout lb : {Layout::row_major, Layout::col_major})
      for (Layout lc : {Layout::row_major, Layout::col_major}) {
        Problem p;
        p.lb = lb;
        p.lc = lc;
        p.pb = 8;
        p.pc = 16;
        p.beta = 0.5f;
        expect_ok(name, p, std::string("B ") + to_string(lb) + " C " + to_string(lc));
      }
}

TEST(Peers, SmallEveryBlockShape) {
  SPARSEK_REQUIRE_GPU();
  for (int bm : {16, 32, 64, 128})
    for (int bk : {16, 32, 64, 128})
      for (const char* name : kPeers) {
        if (std::string(name) != "cublas_dense" && bm != bk) continue;  // why_not covers it (below)
        Problem p;
        p.m = 256;
        p.k = 256;
        p.n = 40;
        p.bm = bm;
        p.bk = bk;
        expect_ok(name, p, std::to_string(bm) + "x" + std::to_string(bk));
      }
}

TEST(Peers, EdgeEmptyRowsNoBlocksAndNEqualsOne) {
  SPARSEK_REQUIRE_GPU();
  for (const char* name : {"cusparse_bsr", "cublas_dense"}) {
    Problem p;
    p.empty_rows = true;
    p.beta = 0.f;
    expect_ok(name, p, "empty rows");
    p.empty_rows = false;
    p.no_blocks = true;
    p.beta = -2.f;  // C = beta * C
    expect_ok(name, p, "nnzb = 0");
    p.no_blocks = false;
    p.beta = 0.f;
    p.n = 1;
    expect_ok(name, p, "N = 1");
  }
  Problem p;
  p.n = 1;
  expect_ok("cusparse_ell", p, "N = 1");
}

TEST(Peers, CublasDenseOpTrans) {
  SPARSEK_REQUIRE_GPU();
  Problem p;
  p.op = Op::trans;
  p.m = 128;
  p.k = 320;
  p.bm = 64;
  p.bk = 32;
  expect_ok("cublas_dense", p, "op = trans");
}

TEST(Peers, SplitConvertThenCoreMatchesOracle) {
  SPARSEK_REQUIRE_GPU();
  for (const char* name : kPeers) {
    Problem p;
    p.m = 512;
    p.k = 384;
    p.n = 256;
    p.bm = p.bk = 64;
    p.density = 0.125;
    expect_ok(name, p, "convert + core", /*split=*/true);
  }
}

// DDS (both ops, both layouts of A) and SDD (both layouts of A and B) against the oracle, through
// cuBLAS and cuSPARSE (SpMM where it reads the sparse operand untransposed, SDDMM on a BSR C).
// cuSPARSE may decline SDDMM on BSR (Status::unsupported, the library's own answer): reported,
// not failed; any other error fails.
TEST(Peers, DdsAndSdd) {
  SPARSEK_REQUIRE_GPU();
  int n = 0;
  auto check = [&](const char* name, CaseSpec s) {
    s.seed = uint64_t(3000 + n++);
    SCOPED_TRACE(std::string(name) + ": " + describe(s));
    auto gc = make_case(s);
    const std::vector<double> ref = oracle(gc->args);
    const std::vector<uint8_t> before = gc->c ? gc->c->bytes : std::vector<uint8_t>();
    DeviceCase dc(*gc);
    ASSERT_EQ(find_variant(name)->why_not(dc.args), "");
    Options o;
    o.variant = name;
    try {
      gemm(dc.args, o);
    } catch (const Error& e) {
      if (e.status() == Status::unsupported && s.kind == OpKind::sdd) {
        std::printf("[ note ] %s declined: %s\n", name, e.what());
        return;
      }
      throw;
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dc.download(*gc);
    expect_output_matches(*gc, ref, before);
  };
  for (Op op : {Op::none, Op::trans})
    for (Layout la : {Layout::row_major, Layout::col_major}) {
      CaseSpec s;
      s.kind = OpKind::dds;
      s.op = op;
      s.rows = s.cols = 128;
      s.bm = s.bk = 32;
      s.free = 48;
      s.in = DType::f16;
      s.out = DType::f32;
      s.la = la;
      s.beta = 0.5f;
      check("cublas_dense", s);
      if (op == Op::trans) check("cusparse_bsr", s);
    }
  for (Layout la : {Layout::row_major, Layout::col_major})
    for (Layout lb : {Layout::row_major, Layout::col_major}) {
      CaseSpec s;
      s.kind = OpKind::sdd;
      s.rows = 128;
      s.cols = 96;
      s.bm = s.bk = 32;
      s.free = 40;
      s.in = DType::f16;
      s.out = DType::f16;
      s.la = la;
      s.lb = lb;
      check("cublas_dense", s);
      check("cusparse_bsr", s);
    }
}

// ---- why_not reasons (pure checks on the arguments: no GPU needed) ----

GemmArgs device_dsd(int bm, int bk, DType in, DType out) {
  static const int32_t rp[2] = {0, 0};
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.sparse.rows = 2 * bm;
  g.sparse.cols = 2 * bk;
  g.sparse.bm = bm;
  g.sparse.bk = bk;
  g.sparse.row_ptr = rp;
  g.sparse.dtype = in;
  g.sparse.memory = Memory::device;
  g.b.rows = 2 * bk;
  g.b.cols = 8;
  g.b.ld = 8;
  g.b.dtype = in;
  g.b.memory = Memory::device;
  g.c.rows = 2 * bm;
  g.c.cols = 8;
  g.c.ld = 8;
  g.c.dtype = out;
  g.c.memory = Memory::device;
  return g;
}

std::string why(const char* name, const GemmArgs& g) { return find_variant(name)->why_not(g); }

// DDS runs as the DSD on the transposes: the SpMM peers take it when that DSD reads the sparse
// operand untransposed (dds op trans); SDD: cuSPARSE SDDMM (BSR) and cuBLAS, not Blocked-ELL.
TEST(PeersWhyNot, Kinds) {
  for (const char* name : kPeers) {
    ASSERT_NE(find_variant(name), nullptr) << name;
    EXPECT_TRUE(find_variant(name)->peer) << name;
    EXPECT_EQ(find_variant(name)->backend, Backend::cuda) << name;
  }
  GemmArgs g = device_dsd(32, 32, DType::f16, DType::f16);  // sparse 64 x 64, nnzb = 0
  g.kind = OpKind::dds;
  g.a = g.b;
  g.a.rows = 8;
  g.a.cols = 64;
  g.a.ld = 64;
  g.c.rows = 8;
  g.c.cols = 64;
  g.c.ld = 64;
  g.op = Op::trans;
  EXPECT_EQ(why("cusparse_bsr", g), "");
  EXPECT_EQ(why("cublas_dense", g), "");
  EXPECT_EQ(why("cusparse_ell", g), "nnzb = 0 (no Blocked-ELL columns)");
  g.op = Op::none;
  EXPECT_NE(why("cusparse_bsr", g).find("op(A) = none only (dsd op none, dds op trans)"), std::string::npos);
  EXPECT_NE(why("cusparse_ell", g).find("op(A) = none only"), std::string::npos);
  EXPECT_EQ(why("cublas_dense", g), "");
  GemmArgs s = g;  // SDD: C (the sparse operand) 64 x 64 = A (64 x 8) * B (8 x 64)
  s.kind = OpKind::sdd;
  s.a = DenseView{nullptr, 64, 8, 8, Layout::row_major, DType::f16, Memory::device};
  s.b = DenseView{nullptr, 8, 64, 64, Layout::row_major, DType::f16, Memory::device};
  EXPECT_EQ(why("cusparse_bsr", s), "");
  EXPECT_EQ(why("cublas_dense", s), "");
  EXPECT_EQ(why("cusparse_ell", s), "cuSPARSE has no Blocked-ELL sampled product (sdd)");
}

TEST(PeersWhyNot, HostMemoryAndTypeCombinations) {
  for (const char* name : kPeers) {
    GemmArgs g = device_dsd(32, 32, DType::f16, DType::f16);
    g.sparse.memory = Memory::host;
    EXPECT_NE(why(name, g).find("needs device memory"), std::string::npos) << name;
    g = device_dsd(32, 32, DType::f16, DType::bf16);
    EXPECT_NE(why(name, g).find("output bf16 with f16 inputs"), std::string::npos) << name;
    g = device_dsd(32, 32, DType::bf16, DType::f16);
    EXPECT_NE(why(name, g).find("output f16 with bf16 inputs"), std::string::npos) << name;
  }
}

TEST(PeersWhyNot, TransposeAndShapes) {
  GemmArgs g = device_dsd(32, 32, DType::f16, DType::f16);
  g.op = Op::trans;
  EXPECT_NE(why("cusparse_bsr", g).find("op(A) = none only"), std::string::npos);
  EXPECT_NE(why("cusparse_ell", g).find("op(A) = none only"), std::string::npos);
  EXPECT_EQ(why("cublas_dense", g), "");
  g = device_dsd(128, 32, DType::f16, DType::f16);
  EXPECT_EQ(why("cusparse_ell", g), "Blocked-ELL needs square blocks (bm=128, bk=32)");
  EXPECT_EQ(why("cusparse_bsr", g), "cuSPARSE BSR needs square blocks (bm=128, bk=32)");
  EXPECT_EQ(why("cublas_dense", g), "");
  g = device_dsd(64, 64, DType::f16, DType::f16);  // nnzb = 0
  EXPECT_EQ(why("cusparse_ell", g), "nnzb = 0 (no Blocked-ELL columns)");
}

TEST(PeersWhyNot, EllNeedsUniformRows) {
  SPARSEK_REQUIRE_GPU();
  const int32_t rp_h[3] = {0, 2, 3};
  Dev rp(sizeof rp_h);
  rp.put(rp_h, sizeof rp_h);
  GemmArgs g = device_dsd(32, 32, DType::f16, DType::f16);
  g.sparse.row_ptr = static_cast<const int32_t*>(rp.p);
  g.sparse.nnzb = 3;
  EXPECT_EQ(why("cusparse_ell", g),
            "Blocked-ELL needs the same block count in every block row (row 0 has 2, row 1 has 1)");
}

// ---- cuBLAS strided-batched GEMM over block-diagonal experts ----

TEST(Peers, CublasBatchedExpertsEveryLayoutAndDtype) {
  SPARSEK_REQUIRE_GPU();
  Problem p;
  p.pattern = PatternKind::block_diagonal;
  p.m = 256;
  p.k = 256;
  p.n = 72;
  p.density = 0.25;  // 4 experts of 2 x 2 blocks
  for (Layout lb : {Layout::row_major, Layout::col_major})
    for (Layout lc : {Layout::row_major, Layout::col_major}) {
      p.lb = lb;
      p.lc = lc;
      p.pb = 8;
      p.pc = 16;
      p.beta = 0.5f;
      expect_ok("cublas_batched", p, std::string("B ") + to_string(lb) + " C " + to_string(lc));
      expect_ok("cublas_batched", p, std::string("convert + core, B ") + to_string(lb) + " C " + to_string(lc), true);
    }
  p = Problem{};
  p.pattern = PatternKind::block_diagonal;
  p.m = 512;  // rectangular experts (128 x 64 rows x columns), blocks 64 x 32
  p.k = 256;
  p.bm = 64;
  p.bk = 32;
  p.density = 0.25;
  for (DtypeCase d : {DtypeCase{DType::f16, DType::f16}, DtypeCase{DType::bf16, DType::f32},
                      DtypeCase{DType::bf16, DType::bf16}, DtypeCase{DType::f32, DType::f32}}) {
    p.in = d.in;
    p.out = d.out;
    p.beta = 0.f;  // C is NaN: neither read nor leaked
    expect_ok("cublas_batched", p, std::string(to_string(d.in)) + " -> " + to_string(d.out));
  }
  p.in = DType::f16;
  p.out = DType::f32;
  p.integers = true;
  p.alpha = 2.f;
  p.beta = -0.5f;
  expect_ok("cublas_batched", p, "integers, exact", false, 0.0);
  p = Problem{};
  p.pattern = PatternKind::block_diagonal;
  p.density = 1.0;  // one expert: the dense product
  p.n = 1;
  expect_ok("cublas_batched", p, "one expert, N = 1");
}

TEST(PeersWhyNot, CublasBatchedNeedsEqualFullyStoredExperts) {
  GemmArgs g = device_dsd(32, 32, DType::f16, DType::f16);  // nnzb = 0
  EXPECT_EQ(why("cublas_batched", g), "A stores no block");
  g.sparse.memory = Memory::host;
  EXPECT_NE(why("cublas_batched", g).find("needs device memory"), std::string::npos);
  SPARSEK_REQUIRE_GPU();
  // 4 x 4 block rows and columns; each case's rows in turn.
  auto why_of = [](std::vector<int32_t> rp_h, std::vector<int32_t> ci_h, Op op = Op::none) {
    Dev rp(rp_h.size() * 4), ci(ci_h.size() * 4);
    rp.put(rp_h.data(), rp_h.size() * 4);
    ci.put(ci_h.data(), ci_h.size() * 4);
    GemmArgs g = device_dsd(32, 32, DType::f16, DType::f16);
    g.sparse.rows = g.sparse.cols = g.b.rows = g.c.rows = 128;
    g.sparse.row_ptr = static_cast<const int32_t*>(rp.p);
    g.sparse.col_idx = static_cast<const int32_t*>(ci.p);
    g.sparse.nnzb = int64_t(ci_h.size());
    g.op = op;
    return why("cublas_batched", g);
  };
  EXPECT_EQ(why_of({0, 2, 4, 6, 8}, {0, 1, 0, 1, 2, 3, 2, 3}), "");  // 2 experts of 2 x 2
  EXPECT_EQ(why_of({0, 1, 2, 3, 4}, {0, 1, 2, 3}), "");              // 4 experts of 1 x 1
  EXPECT_EQ(why_of({0, 2, 4, 6, 8}, {0, 1, 0, 1, 2, 3, 2, 3}, Op::trans), "runs the DSD product with op none only");
  EXPECT_EQ(why_of({0, 2, 4, 6, 8}, {0, 1, 0, 1, 2, 3, 3, 2}),
            "A is not block-diagonal with equal, fully stored experts (block row 3 does not store exactly block "
            "columns 2..3)");
  EXPECT_EQ(why_of({0, 2, 4, 5, 6}, {0, 1, 0, 1, 2, 3}),
            "A is not block-diagonal with equal, fully stored experts (block row 2 does not store exactly block "
            "columns 2..3)");
  EXPECT_EQ(why_of({0, 2, 4, 6, 8}, {0, 1, 0, 1, 0, 1, 2, 3}),  // 3 rows on columns 0..1, then 1: unequal
            "A is not block-diagonal with equal, fully stored experts (block row 0 stores 2 of 4 block columns)");
  EXPECT_EQ(why_of({0, 1, 2, 3, 4}, {1, 0, 2, 3}),
            "A is not block-diagonal with equal, fully stored experts (block row 0 stores 1 of 4 block columns)");
}

// ---- library status -> sparsek::Error ----

TEST(PeersErrors, StatusNamesAndCodes) {
  try {
    peers::check_cusparse(CUSPARSE_STATUS_NOT_SUPPORTED, "cusparseSpMM");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_NE(std::string(e.what()).find("cusparseSpMM failed: CUSPARSE_STATUS_NOT_SUPPORTED"), std::string::npos)
        << e.what();
  }
  try {
    peers::check_cublas(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::cuda_error);
    EXPECT_NE(std::string(e.what()).find("cublasGemmEx failed: CUBLAS_STATUS_INVALID_VALUE"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(peers::check_cusparse(CUSPARSE_STATUS_SUCCESS, "ok"));
  EXPECT_NO_THROW(peers::check_cublas(CUBLAS_STATUS_SUCCESS, "ok"));
  EXPECT_FALSE(peers::cublas_version().empty());
  EXPECT_FALSE(peers::cusparse_version().empty());
}

}  // namespace
}  // namespace sparsek::test
