// `sparsek bench --op decode`: paged decode attention (sparsek/decode.hpp) with top-k page
// selection, set against its floor: one read of the selected K and V pages, timed in the same run
// by the streaming read kernel that bench/read_floor.cu reports (read_floor.hpp). Per count of new
// tokens per request, a row per GPU variant (time, the selected K/V bytes per second, the ratio to
// the floor, the error of a run on a poisoned output) and the floor's row.
//
// The cache: every request holds --context tokens in pages shuffled over the physical pages; the
// selection keeps --selected of each KV head's pages, the newest always (as a gate does). Page
// contents: on a GPU a pool of random pages repeated over the cache (random bytes for gigabytes of
// cache would take the host longer than the bench; the reads do not depend on the values), on the
// CPU every page its own. The error is against the fp64 decode oracle, on the first two requests
// on a GPU (the oracle on 32 requests x 32k tokens would take minutes), on all of them on the CPU.
#include "core/cuda_host.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "read_floor.hpp"
#include "sparsek/decode.hpp"
#include "tools_internal.hpp"

namespace sparsek::cli {

namespace {

const std::vector<FlagSpec> kDecodeSpecs = {
    {"--op", "decode", "time paged decode attention"},
    {"--requests", "B", "requests in the batch (default 32 on a GPU, 4 on the CPU)"},
    {"--context", "S", "tokens in each request's cache, the new ones included (default 32768 GPU, 2048 CPU)"},
    {"--heads", "H", "query heads (default 32 on a GPU, 8 on the CPU)"},
    {"--kv-heads", "H", "key/value heads, dividing --heads (default 8 on a GPU, 2 on the CPU, where they divide "
                        "--heads; else --heads)"},
    {"--dim", "D", "head dimension, 64 or 128 (default 128)"},
    {"--page", "P", "tokens per page, a multiple of 16 in [16, 128] (default 64)"},
    {"--selected", "F", "fraction of each KV head's pages attended, in (0, 1], the newest page always "
                        "(default 0.125)"},
    {"--new-tokens", "a,b", "new (query) tokens per request, each in [1, 16]: one workload each (default 1,4)"},
    {"--dtype", "T", "bf16 | f16 (| f32 on the CPU) (default bf16; f32 on the CPU)"},
    {"--variants", "a,b", "only these rows: cuda_mma, cuda (GPU), cpu (CPU backend)"},
    {"--reps", "R", "timed repetitions, the median is reported (default 50 GPU, 3 CPU)"},
    kWarmupFlag,
    kBackendFlag,
    kThreadsFlag,
    {"--seed", "S", "random seed of the inputs, the page order and the selection (default 1)"},
    kJsonFlag,
};

const char* kFloorRow = "read floor: the selected K/V once";

struct Problem {
  int64_t B = 32, context = 32768, Hq = 32, Hkv = 8, D = 128, page = 64;
  double selected = 0.125;
  DType dtype = DType::bf16;
  int64_t pages_per() const { return (context + page - 1) / page; }
  int64_t kmax() const { return std::max<int64_t>(1, std::llround(selected * double(pages_per()))); }
  // The bytes of the selected K and V pages (whole pages: the kernels read them whole).
  double kv_bytes() const { return double(B * Hkv * kmax() * page * D) * double(dtype_size(dtype)) * 2.0; }
  std::string label(int n) const {
    return std::to_string(B) + " requests x " + std::to_string(context) + " tokens, " + std::to_string(n) +
           " new, Hq " + std::to_string(Hq) + " / Hkv " + std::to_string(Hkv) + ", D " + std::to_string(D) +
           ", page " + std::to_string(page) + ", " + fmt(100.0 * selected, 2) + "% of pages (" +
           std::to_string(kmax()) + " of " + std::to_string(pages_per()) + "), " + to_string(dtype);
  }
};

// The index arrays of a problem: pages shuffled over the physical ones, each (request, KV head)
// keeping kmax pages, the newest and kmax - 1 others drawn at random, sorted.
struct Indices {
  std::vector<int32_t> page_table, seq_lens, sel, counts;
};
Indices make_indices(const Problem& p, uint64_t seed) {
  std::mt19937_64 rng(mix_seed(seed, 3));
  const int64_t per = p.pages_per(), pages = p.B * per, kmax = p.kmax();
  Indices ix;
  ix.page_table.resize(size_t(pages));
  std::iota(ix.page_table.begin(), ix.page_table.end(), 0);
  std::shuffle(ix.page_table.begin(), ix.page_table.end(), rng);
  ix.seq_lens.assign(size_t(p.B), int32_t(p.context));
  ix.counts.assign(size_t(p.B * p.Hkv), int32_t(kmax));
  ix.sel.resize(size_t(p.B * p.Hkv * kmax));
  std::vector<int32_t> all(size_t(per - 1));
  for (int64_t r = 0; r < p.B * p.Hkv; ++r) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> keep(all.begin(), all.begin() + (kmax - 1));
    keep.push_back(int32_t(per - 1));
    std::sort(keep.begin(), keep.end());
    std::copy(keep.begin(), keep.end(), ix.sel.begin() + r * kmax);
  }
  return ix;
}

std::vector<int32_t> cu_seqlens(int64_t B, int n) {
  std::vector<int32_t> cu(size_t(B) + 1);
  for (int64_t b = 0; b <= B; ++b) cu[size_t(b)] = int32_t(b * n);
  return cu;
}

// n uniform [-1, 1) elements of dtype t.
std::vector<uint8_t> random_elements(int64_t n, DType t, uint64_t seed) {
  std::vector<uint8_t> bytes(size_t(std::max<int64_t>(n, 1)) * dtype_size(t));
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) store_from_float(bytes.data(), t, i, float(2 * rng.uniform() - 1));
  return bytes;
}

