// Shared test helpers: host dense matrices, poisoning, GPU availability.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/no_gpu.hpp"
#include "cpu/oracle.hpp"
#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"
#include "sparsek/sparsek.h"

namespace sparsek::test {

// What a GPU path fails with when no GPU answers: Status::no_device and `no_device_text` on a
// machine without a GPU; in a build without CUDA, Status::unsupported saying so.
inline Status no_gpu_status() { return kBuiltWithCuda ? Status::no_device : Status::unsupported; }
inline std::string no_gpu_text(const std::string& no_device_text) {
  return kBuiltWithCuda ? no_device_text : "built without CUDA";
}

// A host dense matrix with owned storage (bytes in `dtype`).
struct HostDense {
  std::vector<uint8_t> bytes;
  DenseView view;
  HostDense(int64_t rows, int64_t cols, DType dtype, Layout layout = Layout::row_major, int64_t pad = 0) {
    view.rows = rows;
    view.cols = cols;
    view.layout = layout;
    view.dtype = dtype;
    view.memory = Memory::host;
    int64_t minor = layout == Layout::row_major ? cols : rows;
    int64_t major = layout == Layout::row_major ? rows : cols;
    view.ld = std::max<int64_t>(minor, 1) + pad;
    bytes.assign(size_t(std::max<int64_t>(major, 1) * view.ld) * dtype_size(dtype), 0);
    view.data = bytes.data();
  }
  float get(int64_t r, int64_t c) const { return load_as_float(view.data, view.dtype, view.index(r, c)); }
  void set(int64_t r, int64_t c, float v) { store_from_float(view.data, view.dtype, view.index(r, c), v); }
  // Uniform [-1, 1) or integers in [-4, 4]; the whole storage (padding too) is written.
  void fill_random(uint64_t seed, bool integers = false) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::uniform_int_distribution<int> ui(-4, 4);
    int64_t n = int64_t(bytes.size() / dtype_size(view.dtype));
    for (int64_t i = 0; i < n; ++i) store_from_float(view.data, view.dtype, i, integers ? float(ui(rng)) : u(rng));
  }
  void fill(float v) {
    int64_t n = int64_t(bytes.size() / dtype_size(view.dtype));
    for (int64_t i = 0; i < n; ++i) store_from_float(view.data, view.dtype, i, v);
  }
};

inline float nan_value() { return std::numeric_limits<float>::quiet_NaN(); }

// A pattern from explicit rows of block columns.
inline Pattern pattern_of(int64_t kb, const std::vector<std::vector<int32_t>>& rows) {
  Pattern p;
  p.mb = int64_t(rows.size());
  p.kb = kb;
  p.row_ptr.push_back(0);
  for (const auto& r : rows) {
    p.col_idx.insert(p.col_idx.end(), r.begin(), r.end());
    p.row_ptr.push_back(int32_t(p.col_idx.size()));
  }
  return p;
}

// ---- one randomized product on the host, checked against the fp64 oracle (cpu/oracle.hpp) ----

// Shapes are given by the sparse operand (rows x cols, blocks bm x bk) and the one extent the
// pattern does not fix: dsd -> N, dds -> M, sdd -> K.
struct CaseSpec {
  OpKind kind = OpKind::dsd;
  Op op = Op::none;
  int64_t rows = 64, cols = 64;
  int bm = 16, bk = 16;
  int64_t free = 33;
  PatternKind pattern = PatternKind::bernoulli;
  double density = 0.3;
  const Pattern* custom = nullptr;  // explicit pattern instead of the generator
  DType in = DType::f32, out = DType::f32;
  Layout la = Layout::row_major, lb = Layout::row_major, lc = Layout::row_major;
  int64_t pad = 0;  // extra leading-dimension elements on every dense operand
  int64_t pad_a = -1, pad_b = -1, pad_c = -1;  // per operand instead of pad (-1: pad)
  float alpha = 1.f, beta = 0.f;
  bool integers = false;  // integer-valued inputs: the result must match exactly
  uint64_t seed = 1;
  // e4m3 inputs (in = e4m3): the dense input's scale group (0 or 128). Scales are random powers of
  // two in [1/4, 4] (exact products) with integers, random in [0.5, 2) otherwise.
  int scale_group = 0;
};

