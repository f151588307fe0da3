// Attention test helpers shared by the CPU and GPU suites: a host problem (q, k, v, a poisoned o
// and lse, a layout shaped as the case asks), the check against the fp64 oracle, and the error of
// the naive bf16/f16 computation (what PyTorch's eager softmax(q k^T * scale + mask) v gives).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/oracle.hpp"
#include "format/attention_internal.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/sparsek.h"

namespace sparsek::test {

struct AttnSpec {
  int64_t batch = 1, hq = 2, hkv = 1, sq = 150, skv = 200;
  int d = 64, block = 64;
  DType dtype = DType::f32;
  bool causal = false;
  float scale = 0.f;
  LayoutKind kind = LayoutKind::topk;
  double density = 0.4;
  int64_t layout_batch = 0;  // 0: batch (else 1)
  int64_t layout_heads = 0;  // 0: hkv (else 1 or hq)
  int64_t extra_kmax = 0;    // kmax beyond the longest row (entries past a count are -1)
  bool split_full = false;   // without causal: every other block of a row goes to the full list
  std::vector<int64_t> empty_rows;  // layout rows (flat index; -1 = the last) forced empty
  bool bshd = false;         // memory order [B, S, H, D] (torch's q.transpose(1, 2)) instead of packed
  int64_t o_tail = 0;        // o gets this many extra rows per head that must stay untouched
  bool lse = true;
  // Packed sequences: their lengths (batch 1, sq = skv = the sum, cu_seqlens from them); empty: none.
  std::vector<int64_t> seqlens;
  uint64_t seed = 1;

  // The spec as packed sequences of these lengths.
  AttnSpec& packed(std::vector<int64_t> lens) {
    seqlens = std::move(lens);
    batch = 1;
    sq = skv = 0;
    for (int64_t n : seqlens) sq = skv = sq + n;
    return *this;
  }

  std::string name() const {
    return "B=" + std::to_string(batch) + " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
           " Sq=" + std::to_string(sq) + " Skv=" + std::to_string(skv) + " D=" + std::to_string(d) +
           " block=" + std::to_string(block) + " " + to_string(dtype) + " " + to_string(kind) +
           (causal ? " causal" : "") + " density=" + std::to_string(density) +
           " layout_batch=" + std::to_string(layout_batch) + " layout_heads=" + std::to_string(layout_heads) +
           " extra_kmax=" + std::to_string(extra_kmax) + (split_full ? " split_full" : "") +
           " empty_rows=" + std::to_string(empty_rows.size()) + (bshd ? " bshd" : "") + packed_name() +
           " seed=" + std::to_string(seed);
  }
  std::string packed_name() const {
    if (seqlens.empty()) return "";
    std::string n = " seqlens=";
    for (size_t i = 0; i < seqlens.size(); ++i) n += (i ? "," : "") + std::to_string(seqlens[i]);
    return n;
  }
};

// Storage of one [b, h, s, d] tensor in `dtype` with its view (host memory).
struct HostTensor {
  std::vector<uint8_t> bytes;
  Tensor4View view;
  HostTensor() = default;
  // bshd: memory order [b, s, h, d]; tail: extra rows per (b, h) (packed order only).
  HostTensor(int64_t b, int64_t h, int64_t s, int64_t d, DType dtype, bool bshd = false, int64_t tail = 0) {
    view.dtype = dtype;
    view.memory = Memory::host;
    view.b = b, view.h = h, view.s = s, view.d = d;
    if (bshd) {
      view.stride_h = d, view.stride_s = h * d, view.stride_b = s * h * d;
    } else {
      view.stride_s = d, view.stride_h = (s + tail) * d, view.stride_b = h * view.stride_h;
    }
    bytes.assign(size_t(b * view.stride_b) * dtype_size(dtype), 0);
    view.data = bytes.data();
  }
  int64_t elements() const { return int64_t(bytes.size() / dtype_size(view.dtype)); }
  float at(int64_t b, int64_t h, int64_t s, int64_t d) const {
    return load_as_float(view.data, view.dtype, view.index(b, h, s, d));
  }
  void fill_random(uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < elements(); ++i)
      store_from_float(view.data, view.dtype, i, float(double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0));
  }
  void fill(float x) {
    for (int64_t i = 0; i < elements(); ++i) store_from_float(view.data, view.dtype, i, x);
  }
};

