// run(plan) inside a CUDA graph: captured once (global capture mode, so any allocation or
// synchronizing call inside run() fails the capture), replayed with new values in the same
// buffers, checked against the fp64 oracle each time. Also the tuner on device operands.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "sparsek/plan.hpp"
#include "sparsek/tune.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t n) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 16)), cudaSuccess); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

// dsd, f16 in/out: A 256x192 in 64x64 blocks, B 192x72, C 256x72 (N not a tile multiple).
struct DeviceCase {
  BsrMatrix a = random_bsr(PatternKind::bernoulli, 256, 192, 64, 64, 0.5, DType::f16, 11);
  HostDense b{192, 72, DType::f16}, c{256, 72, DType::f16};
  DevMem drp{a.row_ptr().size() * 4}, dci{a.col_idx().size() * 4}, dval{a.value_bytes().size()},
      db{b.bytes.size()}, dc{c.bytes.size()};
  GemmArgs g;
  DeviceCase() {
    EXPECT_EQ(cudaMemcpy(drp.p, a.row_ptr().data(), a.row_ptr().size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dci.p, a.col_idx().data(), a.col_idx().size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    g.kind = OpKind::dsd;
    g.sparse = a.view();
    g.sparse.row_ptr = static_cast<const int32_t*>(drp.p);
    g.sparse.col_idx = static_cast<const int32_t*>(dci.p);
    g.sparse.values = dval.p;
    g.sparse.memory = Memory::device;
    g.b = b.view;
    g.b.data = db.p;
    g.b.memory = Memory::device;
    g.c = c.view;
    g.c.data = dc.p;
    g.c.memory = Memory::device;
  }
};

// C (after the device finished writing it) against the fp64 oracle of the case's current values.
void expect_c_matches_oracle(DeviceCase& d) {
  CUDA_OK(cudaMemcpy(d.c.bytes.data(), d.dc.p, d.c.bytes.size(), cudaMemcpyDeviceToHost));
  GemmArgs h;
  h.kind = OpKind::dsd;
  h.sparse = d.a.view();
  h.b = d.b.view;
  h.c = d.c.view;
  EXPECT_LE(max_rel_error(h, oracle(h)), tolerance(DType::f16));
}

// New values in the captured buffers (A's values and B from `seed`, C poisoned), one replay on s,
// C against the fp64 oracle.
void replay_and_check(DeviceCase& d, cudaGraphExec_t exec, cudaStream_t s, uint64_t seed) {
  d.a.fill_random(seed);
  d.b.fill_random(seed + 100);
  CUDA_OK(cudaMemcpy(d.dval.p, d.a.value_bytes().data(), d.a.value_bytes().size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d.db.p, d.b.bytes.data(), d.b.bytes.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d.dc.p, 0xff, d.c.bytes.size()));  // 0xffff is a NaN in f16: beta = 0 must not read it
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  expect_c_matches_oracle(d);
}

void capture_and_replay(DeviceCase& d, const std::string& variant) {
  SCOPED_TRACE("variant " + (variant.empty() ? std::string("(default)") : variant));
  Options o;
  o.variant = variant;
  Plan p;
  try {
    p = plan(d.g, o);
  } catch (const Error& e) {
    if (e.status() == Status::unsupported && variant.empty()) GTEST_SKIP() << e.what();
    throw;
  }
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  bool captured = true;
  try {
    run(p, d.g, s);
  } catch (const Error& e) {
    captured = false;
    if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    graph = nullptr;
    cudaGetLastError();
    ADD_FAILURE() << "run() failed under stream capture: " << e.what();
  }
  if (captured) {
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE("replay " + std::to_string(round));
      replay_and_check(d, exec, s, 100 + uint64_t(round));
    }
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST(GraphCapture, DefaultVariant) {
  SPARSEK_REQUIRE_GPU();
  DeviceCase d;
  capture_and_replay(d, "");
}

// Planning reads a device pattern on the host, which a capture cannot contain: plan() refuses
// with a message saying to plan first, and the capture stays valid (runs of an earlier plan can
// still be captured into it).
TEST(GraphCapture, PlanDuringCaptureIsRefusedAndTheCaptureSurvives) {
  SPARSEK_REQUIRE_GPU();
  DeviceCase d;
  Plan before = plan(d.g);
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  Options o;
  o.stream = s;
  try {
    plan(d.g, o);
    ADD_FAILURE() << "plan() during capture did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("plan before the capture"), std::string::npos) << e.what();
  }
  // The one-shot path checks a device pattern the same way (check_indices, the default).
  EXPECT_THROW(gemm(d.g, o), Error);
  run(before, d.g, s);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess) << "the capture was invalidated";
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// The one-shot gemm() captured after a warm-up on the same stream: its cached plan is kept for the
// graph, so products of other shapes that push it out of the cache (and clearing the cache) leave
// the graph's workspace and schedule alive, and replays stay right.
TEST(GraphCapture, OneShotPlanOutlivesTheCache) {
  SPARSEK_REQUIRE_GPU();
  DeviceCase d;
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Options o;
  o.stream = s;
  o.check_indices = false;  // a checked device pattern is read on the host: not capturable
  try {
    gemm(d.g, o);  // plans and caches
  } catch (const Error& e) {
    cudaStreamDestroy(s);
    if (e.status() == Status::unsupported) GTEST_SKIP() << e.what();
    throw;
  }
  CUDA_OK(cudaStreamSynchronize(s));
  const size_t kept_before = one_shot_plan_cache_stats().kept;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  gemm(d.g, o);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(one_shot_plan_cache_stats().kept, kept_before + 1) << "the captured run's plan was not kept";
  // Other widths (N = 8 .. 24 in the same buffers): more new plans than the cache holds.
  for (int64_t n = 8; n < 8 + 17; ++n) {
    GemmArgs g = d.g;
    g.b.cols = g.b.ld = n;
    g.c.cols = g.c.ld = n;
    gemm(g, o);
  }
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_LE(one_shot_plan_cache_stats().size, size_t(16));
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("replay " + std::to_string(round));
    if (round == 1) clear_one_shot_plan_cache();
    replay_and_check(d, exec, s, 300 + uint64_t(round));
  }
  EXPECT_EQ(one_shot_plan_cache_stats().kept, kept_before + 1) << "clear_one_shot_plan_cache() dropped it";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// Every CUDA variant that supports the problem (peers included: run() makes the same promise).
TEST(GraphCapture, EveryCudaVariant) {
  SPARSEK_REQUIRE_GPU();
  DeviceCase d;
  int tried = 0;
  for (const std::string& name : supported_variants(d.g)) {
    capture_and_replay(d, name);
    ++tried;
  }
  if (tried == 0) GTEST_SKIP() << "no CUDA variant supports a 64x64 f16 dsd yet";
}

// The tuner on device operands: every CUDA candidate checked against the oracle and timed with
// CUDA events, the user's buffers untouched, the winner stored and then used by plan().
TEST(DeviceTune, TunesAndPlanUsesTheStoredWinner) {
  SPARSEK_REQUIRE_GPU();
  char dir[] = "/tmp/sparsek-gpu-tune-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/tune.json";
  const char* old_cache = std::getenv("SPARSEK_CACHE");
  const char* old_mode = std::getenv("SPARSEK_TUNE");
  const std::string saved_cache = old_cache ? old_cache : "", saved_mode = old_mode ? old_mode : "";
  setenv("SPARSEK_CACHE", path.c_str(), 1);
  unsetenv("SPARSEK_TUNE");
  [&] {
    DeviceCase d;
    CUDA_OK(cudaMemset(d.dc.p, 0x7b, d.c.bytes.size()));
    TuneOptions to;
    to.seconds_per_candidate = 0.02;
    TuneReport r;
    try {
      r = tune(d.g, {}, to);
    } catch (const Error& e) {
      if (e.status() == Status::unsupported) GTEST_SKIP() << e.what();
      throw;
    }
    EXPECT_EQ(r.reference, "oracle (fp64)");
    ASSERT_FALSE(r.candidates.empty());
    for (const TuneCandidate& c : r.candidates) {
      EXPECT_TRUE(c.correct) << c.variant << ": " << c.note;
      if (c.correct) EXPECT_GT(c.median_ms, 0) << c.variant;
    }
    EXPECT_TRUE(r.stored) << r.store_error;
    std::vector<uint8_t> cbytes(d.c.bytes.size());
    CUDA_OK(cudaMemcpy(cbytes.data(), d.dc.p, cbytes.size(), cudaMemcpyDeviceToHost));
    for (uint8_t byte : cbytes) ASSERT_EQ(byte, 0x7b) << "tune() wrote the caller's C";

    Plan p = plan(d.g);
    EXPECT_EQ(p.chosen_by(), "cache");
    EXPECT_EQ(p.variant(), r.entry.variant);
    d.a.fill_random(5);
    CUDA_OK(cudaMemcpy(d.dval.p, d.a.value_bytes().data(), d.a.value_bytes().size(), cudaMemcpyHostToDevice));
    d.b.fill_random(6);
    CUDA_OK(cudaMemcpy(d.db.p, d.b.bytes.data(), d.b.bytes.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d.dc.p, 0xff, d.c.bytes.size()));
    run(p, d.g, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    expect_c_matches_oracle(d);
  }();
  if (old_cache) setenv("SPARSEK_CACHE", saved_cache.c_str(), 1);
  else unsetenv("SPARSEK_CACHE");
  if (old_mode) setenv("SPARSEK_TUNE", saved_mode.c_str(), 1);
  std::system(("rm -rf '" + std::string(dir) + "'").c_str());
}

}  // namespace
}  // namespace sparsek::test
