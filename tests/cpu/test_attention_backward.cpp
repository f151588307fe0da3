// The attention backward on the CPU: the CPU variant's gradients against finite differences of
// the fp64 forward reference (random layouts, empty query rows, key blocks nobody attends, causal
// with full blocks, GQA / MQA and layout broadcast, sequence tails, D 64 and 128, strided
// tensors), every element against the fp64 backward reference, the named errors of bad
// arguments and the C API; then the Hopper variant's refusals, which are named before any device
// query (the kernel itself runs in tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_util.hpp"
#include "core/device.hpp"
#include "core/no_gpu.hpp"
#include "plan/backends.hpp"

namespace sparsek {
namespace {

using test::AttnSpec;
using test::BwdCase;
using test::HostTensor;
using test::make_backward_case;

// sum over query rows s0 .. s1-1 of query heads h0 .. h1-1 (batch b) of dout . O, O from the fp64
// forward reference: the loss whose gradients the backward computes (restricted to the rows a
// perturbed element can change).
double loss(const BwdCase& x, int64_t b, int64_t h0, int64_t h1, int64_t s0, int64_t s1) {
  const AttentionArgs& a = x.args.forward;
  std::vector<double> o(size_t(a.q.d));
  double lse = 0, sum = 0;
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t s = s0; s < s1; ++s) {
      attention_oracle_row(a, b, h, s, o.data(), &lse);
      for (int64_t d = 0; d < a.q.d; ++d) sum += o[size_t(d)] * double(x.dout.at(b, h, s, d));
    }
  return sum;
}

// Central difference of the loss for element (b, h, s, d) of t (q, k or v of the case, f32).
double finite_difference(BwdCase& x, HostTensor& t, bool is_q, int64_t b, int64_t h, int64_t s, int64_t d) {
  const AttentionArgs& a = x.args.forward;
  const int64_t G = a.q.h / a.k.h;
  const int64_t h0 = is_q ? h : h * G, h1 = is_q ? h + 1 : (h + 1) * G;
  const int64_t s0 = is_q ? s : 0, s1 = is_q ? s + 1 : a.q.s;
  const int64_t at = t.view.index(b, h, s, d);
  const float orig = t.at(b, h, s, d);
  auto eval = [&](float v, double* actual) {
    store_from_float(t.view.data, t.view.dtype, at, v);
    *actual = t.at(b, h, s, d);  // the value the inputs really hold
    return loss(x, b, h0, h1, s0, s1);
  };
  double xp, xm;
  const double lp = eval(orig + 1e-3f, &xp), lm = eval(orig - 1e-3f, &xm);
  store_from_float(t.view.data, t.view.dtype, at, orig);
  return (lp - lm) / (xp - xm);
}

// Key blocks that no layout row of key/value head hk (batch b) names: their dk and dv are 0.
std::vector<int64_t> unreferenced_key_blocks(const AttentionArgs& a, int64_t b, int64_t hk) {
  const AttentionLayout& l = a.layout;
  const int64_t G = a.q.h / a.k.h, nk = (a.k.s + l.block_kv - 1) / l.block_kv;
  std::vector<char> used(size_t(nk), 0);
  for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
    for (int64_t i = 0; i < l.q_blocks; ++i) {
      const int64_t r = layout_row(l, a.q.h, a.k.h, b, h, i);
      for (int32_t j = 0; j < l.kv_num_blocks[r]; ++j) used[size_t(l.kv_indices[r * l.kmax + j])] = 1;
      for (int32_t j = 0; l.has_full() && j < l.full_kv_num_blocks[r]; ++j)
        used[size_t(l.full_kv_indices[r * l.full_kmax + j])] = 1;
    }
  std::vector<int64_t> out;
  for (int64_t j = 0; j < nk; ++j)
    if (!used[size_t(j)]) out.push_back(j);
  return out;
}

// Runs attention_backward() on the CPU for the case and checks:
//  - every element of dq, dk, dv against the fp64 backward reference (poison gone): the CPU reads
//    P from the forward's f32 LSE and Delta from its O in the dtype, so it may differ from the
//    definition by the rounding of those two (u_in times the terms' magnitude) and of the output;
//  - rows whose forward LSE is -inf have dq = 0, keys of blocks no row names have dk = dv = 0;
//  - (f32) sampled elements against central differences of the fp64 forward reference, the
//    samples including a dead query row and an unattended key when the case has them.
void check_backward(const AttnSpec& spec, int samples = 8) {
  SCOPED_TRACE(spec.name());
  auto x = make_backward_case(spec);
  const AttentionArgs& a = x->args.forward;
  Options cpu;
  cpu.backend = Backend::cpu;
  attention_backward(x->args, cpu);
  const AttentionBackwardReference ref = attention_backward_oracle(x->args);
  const int64_t B = a.q.b, Hq = a.q.h, Sq = a.q.s, D = a.q.d, Hkv = a.k.h, Skv = a.k.s;
  // u_out: the output's rounding; u_in: the f32 LSE's (|LSE| < 16 here) or O's in the dtype.
  const double u_out = spec.dtype == DType::f32 ? 0x1p-24 : spec.dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
  const double u_in = spec.dtype == DType::f32 ? 0x1p-19 : 2 * u_out;
  int reported = 0;
  auto same = [&](const HostTensor& t, const std::vector<double>& r, const std::vector<double>& mag, const char* name,
                  int64_t H, int64_t S) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t d = 0; d < D; ++d) {
            const size_t e = size_t(((b * H + h) * S + s) * D + d);
            const double got = t.at(b, h, s, d), want = r[e];
            if (!(std::fabs(got - want) <= u_out * std::fabs(want) + u_in * mag[e]) && reported++ < 5)
              ADD_FAILURE() << name << "[" << b << ", " << h << ", " << s << ", " << d << "] = " << got << ", want "
                            << want << " (terms' magnitude " << mag[e] << ")";
          }
  };
  same(x->dq, ref.dq, ref.mag_dq, "dq", Hq, Sq);
  same(x->dk, ref.dk, ref.mag_dk, "dk", Hkv, Skv);
  same(x->dv, ref.dv, ref.mag_dv, "dv", Hkv, Skv);

  // Dead rows and unattended keys, found without the backward's code.
  std::vector<std::array<int64_t, 3>> dead_q, dead_k;  // (b, h, s)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t s = 0; s < Sq; ++s)
        if (std::isinf(x->c->lse[size_t((b * Hq + h) * Sq + s)])) {
          dead_q.push_back({b, h, s});
          for (int64_t d = 0; d < D; ++d) EXPECT_EQ(x->dq.at(b, h, s, d), 0.f) << "dq of a row that attends nothing";
        }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hkv; ++hk)
      for (int64_t j : unreferenced_key_blocks(a, b, hk))
        for (int64_t s = j * a.layout.block_kv; s < std::min(Skv, (j + 1) * a.layout.block_kv); ++s) {
          dead_k.push_back({b, hk, s});
          for (int64_t d = 0; d < D; ++d) {
            EXPECT_EQ(x->dk.at(b, hk, s, d), 0.f) << "dk of a key nobody attends";
            EXPECT_EQ(x->dv.at(b, hk, s, d), 0.f) << "dv of a key nobody attends";
          }
        }
  if (spec.dtype != DType::f32 || samples == 0) return;

  std::mt19937_64 rng(spec.seed + 99);
  auto below = [&](int64_t n) { return int64_t(rng() % uint64_t(n)); };
  struct Grad {
    HostTensor* in;
    const HostTensor* grad;
    const char* name;
    bool is_q;
    int64_t H, S;
    const std::vector<std::array<int64_t, 3>>* dead;
  };
  const Grad grads[3] = {{&x->c->q, &x->dq, "dq", true, Hq, Sq, &dead_q},
                         {&x->c->k, &x->dk, "dk", false, Hkv, Skv, &dead_k},
                         {&x->c->v, &x->dv, "dv", false, Hkv, Skv, &dead_k}};
  for (const Grad& g : grads) {
    std::vector<std::array<int64_t, 4>> at;
    for (int i = 0; i < samples; ++i) at.push_back({below(B), below(g.H), below(g.S), below(D)});
    if (!g.dead->empty()) {
      const auto& z = (*g.dead)[size_t(below(int64_t(g.dead->size())))];
      at.push_back({z[0], z[1], z[2], below(D)});
    }
    for (const auto& e : at) {
      const double fd = finite_difference(*x, *g.in, g.is_q, e[0], e[1], e[2], e[3]);
      const double got = g.grad->at(e[0], e[1], e[2], e[3]);
      EXPECT_NEAR(got, fd, 3e-5 + 1e-4 * std::fabs(fd))
          << g.name << "[" << e[0] << ", " << e[1] << ", " << e[2] << ", " << e[3] << "] vs the finite difference";
    }
  }
}

