// The distributed DSD over real NCCL communicators made here (sparsek itself never makes one),
// through the library's own NCCL loader: one rank on one GPU gives the one-GPU plan/run result bit
// for bit (plain, B broadcast + all-gather, captured in a CUDA graph); 2 and 4 ranks (when as many
// GPUs answer) give it for every rank's rows of C, and with the all-gather for all of C; ranks that
// describe different problems get a named error. Skips without a GPU, or when NCCL cannot be loaded.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/nccl.hpp"
#include "distributed_util.hpp"
#include "sparsek/distributed.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

#define REQUIRE_NCCL()                                                        \
  do {                                                                        \
    try {                                                                     \
      nccl::api();                                                            \
    } catch (const Error& e) {                                                \
      GTEST_SKIP() << e.what();                                               \
    }                                                                         \
  } while (0)

// A step of a test: named in a failure's trace, and printed at once (stderr is unbuffered) so that a
// crash, which gtest reports nothing for, shows the step it happened in. Declares a scoped trace:
// use it as a statement of its own in the step's block.
#define STEP(text)      \
  SCOPED_TRACE(text);   \
  std::fprintf(stderr, "[   STEP   ] %s\n", std::string(text).c_str())

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The product, on the host: C = A * B, f16 in, f16 out, 64x64 blocks, N = 520 (not a tile multiple).
struct Problem {
  BsrMatrix a;
  HostDense b{0, 0, DType::f16}, c{0, 0, DType::f16};
  Problem(PatternKind kind, int64_t m = 4096, int64_t k = 1024, int64_t n = 520)
      : a(random_bsr(kind, m, k, 64, 64, 0.125, DType::f16, 21)), b(k, n, DType::f16), c(m, n, DType::f16) {
    b.fill_random(22);
    c.fill(nan_value());  // poison: beta = 0 must not read it, and every row must be written
  }
};

// The problem's operands on the current device.
struct OnDevice {
  std::unique_ptr<Dev> rp, ci, val, b, c;
  GemmArgs g;
  OnDevice(Problem& p, bool real_b = true) {
    rp = std::make_unique<Dev>(p.a.row_ptr().data(), p.a.row_ptr().size() * 4);
    ci = std::make_unique<Dev>(p.a.col_idx().data(), p.a.col_idx().size() * 4);
    val = std::make_unique<Dev>(p.a.value_bytes().data(), p.a.value_bytes().size());
    std::vector<uint8_t> poison_b(p.b.bytes.size());
    for (size_t i = 0; i + 1 < poison_b.size(); i += 2) poison_b[i + 1] = 0x7e;  // f16 NaN (0x7e00)
    b = std::make_unique<Dev>(real_b ? p.b.bytes.data() : poison_b.data(), p.b.bytes.size());
    c = std::make_unique<Dev>(p.c.bytes.data(), p.c.bytes.size());
    g.kind = OpKind::dsd;
    g.sparse = p.a.view();
    g.sparse.row_ptr = static_cast<const int32_t*>(rp->p);
    g.sparse.col_idx = static_cast<const int32_t*>(ci->p);
    g.sparse.values = val->p;
    g.sparse.memory = Memory::device;
    g.b = p.b.view;
    g.b.data = b->p;
    g.b.memory = Memory::device;
    g.c = p.c.view;
    g.c.data = c->p;
    g.c.memory = Memory::device;
  }
};

