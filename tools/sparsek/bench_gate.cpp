// `sparsek bench --op gate`: times the top-k block gate (pool Q and K, score, select) and sets it
// against its floor, reading Q and K once at the GPU's measured copy bandwidth. The layout is
// checked against the CPU reference first (outputs poisoned): rows must match, up to blocks whose
// reference scores tie within 1e-4 of the row's largest (f32 and double may order those
// differently); the selected blocks' reference-score sums must then agree within 1e-4.
#include "core/cuda_host.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "sparsek/attention.hpp"
#include "tools_internal.hpp"

namespace sparsek::cli {

namespace {

const std::vector<FlagSpec> kGateSpecs = {
    {"--op", "gate", "time the top-k block gate"},
    {"--batch", "B", "batch (default 1)"},
    {"--heads", "H", "query heads (default 16 on a GPU, 2 on the CPU)"},
    {"--kv-heads", "H", "key/value heads, dividing --heads (default: --heads)"},
    {"--seq", "S", "query length (default 16384 on a GPU, 4096 on the CPU)"},
    {"--seq-kv", "S", "key length (default: --seq)"},
    {"--dim", "D", "head dimension, 64 or 128 (default 128)"},
    {"--block", "N", "block size, 64 or 128 (default 128)"},
    {"--density", "P", "kept fraction of key blocks per query block, in (0, 1] (default 0.125): topk = "
                       "round(P * Nk) - sink - local"},
    {"--topk", "K", "top-k blocks beside sink and local (overrides --density)"},
    {"--sink", "N", "always-kept first blocks (default 1)"},
    {"--local", "N", "always-kept diagonal blocks (default 1)"},
    {"--causal", nullptr, "causal: only blocks at or before the diagonal"},
    {"--dtype", "T", "bf16 | f16 (| f32 on the CPU) (default bf16; f32 on the CPU)"},
    {"--reps", "R", "timed repetitions, the median is reported (default 50 GPU, 3 CPU)"},
    kWarmupFlag,
    kBackendFlag,
    {"--seed", "S", "random seed of the inputs (default 1)"},
    {"--json", "FILE", "also write the figures as JSON (- for stdout; the text then goes to stderr)"},
};

struct Problem {
  int64_t B = 1, Hq = 16, Hkv = 16, Sq = 16384, Skv = 16384, D = 128;
  int block = 128, topk = 14, sink = 1, local = 1;
  bool causal = false;
  DType dtype = DType::bf16;
  int64_t Mq() const { return (Sq + block - 1) / block; }
  int64_t Nk() const { return (Skv + block - 1) / block; }
  int64_t kmax() const { return std::min<int64_t>(Nk(), int64_t(topk) + sink + local); }
  std::string label() const {
    return "B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
           " Sq=" + std::to_string(Sq) + " Skv=" + std::to_string(Skv) + " D=" + std::to_string(D) + " " +
           to_string(dtype) + " block " + std::to_string(block) + ", topk " + std::to_string(topk) + " + sink " +
           std::to_string(sink) + " + local " + std::to_string(local) + (causal ? ", causal" : "");
  }
};

// Packed host tensor [b, h, s, d] of uniform [-1, 1) values.
std::vector<uint8_t> random_tensor(int64_t b, int64_t h, int64_t s, int64_t d, DType t, uint64_t seed) {
  const int64_t n = b * h * s * d;
  std::vector<uint8_t> bytes(size_t(std::max<int64_t>(n, 1)) * dtype_size(t));
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) store_from_float(bytes.data(), t, i, float(2 * rng.uniform() - 1));
  return bytes;
}

struct Outputs {
  std::vector<int32_t> num, idx;
  std::vector<float> scores;
};

GateArgs make_args(const Problem& p, void* q, void* k, Memory mem) {
  GateArgs a;
  a.q = Tensor4View::packed(q, p.dtype, mem, p.B, p.Hq, p.Sq, p.D);
  a.k = Tensor4View::packed(k, p.dtype, mem, p.B, p.Hkv, p.Skv, p.D);
  a.topk = p.topk;
  a.block = p.block;
  a.causal = p.causal;
  a.sink = p.sink;
  a.local = p.local;
  a.kmax = p.kmax();
  return a;
}

// Rows identical / rows differing only by near ties / wrong rows, of `got` against the reference.
struct Check {
  int64_t same = 0, near = 0, wrong = 0;
};
Check compare(const Problem& p, const Outputs& ref, const Outputs& got) {
  Check c;
  const int64_t rows = int64_t(ref.num.size()), kmax = p.kmax(), Nk = p.Nk();
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t n = ref.num[size_t(r)];
    const auto want = ref.idx.begin() + r * kmax, have = got.idx.begin() + r * kmax;
    if (got.num[size_t(r)] == n && std::equal(want, want + kmax, have)) {
      ++c.same;
      continue;
    }
    // Same count, every index valid, and the reference scores of the two selections sum alike.
    bool ok = got.num[size_t(r)] == n;
    double row_max = 0, sum_want = 0, sum_have = 0;
    for (int64_t j = 0; j < Nk; ++j) {
      const double v = ref.scores[size_t(r * Nk + j)];
      if (std::isfinite(v)) row_max = std::max(row_max, std::fabs(v));
    }
    for (int64_t e = 0; ok && e < n; ++e) {
      const int32_t jw = want[e], jh = have[e];
      ok = jh >= 0 && jh < Nk && (e == 0 || jh > have[e - 1]);
      if (ok) sum_want += ref.scores[size_t(r * Nk + jw)], sum_have += ref.scores[size_t(r * Nk + jh)];
    }
    for (int64_t e = n; ok && e < kmax; ++e) ok = have[e] == 0;
    ok = ok && std::fabs(sum_want - sum_have) <= 1e-4 * row_max * std::max<int64_t>(n, 1);
    ++(ok ? c.near : c.wrong);
  }
  return c;
}

