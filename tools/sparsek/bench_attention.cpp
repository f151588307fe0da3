// `sparsek bench --op attention [--backward]`: the block-sparse attention forward (or backward)
// of every variant that supports a workload, on a seeded random layout, in one process.
//
// Per workload: random q, k, v in [-1, 1), a layout (top-k: each query block keeps
// round(density * Nk) random key blocks; dense; causal), then per variant a run on a NaN-poisoned
// O and LSE checked against the fp64 reference on a sample of query rows, then the timing: median
// of --reps runs after --warmup (GPU: CUDA events, input sets rotated so the working set exceeds
// 2x L2; CPU: wall clock). Effective FLOPs = 4 * D * unmasked score elements.
// --backward: O and LSE from a forward run, dO random in [-1, 1); per backward variant a run on
// NaN-poisoned dq, dk, dv checked against the fp64 backward reference on sampled query rows (dq)
// and sampled key blocks (dk, dv), then the timing. Effective FLOPs = 2.5 x the forward's
// (FlashAttention's convention).
#include "core/cuda_host.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "tools_internal.hpp"

namespace sparsek::cli {

namespace {

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
    {"--backward", nullptr, "time the backward (dq, dk, dv from dO) instead; effective FLOPs 2.5 x the forward's"},
    {"--layout", "NAME", "topk | dense | causal (default topk; causal = every block j <= i, implies --causal)"},
    {"--dtype", "T", "bf16 | f16 | f32 (default bf16 on a GPU, f32 on the CPU)"},
    {"--reps", "R", "timed repetitions, the median is reported (default 20 GPU, 3 CPU)"},
    kWarmupFlag,
    {"--variants", "a,b", "only these variants"},
    kBackendFlag,
    kJsonFlag,
    {"--seed", "S", "random seed of layouts and values (default 1)"},
    {"--seqlens", "n1,n2,..", "packed sequences (varlen) of these lengths in one batch row; the layout is per sequence"},
};

struct Workload {
  int64_t batch = 1, heads = 16, kv_heads = 16, seq = 16384;
  int dim = 128, block = 128;
  double density = 0.125;
  LayoutKind layout = LayoutKind::topk;
  bool causal = false;
  DType dtype = DType::bf16;
  std::vector<int64_t> seqlens;  // packed sequences (batch 1, seq = their sum); empty: none
};

std::string label(const Workload& w) {
  std::string s = "B" + std::to_string(w.batch) + " H" + std::to_string(w.heads);
  if (!w.seqlens.empty()) s = std::to_string(w.seqlens.size()) + " packed seqs H" + std::to_string(w.heads);
  if (w.kv_heads != w.heads) s += "/" + std::to_string(w.kv_heads);
  s += " S" + std::to_string(w.seq) + " D" + std::to_string(w.dim) + " " + block_str(w.block, w.block) + " " +
       to_string(w.layout);
  if (w.layout == LayoutKind::topk) s += " " + fmt(100.0 * w.density, 2) + "%";
  if (w.causal && w.layout != LayoutKind::causal) s += " causal";
  return s + " " + to_string(w.dtype);
}

// A row's figures (BenchRow::figures), in the order the JSON writes them: the max |error| of O and
// LSE; with --backward (they stay null) the max |error| / rms of the reference of dq, dk and dv.
const std::vector<std::string> kForward = {"max_abs_error_o", "max_abs_error_lse"};
const std::vector<std::string> kBackward = {"max_abs_error_o", "max_abs_error_lse", "max_error_over_rms_dq",
                                            "max_error_over_rms_dk", "max_error_over_rms_dv"};

// What a workload reports beside its rows.
struct Measured {
  double kept = 0;  // attended key blocks / all (query block, key block) pairs
  int sets = 1;
  int64_t checked_rows = 0, checked_key_blocks = 0;
  std::string unchecked;  // --backward: what the check had to leave out, and why
};

// Max |error| of O and of LSE that only flags broken results (wrong indexing, masks, NaN leaks),
// not rounding: O's elements are averages of V's, in [-1, 1].
double tolerance(DType t) { return t == DType::bf16 ? 3e-2 : t == DType::f16 ? 5e-3 : 1e-4; }

// The problem on the host (the layout and q, k, v; o and lse are host buffers for the CPU runs;
// with --backward also dO and host dq, dk, dv).
struct HostProblem {
  HostMatrix q, k, v, o;
  std::vector<float> lse;
  LayoutArrays layout;
  std::vector<int32_t> cu_seqlens;  // packed sequences (else empty)
  AttentionArgs args;
  HostMatrix dout, dq, dk, dv;
  AttentionBackwardArgs bargs;
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
  if (!w.seqlens.empty()) {
    p->cu_seqlens.assign(1, 0);
    for (int64_t n : w.seqlens) p->cu_seqlens.push_back(int32_t(p->cu_seqlens.back() + n));
  }
  // One layout row per key/value head (what a gate makes; GQA heads of a group share it); packed
  // sequences: within each query block's sequences, density of their blocks.
  p->layout = random_attention_layout(w.layout, w.batch, w.kv_heads, w.seq, w.seq, w.block, w.density, w.causal,
                                      mix_seed(seed, 4), p->cu_seqlens);
  AttentionArgs& a = p->args;
  a.q = packed(p->q, w.batch, w.heads, w.seq, w.dim);
  a.k = packed(p->k, w.batch, w.kv_heads, w.seq, w.dim);
  a.v = packed(p->v, w.batch, w.kv_heads, w.seq, w.dim);
  a.o = packed(p->o, w.batch, w.heads, w.seq, w.dim);
  a.lse = p->lse.data();
  a.layout = p->layout.view();
  a.causal = w.causal || w.layout == LayoutKind::causal;
  if (!p->cu_seqlens.empty()) {
    a.cu_seqlens = p->cu_seqlens.data();
    a.num_seqs = int64_t(w.seqlens.size());
  }
  validate(a, true);
  return p;
}

void add_backward(HostProblem& p, const Workload& w, uint64_t seed) {
  const int64_t qrows = w.batch * w.heads * w.seq, kvrows = w.batch * w.kv_heads * w.seq;
  p.dout = HostMatrix(qrows, w.dim, w.dtype, Layout::row_major, 0);
  p.dout.fill_random(mix_seed(seed, 6), false);
  p.dq = HostMatrix(qrows, w.dim, w.dtype, Layout::row_major, 0);
  p.dk = HostMatrix(kvrows, w.dim, w.dtype, Layout::row_major, 0);
  p.dv = HostMatrix(kvrows, w.dim, w.dtype, Layout::row_major, 0);
  AttentionBackwardArgs& b = p.bargs;
  b.forward = p.args;
  b.dout = packed(p.dout, w.batch, w.heads, w.seq, w.dim);
  b.dq = packed(p.dq, w.batch, w.heads, w.seq, w.dim);
  b.dk = packed(p.dk, w.batch, w.kv_heads, w.seq, w.dim);
  b.dv = packed(p.dv, w.batch, w.kv_heads, w.seq, w.dim);
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
             BenchRow& row) {
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
  row.figures["max_abs_error_o"] = eo;
  row.figures["max_abs_error_lse"] = el;
  row.wrong = !(eo <= tolerance(w.dtype) && el <= tolerance(w.dtype));
}

// ---- the backward's check: dq of sampled query rows, dk and dv of sampled key blocks ----

struct KeyBlock {
  int64_t b, hk, j;
};
struct BwdReference {
  std::vector<Sample> rows;  // dq, mag_dq: [rows][D]
  std::vector<double> dq, mag_dq;
  std::vector<KeyBlock> blocks;  // dk, dv, mags: [blocks][block][D] (rows past Skv: 0)
  std::vector<double> dk, dv, mag_dk, mag_dv;
};

// The reference of a key block costs (rows attending it) x (their keys) x D: every such row's
// softmax is recomputed. Blocks above this many row-key products are left out of the check.
constexpr double kKeyBlockBudget = 1e7;

BwdReference backward_reference(const HostProblem& p, const Workload& w, uint64_t seed, std::string& unchecked) {
  BwdReference ref;
  const AttentionArgs& a = p.args;
  const size_t D = size_t(w.dim);
  // dq: 8 rows of each sampled head (the forward's sample, thinned: a backward row costs more).
  const std::vector<Sample> all = sample_rows(w, seed);
  for (size_t i = 0; i < all.size(); i += 4) ref.rows.push_back(all[i]);
  ref.dq.resize(ref.rows.size() * D);
  ref.mag_dq.resize(ref.rows.size() * D);
  for (size_t i = 0; i < ref.rows.size(); ++i)
    attention_backward_oracle_row(a, p.bargs.dout, ref.rows[i].b, ref.rows[i].h, ref.rows[i].s, &ref.dq[i * D],
                                  &ref.mag_dq[i * D]);
  // dk, dv: the first key block of the first head and a random block of the last one.
  Rng rng(mix_seed(seed, 7));
  const int64_t nk = (w.seq + w.block - 1) / w.block;
  const HostLayout hl = host_layout(a.layout);
  int skipped = 0;
  for (KeyBlock kb : {KeyBlock{0, 0, 0}, KeyBlock{w.batch - 1, w.kv_heads - 1, rng.below(nk)}}) {
    // Cost: the layout rows of the group naming the block, times their keys.
    double cost = 0;
    const int64_t G = w.heads / w.kv_heads;
    for (int64_t h = kb.hk * G; h < (kb.hk + 1) * G; ++h)
      for (int64_t i = 0; i < a.layout.q_blocks; ++i) {
        const int64_t r = layout_row(a.layout, w.heads, w.kv_heads, kb.b, h, i);
        int64_t n = hl.num[r], named = 0;
        for (int64_t x = 0; x < hl.num[r]; ++x) named += hl.idx[r * a.layout.kmax + x] == kb.j;
        if (a.layout.has_full()) {
          n += hl.full_num[r];
          for (int64_t x = 0; x < hl.full_num[r]; ++x) named += hl.full_idx[r * a.layout.full_kmax + x] == kb.j;
        }
        if (named) cost += double(w.block) * double(n * w.block) * double(w.dim);
      }
    if (cost > kKeyBlockBudget * double(w.dim)) {
      ++skipped;
      continue;
    }
    const size_t at = ref.blocks.size() * size_t(w.block) * D, n = size_t(w.block) * D;
    for (auto* v : {&ref.dk, &ref.dv, &ref.mag_dk, &ref.mag_dv}) v->resize(at + n, 0.0);
    attention_backward_oracle_key_block(a, p.bargs.dout, kb.b, kb.hk, kb.j, &ref.dk[at], &ref.dv[at], &ref.mag_dk[at],
                                        &ref.mag_dv[at]);
    ref.blocks.push_back(kb);
  }
  if (skipped)
    unchecked = std::to_string(skipped) + " sampled key block(s) of dk and dv left unchecked: more than " +
                fmt_sci(kKeyBlockBudget) + " row-key products each in the fp64 reference";
  return ref;
}

// Error of got against ref over a set of elements: counts those outside
// tol * (|ref| + rms(ref)) + u * mag (u: the dtype's unit roundoff, mag: the terms' magnitudes, the
// first-order rounding bound of P and dS in the dtype), and returns max |error| / rms(ref).
struct ErrorTally {
  std::vector<double> got, ref, mag;
  double max_over_rms(DType t, int64_t* fails) const {
    if (ref.empty()) return kNaN;  // nothing checked
    double ss = 0;
    for (double r : ref) ss += r * r;
    const double rms = ref.empty() ? 0 : std::sqrt(ss / double(ref.size()));
    const double tol = t == DType::bf16 ? 2e-2 : t == DType::f16 ? 1e-2 : 1e-5;
    const double u = t == DType::bf16 ? 0x1p-8 : t == DType::f16 ? 0x1p-11 : 0x1p-24;
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double err = std::fabs(got[i] - ref[i]);
      if (!(err <= tol * (std::fabs(ref[i]) + rms) + u * mag[i])) ++*fails;  // NaN fails
      worst = std::isfinite(got[i]) ? std::max(worst, err / (rms > 0 ? rms : 1)) : kNaN;
      if (std::isnan(worst)) break;
    }
    return worst;
  }
};

