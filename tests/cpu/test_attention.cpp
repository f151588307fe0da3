// Block-sparse attention on the host: validation (every error named), the reference's semantics
// on hand-checkable cases (empty rows, causal inside masked vs full blocks, tails, GQA, layout
// broadcast), the CPU variant against the fp64 oracle on random problems, plan/run, effective
// FLOPs and the C API.
#include "core/cuda_host.hpp"
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_util.hpp"
#include "plan/variant.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/sparsek.h"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

// The CPU variant's tolerance on O by dtype (double softmax, rounding of the output alone).
double tol_o(DType t) { return t == DType::f32 ? 1e-5 : t == DType::f16 ? 2e-3 : 1.6e-2; }

// attention() on the case, then the check against the oracle.
void run_and_check(AttnCase& c, const Options& opt = {}) {
  SCOPED_TRACE(c.spec.name());
  const AttentionReference ref = attention_oracle(c.args);
  attention(c.args, opt);
  expect_matches(c, ref, tol_o(c.spec.dtype), 1e-5);
}

// ---------------------------------------------------------------- validation

AttnSpec small() {
  AttnSpec s;
  s.batch = 2, s.hq = 4, s.hkv = 2, s.sq = 200, s.skv = 300, s.d = 64, s.block = 64;
  return s;
}

// validate(a edited by edit, false) must fail naming every one of parts.
template <class Edit>
void expect_bad(const AttentionArgs& a, const Edit& edit, const std::vector<std::string>& parts) {
  AttentionArgs x = a;
  edit(x);
  expect_invalid([&] { validate(x, false); }, parts);
}

TEST(AttentionValidation, AcceptsAValidProblem) {
  auto c = make_attention_case(small());
  EXPECT_NO_THROW(validate(c->args, true));
}

TEST(AttentionValidation, ShapesAreNamed) {
  auto c = make_attention_case(small());
  AttentionArgs a = c->args;
  auto bad = [&](auto edit, const std::vector<std::string>& parts) { expect_bad(a, edit, parts); };
  bad([](AttentionArgs& x) { x.q.d = x.k.d = x.v.d = x.o.d = 96; }, {"q.d = 96 is not 64 or 128"});
  bad([](AttentionArgs& x) { x.k.d = 32; }, {"k.d = 32 differs from q.d = 64"});
  bad([](AttentionArgs& x) { x.v.s = 299; }, {"v.s = 299 differs from k.s = 300"});
  bad([](AttentionArgs& x) { x.v.h = 1; }, {"v.h = 1 differs from k.h = 2"});
  bad([](AttentionArgs& x) { x.o.s = 100; }, {"o.s = 100 differs from q.s = 200"});
  bad([](AttentionArgs& x) { x.o.h = 3; }, {"o.h = 3 differs from q.h = 4"});
  bad([](AttentionArgs& x) { x.k.b = 1; }, {"k.b = 1 differs from q.b = 2"});
  bad([](AttentionArgs& x) { x.k.h = x.v.h = 3; }, {"q.h = 4 query heads is not a multiple of k.h = 3"});
  bad([](AttentionArgs& x) { x.q.s = 0; }, {"q.s = 0 must be at least 1"});
  bad([](AttentionArgs& x) { x.k.b = -1; }, {"k.b = -1 must be at least 1"});
  bad([](AttentionArgs& x) { x.q.stride_s = -64; }, {"q.stride_s = -64 is negative"});
  bad([](AttentionArgs& x) { x.v.data = nullptr; }, {"v.data is null"});
  bad([](AttentionArgs& x) { x.q.stride_b = INT64_MAX; }, {"q: the extent of a [2, 4, 200, 64] tensor", "overflows 64-bit offsets"});
  bad([](AttentionArgs& x) { x.k.stride_b = int64_t(1) << 62; }, {"k: the byte extent of the tensor overflows 64 bits"});
  bad([](AttentionArgs& x) { x.scale = std::numeric_limits<float>::quiet_NaN(); }, {"scale = nan is not finite"});
  bad([](AttentionArgs& x) { x.scale = std::numeric_limits<float>::infinity(); }, {"scale = inf is not finite"});
}

TEST(AttentionValidation, DtypesAndMemoryAreNamed) {
  auto c = make_attention_case(small());
  AttentionArgs a = c->args;
  auto bad = [&](auto edit, const std::vector<std::string>& parts) { expect_bad(a, edit, parts); };
  bad([](AttentionArgs& x) { x.k.dtype = DType::f16; }, {"k dtype f16 differs from q's f32"});
  bad([](AttentionArgs& x) { x.o.dtype = DType::bf16; }, {"o dtype bf16 differs from q's f32"});
  bad([](AttentionArgs& x) { x.q.dtype = DType(7); }, {"q dtype 7 is not f32 (0), f16 (1) or bf16 (2)"});
  bad([](AttentionArgs& x) { x.v.memory = Memory(5); }, {"v memory 5 is not host (0) or device (1)"});
  bad([](AttentionArgs& x) { x.layout.memory = Memory(9); }, {"layout.memory 9 is not host (0) or device (1)"});
  bad([](AttentionArgs& x) { x.k.memory = Memory::device; }, {"k is in device memory but q is in host memory"});
  bad([](AttentionArgs& x) { x.layout.memory = Memory::device; }, {"layout is in device memory but q is in host memory"});
  bad(
      [](AttentionArgs& x) {
        x.q.memory = x.k.memory = x.v.memory = x.o.memory = x.layout.memory = Memory::device;
      },
      {"dtype f32 is for host memory only"});
}

TEST(AttentionValidation, OutputsMustNotOverlapInputsOrThemselves) {
  auto c = make_attention_case(small());
  AttentionArgs a = c->args;
  expect_bad(a, [](AttentionArgs& x) { x.o.data = x.q.data; }, {"o overlaps q", "give o memory of its own"});
  expect_bad(a, [](AttentionArgs& x) { x.lse = static_cast<float*>(x.v.data) + 10; }, {"lse overlaps v"});
  expect_bad(a, [](AttentionArgs& x) { x.lse = static_cast<float*>(x.o.data); }, {"lse overlaps o"});
  {
    // kv_indices inside a buffer of its own, lse its tail.
    AttentionArgs x = a;
    const size_t n = c->layout.idx.size();
    std::vector<int32_t> buf(n + c->lse.size());
    std::copy(c->layout.idx.begin(), c->layout.idx.end(), buf.begin());
    x.layout.kv_indices = buf.data();
    EXPECT_NO_THROW(validate(x, true));
    x.lse = reinterpret_cast<float*>(buf.data() + n - 1);
    expect_invalid([&] { validate(x, false); }, {"lse overlaps layout.kv_indices"});
  }
  expect_bad(a, [](AttentionArgs& x) { x.o.stride_s = 0; },  // every row of o at one place
             {"o strides", "stride_s = 0", "give two positions the same element"});
  expect_bad(a, [](AttentionArgs& x) { x.o.stride_h = 32; },  // heads interleaved into one row's d
             {"o strides", "give two positions the same element"});
  {
    AttentionArgs x = a;  // inputs may be broadcast (stride 0): reading twice is fine
    x.k.stride_b = x.v.stride_b = 0;
    EXPECT_NO_THROW(validate(x, true));
  }
}

