// The transfer plan of context-parallel attention (plan_attention_shards) against brute force on
// random layouts: each rank receives exactly the key/value blocks its rows name that it does not
// hold (no more, none twice, each from its holder), ranks cover the query blocks in order with
// their work within one row of the ideal share, causal blocks past the diagonal are never needed,
// GQA layouts per query head / per key/value head / shared, batch layouts, full lists, one rank,
// more ranks than rows, cross-attention shapes, ring attention's bytes; and the named errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sparsek/distributed.hpp"

namespace sparsek::test {
namespace {

struct Layout {
  std::vector<int32_t> num, idx, fnum, fidx;
  AttentionLayout view;
};

// Random rows: each entry of a row a distinct key block, in [0, nk) or (causal) up to a little
// past the diagonal (the planner must drop those); some rows empty.
Layout random_layout(int64_t lbatch, int64_t heads, int64_t mq, int64_t nk, int64_t kmax, bool full, uint64_t seed,
                     int block = 128) {
  std::mt19937_64 rng(seed);
  Layout l;
  const int64_t rows = lbatch * heads * mq;
  // A valid layout: each row's indices sorted and unique, the full list disjoint from the other.
  auto fill = [&](std::vector<int32_t>& num, std::vector<int32_t>& idx, int64_t km, const std::vector<int32_t>* other,
                  int64_t other_km) {
    num.assign(size_t(rows), 0);
    idx.assign(size_t(rows * km), -1);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t> all;
      for (int64_t j = 0; j < nk; ++j) {
        const bool taken = other && std::find(other->begin() + r * other_km, other->begin() + (r + 1) * other_km,
                                              int32_t(j)) != other->begin() + (r + 1) * other_km;
        if (!taken) all.push_back(int32_t(j));
      }
      std::shuffle(all.begin(), all.end(), rng);
      const int64_t n = int64_t(rng() % uint64_t(std::min<int64_t>(km, int64_t(all.size())) + 1));
      num[size_t(r)] = int32_t(n);
      std::sort(all.begin(), all.begin() + n);
      std::copy(all.begin(), all.begin() + n, idx.begin() + r * km);
    }
  };
  fill(l.num, l.idx, kmax, nullptr, 0);
  if (full) fill(l.fnum, l.fidx, 2, &l.idx, kmax);
  AttentionLayout& v = l.view;
  v.kv_num_blocks = l.num.data(), v.kv_indices = l.idx.data();
  if (full) v.full_kv_num_blocks = l.fnum.data(), v.full_kv_indices = l.fidx.data(), v.full_kmax = 2;
  v.batch = lbatch, v.heads = heads, v.q_blocks = mq, v.kmax = kmax;
  v.block_q = v.block_kv = block;
  v.memory = Memory::host;
  return l;
}

struct Case {
  int64_t batch = 1, hq = 4, hkv = 2, lbatch = 1, heads = 4, sq = 128 * 20, skv = 128 * 20, kmax = 5;
  bool causal = false, full = false;
  int ranks = 3;
  uint64_t seed = 1;
};

void check(const Case& c) {
  SCOPED_TRACE("batch " + std::to_string(c.batch) + " hq " + std::to_string(c.hq) + " hkv " + std::to_string(c.hkv) +
               " layout heads " + std::to_string(c.heads) + " ranks " + std::to_string(c.ranks) +
               (c.causal ? " causal" : "") + (c.full ? " full" : "") + " seed " + std::to_string(c.seed));
  const int64_t mq = (c.sq + 127) / 128, nk = (c.skv + 127) / 128;
  Layout l = random_layout(c.lbatch, c.heads, mq, nk, c.kmax, c.full, c.seed);
  const AttentionShards p = plan_attention_shards(l.view, c.batch, c.hq, c.hkv, c.sq, c.skv, c.causal, c.ranks);
  ASSERT_EQ(int(p.rank.size()), c.ranks);
  const int64_t G = c.hq / c.hkv;
  // Brute force: the ids each query block row needs, and its work.
  auto needs = [&](int64_t i) {
    std::set<int64_t> s;
    for (int64_t lb = 0; lb < c.lbatch; ++lb)
      for (int64_t lh = 0; lh < c.heads; ++lh)
        for (int full = 0; full < (c.full ? 2 : 1); ++full) {
          const auto& num = full ? l.fnum : l.num;
          const auto& idx = full ? l.fidx : l.idx;
          const int64_t km = full ? 2 : c.kmax, row = (lb * c.heads + lh) * mq + i;
          for (int64_t e = 0; e < num[size_t(row)]; ++e) {
            const int64_t j = idx[size_t(row * km + e)];
            if (!full && c.causal && j * 128 > std::min((i + 1) * 128, c.sq) - 1) continue;  // masked whole
            for (int64_t h = 0; h < c.hq; ++h) {  // every query head the row serves
              const bool serves = c.heads == 1 || (c.heads == c.hq && h == lh) || (c.heads == c.hkv && c.heads != c.hq && h / G == lh);
              if (!serves) continue;
              for (int64_t b = 0; b < c.batch; ++b)
                if (c.lbatch == 1 || b == lb) s.insert((b * c.hkv + h / G) * nk + j);
            }
          }
        }
    return s;
  };
  int64_t prev_end = 0, total = 0;
  for (int r = 0; r < c.ranks; ++r) {
    const AttentionShardRank& x = p.rank[size_t(r)];
    EXPECT_EQ(x.q_begin, prev_end) << "rank " << r;
    prev_end = x.q_end;
    total += x.work;
    std::set<int64_t> want;
    for (int64_t i = x.q_begin; i < x.q_end; ++i) {
      const auto s = needs(i);
      want.insert(s.begin(), s.end());
    }
    std::set<int64_t> got;
    int64_t local = 0;
    for (int o = 0; o < c.ranks; ++o) {
      const auto& v = x.recv[size_t(o)];
      EXPECT_TRUE(std::is_sorted(v.begin(), v.end())) << "rank " << r << " from " << o;
      if (o == r) EXPECT_TRUE(v.empty()) << "rank " << r << " receives from itself";
      for (int64_t id : v) {
        const int64_t j = id % nk;
        EXPECT_TRUE(j >= p.rank[size_t(o)].kv_begin && j < p.rank[size_t(o)].kv_end) << "block " << j << " is not rank " << o << "'s";
        EXPECT_TRUE(got.insert(id).second) << "id " << id << " received twice";
      }
    }
    for (int64_t id : want)
      if (id % nk >= x.kv_begin && id % nk < x.kv_end) ++local;
      else EXPECT_TRUE(got.count(id)) << "rank " << r << " misses id " << id;
    for (int64_t id : got) EXPECT_TRUE(want.count(id)) << "rank " << r << " receives unneeded id " << id;
    EXPECT_EQ(x.needed_local, local) << "rank " << r;
    EXPECT_EQ(x.recv_blocks(), int64_t(got.size()));
    EXPECT_DOUBLE_EQ(p.recv_bytes(r, 128, 2), 2.0 * double(got.size()) * 128 * 128 * 2);
    EXPECT_DOUBLE_EQ(p.ring_bytes(r, 128, 2),
                     2.0 * double(c.batch * c.hkv * (nk - (x.kv_end - x.kv_begin))) * 128 * 128 * 2);
  }
  EXPECT_EQ(prev_end, mq);
  // Balance: each share within one row's work of the ideal (each boundary is the one nearest its
  // ideal prefix); a row weighs at most row_cap half-block units.
  for (int r = 0; r < c.ranks; ++r) {
    const double ideal = double(total) / c.ranks;
    const int64_t row_cap = 2 * (c.kmax + (c.full ? 2 : 0)) * c.lbatch * c.heads * (c.heads == 1 ? c.hq : c.heads == c.hkv ? G : 1) *
                            (c.lbatch == 1 ? c.batch : 1);
    EXPECT_LE(double(p.rank[size_t(r)].work), ideal + double(row_cap)) << "rank " << r;
  }
}

TEST(AttentionShards, RandomLayoutsMatchBruteForce) {
  uint64_t seed = 1;
  for (bool causal : {false, true})
    for (bool full : {false, true})
      for (int ranks : {1, 2, 3, 4})
        for (auto [hq, hkv, heads] : {std::tuple{4, 4, 4}, std::tuple{8, 2, 8}, std::tuple{8, 2, 2}, std::tuple{8, 2, 1}}) {
          Case c;
          c.hq = hq, c.hkv = hkv, c.heads = heads, c.causal = causal, c.full = full, c.ranks = ranks, c.seed = seed++;
          check(c);
        }
}

TEST(AttentionShards, BatchLayoutsAndSharedLayouts) {
  for (int64_t lbatch : {1, 3}) {
    Case c;
    c.batch = 3, c.lbatch = lbatch, c.heads = 2, c.hq = 4, c.hkv = 2, c.ranks = 2, c.causal = true, c.seed = 40 + lbatch;
    check(c);
  }
}

TEST(AttentionShards, MoreRanksThanRowsAndCrossAttention) {
  Case c;
  c.sq = 128 * 3, c.skv = 128 * 3, c.ranks = 5, c.seed = 7;
  check(c);
  Case x;  // cross-attention: key/value blocks split evenly, queries by work
  x.sq = 128 * 9 + 5, x.skv = 128 * 14, x.ranks = 3, x.seed = 8;
  check(x);
}

TEST(AttentionShards, OneRankReceivesNothing) {
  Layout l = random_layout(1, 2, 10, 10, 4, false, 3);
  const AttentionShards p = plan_attention_shards(l.view, 1, 2, 2, 1280, 1280, false, 1);
  EXPECT_EQ(p.rank[0].recv_blocks(), 0);
  EXPECT_EQ(p.ring_bytes(0, 64, 2), 0.0);
}

TEST(AttentionShards, ErrorsNameTheArgumentAndValue) {
  Layout l = random_layout(1, 2, 10, 10, 4, false, 5);
  auto expect = [&](const AttentionLayout& v, int64_t hq, int64_t hkv, int64_t sq, int ranks, const std::string& want) {
    try {
      plan_attention_shards(v, 1, hq, hkv, sq, 1280, false, ranks);
      ADD_FAILURE() << "no error, expected: " << want;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect(l.view, 2, 2, 1280, 0, "plan_attention_shards: ranks = 0 must be >= 1");
  expect(l.view, 3, 2, 1280, 2, "hq must be a multiple of hkv");
  expect(l.view, 2, 2, 1000, 2, "layout.q_blocks = 10 differs from ceil(sq / block_q) = 8");
  expect(l.view, 4, 4, 1280, 2, "layout.heads = 2 is neither 1, hq = 4 nor hkv = 4");
  AttentionLayout dev = l.view;
  dev.memory = Memory::device;
  expect(dev, 2, 2, 1280, 2, "the layout must be in host memory");
  l.idx[0] = 0, l.idx[1] = 1, l.idx[2] = 2, l.idx[3] = 10;
  l.num[0] = 4;
  expect(l.view, 2, 2, 1280, 2, "layout.kv_indices[0, 0, 0, 3] = 10 is out of range [0, 10)");
  l.num[0] = 9;
  expect(l.view, 2, 2, 1280, 2, "layout.kv_num_blocks[0, 0, 0] = 9 is out of range [0, 4]");
  l.idx[3] = 2, l.num[0] = 4;
  expect(l.view, 2, 2, 1280, 2,
         "layout.kv_indices[0, 0, 0, 3] = 2 is not above the entry before it (2): a row's indices are sorted and unique");
  l.idx[3] = 3;
  std::vector<int32_t> fnum(20, 0), fidx(40, 0);
  fnum[0] = 2, fidx[0] = 1, fidx[1] = 5;  // block 1 is in both lists of row (0, 0, 0)
  AttentionLayout both = l.view;
  both.full_kv_num_blocks = fnum.data(), both.full_kv_indices = fidx.data(), both.full_kmax = 2;
  expect(both, 2, 2, 1280, 2, "layout.full_kv_indices[0, 0, 0, 0] = 1 is in kv_indices of the same row too");
}

}  // namespace
}  // namespace sparsek::test
