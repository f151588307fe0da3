// Test helpers for the top-k block gate (CPU and GPU suites): host [B, H, S, D] tensors, a gate
// problem with poisoned host outputs, and the row-by-row comparison of two gate results.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "sparsek/attention.hpp"

namespace sparsek::test {

constexpr int32_t kPoisonIndex = -7;

// A host tensor [b, h, s, d]: packed, or with the s and h axes swapped in memory ("bshd": strides
// stride_s = h*d, stride_h = d), plus `pad` extra elements per row of d.
struct HostTensor4 {
  std::vector<uint8_t> bytes;
  Tensor4View v;
  HostTensor4(int64_t b, int64_t h, int64_t s, int64_t d, DType t, bool bshd = false, int64_t pad = 0) {
    const int64_t row = d + pad;
    bytes.assign(size_t(std::max<int64_t>(b * h * s * row, 1)) * dtype_size(t), 0);
    v = Tensor4View::packed(bytes.data(), t, Memory::host, b, h, s, d);
    v.stride_s = bshd ? h * row : row;
    v.stride_h = bshd ? row : s * row;
    v.stride_b = h * s * row;
  }
  void set(int64_t b, int64_t h, int64_t s, int64_t d, float x) { store_from_float(v.data, v.dtype, v.index(b, h, s, d), x); }
  float get(int64_t b, int64_t h, int64_t s, int64_t d) const { return load_as_float(v.data, v.dtype, v.index(b, h, s, d)); }
  // Uniform [-1, 1) in every element (padding included).
  void fill_random(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int64_t n = int64_t(bytes.size() / dtype_size(v.dtype));
    for (int64_t i = 0; i < n; ++i) store_from_float(v.data, v.dtype, i, u(rng));
  }
};

struct GateSpec {
  int64_t B = 1, Hq = 1, Hkv = 1, Sq = 256, Skv = 256, D = 64;
  DType dtype = DType::f32;
  int block = 64, topk = 2, sink = 1, local = 1;
  bool causal = false;
  float scale = 0.f;
  int64_t extra_kmax = 0;  // kmax = min(Nk, topk + sink + local) + extra_kmax
  bool bshd = false;       // q and k stored [b, s, h, d]
  int64_t pad = 0;         // extra elements after each row of q and k (1: rows not 16-byte aligned)
  bool want_scores = true;
};

// A gate problem on the host: q and k (zero-filled: the test writes them), outputs poisoned by run().
struct GateCase {
  GateSpec spec;
  int64_t Mq, Nk, kmax;
  HostTensor4 q, k;
  std::vector<int32_t> num, idx;
  std::vector<float> scores;
  GateArgs args;
  explicit GateCase(const GateSpec& s)
      : spec(s),
        Mq((s.Sq + s.block - 1) / s.block),
        Nk((s.Skv + s.block - 1) / s.block),
        kmax(std::min<int64_t>(Nk, int64_t(s.topk) + s.sink + s.local) + s.extra_kmax),
        q(s.B, s.Hq, s.Sq, s.D, s.dtype, s.bshd, s.pad),
        k(s.B, s.Hkv, s.Skv, s.D, s.dtype, s.bshd, s.pad) {
    num.resize(size_t(s.B * s.Hkv * Mq));
    idx.resize(size_t(s.B * s.Hkv * Mq * kmax));
    scores.resize(s.want_scores ? size_t(s.B * s.Hkv * Mq * Nk) : 0);
    args.q = q.v;
    args.k = k.v;
    args.topk = s.topk;
    args.block = s.block;
    args.causal = s.causal;
    args.sink = s.sink;
    args.local = s.local;
    args.scale = s.scale;
    args.kmax = kmax;
  }
  GateCase(const GateCase&) = delete;
  GateCase& operator=(const GateCase&) = delete;
  // Points the outputs at this case's (poisoned) host buffers.
  GateArgs& host_args() {
    std::fill(num.begin(), num.end(), kPoisonIndex);
    std::fill(idx.begin(), idx.end(), kPoisonIndex);
    std::fill(scores.begin(), scores.end(), std::nanf(""));
    args.kv_num_blocks = num.data();
    args.kv_indices = idx.data();
    args.scores = scores.empty() ? nullptr : scores.data();
    return args;
  }
  void run_host() { gate(host_args()); }
  int64_t row(int64_t b, int64_t g, int64_t i) const { return (b * spec.Hkv + g) * Mq + i; }
  std::vector<int32_t> chosen(int64_t b, int64_t g, int64_t i) const {
    const int64_t r = row(b, g, i);
    return std::vector<int32_t>(idx.begin() + r * kmax, idx.begin() + r * kmax + num[size_t(r)]);
  }
  float score(int64_t b, int64_t g, int64_t i, int64_t j) const { return scores[size_t(row(b, g, i) * Nk + j)]; }
};

// A candidate layout (batch 1, host memory) over num [heads * q_blocks] and idx [.. * kmax], with
// full lists when fnum and fidx are given.
inline AttentionLayout candidate_layout(const std::vector<int32_t>& num, const std::vector<int32_t>& idx, int64_t kmax,
                                        int64_t heads, int64_t q_blocks, int block,
                                        const std::vector<int32_t>* fnum = nullptr,
                                        const std::vector<int32_t>* fidx = nullptr, int64_t full_kmax = 0) {
  AttentionLayout l;
  l.kv_num_blocks = num.data();
  l.kv_indices = idx.data();
  if (fnum) l.full_kv_num_blocks = fnum->data(), l.full_kv_indices = fidx->data();
  l.batch = 1;
  l.heads = heads;
  l.q_blocks = q_blocks;
  l.kmax = kmax;
  l.full_kmax = full_kmax;
  l.block_q = l.block_kv = block;
  l.memory = Memory::host;
  return l;
}

// Layout invariants of one result row: count in [0, kmax], indices ascending and in [0, Nk),
// zeros past the count.
inline void expect_well_formed(const GateCase& c, const std::vector<int32_t>& num, const std::vector<int32_t>& idx) {
  int bad = 0;
  for (int64_t r = 0; r < int64_t(num.size()) && bad < 5; ++r) {
    const int32_t n = num[size_t(r)];
    if (n < 0 || n > c.kmax) {
      ADD_FAILURE() << "row " << r << ": count " << n << " not in [0, " << c.kmax << "]";
      ++bad;
      continue;
    }
    for (int64_t e = 0; e < c.kmax; ++e) {
      const int32_t j = idx[size_t(r * c.kmax + e)];
      const bool ok = e < n ? (j >= 0 && j < c.Nk && (e == 0 || j > idx[size_t(r * c.kmax + e - 1)])) : j == 0;
      if (!ok) {
        ADD_FAILURE() << "row " << r << " entry " << e << " = " << j << " (count " << n << ", Nk " << c.Nk << ")";
        ++bad;
        break;
      }
    }
  }
}

// Compares a result (num, idx, scores) with the reference case `ref` (already run). Rows must match
// exactly, except for near ties: scores computed in f32 and in double may order two blocks at the
// top-k threshold differently, so a row may swap blocks when every block in one list and not the
// other has a reference score within tol * (largest |reference score| of the row) of all the
// others. tol = 0 demands identical layouts. Scores (when both have them) must agree within
// tol_scores * (largest |reference score| of the row); -inf exactly.
inline void expect_same_selection(const GateCase& ref, const std::vector<int32_t>& num,
                                  const std::vector<int32_t>& idx, const std::vector<float>& scores, double tol,
                                  double tol_scores, int64_t* near_tie_rows = nullptr) {
  const GateSpec& s = ref.spec;
  int bad = 0;
  int64_t swapped = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t g = 0; g < s.Hkv; ++g)
      for (int64_t i = 0; i < ref.Mq && bad < 5; ++i) {
        const int64_t r = ref.row(b, g, i);
        const std::vector<int32_t> want = ref.chosen(b, g, i);
        const std::vector<int32_t> got(idx.begin() + r * ref.kmax,
                                       idx.begin() + r * ref.kmax + std::clamp<int64_t>(num[size_t(r)], 0, ref.kmax));
        double row_max = 0;
        for (int64_t j = 0; j < ref.Nk; ++j)
          if (std::isfinite(ref.score(b, g, i, j))) row_max = std::max(row_max, std::fabs(double(ref.score(b, g, i, j))));
        if (!scores.empty() && !ref.scores.empty())
          for (int64_t j = 0; j < ref.Nk; ++j) {
            const float w = ref.score(b, g, i, j), x = scores[size_t(r * ref.Nk + j)];
            const bool ok = std::isinf(w) ? x == w : std::fabs(double(x) - w) <= tol_scores * row_max + 1e-30;
            if (!ok) {
              ADD_FAILURE() << "score [" << b << ", " << g << ", " << i << ", " << j << "] = " << x << ", want " << w;
              ++bad;
              break;
            }
          }
        if (got == want) continue;
        // Near ties: the blocks in one list and not the other must all score within tol of each other.
        bool ok = num[size_t(r)] == int32_t(want.size()) && tol > 0 && !ref.scores.empty();
        if (ok) {
          std::vector<int32_t> diff;
          std::set_symmetric_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(diff));
          double lo = INFINITY, hi = -INFINITY;
          for (int32_t j : diff) {
            const double v = j >= 0 && j < ref.Nk ? double(ref.score(b, g, i, j)) : NAN;
            if (!std::isfinite(v)) ok = false;
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
          ok = ok && hi - lo <= tol * row_max;
        }
        if (ok) {
          ++swapped;
          continue;
        }
        std::string w, x;
        for (int32_t j : want) w += std::to_string(j) + " ";
        for (int32_t j : got) x += std::to_string(j) + " ";
        ADD_FAILURE() << "row [" << b << ", " << g << ", " << i << "]: got { " << x << "}, want { " << w << "}";
        ++bad;
      }
  if (near_tie_rows) *near_tie_rows = swapped;
}