TEST(AttentionValidation, LayoutExtentsAreNamed) {
  auto c = make_attention_case(small());
  AttentionArgs a = c->args;
  auto bad = [&](auto edit, const std::vector<std::string>& parts) { expect_bad(a, edit, parts); };
  bad([](AttentionArgs& x) { x.layout.batch = 3; }, {"layout.batch = 3 is neither 1 nor B = 2"});
  bad([](AttentionArgs& x) { x.layout.heads = 3; }, {"layout.heads = 3 is not 1, Hq = 4 or Hkv = 2"});
  bad([](AttentionArgs& x) { x.layout.q_blocks = 3; },
      {"layout.q_blocks = 3 but Sq = 200 makes ceil(Sq / block_q) = 4 query blocks"});
  bad([](AttentionArgs& x) { x.layout.block_q = x.layout.block_kv = 32; }, {"layout.block_q = 32 is not 64 or 128"});
  bad([](AttentionArgs& x) { x.layout.block_kv = 128; }, {"layout.block_kv = 128 differs from layout.block_q = 64"});
  bad([](AttentionArgs& x) { x.layout.kmax = -1; }, {"layout.kmax = -1 is negative"});
  bad([](AttentionArgs& x) { x.layout.kmax = int64_t(1) << 61; }, {"layout.kmax", "overflows 64 bits"});
  bad([](AttentionArgs& x) { x.layout.kv_num_blocks = nullptr; }, {"layout.kv_num_blocks is null"});
  bad([](AttentionArgs& x) { x.layout.kv_indices = nullptr; }, {"layout.kv_indices is null but layout.kmax ="});
  static const int32_t some[64] = {};
  bad([](AttentionArgs& x) { x.layout.full_kv_indices = some; },
      {"layout.full_kv_indices is given but layout.full_kv_num_blocks is null"});
  bad(
      [](AttentionArgs& x) {
        x.layout.full_kv_num_blocks = some;
        x.layout.full_kmax = 2;
      },
      {"layout.full_kv_num_blocks is given but layout.full_kv_indices is null"});
  bad(
      [](AttentionArgs& x) {
        x.layout.full_kv_num_blocks = some;
        x.layout.full_kv_indices = some;
        x.layout.full_kmax = -2;
      },
      {"layout.full_kmax = -2 is negative"});
}

TEST(AttentionValidation, LayoutContentsNameTheEntry) {
  AttnSpec s = small();
  s.split_full = true;
  auto c = make_attention_case(s);
  LayoutArrays& l = c->layout;
  ASSERT_GE(l.kmax, 2);
  // Layout row (b=1, h=1, i=2): flat (1 * 2 + 1) * 4 + 2 = 14.
  const int64_t r = 14;
  ASSERT_GE(l.num[r], 1);
  auto bad = [&](auto edit, std::vector<std::string> parts) {
    LayoutArrays saved = l;
    edit(l);
    c->args.layout = l.view();
    EXPECT_NO_THROW(validate(c->args, false)) << "the cheap checks do not read the contents";
    EXPECT_NO_THROW(validate(c->args, false, cudaStreamPerThread)) << "nor do they with a stream";
    expect_invalid([&] { validate(c->args, true); }, parts);
    // The stream form (what the Python binding calls) reads a host layout the same way: the
    // stream orders device reads alone.
    expect_invalid([&] { validate(c->args, true, cudaStreamPerThread); }, parts);
    l = saved;
    c->args.layout = l.view();
  };
  bad([&](LayoutArrays& x) { x.num[r] = int32_t(x.kmax) + 1; },
      {"kv_num_blocks[1, 1, 2] = " + std::to_string(l.kmax + 1) + " is out of range [0, " + std::to_string(l.kmax) + "]"});
  bad([&](LayoutArrays& x) { x.num[r] = -1; }, {"kv_num_blocks[1, 1, 2] = -1 is out of range"});
  bad([&](LayoutArrays& x) { x.idx[r * x.kmax] = 140; }, {"kv_indices[1, 1, 2, 0] = 140 is out of range [0, 5)"});
  bad([&](LayoutArrays& x) { x.idx[r * x.kmax] = -3; }, {"kv_indices[1, 1, 2, 0] = -3 is out of range [0, 5)"});
  bad(
      [&](LayoutArrays& x) {
        x.num[r] = 2;
        x.idx[r * x.kmax] = 3;
        x.idx[r * x.kmax + 1] = 3;
      },
      {"kv_indices[1, 1, 2, 1] = 3 is not greater than kv_indices[1, 1, 2, 0] = 3", "sorted and unique"});
  bad(
      [&](LayoutArrays& x) {
        x.num[r] = 2;
        x.idx[r * x.kmax] = 4;
        x.idx[r * x.kmax + 1] = 1;
      },
      {"kv_indices[1, 1, 2, 1] = 1 is not greater than"});
  bad([&](LayoutArrays& x) { x.full_num[r] = int32_t(x.full_kmax) + 2; }, {"full_kv_num_blocks[1, 1, 2] ="});
  bad([&](LayoutArrays& x) { x.full_idx[0] = 5; }, {"full_kv_indices[0, 0, 0, 0] = 5 is out of range [0, 5)"});
  bad(
      [&](LayoutArrays& x) {
        x.num[r] = 1;
        x.idx[r * x.kmax] = 2;
        x.full_num[r] = 2;
        x.full_idx[r * x.full_kmax] = 0;
        x.full_idx[r * x.full_kmax + 1] = 2;
      },
      {"full_kv_indices[1, 1, 2, 1] = 2 is also kv_indices[1, 1, 2, 0]", "either masked or full"});
  // Entries past a row's count are never read.
  l.idx[r * l.kmax + l.kmax - 1] = 9999;
  l.num[r] = int32_t(l.kmax - 1);
  std::sort(l.idx.begin() + r * l.kmax, l.idx.begin() + r * l.kmax + l.num[r]);
  c->args.layout = l.view();
  EXPECT_NO_THROW(validate(c->args, true));
}