// A case of mb x kb blocks of bm x bk at density 0.5, f16 inputs, alpha 1.5 (the GPU product tests).
inline CaseSpec block_case(OpKind kind, Op op, int bm, int bk, int64_t mb, int64_t kb, int64_t free, uint64_t seed,
                           DType out) {
  CaseSpec s;
  s.kind = kind;
  s.op = op;
  s.bm = bm;
  s.bk = bk;
  s.rows = mb * bm;
  s.cols = kb * bk;
  s.free = free;
  s.density = 0.5;
  s.in = DType::f16;
  s.out = out;
  s.alpha = 1.5f;
  s.seed = seed;
  return s;
}

// A 128 x 64 f16 BSR view (64 x 64 blocks, one stored block) marked as device memory, its values at
// `values`: for why_not() tests, which read no data and so run without a GPU.
inline BsrView one_block_device_view(void* values) {
  static const int32_t row_ptr[3] = {0, 1, 1}, col_idx[1] = {0};
  BsrView v;
  v.rows = 128;
  v.cols = 64;
  v.bm = 64;
  v.bk = 64;
  v.nnzb = 1;
  v.row_ptr = row_ptr;
  v.col_idx = col_idx;
  v.values = values;
  v.dtype = DType::f16;
  v.memory = Memory::device;
  return v;
}

struct GemmCase {
  CaseSpec spec;
  BsrMatrix sparse;
  std::unique_ptr<HostDense> a, b, c;  // the dense operands this kind uses (others null)
  std::vector<float> dense_scales;     // e4m3: the scales of the dense input (a DDS's A, a DSD's B)
  GemmArgs args;
};

// n e4m3 scales for a case: powers of two in [1/4, 4] when `integers` (products stay exact), else
// uniform in [0.5, 2).
inline std::vector<float> random_scales(int64_t n, uint64_t seed, bool integers) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(size_t(std::max<int64_t>(n, 0)));
  for (float& x : v) x = integers ? std::ldexp(1.f, int(rng() % 5) - 2) : 0.5f + 1.5f * float(rng() >> 40) / 16777216.f;
  return v;
}

// Builds the operands; the output is NaN-poisoned when beta == 0 (random when beta != 0).
inline std::unique_ptr<GemmCase> make_case(const CaseSpec& s) {
  auto gc = std::make_unique<GemmCase>();
  gc->spec = s;
  const DType sparse_dtype = s.kind == OpKind::sdd ? s.out : s.in;
  if (s.custom) {
    gc->sparse = BsrMatrix(s.rows, s.cols, s.bm, s.bk, s.custom->row_ptr, s.custom->col_idx, sparse_dtype);
    gc->sparse.fill_random(s.seed, s.integers);
  } else {
    gc->sparse = random_bsr(s.pattern, s.rows, s.cols, s.bm, s.bk, s.density, sparse_dtype, s.seed, s.integers);
  }
  const bool tr = s.op == Op::trans;
  int64_t M = 0, N = 0, K = 0;
  switch (s.kind) {
    case OpKind::dsd: M = tr ? s.cols : s.rows; K = tr ? s.rows : s.cols; N = s.free; break;
    case OpKind::dds: K = tr ? s.cols : s.rows; N = tr ? s.rows : s.cols; M = s.free; break;
    case OpKind::sdd: M = s.rows; N = s.cols; K = s.free; break;
  }
  GemmArgs& g = gc->args;
  g.kind = s.kind;
  g.op = s.op;
  g.alpha = s.alpha;
  g.beta = s.beta;
  if (s.kind != OpKind::dsd) {
    gc->a = std::make_unique<HostDense>(M, K, s.in, s.la, s.pad_a >= 0 ? s.pad_a : s.pad);
    gc->a->fill_random(s.seed + 11, s.integers);
    g.a = gc->a->view;
  }
  if (s.kind != OpKind::dds) {
    gc->b = std::make_unique<HostDense>(K, N, s.in, s.lb, s.pad_b >= 0 ? s.pad_b : s.pad);
    gc->b->fill_random(s.seed + 22, s.integers);
    g.b = gc->b->view;
  }
  if (s.kind != OpKind::sdd) {
    gc->c = std::make_unique<HostDense>(M, N, s.out, s.lc, s.pad_c >= 0 ? s.pad_c : s.pad);
    if (s.beta == 0.f) gc->c->fill(nan_value()); else gc->c->fill_random(s.seed + 33, s.integers);
    g.c = gc->c->view;
  } else if (s.beta == 0.f) {
    const int64_t n = gc->sparse.nnzb() * s.bm * s.bk;
    for (int64_t i = 0; i < n; ++i) store_from_float(gc->sparse.value_bytes().data(), s.out, i, nan_value());
  }
  if (s.in == DType::e4m3 && s.kind != OpKind::sdd) {
    gc->sparse.scales() = random_scales(gc->sparse.nnzb(), s.seed + 44, s.integers);
    DenseView& d = s.kind == OpKind::dsd ? g.b : g.a;
    const int64_t tokens = s.kind == OpKind::dsd ? d.cols : d.rows, k = s.kind == OpKind::dsd ? d.rows : d.cols;
    const int64_t groups = s.scale_group == 0 ? 1 : (k + s.scale_group - 1) / s.scale_group;
    gc->dense_scales = random_scales(tokens * groups, s.seed + 55, s.integers);
    d.scales = gc->dense_scales.data();
    d.scale_group = s.scale_group;
  }
  g.sparse = gc->sparse.view();
  return gc;
}

