// The persistent Hopper product schedule (src/plan/schedule.cpp), checked on the host: every
// (block row, N tile) is covered exactly once (split items by contiguous pieces in slot order),
// lists are balanced, and the order rules hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "plan/schedule.hpp"

namespace sparsek {
namespace {

std::vector<int32_t> row_ptr_of(const std::vector<int>& lens) {
  std::vector<int32_t> rp(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) rp[i + 1] = rp[i] + lens[i];
  return rp;
}

// Checks coverage: each (row, n0) appears as one whole item or as pieces that tile
// [row_ptr[r], row_ptr[r+1]) in slot order; returns the per-list costs.
std::vector<int64_t> check_cover(const Schedule& s, const std::vector<int32_t>& rp, int64_t n, int bn, int kslices) {
  const int64_t mb = int64_t(rp.size()) - 1, tiles = (n + bn - 1) / bn;
  EXPECT_EQ(s.cta_items.front(), 0);
  EXPECT_EQ(s.cta_items.back(), int(s.items.size()));
  EXPECT_TRUE(std::is_sorted(s.cta_items.begin(), s.cta_items.end()));
  if (!s.groups.empty()) EXPECT_EQ(s.slot_of.size(), s.items.size());
  std::map<std::pair<int, int>, std::vector<std::tuple<int, int, int>>> pieces;  // (row, n0) -> (slot, z, w)
  std::vector<int64_t> cost;
  for (size_t b = 0; b + 1 < s.cta_items.size(); ++b) {
    int64_t c = 0;
    for (int i = s.cta_items[b]; i < s.cta_items[b + 1]; ++i) {
      const int4 w = s.items[size_t(i)];
      EXPECT_LE(w.z, w.w);
      pieces[{w.x, w.y}].emplace_back(s.slot_of.empty() ? -1 : s.slot_of[size_t(i)], w.z, w.w);
      c += int64_t(w.w - w.z) * kslices + 1;
    }
    cost.push_back(c);
  }
  EXPECT_EQ(int64_t(pieces.size()), mb * tiles);
  for (int64_t r = 0; r < mb; ++r)
    for (int64_t t = 0; t < tiles; ++t) {
      auto it = pieces.find({int(r), int(t * bn)});
      if (it == pieces.end()) {
        ADD_FAILURE() << "row " << r << " tile " << t << " missing";
        continue;
      }
      auto spans = it->second;
      std::sort(spans.begin(), spans.end());  // slot order
      for (auto& sp : spans)
        EXPECT_EQ(std::get<0>(sp) < 0, spans.size() == 1) << "a whole item has no slot; every piece has one";
      int pos = rp[size_t(r)];
      for (auto& sp : spans) {
        EXPECT_EQ(std::get<1>(sp), pos) << "row " << r << ": pieces must be contiguous in slot order";
        pos = std::get<2>(sp);
      }
      EXPECT_EQ(pos, rp[size_t(r) + 1]);
    }
  return cost;
}

TEST(Schedule, UniformRowsCoverEveryItemAndBalance) {
  const auto rp = row_ptr_of(std::vector<int>(64, 8));
  for (Order o : {Order::deadline, Order::bigtile, Order::longest}) {
    Schedule s = build_schedule(rp, 1024, 256, 2, 132, o, 0);
    auto cost = check_cover(s, rp, 1024, 256, 2);
    EXPECT_TRUE(s.groups.empty());
    const auto mm = std::minmax_element(cost.begin(), cost.end());
    EXPECT_LE(*mm.second - *mm.first, 17) << "uniform items differ by at most one item's cost";
  }
}

TEST(Schedule, SingleIsOneItemPerList) {
  const auto rp = row_ptr_of({3, 0, 5, 1});
  Schedule s = build_schedule(rp, 300, 256, 1, 8, Order::single, 0);
  check_cover(s, rp, 300, 256, 1);
  EXPECT_EQ(s.cta_items.size(), s.items.size() + 1);
}

TEST(Schedule, LongRowWithFewTilesIsSplitInOrder) {
  std::vector<int> lens(32, 2);
  lens[7] = 4000;  // one dominant row
  const auto rp = row_ptr_of(lens);
  Schedule s = build_schedule(rp, 256, 256, 1, 132, Order::deadline, 0);
  check_cover(s, rp, 256, 256, 1);
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].x, 7);
  EXPECT_GT(s.slots, 1);
  EXPECT_EQ(s.groups[0].w, s.slots);
}