// The workload's result before it is measured: its label and its shape.
BenchResult gate_result(const Problem& p) {
  BenchResult r;
  r.label = p.label();
  r.fields = {{"batch", p.B},     {"heads", p.Hq},    {"kv_heads", p.Hkv},    {"seq", p.Sq},
              {"seq_kv", p.Skv},  {"dim", p.D},       {"block", p.block},     {"topk", p.topk},
              {"sink", p.sink},   {"local", p.local}, {"causal", p.causal},   {"dtype", to_string(p.dtype)}};
  return r;
}

// bench's JSON document, and the figures that earlier versions wrote at its top level (`figures`:
// the GPU's times and the check's counts, or the CPU's median), where their readers find them.
void write_json(JsonOutput& json, const std::vector<std::string>& argv, const BenchRun& run, const BenchResult& r,
                const Json& figures) {
  Json doc = bench_json(argv, run, {r});
  doc["workload"] = r.label;
  doc["reps"] = run.reps;
  doc.update(figures);
  json.write(doc);
  json.say_written();
}

int run_cpu(const Problem& p, const BenchRun& run, const std::vector<std::string>& argv, JsonOutput& json) {
  std::vector<uint8_t> q = random_tensor(p.B, p.Hq, p.Sq, p.D, p.dtype, run.seed);
  std::vector<uint8_t> k = random_tensor(p.B, p.Hkv, p.Skv, p.D, p.dtype, run.seed + 1);
  GateArgs a = make_args(p, q.data(), k.data(), Memory::host);
  Outputs out;
  out.num.resize(size_t(p.B * p.Hkv * p.Mq()));
  out.idx.resize(out.num.size() * size_t(p.kmax()));
  a.kv_num_blocks = out.num.data();
  a.kv_indices = out.idx.data();
  BenchResult r = gate_result(p);
  r.rows.resize(1);
  BenchRow& row = r.rows[0];
  row.name = "gate (pool + score + top-k)";
  row.times_ms = timing::time_host([&] { gate(a); }, run.warmup, run.reps);
  const double ms = row.median_ms = timing::median(row.times_ms);
  r.intro = {"gate on the CPU backend: " + p.label(), strprintf("median %.3f ms over %d runs", ms, run.reps)};
  print_result(r, Table{"", {}, false});  // the two lines say it all
  write_json(json, argv, run, r, {{"cpu_ms", num(ms)}});
  return 0;
}

