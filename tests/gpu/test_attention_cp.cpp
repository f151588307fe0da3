// Context-parallel attention on the GPU, against attention() / attention_backward() of the whole
// problem on the same GPU (outputs poisoned first): several ranks of this process on one GPU
// (transfers by device copies: every kernel of the split runs) within bf16 rounding of the merge;
// one rank, and one NCCL rank, bit-identical; runs replayed from a CUDA graph; n NCCL ranks on n
// GPUs when as many answer.
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_cp_util.hpp"
#include "core/nccl.hpp"
#include "distributed_util.hpp"
#include "sparsek/distributed.hpp"
#include "sparsek/sparsek.h"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device copy of a host tensor (on the current device); download() writes the host tensor back.
struct DevT4 {
  T4* host;
  void* p = nullptr;
  Tensor4View v;
  explicit DevT4(T4& t) : host(&t) {
    const size_t n = t.bytes.size();
    if (cudaMalloc(&p, n) != cudaSuccess || cudaMemcpy(p, t.bytes.data(), n, cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMalloc/cudaMemcpy");
    v = t.v;
    v.data = p, v.memory = Memory::device;
  }
  void download() {
    if (cudaMemcpy(host->bytes.data(), p, host->bytes.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy D2H");
  }
  ~DevT4() { cudaFree(p); }
  DevT4(const DevT4&) = delete;
  DevT4& operator=(const DevT4&) = delete;
};
struct DevF {
  std::vector<float>* host;
  float* p = nullptr;
  explicit DevF(std::vector<float>& h) : host(&h) {
    if (cudaMalloc(&p, h.size() * 4) != cudaSuccess || cudaMemcpy(p, h.data(), h.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMalloc/cudaMemcpy");
  }
  void download() {
    if (cudaMemcpy(host->data(), p, host->size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("D2H");
  }
  ~DevF() { cudaFree(p); }
  DevF(const DevF&) = delete;
  DevF& operator=(const DevF&) = delete;
};

int reported = 0;
void expect_near(const char* what, float got, float want, double tol, int64_t at, int rank) {
  if (reported > 8) return;
  const bool same = got == want || (std::isinf(got) && got == want);
  const bool ok = tol == 0 ? same : same || std::fabs(double(got) - double(want)) <= tol * (1 + std::fabs(double(want)));
  if (!ok) ++reported, ADD_FAILURE() << what << "[" << at << "] on rank " << rank << ": " << got << " vs " << want << (tol == 0 ? " (bit-identical expected)" : "");
}

// How the ranks run: in this process without NCCL, over NCCL communicators (one per GPU), or one
// NCCL rank through the C API.
enum class Mode { inproc, nccl, capi };

sparsek_tensor4 c_tensor(const Tensor4View& t) {
  return {t.data, sparsek_dtype(int(t.dtype)), sparsek_memory(int(t.memory)), t.b, t.h, t.s, t.d, t.stride_b, t.stride_h, t.stride_s};
}
sparsek_attention_args c_args(const AttentionArgs& a) {
  sparsek_attention_args c{};
  c.q = c_tensor(a.q), c.k = c_tensor(a.k), c.v = c_tensor(a.v), c.o = c_tensor(a.o), c.lse = a.lse;
  const AttentionLayout& l = a.layout;
  c.layout = {l.kv_num_blocks, l.kv_indices, l.full_kv_num_blocks, l.full_kv_indices, l.batch, l.heads, l.q_blocks,
              l.kmax, l.full_kmax, l.block_q, l.block_kv, sparsek_memory(int(l.memory))};
  c.causal = a.causal, c.scale = a.scale;
  c.cu_seqlens = a.cu_seqlens, c.num_seqs = a.num_seqs;
  return c;
}

// One NCCL rank through the C API: a plan made once, its rows, a forward and a backward.
struct CApiRank {
  sparsek_attention_cp_plan plan = nullptr;
  CApiRank(const AttentionArgs& whole, ncclComm* comm) {
    const sparsek_attention_args c = c_args(whole);
    if (sparsek_attention_cp_plan_create(&plan, &c, comm) != SPARSEK_OK) throw std::runtime_error(sparsek_last_error());
  }
  ~CApiRank() { sparsek_attention_cp_plan_destroy(plan); }
  void forward(const AttentionArgs& a, void* stream) {
    const sparsek_attention_args c = c_args(a);
    if (sparsek_attention_cp_plan_run(plan, &c, stream) != SPARSEK_OK) throw std::runtime_error(sparsek_last_error());
  }
  void backward(const AttentionBackwardArgs& a, void* stream) {
    sparsek_attention_backward_args c{};
    c.forward = c_args(a.forward), c.dout = c_tensor(a.dout), c.dq = c_tensor(a.dq), c.dk = c_tensor(a.dk), c.dv = c_tensor(a.dv);
    c.nondeterministic = a.deterministic ? 0 : 1;
    if (sparsek_attention_cp_plan_run_backward(plan, &c, stream) != SPARSEK_OK) throw std::runtime_error(sparsek_last_error());
  }
};

// The whole problem on the GPU (attention, attention_backward), then the distributed forward and
// backward on the ranks' shards, compared row by row. graph: the second runs replayed from a CUDA
// graph (every rank on one stream: in this process, or one NCCL rank).
void check(const CpCase& c, Mode mode, bool graph = false) {
  SCOPED_TRACE(name(c) + (mode == Mode::nccl ? " nccl" : mode == Mode::capi ? " C API" : " in-process") + (graph ? " graph" : ""));
  reported = 0;
  std::mt19937_64 rng(c.seed);
  CpLayout l = random_layout(c, rng);
  T4 q(c.dtype, c.batch, c.hq, c.sq, c.d), k(c.dtype, c.batch, c.hkv, c.skv, c.d), v(c.dtype, c.batch, c.hkv, c.skv, c.d);
  T4 o(c.dtype, c.batch, c.hq, c.sq, c.d), dout(c.dtype, c.batch, c.hq, c.sq, c.d);
  T4 dq(c.dtype, c.batch, c.hq, c.sq, c.d), dk(c.dtype, c.batch, c.hkv, c.skv, c.d), dv(c.dtype, c.batch, c.hkv, c.skv, c.d);
  randomize(q, rng), randomize(k, rng), randomize(v, rng), randomize(dout, rng);
  std::vector<float> lse(size_t(c.batch * c.hq * c.sq));
  AttentionArgs whole;
  {
    DevT4 dq_(q), dk_(k), dv_(v), do_(o), ddout(dout), ddq(dq), ddk(dk), ddv(dv);
    DevF dl(lse);
    whole.q = dq_.v, whole.k = dk_.v, whole.v = dv_.v, whole.o = do_.v, whole.lse = dl.p;
    const AttentionLayout hl = l.view;  // the one-shot call on the GPU takes a device layout
    whole.layout = l.view;
    Dev num(l.num.data(), l.num.size() * 4), idx(l.idx.data(), l.idx.size() * 4);
    Dev fnum(l.fnum.data(), l.fnum.size() * 4), fidx(l.fidx.data(), l.fidx.size() * 4);
    whole.layout.kv_num_blocks = static_cast<const int32_t*>(num.p), whole.layout.kv_indices = static_cast<const int32_t*>(idx.p);
    if (c.full)
      whole.layout.full_kv_num_blocks = static_cast<const int32_t*>(fnum.p),
      whole.layout.full_kv_indices = static_cast<const int32_t*>(fidx.p);
    whole.layout.memory = Memory::device;
    whole.causal = c.causal;
    attention(whole);
    AttentionBackwardArgs wb;
    wb.forward = whole, wb.dout = ddout.v, wb.dq = ddq.v, wb.dk = ddk.v, wb.dv = ddv.v;
    attention_backward(wb);
    CUDA_OK(cudaDeviceSynchronize());
    do_.download(), dl.download(), ddq.download(), ddk.download(), ddv.download();
    whole.layout = hl;  // the plan reads the layout on the host
  }

  std::vector<std::unique_ptr<Comms>> comms;
  std::vector<DistributedAttentionPlan> plans;
  std::unique_ptr<CApiRank> capi;
  if (mode == Mode::capi) {  // the C API's plan, and a C++ plan of the same rank for its rows
    comms.push_back(std::make_unique<Comms>(1));
    capi = std::make_unique<CApiRank>(whole, comms[0]->c[0]);
    plans = plan_distributed_attention(whole, 1);
    int64_t r[4] = {};
    ASSERT_EQ(sparsek_attention_cp_plan_rows(capi->plan, r, r + 1, r + 2, r + 3), SPARSEK_OK);
    EXPECT_EQ(r[1], c.sq);
    EXPECT_EQ(r[3], c.skv);
  } else if (mode == Mode::nccl) {
    comms.push_back(std::make_unique<Comms>(c.ranks));
    plans = plan_distributed_attention(whole, comms[0]->c);
  } else {
    plans = plan_distributed_attention(whole, c.ranks);
  }
  ASSERT_EQ(int(plans.size()), c.ranks);
  std::vector<T4> hq_, hk, hv, ho, hdo, hdq, hdk, hdv;
  std::vector<std::vector<float>> hl;
  for (const auto& p : plans) {
    const int64_t q0 = p.q_row_begin(), q1 = p.q_row_end(), k0 = p.kv_row_begin(), k1 = p.kv_row_end();
    hq_.push_back(slice(q, q0, q1)), hdo.push_back(slice(dout, q0, q1));
    hk.push_back(slice(k, k0, k1)), hv.push_back(slice(v, k0, k1));
    ho.emplace_back(c.dtype, c.batch, c.hq, q1 - q0, c.d), hdq.emplace_back(c.dtype, c.batch, c.hq, q1 - q0, c.d);
    hdk.emplace_back(c.dtype, c.batch, c.hkv, k1 - k0, c.d), hdv.emplace_back(c.dtype, c.batch, c.hkv, k1 - k0, c.d);
    poison(ho.back()), poison(hdq.back()), poison(hdk.back()), poison(hdv.back());
    hl.emplace_back(size_t(std::max<int64_t>(1, c.batch * c.hq * (q1 - q0))), std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<std::unique_ptr<DevT4>> d;  // per rank: q k v o dout dq dk dv
  std::vector<std::unique_ptr<DevF>> dl;
  std::vector<AttentionArgs> fwd;
  std::vector<AttentionBackwardArgs> bwd;
  std::vector<void*> streams;
  for (int r = 0; r < c.ranks; ++r) {
    const int dev = mode == Mode::inproc ? 0 : r;
    CUDA_OK(cudaSetDevice(dev));
    for (T4* t : {&hq_[size_t(r)], &hk[size_t(r)], &hv[size_t(r)], &ho[size_t(r)], &hdo[size_t(r)], &hdq[size_t(r)],
                  &hdk[size_t(r)], &hdv[size_t(r)]})
      d.push_back(std::make_unique<DevT4>(*t));
    dl.push_back(std::make_unique<DevF>(hl[size_t(r)]));
    const size_t b = size_t(r) * 8;
    AttentionArgs a;
    a.q = d[b]->v, a.k = d[b + 1]->v, a.v = d[b + 2]->v, a.o = d[b + 3]->v, a.lse = dl.back()->p;
    fwd.push_back(a);
    AttentionBackwardArgs g;
    g.forward = a, g.dout = d[b + 4]->v, g.dq = d[b + 5]->v, g.dk = d[b + 6]->v, g.dv = d[b + 7]->v;
    bwd.push_back(g);
    cudaStream_t s = nullptr;  // a graph captures one stream: every rank on it
    if (graph && r > 0) s = static_cast<cudaStream_t>(streams[0]);
    else CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams.push_back(s);
  }
  CUDA_OK(cudaSetDevice(0));
  auto sync = [&] {
    for (int r = 0; r < c.ranks; ++r) {
      cudaSetDevice(mode == Mode::inproc ? 0 : r);
      EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(streams[size_t(r)])), cudaSuccess);
    }
    cudaSetDevice(0);
  };
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  if (mode == Mode::inproc && gpus >= 2) {  // a stream of another device than the plans' is refused by name
    CUDA_OK(cudaSetDevice(1));
    cudaStream_t other = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CUDA_OK(cudaSetDevice(0));
    std::vector<void*> wrong = streams;
    wrong.back() = other;
    const std::string want = "streams[" + std::to_string(c.ranks - 1) + "] is on CUDA device 1 but plans[" +
                             std::to_string(c.ranks - 1) + "] was made on device 0";
    try {
      run(plans, fwd, wrong);
      ADD_FAILURE() << "a stream of device 1 was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    cudaStreamDestroy(other);
  }
  if (capi) {
    capi->forward(fwd[0], streams[0]);
    capi->backward(bwd[0], streams[0]);
  } else {
    run(plans, fwd, streams);  // the first run plans the two local calls
    run_backward(plans, bwd, streams);
  }
  sync();
  if (graph) {  // poison again, then the forward and backward replayed from a graph
    for (int r = 0; r < c.ranks; ++r)
      for (int t : {3, 5, 6, 7}) CUDA_OK(cudaMemset(d[size_t(r) * 8 + size_t(t)]->p, 0xFF, d[size_t(r) * 8 + size_t(t)]->host->bytes.size()));
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    cudaStream_t s = static_cast<cudaStream_t>(streams[0]);
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    run(plans, fwd, streams);
    run_backward(plans, bwd, streams);
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_OK(cudaGraphLaunch(ge, s));
    sync();
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
  }
  for (auto& x : d) x->download();
  for (auto& x : dl) x->download();
  const double tol = c.ranks == 1 ? 0 : 2e-2, gtol = c.ranks == 1 ? 0 : 6e-2;
  for (int r = 0; r < c.ranks; ++r) {
    const auto& p = plans[size_t(r)];
    const int64_t q0 = p.q_row_begin(), n = p.q_row_end() - q0, k0 = p.kv_row_begin(), m = p.kv_row_end() - k0;
    for (int64_t bh = 0; bh < c.batch * c.hq; ++bh)
      for (int64_t i = 0; i < n; ++i) {
        expect_near("lse", hl[size_t(r)][size_t(bh * n + i)], lse[size_t(bh * c.sq + q0 + i)], tol, i, r);
        for (int64_t e = 0; e < c.d; ++e) {
          expect_near("o", ho[size_t(r)].at((bh * n + i) * c.d + e), o.at((bh * c.sq + q0 + i) * c.d + e), tol, i, r);
          expect_near("dq", hdq[size_t(r)].at((bh * n + i) * c.d + e), dq.at((bh * c.sq + q0 + i) * c.d + e), gtol, i, r);
        }
      }
    for (int64_t bh = 0; bh < c.batch * c.hkv; ++bh)
      for (int64_t e = 0; e < m * c.d; ++e) {
        expect_near("dk", hdk[size_t(r)].at(bh * m * c.d + e), dk.at((bh * c.skv + k0) * c.d + e), gtol, e, r);
        expect_near("dv", hdv[size_t(r)].at(bh * m * c.d + e), dv.at((bh * c.skv + k0) * c.d + e), gtol, e, r);
      }
  }
  for (size_t r = 0; r < streams.size(); ++r)
    if (r == 0 || !graph) cudaStreamDestroy(static_cast<cudaStream_t>(streams[r]));
}

CpCase gpu_case(int ranks, bool causal, uint64_t seed) {
  CpCase c;
  c.batch = 1, c.hq = 4, c.hkv = 2, c.sq = c.skv = 2048 - 40, c.d = 128, c.block = 128;
  c.heads = 4, c.causal = causal, c.full = true, c.ranks = ranks, c.dtype = DType::bf16, c.seed = seed;
  return c;
}

TEST(ContextParallelGpu, RanksInOneProcessMatchOneGpu) {
  SPARSEK_REQUIRE_SM90();
  uint64_t seed = 1;
  for (int ranks : {1, 2, 4})
    for (bool causal : {false, true}) check(gpu_case(ranks, causal, seed++), Mode::inproc);
  CpCase c = gpu_case(3, true, 9);  // D = 64, 64x64 blocks, f16, two batches with a layout each
  c.d = 64, c.block = 64, c.dtype = DType::f16, c.batch = 2, c.lbatch = 2, c.heads = 2, c.sq = c.skv = 1000;
  check(c, Mode::inproc);
  check(gpu_case(2, true, 11), Mode::inproc, true);  // the side streams' fork and join under capture
}

TEST(ContextParallelGpu, OneNcclRankIsBitIdenticalAndCapturable) {
  SPARSEK_REQUIRE_SM90();
  try {
    nccl::api();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  check(gpu_case(1, true, 31), Mode::nccl, true);
  check(gpu_case(1, false, 32), Mode::nccl);
  check(gpu_case(1, true, 33), Mode::capi);
}

// The C API passes cu_seqlens on: the planner's refusal of packed sequences reaches the caller
// (after the ranks' exchange of their checks) with its status and message.
TEST(ContextParallelGpu, CApiRefusesPackedSequences) {
  SPARSEK_REQUIRE_GPU();
  try {
    nccl::api();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  Comms comms(1);
  sparsek_attention_args c{};
  const sparsek_tensor4 t{nullptr, SPARSEK_BF16, SPARSEK_DEVICE, 1, 2, 256, 128, 2 * 256 * 128, 256 * 128, 128};
  c.q = c.k = c.v = c.o = t;
  int32_t cu[3] = {0, 100, 256};
  c.cu_seqlens = cu, c.num_seqs = 2;
  sparsek_attention_cp_plan plan = nullptr;
  EXPECT_EQ(sparsek_attention_cp_plan_create(&plan, &c, comms.c[0]), SPARSEK_UNSUPPORTED);
  EXPECT_EQ(plan, nullptr);
  EXPECT_NE(std::string(sparsek_last_error()).find("packed sequences (cu_seqlens) are not supported"), std::string::npos)
      << sparsek_last_error();
}

TEST(ContextParallelGpu, NcclRanksOnSeveralGpus) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  cudaGetDeviceCount(&n);
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << n;
  try {
    nccl::api();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  for (int ranks : {2, 4})
    if (ranks <= n)
      for (bool causal : {true, false}) check(gpu_case(ranks, causal, 40 + uint64_t(ranks) + causal), Mode::nccl);
}

}  // namespace
}  // namespace sparsek::test