// validate(args, check_indices, stream) on a device layout: the cheap checks first (no device is
// touched for a bad argument), then the layout is read, which without a GPU is no_device, named.
TEST(AttentionValidation, DeviceLayoutOnAStreamWithoutGpuSaysSo) {
  if (device_info().available) GTEST_SKIP() << "a GPU answers; tests/gpu/test_stream_order.cu reads device layouts";
  auto c = make_attention_case(small());
  AttentionArgs a = c->args;  // host pointers never dereferenced: no device answers to copy from
  for (Tensor4View* t : {&a.q, &a.k, &a.v, &a.o}) {
    t->memory = Memory::device;
    t->dtype = DType::bf16;
  }
  a.layout.memory = Memory::device;
  EXPECT_NO_THROW(validate(a, false, cudaStreamPerThread)) << "the cheap checks read no layout";
  for (bool check : {false, true}) {
    AttentionArgs x = a;
    x.layout.kmax = -4;
    expect_invalid([&] { validate(x, check, cudaStreamPerThread); }, {"layout.kmax = -4 is negative"});
  }
  try {
    validate(a, true, cudaStreamPerThread);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), no_gpu_status()) << e.what();
    EXPECT_NE(std::string(e.what()).find(no_gpu_text("the layout is in device memory but no CUDA device answers")),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------- semantics, by hand

// One (1, heads, s, 64) problem with q = 0 (every score 0: softmax is the uniform average of the
// attended keys' v, LSE = log(count)) and v[key][d] = key + d / 64.
struct HandCase {
  std::unique_ptr<AttnCase> c;
  explicit HandCase(AttnSpec s) {
    s.dtype = DType::f32;
    c = make_attention_case(s);
    c->q.fill(0.f);
    for (int64_t h = 0; h < s.hkv; ++h)
      for (int64_t key = 0; key < s.skv; ++key)
        for (int64_t d = 0; d < s.d; ++d)
          store_from_float(c->v.view.data, DType::f32, c->v.view.index(0, h, key, d),
                           float(1000 * h + key) + float(d) / 64.f);
  }
  // Sets layout row r to the given masked and full lists.
  void row(int64_t r, std::vector<int32_t> masked, std::vector<int32_t> full = {}) {
    LayoutArrays& l = c->layout;
    l.num[size_t(r)] = int32_t(masked.size());
    std::copy(masked.begin(), masked.end(), l.idx.begin() + r * l.kmax);
    if (!l.full_num.empty()) {
      l.full_num[size_t(r)] = int32_t(full.size());
      std::copy(full.begin(), full.end(), l.full_idx.begin() + r * l.full_kmax);
    }
  }
  // Expected o[h][i][0] and lse for a row attending keys [lo, hi) of kv head g.
  static double mean_key(int64_t g, int64_t lo, int64_t hi) { return 1000.0 * g + 0.5 * double(lo + hi - 1); }
};

AttnSpec hand_spec(int64_t sq, int64_t skv, int64_t hq, int64_t hkv, bool causal) {
  AttnSpec s;
  s.batch = 1, s.hq = hq, s.hkv = hkv, s.sq = sq, s.skv = skv, s.d = 64, s.block = 64;
  s.kind = LayoutKind::dense;
  s.causal = causal;
  s.split_full = true;  // full lists present (edited per test)
  s.extra_kmax = 2;
  return s;
}

void expect_row(const AttnCase& c, int64_t h, int64_t i, double o0, double lse) {
  EXPECT_NEAR(c.o.at(0, h, i, 0), o0, 1e-3 * std::max(1.0, std::fabs(o0))) << "o[0, " << h << ", " << i << ", 0]";
  if (std::isinf(lse)) EXPECT_EQ(c.lse[size_t(h * c.spec.sq + i)], -std::numeric_limits<float>::infinity());
  else EXPECT_NEAR(c.lse[size_t(h * c.spec.sq + i)], lse, 1e-5) << "lse[0, " << h << ", " << i << "]";
}

TEST(AttentionSemantics, EmptyRowGivesZeroAndMinusInfinity) {
  HandCase hc(hand_spec(128, 128, 1, 1, false));
  hc.row(0, {});
  hc.row(1, {1});
  attention(hc.c->args);
  for (int64_t i = 0; i < 64; ++i) {
    for (int64_t d = 0; d < 64; ++d) ASSERT_EQ(hc.c->o.at(0, 0, i, d), 0.f);
    expect_row(*hc.c, 0, i, 0.0, -kInf);
  }
  expect_row(*hc.c, 0, 64, HandCase::mean_key(0, 64, 128), std::log(64.0));
}

TEST(AttentionSemantics, CausalMasksInsideMaskedBlocksOnly) {
  HandCase hc(hand_spec(128, 128, 1, 1, true));
  hc.row(0, {0});         // diagonal block, masked: row i sees keys 0..i
  hc.row(1, {1}, {0});    // masked diagonal + full block 0: row 64+t sees 0..63 and 64..64+t
  attention(hc.c->args);
  for (int64_t i : {0, 1, 17, 63}) expect_row(*hc.c, 0, i, HandCase::mean_key(0, 0, i + 1), std::log(double(i + 1)));
  for (int64_t i : {64, 65, 100, 127}) expect_row(*hc.c, 0, i, HandCase::mean_key(0, 0, i + 1), std::log(double(i + 1)));
  // The same block in the full list is attended whole, causal or not.
  hc.row(0, {}, {0});
  hc.row(1, {}, {1});
  attention(hc.c->args);
  for (int64_t i : {0, 5, 63}) expect_row(*hc.c, 0, i, HandCase::mean_key(0, 0, 64), std::log(64.0));
  for (int64_t i : {64, 100}) expect_row(*hc.c, 0, i, HandCase::mean_key(0, 64, 128), std::log(64.0));
  // A masked block entirely after the row's keys masks everything: O = 0, LSE = -inf.
  hc.row(0, {1});
  attention(hc.c->args);
  expect_row(*hc.c, 0, 10, 0.0, -kInf);
}

TEST(AttentionSemantics, TailsAreNeverAttendedAndCausalUsesAbsolutePositions) {
  // Sq = 70, Skv = 100: key block 1 holds keys 64..99; query block 1 holds rows 64..69.
  HandCase hc(hand_spec(70, 100, 1, 1, true));
  hc.row(0, {}, {1});  // full: keys 64..99 (not past Skv)
  hc.row(1, {1});      // masked: row 64+t sees keys 64..64+t (q_idx >= kv_idx, no offset)
  attention(hc.c->args);
  expect_row(*hc.c, 0, 3, HandCase::mean_key(0, 64, 100), std::log(36.0));
  for (int64_t i : {64, 66, 69}) expect_row(*hc.c, 0, i, HandCase::mean_key(0, 64, i + 1), std::log(double(i - 63)));
}

TEST(AttentionSemantics, GqaHeadsReadTheirGroupsKeyValueHead) {
  // Hq = 4, Hkv = 2: query heads 0, 1 read kv head 0; 2, 3 read kv head 1. Layout heads = Hkv:
  // one row per group.
  AttnSpec s = hand_spec(64, 128, 4, 2, false);
  HandCase hc(s);
  hc.row(0, {0});  // group 0: block 0
  hc.row(1, {1});  // group 1: block 1
  attention(hc.c->args);
  for (int64_t h : {0, 1}) expect_row(*hc.c, h, 7, HandCase::mean_key(0, 0, 64), std::log(64.0));
  for (int64_t h : {2, 3}) expect_row(*hc.c, h, 7, HandCase::mean_key(1, 64, 128), std::log(64.0));
}

TEST(AttentionSemantics, LayoutHeadsEqualToHqGiveEveryQueryHeadItsRow) {
  AttnSpec s = hand_spec(64, 256, 4, 2, false);
  s.layout_heads = 4;
  HandCase hc(s);
  for (int64_t h = 0; h < 4; ++h) hc.row(h, {int32_t(h)});
  attention(hc.c->args);
  for (int64_t h = 0; h < 4; ++h)
    expect_row(*hc.c, h, 0, HandCase::mean_key(h / 2, 64 * h, 64 * h + 64), std::log(64.0));
}

TEST(AttentionSemantics, LayoutBroadcastOverBatchAndHeads) {
  AttnSpec s = small();
  s.layout_batch = 1;
  s.layout_heads = 1;
  auto c = make_attention_case(s);
  run_and_check(*c);
  // The same problem with the one layout row written out for every (batch, query head).
  auto d = make_attention_case(s);
  LayoutArrays rep = c->layout;
  rep.batch = 2;
  rep.heads = 4;
  rep.num.clear();
  rep.idx.clear();
  for (int copy = 0; copy < 2 * 4; ++copy) {
    rep.num.insert(rep.num.end(), c->layout.num.begin(), c->layout.num.end());
    rep.idx.insert(rep.idx.end(), c->layout.idx.begin(), c->layout.idx.end());
  }
  d->layout = rep;
  d->args.layout = d->layout.view();
  attention(d->args);
  EXPECT_EQ(c->o.bytes, d->o.bytes);
}

// ---------------------------------------------------------------- the CPU variant vs the oracle

TEST(AttentionCpu, MatchesTheOracleOnRandomProblems) {
  struct V {
    DType t;
    int d, block;
    bool causal;
  };
  for (V v : {V{DType::f32, 64, 64, false}, V{DType::f16, 128, 64, true}, V{DType::bf16, 64, 128, false},
              V{DType::bf16, 128, 128, true}, V{DType::f32, 128, 64, true}}) {
    AttnSpec s = small();
    s.dtype = v.t, s.d = v.d, s.block = v.block, s.causal = v.causal;
    s.seed = uint64_t(v.d + v.block + int(v.t));
    auto c = make_attention_case(s);
    run_and_check(*c);
  }
}

TEST(AttentionCpu, CornerLayouts) {
  std::vector<AttnSpec> specs;
  AttnSpec s = small();
  s.empty_rows = {0, 5, -1};
  s.extra_kmax = 3;
  specs.push_back(s);
  s = small();
  s.split_full = true;  // full lists, no causal
  specs.push_back(s);
  s = small();
  s.kind = LayoutKind::causal;
  s.causal = true;
  s.sq = s.skv = 257;  // one-row tail block
  specs.push_back(s);
  s = small();
  s.kind = LayoutKind::dense;
  s.sq = 1;  // one query row
  s.skv = 1;
  specs.push_back(s);
  s = small();
  s.bshd = true;  // strided [B, S, H, D] memory
  s.lse = false;  // LSE not asked for
  specs.push_back(s);
  s = small();
  s.hq = s.hkv = 3;  // MHA, layout heads = Hkv = Hq
  s.o_tail = 5;      // o rows past Sq stay untouched
  s.scale = 0.3f;
  specs.push_back(s);
  s = small();
  s.hkv = 1;  // MQA
  s.layout_heads = 4;
  s.density = 0.01;  // one block per row
  specs.push_back(s);
  for (const AttnSpec& spec : specs) {
    auto c = make_attention_case(spec);
    run_and_check(*c);
  }
}

TEST(AttentionCpu, AnyThreadCountIsBitIdentical) {
  AttnSpec s = small();
  s.dtype = DType::bf16;
  s.causal = true;
  auto c = make_attention_case(s);
  Options one;
  one.threads = 1;
  attention(c->args, one);
  const std::vector<uint8_t> o1 = c->o.bytes;
  const std::vector<float> l1 = c->lse;
  Options three;
  three.threads = 3;
  c->o.fill(0.f);
  attention(c->args, three);
  EXPECT_EQ(o1, c->o.bytes);
  EXPECT_EQ(std::memcmp(l1.data(), c->lse.data(), l1.size() * 4), 0);
}

TEST(AttentionCpu, WithinTwiceTheNaiveHalfPrecisionError) {
  for (DType t : {DType::bf16, DType::f16}) {
    AttnSpec s = small();
    s.dtype = t;
    s.causal = true;
    auto c = make_attention_case(s);
    const AttentionReference ref = attention_oracle(c->args);
    attention(c->args);
    const double naive = naive_error(*c, ref);
    const double ours = expect_matches(*c, ref, tol_o(t), 1e-5);
    EXPECT_GT(naive, 0.0) << "the naive computation must show rounding";
    EXPECT_LE(ours, 2 * naive) << to_string(t);
  }
}

TEST(AttentionCpu, MalformedLayoutOnAPlanRunIsNotACrash) {
  auto c = make_attention_case(small());
  AttentionPlan p = plan(c->args);  // plan() does not read the contents
  for (int32_t& n : c->layout.num) n = 1 << 20;
  for (int32_t& x : c->layout.idx) x = -123456;
  c->args.layout = c->layout.view();
  EXPECT_NO_THROW(run(p, c->args));  // undefined values, but no read out of bounds
  expect_invalid([&] { attention(c->args); }, {"kv_num_blocks[0, 0, 0] = 1048576 is out of range"});
  Options unchecked;
  unchecked.check_indices = false;
  EXPECT_NO_THROW(attention(c->args, unchecked));
}

// ---------------------------------------------------------------- plan / run

TEST(AttentionPlan, RunsWithNewPointersAndNewLayoutContents) {
  AttnSpec s = small();
  s.causal = true;
  auto a = make_attention_case(s);
  s.seed = 99;  // same shapes and extents (causal top-k: kmax 1, full_kmax k - 1), other contents
  auto b = make_attention_case(s);
  ASSERT_EQ(b->layout.kmax, a->layout.kmax);
  ASSERT_EQ(b->layout.full_kmax, a->layout.full_kmax);
  ASSERT_NE(b->layout.full_idx, a->layout.full_idx);
  AttentionPlan p = plan(a->args);
  EXPECT_EQ(p.variant(), "cpu");
  EXPECT_EQ(p.backend(), Backend::cpu);
  EXPECT_EQ(p.workspace_bytes(), 0u);
  for (AttnCase* c : {a.get(), b.get(), a.get()}) {
    SCOPED_TRACE(c->spec.name());
    c->o.fill(std::numeric_limits<float>::quiet_NaN());
    const AttentionReference ref = attention_oracle(c->args);
    run(p, c->args);
    expect_matches(*c, ref, tol_o(s.dtype), 1e-5);
  }
}

TEST(AttentionPlan, RunRefusesArgsThatDoNotMatch) {
  auto c = make_attention_case(small());
  AttentionPlan p = plan(c->args);
  auto bad = [&](auto edit, std::vector<std::string> parts) {
    AttentionArgs x = c->args;
    edit(x);
    expect_invalid([&] { run(p, x); }, parts);
  };
  bad([](AttentionArgs& x) { x.q.s = x.o.s = 128; }, {"run: args do not match the plan: q.s is 128, the plan was made for 200"});
  bad([](AttentionArgs& x) { x.k.stride_h *= 2; }, {"k.stride_h is"});
  bad([](AttentionArgs& x) { x.causal = true; }, {"causal is true, the plan was made for false"});
  bad([](AttentionArgs& x) { x.scale = 2.f; }, {"the softmax scale is 2.0"});
  bad([](AttentionArgs& x) { x.layout.kmax += 1; }, {"layout.kmax is"});
  bad([](AttentionArgs& x) { x.layout.heads = 4; }, {"layout.heads is 4, the plan was made for 2"});
  bad([](AttentionArgs& x) { x.o.data = x.q.data; }, {"o overlaps q"});
  expect_invalid([&] { run(AttentionPlan(), c->args); }, {"the attention plan is empty"});
  // The default scale and its value are the same plan.
  AttentionArgs x = c->args;
  x.scale = 1.f / 8.f;  // 1 / sqrt(64)
  EXPECT_NO_THROW(run(p, x));
}

TEST(AttentionPlan, VariantChoiceAndBackendErrors) {
  auto c = make_attention_case(small());
  const std::vector<std::string> names = supported_variants(c->args);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "cpu");
  for (const std::string& r : unsupported_reasons(c->args)) EXPECT_EQ(r.find("cpu:"), std::string::npos) << r;
  Options o;
  o.variant = "nope";
  expect_invalid([&] { plan(c->args, o); }, {"options.variant 'nope' is not one of: cpu"});
  o.variant = "cpu";
  EXPECT_EQ(plan(c->args, o).variant(), "cpu");
  Options cuda;
  cuda.backend = Backend::cuda;
  expect_invalid([&] { plan(c->args, cuda); }, {"backend cuda needs device memory"});
  Options neg;
  neg.threads = -2;
  expect_invalid([&] { plan(c->args, neg); }, {"options.threads=-2 is negative"});
  // Every registered variant says why it cannot run device tensors on the host, or runs them.
  AttentionArgs dev = c->args;
  dev.q.memory = dev.k.memory = dev.v.memory = dev.o.memory = dev.layout.memory = Memory::device;
  dev.q.dtype = dev.k.dtype = dev.v.dtype = dev.o.dtype = DType::bf16;
  for (const std::string& r : unsupported_reasons(dev))
    if (r.rfind("cpu:", 0) == 0) EXPECT_NE(r.find("needs host memory"), std::string::npos) << r;
}