// Compares a run's packed dq, dk, dv (bytes in w.dtype) with the reference.
void compare_backward(const BwdReference& ref, const Workload& w, const std::vector<uint8_t>& dq,
                      const std::vector<uint8_t>& dk, const std::vector<uint8_t>& dv, BenchRow& row) {
  const int64_t D = w.dim;
  ErrorTally tq, tk, tv;
  for (size_t i = 0; i < ref.rows.size(); ++i) {
    const Sample& r = ref.rows[i];
    const int64_t base = ((r.b * w.heads + r.h) * w.seq + r.s) * D;
    for (int64_t d = 0; d < D; ++d) {
      tq.got.push_back(load_as_float(dq.data(), w.dtype, base + d));
      tq.ref.push_back(ref.dq[i * size_t(D) + size_t(d)]);
      tq.mag.push_back(ref.mag_dq[i * size_t(D) + size_t(d)]);
    }
  }
  for (size_t i = 0; i < ref.blocks.size(); ++i) {
    const KeyBlock& kb = ref.blocks[i];
    for (int64_t key = kb.j * w.block; key < std::min(w.seq, (kb.j + 1) * w.block); ++key)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t at = ((kb.b * w.kv_heads + kb.hk) * w.seq + key) * D + d;
        const size_t x = (i * size_t(w.block) + size_t(key - kb.j * w.block)) * size_t(D) + size_t(d);
        tk.got.push_back(load_as_float(dk.data(), w.dtype, at));
        tk.ref.push_back(ref.dk[x]);
        tk.mag.push_back(ref.mag_dk[x]);
        tv.got.push_back(load_as_float(dv.data(), w.dtype, at));
        tv.ref.push_back(ref.dv[x]);
        tv.mag.push_back(ref.mag_dv[x]);
      }
  }
  int64_t fails = 0;
  row.figures["max_error_over_rms_dq"] = tq.max_over_rms(w.dtype, &fails);
  row.figures["max_error_over_rms_dk"] = tk.max_over_rms(w.dtype, &fails);
  row.figures["max_error_over_rms_dv"] = tv.max_over_rms(w.dtype, &fails);
  row.wrong = fails > 0;
}

