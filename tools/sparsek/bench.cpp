// `sparsek bench`: sparsek's variants beside cuSPARSE (BSR, Blocked-ELL) and cuBLAS on the
// densified matrix, on the same inputs, in one process (SPEC §6, DESIGN "Measuring").
//
// GPU: per workload, every cuda variant that supports it (+ the peers' core calls timed alone:
// "cublas_dense_gemm" = GEMM on an A densified beforehand, "cusparse_ell_spmm" = SpMM on values
// converted beforehand, as the peers publish their numbers); median of --reps CUDA-event timings
// after --warmup runs, input sets rotated so the working set exceeds 2x L2; effective TFLOPS
// (stored blocks only), ratio to cuBLAS dense and to the best peer, the "ideal" (effective flops
// at the measured dense cuBLAS rate), and the relative error of a run on a NaN-poisoned output
// against a reference (fp64 oracle for small problems, else cuBLAS dense with fp32 output).
//
// No GPU: the CPU backend on a problem that finishes in seconds, against the fp64 oracle.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cli.hpp"
#include "core/device.hpp"
#include "cpu/oracle.hpp"
#include "cuda/peers/peers.hpp"
#include "plan/variant.hpp"

namespace sparsek::cli {

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
// Core-only peer rows: name, the variant whose state they reuse.
const char* kDenseGemm = "cublas_dense_gemm";
const char* kEllSpmm = "cusparse_ell_spmm";

const std::vector<FlagSpec> kSpecs = {
    {"--m", "M", "rows of C (default: the workload table on a GPU, 1024 on the CPU)"},
    {"--n", "N", "columns of B and C"},
    {"--k", "K", "columns of A = rows of B"},
    {"--block", "BMxBK", "block shape, each of 16, 32, 64, 128 (e.g. 64x64)"},
    {"--density", "D", "fraction of stored blocks, in (0, 1] (default 0.125)"},
    {"--pattern", "NAME", "fixed_k | bernoulli | power_law | banded | block_diagonal | causal (default fixed_k)"},
    {"--dtype", "T", "f16 | bf16 | f32 (default f16 on a GPU, f32 on the CPU); C has the same dtype"},
    {"--reps", "R", "timed repetitions, the median is reported (default 20 GPU, 5 CPU)"},
    {"--warmup", "W", "untimed runs first (default 5 GPU, 1 CPU)"},
    {"--variants", "a,b", "only these rows (variant names, cublas_dense_gemm, cusparse_ell_spmm)"},
    {"--backend", "B", "auto | cpu | cuda (default auto: cuda when a GPU answers)"},
    {"--json", "FILE", "also write every number as JSON"},
    {"--seed", "S", "random seed of patterns and values (default 1)"},
    {"--suite", "NAME", "spec (default: the workload table) | serving (decode, MoE, structured and skewed rows)"},
    {"--op", "NAME", "gemm (default) | gate (the top-k block gate: sparsek bench --op gate --help)"},
};

struct Workload {
  std::string name;  // serving suite: what the row stands for
  int64_t m = 1024, n = 1024, k = 1024;
  int bm = 64, bk = 64;
  double density = 0.125;
  PatternKind pattern = PatternKind::fixed_k;
  DType dtype = DType::f32;
};

std::string size_str(const Workload& w) {
  if (w.m == w.n && w.n == w.k) return std::to_string(w.m) + "^3";
  return std::to_string(w.m) + "x" + std::to_string(w.n) + "x" + std::to_string(w.k);
}
std::string label(const Workload& w) {
  return (w.name.empty() ? "" : w.name + ", ") + size_str(w) + " " + block_str(w.bm, w.bk) + " " +
         fmt(100.0 * w.density, 2) + "%";
}

struct Row {
  std::string name;
  bool peer = false;
  std::string status = "ok";  // ok | unsupported | failed
  std::string reason;
  std::vector<double> times_ms;
  double median_ms = kNaN, eff_tflops = kNaN, vs_dense = kNaN, vs_best_peer = kNaN, frac_ideal = kNaN;
  double rel_err = kNaN, max_err = kNaN;
  bool wrong = false;
};

struct Result {
  Workload w;
  int64_t nnzb = 0;
  double a_bytes = 0;  // A's stored values: what a small-N product must stream at least once
  double eff_flops = 0, dense_flops = 0;
  int sets = 1;
  std::string reference;
  double dense_tflops = kNaN, ideal_ms = kNaN;
  std::vector<Row> rows;
};

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ‖got − ref‖₂ / ‖ref‖₂ and max|got − ref| / max|ref|; NaN/Inf in got gives inf.
template <typename R>
void compare(const std::vector<uint8_t>& got, DType t, const R* ref, int64_t n, double* rel, double* max_rel) {
  double num = 0, den = 0, mx = 0, mref = 0;
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    double g = load_as_float(got.data(), t, i), r = double(ref[i]);
    if (!std::isfinite(g)) {
      bad = true;
      break;
    }
    double d = g - r;
    num += d * d;
    den += r * r;
    mx = std::max(mx, std::fabs(d));
    mref = std::max(mref, std::fabs(r));
  }
  if (bad) {
    *rel = *max_rel = std::numeric_limits<double>::infinity();
    return;
  }
  *rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  *max_rel = mref > 0 ? mx / mref : mx;
}

