// The distributed DSD's host pieces: the stored-block partition of block rows (balance within one
// block row of the ideal share, empty ranks, more ranks than rows, power-law rows, nnzb = 0), the
// cross-rank comparison of the problem, and the named errors that need no GPU and no NCCL.
#include <cstdlib>
#include <string>
#include <vector>

#include "core/nccl.hpp"
#include "plan/partition.hpp"
#include "sparsek/distributed.hpp"
#include "sparsek/sparsek.h"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<int32_t> row_ptr_of(const std::vector<int>& lengths) {
  std::vector<int32_t> rp{0};
  for (int l : lengths) rp.push_back(rp.back() + l);
  return rp;
}

// The partition's invariants and its balance: every rank's stored blocks within one block row
// (the longest row) of nnzb / ranks.
void check_partition(const std::vector<int32_t>& rp, int ranks) {
  const int64_t mb = int64_t(rp.size()) - 1, nnzb = rp.back();
  SCOPED_TRACE("mb=" + std::to_string(mb) + " nnzb=" + std::to_string(nnzb) + " ranks=" + std::to_string(ranks));
  std::vector<int64_t> b = partition_block_rows(rp.data(), mb, ranks);
  ASSERT_EQ(b.size(), size_t(ranks) + 1);
  EXPECT_EQ(b.front(), 0);
  EXPECT_EQ(b.back(), mb);
  int64_t longest = 0;
  for (int64_t i = 0; i < mb; ++i) longest = std::max<int64_t>(longest, rp[i + 1] - rp[i]);
  const double ideal = double(nnzb) / ranks;
  for (int r = 0; r < ranks; ++r) {
    ASSERT_LE(b[r], b[r + 1]) << "rank " << r;
    const int64_t share = rp[b[r + 1]] - rp[b[r]];
    EXPECT_LE(std::abs(double(share) - ideal), double(longest)) << "rank " << r << " holds " << share << " blocks";
  }
}

TEST(Partition, BalancedWithinOneBlockRowOnEveryPattern) {
  for (PatternKind kind : {PatternKind::fixed_k, PatternKind::bernoulli, PatternKind::power_law, PatternKind::banded,
                           PatternKind::block_diagonal, PatternKind::causal})
    for (int64_t mb : {1, 7, 64, 513})
      for (int ranks : {1, 2, 3, 4, 8, 13}) {
        Pattern p = make_pattern(kind, mb, 64, 0.125, uint64_t(mb * 31 + ranks));
        check_partition(p.row_ptr, ranks);
      }
}

TEST(Partition, PowerLawRowsBalanceStoredBlocksNotRowCounts) {
  Pattern p = make_pattern(PatternKind::power_law, 512, 64, 0.125, 7);  // the benchmark's kind of rows
  check_partition(p.row_ptr, 4);
  std::vector<int64_t> b = partition_block_rows(p.row_ptr.data(), 512, 4);
  // An even split of the rows would be far off the ideal share on these rows; ours is not.
  auto worst = [&](const std::vector<int64_t>& bounds) {
    double w = 0;
    for (int r = 0; r < 4; ++r) w = std::max(w, std::abs(double(p.row_ptr[bounds[r + 1]] - p.row_ptr[bounds[r]]) - p.nnzb() / 4.0));
    return w;
  };
  EXPECT_LT(worst(b), worst({0, 128, 256, 384, 512}));
  EXPECT_NE(b, (std::vector<int64_t>{0, 128, 256, 384, 512}));
}

