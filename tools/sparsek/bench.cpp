// `sparsek bench`: sparsek's variants beside cuSPARSE (BSR, Blocked-ELL, SDDMM) and cuBLAS on the
// densified matrix, on the same inputs, in one process (how docs/BENCHMARKS.md measures), for any of
// the three products (--op dsd | dds | sdd, --trans, --a-layout / --b-layout); --op attention,
// --op gate and --op decode are cases of their own (bench_attention.cpp, bench_gate.cpp,
// bench_decode.cpp).
//
// GPU: per workload, every cuda variant that supports it (+ the peers' core calls timed alone:
// "cublas_dense_gemm" = GEMM on an A densified beforehand, "cusparse_ell_spmm" = SpMM on values
// converted beforehand, "cublas_batched_gemm" = strided-batched GEMM over the experts of a
// block-diagonal A, as the peers publish their numbers); median of --reps CUDA-event timings
// (time_gpu()) after --warmup runs, input sets rotated so the working set exceeds 2x L2; effective
// TFLOPS (stored blocks only), ratio to cuBLAS dense and to the best peer, the "ideal" (effective
// flops at the measured dense cuBLAS rate), and the relative error of a run on a NaN-poisoned output
// against a reference (fp64 oracle for small problems, else cuBLAS dense with fp32 output).
//
// No GPU: the CPU backend on a problem that finishes in seconds, against the fp64 oracle.
//
// --dtype e4m3 (DSD and DDS): the sparse operand quantized with one fp32 scale per stored block,
// the dense input with one per token (quantize.hpp's amax rule, from uniform [-1, 1) values), C in
// --out (bf16 by default), beside "cublaslt_fp8_dense": cuBLASLt's dense fp8 GEMM on the same
// values densified and quantized again with one scale per operand (tensor-wise, as
// torch._scaled_mm), its output checked against the same reference. The reference of a large
// e4m3 problem is the fp64 oracle on its first 64 tokens (C's first columns in dsd, rows in dds).
#include "core/cuda_host.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_case.hpp"
#include "cpu/blas_cpu.hpp"
#include "core/no_gpu.hpp"  // kBuiltWithCuda, no_gpu_error(): what a build without CUDA says
#include "dense_fp8.hpp"
#include "sparsek/quantize.hpp"
#include "tools_internal.hpp"

