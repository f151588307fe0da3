// CPU backend and reference of page selection (include/sparsek/decode.hpp): the page summaries'
// update and the top-k of pages per (request, key/value head). The GPU kernels
// (src/kernels/decode/select.cu) write the same summaries bit for bit; they sum the bounds on the
// tensor cores, so a score can differ from this one in its last bits (exact sums agree).
//
// Index contents are not trusted (as in decode_cpu.cpp): counts and lengths are clamped, pages
// outside the cache are skipped (never pickable), writes stay inside the outputs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/parallel.hpp"
#include "format/decode_internal.hpp"
#include "plan/gate_internal.hpp"  // gate_order_key, summary_min, summary_max

namespace sparsek {

namespace {
struct Req {
  int64_t q0, n, len;
};
Req request(const PageSelectArgs& a, const DecodeIndices& ix, int64_t b) {
  const int64_t T = a.q.t;
  const int64_t q0 = std::clamp<int64_t>(ix.cu_seqlens_q[b], 0, T);
  const int64_t n = std::clamp<int64_t>(int64_t(ix.cu_seqlens_q[b + 1]) - q0, 0, std::min<int64_t>(kDecodeMaxNewTokens, T - q0));
  const int64_t len = std::clamp<int64_t>(ix.seq_lens[b], 0, a.max_pages * a.k.page_size);
  return {q0, n, len};
}
DecodeIndices indices(const PageSelectArgs& a) {
  DecodeArgs d;
  d.page_table = a.page_table, d.seq_lens = a.seq_lens, d.cu_seqlens_q = a.cu_seqlens_q;
  d.batch = a.batch, d.max_pages = a.max_pages, d.k = a.k;
  d.index_memory = Memory::host;
  return host_decode_indices(d, nullptr);
}
}  // namespace

void page_summaries_cpu(const PageSelectArgs& a, int threads_requested) {
  const DecodeIndices ix = indices(a);
  const int64_t D = a.k.d, Hkv = a.k.h, ps = a.k.page_size;
  Options o;
  o.threads = threads_requested;
  const int threads = thread_count(o, double(a.batch) * double(Hkv) * double(a.all_pages ? a.max_pages : 2) * double(ps * D));
  parallel_for(a.batch * Hkv, threads, [&](int64_t item, int) {
    const int64_t b = item / Hkv, hk = item % Hkv;
    const Req r = request(a, ix, b);
    if (!a.all_pages && r.n == 0) return;
    const int64_t first = a.all_pages ? 0 : std::max<int64_t>(r.len - r.n, 0) / ps;
    for (int64_t lp = first; lp * ps < r.len; ++lp) {
      const int64_t pp = ix.page_table[b * a.max_pages + lp];
      if (pp < 0 || pp >= a.k.pages) continue;
      const int64_t slots = std::min(ps, r.len - lp * ps);
      const int64_t out = (pp * Hkv + hk) * 2 * D;
      for (int64_t d = 0; d < D; ++d) {
        float mn = load_as_float(a.k.data, a.k.dtype, a.k.index(pp, 0, hk, d)), mx = mn;
        for (int64_t s = 1; s < slots; ++s) {
          const float x = load_as_float(a.k.data, a.k.dtype, a.k.index(pp, s, hk, d));
          mn = summary_min(mn, x);
          mx = summary_max(mx, x);
        }
        store_from_float(a.summaries, a.k.dtype, out + d, mn);  // a cache value: exact
        store_from_float(a.summaries, a.k.dtype, out + D + d, mx);
      }
    }
  });
}

void select_pages_cpu(const PageSelectArgs& a, int threads_requested) {
  const DecodeIndices ix = indices(a);
  const int64_t D = a.k.d, Hkv = a.k.h, G = a.q.h / Hkv, ps = a.k.page_size;
  Options o;
  o.threads = threads_requested;
  const int threads = thread_count(o, double(a.batch) * double(a.q.h) * double(a.max_pages) * double(2 * D));
  parallel_for(a.batch * Hkv, threads, [&](int64_t item, int) {
    const int64_t b = item / Hkv, hk = item % Hkv;
    const Req r = request(a, ix, b);
    const int64_t npages = (r.len + ps - 1) / ps, nvec = G * r.n;
    std::vector<float> q(size_t(nvec * D));
    for (int64_t i = 0; i < nvec; ++i)
      for (int64_t d = 0; d < D; ++d)
        q[size_t(i * D + d)] = load_as_float(a.q.data, a.q.dtype, a.q.index(r.q0 + i / G, hk * G + i % G, d));
    // The bound per page: the largest over the vectors, each summed in ascending d as q-·min + q+·max
    // (two fmas, one of them adding an exact zero: the value of one fma of q_d with the side its
    // sign picks, and the GPU's NaN where a summary is infinite; NaN bounds never win).
    std::vector<uint32_t> key(size_t(npages), 0u);
    std::vector<float> mn(static_cast<size_t>(D)), mx(static_cast<size_t>(D));
    auto always_on = [&](int64_t j) { return j < a.sink || j >= npages - a.local; };
    for (int64_t j = 0; j < npages; ++j) {
      const int64_t pp = ix.page_table[b * a.max_pages + j];
      if (pp < 0 || pp >= a.k.pages || always_on(j)) continue;
      const int64_t at = (pp * Hkv + hk) * 2 * D;
      for (int64_t d = 0; d < D; ++d) {
        mn[size_t(d)] = load_as_float(a.summaries, a.k.dtype, at + d);
        mx[size_t(d)] = load_as_float(a.summaries, a.k.dtype, at + D + d);
      }
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < nvec; ++i) {
        const float* qi = &q[size_t(i * D)];
        float acc = 0.f;
        for (int64_t d = 0; d < D; ++d) {
          const float qn = qi[d] < 0.f ? qi[d] : 0.f, qp = qi[d] > 0.f ? qi[d] : 0.f;
          acc = std::fma(qp, mx[size_t(d)], std::fma(qn, mn[size_t(d)], acc));
        }
        if (acc > best) best = acc;
      }
      key[size_t(j)] = gate_order_key(best);
    }
    // The top-k of the other pages by key (ties: the lower page), then every kept page ascending.
    std::vector<int64_t> pick;
    for (int64_t j = 0; j < npages; ++j)
      if (key[size_t(j)] != 0u) pick.push_back(j);
    const size_t k = std::min(pick.size(), size_t(a.topk));
    std::partial_sort(pick.begin(), pick.begin() + std::ptrdiff_t(k), pick.end(), [&](int64_t x, int64_t y) {
      return key[size_t(x)] != key[size_t(y)] ? key[size_t(x)] > key[size_t(y)] : x < y;
    });
    std::vector<char> keep(size_t(npages), 0);
    for (size_t e = 0; e < k; ++e) keep[size_t(pick[e])] = 1;
    int32_t* out = a.sel_indices + item * a.sel_kmax;
    int64_t pos = 0;
    for (int64_t j = 0; j < npages; ++j)
      if (keep[size_t(j)] || always_on(j)) {
        if (pos < a.sel_kmax) out[pos] = int32_t(j);
        ++pos;
      }
    for (int64_t e = pos; e < a.sel_kmax; ++e) out[e] = 0;
    a.sel_counts[item] = int32_t(std::min(pos, a.sel_kmax));
  });
}

}  // namespace sparsek
