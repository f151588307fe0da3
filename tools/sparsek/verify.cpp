// `sparsek verify`: a seeded randomized sweep of DSD/DDS/SDD problems, each run through every
// (non-peer) variant of the backend that supports it and compared with the fp64 oracle.
//
// Case i is a pure function of (--seed, i), so `sparsek verify --seed S --case i` reproduces a
// failure alone. Coverage is forced where it matters: the block shape cycles through all 16
// shapes, the pattern through all six generators; the rest is drawn (op, kind, dtypes, layouts,
// leading-dimension padding, alpha/beta, sizes that are not tile multiples, N = 1, nnzb = 0,
// empty block rows). Inputs are integer-valued in ~40% of the cases, where an fp32 output must
// match exactly. Outputs are poisoned (NaN) when beta = 0, padding of every dense operand holds
// NaN (a kernel that reads it is caught) and must be left untouched in C.
//
// With --variants (a forced list) the sweep is drawn inside the listed variants' domains: a case
// that none of them supports is redrawn (draw t of case i is a function of (seed, i, t)), so a
// narrow variant such as hopper checks every case instead of the few the full sweep hands it.
// The summary always counts the cases each variant checked.
#include "core/cuda_host.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli.hpp"
#include "core/no_gpu.hpp"  // no_gpu_error(): what a build without CUDA says
#include "tools_internal.hpp"