// A generous bound that only flags broken results (wrong indexing, NaN leaks), not rounding.
double sanity_tolerance(DType out) { return out == DType::bf16 ? 3e-2 : 5e-3; }

// A row for `name`: "unsupported" with the reason when `why` (why_not()'s answer) is not empty.
Row make_row(const std::string& name, bool peer, const std::string& why) {
  Row row;
  row.name = name;
  row.peer = peer;
  if (!why.empty()) {
    row.status = "unsupported";
    row.reason = why;
  }
  return row;
}

// A row whose run threw: "unsupported" for Status::unsupported, else "failed".
void mark_failed(Row& row, const Error& e) {
  row.status = e.status() == Status::unsupported ? "unsupported" : "failed";
  row.reason = e.what();
}

bool wanted(const std::vector<std::string>& only, const std::string& name) {
  return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
}

void fill_ratios(Result& r) {
  const Row* gemm = nullptr;
  for (const Row& x : r.rows)
    if (x.name == kDenseGemm && x.status == "ok") gemm = &x;
  if (!gemm)
    for (const Row& x : r.rows)
      if (x.name == std::string("cublas_dense") && x.status == "ok") gemm = &x;
  double best_peer = kNaN;
  for (const Row& x : r.rows)
    if (x.peer && x.status == "ok" && !(x.median_ms >= best_peer)) best_peer = x.median_ms;
  if (gemm) {
    r.dense_tflops = r.dense_flops / (gemm->median_ms * 1e-3) / 1e12;
    r.ideal_ms = r.eff_flops / (r.dense_tflops * 1e12) * 1e3;
  }
  for (Row& x : r.rows) {
    if (x.status != "ok") continue;
    x.eff_tflops = r.eff_flops / (x.median_ms * 1e-3) / 1e12;
    if (gemm) x.vs_dense = gemm->median_ms / x.median_ms;
    x.vs_best_peer = best_peer / x.median_ms;
    x.frac_ideal = x.eff_tflops / r.dense_tflops;
  }
}

