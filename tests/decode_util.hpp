// Decode attention test helpers shared by the CPU and GPU suites: a host problem (a ragged batch
// of requests over a paged cache with shuffled physical pages, an optional selection, poisoned
// outputs), and the check against the fp64 oracle.
//
// Everything that must not be read is poisoned: cache slots past a request's seq_len and pages no
// request owns hold NaN, page-table entries past a request's pages and selection entries past a
// count hold out-of-range values. A kernel that reads any of them gives NaN or fails.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/oracle.hpp"
#include "sparsek/decode.hpp"

namespace sparsek::test {

struct DecodeSpec {
  std::vector<int> new_tokens = {1, 16, 3};  // per request, 1..16
  std::vector<int> seq_lens = {70, 300, 64}; // per request, >= its new tokens
  int hq = 4, hkv = 1, d = 64, page_size = 32;
  DType dtype = DType::f32;
  bool causal = true;
  float scale = 0.f;
  // Selection: none when sel_frac < 0; else each page kept with probability sel_frac, the newest
  // page always, and the (b, hk) pairs listed in empty_heads (flat b * hkv + hk) get none.
  double sel_frac = -1;
  std::vector<int> empty_heads;
  int extra_pages = 5;   // physical pages no request owns (poisoned)
  int64_t q_pad = 0;     // extra elements per token row of q and o (strided views)
  bool kv_combined = false;  // one buffer [pages, 2, page_size, Hkv, D]: K then V of each page
  bool lse = true;
  uint64_t seed = 1;

  std::string name() const {
    std::string s = "n={";
    for (int n : new_tokens) s += std::to_string(n) + ",";
    s += "} len={";
    for (int l : seq_lens) s += std::to_string(l) + ",";
    return s + "} Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) + " D=" + std::to_string(d) +
           " page=" + std::to_string(page_size) + " " + to_string(dtype) + (causal ? " causal" : "") +
           " sel=" + std::to_string(sel_frac) + " empty=" + std::to_string(empty_heads.size()) +
           " pad=" + std::to_string(q_pad) + (kv_combined ? " kv_combined" : "") + " seed=" + std::to_string(seed);
  }
};

struct DecodeCase {
  std::vector<uint8_t> q, k, v, o;  // v empty: V lives in k's buffer, v_offset elements on
  std::vector<float> lse;
  std::vector<int32_t> page_table, seq_lens, cu, sel_idx, sel_cnt;
  DecodeArgs args;
  int64_t v_offset = 0;

  // Points args at this case's host storage (after a copy or a move).
  void bind() {
    args.q.data = q.data(), args.o.data = o.data(), args.k.data = k.data();
    args.v.data = v.empty() ? static_cast<void*>(k.data() + size_t(v_offset) * dtype_size(args.k.dtype)) : v.data();
    args.lse = lse.empty() ? nullptr : lse.data();
    args.page_table = page_table.data(), args.seq_lens = seq_lens.data(), args.cu_seqlens_q = cu.data();
    args.sel_indices = sel_cnt.empty() ? nullptr : sel_idx.data();
    args.sel_counts = sel_cnt.empty() ? nullptr : sel_cnt.data();
  }
  void poison_outputs() {
    for (size_t i = 0; i < o.size() / dtype_size(args.o.dtype); ++i)
      store_from_float(o.data(), args.o.dtype, int64_t(i), std::numeric_limits<float>::quiet_NaN());
    std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());
  }
};