namespace sparsek::cli {

namespace {

// Core-only peer rows: name, the variant whose state they reuse.
const char* kDenseGemm = "cublas_dense_gemm";
const char* kEllSpmm = "cusparse_ell_spmm";
const char* kBatchedGemm = "cublas_batched_gemm";  // over the experts of a block-diagonal A (torch.bmm's call)
const std::pair<const char*, const char*> kCoreRows[] = {
    {kDenseGemm, "cublas_dense"}, {kEllSpmm, "cusparse_ell"}, {kBatchedGemm, "cublas_batched"}};
// Rows that apply to one kind of pattern only: shown where they run or where --variants names them.
bool pattern_specific(const std::string& name) { return name == "cublas_batched" || name == kBatchedGemm; }
// The dense peer of --dtype e4m3 (dense_fp8.hpp), and the variants that run e4m3.
const char* kLtFp8 = "cublaslt_fp8_dense";
const char* kCpuDense = "openblas_dense_sgemm";  // the CPU's dense peer: OpenBLAS on the densified operand
bool runs_e4m3(const std::string& name) { return name == "cpu" || name == "hopper_fp8" || name == kLtFp8; }

const std::vector<FlagSpec> kSpecs = {
    {"--op", "OP", "dsd (A sparse; default) | dds (B sparse) | sdd (C sparse: only its blocks are computed) | "
                   "attention | gate (the top-k block gate) | decode (paged decode attention); `sparsek bench --op "
                   "OP --help` lists the flags of attention, gate and decode"},
    {"--trans", nullptr, "op = transpose on the sparse operand (dsd: C = A^T B; dds: C = A B^T)"},
    {"--a-layout", "L", "row | col: layout of the dense A (dds, sdd; default row)"},
    {"--b-layout", "L", "row | col: layout of the dense B (dsd, sdd; default row)"},
    {"--m", "M", "rows of C (default: the workload table on a GPU, 1024 on the CPU)"},
    {"--n", "N", "columns of C"},
    {"--k", "K", "the reduction: columns of op(A) = rows of op(B)"},
    {"--block", "BMxBK", "block shape of the sparse operand as stored, each of 16, 32, 64, 128 (e.g. 64x64)"},
    {"--density", "D", "fraction of stored blocks, in (0, 1] (default 0.125)"},
    {"--pattern", "NAME", "fixed_k | bernoulli | power_law | banded | block_diagonal | causal (default fixed_k)"},
    {"--dtype", "T", "f16 | bf16 | f32 | e4m3 (default f16 on a GPU, f32 on the CPU); C has the same dtype, but for "
                     "e4m3 (fp8, dsd and dds: one fp32 scale per stored block and per token; see --out). e4m3 "
                     "runs on the CPU backend too (against the fp64 oracle)"},
    {"--out", "T", "with --dtype e4m3: C's dtype, bf16 | f16 | f32 (default bf16)"},
    {"--reps", "R", "timed repetitions, the median is reported (default 20 GPU, 5 CPU)"},
    kWarmupFlag,
    {"--calls", "R", "GPU: time R calls back to back per repetition and report the time per call, as a stream of "
                     "calls runs (a decode step's layers; default 1: each call timed alone)"},
    {"--variants", "a,b", "only these rows (variant names, cublas_dense_gemm, cusparse_ell_spmm, cublas_batched_gemm)"},
    kBackendFlag,
    kThreadsFlag,
    kJsonFlag,
    {"--seed", "S", "random seed of patterns and values (default 1)"},
    {"--suite", "NAME", "spec (default: the workload table) | serving (decode, MoE, structured and skewed rows)"},
    {"--compare", "BASELINE", "the performance gate: exit 1 when a sparsek row is more than 5% slower than in "
                              "BASELINE (a bench --json file of the same GPU, or a directory of them); a row "
                              "whose time is not a positive, finite number, in either file, fails it too"},
    {"--threshold", "PCT", "--compare: how much slower a row may be, in percent (default 5)"},
    {"--from", "RESULTS", "--compare: take the results from RESULTS (a bench --json file) instead of running"},
};

struct Workload {
  std::string name;  // serving suite: what the row stands for
  int64_t m = 1024, n = 1024, k = 1024;
  int bm = 64, bk = 64;
  double density = 0.125;
  PatternKind pattern = PatternKind::fixed_k;
  DType dtype = DType::f32;
  DType out = DType::f32;  // C's dtype (sdd: the sparse operand's): dtype, but for e4m3 inputs
  OpKind kind = OpKind::dsd;
  Op op = Op::none;
  Layout la = Layout::row_major, lb = Layout::row_major;  // the dense inputs (C is row-major)
  int calls = 1;  // calls timed back to back (time_gpu())
};

// The sparse operand as stored: dsd A (M x K, or K x M for op T), dds B (K x N, or N x K), sdd C.
std::pair<int64_t, int64_t> sparse_dims(const Workload& w) {
  const bool t = w.op == Op::trans;
  switch (w.kind) {
    case OpKind::dsd: return t ? std::pair{w.k, w.m} : std::pair{w.m, w.k};
    case OpKind::dds: return t ? std::pair{w.n, w.k} : std::pair{w.k, w.n};
    case OpKind::sdd: break;
  }
  return {w.m, w.n};
}

std::string size_str(const Workload& w) {
  if (w.m == w.n && w.n == w.k) return std::to_string(w.m) + "^3";
  return std::to_string(w.m) + "x" + std::to_string(w.n) + "x" + std::to_string(w.k);
}
// "8192^3 128x128 12.50%" for DSD with row-major operands (the labels baselines are keyed by);
// other products and layouts lead with them: "dds^T 4096x14336x4096 ...", "sdd A:col ...".
std::string label(const Workload& w) {
  std::string op;
  if (w.kind != OpKind::dsd || w.op == Op::trans)
    op = std::string(to_string(w.kind)) + (w.op == Op::trans ? "^T" : "") + " ";
  if (w.kind != OpKind::dsd && w.la == Layout::col_major) op += "A:col ";
  if (w.kind != OpKind::dds && w.lb == Layout::col_major) op += "B:col ";
  return (w.name.empty() ? "" : w.name + ", ") + op + size_str(w) + " " + block_str(w.bm, w.bk) + " " +
         fmt(100.0 * w.density, 2) + "%" + (w.dtype == DType::e4m3 ? std::string(" e4m3") : "") +
         (w.calls > 1 ? ", " + std::to_string(w.calls) + " calls in a row" : "");
}

// The workload's host operands: the sparse one (random values; for sdd it is C, whose values the
// product overwrites), the dense inputs the kind uses, and args over them (C left unset).
// e4m3: the sparse operand's block scales are in s, the dense input's token scales in scales.
struct HostProblem {
  BsrMatrix s;
  HostMatrix a, b;
  std::vector<float> scales;
  GemmArgs g;
};
// A dense input (uniform [-1, 1)); e4m3: quantized from f32 with one scale per token (the rows of
// a dds's A, the columns of a dsd's B), into `scales`.
HostMatrix dense_input(int64_t rows, int64_t cols, DType t, Layout l, uint64_t seed, ScaleDim dim,
                       std::vector<float>& scales) {
  HostMatrix m(rows, cols, t == DType::e4m3 ? DType::f32 : t, l, 0);
  m.fill_random(seed, false);
  if (t != DType::e4m3) return m;
  HostMatrix q(rows, cols, DType::e4m3, l, 0);
  scales.assign(size_t(dim == ScaleDim::rows ? rows : cols), 0.f);
  quantize_e4m3(m.view, q.view, scales.data(), dim);
  return q;
}
void make_host(const Workload& w, uint64_t seed, HostProblem& p) {
  const auto [rows, cols] = sparse_dims(w);
  if (w.dtype == DType::e4m3)  // amax scales per block (random_bsr's e4m3 would give every block scale 1)
    p.s = quantize_e4m3(random_bsr(w.pattern, rows, cols, w.bm, w.bk, w.density, DType::f32, seed));
  else
    p.s = random_bsr(w.pattern, rows, cols, w.bm, w.bk, w.density, w.dtype, seed);
  GemmArgs& g = p.g;
  g.kind = w.kind;
  g.op = w.op;
  if (w.kind != OpKind::dsd) {
    p.a = dense_input(w.m, w.k, w.dtype, w.la, mix_seed(seed, 1), ScaleDim::rows, p.scales);
    g.a = p.a.view;
  }
  if (w.kind != OpKind::dds) {
    p.b = dense_input(w.k, w.n, w.dtype, w.lb, mix_seed(seed, 2), ScaleDim::cols, p.scales);
    g.b = p.b.view;
  }
  g.sparse = p.s.view();
}

// A row's figures (BenchRow::figures), in the order the JSON writes them.
const std::vector<std::string> kFigures = {"ratio_vs_cublas_dense", "ratio_vs_best_peer", "fraction_of_ideal",
                                           "rel_error", "max_rel_error"};

// What a workload reports beside its rows.
struct Measured {
  int64_t nnzb = 0;
  double a_bytes = 0;  // A's stored values: what a small-N product must stream at least once
  double dense_flops = 0;
  int sets = 1;
  std::string reference;
};

// A generous bound that only flags broken results (wrong indexing, NaN leaks), not rounding.
double sanity_tolerance(DType out) { return out == DType::bf16 ? 3e-2 : 5e-3; }
// The dense fp8 peer's: it quantizes the e4m3 inputs again with one scale per operand, which costs
// it about 6e-3 (measured on the CPU over dsd/dds, both ops and layouts) whatever C's dtype.
double fp8_peer_tolerance(DType out) { return std::max(sanity_tolerance(out), 3e-2); }

// rel_error = ‖got − ref‖₂ / ‖ref‖₂ and max_rel_error = max|got − ref| / max|ref| (inf for NaN/Inf
// in got), and whether the row is wrong; nothing when there is no reference.
template <typename R>
void check_output(const std::vector<uint8_t>& got, DType t, const std::vector<R>& ref, BenchRow& row,
                  double tolerance = kNaN) {
  if (ref.empty()) return;
  double num = 0, den = 0, mx = 0, mref = 0;
  bool bad = false;
  for (size_t i = 0; i < ref.size() && !bad; ++i) {
    const double g = load_as_float(got.data(), t, int64_t(i)), r = double(ref[i]);
    bad = !std::isfinite(g);
    num += (g - r) * (g - r);
    den += r * r;
    mx = std::max(mx, std::fabs(g - r));
    mref = std::max(mref, std::fabs(r));
  }
  const double inf = std::numeric_limits<double>::infinity();
  const double rel = bad ? inf : den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  row.figures["rel_error"] = rel;
  row.figures["max_rel_error"] = bad ? inf : mref > 0 ? mx / mref : mx;
  row.wrong = !(rel <= (std::isnan(tolerance) ? sanity_tolerance(t) : tolerance));
}

// The rates and ratios (to cuBLAS dense, to the best peer, to the ideal: the effective FLOPs at
// the measured dense cuBLAS rate), the lines around the table and the workload's JSON fields.
void finish(const Workload& w, const Measured& m, bool gpu, BenchResult& r) {
  add_rates(r);
  const BenchRow* gemm = nullptr;
  for (const BenchRow& x : r.rows)
    if ((x.name == kDenseGemm || x.name == kLtFp8) && x.ok()) gemm = &x;
  if (!gemm)
    for (const BenchRow& x : r.rows)
      if (x.name == std::string("cublas_dense") && x.ok()) gemm = &x;
  double best_peer = kNaN, dense_tflops = kNaN, ideal_ms = kNaN;
  for (const BenchRow& x : r.rows)
    if (x.peer && x.ok() && !(x.median_ms >= best_peer)) best_peer = x.median_ms;
  if (gemm) {
    dense_tflops = m.dense_flops / (gemm->median_ms * 1e-3) / 1e12;
    ideal_ms = r.eff_flops / (dense_tflops * 1e12) * 1e3;
  }
  for (BenchRow& x : r.rows) {
    if (!x.ok()) continue;
    if (gemm) x.figures["ratio_vs_cublas_dense"] = gemm->median_ms / x.median_ms;
    x.figures["ratio_vs_best_peer"] = best_peer / x.median_ms;
    x.figures["fraction_of_ideal"] = x.eff_tflops / dense_tflops;
  }

  const auto [srows, scols] = sparse_dims(w);
  const int64_t blocks = (srows / w.bm) * (scols / w.bk);
  r.intro = {"", strprintf("== %s: %s%s M=%lld N=%lld K=%lld, %s blocks, %s %.2f%% (nnzb %lld, actual %.2f%%), %s",
                           r.label.c_str(), to_string(w.kind), w.op == Op::trans ? " op=trans" : "", (long long)w.m,
                           (long long)w.n, (long long)w.k, block_str(w.bm, w.bk).c_str(), to_string(w.pattern),
                           100 * w.density, (long long)m.nnzb, 100.0 * double(m.nnzb) / double(blocks > 0 ? blocks : 1),
                           w.dtype == DType::e4m3
                               ? (std::string("e4m3 (block and token scales) -> ") + to_string(w.out)).c_str()
                               : to_string(w.dtype))};
  if (gpu && w.calls > 1)
    r.intro.push_back(
        strprintf("   time per call of %d calls back to back (input sets rotated from call to call)", w.calls));
  r.intro.push_back(strprintf("   effective GFLOP %.2f; %sreference: %s", r.eff_flops / 1e9,
                              gpu ? (std::to_string(m.sets) + " input set(s) rotated; ").c_str() : "",
                              m.reference.c_str()));
  r.wrong_note = "WRONG: error above " + fmt_sci(sanity_tolerance(w.out)) +
                 (w.dtype == DType::e4m3 ? " (" + std::string(kLtFp8) + ": " + fmt_sci(fp8_peer_tolerance(w.out)) + ")" : "");
  if (gpu) {
    r.extra_rows = {{"ideal", fmt(ideal_ms, 3), fmt(dense_tflops, 1), "-", "-", "100.0", "-",
                     w.dtype == DType::e4m3 ? "effective flops at the measured cuBLASLt dense fp8 rate"
                                            : "effective flops at the measured cuBLAS dense rate"}};
    r.outro.push_back("   (* peer; x = speed-up: >1 is faster; rel err = ||C - ref|| / ||ref|| on a NaN-poisoned C)");
    // Few tokens (a dsd's N, a dds's M): bound by the sparse operand's bytes, so the rate that
    // matters is bytes per second.
    if ((w.kind == OpKind::dds ? w.m : w.n) <= 128) {
      std::string line;
      for (const BenchRow& x : r.rows)
        if (x.ok() && !x.peer) line += "  " + x.name + " " + fmt(m.a_bytes / (x.median_ms * 1e-3) / 1e12, 2) + " TB/s";
      r.outro.push_back(strprintf("   the sparse operand's values %.1f MB read at:%s (median; compare with the GPU's DRAM bandwidth)",
                                  m.a_bytes / 1e6, line.c_str()));
    }
  } else if (w.kind != OpKind::sdd && w.dtype != DType::e4m3) {
    r.outro.push_back(std::string("   (* peer: ") + kCpuDense +
                      ", OpenBLAS's dense product on the sparse operand densified beforehand, all its threads; "
                      "x dense BLAS = its time over the row's: >1 is faster)");
  }

  r.fields = {{"m", w.m}, {"n", w.n}, {"k", w.k}, {"bm", w.bm}, {"bk", w.bk}, {"op", to_string(w.kind)},
              {"trans", w.op == Op::trans}, {"a_layout", to_string(w.la)}, {"b_layout", to_string(w.lb)},
              {"density", w.density}, {"pattern", to_string(w.pattern)}, {"dtype", to_string(w.dtype)},
              {"out_dtype", to_string(w.out)},
              {"nnzb", m.nnzb}, {"effective_flops", r.eff_flops}, {"dense_flops", m.dense_flops}};
  if (!w.name.empty()) r.fields["name"] = w.name;
  r.fields.update(Json{{"a_value_bytes", m.a_bytes}, {"rotation_sets", m.sets}, {"calls", w.calls},
                       {"reference", m.reference}, {"dense_tflops", num(dense_tflops)}, {"ideal_ms", num(ideal_ms)},
                       {"ideal_effective_tflops", num(dense_tflops)}});
}

// A row of the table before it is measured: a variant, or a peer's core call on the state of its
// parent variant (on data converted beforehand).
struct Candidate {
  std::string name;
  bool peer;
  const Variant* v;
  bool core;
};
// The listed rows (--variants), else every variant of the backend (on a GPU + the peers' core calls);
// for e4m3 only those that run it (the dense fp8 peer is measured apart: run_gpu()).
std::vector<Candidate> candidates(bool gpu, const std::vector<std::string>& only, bool fp8) {
  std::vector<Candidate> c;
  for (const Variant& v : variants())
    if (v.backend == (gpu ? Backend::cuda : Backend::cpu) && wanted(only, v.name) && (!fp8 || runs_e4m3(v.name)))
      c.push_back({v.name, v.peer, &v, false});
  if (gpu && !fp8)
    for (auto [name, parent] : kCoreRows)
      if (const Variant* v = find_variant(parent); v && wanted(only, name)) c.push_back({name, true, v, true});
  return c;
}

// The progress line over all rows of the run: "[####....]  40%  4/10  ETA 0:12  what".
struct Steps {
  Progress& progress;
  size_t done = 0, total = 1;
  void at(const std::string& what) { progress.step(done, total, what); }
};

// Every candidate's row on `args` (one per input set; set 0 is the checked one): prepared, timed
// by time(run on a set) and checked by check(row, run on set 0).
void measure_rows(const std::vector<GemmArgs>& args, bool gpu, const Options& o, const std::vector<std::string>& only,
                  Steps& steps, const std::string& prefix,
                  const std::function<std::vector<double>(const std::function<void(int)>&)>& time,
                  const std::function<void(BenchRow&, const std::function<void()>&)>& check, BenchResult& r) {
  for (const Candidate& c : candidates(gpu, only, args[0].sparse.dtype == DType::e4m3)) {
    const std::string why = c.v->why_not(args[0]);
    if (!why.empty() && pattern_specific(c.name) && only.empty()) {
      ++steps.done;
      continue;
    }
    r.rows.push_back(measure_row(c.name, c.peer, why, gpu, [&](BenchRow& row) {
      steps.at(prefix + "timing " + c.name);
      std::unique_ptr<VariantState> st = c.v->prepare ? c.v->prepare(args[0], o) : nullptr;
      auto* peer = c.core ? static_cast<peers::PeerState*>(st.get()) : nullptr;
      auto run_on = [&](int set) {
        if (peer) peer->core(args[size_t(set)], o.stream);
        else c.v->run(args[size_t(set)], o, st.get());
      };
      if (peer) peer->convert(args[0], o.stream);
      row.times_ms = time(run_on);
      check(row, [&] {
        if (peer) peer->convert(args[0], o.stream);
        run_on(0);
      });
    }));
    ++steps.done;
  }
  steps.progress.clear();
}

// Bytes of one workload's operands: A's values (at most the stored density), B and C.
double operand_bytes(const Workload& w) {
  const double es = double(dtype_size(w.dtype));
  return (std::min(1.0, w.density * 1.01) * double(w.m) * double(w.k) + double(w.k) * double(w.n)) * es +
         double(w.m) * double(w.n) * double(dtype_size(w.out));
}
std::string dims_text(const Workload& w) {
  return "--m " + std::to_string(w.m) + " --n " + std::to_string(w.n) + " --k " + std::to_string(w.k);
}

struct Settings {
  int reps, warmup;
  uint64_t seed;
  std::vector<std::string> only;
  int threads;
};

// ---------------------------------------------------------------------------------------------
// CPU

BenchResult run_cpu(const Workload& w, const Settings& s, Steps& steps) {
  BenchResult r;
  r.label = label(w);
  r.figures = kFigures;
  Measured m;
  const bool with_oracle = 2.0 * w.density * double(w.m) * double(w.k) * double(w.n) <= 4e9;
  // The operands, the CPU backend's float panels of them, and the oracle's doubles.
  check_host_bytes("the workload " + dims_text(w),
                   operand_bytes(w) * (1.0 + 4.0 / double(dtype_size(w.dtype))) +
                       (with_oracle ? 8.0 * double(w.m) * double(w.n) : 0.0));
  HostProblem hp;
  make_host(w, s.seed, hp);
  GemmArgs& g = hp.g;
  HostMatrix c;  // dsd / dds: C (sdd writes the sparse operand's values)
  std::vector<uint8_t>* out = &hp.s.value_bytes();
  if (w.kind != OpKind::sdd) {
    c = HostMatrix(w.m, w.n, w.out, Layout::row_major, 0);
    g.c = c.view;
    out = &c.bytes;
  }
  validate(g, true);
  m.nnzb = hp.s.nnzb();
  r.eff_flops = g.effective_flops();
  m.dense_flops = 2.0 * double(w.m) * double(w.n) * double(w.k);
  std::vector<double> ref;
  // The fp64 oracle is naive (~1 GFLOP/s): skip it where it would take longer than the bench.
  if (with_oracle) {
    steps.at("computing the fp64 oracle");
    ref = oracle(g);
    m.reference = "fp64 oracle";
  } else {
    m.reference = "none (problem too large for the fp64 oracle)";
  }
  Options o;
  o.backend = Backend::cpu;
  o.threads = s.threads;
  measure_rows(
      {g}, false, o, s.only, steps, "",
      [&](const std::function<void(int)>& run) { return timing::time_host([&] { run(0); }, s.warmup, s.reps); },
      [&](BenchRow& row, const std::function<void()>& run) {
        std::fill(out->begin(), out->end(), uint8_t(0xFF));  // NaN in every dtype: beta = 0 must not read it,
        run();                                                // and every element must be written
        check_output(*out, w.out, ref, row);
      },
      r);
  // Beside it, the dense product a NumPy user would call: OpenBLAS's sgemm with all its threads on
  // the sparse operand densified beforehand (dsd and dds; f32 inputs as they are, f16 / bf16
  // widened to f32 beforehand).
  if (w.kind != OpKind::sdd && w.dtype != DType::e4m3 && cpu_blas_available() && wanted(s.only, kCpuDense)) {
    const int64_t M = w.m, N = w.n, K = w.k;
    const bool fits = cpu_blas_fits(M, N, K, K, N, N);
    r.rows.push_back(measure_row(kCpuDense, true, fits ? "" : "an extent exceeds the BLAS interface's int", false,
                                 [&](BenchRow& row) {
      steps.at("timing " + std::string(kCpuDense));
      const std::vector<float> sd = bsr_to_dense(hp.s);  // the sparse operand as stored
      const int64_t cols = hp.s.cols();
      const bool t = w.op == Op::trans;
      std::vector<float> lhs(size_t(M * K)), rhs(size_t(K * N)), cf(size_t(M * N));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k)
          lhs[size_t(i * K + k)] = w.kind == OpKind::dsd ? sd[size_t(t ? k * cols + i : i * cols + k)]
                                                         : load_as_float(g.a.data, g.a.dtype, g.a.index(i, k));
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j)
          rhs[size_t(k * N + j)] = w.kind == OpKind::dds ? sd[size_t(t ? j * cols + k : k * cols + j)]
                                                         : load_as_float(g.b.data, g.b.dtype, g.b.index(k, j));
      auto gemm = [&] { cpu_sgemm(M, N, K, lhs.data(), K, rhs.data(), N, false, cf.data(), N); };
      row.times_ms = timing::time_host(gemm, s.warmup, s.reps);
      std::fill(out->begin(), out->end(), uint8_t(0xFF));
      gemm();
      for (int64_t e = 0; e < M * N; ++e) store_from_float(out->data(), w.out, e, cf[size_t(e)]);  // C: row-major, ld N
      check_output(*out, w.out, ref, row);
    }));
    ++steps.done;
  }
  finish(w, m, false, r);
  return r;
}

