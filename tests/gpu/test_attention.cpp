// GPU tests of the Hopper attention forward ("hopper") against the fp64 oracle: random top-k,
// dense and causal layouts, empty rows, kmax beyond the counts, batch/head broadcast, sequence
// lengths that are not block multiples, GQA/MQA, D 64/128, bf16/f16, 64x64 and 128x128 blocks,
// full-block lists, strided tensors, NaN-poisoned outputs, bit-identical repeats, run() captured
// in a CUDA graph with the layout's contents changed between replays, and an error no larger
// than twice the naive half-precision computation's. Shapes stay small: the suite also runs
// under compute-sanitizer (memcheck, racecheck).
#include <cuda_runtime.h>

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attention_util.hpp"
#include "plan/variant.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

#define SPARSEK_REQUIRE_HOPPER_ATTENTION()                                                          \
  do {                                                                                              \
    SPARSEK_REQUIRE_SM90();                                                                         \
    if (!find_attention_variant("hopper")) GTEST_SKIP() << "this build has no hopper attention variant"; \
  } while (0)

// Max |dO| allowed by dtype (P and the output are rounded to the dtype); the tighter check is
// the comparison with the naive computation's error.
double tol_o(DType t) { return t == DType::f16 ? 4e-3 : 2e-2; }
const double kTolLse = 2e-3;

// Owned device bytes, filled from the host (n = 0: no allocation).
struct DeviceBytes {
  void* p = nullptr;
  size_t n = 0;
  DeviceBytes(const void* host, size_t bytes) : n(bytes) {
    if (!n) return;
    check_cuda(cudaMalloc(&p, n), "cudaMalloc");
    check_cuda(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceBytes() {
    if (p) cudaFree(p);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void download(void* host) const {
    if (n) check_cuda(cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  void upload(const void* host) const {
    if (n) check_cuda(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
};

// An AttnCase's tensors and layout in device memory (o and lse poisoned with NaN bytes).
struct DeviceCase {
  std::unique_ptr<DeviceBytes> q, k, v, o, lse, num, idx, fnum, fidx, cu;
  AttentionArgs args;
  explicit DeviceCase(const AttnCase& c) {
    auto up = [](const auto& vec) {
      return std::make_unique<DeviceBytes>(vec.data(), vec.size() * sizeof(vec[0]));
    };
    q = up(c.q.bytes), k = up(c.k.bytes), v = up(c.v.bytes), o = up(c.o.bytes), lse = up(c.lse);
    num = up(c.layout.num), idx = up(c.layout.idx), fnum = up(c.layout.full_num), fidx = up(c.layout.full_idx);
    args = c.args;
    for (auto [t, d] : {std::pair{&args.q, q.get()}, std::pair{&args.k, k.get()}, std::pair{&args.v, v.get()},
                        std::pair{&args.o, o.get()}}) {
      t->data = d->p;
      t->memory = Memory::device;
    }
    args.lse = c.args.lse ? static_cast<float*>(lse->p) : nullptr;
    cu = up(c.cu_seqlens);
    if (!c.cu_seqlens.empty()) args.cu_seqlens = static_cast<const int32_t*>(cu->p);
    set_layout(c.layout);
    poison();
  }
  void set_layout(const LayoutArrays& l) {
    args.layout.kv_num_blocks = static_cast<const int32_t*>(num->p);
    args.layout.kv_indices = static_cast<const int32_t*>(idx->p);
    args.layout.full_kv_num_blocks = l.full_num.empty() ? nullptr : static_cast<const int32_t*>(fnum->p);
    args.layout.full_kv_indices = l.full_num.empty() ? nullptr : static_cast<const int32_t*>(fidx->p);
    args.layout.memory = Memory::device;
  }
  // Synchronous: a run on any stream (a graph on a non-blocking one too) comes after it.
  void poison() {
    check_cuda(cudaMemset(o->p, 0xFF, o->n), "cudaMemset(o)");
    if (lse->n) check_cuda(cudaMemset(lse->p, 0xFF, lse->n), "cudaMemset(lse)");
    check_cuda(cudaDeviceSynchronize(), "poison");
  }
  void download(AttnCase& c) const {
    check_cuda(cudaDeviceSynchronize(), "attention run");
    o->download(c.o.bytes.data());
    lse->download(c.lse.data());
  }
};

Options hopper() {
  Options o;
  o.variant = "hopper";
  return o;
}

// One case through attention() on the hopper variant, checked against the oracle and against
// twice the naive computation's error.
void check(const AttnSpec& s) {
  SCOPED_TRACE(s.name());
  auto c = make_attention_case(s);
  const AttentionReference ref = attention_oracle(c->args);
  DeviceCase d(*c);
  attention(d.args, hopper());
  d.download(*c);
  const double err = expect_matches(*c, ref, tol_o(s.dtype), kTolLse);
  const double naive = naive_error(*c, ref);
  EXPECT_LE(err, 2 * naive + 1e-6) << "max |dO| " << err << " vs the naive computation's " << naive;
}

AttnSpec base(DType t, int d, int block, bool causal) { return gpu_spec(t, d, block, causal); }

TEST(HopperAttention, RandomTopkLayouts) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (int block : {64, 128})
        for (bool causal : {false, true}) check(base(t, d, block, causal));
}

TEST(HopperAttention, CornerLayouts) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  std::vector<AttnSpec> specs;
  AttnSpec s = base(DType::bf16, 128, 128, false);
  s.empty_rows = {0, 3, -1};  // empty rows: O = 0, LSE = -inf
  s.extra_kmax = 4;            // kmax beyond every count (-1 past the counts)
  specs.push_back(s);
  s = base(DType::f16, 64, 64, false);
  s.layout_batch = 1, s.layout_heads = 1;  // one layout row broadcast over batch and heads
  specs.push_back(s);
  s = base(DType::bf16, 64, 128, true);
  s.layout_heads = 4;  // a row per query head (not per group)
  specs.push_back(s);
  s = base(DType::bf16, 128, 64, false);
  s.split_full = true;  // full lists without causal
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, true);
  s.kind = LayoutKind::causal;  // every block j <= i: full below the diagonal, masked on it
  s.sq = s.skv = 385;          // a one-row tail block
  specs.push_back(s);
  s = base(DType::f16, 128, 128, false);
  s.kind = LayoutKind::dense;
  specs.push_back(s);
  s = base(DType::bf16, 64, 64, false);
  s.hq = 8, s.hkv = 1;  // MQA
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, false);
  s.bshd = true;  // [B, S, H, D] memory (torch's transpose(1, 2))
  specs.push_back(s);
  s = base(DType::bf16, 128, 64, true);
  s.lse = false;  // no LSE asked for
  s.o_tail = 3;   // o rows past Sq stay untouched
  specs.push_back(s);
  s = base(DType::f16, 64, 128, false);
  s.sq = 1, s.skv = 50;  // one query row, fewer keys than a block
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, false);
  s.sq = 128, s.skv = 8192, s.batch = 1, s.hq = s.hkv = 1;  // one very long row (64 key blocks)
  s.kind = LayoutKind::dense;
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, false);
  s.sq = s.skv = 2048, s.density = 0.5;  // unequal rows: every other layout row empty
  for (int64_t r = 0; r < 2 * 2 * 16; r += 2) s.empty_rows.push_back(r);
  specs.push_back(s);
  for (const AttnSpec& spec : specs) check(spec);
}

TEST(HopperAttention, EmptyLayoutGivesZerosAndMinusInfinity) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  AttnSpec s = base(DType::bf16, 128, 128, true);
  s.kind = LayoutKind::causal;
  for (int64_t r = 0; r < 2 * 2 * 3; ++r) s.empty_rows.push_back(r);  // every row (B 2 x Hkv 2 x 3 blocks)
  check(s);
}