// ---- cases the CPU gate tests share (tests/cpu/test_gate.cpp, test_gate_capi.cpp) ----

// Key block j holds c[j] in dimension 0 (every row), query block i holds a[i]: with scale 1 the
// score of (i, j) is a[i] * c[j]. Values are multiples of 1/16, exact in f16 and bf16.
inline const std::vector<float> kC = {2 / 16.f, 8 / 16.f, 6 / 16.f, 15 / 16.f, 4 / 16.f, 14 / 16.f, 7 / 16.f, 12 / 16.f};
// Order of kC, best first: 3, 5, 7, 1, 6, 2, 4, 0.

inline GateSpec hand_spec() {
  GateSpec s;
  s.Sq = s.Skv = 8 * 64;
  s.D = 64;
  s.block = 64;
  s.scale = 1.f;
  return s;
}

inline void set_blocks(GateCase& c, const std::vector<float>& a, const std::vector<float>& kc) {
  const GateSpec& s = c.spec;
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t r = 0; r < s.Sq; ++r) c.q.set(b, h, r, 0, a[size_t(r / s.block)]);
    for (int64_t h = 0; h < s.Hkv; ++h)
      for (int64_t r = 0; r < s.Skv; ++r) c.k.set(b, h, r, 0, kc[size_t(r / s.block)]);
  }
}

// Four packed sequences in 700 rows of random q and k (block 64: boundaries inside blocks, one
// sequence of a single row), cu_seqlens and num_seqs set: the C++ and the C API tests' case.
struct PackedGateCase {
  std::vector<int32_t> cu = {0, 100, 101, 450, 700};
  GateCase c{spec()};
  PackedGateCase() {
    c.q.fill_random(5);
    c.k.fill_random(6);
    c.args.cu_seqlens = cu.data();
    c.args.num_seqs = 4;
  }
  static GateSpec spec() {
    GateSpec s;
    s.Hq = s.Hkv = 1, s.D = 64, s.block = 64, s.topk = 3, s.sink = 1, s.local = 1;
    s.Sq = s.Skv = 700;
    return s;
  }
};

}  // namespace sparsek::test