TEST(AttentionPlan, ProblemsValidationRefusesListNoVariant) {
  // A problem validate() refuses is supported by no variant: the cpu variant names the reason.
  auto c = make_attention_case(small());
  struct Case {
    const char* what;
    void (*edit)(AttentionArgs&);
    const char* why;
  };
  const Case cases[] = {
      {"D = 96", [](AttentionArgs& a) { a.q.d = a.k.d = a.v.d = a.o.d = 96; }, "q.d = 96 is not 64 or 128"},
      {"negative stride", [](AttentionArgs& a) { a.k.stride_s = -1; }, "k.stride_s = -1 is negative"},
      {"layout block", [](AttentionArgs& a) { a.layout.block_q = a.layout.block_kv = 32; }, "layout.block_q = 32"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    AttentionArgs a = c->args;
    k.edit(a);
    EXPECT_THROW(validate(a, false), Error);
    for (const std::string& v : supported_variants(a)) ADD_FAILURE() << "listed as supported: " << v;
    bool named = false;
    for (const std::string& r : unsupported_reasons(a))
      named |= r.rfind("cpu: ", 0) == 0 && r.find(k.why) != std::string::npos;
    EXPECT_TRUE(named) << "no 'cpu: " << k.why << "' among the reasons";
  }
}

TEST(AttentionPlan, OneShotGivesTheRightAnswerAcrossChangingShapes) {
  // The one-shot call caches plans: alternating shapes must never reuse the wrong one.
  AttnSpec s1 = small(), s2 = small();
  s2.sq = 64, s2.skv = 64, s2.hq = 2, s2.hkv = 2, s2.causal = true;
  for (int rep = 0; rep < 2; ++rep)
    for (const AttnSpec& s : {s1, s2}) {
      auto c = make_attention_case(s);
      run_and_check(*c);
    }
}

// ---------------------------------------------------------------- effective FLOPs

TEST(AttentionFlops, CountsUnmaskedScoreElements) {
  AttnSpec s = hand_spec(128, 128, 2, 1, false);
  s.split_full = false;
  s.extra_kmax = 0;
  HandCase hc(s);  // dense layout, heads = Hkv = 1 broadcast to both query heads
  const double D4 = 4.0 * 64;
  EXPECT_DOUBLE_EQ(effective_flops(hc.c->args), D4 * 2 * 128 * 128);
  hc.c->args.causal = true;  // masked blocks only: the lower triangle incl. the diagonal
  EXPECT_DOUBLE_EQ(effective_flops(hc.c->args), D4 * 2 * (128.0 * 129 / 2));
  // Tails: Sq = 100, Skv = 70.
  AttnSpec t = hand_spec(100, 70, 1, 1, false);
  t.split_full = false;
  t.extra_kmax = 0;
  HandCase tc(t);
  EXPECT_DOUBLE_EQ(effective_flops(tc.c->args), D4 * 100 * 70);
  tc.c->args.causal = true;  // key j <= row i, j < 70: rows 0..69 see i + 1, rows 70..99 see 70
  EXPECT_DOUBLE_EQ(effective_flops(tc.c->args), D4 * (70.0 * 71 / 2 + 30 * 70));
  // Full blocks are counted whole even with causal.
  AttnSpec f = hand_spec(128, 128, 1, 1, true);
  f.extra_kmax = 1;
  HandCase fc(f);
  fc.row(0, {}, {0, 1});
  fc.row(1, {}, {0, 1});
  EXPECT_DOUBLE_EQ(effective_flops(fc.c->args), D4 * 128 * 128);
  // And it names a bad layout rather than reading past it.
  fc.c->layout.full_num[0] = 9;
  expect_invalid([&] { effective_flops(fc.c->args); }, {"full_kv_num_blocks[0, 0, 0] = 9 is out of range [0, 2]"});
}

// ---------------------------------------------------------------- packed sequences (cu_seqlens)

// Boundaries inside blocks, an empty sequence, a one-token sequence and a sequence longer than a
// block, against the oracle; random layouts name blocks of other sequences too (masked).
TEST(AttentionPacked, MatchesTheOracle) {
  struct V {
    DType t;
    int d, block;
    bool causal, split_full;
  };
  for (V v : {V{DType::f32, 64, 64, false, false}, V{DType::f32, 64, 64, true, false}, V{DType::bf16, 128, 128, true, false},
              V{DType::f16, 64, 64, false, true}, V{DType::f32, 128, 64, true, false}}) {
    AttnSpec s = small();
    s.packed({50, 1, 0, 130, 77, 64});
    s.dtype = v.t, s.d = v.d, s.block = v.block, s.causal = v.causal, s.split_full = v.split_full;
    s.density = 0.7;
    s.layout_heads = 4;  // a layout row per query head (GQA 4 / 2)
    s.seed = uint64_t(v.d + v.block + int(v.t) + 2 * v.causal);
    auto c = make_attention_case(s);
    run_and_check(*c);
  }
}

// Every block in the layout: each sequence's rows are attention over that sequence alone.
TEST(AttentionPacked, EachSequenceAsIfAlone) {
  const std::vector<int64_t> lens = {70, 0, 1, 150, 33};
  for (bool causal : {false, true}) {
    AttnSpec s = small();
    s.packed(lens);
    s.kind = LayoutKind::dense;
    s.causal = causal;
    s.hq = 2, s.hkv = 1;
    auto packed = make_attention_case(s);
    Options cpu;
    cpu.backend = Backend::cpu;
    attention(packed->args, cpu);
    int64_t row0 = 0;
    for (int64_t n : lens) {
      if (n == 0) continue;
      AttnSpec one = small();
      one.batch = 1, one.hq = 2, one.hkv = 1, one.sq = one.skv = n;
      one.kind = LayoutKind::dense;
      one.causal = causal;
      auto alone = make_attention_case(one);
      for (auto [from, to] : {std::pair{&packed->q, &alone->q}, {&packed->k, &alone->k}, {&packed->v, &alone->v}})
        for (int64_t h = 0; h < to->view.h; ++h)
          for (int64_t r = 0; r < n; ++r)
            for (int64_t d = 0; d < one.d; ++d)
              store_from_float(to->view.data, to->view.dtype, to->view.index(0, h, r, d), from->at(0, h, row0 + r, d));
      attention(alone->args, cpu);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t d = 0; d < one.d; ++d)
            ASSERT_EQ(packed->o.at(0, h, row0 + r, d), alone->o.at(0, h, r, d))
                << "causal " << causal << " sequence at " << row0 << ", head " << h << ", row " << r << ", d " << d;
          ASSERT_EQ(packed->lse[size_t(h * s.sq + row0 + r)], alone->lse[size_t(h * n + r)]);
        }
      row0 += n;
    }
  }
}

