// Page selection on the CPU backend against a brute-force double reference: the summaries (every
// page, or only the new tokens' pages; unstored slots poisoned, untouched pages must keep their
// poison), the selection (integer data: exactly the reference's, ties to the lower page; real data:
// up to near ties) over GQA 1/4/8, 1..16 new tokens, D 64/128, page sizes 16..128, f32/f16/bf16,
// sink/local/topk corners; a selection decode_attention() accepts; bit-identical over thread counts;
// and the named errors.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "page_select_util.hpp"

namespace sparsek::test {
namespace {

Options cpu(int threads = 0) {
  Options o;
  o.backend = Backend::cpu;
  o.threads = threads;
  return o;
}

DecodeSpec spec(DType t, int d, int hq, int hkv, int ps, uint64_t seed) {
  DecodeSpec s;
  s.dtype = t, s.d = d, s.hq = hq, s.hkv = hkv, s.page_size = ps, s.seed = seed;
  s.new_tokens = {1, 16, 4, 1, 3};
  s.seq_lens = {1, 16 * ps + 5, 9 * ps, 40 * ps - 1, 2 * ps + 2};  // one page; a new page; a full last page
  return s;
}

void run_case(const DecodeSpec& s, int64_t topk, int64_t sink, int64_t local, bool integers) {
  SCOPED_TRACE(s.name() + " topk=" + std::to_string(topk) + " sink=" + std::to_string(sink) +
               " local=" + std::to_string(local) + (integers ? " integers" : " reals"));
  PageSelectCase c = make_page_select_case(s, topk, sink, local, integers);
  c.args.all_pages = true;
  update_page_summaries(c.args, cpu());
  expect_summaries(c, c.summaries, true);
  select_pages(c.args, cpu());
  expect_selection(c, c.sel_idx, c.sel_cnt, integers);
}

TEST(PageSelect, IntegerDataSelectsExactlyOverShapes) {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{8, 2}, std::pair{8, 1}})
        run_case(spec(t, d, hq, hkv, 32, uint64_t(d + 7 * hq + int(t))), 3, 1, 1, true);
}

TEST(PageSelect, RealDataUpToNearTies) {
  for (DType t : {DType::f32, DType::bf16})
    for (int ps : {16, 64, 128}) run_case(spec(t, 128, 8, 2, ps, uint64_t(ps)), 5, 1, 2, false);
}

TEST(PageSelect, TopkSinkLocalCorners) {
  const DecodeSpec s = spec(DType::f32, 64, 4, 2, 16, 3);
  for (auto [topk, sink, local] : {std::tuple{0, 0, 0}, std::tuple{0, 1, 1}, std::tuple{1, 0, 0},
                                   std::tuple{1000, 0, 0}, std::tuple{4, 3, 0}, std::tuple{4, 0, 3},
                                   std::tuple{2, 30, 30}})
    run_case(s, topk, sink, local, true);
}

TEST(PageSelect, AllEqualScoresGoToTheLowerPages) {
  DecodeSpec s = spec(DType::f32, 64, 2, 1, 16, 9);
  PageSelectCase c = make_page_select_case(s, 3, 0, 0, true);
  for (size_t i = 0; i < c.dc.q.size() / 4; ++i) store_from_float(c.dc.q.data(), DType::f32, int64_t(i), 1.f);
  for (size_t i = 0; i < c.summaries.size() / 4; ++i) store_from_float(c.summaries.data(), DType::f32, int64_t(i), 2.f);
  select_pages(c.args, cpu());
  for (int64_t b = 0; b < c.args.batch; ++b) {
    const int64_t np = (c.dc.seq_lens[size_t(b)] + 15) / 16;
    ASSERT_EQ(c.sel_cnt[size_t(b)], std::min<int64_t>(np, 3));
    for (int64_t e = 0; e < c.sel_cnt[size_t(b)]; ++e) EXPECT_EQ(c.sel_idx[size_t(b * c.args.sel_kmax + e)], e);
  }
}

TEST(PageSelect, UpdateTouchesOnlyTheNewTokensPages) {
  for (int ps : {16, 32}) {
    // 16 new tokens with page_size 16 cross into a second page unless aligned: both cases.
    DecodeSpec s = spec(DType::bf16, 64, 4, 2, ps, uint64_t(ps) + 1);
    s.seq_lens = {1, 16 * ps + 5, 9 * ps, 40 * ps - 1, 2 * ps + 2};
    PageSelectCase c = make_page_select_case(s, 2, 1, 1, false);
    update_page_summaries(c.args, cpu());
    expect_summaries(c, c.summaries, false);
  }
}

