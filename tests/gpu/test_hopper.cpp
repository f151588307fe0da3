// GPU tests of the Hopper (sm_90a) DSD variant "hopper" against the fp64 oracle: every block
// shape, fp16 / bf16, output dtypes, ragged and tiny N, empty rows, nnzb = 0, beta = 0 with NaN in
// C, a long row, C column-major, bit-identical repeats, and why_not() on what it must reject.
// op(A) = A^T, column-major B, DDS and SDD: test_hopper_products.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cpu/oracle.hpp"
#include "plan/variant.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

// Owned device memory (nullptr for 0 bytes).
struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n) check_cuda(cudaMalloc(&p, n), "cudaMalloc");
  }
  DeviceBuffer(const void* host, size_t n) : DeviceBuffer(n) {
    if (n) check_cuda(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void download(void* host) const {
    if (bytes) check_cuda(cudaMemcpy(host, p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
};

struct Case {
  int64_t mb = 4, kb = 6;
  int bm = 64, bk = 64;
  int64_t n = 200;
  DType in = DType::f16, out = DType::f32;
  double density = 0.4;
  float alpha = 1.5f, beta = 0.f;
  bool integers = false;
  Layout c_layout = Layout::row_major;
  int64_t b_pad = 0, c_pad = 0;
  std::vector<int64_t> empty_rows;  // block rows forced empty (-1 = the last one)
  std::vector<int64_t> full_rows;   // block rows forced to hold every block column
  uint64_t seed = 1;
  std::string name() const {
    return "bm=" + std::to_string(bm) + " bk=" + std::to_string(bk) + " mb=" + std::to_string(mb) +
           " kb=" + std::to_string(kb) + " N=" + std::to_string(n) + " in=" + to_string(in) +
           " out=" + to_string(out) + " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
           (integers ? " integers" : "") + (c_layout == Layout::col_major ? " C col-major" : "");
  }
};

BsrMatrix make_matrix(const Case& cs) {
  Pattern p = make_pattern(PatternKind::bernoulli, cs.mb, cs.kb, cs.density, cs.seed);
  std::vector<std::vector<int32_t>> rows(size_t(cs.mb));
  for (int64_t r = 0; r < cs.mb; ++r)
    for (int32_t j = p.row_ptr[r]; j < p.row_ptr[r + 1]; ++j) rows[size_t(r)].push_back(p.col_idx[j]);
  for (int64_t r : cs.empty_rows) rows[size_t(r < 0 ? cs.mb + r : r)].clear();
  for (int64_t r : cs.full_rows) {
    auto& v = rows[size_t(r < 0 ? cs.mb + r : r)];
    v.clear();
    for (int32_t c = 0; c < cs.kb; ++c) v.push_back(c);
  }
  std::vector<int32_t> rp{0}, ci;
  for (const auto& v : rows) {
    ci.insert(ci.end(), v.begin(), v.end());
    rp.push_back(int32_t(ci.size()));
  }
  BsrMatrix a(cs.mb * cs.bm, cs.kb * cs.bk, cs.bm, cs.bk, rp, ci, cs.in);
  a.fill_random(cs.seed + 1, cs.integers);
  return a;
}

// The operands of one case on the host and on the device.
struct Problem {
  Case cs;
  BsrMatrix a;
  HostDense b, c;  // c: the C given to the product (NaN when beta == 0)
  DeviceBuffer d_rp, d_ci, d_vals;
  std::unique_ptr<DeviceBuffer> d_b, d_c;
  explicit Problem(const Case& k)
      : cs(k),
        a(make_matrix(k)),
        b(k.kb * k.bk, k.n, k.in, Layout::row_major, k.b_pad),
        c(k.mb * k.bm, k.n, k.out, k.c_layout, k.c_pad),
        d_rp(a.row_ptr().data(), a.row_ptr().size() * 4),
        d_ci(a.col_idx().data(), a.col_idx().size() * 4),
        d_vals(a.value_bytes().data(), a.value_bytes().size()) {
    b.fill_random(k.seed + 2, k.integers);
    if (k.beta != 0.f)
      c.fill_random(k.seed + 3, k.integers);
    else
      c.fill(nan_value());  // must not leak: beta == 0 never reads C
    d_b = std::make_unique<DeviceBuffer>(b.bytes.data(), b.bytes.size());
    d_c = std::make_unique<DeviceBuffer>(c.bytes.data(), c.bytes.size());
  }
  GemmArgs device_args() {
    GemmArgs g;
    g.kind = OpKind::dsd;
    g.alpha = cs.alpha;
    g.beta = cs.beta;
    g.sparse = a.view();
    g.sparse.row_ptr = static_cast<const int32_t*>(d_rp.p);
    g.sparse.col_idx = static_cast<const int32_t*>(d_ci.p);
    g.sparse.values = d_vals.p;
    g.sparse.memory = Memory::device;
    g.b = b.view;
    g.b.data = d_b->p;
    g.b.memory = Memory::device;
    g.c = c.view;
    g.c.data = d_c->p;
    g.c.memory = Memory::device;
    return g;
  }
  GemmArgs host_args(HostDense& out) {
    GemmArgs g;
    g.kind = OpKind::dsd;
    g.alpha = cs.alpha;
    g.beta = cs.beta;
    g.sparse = a.view();
    g.b = b.view;
    g.c = out.view;
    return g;
  }
  // Runs the product on the device (C re-uploaded first) and returns C's bytes.
  std::vector<uint8_t> run(const std::string& variant = "hopper") {
    // NOTE: a fresh plan every time: the one-shot cache is keyed by the problem, not by the
    // SPARSEK_HOPPER_* switches the tests set between runs, so a cached plan would ignore them.
    clear_one_shot_plan_cache();
    check_cuda(cudaMemcpy(d_c->p, c.bytes.data(), c.bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy C");
    Options o;
    o.backend = Backend::cuda;
    o.variant = variant;
    gemm(device_args(), o);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after gemm");
    std::vector<uint8_t> got(c.bytes.size());
    d_c->download(got.data());
    return got;
  }
};

double tolerance(const Case& cs) {
  if (cs.integers && cs.out == DType::f32) return 0.0;  // exact: small integers, fp32 accumulation
  // NOTE: the tensor cores' fp32 accumulation rounds toward zero (seen on H100: a 9600-long row
  // came out 2.7e-5 of max|C| low, every error of the same sign), so the bound grows with K.
  const double k = double(cs.kb * cs.bk);
  switch (cs.out) {
    case DType::f32: return 2e-5 * std::max(1.0, k / 2048.0);
    case DType::f16: return 1.5e-3;
    case DType::bf16: return 1e-2;
  }
  return 0.0;
}

// Runs a case, checks it against the oracle, and prints the worst elements when it fails.
void check_case(const Case& cs) {
  SCOPED_TRACE(cs.name());
  Problem p(cs);
  std::vector<uint8_t> got = p.run();
  HostDense given(p.c.view.rows, p.c.view.cols, cs.out, cs.c_layout, cs.c_pad);
  given.bytes = p.c.bytes;
  given.view.data = given.bytes.data();
  const std::vector<double> ref = oracle(p.host_args(given));
  HostDense out(p.c.view.rows, p.c.view.cols, cs.out, cs.c_layout, cs.c_pad);
  out.bytes = got;
  out.view.data = out.bytes.data();
  const double err = max_rel_error(p.host_args(out), ref);
  const double tol = tolerance(cs);
  EXPECT_LE(err, tol);
  // Nothing outside C's rows x cols (the padding of its leading dimension) may be written.
  const DenseView& v = given.view;
  const size_t es = dtype_size(v.dtype);
  for (size_t i = 0; i < got.size() / es; ++i) {
    const int64_t major = int64_t(i) / v.ld, minor = int64_t(i) % v.ld;
    const bool inside = v.layout == Layout::row_major ? (major < v.rows && minor < v.cols)
                                                      : (minor < v.rows && major < v.cols);
    if (!inside && std::memcmp(&got[i * es], &given.bytes[i * es], es) != 0) {
      ADD_FAILURE() << "C padding element " << i << " (ld " << v.ld << ") was written";
      break;
    }
  }
  if (!(err <= tol)) {
    double scale = 1e-30;
    for (double r : ref) scale = std::max(scale, std::fabs(r));
    int shown = 0;
    const int64_t M = out.view.rows, N = out.view.cols;
    for (int64_t m = 0; m < M && shown < 12; ++m)
      for (int64_t n = 0; n < N && shown < 12; ++n) {
        const double g = out.get(m, n), r = ref[size_t(m * N + n)];
        if (!(std::fabs(g - r) <= tol * scale)) {
          ADD_FAILURE() << "C(" << m << ", " << n << ") = " << g << ", want " << r;
          ++shown;
        }
      }
  }
}

// ---- why_not: runs anywhere (no device memory is touched) ----

GemmArgs fake_device_args(int bm, int bk, int64_t n, int64_t ldb, DType dt) {
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
  g.b = DenseView{storage, bk, n, ldb, Layout::row_major, dt, Memory::device};
  g.c = DenseView{storage, 2 * bm, n, n, Layout::row_major, DType::f32, Memory::device};
  return g;
}

TEST(Hopper, WhyNotRejects) {
  const Variant* v = find_variant("hopper");
  ASSERT_NE(v, nullptr);
  auto why = [&](const GemmArgs& g) { return v->why_not(g); };
  auto has = [](const std::string& s, const char* part) { return s.find(part) != std::string::npos; };

  GemmArgs g = fake_device_args(64, 64, 128, 128, DType::f32);
  EXPECT_TRUE(has(why(g), "f16 or bf16")) << why(g);
  g = fake_device_args(16, 64, 128, 128, DType::f16);
  EXPECT_TRUE(has(why(g), "bm=16")) << why(g);
  g = fake_device_args(64, 16, 128, 128, DType::bf16);
  EXPECT_TRUE(has(why(g), "bk=16")) << why(g);
  g = fake_device_args(64, 64, 128, 128, DType::f16);
  g.sparse.values = static_cast<char*>(g.sparse.values) + 8;
  EXPECT_TRUE(has(why(g), "A values must be 16-byte aligned")) << why(g);
  g = fake_device_args(64, 64, 128, 128, DType::f16);
  g.sparse.memory = Memory::host;
  EXPECT_TRUE(has(why(g), "device memory")) << why(g);

  // Supported problems (op(A) = A^T, column-major B, and a B the TMA cannot read in place, which
  // run() packs: 6-byte rows, a base address 2 bytes off): "" on an sm_90 GPU, else a reason
  // naming the device.
  const auto& d = device_info();
  for (int variation = 0; variation < 5; ++variation) {
    g = fake_device_args(64, 64, 128, 128, DType::f16);
    if (variation == 1) g.op = Op::trans;
    if (variation == 2) {
      g.b.layout = Layout::col_major;
      g.b.ld = 64;
    }
    if (variation == 3) g = fake_device_args(64, 64, 3, 3, DType::f16);
    if (variation == 4) g.b.data = static_cast<char*>(g.b.data) + 2;
    if (d.available && d.cc_major == 9 && d.cc_minor == 0)
      EXPECT_EQ(why(g), "") << "variation " << variation;
    else
      EXPECT_TRUE(has(why(g), "sm_90") || has(why(g), "no CUDA device")) << why(g);
  }
}

// ---- correctness on the device ----

TEST(Hopper, BlockShapesAndDtypes) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {32, 64, 128})
    for (int bk : {32, 64, 128})
      for (DType in : {DType::f16, DType::bf16}) {
        Case cs;
        cs.bm = bm;
        cs.bk = bk;
        cs.in = in;
        cs.mb = bm == 128 ? 3 : 5;
        cs.kb = 6;
        cs.seed = uint64_t(bm * 1000 + bk * 10 + int(in));
        check_case(cs);
      }
}

TEST(Hopper, IntegerDataIsExact) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {32, 64, 128})
    for (int bk : {32, 64, 128}) {
      Case cs;
      cs.bm = bm;
      cs.bk = bk;
      cs.integers = true;
      cs.alpha = 2.f;
      cs.beta = -1.f;
      cs.kb = 9;
      cs.n = 264;
      cs.in = bk == 64 ? DType::bf16 : DType::f16;
      cs.seed = uint64_t(7 + bm + bk);
      check_case(cs);
    }
}

TEST(Hopper, OutputDtypesWithBeta) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {32, 64, 128})
    for (DType in : {DType::f16, DType::bf16})
      for (DType out : {DType::f16, DType::bf16, DType::f32}) {
        Case cs;
        cs.bm = bm;
        cs.bk = 64;
        cs.in = in;
        cs.out = out;
        cs.beta = 0.5f;
        cs.alpha = 0.75f;
        cs.seed = uint64_t(bm + 3 * int(in) + 11 * int(out));
        check_case(cs);
      }
}