TEST(AttentionPacked, BadArgumentsAreNamed) {
  AttnSpec s = small();
  s.packed({100, 200});
  auto c = make_attention_case(s);
  EXPECT_NO_THROW(validate(c->args, true));
  expect_bad(c->args, [](AttentionArgs& x) { x.num_seqs = 0; }, {"num_seqs = 0 with cu_seqlens given"});
  expect_bad(c->args, [](AttentionArgs& x) { x.cu_seqlens = nullptr; }, {"num_seqs = 2 but cu_seqlens is null"});
  auto two = make_attention_case(small());  // B = 2, Sq 200 != Skv 300
  int32_t cu[2] = {0, 200};
  expect_bad(two->args, [&](AttentionArgs& x) { x.cu_seqlens = cu, x.num_seqs = 1; },
             {"q.b = 2 with cu_seqlens: packed sequences are one batch row"});
  AttnSpec cross = small();
  cross.batch = 1;
  auto cr = make_attention_case(cross);
  expect_bad(cr->args, [&](AttentionArgs& x) { x.cu_seqlens = cu, x.num_seqs = 1; },
             {"q.s = 200 differs from k.s = 300 with cu_seqlens"});
  // cu_seqlens is an input: o and lse must not overlap it.
  expect_bad(c->args, [&](AttentionArgs& x) { x.lse = reinterpret_cast<float*>(c->cu_seqlens.data()); },
             {"lse overlaps cu_seqlens"});
  // Contents (checked with the layout's).
  auto contents = [&](std::vector<int32_t> cu_now, const std::string& msg) {
    c->cu_seqlens = cu_now;
    c->args.cu_seqlens = c->cu_seqlens.data();
    expect_invalid([&] { validate(c->args, true); }, {msg});
    expect_invalid([&] { attention(c->args); }, {msg});
  };
  contents({1, 100, 300}, "cu_seqlens[0] = 1 is not 0");
  contents({0, 301, 300}, "cu_seqlens[2] = 300 is less than cu_seqlens[1] = 301 (offsets never decrease)");
  contents({0, 100, 299}, "cu_seqlens[2] = 299 is not the packed length T = q.s = 300");
  // A plan made without packed sequences refuses them, and the reverse.
  c->cu_seqlens = {0, 100, 300};
  c->args.cu_seqlens = c->cu_seqlens.data();
  AttentionArgs plain = c->args;
  plain.cu_seqlens = nullptr, plain.num_seqs = 0;
  const AttentionPlan p = plan(plain);
  expect_invalid([&] { run(p, c->args); }, {"cu_seqlens is packed sequences (num_seqs = 2), the plan was made for no cu_seqlens"});
  const AttentionPlan pp = plan(c->args);
  AttentionArgs three = c->args;
  int32_t cu3[4] = {0, 100, 150, 300};
  three.cu_seqlens = cu3, three.num_seqs = 3;
  expect_invalid([&] { run(pp, three); }, {"num_seqs = 3", "num_seqs = 2"});
}