// One workload being measured: its host problem, the reference rows (with --backward: of the
// backward, in bref), and what its result reports.
struct Job {
  std::unique_ptr<HostProblem> p;
  Reference ref;
  BwdReference bref;
  Measured m;
  BenchResult r;
};

Job prepare(const Workload& w, uint64_t seed, bool backward, Progress& progress, const std::string& prefix) {
  Job j;
  j.r.label = label(w);
  j.r.figures = backward ? kBackward : kForward;
  progress.update(prefix + "generating inputs ...");
  j.p = make_problem(w, seed);
  j.r.eff_flops = effective_flops(j.p->args) * (backward ? 2.5 : 1.0);
  j.m.kept = kept_fraction(j.p->layout, w.seq);
  progress.update(prefix + "computing the fp64 reference rows ...");
  if (!backward) {
    j.ref = reference(*j.p, w, seed);
    j.m.checked_rows = int64_t(j.ref.rows.size());
    return j;
  }
  add_backward(*j.p, w, seed);
  j.bref = backward_reference(*j.p, w, seed, j.m.unchecked);
  j.m.checked_rows = int64_t(j.bref.rows.size());
  j.m.checked_key_blocks = int64_t(j.bref.blocks.size());
  return j;
}

// The rates, the lines around the table and the workload's JSON fields.
void finish(const Workload& w, const Measured& m, bool backward, bool gpu, BenchResult& r) {
  add_rates(r);
  const bool causal = w.causal || w.layout == LayoutKind::causal;
  r.intro = {"", strprintf("== %s: B=%lld Hq=%lld Hkv=%lld S=%lld D=%d, %s blocks, layout %s "
                           "(%.2f%% of blocks kept)%s, %s",
                           r.label.c_str(), (long long)w.batch, (long long)w.heads, (long long)w.kv_heads,
                           (long long)w.seq, w.dim, block_str(w.block, w.block).c_str(), to_string(w.layout),
                           100 * m.kept, causal ? ", causal" : "", to_string(w.dtype))};
  const std::string sets = gpu ? std::to_string(m.sets) + " input set(s) rotated; " : "";
  if (!backward)
    r.intro.push_back(strprintf("   effective GFLOP %.2f; %s%lld sampled rows checked against the fp64 reference",
                                r.eff_flops / 1e9, sets.c_str(), (long long)m.checked_rows));
  else
    r.intro.push_back(strprintf("   backward (dq, dk, dv): effective GFLOP %.2f (2.5 x the forward's); %sdq of %lld "
                                "sampled rows and dk, dv of %lld sampled key block(s) checked against the fp64 "
                                "reference",
                                r.eff_flops / 1e9, sets.c_str(), (long long)m.checked_rows,
                                (long long)m.checked_key_blocks));
  if (!m.unchecked.empty()) r.intro.push_back("   " + m.unchecked);
  r.when_empty = strprintf("   no %s attention variant is registered", gpu ? "GPU" : "CPU");
  r.wrong_note = backward ? "WRONG: outside the rounding bound" : "WRONG: error above " + fmt_sci(tolerance(w.dtype));

  r.fields = {{"batch", w.batch}, {"heads", w.heads}, {"kv_heads", w.kv_heads}, {"seq", w.seq}, {"dim", w.dim},
              {"block", w.block}, {"layout", to_string(w.layout)}, {"density", w.density}, {"causal", causal},
              {"dtype", to_string(w.dtype)}, {"kept_fraction", m.kept}, {"effective_flops", r.eff_flops},
              {"rotation_sets", m.sets}, {"checked_rows", m.checked_rows}, {"pass", backward ? "backward" : "forward"}};
  if (backward) r.fields.update(Json{{"checked_key_blocks", m.checked_key_blocks}, {"unchecked", m.unchecked}});
}

