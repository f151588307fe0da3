// The top-k block gate on the CPU: the reference the GPU kernels are tested against, and the
// backend for host memory. Pooled means and scores in double; the selection follows the rules in
// plan/gate_internal.hpp (ties -> the lower index).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/scratch.hpp"
#include "plan/gate_internal.hpp"

namespace sparsek {

namespace {

// Mean of rows [r0, r1) of heads [h0, h1) of batch b of t: out[d], d < t.d.
void pool(const Tensor4View& t, int64_t b, int64_t h0, int64_t h1, int64_t r0, int64_t r1, double* out) {
  std::fill(out, out + t.d, 0.0);
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t d = 0; d < t.d; ++d) out[d] += load_as_float(t.data, t.dtype, t.index(b, h, r, d));
  const double n = double((h1 - h0) * (r1 - r0));
  for (int64_t d = 0; d < t.d; ++d) out[d] /= n;
}

// allowed[j] for row (b, g, i): [0, Nk), causal, and the candidate lists (their union).
void allowed_blocks(const GateArgs& a, const GateShape& s, int64_t b, int64_t g, int64_t i,
                    std::vector<char>& allowed) {
  const AttentionLayout* c = a.candidates;
  std::fill(allowed.begin(), allowed.end(), char(c == nullptr));
  if (c) {
    const int64_t cb = c->batch == 1 ? 0 : b;
    // heads == Hkv: the group's own list; == Hq: the union of the group's query heads; else 1.
    const int64_t h0 = c->heads == s.Hkv ? g : c->heads == s.Hq ? g * s.G : 0;
    const int64_t nh = c->heads == s.Hkv ? 1 : c->heads == s.Hq ? s.G : 1;
    auto mark = [&](const int32_t* num, const int32_t* idx, int64_t kmax) {
      for (int64_t h = h0; h < h0 + nh; ++h) {
        const int64_t row = (cb * c->heads + h) * c->q_blocks + i;
        for (int64_t e = 0; e < num[row]; ++e) allowed[size_t(idx[row * kmax + e])] = 1;
      }
    };
    mark(c->kv_num_blocks, c->kv_indices, c->kmax);
    if (c->has_full()) mark(c->full_kv_num_blocks, c->full_kv_indices, c->full_kmax);
  }
  if (a.causal)
    for (int64_t j = 0; j < s.Nk; ++j)
      if (!gate_causal_allows(i, j, s.block, s.Sq)) allowed[size_t(j)] = 0;
  if (a.cu_seqlens) {
    int64_t first, end;
    gate_sequence_blocks(a.cu_seqlens, a.num_seqs, i, s.block, s.Sq, first, end);
    for (int64_t j = 0; j < s.Nk; ++j)
      if (j < first || j >= end) allowed[size_t(j)] = 0;
  }
}

}  // namespace

void gate_cpu(const GateArgs& a, const GateShape& s) {
  const int64_t D = s.D, Mq = s.Mq, Nk = s.Nk;
  const bool given = a.given_scores != nullptr;
  // Scratch: the pooled k of one key/value head and one row's scores (Nk each; a query block's
  // pooled q is made when its row is, so nothing here grows with Sq).
  check_scratch(double(Nk) * double((given ? 0 : D * 8) + 9),
                "k.s = " + std::to_string(s.Skv) + " (" + std::to_string(Nk) + " key blocks of " +
                    std::to_string(s.block) + ")",
                "the CPU gate's pooled keys and scores");
  std::vector<double> pq(given ? 0 : size_t(D)), pk(given ? 0 : size_t(Nk * D));
  std::vector<double> score(static_cast<size_t>(Nk));
  std::vector<char> allowed(static_cast<size_t>(Nk));
  std::vector<int64_t> pick;
  std::vector<int32_t> chosen;
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t g = 0; g < s.Hkv; ++g) {
      if (!given)
        for (int64_t j = 0; j < Nk; ++j)
          pool(a.k, b, g, g + 1, j * s.block, std::min(s.Skv, (j + 1) * s.block), &pk[size_t(j * D)]);
      for (int64_t i = 0; i < Mq; ++i) {
        const int64_t row = (b * s.Hkv + g) * Mq + i;
        allowed_blocks(a, s, b, g, i, allowed);
        if (!given && Nk > 0)
          pool(a.q, b, g * s.G, (g + 1) * s.G, i * s.block, std::min(s.Sq, (i + 1) * s.block), pq.data());
        for (int64_t j = 0; j < Nk; ++j) {
          double v = 0;
          if (given) {
            v = a.given_scores[row * Nk + j];
          } else {
            for (int64_t d = 0; d < D; ++d) v += pq[size_t(d)] * pk[size_t(j * D + d)];
            v *= double(s.scale);
          }
          score[size_t(j)] = v;
          if (a.scores) a.scores[row * Nk + j] = allowed[size_t(j)] ? float(v) : -INFINITY;
        }
        // Always-on blocks first, then the best `topk` of the other allowed blocks.
        chosen.clear();
        pick.clear();
        int64_t first = 0, end = Nk;
        if (a.cu_seqlens) gate_sequence_blocks(a.cu_seqlens, a.num_seqs, i, s.block, s.Sq, first, end);
        for (int64_t j = 0; j < Nk; ++j) {
          if (!allowed[size_t(j)]) continue;
          if (gate_always_on(i, j, a.sink, a.local, first))
            chosen.push_back(int32_t(j));
          else if (score[size_t(j)] > -INFINITY)  // -inf and NaN are never picked
            pick.push_back(j);
        }
        const size_t k = std::min(pick.size(), size_t(a.topk));
        std::partial_sort(pick.begin(), pick.begin() + std::ptrdiff_t(k), pick.end(), [&](int64_t x, int64_t y) {
          return score[size_t(x)] > score[size_t(y)] || (score[size_t(x)] == score[size_t(y)] && x < y);
        });
        for (size_t e = 0; e < k; ++e) chosen.push_back(int32_t(pick[e]));
        std::sort(chosen.begin(), chosen.end());
        a.kv_num_blocks[row] = int32_t(chosen.size());
        for (int64_t e = 0; e < a.kmax; ++e)
          a.kv_indices[row * a.kmax + e] = e < int64_t(chosen.size()) ? chosen[size_t(e)] : 0;
      }
    }
  }
}

}  // namespace sparsek
