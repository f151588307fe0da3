// Decode attention on the CPU backend against the fp64 oracle: ragged batches (1- and 16-token
// requests), selections (empty ones too), a request of one page, last pages not full, shuffled
// physical pages, GQA 1/4/8, D 64/128, page sizes 16..128 (48 too), f32/f16/bf16, strided q and o,
// without causal_new, bit-identical repeats over thread counts; and the named errors of validate(),
// plan() and run(). The C API: decode attention and page selection (against the C++ calls).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "decode_util.hpp"
#include "page_select_util.hpp"
#include "sparsek/sparsek.h"

namespace sparsek::test {
namespace {

Options cpu(int threads = 0) {
  Options o;
  o.backend = Backend::cpu;
  o.threads = threads;
  return o;
}

void check(const DecodeSpec& s) {
  SCOPED_TRACE(s.name());
  DecodeCase c = make_decode_case(s);
  const DecodeReference ref = decode_oracle(c.args);
  decode_attention(c.args, cpu());
  expect_decode_matches(c, ref, decode_tol_o(s.dtype), s.dtype == DType::f32 ? 1e-5 : 1e-4);
}

TEST(Decode, RaggedBatchesOverShapes) {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{8, 2}, std::pair{8, 1}}) {
        DecodeSpec s;
        s.dtype = t, s.d = d, s.hq = hq, s.hkv = hkv;
        s.new_tokens = {1, 16, 4, 1};
        s.seq_lens = {1, 16 + 37, 200, 96};  // a 1-token request (one page), last pages part full
        s.seed = uint64_t(d + hq * 10 + int(t));
        check(s);
      }
}

TEST(Decode, PageSizes) {
  for (int ps : {16, 32, 48, 64, 128}) {
    DecodeSpec s;
    s.page_size = ps;
    s.new_tokens = {2, 1, 16};
    s.seq_lens = {ps, 5 * ps + 3, 2 * ps - 1};
    s.seed = uint64_t(ps);
    check(s);
  }
}

TEST(Decode, Selections) {
  for (double frac : {0.0, 0.3, 1.0})
    for (int d : {64, 128}) {
      DecodeSpec s;
      s.d = d, s.hq = 8, s.hkv = 2, s.page_size = 16;
      s.new_tokens = {1, 16, 5};
      s.seq_lens = {400, 300, 17};
      s.sel_frac = frac;
      s.empty_heads = {1, 4};  // (request 0, head 1) and (request 2, head 0) select nothing
      s.dtype = DType::bf16;
      s.seed = uint64_t(frac * 100 + d);
      check(s);
    }
}

// All rows of a head see nothing: LSE -inf and O exactly 0 (checked in expect_decode_matches).
TEST(Decode, EmptySelectionEverywhere) {
  DecodeSpec s;
  s.sel_frac = 0.5;
  s.hkv = 2;
  s.empty_heads = {0, 1, 2, 3, 4, 5};
  DecodeCase c = make_decode_case(s);
  const DecodeReference ref = decode_oracle(c.args);
  for (double l : ref.lse) EXPECT_TRUE(std::isinf(l) && l < 0);
  decode_attention(c.args, cpu());
  expect_decode_matches(c, ref, 0.0, 0.0);
}

// Selected pages after a new token's position (with causal_new) are masked for it: with a
// selection holding only the newest page and 16 new tokens that straddle two pages, the first
// tokens see nothing.
TEST(Decode, CausalMaskInsideSelection) {
  DecodeSpec s;
  s.new_tokens = {16};
  s.seq_lens = {40};  // pages 0..2 (page 32: page 1 holds 32..39); new tokens are 24..39
  s.sel_frac = 0.0;   // the newest page alone
  DecodeCase c = make_decode_case(s);
  const DecodeReference ref = decode_oracle(c.args);
  EXPECT_TRUE(std::isinf(ref.lse[0]));              // token 24 sees no position >= 32
  EXPECT_FALSE(std::isinf(ref.lse[size_t(15 * 4)]));  // token 39 sees 32..39
  decode_attention(c.args, cpu());
  expect_decode_matches(c, ref, decode_tol_o(s.dtype), 1e-5);
}

TEST(Decode, NotCausalAndScaleAndStrides) {
  DecodeSpec s;
  s.causal = false;
  s.scale = 0.3f;
  s.q_pad = 8;
  s.lse = false;
  s.dtype = DType::f16;
  check(s);
  s.lse = true;
  s.causal = true;
  check(s);
}

