// The distributed DSD's host pieces: the nnzb-balanced partition of block rows and the cross-rank
// comparison of the problem (partition.hpp).
#include "plan/partition.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "plan/plan_internal.hpp"

namespace sparsek {

std::vector<int64_t> partition_block_rows(const int32_t* row_ptr, int64_t mb, int ranks) {
  if (ranks < 1)
    throw Error(Status::invalid_argument, "partition: ranks=" + std::to_string(ranks) + " must be >= 1");
  if (mb < 0) throw Error(Status::invalid_argument, "partition: mb=" + std::to_string(mb) + " must be >= 0");
  if (!row_ptr) throw Error(Status::invalid_argument, "partition: row_ptr is null");
  // The search below needs a valid row_ptr (0 first, never decreasing): on any other it would
  // return bounds that split nothing evenly, without a word.
  if (row_ptr[0] != 0)
    throw Error(Status::invalid_argument, "partition: row_ptr[0]=" + std::to_string(row_ptr[0]) + " must be 0");
  for (int64_t i = 1; i <= mb; ++i)
    if (row_ptr[i] < row_ptr[i - 1])
      throw Error(Status::invalid_argument, "partition: row_ptr[" + std::to_string(i) + "]=" +
                                                std::to_string(row_ptr[i]) + " is less than row_ptr[" +
                                                std::to_string(i - 1) + "]=" + std::to_string(row_ptr[i - 1]) +
                                                " (row_ptr must be non-decreasing)");
  return balanced_bounds(row_ptr, mb, ranks);
}

RankProblem describe(const GemmArgs& g, const DistributedOptions& o, const int32_t* row_ptr, const int32_t* col_idx) {
  RankProblem p;
  p.v[RankProblem::m] = g.sparse.rows;
  p.v[RankProblem::k] = g.sparse.cols;
  p.v[RankProblem::n] = g.c.cols;
  p.v[RankProblem::bm] = g.sparse.bm;
  p.v[RankProblem::bk] = g.sparse.bk;
  p.v[RankProblem::nnzb] = g.sparse.nnzb;
  p.v[RankProblem::a_dtype] = int64_t(g.sparse.dtype);
  p.v[RankProblem::b_dtype] = int64_t(g.b.dtype);
  p.v[RankProblem::c_dtype] = int64_t(g.c.dtype);
  p.v[RankProblem::b_layout] = int64_t(g.b.layout);
  p.v[RankProblem::c_layout] = int64_t(g.c.layout);
  p.v[RankProblem::b_ld] = g.b.ld;
  p.v[RankProblem::broadcast_root] = o.broadcast_root;
  p.v[RankProblem::all_gather] = o.all_gather;
  p.v[RankProblem::pattern_hash] = int64_t(hash_pattern(row_ptr, g.sparse.mb(), col_idx, g.sparse.nnzb));
  return p;
}

void check_same_problem(const std::vector<RankProblem>& ranks) {
  static const char* names[RankProblem::count] = {
      "M", "K", "N", "bm", "bk", "nnzb", "A.dtype", "B.dtype", "C.dtype", "B.layout", "C.layout", "B.ld",
      "broadcast_root", "all_gather", "pattern"};
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].status != 0)
      throw Error(Status(ranks[r].status), "distributed plan: rank " + std::to_string(r) + ": " +
                                               std::string(ranks[r].error, strnlen(ranks[r].error, sizeof ranks[r].error)));
  for (size_t r = 1; r < ranks.size(); ++r)
    for (int f = 0; f < RankProblem::count; ++f) {
      const int64_t got = ranks[r].v[f], want = ranks[0].v[f];
      if (got == want) continue;
      if (f == RankProblem::b_ld && ranks[0].v[RankProblem::broadcast_root] < 0) continue;
      std::string head = "distributed plan: the ranks describe different problems: rank " + std::to_string(r);
      if (f == RankProblem::pattern_hash)
        throw Error(Status::invalid_argument,
                    head + "'s pattern (row_ptr, col_idx) differs from rank 0's (same shapes and nnzb)");
      auto text = [f](int64_t x) -> std::string {  // enums by name when in range
        const bool dtype = f == RankProblem::a_dtype || f == RankProblem::b_dtype || f == RankProblem::c_dtype;
        const bool layout = f == RankProblem::b_layout || f == RankProblem::c_layout;
        if (dtype && x >= 0 && x <= 2) return to_string(DType(x));
        if (layout && (x == 0 || x == 1)) return to_string(Layout(x));
        return std::to_string(x);
      };
      throw Error(Status::invalid_argument, head + " has " + names[f] + "=" + text(got) + " but rank 0 has " +
                                                names[f] + "=" + text(want));
    }
}

}  // namespace sparsek
