// plan() reads a device pattern on the host. When the caller uploaded that pattern on its own
// non-blocking stream, plan() must wait for that stream first (Options::stream), or it checks and
// schedules stale indices.
#include <cuda_runtime.h>

#include "cpu/oracle.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

// Keeps the stream busy long enough that an unordered read would certainly see the old bytes.
__global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

TEST(StreamOrder, PlanWaitsForThePatternUploadOnOptionsStream) {
  SPARSEK_REQUIRE_GPU();
  BsrMatrix a = random_bsr(PatternKind::fixed_k, 256, 256, 64, 64, 0.5, DType::f16, 5);
  HostDense b(256, 40, DType::f16), c(256, 40, DType::f16);
  b.fill_random(6);
  const size_t rp_bytes = a.row_ptr().size() * 4, ci_bytes = a.col_idx().size() * 4;
  int32_t* pinned = nullptr;  // pinned, so the async copies really are asynchronous
  ASSERT_EQ(cudaMallocHost(&pinned, rp_bytes + ci_bytes), cudaSuccess);
  std::memcpy(pinned, a.row_ptr().data(), rp_bytes);
  std::memcpy(pinned + a.row_ptr().size(), a.col_idx().data(), ci_bytes);
  void *drp, *dci, *dval, *db, *dc;
  ASSERT_EQ(cudaMalloc(&drp, rp_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dci, ci_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dval, a.value_bytes().size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, b.bytes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc, c.bytes.size()), cudaSuccess);
  // Stale bytes: row_ptr[0] = -1 would fail validation if read before the upload lands.
  ASSERT_EQ(cudaMemset(drp, 0xff, rp_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dci, 0xff, ci_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dval, a.value_bytes().data(), a.value_bytes().size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  spin<<<1, 1, 0, s>>>(200LL * 1000 * 1000);  // ~0.1 s at ~2 GHz
  ASSERT_EQ(cudaMemcpyAsync(drp, pinned, rp_bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dci, pinned + a.row_ptr().size(), ci_bytes, cudaMemcpyHostToDevice, s), cudaSuccess);

  GemmArgs g;
  g.kind = OpKind::dsd;
  g.sparse = a.view();
  g.sparse.row_ptr = static_cast<const int32_t*>(drp);
  g.sparse.col_idx = static_cast<const int32_t*>(dci);
  g.sparse.values = dval;
  g.sparse.memory = Memory::device;
  g.b = b.view;
  g.b.data = db;
  g.b.memory = Memory::device;
  g.c = c.view;
  g.c.data = dc;
  g.c.memory = Memory::device;
  Options o;
  o.stream = s;
  Plan p = plan(g, o);  // must not throw "row_ptr[0] must be 0, got -1"
  ASSERT_EQ(cudaMemsetAsync(dc, 0xff, c.bytes.size(), s), cudaSuccess);  // NaN-poison C
  run(p, g, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(c.bytes.data(), dc, c.bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);

  GemmArgs h = g;
  h.sparse = a.view();
  h.b = b.view;
  h.c = c.view;
  EXPECT_LT(max_rel_error(h, oracle(h)), 2e-3);

  cudaStreamDestroy(s);
  for (void* ptr : {drp, dci, dval, db, dc}) cudaFree(ptr);
  cudaFreeHost(pinned);
}

}  // namespace
}  // namespace sparsek::test