void print_result(const Result& r, bool gpu) {
  const Workload& w = r.w;
  std::printf("\n== %s: M=%lld N=%lld K=%lld, %s blocks, %s %.2f%% (nnzb %lld, actual %.2f%%), %s\n", label(w).c_str(),
              (long long)w.m, (long long)w.n, (long long)w.k, block_str(w.bm, w.bk).c_str(), to_string(w.pattern),
              100 * w.density, (long long)r.nnzb,
              100.0 * double(r.nnzb) / double((w.m / w.bm) * (w.k / w.bk) > 0 ? (w.m / w.bm) * (w.k / w.bk) : 1),
              to_string(w.dtype));
  std::printf("   effective GFLOP %.2f; %s\n", r.eff_flops / 1e9,
              gpu ? (std::to_string(r.sets) + " input set(s) rotated; reference: " + r.reference).c_str()
                  : ("reference: " + r.reference).c_str());
  std::vector<std::vector<std::string>> rows;
  for (const Row& x : r.rows) {
    std::string note = x.status == "ok" ? (x.wrong ? "WRONG: error above " + fmt_sci(sanity_tolerance(w.dtype)) : "")
                                        : x.status + ": " + x.reason;
    if (gpu)
      rows.push_back({x.name + (x.peer ? " *" : ""), fmt(x.median_ms, 3), fmt(x.eff_tflops, 1), fmt(x.vs_dense, 2),
                      fmt(x.vs_best_peer, 2), fmt(100 * x.frac_ideal, 1), fmt_sci(x.rel_err), note});
    else
      rows.push_back({x.name, fmt(x.median_ms, 3), fmt(x.eff_tflops * 1e3, 2), fmt_sci(x.rel_err), note});
  }
  if (gpu) {
    rows.push_back({"ideal", fmt(r.ideal_ms, 3), fmt(r.dense_tflops, 1), "-", "-", "100.0", "-",
                    "effective flops at the measured cuBLAS dense rate"});
    print_table({"variant", "median ms", "eff TFLOPS", "x cuBLAS", "x best peer", "% ideal", "rel err", "note"}, rows);
    std::printf("   (* peer; x = speed-up: >1 is faster; rel err = ||C - ref|| / ||ref|| on a NaN-poisoned C)\n");
    if (w.n <= 128) {  // small N: bound by A's bytes, so the rate that matters is bytes per second
      std::string line;
      for (const Row& x : r.rows)
        if (x.status == "ok" && !x.peer)
          line += "  " + x.name + " " + fmt(r.a_bytes / (x.median_ms * 1e-3) / 1e12, 2) + " TB/s";
      std::printf("   A's values %.1f MB read at:%s (median; compare with the GPU's DRAM bandwidth)\n",
                  r.a_bytes / 1e6, line.c_str());
    }
  } else {
    print_table({"variant", "median ms", "eff GFLOPS", "rel err", "note"}, rows);
  }
}

