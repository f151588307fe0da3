// The top-k block gate on the CPU (the reference): hand-checkable selections (sink, local, top-k,
// ties, causal, candidates, -inf/NaN scores), pooling (GQA groups, sequence tails, strided
// tensors, f16/bf16), selection invariants on random data, packed sequences, the workspace size
// and every validation error by name. Scratch limits and the C API: test_gate_capi.cpp.
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gate_test_util.hpp"
#include "plan/gate_internal.hpp"
#include "sparsek/sparsek.h"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

using V = std::vector<int32_t>;

TEST(Gate, SinkLocalTopk) {
  GateCase c(hand_spec());
  set_blocks(c, {1, 1, -1, 1, 1, 1, 1, 1}, kC);
  c.run_host();
  EXPECT_EQ(c.chosen(0, 0, 0), (V{0, 3, 5}));     // sink = local = 0
  EXPECT_EQ(c.chosen(0, 0, 2), (V{0, 2, 4, 6}));  // a < 0: the lowest c are the best scores
  EXPECT_EQ(c.chosen(0, 0, 3), (V{0, 3, 5, 7}));  // local 3 is also the best: 5, 7 next
  EXPECT_EQ(c.chosen(0, 0, 4), (V{0, 3, 4, 5}));
  EXPECT_EQ(c.chosen(0, 0, 7), (V{0, 3, 5, 7}));
  expect_well_formed(c, c.num, c.idx);
  for (int64_t j = 0; j < c.Nk; ++j) {
    EXPECT_EQ(c.score(0, 0, 4, j), kC[size_t(j)]);
    EXPECT_EQ(c.score(0, 0, 2, j), -kC[size_t(j)]);
  }
}

TEST(Gate, WiderLocalNoSinkAndTopkZero) {
  GateSpec s = hand_spec();
  s.sink = 0;
  s.local = 3;
  GateCase c(s);
  set_blocks(c, std::vector<float>(8, 1.f), kC);
  c.run_host();
  EXPECT_EQ(c.chosen(0, 0, 0), (V{0, 3, 5}));
  EXPECT_EQ(c.chosen(0, 0, 1), (V{0, 1, 3, 5}));
  EXPECT_EQ(c.chosen(0, 0, 6), (V{3, 4, 5, 6, 7}));  // local 4..6, then 3 and 7
  s.topk = 0;
  s.sink = 2;
  s.local = 1;
  GateCase z(s);
  set_blocks(z, std::vector<float>(8, 1.f), kC);
  z.run_host();
  EXPECT_EQ(z.chosen(0, 0, 0), (V{0, 1}));
  EXPECT_EQ(z.chosen(0, 0, 5), (V{0, 1, 5}));
}

TEST(Gate, TiesGoToTheLowerIndex) {
  GateCase c(hand_spec());
  set_blocks(c, std::vector<float>(8, 1.f), std::vector<float>(8, 0.5f));
  c.run_host();
  EXPECT_EQ(c.chosen(0, 0, 0), (V{0, 1, 2}));
  EXPECT_EQ(c.chosen(0, 0, 4), (V{0, 1, 2, 4}));
  EXPECT_EQ(c.chosen(0, 0, 1), (V{0, 1, 2, 3}));
}

TEST(Gate, CausalAllowsBlocksUpToTheDiagonal) {
  GateSpec s = hand_spec();
  s.causal = true;
  GateCase c(s);
  set_blocks(c, std::vector<float>(8, 1.f), kC);
  c.run_host();
  EXPECT_EQ(c.chosen(0, 0, 0), (V{0}));
  EXPECT_EQ(c.chosen(0, 0, 2), (V{0, 1, 2}));
  EXPECT_EQ(c.chosen(0, 0, 4), (V{0, 1, 3, 4}));
  EXPECT_EQ(c.chosen(0, 0, 7), (V{0, 3, 5, 7}));
  for (int64_t j = 0; j < c.Nk; ++j) EXPECT_EQ(c.score(0, 0, 2, j), j <= 2 ? kC[size_t(j)] : -INFINITY) << j;
}