AttnSpec tiny() {
  AttnSpec s;
  s.batch = 1, s.hq = 2, s.hkv = 1, s.sq = 70, s.skv = 150;  // tails in both sequences (block 64)
  s.d = 64, s.block = 64, s.density = 0.5;
  return s;
}

TEST(AttentionBackwardCpu, RandomLayoutsWithTailsAndGqa) {
  for (uint64_t seed : {1, 2, 3}) {
    AttnSpec s = tiny();
    s.seed = seed;
    check_backward(s);
  }
}

TEST(AttentionBackwardCpu, EmptyQueryRowsAndKmaxBeyondTheCounts) {
  AttnSpec s = tiny();
  s.empty_rows = {0, -1};
  s.extra_kmax = 2;
  check_backward(s);
}

TEST(AttentionBackwardCpu, KeyBlocksNobodyAttends) {
  AttnSpec s = tiny();
  s.hq = s.hkv = 1;
  s.sq = 64, s.skv = 320, s.density = 0.2;  // one key block of five per row
  check_backward(s);
}

TEST(AttentionBackwardCpu, CausalWithFullBlocks) {
  AttnSpec s = tiny();
  s.kind = LayoutKind::causal;  // every block j <= i: full below the diagonal, masked on it
  s.causal = true;
  s.hq = s.hkv = 2;
  s.sq = s.skv = 150;
  check_backward(s);
  s.kind = LayoutKind::topk;  // random causal top-k
  s.density = 0.6;
  s.seed = 5;
  check_backward(s);
}