TEST(PageSelect, TheSelectionFeedsDecodeAttention) {
  PageSelectCase c = make_page_select_case(spec(DType::f32, 128, 8, 2, 32, 5), 4, 1, 1, false);
  c.args.all_pages = true;
  update_page_summaries(c.args, cpu());
  select_pages(c.args, cpu());
  DecodeArgs d = c.dc.args;
  d.sel_indices = c.sel_idx.data(), d.sel_counts = c.sel_cnt.data(), d.sel_kmax = c.args.sel_kmax;
  validate(d, true);  // sorted, unique, in range
  decode_attention(d, cpu());
  const DecodeReference ref = decode_oracle(d);
  expect_decode_matches(c.dc, ref, 1e-5, 1e-5);
}

TEST(PageSelect, BitIdenticalOverThreadCounts) {
  PageSelectCase c = make_page_select_case(spec(DType::bf16, 128, 8, 2, 16, 4), 6, 1, 1, false);
  c.args.all_pages = true;
  update_page_summaries(c.args, cpu(1));
  const std::vector<uint8_t> sum1 = c.summaries;
  select_pages(c.args, cpu(1));
  const std::vector<int32_t> idx1 = c.sel_idx, cnt1 = c.sel_cnt;
  for (int threads : {2, 3, 8}) {
    c.poison_summaries();
    c.poison_selection();
    update_page_summaries(c.args, cpu(threads));
    select_pages(c.args, cpu(threads));
    EXPECT_EQ(c.summaries, sum1) << threads << " threads";
    EXPECT_EQ(c.sel_idx, idx1) << threads << " threads";
    EXPECT_EQ(c.sel_cnt, cnt1) << threads << " threads";
  }
}

void expect_error(const PageSelectArgs& a, PageOp op, const std::string& want, const Options& o = cpu()) {
  try {
    op == PageOp::select ? select_pages(a, o) : update_page_summaries(a, o);
    ADD_FAILURE() << "no error, expected: " << want;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(PageSelect, ErrorsNameTheArgumentAndValue) {
  PageSelectCase c = make_page_select_case(spec(DType::f32, 64, 4, 2, 16, 2), 2, 1, 1, true);
  const PageSelectArgs good = c.args;
  auto with = [&](auto edit) {
    PageSelectArgs a = good;
    edit(a);
    return a;
  };
  expect_error(with([](auto& a) { a.summaries = nullptr; }), PageOp::select, "select_pages: summaries is null");
  expect_error(with([](auto& a) { a.k.data = nullptr; }), PageOp::update_summaries,
               "update_page_summaries: k.data is null");
  expect_error(with([](auto& a) { a.sel_counts = nullptr; }), PageOp::select, "select_pages: sel_counts is null");
  expect_error(with([](auto& a) { a.topk = -1; }), PageOp::select, "topk = -1 is out of range");
  expect_error(with([](auto& a) { a.sel_kmax = 3; }), PageOp::select,
               "sel_kmax = 3 is out of range [min(max_pages, topk + sink + local) = 4");
  expect_error(with([](auto& a) { a.q.h = 3; }), PageOp::select, "q.h = 3 is not a multiple of k.h = 2");
  expect_error(with([](auto& a) { a.q.dtype = DType::bf16; }), PageOp::select, "q dtype bf16 differs from k dtype f32");
  expect_error(with([](auto& a) { a.k.page_size = 24; }), PageOp::select, "k.page_size = 24 is not supported");
  expect_error(with([&](auto& a) { a.sel_counts = c.dc.seq_lens.data(); }), PageOp::select,
               "sel_counts overlaps seq_lens");
  expect_error(with([&](auto& a) { a.summaries = c.dc.k.data(); }), PageOp::update_summaries, "summaries overlaps k");
  expect_error(with([](auto& a) { a.index_memory = Memory::device; }), PageOp::select,
               "the index arrays (index_memory) are in device memory, k in host");
  Options v = cpu();
  v.variant = "cuda";
  expect_error(good, PageOp::select, "select_pages: variant 'cuda' does not exist for the cpu backend", v);
  // Contents.
  c.dc.page_table[0] = 100000;
  expect_error(good, PageOp::select, "select_pages: page_table[0, 0] = 100000 is out of range");
  c.dc.page_table[0] = 0;
  c.dc.cu[1] = 0;
  expect_error(good, PageOp::update_summaries, "update_page_summaries: request 0 has 0 new tokens");
}

TEST(PageSelect, MalformedContentsWithoutChecksStayInBounds) {
  PageSelectCase c = make_page_select_case(spec(DType::f32, 64, 4, 2, 16, 6), 2, 1, 1, false);
  Options o = cpu();
  o.check_indices = false;
  c.dc.page_table[0] = -5;                 // a page outside the cache: skipped
  c.dc.seq_lens[1] = 1 << 30;              // clamped to max_pages * page_size
  c.dc.cu[2] = c.dc.cu[1] - 3;             // a negative count: clamped to 0
  c.args.all_pages = true;
  update_page_summaries(c.args, o);
  select_pages(c.args, o);
  for (int32_t n : c.sel_cnt) EXPECT_TRUE(n >= 0 && n <= c.args.sel_kmax) << n;
}

}  // namespace
}  // namespace sparsek::test