// Output elements in a fixed order (dense C: row-major M x N; sdd: C's values in block order).
inline std::vector<float> output_values(const GemmCase& gc) {
  std::vector<float> v;
  if (gc.args.kind == OpKind::sdd) {
    const int64_t n = gc.sparse.nnzb() * gc.sparse.bm() * gc.sparse.bk();
    for (int64_t i = 0; i < n; ++i) v.push_back(load_as_float(gc.sparse.value_bytes().data(), gc.spec.out, i));
  } else {
    for (int64_t r = 0; r < gc.c->view.rows; ++r)
      for (int64_t c = 0; c < gc.c->view.cols; ++c) v.push_back(gc.c->get(r, c));
  }
  return v;
}

// Tolerance on max_rel_error for real-valued inputs: f32 accumulation, then output rounding.
inline double tolerance(DType out) { return out == DType::f32 ? 2e-5 : out == DType::f16 ? 1.5e-3 : 1e-2; }

// One line naming every field of a case (for SCOPED_TRACE).
inline std::string describe(const CaseSpec& s) {
  return std::string(to_string(s.kind)) + " op=" + to_string(s.op) + " " + std::to_string(s.rows) + "x" +
         std::to_string(s.cols) + " blocks " + std::to_string(s.bm) + "x" + std::to_string(s.bk) +
         " free=" + std::to_string(s.free) + " " + to_string(s.pattern) + " in=" + to_string(s.in) +
         " out=" + to_string(s.out) + " layouts a/b/c=" + to_string(s.la) + "/" + to_string(s.lb) + "/" +
         to_string(s.lc) + " pad=" + std::to_string(s.pad) +
         (s.pad_a >= 0 || s.pad_b >= 0 || s.pad_c >= 0
              ? " pads a/b/c=" + std::to_string(s.pad_a) + "/" + std::to_string(s.pad_b) + "/" + std::to_string(s.pad_c)
              : std::string()) + " alpha=" + std::to_string(s.alpha) +
         " beta=" + std::to_string(s.beta) + (s.integers ? " integers" : " reals") +
         (s.in == DType::e4m3 ? " scale_group=" + std::to_string(s.scale_group) : std::string());
}

// Checks the case's (host) output against the oracle's ref: exactly (after rounding the exact
// result to the output dtype) for integer inputs, within tolerance() otherwise. Also checks that
// the padding of a dense C (elements outside its rows x cols) still holds c_before's bytes.
inline void expect_output_matches(const GemmCase& gc, const std::vector<double>& ref,
                                  const std::vector<uint8_t>& c_before) {
  if (gc.spec.integers) {
    const std::vector<float> got = output_values(gc);
    ASSERT_EQ(got.size(), ref.size());
    int bad = 0;
    for (size_t e = 0; e < ref.size() && bad < 5; ++e) {
      float want = 0.f;
      store_from_float(&want, gc.spec.out, 0, float(ref[e]));  // round to the output dtype
      want = load_as_float(&want, gc.spec.out, 0);
      if (!(got[e] == want)) {
        ADD_FAILURE() << "element " << e << ": got " << got[e] << ", want " << want << " (exact " << ref[e] << ")";
        ++bad;
      }
    }
  } else {
    EXPECT_LE(max_rel_error(gc.args, ref), tolerance(gc.spec.out));
  }
  if (gc.c) {
    const DenseView& v = gc.c->view;
    const size_t es = dtype_size(v.dtype);
    const int64_t n = int64_t(c_before.size() / es);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t major = i / v.ld, minor = i % v.ld;
      const bool inside = v.layout == Layout::row_major ? (major < v.rows && minor < v.cols)
                                                        : (minor < v.rows && major < v.cols);
      if (!inside && std::memcmp(&c_before[size_t(i) * es], &gc.c->bytes[size_t(i) * es], es) != 0) {
        ADD_FAILURE() << "C padding element " << i << " was written";
        break;
      }
    }
  }
}