TEST(Hopper, NarrowAndRaggedN) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {32, 64, 128})
    for (int64_t n : {1, 8, 72, 264, 520}) {
      Case cs;
      cs.bm = bm;
      cs.bk = bm == 32 ? 32 : 128;
      cs.n = n;
      cs.b_pad = (8 - n % 8) % 8;  // 16-byte strided B rows: read in place (test_hopper_unaligned.cpp packs)
      cs.out = n == 72 ? DType::f16 : DType::f32;
      cs.beta = n == 264 ? 1.f : 0.f;
      cs.seed = uint64_t(bm * 7 + n);
      check_case(cs);
    }
}

// Row-major C whose rows are not whole 16-byte granules (N * sizeof(out) % 16 != 0) inside a
// padded, TMA-aligned leading dimension: the padding must stay untouched (regression: TMA stores
// wrote the rest of the last granule).
TEST(Hopper, RaggedRowsInPaddedC) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {32, 64, 128})
    for (DType out : {DType::f16, DType::bf16, DType::f32})
      for (float beta : {0.f, 1.f}) {
        Case cs;
        cs.bm = bm;
        cs.bk = 64;
        cs.out = out;
        cs.in = out == DType::bf16 ? DType::bf16 : DType::f16;
        cs.n = 225;   // 450 / 900 bytes: not a multiple of 16
        cs.c_pad = 7;  // ld 232: 464 / 928 bytes, 16-byte aligned rows
        cs.b_pad = 7;
        cs.beta = beta;
        cs.seed = uint64_t(bm * 3 + int(out) + int(beta));
        check_case(cs);
      }
  Case empty;  // no stored block: only the beta*C / zero epilogue runs
  empty.mb = 3;
  empty.empty_rows = {0, 1, 2};
  empty.n = 14;
  empty.c_pad = 2;
  empty.b_pad = 2;
  check_case(empty);
}