void write_json(const std::string& path, const std::vector<Result>& results, bool gpu, const std::string& cmdline,
                int reps, int warmup, uint64_t seed) {
  Json j;
  j.begin_object();
  j.kv("tool", "sparsek bench").kv("sparsek_version", version()).kv("date", now_utc_iso8601()).kv("command", cmdline);
  j.kv("mode", gpu ? "gpu" : "cpu");
  const DeviceInfo& d = device_info();
  j.begin_object("device");
  j.kv("available", d.available);
  if (d.available) {
    j.kv("name", d.name).kv("compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor));
    j.kv("sm_count", d.sm_count).kv("l2_bytes", int64_t(d.l2_bytes));
    j.kv("driver_version", d.driver_version).kv("runtime_version", d.runtime_version);
    j.kv("cublas", peers::cublas_version()).kv("cusparse", peers::cusparse_version());
  } else {
    j.kv("why_not", d.why_not);
  }
  j.end_object();
  j.begin_object("settings").kv("reps", reps).kv("warmup", warmup).kv("seed", int64_t(seed)).end_object();
  j.begin_array("workloads");
  for (const Result& r : results) {
    const Workload& w = r.w;
    j.begin_object();
    j.kv("label", label(w)).kv("m", w.m).kv("n", w.n).kv("k", w.k).kv("bm", w.bm).kv("bk", w.bk);
    j.kv("density", w.density).kv("pattern", to_string(w.pattern)).kv("dtype", to_string(w.dtype));
    j.kv("nnzb", r.nnzb).kv("effective_flops", r.eff_flops).kv("dense_flops", r.dense_flops);
    if (!w.name.empty()) j.kv("name", w.name);
    j.kv("a_value_bytes", r.a_bytes);
    j.kv("rotation_sets", r.sets).kv("reference", r.reference);
    j.kv("dense_tflops", r.dense_tflops).kv("ideal_ms", r.ideal_ms).kv("ideal_effective_tflops", r.dense_tflops);
    j.begin_array("variants");
    for (const Row& x : r.rows) {
      j.begin_object();
      j.kv("name", x.name).kv("peer", x.peer).kv("status", x.status).kv("reason", x.reason);
      j.kv("median_ms", x.median_ms).kv("effective_tflops", x.eff_tflops);
      j.kv("ratio_vs_cublas_dense", x.vs_dense).kv("ratio_vs_best_peer", x.vs_best_peer);
      j.kv("fraction_of_ideal", x.frac_ideal).kv("rel_error", x.rel_err).kv("max_rel_error", x.max_err);
      j.kv("wrong", x.wrong);
      j.begin_array("times_ms");
      for (double t : x.times_ms) j.value(t);
      j.end_array();
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.end_object();
  std::ofstream f(path);
  f << j.str() << "\n";
  if (!f) throw Error(Status::io_error, "could not write --json " + path);
}

// ---------------------------------------------------------------------------------------------
// CPU

Result run_cpu(const Workload& w, int reps, int warmup, uint64_t seed, const std::vector<std::string>& only,
               Progress& progress) {
  Result r;
  r.w = w;
  BsrMatrix a = random_bsr(w.pattern, w.m, w.k, w.bm, w.bk, w.density, w.dtype, seed);
  HostMatrix b(w.k, w.n, w.dtype, Layout::row_major, 0), c(w.m, w.n, w.dtype, Layout::row_major, 0);
  b.fill_random(mix_seed(seed, 2), false);
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.sparse = a.view();
  g.b = b.view;
  g.c = c.view;
  validate(g, true);
  r.nnzb = a.nnzb();
  r.eff_flops = g.effective_flops();
  r.dense_flops = 2.0 * double(w.m) * double(w.n) * double(w.k);
  std::vector<double> ref;
  // The fp64 oracle is naive (~1 GFLOP/s): skip it where it would take longer than the bench.
  if (r.eff_flops <= 4e9) {
    progress.update("computing the fp64 oracle ...");
    ref = oracle(g);
    r.reference = "fp64 oracle";
  } else {
    r.reference = "none (problem too large for the fp64 oracle)";
  }
  Options o;
  o.backend = Backend::cpu;
  for (const Variant& v : variants()) {
    if (v.backend != Backend::cpu || !wanted(only, v.name)) continue;
    Row row = make_row(v.name, v.peer, v.why_not(g));
    if (row.status != "ok") {
      r.rows.push_back(row);
      continue;
    }
    try {
      progress.update(std::string("timing ") + v.name + " ...");
      std::unique_ptr<VariantState> st = v.prepare ? v.prepare(g, o) : nullptr;
      for (int i = 0; i < warmup; ++i) v.run(g, o, st.get());
      for (int i = 0; i < reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        v.run(g, o, st.get());
        auto t1 = std::chrono::steady_clock::now();
        row.times_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      row.median_ms = median(row.times_ms);
      c.fill_bytes(0xFF);  // NaN in every dtype: beta = 0 must not read it, every element must be written
      v.run(g, o, st.get());
      if (!ref.empty()) {
        compare(c.bytes, w.dtype, ref.data(), int64_t(ref.size()), &row.rel_err, &row.max_err);
        row.wrong = !(row.rel_err <= sanity_tolerance(w.dtype));
      }
    } catch (const Error& e) {
      mark_failed(row, e);
    }
    r.rows.push_back(row);
  }
  progress.clear();
  fill_ratios(r);
  return r;
}

// ---------------------------------------------------------------------------------------------
// GPU

struct GpuTimer {
  std::vector<cudaEvent_t> ev;
  explicit GpuTimer(int reps) : ev(size_t(2 * reps)) {
    for (auto& e : ev) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~GpuTimer() {
    for (auto& e : ev) cudaEventDestroy(e);
  }
};

// Warm-up, then `reps` runs each bracketed by events; run(set) enqueues one product on input set
// `set` (rotated). Returns the per-run times in ms.
template <typename F>
std::vector<double> time_gpu(F&& run, int warmup, int reps, int sets) {
  for (int i = 0; i < warmup; ++i) run(i % sets);
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  GpuTimer t(reps);
  for (int i = 0; i < reps; ++i) {
    check_cuda(cudaEventRecord(t.ev[size_t(2 * i)], nullptr), "cudaEventRecord");
    run((warmup + i) % sets);
    check_cuda(cudaEventRecord(t.ev[size_t(2 * i + 1)], nullptr), "cudaEventRecord");
  }
  check_cuda(cudaEventSynchronize(t.ev.back()), "timed runs");
  std::vector<double> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float x = 0;
    check_cuda(cudaEventElapsedTime(&x, t.ev[size_t(2 * i)], t.ev[size_t(2 * i + 1)]), "cudaEventElapsedTime");
    ms[size_t(i)] = x;
  }
  return ms;
}

Result run_gpu(const Workload& w, int reps, int warmup, uint64_t seed, const std::vector<std::string>& only,
               Progress& progress, const std::string& prefix) {
  Result r;
  r.w = w;
  const DeviceInfo& info = device_info();
  progress.update(prefix + "generating inputs ...");
  BsrMatrix a = random_bsr(w.pattern, w.m, w.k, w.bm, w.bk, w.density, w.dtype, seed);
  HostMatrix b(w.k, w.n, w.dtype, Layout::row_major, 0);
  b.fill_random(mix_seed(seed, 2), false);
  r.nnzb = a.nnzb();
  r.a_bytes = double(a.value_bytes().size());
  const size_t es = dtype_size(w.dtype);
  const size_t a_bytes = a.value_bytes().size(), b_bytes = b.bytes.size(), c_bytes = size_t(w.m * w.n) * es;
  // Rotate enough input sets that consecutive runs cannot find their operands in L2.
  const size_t set_bytes = a_bytes + b_bytes + c_bytes;
  r.sets = int(std::min<size_t>(16, std::max<size_t>(1, (2 * info.l2_bytes + set_bytes - 1) / set_bytes)));

  DeviceBuffer d_rp(a.row_ptr().size() * 4), d_ci(a.col_idx().size() * 4);
  d_rp.upload(a.row_ptr().data(), d_rp.bytes);
  d_ci.upload(a.col_idx().data(), d_ci.bytes);
  std::vector<DeviceBuffer> d_a, d_b, d_c;
  std::vector<GemmArgs> args;
  for (int s = 0; s < r.sets; ++s) {
    d_a.emplace_back(a_bytes);
    d_b.emplace_back(b_bytes);
    d_c.emplace_back(c_bytes);
    if (s == 0) {
      d_a[0].upload(a.value_bytes().data(), a_bytes);
      d_b[0].upload(b.bytes.data(), b_bytes);
    } else {  // same values: rotation is about the cache, not the data
      check_cuda(cudaMemcpy(d_a[s].p, d_a[0].p, a_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy(A copy)");
      check_cuda(cudaMemcpy(d_b[s].p, d_b[0].p, b_bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy(B copy)");
    }
    check_cuda(cudaMemset(d_c[s].p, 0xFF, c_bytes), "cudaMemset(C)");
    GemmArgs g;
    g.kind = OpKind::dsd;
    g.sparse = a.view();
    g.sparse.row_ptr = static_cast<const int32_t*>(d_rp.p);
    g.sparse.col_idx = static_cast<const int32_t*>(d_ci.p);
    g.sparse.values = d_a[s].p;
    g.sparse.memory = Memory::device;
    g.b = b.view;
    g.b.data = d_b[s].p;
    g.b.memory = Memory::device;
    g.c.data = d_c[s].p;
    g.c.rows = w.m;
    g.c.cols = w.n;
    g.c.ld = w.n;
    g.c.dtype = w.dtype;
    g.c.memory = Memory::device;
    args.push_back(g);
  }
  validate(args[0], true);
  r.eff_flops = args[0].effective_flops();
  r.dense_flops = 2.0 * double(w.m) * double(w.n) * double(w.k);
  Options o;
  o.backend = Backend::cuda;

  // Reference: fp64 oracle when it is quick, else cuBLAS on the densified A with fp32 output.
  std::vector<float> ref;
  if (r.eff_flops <= 2e9) {
    progress.update(prefix + "computing the fp64 oracle ...");
    GemmArgs h = args[0];
    h.sparse = a.view();
    h.b = b.view;
    HostMatrix hc(w.m, w.n, w.dtype, Layout::row_major, 0);
    h.c = hc.view;
    std::vector<double> d = oracle(h);
    ref.assign(d.begin(), d.end());
    r.reference = "fp64 oracle";
  } else if (const Variant* v = find_variant("cublas_dense")) {
    progress.update(prefix + "computing the cuBLAS fp32 reference ...");
    try {
      DeviceBuffer d_ref(size_t(w.m * w.n) * 4);
      GemmArgs g = args[0];
      g.c.data = d_ref.p;
      g.c.dtype = DType::f32;
      std::string why = v->why_not(g);
      if (!why.empty()) throw Error(Status::unsupported, why);
      auto st = v->prepare(g, o);
      v->run(g, o, st.get());
      check_cuda(cudaDeviceSynchronize(), "cuBLAS reference");
      ref.resize(size_t(w.m * w.n));
      d_ref.download(ref.data(), d_ref.bytes);
      r.reference = "cuBLAS dense, fp32 output";
    } catch (const Error& e) {
      ref.clear();
      r.reference = std::string("none (cuBLAS reference failed: ") + e.what() + ")";
    }
  }

  std::vector<uint8_t> got(c_bytes);
  // Poison C of set 0, run once, compare with the reference.
  auto check = [&](Row& row, auto&& run_once) {
    check_cuda(cudaMemset(d_c[0].p, 0xFF, c_bytes), "cudaMemset(poison C)");
    run_once();
    check_cuda(cudaDeviceSynchronize(), "checked run");
    d_c[0].download(got.data(), c_bytes);
    if (!ref.empty()) {
      compare(got, w.dtype, ref.data(), int64_t(ref.size()), &row.rel_err, &row.max_err);
      row.wrong = !(row.rel_err <= sanity_tolerance(w.dtype));
    }
  };
  auto fail = [&](Row& row, const Error& e) {
    mark_failed(row, e);
    cudaDeviceSynchronize();  // do not let one row's error hit the next
    cudaGetLastError();
  };

  for (const Variant& v : variants()) {
    if (v.backend != Backend::cuda || !wanted(only, v.name)) continue;
    Row row = make_row(v.name, v.peer, v.why_not(args[0]));
    if (row.status != "ok") {
      r.rows.push_back(row);
      continue;
    }
    try {
      progress.update(prefix + "timing " + v.name + " ...");
      std::unique_ptr<VariantState> st = v.prepare ? v.prepare(args[0], o) : nullptr;
      row.times_ms = time_gpu([&](int s) { v.run(args[size_t(s)], o, st.get()); }, warmup, reps, r.sets);
      row.median_ms = median(row.times_ms);
      check(row, [&] { v.run(args[0], o, st.get()); });
    } catch (const Error& e) {
      fail(row, e);
    }
    r.rows.push_back(row);
  }

  // The peers' core calls alone, on data converted beforehand.
  for (auto [name, parent] : {std::pair{kDenseGemm, "cublas_dense"}, std::pair{kEllSpmm, "cusparse_ell"}}) {
    const Variant* v = find_variant(parent);
    if (!v || !wanted(only, name)) continue;
    Row row = make_row(name, true, v->why_not(args[0]));
    if (row.status != "ok") {
      r.rows.push_back(row);
      continue;
    }
    try {
      progress.update(prefix + "timing " + name + " ...");
      std::unique_ptr<VariantState> st = v->prepare(args[0], o);
      auto* ps = static_cast<peers::PeerState*>(st.get());
      ps->convert(args[0], o.stream);
      row.times_ms = time_gpu([&](int s) { ps->core(args[size_t(s)], o.stream); }, warmup, reps, r.sets);
      row.median_ms = median(row.times_ms);
      check(row, [&] {
        ps->convert(args[0], o.stream);
        ps->core(args[0], o.stream);
      });
    } catch (const Error& e) {
      fail(row, e);
    }
    r.rows.push_back(row);
  }
  progress.clear();
  fill_ratios(r);
  return r;
}

}  // namespace

const std::vector<SpecWorkload>& spec_workloads() {
  static const std::vector<SpecWorkload> table = {{8192, 128, 128, 0.125}, {8192, 64, 64, 0.125},
                                                  {8192, 32, 32, 0.125},   {4096, 64, 64, 0.125},
                                                  {8192, 128, 128, 0.25},  {8192, 128, 32, 0.0625}};
  return table;
}

// The serving suite: the shapes users run (decode against block-pruned weights, the N alignment
// step, mixture-of-experts, structured and skewed patterns), fp16, beside the dense peers.
std::vector<Workload> serving_workloads(DType dtype) {
  auto w = [dtype](const char* name, int64_t m, int64_t n, int64_t k, int b, double density, PatternKind p) {
    Workload x;
    x.name = name;
    x.m = m;
    x.n = n;
    x.k = k;
    x.bm = x.bk = b;
    x.density = density;
    x.pattern = p;
    x.dtype = dtype;
    return x;
  };
  const PatternKind fixed = PatternKind::fixed_k;
  return {w("decode N=1", 14336, 1, 4096, 64, 0.25, fixed),
          w("decode N=16", 14336, 16, 4096, 64, 0.25, fixed),
          w("decode N=128", 14336, 128, 4096, 64, 0.25, fixed),
          w("unaligned N=999", 8256, 999, 8192, 64, 0.125, fixed),
          w("aligned N=1000", 8256, 1000, 8192, 64, 0.125, fixed),
          w("8 experts (block-diagonal)", 8192, 8192, 8192, 128, 0.125, PatternKind::block_diagonal),
          w("banded", 8192, 8192, 8192, 64, 0.125, PatternKind::banded),
          w("lower-triangular", 8192, 8192, 8192, 64, 0.5, PatternKind::causal),
          w("power-law rows", 8192, 8192, 8192, 128, 0.125, PatternKind::power_law),
          w("uniform rows", 8192, 8192, 8192, 128, 0.125, fixed)};
}

int bench_main(const std::vector<std::string>& argv) {
  // `--op gate` has its own flags (bench_gate.cpp).
  for (size_t i = 0; i < argv.size(); ++i)
    if (argv[i] == "--op=gate" || (argv[i] == "--op" && i + 1 < argv.size() && argv[i + 1] == "gate"))
      return bench_gate_main(argv);
  Args args(argv, kSpecs);
  if (args.help()) {
    print_help("sparsek bench [flags]",
               "Times DSD (C = A*B, A block-sparse) for every variant that supports the problem, beside\n"
               "cuSPARSE (BSR, Blocked-ELL) and cuBLAS on the densified A, on the same inputs. With a GPU\n"
               "and no shape flags it runs the workload table (8192^3 at 128x128, 64x64, 32x32 and 12.5%;\n"
               "4096^3 64x64 12.5%; 8192^3 128x128 25%; 8192^3 128x32 6.25%; fixed_k, f16). Without a\n"
               "GPU it runs the CPU backend on 1024^3, 64x64, 12.5% and says so. --suite serving runs\n"
               "what serving and training users run instead (GPU only): decode with W 14336x4096 at\n"
               "64x64, 25% and N = 1, 16, 128 (with the rate at which A's values are read); M 8256,\n"
               "K 8192 at N = 999 and 1000; 8 experts of 1024x1024 (block-diagonal, 128x128); banded\n"
               "and lower-triangular 64x64; power-law and uniform rows at 128x128, 12.5%. Exit code 1\n"
               "when a variant failed or produced a wrong result.",
               kSpecs);
    return 0;
  }
  if (args.str("--op", "gemm") != "gemm") args.bad("--op", "must be gemm or gate");
  const Backend backend = args.backend("--backend");
  // Parse everything before any work, so a bad flag fails fast (exit 2).
  Workload custom;
  const bool shaped = args.has("--m") || args.has("--n") || args.has("--k") || args.has("--block") ||
                      args.has("--density") || args.has("--pattern");
  const int64_t big = int64_t(1) << 20;
  custom.m = args.integer("--m", -1, 1, big);
  custom.n = args.integer("--n", -1, 1, big);
  custom.k = args.integer("--k", -1, 1, big);
  args.block("--block", &custom.bm, &custom.bk);
  custom.density = args.real("--density", 0.125, 0.0, 1.0);
  custom.pattern = args.pattern("--pattern", PatternKind::fixed_k);
  const bool dtype_given = args.has("--dtype");
  DType dtype = args.dtype("--dtype", DType::f16);
  const uint64_t seed = args.seed("--seed", 1);
  std::vector<std::string> only = args.list("--variants");
  for (const std::string& name : only)
    if (!find_variant(name) && name != kDenseGemm && name != kEllSpmm) {
      std::string known;
      for (const Variant& v : variants()) known += std::string(v.name) + ", ";
      args.bad("--variants", "unknown variant '" + name + "' (known: " + known + kDenseGemm + ", " + kEllSpmm + ")");
    }
  const std::string suite = args.str("--suite", "spec");
  if (suite != "spec" && suite != "serving") args.bad("--suite", "must be spec or serving");
  if (suite == "serving" && shaped)
    args.bad("--suite", "choose the suite or shape flags (--m, --n, --k, --block, --density, --pattern), not both");
  const std::string json = args.str("--json", "");
  if (args.has("--json") && json.empty()) args.bad("--json", "needs a file name");

  const bool gpu = use_gpu(backend);
  const DeviceInfo& info = device_info();
  if (suite == "serving" && !gpu)
    args.bad("--suite", "these workloads are sized for a GPU and none is in use (" +
                            (backend == Backend::cpu ? std::string("--backend cpu") : info.why_not) + ")");
  const int reps = int(args.integer("--reps", gpu ? 20 : 5, 1, 100000));
  const int warmup = int(args.integer("--warmup", gpu ? 5 : 1, 0, 100000));

  std::string cmdline = "sparsek bench";
  for (const std::string& a : argv) cmdline += " " + a;
  Progress progress(stdout_is_tty());
  std::vector<Result> results;

  auto fill_dims = [&](Workload w, int64_t dflt) {
    if (w.m < 0) w.m = dflt;
    if (w.n < 0) w.n = dflt;
    if (w.k < 0) w.k = dflt;
    if (w.m % w.bm) args.bad("--m", "M=" + std::to_string(w.m) + " must be a multiple of bm=" + std::to_string(w.bm));
    if (w.k % w.bk) args.bad("--k", "K=" + std::to_string(w.k) + " must be a multiple of bk=" + std::to_string(w.bk));
    return w;
  };
  std::vector<Workload> table;
  if (!gpu) {
    Workload w = fill_dims(custom, 1024);
    w.dtype = dtype_given ? dtype : DType::f32;
    table.push_back(w);
  } else if (shaped) {
    Workload w = fill_dims(custom, 8192);
    w.dtype = dtype;
    table.push_back(w);
  } else if (suite == "serving") {
    table = serving_workloads(dtype);
  } else {
    for (const SpecWorkload& d : spec_workloads()) {
      Workload w;
      w.m = w.n = w.k = d.size;
      w.bm = d.bm;
      w.bk = d.bk;
      w.density = d.density;
      w.pattern = PatternKind::fixed_k;
      w.dtype = dtype;
      table.push_back(w);
    }
  }

  if (!gpu) {
    if (backend == Backend::cpu)
      std::printf("running the CPU backend (--backend cpu)\n");
    else
      std::printf("no GPU found: %s; running the CPU backend\n", info.why_not.c_str());
    results.push_back(run_cpu(table[0], reps, warmup, seed, only, progress));
    print_result(results.back(), false);
  } else {
    std::printf("sparsek %s bench on %s (compute capability %d.%d, %d SMs), CUDA runtime %d, driver %d\n", version(),
                info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count, info.runtime_version,
                info.driver_version);
    std::printf("median of %d runs after %d warm-up runs, CUDA events; alpha = 1, beta = 0\n", reps, warmup);
    for (size_t i = 0; i < table.size(); ++i) {
      std::string prefix = "[" + std::to_string(i + 1) + "/" + std::to_string(table.size()) + "] " + label(table[i]) + ": ";
      results.push_back(run_gpu(table[i], reps, warmup, seed, only, progress, prefix));
      print_result(results.back(), true);
      std::fflush(stdout);
    }
  }
  if (!json.empty()) {
    write_json(json, results, gpu, cmdline, reps, warmup, seed);
    std::printf("\nwrote %s\n", json.c_str());
  }
  int bad = 0;
  for (const Result& r : results)
    for (const Row& x : r.rows) bad += x.status == "failed" || x.wrong;
  if (bad) std::printf("%d row(s) failed or gave a wrong result\n", bad);
  return bad ? 1 : 0;
}

}  // namespace sparsek::cli