TEST(AttentionBackwardCpu, FullListsWithoutCausalAndD128) {
  AttnSpec s = tiny();
  s.hq = s.hkv = 1;
  s.d = 128;
  s.sq = 40, s.skv = 100;
  s.density = 1.0;
  s.split_full = true;
  check_backward(s);
}

TEST(AttentionBackwardCpu, GqaLayoutsPerQueryHeadAndBroadcast) {
  AttnSpec s = tiny();
  s.batch = 2, s.hq = 4, s.hkv = 2, s.sq = 40, s.skv = 90;
  s.layout_heads = 4;  // a row per query head
  s.scale = 0.3f;
  check_backward(s, 4);
  s.hq = 3, s.hkv = 1;  // MQA, one layout row for every batch and head
  s.layout_heads = 1, s.layout_batch = 1;
  s.seed = 7;
  check_backward(s, 4);
}

TEST(AttentionBackwardCpu, PackedSequences) {
  AttnSpec s = tiny();
  s.hq = 2, s.hkv = 1;
  s.packed({40, 1, 0, 90, 29});  // boundaries inside blocks, an empty and a one-token sequence
  s.density = 0.8;
  check_backward(s);
  s.causal = true;
  s.seed = 4;
  check_backward(s);
  s.kind = LayoutKind::causal;  // full lists below the diagonal: the boundaries still apply there
  s.d = 128;
  s.seed = 6;
  check_backward(s, 4);
}

TEST(AttentionBackwardCpu, StridedTensorsAndHalfPrecision) {
  AttnSpec s = tiny();
  s.bshd = true;  // [B, S, H, D] memory order
  check_backward(s, 4);
  for (DType t : {DType::f16, DType::bf16}) {
    s.bshd = false;
    s.dtype = t;
    check_backward(s);  // every element against the reference, rounded to the dtype
  }
}

TEST(AttentionBackwardCpu, ThreadCountsGiveBitIdenticalGradients) {
  AttnSpec s = tiny();
  s.batch = 2, s.hq = 4, s.hkv = 2;
  auto x = make_backward_case(s);
  Options o;
  o.threads = 1;
  attention_backward(x->args, o);
  const std::vector<uint8_t> dq = x->dq.bytes, dk = x->dk.bytes, dv = x->dv.bytes;
  for (int threads : {3, 0}) {
    x->poison();
    o.threads = threads;
    attention_backward(x->args, o);
    EXPECT_EQ(dq, x->dq.bytes) << threads << " threads";
    EXPECT_EQ(dk, x->dk.bytes) << threads << " threads";
    EXPECT_EQ(dv, x->dv.bytes) << threads << " threads";
  }
}