TEST(Hopper, EmptyRowsGiveBetaC) {
  SPARSEK_REQUIRE_SM90();
  for (float beta : {0.f, 0.75f})
    for (int bm : {32, 64, 128}) {
      Case cs;
      cs.bm = bm;
      cs.mb = 6;
      cs.empty_rows = {0, 2, -1};
      cs.beta = beta;
      cs.seed = uint64_t(bm + 100 * int(beta * 4));
      check_case(cs);
    }
}

// alpha = +-Inf: block rows without a stored block must stay beta*C (the oracle's and the CPU
// backend's semantics), not Inf * 0 = NaN.
TEST(Hopper, InfiniteAlphaLeavesEmptyRowsBetaC) {
  SPARSEK_REQUIRE_SM90();
  for (float beta : {0.f, 0.75f}) {
    Case cs;
    cs.bm = 64;
    cs.mb = 6;
    cs.empty_rows = {0, 2, -1};
    cs.alpha = std::numeric_limits<float>::infinity();
    cs.beta = beta;
    cs.seed = 4242 + uint64_t(beta * 4);
    check_case(cs);
  }
}

TEST(Hopper, NoStoredBlocks) {
  SPARSEK_REQUIRE_SM90();
  for (float beta : {0.f, 2.f}) {
    Case cs;
    cs.mb = 3;
    cs.empty_rows = {0, 1, 2};
    cs.beta = beta;
    cs.out = DType::bf16;
    check_case(cs);
  }
}