TEST(Schedule, ForcedPiecesAndNeverSplit) {
  std::mt19937 rng(3);
  std::vector<int> lens(50);
  for (int& l : lens) l = int(rng() % 40);
  const auto rp = row_ptr_of(lens);
  Schedule forced = build_schedule(rp, 700, 256, 2, 16, Order::deadline, 8);
  check_cover(forced, rp, 700, 256, 2);
  EXPECT_FALSE(forced.groups.empty());
  Schedule never = build_schedule(rp, 700, 256, 2, 16, Order::deadline, -1);
  check_cover(never, rp, 700, 256, 2);
  EXPECT_TRUE(never.groups.empty());
}

TEST(Schedule, EmptyProblems) {
  Schedule s = build_schedule(row_ptr_of({}), 512, 256, 1, 8, Order::deadline, 0);
  EXPECT_TRUE(s.items.empty());
  EXPECT_EQ(s.cta_items, std::vector<int>{0});
  Schedule z = build_schedule(row_ptr_of({1, 2}), 0, 256, 1, 8, Order::deadline, 0);
  EXPECT_TRUE(z.items.empty());
}

// SDD: every stored block in exactly one group of at most `group` neighbours of its row, groups in
// row order, list b holding items b, b + lists, ...; no lists beyond the items; none for nnzb = 0.
TEST(Schedule, SddGroupsCoverEveryBlockOnce) {
  const std::vector<int32_t> rp = row_ptr_of({0, 9, 4, 0, 1, 16, 3});
  for (int group : {1, 2, 4, 8})
    for (int ctas : {1, 3, 132}) {
      SCOPED_TRACE("group " + std::to_string(group) + " ctas " + std::to_string(ctas));
      const Schedule s = build_sdd_schedule(rp, group, ctas);
      std::vector<int> seen(size_t(rp.back()), 0);
      std::vector<int4> in_order;
      const int lists = int(s.cta_items.size()) - 1;
      EXPECT_EQ(s.cta_items.front(), 0);
      EXPECT_EQ(s.cta_items.back(), int(s.items.size()));
      EXPECT_EQ(lists, std::min<int>(ctas, int(s.items.size())));
      for (int b = 0; b < lists; ++b)
        for (int i = s.cta_items[size_t(b)]; i < s.cta_items[size_t(b) + 1]; ++i) {
          const int4 w = s.items[size_t(i)];
          EXPECT_GE(w.z, 1);
          EXPECT_LE(w.z, group);
          EXPECT_GE(w.y, rp[size_t(w.x)]);
          EXPECT_LE(w.y + w.z, rp[size_t(w.x) + 1]) << "a group stays inside its row";
          for (int j = w.y; j < w.y + w.z; ++j) seen[size_t(j)]++;
          // round-robin: item t of list b is the (b + t * lists)-th group in row order
          const size_t pos = size_t(b + (i - s.cta_items[size_t(b)]) * lists);
          if (in_order.size() <= pos) in_order.resize(pos + 1, int4{-1, -1, -1, -1});
          in_order[pos] = w;
        }
      for (int j = 0; j < rp.back(); ++j) EXPECT_EQ(seen[size_t(j)], 1) << "block " << j;
      for (size_t t = 1; t < in_order.size(); ++t)
        EXPECT_LT(in_order[t - 1].y, in_order[t].y) << "groups in row order";
    }
  const Schedule none = build_sdd_schedule(row_ptr_of({0, 0}), 4, 8);
  EXPECT_TRUE(none.items.empty());
  EXPECT_EQ(none.cta_items, std::vector<int>{0});
}

TEST(Schedule, ParseOrder) {
  EXPECT_EQ(parse_order("single"), Order::single);
  EXPECT_EQ(parse_order("longest"), Order::longest);
  EXPECT_EQ(parse_order("bigtile"), Order::bigtile);
  EXPECT_EQ(parse_order("deadline"), Order::deadline);
  EXPECT_EQ(parse_order("bogus"), Order::deadline);
}

}  // namespace
}  // namespace sparsek