// A plan's run() reads cu_seqlens as given: new offsets are a new answer, malformed ones are not a crash.
TEST(AttentionPacked, PlansTakeNewOffsetsAndSurviveMalformedOnes) {
  AttnSpec s = small();
  s.packed({100, 200});
  auto c = make_attention_case(s);
  const AttentionPlan p = plan(c->args);
  for (std::vector<int32_t> cu : {std::vector<int32_t>{0, 100, 300}, {0, 250, 300}, {0, 0, 300}}) {
    c->cu_seqlens = cu;
    c->args.cu_seqlens = c->cu_seqlens.data();
    c->o.fill(std::numeric_limits<float>::quiet_NaN());
    const AttentionReference ref = attention_oracle(c->args);
    run(p, c->args);
    expect_matches(*c, ref, tol_o(s.dtype), 1e-5);
  }
  for (std::vector<int32_t> cu : {std::vector<int32_t>{5, -7, 1 << 30}, {INT32_MAX, INT32_MIN, 0}}) {
    c->cu_seqlens = cu;
    c->args.cu_seqlens = c->cu_seqlens.data();
    EXPECT_NO_THROW(run(p, c->args));
  }
}

TEST(AttentionPacked, FlopsCountOnlyTheSequencesOwnKeys) {
  AttnSpec s = hand_spec(128, 128, 1, 1, false);
  s.split_full = false;
  s.extra_kmax = 0;
  HandCase hc(s);  // a dense layout, 128 rows and keys
  int32_t cu[3] = {0, 28, 128};
  hc.c->args.cu_seqlens = cu, hc.c->args.num_seqs = 2;
  const double D4 = 4.0 * 64;
  EXPECT_DOUBLE_EQ(effective_flops(hc.c->args), D4 * (28.0 * 28 + 100 * 100));
  hc.c->args.causal = true;
  EXPECT_DOUBLE_EQ(effective_flops(hc.c->args), D4 * (28.0 * 29 / 2 + 100.0 * 101 / 2));
}

