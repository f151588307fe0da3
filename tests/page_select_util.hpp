// Page selection test helpers shared by the CPU and GPU suites: a decode case (tests/decode_util.hpp)
// with summaries and selection outputs, an independent reference (double precision, brute force),
// and the checks.
//
// Cache slots nobody stores are poisoned with a large finite value (the decode helper's NaN would
// pass unseen through min and max): a summary that reads one gets 30000 and fails. Summaries of
// pages no update touches and the selection outputs start poisoned too.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "decode_util.hpp"

namespace sparsek::test {

constexpr float kSlotPoison = 30000.f;    // unstored cache slots
constexpr float kSummaryPoison = -768.f;  // summaries no update should touch (exact in bf16 and f16)

struct PageSelectCase {
  DecodeCase dc;
  std::vector<uint8_t> summaries;
  std::vector<int32_t> sel_idx, sel_cnt;
  PageSelectArgs args;

  void bind() {
    dc.bind();
    args.q = dc.args.q;
    args.k = dc.args.k;
    args.q.data = dc.q.data(), args.k.data = dc.k.data();
    args.summaries = summaries.data();
    args.page_table = dc.page_table.data(), args.seq_lens = dc.seq_lens.data(), args.cu_seqlens_q = dc.cu.data();
    args.sel_indices = sel_idx.data(), args.sel_counts = sel_cnt.data();
  }
  void poison_selection() {
    std::fill(sel_idx.begin(), sel_idx.end(), -99);
    std::fill(sel_cnt.begin(), sel_cnt.end(), -99);
  }
  void poison_summaries() {
    for (size_t i = 0; i < summaries.size() / dtype_size(args.k.dtype); ++i)
      store_from_float(summaries.data(), args.k.dtype, int64_t(i), kSummaryPoison);
  }
};

// integers: q and the stored keys become integers in [-4, 4] (every bound exact in f32: the
// selection must equal the reference's exactly, ties included).
inline PageSelectCase make_page_select_case(const DecodeSpec& s, int64_t topk, int64_t sink, int64_t local,
                                            bool integers = false) {
  PageSelectCase c;
  c.dc = make_decode_case(s);
  const DType t = s.dtype;
  auto remap = [&](std::vector<uint8_t>& buf) {
    for (size_t i = 0; i < buf.size() / dtype_size(t); ++i) {
      const float x = load_as_float(buf.data(), t, int64_t(i));
      store_from_float(buf.data(), t, int64_t(i), std::isnan(x) ? kSlotPoison : integers ? std::round(4.f * x) : x);
    }
  };
  remap(c.dc.k);
  if (integers) remap(c.dc.q);
  const DecodeArgs& a = c.dc.args;
  c.summaries.assign(size_t(a.k.pages * a.k.h * 2 * a.k.d) * dtype_size(t), 0);
  c.args.batch = a.batch, c.args.max_pages = a.max_pages;
  c.args.index_memory = Memory::host;
  c.args.topk = topk, c.args.sink = sink, c.args.local = local;
  c.args.sel_kmax = std::min(a.max_pages, topk + sink + local) + 2;  // two spare entries: set to 0
  c.args.sel_kmax = std::min(c.args.sel_kmax, a.max_pages);
  c.sel_idx.assign(size_t(a.batch * a.k.h * c.args.sel_kmax), 0);
  c.sel_cnt.assign(size_t(a.batch * a.k.h), 0);
  c.bind();
  c.poison_summaries();
  c.poison_selection();
  return c;
}

// The reference summaries of request b's logical page lp (min, max per channel) in double.
inline void summary_ref(const PageSelectCase& c, int64_t b, int64_t lp, int64_t hk, std::vector<double>& mn,
                        std::vector<double>& mx) {
  const DecodeArgs& a = c.dc.args;
  const int64_t ps = a.k.page_size, len = c.dc.seq_lens[size_t(b)];
  const int64_t pp = c.dc.page_table[size_t(b * a.max_pages + lp)];
  mn.assign(size_t(a.k.d), 1e300);
  mx.assign(size_t(a.k.d), -1e300);
  for (int64_t s = 0; s < std::min(ps, len - lp * ps); ++s)
    for (int64_t d = 0; d < a.k.d; ++d) {
      const double x = load_as_float(c.dc.k.data(), a.k.dtype, a.k.index(pp, s, hk, d));
      mn[size_t(d)] = std::min(mn[size_t(d)], x);
      mx[size_t(d)] = std::max(mx[size_t(d)], x);
    }
}

// Checks the summaries (host bytes `sum`) of every page of every request with lp in
// [first(b), npages): exact; every other page's summary must still hold the poison.
inline void expect_summaries(const PageSelectCase& c, const std::vector<uint8_t>& sum, bool all_pages) {
  const DecodeArgs& a = c.dc.args;
  const int64_t ps = a.k.page_size, D = a.k.d, H = a.k.h;
  std::vector<char> touched(size_t(a.k.pages), 0);
  std::vector<double> mn, mx;
  int reported = 0;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t len = c.dc.seq_lens[size_t(b)], n = c.dc.cu[size_t(b + 1)] - c.dc.cu[size_t(b)];
    const int64_t first = all_pages ? 0 : (len - n) / ps;
    for (int64_t lp = first; lp * ps < len; ++lp) {
      const int64_t pp = c.dc.page_table[size_t(b * a.max_pages + lp)];
      touched[size_t(pp)] = 1;
      for (int64_t hk = 0; hk < H; ++hk) {
        summary_ref(c, b, lp, hk, mn, mx);
        for (int64_t d = 0; d < D; ++d) {
          const int64_t at = (pp * H + hk) * 2 * D + d;
          const double gmn = load_as_float(sum.data(), a.k.dtype, at), gmx = load_as_float(sum.data(), a.k.dtype, at + D);
          if ((gmn != mn[size_t(d)] || gmx != mx[size_t(d)]) && reported++ < 5)
            ADD_FAILURE() << "request " << b << " page " << lp << " (physical " << pp << ") head " << hk << " channel "
                          << d << ": min/max " << gmn << "/" << gmx << ", want " << mn[size_t(d)] << "/" << mx[size_t(d)];
        }
      }
    }
  }
  for (int64_t pp = 0; pp < a.k.pages; ++pp)
    if (!touched[size_t(pp)])
      for (int64_t e = 0; e < H * 2 * D; ++e)
        if (load_as_float(sum.data(), a.k.dtype, pp * H * 2 * D + e) != kSummaryPoison && reported++ < 5)
          ADD_FAILURE() << "physical page " << pp << " (not to be updated) element " << e << " was written";
}