TEST(HopperAttention, RepeatedRunsAreBitIdentical) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  AttnSpec s = base(DType::bf16, 128, 128, true);
  auto c = make_attention_case(s);
  DeviceCase d(*c);
  AttentionPlan p = plan(d.args, hopper());
  run(p, d.args);
  d.download(*c);
  const std::vector<uint8_t> o1 = c->o.bytes;
  const std::vector<float> l1 = c->lse;
  for (int rep = 0; rep < 3; ++rep) {
    d.poison();
    run(p, d.args);
    d.download(*c);
    EXPECT_EQ(o1, c->o.bytes) << "run " << rep;
    EXPECT_EQ(std::memcmp(l1.data(), c->lse.data(), l1.size() * 4), 0) << "run " << rep;
  }
}

// run() captured once in a CUDA graph (global capture mode: an allocation or a synchronizing call
// inside run() fails the capture), replayed after new values and new layout contents (same
// extents) were written into the same buffers: each replay matches its own oracle.
TEST(HopperAttention, RunInACudaGraphFollowsNewLayoutContents) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  AttnSpec s = base(DType::bf16, 128, 128, true);  // causal top-k: kmax 1, full_kmax k - 1 for any seed
  auto c = make_attention_case(s);
  DeviceCase d(*c);
  AttentionPlan p = plan(d.args, hopper());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  run(p, d.args, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("replay with seed " + std::to_string(seed));
    AttnSpec t = s;
    t.seed = seed * 101;
    auto n = make_attention_case(t);
    ASSERT_EQ(n->layout.kmax, c->layout.kmax);
    ASSERT_EQ(n->layout.full_kmax, c->layout.full_kmax);
    d.q->upload(n->q.bytes.data());
    d.k->upload(n->k.bytes.data());
    d.v->upload(n->v.bytes.data());
    d.num->upload(n->layout.num.data());
    d.idx->upload(n->layout.idx.data());
    d.fnum->upload(n->layout.full_num.data());
    d.fidx->upload(n->layout.full_idx.data());
    d.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    d.download(*n);
    expect_matches(*n, attention_oracle(n->args), tol_o(t.dtype), kTolLse);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Packed sequences: boundaries inside blocks, an empty and a one-token sequence, a sequence longer
// than several blocks; the random layouts name blocks of other sequences too.
AttnSpec packed_spec(DType t, int d, int block, bool causal) {
  AttnSpec s = base(t, d, block, causal);
  s.packed({50, 1, 0, 130, 77, 64, 300});
  s.layout_heads = 4;  // a row per query head (GQA 4 / 2)
  s.density = 0.6;
  return s;
}

TEST(HopperAttention, PackedSequences) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (int block : {64, 128})
        for (bool causal : {false, true}) check(packed_spec(t, d, block, causal));
  AttnSpec full = packed_spec(DType::bf16, 128, 128, false);
  full.split_full = true;  // the boundaries apply inside full blocks too
  check(full);
  AttnSpec many = base(DType::bf16, 64, 64, true);  // more sequences than a warp's ballot (33+)
  many.packed(std::vector<int64_t>(45, 7));
  many.layout_heads = 4;
  many.kind = LayoutKind::causal;
  check(many);
}