// Runs the product through gemm() and checks it against the oracle (expect_output_matches).
inline void run_and_check(GemmCase& gc, const Options& opt = {}) {
  const std::vector<double> ref = oracle(gc.args);  // before the run: C is read when beta != 0
  const std::vector<uint8_t> before = gc.c ? gc.c->bytes : std::vector<uint8_t>();
  gemm(gc.args, opt);
  expect_output_matches(gc, ref, before);
}

// Runs f, expects Error(invalid_argument) whose message contains every one of `parts`.
inline void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
        << "message '" << e.what() << "' lacks '" << p << "'";
    return;
  }
  ADD_FAILURE() << "no sparsek::Error thrown (expected one mentioning '" << (parts.empty() ? "" : parts[0]) << "')";
}

// The C API's descriptions of views (what a C caller would fill in).
inline sparsek_bsr to_c(const BsrView& v) {
  sparsek_bsr b{};
  b.rows = v.rows;
  b.cols = v.cols;
  b.bm = v.bm;
  b.bk = v.bk;
  b.nnzb = v.nnzb;
  b.row_ptr = v.row_ptr;
  b.col_idx = v.col_idx;
  b.values = v.values;
  b.dtype = sparsek_dtype(int(v.dtype));
  b.memory = sparsek_memory(int(v.memory));
  b.scales = v.scales;
  return b;
}
inline sparsek_dense to_c(const DenseView& v) {
  sparsek_dense d{};
  d.data = v.data;
  d.rows = v.rows;
  d.cols = v.cols;
  d.ld = v.ld;
  d.layout = sparsek_layout(int(v.layout));
  d.dtype = sparsek_dtype(int(v.dtype));
  d.memory = sparsek_memory(int(v.memory));
  d.scales = v.scales;
  d.scale_group = v.scale_group;
  return d;
}

// Saves an environment variable and restores it (or its absence) when destroyed.
class SavedEnv {
 public:
  explicit SavedEnv(const char* name) : name_(name) {
    const char* e = std::getenv(name);
    set_ = e != nullptr;
    if (e) value_ = e;
  }
  ~SavedEnv() {
    if (set_) setenv(name_, value_.c_str(), 1);
    else unsetenv(name_);
  }
  SavedEnv(const SavedEnv&) = delete;
  SavedEnv& operator=(const SavedEnv&) = delete;

 private:
  const char* name_;
  bool set_ = false;
  std::string value_;
};

// Sets an environment variable (or, with nullptr, unsets it) for one scope and restores it after: the
// variants read their switches when a plan is made.
struct EnvFor {
  SavedEnv saved;
  EnvFor(const char* name, const char* value) : saved(name) {
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
};

}  // namespace sparsek::test

// Skips the current test in a build without CUDA, whose GPU variants are names only (their domain
// checks, like their kernels, are compiled with the CUDA code).
#define SPARSEK_REQUIRE_CUDA_BUILD()                                                           \
  do {                                                                                         \
    if (!::sparsek::kBuiltWithCuda) GTEST_SKIP() << "built without CUDA (SPARSEK_CUDA=OFF)";   \
  } while (0)
// Skips the current test with the reason when no CUDA device answers.
#define SPARSEK_REQUIRE_GPU()                                                       \
  do {                                                                              \
    const auto& info_ = ::sparsek::device_info();                                   \
    if (!info_.available) GTEST_SKIP() << "no GPU: " << info_.why_not;              \
  } while (0)
// The Hopper kernels (sm_90a) run on an sm_90 GPU only.
#define SPARSEK_REQUIRE_SM90()                                                                      \
  do {                                                                                              \
    SPARSEK_REQUIRE_GPU();                                                                          \
    const auto& d_ = ::sparsek::device_info();                                                      \
    if (d_.cc_major != 9 || d_.cc_minor != 0)                                                       \
      GTEST_SKIP() << "not an sm_90 GPU: " << d_.name << " is sm_" << d_.cc_major << d_.cc_minor; \
  } while (0)