TEST(Gate, CausalWithLongerKeysAndTailBlocks) {
  // Sq = 100 (blocks 0..63, 64..99), Skv = 300: query block 1 ends at row 99, so key block 1
  // (64..127) is allowed and block 2 (128..) is not.
  GateSpec s = hand_spec();
  s.Sq = 100;
  s.Skv = 300;
  s.causal = true;
  s.topk = 8;
  GateCase c(s);
  set_blocks(c, {1, 1}, kC);
  c.run_host();
  EXPECT_EQ(c.Mq, 2);
  EXPECT_EQ(c.Nk, 5);
  EXPECT_EQ(c.chosen(0, 0, 1), (V{0, 1}));
}

TEST(Gate, CandidatesRestrictTheUniverse) {
  GateSpec s = hand_spec();
  GateCase c(s);
  set_blocks(c, std::vector<float>(8, 1.f), kC);
  // Every row: partial list {1, 2, 4, 6}, full list {7}; row 0's lists are empty.
  const int64_t kmax = 4;
  std::vector<int32_t> num(8, 4), idx(8 * kmax), fnum(8, 1), fidx(8, 7);
  for (int64_t i = 0; i < 8; ++i) std::memcpy(&idx[size_t(i * kmax)], V{1, 2, 4, 6}.data(), 16);
  num[0] = fnum[0] = 0;
  const AttentionLayout cand = candidate_layout(num, idx, kmax, 1, 8, 64, &fnum, &fidx, 1);
  c.args.candidates = &cand;
  c.run_host();
  EXPECT_EQ(c.chosen(0, 0, 0), V{});
  EXPECT_EQ(c.chosen(0, 0, 4), (V{1, 4, 7}));     // sink 0 is no candidate; 7 and 1 are the best
  EXPECT_EQ(c.chosen(0, 0, 3), (V{1, 7}));        // local 3 is no candidate either
  EXPECT_EQ(c.score(0, 0, 4, 0), -INFINITY);
  EXPECT_EQ(c.score(0, 0, 4, 7), kC[7]);
  EXPECT_EQ(c.score(0, 0, 0, 3), -INFINITY);
}

TEST(Gate, CandidatesPerQueryHeadAreUnitedOverTheGroup) {
  GateSpec s = hand_spec();
  s.Hq = 2;  // one group of two query heads
  s.topk = 8;
  GateCase c(s);
  set_blocks(c, std::vector<float>(8, 1.f), kC);
  std::vector<int32_t> num(16, 1), idx(16);
  for (int64_t i = 0; i < 8; ++i) idx[size_t(i)] = 2, idx[size_t(8 + i)] = 5;  // head 0: {2}, head 1: {5}
  const AttentionLayout cand = candidate_layout(num, idx, 1, 2, 8, 64);
  c.args.candidates = &cand;
  c.run_host();
  EXPECT_EQ(c.chosen(0, 0, 6), (V{2, 5}));
}

TEST(Gate, GroupQueryHeadsArePooledTogether) {
  // Hq = 4, Hkv = 2: group 0 = heads 0, 1 (3 and -1: mean 1); group 1 = heads 2, 3 (-2 and 1:
  // mean -0.5).
  GateSpec s = hand_spec();
  s.Hq = 4;
  s.Hkv = 2;
  s.Sq = 64;
  GateCase c(s);
  const float a[4] = {3, -1, -2, 1};
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t r = 0; r < 64; ++r) c.q.set(0, h, r, 0, a[h]);
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t r = 0; r < s.Skv; ++r) c.k.set(0, g, r, 0, kC[size_t(r / 64)]);
  c.run_host();
  for (int64_t j = 0; j < c.Nk; ++j) {
    EXPECT_FLOAT_EQ(c.score(0, 0, 0, j), kC[size_t(j)]);
    EXPECT_FLOAT_EQ(c.score(0, 1, 0, j), -0.5f * kC[size_t(j)]);
  }
  EXPECT_EQ(c.chosen(0, 0, 0), (V{0, 3, 5}));
  EXPECT_EQ(c.chosen(0, 1, 0), (V{0, 2, 4}));
}