TEST(Hopper, ColumnMajorAndPaddedC) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {32, 64, 128})
    for (DType out : {DType::f16, DType::f32}) {
      Case cs;
      cs.bm = bm;
      cs.out = out;
      cs.c_layout = Layout::col_major;
      cs.c_pad = 3;
      cs.b_pad = 8;
      cs.beta = 0.25f;
      cs.seed = uint64_t(bm + int(out));
      check_case(cs);
      cs.c_layout = Layout::row_major;
      cs.c_pad = 1;  // odd ld: pairs fall back to single stores
      check_case(cs);
    }
}

TEST(Hopper, LongRowAmongShortOnes) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {32, 64, 128}) {
    Case cs;
    cs.bm = bm;
    cs.bk = bm == 128 ? 128 : 64;
    cs.mb = 5;
    cs.kb = 150;  // > 32 blocks in a row: the producer restages column indices
    cs.density = 0.02;
    cs.full_rows = {1};
    cs.n = 136;
    cs.seed = uint64_t(bm + 5);
    check_case(cs);
  }
}

TEST(Hopper, MoreWorkItemsThanSMs) {
  SPARSEK_REQUIRE_SM90();
  Case cs;
  cs.bm = 32;
  cs.bk = 32;
  cs.mb = 200;
  cs.kb = 16;
  cs.density = 0.25;
  cs.n = 520;
  cs.out = DType::f16;
  check_case(cs);
  cs.bm = 64;
  cs.bk = 64;
  cs.mb = 150;
  cs.kb = 8;
  cs.n = 600;
  cs.in = DType::bf16;
  cs.out = DType::f32;
  check_case(cs);
}