struct Settings {
  int reps, warmup;
  uint64_t seed;
  bool backward;
  std::vector<std::string> only;
};

// Every variant of `table` that --variants lists, on the backend: run once on set 0 after poison()
// and checked by check(row), then timed over the input sets (`sets`: one args per set).
template <class Args>
void check_and_time(const std::vector<VariantOf<Args>>& table, const std::vector<Args>& sets, bool gpu,
                    const Settings& s, Progress& progress, const std::string& prefix,
                    const std::function<void()>& poison, const std::function<void(BenchRow&)>& check,
                    BenchResult& r) {
  Options o;
  o.backend = gpu ? Backend::cuda : Backend::cpu;
  variant_rows(table, o.backend, sets[0], s.only, r.rows, [&](const VariantOf<Args>& v, BenchRow& row) {
    progress.update(prefix + "checking " + v.name + " ...");
    std::unique_ptr<VariantState> st = v.prepare ? v.prepare(sets[0], o) : nullptr;
    poison();
    v.run(sets[0], o, st.get());
    check(row);
    progress.update(prefix + "timing " + v.name + " ...");
    auto run = [&](int set) { v.run(sets[size_t(set)], o, st.get()); };
    row.times_ms = gpu ? timing::time_gpu(run, s.warmup, s.reps, int(sets.size()))
                       : timing::time_host([&] { run(0); }, s.warmup, s.reps);
  });
  progress.clear();
}