// ---------------------------------------------------------------------------------------------
// GPU

// The dense fp8 peer's inputs (dense_fp8.hpp): L = op(A) of a dsd, or A of a dds (M x K), and R^T
// (N x K; R = B of a dsd, op(B) of a dds), both row-major: the values of the workload's e4m3
// operands (scale times code) densified, then quantized again with one scale per operand.
struct DenseFp8Inputs {
  std::vector<uint8_t> lhs, rhs;
  float lhs_scale = 1, rhs_scale = 1;
};
// x / scale rounded to e4m3 for every x, with scale = amax / 448 (1 for all zeros).
float quantize_tensor(const std::vector<float>& x, std::vector<uint8_t>& codes) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float scale = amax > 0 ? amax / 448.f : 1.f;
  codes.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) codes[i] = float_to_e4m3(x[i] / scale).bits;
  return scale;
}
DenseFp8Inputs dense_fp8_inputs(const Workload& w, const HostProblem& hp) {
  const std::vector<float> sd = bsr_to_dense(hp.s);  // the sparse operand as stored, scales applied
  const int64_t cols = hp.s.cols();
  const bool t = w.op == Op::trans;
  const DenseView& d = w.kind == OpKind::dsd ? hp.g.b : hp.g.a;  // the e4m3 dense input
  const std::vector<uint8_t>& codes = w.kind == OpKind::dsd ? hp.b.bytes : hp.a.bytes;
  auto dense = [&](int64_t r, int64_t c, int64_t token) {
    return hp.scales[size_t(token)] * e4m3_to_float(e4m3_t{codes[size_t(d.index(r, c))]});
  };
  std::vector<float> l(size_t(w.m * w.k)), rt(size_t(w.n * w.k));
  for (int64_t i = 0; i < w.m; ++i)
    for (int64_t k = 0; k < w.k; ++k)
      l[size_t(i * w.k + k)] = w.kind == OpKind::dsd ? sd[size_t(t ? k * cols + i : i * cols + k)] : dense(i, k, i);
  for (int64_t j = 0; j < w.n; ++j)
    for (int64_t k = 0; k < w.k; ++k)
      rt[size_t(j * w.k + k)] = w.kind == OpKind::dsd ? dense(k, j, j) : sd[size_t(t ? j * cols + k : k * cols + j)];
  DenseFp8Inputs in;
  in.lhs_scale = quantize_tensor(l, in.lhs);
  in.rhs_scale = quantize_tensor(rt, in.rhs);
  return in;
}