// The one-GPU result (plan/run on device 0), C's bytes.
std::vector<uint8_t> one_gpu(Problem& p) {
  if (cudaSetDevice(0) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
  OnDevice d(p);
  Plan pl = plan(d.g);
  run(pl, d.g, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("one-GPU run failed");
  return d.c->download();
}

// Checks that rows [r0, r1) of `got` (C's bytes) are bit-identical to `want`'s, and (when
// `others_poisoned`) that the other rows still hold the poison.
void expect_rows(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::vector<uint8_t>& poison,
                 int64_t r0, int64_t r1, int64_t row_bytes, bool others_poisoned, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  const size_t a = size_t(r0 * row_bytes), b = size_t(r1 * row_bytes);
  EXPECT_EQ(std::memcmp(got.data() + a, want.data() + a, b - a), 0) << what << ": rows [" << r0 << ", " << r1
                                                                      << ") differ from the one-GPU result";
  if (others_poisoned) {
    EXPECT_EQ(std::memcmp(got.data(), poison.data(), a), 0) << what << ": rows before the shard were written";
    EXPECT_EQ(std::memcmp(got.data() + b, poison.data() + b, got.size() - b), 0) << what << ": rows after the shard were written";
  }
}

bool has_nan_f16(const std::vector<uint8_t>& c) {
  for (size_t i = 0; i + 1 < c.size(); i += 2) {
    uint16_t h = uint16_t(c[i] | c[i + 1] << 8);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) return true;
  }
  return false;
}

TEST(DistributedGpu, OneRankIsBitIdenticalToOneGpu) {
  SPARSEK_REQUIRE_GPU();
  REQUIRE_NCCL();
  for (PatternKind kind : {PatternKind::fixed_k, PatternKind::power_law}) {
    SCOPED_TRACE(to_string(kind));
    Problem p(kind);
    const std::vector<uint8_t> want = one_gpu(p);
    ASSERT_FALSE(has_nan_f16(want)) << "the one-GPU result left poison in C";
    CUDA_OK(cudaSetDevice(0));
    Comms comms(1);
    for (int mode = 0; mode < 2; ++mode) {  // plain; B broadcast from rank 0 + all-gather
      DistributedOptions o;
      o.broadcast_root = mode ? 0 : -1;
      o.all_gather = mode == 1;
      OnDevice d(p);
      DistributedPlan dp = plan_distributed(d.g, comms.c[0], o);
      EXPECT_EQ(dp.ranks(), 1);
      EXPECT_EQ(dp.rank(), 0);
      EXPECT_EQ(dp.row_begin(), 0);
      EXPECT_EQ(dp.row_end(), p.a.mb());
      EXPECT_EQ(dp.local_nnzb(), p.a.nnzb());
      run(dp, d.g, nullptr);
      run(dp, d.g, nullptr);  // planned once, run many times
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(d.c->download(), want) << "mode " << mode;
    }
  }
}

TEST(DistributedGpu, OneRankRunIsGraphCapturable) {
  SPARSEK_REQUIRE_GPU();
  REQUIRE_NCCL();
  Problem p(PatternKind::power_law, 1024, 512, 200);
  const std::vector<uint8_t> want = one_gpu(p);
  CUDA_OK(cudaSetDevice(0));
  Comms comms(1);
  OnDevice d(p);
  DistributedOptions o;
  o.broadcast_root = 0;
  o.all_gather = true;
  DistributedPlan dp = plan_distributed(d.g, comms.c[0], o);
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Global capture mode: any allocation or synchronizing call inside run() fails the capture.
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  std::string failure;
  try {
    run(dp, d.g, s);
  } catch (const Error& e) {
    failure = e.what();
  }
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_EQ(failure, "") << "run() failed under stream capture";
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(d.c->download(), want);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// One rank on device 0 (made current first) with a small problem, and plan_distributed's error.
struct OneRank {
  Problem p{PatternKind::fixed_k, 256, 128, 64};
  Comms comms{1};
  OnDevice d{p};
  // The error plan_distributed throws for (g, o) ("" when it plans), with its status.
  std::string error(const GemmArgs& g, const DistributedOptions& o, Status* status = nullptr) {
    try {
      plan_distributed(g, comms.c[0], o);
    } catch (const Error& e) {
      if (status) *status = e.status();
      return e.what();
    }
    return "";
  }
};

// Each bad argument gets its named error on a one-rank communicator (the failed rank still takes
// part in the exchange; its error comes back from the comparison).
TEST(DistributedGpu, NamedErrorsWithACommunicator) {
  SPARSEK_REQUIRE_GPU();
  REQUIRE_NCCL();
  CUDA_OK(cudaSetDevice(0));
  OneRank one;
  const GemmArgs& good = one.d.g;
  auto expect_error = [&](const GemmArgs& g, const DistributedOptions& o, const std::string& part) {
    Status st = Status::ok;
    const std::string got = one.error(g, o, &st);
    EXPECT_TRUE(contains(got, part)) << "got \"" << got << "\"";
    EXPECT_EQ(st, Status::invalid_argument) << got;
  };
  {
    STEP("B with other rows than A's columns");
    GemmArgs g = good;
    g.b.rows = 64;
    expect_error(g, {}, "rank 0: B must be");
  }
  {
    STEP("op = trans");
    GemmArgs g = good;
    g.op = Op::trans;
    expect_error(g, {}, "op must be none");
  }
  {
    STEP("C in host memory");
    GemmArgs g = good;
    g.c.memory = Memory::host;
    expect_error(g, {}, "must be in device memory");
  }
  {
    STEP("broadcast_root = 1 with 1 rank");
    DistributedOptions o;
    o.broadcast_root = 1;
    expect_error(good, o, "broadcast_root=1 is not a rank of the communicator (1 ranks)");
  }
  {
    STEP("all_gather with padded C");
    DistributedOptions o;
    o.all_gather = true;
    HostDense padded(one.p.c.view.rows, one.p.c.view.cols, DType::f16, Layout::row_major, 8);
    Dev cpad(padded.bytes.data(), padded.bytes.size());
    GemmArgs g = good;
    g.c.ld = g.c.cols + 8;
    g.c.data = cpad.p;
    expect_error(g, o, "all_gather needs C row-major with ld == N");
  }
}

// After named errors (exchanges that ended in a throw), the communicator still plans and runs: the
// one-rank result is the one-GPU result, with B broadcast and C gathered.
TEST(DistributedGpu, PlanAndRunAfterNamedErrors) {
  SPARSEK_REQUIRE_GPU();
  REQUIRE_NCCL();
  CUDA_OK(cudaSetDevice(0));
  OneRank one;
  const std::vector<uint8_t> want = one_gpu(one.p);
  ASSERT_FALSE(has_nan_f16(want)) << "the one-GPU result left poison in C";
  {
    STEP("two errors in a row");
    GemmArgs g = one.d.g;
    g.op = Op::trans;
    EXPECT_NE(one.error(g, {}), "");
    EXPECT_NE(one.error(g, {}), "");
  }
  STEP("plan and run (B broadcast, C gathered)");
  DistributedOptions o;
  o.broadcast_root = 0;
  o.all_gather = true;
  DistributedPlan dp = plan_distributed(one.d.g, one.comms.c[0], o);
  run(dp, one.d.g, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(one.d.c->download(), want);
}

// A run whose args differ from the plan's gets a named error (before any collective).
TEST(DistributedGpu, RunWithOtherArgsThanThePlansGetsANamedError) {
  SPARSEK_REQUIRE_GPU();
  REQUIRE_NCCL();
  CUDA_OK(cudaSetDevice(0));
  OneRank one;
  DistributedPlan dp;
  {
    STEP("plan");
    dp = plan_distributed(one.d.g, one.comms.c[0], {});
  }
  STEP("run with N = 32 (planned for 64)");
  GemmArgs g = one.d.g;
  g.c.cols = g.b.cols = 32;
  try {
    run(dp, g, nullptr);
    ADD_FAILURE() << "a run with other shapes was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_TRUE(contains(e.what(), "args do not match the plan")) << e.what();
  }
}

// Ranks 0..n-1 on devices 0..n-1, one process: every rank's rows (and with the all-gather, all of
// C) bit-identical to the one-GPU result. Row splitting is turned off so that the shards' plans
// add every output's blocks in the same order as the whole problem's plan.
void multi_rank(int n, PatternKind kind, bool broadcast, bool gather) {
  SCOPED_TRACE(std::to_string(n) + " ranks, " + to_string(kind) + (broadcast ? ", broadcast B" : "") +
               (gather ? ", all-gather C" : ""));
  SavedEnv split("SPARSEK_HOPPER_SPLIT"), window("SPARSEK_HOPPER_WINDOW");
  setenv("SPARSEK_HOPPER_SPLIT", "off", 1);
  setenv("SPARSEK_HOPPER_WINDOW", "off", 1);
  Problem p(kind);
  const std::vector<uint8_t> want = one_gpu(p);
  ASSERT_FALSE(has_nan_f16(want));
  Comms comms(n);
  std::vector<std::unique_ptr<OnDevice>> d;
  std::vector<GemmArgs> args;
  std::vector<void*> streams(size_t(n), nullptr);
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaSetDevice(r));
    d.push_back(std::make_unique<OnDevice>(p, !broadcast || r == 0));  // broadcast: only rank 0 has B
    args.push_back(d.back()->g);
  }
  CUDA_OK(cudaSetDevice(0));
  DistributedOptions o;
  o.broadcast_root = broadcast ? 0 : -1;
  o.all_gather = gather;
  std::vector<DistributedPlan> plans = plan_distributed(args, comms.c, o);
  ASSERT_EQ(plans.size(), size_t(n));
  int64_t covered = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(plans[r].rank(), r);
    EXPECT_EQ(plans[r].row_begin(), covered);
    covered = plans[r].row_end();
  }
  EXPECT_EQ(covered, p.a.mb());
  run(plans, args, streams);
  run(plans, args, streams);
  const int64_t row_bytes = p.c.view.ld * 2 * p.a.bm();
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaSetDevice(r));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> got = d[size_t(r)]->c->download();
    if (gather) EXPECT_EQ(got, want) << "rank " << r << ": gathered C differs from the one-GPU result";
    else
      expect_rows(got, want, p.c.bytes, plans[r].row_begin(), plans[r].row_end(), row_bytes, true,
                  "rank " + std::to_string(r));
  }
  CUDA_OK(cudaSetDevice(0));
}