TEST(Gate, TailBlocksAverageOnlyTheirRows) {
  GateSpec s = hand_spec();
  s.Sq = 2 * 64 + 10;
  s.Skv = 3 * 64 + 1;
  GateCase c(s);
  for (int64_t r = 0; r < s.Sq; ++r) c.q.set(0, 0, r, 0, r < 128 ? 1.f : 2.f);
  for (int64_t r = 0; r < s.Skv; ++r) c.k.set(0, 0, r, 0, r < 192 ? 0.25f : 0.75f);
  c.run_host();
  EXPECT_EQ(c.Mq, 3);
  EXPECT_EQ(c.Nk, 4);
  EXPECT_FLOAT_EQ(c.score(0, 0, 2, 3), 1.5f);  // 2 * 0.75: means over 10 and 1 rows
  EXPECT_FLOAT_EQ(c.score(0, 0, 0, 0), 0.25f);
}

TEST(Gate, DefaultScaleAndMeansOverRowsAndDims) {
  // q rows alternate +3 / -1 in dims 0 and 1 (mean 1, 1); k block 0 rows are (2, 4) (mean 2, 4):
  // score = (1*2 + 1*4) / sqrt(128).
  GateSpec s = hand_spec();
  s.D = 128;
  s.scale = 0.f;
  s.Sq = s.Skv = 64;
  GateCase c(s);
  for (int64_t r = 0; r < 64; ++r) {
    c.q.set(0, 0, r, 0, r % 2 ? -1.f : 3.f);
    c.q.set(0, 0, r, 1, r % 2 ? -1.f : 3.f);
    c.k.set(0, 0, r, 0, 2.f);
    c.k.set(0, 0, r, 1, 4.f);
  }
  c.run_host();
  EXPECT_FLOAT_EQ(c.score(0, 0, 0, 0), float(6.0 / std::sqrt(128.0)));
}

TEST(Gate, LargerKmaxIsZeroFilledAndBatchesAreIndependent) {
  GateSpec s = hand_spec();
  s.B = 2;
  s.extra_kmax = 3;
  GateCase c(s);
  set_blocks(c, std::vector<float>(8, 1.f), kC);
  for (int64_t r = 0; r < s.Skv; ++r) c.k.set(1, 0, r, 0, -kC[size_t(r / 64)]);  // batch 1 reversed
  c.run_host();
  expect_well_formed(c, c.num, c.idx);
  EXPECT_EQ(c.kmax, 7);
  EXPECT_EQ(c.chosen(0, 0, 4), (V{0, 3, 4, 5}));
  EXPECT_EQ(c.chosen(1, 0, 4), (V{0, 2, 4, 6}));
  const int64_t r = c.row(0, 0, 4);
  for (int64_t e = 4; e < c.kmax; ++e) EXPECT_EQ(c.idx[size_t(r * c.kmax + e)], 0);
}

TEST(Gate, GivenScoresOnlySelect) {
  GateSpec s = hand_spec();
  s.topk = 2;
  s.Sq = 64;  // one query block
  GateCase c(s);
  // q and k are not read: leave their data null.
  c.args.q.data = nullptr;
  c.args.k.data = nullptr;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> given = {5, nan, 1, 1, -INFINITY, 1, -0.f, 0.f};
  c.args.given_scores = given.data();
  c.run_host();
  // sink 0, local 0; top-2 of the rest: 2 and 3 (1, the lower indices; 5 loses the tie); NaN and
  // -inf are never picked.
  EXPECT_EQ(c.chosen(0, 0, 0), (V{0, 2, 3}));
  EXPECT_TRUE(std::isnan(c.score(0, 0, 0, 1)));
  EXPECT_EQ(c.score(0, 0, 0, 4), -INFINITY);
  // -0 and +0 tie: the lower index wins.
  given = {5, -1, -1, -1, -1, -1, -0.f, 0.f};
  s.topk = 1;
  GateCase z(s);
  z.args.q.data = z.args.k.data = nullptr;
  z.args.given_scores = given.data();
  z.run_host();
  EXPECT_EQ(z.chosen(0, 0, 0), (V{0, 6}));
  // Only -inf and NaN left: nothing beyond the always-on blocks.
  given = {-INFINITY, -INFINITY, nan, -INFINITY, nan, -INFINITY, -INFINITY, -INFINITY};
  z.run_host();
  EXPECT_EQ(z.chosen(0, 0, 0), (V{0}));
}

