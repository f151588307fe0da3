// The autotuner: every supporting variant of the backend is planned and run on the
// tuner's own random operands of the problem's shapes and pattern, checked against a reference,
// then timed (warm-up, median of repetitions, inputs rotated beyond L2 on the device).
#include "core/cuda_host.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>

#include "core/device.hpp"
#include "cpu/oracle.hpp"
#include "plan/plan_internal.hpp"
#include "sparsek/quantize.hpp"
#include "sparsek/tune.hpp"
#include "tune/tune_internal.hpp"

namespace sparsek {

namespace {

// Above this many effective FLOPs the fp64 oracle (on the host) would take longer than the
// tuning itself; the default variant's output is the reference instead.
constexpr double kOracleMaxFlops = 1e9;

// ---- owned buffers ----

struct HostBuf {
  void* p = nullptr;
  size_t bytes = 0;
  HostBuf() = default;
  explicit HostBuf(size_t n) : bytes(n) {
    p = std::aligned_alloc(64, (std::max<size_t>(n, 64) + 63) / 64 * 64);
    if (!p) throw Error(Status::internal, "tuner: out of host memory (" + std::to_string(n) + " bytes)");
  }
  HostBuf(HostBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  HostBuf& operator=(HostBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~HostBuf() { std::free(p); }
};

struct DevBuf {
  void* p = nullptr;
  DevBuf() = default;
  explicit DevBuf(size_t n) { check_cuda(cudaMalloc(&p, std::max<size_t>(n, 256)), "cudaMalloc (tuner operands)"); }
  DevBuf(DevBuf&& o) noexcept : p(o.p) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
};

// Fast seeded uniform [-1, 1): splitmix64. Never all zero.
void fill_random(void* p, DType t, int64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (int64_t i = 0; i < n; ++i) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    store_from_float(p, t, i, 2.f * u - 1.f);
  }
}
void fill_nan(void* p, DType t, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_from_float(p, t, i, std::numeric_limits<float>::quiet_NaN());
}

int64_t dense_elems(const DenseView& d) {
  int64_t major = d.layout == Layout::row_major ? d.rows : d.cols;
  return std::max<int64_t>(major, 1) * d.ld;
}

// The tuner's operands: the problem's shapes, layouts, leading dimensions, dtypes and pattern,
// with its own random values. Device workloads hold `copies` copies of every value buffer (the
// pattern is shared, as in real use) so that consecutive runs do not find their data in L2.
class Workload {
 public:
  Workload(const GemmArgs& problem, const HostPattern& hp, Backend be, uint64_t seed) : g_(problem), be_(be) {
    const BsrView& s = problem.sparse;
    rp_.assign(hp.row_ptr, hp.row_ptr + s.mb() + 1);
    if (s.nnzb > 0) ci_.assign(hp.col_idx, hp.col_idx + s.nnzb);
    // Slot 0 = sparse values, 1..3 = dense a, b, c (unused slots: 0 elements).
    elems_[0] = s.nnzb * s.bm * s.bk;
    dtype_[0] = s.dtype;
    const DenseView* d[3] = {&problem.a, &problem.b, &problem.c};
    for (int i = 0; i < 3; ++i) {
      bool used = (i == 0 && problem.kind != OpKind::dsd) || (i == 1 && problem.kind != OpKind::dds) ||
                  (i == 2 && problem.kind != OpKind::sdd);
      elems_[i + 1] = used ? dense_elems(*d[i]) : 0;
      dtype_[i + 1] = d[i]->dtype;
    }
    out_ = problem.kind == OpKind::sdd ? 0 : 3;
    // e4m3 inputs: scales of 1 (the random values are the codes' values), shared by the copies
    // like the pattern. The dense input's are sized by its role (scale_count).
    if (s.dtype == DType::e4m3) sparse_scales_.assign(size_t(s.nnzb), 1.f);
    if (const DenseView* d = scaled_dense(problem))
      dense_scales_.assign(size_t(problem.kind == OpKind::dsd ? scale_count(d->cols, d->rows, d->scale_group)
                                                              : scale_count(d->rows, d->cols, d->scale_group)),
                           1.f);
    for (int i = 0; i < 4; ++i) {
      host_[i] = HostBuf(bytes(i));
      if (i == out_) {
        // The output's initial contents: read only when beta != 0; poison otherwise.
        if (problem.beta != 0.f) fill_random(host_[i].p, dtype_[i], elems_[i], seed + 100 + i);
        else fill_nan(host_[i].p, dtype_[i], elems_[i]);
      } else {
        fill_random(host_[i].p, dtype_[i], elems_[i], seed + i);
      }
    }
    if (be_ == Backend::cpu) return;  // the CPU just repeats on the same buffers

    size_t ws = 0;
    for (int i = 0; i < 4; ++i) ws += bytes(i);
    // NOTE: rotate through enough copies that ~2.5x L2 lies between two uses of the same bytes;
    // never more than a quarter of free memory or 64 copies.
    const double l2 = double(std::max<size_t>(device_info().l2_bytes, 1 << 20));
    size_t free_b = 0, total_b = 0;
    check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    int copies = int(std::ceil(2.5 * l2 / double(std::max<size_t>(ws, 1))));
    copies = std::clamp(copies, 2, 64);
    while (copies > 1 && double(copies) * double(ws) > 0.25 * double(free_b)) --copies;
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&drp_), rp_.size() * 4), "cudaMalloc (tuner row_ptr)");
    check_cuda(cudaMemcpy(drp_, rp_.data(), rp_.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy (tuner row_ptr)");
    if (!ci_.empty()) {
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&dci_), ci_.size() * 4), "cudaMalloc (tuner col_idx)");
      check_cuda(cudaMemcpy(dci_, ci_.data(), ci_.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy (tuner col_idx)");
    }
    for (auto [host, dev] : {std::pair{&sparse_scales_, &d_sparse_scales_}, std::pair{&dense_scales_, &d_dense_scales_}})
      if (!host->empty()) {
        check_cuda(cudaMalloc(reinterpret_cast<void**>(dev), host->size() * 4), "cudaMalloc (tuner scales)");
        check_cuda(cudaMemcpy(*dev, host->data(), host->size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy (tuner scales)");
      }
    dev_.resize(size_t(copies));
    for (auto& c : dev_)
      for (int i = 0; i < 4; ++i) {
        if (!elems_[i]) continue;
        c[i] = DevBuf(bytes(i));
        check_cuda(cudaMemcpy(c[i].p, host_[i].p, bytes(i), cudaMemcpyHostToDevice), "cudaMemcpy (tuner operands)");
      }
  }
  ~Workload() {
    if (drp_) cudaFree(drp_);
    if (dci_) cudaFree(dci_);
    if (d_sparse_scales_) cudaFree(d_sparse_scales_);
    if (d_dense_scales_) cudaFree(d_dense_scales_);
  }
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  int copies() const { return be_ == Backend::cpu ? 1 : int(dev_.size()); }

  // The problem with copy r's pointers.
  GemmArgs args(int r) const {
    GemmArgs g = g_;
    void* p[4];
    for (int i = 0; i < 4; ++i) p[i] = be_ == Backend::cpu ? host_[i].p : dev_[size_t(r)][i].p;
    g.sparse.row_ptr = be_ == Backend::cpu ? rp_.data() : drp_;
    g.sparse.col_idx = g.sparse.nnzb == 0 ? nullptr : be_ == Backend::cpu ? ci_.data() : dci_;
    g.sparse.values = g.sparse.nnzb == 0 ? nullptr : p[0];
    DenseView* d[3] = {&g.a, &g.b, &g.c};
    for (int i = 0; i < 3; ++i)
      if (elems_[i + 1]) d[i]->data = p[i + 1];
    set_scales(g, be_ == Backend::cpu ? sparse_scales_.data() : d_sparse_scales_,
               be_ == Backend::cpu ? dense_scales_.data() : d_dense_scales_);
    return g;
  }
  // Host operands with the output's initial contents (for the oracle).
  GemmArgs host_args() {
    GemmArgs g = g_;
    g.sparse.row_ptr = rp_.data();
    g.sparse.col_idx = ci_.empty() ? nullptr : ci_.data();
    g.sparse.values = g.sparse.nnzb == 0 ? nullptr : host_[0].p;
    g.sparse.memory = Memory::host;
    DenseView* d[3] = {&g.a, &g.b, &g.c};
    for (int i = 0; i < 3; ++i) {
      d[i]->memory = Memory::host;
      if (elems_[i + 1]) d[i]->data = host_[i + 1].p;
    }
    set_scales(g, sparse_scales_.data(), dense_scales_.data());
    return g;
  }
  // Restores copy 0's output to its initial contents (random when beta != 0, else NaN).
  void reset_output(void* stream) {
    if (!elems_[out_]) return;
    if (be_ == Backend::cpu) {
      if (!saved_out_.p) {
        saved_out_ = HostBuf(bytes(out_));
        std::memcpy(saved_out_.p, host_[out_].p, bytes(out_));
      }
      std::memcpy(host_[out_].p, saved_out_.p, bytes(out_));
    } else {
      check_cuda(cudaMemcpyAsync(dev_[0][out_].p, host_[out_].p, bytes(out_), cudaMemcpyHostToDevice,
                                 static_cast<cudaStream_t>(stream)),
                 "cudaMemcpyAsync (tuner output reset)");
    }
  }
  // Copy 0's output as doubles in the oracle's order (dsd/dds: M*N row-major; sdd: nnzb*bm*bk).
  std::vector<double> output(void* stream) {
    const void* src = host_[out_].p;
    HostBuf tmp;
    if (be_ == Backend::cuda) {
      check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize (tuner)");
      tmp = HostBuf(bytes(out_));
      check_cuda(cudaMemcpy(tmp.p, dev_[0][out_].p, bytes(out_), cudaMemcpyDeviceToHost), "cudaMemcpy (tuner output)");
      src = tmp.p;
    }
    std::vector<double> out;
    if (g_.kind == OpKind::sdd) {
      out.resize(size_t(elems_[0]));
      for (int64_t i = 0; i < elems_[0]; ++i) out[size_t(i)] = load_as_float(src, dtype_[0], i);
    } else {
      const DenseView& c = g_.c;
      out.resize(size_t(c.rows * c.cols));
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t col = 0; col < c.cols; ++col)
          out[size_t(r * c.cols + col)] = load_as_float(src, c.dtype, c.index(r, col));
    }
    return out;
  }

 private:
  // The dense input that carries scales (an e4m3 DSD's B or DDS's A), or null.
  static const DenseView* scaled_dense(const GemmArgs& g) {
    const DenseView* d = g.kind == OpKind::dsd ? &g.b : g.kind == OpKind::dds ? &g.a : nullptr;
    return d && d->dtype == DType::e4m3 ? d : nullptr;
  }
  void set_scales(GemmArgs& g, const float* sparse, const float* dense) const {
    if (!sparse_scales_.empty()) g.sparse.scales = sparse;
    if (!dense_scales_.empty()) (g.kind == OpKind::dsd ? g.b : g.a).scales = dense;
  }
  size_t bytes(int i) const { return size_t(elems_[i]) * dtype_size(dtype_[i]); }
  GemmArgs g_;
  Backend be_;
  std::vector<int32_t> rp_, ci_;
  int32_t* drp_ = nullptr;
  int32_t* dci_ = nullptr;
  int64_t elems_[4] = {};
  DType dtype_[4] = {};
  int out_ = 3;
  HostBuf host_[4];
  HostBuf saved_out_;
  std::vector<std::array<DevBuf, 4>> dev_;
  std::vector<float> sparse_scales_, dense_scales_;  // e4m3 inputs only
  float* d_sparse_scales_ = nullptr;
  float* d_dense_scales_ = nullptr;
};

// max |got - ref| / max |ref| (max |ref| = 0: absolute); infinite when got holds a NaN/Inf.
double rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double scale = 0, err = 0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  if (scale == 0) scale = 1;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(got[i] - ref[i]));
  }
  return err / scale;
}