TEST(AttentionLayoutGenerator, TopkCausalAndDense) {
  LayoutArrays t = random_attention_layout(LayoutKind::topk, 1, 2, 1024, 1024, 128, 0.25, false, 3);
  EXPECT_EQ(t.q_blocks, 8);
  EXPECT_EQ(t.kmax, 2);
  EXPECT_TRUE(t.full_num.empty());
  for (int32_t n : t.num) EXPECT_EQ(n, 2);
  LayoutArrays c = random_attention_layout(LayoutKind::topk, 1, 1, 1024, 1024, 128, 0.25, true, 3);
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(c.num[size_t(i)], 1) << "only the diagonal block is masked";
    EXPECT_EQ(c.idx[size_t(i * c.kmax)], i);
    EXPECT_EQ(c.full_num[size_t(i)], std::min<int64_t>(i, 1)) << "the other kept block is below the diagonal";
  }
  LayoutArrays d = random_attention_layout(LayoutKind::causal, 1, 1, 300, 300, 64, 1.0, false, 3);
  for (int64_t i = 0; i < d.q_blocks; ++i) EXPECT_EQ(d.num[size_t(i)] + d.full_num[size_t(i)], i + 1);
  // Same seed, same layout.
  LayoutArrays again = random_attention_layout(LayoutKind::topk, 1, 2, 1024, 1024, 128, 0.25, false, 3);
  EXPECT_EQ(again.idx, t.idx);
}

// ---------------------------------------------------------------- C API