TEST(Gate, StridedAndHalfPrecisionInputsGiveTheSameLayout) {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (bool bshd : {false, true}) {
      SCOPED_TRACE(std::string(to_string(t)) + (bshd ? " bshd" : " packed"));
      GateSpec s = hand_spec();
      s.dtype = t;
      s.bshd = bshd;
      s.Hq = s.Hkv = 2;
      GateCase c(s);
      set_blocks(c, {1, 1, -1, 1, 1, 1, 1, 1}, kC);
      c.run_host();
      for (int64_t g = 0; g < 2; ++g) {
        EXPECT_EQ(c.chosen(0, g, 2), (V{0, 2, 4, 6}));
        EXPECT_EQ(c.chosen(0, g, 4), (V{0, 3, 4, 5}));
      }
    }
  }
}

TEST(Gate, RandomDataKeepsTheSelectionInvariants) {
  for (bool causal : {false, true}) {
    GateSpec s;
    s.B = 2;
    s.Hq = 4;
    s.Hkv = 2;
    s.Sq = 700;
    s.Skv = 1000;
    s.D = 64;
    s.block = 64;
    s.topk = 4;
    s.sink = 2;
    s.local = 2;
    s.causal = causal;
    GateCase c(s);
    c.q.fill_random(1);
    c.k.fill_random(2);
    c.run_host();
    expect_well_formed(c, c.num, c.idx);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t g = 0; g < s.Hkv; ++g)
        for (int64_t i = 0; i < c.Mq; ++i) {
          const V got = c.chosen(b, g, i);
          std::vector<char> in(size_t(c.Nk), 0);
          for (int32_t j : got) in[size_t(j)] = 1;
          int64_t on = 0, allowed = 0;
          double worst_picked = INFINITY, best_left = -INFINITY;
          for (int64_t j = 0; j < c.Nk; ++j) {
            const bool ok = !causal || gate_causal_allows(i, j, s.block, s.Sq);
            const bool always = ok && gate_always_on(i, j, s.sink, s.local);
            allowed += ok && !always;
            on += always;
            if (always) EXPECT_TRUE(in[size_t(j)]) << "always-on block " << j << " missing in row " << i;
            if (!ok) {
              EXPECT_FALSE(in[size_t(j)]) << "row " << i << " picked the disallowed block " << j;
              EXPECT_EQ(c.score(b, g, i, j), -INFINITY);
            }
            if (ok && !always) {
              if (in[size_t(j)]) worst_picked = std::min(worst_picked, double(c.score(b, g, i, j)));
              else best_left = std::max(best_left, double(c.score(b, g, i, j)));
            }
          }
          EXPECT_EQ(int64_t(got.size()), on + std::min<int64_t>(allowed, s.topk)) << "row " << i;
          EXPECT_GE(worst_picked, best_left) << "row " << i;
        }
  }
}

// Packed sequences of whole blocks: each sequence's rows select exactly what the gate selects on
// that sequence alone (shifted by its first block; pooling never crosses a boundary here).
TEST(Gate, PackedSequencesSelectAsIfEachWereAlone) {
  const std::vector<int64_t> lens = {4 * 64, 0, 64, 9 * 64, 3 * 64};
  for (bool causal : {false, true}) {
    GateSpec s;
    s.Hq = 4, s.Hkv = 2, s.D = 64, s.block = 64, s.topk = 2, s.sink = 1, s.local = 2, s.causal = causal;
    s.Sq = s.Skv = 0;
    for (int64_t n : lens) s.Sq = s.Skv = s.Sq + n;
    GateCase packed(s);
    packed.q.fill_random(3);
    packed.k.fill_random(4);
    std::vector<int32_t> cu = {0};
    for (int64_t n : lens) cu.push_back(int32_t(cu.back() + n));
    packed.args.cu_seqlens = cu.data();
    packed.args.num_seqs = int64_t(lens.size());
    packed.run_host();
    expect_well_formed(packed, packed.num, packed.idx);
    for (size_t x = 0; x < lens.size(); ++x) {
      if (!lens[x]) continue;
      GateSpec one = s;
      one.Sq = one.Skv = lens[x];
      GateCase alone(one);
      for (int64_t h = 0; h < s.Hq; ++h)
        for (int64_t r = 0; r < lens[x]; ++r)
          for (int64_t d = 0; d < s.D; ++d) alone.q.set(0, h, r, d, packed.q.get(0, h, cu[x] + r, d));
      for (int64_t h = 0; h < s.Hkv; ++h)
        for (int64_t r = 0; r < lens[x]; ++r)
          for (int64_t d = 0; d < s.D; ++d) alone.k.set(0, h, r, d, packed.k.get(0, h, cu[x] + r, d));
      alone.run_host();
      const int64_t first = cu[x] / 64;
      for (int64_t g = 0; g < s.Hkv; ++g)
        for (int64_t i = 0; i < alone.Mq; ++i) {
          V want = alone.chosen(0, g, i);
          for (int32_t& j : want) j += int32_t(first);
          EXPECT_EQ(packed.chosen(0, g, first + i), want) << "causal " << causal << " sequence " << x << " row " << i;
        }
    }
  }
}