void run_cpu(const Workload& w, const Settings& s, Progress& progress, const std::string& prefix, Job& j) {
  HostProblem* p = j.p.get();
  if (s.backward) {
    Options o;
    o.backend = Backend::cpu;
    attention(p->args, o);  // O and LSE
    check_and_time(
        attention_backward_variants(), {p->bargs}, false, s, progress, prefix,
        [&] {
          for (HostMatrix* x : {&p->dq, &p->dk, &p->dv}) x->fill_bytes(0xFF);  // NaN in every dtype
        },
        [&](BenchRow& row) { compare_backward(j.bref, w, p->dq.bytes, p->dk.bytes, p->dv.bytes, row); }, j.r);
  } else {
    check_and_time(
        attention_variants(), {p->args}, false, s, progress, prefix,
        [&] {
          p->o.fill_bytes(0xFF);  // NaN in every dtype
          std::fill(p->lse.begin(), p->lse.end(), std::numeric_limits<float>::quiet_NaN());
        },
        [&](BenchRow& row) { compare(j.ref, w, p->o.bytes, p->lse, row); }, j.r);
  }
}

void run_gpu(const Workload& w, const Settings& s, Progress& progress, const std::string& prefix, Job& j) {
  const HostProblem* p = j.p.get();
  const bool backward = s.backward;

  // Device copies: the layout once, q/k/v/o/lse per rotated input set.
  const LayoutArrays& la = p->layout;
  auto upload = [](const std::vector<int32_t>& v) {
    DeviceBuffer d(v.size() * 4);
    if (!v.empty()) d.upload(v.data(), d.bytes);
    return d;
  };
  DeviceBuffer d_num = upload(la.num), d_idx = upload(la.idx), d_fnum = upload(la.full_num),
               d_fidx = upload(la.full_idx), d_cu = upload(p->cu_seqlens);
  const size_t q_bytes = p->q.bytes.size(), kv_bytes = p->k.bytes.size(), lse_bytes = p->lse.size() * 4;
  // The backward's set adds dO and dq (like q), dk and dv (like k).
  const size_t set_bytes = (backward ? 4 : 2) * q_bytes + (backward ? 4 : 2) * kv_bytes + lse_bytes;
  j.m.sets = int(std::min<size_t>(16, std::max<size_t>(1, (2 * device_info().l2_bytes + set_bytes - 1) / set_bytes)));
  std::vector<DeviceBuffer> d_q, d_k, d_v, d_o, d_lse;
  std::vector<AttentionArgs> args;
  for (size_t set = 0; set < size_t(j.m.sets); ++set) {
    d_q.emplace_back(q_bytes);
    d_k.emplace_back(kv_bytes);
    d_v.emplace_back(kv_bytes);
    d_o.emplace_back(q_bytes);
    d_lse.emplace_back(lse_bytes);
    d_q[set].upload(p->q.bytes.data(), q_bytes);  // same values: rotation is about the cache
    d_k[set].upload(p->k.bytes.data(), kv_bytes);
    d_v[set].upload(p->v.bytes.data(), kv_bytes);
    AttentionArgs a = p->args;
    for (auto [t, buf] : {std::pair{&a.q, &d_q[set]}, std::pair{&a.k, &d_k[set]}, std::pair{&a.v, &d_v[set]},
                          std::pair{&a.o, &d_o[set]}}) {
      t->data = buf->p;
      t->memory = Memory::device;
    }
    a.lse = static_cast<float*>(d_lse[set].p);
    a.layout.kv_num_blocks = static_cast<const int32_t*>(d_num.p);
    a.layout.kv_indices = static_cast<const int32_t*>(d_idx.p);
    if (a.layout.has_full()) {
      a.layout.full_kv_num_blocks = static_cast<const int32_t*>(d_fnum.p);
      a.layout.full_kv_indices = static_cast<const int32_t*>(d_fidx.p);
    }
    a.layout.memory = Memory::device;
    if (a.cu_seqlens) a.cu_seqlens = static_cast<const int32_t*>(d_cu.p);
    args.push_back(a);
  }
  validate(args[0], true);

  if (backward) {
    Options o;
    o.backend = Backend::cuda;
    std::vector<DeviceBuffer> d_do, d_dq, d_dk, d_dv;
    std::vector<AttentionBackwardArgs> bargs;
    for (size_t set = 0; set < args.size(); ++set) {
      attention(args[set], o);  // O and LSE of this set
      d_do.emplace_back(q_bytes);
      d_dq.emplace_back(q_bytes);
      d_dk.emplace_back(kv_bytes);
      d_dv.emplace_back(kv_bytes);
      d_do[set].upload(p->dout.bytes.data(), q_bytes);
      AttentionBackwardArgs b = p->bargs;
      b.forward = args[set];
      for (auto [t, buf] : {std::pair{&b.dout, &d_do[set]}, std::pair{&b.dq, &d_dq[set]},
                            std::pair{&b.dk, &d_dk[set]}, std::pair{&b.dv, &d_dv[set]}}) {
        t->data = buf->p;
        t->memory = Memory::device;
      }
      bargs.push_back(b);
    }
    check_cuda(cudaDeviceSynchronize(), "forward runs");
    std::vector<uint8_t> got_dq(q_bytes), got_dk(kv_bytes), got_dv(kv_bytes);
    check_and_time(
        attention_backward_variants(), bargs, true, s, progress, prefix,
        [&] {
          for (DeviceBuffer* d : {&d_dq[0], &d_dk[0], &d_dv[0]})
            check_cuda(cudaMemset(d->p, 0xFF, d->bytes), "cudaMemset(poison the gradients)");
        },
        [&](BenchRow& row) {
          check_cuda(cudaDeviceSynchronize(), "checked run");
          d_dq[0].download(got_dq.data(), q_bytes);
          d_dk[0].download(got_dk.data(), kv_bytes);
          d_dv[0].download(got_dv.data(), kv_bytes);
          compare_backward(j.bref, w, got_dq, got_dk, got_dv, row);
        },
        j.r);
  } else {
    std::vector<uint8_t> got_o(q_bytes);
    std::vector<float> got_lse(p->lse.size());
    check_and_time(
        attention_variants(), args, true, s, progress, prefix,
        [&] {
          check_cuda(cudaMemset(d_o[0].p, 0xFF, q_bytes), "cudaMemset(poison o)");
          check_cuda(cudaMemset(d_lse[0].p, 0xFF, lse_bytes), "cudaMemset(poison lse)");
        },
        [&](BenchRow& row) {
          check_cuda(cudaDeviceSynchronize(), "checked run");
          d_o[0].download(got_o.data(), q_bytes);
          d_lse[0].download(got_lse.data(), lse_bytes);
          compare(j.ref, w, got_o, got_lse, row);
        },
        j.r);
  }
}