int run_gpu(const Problem& p, const BenchRun& run, const std::vector<std::string>& argv, JsonOutput& json) {
  const DeviceInfo& info = device_info();
  std::printf("sparsek %s gate bench on %s (%d SMs): %s\n", version(), info.name.c_str(), info.sm_count,
              p.label().c_str());
  std::vector<uint8_t> hq = random_tensor(p.B, p.Hq, p.Sq, p.D, p.dtype, run.seed);
  std::vector<uint8_t> hk = random_tensor(p.B, p.Hkv, p.Skv, p.D, p.dtype, run.seed + 1);
  const size_t qk_bytes = hq.size() + hk.size();
  // Input sets rotate so that the timed reads come from HBM, not L2.
  const int sets = int(std::min<size_t>(8, std::max<size_t>(1, (2 * info.l2_bytes + qk_bytes - 1) / qk_bytes)));
  std::vector<DeviceBuffer> dq, dk;
  for (int s = 0; s < sets; ++s) {
    dq.emplace_back(hq.size());
    dk.emplace_back(hk.size());
    dq.back().upload(hq.data(), hq.size());
    dk.back().upload(hk.data(), hk.size());
  }
  GateArgs a = make_args(p, dq[0].p, dk[0].p, Memory::device);
  const size_t rows = size_t(p.B * p.Hkv * p.Mq());
  DeviceBuffer d_num(rows * 4), idx(rows * size_t(p.kmax()) * 4), scores(rows * size_t(p.Nk()) * 4);
  a.workspace_bytes = gate_workspace_bytes(a);
  DeviceBuffer ws(a.workspace_bytes);
  a.workspace = ws.p;
  a.kv_num_blocks = static_cast<int32_t*>(d_num.p);
  a.kv_indices = static_cast<int32_t*>(idx.p);
  cudaStream_t st;
  check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  Options o;
  o.stream = st;

  // Check: poisoned outputs, the GPU run against the CPU reference on the same inputs.
  Outputs got, ref;
  got.num.resize(rows);
  got.idx.resize(rows * size_t(p.kmax()));
  a.scores = static_cast<float*>(scores.p);
  // NOTE: st does not wait for the legacy stream, where the uploads ran: synchronize first.
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check_cuda(cudaMemsetAsync(d_num.p, 0x5a, d_num.bytes, st), "cudaMemsetAsync");
  check_cuda(cudaMemsetAsync(idx.p, 0x5a, idx.bytes, st), "cudaMemsetAsync");
  gate(a, o);
  check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  d_num.download(got.num.data(), d_num.bytes);
  idx.download(got.idx.data(), idx.bytes);
  a.scores = nullptr;  // timed without the optional scores output
  {
    GateArgs h = make_args(p, hq.data(), hk.data(), Memory::host);
    ref.num.resize(rows);
    ref.idx.resize(got.idx.size());
    ref.scores.resize(rows * size_t(p.Nk()));
    h.kv_num_blocks = ref.num.data();
    h.kv_indices = ref.idx.data();
    h.scores = ref.scores.data();
    gate(h);
  }
  const Check c = compare(p, ref, got);
  std::printf("layout vs CPU reference: %lld rows identical, %lld differ only by near-tie swaps, %lld wrong\n",
              (long long)c.same, (long long)c.near, (long long)c.wrong);

  // The gate, then its floor: Q and K read once at the copy bandwidth of this GPU.
  auto time = [&](const std::function<void(int)>& f) {
    return timing::time_gpu(f, run.warmup, run.reps, sets, 1, st);
  };
  const std::vector<double> gate_ms = time([&](int s) {
    a.q.data = dq[size_t(s)].p;
    a.k.data = dk[size_t(s)].p;
    gate(a, o);
  });
  DeviceBuffer copy_dst(hq.size());
  const std::vector<double> copy_ms = time([&](int s) {
    check_cuda(cudaMemcpyAsync(copy_dst.p, dq[size_t(s)].p, hq.size(), cudaMemcpyDeviceToDevice, st),
               "cudaMemcpyAsync");
  });
  // Selection alone: the same layout from given scores (no pooling, no dot products).
  std::vector<float> hs(ref.scores);
  for (float& x : hs) x = std::isfinite(x) ? x : -INFINITY;
  DeviceBuffer given(hs.size() * 4);
  given.upload(hs.data(), given.bytes);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  GateArgs g = a;
  g.given_scores = static_cast<const float*>(given.p);
  g.workspace_bytes = gate_workspace_bytes(g);
  const std::vector<double> select_ms = time([&](int) { gate(g, o); });
  check_cuda(cudaStreamDestroy(st), "cudaStreamDestroy");

  const double t_gate = timing::median(gate_ms), t_copy = timing::median(copy_ms);
  const double copy_bw = 2.0 * double(hq.size()) / (t_copy * 1e-3);  // read + write bytes per second
  const double floor_ms = double(qk_bytes) / copy_bw * 1e3;
  BenchResult r = gate_result(p);
  r.fields.update(Json{{"qk_bytes", int64_t(qk_bytes)}, {"rotation_sets", sets}});
  r.figures = {"read_tbps", "x_floor"};  // Q and K's bytes per second; the time over the floor's
  auto row = [&](const char* name, std::vector<double> times, double median_ms, double tbps) {
    BenchRow x;
    x.name = name;
    x.times_ms = std::move(times);
    x.median_ms = median_ms;
    x.figures = {{"read_tbps", tbps}, {"x_floor", median_ms / floor_ms}};
    return x;
  };
  r.rows = {row("gate (pool + score + top-k)", gate_ms, t_gate, double(qk_bytes) / (t_gate * 1e-3) / 1e12),
            row("floor: read Q and K once at copy speed", {}, floor_ms, copy_bw / 1e12),
            row("select only (given scores)", select_ms, timing::median(select_ms), kNaN)};
  r.rows[0].wrong = c.wrong > 0;
  r.rows[1].figures["x_floor"] = 1.0;
  r.intro = {strprintf("median of %d runs after %d warm-up runs, CUDA events, %d input set(s); Q + K = %.1f MB",
                       run.reps, run.warmup, sets, double(qk_bytes) / 1e6)};
  r.outro = {strprintf("copy: cudaMemcpyAsync of Q (%.1f MB), device to device: %.3f ms = %.2f TB/s read + write",
                       double(hq.size()) / 1e6, t_copy, copy_bw / 1e12)};
  print_result(r, Table{"",
                        {{"us", [](const BenchRow& x) { return fmt(x.median_ms * 1e3, 1); }},
                         fixed_column("TB/s (Q+K read)", "read_tbps", 2),
                         fixed_column("x floor", "x_floor", 2)},
                        false});

  write_json(json, argv, run, r,
             {{"gate_us", num(t_gate * 1e3)}, {"floor_us", num(floor_ms * 1e3)},
              {"select_only_us", num(r.rows[2].median_ms * 1e3)}, {"copy_tbps", num(copy_bw / 1e12)},
              {"rows_identical", c.same}, {"rows_near_ties", c.near}, {"rows_wrong", c.wrong}});
  return c.wrong ? 1 : 0;
}

}  // namespace