// Boundaries inside blocks: a row never selects a block of no sequence of its rows; errors name
// cu_seqlens.
TEST(Gate, PackedSequencesStayInsideTheirSequences) {
  PackedGateCase p;
  GateCase& c = p.c;
  const std::vector<int32_t>& cu = p.cu;
  c.run_host();
  expect_well_formed(c, c.num, c.idx);
  for (int64_t i = 0; i < c.Mq; ++i) {
    const int64_t lo_row = i * 64, hi_row = std::min<int64_t>(700, (i + 1) * 64) - 1;
    int64_t lo = 0, hi = 0;
    for (size_t x = 0; x + 1 < cu.size(); ++x) {
      if (cu[x] <= lo_row && lo_row < cu[x + 1]) lo = cu[x];
      if (cu[x] <= hi_row && hi_row < cu[x + 1]) hi = cu[x + 1];
    }
    const V got = c.chosen(0, 0, i);
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got.front(), lo / 64) << "row " << i << ": the sink block is its sequence's first";
    for (int32_t j : got) {
      EXPECT_GE(j, lo / 64) << "row " << i;
      EXPECT_LT(j, (hi + 63) / 64) << "row " << i;
    }
  }
  auto bad = [&](std::vector<int32_t> now, int64_t n, const std::string& msg) {
    std::vector<int32_t> keep = now;
    c.args.cu_seqlens = keep.data();
    c.args.num_seqs = n;
    expect_invalid([&] { gate(c.host_args()); }, {msg});
  };
  bad({0, 100, 700}, 0, "num_seqs = 0 with cu_seqlens given");
  bad({1, 100, 700}, 2, "cu_seqlens[0] = 1 is not 0 (the first sequence starts at row 0)");
  bad({0, 300, 200, 700}, 3, "cu_seqlens[2] = 200 is less than cu_seqlens[1] = 300 (offsets never decrease)");
  bad({0, 100, 699}, 2, "cu_seqlens[2] = 699 is not the packed length T = q.s = 700");
  c.args.cu_seqlens = nullptr;
  c.args.num_seqs = 2;
  expect_invalid([&] { gate(c.host_args()); }, {"num_seqs = 2 but cu_seqlens is null (give both, or num_seqs = 0)"});
}

TEST(Gate, EmptyProblems) {
  GateSpec s = hand_spec();
  s.Skv = 0;  // no key blocks: every row keeps nothing
  GateCase c(s);
  c.run_host();
  EXPECT_EQ(c.Nk, 0);
  EXPECT_EQ(c.kmax, 0);
  for (int32_t n : c.num) EXPECT_EQ(n, 0);
  s = hand_spec();
  s.Sq = 0;  // no query blocks: nothing to write
  GateCase z(s);
  z.run_host();
  EXPECT_TRUE(z.num.empty());
  s = hand_spec();
  s.B = 0;
  GateCase e(s);
  e.run_host();
  EXPECT_TRUE(e.num.empty());
}