// Measures one workload: on the GPU (gpu) or the CPU backend.
BenchResult measure(const Workload& w, const Settings& s, bool gpu, Progress& progress, const std::string& prefix) {
  Job j = prepare(w, s.seed, s.backward, progress, prefix);
  (gpu ? run_gpu : run_cpu)(w, s, progress, prefix, j);
  finish(w, j.m, s.backward, gpu, j.r);
  return std::move(j.r);
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
               "shape; --suite packed compares packed sequences (8 of mixed lengths, 64k tokens; 8 equal\n"
               "ones) with the equal-length batch B=8 S=8192, per-sequence top-k, not causal and causal.\n"
               "--seqlens packs sequences of the given lengths into one batch row (a query attends only\n"
               "its own sequence; the layout keeps blocks of each query block's sequences). --backward times the backward instead (dq, dk, dv from a random dO after a forward run;\n"
               "effective FLOPs 2.5 x the forward's), checked against the fp64 backward reference on sampled\n"
               "rows of dq and sampled key blocks of dk and dv. Exit code 1 when a variant failed, gave a wrong\n"
               "result, or none could run.",
               kSpecs);
    return 0;
  }
  if (args.has("--op") && args.str("--op", "") != "attention") args.bad("--op", "must be attention or dsd");
  const bool suite = args.has("--suite");
  const std::string suite_name = args.str("--suite", "");
  if (suite && suite_name != "attention" && suite_name != "packed")
    args.bad("--suite", "must be attention or packed");
  if (suite)
    for (const char* f : {"--density", "--layout", "--dim", "--causal", "--kv-heads", "--seqlens"})
      if (args.has(f)) args.bad(f, "not with --suite (each row of the suite sets it)");
  if (suite_name == "packed")
    for (const char* f : {"--batch", "--seq"})
      if (args.has(f)) args.bad(f, "not with --suite packed (its rows set the lengths)");
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
  if (args.has("--seqlens")) {
    if (args.has("--batch") || args.has("--seq")) args.bad("--seqlens", "not with --batch or --seq (the sequences set both)");
    int64_t total = 0;
    for (const std::string& x : args.list("--seqlens")) {
      char* end = nullptr;
      const long long n = std::strtoll(x.c_str(), &end, 10);
      if (x.empty() || *end || n < 0 || n > big) args.bad("--seqlens", "'" + x + "' is not a length in [0, " + std::to_string(big) + "]");
      base.seqlens.push_back(n);
      total += n;
    }
    if (total < 1 || total > big) args.bad("--seqlens", "the lengths must add up to [1, " + std::to_string(big) + "], got " + std::to_string(total));
    base.batch = 1;
    base.seq = total;
  }
  base.dtype = args.dtype("--dtype", gpu ? DType::bf16 : DType::f32);
  if (gpu && base.dtype == DType::f32) args.bad("--dtype", "f32 runs on the CPU only (--backend cpu)");
  Settings s;
  s.seed = args.seed("--seed", 1);
  const bool backward = s.backward = args.has("--backward");
  s.only = args.list("--variants");
  for (const std::string& name : s.only)
    if (backward ? !find_attention_backward_variant(name) : !find_attention_variant(name)) {
      std::string known;
      auto add = [&](const auto& table) {
        for (const auto& v : table) known += (known.empty() ? "" : ", ") + std::string(v.name);
      };
      if (backward) add(attention_backward_variants());
      else add(attention_variants());
      args.bad("--variants", std::string("unknown attention ") + (backward ? "backward " : "") + "variant '" + name +
                                 "' (known: " + known + ")");
    }
  s.reps = int(args.integer("--reps", gpu ? 20 : 3, 1, 100000));
  s.warmup = int(args.integer("--warmup", gpu ? 5 : 1, 0, 100000));

  JsonOutput json(args);  // after every flag check: an unwritable path fails before any work

  std::vector<Workload> table;
  if (!suite) {
    table.push_back(base);
  } else if (suite_name == "packed") {
    // Packed sequences against equal lengths, at one per-sequence density: 8 sequences of mixed
    // lengths (64k tokens), the same tokens as 8 equal sequences, and the equal-length batch.
    const std::vector<int64_t> mixed = {1000, 1500, 2500, 4000, 6000, 9000, 12000, 29536};
    for (bool causal : {false, true}) {
      Workload w = base;
      w.causal = causal;
      w.batch = 1;
      w.seqlens = mixed;
      w.seq = 65536;
      table.push_back(w);
      w.seqlens.assign(8, 8192);
      table.push_back(w);
      w.seqlens.clear();
      w.batch = 8;
      w.seq = 8192;
      table.push_back(w);
    }
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
                info.driver_version, s.reps, s.warmup);
  else if (backend == Backend::cpu)
    std::printf("running the CPU backend (--backend cpu); median of %d runs after %d warm-up runs\n", s.reps, s.warmup);
  else
    std::printf("no GPU found: %s; running the CPU backend; median of %d runs after %d warm-up runs\n",
                info.why_not.c_str(), s.reps, s.warmup);
  Table t;
  t.columns = {median_column(), rate_column(gpu)};
  if (backward)
    t.columns.insert(t.columns.end(), {sci_column("dq err/rms", "max_error_over_rms_dq"),
                                       sci_column("dk err/rms", "max_error_over_rms_dk"),
                                       sci_column("dv err/rms", "max_error_over_rms_dv")});
  else
    t.columns.insert(t.columns.end(),
                     {sci_column("max|dO|", "max_abs_error_o"), sci_column("max|dLSE|", "max_abs_error_lse")});
  BenchRun run;
  run.op = "attention";
  run.gpu = gpu;
  run.threads = cpu_backend_threads(0);
  run.reps = s.reps;
  run.warmup = s.warmup;
  run.seed = s.seed;
  std::vector<std::string> labels;
  for (const Workload& w : table) labels.push_back(label(w));
  Progress progress(stdout_is_tty());
  return run_workloads(
      labels,
      [&](size_t i, const std::string& prefix) { return measure(table[i], s, gpu, progress, prefix); },
      t, argv, run, json);
}

}  // namespace sparsek::cli