// K and V interleaved per page in one buffer ([pages, 2, page_size, Hkv, D]).
TEST(Decode, CombinedKvBuffer) {
  for (double frac : {-1.0, 0.5}) {
    DecodeSpec s;
    s.kv_combined = true;
    s.hq = 8, s.hkv = 2, s.d = 128, s.page_size = 16;
    s.new_tokens = {1, 16, 4};
    s.seq_lens = {200, 100, 33};
    s.sel_frac = frac;
    s.dtype = DType::f16;
    check(s);
  }
}

// The selection of every page gives the bits of no selection; any thread count gives the same bits.
TEST(Decode, BitIdentical) {
  DecodeSpec s;
  s.hq = 8, s.hkv = 2, s.new_tokens = {16, 1, 7, 2}, s.seq_lens = {500, 33, 128, 7};
  s.sel_frac = 1.0;
  s.dtype = DType::bf16;
  DecodeCase c = make_decode_case(s);
  decode_attention(c.args, cpu(1));
  const std::vector<uint8_t> o1 = c.o;
  const std::vector<float> l1 = c.lse;
  for (int threads : {1, 3, 8}) {
    c.poison_outputs();
    decode_attention(c.args, cpu(threads));
    EXPECT_EQ(c.o, o1) << threads << " threads";
    EXPECT_EQ(0, std::memcmp(c.lse.data(), l1.data(), l1.size() * 4)) << threads << " threads";
  }
  DecodeArgs all = c.args;
  all.sel_indices = nullptr, all.sel_counts = nullptr, all.sel_kmax = 0;
  c.poison_outputs();
  decode_attention(all, cpu(2));
  EXPECT_EQ(c.o, o1);
  EXPECT_EQ(0, std::memcmp(c.lse.data(), l1.data(), l1.size() * 4));
}

// A plan runs with new contents (a new page table, new lengths and selection) of the same extents.
TEST(Decode, PlanRunsNewContents) {
  DecodeSpec s;
  s.sel_frac = 0.5;
  DecodeCase c = make_decode_case(s);
  const DecodePlan p = plan(c.args, cpu());
  EXPECT_EQ(p.backend(), Backend::cpu);
  EXPECT_EQ(p.variant(), "cpu");
  s.seed = 9;
  DecodeCase c2 = make_decode_case(s);
  ASSERT_EQ(c2.args.max_pages, c.args.max_pages);
  ASSERT_EQ(c2.args.k.pages, c.args.k.pages);
  run(p, c2.args);
  expect_decode_matches(c2, decode_oracle(c2.args), decode_tol_o(s.dtype), 1e-5);
}

// ---- errors ----

void expect_error(const DecodeArgs& a, const std::string& needle, Status st = Status::invalid_argument) {
  try {
    decode_attention(a, cpu());
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), st) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

struct DecodeErrors : ::testing::Test {
  DecodeSpec s;
  DecodeCase c;
  void SetUp() override {
    s.hq = 4, s.hkv = 2, s.new_tokens = {1, 4}, s.seq_lens = {70, 40}, s.sel_frac = 0.5;
    c = make_decode_case(s);
    c.bind();
  }
};

TEST_F(DecodeErrors, PageTable) {
  c.page_table[1] = int32_t(c.args.k.pages);  // request 0, page 1 (read: 70 tokens are 3 pages)
  expect_error(c.args, "page_table[0, 1] = " + std::to_string(c.args.k.pages) + " is out of range");
  c.page_table[1] = -1;
  expect_error(c.args, "page_table[0, 1] = -1");
}

TEST_F(DecodeErrors, SeqLens) {
  c.seq_lens[1] = int32_t(c.args.max_pages * 32 + 1);
  expect_error(c.args, "seq_lens[1] = " + std::to_string(c.args.max_pages * 32 + 1) + " is beyond");
  c.seq_lens[1] = 3;  // 4 new tokens
  expect_error(c.args, "seq_lens[1] = 3 is less than the request's 4 new tokens");
}

TEST_F(DecodeErrors, CuSeqlens) {
  c.cu = {0, 1, 1};
  c.bind();
  expect_error(c.args, "request 1 has 0 new tokens");
  c.cu = {1, 1, 5};
  c.bind();
  expect_error(c.args, "cu_seqlens_q[0] = 1");
  c.cu = {0, 3, 2};
  c.bind();
  expect_error(c.args, "request 1 has -1 new tokens");
  c.cu = {0, 1, 4};
  c.bind();
  expect_error(c.args, "cu_seqlens_q[2] = 4 differs from q.t = 5");
}