TEST(Gate, WorkspaceBytes) {
  GateSpec s = hand_spec();
  s.B = 2;
  s.Hq = 4;
  s.Hkv = 2;
  s.Sq = 200;   // Mq = 4
  s.Skv = 130;  // Nk = 3
  GateCase c(s);
  EXPECT_EQ(gate_workspace_bytes(c.args), 0u);  // host memory
  c.args.q.memory = c.args.k.memory = Memory::device;
  c.args.q.dtype = c.args.k.dtype = DType::bf16;
  EXPECT_EQ(gate_workspace_bytes(c.args), size_t(4 * 64 * 2 * 2 * (4 + 3)));
  const float given = 0;
  c.args.given_scores = &given;
  EXPECT_EQ(gate_workspace_bytes(c.args), 0u);
}

// ---- bad input: each error names the argument and the value ----

// A valid one-entry-per-row candidate layout for hand_spec() (8 query blocks), set on c; the error
// cases below break one thing in it.
std::vector<int32_t> g_cnum, g_cidx;
AttentionLayout g_cand;
AttentionLayout& valid_candidates(GateCase& c) {
  g_cnum.assign(8, 1);
  g_cidx.assign(8, 0);
  g_cand = candidate_layout(g_cnum, g_cidx, 1, 1, 8, 64);
  c.args.candidates = &g_cand;
  return g_cand;
}

struct BadCase {
  const char* name;
  std::vector<std::string> parts;
  void (*edit)(GateCase&);
};

TEST(Gate, ErrorsNameTheArgumentAndValue) {
  const std::vector<BadCase> cases = {
      {"d", {"q.d = 96 is not 64 or 128"}, [](GateCase& c) { c.args.q.d = 96; }},
      {"kd", {"k.d = 128 differs from q.d = 64"}, [](GateCase& c) { c.args.k.d = 128; }},
      {"kb", {"k.b = 2 differs from q.b = 1"}, [](GateCase& c) { c.args.k.b = 2; }},
      {"heads", {"q.h = 3 is not a multiple of k.h = 2"}, [](GateCase& c) { c.args.q.h = 3, c.args.k.h = 2; }},
      {"no heads", {"k.h = 0"}, [](GateCase& c) { c.args.k.h = 0; }},
      {"neg s", {"q.s = -1 is negative"}, [](GateCase& c) { c.args.q.s = -1; }},
      {"neg stride", {"k.stride_s = -64 is negative"}, [](GateCase& c) { c.args.k.stride_s = -64; }},
      {"dtype", {"k.dtype = f16 differs from q.dtype = f32"}, [](GateCase& c) { c.args.k.dtype = DType::f16; }},
      {"bad dtype", {"q.dtype = 7 is not f32 (0), f16 (1) or bf16 (2)"},
       [](GateCase& c) { c.args.q.dtype = static_cast<DType>(7); }},
      {"e4m3", {"q.dtype = e4m3 is not f32 (0), f16 (1) or bf16 (2)"},
       [](GateCase& c) { c.args.q.dtype = DType::e4m3; }},
      {"memory", {"k is in device memory", "q is in host memory"},
       [](GateCase& c) { c.args.k.memory = Memory::device; }},
      {"bad memory", {"k.memory = 5 is not host (0) or device (1)"},
       [](GateCase& c) { c.args.k.memory = static_cast<Memory>(5); }},
      {"block", {"block = 32 is not 64 or 128"}, [](GateCase& c) { c.args.block = 32; }},
      {"topk", {"topk = -1 is negative"}, [](GateCase& c) { c.args.topk = -1; }},
      {"sink", {"sink = -2 is negative"}, [](GateCase& c) { c.args.sink = -2; }},
      {"local", {"local = -3 is negative"}, [](GateCase& c) { c.args.local = -3; }},
      {"scale", {"scale = nan is not finite"}, [](GateCase& c) { c.args.scale = std::nanf(""); }},
      {"kmax", {"kmax = 3 is less than min(Nk = 8, topk + sink + local = 4)"}, [](GateCase& c) { c.args.kmax = 3; }},
      {"q null", {"q.data is null"}, [](GateCase& c) { c.args.q.data = nullptr; }},
      {"k null", {"k.data is null"}, [](GateCase& c) { c.args.k.data = nullptr; }},
      {"num null", {"kv_num_blocks is null"}, [](GateCase& c) { c.args.kv_num_blocks = nullptr; }},
      {"idx null", {"kv_indices is null"}, [](GateCase& c) { c.args.kv_indices = nullptr; }},
      {"overflow", {"overflows int64"}, [](GateCase& c) { c.args.q.stride_b = int64_t(1) << 62, c.args.q.b = c.args.k.b = 8; }},
      {"alias out/out", {"kv_indices overlaps kv_num_blocks"},
       [](GateCase& c) { c.args.kv_indices = c.args.kv_num_blocks; }},
      {"alias out/in", {"scores overlaps the input q"},
       [](GateCase& c) { c.args.scores = static_cast<float*>(c.args.q.data); }},
      {"cand memory", {"candidates are in device memory", "q is in host memory"},
       [](GateCase& c) { valid_candidates(c).memory = Memory::device; }},
      {"cand bad memory", {"candidates.memory = 7 is not host (0) or device (1)"},
       [](GateCase& c) { valid_candidates(c).memory = static_cast<Memory>(7); }},
      {"cand block", {"candidates.block_q = 128 and candidates.block_kv = 64 are not both block = 64"},
       [](GateCase& c) { valid_candidates(c).block_q = 128; }},
      {"cand batch", {"candidates.batch = 2 is neither 1 nor B = 1"},
       [](GateCase& c) { valid_candidates(c).batch = 2; }},
      {"cand heads", {"candidates.heads = 3 is not 1, Hq = 1 or Hkv = 1"},
       [](GateCase& c) { valid_candidates(c).heads = 3; }},
      {"cand q_blocks", {"candidates.q_blocks = 7 differs from ceil(Sq / block) = 8"},
       [](GateCase& c) { valid_candidates(c).q_blocks = 7; }},
      {"cand kmax", {"candidates.kmax = -1 is negative"}, [](GateCase& c) { valid_candidates(c).kmax = -1; }},
      {"cand null", {"candidates.kv_num_blocks is null"},
       [](GateCase& c) { valid_candidates(c).kv_num_blocks = nullptr; }},
      {"cand full", {"full_kv_num_blocks and full_kv_indices"},
       [](GateCase& c) { valid_candidates(c).full_kv_num_blocks = g_cnum.data(); }},
      {"cand count", {"candidates.kv_num_blocks[0, 0, 5] = 2", "[0, 1]"},
       [](GateCase& c) {
         valid_candidates(c);
         g_cnum[5] = 2;
       }},
      {"cand index", {"candidates.kv_indices[0, 0, 3, 0] = 8", "[0, 8)"},
       [](GateCase& c) {
         valid_candidates(c);
         g_cidx[3] = 8;
       }},
  };
  for (const BadCase& bc : cases) {
    SCOPED_TRACE(bc.name);
    GateCase c(hand_spec());
    GateArgs& a = c.host_args();
    bc.edit(c);
    expect_invalid([&] { gate(a); }, bc.parts);
    EXPECT_EQ(c.num[0], kPoisonIndex) << "an invalid call wrote its output";
  }
}

