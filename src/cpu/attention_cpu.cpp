// CPU backend of block-sparse attention: host memory, f32 / f16 / bf16, softmax in double. The
// backward (at the end) computes the gradients from the forward's LSE and O, in double.
//
// A work item is (batch, query head, query block) and owns its rows of O and LSE. It converts its
// query rows to float once, then walks its layout row (the masked list, then the full list),
// converting each K and V block to float, with an online softmax per query row in double: the
// running max m, the running sum l and the accumulator acc[D], rescaled whenever m grows. Scores
// are float products summed in double. With packed sequences a row attends only its own
// sequence's keys (found by a binary search of cu_seqlens, which run() does not trust either: any
// contents give wrong values, never a read outside cu_seqlens[0 .. num_seqs]).
//
// Determinism: the order of the work inside an item is fixed by the layout, never by the thread
// count, so any thread count gives bit-identical results.
//
// run() does not trust the layout's contents (plans do not check them): a count outside
// [0, kmax] is clamped and an index outside [0, Nk) skipped, so a malformed layout gives wrong
// values, never a read out of bounds.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/dot.hpp"
#include "cpu/parallel.hpp"
#include "format/attention_internal.hpp"
#include "plan/backends.hpp"

namespace sparsek {

namespace {

// Per-worker buffers, reused across work items.
struct Scratch {
  std::vector<float> q, k, v;    // [rows][D], [keys][D], [keys][D]
  std::vector<double> acc;       // [rows][D]
  std::vector<double> m, l, s;   // [rows], [rows], [keys]
};

// Rows [s0, s0 + n) of head h of batch b of t as floats, [n][D].
void load_rows(const Tensor4View& t, int64_t b, int64_t h, int64_t s0, int64_t n, std::vector<float>& out) {
  out.resize(size_t(n * t.d));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < t.d; ++d) out[size_t(r * t.d + d)] = load_as_float(t.data, t.dtype, t.index(b, h, s0 + r, d));
}

// Calls fn(j, masked) for every block of layout row r of l, the masked list first, then the full
// list, in list order (counts clamped to [0, kmax], indices outside [0, nk) skipped).
template <class F>
void for_each_block(const AttentionLayout& l, int64_t r, int64_t nk, const F& fn) {
  auto walk = [&](const int32_t* num, const int32_t* idx, int64_t kmax, bool masked) {
    const int64_t n = std::clamp<int64_t>(num[r], 0, kmax);
    for (int64_t e = 0; e < n; ++e)
      if (idx[r * kmax + e] >= 0 && idx[r * kmax + e] < nk) fn(idx[r * kmax + e], masked);
  };
  walk(l.kv_num_blocks, l.kv_indices, l.kmax, true);
  if (l.has_full()) walk(l.full_kv_num_blocks, l.full_kv_indices, l.full_kmax, false);
}

// The keys packed query row x may attend: its own sequence's rows with cu_seqlens, else all.
struct KeyRange {
  int64_t lo, hi;
};
KeyRange key_range(const AttentionArgs& a, int64_t x) {
  if (!a.cu_seqlens) return {0, a.k.s};
  const int64_t d = sequence_of(a.cu_seqlens, a.num_seqs, x);
  return {a.cu_seqlens[d], a.cu_seqlens[d + 1]};
}

std::string cpu_why_not(const AttentionArgs& a) {
  for (const auto& [t, name] : {std::pair{&a.q, "q"}, std::pair{&a.k, "k"}, std::pair{&a.v, "v"}, std::pair{&a.o, "o"}})
    if (t->memory != Memory::host)
      return std::string("cpu backend needs host memory, but ") + name + " is in device memory";
  if (a.layout.memory != Memory::host) return "cpu backend needs host memory, but the layout is in device memory";
  // Whatever validation refuses (D = 96, a bad stride, ...) no variant runs: say why rather than
  // list "cpu" among the supported variants.
  try {
    validate(a, false);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void cpu_run(const AttentionArgs& a, const Options& o, VariantState*) {
  const AttentionLayout& l = a.layout;
  const int64_t Hq = a.q.h, Sq = a.q.s, D = a.q.d, Hkv = a.k.h, Skv = a.k.s;
  const int64_t bq = l.block_q, bk = l.block_kv, mq = l.q_blocks, nk = (Skv + bk - 1) / bk;
  const int64_t items = a.q.b * Hq * mq;
  const double scale = double(a.softmax_scale());
  const double flops = double(items) * double(l.kmax + (l.has_full() ? l.full_kmax : 0)) * double(bq * bk) * 4.0 * double(D);
  const int threads = thread_count(o, flops);
  std::vector<Scratch> scratch(size_t(std::max(threads, 1)));

  parallel_for(items, threads, [&](int64_t item, int w) {
    const int64_t i = item % mq, h = item / mq % Hq, b = item / (mq * Hq), hk = h / (Hq / Hkv);
    const int64_t r = layout_row(l, Hq, Hkv, b, h, i);
    const int64_t r0 = i * bq, nr = std::min(Sq, r0 + bq) - r0;
    Scratch& sc = scratch[size_t(w)];
    load_rows(a.q, b, h, r0, nr, sc.q);
    sc.acc.assign(size_t(nr * D), 0.0);
    sc.m.assign(size_t(nr), -std::numeric_limits<double>::infinity());
    sc.l.assign(size_t(nr), 0.0);

    // One key block j; masked: causal applies inside it.
    for_each_block(l, r, nk, [&](int64_t j, bool masked) {
      const int64_t c0 = int64_t(j) * bk, nc = std::min(Skv, c0 + bk) - c0;
      load_rows(a.k, b, hk, c0, nc, sc.k);
      load_rows(a.v, b, hk, c0, nc, sc.v);
      sc.s.resize(size_t(nc));
      for (int64_t rr = 0; rr < nr; ++rr) {
        // Keys c0 + c, c in [c_first, n), of this block are attended by query row r0 + rr.
        const KeyRange kr = key_range(a, r0 + rr);
        int64_t n = std::min(nc, kr.hi - c0);
        if (masked && a.causal) n = std::min(n, r0 + rr - c0 + 1);
        const int64_t c_first = std::max<int64_t>(0, kr.lo - c0);
        if (n <= c_first) continue;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t c = c_first; c < n; ++c) {
          sc.s[size_t(c)] = scale * dot_f64(&sc.q[size_t(rr * D)], &sc.k[size_t(c * D)], D);
          mx = std::max(mx, sc.s[size_t(c)]);
        }
        double& m = sc.m[size_t(rr)];
        double& sum = sc.l[size_t(rr)];
        double* acc = &sc.acc[size_t(rr * D)];
        if (mx > m) {  // a new maximum: rescale what was summed so far (exp(-inf) = 0 the first time)
          const double f = std::exp(m - mx);
          sum *= f;
          for (int64_t d = 0; d < D; ++d) acc[d] *= f;
          m = mx;
        }
        for (int64_t c = c_first; c < n; ++c) {
          const double p = std::exp(sc.s[size_t(c)] - m);
          sum += p;
          const float* v = &sc.v[size_t(c * D)];
          for (int64_t d = 0; d < D; ++d) acc[d] += p * double(v[d]);
        }
      }
    });

    for (int64_t rr = 0; rr < nr; ++rr) {
      const double sum = sc.l[size_t(rr)];
      const double inv = sum > 0 ? 1.0 / sum : 0.0;  // no attended key: O = 0
      for (int64_t d = 0; d < D; ++d)
        store_from_float(a.o.data, a.o.dtype, a.o.index(b, h, r0 + rr, d), float(sc.acc[size_t(rr * D + d)] * inv));
      if (a.lse)
        a.lse[(b * Hq + h) * Sq + r0 + rr] =
            sum > 0 ? float(sc.m[size_t(rr)] + std::log(sum)) : -std::numeric_limits<float>::infinity();
    }
  });
}

// ---- the backward, from the forward's outputs ----
//
// The formulas of attention.hpp with the given forward.lse and forward.o, as the Hopper kernel
// reads them: P = exp(scale q.k - LSE) over every key of the blocks a row's lists name (masked keys
// score -inf), Delta = rowsum(dO o O), dS = P (dP - Delta). A row whose LSE is -inf attends
// nothing: its P is exp(s - inf) = 0. With deterministic, a row whose LSE is -inf gets dq = 0, and
// any other row whose LSE or Delta, or the bound that sizes the GPU's integer grid (the head's K and
// V, the row's dO), is not finite gets a NaN dq row, as on the GPU. Sums in double.
//
// Two passes, each with scratch of a few blocks (never sized by the sequence lengths, which a
// broadcast tensor may make huge): dq per (batch, query head, query block), dk and dv per (batch,
// key/value head, key block), the latter walking every layout row of the group's query heads for
// the rows that name its block. Every item writes its own outputs and sums in an order fixed by
// the layout: any thread count gives bit-identical results. A malformed layout gives wrong values,
// never a read out of bounds (counts clamped, out-of-range indices skipped, as in the forward).

std::string cpu_why_not_bwd(const AttentionBackwardArgs& a) {
  std::string why = cpu_why_not(a.forward);
  for (const auto& [t, name] : {std::pair{&a.dout, "dout"}, std::pair{&a.dq, "dq"}, std::pair{&a.dk, "dk"},
                                std::pair{&a.dv, "dv"}})
    if (why.empty() && t->memory != Memory::host)
      why = std::string("cpu backend needs host memory, but ") + name + " is in device memory";
  return why;
}

// What the gradient of one query row needs besides q and dO: the LSE as used (-inf -> +inf, so
// that P = 0) and Delta.
struct RowStats {
  double lse = 0, delta = 0;
  bool dead = false;        // LSE = -inf
  bool nonfinite = false;   // LSE, Delta or the row's part of the bound is not finite
};

// Rows [r0, r0 + n) of head h of batch b: q, dO (floats, [n][D]) and their RowStats.
struct QueryRows {
  std::vector<float> q, g, o;
  std::vector<RowStats> st;
};
void load_query_rows(const AttentionBackwardArgs& a, int64_t b, int64_t h, int64_t r0, int64_t n, QueryRows& w) {
  const AttentionArgs& f = a.forward;
  const int64_t D = f.q.d;
  load_rows(f.q, b, h, r0, n, w.q);
  load_rows(a.dout, b, h, r0, n, w.g);
  load_rows(f.o, b, h, r0, n, w.o);
  w.st.resize(size_t(n));
  for (int64_t rr = 0; rr < n; ++rr) {
    const float* o = &w.o[size_t(rr * D)];
    const float* g = &w.g[size_t(rr * D)];
    RowStats& st = w.st[size_t(rr)];
    const double lse = double(f.lse[(b * f.q.h + h) * f.q.s + r0 + rr]);
    float norm2 = 0.f;  // f32, as the GPU's bound: a dO whose squares overflow f32 marks the row
    for (int64_t d = 0; d < D; ++d) norm2 += g[d] * g[d];
    st.dead = lse == -std::numeric_limits<double>::infinity();
    st.lse = st.dead ? std::numeric_limits<double>::infinity() : lse;
    st.delta = dot_f64(o, g, D);
    st.nonfinite = !std::isfinite(lse) || !std::isfinite(float(st.delta)) || !std::isfinite(norm2);
  }
}

// Whether the GPU's bound for (batch b, key/value head hk) is finite: every element of K finite
// and every row of V with a finite squared norm in f32. Computed once per head and worker (the
// items of one head are consecutive).
struct HeadBound {
  int64_t b = -1, hk = -1;
  bool finite = true;
};
bool head_finite(const AttentionArgs& f, int64_t b, int64_t hk, HeadBound& hb) {
  if (hb.b == b && hb.hk == hk) return hb.finite;
  hb.b = b, hb.hk = hk, hb.finite = true;
  for (int64_t s = 0; s < f.k.s && hb.finite; ++s) {
    float v2 = 0.f;
    for (int64_t d = 0; d < f.k.d; ++d) {
      const float kx = load_as_float(f.k.data, f.k.dtype, f.k.index(b, hk, s, d));
      const float vx = load_as_float(f.v.data, f.v.dtype, f.v.index(b, hk, s, d));
      if (!std::isfinite(kx)) hb.finite = false;
      v2 += vx * vx;
    }
    if (!std::isfinite(v2)) hb.finite = false;
  }
  return hb.finite;
}

// The terms of query rows [r0, r0 + nr) (in w) against key block j (keys c0 .., k and v rows in kr,
// vr): term(rr, c, p, ds) for every row and key, with P and dS = P (dP - Delta) (before the scale).
template <class Term>
void block_terms(const AttentionArgs& f, const QueryRows& w, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                 const std::vector<float>& kr, const std::vector<float>& vr, bool masked, const Term& term) {
  const int64_t D = f.q.d;
  const double scale = double(f.softmax_scale());
  for (int64_t rr = 0; rr < nr; ++rr) {
    const RowStats& st = w.st[size_t(rr)];
    const KeyRange own = key_range(f, r0 + rr);
    for (int64_t c = 0; c < nc; ++c) {
      const bool hidden = (masked && f.causal && c0 + c > r0 + rr) || c0 + c < own.lo || c0 + c >= own.hi;
      const double s = hidden ? -std::numeric_limits<double>::infinity()
                              : scale * dot_f64(&w.q[size_t(rr * D)], &kr[size_t(c * D)], D);
      const double p = std::exp(s - st.lse);
      const double dp = dot_f64(&w.g[size_t(rr * D)], &vr[size_t(c * D)], D);
      term(rr, c, p, p * (dp - st.delta));
    }
  }
}

void cpu_run_bwd(const AttentionBackwardArgs& a, const Options& o, VariantState*) {
  const AttentionArgs& f = a.forward;
  const AttentionLayout& l = f.layout;
  const int64_t B = f.q.b, Hq = f.q.h, Sq = f.q.s, D = f.q.d, Hkv = f.k.h, Skv = f.k.s, G = Hq / Hkv;
  const int64_t bq = l.block_q, bk = l.block_kv, mq = l.q_blocks, nk = (Skv + bk - 1) / bk;
  const double scale = double(f.softmax_scale());
  const double flops = 10.0 * double(B * Hq * Sq) * double(l.kmax + (l.has_full() ? l.full_kmax : 0)) *
                       double(bk) * double(D);
  const int threads = thread_count(o, flops);
  struct Scratch {
    QueryRows rows;
    std::vector<float> k, v;
    std::vector<double> acc, acc2;
    HeadBound bound;
  };
  std::vector<Scratch> scratch(size_t(std::max(threads, 1)));

  // dq: one item per (batch, query head, query block).
  parallel_for(B * Hq * mq, threads, [&](int64_t item, int w) {
    const int64_t i = item % mq, h = item / mq % Hq, b = item / (mq * Hq), hk = h / G;
    const int64_t r0 = i * bq, nr = std::min(Sq, r0 + bq) - r0;
    Scratch& sc = scratch[size_t(w)];
    load_query_rows(a, b, h, r0, nr, sc.rows);
    sc.acc.assign(size_t(nr * D), 0.0);
    for_each_block(l, layout_row(l, Hq, Hkv, b, h, i), nk, [&](int64_t j, bool masked) {
      const int64_t c0 = j * bk, nc = std::min(Skv, c0 + bk) - c0;
      load_rows(f.k, b, hk, c0, nc, sc.k);
      load_rows(f.v, b, hk, c0, nc, sc.v);
      block_terms(f, sc.rows, r0, nr, c0, nc, sc.k, sc.v, masked, [&](int64_t rr, int64_t c, double, double ds) {
        double* dq = &sc.acc[size_t(rr * D)];
        const float* k = &sc.k[size_t(c * D)];
        for (int64_t d = 0; d < D; ++d) dq[d] += ds * double(k[d]);
      });
    });
    const bool kv_finite = !a.deterministic || head_finite(f, b, hk, sc.bound);
    for (int64_t rr = 0; rr < nr; ++rr) {
      const RowStats& st = sc.rows.st[size_t(rr)];
      for (int64_t d = 0; d < D; ++d) {
        double v = scale * sc.acc[size_t(rr * D + d)];
        if (a.deterministic && st.dead) v = 0.0;
        else if (a.deterministic && (st.nonfinite || !kv_finite)) v = std::numeric_limits<double>::quiet_NaN();
        store_from_float(a.dq.data, a.dq.dtype, a.dq.index(b, h, r0 + rr, d), float(v));
      }
    }
  });

  // dk, dv: one item per (batch, key/value head, key block).
  parallel_for(B * Hkv * nk, threads, [&](int64_t item, int w) {
    const int64_t j = item % nk, hk = item / nk % Hkv, b = item / (nk * Hkv);
    const int64_t c0 = j * bk, nc = std::min(Skv, c0 + bk) - c0;
    Scratch& sc = scratch[size_t(w)];
    load_rows(f.k, b, hk, c0, nc, sc.k);
    load_rows(f.v, b, hk, c0, nc, sc.v);
    sc.acc.assign(size_t(nc * D), 0.0);   // dk
    sc.acc2.assign(size_t(nc * D), 0.0);  // dv
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
      for (int64_t i = 0; i < mq; ++i) {
        const int64_t r0 = i * bq, nr = std::min(Sq, r0 + bq) - r0;
        bool loaded = false;
        for_each_block(l, layout_row(l, Hq, Hkv, b, h, i), nk, [&](int64_t jj, bool masked) {
          if (jj != j) return;
          if (!loaded) load_query_rows(a, b, h, r0, nr, sc.rows), loaded = true;
          block_terms(f, sc.rows, r0, nr, c0, nc, sc.k, sc.v, masked, [&](int64_t rr, int64_t c, double p, double ds) {
            double* dk = &sc.acc[size_t(c * D)];
            double* dv = &sc.acc2[size_t(c * D)];
            const float* q = &sc.rows.q[size_t(rr * D)];
            const float* g = &sc.rows.g[size_t(rr * D)];
            for (int64_t d = 0; d < D; ++d) {
              dk[d] += ds * double(q[d]);
              dv[d] += p * double(g[d]);
            }
          });
        });
      }
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t d = 0; d < D; ++d) {
        store_from_float(a.dk.data, a.dk.dtype, a.dk.index(b, hk, c0 + c, d), float(scale * sc.acc[size_t(c * D + d)]));
        store_from_float(a.dv.data, a.dv.dtype, a.dv.index(b, hk, c0 + c, d), float(sc.acc2[size_t(c * D + d)]));
      }
  });
}

}  // namespace

std::vector<AttentionVariant> cpu_attention_variants() {
  return {AttentionVariant{"cpu", Backend::cpu, false, &cpu_why_not, nullptr, &cpu_run}};
}

std::vector<AttentionBackwardVariant> cpu_attention_backward_variants() {
  return {AttentionBackwardVariant{"cpu", Backend::cpu, false, &cpu_why_not_bwd, nullptr, &cpu_run_bwd}};
}

}  // namespace sparsek
