// Internal (host): the pure pieces of the distributed plan, tested on the CPU. The partition itself
// (partition_block_rows) is public: include/sparsek/distributed.hpp.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "sparsek/distributed.hpp"

namespace sparsek {

// Boundaries of `ranks` contiguous ranges of n items whose work prefix sums are prefix[0..n]
// (non-decreasing; the callers check it): boundary r is the item boundary whose prefix lies nearest
// the ideal r * total / ranks (exact integer arithmetic; a tie goes below), so every range's work is
// within one item of total / ranks; among boundaries with the same prefix (items without work
// between them) the one nearest the even split of items, which also spreads total = 0 evenly.
// bounds[0] = 0, bounds[ranks] = n, non-decreasing. The distributed DSD's block rows
// (partition_block_rows) and context-parallel attention's query blocks (plan_attention_shards).
template <class T>
std::vector<int64_t> balanced_bounds(const T* prefix, int64_t n, int ranks) {
  std::vector<int64_t> bounds(size_t(ranks) + 1, 0);
  bounds[size_t(ranks)] = n;
  const __int128 base = prefix[0], total = __int128(prefix[n]) - base;
  const T* end = prefix + n + 1;
  for (int r = 1; r < ranks; ++r) {
    const __int128 want2 = 2 * __int128(r) * total;  // twice the ideal prefix, times ranks
    auto scaled = [&](T x) { return 2 * __int128(ranks) * (__int128(x) - base); };
    const T* hi = std::partition_point(prefix, end, [&](T x) { return scaled(x) < want2; });  // first >= ideal
    const T* pick = hi;
    if (hi > prefix && (hi == end || want2 - scaled(hi[-1]) <= scaled(*hi) - want2)) pick = hi - 1;  // nearer below
    const T v = *pick;
    const int64_t lo_i = std::lower_bound(prefix, end, v) - prefix;
    const int64_t hi_i = std::upper_bound(prefix, end, v) - prefix - 1;
    const int64_t even = int64_t(r) * n / ranks;
    bounds[size_t(r)] = std::max(bounds[size_t(r - 1)], std::clamp(even, lo_i, hi_i));
  }
  return bounds;
}

// What every rank of a distributed product must agree on, and how its own planning went, as
// exchanged between the ranks (one plain struct each, gathered by NCCL at plan time): a rank whose
// checks failed still takes part in the exchange, so that every rank reports its error and none
// waits for it in a collective.
struct RankProblem {
  enum Field { m, k, n, bm, bk, nnzb, a_dtype, b_dtype, c_dtype, b_layout, c_layout, b_ld, broadcast_root,
               all_gather, pattern_hash, count };
  int64_t v[count] = {};
  int64_t status = 0;    // a Status: not ok when this rank's planning failed
  char error[512] = {};  // then its message (truncated, zero-terminated)
};
// The whole problem as this rank describes it (pattern: host copies of row_ptr, col_idx).
RankProblem describe(const GemmArgs& g, const DistributedOptions& o, const int32_t* row_ptr, const int32_t* col_idx);
// Throws the first failed rank's error (its status, "rank r: " + its message), else
// Error(invalid_argument) naming the first field where a rank differs from rank 0, with both
// values ("rank 2 has N=64 but rank 0 has N=72"). b_ld is compared only when B is broadcast.
void check_same_problem(const std::vector<RankProblem>& ranks);

}  // namespace sparsek
