// CPU backend of block-sparse attention: host memory, f32 / f16 / bf16, softmax in double. The
// backward (at the end) runs the fp64 reference.
//
// A work item is (batch, query head, query block) and owns its rows of O and LSE. It converts its
// query rows to float once, then walks its layout row (the masked list, then the full list),
// converting each K and V block to float, with an online softmax per query row in double: the
// running max m, the running sum l and the accumulator acc[D], rescaled whenever m grows. Scores
// are float products summed in double.
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

#include "cpu/oracle.hpp"
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

double dot(const float* x, const float* y, int64_t n) {
  // Four partial sums (n is 64 or 128): a fixed order with room for the pipeline.
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t d = 0; d < n; d += 4) {
    s0 += double(x[d]) * double(y[d]);
    s1 += double(x[d + 1]) * double(y[d + 1]);
    s2 += double(x[d + 2]) * double(y[d + 2]);
    s3 += double(x[d + 3]) * double(y[d + 3]);
  }
  return (s0 + s1) + (s2 + s3);
}

std::string cpu_why_not(const AttentionArgs& a) {
  for (const auto& [t, name] : {std::pair{&a.q, "q"}, std::pair{&a.k, "k"}, std::pair{&a.v, "v"}, std::pair{&a.o, "o"}})
    if (t->memory != Memory::host)
      return std::string("cpu backend needs host memory, but ") + name + " is in device memory";
  if (a.layout.memory != Memory::host) return "cpu backend needs host memory, but the layout is in device memory";
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
    auto block = [&](int32_t j, bool masked) {
      if (j < 0 || j >= nk) return;
      const int64_t c0 = int64_t(j) * bk, nc = std::min(Skv, c0 + bk) - c0;
      load_rows(a.k, b, hk, c0, nc, sc.k);
      load_rows(a.v, b, hk, c0, nc, sc.v);
      sc.s.resize(size_t(nc));
      for (int64_t rr = 0; rr < nr; ++rr) {
        // Keys c0 .. c0 + n - 1 of this block are attended by query row r0 + rr.
        const int64_t n = masked && a.causal ? std::min(nc, r0 + rr - c0 + 1) : nc;
        if (n <= 0) continue;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t c = 0; c < n; ++c) {
          sc.s[size_t(c)] = scale * dot(&sc.q[size_t(rr * D)], &sc.k[size_t(c * D)], D);
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
        for (int64_t c = 0; c < n; ++c) {
          const double p = std::exp(sc.s[size_t(c)] - m);
          sum += p;
          const float* v = &sc.v[size_t(c * D)];
          for (int64_t d = 0; d < D; ++d) acc[d] += p * double(v[d]);
        }
      }
    };
    auto walk = [&](const int32_t* num, const int32_t* idx, int64_t kmax, bool masked) {
      const int64_t n = std::clamp<int64_t>(num[r], 0, kmax);
      for (int64_t j = 0; j < n; ++j) block(idx[r * kmax + j], masked);
    };
    walk(l.kv_num_blocks, l.kv_indices, l.kmax, true);
    if (l.has_full()) walk(l.full_kv_num_blocks, l.full_kv_indices, l.full_kmax, false);

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

// ---- the backward: the fp64 reference (cpu/oracle.cpp), one (batch, key/value head) per item ----
//
// An item owns dk and dv of its key/value head and dq of the query heads of its group, so items
// write disjoint outputs and the sums inside one run in a fixed order: any thread count gives
// bit-identical results. P is recomputed from q and k (forward.o and forward.lse are not read);
// a malformed layout gives wrong values, never a read out of bounds (see attended_keys).

std::string cpu_why_not_bwd(const AttentionBackwardArgs& a) {
  std::string why = cpu_why_not(a.forward);
  for (const auto& [t, name] : {std::pair{&a.dout, "dout"}, std::pair{&a.dq, "dq"}, std::pair{&a.dk, "dk"},
                                std::pair{&a.dv, "dv"}})
    if (why.empty() && t->memory != Memory::host)
      why = std::string("cpu backend needs host memory, but ") + name + " is in device memory";
  return why;
}

void cpu_run_bwd(const AttentionBackwardArgs& a, const Options& o, VariantState*) {
  const AttentionArgs& f = a.forward;
  const AttentionLayout& l = f.layout;
  const int64_t B = f.q.b, Hq = f.q.h, Sq = f.q.s, D = f.q.d, Hkv = f.k.h, Skv = f.k.s, G = Hq / Hkv;
  const double flops = 10.0 * double(B * Hq * Sq) * double(l.kmax + (l.has_full() ? l.full_kmax : 0)) *
                       double(l.block_kv) * double(D);
  const int threads = thread_count(o, flops);
  struct Scratch {
    std::vector<double> dq, dk, dv;
  };
  std::vector<Scratch> scratch(size_t(std::max(threads, 1)));
  parallel_for(B * Hkv, threads, [&](int64_t item, int w) {
    const int64_t b = item / Hkv, hk = item % Hkv;
    Scratch& sc = scratch[size_t(w)];
    sc.dq.resize(size_t(G * Sq * D));
    sc.dk.resize(size_t(Skv * D));
    sc.dv.resize(size_t(Skv * D));
    BackwardHeadOut out;
    out.dq = sc.dq.data(), out.dk = sc.dk.data(), out.dv = sc.dv.data();
    attention_backward_oracle_head(f, a.dout, b, hk, out);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t s = 0; s < Sq; ++s)
        for (int64_t d = 0; d < D; ++d)
          store_from_float(a.dq.data, a.dq.dtype, a.dq.index(b, hk * G + g, s, d), float(sc.dq[size_t((g * Sq + s) * D + d)]));
    for (int64_t s = 0; s < Skv; ++s)
      for (int64_t d = 0; d < D; ++d) {
        store_from_float(a.dk.data, a.dk.dtype, a.dk.index(b, hk, s, d), float(sc.dk[size_t(s * D + d)]));
        store_from_float(a.dv.data, a.dv.dtype, a.dv.index(b, hk, s, d), float(sc.dv[size_t(s * D + d)]));
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
