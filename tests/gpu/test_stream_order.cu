// Stream order. plan() reads a device pattern on the host: when the caller uploaded that pattern
// on its own non-blocking stream, plan() must wait for that stream first (Options::stream), or it
// checks and schedules stale indices. The Hopper DSD kernel may start while the kernel ahead of it
// in the stream is still running (programmatic dependent launch): it must still see everything
// that kernel writes (its A values, B and C). validate() of attention arguments reads a device
// layout in its stream's order, and refuses to while that stream is being captured.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "attention_util.hpp"
#include "cpu/oracle.hpp"
#include "kernels/ptx/async.cuh"
#include "device_case.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/plan.hpp"

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
// kernels that start early (64- and 128-column tiles; beta != 0 reads C back), then the other
// launches: a wide tile, CTA pairs (128x128 blocks, N = 512), op T.
TEST(StreamOrder, HopperSeesWhatTheKernelAheadOfItWrites) {
  SPARSEK_REQUIRE_SM90();
  struct Shape {
    int64_t mb, kb, n;
    int b;
    Op op;
    float beta;
  };
  for (const Shape& sh : {Shape{32, 16, 16, 64, Op::none, 0.f}, Shape{16, 16, 100, 128, Op::none, 1.f},
                          Shape{16, 16, 300, 64, Op::none, 0.f}, Shape{8, 8, 512, 128, Op::none, 1.f},
                          Shape{8, 16, 96, 64, Op::trans, 0.5f}}) {
    const Pattern pat = make_pattern(PatternKind::fixed_k, sh.mb, sh.kb, 0.25, 21);
    CaseSpec spec = block_case(OpKind::dsd, sh.op, sh.b, sh.b, sh.mb, sh.kb, sh.n, 22, DType::f16);
    spec.custom = &pat;
    spec.beta = sh.beta;
    SCOPED_TRACE(describe(spec));
    std::unique_ptr<GemmCase> old_case = make_case(spec);
    spec.seed = 23;  // the same pattern, other values of A, B and C
    std::unique_ptr<GemmCase> new_case = make_case(spec);
    DeviceCase run_on(*old_case), from(*new_case);
    Options o;
    o.variant = "hopper";
    Plan p = plan(run_on.args, o);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    auto copy = [](const std::unique_ptr<DeviceBuffer>& src, const std::unique_ptr<DeviceBuffer>& dst) {
      return Copy{static_cast<const uint8_t*>(src->ptr), static_cast<uint8_t*>(dst->ptr), src->bytes};
    };
    // Few CTAs, so that most of the product's CTAs start beside them and wait.
    release_then_copy<<<8, 256, 0, s>>>(copy(from.values, run_on.values), copy(from.b, run_on.b),
                                        copy(from.c, run_on.c), 1000LL * 1000);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    run(p, run_on.args, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamDestroy(s);
    const std::vector<double> ref = oracle(new_case->args);  // beta * the new C
    const std::vector<uint8_t> before = new_case->c->bytes;
    run_on.download(*new_case);
    expect_output_matches(*new_case, ref, before);
  }
}

// validate(args, true, stream) reads a device layout in `stream`'s order: the layout is uploaded
// there behind a long kernel, over stale bytes (counts of -1) that fail the check if read first,
// and a bad count written there later is seen and named. While `stream` is being captured the
// check is refused before anything is enqueued, so the capture survives it.
TEST(StreamOrder, AttentionValidateReadsTheLayoutInItsStreamsOrder) {
  SPARSEK_REQUIRE_GPU();
  AttnSpec spec;
  spec.dtype = DType::bf16;
  auto c = make_attention_case(spec);
  const LayoutArrays& l = c->layout;
  ASSERT_TRUE(l.full_num.empty());
  ASSERT_GE(l.kmax, 1);
  const size_t num_bytes = l.num.size() * 4, idx_bytes = l.idx.size() * 4;
  int32_t* pinned = nullptr;  // pinned, so the async copies really are asynchronous
  ASSERT_EQ(cudaMallocHost(&pinned, num_bytes + idx_bytes), cudaSuccess);
  std::memcpy(pinned, l.num.data(), num_bytes);
  std::memcpy(pinned + l.num.size(), l.idx.data(), idx_bytes);
  std::vector<void*> allocations;
  auto device = [&](size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    allocations.push_back(p);
    return p;
  };
  AttentionArgs a = c->args;
  for (Tensor4View* t : {&a.q, &a.k, &a.v, &a.o}) {  // validate() reads none of them
    t->data = device(size_t(t->b * t->stride_b) * dtype_size(t->dtype));
    t->memory = Memory::device;
  }
  a.lse = static_cast<float*>(device(c->lse.size() * 4));
  int32_t* dnum = static_cast<int32_t*>(device(num_bytes));
  int32_t* didx = static_cast<int32_t*>(device(idx_bytes));
  ASSERT_EQ(cudaMemset(dnum, 0xff, num_bytes), cudaSuccess);  // stale: every kv_num_blocks = -1
  ASSERT_EQ(cudaMemset(didx, 0xff, idx_bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  a.layout.kv_num_blocks = dnum;
  a.layout.kv_indices = didx;
  a.layout.memory = Memory::device;

  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  spin<<<1, 1, 0, s>>>(200LL * 1000 * 1000);  // ~0.1 s at ~2 GHz
  ASSERT_EQ(cudaMemcpyAsync(dnum, pinned, num_bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(didx, pinned + l.num.size(), idx_bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_NO_THROW(validate(a, true, s)) << "must not read the stale kv_num_blocks = -1";

  pinned[0] = int32_t(l.kmax) + 1;  // the copies above have finished: validate() waited for them
  spin<<<1, 1, 0, s>>>(200LL * 1000 * 1000);
  ASSERT_EQ(cudaMemcpyAsync(dnum, pinned, 4, cudaMemcpyHostToDevice, s), cudaSuccess);
  expect_invalid([&] { validate(a, true, s); },
                 {"kv_num_blocks[0, 0, 0] = " + std::to_string(l.kmax + 1) + " is out of range"});

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  expect_invalid([&] { validate(a, true, s); }, {"captured into a CUDA graph", "check_indices off"});
  EXPECT_NO_THROW(validate(a, false, s)) << "the cheap checks read no layout";
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess) << "the refusal must leave the capture intact";
  cudaGraphDestroy(graph);

  cudaStreamDestroy(s);
  cudaFreeHost(pinned);
  for (void* p : allocations) cudaFree(p);
}

}  // namespace
}  // namespace sparsek::test