// The e4m3 reference's sample: the fp64 oracle on the first `tokens` tokens (C's first columns in
// dsd, its first rows in dds); 0 = all of C.
int64_t reference_tokens(const Workload& w, double eff_flops) {
  const int64_t tokens = w.kind == OpKind::dsd ? w.n : w.m;
  return w.dtype != DType::e4m3 || eff_flops <= 2e9 ? 0 : std::min<int64_t>(tokens, 64);
}
// C's elements of the sample (row-major M x N, `es` bytes each), packed as the oracle returns them.
std::vector<uint8_t> sample_of(const std::vector<uint8_t>& c, const Workload& w, int64_t tokens, size_t es) {
  if (tokens == 0) return c;
  if (w.kind != OpKind::dsd) return std::vector<uint8_t>(c.begin(), c.begin() + ptrdiff_t(size_t(tokens * w.n) * es));
  std::vector<uint8_t> out(size_t(w.m * tokens) * es);
  for (int64_t i = 0; i < w.m; ++i)
    std::copy_n(c.begin() + ptrdiff_t(size_t(i * w.n) * es), size_t(tokens) * es,
                out.begin() + ptrdiff_t(size_t(i * tokens) * es));
  return out;
}

BenchResult run_gpu(const Workload& w, const Settings& s, Steps& steps, const std::string& prefix) {
  BenchResult r;
  r.label = label(w);
  r.figures = kFigures;
  Measured m;
  const DeviceInfo& info = device_info();
  // Host: the operands and a float reference; device: one input set and an f32 reference.
  // (e4m3: + the dense peer's inputs, densified in f32 and quantized again)
  check_host_bytes("the workload " + dims_text(w),
                   operand_bytes(w) + 8.0 * double(w.m) * double(w.n) +
                       (w.dtype == DType::e4m3 ? 9.0 * (double(w.m) + double(w.n)) * double(w.k) : 0.0));
  check_device_bytes("the workload " + dims_text(w), operand_bytes(w) + 4.0 * double(w.m) * double(w.n));
  steps.at(prefix + "generating inputs");
  HostProblem hp;
  make_host(w, s.seed, hp);
  const BsrMatrix& sp = hp.s;
  m.nnzb = sp.nnzb();
  m.a_bytes = double(sp.value_bytes().size());
  const bool sdd = w.kind == OpKind::sdd, fp8 = w.dtype == DType::e4m3;
  const size_t es = dtype_size(w.out);  // C's elements
  // The output: C (dsd, dds) or the sparse operand's values (sdd).
  const size_t s_bytes = sp.value_bytes().size(), a_bytes = hp.a.bytes.size(), b_bytes = hp.b.bytes.size();
  const size_t c_bytes = sdd ? s_bytes : size_t(w.m * w.n) * es;
  // Rotate enough input sets that consecutive runs cannot find their operands in L2.
  const size_t set_bytes = s_bytes + a_bytes + b_bytes + (sdd ? 0 : c_bytes);
  m.sets = int(std::min<size_t>(16, std::max<size_t>(1, (2 * info.l2_bytes + set_bytes - 1) / set_bytes)));

  DeviceBuffer d_rp(sp.row_ptr().size() * 4), d_ci(sp.col_idx().size() * 4);
  d_rp.upload(sp.row_ptr().data(), d_rp.bytes);
  d_ci.upload(sp.col_idx().data(), d_ci.bytes);
  // e4m3: the scales (one copy: a few KB beside the values).
  DeviceBuffer d_block_scales(sp.scales().size() * 4), d_token_scales(hp.scales.size() * 4);
  d_block_scales.upload(sp.scales().data(), d_block_scales.bytes);
  d_token_scales.upload(hp.scales.data(), d_token_scales.bytes);
  std::vector<DeviceBuffer> d_s, d_a, d_b, d_c;
  std::vector<GemmArgs> args;
  // A copy of set 0's buffer (same values: rotation is about the cache, not the data).
  auto copy0 = [](std::vector<DeviceBuffer>& v, const std::vector<uint8_t>& host, size_t bytes) {
    v.emplace_back(bytes);
    if (v.size() == 1)
      v[0].upload(host.data(), bytes);
    else if (bytes)
      check_cuda(cudaMemcpy(v.back().p, v[0].p, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy(input copy)");
  };
  for (int set = 0; set < m.sets; ++set) {
    GemmArgs g = hp.g;
    copy0(d_s, sp.value_bytes(), s_bytes);
    g.sparse.row_ptr = static_cast<const int32_t*>(d_rp.p);
    g.sparse.col_idx = static_cast<const int32_t*>(d_ci.p);
    g.sparse.values = d_s[size_t(set)].p;
    g.sparse.memory = Memory::device;
    if (fp8) g.sparse.scales = static_cast<const float*>(d_block_scales.p);
    if (!sdd) {
      d_c.emplace_back(c_bytes);
      check_cuda(cudaMemset(d_c.back().p, 0xFF, c_bytes), "cudaMemset(C)");
      g.c = {d_c.back().p, w.m, w.n, w.n, Layout::row_major, w.out, Memory::device};
    }
    if (w.kind != OpKind::dsd) {
      copy0(d_a, hp.a.bytes, a_bytes);
      g.a.data = d_a.back().p;
      g.a.memory = Memory::device;
      if (fp8) g.a.scales = static_cast<const float*>(d_token_scales.p);
    }
    if (w.kind != OpKind::dds) {
      copy0(d_b, hp.b.bytes, b_bytes);
      g.b.data = d_b.back().p;
      g.b.memory = Memory::device;
      if (fp8) g.b.scales = static_cast<const float*>(d_token_scales.p);
    }
    args.push_back(g);
  }
  validate(args[0], true);
  r.eff_flops = args[0].effective_flops();
  m.dense_flops = 2.0 * double(w.m) * double(w.n) * double(w.k);
  Options o;
  o.backend = Backend::cuda;
  DeviceBuffer& out0 = sdd ? d_s[0] : d_c[0];

  // Reference: fp64 oracle when it is quick, else cuBLAS on the densified sparse operand (sdd: the
  // whole dense product) with fp32 output.
  std::vector<float> ref;
  const size_t outputs = c_bytes / es;
  const int64_t ref_tokens = reference_tokens(w, r.eff_flops);
  if (r.eff_flops <= 2e9 || fp8) {
    steps.at(prefix + "computing the fp64 oracle");
    GemmArgs h = hp.g;
    HostMatrix hc(w.m, w.n, w.out, Layout::row_major, 0);
    if (!sdd) h.c = hc.view;
    if (ref_tokens > 0 && w.kind == OpKind::dsd) h.b.cols = h.c.cols = ref_tokens;  // C's first columns
    if (ref_tokens > 0 && w.kind == OpKind::dds) h.a.rows = h.c.rows = ref_tokens;  // C's first rows
    std::vector<double> d = oracle(h);
    ref.assign(d.begin(), d.end());
    m.reference = ref_tokens == 0 ? "fp64 oracle"
                                  : "fp64 oracle on the first " + std::to_string(ref_tokens) + " tokens (C's first " +
                                        (w.kind == OpKind::dsd ? "columns)" : "rows)");
  } else if (const Variant* v = find_variant("cublas_dense")) {
    steps.at(prefix + "computing the cuBLAS fp32 reference");
    try {
      DeviceBuffer d_ref(outputs * 4);
      GemmArgs g = args[0];
      if (sdd) {
        g.sparse.values = d_ref.p;
        g.sparse.dtype = DType::f32;
      } else {
        g.c.data = d_ref.p;
        g.c.dtype = DType::f32;
      }
      std::string why = v->why_not(g);
      if (!why.empty()) throw Error(Status::unsupported, why);
      auto st = v->prepare(g, o);
      v->run(g, o, st.get());
      check_cuda(cudaDeviceSynchronize(), "cuBLAS reference");
      ref.resize(outputs);
      d_ref.download(ref.data(), d_ref.bytes);
      m.reference = "cuBLAS dense, fp32 output";
    } catch (const Error& e) {
      ref.clear();
      m.reference = std::string("none (cuBLAS reference failed: ") + e.what() + ")";
    }
  }

  std::vector<uint8_t> got(c_bytes);
  measure_rows(
      args, true, o, s.only, steps, prefix,
      [&](const std::function<void(int)>& run) { return timing::time_gpu(run, s.warmup, s.reps, m.sets, w.calls); },
      [&](BenchRow& row, const std::function<void()>& run) {  // on a poisoned output of set 0
        check_cuda(cudaMemset(out0.p, 0xFF, c_bytes), "cudaMemset(poison the output)");
        run();
        check_cuda(cudaDeviceSynchronize(), "checked run");
        out0.download(got.data(), c_bytes);
        check_output(sample_of(got, w, ref_tokens, es), w.out, ref, row);
      },
      r);
  if (fp8 && wanted(s.only, kLtFp8)) {  // the dense fp8 peer, on its own copies of the inputs
    r.rows.push_back(measure_row(kLtFp8, true, "", true, [&](BenchRow& row) {
      steps.at(prefix + "densifying for " + kLtFp8);
      const DenseFp8Inputs in = dense_fp8_inputs(w, hp);
      const size_t c_dense = size_t(w.m * w.n) * es, bytes = in.lhs.size() + in.rhs.size() + c_dense;
      const int sets = int(std::min<size_t>(16, std::max<size_t>(1, (2 * info.l2_bytes + bytes - 1) / bytes)));
      check_device_bytes("the dense fp8 peer", double(sets) * double(bytes));
      std::vector<DeviceBuffer> dl, dr, dc;
      for (int set = 0; set < sets; ++set) {
        copy0(dl, in.lhs, in.lhs.size());
        copy0(dr, in.rhs, in.rhs.size());
        dc.emplace_back(c_dense);
      }
      // One allocation per scale: with both scales in one 8-byte buffer cublasLtMatmul refused the
      // second (status 15 on an H200: cuBLASLt wants more than 4-byte aligned scale pointers).
      DeviceBuffer d_lhs_scale(sizeof(float)), d_rhs_scale(sizeof(float));
      d_lhs_scale.upload(&in.lhs_scale, sizeof(float));
      d_rhs_scale.upload(&in.rhs_scale, sizeof(float));
      const float* sl = static_cast<const float*>(d_lhs_scale.p);
      const float* sr = static_cast<const float*>(d_rhs_scale.p);
      steps.at(prefix + "timing " + kLtFp8);
      const timing::DenseFp8Gemm gemm(w.m, w.n, w.k, w.out);
      auto run_on = [&](int set) {
        gemm.run(dl[size_t(set)].p, dr[size_t(set)].p, dc[size_t(set)].p, sl, sr, o.stream);
      };
      row.times_ms = timing::time_gpu(run_on, s.warmup, s.reps, sets, w.calls);
      check_cuda(cudaMemset(dc[0].p, 0xFF, c_dense), "cudaMemset(poison the output)");
      run_on(0);
      check_cuda(cudaDeviceSynchronize(), "checked run");
      dc[0].download(got.data(), c_dense);
      check_output(sample_of(got, w, ref_tokens, es), w.out, ref, row, fp8_peer_tolerance(w.out));
    }));
    ++steps.done;
    steps.progress.clear();
  }
  finish(w, m, true, r);
  return r;
}

}  // namespace

const std::vector<SpecWorkload>& spec_workloads() {
  static const std::vector<SpecWorkload> table = {{8192, 128, 128, 0.125}, {8192, 64, 64, 0.125},
                                                  {8192, 32, 32, 0.125},   {4096, 64, 64, 0.125},
                                                  {8192, 128, 128, 0.25},  {8192, 128, 32, 0.0625}};
  return table;
}

namespace {

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
  std::vector<Workload> table;
  // Decode twice: each call timed alone, and per call in a stream of 8 (a decode step runs its
  // layers back to back, and a call may start while the one before it ends).
  for (int calls : {1, 8})
    for (int64_t n : {1, 16, 128}) {
      table.push_back(w(("decode N=" + std::to_string(n)).c_str(), 14336, n, 4096, 64, 0.25, fixed));
      table.back().calls = calls;
    }
  table.insert(table.end(), {w("unaligned N=999", 8256, 999, 8192, 64, 0.125, fixed),
                             w("aligned N=1000", 8256, 1000, 8192, 64, 0.125, fixed),
                             w("8 experts (block-diagonal)", 8192, 8192, 8192, 128, 0.125, PatternKind::block_diagonal),
                             w("banded", 8192, 8192, 8192, 64, 0.125, PatternKind::banded),
                             w("lower-triangular", 8192, 8192, 8192, 64, 0.5, PatternKind::causal),
                             w("power-law rows", 8192, 8192, 8192, 128, 0.125, PatternKind::power_law),
                             w("uniform rows", 8192, 8192, 8192, 128, 0.125, fixed)});
  return table;
}

// The GPU table of a product other than dsd: a block-sparse layer W (14336 x 4096, 64x64 blocks,
// 25%) with 4096 tokens, the forward y = x*W^T (dds) or the weight gradient dW = dy^T*x on W's
// blocks (sdd), and 8192^3 128x128 12.5%.
std::vector<Workload> layer_workloads(const Workload& custom) {
  struct Shape {
    int64_t m, n, k;
    int b;
    double density;
  };
  const bool dds = custom.kind == OpKind::dds;
  std::vector<Workload> table;
  for (const Shape& d : {dds ? Shape{4096, 14336, 4096, 64, 0.25} : Shape{14336, 4096, 4096, 64, 0.25},
                         Shape{8192, 8192, 8192, 128, 0.125}}) {
    Workload w = custom;
    w.m = d.m;
    w.n = d.n;
    w.k = d.k;
    w.bm = w.bk = d.b;
    w.density = d.density;
    w.pattern = PatternKind::fixed_k;
    table.push_back(w);
  }
  return table;
}

// The GPU table of --dtype e4m3: DSD 8192^3 128x128 12.5%, and a block-sparse layer W (14336 x
// 4096, 64x64 blocks, 25%) in its forward y = x*W^T (dds --trans) with 4096 tokens and with 16
// (decode). With --op, that op's rows only. The layer rows are always x*W^T (hopper_fp8 reads the
// sparse operand as stored, K-major: a dds without --trans is refused there); the dsd row takes
// --trans and --b-layout, the layer rows --a-layout.
std::vector<Workload> fp8_workloads(const Workload& custom, bool op_given) {
  auto w = [&](const char* name, OpKind kind, int64_t m, int64_t n, int64_t k, int b, double density) {
    Workload x = custom;
    x.name = name;
    x.kind = kind;
    x.m = m, x.n = n, x.k = k;
    x.bm = x.bk = b;
    x.density = density;
    x.pattern = PatternKind::fixed_k;
    x.op = kind == OpKind::dds ? Op::trans : custom.kind == OpKind::dsd ? custom.op : Op::none;
    if (kind != custom.kind) x.la = x.lb = Layout::row_major;  // the other op's layout flags do not apply
    return x;
  };
  std::vector<Workload> table;
  if (!op_given || custom.kind == OpKind::dsd) table.push_back(w("", OpKind::dsd, 8192, 8192, 8192, 128, 0.125));
  if (!op_given || custom.kind == OpKind::dds) {
    table.push_back(w("layer, 4096 tokens", OpKind::dds, 4096, 14336, 4096, 64, 0.25));
    table.push_back(w("decode, 16 tokens", OpKind::dds, 16, 14336, 4096, 64, 0.25));
  }
  return table;
}

// `--op OP` (or --op=OP) among the flags: the attention and gate benches have flags of their own.
bool op_requested(const std::vector<std::string>& argv, const std::string& op) {
  for (size_t i = 0; i < argv.size(); ++i)
    if (argv[i] == "--op=" + op || (argv[i] == "--op" && i + 1 < argv.size() && argv[i + 1] == op)) return true;
  return false;
}
// `--op attention` or `--suite attention` selects the attention bench.
bool attention_requested(const std::vector<std::string>& argv) {
  for (size_t i = 0; i < argv.size(); ++i)
    if (argv[i] == "--suite=attention" || (argv[i] == "--suite" && i + 1 < argv.size() && argv[i + 1] == "attention"))
      return true;
  return op_requested(argv, "attention");
}

}  // namespace