namespace sparsek::cli {

namespace {

const std::vector<FlagSpec> kSpecs = {
    {"--cases", "N", "number of cases (default 1000 on a GPU, 200 on the CPU)"},
    {"--seed", "S", "base seed (default 1); case i is reproducible from (seed, i)"},
    {"--case", "I", "run only case I (reproduce a failure)"},
    kBackendFlag,
    {"--variants", "a,b",
     "only these variants (of one backend, which they select); each case is redrawn (seeded) until one of "
     "them supports it"},
    {"--peers", nullptr, "also check the peer variants (cuSPARSE, cuBLAS)"},
    kThreadsFlag,
    {"--json", "FILE", "also write the summary and every failure as JSON (- for stdout)"},
    {"--verbose", nullptr, "print every case"},
    {"--inject-error", nullptr, "self-test: corrupt one output element of every run (verify must fail)"},
};

const int kBlocks[4] = {16, 32, 64, 128};
const PatternKind kPatterns[6] = {PatternKind::fixed_k, PatternKind::bernoulli,      PatternKind::power_law,
                                  PatternKind::banded,  PatternKind::block_diagonal, PatternKind::causal};
enum Edge { kNone = 0, kNoBlocks = 1, kEmptyRows = 2 };

struct Case {
  uint64_t seed = 0;
  OpKind kind = OpKind::dsd;
  Op op = Op::none;
  int bm = 16, bk = 16;
  DType in = DType::f32, out = DType::f32;
  PatternKind pattern = PatternKind::fixed_k;
  double density = 0.5;
  int64_t mb = 1, kb = 1;  // stored sparse matrix, in blocks
  int64_t free = 1;        // N (dsd), M (dds), K (sdd)
  Layout la = Layout::row_major, lb = Layout::row_major, lc = Layout::row_major;
  int64_t pa = 0, pb = 0, pc = 0;  // leading-dimension padding
  float alpha = 1, beta = 0;
  bool integers = false;
  Edge edge = kNone;
};

std::string describe(const Case& c, const GemmArgs& g) {
  char b[512];
  auto lay = [](Layout l, int64_t pad) {
    return std::string(l == Layout::row_major ? "row" : "col") + (pad ? "+" + std::to_string(pad) : "");
  };
  std::string ops = c.kind == OpKind::sdd ? "" : (c.op == Op::trans ? " op=trans" : " op=none");
  std::string dense = c.kind == OpKind::dsd   ? "B:" + lay(c.lb, c.pb) + " C:" + lay(c.lc, c.pc)
                      : c.kind == OpKind::dds ? "A:" + lay(c.la, c.pa) + " C:" + lay(c.lc, c.pc)
                                              : "A:" + lay(c.la, c.pa) + " B:" + lay(c.lb, c.pb);
  std::snprintf(b, sizeof b, "%s%s %dx%d %s->%s %s d=%.2f nnzb=%lld M=%lld N=%lld K=%lld %s alpha=%g beta=%g%s%s",
                to_string(c.kind), ops.c_str(), c.bm, c.bk, to_string(c.in), to_string(c.out), to_string(c.pattern),
                c.density, (long long)g.sparse.nnzb, (long long)g.m(), (long long)g.n(), (long long)g.k(),
                dense.c_str(), c.alpha, c.beta, c.integers ? " ints" : "",
                c.edge == kNoBlocks ? " edge=nnzb0" : c.edge == kEmptyRows ? " edge=empty-rows" : "");
  return b;
}

// `slot` picks the block shape and the pattern (slot % 96 walks all 16 x 6 pairs); `case_seed`
// draws the rest.
Case draw_case(uint64_t case_seed, int slot) {
  Case c;
  c.seed = case_seed;
  Rng r(c.seed);
  c.bm = kBlocks[slot % 4];
  c.bk = kBlocks[(slot / 4) % 4];
  c.pattern = kPatterns[(slot / 16) % 6];
  c.kind = OpKind(r.below(3));
  c.op = c.kind != OpKind::sdd && r.below(2) ? Op::trans : Op::none;
  c.in = DType(r.below(3));
  if (c.in == DType::f32) {
    c.out = DType::f32;
  } else {
    int64_t o = r.below(10);  // mostly the input type or f32; sometimes the other half type
    c.out = o < 5 ? c.in : o < 9 ? DType::f32 : (c.in == DType::f16 ? DType::bf16 : DType::f16);
  }
  c.density = r.pick(std::vector<double>{0.05, 0.1, 0.25, 0.5, 0.75, 1.0});
  // Keep each case small (the oracle is naive): sparse sides up to ~320, dense side up to 260.
  c.mb = 1 + r.below(std::max<int64_t>(1, 320 / c.bm));
  c.kb = 1 + r.below(std::max<int64_t>(1, 320 / c.bk));
  int64_t f = r.below(100);
  c.free = f < 10 ? 1 : f < 25 ? 2 + r.below(15) : 1 + r.below(260);
  c.la = Layout(r.below(2));
  c.lb = Layout(r.below(2));
  c.lc = Layout(r.below(2));
  auto pad = [&] { return r.below(10) < 6 ? int64_t(0) : 1 + r.below(9); };
  c.pa = pad();
  c.pb = pad();
  c.pc = pad();
  c.alpha = r.pick(std::vector<float>{1.f, -1.f, 0.5f, 2.f, 1.25f});
  c.beta = r.below(2) ? 0.f : r.pick(std::vector<float>{1.f, -0.5f, 2.f});
  c.integers = r.below(10) < 4;
  int64_t e = r.below(100);
  c.edge = e < 5 ? kNoBlocks : e < 15 ? kEmptyRows : kNone;
  return c;
}

// Case `index` of the default sweep: a pure function of (seed, index).
Case make_case(uint64_t seed, int index) { return draw_case(mix_seed(seed, uint64_t(index)), index); }

// Draw `t` >= 1 of case `index` under a forced variant list (--variants), used when the earlier
// draws fell outside every listed variant's domain: a pure function of (seed, index, t), so
// --seed S --case I --variants X reproduces it. The block shape and pattern are drawn too (the
// default sweep's cycling would keep handing, say, a 16x16 shape to a variant that has none).
Case redraw_case(uint64_t seed, int index, int t) {
  const uint64_t s = mix_seed(mix_seed(seed, uint64_t(index)), 0x7265647261770000ull + uint64_t(t));
  Rng slot(mix_seed(s, 96));
  return draw_case(s, int(slot.below(96)));
}
// Draws per case before giving up (the case then counts as having no supporting variant). A
// narrow domain such as hopper's (f16/bf16, bm and bk in {32,64,128}; for SDD dense operands with
// 16-byte aligned lines) holds a few percent of the draws, so 2000 draws practically never miss it. A rejected draw only builds the operands' shapes (and uploads
// them on a GPU): no values, no oracle.
constexpr int kMaxDraws = 2000;

// One case's host operands (the oracle reads these) and the output's original bytes.
struct Problem {
  Case c;
  BsrMatrix s;
  HostMatrix a, b, cm;  // dense operands (unused ones stay empty)
  GemmArgs g;           // host pointers
  std::vector<uint8_t> out0;  // output bytes before the run (C dense or C's BSR values)
};

BsrMatrix make_sparse(const Case& c, DType dtype, Rng& r, bool fill) {
  Pattern p = make_pattern(c.pattern, c.mb, c.kb, c.density, c.seed);
  std::vector<int32_t> rp(size_t(c.mb + 1), 0), ci;
  for (int64_t i = 0; i < c.mb; ++i) {
    bool drop = c.edge == kNoBlocks || (c.edge == kEmptyRows && r.below(3) == 0);
    if (!drop)
      for (int32_t j = p.row_ptr[size_t(i)]; j < p.row_ptr[size_t(i + 1)]; ++j) ci.push_back(p.col_idx[size_t(j)]);
    rp[size_t(i + 1)] = int32_t(ci.size());
  }
  BsrMatrix m(c.mb * c.bm, c.kb * c.bk, c.bm, c.bk, std::move(rp), std::move(ci), dtype);
  if (fill) m.fill_random(mix_seed(c.seed, 11), c.integers);
  return m;
}

// With fill = false only the shapes, pattern and storage are made (values left zero): enough for
// a variant's why_not(), which must not depend on values.
void build(Problem& p, bool fill = true) {
  const Case& c = p.c;
  Rng r(mix_seed(c.seed, 7));
  GemmArgs& g = p.g;
  g.kind = c.kind;
  g.op = c.op;
  g.alpha = c.alpha;
  g.beta = c.beta;
  const bool ints = c.integers;
  if (c.kind == OpKind::dsd) {
    p.s = make_sparse(c, c.in, r, fill);
    g.sparse = p.s.view();
    const int64_t M = c.op == Op::none ? p.s.rows() : p.s.cols(), K = c.op == Op::none ? p.s.cols() : p.s.rows();
    p.b = HostMatrix(K, c.free, c.in, c.lb, c.pb);
    if (fill) p.b.fill_random(mix_seed(c.seed, 2), ints);
    p.cm = HostMatrix(M, c.free, c.out, c.lc, c.pc);
    g.b = p.b.view;
  } else if (c.kind == OpKind::dds) {
    p.s = make_sparse(c, c.in, r, fill);
    g.sparse = p.s.view();
    const int64_t K = c.op == Op::none ? p.s.rows() : p.s.cols(), N = c.op == Op::none ? p.s.cols() : p.s.rows();
    p.a = HostMatrix(c.free, K, c.in, c.la, c.pa);
    if (fill) p.a.fill_random(mix_seed(c.seed, 1), ints);
    p.cm = HostMatrix(c.free, N, c.out, c.lc, c.pc);
    g.a = p.a.view;
  } else {
    p.s = make_sparse(c, c.out, r, fill);
    p.a = HostMatrix(p.s.rows(), c.free, c.in, c.la, c.pa);
    p.b = HostMatrix(c.free, p.s.cols(), c.in, c.lb, c.pb);
    if (fill) {
      p.a.fill_random(mix_seed(c.seed, 1), ints);
      p.b.fill_random(mix_seed(c.seed, 2), ints);
    }
    if (fill && c.beta == 0.f) std::fill(p.s.value_bytes().begin(), p.s.value_bytes().end(), uint8_t(0xFF));  // NaN
    g.sparse = p.s.view();
    g.a = p.a.view;
    g.b = p.b.view;
    p.out0 = p.s.value_bytes();
    return;
  }
  // Dense C: NaN everywhere when beta = 0 (must be neither read nor leaked); else random values
  // with NaN in the padding (which must stay as it is).
  if (fill && c.beta == 0.f)
    p.cm.fill_bytes(0xFF);
  else if (fill)
    p.cm.fill_random(mix_seed(c.seed, 3), ints);
  g.c = p.cm.view;
  p.out0 = p.cm.bytes;
}

double tolerance(const Case& c) {
  if (c.out == DType::bf16) return 1.6e-2;
  if (c.out == DType::f16) return 2e-3;
  return 1e-4;
}
// Integer inputs with an fp32 output: every partial sum is an integer below 2^24 and alpha, beta
// are multiples of 1/4, so any summation order gives the exact result.
bool exact(const Case& c) { return c.integers && c.out == DType::f32; }

struct Check {
  bool ok = true;
  double err = 0;  // max |got - ref| / max |ref|
  std::string why;
};

Check compare(const Problem& p, const std::vector<uint8_t>& got, const std::vector<double>& ref) {
  Check k;
  const Case& c = p.c;
  double scale = 0;
  for (double x : ref) scale = std::max(scale, std::fabs(x));
  const double tol = exact(c) ? 0.0 : tolerance(c);
  const DType t = c.out;
  const size_t es = dtype_size(t);
  auto check_elem = [&](double gv, double rv, const std::string& where) {
    double d = std::fabs(gv - rv);
    double e = scale > 0 ? d / scale : d;
    if (!std::isfinite(gv)) e = std::numeric_limits<double>::infinity();
    if (e > k.err) k.err = e;
    if (k.ok && e > tol) {
      k.ok = false;
      char b[256];
      std::snprintf(b, sizeof b, "%s: got %.9g, want %.9g (error %.3g of max|ref| %.3g, tolerance %.3g%s)",
                    where.c_str(), gv, rv, e, scale, tol, exact(c) ? ", exact" : "");
      k.why = b;
    }
  };
  if (c.kind == OpKind::sdd) {
    for (size_t i = 0; i < ref.size(); ++i)
      check_elem(load_as_float(got.data(), t, int64_t(i)), ref[i], "C value [" + std::to_string(i) + "]");
    return k;
  }
  const HostMatrix& cm = p.cm;
  const int64_t N = cm.view.cols, n = int64_t(cm.elements());
  for (int64_t i = 0; i < n; ++i) {
    if (cm.is_padding(i)) {
      if (std::memcmp(got.data() + size_t(i) * es, p.out0.data() + size_t(i) * es, es) != 0 && k.ok) {
        k.ok = false;
        k.err = std::numeric_limits<double>::infinity();
        k.why = "wrote into C's padding (storage index " + std::to_string(i) + ", ld " + std::to_string(cm.view.ld) + ")";
      }
      continue;
    }
    int64_t major = i / cm.view.ld, minor = i % cm.view.ld;
    int64_t row = cm.view.layout == Layout::row_major ? major : minor;
    int64_t col = cm.view.layout == Layout::row_major ? minor : major;
    check_elem(load_as_float(got.data(), t, i), ref[size_t(row * N + col)],
               "C(" + std::to_string(row) + ", " + std::to_string(col) + ")");
  }
  return k;
}

// Runs `v` on a copy of the problem's output and returns the output bytes.
std::vector<uint8_t> run_host(const Variant& v, const Problem& p, int threads) {
  GemmArgs g = p.g;
  std::vector<uint8_t> out = p.out0;
  if (p.c.kind == OpKind::sdd)
    g.sparse.values = out.empty() ? nullptr : out.data();
  else
    g.c.data = out.data();
  Options o;
  o.backend = Backend::cpu;
  o.variant = v.name;
  o.threads = threads;
  gemm(g, o);
  return out;
}

// Device copies of a problem (uploaded once per case; the output is reset before every run).
struct DeviceProblem {
  DeviceBuffer rp, ci, vals, a, b, c;
  GemmArgs g;
  explicit DeviceProblem(const Problem& p) {
    g = p.g;
    const BsrView& s = p.g.sparse;
    rp = DeviceBuffer(size_t(s.mb() + 1) * 4);
    ci = DeviceBuffer(size_t(s.nnzb) * 4);
    vals = DeviceBuffer(size_t(s.nnzb) * s.bm * s.bk * dtype_size(s.dtype));
    rp.upload(s.row_ptr, rp.bytes);
    ci.upload(s.col_idx, ci.bytes);
    vals.upload(s.values, vals.bytes);
    g.sparse.row_ptr = static_cast<const int32_t*>(rp.p);
    g.sparse.col_idx = s.nnzb ? static_cast<const int32_t*>(ci.p) : nullptr;
    g.sparse.values = s.nnzb ? vals.p : nullptr;
    g.sparse.memory = Memory::device;
    auto put = [](DenseView& d, DeviceBuffer& buf, const std::vector<uint8_t>& bytes) {
      buf = DeviceBuffer(bytes.size());
      buf.upload(bytes.data(), bytes.size());
      d.data = buf.p;
      d.memory = Memory::device;
    };
    if (p.c.kind != OpKind::dds) put(g.b, b, p.b.bytes);
    if (p.c.kind != OpKind::dsd) put(g.a, a, p.a.bytes);
    if (p.c.kind != OpKind::sdd) put(g.c, c, p.out0);
  }
  std::vector<uint8_t> run(const Variant& v, const Problem& p) {
    DeviceBuffer& out = p.c.kind == OpKind::sdd ? vals : c;
    out.upload(p.out0.data(), p.out0.size());
    Options o;
    o.backend = Backend::cuda;
    o.variant = v.name;
    gemm(g, o);
    check_cuda(cudaDeviceSynchronize(), (std::string(v.name) + " run").c_str());
    std::vector<uint8_t> got(p.out0.size());
    out.download(got.data(), got.size());
    return got;
  }
};

// A variant's why_not(), with a throw read as a reason.
std::string why_not(const Variant& v, const GemmArgs& g) {
  try {
    return v.why_not(g);
  } catch (const Error& e) {
    return e.what();
  }
}

// The first draw of case `index` (draws `first` .. kMaxDraws - 1) that one of `vs` supports,
// judged on the operands' shapes alone (uploaded on a GPU: device variants check device
// pointers). Returns the draw number (0 = the default sweep's case), or -1 when no draw fits:
// *out is then the default case (it counts as having no supporting variant) and *why holds the
// listed variants' reasons for the last draw. A draw that cannot be built is taken as it is, so
// the main loop reports it.
int fit_case(uint64_t seed, int index, int first, const std::vector<const Variant*>& vs, Backend be, Case* out,
             std::string* why = nullptr) {
  for (int t = first; t < kMaxDraws; ++t) {
    Problem q;
    q.c = t == 0 ? make_case(seed, index) : redraw_case(seed, index, t);
    try {
      build(q, false);
      validate(q.g, true);
    } catch (const Error&) {
      *out = q.c;
      return t;
    }
    std::unique_ptr<DeviceProblem> dev;
    if (be == Backend::cuda) dev = std::make_unique<DeviceProblem>(q);  // an upload error aborts verify
    std::string reasons;
    for (const Variant* v : vs) {
      const std::string w = why_not(*v, dev ? dev->g : q.g);
      if (w.empty()) {
        *out = q.c;
        return t;
      }
      reasons += (reasons.empty() ? "" : "; ") + std::string(v->name) + ": " + w;
    }
    if (why) *why = reasons;
  }
  if (index >= 0) *out = make_case(seed, index);
  return -1;
}

}  // namespace

int verify_main(const std::vector<std::string>& argv) {
  Args args(argv, kSpecs);
  if (args.help()) {
    print_help("sparsek verify [flags]",
               "Randomized correctness sweep: DSD/DDS/SDD over all 16 block shapes, f32/f16/bf16, the six\n"
               "patterns, op none/trans, row/col-major operands with padded leading dimensions, alpha/beta,\n"
               "N = 1, nnzb = 0 and empty block rows; every (non-peer) variant of the backend that supports\n"
               "a case is compared with the fp64 oracle on a NaN-poisoned output (exactly, for integer\n"
               "inputs with an fp32 output). Exits 1 on any mismatch and lists the failing cases; each\n"
               "one is reproducible with --seed S --case I.",
               kSpecs);
    return 0;
  }
  const DeviceInfo& info = device_info();
  const std::vector<std::string> only = args.list("--variants");
  const bool forced = !only.empty();
  // A forced variant list names its backend (so `--variants cpu` checks the CPU variant on a GPU
  // machine too); an explicit --backend must agree with it.
  Backend requested = args.backend("--backend");
  const bool explicit_backend = requested != Backend::automatic;
  std::string first_named;
  for (const std::string& n : only) {
    const Variant* v = find_variant(n);
    if (!v) args.bad("--variants", "unknown variant '" + n + "'");
    const char* vb = v->backend == Backend::cpu ? "cpu" : "cuda";
    if (requested == Backend::automatic) {
      requested = v->backend;
      first_named = n;
    } else if (v->backend != requested) {
      const std::string rb = requested == Backend::cpu ? "cpu" : "cuda";
      args.bad("--variants", "variant '" + n + "' runs on the " + vb + " backend, " +
                                 (explicit_backend ? "not on --backend " + rb
                                                   : "'" + first_named + "' on the " + rb +
                                                         " backend: list variants of one backend per run"));
    }
  }
  if (forced && !explicit_backend && requested == Backend::cuda && !info.available)
    throw no_gpu_error("--variants " + first_named + ": a GPU variant",
                       "--variants " + first_named + ": a GPU variant, but no GPU found: ");
  const Backend be = use_gpu(requested) ? Backend::cuda : Backend::cpu;
  const int cases = int(args.integer("--cases", be == Backend::cuda ? 1000 : 200, 1, 10000000));
  const uint64_t seed = args.seed("--seed", 1);
  const int only_case = int(args.integer("--case", -1, 0, 10000000));
  const bool peers = args.has("--peers"), verbose = args.has("--verbose"), inject = args.has("--inject-error");
  const int threads = int(args.integer("--threads", 0, 1, 4096));
  JsonOutput json(args);

  std::vector<const Variant*> vs;
  for (const Variant& v : variants())
    if (v.backend == be && (peers || !v.peer || forced) &&
        (only.empty() || std::find(only.begin(), only.end(), v.name) != only.end()))
      vs.push_back(&v);
  std::string names;
  for (const Variant* v : vs) names += (names.empty() ? "" : ", ") + std::string(v->name);
  std::printf("sparsek verify: %s, seed %llu, backend %s (%s), variants: %s\n",
              only_case >= 0 ? ("case " + std::to_string(only_case)).c_str() : (std::to_string(cases) + " cases").c_str(),
              (unsigned long long)seed, be == Backend::cpu ? "cpu" : "cuda",
              be == Backend::cpu ? (info.available ? "chosen" : ("no GPU: " + info.why_not).c_str())
                                 : info.name.c_str(),
              names.empty() ? "(none)" : names.c_str());
  if (vs.empty()) {
    std::printf("no variant to check\n");
    return 1;
  }
  Json doc = json_header("verify", argv);
  doc["backend"] = be == Backend::cpu ? "cpu" : "cuda";
  doc["device"] = be == Backend::cpu ? "cpu" : info.name;
  doc["seed"] = int64_t(seed);
  doc["cases"] = only_case >= 0 ? 1 : cases;
  if (only_case >= 0) doc["case"] = only_case;
  doc["variants"] = Json::array();
  for (const Variant* v : vs) doc["variants"].push_back(v->name);

  if (forced) {
    // Whether the listed variants support anything on this machine (hopper on a non-sm_90 GPU
    // supports nothing): else every case would spend kMaxDraws draws in vain. The probe draws
    // depend on (seed, variant list, machine) only, so --case I still reproduces case I.
    Case unused;
    std::string why;
    if (fit_case(seed, -1, 1, vs, be, &unused, &why) < 0) {
      std::printf("no listed variant supports any of %d probe draws here (reasons for the last one: %s)\n",
                  kMaxDraws - 1, why.c_str());
      return 1;
    }
  }

  struct Failure {
    int index;
    std::string variant, desc, why;
  };
  std::vector<Failure> failures;
  int64_t runs = 0, exact_runs = 0, unsupported_cases = 0;
  std::vector<int64_t> per_variant(vs.size(), 0);  // cases each variant checked
  int64_t redrawn = 0, draws = 0, no_fit = 0;      // --variants: drawing into the domain
  std::map<std::string, int64_t> by_kind, by_dtype, by_pattern, by_edge;
  std::map<std::string, int64_t> by_block;
  double worst = 0;  // worst error / tolerance (non-exact runs)
  std::string worst_at;
  Progress progress(stdout_is_tty());
  const int first = only_case >= 0 ? only_case : 0, last = only_case >= 0 ? only_case + 1 : cases;
  bool aborted = false;

  for (int i = first; i < last && !aborted; ++i) {
    progress.step(size_t(i - first), size_t(last - first), "failures " + std::to_string(failures.size()));
    Problem p;
    int draw = 0;
    if (forced) {
      // Draw case i inside the listed variants' domain (the default case when it already is).
      try {
        draw = fit_case(seed, i, 0, vs, be, &p.c);
      } catch (const Error& e) {
        failures.push_back({i, "-", "", std::string("could not upload a draw of the case: ") + e.what()});
        aborted = true;
        break;
      }
      draws += draw < 0 ? kMaxDraws : draw + 1;
      if (draw > 0) ++redrawn;
      if (draw < 0) ++no_fit;
    } else {
      p.c = make_case(seed, i);
    }
    std::string desc;
    try {
      build(p);
      desc = describe(p.c, p.g) + (draw > 0 ? " draw=" + std::to_string(draw) : "");
      validate(p.g, true);
    } catch (const Error& e) {
      failures.push_back({i, "-", desc, std::string("could not build the case: ") + e.what()});
      continue;
    }
    std::vector<double> ref;  // the oracle's C, made once a variant supports the case
    std::unique_ptr<DeviceProblem> dev;
    if (be == Backend::cuda) {
      try {
        dev = std::make_unique<DeviceProblem>(p);
      } catch (const Error& e) {
        failures.push_back({i, "-", desc, std::string("could not upload the case: ") + e.what()});
        aborted = true;
        break;
      }
    }
    const GemmArgs& probe = dev ? dev->g : p.g;
    int ran = 0;
    for (size_t vi = 0; vi < vs.size(); ++vi) {
      const Variant* v = vs[vi];
      const std::string why = why_not(*v, probe);
      if (verbose) std::printf("case %d %s: %s%s\n", i, v->name, desc.c_str(), why.empty() ? "" : (" -> skip: " + why).c_str());
      if (!why.empty()) continue;
      if (!ran) ref = oracle(p.g);
      ++per_variant[vi];
      Check k;
      try {
        std::vector<uint8_t> got = dev ? dev->run(*v, p) : run_host(*v, p, threads);
        if (inject && !got.empty()) {
          // Corrupt the first element that is not padding: the comparison must catch it.
          size_t es = dtype_size(p.c.out), e = 0;
          if (p.c.kind != OpKind::sdd)
            while (e < p.cm.elements() && p.cm.is_padding(int64_t(e))) ++e;
          if (e * es < got.size()) store_from_float(got.data(), p.c.out, int64_t(e), load_as_float(got.data(), p.c.out, int64_t(e)) + 1.f);
        }
        k = compare(p, got, ref);
      } catch (const Error& e) {
        k.ok = false;
        k.why = std::string(to_string(e.status())) + ": " + e.what();
        if (e.status() == Status::cuda_error) {
          // A sticky device error poisons every later case: stop here.
          if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess) aborted = true;
        }
      }
      ++ran;
      ++runs;
      if (exact(p.c)) ++exact_runs;
      if (!k.ok) failures.push_back({i, v->name, desc, k.why});
      if (!exact(p.c) && k.ok && k.err / tolerance(p.c) > worst) {
        worst = k.err / tolerance(p.c);
        worst_at = "case " + std::to_string(i) + " " + v->name;
      }
    }
    if (!ran) {
      ++unsupported_cases;
      continue;
    }
    by_kind[to_string(p.c.kind)]++;
    by_dtype[std::string(to_string(p.c.in)) + "->" + to_string(p.c.out)]++;
    by_pattern[to_string(p.c.pattern)]++;
    by_block[block_str(p.c.bm, p.c.bk)]++;
    if (p.c.edge == kNoBlocks) by_edge["nnzb=0"]++;
    if (p.c.edge == kEmptyRows) by_edge["empty rows"]++;
    if (p.g.n() == 1) by_edge["N=1"]++;
    if (p.g.m() == 1) by_edge["M=1"]++;
    if (p.c.beta == 0.f) by_edge["beta=0 on NaN"]++;
  }
  progress.clear();