TEST(Partition, ExactBoundaries) {
  auto bounds = [](const std::vector<int>& lengths, int ranks) {
    std::vector<int32_t> rp = row_ptr_of(lengths);
    return partition_block_rows(rp.data(), int64_t(lengths.size()), ranks);
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(bounds({1, 1, 1, 1, 1, 1, 1, 1}, 2), (V{0, 4, 8}));
  EXPECT_EQ(bounds({6, 1, 1, 1, 1, 1, 1}, 2), (V{0, 1, 7}));  // the long row alone is the half
  // Boundaries at the same prefix (empty rows between) split the rows evenly.
  EXPECT_EQ(bounds({8, 0, 0, 0, 0, 0, 0, 8}, 2), (V{0, 4, 8}));
  // nnzb = 0: every boundary has the same prefix, so the rows are split evenly.
  EXPECT_EQ(bounds({0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 4), (V{0, 2, 5, 7, 10}));
  // One rank: everything.
  EXPECT_EQ(bounds({3, 0, 5}, 1), (V{0, 3}));
  // mb = 0: every rank empty.
  EXPECT_EQ(bounds({}, 3), (V{0, 0, 0, 0}));
}

TEST(Partition, EmptyRanksAndMoreRanksThanRows) {
  // All blocks in one row: one rank holds it, the others are empty, and the balance still holds.
  std::vector<int32_t> one = row_ptr_of({0, 0, 0, 10, 0, 0, 0, 0});
  check_partition(one, 4);
  std::vector<int64_t> b = partition_block_rows(one.data(), 8, 4);
  int holders = 0;
  for (int r = 0; r < 4; ++r) holders += one[b[r + 1]] - one[b[r]] > 0;
  EXPECT_EQ(holders, 1);
  // 3 block rows over 8 ranks: every row owned exactly once, at most 3 ranks with rows.
  std::vector<int32_t> three = row_ptr_of({2, 5, 1});
  check_partition(three, 8);
  b = partition_block_rows(three.data(), 3, 8);
  int with_rows = 0;
  for (int r = 0; r < 8; ++r) with_rows += b[r + 1] > b[r];
  EXPECT_LE(with_rows, 3);
}

TEST(Partition, NamedErrors) {
  std::vector<int32_t> rp = row_ptr_of({1, 2});
  try {
    partition_block_rows(rp.data(), 2, 0);
    FAIL() << "ranks = 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_TRUE(contains(e.what(), "ranks=0 must be >= 1")) << e.what();
  }
  EXPECT_THROW(partition_block_rows(rp.data(), 2, -3), Error);
  EXPECT_THROW(partition_block_rows(nullptr, 2, 2), Error);
}

TEST(Partition, RowPtrThatIsNotABsrRowPtrIsNamed) {
  // A decreasing row_ptr (not a pattern at all) would otherwise give bounds that balance nothing.
  const std::vector<std::pair<std::vector<int32_t>, std::string>> cases = {
      {{0, 9, 3, 1}, "row_ptr[2]=3 is less than row_ptr[1]=9"},
      {{0, 2, 2, 1, 5}, "row_ptr[3]=1 is less than row_ptr[2]=2"},
      {{0, -1}, "row_ptr[1]=-1 is less than row_ptr[0]=0"},
      {{4, 6, 8}, "row_ptr[0]=4 must be 0"},
  };
  for (const auto& [rp, part] : cases) {
    try {
      partition_block_rows(rp.data(), int64_t(rp.size()) - 1, 2);
      ADD_FAILURE() << "accepted; wanted: " << part;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  }
}

// Two ranks' descriptions of a 256x128 (64x64 blocks) by 128x72 product.
struct TwoRanks {
  // block rows of lengths 1, 2, 1, 2 over 2 block columns
  BsrMatrix a{256, 128, 64, 64, {0, 1, 3, 4, 6}, {0, 0, 1, 1, 0, 1}, DType::f16};
  GemmArgs g;
  DistributedOptions o;
  TwoRanks() {
    g.sparse = a.view();
    g.b = DenseView{nullptr, 128, 72, 72, Layout::row_major, DType::f16, Memory::device};
    g.c = DenseView{nullptr, 256, 72, 72, Layout::row_major, DType::f16, Memory::device};
  }
  RankProblem desc(const GemmArgs& x) const { return describe(x, o, x.sparse.row_ptr, x.sparse.col_idx); }
};

std::string mismatch(const std::vector<RankProblem>& ranks) {
  try {
    check_same_problem(ranks);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    return e.what();
  }
  return "";
}

TEST(DistributedCheck, RanksMustDescribeTheSameProblem) {
  TwoRanks t;
  EXPECT_EQ(mismatch({t.desc(t.g), t.desc(t.g)}), "");
  GemmArgs other = t.g;  // mismatched shapes across ranks
  other.b.cols = other.c.cols = other.b.ld = other.c.ld = 64;
  EXPECT_TRUE(contains(mismatch({t.desc(t.g), t.desc(other)}), "rank 1 has N=64 but rank 0 has N=72"));
  other = t.g;
  other.c.dtype = DType::f32;
  EXPECT_TRUE(contains(mismatch({t.desc(t.g), t.desc(t.g), t.desc(other)}), "rank 2 has C.dtype=f32 but rank 0 has C.dtype=f16"));
  // The same shapes and nnzb but another pattern: block row 0's block moved to another column.
  std::vector<int32_t> rp = t.a.row_ptr(), cols = t.a.col_idx();
  ASSERT_EQ(rp[1] - rp[0], 1) << "the test wants one block in row 0";
  cols[0] = (cols[0] + 1) % 2;
  other = t.g;
  other.sparse.col_idx = cols.data();
  EXPECT_TRUE(contains(mismatch({t.desc(t.g), t.desc(other)}), "rank 1's pattern (row_ptr, col_idx) differs from rank 0's"));
  // B's ld matters only when B is broadcast.
  other = t.g;
  other.b.ld = 80;
  EXPECT_EQ(mismatch({t.desc(t.g), t.desc(other)}), "");
  t.o.broadcast_root = 0;
  EXPECT_TRUE(contains(mismatch({t.desc(t.g), t.desc(other)}), "rank 1 has B.ld=80 but rank 0 has B.ld=72"));
  // Options too.
  TwoRanks u;
  u.o.all_gather = true;
  EXPECT_TRUE(contains(mismatch({t.desc(t.g), u.desc(u.g)}), "rank 1 has"));
}

TEST(DistributedCheck, AFailedRankIsReportedOnEveryRank) {
  TwoRanks t;
  std::vector<RankProblem> all{t.desc(t.g), RankProblem{}};
  all[1].status = int64_t(Status::unsupported);
  std::snprintf(all[1].error, sizeof all[1].error, "no variant supports this problem");
  try {
    check_same_problem(all);
    FAIL() << "a failed rank was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_TRUE(contains(e.what(), "rank 1: no variant supports this problem")) << e.what();
  }
}

TEST(Distributed, NullCommunicatorIsANamedError) {
  TwoRanks t;
  try {
    plan_distributed(t.g, nullptr);
    FAIL() << "null communicator accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_TRUE(contains(e.what(), "comm is null")) << e.what();
  }
  try {
    plan_distributed(std::vector<GemmArgs>{t.g}, std::vector<ncclComm*>{}, {});
    FAIL() << "no communicators accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "comms is empty")) << e.what();
  }
  try {
    run(DistributedPlan(), t.g, nullptr);
    FAIL() << "empty plan ran";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "the distributed plan is empty")) << e.what();
  }
}

TEST(Distributed, CApiNamedErrors) {
  TwoRanks t;
  sparsek_gemm_args args{};
  args.kind = SPARSEK_DSD;
  sparsek_dist_plan p = reinterpret_cast<sparsek_dist_plan>(&t);  // must be reset to NULL
  EXPECT_EQ(sparsek_dist_plan_create(&p, &args, nullptr, nullptr, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_TRUE(contains(sparsek_last_error(), "sparsek_dist_plan_create: distributed plan: comm is null"))
      << sparsek_last_error();
  EXPECT_EQ(sparsek_dist_plan_run(nullptr, &args, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(sparsek_last_error(), "argument 'plan' is NULL"));
  EXPECT_EQ(sparsek_dist_plan_destroy(nullptr), SPARSEK_OK);
  EXPECT_EQ(sparsek_dist_plan_destroy(reinterpret_cast<sparsek_dist_plan>(&t)), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(sparsek_last_error(), "not made by sparsek_dist_plan_create")) << sparsek_last_error();
  int64_t r0 = 0, r1 = 0;
  EXPECT_EQ(sparsek_dist_plan_rows(reinterpret_cast<sparsek_dist_plan>(&t), &r0, &r1), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(sparsek_nccl_version(nullptr), SPARSEK_INVALID_ARGUMENT);
}

// An NCCL call that fails has a status of its own and a message naming NCCL, the call, NCCL's text
// and its result code by name, for every code NCCL has (the library need not be loaded for that).
TEST(Distributed, NcclFailuresAreNcclErrors) {
  const std::pair<int, const char*> codes[] = {{1, "ncclUnhandledCudaError = 1"}, {2, "ncclSystemError = 2"},
                                               {3, "ncclInternalError = 3"},      {4, "ncclInvalidArgument = 4"},
                                               {5, "ncclInvalidUsage = 5"},       {6, "ncclRemoteError = 6"},
                                               {7, "ncclInProgress = 7"},         {42, "ncclResult = 42"}};
  for (const auto& [code, name] : codes) {
    try {
      nccl::check(code, "ncclCommCount");
      ADD_FAILURE() << "code " << code << " passed";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::nccl_error);
      EXPECT_TRUE(contains(e.what(), "NCCL: ncclCommCount failed: ")) << e.what();
      EXPECT_TRUE(contains(e.what(), name)) << e.what();
    }
  }
  EXPECT_NO_THROW(nccl::check(0, "ncclCommCount"));
  EXPECT_STREQ(to_string(Status::nccl_error), "NCCL error");
}

// A communicator NCCL does not recognise (here: zeroed memory, whose magic numbers are wrong),
// through the C++ and the C API: NCCL's invalid-argument error as SPARSEK_NCCL_ERROR, never a CUDA
// error.
TEST(Distributed, InvalidCommunicatorIsAnNcclError) {
  int version = 0;
  if (sparsek_nccl_version(&version) != SPARSEK_OK) GTEST_SKIP() << "NCCL cannot be loaded: " << sparsek_last_error();
  TwoRanks t;
  std::vector<uint64_t> zeros(size_t(1) << 21);  // 16 MiB: more than NCCL's communicator struct
  auto* comm = reinterpret_cast<ncclComm*>(zeros.data());
  try {
    plan_distributed(t.g, comm);
    ADD_FAILURE() << "an invalid communicator was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::nccl_error) << e.what();
    EXPECT_TRUE(contains(e.what(), "NCCL: ncclCommCount failed")) << e.what();
    EXPECT_TRUE(contains(e.what(), "ncclInvalidArgument")) << e.what();
  }
  sparsek_gemm_args args{};
  args.kind = SPARSEK_DSD;
  args.sparse = to_c(t.g.sparse);
  args.b = to_c(t.g.b);
  args.c = to_c(t.g.c);
  args.alpha = 1.f;
  sparsek_dist_plan p = nullptr;
  EXPECT_EQ(sparsek_dist_plan_create(&p, &args, comm, nullptr, nullptr), SPARSEK_NCCL_ERROR) << sparsek_last_error();
  EXPECT_TRUE(contains(sparsek_last_error(), "NCCL: ncclCommCount failed")) << sparsek_last_error();
  EXPECT_STREQ(sparsek_status_string(SPARSEK_NCCL_ERROR), "NCCL error");
}

// NCCL that cannot be loaded: a named error saying what was tried and how to fix it. (Each test
// runs in its own process under ctest; nothing else in this binary loads NCCL.)
TEST(Distributed, MissingNcclIsANamedError) {
  const char* before = std::getenv("SPARSEK_NCCL_LIBRARY");
  std::string saved = before ? before : "";
  setenv("SPARSEK_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  int v = 0;
  sparsek_status s = sparsek_nccl_version(&v);
  std::string text = sparsek_last_error();
  if (before) setenv("SPARSEK_NCCL_LIBRARY", saved.c_str(), 1);
  else unsetenv("SPARSEK_NCCL_LIBRARY");
  if (s == SPARSEK_OK) GTEST_SKIP() << "NCCL was already loaded in this process (version " << v << ")";
  EXPECT_EQ(s, SPARSEK_UNSUPPORTED);
  EXPECT_TRUE(contains(text, "NCCL is not available")) << text;
  EXPECT_TRUE(contains(text, "/nonexistent/libnccl.so.2")) << text;
  EXPECT_TRUE(contains(text, "SPARSEK_NCCL_LIBRARY")) << text;
}

}  // namespace
}  // namespace sparsek::test