// The problem's args over the given buffers (all in `mem`; the index arrays host or device alike).
DecodeArgs make_args(const Problem& p, int n, int64_t batch, int64_t cache_pages, void* q, void* o, float* lse, void* k,
                     void* v, const int32_t* pt, const int32_t* seq, const int32_t* cu, const int32_t* sel,
                     const int32_t* cnt, Memory mem) {
  DecodeArgs a;
  const int64_t T = batch * n;
  a.q = TokensView::packed(q, p.dtype, mem, T, p.Hq, p.D);
  a.o = TokensView::packed(o, p.dtype, mem, T, p.Hq, p.D);
  a.k = PagedCacheView::packed(k, p.dtype, mem, cache_pages, p.page, p.Hkv, p.D);
  a.v = PagedCacheView::packed(v, p.dtype, mem, cache_pages, p.page, p.Hkv, p.D);
  a.lse = lse;
  a.page_table = pt, a.seq_lens = seq, a.cu_seqlens_q = cu;
  a.sel_indices = sel, a.sel_counts = cnt, a.sel_kmax = p.kmax();
  a.batch = batch, a.max_pages = p.pages_per();
  a.index_memory = mem;
  return a;
}

// A generous bound that flags broken results (wrong pages, NaN leaks), not rounding.
double decode_tolerance(DType t) { return t == DType::bf16 ? 2e-2 : t == DType::f16 ? 5e-3 : 1e-5; }

// rel_error = ||O - ref|| / ||ref|| over the reference's tokens (inf for a non-finite O).
void check_o(const std::vector<uint8_t>& got, DType t, const DecodeReference& ref, BenchRow& row) {
  double num = 0, den = 0;
  bool bad = false;
  for (size_t i = 0; i < ref.o.size() && !bad; ++i) {
    const double g = load_as_float(got.data(), t, int64_t(i)), r = ref.o[i];
    bad = !std::isfinite(g);
    num += (g - r) * (g - r);
    den += r * r;
  }
  const double rel = bad ? std::numeric_limits<double>::infinity() : den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  row.figures["rel_error"] = rel;
  row.wrong = !(rel <= decode_tolerance(t));
}

BenchResult decode_result(const Problem& p, int n) {
  BenchResult r;
  r.label = p.label(n);
  r.figures = {"read_tbps", "x_floor", "rel_error", "kv_splits"};
  r.fields = {{"requests", p.B}, {"context", p.context}, {"new_tokens", n},    {"heads", p.Hq},
              {"kv_heads", p.Hkv}, {"dim", p.D},         {"page", p.page},     {"selected", p.selected},
              {"sel_kmax", p.kmax()}, {"pages_per_request", p.pages_per()}, {"dtype", to_string(p.dtype)},
              {"kv_bytes", p.kv_bytes()}};
  r.wrong_note = "WRONG: error above " + fmt_sci(decode_tolerance(p.dtype));
  return r;
}