TEST(Hopper, RepeatedRunsAreBitIdentical) {
  SPARSEK_REQUIRE_SM90();
  for (int bm : {32, 128}) {
    Case cs;
    cs.bm = bm;
    cs.bk = 64;
    cs.mb = 4096 / bm;
    cs.kb = 32;
    cs.density = 0.2;
    cs.n = 1000;
    cs.out = DType::f32;
    Problem p(cs);
    const std::vector<uint8_t> first = p.run();
    for (int rep = 0; rep < 3; ++rep) EXPECT_TRUE(p.run() == first) << "run " << rep << " differs (bm=" << bm << ")";
  }
}

// bm = 128 CTA pairs (SPARSEK_HOPPER_CLUSTER=2 forces them, =1 forbids them; 128x64 and 128x128
// blocks with an even N-tile count get them by default): the pair shares each A tile by multicast. Each C tile
// sees the same wgmmas on the same shared-memory layout, so C must be bit-identical to the
// unclustered kernel (split rows off; with the automatic split, each mode against the oracle and
// its own repeat). Odd tile counts (the second CTA's tile past N), ragged N, beta, empty rows,
// column-major C, fewer items than pairs; the default choice (unset) against both.
TEST(Hopper, ClusterPairsAreBitIdentical) {
  SPARSEK_REQUIRE_SM90();
  struct Shape {
    int bk;
    int64_t mb, n;
    DType out;
    float beta;
    Layout c;
  };
  for (const Shape& sh : {Shape{128, 300, 520, DType::f32, 0.f, Layout::row_major},
                          Shape{64, 40, 776, DType::f16, 0.5f, Layout::row_major},
                          Shape{32, 7, 296, DType::bf16, 0.f, Layout::row_major},
                          Shape{128, 90, 200, DType::f32, 1.f, Layout::col_major},
                          Shape{64, 1, 64, DType::f32, 0.f, Layout::row_major},
                          Shape{128, 33, 1000, DType::f16, 0.f, Layout::row_major}}) {  // 4 tiles: paired by default
    Case cs;
    cs.bm = 128;
    cs.bk = sh.bk;
    cs.mb = sh.mb;
    cs.kb = 20;
    cs.density = 0.15;
    if (sh.mb > 10) cs.empty_rows = {2, -1};
    if (sh.mb > 10) cs.full_rows = {5};
    cs.n = sh.n;
    cs.out = sh.out;
    cs.beta = sh.beta;
    cs.c_layout = sh.c;
    cs.in = sh.out == DType::bf16 ? DType::bf16 : DType::f16;
    cs.seed = uint64_t(sh.bk + sh.mb);
    SCOPED_TRACE(cs.name());
    Problem p(cs);
    {
      // Across modes, no split rows: the automatic cut depends on the schedule's lists and tile
      // width, which pairs change, so a long row may be cut into other pieces (summed in another
      // order) in each mode: right in both, but not bit-identical between them.
      EnvFor no_split("SPARSEK_HOPPER_SPLIT", "off");
      std::vector<uint8_t> base;
      {
        EnvFor off("SPARSEK_HOPPER_CLUSTER", "1");
        base = p.run();
      }
      EXPECT_TRUE(p.run() == base) << "the default choice differs from cluster 1";
      EnvFor e("SPARSEK_HOPPER_CLUSTER", "2");
      EXPECT_TRUE(p.run() == base) << "cluster 2 differs from 1";
      EXPECT_TRUE(p.run() == base) << "cluster 2 repeat differs";
      for (const char* mode : {"1", "2"}) {  // the diagnostic modes (A loaded locally)
        EnvFor m("SPARSEK_HOPPER_CLUSTER_MODE", mode);
        EXPECT_TRUE(p.run() == base) << "cluster 2 mode " << mode << " differs from 1";
      }
    }
    // The default (automatic) split: each mode on its own is right and bit-identical on repeat.
    for (const char* cluster : {"1", "2"}) {
      SCOPED_TRACE(std::string("SPARSEK_HOPPER_CLUSTER=") + cluster + ", default split");
      EnvFor e("SPARSEK_HOPPER_CLUSTER", cluster);
      const std::vector<uint8_t> first = p.run();
      EXPECT_TRUE(p.run() == first) << "repeat differs";
      check_case(cs);
    }
  }
}

