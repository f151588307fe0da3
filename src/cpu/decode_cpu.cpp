// CPU backend of decode attention: host memory, f32 / f16 / bf16, softmax in double.
//
// A work item is (request, key/value head), as one GPU CTA before its KV split: it converts each
// page of K and V it walks to float once and uses it for every row it owns (the G query heads of
// the group times the request's new tokens), with an online softmax per row in double. The page
// order is fixed (the selection's, or ascending), never by the thread count: results are
// bit-identical for any thread count.
//
// The index contents are not trusted (plans do not check them): new-token counts are clamped to
// [0, 16] and rows past q.t dropped, seq_len clamped to [0, max_pages * page_size], selection
// counts to [0, sel_kmax], and a page whose logical index is past the request's pages or whose
// physical index is outside the cache is skipped: wrong values, never a read out of bounds.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/dot.hpp"
#include "cpu/parallel.hpp"
#include "format/decode_internal.hpp"

namespace sparsek {

namespace {
struct Scratch {
  std::vector<float> q, k, v;   // [rows][D], [page_size][D] x 2
  std::vector<double> acc, m, l, s;  // s: one page's scores of one row
};

}  // namespace

void decode_cpu_run(const DecodeArgs& a, int threads_requested) {
  const DecodeIndices ix = host_decode_indices(a, nullptr);
  const int64_t T = a.q.t, Hq = a.q.h, D = a.q.d, Hkv = a.k.h, G = Hq / Hkv, ps = a.k.page_size;
  const int64_t items = a.batch * Hkv;
  const double scale = double(a.softmax_scale());
  Options o;
  o.threads = threads_requested;
  const int threads = thread_count(o, double(T) * double(Hq) * double(a.max_pages * ps) * 4.0 * double(D));
  std::vector<Scratch> scratch(size_t(std::max(threads, 1)));
  const double ninf = -std::numeric_limits<double>::infinity();

  parallel_for(items, threads, [&](int64_t item, int w) {
    const int64_t b = item / Hkv, hk = item % Hkv;
    const int64_t q0 = std::clamp<int64_t>(ix.cu_seqlens_q[b], 0, T);
    const int64_t n = std::clamp<int64_t>(int64_t(ix.cu_seqlens_q[b + 1]) - q0, 0, std::min<int64_t>(kDecodeMaxNewTokens, T - q0));
    const int64_t len = std::clamp<int64_t>(ix.seq_lens[b], 0, a.max_pages * ps);
    const int64_t npages = (len + ps - 1) / ps;
    const int64_t rows = G * n;  // row r: token j = r / G, head hk * G + r % G
    if (rows == 0) return;
    Scratch& sc = scratch[size_t(w)];
    sc.q.resize(size_t(rows * D));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < D; ++d)
        sc.q[size_t(r * D + d)] = load_as_float(a.q.data, a.q.dtype, a.q.index(q0 + r / G, hk * G + r % G, d));
    sc.acc.assign(size_t(rows * D), 0.0);
    sc.m.assign(size_t(rows), ninf);
    sc.l.assign(size_t(rows), 0.0);
    sc.k.resize(size_t(ps * D));
    sc.v.resize(size_t(ps * D));

    int64_t entries = npages;
    const int32_t* sel = nullptr;
    if (a.has_selection()) {
      entries = std::clamp<int64_t>(ix.sel_counts[b * Hkv + hk], 0, a.sel_kmax);
      sel = ix.sel_indices + (b * Hkv + hk) * a.sel_kmax;
    }
    for (int64_t e = 0; e < entries; ++e) {
      const int64_t lp = sel ? sel[e] : e;
      if (lp < 0 || lp >= npages) continue;
      const int64_t pp = ix.page_table[b * a.max_pages + lp];
      if (pp < 0 || pp >= a.k.pages) continue;
      const int64_t nslots = std::min(ps, len - lp * ps);
      for (int64_t s = 0; s < nslots; ++s)
        for (int64_t d = 0; d < D; ++d) {
          sc.k[size_t(s * D + d)] = load_as_float(a.k.data, a.k.dtype, a.k.index(pp, s, hk, d));
          sc.v[size_t(s * D + d)] = load_as_float(a.v.data, a.v.dtype, a.v.index(pp, s, hk, d));
        }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t j = r / G;
        const int64_t limit = a.causal_new ? len - n + j + 1 : len;  // visible positions < limit
        const int64_t cnt = std::min(nslots, limit - lp * ps);
        if (cnt <= 0) continue;
        const float* qr = &sc.q[size_t(r * D)];
        double* acc = &sc.acc[size_t(r * D)];
        double mx = ninf;
        std::vector<double>& s = sc.s;
        s.resize(size_t(cnt));
        for (int64_t c = 0; c < cnt; ++c) mx = std::max(mx, s[size_t(c)] = scale * dot_f64(qr, &sc.k[size_t(c * D)], D));
        double& m = sc.m[size_t(r)];
        double& l = sc.l[size_t(r)];
        if (mx > m) {
          const double f = std::exp(m - mx);
          l *= f;
          for (int64_t d = 0; d < D; ++d) acc[d] *= f;
          m = mx;
        }
        for (int64_t c = 0; c < cnt; ++c) {
          const double p = std::exp(s[size_t(c)] - m);
          l += p;
          const float* vr = &sc.v[size_t(c * D)];
          for (int64_t d = 0; d < D; ++d) acc[d] += p * double(vr[d]);
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = q0 + r / G, h = hk * G + r % G;
      const double l = sc.l[size_t(r)], inv = l > 0 ? 1.0 / l : 0.0;  // sees nothing: O = 0
      for (int64_t d = 0; d < D; ++d)
        store_from_float(a.o.data, a.o.dtype, a.o.index(t, h, d), float(sc.acc[size_t(r * D + d)] * inv));
      if (a.lse)
        a.lse[t * Hq + h] = l > 0 ? float(sc.m[size_t(r)] + std::log(l)) : -std::numeric_limits<float>::infinity();
    }
  });
}

}  // namespace sparsek