struct Settings {
  std::vector<int> new_tokens;
  std::vector<std::string> only;
  int reps = 0, warmup = 0, threads = 0;
  uint64_t seed = 1;
};

// ---------------------------------------------------------------------------------------------
// CPU: every page its own values, the oracle over the whole batch.

BenchResult run_cpu(const Problem& p, int n, const Settings& s) {
  BenchResult r = decode_result(p, n);
  const int64_t pages = p.B * p.pages_per(), T = p.B * n, page_elems = p.page * p.Hkv * p.D;
  check_host_bytes("--requests " + std::to_string(p.B) + " --context " + std::to_string(p.context),
                   2.0 * double(pages * page_elems) * double(dtype_size(p.dtype)));
  const std::vector<uint8_t> k = random_elements(pages * page_elems, p.dtype, mix_seed(s.seed, 1));
  const std::vector<uint8_t> v = random_elements(pages * page_elems, p.dtype, mix_seed(s.seed, 2));
  const std::vector<uint8_t> q = random_elements(T * p.Hq * p.D, p.dtype, mix_seed(s.seed, 4 + uint64_t(n)));
  const Indices ix = make_indices(p, s.seed);
  const std::vector<int32_t> cu = cu_seqlens(p.B, n);
  std::vector<uint8_t> o(size_t(T * p.Hq * p.D) * dtype_size(p.dtype));
  std::vector<float> lse(size_t(T * p.Hq));
  const DecodeArgs a = make_args(p, n, p.B, pages, const_cast<uint8_t*>(q.data()), o.data(), lse.data(),
                                 const_cast<uint8_t*>(k.data()), const_cast<uint8_t*>(v.data()), ix.page_table.data(),
                                 ix.seq_lens.data(), cu.data(), ix.sel.data(), ix.counts.data(), Memory::host);
  const DecodeReference ref = decode_oracle(a);
  if (wanted(s.only, "cpu"))
    r.rows.push_back(measure_row("cpu", false, "", false, [&](BenchRow& row) {
      Options opt;
      opt.backend = Backend::cpu;
      opt.threads = s.threads;
      const DecodePlan plan_ = plan(a, opt);
      row.times_ms = timing::time_host([&] { run(plan_, a); }, s.warmup, s.reps);
      std::fill(o.begin(), o.end(), uint8_t(0xFF));  // NaN in every dtype: every element must be written
      run(plan_, a);
      check_o(o, p.dtype, ref, row);
    }));
  for (BenchRow& x : r.rows)
    if (x.ok()) x.figures["read_tbps"] = p.kv_bytes() / (x.median_ms * 1e-3) / 1e12;
  r.intro = {"", "== " + r.label, "   reference: fp64 decode oracle over every request; no read floor on the CPU"};
  return r;
}

// ---------------------------------------------------------------------------------------------
// GPU

struct DeviceCache {
  std::vector<DeviceBuffer> k, v;  // one per input set
  int64_t pages = 0;
};