struct AttnCase {
  AttnSpec spec;
  HostTensor q, k, v, o;
  std::vector<float> lse;
  LayoutArrays layout;
  std::vector<int32_t> cu_seqlens;  // packed sequences' offsets (empty: none)
  AttentionArgs args;
};

// idx of `rows` rows of kmax entries re-strided to new_kmax (new entries -1).
inline void widen(std::vector<int32_t>& idx, int64_t rows, int64_t kmax, int64_t new_kmax) {
  std::vector<int32_t> out(size_t(rows * new_kmax), -1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < kmax; ++j) out[size_t(r * new_kmax + j)] = idx[size_t(r * kmax + j)];
  idx.swap(out);
}

// The case's layout, edited as its spec says (split lists, empty rows, wider kmax).
inline LayoutArrays make_layout(const AttnSpec& s) {
  const int64_t lb = s.layout_batch ? s.layout_batch : s.batch, lh = s.layout_heads ? s.layout_heads : s.hkv;
  LayoutArrays l = random_attention_layout(s.kind, lb, lh, s.sq, s.skv, s.block, s.density, s.causal, s.seed + 7);
  const int64_t rows = int64_t(l.num.size());
  if (s.split_full && l.full_num.empty()) {
    std::vector<int32_t> num(size_t(rows), 0), idx(size_t(rows * l.kmax), -1), fnum(size_t(rows), 0),
        fidx(size_t(rows * l.kmax), -1);
    for (int64_t r = 0; r < rows; ++r)
      for (int32_t j = 0; j < l.num[size_t(r)]; ++j) {
        const int32_t x = l.idx[size_t(r * l.kmax + j)];
        if (j % 2) fidx[size_t(r * l.kmax + fnum[size_t(r)]++)] = x;
        else idx[size_t(r * l.kmax + num[size_t(r)]++)] = x;
      }
    l.num = num, l.idx = idx, l.full_num = fnum, l.full_idx = fidx;
    l.full_kmax = l.kmax;
  }
  for (int64_t r : s.empty_rows) {
    const size_t at = size_t(r < 0 ? rows + r : r);
    l.num[at] = 0;
    if (!l.full_num.empty()) l.full_num[at] = 0;
  }
  if (s.extra_kmax) {
    widen(l.idx, rows, l.kmax, l.kmax + s.extra_kmax);
    l.kmax += s.extra_kmax;
    if (!l.full_num.empty()) {
      widen(l.full_idx, rows, l.full_kmax, l.full_kmax + s.extra_kmax);
      l.full_kmax += s.extra_kmax;
    }
  }
  return l;
}

// Random q, k, v in [-1, 1); o and lse poisoned with NaN.
inline std::unique_ptr<AttnCase> make_attention_case(const AttnSpec& s) {
  auto c = std::make_unique<AttnCase>();
  c->spec = s;
  c->q = HostTensor(s.batch, s.hq, s.sq, s.d, s.dtype, s.bshd);
  c->k = HostTensor(s.batch, s.hkv, s.skv, s.d, s.dtype, s.bshd);
  c->v = HostTensor(s.batch, s.hkv, s.skv, s.d, s.dtype, s.bshd);
  c->o = HostTensor(s.batch, s.hq, s.sq, s.d, s.dtype, s.bshd, s.o_tail);
  c->q.fill_random(s.seed + 1);
  c->k.fill_random(s.seed + 2);
  c->v.fill_random(s.seed + 3);
  c->o.fill(std::numeric_limits<float>::quiet_NaN());
  c->lse.assign(size_t(s.batch * s.hq * s.sq), std::numeric_limits<float>::quiet_NaN());
  c->layout = make_layout(s);
  AttentionArgs& a = c->args;
  a.q = c->q.view;
  a.k = c->k.view;
  a.v = c->v.view;
  a.o = c->o.view;
  a.lse = s.lse ? c->lse.data() : nullptr;
  a.layout = c->layout.view();
  a.causal = s.causal;
  a.scale = s.scale;
  if (!s.seqlens.empty()) {
    c->cu_seqlens.assign(1, 0);
    for (int64_t n : s.seqlens) c->cu_seqlens.push_back(int32_t(c->cu_seqlens.back() + n));
    a.cu_seqlens = c->cu_seqlens.data();
    a.num_seqs = int64_t(s.seqlens.size());
  }
  return c;
}