TEST_F(DecodeErrors, TooManyNewTokens) {
  DecodeSpec t = s;
  t.new_tokens = {1, 17};
  t.seq_lens = {70, 40};
  DecodeCase d = make_decode_case(t);
  expect_error(d.args, "request 1 has 17 new tokens");
}

TEST_F(DecodeErrors, Selection) {
  c.sel_cnt[0] = -1;
  expect_error(c.args, "sel_counts[0, 0] = -1 is out of range");
  c.sel_cnt[0] = int32_t(c.args.sel_kmax + 1);
  expect_error(c.args, "sel_counts[0, 0] = " + std::to_string(c.args.sel_kmax + 1));
  const int64_t k = c.args.sel_kmax;
  c.sel_cnt[0] = 2, c.sel_idx[0] = 1, c.sel_idx[1] = 0;
  expect_error(c.args, "sel_indices[0, 0, 1] = 0 is below the entry before it");
  c.sel_idx[1] = 1;
  expect_error(c.args, "sel_indices[0, 0, 1] = 1 repeats");
  c.sel_idx[1] = 3;  // request 0 has pages 0..2
  expect_error(c.args, "sel_indices[0, 0, 1] = 3 is out of range [0, 3)");
  (void)k;
  DecodeArgs a = c.args;
  a.sel_counts = nullptr;
  expect_error(a, "sel_indices and sel_counts go together");
}

TEST_F(DecodeErrors, ShapesDtypesStrides) {
  DecodeArgs a = c.args;
  a.q.d = 96, a.o.d = 96, a.k.d = 96, a.v.d = 96;
  expect_error(a, "q.d = 96 is not supported");
  a = c.args;
  a.k.page_size = 24, a.v.page_size = 24;
  expect_error(a, "k.page_size = 24 is not supported");
  a = c.args;
  a.v.dtype = DType::bf16;
  expect_error(a, "v dtype bf16 differs from q dtype f32");
  a = c.args;
  a.v.stride_slot += 1;
  expect_error(a, "v.stride_slot");
  a = c.args;
  a.q.stride_h = 32;  // D = 64: heads overlap
  expect_error(a, "q.stride_h = 32 overlaps");
  a = c.args;
  a.k.h = 3, a.v.h = 3;
  expect_error(a, "q.h = 4 is not a multiple of k.h = 3");
  a = c.args;
  a.o.t = 4;
  expect_error(a, "o is [4, 4, 64]");
  a = c.args;
  a.page_table = nullptr;
  expect_error(a, "page_table is null");
  a = c.args;
  a.index_memory = Memory::device;
  expect_error(a, "index_memory");
  a = c.args;
  a.o.data = a.q.data;
  expect_error(a, "o overlaps q");
  a = c.args;
  a.q.t = 40, a.o.t = 40;
  expect_error(a, "q.t = 40 new tokens cannot be 1..16 per request for batch = 2");
}