TEST(Gate, OptionsAreChecked) {
  GateCase c(hand_spec());
  GateArgs& a = c.host_args();
  Options o;
  o.backend = Backend::cuda;
  expect_invalid([&] { gate(a, o); }, {"options.backend = cuda needs device memory, but q and k are in host memory"});
  o = Options();
  o.backend = static_cast<Backend>(5);
  expect_invalid([&] { gate(a, o); }, {"options.backend = 5 is not automatic (0), cpu (1) or cuda (2)"});
  o = Options();
  o.variant = "hopper";
  expect_invalid([&] { gate(a, o); }, {"options.variant 'hopper'"});
  o = Options();
  o.threads = -1;
  expect_invalid([&] { gate(a, o); }, {"options.threads = -1 is negative"});
}

TEST(Gate, DeviceMemoryWithoutGpuSaysSo) {
  if (device_info().available) GTEST_SKIP() << "a GPU answers; tests/gpu/test_gate.cpp covers device memory";
  GateCase c(hand_spec());
  GateArgs& a = c.host_args();
  a.q.memory = a.k.memory = Memory::device;
  a.q.dtype = a.k.dtype = DType::bf16;
  try {
    gate(a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), no_gpu_status()) << e.what();
  }
  a.q.dtype = a.k.dtype = DType::f32;
  try {
    gate(a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("q.dtype = f32: the GPU gate reads f16 or bf16"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sparsek::test
