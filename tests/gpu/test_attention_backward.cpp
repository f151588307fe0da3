// GPU tests of attention_backward() on the Hopper variant against the fp64 backward reference
// (cpu/oracle.cpp), every element of dq, dk and dv on NaN-poisoned outputs: random top-k layouts,
// empty query rows, key blocks nobody attends, causal with full blocks, GQA / MQA and layout
// broadcast, sequence tails, D 64/128, bf16/f16, 64x64 and 128x128 blocks, strided tensors; repeated
// runs bit-identical; the one-shot forward + backward captured in a CUDA graph and replayed on new
// values and layout contents. O and LSE come from the GPU forward. Shapes stay small: the suite
// also runs under compute-sanitizer.
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "attention_util.hpp"
#include "device_case.hpp"
#include "plan/variant.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

Options hopper(void* stream = nullptr) {
  Options o;
  o.variant = "hopper";
  o.stream = stream;
  return o;
}

// A BwdCase's tensors and layout in device memory; dq, dk, dv poisoned with NaN bytes.
struct DeviceBwd {
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  AttentionBackwardArgs args;
  DeviceBuffer *q, *k, *v, *dout, *num, *idx, *fnum, *fidx, *cu;
  DeviceBuffer *dq, *dk, *dv;
  explicit DeviceBwd(BwdCase& x) {
    auto up = [&](const auto& vec) {
      keep.push_back(std::make_unique<DeviceBuffer>(vec.data(), vec.size() * sizeof(vec[0])));
      return keep.back().get();
    };
    AttnCase& c = *x.c;
    q = up(c.q.bytes), k = up(c.k.bytes), v = up(c.v.bytes);
    DeviceBuffer *o = up(c.o.bytes), *lse = up(c.lse);
    num = up(c.layout.num), idx = up(c.layout.idx), fnum = up(c.layout.full_num), fidx = up(c.layout.full_idx);
    dout = up(x.dout.bytes), dq = up(x.dq.bytes), dk = up(x.dk.bytes), dv = up(x.dv.bytes);
    args = x.args;
    AttentionArgs& f = args.forward;
    for (auto [t, d] : {std::pair{&f.q, q}, std::pair{&f.k, k}, std::pair{&f.v, v}, std::pair{&f.o, o},
                        std::pair{&args.dout, dout}, std::pair{&args.dq, dq}, std::pair{&args.dk, dk},
                        std::pair{&args.dv, dv}}) {
      t->data = d->ptr;
      t->memory = Memory::device;
    }
    f.lse = static_cast<float*>(lse->ptr);
    cu = up(c.cu_seqlens);
    if (!c.cu_seqlens.empty()) f.cu_seqlens = static_cast<const int32_t*>(cu->ptr);
    AttentionLayout& l = f.layout;
    l.kv_num_blocks = static_cast<const int32_t*>(num->ptr);
    l.kv_indices = static_cast<const int32_t*>(idx->ptr);
    l.full_kv_num_blocks = c.layout.full_num.empty() ? nullptr : static_cast<const int32_t*>(fnum->ptr);
    l.full_kv_indices = c.layout.full_num.empty() ? nullptr : static_cast<const int32_t*>(fidx->ptr);
    l.memory = Memory::device;
    attention(f, hopper());  // O and LSE from the GPU forward
    poison();
  }
  // Synchronous: a run on any stream comes after it.
  void poison() {
    for (DeviceBuffer* d : {dq, dk, dv}) check_cuda(cudaMemset(d->ptr, 0xFF, d->bytes), "cudaMemset(poison)");
    check_cuda(cudaDeviceSynchronize(), "poison");
  }
  void download(BwdCase& x) const {
    check_cuda(cudaDeviceSynchronize(), "attention backward run");
    dq->download(x.dq.bytes.data());
    dk->download(x.dk.bytes.data());
    dv->download(x.dv.bytes.data());
  }
  void upload(const void* host, DeviceBuffer* d) const {
    if (d->bytes) check_cuda(cudaMemcpy(d->ptr, host, d->bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  // Another case's inputs and layout contents (same extents) into these buffers; O and LSE are not
  // recomputed here.
  void upload_inputs(const BwdCase& n) const {
    upload(n.c->q.bytes.data(), q);
    upload(n.c->k.bytes.data(), k);
    upload(n.c->v.bytes.data(), v);
    upload(n.dout.bytes.data(), dout);
    upload(n.c->layout.num.data(), num);
    upload(n.c->layout.idx.data(), idx);
    upload(n.c->layout.full_num.data(), fnum);
    upload(n.c->layout.full_idx.data(), fidx);
  }
};

// Every element of got against ref: |got - ref| <= tol (|ref| + rms(ref)) + u mag (the first-order
// rounding bound of P and dS in the dtype); rows that are not live must be exactly 0.
void expect_close(const char* name, const HostTensor& got, const std::vector<double>& ref,
                  const std::vector<double>& mag, const std::vector<char>& live, DType t) {
  const Tensor4View& v = got.view;
  double ss = 0;
  for (double r : ref) ss += r * r;
  const double rms = std::sqrt(ss / double(std::max<size_t>(ref.size(), 1)));
  const double tol = t == DType::bf16 ? 2e-2 : 1e-2, u = t == DType::bf16 ? 0x1p-8 : 0x1p-11;
  int reported = 0;
  double worst = 0;
  for (int64_t b = 0; b < v.b; ++b)
    for (int64_t h = 0; h < v.h; ++h)
      for (int64_t s = 0; s < v.s; ++s) {
        const int64_t row = (b * v.h + h) * v.s + s;
        for (int64_t d = 0; d < v.d; ++d) {
          const size_t e = size_t(row * v.d + d);
          const double g = got.at(b, h, s, d);
          const double err = std::fabs(g - ref[e]);
          const bool ok = live[size_t(row)] ? err <= tol * (std::fabs(ref[e]) + rms) + u * mag[e] : g == 0.0;
          if (live[size_t(row)] && std::isfinite(err)) worst = std::max(worst, err / (rms > 0 ? rms : 1));
          if (!ok && reported++ < 5)
            ADD_FAILURE() << name << "[" << b << ", " << h << ", " << s << ", " << d << "] = " << g << ", reference "
                          << ref[e] << (live[size_t(row)] ? "" : " (must be exactly 0)");
        }
      }
  ::testing::Test::RecordProperty(std::string("max_err_over_rms_") + name, std::to_string(worst));
}

void expect_matches(const BwdCase& x, const AttentionBackwardReference& ref, DType t) {
  expect_close("dq", x.dq, ref.dq, ref.mag_dq, ref.q_live, t);
  expect_close("dk", x.dk, ref.dk, ref.mag_dk, ref.k_live, t);
  expect_close("dv", x.dv, ref.dv, ref.mag_dv, ref.k_live, t);
}

// One case through attention_backward() on the hopper variant; with deterministic, a second run
// on poisoned outputs must give the same bytes.
void check(const AttnSpec& s, bool deterministic = true) {
  SCOPED_TRACE(s.name() + (deterministic ? "" : " nondeterministic"));
  auto x = make_backward_case(s);
  DeviceBwd d(*x);
  d.args.deterministic = deterministic;
  attention_backward(d.args, hopper());
  d.download(*x);
  expect_matches(*x, attention_backward_oracle(x->args), s.dtype);
  if (!deterministic) return;
  const std::vector<uint8_t> dq = x->dq.bytes, dk = x->dk.bytes, dv = x->dv.bytes;
  d.poison();
  attention_backward(d.args, hopper());
  d.download(*x);
  EXPECT_EQ(dq, x->dq.bytes) << "dq differs between two runs";
  EXPECT_EQ(dk, x->dk.bytes) << "dk differs between two runs";
  EXPECT_EQ(dv, x->dv.bytes) << "dv differs between two runs";
}

AttnSpec base(DType t, int d, int block, bool causal) { return gpu_spec(t, d, block, causal); }

TEST(HopperAttentionBackward, RandomTopkLayouts) {
  SPARSEK_REQUIRE_SM90();
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (int block : {64, 128})
        for (bool causal : {false, true}) check(base(t, d, block, causal));
}

// Packed sequences: boundaries inside blocks and inside 64-row steps, an empty and a one-token
// sequence; the layouts name blocks of other sequences too; deterministic runs repeat bit for bit.
TEST(HopperAttentionBackward, PackedSequences) {
  SPARSEK_REQUIRE_SM90();
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (int block : {64, 128})
        for (bool causal : {false, true}) {
          AttnSpec s = base(t, d, block, causal);
          s.packed({50, 1, 0, 130, 77, 64, 300});
          s.layout_heads = 4;
          s.density = 0.6;
          check(s);
        }
  AttnSpec s = base(DType::bf16, 128, 128, true);
  s.packed({100, 0, 29, 200, 211});
  s.kind = LayoutKind::causal;  // full lists below the diagonal
  check(s);
  check(s, false);
}

TEST(HopperAttentionBackward, CornerLayouts) {
  SPARSEK_REQUIRE_SM90();
  std::vector<AttnSpec> specs;
  AttnSpec s = base(DType::bf16, 128, 128, false);
  s.empty_rows = {0, 3, -1};  // empty query rows: dq = 0
  s.extra_kmax = 4;           // kmax beyond every count
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, false);
  s.batch = 1, s.hq = s.hkv = 1, s.sq = 128, s.skv = 1024, s.density = 0.25;  // key blocks nobody attends
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
  s.sq = s.skv = 385;           // a one-row tail block
  specs.push_back(s);
  s = base(DType::f16, 128, 128, false);
  s.kind = LayoutKind::dense;
  specs.push_back(s);
  s = base(DType::bf16, 64, 64, true);
  s.hq = 8, s.hkv = 1;  // MQA: dk, dv sum over 8 query heads
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, false);
  s.bshd = true;  // [B, S, H, D] memory (torch's transpose(1, 2))
  specs.push_back(s);
  s = base(DType::f16, 64, 128, false);
  s.sq = 1, s.skv = 50;  // one query row, fewer keys than a block
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, false);
  s.sq = 128, s.skv = 4096, s.batch = 1, s.hq = s.hkv = 1;  // one long row (32 key blocks)
  s.kind = LayoutKind::dense;
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, false);
  s.sq = 2048, s.skv = 256, s.batch = 1, s.hq = s.hkv = 1;  // long key columns (16 query blocks each)
  s.kind = LayoutKind::dense;
  specs.push_back(s);
  s = base(DType::bf16, 128, 128, false);
  s.scale = 0.3f;
  specs.push_back(s);
  for (const AttnSpec& spec : specs) check(spec);
}