// One very long row among many one-block rows (split into pieces automatically: three N tiles),
// every block shape and three schedules: right against the oracle and bit-identical over repeats.
TEST(Hopper, VeryLongRowAmongManyShortOnes) {
  SPARSEK_REQUIRE_SM90();
  for (const char* sched : {"", "bigtile", "longest"}) {
    for (int bm : {32, 64, 128}) {
      SCOPED_TRACE(std::string("schedule '") + sched + "'");
      std::unique_ptr<EnvFor> e;
      if (*sched) e = std::make_unique<EnvFor>("SPARSEK_HOPPER_SCHEDULE", sched);
      Case cs;
      cs.bm = bm;
      cs.bk = 64;
      cs.mb = 8192 / bm;
      cs.kb = 320;
      cs.density = 1.0 / 320.0;  // most rows hold 0-2 blocks
      cs.full_rows = {5};        // 320 blocks: 20480 long in K
      cs.n = 600;
      cs.out = DType::f32;
      cs.seed = uint64_t(bm + 11);
      check_case(cs);
      Problem p(cs);
      const std::vector<uint8_t> first = p.run();
      for (int rep = 0; rep < 2; ++rep) EXPECT_TRUE(p.run() == first) << "run " << rep << " differs (bm=" << bm << ")";
    }
  }
}

// N a whole number of 64-column chunks: B is loaded as one 3-D TMA box per stage (a tile past the
// last chunk is zero-filled). Every block height, a last tile of 1-3 chunks, padded B and C rows,
// CTA pairs (128x128) and beta; right against the oracle.
TEST(Hopper, WholeChunkNUsesThreeDimensionalB) {
  SPARSEK_REQUIRE_SM90();
  struct Shape {
    int bm, bk;
    int64_t n, b_pad, c_pad;
    float beta;
  };
  for (const Shape& sh : {Shape{32, 32, 320, 0, 0, 0.f}, Shape{32, 64, 64, 8, 0, 0.5f}, Shape{64, 64, 448, 0, 8, 0.f},
                          Shape{64, 128, 192, 64, 0, 0.f}, Shape{128, 128, 1024, 0, 0, 1.f},
                          Shape{128, 128, 832, 8, 8, 0.f}, Shape{128, 32, 576, 0, 0, 0.f}}) {
    Case cs;
    cs.bm = sh.bm;
    cs.bk = sh.bk;
    cs.mb = 9;
    cs.kb = 24;
    cs.density = 0.3;
    cs.n = sh.n;
    cs.b_pad = sh.b_pad;
    cs.c_pad = sh.c_pad;
    cs.beta = sh.beta;
    cs.out = DType::f32;
    cs.seed = uint64_t(sh.bm + sh.n);
    check_case(cs);
  }
}