// Relative to max |ref|: fp32 accumulation over K plus the output's rounding.
double tolerance(const GemmArgs& g) {
  DType out = g.kind == OpKind::sdd ? g.sparse.dtype : g.c.dtype;
  switch (out) {
    case DType::f32: return 1e-3;
    case DType::f16: return 5e-3;
    case DType::bf16: return 2e-2;
    case DType::e4m3: break;  // not an output dtype
  }
  return 1e-3;
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

struct Stream {
  cudaStream_t s = nullptr;
  explicit Stream(bool device) {
    if (device) check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate (tuner)");
  }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
};

struct Events {
  std::vector<cudaEvent_t> ev;
  explicit Events(size_t n) {
    ev.resize(n, nullptr);
    for (auto& e : ev) check_cuda(cudaEventCreate(&e), "cudaEventCreate (tuner)");
  }
  ~Events() {
    for (auto e : ev)
      if (e) cudaEventDestroy(e);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Warm-up, then the median of repeated timings in milliseconds.
double time_candidate(const Plan& p, Workload& w, Backend be, cudaStream_t stream, const TuneOptions& to) {
  using clock = std::chrono::steady_clock;
  const int R = w.copies();
  std::vector<GemmArgs> args;
  for (int r = 0; r < R; ++r) args.push_back(w.args(r));
  int i = 0;
  auto t0 = clock::now();
  const int warm = std::max(1, to.warmup);
  for (int k = 0; k < warm; ++k) run(p, args[size_t(i++ % R)], stream);
  if (be == Backend::cuda) check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (tuner warm-up)");
  double est_s = std::chrono::duration<double>(clock::now() - t0).count() / warm;
  int reps = est_s > 0 ? int(to.seconds_per_candidate / est_s) : to.max_reps;
  reps = std::clamp(reps, std::max(1, to.min_reps), std::max(1, std::max(to.min_reps, to.max_reps)));
  std::vector<double> ms(static_cast<size_t>(reps));
  if (be == Backend::cpu) {
    for (int k = 0; k < reps; ++k) {
      auto a = clock::now();
      run(p, args[size_t(i++ % R)], stream);
      ms[size_t(k)] = std::chrono::duration<double, std::milli>(clock::now() - a).count();
    }
  } else {
    Events ev(size_t(2 * reps));
    for (int k = 0; k < reps; ++k) {
      check_cuda(cudaEventRecord(ev.ev[size_t(2 * k)], stream), "cudaEventRecord");
      run(p, args[size_t(i++ % R)], stream);
      check_cuda(cudaEventRecord(ev.ev[size_t(2 * k + 1)], stream), "cudaEventRecord");
    }
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (tuner)");
    for (int k = 0; k < reps; ++k) {
      float t = 0;
      check_cuda(cudaEventElapsedTime(&t, ev.ev[size_t(2 * k)], ev.ev[size_t(2 * k + 1)]), "cudaEventElapsedTime");
      ms[size_t(k)] = t;
    }
  }
  return median(ms);
}

}  // namespace

namespace tune_detail {
const TuneCandidate* pick_winner(const std::vector<TuneCandidate>& cands, const std::string& default_variant,
                                 double margin) {
  const TuneCandidate* best = nullptr;
  const TuneCandidate* dflt = nullptr;
  for (const TuneCandidate& c : cands) {
    if (!c.correct) continue;
    if (c.variant == default_variant) dflt = &c;
    if (!best || c.median_ms < best->median_ms) best = &c;
  }
  // The default stays unless another correct candidate beats it by more than the margin; a
  // default that failed or was wrong loses to any correct candidate.
  if (dflt && best != dflt && !(dflt->median_ms > best->median_ms * (1.0 + margin))) return dflt;
  return best;
}
}  // namespace tune_detail

TuneReport tune(const GemmArgs& problem_in, const Options& options, const TuneOptions& to) {
  // Only the shapes, layouts, dtypes and the pattern are used: null value / dense pointers get an
  // aligned stand-in address (never dereferenced) so that the checks and why_not() see a
  // well-aligned operand.
  alignas(256) static unsigned char stand_in[256];
  GemmArgs problem = problem_in;
  if (!problem.sparse.values) problem.sparse.values = stand_in;
  for (DenseView* d : {&problem.a, &problem.b, &problem.c}) {
    if (!d->data) d->data = stand_in;
    if (d->dtype == DType::e4m3 && !d->scales) d->scales = reinterpret_cast<const float*>(stand_in);
  }
  if (problem.sparse.dtype == DType::e4m3 && !problem.sparse.scales)
    problem.sparse.scales = reinterpret_cast<const float*>(stand_in);
  validate_description(problem, false);  // the stand-ins share an address: no aliasing check
  const Backend be = resolve_backend(problem, options);
  HostPattern hp = host_pattern(problem.sparse, true, options.stream);
  validate_pattern(problem, hp, /*check_scales=*/false);  // the workload brings its own
  const PatternStats st = pattern_stats(hp.row_ptr, problem.sparse.mb());

  TuneReport rep;
  rep.entry.key = tune_key(problem, st, be, options.threads);
  std::string reasons;
  const Variant* def = heuristic_variant(problem, be, &reasons);

  Workload w(problem, hp, be, to.seed);
  const GemmArgs g0 = w.args(0);
  std::vector<const Variant*> cands;
  for (const Variant& v : variants())
    if (v.backend == be && v.why_not(problem).empty() && v.why_not(g0).empty()) cands.push_back(&v);
  if (cands.empty()) throw Error(Status::unsupported, "tune: no variant supports this problem" + reasons);
  // The default goes first: its output may be the reference for the others.
  if (def) {
    auto it = std::find(cands.begin(), cands.end(), def);
    if (it != cands.end()) std::rotate(cands.begin(), it, it + 1);
  }

  Stream stream(be == Backend::cuda);
  std::vector<double> ref;
  double tol = tolerance(problem);
  if (problem.effective_flops() <= kOracleMaxFlops) {
    ref = oracle(w.host_args());
    rep.reference = "oracle (fp64)";
  }

  Options po;
  po.backend = be;
  po.threads = options.threads;
  for (size_t ci = 0; ci < cands.size(); ++ci) {
    const Variant& v = *cands[ci];
    if (to.progress) to.progress(ci, cands.size(), v.name);
    TuneCandidate c;
    c.variant = v.name;
    try {
      po.variant = v.name;
      Plan p = plan(g0, po);
      w.reset_output(stream.s);
      run(p, g0, stream.s);
      std::vector<double> got = w.output(stream.s);
      if (ref.empty()) {  // too large for the oracle: the first variant that runs is the reference
        ref = std::move(got);
        rep.reference = std::string(&v == def ? "default variant " : "variant ") + v.name;
        tol *= 2;  // both sides carry rounding now
        c.error = 0;
      } else {
        c.error = rel_error(got, ref);
      }
      c.ran = true;
      c.correct = c.error <= tol;
      if (!c.correct) {
        c.note = "wrong result: error " + std::to_string(c.error) + " > tolerance " + std::to_string(tol) + " vs " +
                 rep.reference;
      } else {
        c.median_ms = time_candidate(p, w, be, stream.s, to);
      }
    } catch (const std::exception& e) {
      c.note = e.what();
      if (be == Backend::cuda) cudaGetLastError();  // do not let one candidate's error hit the next
    }
    rep.candidates.push_back(c);
  }
  if (to.progress) to.progress(cands.size(), cands.size(), "");

  const TuneCandidate* win = tune_detail::pick_winner(rep.candidates, def ? def->name : "", to.margin);
  if (!win) {
    std::string notes;
    for (const TuneCandidate& c : rep.candidates) notes += "; " + c.variant + ": " + c.note;
    throw Error(Status::internal, "tune: no candidate produced a correct result" + notes);
  }
  const TuneCandidate* dflt = nullptr;
  for (const TuneCandidate& c : rep.candidates)
    if (c.correct && def && c.variant == def->name) dflt = &c;
  rep.speedup = dflt && win->median_ms > 0 ? dflt->median_ms / win->median_ms : 1.0;

  TuneEntry& e = rep.entry;
  e.variant = win->variant;
  e.time_ms = win->median_ms;
  e.default_variant = def ? def->name : "";
  e.default_ms = dflt ? dflt->median_ms : 0;
  for (const TuneCandidate& c : rep.candidates)
    if (c.correct) e.candidates.emplace_back(c.variant, c.median_ms);
  e.created = now_utc();

  if (to.store) {
    std::string path = to.cache_path.empty() ? tune_cache_path() : to.cache_path;
    if (path.empty()) {
      rep.store_error = "no cache path: set SPARSEK_CACHE or HOME";
    } else {
      try {
        TuneCache(path).store(e);
        rep.stored = true;
      } catch (const Error& err) {
        rep.store_error = err.what();
      }
    }
  }
  return rep;
}

}  // namespace sparsek