// The selection (host arrays) against the reference: scores in double from the summaries the
// reference computes; kept = sink + local + the topk best others (ties: the lower page). With
// exact, the kept set must be the reference's; else picked pages may swap only with pages whose
// reference score is within tol (relative to the row's largest |score|) of theirs.
inline void expect_selection(const PageSelectCase& c, const std::vector<int32_t>& idx, const std::vector<int32_t>& cnt,
                             bool exact, double tol = 1e-5) {
  const PageSelectArgs& a = c.args;
  const DecodeArgs& da = c.dc.args;
  const int64_t H = a.k.h, G = a.q.h / H, D = a.k.d, ps = a.k.page_size;
  std::vector<double> mn, mx;
  int reported = 0;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t hk = 0; hk < H; ++hk) {
      SCOPED_TRACE("request " + std::to_string(b) + " head " + std::to_string(hk));
      const int64_t len = c.dc.seq_lens[size_t(b)], np = (len + ps - 1) / ps;
      const int64_t q0 = c.dc.cu[size_t(b)], n = c.dc.cu[size_t(b + 1)] - q0;
      std::vector<double> score(size_t(np), 0);
      double big = 0;
      for (int64_t p = 0; p < np; ++p) {
        summary_ref(c, b, p, hk, mn, mx);
        double best = -1e300;
        for (int64_t i = 0; i < G * n; ++i) {
          double sum = 0;
          for (int64_t d = 0; d < D; ++d) {
            const double qd = load_as_float(c.dc.q.data(), da.q.dtype, da.q.index(q0 + i / G, hk * G + i % G, d));
            sum += std::max(qd * mn[size_t(d)], qd * mx[size_t(d)]);
          }
          best = std::max(best, sum);
        }
        score[size_t(p)] = best;
        big = std::max(big, std::abs(best));
      }
      auto on = [&](int64_t p) { return p < a.sink || p >= np - a.local; };
      std::vector<int64_t> others;
      for (int64_t p = 0; p < np; ++p)
        if (!on(p)) others.push_back(p);
      std::stable_sort(others.begin(), others.end(), [&](int64_t x, int64_t y) { return score[size_t(x)] > score[size_t(y)]; });
      const size_t k = std::min(others.size(), size_t(a.topk));
      std::vector<char> want(size_t(np), 0);
      for (int64_t p = 0; p < np; ++p) want[size_t(p)] = on(p);
      for (size_t e = 0; e < k; ++e) want[size_t(others[e])] = 1;
      const int64_t count = std::count(want.begin(), want.end(), 1);
      const int64_t row = b * H + hk;
      ASSERT_EQ(cnt[size_t(row)], std::min(count, a.sel_kmax));
      const int32_t* got = idx.data() + row * a.sel_kmax;
      std::vector<char> have(size_t(np), 0);
      for (int64_t e = 0; e < cnt[size_t(row)]; ++e) {
        ASSERT_TRUE(got[e] >= 0 && got[e] < np) << "entry " << e << " = " << got[e];
        if (e > 0) ASSERT_LT(got[e - 1], got[e]) << "entry " << e << ": not ascending";
        have[size_t(got[e])] = 1;
      }
      for (int64_t e = cnt[size_t(row)]; e < a.sel_kmax; ++e) ASSERT_EQ(got[e], 0) << "entry " << e << " past the count";
      for (int64_t p = 0; p < np; ++p) {
        if (have[size_t(p)] == want[size_t(p)]) continue;
        if (on(p)) {
          ADD_FAILURE() << "page " << p << " (sink or local) is " << (have[size_t(p)] ? "kept" : "missing");
          continue;
        }
        // A swap: the page's score must tie the k-th best within tol.
        const double kth = k ? score[size_t(others[k - 1])] : 0;
        const bool near = !exact && k > 0 && std::abs(score[size_t(p)] - kth) <= tol * std::max(big, 1.0);
        if (!near && reported++ < 5)
          ADD_FAILURE() << "page " << p << " score " << score[size_t(p)] << " is " << (have[size_t(p)] ? "kept" : "dropped")
                        << "; the k-th best score is " << kth;
      }
    }
}

}  // namespace sparsek::test
