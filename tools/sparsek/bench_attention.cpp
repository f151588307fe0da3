// `sparsek bench --op attention`: the block-sparse attention forward of every variant that
// supports a workload, on a seeded random layout, in one process.
//
// Per workload: random q, k, v in [-1, 1), a layout (top-k: each query block keeps
// round(density * Nk) random key blocks; dense; causal), then per variant a run on a NaN-poisoned
// O and LSE checked against the fp64 reference on a sample of query rows, then the timing: median
// of --reps runs after --warmup (GPU: CUDA events, input sets rotated so the working set exceeds
// 2x L2; CPU: wall clock). Effective FLOPs = 4 * D * unmasked score elements.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cli.hpp"
#include "core/device.hpp"
#include "cpu/oracle.hpp"
#include "format/attention_internal.hpp"
#include "plan/backends.hpp"
#include "plan/variant.hpp"

namespace sparsek::cli {

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<FlagSpec> kSpecs = {
    {"--op", "attention", "the attention bench (this text); dsd is the products' bench"},
    {"--suite", "attention", "the attention target table (12.5%, 25%, dense layout, D=64, causal top-k 12.5%, GQA 16/2)"},
    {"--batch", "B", "batch size (default 1)"},
    {"--heads", "H", "query heads (default 16 on a GPU, 4 on the CPU)"},
    {"--kv-heads", "H", "key/value heads, a divisor of --heads (default: --heads)"},
    {"--seq", "S", "query and key sequence length (default 16384 on a GPU, 1024 on the CPU)"},
    {"--dim", "D", "head dimension, 64 or 128 (default 128)"},
    {"--density", "F", "top-k: fraction of key blocks each query block keeps, in (0, 1] (default 0.125)"},
    {"--block", "N", "block size, 64 or 128 (default 128)"},
    {"--causal", nullptr, "causal: only key blocks j <= i, element mask inside the diagonal blocks"},
    {"--layout", "NAME", "topk | dense | causal (default topk; causal = every block j <= i, implies --causal)"},
    {"--dtype", "T", "bf16 | f16 | f32 (default bf16 on a GPU, f32 on the CPU)"},
    {"--reps", "R", "timed repetitions, the median is reported (default 20 GPU, 3 CPU)"},
    {"--warmup", "W", "untimed runs first (default 5 GPU, 1 CPU)"},
    {"--variants", "a,b", "only these variants"},
    {"--backend", "B", "auto | cpu | cuda (default auto: cuda when a GPU answers)"},
    {"--json", "FILE", "also write every number as JSON (- for stdout; the table then goes to stderr)"},
    {"--seed", "S", "random seed of layouts and values (default 1)"},
};

struct Workload {
  int64_t batch = 1, heads = 16, kv_heads = 16, seq = 16384;
  int dim = 128, block = 128;
  double density = 0.125;
  LayoutKind layout = LayoutKind::topk;
  bool causal = false;
  DType dtype = DType::bf16;
};

std::string label(const Workload& w) {
  std::string s = "B" + std::to_string(w.batch) + " H" + std::to_string(w.heads);
  if (w.kv_heads != w.heads) s += "/" + std::to_string(w.kv_heads);
  s += " S" + std::to_string(w.seq) + " D" + std::to_string(w.dim) + " " + block_str(w.block, w.block) + " " +
       to_string(w.layout);
  if (w.layout == LayoutKind::topk) s += " " + fmt(100.0 * w.density, 2) + "%";
  if (w.causal && w.layout != LayoutKind::causal) s += " causal";
  return s + " " + to_string(w.dtype);
}

struct Row {
  std::string name;
  std::string status = "ok";  // ok | unsupported | failed
  std::string reason;
  std::vector<double> times_ms;
  double median_ms = kNaN, eff_tflops = kNaN, err_o = kNaN, err_lse = kNaN;
  bool wrong = false;
};

struct Result {
  Workload w;
  double eff_flops = 0, kept = 0;  // kept: attended key blocks / all (query block, key block) pairs
  int sets = 1;
  int64_t checked_rows = 0;
  std::vector<Row> rows;
};

// Max |error| of O and of LSE that only flags broken results (wrong indexing, masks, NaN leaks),
// not rounding: O's elements are averages of V's, in [-1, 1].
double tolerance(DType t) { return t == DType::bf16 ? 3e-2 : t == DType::f16 ? 5e-3 : 1e-4; }

// The problem on the host (the layout and q, k, v; o and lse are host buffers for the CPU runs).
struct HostProblem {
  HostMatrix q, k, v, o;
  std::vector<float> lse;
  LayoutArrays layout;
  AttentionArgs args;
};

Tensor4View packed(HostMatrix& m, int64_t b, int64_t h, int64_t s, int64_t d) {
  return Tensor4View::packed(m.view.data, m.view.dtype, Memory::host, b, h, s, d);
}

// Attended key blocks over all (query block, key block) pairs of the layout.
double kept_fraction(const LayoutArrays& l, int64_t seq) {
  double kept = 0;
  for (int32_t n : l.num) kept += n;
  for (int32_t n : l.full_num) kept += n;
  return kept / (double(l.num.size()) * double((seq + l.block - 1) / l.block));
}

std::unique_ptr<HostProblem> make_problem(const Workload& w, uint64_t seed) {
  auto p = std::make_unique<HostProblem>();
  const int64_t qrows = w.batch * w.heads * w.seq, kvrows = w.batch * w.kv_heads * w.seq;
  p->q = HostMatrix(qrows, w.dim, w.dtype, Layout::row_major, 0);
  p->k = HostMatrix(kvrows, w.dim, w.dtype, Layout::row_major, 0);
  p->v = HostMatrix(kvrows, w.dim, w.dtype, Layout::row_major, 0);
  p->o = HostMatrix(qrows, w.dim, w.dtype, Layout::row_major, 0);
  p->q.fill_random(mix_seed(seed, 1), false);
  p->k.fill_random(mix_seed(seed, 2), false);
  p->v.fill_random(mix_seed(seed, 3), false);
  p->lse.assign(size_t(qrows), 0.f);
  // One layout row per key/value head (what a gate makes; GQA heads of a group share it).
  p->layout = random_attention_layout(w.layout, w.batch, w.kv_heads, w.seq, w.seq, w.block, w.density, w.causal,
                                      mix_seed(seed, 4));
  AttentionArgs& a = p->args;
  a.q = packed(p->q, w.batch, w.heads, w.seq, w.dim);
  a.k = packed(p->k, w.batch, w.kv_heads, w.seq, w.dim);
  a.v = packed(p->v, w.batch, w.kv_heads, w.seq, w.dim);
  a.o = packed(p->o, w.batch, w.heads, w.seq, w.dim);
  a.lse = p->lse.data();
  a.layout = p->layout.view();
  a.causal = w.causal || w.layout == LayoutKind::causal;
  validate(a, true);
  return p;
}

// The sampled (batch, head, row) triples the check compares: the first and last head, two random
// ones; per head the first and last row, the first row of the last query block, 29 random rows.
struct Sample {
  int64_t b, h, s;
};
std::vector<Sample> sample_rows(const Workload& w, uint64_t seed) {
  Rng rng(mix_seed(seed, 5));
  std::vector<std::pair<int64_t, int64_t>> heads = {{0, 0}, {w.batch - 1, w.heads - 1}};
  for (int i = 0; i < 2; ++i) heads.emplace_back(rng.below(w.batch), rng.below(w.heads));
  std::vector<Sample> out;
  for (auto [b, h] : heads) {
    out.push_back({b, h, 0});
    out.push_back({b, h, w.seq - 1});
    out.push_back({b, h, (w.seq - 1) / w.block * w.block});
    for (int i = 0; i < 29; ++i) out.push_back({b, h, rng.below(w.seq)});
  }
  return out;
}

// The reference of the sampled rows: o [rows][D] and lse [rows].
struct Reference {
  std::vector<Sample> rows;
  std::vector<double> o, lse;
};
Reference reference(const HostProblem& p, const Workload& w, uint64_t seed) {
  Reference ref;
  ref.rows = sample_rows(w, seed);
  ref.o.resize(ref.rows.size() * size_t(w.dim));
  ref.lse.resize(ref.rows.size());
  for (size_t i = 0; i < ref.rows.size(); ++i)
    attention_oracle_row(p.args, ref.rows[i].b, ref.rows[i].h, ref.rows[i].s, &ref.o[i * size_t(w.dim)], &ref.lse[i]);
  return ref;
}

// Compares a run's packed o (bytes in w.dtype) and lse with the reference rows.
void compare(const Reference& ref, const Workload& w, const std::vector<uint8_t>& o, const std::vector<float>& lse,
             Row& row) {
  const double inf = std::numeric_limits<double>::infinity();
  double eo = 0, el = 0;
  for (size_t i = 0; i < ref.rows.size(); ++i) {
    const Sample& r = ref.rows[i];
    const int64_t base = ((r.b * w.heads + r.h) * w.seq + r.s) * w.dim;
    for (int64_t d = 0; d < w.dim; ++d) {
      const double got = load_as_float(o.data(), w.dtype, base + d);
      eo = std::isfinite(got) ? std::max(eo, std::fabs(got - ref.o[i * size_t(w.dim) + size_t(d)])) : inf;
    }
    const double got = lse[size_t((r.b * w.heads + r.h) * w.seq + r.s)], want = ref.lse[i];
    if (std::isinf(want)) el = got == want ? el : inf;  // an empty row: -inf exactly
    else el = std::isfinite(got) ? std::max(el, std::fabs(got - want)) : inf;
  }
  row.err_o = eo;
  row.err_lse = el;
  row.wrong = !(eo <= tolerance(w.dtype) && el <= tolerance(w.dtype));
}

bool wanted(const std::vector<std::string>& only, const std::string& name) {
  return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
}

// Every variant of `be`: a row each ("unsupported" with the reason where why_not() objects).
template <class Measure>
void for_each_variant(Backend be, const AttentionArgs& args, const std::vector<std::string>& only, Result& r,
                      const Measure& measure) {
  for (const AttentionVariant& v : attention_variants()) {
    if (v.backend != be || !wanted(only, v.name)) continue;
    Row row;
    row.name = v.name;
    const std::string why = v.why_not(args);
    if (!why.empty()) {
      row.status = "unsupported";
      row.reason = why;
    } else {
      try {
        measure(v, row);
        row.median_ms = median(row.times_ms);
        row.eff_tflops = r.eff_flops / (row.median_ms * 1e-3) / 1e12;
      } catch (const Error& e) {
        row.status = e.status() == Status::unsupported ? "unsupported" : "failed";
        row.reason = e.what();
        if (be == Backend::cuda) {  // do not let one row's error hit the next
          cudaDeviceSynchronize();
          cudaGetLastError();
        }
      }
    }
    r.rows.push_back(row);
  }
}

// The workload's host problem, its result's header (FLOPs, kept fraction) and the reference rows.
std::unique_ptr<HostProblem> prepare(const Workload& w, uint64_t seed, Progress& progress, const std::string& prefix,
                                     Result& r, Reference& ref) {
  r.w = w;
  progress.update(prefix + "generating inputs ...");
  auto p = make_problem(w, seed);
  r.eff_flops = effective_flops(p->args, host_layout(p->args.layout));
  r.kept = kept_fraction(p->layout, w.seq);
  progress.update(prefix + "computing the fp64 reference rows ...");
  ref = reference(*p, w, seed);
  r.checked_rows = int64_t(ref.rows.size());
  return p;
}

Result run_cpu(const Workload& w, int reps, int warmup, uint64_t seed, const std::vector<std::string>& only,
               Progress& progress, const std::string& prefix) {
  Result r;
  Reference ref;
  auto p = prepare(w, seed, progress, prefix, r, ref);
  Options o;
  o.backend = Backend::cpu;
  for_each_variant(Backend::cpu, p->args, only, r, [&](const AttentionVariant& v, Row& row) {
    progress.update(prefix + "checking and timing " + v.name + " ...");
    std::unique_ptr<VariantState> st = v.prepare ? v.prepare(p->args, o) : nullptr;
    p->o.fill_bytes(0xFF);  // NaN in every dtype
    std::fill(p->lse.begin(), p->lse.end(), std::numeric_limits<float>::quiet_NaN());
    v.run(p->args, o, st.get());
    compare(ref, w, p->o.bytes, p->lse, row);
    for (int i = 0; i < warmup; ++i) v.run(p->args, o, st.get());
    for (int i = 0; i < reps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      v.run(p->args, o, st.get());
      auto t1 = std::chrono::steady_clock::now();
      row.times_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  });
  progress.clear();
  return r;
}

Result run_gpu(const Workload& w, int reps, int warmup, uint64_t seed, const std::vector<std::string>& only,
               Progress& progress, const std::string& prefix) {
  Result r;
  Reference ref;
  auto p = prepare(w, seed, progress, prefix, r, ref);

  // Device copies: the layout once, q/k/v/o/lse per rotated input set.
  const LayoutArrays& la = p->layout;
  auto upload = [](const std::vector<int32_t>& v) {
    DeviceBuffer d(v.size() * 4);
    if (!v.empty()) d.upload(v.data(), d.bytes);
    return d;
  };
  DeviceBuffer d_num = upload(la.num), d_idx = upload(la.idx), d_fnum = upload(la.full_num),
               d_fidx = upload(la.full_idx);
  const size_t q_bytes = p->q.bytes.size(), kv_bytes = p->k.bytes.size(), lse_bytes = p->lse.size() * 4;
  const size_t set_bytes = 2 * q_bytes + 2 * kv_bytes + lse_bytes;
  r.sets = int(std::min<size_t>(16, std::max<size_t>(1, (2 * device_info().l2_bytes + set_bytes - 1) / set_bytes)));
  std::vector<DeviceBuffer> d_q, d_k, d_v, d_o, d_lse;
  std::vector<AttentionArgs> args;
  for (int s = 0; s < r.sets; ++s) {
    d_q.emplace_back(q_bytes);
    d_k.emplace_back(kv_bytes);
    d_v.emplace_back(kv_bytes);
    d_o.emplace_back(q_bytes);
    d_lse.emplace_back(lse_bytes);
    d_q[s].upload(p->q.bytes.data(), q_bytes);  // same values: rotation is about the cache
    d_k[s].upload(p->k.bytes.data(), kv_bytes);
    d_v[s].upload(p->v.bytes.data(), kv_bytes);
    AttentionArgs a = p->args;
    for (auto [t, buf] : {std::pair{&a.q, &d_q[s]}, std::pair{&a.k, &d_k[s]}, std::pair{&a.v, &d_v[s]},
                          std::pair{&a.o, &d_o[s]}}) {
      t->data = buf->p;
      t->memory = Memory::device;
    }
    a.lse = static_cast<float*>(d_lse[s].p);
    a.layout.kv_num_blocks = static_cast<const int32_t*>(d_num.p);
    a.layout.kv_indices = static_cast<const int32_t*>(d_idx.p);
    if (a.layout.has_full()) {
      a.layout.full_kv_num_blocks = static_cast<const int32_t*>(d_fnum.p);
      a.layout.full_kv_indices = static_cast<const int32_t*>(d_fidx.p);
    }
    a.layout.memory = Memory::device;
    args.push_back(a);
  }
  validate(args[0], true);

  Options o;
  o.backend = Backend::cuda;
  std::vector<uint8_t> got_o(q_bytes);
  std::vector<float> got_lse(p->lse.size());
  for_each_variant(Backend::cuda, args[0], only, r, [&](const AttentionVariant& v, Row& row) {
    progress.update(prefix + "checking " + v.name + " ...");
    std::unique_ptr<VariantState> st = v.prepare ? v.prepare(args[0], o) : nullptr;
    check_cuda(cudaMemset(d_o[0].p, 0xFF, q_bytes), "cudaMemset(poison o)");
    check_cuda(cudaMemset(d_lse[0].p, 0xFF, lse_bytes), "cudaMemset(poison lse)");
    v.run(args[0], o, st.get());
    check_cuda(cudaDeviceSynchronize(), "checked run");
    d_o[0].download(got_o.data(), q_bytes);
    d_lse[0].download(got_lse.data(), lse_bytes);
    compare(ref, w, got_o, got_lse, row);
    progress.update(prefix + "timing " + v.name + " ...");
    row.times_ms = time_gpu([&](int s) { v.run(args[size_t(s)], o, st.get()); }, warmup, reps, r.sets);
  });
  progress.clear();
  return r;
}

void print_result(const Result& r, bool gpu) {
  const Workload& w = r.w;
  std::printf("\n== %s: B=%lld Hq=%lld Hkv=%lld S=%lld D=%d, %s blocks, layout %s (%.2f%% of blocks kept)%s, %s\n",
              label(w).c_str(), (long long)w.batch, (long long)w.heads, (long long)w.kv_heads, (long long)w.seq, w.dim,
              block_str(w.block, w.block).c_str(), to_string(w.layout), 100 * r.kept,
              w.causal || w.layout == LayoutKind::causal ? ", causal" : "", to_string(w.dtype));
  std::printf("   effective GFLOP %.2f; %s%lld sampled rows checked against the fp64 reference\n", r.eff_flops / 1e9,
              gpu ? (std::to_string(r.sets) + " input set(s) rotated; ").c_str() : "", (long long)r.checked_rows);
  if (r.rows.empty()) {
    std::printf("   no %s attention variant is registered\n", gpu ? "GPU" : "CPU");
    return;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Row& x : r.rows) {
    std::string note = x.status == "ok" ? (x.wrong ? "WRONG: error above " + fmt_sci(tolerance(w.dtype)) : "")
                                        : x.status + ": " + x.reason;
    rows.push_back({x.name, fmt(x.median_ms, 3), gpu ? fmt(x.eff_tflops, 1) : fmt(x.eff_tflops * 1e3, 2),
                    fmt_sci(x.err_o), fmt_sci(x.err_lse), note});
  }
  print_table({"variant", "median ms", gpu ? "eff TFLOPS" : "eff GFLOPS", "max|dO|", "max|dLSE|", "note"}, rows);
}

Json to_json(const std::vector<Result>& results, bool gpu, const std::vector<std::string>& argv, int reps,
             int warmup, uint64_t seed) {
  Json j = json_header("bench", argv);
  j["op"] = "attention";
  j["mode"] = gpu ? "gpu" : "cpu";
  j["device"] = device_json(gpu, cpu_threads(0));
  j["settings"] = {{"reps", reps}, {"warmup", warmup}, {"seed", int64_t(seed)}};
  Json ws = Json::array();
  for (const Result& r : results) {
    const Workload& w = r.w;
    Json x;
    x["label"] = label(w);
    x["batch"] = w.batch;
    x["heads"] = w.heads;
    x["kv_heads"] = w.kv_heads;
    x["seq"] = w.seq;
    x["dim"] = w.dim;
    x["block"] = w.block;
    x["layout"] = to_string(w.layout);
    x["density"] = w.density;
    x["causal"] = w.causal || w.layout == LayoutKind::causal;
    x["dtype"] = to_string(w.dtype);
    x["kept_fraction"] = r.kept;
    x["effective_flops"] = r.eff_flops;
    x["rotation_sets"] = r.sets;
    x["checked_rows"] = r.checked_rows;
    Json vs = Json::array();
    for (const Row& v : r.rows) {
      Json y;
      y["name"] = v.name;
      y["status"] = v.status;
      y["reason"] = v.reason;
      y["median_ms"] = num(v.median_ms);
      y["effective_tflops"] = num(v.eff_tflops);
      y["max_abs_error_o"] = num(v.err_o);
      y["max_abs_error_lse"] = num(v.err_lse);
      y["wrong"] = v.wrong;
      Json t = Json::array();
      for (double ms : v.times_ms) t.push_back(num(ms));
      y["times_ms"] = t;
      vs.push_back(y);
    }
    x["variants"] = vs;
    ws.push_back(x);
  }
  j["workloads"] = ws;
  return j;
}

}  // namespace

int bench_attention_main(const std::vector<std::string>& argv) {
  Args args(argv, kSpecs);
  if (args.help()) {
    print_help("sparsek bench --op attention [flags]",
               "Times block-sparse attention (forward: O and LSE) for every variant that supports the\n"
               "workload, on a random layout: top-k keeps round(density * Nk) random key blocks per query\n"
               "block. Each variant's output is checked against the fp64 reference on sampled rows first.\n"
               "Default with a GPU: B=1 Hq=16 S=16384 D=128 bf16, 128x128 blocks, top-k 12.5%; without\n"
               "one, the CPU backend on B=1 Hq=4 S=1024 D=128 f32, and it says so. --suite attention runs\n"
               "the target table (12.5%, 25%, dense layout, D=64, causal top-k 12.5%, GQA 16/2) at that\n"
               "shape. Exit code 1 when a variant failed, gave a wrong result, or none could run.",
               kSpecs);
    return 0;
  }
  if (args.has("--op") && args.str("--op", "") != "attention") args.bad("--op", "must be attention or dsd");
  const bool suite = args.has("--suite");
  if (suite && args.str("--suite", "") != "attention") args.bad("--suite", "the only suite is 'attention'");
  if (suite)
    for (const char* f : {"--density", "--layout", "--dim", "--causal", "--kv-heads"})
      if (args.has(f)) args.bad(f, "not with --suite (each row of the suite sets it)");
  const Backend backend = args.backend("--backend");
  const bool gpu = use_gpu(backend);
  const int64_t big = int64_t(1) << 20;
  Workload base;
  base.batch = args.integer("--batch", 1, 1, 4096);
  base.heads = args.integer("--heads", gpu ? 16 : 4, 1, 4096);
  base.kv_heads = args.integer("--kv-heads", base.heads, 1, base.heads);
  if (base.heads % base.kv_heads) args.bad("--kv-heads", "must divide --heads = " + std::to_string(base.heads));
  base.seq = args.integer("--seq", gpu ? 16384 : 1024, 1, big);
  base.dim = int(args.integer("--dim", 128, 64, 128));
  if (base.dim != 64 && base.dim != 128) args.bad("--dim", "must be 64 or 128");
  base.block = int(args.integer("--block", 128, 64, 128));
  if (base.block != 64 && base.block != 128) args.bad("--block", "must be 64 or 128");
  base.density = args.real("--density", 0.125, 0.0, 1.0);
  base.causal = args.has("--causal");
  const std::string layout = args.str("--layout", "topk");
  if (layout == "topk") base.layout = LayoutKind::topk;
  else if (layout == "dense") base.layout = LayoutKind::dense;
  else if (layout == "causal") base.layout = LayoutKind::causal;
  else args.bad("--layout", "must be one of topk, dense, causal");
  base.causal = base.causal || base.layout == LayoutKind::causal;
  base.dtype = args.dtype("--dtype", gpu ? DType::bf16 : DType::f32);
  if (gpu && base.dtype == DType::f32) args.bad("--dtype", "f32 runs on the CPU only (--backend cpu)");
  const uint64_t seed = args.seed("--seed", 1);
  const std::vector<std::string> only = args.list("--variants");
  for (const std::string& name : only)
    if (!find_attention_variant(name)) {
      std::string known;
      for (const AttentionVariant& v : attention_variants()) known += (known.empty() ? "" : ", ") + std::string(v.name);
      args.bad("--variants", "unknown attention variant '" + name + "' (known: " + known + ")");
    }
  const int reps = int(args.integer("--reps", gpu ? 20 : 3, 1, 100000));
  const int warmup = int(args.integer("--warmup", gpu ? 5 : 1, 0, 100000));

  JsonOutput json(args);  // after every flag check: an unwritable path fails before any work

  std::vector<Workload> table;
  if (!suite) {
    table.push_back(base);
  } else {
    // The target table: 12.5%, 25%, dense layout, D = 64, causal top-k 12.5%, GQA 16 / 2.
    auto row = [&](double density, LayoutKind kind, int dim, bool causal, int64_t kv_heads) {
      Workload w = base;
      w.density = density;
      w.layout = kind;
      w.dim = dim;
      w.causal = causal;
      w.kv_heads = kv_heads;
      table.push_back(w);
    };
    row(0.125, LayoutKind::topk, 128, false, base.heads);
    row(0.25, LayoutKind::topk, 128, false, base.heads);
    row(1.0, LayoutKind::dense, 128, false, base.heads);
    row(0.125, LayoutKind::topk, 64, false, base.heads);
    row(0.125, LayoutKind::topk, 128, true, base.heads);
    if (base.heads % 8 == 0) row(0.125, LayoutKind::topk, 128, false, base.heads / 8);
  }

  const DeviceInfo& info = device_info();
  if (gpu)
    std::printf("sparsek %s attention bench on %s (compute capability %d.%d, %d SMs), CUDA runtime %d, driver %d\n"
                "median of %d runs after %d warm-up runs, CUDA events\n",
                version(), info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count, info.runtime_version,
                info.driver_version, reps, warmup);
  else if (backend == Backend::cpu)
    std::printf("running the CPU backend (--backend cpu); median of %d runs after %d warm-up runs\n", reps, warmup);
  else
    std::printf("no GPU found: %s; running the CPU backend; median of %d runs after %d warm-up runs\n",
                info.why_not.c_str(), reps, warmup);
  Progress progress(stdout_is_tty());
  std::vector<Result> results;
  for (size_t i = 0; i < table.size(); ++i) {
    const std::string prefix =
        "[" + std::to_string(i + 1) + "/" + std::to_string(table.size()) + "] " + label(table[i]) + ": ";
    results.push_back(gpu ? run_gpu(table[i], reps, warmup, seed, only, progress, prefix)
                          : run_cpu(table[i], reps, warmup, seed, only, progress, prefix));
    print_result(results.back(), gpu);
    std::fflush(stdout);
  }
  if (json.enabled()) {
    json.write(to_json(results, gpu, argv, reps, warmup, seed));
    std::printf("\n");
    json.say_written();
  }
  int bad = 0, empty = 0;
  for (const Result& r : results) {
    empty += r.rows.empty();
    for (const Row& x : r.rows) bad += x.status == "failed" || x.wrong;
  }
  if (bad) std::printf("%d row(s) failed or gave a wrong result\n", bad);
  if (empty) std::printf("%d workload(s) had no variant to run\n", empty);
  return bad || empty ? 1 : 0;
}

}  // namespace sparsek::cli