TEST_F(DecodeErrors, PlanMismatchAndEmptyPlan) {
  const DecodePlan p = plan(c.args, cpu());
  DecodeArgs a = c.args;
  a.max_pages -= 1;
  try {
    run(p, a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_pages"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run(DecodePlan(), c.args), Error);
  Options o = cpu();
  o.variant = "cuda";
  EXPECT_THROW(plan(c.args, o), Error);
}

// run() does not check contents: malformed ones give wrong values, never a crash.
TEST_F(DecodeErrors, MalformedContentsThroughRun) {
  const DecodePlan p = plan(c.args, cpu());
  c.page_table[0] = 1 << 30;
  c.seq_lens[0] = 1 << 30;
  c.sel_cnt[1] = 1 << 30;
  c.sel_idx[0] = -5;
  c.cu = {0, 30, 2};
  c.bind();
  run(p, c.args);
  SUCCEED();
}


// ---- the C API ----

sparsek_tokens to_c(const TokensView& t) {
  sparsek_tokens x{};
  x.data = t.data, x.dtype = sparsek_dtype(int(t.dtype)), x.memory = sparsek_memory(int(t.memory));
  x.t = t.t, x.h = t.h, x.d = t.d, x.stride_t = t.stride_t, x.stride_h = t.stride_h;
  return x;
}
sparsek_paged_cache to_c(const PagedCacheView& t) {
  sparsek_paged_cache x{};
  x.data = t.data, x.dtype = sparsek_dtype(int(t.dtype)), x.memory = sparsek_memory(int(t.memory));
  x.pages = t.pages, x.page_size = t.page_size, x.h = t.h, x.d = t.d;
  x.stride_page = t.stride_page, x.stride_slot = t.stride_slot, x.stride_h = t.stride_h;
  return x;
}

sparsek_decode_args to_c(const DecodeArgs& a) {
  sparsek_decode_args c{};
  c.q = to_c(a.q), c.o = to_c(a.o), c.k = to_c(a.k), c.v = to_c(a.v), c.lse = a.lse;
  c.page_table = a.page_table, c.seq_lens = a.seq_lens, c.cu_seqlens_q = a.cu_seqlens_q;
  c.sel_indices = a.sel_indices, c.sel_counts = a.sel_counts;
  c.batch = a.batch, c.max_pages = a.max_pages, c.sel_kmax = a.sel_kmax;
  c.index_memory = sparsek_memory(int(a.index_memory));
  c.causal_new = a.causal_new ? 1 : 0;
  c.scale = a.scale;
  return c;
}

sparsek_page_select_args to_c(const PageSelectArgs& a) {
  sparsek_page_select_args c{};
  c.q = to_c(a.q), c.k = to_c(a.k), c.summaries = a.summaries;
  c.page_table = a.page_table, c.seq_lens = a.seq_lens, c.cu_seqlens_q = a.cu_seqlens_q;
  c.batch = a.batch, c.max_pages = a.max_pages;
  c.index_memory = sparsek_memory(int(a.index_memory));
  c.sel_indices = a.sel_indices, c.sel_counts = a.sel_counts, c.sel_kmax = a.sel_kmax;
  c.topk = a.topk, c.sink = a.sink, c.local = a.local;
  c.all_pages = a.all_pages ? 1 : 0;
  return c;
}

TEST(DecodeCApi, OneShotPlanAndErrors) {
  DecodeSpec s;
  s.dtype = DType::bf16, s.hq = 8, s.hkv = 2, s.sel_frac = 0.5;
  DecodeCase c = make_decode_case(s);
  const DecodeReference ref = decode_oracle(c.args);
  sparsek_decode_args a = to_c(c.args);
  ASSERT_EQ(sparsek_decode_attention(&a, nullptr), SPARSEK_OK) << sparsek_last_error();
  expect_decode_matches(c, ref, decode_tol_o(s.dtype), 1e-4);

  c.poison_outputs();
  sparsek_decode_plan p = nullptr;
  ASSERT_EQ(sparsek_decode_plan_create(&p, &a, 0), SPARSEK_OK) << sparsek_last_error();
  int32_t splits = -1;
  uint64_t ws = 1;
  ASSERT_EQ(sparsek_decode_plan_info(p, &splits, &ws), SPARSEK_OK);
  EXPECT_EQ(splits, 1);
  EXPECT_EQ(ws, 0u);
  ASSERT_EQ(sparsek_decode_plan_run(p, &a, nullptr), SPARSEK_OK) << sparsek_last_error();
  expect_decode_matches(c, ref, decode_tol_o(s.dtype), 1e-4);
  EXPECT_EQ(sparsek_decode_plan_destroy(p), SPARSEK_OK);
  EXPECT_EQ(sparsek_decode_plan_run(p, &a, nullptr), SPARSEK_INVALID_ARGUMENT);  // destroyed
  EXPECT_NE(std::string(sparsek_last_error()).find("not a live plan"), std::string::npos) << sparsek_last_error();

  EXPECT_EQ(sparsek_decode_attention(nullptr, nullptr), SPARSEK_INVALID_ARGUMENT);
  sparsek_decode_args b = a;
  b.causal_new = 2;
  EXPECT_EQ(sparsek_decode_attention(&b, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("causal_new = 2"), std::string::npos) << sparsek_last_error();
  b = a;
  b.index_memory = sparsek_memory(7);
  EXPECT_EQ(sparsek_decode_attention(&b, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("index_memory memory = 7"), std::string::npos) << sparsek_last_error();
  c.page_table[0] = -3;
  EXPECT_EQ(sparsek_decode_attention(&a, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("page_table[0, 0] = -3"), std::string::npos) << sparsek_last_error();
  EXPECT_EQ(sparsek_decode_plan_create(&p, &a, 65), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
}

void expect_c_error(sparsek_status got, sparsek_status want, const std::string& needle) {
  EXPECT_EQ(got, want) << sparsek_last_error();
  EXPECT_NE(std::string(sparsek_last_error()).find(needle), std::string::npos) << sparsek_last_error();
}

// The C calls give the C++ calls' summaries and selection (bit for bit: the same CPU code) on a
// ragged GQA batch, then the named errors.
TEST(PageSelectCApi, MatchesTheCppCallsAndNamesErrors) {
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 64, s.hq = 8, s.hkv = 2, s.page_size = 16, s.seed = 11;
  s.new_tokens = {1, 4, 2}, s.seq_lens = {1, 16 * 9 + 3, 16 * 5};
  PageSelectCase want = make_page_select_case(s, 2, 1, 1, true);
  want.args.all_pages = true;
  update_page_summaries(want.args, cpu());
  select_pages(want.args, cpu());
  expect_summaries(want, want.summaries, true);
  expect_selection(want, want.sel_idx, want.sel_cnt, true);

  PageSelectCase c = make_page_select_case(s, 2, 1, 1, true);
  c.args.all_pages = true;
  sparsek_page_select_args a = to_c(c.args);
  ASSERT_EQ(sparsek_update_page_summaries(&a, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(c.summaries, want.summaries);
  ASSERT_EQ(sparsek_select_pages(&a, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(c.sel_idx, want.sel_idx);
  EXPECT_EQ(c.sel_cnt, want.sel_cnt);
  // Unchecked: the same results.
  c.poison_summaries();
  c.poison_selection();
  a.skip_index_check = 1;
  ASSERT_EQ(sparsek_update_page_summaries(&a, nullptr), SPARSEK_OK) << sparsek_last_error();
  ASSERT_EQ(sparsek_select_pages(&a, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(c.summaries, want.summaries);
  EXPECT_EQ(c.sel_idx, want.sel_idx);
  EXPECT_EQ(c.sel_cnt, want.sel_cnt);
  a.skip_index_check = 0;
  // Only the new tokens' pages: the others keep their poison.
  c.poison_summaries();
  a.all_pages = 0;
  ASSERT_EQ(sparsek_update_page_summaries(&a, nullptr), SPARSEK_OK) << sparsek_last_error();
  expect_summaries(c, c.summaries, false);

  expect_c_error(sparsek_select_pages(nullptr, nullptr), SPARSEK_INVALID_ARGUMENT,
                 "sparsek_select_pages: argument 'args' is NULL");
  expect_c_error(sparsek_update_page_summaries(nullptr, nullptr), SPARSEK_INVALID_ARGUMENT,
                 "sparsek_update_page_summaries: argument 'args' is NULL");
  sparsek_page_select_args b = a;
  b.sel_kmax = 3;  // topk + sink + local = 4 pages fit every request's max_pages
  expect_c_error(sparsek_select_pages(&b, nullptr), SPARSEK_INVALID_ARGUMENT,
                 "sel_kmax = 3 is out of range [min(max_pages, topk + sink + local) = 4");
  b = a;
  b.sel_counts = nullptr;
  expect_c_error(sparsek_select_pages(&b, nullptr), SPARSEK_INVALID_ARGUMENT, "select_pages: sel_counts is null");
  b = a;
  b.summaries = nullptr;
  expect_c_error(sparsek_update_page_summaries(&b, nullptr), SPARSEK_INVALID_ARGUMENT,
                 "update_page_summaries: summaries is null");
  b = a;
  b.all_pages = 2;
  expect_c_error(sparsek_update_page_summaries(&b, nullptr), SPARSEK_INVALID_ARGUMENT, "all_pages = 2 is not 0 or 1");
  b = a;
  b.skip_index_check = -1;
  expect_c_error(sparsek_select_pages(&b, nullptr), SPARSEK_INVALID_ARGUMENT, "skip_index_check = -1 is not 0 or 1");
  b = a;
  b.index_memory = sparsek_memory(7);
  expect_c_error(sparsek_select_pages(&b, nullptr), SPARSEK_INVALID_ARGUMENT, "index_memory memory = 7");
  // Contents: checked by default, not with skip_index_check (the call then stays in bounds).
  c.dc.page_table[0] = 100000;
  expect_c_error(sparsek_select_pages(&a, nullptr), SPARSEK_INVALID_ARGUMENT,
                 "sparsek_select_pages: select_pages: page_table[0, 0] = 100000 is out of range");
  a.skip_index_check = 1;
  EXPECT_EQ(sparsek_select_pages(&a, nullptr), SPARSEK_OK) << sparsek_last_error();
}

}  // namespace
}  // namespace sparsek::test
