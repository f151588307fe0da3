// Internal (host): the pure pieces of the distributed plan, tested on the CPU. The partition itself
// (partition_block_rows) is public: include/sparsek/distributed.hpp.
#pragma once
#include <cstdint>
#include <vector>

#include "sparsek/distributed.hpp"

namespace sparsek {

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