// The cache on the device: a pool of random pages (its first `pool` pages) repeated over every
// physical page, then copied for each further input set. The pool is returned for the oracle.
DeviceCache make_cache(const Problem& p, int64_t pool, int sets, uint64_t seed, std::vector<uint8_t>& hk,
                       std::vector<uint8_t>& hv) {
  DeviceCache c;
  c.pages = p.B * p.pages_per();
  const size_t page_bytes = size_t(p.page * p.Hkv * p.D) * dtype_size(p.dtype), bytes = size_t(c.pages) * page_bytes;
  hk = random_elements(pool * p.page * p.Hkv * p.D, p.dtype, mix_seed(seed, 1));
  hv = random_elements(pool * p.page * p.Hkv * p.D, p.dtype, mix_seed(seed, 2));
  for (int set = 0; set < sets; ++set)
    for (auto* part : {&c.k, &c.v}) {
      part->emplace_back(bytes);
      uint8_t* d = static_cast<uint8_t*>(part->back().p);
      if (set > 0) {
        check_cuda(cudaMemcpy(d, (*part)[0].p, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy(cache copy)");
        continue;
      }
      const std::vector<uint8_t>& h = part == &c.k ? hk : hv;
      check_cuda(cudaMemcpy(d, h.data(), size_t(pool) * page_bytes, cudaMemcpyHostToDevice), "cudaMemcpy(cache)");
      for (int64_t pg = pool; pg < c.pages; pg += pool)
        check_cuda(cudaMemcpy(d + size_t(pg) * page_bytes, d, size_t(std::min(pool, c.pages - pg)) * page_bytes,
                              cudaMemcpyDeviceToDevice),
                   "cudaMemcpy(cache pages)");
    }
  return c;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& h) {
  DeviceBuffer d(h.size() * sizeof(T));
  d.upload(h.data(), d.bytes);
  return d;
}

BenchResult run_gpu(const Problem& p, int n, const Settings& s, const DeviceCache& cache, int64_t pool,
                    const std::vector<uint8_t>& hk, const std::vector<uint8_t>& hv, const Indices& ix,
                    const timing::ReadFloor& floor, const std::string& prefix, Progress& progress) {
  BenchResult r = decode_result(p, n);
  const int64_t T = p.B * n;
  const size_t es = dtype_size(p.dtype), o_bytes = size_t(T * p.Hq * p.D) * es;
  const std::vector<uint8_t> hq = random_elements(T * p.Hq * p.D, p.dtype, mix_seed(s.seed, 4 + uint64_t(n)));
  const std::vector<int32_t> cu = cu_seqlens(p.B, n);
  DeviceBuffer q = upload(hq), o(o_bytes), lse(size_t(T * p.Hq) * 4), pt = upload(ix.page_table),
               seq = upload(ix.seq_lens), dcu = upload(cu), sel = upload(ix.sel), cnt = upload(ix.counts);
  const int sets = int(cache.k.size());
  std::vector<DecodeArgs> args;
  for (int set = 0; set < sets; ++set)
    args.push_back(make_args(p, n, p.B, cache.pages, q.p, o.p, static_cast<float*>(lse.p), cache.k[size_t(set)].p,
                             cache.v[size_t(set)].p, static_cast<const int32_t*>(pt.p),
                             static_cast<const int32_t*>(seq.p), static_cast<const int32_t*>(dcu.p),
                             static_cast<const int32_t*>(sel.p), static_cast<const int32_t*>(cnt.p), Memory::device));
  validate(args[0], true);

  // The reference: the first two requests, their pages in the pool.
  progress.step(0, 1, prefix + "computing the fp64 decode oracle");
  const int64_t R = std::min<int64_t>(p.B, 2);
  std::vector<int32_t> pt_pool(ix.page_table.begin(), ix.page_table.begin() + R * p.pages_per());
  for (int32_t& x : pt_pool) x = int32_t(x % pool);
  std::vector<uint8_t> ho(size_t(R * n * p.Hq * p.D) * es);
  const DecodeArgs h = make_args(p, n, R, pool, const_cast<uint8_t*>(hq.data()), ho.data(), nullptr,
                                 const_cast<uint8_t*>(hk.data()), const_cast<uint8_t*>(hv.data()), pt_pool.data(),
                                 ix.seq_lens.data(), cu.data(), ix.sel.data(), ix.counts.data(), Memory::host);
  const DecodeReference ref = decode_oracle(h);
  progress.clear();

  std::vector<uint8_t> got(o_bytes);
  for (const char* variant : {"cuda_mma", "cuda"}) {
    if (!wanted(s.only, variant)) continue;
    progress.step(0, 1, prefix + "timing " + variant);
    r.rows.push_back(measure_row(variant, false, "", true, [&](BenchRow& row) {
      Options opt;
      opt.variant = variant;
      const DecodePlan plan_ = plan(args[0], opt);
      row.times_ms =
          timing::time_gpu([&](int set) { run(plan_, args[size_t(set)]); }, s.warmup, s.reps, sets);
      check_cuda(cudaMemset(o.p, 0xFF, o_bytes), "cudaMemset(poison the output)");
      run(plan_, args[0]);
      check_cuda(cudaDeviceSynchronize(), "checked run");
      o.download(got.data(), o_bytes);
      check_o(got, p.dtype, ref, row);
      row.figures["kv_splits"] = plan_.kv_splits();
    }));
    progress.clear();
  }
  BenchRow f;
  f.name = kFloorRow;
  f.times_ms = floor.times_ms;
  f.median_ms = floor.us * 1e-3;
  r.rows.push_back(f);
  for (BenchRow& x : r.rows)
    if (x.ok()) {
      x.figures["read_tbps"] = p.kv_bytes() / (x.median_ms * 1e-3) / 1e12;
      x.figures["x_floor"] = x.median_ms / f.median_ms;
    }
  r.intro = {"", "== " + r.label,
             strprintf("   selected K/V %.1f MB; %d input set(s); reference: fp64 decode oracle on the first %lld "
                       "request(s)",
                       p.kv_bytes() / 1e6, sets, (long long)R)};
  r.fields.update(Json{{"rotation_sets", sets}, {"floor_us", num(floor.us)}, {"reference_requests", R}});
  return r;
}

}  // namespace

int bench_decode_main(const std::vector<std::string>& argv) {
  Args args(argv, kDecodeSpecs);
  if (args.help()) {
    print_help("sparsek bench --op decode [flags]",
               "Times paged decode attention over a KV cache with top-k page selection (each KV head\n"
               "attends --selected of its request's pages, the newest always) and sets it against its\n"
               "floor: one read of the selected K and V pages by a streaming read kernel, timed in the\n"
               "same run (best of a few launch shapes, its inputs rotated out of L2). Each row is checked\n"
               "on a NaN-poisoned output against the fp64 decode oracle (on a GPU over the first two\n"
               "requests). Default on a GPU: 32 requests x 32768 tokens, Hq 32 / Hkv 8, D 128, bf16,\n"
               "pages of 64 tokens in shuffled physical order, 12.5% of pages, 1 and 4 new tokens per\n"
               "request; rows cuda_mma and cuda. Without a GPU (or with --backend cpu) it runs the CPU\n"
               "backend on 4 requests x 2048 tokens, Hq 8 / Hkv 2, f32, and says so (no read floor\n"
               "there). Exit code 1 when a row failed or gave a wrong result.",
               kDecodeSpecs);
    return 0;
  }
  if (args.str("--op", "decode") != "decode") args.bad("--op", "expected decode");
  const Backend backend = args.backend("--backend");
  const bool gpu = use_gpu(backend);
  Problem p;
  p.B = args.integer("--requests", gpu ? 32 : 4, 1, 1 << 20);
  p.context = args.integer("--context", gpu ? 32768 : 2048, 1, int64_t(1) << 26);
  p.Hq = args.integer("--heads", gpu ? 32 : 8, 1, 1024);
  const int64_t kv_default = p.Hq % (gpu ? 8 : 2) == 0 ? (gpu ? 8 : 2) : p.Hq;
  p.Hkv = args.integer("--kv-heads", kv_default, 1, 1024);
  if (p.Hq % p.Hkv)
    args.bad("--kv-heads", std::to_string(p.Hkv) + " does not divide --heads " + std::to_string(p.Hq));
  p.D = args.integer("--dim", 128, 1, 1024);
  if (p.D != 64 && p.D != 128) args.bad("--dim", "must be 64 or 128");
  p.page = args.integer("--page", 64, 1, 1024);
  if (p.page % 16 || p.page > 128) args.bad("--page", "must be a multiple of 16 in [16, 128]");
  p.selected = args.real("--selected", 0.125, 0.0, 1.0);
  const std::string dt = args.str("--dtype", "");
  if (dt == "e4m3") args.bad("--dtype", "decode attention runs bf16 and f16 (f32 on the CPU backend); no e4m3");
  p.dtype = args.dtype("--dtype", gpu ? DType::bf16 : DType::f32);
  if (gpu && p.dtype == DType::f32) args.bad("--dtype", "f32 runs on the CPU backend only (--backend cpu)");
  Settings s;
  for (const std::string& x : args.list("--new-tokens")) {
    char* end = nullptr;
    const long v = std::strtol(x.c_str(), &end, 10);
    if (*end || v < 1 || v > kDecodeMaxNewTokens)
      args.bad("--new-tokens", "'" + x + "': each count must be an integer in [1, " +
                                   std::to_string(kDecodeMaxNewTokens) + "]");
    if (v > p.context) args.bad("--new-tokens", "'" + x + "' new tokens exceed --context " + std::to_string(p.context));
    s.new_tokens.push_back(int(v));
  }
  if (s.new_tokens.empty()) {
    if (args.has("--new-tokens")) args.bad("--new-tokens", "needs at least one count");
    for (int v : {1, 4})
      if (v <= p.context) s.new_tokens.push_back(v);
  }
  s.only = args.list("--variants");
  for (const std::string& name : s.only) {
    if (name != "cuda_mma" && name != "cuda" && name != "cpu")
      args.bad("--variants", "unknown decode variant '" + name + "' (cuda_mma, cuda; cpu on the CPU backend)");
    if (gpu != (name != "cpu"))
      args.bad("--variants", "'" + name + "' runs on the " + (gpu ? "CPU backend (--backend cpu)" : "GPU") +
                                 ", but this run uses the " + (gpu ? "GPU" : "CPU backend"));
  }
  s.threads = int(args.integer("--threads", 0, 1, 4096));
  s.reps = int(args.integer("--reps", gpu ? 50 : 3, 1, 100000));
  s.warmup = int(args.integer("--warmup", gpu ? 5 : 1, 0, 100000));
  s.seed = args.seed("--seed", 1);
  JsonOutput json(args);  // an unwritable path fails before any work

  BenchRun run;
  run.op = "decode";
  run.gpu = gpu;
  run.threads = cpu_backend_threads(s.threads);
  run.reps = s.reps;
  run.warmup = s.warmup;
  run.seed = s.seed;
  run.units = "median_ms per call; read_tbps: the selected K/V bytes per second (10^12 B/s); x_floor: the "
              "time over the read floor's";
  std::vector<std::string> labels;
  for (int n : s.new_tokens) labels.push_back(p.label(n));
  Table t;
  t.name_header = "row";
  t.columns = {{"us", [](const BenchRow& x) { return fmt(x.median_ms * 1e3, 1); }},
               gpu ? fixed_column("TB/s (sel. K/V)", "read_tbps", 2) : fixed_column("GB/s (sel. K/V)", "read_tbps", 2, 1e3)};
  if (!gpu) {
    std::printf("%s; running the CPU backend, %d thread(s)\n",
                backend == Backend::cpu ? "--backend cpu" : ("no GPU found: " + device_info().why_not).c_str(),
                run.threads);
    t.columns.push_back(sci_column("rel err", "rel_error"));
    return run_workloads(
        labels, [&](size_t i, const std::string&) { return run_cpu(p, s.new_tokens[i], s); }, t, argv, run, json);
  }

  const DeviceInfo& info = device_info();
  std::printf("sparsek %s decode bench on %s (%d SMs), CUDA runtime %d, driver %d\n", version(), info.name.c_str(),
              info.sm_count, info.runtime_version, info.driver_version);
  std::printf("median of %d runs after %d warm-up runs, CUDA events (%s)\n", s.reps, s.warmup,
              timing::stream_held() ? "GPU time: the stream held until each batch is enqueued"
                                    : "SPARSEK_BENCH_GATE=off: runs timed as the host issues them");
  const double page_bytes = double(p.page * p.Hkv * p.D) * double(dtype_size(p.dtype));
  const double cache_bytes = 2.0 * double(p.B * p.pages_per()) * page_bytes;
  // Rotate whole caches where one fits twice in L2 (small problems): the floor's reads come from HBM too.
  const int sets = int(std::min<double>(8, std::max(1.0, std::ceil(2.0 * double(info.l2_bytes) / cache_bytes))));
  check_device_bytes("the decode cache (--requests x --context)", double(sets) * cache_bytes + 2.0 * p.kv_bytes());
  Progress progress(stdout_is_tty());
  progress.step(0, 1, "writing the cache");
  const int64_t pool = std::min<int64_t>(p.B * p.pages_per(), 64);
  std::vector<uint8_t> hk, hv;
  const DeviceCache cache = make_cache(p, pool, sets, s.seed, hk, hv);
  const Indices ix = make_indices(p, s.seed);
  progress.step(0, 1, "timing the read floor");
  const timing::ReadFloor floor = timing::read_floor(size_t(p.kv_bytes()), s.warmup, s.reps);
  progress.clear();
  std::printf("read floor: %.1f MB (the selected K/V pages) read once in %.1f us = %.2f TB/s (%d CTAs of 256 per "
              "SM, %d loads in flight, %d copies rotated)\n",
              p.kv_bytes() / 1e6, floor.us, p.kv_bytes() / floor.us / 1e6, floor.config.ctas_per_sm,
              floor.config.unroll, floor.copies);
  t.columns.push_back(fixed_column("x floor", "x_floor", 2));
  t.columns.push_back(sci_column("rel err", "rel_error"));
  return run_workloads(
      labels,
      [&](size_t i, const std::string& prefix) {
        return run_gpu(p, s.new_tokens[i], s, cache, pool, hk, hv, ix, floor, prefix, progress);
      },
      t, argv, run, json);
}

}  // namespace sparsek::cli