// The case's host o and lse (written by a run) against the oracle: max |dO| <= tol_o, and LSE
// within tol_lse (exactly -inf for a row that attends nothing). Returns max |dO|.
inline double expect_matches(const AttnCase& c, const AttentionReference& ref, double tol_o, double tol_lse) {
  const AttnSpec& s = c.spec;
  double worst_o = 0;
  int reported = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t i = 0; i < s.sq; ++i) {
        const int64_t row = (b * s.hq + h) * s.sq + i;
        for (int64_t d = 0; d < s.d; ++d) {
          const double got = c.o.at(b, h, i, d), want = ref.o[size_t(row * s.d + d)];
          const double err = std::isfinite(got) ? std::fabs(got - want) : std::numeric_limits<double>::infinity();
          worst_o = std::max(worst_o, err);
          if (!(err <= tol_o) && reported++ < 5)
            ADD_FAILURE() << "o[" << b << ", " << h << ", " << i << ", " << d << "] = " << got << ", want " << want;
        }
        if (!s.lse) continue;
        const double got = c.lse[size_t(row)], want = ref.lse[size_t(row)];
        const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= tol_lse;
        if (!ok && reported++ < 5)
          ADD_FAILURE() << "lse[" << b << ", " << h << ", " << i << "] = " << got << ", want " << want;
      }
  // The rows of o past Sq (o_tail) must still hold the poison.
  for (int64_t b = 0; b < s.batch && s.o_tail; ++b)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t i = s.sq; i < s.sq + s.o_tail; ++i)
        for (int64_t d = 0; d < s.d; ++d)
          if (!std::isnan(c.o.at(b, h, i, d)) && reported++ < 5)
            ADD_FAILURE() << "o row " << i << " past Sq = " << s.sq << " was written";
  return worst_o;
}

// Max |O - oracle| of the naive computation in the case's dtype: S = round(q k^T), then
// round(S * scale), masked, P = round(softmax(S)) (computed in float), O = round(P v) (float
// accumulation) — eager PyTorch in bf16/f16. Rows that attend nothing (NaN there) are skipped.
inline double naive_error(const AttnCase& c, const AttentionReference& ref) {
  const AttentionArgs& a = c.args;
  const AttnSpec& s = c.spec;
  const DType t = s.dtype;
  auto rnd = [t](float x) {
    float y;
    store_from_float(&y, t, 0, x);
    return load_as_float(&y, t, 0);
  };
  const float scale = rnd(a.softmax_scale());
  const AttentionLayout& l = a.layout;
  double worst = 0;
  std::vector<float> sc(size_t(s.skv)), p(size_t(s.skv));
  std::vector<char> on(size_t(s.skv));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.hq; ++h) {
      const int64_t hk = h / (s.hq / s.hkv);
      for (int64_t i = 0; i < s.sq; ++i) {
        std::fill(on.begin(), on.end(), 0);
        const int64_t r = layout_row(l, s.hq, s.hkv, b, h, i / l.block_q);
        for (int32_t j = 0; j < l.kv_num_blocks[r]; ++j)
          for (int64_t key = int64_t(l.kv_indices[r * l.kmax + j]) * l.block_kv;
               key < std::min<int64_t>(s.skv, (l.kv_indices[r * l.kmax + j] + 1) * int64_t(l.block_kv)); ++key)
            on[size_t(key)] = !(s.causal && key > i);
        if (l.has_full())
          for (int32_t j = 0; j < l.full_kv_num_blocks[r]; ++j)
            for (int64_t key = int64_t(l.full_kv_indices[r * l.full_kmax + j]) * l.block_kv;
                 key < std::min<int64_t>(s.skv, (l.full_kv_indices[r * l.full_kmax + j] + 1) * int64_t(l.block_kv)); ++key)
              on[size_t(key)] = 1;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t key = 0; key < s.skv; ++key) {
          if (!on[size_t(key)]) continue;
          float dot = 0;
          for (int64_t d = 0; d < s.d; ++d) dot += c.q.at(b, h, i, d) * c.k.at(b, hk, key, d);
          sc[size_t(key)] = rnd(rnd(dot) * scale);
          mx = std::max(mx, sc[size_t(key)]);
        }
        if (std::isinf(mx)) continue;  // attends nothing
        float sum = 0;
        for (int64_t key = 0; key < s.skv; ++key)
          if (on[size_t(key)]) sum += (p[size_t(key)] = std::exp(sc[size_t(key)] - mx));
        for (int64_t key = 0; key < s.skv; ++key)
          if (on[size_t(key)]) p[size_t(key)] = rnd(p[size_t(key)] / sum);
        const int64_t row = (b * s.hq + h) * s.sq + i;
        for (int64_t d = 0; d < s.d; ++d) {
          float acc = 0;
          for (int64_t key = 0; key < s.skv; ++key)
            if (on[size_t(key)]) acc += p[size_t(key)] * c.v.at(b, hk, key, d);
          worst = std::max(worst, std::fabs(double(rnd(acc)) - ref.o[size_t(row * s.d + d)]));
        }
      }
    }
  return worst;
}

