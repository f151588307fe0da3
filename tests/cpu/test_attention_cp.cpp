// Context-parallel attention on host memory (plan_distributed_attention with `ranks`): every rank
// of one process runs its shards on the CPU backend, the transfers are copies. Checked against
// attention() / attention_backward() of the whole problem (the fp64-accumulating CPU backend): one
// rank bit-identical, several ranks within the rounding of the merge; outputs poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_cp_util.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/distributed.hpp"
#include "sparsek/sparsek.h"

namespace sparsek::test {
namespace {

int reported = 0;  // failures reported by this check(): the first few are enough

// |got - want| <= tol * (1 + |want|), or both NaN-free and equal when tol = 0.
void expect_near(const char* what, float got, float want, double tol, int64_t at, int rank) {
  if (reported > 8) return;
  if (tol == 0) {
    if (!(got == want || (std::isinf(got) && std::isinf(want) && (got > 0) == (want > 0))))
      ++reported, ADD_FAILURE() << what << "[" << at << "] on rank " << rank << ": " << got << " != " << want << " (bit-identical expected)";
    return;
  }
  if (!(std::fabs(double(got) - double(want)) <= tol * (1 + std::fabs(double(want)))) &&
      !(std::isinf(got) && got == want))
    ++reported, ADD_FAILURE() << what << "[" << at << "] on rank " << rank << ": " << got << " vs " << want;
}

void check(const CpCase& c) {
  SCOPED_TRACE(name(c));
  reported = 0;
  std::mt19937_64 rng(c.seed);
  CpLayout l = random_layout(c, rng);
  T4 q(c.dtype, c.batch, c.hq, c.sq, c.d), k(c.dtype, c.batch, c.hkv, c.skv, c.d), v(c.dtype, c.batch, c.hkv, c.skv, c.d);
  T4 o(c.dtype, c.batch, c.hq, c.sq, c.d), dout(c.dtype, c.batch, c.hq, c.sq, c.d);
  randomize(q, rng), randomize(k, rng), randomize(v, rng), randomize(dout, rng);
  std::vector<float> lse(size_t(c.batch * c.hq * c.sq));
  AttentionArgs whole;
  whole.q = q.v, whole.k = k.v, whole.v = v.v, whole.o = o.v, whole.lse = lse.data();
  whole.layout = l.view, whole.causal = c.causal;
  attention(whole);
  T4 dq(c.dtype, c.batch, c.hq, c.sq, c.d), dk(c.dtype, c.batch, c.hkv, c.skv, c.d), dv(c.dtype, c.batch, c.hkv, c.skv, c.d);
  AttentionBackwardArgs wb;
  wb.forward = whole, wb.dout = dout.v, wb.dq = dq.v, wb.dk = dk.v, wb.dv = dv.v;
  attention_backward(wb);

  const std::vector<DistributedAttentionPlan> plans = plan_distributed_attention(whole, c.ranks);
  ASSERT_EQ(int(plans.size()), c.ranks);
  std::vector<T4> sq_, sk, sv, so, sdo, sdq, sdk, sdv;
  std::vector<std::vector<float>> slse;
  std::vector<AttentionArgs> fwd;
  std::vector<AttentionBackwardArgs> bwd;
  int64_t prev_q = 0, prev_kv = 0;
  for (const auto& p : plans) {
    EXPECT_EQ(p.q_row_begin(), prev_q);
    EXPECT_EQ(p.kv_row_begin(), prev_kv);
    prev_q = p.q_row_end(), prev_kv = p.kv_row_end();
    const int64_t q0 = p.q_row_begin(), q1 = p.q_row_end(), k0 = p.kv_row_begin(), k1 = p.kv_row_end();
    sq_.push_back(slice(q, q0, q1)), sdo.push_back(slice(dout, q0, q1));
    sk.push_back(slice(k, k0, k1)), sv.push_back(slice(v, k0, k1));
    so.emplace_back(c.dtype, c.batch, c.hq, q1 - q0, c.d), sdq.emplace_back(c.dtype, c.batch, c.hq, q1 - q0, c.d);
    sdk.emplace_back(c.dtype, c.batch, c.hkv, k1 - k0, c.d), sdv.emplace_back(c.dtype, c.batch, c.hkv, k1 - k0, c.d);
    poison(so.back()), poison(sdq.back()), poison(sdk.back()), poison(sdv.back());
    slse.emplace_back(size_t(std::max<int64_t>(1, c.batch * c.hq * (q1 - q0))), std::numeric_limits<float>::quiet_NaN());
  }
  EXPECT_EQ(prev_q, c.sq);
  EXPECT_EQ(prev_kv, c.skv);
  double moved = 0;
  size_t held = 0;
  for (const auto& p : plans) moved += p.recv_bytes(), held += p.workspace_bytes();
  if (c.ranks > 1) EXPECT_GT(moved, 0) << "no block crosses ranks: the case tests nothing";
  if (c.ranks > 1) EXPECT_GE(double(held), 2 * moved) << "the received blocks and their gradients are held";
  for (int r = 0; r < c.ranks; ++r) {
    AttentionArgs a;
    a.q = sq_[size_t(r)].v, a.k = sk[size_t(r)].v, a.v = sv[size_t(r)].v, a.o = so[size_t(r)].v;
    a.lse = slse[size_t(r)].data();
    fwd.push_back(a);
  }
  run(plans, fwd);
  // Several ranks: the merge of two partial results rounded to the dtype.
  const double tol = c.ranks == 1 ? 0 : c.dtype == DType::f32 ? 2e-5 : 2e-2;
  for (int r = 0; r < c.ranks; ++r) {
    const auto& p = plans[size_t(r)];
    const int64_t q0 = p.q_row_begin(), n = p.q_row_end() - q0;
    for (int64_t bh = 0; bh < c.batch * c.hq; ++bh)
      for (int64_t i = 0; i < n; ++i) {
        expect_near("lse", slse[size_t(r)][size_t(bh * n + i)], lse[size_t(bh * c.sq + q0 + i)], tol, bh * c.sq + q0 + i, r);
        for (int64_t e = 0; e < c.d; ++e)
          expect_near("o", so[size_t(r)].at((bh * n + i) * c.d + e), o.at((bh * c.sq + q0 + i) * c.d + e), tol,
                      (bh * c.sq + q0 + i) * c.d + e, r);
      }
  }
  // The backward from the whole forward's o and lse (so that only the backward's split is measured).
  for (int r = 0; r < c.ranks; ++r) {
    const auto& p = plans[size_t(r)];
    so[size_t(r)] = slice(o, p.q_row_begin(), p.q_row_end());
    for (int64_t bh = 0; bh < c.batch * c.hq; ++bh)
      for (int64_t i = p.q_row_begin(); i < p.q_row_end(); ++i)
        slse[size_t(r)][size_t(bh * (p.q_row_end() - p.q_row_begin()) + i - p.q_row_begin())] = lse[size_t(bh * c.sq + i)];
    AttentionBackwardArgs b;
    b.forward = fwd[size_t(r)];
    b.forward.o = so[size_t(r)].v;
    b.dout = sdo[size_t(r)].v, b.dq = sdq[size_t(r)].v, b.dk = sdk[size_t(r)].v, b.dv = sdv[size_t(r)].v;
    bwd.push_back(b);
  }
  run_backward(plans, bwd);
  const double gtol = c.ranks == 1 ? 0 : c.dtype == DType::f32 ? 5e-5 : 5e-2;
  for (int r = 0; r < c.ranks; ++r) {
    const auto& p = plans[size_t(r)];
    const int64_t q0 = p.q_row_begin(), n = p.q_row_end() - q0, k0 = p.kv_row_begin(), m = p.kv_row_end() - k0;
    for (int64_t bh = 0; bh < c.batch * c.hq; ++bh)
      for (int64_t e = 0; e < n * c.d; ++e)
        expect_near("dq", sdq[size_t(r)].at(bh * n * c.d + e), dq.at((bh * c.sq + q0) * c.d + e), gtol, e, r);
    for (int64_t bh = 0; bh < c.batch * c.hkv; ++bh)
      for (int64_t e = 0; e < m * c.d; ++e) {
        expect_near("dk", sdk[size_t(r)].at(bh * m * c.d + e), dk.at((bh * c.skv + k0) * c.d + e), gtol, e, r);
        expect_near("dv", sdv[size_t(r)].at(bh * m * c.d + e), dv.at((bh * c.skv + k0) * c.d + e), gtol, e, r);
      }
  }
}

TEST(ContextParallelAttention, OneRankIsBitIdenticalToAttention) {
  for (bool causal : {false, true}) {
    CpCase c;
    c.ranks = 1, c.causal = causal, c.full = true, c.seed = 3;
    check(c);
    c.dtype = DType::bf16;
    check(c);
  }
}

TEST(ContextParallelAttention, SeveralRanksMatchTheWholeProblem) {
  uint64_t seed = 10;
  for (int ranks : {2, 3, 4})
    for (bool causal : {false, true})
      for (bool full : {false, true}) {
        CpCase c;
        c.ranks = ranks, c.causal = causal, c.full = full, c.seed = seed++;
        check(c);
      }
}

TEST(ContextParallelAttention, GqaBatchesLayoutExtentsTailsAndBlocks) {
  uint64_t seed = 100;
  for (int64_t heads : {1, 4, 2})
    for (int64_t lbatch : {1, 2}) {
      CpCase c;
      c.batch = 2, c.hq = 4, c.hkv = 2, c.heads = heads, c.lbatch = lbatch;
      c.sq = c.skv = 600, c.block = 64, c.causal = heads != 2, c.full = true, c.ranks = 3, c.seed = seed++;
      check(c);
    }
  CpCase c;  // D = 128, bf16, a tail
  c.d = 128, c.dtype = DType::bf16, c.sq = c.skv = 700, c.causal = true, c.ranks = 2, c.seed = 8;
  check(c);
}

TEST(ContextParallelAttention, CrossAttentionAndMoreRanksThanRows) {
  CpCase c;
  c.sq = 384, c.skv = 1000, c.ranks = 3, c.full = true, c.seed = 21;  // key/value blocks split evenly
  check(c);
  c.sq = c.skv = 256, c.ranks = 4, c.seed = 23;  // two query blocks over four ranks: two ranks idle
  check(c);
}

// Per-head layouts give each key/value head its own set of received blocks (gaps in the compact
// buffer), and the partial last block is received too: it must sit alone in the last slot.
TEST(ContextParallelAttention, PerHeadLayoutsWithAPartialLastBlock) {
  CpCase c;
  c.hq = 4, c.hkv = 2, c.heads = 4, c.sq = c.skv = 2008, c.full = true, c.ranks = 4, c.seed = 5;
  check(c);
}

TEST(ContextParallelAttention, ErrorsNameTheArgumentAndValue) {
  CpCase c;
  std::mt19937_64 rng(5);
  CpLayout l = random_layout(c, rng);
  T4 q(c.dtype, 1, 2, 640, 64), k(c.dtype, 1, 2, 640, 64);
  AttentionArgs whole;
  whole.q = q.v, whole.k = k.v, whole.v = k.v, whole.layout = l.view;
  auto expect = [](auto&& f, Status st, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no error, expected: " << want;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), st) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect([&] { plan_distributed_attention(whole, 0); }, Status::invalid_argument, "ranks = 0 must be >= 1");
  AttentionArgs cross = whole;
  cross.k.s = cross.v.s = 512, cross.causal = true;
  expect([&] { plan_distributed_attention(cross, 2); }, Status::unsupported, "causal needs self-attention");
  AttentionArgs packed = whole;
  int32_t cu[3] = {0, 100, 640};
  packed.cu_seqlens = cu, packed.num_seqs = 2;
  expect([&] { plan_distributed_attention(packed, 2); }, Status::unsupported,
         "distributed attention: packed sequences (cu_seqlens) are not supported");
  AttentionArgs mixed = whole;
  mixed.k.memory = Memory::device;
  expect([&] { plan_distributed_attention(mixed, 2); }, Status::invalid_argument, "q, k and v must be in one kind of memory");
  const auto plans = plan_distributed_attention(whole, 2);
  const auto& p0 = plans[0];
  T4 sq(c.dtype, 1, 2, p0.q_row_end(), 64), so(c.dtype, 1, 2, p0.q_row_end(), 64), sk(c.dtype, 1, 2, p0.kv_row_end(), 64);
  std::vector<float> lse(size_t(2 * p0.q_row_end()));
  AttentionArgs s;
  s.q = sq.v, s.o = so.v, s.k = sk.v, s.v = sk.v, s.lse = lse.data();
  expect([&] { run(p0, s); }, Status::invalid_argument, "ranks of a plan without communicators run together");
  std::vector<AttentionArgs> two{s, s};
  two[1].q.s = 3;
  expect([&] { run(plans, two); }, Status::invalid_argument, "rank 1: q is [1, 2, 3, 64] but this rank's shard is");
  two[1] = s;
  two[0].lse = nullptr;
  expect([&] { run(plans, two); }, Status::invalid_argument, "rank 0: lse is null");
  two[0] = s;
  two[0].q.stride_h = 1;
  expect([&] { run(plans, two); }, Status::invalid_argument, "rank 0: q must be packed");
  two[0] = s;
  two[0].cu_seqlens = cu, two[0].num_seqs = 2;
  expect([&] { run(plans, two); }, Status::unsupported, "rank 0: a shard with cu_seqlens");
  expect([&] { run(std::vector<DistributedAttentionPlan>{plans[1], plans[0]}, std::vector<AttentionArgs>{s, s}); },
         Status::invalid_argument, "plans[0] is not rank 0");
  expect([&] { run(DistributedAttentionPlan(), s); }, Status::invalid_argument, "the plan is empty");
  expect([&] { plan_distributed_attention(whole, static_cast<ncclComm*>(nullptr)); }, Status::invalid_argument,
         "distributed attention: comm is null");
}

TEST(ContextParallelAttention, CApiNamedErrors) {
  int dummy = 0;
  sparsek_attention_args args{};
  sparsek_attention_cp_plan p = reinterpret_cast<sparsek_attention_cp_plan>(&dummy);  // must be reset to NULL
  EXPECT_EQ(sparsek_attention_cp_plan_create(&p, &args, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(sparsek_last_error()).find("sparsek_attention_cp_plan_create: distributed attention: comm is null"),
            std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_attention_cp_plan_create(&p, nullptr, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("'problem' is NULL"), std::string::npos) << sparsek_last_error();
  EXPECT_EQ(sparsek_attention_cp_plan_run(nullptr, &args, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("argument 'plan' is NULL"), std::string::npos);
  sparsek_attention_backward_args b{};
  EXPECT_EQ(sparsek_attention_cp_plan_run_backward(reinterpret_cast<sparsek_attention_cp_plan>(&dummy), &b, nullptr),
            SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("not made by sparsek_attention_cp_plan_create"), std::string::npos)
      << sparsek_last_error();
  int64_t r[4] = {};
  EXPECT_EQ(sparsek_attention_cp_plan_rows(nullptr, r, r + 1, r + 2, r + 3), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(sparsek_attention_cp_plan_destroy(nullptr), SPARSEK_OK);
  EXPECT_EQ(sparsek_attention_cp_plan_destroy(reinterpret_cast<sparsek_attention_cp_plan>(&dummy)), SPARSEK_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace sparsek::test