TEST(HopperAttentionBackward, EmptyLayoutGivesZeroGradients) {
  SPARSEK_REQUIRE_SM90();
  AttnSpec s = base(DType::bf16, 128, 128, true);
  s.kind = LayoutKind::causal;
  for (int64_t r = 0; r < 2 * 2 * 3; ++r) s.empty_rows.push_back(r);  // every row (B 2 x Hkv 2 x 3 blocks)
  check(s);
}

// K and V scaled far beyond unit size (max|K| * max||V|| ~ 1e6): the deterministic dQ grid follows
// the head's bound, so dq keeps its accuracy and repeats bit for bit.
TEST(HopperAttentionBackward, LargeKeysAndValuesStayAccurateAndRepeatable) {
  SPARSEK_REQUIRE_SM90();
  for (DType t : {DType::bf16, DType::f16}) {
    AttnSpec s = base(t, 128, 128, false);
    s.scale = 1.f / 4096;  // keeps the scores (and so P) of unit size
    SCOPED_TRACE(s.name());
    auto x = make_backward_case(s);
    AttnCase& c = *x->c;
    for (auto [tensor, mul] : {std::pair{&c.k, 256.f}, std::pair{&c.v, 512.f}})
      for (int64_t i = 0; i < tensor->elements(); ++i)  // powers of two: exact in bf16 and f16
        store_from_float(tensor->view.data, t, i, load_as_float(tensor->view.data, t, i) * mul);
    DeviceBwd d(*x);  // O and LSE of the scaled inputs from the GPU forward
    attention_backward(d.args, hopper());
    d.download(*x);
    expect_matches(*x, attention_backward_oracle(x->args), t);
    const std::vector<uint8_t> dq = x->dq.bytes;
    d.poison();
    attention_backward(d.args, hopper());
    d.download(*x);
    EXPECT_EQ(dq, x->dq.bytes) << "dq differs between two runs";
  }
}

