// plan_attention_shards(): the host-side transfer plan of context-parallel block-sparse attention
// (include/sparsek/distributed.hpp). Plain C++: no CUDA, no NCCL.
#include <algorithm>
#include <string>
#include <vector>

#include "sparsek/distributed.hpp"
#include "plan/partition.hpp"

namespace sparsek {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(Status::invalid_argument, "plan_attention_shards: " + what);
}
std::string num(int64_t v) { return std::to_string(v); }

}  // namespace

int64_t AttentionShardRank::recv_blocks() const {
  int64_t n = 0;
  for (const auto& v : recv) n += int64_t(v.size());
  return n;
}

double AttentionShards::recv_bytes(int r, int64_t d, int64_t elem_bytes) const {
  return 2.0 * double(rank[size_t(r)].recv_blocks()) * double(block_kv) * double(d) * double(elem_bytes);
}

double AttentionShards::ring_bytes(int r, int64_t d, int64_t elem_bytes) const {
  const AttentionShardRank& x = rank[size_t(r)];
  const double others = double(batch * hkv) * double(kv_blocks - (x.kv_end - x.kv_begin));
  return 2.0 * others * double(block_kv) * double(d) * double(elem_bytes);
}

AttentionShards plan_attention_shards(const AttentionLayout& l, int64_t batch, int64_t hq, int64_t hkv, int64_t sq,
                                      int64_t skv, bool causal, int ranks) {
  if (ranks < 1) bad("ranks = " + num(ranks) + " must be >= 1");
  if (l.memory != Memory::host) bad("the layout must be in host memory (memory = " + num(int(l.memory)) + ")");
  if (batch < 1) bad("batch = " + num(batch) + " must be >= 1");
  if (hq < 1 || hkv < 1 || hq % hkv != 0) bad("hq = " + num(hq) + ", hkv = " + num(hkv) + ": hq must be a multiple of hkv >= 1");
  if (sq < 1 || skv < 1) bad("sq = " + num(sq) + ", skv = " + num(skv) + " must be >= 1");
  if (l.block_q < 1 || l.block_kv < 1) bad("block_q = " + num(l.block_q) + ", block_kv = " + num(l.block_kv) + " must be >= 1");
  const int64_t mq = (sq + l.block_q - 1) / l.block_q, nk = (skv + l.block_kv - 1) / l.block_kv;
  if (l.q_blocks != mq) bad("layout.q_blocks = " + num(l.q_blocks) + " differs from ceil(sq / block_q) = " + num(mq));
  if (l.batch != 1 && l.batch != batch) bad("layout.batch = " + num(l.batch) + " is neither 1 nor batch = " + num(batch));
  if (l.heads != 1 && l.heads != hq && l.heads != hkv)
    bad("layout.heads = " + num(l.heads) + " is neither 1, hq = " + num(hq) + " nor hkv = " + num(hkv));
  if (!l.kv_num_blocks || (l.kmax > 0 && !l.kv_indices)) bad("layout.kv_num_blocks or kv_indices is null");
  if (l.has_full() && (!l.full_kv_indices && l.full_kmax > 0)) bad("layout.full_kv_indices is null");
  const int64_t G = hq / hkv;
  // Per layout head: the key/value heads it names and the query heads each of its rows serves.
  const bool per_q = l.heads == hq && hq != hkv, per_kv = l.heads == hkv;
  const int64_t weight = l.heads == 1 ? hq : per_kv ? G : 1;
  auto kv_heads_of = [&](int64_t lh, int64_t& g0, int64_t& g1) {
    if (l.heads == 1) g0 = 0, g1 = hkv;
    else if (per_kv) g0 = lh, g1 = lh + 1;
    else g0 = per_q ? lh / G : lh, g1 = g0 + 1;
  };
  auto last_row = [&](int64_t i) { return std::min((i + 1) * l.block_q, sq) - 1; };
  // With causal a block of kv_indices past the row's last query is masked whole: never needed.
  // full_kv_indices blocks are attended whole (no element mask), so always needed.
  auto allowed = [&](int64_t i, int64_t j, int full) { return full || !causal || j * l.block_kv <= last_row(i); };
  auto diagonal = [&](int64_t i, int64_t j, int full) {
    return !full && causal && j * l.block_kv <= last_row(i) && (j + 1) * l.block_kv - 1 > i * l.block_q;  // a partial block
  };
  // Calls f(b_layout, layout head, j, full) for every needed entry of row i (both lists), checking
  // counts and indices (in range, sorted, unique, no block in both lists).
  std::vector<int64_t> partial;
  auto for_row = [&](int64_t i, auto&& f) {
    for (int64_t lb = 0; lb < l.batch; ++lb)
      for (int64_t lh = 0; lh < l.heads; ++lh)
        for (int full = 0; full < (l.has_full() ? 2 : 1); ++full) {
          const int32_t* cnt = full ? l.full_kv_num_blocks : l.kv_num_blocks;
          const int32_t* idx = full ? l.full_kv_indices : l.kv_indices;
          const int64_t kmax = full ? l.full_kmax : l.kmax;
          const int64_t row = (lb * l.heads + lh) * mq + i;
          const int64_t n = cnt[row];
          const char* name = full ? "full_kv" : "kv";
          auto where = [&](int64_t e) {
            return std::string("layout.") + name + "_indices[" + num(lb) + ", " + num(lh) + ", " + num(i) + ", " + num(e) + "] = ";
          };
          if (n < 0 || n > kmax)
            bad(std::string("layout.") + name + "_num_blocks[" + num(lb) + ", " + num(lh) + ", " + num(i) + "] = " + num(n) +
                " is out of range [0, " + num(kmax) + "]");
          if (!full) partial.assign(idx + row * kmax, idx + row * kmax + n);
          for (int64_t e = 0; e < n; ++e) {
            const int64_t j = idx[row * kmax + e];
            if (j < 0 || j >= nk) bad(where(e) + num(j) + " is out of range [0, " + num(nk) + ")");
            if (e > 0 && j <= idx[row * kmax + e - 1])
              bad(where(e) + num(j) + " is not above the entry before it (" + num(idx[row * kmax + e - 1]) +
                  "): a row's indices are sorted and unique");
            if (full && std::binary_search(partial.begin(), partial.end(), int32_t(j)))
              bad(where(e) + num(j) + " is in kv_indices of the same row too");
            if (allowed(i, j, full)) f(lb, lh, j, full);
          }
        }
  };

  // Work per query block row (half-block units): the batch copies a shared layout serves count too.
  const int64_t copies = l.batch == 1 ? batch : 1;
  std::vector<int64_t> prefix(size_t(mq) + 1, 0);
  for (int64_t i = 0; i < mq; ++i) {
    int64_t w = 0;
    for_row(i, [&](int64_t, int64_t, int64_t j, int full) { w += (diagonal(i, j, full) ? 1 : 2) * weight * copies; });
    prefix[size_t(i + 1)] = prefix[size_t(i)] + w;
  }
  AttentionShards out;
  out.ranks = ranks, out.batch = batch, out.hq = hq, out.hkv = hkv, out.q_blocks = mq, out.kv_blocks = nk;
  out.block_kv = l.block_kv;
  const std::vector<int64_t> qb = balanced_bounds(prefix.data(), mq, ranks);
  const bool self = sq == skv && l.block_q == l.block_kv;
  std::vector<int64_t> kb(size_t(ranks) + 1);
  for (int r = 0; r <= ranks; ++r) kb[size_t(r)] = self ? qb[size_t(r)] : nk * r / ranks;
  auto owner = [&](int64_t j) {  // the rank whose key/value range holds block j
    return int(std::upper_bound(kb.begin(), kb.end(), j) - kb.begin()) - 1;
  };
  out.rank.resize(size_t(ranks));
  std::vector<char> need(size_t(batch * hkv * nk));
  for (int r = 0; r < ranks; ++r) {
    AttentionShardRank& x = out.rank[size_t(r)];
    x.q_begin = qb[size_t(r)], x.q_end = qb[size_t(r + 1)];
    x.kv_begin = kb[size_t(r)], x.kv_end = kb[size_t(r + 1)];
    x.work = prefix[size_t(x.q_end)] - prefix[size_t(x.q_begin)];
    std::fill(need.begin(), need.end(), 0);
    for (int64_t i = x.q_begin; i < x.q_end; ++i)
      for_row(i, [&](int64_t lb, int64_t lh, int64_t j, int) {
        int64_t g0, g1;
        kv_heads_of(lh, g0, g1);
        const int64_t b0 = l.batch == 1 ? 0 : lb, b1 = l.batch == 1 ? batch : lb + 1;
        for (int64_t b = b0; b < b1; ++b)
          for (int64_t g = g0; g < g1; ++g) need[size_t((b * hkv + g) * nk + j)] = 1;
      });
    x.recv.assign(size_t(ranks), {});
    for (int64_t id = 0; id < int64_t(need.size()); ++id) {
      if (!need[size_t(id)]) continue;
      const int o = owner(id % nk);
      if (o == r) ++x.needed_local;
      else x.recv[size_t(o)].push_back(id);  // ascending: sorted and unique
    }
  }
  return out;
}

}  // namespace sparsek