TEST(AttentionBackwardCpu, PlanAndRunMatchTheOneShotCall) {
  AttnSpec s = tiny();
  s.batch = 2, s.hq = 4, s.hkv = 2;
  auto x = make_backward_case(s);
  attention_backward(x->args);
  const std::vector<uint8_t> dq = x->dq.bytes, dk = x->dk.bytes, dv = x->dv.bytes;
  const AttentionBackwardPlan p = plan(x->args);
  EXPECT_EQ(p.variant(), "cpu");
  for (int i = 0; i < 2; ++i) {  // a plan runs many times
    x->poison();
    run(p, x->args);
    EXPECT_EQ(dq, x->dq.bytes);
    EXPECT_EQ(dk, x->dk.bytes);
    EXPECT_EQ(dv, x->dv.bytes);
  }
  // Args that are not the planned problem's (but for the pointers) are named.
  AttentionBackwardArgs a = x->args;
  a.dq.stride_s *= 2;
  try {
    run(p, a);
    ADD_FAILURE() << "no error for dq's other stride";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("args do not match the plan: dq.stride_s is"), std::string::npos) << e.what();
  }
  try {
    run(AttentionBackwardPlan(), x->args);
    ADD_FAILURE() << "no error for an empty plan";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the attention backward plan is empty"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- the forward's LSE and O
//
// The backward's contract: P = exp(scale q.k - LSE) with the given LSE and Delta = rowsum(dO o O)
// with the given O (as the Hopper kernel reads them), not a softmax recomputed from q and k.

struct Grads {
  std::vector<float> dq, dk, dv;
};
Grads grads_of(const BwdCase& x) {
  auto all = [](const HostTensor& t) {
    std::vector<float> out;
    for (int64_t b = 0; b < t.view.b; ++b)
      for (int64_t h = 0; h < t.view.h; ++h)
        for (int64_t s = 0; s < t.view.s; ++s)
          for (int64_t d = 0; d < t.view.d; ++d) out.push_back(t.at(b, h, s, d));
    return out;
  };
  return {all(x.dq), all(x.dk), all(x.dv)};
}
Grads run_cpu(BwdCase& x, bool deterministic = true) {
  x.poison();
  x.args.deterministic = deterministic;
  Options cpu;
  cpu.backend = Backend::cpu;
  attention_backward(x.args, cpu);
  return grads_of(x);
}

TEST(AttentionBackwardCpu, PIsTakenFromTheGivenLse) {
  // LSE + ln 2 halves every P: dV = P^T dO, dS = P (dP - Delta) (Delta from O, unchanged), so every
  // gradient halves. A backward that recomputed the softmax would not move.
  AttnSpec s = tiny();
  s.empty_rows = {0};
  auto x = make_backward_case(s);
  const Grads base = run_cpu(*x);
  std::vector<float>& lse = x->c->lse;
  for (float& l : lse) l = float(double(l) + std::log(2.0));  // -inf stays -inf
  const Grads half = run_cpu(*x);
  auto expect_half = [](const std::vector<float>& a, const std::vector<float>& b, const char* name) {
    double worst = 0, scale = 0;
    for (size_t e = 0; e < a.size(); ++e) {
      worst = std::max(worst, std::fabs(double(b[e]) - 0.5 * double(a[e])));
      scale = std::max(scale, std::fabs(double(a[e])));
    }
    EXPECT_GT(scale, 0.0) << name;
    EXPECT_LE(worst, 1e-5 * scale) << name << ": LSE + ln 2 must halve it";
  };
  expect_half(base.dq, half.dq, "dq");
  expect_half(base.dk, half.dk, "dk");
  expect_half(base.dv, half.dv, "dv");
}

TEST(AttentionBackwardCpu, DeltaIsTakenFromTheGivenO) {
  // O' = O + t dO / |dO|^2 per row raises Delta by t: dS' = dS - t P, so dq' = dq - scale t (P K)
  // with P K the forward of (q, k, v = k); dv does not read O.
  AttnSpec s = tiny();
  auto x = make_backward_case(s);
  const Grads base = run_cpu(*x);
  const AttentionArgs& f = x->args.forward;
  const int64_t B = f.q.b, Hq = f.q.h, Sq = f.q.s, D = f.q.d;
  const double t = 0.5;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t r = 0; r < Sq; ++r) {
        double n2 = 0;
        for (int64_t d = 0; d < D; ++d) n2 += double(x->dout.at(b, h, r, d)) * x->dout.at(b, h, r, d);
        for (int64_t d = 0; d < D; ++d) {
          const int64_t at = f.o.index(b, h, r, d);
          store_from_float(f.o.data, f.o.dtype, at, float(x->c->o.at(b, h, r, d) + t * x->dout.at(b, h, r, d) / n2));
        }
      }
  const Grads moved = run_cpu(*x);
  // P K: attention with v = k (o and lse into buffers of their own).
  HostTensor pk(B, Hq, Sq, D, f.q.dtype);
  std::vector<float> lse2(size_t(B * Hq * Sq));
  AttentionArgs fk = f;
  fk.v = f.k, fk.o = pk.view, fk.lse = lse2.data();
  attention(fk);
  const double scale = double(f.softmax_scale());
  double worst = 0, size = 0;
  size_t e = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t r = 0; r < Sq; ++r)
        for (int64_t d = 0; d < D; ++d, ++e) {
          const double want = double(base.dq[e]) - scale * t * double(pk.at(b, h, r, d));
          worst = std::max(worst, std::fabs(double(moved.dq[e]) - want));
          size = std::max(size, std::fabs(want));
        }
  EXPECT_GT(size, 0.0);
  EXPECT_LE(worst, 1e-5 * size) << "dq must follow Delta = rowsum(dO o O) of the given O";
  EXPECT_EQ(base.dv, moved.dv) << "dv = P^T dO does not read O";
}