// Deterministic dQ rounds partial sums to integers, which would turn a NaN into 0: a NaN in a row's
// dO (so its Delta) must give a NaN dq row, and an inf in a head's K every dq row of that head whose
// forward LSE is not -inf; rows with LSE = -inf (nothing attended) stay exactly 0, all other rows
// finite. dq is poisoned with a finite value here (NaN poison could not be told from a NaN result).
TEST(HopperAttentionBackward, NonFiniteInputsGiveNanDqRows) {
  SPARSEK_REQUIRE_SM90();
  AttnSpec s = base(DType::bf16, 64, 64, false);  // batch 2, Hq 4, Hkv 2, Sq 300: 5 query blocks
  s.empty_rows = {-1};  // the last layout row: batch 1, kv head 1, queries 256..299 attend nothing
  auto x = make_backward_case(s);
  const Tensor4View& g = x->dout.view;
  store_from_float(g.data, g.dtype, g.index(0, 0, 5, 3), std::numeric_limits<float>::quiet_NaN());
  const Tensor4View& k = x->c->k.view;
  store_from_float(k.data, k.dtype, k.index(1, 1, 7, 0), std::numeric_limits<float>::infinity());
  DeviceBwd d(*x);
  ASSERT_EQ(cudaMemset(d.dq->ptr, 0x7B, d.dq->bytes), cudaSuccess);  // bf16 0x7B7B: about 1.3e36
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  attention_backward(d.args, hopper());
  d.download(*x);
  std::vector<float> lse(x->c->lse.size());  // the GPU forward's, as the backward read it
  ASSERT_EQ(cudaMemcpy(lse.data(), d.args.forward.lse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  const Tensor4View& q = x->dq.view;
  int wrong = 0, nan_rows = 0, empty_rows = 0;
  for (int64_t b = 0; b < q.b; ++b)
    for (int64_t h = 0; h < q.h; ++h)
      for (int64_t r = 0; r < q.s; ++r) {
        const bool attends = lse[size_t((b * q.h + h) * q.s + r)] != -std::numeric_limits<float>::infinity();
        const bool inf_head = b == 1 && h / (q.h / k.h) == 1, empty = inf_head && !attends;
        const bool nan_row = attends && ((b == 0 && h == 0 && r == 5) || inf_head);
        nan_rows += nan_row;
        empty_rows += empty;
        for (int64_t c = 0; c < q.d; ++c) {
          const float v = x->dq.at(b, h, r, c);
          const bool ok = empty ? v == 0.f : nan_row ? std::isnan(v) : std::fabs(v) < 1e30f;
          if (!ok && wrong++ < 5)
            ADD_FAILURE() << "dq[" << b << ", " << h << ", " << r << ", " << c << "] = " << v
                          << (empty ? ", expected 0" : nan_row ? ", expected NaN" : ", expected a finite value");
        }
      }
  EXPECT_GE(empty_rows, 88) << "the inf head's queries 256..299 attend nothing (two query heads)";
  EXPECT_GT(nan_rows, 44) << "the case must have rows that attend something in the inf head";
}

// The plan's workspace (transposed layout, row statistics, dQ accumulator) is reused by every run:
// nothing of one run may leak into the next. One plan, several runs on the same buffers with new
// values and layouts -- query blocks without entries in between, the fp32 mode in between -- each
// against its own reference; the first case again at the end, bit for bit as the first time.
TEST(HopperAttentionBackward, RunsOfOnePlanLeaveNothingBehind) {
  SPARSEK_REQUIRE_SM90();
  for (auto [t, d, block] : {std::tuple{DType::bf16, 128, 128}, std::tuple{DType::bf16, 64, 128},
                             std::tuple{DType::f16, 128, 64}}) {
    const AttnSpec s = base(t, d, block, false);
    SCOPED_TRACE(s.name());
    auto first = make_backward_case(s);
    DeviceBwd dev(*first);
    std::vector<uint8_t> first_dq;
    struct Run {
      uint64_t seed;
      bool empty_blocks, deterministic;
    };
    for (const Run& r : {Run{s.seed, false, true}, Run{s.seed + 7, true, true}, Run{s.seed + 11, false, false},
                         Run{s.seed + 13, true, true}, Run{s.seed, false, true}}) {
      SCOPED_TRACE("seed " + std::to_string(r.seed) + (r.empty_blocks ? " with empty query blocks" : "") +
                   (r.deterministic ? "" : " fp32 mode"));
      AttnSpec u = s;
      u.seed = r.seed;
      if (r.empty_blocks) u.empty_rows = {0, 2, -1};
      auto n = make_backward_case(u);
      ASSERT_EQ(n->c->layout.kmax, first->c->layout.kmax);
      dev.upload_inputs(*n);
      attention(dev.args.forward, hopper());  // O and LSE of the new values
      dev.poison();
      dev.args.deterministic = r.deterministic;
      attention_backward(dev.args, hopper());
      dev.download(*n);
      expect_matches(*n, attention_backward_oracle(n->args), t);
      if (r.seed == s.seed && !r.empty_blocks) {
        if (first_dq.empty()) first_dq = n->dq.bytes;
        else EXPECT_EQ(first_dq, n->dq.bytes) << "dq of the first case differs after the other runs";
      }
    }
  }
}

TEST(HopperAttentionBackward, NondeterministicModeIsAccurate) {
  SPARSEK_REQUIRE_SM90();
  check(base(DType::bf16, 128, 128, false), false);
  check(base(DType::f16, 64, 128, true), false);  // D = 64: 128-row steps, a dQ half per warpgroup
  AttnSpec s = base(DType::bf16, 64, 64, true);
  s.hq = 8, s.hkv = 2;
  check(s, false);
}

// The one-shot forward and backward captured once in a CUDA graph (global capture mode: an
// allocation or a synchronizing call fails the capture) after a first, planning call with
// check_indices off; replayed after new values and new layout contents (same extents) were
// written into the same buffers: each replay matches its own reference.
TEST(HopperAttentionBackward, OneShotInACudaGraphFollowsNewValuesAndLayouts) {
  SPARSEK_REQUIRE_SM90();
  AttnSpec s = base(DType::bf16, 128, 128, true);  // causal top-k: kmax 1, full_kmax k - 1 for any seed
  auto x = make_backward_case(s);
  DeviceBwd d(*x);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Options o = hopper(stream);
  o.check_indices = false;
  attention(d.args.forward, o);  // the plans, outside the capture
  attention_backward(d.args, o);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  attention(d.args.forward, o);
  attention_backward(d.args, o);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("replay with seed " + std::to_string(seed));
    AttnSpec t = s;
    t.seed = seed * 101;
    auto n = make_backward_case(t);
    ASSERT_EQ(n->c->layout.kmax, x->c->layout.kmax);
    ASSERT_EQ(n->c->layout.full_kmax, x->c->layout.full_kmax);
    d.upload_inputs(*n);
    d.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    d.download(*n);
    expect_matches(*n, attention_backward_oracle(n->args), t.dtype);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(HopperAttentionBackward, ChosenByDefaultForDeviceMemory) {
  SPARSEK_REQUIRE_SM90();
  auto x = make_backward_case(base(DType::bf16, 64, 64, false));
  DeviceBwd d(*x);
  EXPECT_TRUE(unsupported_reasons(d.args).size() == 1 && unsupported_reasons(d.args)[0].rfind("cpu: ", 0) == 0)
      << "only the cpu variant should refuse a device problem";
  attention_backward(d.args);  // no variant named: the heuristic picks hopper
  d.download(*x);
  expect_matches(*x, attention_backward_oracle(x->args), DType::bf16);
}

}  // namespace
}  // namespace sparsek::test