TEST(DistributedGpu, TwoAndFourRanksAreBitIdenticalToOneGpu) {
  SPARSEK_REQUIRE_GPU();
  REQUIRE_NCCL();
  int gpus = 0;
  CUDA_OK(cudaGetDeviceCount(&gpus));
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " answer";
  for (int n : {2, 4}) {
    if (n > gpus) continue;
    for (PatternKind kind : {PatternKind::fixed_k, PatternKind::power_law}) {
      multi_rank(n, kind, false, false);
      multi_rank(n, kind, true, true);
    }
  }
}

TEST(DistributedGpu, RanksDescribingDifferentProblemsGetANamedError) {
  SPARSEK_REQUIRE_GPU();
  REQUIRE_NCCL();
  int gpus = 0;
  CUDA_OK(cudaGetDeviceCount(&gpus));
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " answer";
  Problem p(PatternKind::fixed_k, 512, 256, 128), q(PatternKind::fixed_k, 512, 256, 64);
  Comms comms(2);
  CUDA_OK(cudaSetDevice(0));
  OnDevice d0(p);
  CUDA_OK(cudaSetDevice(1));
  OnDevice d1(q);  // N = 64 on rank 1, 128 on rank 0
  CUDA_OK(cudaSetDevice(0));
  try {
    plan_distributed(std::vector<GemmArgs>{d0.g, d1.g}, comms.c, {});
    ADD_FAILURE() << "different problems across ranks were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_TRUE(contains(e.what(), "rank 1 has N=64 but rank 0 has N=128")) << e.what();
  }
}

}  // namespace
}  // namespace sparsek::test