// Row (0, 0, r) of the case, r from Sq / 3 on: a row that attends keys (finite LSE), and the key
// blocks its layout row names (both lists).
struct LiveRow {
  int64_t r = -1;
  std::vector<int64_t> blocks;
};
LiveRow live_row(const BwdCase& x) {
  const AttentionArgs& f = x.args.forward;
  const AttentionLayout& l = f.layout;
  LiveRow out;
  for (int64_t r = f.q.s / 3; r < f.q.s && out.r < 0; ++r)
    if (std::isfinite(x.c->lse[size_t(r)])) out.r = r;
  if (out.r < 0) return out;
  const int64_t row = layout_row(l, f.q.h, f.k.h, 0, 0, out.r / l.block_q);
  for (int32_t e = 0; e < l.kv_num_blocks[row]; ++e) out.blocks.push_back(l.kv_indices[row * l.kmax + e]);
  for (int32_t e = 0; l.has_full() && e < l.full_kv_num_blocks[row]; ++e)
    out.blocks.push_back(l.full_kv_indices[row * l.full_kmax + e]);
  return out;
}

TEST(AttentionBackwardCpu, NonFiniteLseAsOnTheGpu) {
  AttnSpec s = tiny();
  s.hq = s.hkv = 1;
  s.causal = true;
  s.kind = LayoutKind::causal;
  s.sq = s.skv = 200;
  auto x = make_backward_case(s);
  const Grads base = run_cpu(*x);
  const LiveRow row = live_row(*x);
  ASSERT_GE(row.r, 0);
  const int64_t D = x->args.forward.q.d, bk = x->args.forward.layout.block_kv, Skv = x->args.forward.k.s;
  float& lse = x->c->lse[size_t(row.r)];
  const float real = lse;
  auto dq_row = [&](const Grads& g) { return std::vector<float>(g.dq.begin() + row.r * D, g.dq.begin() + (row.r + 1) * D); };
  auto all_nan = [](const std::vector<float>& v) { return std::all_of(v.begin(), v.end(), [](float x) { return std::isnan(x); }); };
  auto other_rows_same = [&](const Grads& g) {
    for (size_t e = 0; e < g.dq.size(); ++e)
      if (int64_t(e) / D != row.r && !(g.dq[e] == base.dq[e])) return false;
    return true;
  };

  // NaN: the row's dq is NaN, and so are dk and dv of every key of the blocks it names (masked
  // ones too), in both modes; other rows' dq do not move.
  lse = std::numeric_limits<float>::quiet_NaN();
  for (bool det : {true, false}) {
    SCOPED_TRACE(det ? "deterministic" : "not deterministic");
    const Grads g = run_cpu(*x, det);
    EXPECT_TRUE(all_nan(dq_row(g)));
    EXPECT_TRUE(other_rows_same(g));
    for (int64_t j : row.blocks)
      for (int64_t c = j * bk; c < std::min(Skv, (j + 1) * bk); ++c) {
        EXPECT_TRUE(std::isnan(g.dk[size_t(c * D)])) << "dk of key " << c;
        EXPECT_TRUE(std::isnan(g.dv[size_t(c * D)])) << "dv of key " << c;
      }
  }
  // +inf: P = 0 (no contribution); deterministic marks the row NaN, otherwise dq = 0.
  lse = std::numeric_limits<float>::infinity();
  Grads g = run_cpu(*x, true);
  EXPECT_TRUE(all_nan(dq_row(g)));
  EXPECT_TRUE(other_rows_same(g));
  g = run_cpu(*x, false);
  EXPECT_EQ(dq_row(g), std::vector<float>(size_t(D), 0.f));
  for (float v : g.dk) EXPECT_TRUE(std::isfinite(v));
  // -inf: the row attends nothing (dq = 0, no contribution to dk and dv), in both modes.
  lse = -std::numeric_limits<float>::infinity();
  for (bool det : {true, false}) {
    g = run_cpu(*x, det);
    EXPECT_EQ(dq_row(g), std::vector<float>(size_t(D), 0.f));
    EXPECT_TRUE(other_rows_same(g));
    bool moved = false;
    for (size_t e = 0; e < g.dv.size(); ++e) {
      EXPECT_TRUE(std::isfinite(g.dv[e]));
      moved |= g.dv[e] != base.dv[e];
    }
    EXPECT_TRUE(moved) << "the row's contributions to dv must be gone";
  }
  lse = real;
  // An inf in K, in a key no row attends: deterministic marks every live row's dq NaN (the bound of
  // the GPU's integer grid is over the head's K), rows that attend nothing keep 0.
  x->c->lse[0] = -std::numeric_limits<float>::infinity();  // row 0: dead
  const int64_t last_key = Skv - 1;  // causal: only the last row attends it
  store_from_float(x->c->k.view.data, x->c->k.view.dtype, x->c->k.view.index(0, 0, last_key, 3),
                   std::numeric_limits<float>::infinity());
  g = run_cpu(*x, true);
  EXPECT_EQ(std::vector<float>(g.dq.begin(), g.dq.begin() + D), std::vector<float>(size_t(D), 0.f));
  EXPECT_TRUE(all_nan(dq_row(g))) << "row " << row.r;
  g = run_cpu(*x, false);
  EXPECT_TRUE(std::isfinite(dq_row(g)[0])) << "without deterministic only rows that read the key see it";
}