int bench_gate_main(const std::vector<std::string>& argv) {
  Args args(argv, kGateSpecs);
  if (args.help()) {
    print_help("sparsek bench --op gate [flags]",
               "Times the top-k block gate (mean-pool Q and K per block, score pooled q . pooled k,\n"
               "keep sink + local + top-k blocks per query block) after checking its layout against the\n"
               "CPU reference, and sets it against its floor: reading Q and K once at the GPU's\n"
               "measured copy bandwidth. Default on a GPU: B=1, 16 heads, 16384 tokens, D=128, bf16,\n"
               "128-token blocks, 12.5% of the key blocks per query block. Without a GPU it runs the CPU\n"
               "backend on a small problem and says so.",
               kGateSpecs);
    return 0;
  }
  if (args.str("--op", "gate") != "gate") args.bad("--op", "expected gate");
  const bool gpu = use_gpu(args.backend("--backend"));
  Problem p;
  p.B = args.integer("--batch", 1, 1, 1 << 16);
  p.Hq = args.integer("--heads", gpu ? 16 : 2, 1, 1 << 16);
  p.Hkv = args.integer("--kv-heads", p.Hq, 1, p.Hq);
  if (p.Hq % p.Hkv) args.bad("--kv-heads", std::to_string(p.Hkv) + " does not divide --heads " + std::to_string(p.Hq));
  p.Sq = args.integer("--seq", gpu ? 16384 : 4096, 1, int64_t(1) << 26);
  p.Skv = args.integer("--seq-kv", p.Sq, 1, int64_t(1) << 26);
  p.D = args.integer("--dim", 128, 64, 128);
  if (p.D != 64 && p.D != 128) args.bad("--dim", std::to_string(p.D) + " is not 64 or 128");
  p.block = int(args.integer("--block", 128, 64, 128));
  if (p.block != 64 && p.block != 128) args.bad("--block", std::to_string(p.block) + " is not 64 or 128");
  p.sink = int(args.integer("--sink", 1, 0, 1 << 20));
  p.local = int(args.integer("--local", 1, 0, 1 << 20));
  p.causal = args.has("--causal");
  const double density = args.real("--density", 0.125, 0.0, 1.0);
  const int64_t keep = std::max<int64_t>(1, std::llround(density * double(p.Nk())));
  p.topk = int(args.integer("--topk", std::max<int64_t>(0, keep - p.sink - p.local), 0, 1 << 24));
  p.dtype = args.dtype("--dtype", gpu ? DType::bf16 : DType::f32);
  if (gpu && p.dtype == DType::f32) args.bad("--dtype", "f32 runs on the CPU only (--backend cpu)");
  BenchRun run;
  run.op = "gate";
  run.gpu = gpu;
  run.threads = cpu_backend_threads(0);
  run.reps = int(args.integer("--reps", gpu ? 50 : 3, 1, 100000));
  run.warmup = int(args.integer("--warmup", gpu ? 5 : 1, 0, 100000));
  run.seed = args.seed("--seed", 1);
  JsonOutput json(args);  // an unwritable path fails before any work
  if (!gpu) {
    std::printf("%s; running the CPU backend\n",
                args.backend("--backend") == Backend::cpu ? "--backend cpu" : ("no GPU found: " + device_info().why_not).c_str());
    return run_cpu(p, run, argv, json);
  }
  return run_gpu(p, run, argv, json);
}

}  // namespace sparsek::cli