// The GPU suites' base case: tails in both sequences (Sq 300, Skv 450), GQA 4 / 2, batch 2,
// top-k 40%, a seed per (dtype, D, block, causal).
inline AttnSpec gpu_spec(DType t, int d, int block, bool causal) {
  AttnSpec s;
  s.batch = 2, s.hq = 4, s.hkv = 2, s.sq = 300, s.skv = 450;
  s.dtype = t, s.d = d, s.block = block, s.causal = causal;
  s.density = 0.4;
  s.seed = uint64_t(d * 7 + block + int(t) * 3 + causal);
  return s;
}

// The C API's views of a tensor and of attention args.
inline sparsek_tensor4 to_c(const Tensor4View& t) {
  sparsek_tensor4 c{};
  c.data = t.data;
  c.dtype = sparsek_dtype(int(t.dtype));
  c.memory = sparsek_memory(int(t.memory));
  c.b = t.b, c.h = t.h, c.s = t.s, c.d = t.d;
  c.stride_b = t.stride_b, c.stride_h = t.stride_h, c.stride_s = t.stride_s;
  return c;
}

inline sparsek_attention_args to_c(const AttentionArgs& a) {
  sparsek_attention_args c{};
  c.q = to_c(a.q), c.k = to_c(a.k), c.v = to_c(a.v), c.o = to_c(a.o);
  c.lse = a.lse;
  const AttentionLayout& l = a.layout;
  c.layout.kv_num_blocks = l.kv_num_blocks;
  c.layout.kv_indices = l.kv_indices;
  c.layout.full_kv_num_blocks = l.full_kv_num_blocks;
  c.layout.full_kv_indices = l.full_kv_indices;
  c.layout.batch = l.batch, c.layout.heads = l.heads, c.layout.q_blocks = l.q_blocks;
  c.layout.kmax = l.kmax, c.layout.full_kmax = l.full_kmax;
  c.layout.block_q = l.block_q, c.layout.block_kv = l.block_kv;
  c.layout.memory = sparsek_memory(int(l.memory));
  c.causal = a.causal;
  c.scale = a.scale;
  c.cu_seqlens = a.cu_seqlens;
  c.num_seqs = a.num_seqs;
  return c;
}

// A backward problem on the host: an AttnCase (its o and lse from the CPU forward), a random dout
// like q and NaN-poisoned dq, dk, dv (in q's memory order: bshd too).
struct BwdCase {
  std::unique_ptr<AttnCase> c;
  HostTensor dout, dq, dk, dv;
  AttentionBackwardArgs args;
  void poison() {
    for (HostTensor* t : {&dq, &dk, &dv}) t->fill(std::numeric_limits<float>::quiet_NaN());
  }
};
inline std::unique_ptr<BwdCase> make_backward_case(const AttnSpec& spec) {
  AttnSpec s = spec;
  s.lse = true;
  s.o_tail = 0;
  auto x = std::make_unique<BwdCase>();
  x->c = make_attention_case(s);
  Options cpu;
  cpu.backend = Backend::cpu;
  attention(x->c->args, cpu);
  x->dout = HostTensor(s.batch, s.hq, s.sq, s.d, s.dtype, s.bshd);
  x->dout.fill_random(s.seed + 11);
  x->dq = HostTensor(s.batch, s.hq, s.sq, s.d, s.dtype, s.bshd);
  x->dk = HostTensor(s.batch, s.hkv, s.skv, s.d, s.dtype, s.bshd);
  x->dv = HostTensor(s.batch, s.hkv, s.skv, s.d, s.dtype, s.bshd);
  x->poison();
  AttentionBackwardArgs& a = x->args;
  a.forward = x->c->args;
  a.dout = x->dout.view, a.dq = x->dq.view, a.dk = x->dk.view, a.dv = x->dv.view;
  return x;
}
}  // namespace sparsek::test
