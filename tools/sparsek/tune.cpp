// `sparsek tune`: tunes one DSD workload offline (the same workload flags as bench) and stores the
// winner in the tuning cache; `--plan-time` instead measures how long plan() takes on it.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli.hpp"
#include "core/device.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/tune.hpp"

namespace sparsek::cli {

namespace {

const std::vector<FlagSpec> kSpecs = {
    {"--m", "M", "rows of C (default 8192 on a GPU, 1024 on the CPU)"},
    {"--n", "N", "columns of B and C (default: M)"},
    {"--k", "K", "columns of A = rows of B (default: M)"},
    {"--block", "BMxBK", "block shape, each of 16, 32, 64, 128 (default 64x64)"},
    {"--density", "D", "fraction of stored blocks, in (0, 1] (default 0.125)"},
    {"--pattern", "NAME", "fixed_k | bernoulli | power_law | banded | block_diagonal | causal (default fixed_k)"},
    {"--dtype", "T", "f16 | bf16 | f32 (default f16 on a GPU, f32 on the CPU); C has the same dtype"},
    {"--backend", "B", "auto | cpu | cuda (default auto: cuda when a GPU answers)"},
    {"--seed", "S", "random seed of the pattern and the values (default 1)"},
    {"--warmup", "W", "untimed runs per candidate (default 2)"},
    {"--reps", "R", "most timed runs per candidate; the median counts (default 100, at least 5)"},
    {"--budget", "SEC", "seconds of timed runs per candidate (default 0.3)"},
    {"--no-store", nullptr, "tune but do not write the cache"},
    {"--plan-time", nullptr, "measure plan() on this workload (median of --reps calls) instead of tuning"},
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

std::string bar(size_t done, size_t total) {
  const size_t width = 24;
  size_t fill = total ? done * width / total : width;
  return "[" + std::string(fill, '#') + std::string(width - fill, '.') + "]";
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
               "SPARSEK_TUNE is cached (the default) or on. Without a GPU it tunes the CPU backend.",
               kSpecs);
    return 0;
  }
  const bool gpu = use_gpu(args.backend("--backend"));
  const DeviceInfo& info = device_info();
  const int64_t big = int64_t(1) << 20;
  const int64_t m = args.integer("--m", gpu ? 8192 : 1024, 1, big);
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
  TuneOptions to;
  to.warmup = int(args.integer("--warmup", 2, 0, 100000));
  to.max_reps = int(args.integer("--reps", 100, 1, 100000));
  to.min_reps = std::min(to.min_reps, to.max_reps);
  to.seconds_per_candidate = args.real("--budget", 0.3, 0.0, 3600.0);
  to.store = !args.has("--no-store");
  to.seed = seed;
  Options opt;
  opt.backend = gpu ? Backend::cuda : Backend::cpu;

  const std::string where =
      gpu ? info.name + " (" + std::to_string(info.sm_count) + " SMs, cc " + std::to_string(info.cc_major) + "." +
                std::to_string(info.cc_minor) + ")"
          : std::string("the CPU backend") + (info.available ? "" : " (no GPU: " + info.why_not + ")");
  const std::string what = "dsd " + std::string(to_string(dtype)) + " " + std::to_string(m) + "x" + std::to_string(n) +
                           "x" + std::to_string(k) + ", " + block_str(bm, bk) + " blocks, " + to_string(kind) + " " +
                           fmt(100.0 * density, 2) + "%";

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
    std::sort(us.begin(), us.end());
    std::printf("sparsek %s plan() time: %s (nnzb=%lld) on %s, SPARSEK_TUNE=%s\n", version(), what.c_str(),
                static_cast<long long>(prob->g.sparse.nnzb), where.c_str(), to_string(tune_mode()));
    std::printf("variant %s (%s); %d calls after 3 warm-up calls: median %.1f us, min %.1f us, max %.1f us\n",
                p.variant().c_str(), p.chosen_by().c_str(), reps, us[us.size() / 2], us.front(), us.back());
    return 0;
  }

  auto prob = make_problem(m, n, k, bm, bk, density, kind, dtype, gpu, seed, false);
  std::printf("sparsek %s tune: %s (nnzb=%lld) on %s\n", version(), what.c_str(),
              static_cast<long long>(prob->g.sparse.nnzb), where.c_str());
  Progress progress(stdout_is_tty());
  to.progress = [&](size_t done, size_t total, const std::string& name) {
    progress.update("tuning " + bar(done, total) + " " + std::to_string(done) + "/" + std::to_string(total) +
                    (name.empty() ? "" : " " + name));
  };
  TuneReport r = tune(prob->g, opt, to);
  progress.clear();

  const double flops = prob->g.effective_flops();
  std::printf("reference: %s; each candidate's median of timed runs after %d warm-up run(s)\n\n",
              r.reference.c_str(), std::max(1, to.warmup));
  std::vector<std::vector<std::string>> rows;
  for (const TuneCandidate& c : r.candidates) {
    std::string mark = c.variant == r.entry.variant ? " <- winner" : "";
    if (c.variant == r.entry.default_variant) mark += " (default)";
    rows.push_back({c.variant, c.correct ? fmt(c.median_ms, 4) : "-",
                    c.correct && c.median_ms > 0 ? fmt(flops / (c.median_ms * 1e-3) / 1e12, 3) : "-",
                    c.correct ? "ok (err " + fmt_sci(c.error) + ")" : (c.ran ? "WRONG" : "failed"),
                    mark.empty() ? (c.correct ? "" : c.note.substr(0, 100)) : mark});
  }
  print_table({"variant", "median ms", "eff TFLOPS", "check", ""}, rows);

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
  if (!to.store) {
    std::printf("not stored (--no-store)\n");
    return 0;
  }
  if (!r.stored) {
    std::printf("NOT stored: %s\n", r.store_error.c_str());
    return 1;
  }
  std::printf("stored in %s\n", tune_cache_path().c_str());
  return 0;
}

}  // namespace sparsek::cli