// A plan captured in a CUDA graph follows new offsets written into the same buffer.
TEST(HopperAttention, PackedSequencesInACudaGraphFollowNewOffsets) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  AttnSpec s = packed_spec(DType::bf16, 128, 128, true);
  auto c = make_attention_case(s);
  DeviceCase d(*c);
  AttentionPlan p = plan(d.args, hopper());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  run(p, d.args, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const int32_t T = int32_t(s.sq);
  for (std::vector<int32_t> cu : {c->cu_seqlens, std::vector<int32_t>{0, 1, 129, 250, 300, 301, 400, T},
                                  std::vector<int32_t>{0, T, T, T, T, T, T, T}}) {
    SCOPED_TRACE("offsets ending " + std::to_string(cu[1]) + ", " + std::to_string(cu[2]));
    ASSERT_EQ(cu.size(), c->cu_seqlens.size());
    c->cu_seqlens = cu;
    c->args.cu_seqlens = c->cu_seqlens.data();
    d.cu->upload(cu.data());
    d.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    d.download(*c);
    expect_matches(*c, attention_oracle(c->args), tol_o(s.dtype), kTolLse);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Malformed offsets on a plan's run(): wrong values, never a fault (memcheck runs this suite).
TEST(HopperAttention, MalformedOffsetsAreNotAFault) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  AttnSpec s = packed_spec(DType::bf16, 64, 64, true);
  auto c = make_attention_case(s);
  DeviceCase d(*c);
  AttentionPlan p = plan(d.args, hopper());
  const std::vector<int32_t> bad = {5, INT32_MAX, -3, INT32_MIN, 7, 1 << 30, 2, 0};
  ASSERT_EQ(bad.size(), c->cu_seqlens.size());
  d.cu->upload(bad.data());
  run(p, d.args);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(HopperAttention, UnalignedTensorsAreRefusedWithAReason) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  AttnSpec s = base(DType::bf16, 64, 64, false);
  auto c = make_attention_case(s);
  DeviceCase d(*c);
  AttentionArgs a = d.args;
  a.q.data = static_cast<char*>(a.q.data) + 2;  // one element off: rows no longer 16-byte aligned
  a.q.s -= 1;  // stay inside the buffer
  a.o.s -= 1;
  a.layout.q_blocks = (a.q.s + 63) / 64;
  const std::string why = find_attention_variant("hopper")->why_not(a);
  EXPECT_FALSE(why.empty()) << "a q not 16-byte aligned must be refused by the variant";
  try {
    attention(a, hopper());
    ADD_FAILURE() << "no error for an unaligned q";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported) << e.what();
  }
}

TEST(HopperAttention, EffectiveFlopsOfADeviceLayoutMatchTheHostOnes) {
  SPARSEK_REQUIRE_HOPPER_ATTENTION();
  AttnSpec s = base(DType::bf16, 128, 128, true);
  auto c = make_attention_case(s);
  DeviceCase d(*c);
  EXPECT_EQ(effective_flops(d.args), effective_flops(c->args));
}

}  // namespace
}  // namespace sparsek::test