// Bytes the hopper variant's prepare() holds on the device for this problem (schedule, plus the
// partial tiles when it splits rows).
size_t hopper_workspace(Problem& p) {
  const Variant* v = find_variant("hopper");
  Options o;
  o.backend = Backend::cuda;
  return v->prepare(p.device_args(), o)->workspace_bytes();
}

// Runs cs with rows cut into pieces of 3 stages (SPARSEK_HOPPER_SPLIT=3): something must be split
// (more workspace than with splitting off), the result right against the oracle and the same
// bytes over two more runs.
void check_split_rows(const Case& cs) {
  Problem p(cs);
  size_t whole = 0;
  {
    EnvFor off("SPARSEK_HOPPER_SPLIT", "off");
    whole = hopper_workspace(p);
  }
  EnvFor split("SPARSEK_HOPPER_SPLIT", "3");
  EXPECT_GT(hopper_workspace(p), whole) << "nothing was split";
  check_case(cs);
  const std::vector<uint8_t> first = p.run();
  for (int rep = 0; rep < 2; ++rep) EXPECT_TRUE(p.run() == first) << "run " << rep << " differs";
}

// Split rows (SPARSEK_HOPPER_SPLIT=<stages> forces pieces that long): each piece writes its raw
// sums to a partial slot and a second launch adds them in K order and writes C. Every block
// shape, output dtype, beta, both C layouts, ragged N, CTA pairs and none; a row holding every
// block column, an empty row; right against the oracle and bit-identical over repeats.
TEST(Hopper, SplitRowsMatchOracleAndRepeat) {
  SPARSEK_REQUIRE_SM90();
  struct Shape {
    int bm, bk;
    int64_t n;
    DType out;
    float beta;
    Layout c;
    const char* cluster;  // SPARSEK_HOPPER_CLUSTER ("" = default)
  };
  for (const Shape& sh : {Shape{32, 32, 136, DType::f32, 0.f, Layout::row_major, ""},
                          Shape{32, 64, 296, DType::f16, 0.5f, Layout::col_major, ""},
                          Shape{64, 64, 520, DType::bf16, 0.f, Layout::row_major, ""},
                          Shape{64, 128, 64, DType::f32, 1.f, Layout::row_major, ""},
                          Shape{128, 128, 1000, DType::f16, 0.f, Layout::row_major, "2"},
                          Shape{128, 64, 200, DType::f32, 0.25f, Layout::col_major, "1"},
                          Shape{128, 32, 776, DType::f32, 0.f, Layout::row_major, "2"}}) {
    Case cs;
    cs.bm = sh.bm;
    cs.bk = sh.bk;
    cs.mb = 12;
    cs.kb = 40;
    cs.density = 0.3;
    cs.full_rows = {3};
    cs.empty_rows = {5};
    cs.n = sh.n;
    cs.out = sh.out;
    cs.beta = sh.beta;
    cs.c_layout = sh.c;
    cs.in = sh.out == DType::bf16 ? DType::bf16 : DType::f16;
    cs.seed = uint64_t(sh.bm * 7 + sh.bk);
    SCOPED_TRACE(cs.name());
    std::unique_ptr<EnvFor> clu;
    if (*sh.cluster) clu = std::make_unique<EnvFor>("SPARSEK_HOPPER_CLUSTER", sh.cluster);
    check_split_rows(cs);
  }
}

