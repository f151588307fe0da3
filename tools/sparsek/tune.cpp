// `sparsek tune`: tunes one DSD workload offline (the same workload flags as bench) and stores the
// winner in the tuning cache; `--compare` then re-times the candidates in a second pass and
// compares the pick with the best (`--spec-workloads`: over the GPU workload table); `--plan-time`
// measures how long plan() takes on the workload; `--run-overhead` what run(plan) costs over the
// bare variant launch.
#include "core/cuda_host.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/tune.hpp"
#include "tools_internal.hpp"

namespace sparsek::cli {

namespace {

const std::vector<FlagSpec> kSpecs = {
    {"--m", "M", "rows of C (default 8192 on a GPU, 1024 on the CPU; with --run-overhead 256 on a GPU, 64 on the CPU)"},
    {"--n", "N", "columns of B and C (default: M)"},
    {"--k", "K", "columns of A = rows of B (default: M)"},
    {"--block", "BMxBK", "block shape, each of 16, 32, 64, 128 (default 64x64)"},
    {"--density", "D", "fraction of stored blocks, in (0, 1] (default 0.125)"},
    {"--pattern", "NAME", "fixed_k | bernoulli | power_law | banded | block_diagonal | causal (default fixed_k)"},
    {"--dtype", "T", "f16 | bf16 | f32 (default f16 on a GPU, f32 on the CPU); C has the same dtype"},
    kBackendFlag,
    {"--seed", "S", "random seed of the pattern and the values (default 1)"},
    {"--warmup", "W", "untimed runs per candidate (default 2)"},
    {"--reps", "R", "most timed runs per candidate; the median counts (default 100, at least 5)"},
    {"--budget", "SEC", "seconds of timed runs per candidate (default 0.3)"},
    {"--no-store", nullptr, "tune but do not write the cache"},
    kLockWaitFlag,
    kNoWaitFlag,
    {"--plan-time", nullptr, "measure plan() on this workload (median of --reps calls) instead of tuning"},
    {"--run-overhead", nullptr, "measure the host time of run(plan) against the bare variant launch and gemm()"},
    {"--calls", "N", "timed calls of each kind for --run-overhead (default 2000)"},
    {"--compare", nullptr, "after tuning, re-time the candidates and compare the tuner's pick with the best"},
    {"--spec-workloads", nullptr, "--compare over bench's workload table (its default list on a GPU; GPU only)"},
    kThreadsFlag,
    {"--json", "FILE", "also write the results as JSON (- for stdout)"},
};

struct Problem {
  Pattern pattern;
  DeviceBuffer drp, dci;                // device pattern (cuda)
  std::vector<void*> host_allocs;       // untouched host buffers for --plan-time
  std::vector<DeviceBuffer> dev_allocs;
  GemmArgs g;
  ~Problem() {
    for (void* p : host_allocs) std::free(p);
  }
};

// DSD of the workload: pattern generated and placed on the backend's memory; value and dense
// pointers null (tune() needs none) unless `buffers` (plan() checks them, never reads them).
std::unique_ptr<Problem> make_problem(int64_t m, int64_t n, int64_t k, int bm, int bk, double density,
                                      PatternKind kind, DType dtype, bool gpu, uint64_t seed, bool buffers) {
  auto p = std::make_unique<Problem>();
  p->pattern = make_pattern(kind, m / bm, k / bk, density, seed);
  const Memory mem = gpu ? Memory::device : Memory::host;
  GemmArgs& g = p->g;
  g.kind = OpKind::dsd;
  g.sparse.rows = m;
  g.sparse.cols = k;
  g.sparse.bm = bm;
  g.sparse.bk = bk;
  g.sparse.nnzb = p->pattern.nnzb();
  g.sparse.dtype = dtype;
  g.sparse.memory = mem;
  g.b = {nullptr, k, n, n, Layout::row_major, dtype, mem};
  g.c = {nullptr, m, n, n, Layout::row_major, dtype, mem};
  if (gpu) {
    p->drp = DeviceBuffer(p->pattern.row_ptr.size() * 4);
    p->drp.upload(p->pattern.row_ptr.data(), p->pattern.row_ptr.size() * 4);
    p->dci = DeviceBuffer(std::max<size_t>(p->pattern.col_idx.size(), 1) * 4);
    if (!p->pattern.col_idx.empty()) p->dci.upload(p->pattern.col_idx.data(), p->pattern.col_idx.size() * 4);
    g.sparse.row_ptr = static_cast<const int32_t*>(p->drp.p);
    g.sparse.col_idx = static_cast<const int32_t*>(p->dci.p);
  } else {
    g.sparse.row_ptr = p->pattern.row_ptr.data();
    g.sparse.col_idx = p->pattern.col_idx.data();
  }
  if (buffers) {
    auto alloc = [&](size_t bytes) -> void* {
      if (gpu) {
        p->dev_allocs.emplace_back(bytes);
        return p->dev_allocs.back().p;
      }
      void* h = std::malloc(std::max<size_t>(bytes, 64));  // never touched: no pages are committed
      if (!h) throw Error(Status::internal, "out of host memory");
      p->host_allocs.push_back(h);
      return h;
    };
    const size_t es = dtype_size(dtype);
    g.sparse.values = alloc(size_t(g.sparse.nnzb) * size_t(bm * bk) * es);
    g.b.data = alloc(size_t(k * n) * es);
    g.c.data = alloc(size_t(m * n) * es);
  }
  return p;
}

struct Workload {
  int64_t m, n, k;
  int bm, bk;
  double density;
  PatternKind kind;
  DType dtype;
};

std::string describe(const Workload& w) {
  return "dsd " + std::string(to_string(w.dtype)) + " " + std::to_string(w.m) + "x" + std::to_string(w.n) + "x" +
         std::to_string(w.k) + ", " + block_str(w.bm, w.bk) + " blocks, " + to_string(w.kind) + " " +
         fmt(100.0 * w.density, 2) + "%";
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

// Effective rate in the unit of the machine: TFLOPS on a GPU, GFLOPS on the CPU.
double rate(double flops, double ms, bool gpu) { return ms > 0 ? flops / (ms * 1e-3) / (gpu ? 1e12 : 1e9) : std::nan(""); }
const char* rate_unit(bool gpu) { return gpu ? "eff TFLOPS" : "eff GFLOPS"; }

Json workload_json(const Workload& w) {
  return {{"m", w.m}, {"n", w.n}, {"k", w.k}, {"bm", w.bm}, {"bk", w.bk}, {"density", w.density},
          {"pattern", to_string(w.kind)}, {"dtype", to_string(w.dtype)}};
}

// Tunes w, prints the candidate table and the winner. *ok = false when storing was asked for and
// failed. *out gets the same as JSON.
TuneReport tune_and_print(const Workload& w, bool gpu, const Options& opt, TuneOptions to, uint64_t seed,
                          const std::string& where, double lock_wait_s, bool* ok, Json* out) {
  auto prob = make_problem(w.m, w.n, w.k, w.bm, w.bk, w.density, w.kind, w.dtype, gpu, seed, false);
  std::printf("sparsek %s tune: %s (nnzb=%lld) on %s\n", version(), describe(w).c_str(),
              static_cast<long long>(prob->g.sparse.nnzb), where.c_str());
  Progress progress(stdout_is_tty());
  to.progress = [&](size_t done, size_t total, const std::string& name) {
    progress.step(done, total, name.empty() ? "" : "timing " + name);
  };
  TuneOptions run_opts = to;
  run_opts.store = false;  // stored here, with the lock wait of --lock-wait / --no-wait
  TuneReport r = tune(prob->g, opt, run_opts);
  progress.clear();
  if (to.store) {
    const std::string path = tune_cache_path();
    if (path.empty()) {
      r.store_error = "no cache path: set SPARSEK_CACHE or HOME";
    } else {
      try {
        TuneCache cache(path);
        cache.set_lock_wait(lock_wait_s);
        cache.store(r.entry);  // another process's lock held past the wait: Error naming it
        r.stored = true;
      } catch (const Error& e) {
        r.store_error = e.what();
      }
    }
  }

  const double flops = prob->g.effective_flops();
  std::printf("reference: %s; each candidate's median of timed runs after %d warm-up run(s)\n\n",
              r.reference.c_str(), std::max(1, to.warmup));
  std::vector<std::vector<std::string>> rows;
  Json cj = Json::array();
  for (const TuneCandidate& c : r.candidates) {
    std::string mark = c.variant == r.entry.variant ? " <- winner" : "";
    if (c.variant == r.entry.default_variant) mark += " (default)";
    rows.push_back({c.variant, c.correct ? fmt(c.median_ms, 4) : "-",
                    c.correct ? fmt(rate(flops, c.median_ms, gpu), 3) : "-",
                    c.correct ? "ok (err " + fmt_sci(c.error) + ")" : (c.ran ? "WRONG" : "failed"),
                    mark.empty() ? (c.correct ? "" : c.note.substr(0, 100)) : mark});
    cj.push_back({{"variant", c.variant}, {"ran", c.ran}, {"correct", c.correct},
                  {"median_ms", c.correct ? num(c.median_ms) : Json(nullptr)},
                  {"effective_tflops", c.correct ? num(rate(flops, c.median_ms, true)) : Json(nullptr)},
                  {"error", num(c.error)}, {"note", c.note}});
  }
  print_table({"variant", "median ms", rate_unit(gpu), "check", ""}, rows);
  *out = {{"workload", workload_json(w)},  {"nnzb", prob->g.sparse.nnzb},
          {"reference", r.reference},     {"candidates", cj},
          {"winner", r.entry.variant},    {"winner_ms", num(r.entry.time_ms)},
          {"default", r.entry.default_variant}, {"default_ms", num(r.entry.default_ms)},
          {"speedup_over_default", num(r.speedup)}, {"stored", r.stored}, {"store_error", r.store_error}};

  const TuneEntry& e = r.entry;
  std::printf("\n");
  if (e.variant == e.default_variant) {
    const TuneCandidate* other = nullptr;
    for (const TuneCandidate& c : r.candidates)
      if (c.correct && c.variant != e.variant && (!other || c.median_ms < other->median_ms)) other = &c;
    if (!other)
      std::printf("winner: %s, the default (%s), %.4f ms\n", e.variant.c_str(),
                  r.candidates.size() == 1 ? "the only candidate" : "no other candidate ran correctly", e.time_ms);
    else if (other->median_ms < e.time_ms)
      std::printf("winner: %s, the default, kept: %s was only %.1f%% faster (a winner needs > %.0f%%)\n",
                  e.variant.c_str(), other->variant.c_str(), 100.0 * (e.time_ms / other->median_ms - 1.0),
                  100.0 * to.margin);
    else
      std::printf("winner: %s, the default, %.2fx faster than the next (%s)\n", e.variant.c_str(),
                  other->median_ms / e.time_ms, other->variant.c_str());
  } else if (e.default_ms > 0) {
    std::printf("winner: %s, %.2fx faster than the default %s (%.4f ms vs %.4f ms)\n", e.variant.c_str(), r.speedup,
                e.default_variant.c_str(), e.time_ms, e.default_ms);
  } else {
    std::printf("winner: %s (%.4f ms); the default %s did not run correctly\n", e.variant.c_str(), e.time_ms,
                e.default_variant.empty() ? "(none)" : e.default_variant.c_str());
  }
  *ok = true;
  if (!to.store) {
    std::printf("not stored (--no-store)\n");
  } else if (!r.stored) {
    std::printf("NOT stored: %s\n", printable(r.store_error).c_str());
    *ok = false;
  } else {
    std::printf("stored in %s\n", tune_cache_path().c_str());
  }
  return r;
}

// The tuner's pick against the best candidate. The tuner's own pass cannot judge itself (its
// pick is within its 2% margin of its own best by construction), so every candidate is timed
// again in a second, independent tuning pass (same method, not stored) and the pick's time there
// is compared with the fastest correct candidate's. Returns the grep-able line ("" + *pct = NaN
// when the pick did not run correctly in the second pass).
std::string compare_pick(const Workload& w, bool gpu, const Options& opt, TuneOptions to, uint64_t seed,
                         const TuneReport& first, double* pct, Json* out) {
  auto prob = make_problem(w.m, w.n, w.k, w.bm, w.bk, w.density, w.kind, w.dtype, gpu, seed, false);
  to.store = false;
  to.progress = nullptr;
  Progress progress(stdout_is_tty());
  progress.update("re-timing the candidates ...");
  TuneReport again = tune(prob->g, opt, to);
  progress.clear();
  const TuneCandidate *pick = nullptr, *best = nullptr;
  for (const TuneCandidate& c : again.candidates) {
    if (!c.correct) continue;
    if (c.variant == first.entry.variant) pick = &c;
    if (!best || c.median_ms < best->median_ms) best = &c;
  }
  *pct = std::nan("");
  if (!pick || !best) {
    std::printf("compare: the pick %s did not run correctly in the second timing pass\n",
                first.entry.variant.c_str());
    return "";
  }
  *pct = 100.0 * (pick->median_ms / best->median_ms - 1.0);
  *out = {{"pick", pick->variant}, {"pick_ms", num(pick->median_ms)}, {"best", best->variant},
          {"best_ms", num(best->median_ms)}, {"pick_within_pct_of_best", num(*pct)}};
  char line[512];
  std::snprintf(line, sizeof line, "tuner pick: %s %.4f ms; best: %s %.4f ms; pick within %.1f%% of best",
                pick->variant.c_str(), pick->median_ms, best->variant.c_str(), best->median_ms, *pct);
  std::printf("second timing pass (not stored), %zu candidate(s):", again.candidates.size());
  for (const TuneCandidate& c : again.candidates)
    std::printf(" %s %s;", c.variant.c_str(), c.correct ? (fmt(c.median_ms, 4) + " ms").c_str() : "-");
  std::printf("\n%s\n", line);
  return line;
}

// Host wall time per call of run(plan), of the bare variant launch run() ends in (the plan's
// variant, its state prepared as plan() prepares it, run under the options run() hands it, no
// checks) and of the one-shot gemm(), on the workload's real buffers.
// Calls go in batches, interleaved by kind; on a GPU the stream is synchronized between batches
// (untimed), so a full launch queue never makes the host wait for kernels.
int run_overhead(const Workload& w, bool gpu, const Options& base, uint64_t seed, int calls,
                 const std::string& where, Json* out) {
  auto prob = make_problem(w.m, w.n, w.k, w.bm, w.bk, w.density, w.kind, w.dtype, gpu, seed, true);
  GemmArgs& g = prob->g;
  // Zeros, not garbage (NaN / denormal inputs could slow a CPU kernel).
  const size_t es = dtype_size(w.dtype);
  const size_t bytes[3] = {size_t(g.sparse.nnzb) * size_t(w.bm * w.bk) * es, size_t(w.k * w.n) * es,
                           size_t(w.m * w.n) * es};
  void* ptrs[3] = {const_cast<void*>(g.sparse.values), const_cast<void*>(g.b.data), g.c.data};
  for (int i = 0; i < 3; ++i) {
    if (gpu)
      check_cuda(cudaMemset(ptrs[i], 0, bytes[i]), "cudaMemset");
    else
      std::memset(ptrs[i], 0, bytes[i]);
  }
  cudaStream_t stream = nullptr;
  if (gpu) check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() {
      if (s) cudaStreamDestroy(s);
    }
  } guard{stream};
  Options opt = base;
  opt.stream = stream;
  Options unchecked = opt;
  unchecked.check_indices = false;
  const Plan p = plan(g, opt);
  const Variant* v = find_variant(p.variant());
  Options bare;
  bare.backend = p.backend();
  bare.check_indices = false;
  bare.threads = opt.threads;
  const std::unique_ptr<VariantState> state = v->prepare ? v->prepare(g, bare) : nullptr;
  bare.stream = stream;
  auto sync = [&] {
    if (gpu) check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };

  using clock = std::chrono::steady_clock;
  const int batch = 50;
  const char* names[4] = {"run(plan, args, stream)", "bare variant run()", "gemm() one-shot",
                          "gemm() one-shot, check_indices=false"};
  std::vector<double> us[4];
  auto one = [&](int kind) {
    switch (kind) {
      case 0: run(p, g, stream); break;
      case 1: v->run(g, bare, state.get()); break;
      case 2: gemm(g, opt); break;
      default: gemm(g, unchecked); break;
    }
  };
  auto timed_batch = [&](int kind, int n, bool record) {
    for (int i = 0; i < n; ++i) {
      auto t0 = clock::now();
      one(kind);
      auto t1 = clock::now();
      if (record) us[kind].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    sync();
  };
  const int warm = std::min(calls, 100);
  for (int kind = 0; kind < 4; ++kind) timed_batch(kind, warm, false);
  for (int done = 0; done < calls; done += batch) {
    const int n = std::min(batch, calls - done);
    // Rotate the order, so no kind always follows the same one.
    for (int j = 0; j < 4; ++j) timed_batch((j + done / batch) % 4, n, true);
  }

  std::printf("sparsek %s run() overhead: %s (nnzb=%lld) on %s; variant %s (%s)\n", version(), describe(w).c_str(),
              static_cast<long long>(g.sparse.nnzb), where.c_str(), p.variant().c_str(), p.chosen_by().c_str());
  std::printf("host wall time per call, %d calls of each after %d warm-up calls, in interleaved batches of %d%s:\n",
              calls, warm, batch, gpu ? " (stream synchronized between batches, untimed)" : "");
  std::vector<std::vector<std::string>> rows;
  Json calls_j = Json::array();
  for (int kind = 0; kind < 4; ++kind) {
    const double mn = *std::min_element(us[kind].begin(), us[kind].end());
    rows.push_back({names[kind], fmt(timing::median(us[kind]), 2), fmt(mean_of(us[kind]), 2), fmt(mn, 2)});
    calls_j.push_back({{"call", names[kind]}, {"median_us", timing::median(us[kind])}, {"mean_us", mean_of(us[kind])},
                       {"min_us", mn}});
  }
  print_table({"call", "median us", "mean us", "min us"}, rows);
  *out = {{"workload", workload_json(w)}, {"variant", p.variant()}, {"calls_each", calls}, {"host_us", calls_j},
          {"overhead_us_median", timing::median(us[0]) - timing::median(us[1])},
          {"overhead_us_mean", mean_of(us[0]) - mean_of(us[1])}};
  std::printf("run() overhead over the bare variant launch: %.2f us (median), %.2f us (mean); target < 5 us\n",
              timing::median(us[0]) - timing::median(us[1]), mean_of(us[0]) - mean_of(us[1]));
  return 0;
}

}  // namespace

int tune_main(const std::vector<std::string>& argv) {
  Args args(argv, kSpecs);
  if (args.help()) {
    print_help("sparsek tune [flags]",
               "Times every variant that supports a DSD workload (sparsek's and the cuSPARSE/cuBLAS peers)\n"
               "on random operands, checks each result against a reference before it may win, and\n"
               "stores the winner (it must beat the default by more than 2%) in the tuning cache\n"
               "($SPARSEK_CACHE or ~/.cache/sparsek/tune.json), where plan() finds it when\n"
               "SPARSEK_TUNE is cached (the default) or on. Without a GPU it tunes the CPU backend.\n"
               "When another process holds the cache's lock, storing waits --lock-wait seconds (default\n"
               "30; --no-wait: none), then fails with exit code 1 naming that process.\n"
               "--compare times the candidates again and prints 'tuner pick: ...; best: ...; pick\n"
               "within X% of best'; --run-overhead measures run(plan)'s host cost over the bare launch.",
               kSpecs);
    return 0;
  }
  const bool gpu = use_gpu(args.backend("--backend"));
  const DeviceInfo& info = device_info();
  const bool overhead = args.has("--run-overhead");
  const bool spec = args.has("--spec-workloads");
  const bool compare = args.has("--compare") || spec;
  if (int(overhead) + int(compare) + int(args.has("--plan-time")) > 1)
    args.bad(overhead ? "--run-overhead" : "--plan-time", "choose one of --plan-time, --run-overhead, --compare");
  if (spec && !gpu)
    args.bad("--spec-workloads", "bench's workload table is sized for a GPU (none is used here); use --compare on one workload");
  const int64_t big = int64_t(1) << 20;
  // --run-overhead: a product small enough that the host calls, not the product, take the time
  // (on the CPU the product runs inside the call, so it must be tiny for a us difference to show).
  const int64_t m = args.integer("--m", overhead ? (gpu ? 256 : 64) : gpu ? 8192 : 1024, 1, big);
  const int64_t n = args.integer("--n", m, 1, big);
  const int64_t k = args.integer("--k", m, 1, big);
  int bm = 64, bk = 64;
  args.block("--block", &bm, &bk);
  if (m % bm) args.bad("--m", "M=" + std::to_string(m) + " must be a multiple of bm=" + std::to_string(bm));
  if (k % bk) args.bad("--k", "K=" + std::to_string(k) + " must be a multiple of bk=" + std::to_string(bk));
  const double density = args.real("--density", 0.125, 0.0, 1.0);
  const PatternKind kind = args.pattern("--pattern", PatternKind::fixed_k);
  const DType dtype = args.dtype("--dtype", gpu ? DType::f16 : DType::f32);
  const uint64_t seed = args.seed("--seed", 1);
  const int calls = int(args.integer("--calls", 2000, 1, 10000000));
  const int threads = int(args.integer("--threads", 0, 1, 4096));
  JsonOutput json(args);
  Json doc = json_header("tune", argv);
  doc["device"] = gpu ? info.name : std::string("cpu");
  TuneOptions to;
  to.warmup = int(args.integer("--warmup", 2, 0, 100000));
  to.max_reps = int(args.integer("--reps", 100, 1, 100000));
  to.min_reps = std::min(to.min_reps, to.max_reps);
  to.seconds_per_candidate = args.real("--budget", 0.3, 0.0, 3600.0);
  to.store = !args.has("--no-store");
  const double lock_wait = lock_wait_seconds(args);
  if (!to.store && (args.has("--lock-wait") || args.has("--no-wait")))
    args.bad(args.has("--no-wait") ? "--no-wait" : "--lock-wait", "not with --no-store (nothing is stored, no lock taken)");
  to.seed = seed;
  Options opt;
  opt.backend = gpu ? Backend::cuda : Backend::cpu;
  opt.threads = threads;
  auto finish = [&](int rc) {
    if (json.enabled()) {
      json.write(doc);
      json.say_written();
    }
    return rc;
  };

  const std::string where =
      gpu ? info.name + " (" + std::to_string(info.sm_count) + " SMs, cc " + std::to_string(info.cc_major) + "." +
                std::to_string(info.cc_minor) + ")"
          : std::string("the CPU backend") + (info.available ? "" : " (no GPU: " + info.why_not + ")");
  const Workload given{m, n, k, bm, bk, density, kind, dtype};
  {
    // The tuner's operands (A's stored values, B, C, and the reference's C in doubles), checked
    // before anything is allocated.
    const double es = double(dtype_size(dtype)), dm = double(m), dn = double(n), dk = double(k);
    check_host_bytes("the workload --m " + std::to_string(m) + " --n " + std::to_string(n) + " --k " +
                         std::to_string(k),
                     (std::min(1.0, density * 1.01) * dm * dk + dk * dn + 2 * dm * dn) * es + 8 * dm * dn);
  }

  if (overhead) {
    Json r;
    const int rc = run_overhead(given, gpu, opt, seed, calls, where, &r);
    doc["run_overhead"] = r;
    return finish(rc);
  }

  if (args.has("--plan-time")) {
    auto prob = make_problem(m, n, k, bm, bk, density, kind, dtype, gpu, seed, true);
    const int reps = std::max(1, to.max_reps);
    using clock = std::chrono::steady_clock;
    Plan p;
    for (int i = 0; i < 3; ++i) p = plan(prob->g, opt);  // warm: first-touch, device init, cache read
    std::vector<double> us;
    for (int i = 0; i < reps; ++i) {
      auto t0 = clock::now();
      Plan q = plan(prob->g, opt);
      us.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
    }
    const double median_us = timing::median(us);
    std::sort(us.begin(), us.end());
    std::printf("sparsek %s plan() time: %s (nnzb=%lld) on %s, SPARSEK_TUNE=%s\n", version(), describe(given).c_str(),
                static_cast<long long>(prob->g.sparse.nnzb), where.c_str(), to_string(tune_mode()));
    std::printf("variant %s (%s); %d calls after 3 warm-up calls: median %.1f us, min %.1f us, max %.1f us\n",
                p.variant().c_str(), p.chosen_by().c_str(), reps, median_us, us.front(), us.back());
    doc["plan_time"] = {{"workload", workload_json(given)}, {"variant", p.variant()}, {"chosen_by", p.chosen_by()},
                        {"calls", reps}, {"median_us", median_us}, {"min_us", us.front()},
                        {"max_us", us.back()}};
    return finish(0);
  }

  std::vector<Workload> table;
  if (spec) {
    for (const SpecWorkload& s : spec_workloads())
      table.push_back({s.size, s.size, s.size, s.bm, s.bk, s.density, PatternKind::fixed_k, dtype});
  } else {
    table.push_back(given);
  }
  int rc = 0;
  std::vector<std::string> lines;
  double worst = 0;
  doc["tuned"] = Json::array();
  for (size_t i = 0; i < table.size(); ++i) {
    if (i) std::printf("\n");
    bool ok = true;
    Json tj;
    TuneReport r = tune_and_print(table[i], gpu, opt, to, seed, where, lock_wait, &ok, &tj);
    if (!ok) rc = 1;
    if (!compare) {
      doc["tuned"].push_back(tj);
      continue;
    }
    double pct = 0;
    Json cj;
    std::string line = compare_pick(table[i], gpu, opt, to, seed, r, &pct, &cj);
    tj["second_pass"] = cj;
    doc["tuned"].push_back(tj);
    if (line.empty()) {
      rc = 1;
      line = "tuner pick: " + r.entry.variant + " did not run correctly when re-timed";
    } else {
      worst = std::max(worst, pct);
    }
    const Workload& w = table[i];
    lines.push_back("[" + std::to_string(w.m) + "x" + std::to_string(w.n) + "x" + std::to_string(w.k) + " " +
                    block_str(w.bm, w.bk) + " " + fmt(100.0 * w.density, 2) + "%] " + line);
    std::fflush(stdout);
  }
  if (spec) {
    std::printf("\nsummary (%zu workloads, pick vs best in the second timing pass; target within 5%%):\n",
                lines.size());
    for (const std::string& l : lines) std::printf("%s\n", l.c_str());
    std::printf("worst: pick within %.1f%% of best\n", worst);
    doc["worst_pick_within_pct_of_best"] = worst;
  }
  return finish(rc);
}

}  // namespace sparsek::cli