  auto join = [](const std::map<std::string, int64_t>& m) {
    std::string s;
    for (const auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k + " " + std::to_string(v);
    return s;
  };
  std::printf("checked %lld run(s) (%lld exact comparisons); %lld case(s) had no supporting variant\n",
              (long long)runs, (long long)exact_runs, (long long)unsupported_cases);
  std::printf("  kinds: %s\n  dtypes: %s\n  patterns: %s\n  block shapes: %zu of 16\n  edges: %s\n",
              join(by_kind).c_str(), join(by_dtype).c_str(), join(by_pattern).c_str(), by_block.size(),
              join(by_edge).c_str());
  // Always printed, so a variant that checked few (or no) cases is visible.
  std::string pv;
  for (size_t vi = 0; vi < vs.size(); ++vi)
    pv += (vi ? ", " : "") + std::string(vs[vi]->name) + " " + std::to_string(per_variant[vi]);
  std::printf("  per variant (cases checked): %s\n", pv.c_str());
  if (forced)
    std::printf("  drawn into the --variants domain: %lld case(s) redrawn (%lld draws in all); %lld case(s) fit none "
                "in %d draws\n",
                (long long)redrawn, (long long)draws, (long long)no_fit, kMaxDraws);
  if (!worst_at.empty()) std::printf("  worst error / tolerance: %.3f (%s)\n", worst, worst_at.c_str());
  if (aborted) std::printf("ABORTED after a sticky CUDA error\n");
  if (!failures.empty()) {
    std::string only_flag;
    for (const std::string& n : only) only_flag += (only_flag.empty() ? " --variants " : ",") + n;
    std::printf("\nFAILED cases (reproduce with: sparsek verify --seed %llu --case I%s%s%s):\n",
                (unsigned long long)seed, be == Backend::cpu && !forced ? " --backend cpu" : "", only_flag.c_str(),
                peers ? " --peers" : "");
    size_t shown = 0;
    for (const Failure& f : failures) {
      if (++shown > 50) {
        std::printf("  ... and %zu more\n", failures.size() - 50);
        break;
      }
      std::printf("  case %d [%s] %s\n    %s\n", f.index, f.variant.c_str(), f.desc.c_str(), f.why.c_str());
    }
  }
  std::printf("%zu failure(s)\n", failures.size());
  if (runs == 0) std::printf("nothing was checked\n");
  const bool passed = failures.empty() && !aborted && runs > 0;
  if (json.enabled()) {
    doc["runs"] = runs;
    doc["exact_runs"] = exact_runs;
    doc["unsupported_cases"] = unsupported_cases;
    Json pvj = Json::object();
    for (size_t vi = 0; vi < vs.size(); ++vi) pvj[vs[vi]->name] = per_variant[vi];
    doc["cases_per_variant"] = pvj;
    doc["coverage"] = {{"kinds", by_kind}, {"dtypes", by_dtype}, {"patterns", by_pattern},
                       {"block_shapes", by_block}, {"edges", by_edge}};
    if (forced) doc["redraws"] = {{"redrawn", redrawn}, {"draws", draws}, {"fit_none", no_fit}};
    doc["worst_error_over_tolerance"] = num(worst_at.empty() ? std::nan("") : worst);
    doc["worst_at"] = worst_at;
    doc["aborted"] = aborted;
    Json fj = Json::array();
    for (const Failure& f : failures)
      fj.push_back({{"case", f.index}, {"variant", f.variant}, {"description", f.desc}, {"why", f.why}});
    doc["failures"] = fj;
    doc["passed"] = passed;
    json.write(doc);
    json.say_written();
  }
  return passed ? 0 : 1;
}

}  // namespace sparsek::cli