// ---------------------------------------------------------------- named errors

void expect_error(const AttentionBackwardArgs& a, const std::string& part, Status st = Status::invalid_argument) {
  try {
    attention_backward(a);
    ADD_FAILURE() << "no error; wanted one containing: " << part;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), st) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(AttentionBackwardCpu, BadArgumentsAreNamed) {
  auto x = make_backward_case(tiny());
  const AttentionBackwardArgs good = x->args;
  AttentionBackwardArgs a = good;
  a.forward.lse = nullptr;
  expect_error(a, "forward.lse is null");
  a = good;
  a.forward.q.d = 96;
  expect_error(a, "q.d = 96 is not 64 or 128");
  a = good;
  a.dout.s = 69;
  expect_error(a, "dout is [1, 2, 69, 64] but q is [1, 2, 70, 64]: dout must have q's shape");
  a = good;
  a.dk.h = 2;
  expect_error(a, "dk is [1, 2, 150, 64] but k is [1, 1, 150, 64]");
  a = good;
  a.dq.dtype = DType::f16;
  expect_error(a, "dq dtype f16 differs from q's f32");
  a = good;
  a.dv.memory = Memory::device;
  expect_error(a, "dv is in device memory but q is in host memory");
  a = good;
  a.dq.data = nullptr;
  expect_error(a, "dq.data is null");
  a = good;
  a.dk.stride_s = 0;
  expect_error(a, "dk strides (stride_b = 9600, stride_h = 9600, stride_s = 0, d = 64) give two positions the same element");
  // Outputs overlapping an input or each other.
  a = good;
  a.dv.data = a.forward.k.data;
  expect_error(a, "dv overlaps k: dv occupies");
  a = good;
  a.dq.data = a.dout.data;
  expect_error(a, "dq overlaps dout");
  a = good;
  a.dq.data = a.forward.o.data;
  expect_error(a, "dq overlaps o");
  a = good;
  std::vector<float> big(40000);  // lse at the start of a buffer that can hold dk
  a.forward.lse = big.data();
  a.dk.data = big.data();
  expect_error(a, "dk overlaps lse");
  a = good;
  a.dv.data = a.dk.data;
  expect_error(a, "dv overlaps dk: dk occupies");
  // The layout's contents are checked by the one-shot call.
  a = good;
  std::vector<int32_t> idx(x->c->layout.idx);
  idx[0] = 99;
  a.forward.layout.kv_indices = idx.data();
  expect_error(a, "kv_indices[0, 0, 0, 0] = 99 is out of range [0, 3)");
  // Options.
  Options o;
  o.variant = "nope";
  try {
    attention_backward(good, o);
    ADD_FAILURE() << "an unknown variant must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("options.variant 'nope' is not one of: cpu, hopper"), std::string::npos)
        << e.what();
  }
  o.variant = "hopper";
  o.backend = Backend::cpu;
  try {
    attention_backward(good, o);
    ADD_FAILURE() << "a cuda variant on the cpu backend must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("options.variant 'hopper' is not a cpu variant"), std::string::npos)
        << e.what();
  }
  // Nothing was written by a refused call.
  for (float* p = reinterpret_cast<float*>(x->dq.bytes.data()); p < reinterpret_cast<float*>(x->dq.bytes.data()) + 8; ++p)
    EXPECT_TRUE(std::isnan(*p));
}

TEST(AttentionBackwardCpu, UnsupportedReasonsNameEachVariant) {
  auto x = make_backward_case(tiny());
  const std::vector<std::string> why = unsupported_reasons(x->args);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_EQ(why[0].rfind("hopper: ", 0), 0u) << why[0];
  AttentionBackwardArgs a = x->args;
  a.dq.memory = Memory::device;
  bool cpu_named = false;
  for (const std::string& w : unsupported_reasons(a))
    cpu_named = cpu_named || w.find("cpu: cpu backend needs host memory, but dq is in device memory") == 0;
  EXPECT_TRUE(cpu_named);
}

// ---------------------------------------------------------------- C API

sparsek_attention_backward_args to_c(const AttentionBackwardArgs& a) {
  sparsek_attention_backward_args c{};
  c.forward = test::to_c(a.forward);
  c.dout = test::to_c(a.dout), c.dq = test::to_c(a.dq), c.dk = test::to_c(a.dk), c.dv = test::to_c(a.dv);
  c.nondeterministic = a.deterministic ? 0 : 1;
  return c;
}