TEST(AttentionCapi, OneShotAndPlans) {
  AttnSpec s = small();
  s.causal = true;
  auto c = make_attention_case(s);
  const AttentionReference ref = attention_oracle(c->args);
  sparsek_attention_args ca = to_c(c->args);
  ASSERT_EQ(sparsek_attention(&ca, nullptr), SPARSEK_OK) << sparsek_last_error();
  expect_matches(*c, ref, tol_o(s.dtype), 1e-5);

  sparsek_attention_plan p = nullptr;
  ASSERT_EQ(sparsek_attention_plan_create(&p, &ca, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_STREQ(sparsek_attention_plan_variant(p), "cpu");
  uint64_t ws = 7;
  EXPECT_EQ(sparsek_attention_plan_workspace_bytes(p, &ws), SPARSEK_OK);
  EXPECT_EQ(ws, 0u);
  c->o.fill(std::numeric_limits<float>::quiet_NaN());
  ASSERT_EQ(sparsek_attention_plan_run(p, &ca, nullptr), SPARSEK_OK) << sparsek_last_error();
  expect_matches(*c, ref, tol_o(s.dtype), 1e-5);
  sparsek_attention_args other = ca;
  other.causal = 0;
  EXPECT_EQ(sparsek_attention_plan_run(p, &other, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("sparsek_attention_plan_run: run: args do not match the plan: causal"),
            std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_attention_plan_destroy(p), SPARSEK_OK);
  EXPECT_EQ(sparsek_attention_plan_destroy(nullptr), SPARSEK_OK);
}

// Packed sequences through the C API: the same bits as the C++ call (one shot and a plan), and a
// bad cu_seqlens gives the status and the message naming it.
TEST(AttentionCapi, PackedSequencesMatchTheCppCallAndNameBadOffsets) {
  AttnSpec s = small();
  s.packed({50, 1, 0, 130, 77});  // boundaries inside blocks, an empty and a one-token sequence
  s.causal = true;
  s.split_full = true;
  s.density = 0.7;
  auto c = make_attention_case(s);
  attention(c->args);
  const std::vector<uint8_t> o = c->o.bytes;
  const std::vector<float> lse = c->lse;
  auto poison = [&] {
    c->o.fill(std::numeric_limits<float>::quiet_NaN());
    std::fill(c->lse.begin(), c->lse.end(), std::numeric_limits<float>::quiet_NaN());
  };
  auto same_bits = [&](const char* what) {
    EXPECT_EQ(c->o.bytes, o) << what;
    EXPECT_EQ(0, std::memcmp(c->lse.data(), lse.data(), lse.size() * sizeof(float))) << what;
  };
  sparsek_attention_args ca = to_c(c->args);
  ASSERT_EQ(ca.num_seqs, 5);
  poison();
  ASSERT_EQ(sparsek_attention(&ca, nullptr), SPARSEK_OK) << sparsek_last_error();
  same_bits("sparsek_attention");
  sparsek_attention_plan p = nullptr;
  ASSERT_EQ(sparsek_attention_plan_create(&p, &ca, nullptr), SPARSEK_OK) << sparsek_last_error();
  poison();
  ASSERT_EQ(sparsek_attention_plan_run(p, &ca, nullptr), SPARSEK_OK) << sparsek_last_error();
  same_bits("sparsek_attention_plan_run");

  auto expect = [](sparsek_status st, sparsek_status want, const std::string& part) {
    EXPECT_EQ(st, want);
    EXPECT_NE(std::string(sparsek_last_error()).find(part), std::string::npos) << sparsek_last_error();
  };
  // The plan was made for 5 packed sequences: none, or another count, is a mismatch.
  sparsek_attention_args x = ca;
  x.cu_seqlens = nullptr, x.num_seqs = 0;
  expect(sparsek_attention_plan_run(p, &x, nullptr), SPARSEK_INVALID_ARGUMENT,
         "sparsek_attention_plan_run: run: args do not match the plan: cu_seqlens is no cu_seqlens, the plan was made "
         "for packed sequences (num_seqs = 5)");
  EXPECT_EQ(sparsek_attention_plan_destroy(p), SPARSEK_OK);
  x = ca;
  x.num_seqs = 0;
  expect(sparsek_attention(&x, nullptr), SPARSEK_INVALID_ARGUMENT,
         "sparsek_attention: num_seqs = 0 with cu_seqlens given");
  x = ca;
  x.cu_seqlens = nullptr;
  expect(sparsek_attention(&x, nullptr), SPARSEK_INVALID_ARGUMENT, "num_seqs = 5 but cu_seqlens is null");
  std::vector<int32_t> cu = c->cu_seqlens;
  cu.back() -= 1;
  x = ca;
  x.cu_seqlens = cu.data();
  expect(sparsek_attention(&x, nullptr), SPARSEK_INVALID_ARGUMENT,
         "cu_seqlens[5] = 257 is not the packed length T = q.s = 258");
  cu = c->cu_seqlens;
  cu[2] = 60;  // 0, 50, 60, 51, ...
  expect(sparsek_attention(&x, nullptr), SPARSEK_INVALID_ARGUMENT,
         "cu_seqlens[3] = 51 is less than cu_seqlens[2] = 60 (offsets never decrease)");
  // Packed sequences are one batch row.
  auto two = make_attention_case(small());
  int32_t cu2[2] = {0, 200};
  x = to_c(two->args);
  x.cu_seqlens = cu2, x.num_seqs = 1;
  expect(sparsek_attention(&x, nullptr), SPARSEK_INVALID_ARGUMENT, "q.b = 2 with cu_seqlens");
}

// A destroyed or foreign attention plan handle is reported, never dereferenced.
TEST(AttentionCapi, DestroyedAndForeignPlanHandlesAreDetected) {
  auto c = make_attention_case(small());
  sparsek_attention_args ca = to_c(c->args);
  sparsek_attention_plan p = nullptr;
  ASSERT_EQ(sparsek_attention_plan_create(&p, &ca, nullptr), SPARSEK_OK) << sparsek_last_error();
  ASSERT_EQ(sparsek_attention_plan_run(p, &ca, nullptr), SPARSEK_OK) << sparsek_last_error();
  ASSERT_EQ(sparsek_attention_plan_destroy(p), SPARSEK_OK);
  EXPECT_EQ(sparsek_attention_plan_run(p, &ca, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("is not a live plan (already destroyed, or not made by "
                                                   "sparsek_attention_plan_create)"),
            std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_attention_plan_destroy(p), SPARSEK_INVALID_ARGUMENT);
  uint64_t ws = 7;
  EXPECT_EQ(sparsek_attention_plan_workspace_bytes(p, &ws), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(ws, 7u);
  EXPECT_STREQ(sparsek_attention_plan_variant(p), "");
  float not_a_plan[16] = {};
  sparsek_attention_plan foreign = reinterpret_cast<sparsek_attention_plan>(not_a_plan);
  EXPECT_EQ(sparsek_attention_plan_run(foreign, &ca, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(sparsek_attention_plan_destroy(foreign), SPARSEK_INVALID_ARGUMENT);
  EXPECT_STREQ(sparsek_attention_plan_variant(foreign), "");
}

TEST(AttentionCapi, BadInputGivesStatusAndMessage) {
  auto c = make_attention_case(small());
  sparsek_attention_args ca = to_c(c->args);
  auto expect = [](sparsek_status st, sparsek_status want, const std::string& part) {
    EXPECT_EQ(st, want);
    EXPECT_NE(std::string(sparsek_last_error()).find(part), std::string::npos) << sparsek_last_error();
  };
  expect(sparsek_attention(nullptr, nullptr), SPARSEK_INVALID_ARGUMENT, "sparsek_attention: argument 'args' is NULL");
  sparsek_attention_args x = ca;
  x.causal = 2;
  expect(sparsek_attention(&x, nullptr), SPARSEK_INVALID_ARGUMENT, "causal = 2 is not 0 or 1");
  x = ca;
  std::memset(&x.q.dtype, 0x7f, sizeof x.q.dtype);
  expect(sparsek_attention(&x, nullptr), SPARSEK_INVALID_ARGUMENT, "q dtype");
  x = ca;
  x.layout.kmax = -4;
  expect(sparsek_attention(&x, nullptr), SPARSEK_INVALID_ARGUMENT, "layout.kmax = -4 is negative");
  sparsek_attention_plan p = reinterpret_cast<sparsek_attention_plan>(0x1);
  expect(sparsek_attention_plan_create(&p, nullptr, nullptr), SPARSEK_INVALID_ARGUMENT, "argument 'problem' is NULL");
  EXPECT_EQ(p, nullptr) << "a failed create leaves NULL";
  expect(sparsek_attention_plan_create(&p, &ca, "nope"), SPARSEK_INVALID_ARGUMENT, "options.variant 'nope'");
  expect(sparsek_attention_plan_run(nullptr, &ca, nullptr), SPARSEK_INVALID_ARGUMENT, "argument 'plan' is NULL");
  uint64_t ws = 0;
  expect(sparsek_attention_plan_workspace_bytes(nullptr, &ws), SPARSEK_INVALID_ARGUMENT, "argument 'plan' is NULL");
  EXPECT_STREQ(sparsek_attention_plan_variant(nullptr), "");
  // A device problem on a machine without a GPU: no_device, not a crash.
  if (!device_info().available) {
    x = ca;
    x.q.memory = x.k.memory = x.v.memory = x.o.memory = x.layout.memory = SPARSEK_DEVICE;
    x.q.dtype = x.k.dtype = x.v.dtype = x.o.dtype = SPARSEK_BF16;
    expect(sparsek_attention(&x, nullptr), sparsek_status(no_gpu_status()), no_gpu_text("no CUDA device answers"));
  }
}

}  // namespace
}  // namespace sparsek::test