int bench_main(const std::vector<std::string>& argv) {
  if (attention_requested(argv)) return bench_attention_main(argv);
  if (op_requested(argv, "gate")) return bench_gate_main(argv);
  if (op_requested(argv, "decode")) return bench_decode_main(argv);
  Args args(argv, kSpecs);
  if (args.help()) {
    print_help("sparsek bench [flags]",
               "Times a block-sparse product for every variant that supports it, beside cuSPARSE (BSR and\n"
               "Blocked-ELL SpMM, BSR SDDMM) and cuBLAS on the densified sparse operand, on the same inputs.\n"
               "--op dsd (default): C = op(A)*B, A block-sparse; --op dds: C = A*op(B), B block-sparse (the\n"
               "layer forward y = x*W^T is --op dds --trans); --op sdd: C = A*B on C's blocks only (the weight\n"
               "gradient dW = dy^T*x is --op sdd --a-layout col). With a GPU and no shape flags it runs the\n"
               "op's workload table and reports effective TFLOPS: dsd 8192^3 at 128x128, 64x64, 32x32 and\n"
               "12.5%; 4096^3 64x64 12.5%; 8192^3 128x128 25%; 8192^3 128x32 6.25%. dds: M=4096 N=14336\n"
               "K=4096 64x64 25%, 8192^3 128x128 12.5%. sdd: M=14336 N=4096 K=4096 64x64 25%, 8192^3\n"
               "128x128 12.5% (fixed_k, f16). Without a GPU it runs the CPU backend on 1024^3, 64x64, 12.5%,\n"
               "says so, and reports effective GFLOPS beside openblas_dense_sgemm (OpenBLAS's dense product\n"
               "on the sparse operand densified beforehand, all its threads; DSD and DDS).\n"
               "--suite serving runs what serving and training users run instead (GPU only, DSD): decode\n"
               "with W 14336x4096 at 64x64, 25% and N = 1, 16, 128 (with\n"
               "the rate at which A's values are read); M 8256, K 8192 at N = 999 and 1000; 8 experts of\n"
               "1024x1024 (block-diagonal, 128x128); banded and lower-triangular 64x64; power-law and\n"
               "uniform rows at 128x128, 12.5%. --dtype e4m3 (fp8: the sparse operand with one fp32 scale per\n"
               "stored block, the dense input with one per token, C in --out, bf16 by default) runs hopper_fp8\n"
               "beside cuBLASLt's dense fp8 GEMM (cublaslt_fp8_dense: the same values densified, one scale per\n"
               "operand), on a GPU without shape flags: dsd 8192^3 128x128 12.5% (B row-major: the transpose\n"
               "to K-major is timed; --b-layout col reads B in place), and the layer y = x*W^T (dds --trans)\n"
               "with W 14336x4096 64x64 25% at 4096 tokens and at 16 (decode); --op keeps one op's rows. Its\n"
               "error column is against the fp64 oracle (on the first 64 tokens of a large problem). On the\n"
               "CPU backend --dtype e4m3 runs the CPU rows against the fp64 oracle. --op decode times paged\n"
               "decode attention against its read floor (`sparsek bench --op decode --help`). Exit code 1\n"
               "when a variant failed or produced a wrong\n"
               "result, or when --compare finds a row more than --threshold percent slower than its\n"
               "baseline (matched by workload and variant; sparsek's own variants, not the peers).",
               kSpecs);
    return 0;
  }
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
  const std::string op_name = args.str("--op", "dsd");
  if (op_name == "dsd") custom.kind = OpKind::dsd;
  else if (op_name == "dds") custom.kind = OpKind::dds;
  else if (op_name == "sdd") custom.kind = OpKind::sdd;
  else args.bad("--op", "must be one of dsd, dds, sdd, attention, gate or decode");
  if (args.has("--trans")) {
    if (custom.kind == OpKind::sdd) args.bad("--trans", "sdd has no op (its sparse operand is the output)");
    custom.op = Op::trans;
  }
  // A dense operand's layout; the flag of the sparse operand (A in dsd, B in dds) is a mistake.
  auto layout = [&](const char* flag, OpKind sparse_in) {
    if (args.has(flag) && custom.kind == sparse_in)
      args.bad(flag, std::string("that operand is the sparse one in ") + to_string(sparse_in));
    const std::string v = args.str(flag, "row");
    if (v == "row") return Layout::row_major;
    if (v != "col") args.bad(flag, "must be row or col");
    return Layout::col_major;
  };
  custom.la = layout("--a-layout", OpKind::dsd);
  custom.lb = layout("--b-layout", OpKind::dds);
  const bool dtype_given = args.has("--dtype");
  DType dtype = DType::f16;
  if (args.str("--dtype", "") == "e4m3") dtype = DType::e4m3;
  else if (dtype_given) {
    const std::string v = args.str("--dtype", "");
    if (v != "f16" && v != "bf16" && v != "f32") args.bad("--dtype", "must be one of f16, bf16, f32, e4m3");
    dtype = args.dtype("--dtype", DType::f16);
  }
  const bool fp8 = dtype == DType::e4m3;
  if (fp8 && custom.kind == OpKind::sdd) args.bad("--dtype", "e4m3 runs dsd and dds; sdd has no e4m3 form");
  if (args.has("--out") && !fp8) args.bad("--out", "only with --dtype e4m3 (C has the inputs' dtype otherwise)");
  const DType out_dtype = args.dtype("--out", DType::bf16);
  Settings s;
  s.seed = args.seed("--seed", 1);
  s.threads = int(args.integer("--threads", 0, 1, 4096));
  s.only = args.list("--variants");
  for (const std::string& name : s.only)
    if (!find_variant(name) && name != kDenseGemm && name != kEllSpmm && name != kBatchedGemm && name != kLtFp8) {
      std::string known;
      for (const Variant& v : variants()) known += std::string(v.name) + ", ";
      args.bad("--variants", "unknown variant '" + name + "' (known: " + known + kDenseGemm + ", " + kEllSpmm + ", " +
                                 kBatchedGemm + ", " + kLtFp8 + ")");
    } else if (fp8 != runs_e4m3(name) && name != "cpu") {
      args.bad("--variants", fp8 ? "'" + name + "' does not run e4m3 (with --dtype e4m3: cpu, hopper_fp8, " + kLtFp8 + ")"
                                 : "'" + name + "' runs --dtype e4m3 only");
    }
  const std::string suite = args.str("--suite", "spec");
  if (suite != "spec" && suite != "serving") args.bad("--suite", "must be spec, serving or attention");
  if (fp8 && suite == "serving")
    args.bad("--dtype", "e4m3 is not in --suite serving (--dtype e4m3 alone runs its own table, decode included)");
  if (suite == "serving" && shaped)
    args.bad("--suite", "choose the suite or shape flags (--m, --n, --k, --block, --density, --pattern), not both");
  custom.calls = int(args.integer("--calls", 1, 1, 1000));
  if (suite == "serving" && args.has("--calls")) args.bad("--calls", "not with --suite serving (it sets its own)");
  const std::string baseline = args.str("--compare", ""), from = args.str("--from", "");
  if (args.has("--compare") && baseline.empty()) args.bad("--compare", "needs a baseline file or directory");
  if (args.has("--from") && !args.has("--compare")) args.bad("--from", "only goes with --compare BASELINE");
  if (args.has("--threshold") && !args.has("--compare")) args.bad("--threshold", "only goes with --compare BASELINE");
  const double threshold = args.real("--threshold", 5.0, 0.0, 1000.0);
  JsonOutput json(args);
  // The performance gate: these results (bench's JSON) against the baseline; its report joins them.
  auto gate = [&](Json& results) {
    Json report;
    const int rc = bench_gate(results, from.empty() ? std::string("these results") : "--from " + printable(from),
                              baseline, threshold, &report);
    results["gate"] = report;
    return rc;
  };

  if (!from.empty()) {  // the gate on recorded results: nothing runs
    Json results = read_json_file(from, "--from");
    const int rc = gate(results);
    json.write(results);
    json.say_written();
    return rc;
  }

  const bool gpu = use_gpu(backend);
  const DeviceInfo& info = device_info();
  if (suite == "serving" && (custom.kind != OpKind::dsd || custom.op == Op::trans || custom.lb == Layout::col_major))
    args.bad("--suite", "serving runs DSD with op none and row-major B; not with --op " + op_name +
                            (custom.op == Op::trans ? " --trans" : "") +
                            (custom.lb == Layout::col_major ? " --b-layout col" : ""));
  if (suite == "serving" && !gpu)
    args.bad("--suite", "these workloads are sized for a GPU and none is in use (" +
                            (backend == Backend::cpu ? std::string("--backend cpu") : info.why_not) + ")");
  // --variants names rows of one backend: the GPU's (and the peers' core rows) or the CPU's.
  for (const std::string& name : s.only) {
    const Variant* v = find_variant(name);
    const bool gpu_row = name != kCpuDense && (!v || v->backend == Backend::cuda);
    if (gpu_row && !gpu) {
      if (backend == Backend::cpu) args.bad("--variants", "'" + name + "' is a GPU row, but --backend cpu");
      throw no_gpu_error("--variants " + name + ": a GPU row", "--variants " + name + ": a GPU row, but no GPU found: ");
    }
    if (!gpu_row && gpu)
      args.bad("--variants", "'" + name + "' runs on the CPU backend; with a GPU add --backend cpu");
  }
  s.reps = int(args.integer("--reps", gpu ? 20 : 5, 1, 100000));
  s.warmup = int(args.integer("--warmup", gpu ? 5 : 1, 0, 100000));

  auto fill_dims = [&](Workload w, int64_t dflt) {
    if (w.m < 0) w.m = dflt;
    if (w.n < 0) w.n = dflt;
    if (w.k < 0) w.k = dflt;
    const auto [rows, cols] = sparse_dims(w);
    if (rows % w.bm || cols % w.bk)
      args.bad("--block", "the sparse operand of this " + op_name + " is " + std::to_string(rows) + "x" +
                              std::to_string(cols) + ", not whole " + block_str(w.bm, w.bk) + " blocks");
    return w;
  };
  std::vector<Workload> table;
  if (!gpu) {
    table.push_back(fill_dims(custom, 1024));
    dtype = dtype_given ? dtype : DType::f32;
  } else if (shaped) {
    table.push_back(fill_dims(custom, 8192));
  } else if (fp8) {
    table = fp8_workloads(custom, args.has("--op"));
  } else if (suite == "serving") {
    table = serving_workloads(dtype);
  } else if (custom.kind == OpKind::dsd) {
    for (const SpecWorkload& d : spec_workloads()) {
      Workload w = custom;
      w.m = w.n = w.k = d.size;
      w.bm = d.bm;
      w.bk = d.bk;
      w.density = d.density;
      w.pattern = PatternKind::fixed_k;
      table.push_back(w);
    }
  } else {
    table = layer_workloads(custom);
  }
  std::vector<std::string> labels;
  for (Workload& w : table) {
    w.dtype = dtype;
    w.out = fp8 ? out_dtype : dtype;
    labels.push_back(label(w));
  }

  Progress progress(stdout_is_tty());
  Steps steps{progress, 0,
              std::max<size_t>(1, (candidates(gpu, s.only, fp8).size() + fp8 + !gpu) * table.size())};  // + the CPU's dense peer
  Table t;
  if (gpu) {
    std::printf("sparsek %s bench on %s (compute capability %d.%d, %d SMs), CUDA runtime %d, driver %d\n", version(),
                info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count, info.runtime_version,
                info.driver_version);
    std::printf("median of %d runs after %d warm-up runs, CUDA events (%s); alpha = 1, beta = 0\n", s.reps, s.warmup,
                timing::stream_held() ? "GPU time: the stream held until each batch is enqueued"
                                      : "SPARSEK_BENCH_GATE=off: runs timed as the host issues them");
    t.columns = {median_column(),
                 rate_column(true),
                 fixed_column(fp8 ? "x dense fp8" : "x cuBLAS", "ratio_vs_cublas_dense", 2),
                 fixed_column("x best peer", "ratio_vs_best_peer", 2),
                 fixed_column("% ideal", "fraction_of_ideal", 1, 100),
                 sci_column("rel err", "rel_error")};
  } else {
    const int threads = cpu_backend_threads(s.threads);
    if (backend == Backend::cpu)
      std::printf("running the CPU backend (--backend cpu), %d thread(s)\n", threads);
    else
      std::printf("no GPU found: %s; running the CPU backend, %d thread(s)\n", info.why_not.c_str(), threads);
    std::printf("block products through %s\n", cpu_blas_description().c_str());
    t.columns = {median_column(), rate_column(false)};
    if (!fp8) t.columns.push_back(fixed_column("x dense BLAS", "ratio_vs_best_peer", 2));  // no e4m3 dense peer here
    t.columns.push_back(sci_column("rel err", "rel_error"));
  }
  BenchRun run;
  run.gpu = gpu;
  run.threads = cpu_backend_threads(s.threads);
  run.reps = s.reps;
  run.warmup = s.warmup;
  run.seed = s.seed;
  run.units = std::string("effective_tflops: TFLOPS (10^12 FLOP/s) on stored blocks") +
              (gpu ? "" : " (the table shows GFLOPS)");
  return run_workloads(
      labels,
      [&](size_t i, const std::string& prefix) {
        return gpu ? run_gpu(table[i], s, steps, prefix) : run_cpu(table[i], s, steps);
      },
      t, argv, run, json,
      baseline.empty() ? std::function<int(Json&)>() : [&](Json& doc) {
        std::printf("\n");
        return gate(doc);
      });
}

}  // namespace sparsek::cli
