// Stream order. plan() reads a device pattern on the host: when the caller uploaded that pattern
// on its own non-blocking stream, plan() must wait for that stream first (Options::stream), or it
// checks and schedules stale indices. The Hopper DSD kernel may start while the kernel ahead of it
// in the stream is still running (programmatic dependent launch): it must still see everything
// that kernel writes (its A values, B and C).
#include <cuda_runtime.h>

#include <vector>

#include "cpu/oracle.hpp"
#include "cuda/ptx/async.cuh"
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

// A kernel that lets the next programmatic launch start at once (as a kernel written for it would),
// then keeps its CTAs busy and only after that copies src[i] to dst[i] for each pair of buffers.
struct Copy {
  const uint8_t* src;
  uint8_t* dst;
  size_t bytes;
};
__global__ void release_then_copy(Copy a, Copy b, Copy c, long long cycles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) ptx::launch_dependents();
#endif
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (const Copy& x : {a, b, c})
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < x.bytes; i += stride) x.dst[i] = x.src[i];
}

// A, B and C hold one set of values when the product is enqueued; a kernel ahead of it in the
// stream replaces all three (after ~0.5 ms) with another. The product must use the new ones: the
// decode shape (64-column tiles: the kernel that starts early), then for the other launches a wide
// tile, CTA pairs (128x128 blocks, N = 512), op T, and beta != 0 (C read back).
TEST(StreamOrder, HopperSeesWhatTheKernelAheadOfItWrites) {
  SPARSEK_REQUIRE_SM90();
  struct Shape {
    int64_t m, k, n;
    int b;
    Op op;
    float beta;
  };
  for (const Shape& sh : {Shape{2048, 1024, 16, 64, Op::none, 0.f}, Shape{1024, 1024, 300, 64, Op::none, 0.f},
                          Shape{1024, 1024, 512, 128, Op::none, 1.f}, Shape{1024, 512, 96, 64, Op::trans, 0.5f}}) {
    SCOPED_TRACE("M=" + std::to_string(sh.m) + " K=" + std::to_string(sh.k) + " N=" + std::to_string(sh.n) +
                 " block " + std::to_string(sh.b) + (sh.op == Op::trans ? " op T" : "") +
                 " beta=" + std::to_string(sh.beta));
    const int64_t ar = sh.op == Op::trans ? sh.k : sh.m, ac = sh.op == Op::trans ? sh.m : sh.k;
    BsrMatrix old_a = random_bsr(PatternKind::fixed_k, ar, ac, sh.b, sh.b, 0.25, DType::f16, 21);
    BsrMatrix new_a = old_a;  // the same pattern, other values
    new_a.fill_random(22);
    HostDense old_b(sh.k, sh.n, DType::f16), new_b(sh.k, sh.n, DType::f16);
    HostDense old_c(sh.m, sh.n, DType::f16), new_c(sh.m, sh.n, DType::f16);
    old_b.fill_random(23);
    new_b.fill_random(24);
    old_c.fill_random(25);
    new_c.fill_random(26);
    const size_t va = new_a.value_bytes().size(), vb = new_b.bytes.size(), vc = new_c.bytes.size();
    std::vector<void*> bufs;
    auto upload = [&](const void* host, size_t bytes) {
      void* d = nullptr;
      EXPECT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
      bufs.push_back(d);
      return static_cast<uint8_t*>(d);
    };
    uint8_t* rp = upload(old_a.row_ptr().data(), old_a.row_ptr().size() * 4);
    uint8_t* ci = upload(old_a.col_idx().data(), old_a.col_idx().size() * 4);
    uint8_t *a = upload(old_a.value_bytes().data(), va), *a2 = upload(new_a.value_bytes().data(), va);
    uint8_t *b = upload(old_b.bytes.data(), vb), *b2 = upload(new_b.bytes.data(), vb);
    uint8_t *c = upload(old_c.bytes.data(), vc), *c2 = upload(new_c.bytes.data(), vc);

    GemmArgs g;
    g.kind = OpKind::dsd;
    g.op = sh.op;
    g.sparse = old_a.view();
    g.sparse.row_ptr = reinterpret_cast<const int32_t*>(rp);
    g.sparse.col_idx = reinterpret_cast<const int32_t*>(ci);
    g.sparse.values = a;
    g.sparse.memory = Memory::device;
    g.b = old_b.view;
    g.b.data = b;
    g.b.memory = Memory::device;
    g.c = old_c.view;
    g.c.data = c;
    g.c.memory = Memory::device;
    g.alpha = 1.f;
    g.beta = sh.beta;
    Options o;
    o.variant = "hopper";
    Plan p = plan(g, o);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    // Few CTAs, so that most of the product's CTAs start beside them and wait.
    release_then_copy<<<8, 256, 0, s>>>(Copy{a2, a, va}, Copy{b2, b, vb}, Copy{c2, c, vc}, 1000LL * 1000);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    run(p, g, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamDestroy(s);
    HostDense got(sh.m, sh.n, DType::f16);
    ASSERT_EQ(cudaMemcpy(got.bytes.data(), c, vc, cudaMemcpyDeviceToHost), cudaSuccess);

    GemmArgs h = g;
    h.sparse = new_a.view();
    h.b = new_b.view;
    h.c = new_c.view;  // beta * the new C
    const std::vector<double> ref = oracle(h);
    h.c = got.view;
    EXPECT_LT(max_rel_error(h, ref), 2e-3);
    for (void* d : bufs) cudaFree(d);
  }
}

}  // namespace
}  // namespace sparsek::test