inline DecodeCase make_decode_case(const DecodeSpec& s) {
  std::mt19937_64 rng(s.seed);
  auto uni = [&] { return float(double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0); };
  const int64_t B = int64_t(s.new_tokens.size()), ps = s.page_size, D = s.d;
  DecodeCase c;
  c.cu.assign(size_t(B + 1), 0);
  for (int64_t b = 0; b < B; ++b) c.cu[size_t(b + 1)] = c.cu[size_t(b)] + s.new_tokens[size_t(b)];
  const int64_t T = c.cu[size_t(B)];
  c.seq_lens.assign(s.seq_lens.begin(), s.seq_lens.end());
  int64_t max_pages = 1, used = 0;
  for (int l : s.seq_lens) {
    max_pages = std::max<int64_t>(max_pages, (l + ps - 1) / ps);
    used += (l + ps - 1) / ps;
  }
  max_pages += 1;  // a spare column: never read
  const int64_t pages = used + s.extra_pages;
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.page_table.assign(size_t(B * max_pages), int32_t(pages + 1000));  // out of range: must not be read
  int64_t next = 0;
  const size_t es = dtype_size(s.dtype);
  // Element index of (page, slot, head, 0) in K's and in V's storage.
  const int64_t page_elems = ps * s.hkv * D;
  const int64_t cache_elems = pages * page_elems * (s.kv_combined ? 2 : 1);
  c.k.assign(size_t(cache_elems) * es, 0);
  if (!s.kv_combined) c.v.assign(c.k.size(), 0);
  c.v_offset = s.kv_combined ? page_elems : 0;
  const int64_t page_stride = s.kv_combined ? 2 * page_elems : page_elems;
  uint8_t* vbuf = s.kv_combined ? c.k.data() : c.v.data();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < cache_elems; ++i) {  // all NaN; the live slots overwritten below
    store_from_float(c.k.data(), s.dtype, i, nan);
    if (!s.kv_combined) store_from_float(c.v.data(), s.dtype, i, nan);
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = s.seq_lens[size_t(b)];
    for (int64_t p = 0; p * ps < len; ++p) {
      const int64_t pp = perm[size_t(next++)];
      c.page_table[size_t(b * max_pages + p)] = int32_t(pp);
      for (int64_t slot = 0; slot < std::min(ps, len - p * ps); ++slot)
        for (int64_t h = 0; h < s.hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t i = pp * page_stride + (slot * s.hkv + h) * D + d;
            store_from_float(c.k.data(), s.dtype, i, uni());
            store_from_float(vbuf, s.dtype, i + c.v_offset, uni());
          }
    }
  }
  const int64_t qrow = s.hq * D + s.q_pad;
  c.q.assign(size_t(T * qrow) * es, 0);
  for (int64_t i = 0; i < T * qrow; ++i) store_from_float(c.q.data(), s.dtype, i, uni());
  c.o.assign(c.q.size(), 0);
  if (s.lse) c.lse.assign(size_t(T * s.hq), 0.f);
  if (s.sel_frac >= 0) {
    c.sel_idx.assign(size_t(B * s.hkv * max_pages), -7);  // past a count: must not be read
    c.sel_cnt.assign(size_t(B * s.hkv), 0);
    std::uniform_real_distribution<double> u01(0, 1);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < s.hkv; ++h) {
        const int64_t row = b * s.hkv + h;
        if (std::find(s.empty_heads.begin(), s.empty_heads.end(), int(row)) != s.empty_heads.end()) continue;
        const int64_t np = (s.seq_lens[size_t(b)] + ps - 1) / ps;
        int32_t n = 0;
        for (int64_t p = 0; p < np; ++p)
          if (p == np - 1 || u01(rng) < s.sel_frac) c.sel_idx[size_t(row * max_pages + n++)] = int32_t(p);
        c.sel_cnt[size_t(row)] = n;
      }
  }
  DecodeArgs& a = c.args;
  a.q = TokensView::packed(nullptr, s.dtype, Memory::host, T, s.hq, D);
  a.q.stride_t = qrow;
  a.o = a.q;
  a.k = PagedCacheView::packed(nullptr, s.dtype, Memory::host, pages, ps, s.hkv, D);
  a.k.stride_page = page_stride;
  a.v = a.k;
  a.batch = B, a.max_pages = max_pages, a.sel_kmax = s.sel_frac >= 0 ? max_pages : 0;
  a.index_memory = Memory::host;
  a.causal_new = s.causal;
  a.scale = s.scale;
  c.bind();
  c.poison_outputs();
  return c;
}

// Max |O - ref| over the case's outputs (host memory) with the LSE checks: both -inf (then O is
// exactly 0) or within tol_lse. Elements of o between rows (q_pad) are not compared.
inline double expect_decode_matches(const DecodeCase& c, const DecodeReference& ref, double tol_o, double tol_lse) {
  const DecodeArgs& a = c.args;
  double worst = 0;
  int reported = 0;
  for (int64_t t = 0; t < a.q.t; ++t)
    for (int64_t h = 0; h < a.q.h; ++h) {
      const double rl = ref.lse[size_t(t * a.q.h + h)];
      const bool dead = std::isinf(rl) && rl < 0;
      if (!c.lse.empty()) {
        const double gl = c.lse[size_t(t * a.q.h + h)];
        const bool ok = dead ? (std::isinf(gl) && gl < 0) : std::abs(gl - rl) <= tol_lse;
        if (!ok && reported++ < 5) ADD_FAILURE() << "lse[" << t << ", " << h << "] = " << gl << ", reference " << rl;
      }
      for (int64_t d = 0; d < a.q.d; ++d) {
        const double got = load_as_float(c.o.data(), a.o.dtype, a.o.index(t, h, d));
        const double want = ref.o[size_t((t * a.q.h + h) * a.q.d + d)];
        const double err = std::isfinite(got) ? std::abs(got - want) : std::numeric_limits<double>::infinity();
        if (dead && got != 0.0 && reported++ < 5) ADD_FAILURE() << "o[" << t << ", " << h << ", " << d << "] = " << got << " in a row that sees nothing";
        if (!(err <= tol_o) && reported++ < 5)
          ADD_FAILURE() << "o[" << t << ", " << h << ", " << d << "] = " << got << ", reference " << want;
        worst = std::max(worst, err);
      }
    }
  return worst;
}

inline double decode_tol_o(DType t) { return t == DType::f32 ? 1e-5 : t == DType::f16 ? 2e-3 : 1.6e-2; }

}  // namespace sparsek::test