TEST(AttentionBackwardCapi, OneShotMatchesTheCppCallAndNamesErrors) {
  auto x = make_backward_case(tiny());
  attention_backward(x->args);
  const std::vector<uint8_t> dq = x->dq.bytes, dk = x->dk.bytes, dv = x->dv.bytes;
  x->poison();
  sparsek_attention_backward_args c = to_c(x->args);
  ASSERT_EQ(sparsek_attention_backward(&c, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(dq, x->dq.bytes);
  EXPECT_EQ(dk, x->dk.bytes);
  EXPECT_EQ(dv, x->dv.bytes);
  auto expect = [](sparsek_status st, const std::string& part) {
    EXPECT_EQ(st, SPARSEK_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sparsek_last_error()).find(part), std::string::npos) << sparsek_last_error();
  };
  expect(sparsek_attention_backward(nullptr, nullptr), "sparsek_attention_backward: argument 'args' is NULL");
  sparsek_attention_backward_args bad = c;
  bad.nondeterministic = 2;
  expect(sparsek_attention_backward(&bad, nullptr), "nondeterministic = 2 is not 0 or 1");
  bad = c;
  bad.forward.lse = nullptr;
  expect(sparsek_attention_backward(&bad, nullptr), "forward.lse is null");
  bad = c;
  bad.dk.data = bad.forward.v.data;
  expect(sparsek_attention_backward(&bad, nullptr), "dk overlaps v");
}

TEST(AttentionBackwardCapi, PlansRunAndCheckTheirHandles) {
  auto x = make_backward_case(tiny());
  attention_backward(x->args);
  const std::vector<uint8_t> dq = x->dq.bytes, dk = x->dk.bytes, dv = x->dv.bytes;
  sparsek_attention_backward_args c = to_c(x->args);
  sparsek_attention_backward_plan p = nullptr;
  ASSERT_EQ(sparsek_attention_backward_plan_create(&p, &c, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_STREQ(sparsek_attention_backward_plan_variant(p), "cpu");
  uint64_t ws = 7;
  EXPECT_EQ(sparsek_attention_backward_plan_workspace_bytes(p, &ws), SPARSEK_OK);
  EXPECT_EQ(ws, 0u);
  x->poison();
  ASSERT_EQ(sparsek_attention_backward_plan_run(p, &c, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(dq, x->dq.bytes);
  EXPECT_EQ(dk, x->dk.bytes);
  EXPECT_EQ(dv, x->dv.bytes);
  sparsek_attention_backward_args other = c;
  other.forward.causal = 1;
  EXPECT_EQ(sparsek_attention_backward_plan_run(p, &other, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error())
                .find("sparsek_attention_backward_plan_run: run: args do not match the plan: causal"),
            std::string::npos)
      << sparsek_last_error();
  sparsek_attention_backward_plan none = nullptr;
  EXPECT_EQ(sparsek_attention_backward_plan_create(&none, nullptr, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
  ASSERT_EQ(sparsek_attention_backward_plan_destroy(p), SPARSEK_OK);
  // A destroyed or foreign handle is reported, never dereferenced.
  EXPECT_EQ(sparsek_attention_backward_plan_run(p, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error())
                .find("is not a live plan (already destroyed, or not made by sparsek_attention_backward_plan_create)"),
            std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_attention_backward_plan_destroy(p), SPARSEK_INVALID_ARGUMENT);
  EXPECT_STREQ(sparsek_attention_backward_plan_variant(p), "");
  float not_a_plan[16] = {};
  auto foreign = reinterpret_cast<sparsek_attention_backward_plan>(not_a_plan);
  EXPECT_EQ(sparsek_attention_backward_plan_workspace_bytes(foreign, &ws), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(sparsek_attention_backward_plan_destroy(nullptr), SPARSEK_OK);
}

// Packed sequences through the C API's backward: the C++ call's bits (one shot and a plan); a bad
// cu_seqlens, or a plan made without packed sequences, gives the status and names it.
TEST(AttentionBackwardCapi, PackedSequencesMatchTheCppCallAndNameBadOffsets) {
  AttnSpec s = tiny();
  s.packed({40, 1, 0, 90, 29});  // boundaries inside blocks, an empty and a one-token sequence
  s.causal = true;
  s.density = 0.8;
  auto x = make_backward_case(s);
  attention_backward(x->args);
  const std::vector<uint8_t> dq = x->dq.bytes, dk = x->dk.bytes, dv = x->dv.bytes;
  auto same_bits = [&](const char* what) {
    EXPECT_EQ(dq, x->dq.bytes) << what;
    EXPECT_EQ(dk, x->dk.bytes) << what;
    EXPECT_EQ(dv, x->dv.bytes) << what;
  };
  sparsek_attention_backward_args c = to_c(x->args);
  ASSERT_EQ(c.forward.num_seqs, 5);
  x->poison();
  ASSERT_EQ(sparsek_attention_backward(&c, nullptr), SPARSEK_OK) << sparsek_last_error();
  same_bits("sparsek_attention_backward");
  sparsek_attention_backward_plan p = nullptr;
  ASSERT_EQ(sparsek_attention_backward_plan_create(&p, &c, nullptr), SPARSEK_OK) << sparsek_last_error();
  x->poison();
  ASSERT_EQ(sparsek_attention_backward_plan_run(p, &c, nullptr), SPARSEK_OK) << sparsek_last_error();
  same_bits("sparsek_attention_backward_plan_run");
  auto expect = [](sparsek_status st, const std::string& part) {
    EXPECT_EQ(st, SPARSEK_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sparsek_last_error()).find(part), std::string::npos) << sparsek_last_error();
  };
  sparsek_attention_backward_args bad = c;
  bad.forward.cu_seqlens = nullptr, bad.forward.num_seqs = 0;
  expect(sparsek_attention_backward_plan_run(p, &bad, nullptr),
         "sparsek_attention_backward_plan_run: run: args do not match the plan: cu_seqlens is no cu_seqlens");
  ASSERT_EQ(sparsek_attention_backward_plan_destroy(p), SPARSEK_OK);
  std::vector<int32_t> cu = x->c->cu_seqlens;
  cu[0] = 1;
  bad = c;
  bad.forward.cu_seqlens = cu.data();
  expect(sparsek_attention_backward(&bad, nullptr), "sparsek_attention_backward: cu_seqlens[0] = 1 is not 0");
  bad = c;
  bad.forward.num_seqs = -1;
  expect(sparsek_attention_backward(&bad, nullptr), "num_seqs = -1 with cu_seqlens given");
}

// Views over a fake, 16-byte aligned device address: why_not never dereferences them.
AttentionBackwardArgs valid_args() {
  void* dev = reinterpret_cast<void*>(uintptr_t(1) << 20);
  static float lse = 0.f;
  AttentionBackwardArgs a;
  AttentionArgs& f = a.forward;
  f.q = Tensor4View::packed(dev, DType::bf16, Memory::device, 2, 4, 256, 128);
  f.k = Tensor4View::packed(dev, DType::bf16, Memory::device, 2, 2, 384, 128);
  f.v = f.k;
  f.o = f.q;
  f.lse = &lse;
  f.layout.q_blocks = 2;
  f.layout.kmax = 3;
  a.dout = a.dq = f.q;
  a.dk = a.dv = f.k;
  return a;
}

std::string why_not(const AttentionBackwardArgs& a) { return hopper_attention_backward_variants().at(0).why_not(a); }

TEST(AttentionBackwardHopper, NamesTheBadArgument) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "built without CUDA (SPARSEK_CUDA=OFF): the Hopper variant is a name only";
  AttentionBackwardArgs a = valid_args();
  a.forward.lse = nullptr;
  EXPECT_NE(why_not(a).find("lse"), std::string::npos) << why_not(a);

  a = valid_args();
  a.dq.s = 255;
  EXPECT_NE(why_not(a).find("dq must have q's shape [2, 4, 256, 128], got [2, 4, 255, 128]"), std::string::npos)
      << why_not(a);

  a = valid_args();
  a.dk.dtype = DType::f16;
  EXPECT_NE(why_not(a).find("dk must have k's dtype"), std::string::npos) << why_not(a);

  a = valid_args();
  a.dv.memory = Memory::host;
  EXPECT_NE(why_not(a).find("dv must be in device memory"), std::string::npos) << why_not(a);

  a = valid_args();
  a.dout.stride_s = 130;  // 260 bytes: not a multiple of 16
  a.dout.stride_h = 130 * 256;
  a.dout.stride_b = 130 * 256 * 4;
  EXPECT_NE(why_not(a).find("dout's sequence stride must be a multiple of 16 bytes"), std::string::npos) << why_not(a);

  a = valid_args();
  a.forward.k.h = a.forward.v.h = a.dk.h = a.dv.h = 3;  // 4 query heads over 3
  EXPECT_NE(why_not(a).find("multiple of the key/value heads"), std::string::npos) << why_not(a);

  a = valid_args();
  a.forward.q.d = a.forward.k.d = a.forward.v.d = a.forward.o.d = a.dout.d = a.dq.d = a.dk.d = a.dv.d = 96;
  EXPECT_NE(why_not(a).find("D=96"), std::string::npos) << why_not(a);
}

TEST(AttentionBackwardHopper, ValidArgumentsReachTheDeviceChecks) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "built without CUDA (SPARSEK_CUDA=OFF): the Hopper variant is a name only";
  const std::string why = why_not(valid_args());
  const DeviceInfo& d = device_info();
  if (!d.available) {
    EXPECT_NE(why.find("no CUDA device"), std::string::npos) << why;
  } else if (d.cc_major != 9 || d.cc_minor != 0) {
    EXPECT_NE(why.find("needs an sm_90a GPU"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace sparsek