// Automatic splitting: with one 256-column tile a 128-block row is 8x the work of a CTA's share,
// so the schedule cuts it into pieces (more device workspace than with SPARSEK_HOPPER_SPLIT=off);
// the same shape without the long row is not split. Both right against the oracle.
TEST(Hopper, LongRowWithFewTilesIsSplit) {
  SPARSEK_REQUIRE_SM90();
  for (bool long_row : {true, false}) {
    Case cs;
    cs.bm = 64;
    cs.bk = 64;
    cs.mb = 200;
    cs.kb = 128;
    cs.density = 0.05;
    if (long_row) cs.full_rows = {7};
    cs.n = 256;
    cs.out = DType::f32;
    cs.seed = long_row ? 3 : 4;
    SCOPED_TRACE(long_row ? "with a 128-block row" : "uniform rows");
    Problem p(cs);
    size_t whole = 0;
    {
      EnvFor off("SPARSEK_HOPPER_SPLIT", "off");
      whole = hopper_workspace(p);
    }
    if (long_row)
      EXPECT_GT(hopper_workspace(p), whole) << "the long row was not split";
    else
      EXPECT_EQ(hopper_workspace(p), whole) << "uniform rows were split";
    check_case(cs);
    const std::vector<uint8_t> first = p.run();
    EXPECT_TRUE(p.run() == first) << "repeat differs";
  }
}

// N <= 64 (decode) runs on 64-column work tiles and N <= 128 on 128-column ones where they are built
// (bm >= 64, bk >= 64, op none); SPARSEK_HOPPER_TILE_N forces each tile width on the same cases
// (a narrow tile then covers N > its width in several N tiles). All against the oracle: N in {1, 2,
// 3, 7, 8, 15, 16, 17, 33, 63, 64, 65, 100, 127, 128}, both input dtypes, every output dtype, beta =
// 0 over NaN and beta != 0, C row- and column-major, B's and C's leading dimensions above N, an
// empty block row; then split rows with narrow tiles repeat bit-identically.
TEST(Hopper, NarrowTilesForSmallN) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (const char* tile : {"64", "128", "256"})
    for (int bm : {64, 128})
      for (int bk : {64, 128})
        for (int64_t N : {1, 2, 3, 7, 8, 15, 16, 17, 33, 63, 64, 65, 100, 127, 128}) {
          EnvFor force("SPARSEK_HOPPER_TILE_N", tile);
          Case cs;
          cs.bm = bm;
          cs.bk = bk;
          cs.mb = 5;
          cs.kb = 4;
          cs.n = N;
          cs.in = n % 2 ? DType::bf16 : DType::f16;
          cs.out = n % 3 == 0 ? DType::f32 : cs.in;
          cs.beta = n % 4 == 1 ? 0.5f : 0.f;
          cs.c_layout = n % 5 < 2 ? Layout::col_major : Layout::row_major;
          cs.c_pad = n % 7 == 3 ? 8 : 0;
          cs.b_pad = n % 3 == 2 ? (8 - N % 8) % 8 + 8 : 0;  // 16-byte multiple ld above N: read in place
          cs.empty_rows = {2};
          cs.seed = uint64_t(900 + n++);
          SCOPED_TRACE(std::string("SPARSEK_HOPPER_TILE_N=") + tile);
          check_case(cs);
        }
  for (int bm : {64, 128}) {
    Case cs;
    cs.bm = bm;
    cs.bk = 64;
    cs.mb = 12;
    cs.kb = 40;
    cs.density = 0.3;
    cs.full_rows = {3};
    cs.n = bm == 64 ? 16 : 96;  // a 64- and a 128-column tile
    cs.out = DType::f16;
    cs.beta = bm == 64 ? 0.f : 1.f;
    cs.seed = uint64_t(950 + bm);
    SCOPED_TRACE(cs.name());
    check_split_rows(cs);
  }
}

TEST(Hopper, DispatchPicksHopperOnSm90) {
  SPARSEK_REQUIRE_SM90();
  Case cs;
  Problem p(cs);
  const std::vector<std::string> names = supported_variants(p.device_args());
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "hopper");
  EXPECT_TRUE(p.run("") == p.run("hopper"));  // the default choice is this kernel
}

TEST(Hopper, ForcedOnUnsupportedProblemThrows) {
  SPARSEK_REQUIRE_SM90();
  Case cs;
  cs.in = DType::f32;  // the tensor-core path takes f16 / bf16 inputs
  Problem p(cs);
  try {
    p.run("hopper");
    FAIL() << "expected Error(unsupported)";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_NE(std::string(e.what()).find("f16 or bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sparsek::test
