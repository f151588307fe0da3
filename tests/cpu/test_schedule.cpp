// The product schedules (src/plan/schedule.cpp), checked on the host. Persistent Hopper: every
// (block row, N tile) is covered exactly once (split items by contiguous pieces in slot order),
// lists are balanced, and the order rules hold. Small-N streaming: every row once, whole or in
// pieces no longer than asked. Row pairs: every stored block once, on its row's half, in column order.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "plan/schedule.hpp"
#include "test_util.hpp"

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

// The locality window (128-row blocks): items of long rows are cut to at most `window` tiles of a
// CTA's time; uniform rows (even ones longer than the window) and the makespan rule are unchanged.
TEST(Schedule, WindowCutsOnlyLongRows) {
  // Power-law-like rows at 128x128, N = 8192 as CTA pairs (512-column items, 66 lists).
  std::vector<int> lens = {64, 60, 40, 30, 24, 20, 17, 15, 13, 12, 11, 10, 9, 9, 8, 7};
  lens.resize(64, 3);
  const auto rp = row_ptr_of(lens);
  Schedule off = build_schedule(rp, 8192, 512, 2, 66, Order::deadline, 0);
  check_cover(off, rp, 8192, 512, 2);
  EXPECT_TRUE(off.groups.empty()) << "no item is long enough for the makespan rule";
  Schedule on = build_schedule(rp, 8192, 512, 2, 66, Order::deadline, 0, 3.0);
  const auto cost = check_cover(on, rp, 8192, 512, 2);
  EXPECT_FALSE(on.groups.empty());
  double total = 0;
  for (int64_t c : cost) total += double(c);
  const double window = 3.0 * total / 16.0 / 66.0;  // 3 tiles of a list's time
  for (const int4& w : on.items) EXPECT_LE(double(w.w - w.z) * 2, window + 2) << "row " << w.x;
  for (const int4& g : on.groups) EXPECT_GE(lens[size_t(g.x)], 13) << "only long rows are cut";
  // Uniform rows longer than the window (few rows, many lists) stay whole.
  const auto uni = row_ptr_of(std::vector<int>(8, 40));
  Schedule u = build_schedule(uni, 8192, 512, 2, 66, Order::deadline, 0, 3.0);
  check_cover(u, uni, 8192, 512, 2);
  EXPECT_TRUE(u.groups.empty());
  // Not with no more tiles than the window (1024 columns: two 512-column tiles).
  EXPECT_TRUE(build_schedule(rp, 1024, 512, 2, 66, Order::deadline, 0, 3.0).groups.size() ==
              build_schedule(rp, 1024, 512, 2, 66, Order::deadline, 0).groups.size());
  // Only for the deadline order with automatic splitting.
  EXPECT_TRUE(build_schedule(rp, 8192, 512, 2, 66, Order::bigtile, 0, 3.0).groups.empty());
  EXPECT_TRUE(build_schedule(rp, 8192, 512, 2, 66, Order::deadline, -1, 3.0).groups.empty());
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

// ---- the small-N streaming schedule (one unit per CTA) ----

// Every row is one whole unit (slot -1) or pieces that tile it in slot order, named by exactly one
// group; no unit is longer than max_piece; units are longest first. Returns the longest unit.
int check_stream_cover(const StreamSchedule& s, const std::vector<int32_t>& rp, int max_piece) {
  const int64_t mb = int64_t(rp.size()) - 1;
  std::map<int, std::vector<std::tuple<int, int, int>>> pieces;  // row -> (slot, first, end)
  int longest = 0;
  for (size_t i = 0; i < s.units.size(); ++i) {
    const int4 u = s.units[i];
    EXPECT_LE(u.y, u.z);
    EXPECT_LE(u.z - u.y, max_piece);
    if (i > 0) EXPECT_GE(s.units[i - 1].z - s.units[i - 1].y, u.z - u.y) << "units must be longest first";
    longest = std::max(longest, u.z - u.y);
    pieces[u.x].emplace_back(u.w, u.y, u.z);
  }
  EXPECT_EQ(int64_t(pieces.size()), std::max<int64_t>(mb, 0));
  std::map<int, int4> group_of;
  int slots = 0;
  for (const int4& gr : s.groups) {
    EXPECT_EQ(gr.y, slots) << "groups take consecutive slots";
    slots += gr.z;
    group_of[gr.x] = gr;
  }
  EXPECT_EQ(slots, s.slots);
  for (auto& [row, spans] : pieces) {
    std::sort(spans.begin(), spans.end());
    const bool split = group_of.count(row) > 0;
    if (!split) {
      EXPECT_EQ(spans.size(), 1u) << "row " << row;
      EXPECT_EQ(std::get<0>(spans[0]), -1) << "row " << row;
    } else {
      EXPECT_EQ(int(spans.size()), group_of[row].z) << "row " << row;
      EXPECT_EQ(std::get<0>(spans[0]), group_of[row].y) << "row " << row;
    }
    int pos = rp[size_t(row)];
    for (auto& sp : spans) {
      EXPECT_EQ(std::get<1>(sp), pos) << "row " << row << ": pieces must be contiguous in slot order";
      pos = std::get<2>(sp);
    }
    EXPECT_EQ(pos, rp[size_t(row) + 1]) << "row " << row;
  }
  return longest;
}

// Decode W 14336x4096 at 64x64, 25%: 224 rows of 16 blocks on 132 SMs. Each row is about half a
// CTA's share, so nothing is cut (a cut would cost the second launch).
TEST(StreamSchedule, UniformDecodeRowsAreWhole) {
  const auto rp = row_ptr_of(std::vector<int>(224, 16));
  StreamSchedule s = build_stream_schedule(rp, 132, 4, 1024);
  check_stream_cover(s, rp, 1024);
  EXPECT_EQ(s.units.size(), 224u);
  EXPECT_TRUE(s.groups.empty());
  EXPECT_EQ(s.slots, 0);
}

// A row many times a CTA's share is cut into pieces of about that share; the rest stay whole.
TEST(StreamSchedule, LongRowIsCutIntoShares) {
  std::vector<int> lens(200, 3);
  lens[17] = 5000;
  lens[40] = 0;
  const auto rp = row_ptr_of(lens);
  StreamSchedule s = build_stream_schedule(rp, 132, 4, 1024);
  const int longest = check_stream_cover(s, rp, 1024);
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].x, 17);
  const int share = (5000 + 199 * 3 - 3 + 131) / 132;  // ceil(stored blocks / 132)
  EXPECT_LE(longest, share);
  EXPECT_EQ(s.groups[0].z, (5000 + share - 1) / share);
}

// Rows over max_piece are cut even when the share is larger; min_piece keeps pieces from being
// tiny when there are many CTAs.
TEST(StreamSchedule, MaxAndMinPiece) {
  const auto big = row_ptr_of(std::vector<int>(8, 3000));  // share 24000 / 4 = 6000 > max_piece
  StreamSchedule s = build_stream_schedule(big, 4, 1, 1024);
  EXPECT_LE(check_stream_cover(s, big, 1024), 1024);
  EXPECT_EQ(s.groups.size(), 8u);
  const auto rp = row_ptr_of({100, 1, 1, 1});  // share 1 on 132 CTAs, but pieces of >= 40
  StreamSchedule m = build_stream_schedule(rp, 132, 40, 1024);
  check_stream_cover(m, rp, 1024);
  ASSERT_EQ(m.groups.size(), 1u);
  EXPECT_EQ(m.groups[0].z, 3);  // 100 / 40 -> 3 pieces (34, 33, 33)
}

TEST(StreamSchedule, RandomPatternsAndEmptyOnes) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int> lens(1 + rng() % 300);
    for (int& l : lens) l = rng() % 4 == 0 ? 0 : int(rng() % (trial % 2 ? 2000 : 40));
    const auto rp = row_ptr_of(lens);
    const int max_piece = 256 + int(rng() % 1024);
    StreamSchedule s = build_stream_schedule(rp, 1 + int(rng() % 200), 1 + int(rng() % 64), max_piece);
    check_stream_cover(s, rp, max_piece);
  }
  EXPECT_TRUE(build_stream_schedule(row_ptr_of({}), 132, 4, 1024).units.empty());
  StreamSchedule z = build_stream_schedule(row_ptr_of({0, 0, 0}), 132, 4, 1024);
  check_stream_cover(z, row_ptr_of({0, 0, 0}), 1024);
  EXPECT_EQ(z.units.size(), 3u);  // empty rows still get their beta * C
}

// Row pairs from explicit rows (block columns per row).
RowPairs pairs_of(const std::vector<std::vector<int32_t>>& rows) {
  const Pattern p = test::pattern_of(0, rows);
  return pair_rows(p.row_ptr.data(), p.col_idx.data(), p.mb);
}

TEST(RowPairs, UnionInColumnOrderWithDuplicatesAndAnOddRow) {
  // Row 0 sorted, row 1 unsorted with column 5 stored twice, row 2 empty (its pair has no row 3).
  const RowPairs r = pairs_of({{1, 3, 5}, {3, 0, 5, 5}, {}});
  EXPECT_EQ(r.row_ptr, (std::vector<int32_t>{0, 5, 5}));
  EXPECT_EQ(r.col, (std::vector<int32_t>{0, 1, 3, 5, 5}));
  // Stored blocks: row 0 = 0, 1, 2 (columns 1, 3, 5); row 1 = 3, 4, 5, 6 (columns 3, 0, 5, 5).
  const std::vector<std::pair<int, int>> want{{-1, 4}, {0, -1}, {1, 3}, {2, 5}, {-1, 6}};
  ASSERT_EQ(r.blk.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(r.blk[j].x, want[j].first) << "position " << j;
    EXPECT_EQ(r.blk[j].y, want[j].second) << "position " << j;
  }
  EXPECT_EQ(r.stored, 7);
  EXPECT_DOUBLE_EQ(r.fill(), 0.7);
  const RowPairs none = pairs_of({});
  EXPECT_EQ(none.row_ptr, (std::vector<int32_t>{0}));
  EXPECT_EQ(none.fill(), 0.0);
}

TEST(RowPairs, EveryBlockOnceOnItsRowRandomPatterns) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const int mb = 1 + int(rng() % 17), kb = 1 + int(rng() % 24);
    std::vector<std::vector<int32_t>> rows(static_cast<size_t>(mb));
    for (auto& row : rows)
      for (int c = 0; c < kb; ++c)
        if (rng() % 3 == 0) row.push_back(int32_t(rng() % kb));  // unsorted, duplicates possible
    std::vector<int32_t> rp{0}, ci;
    for (const auto& row : rows) {
      ci.insert(ci.end(), row.begin(), row.end());
      rp.push_back(int32_t(ci.size()));
    }
    const RowPairs r = pair_rows(rp.data(), ci.data(), mb);
    ASSERT_EQ(r.row_ptr.size(), size_t((mb + 1) / 2 + 1));
    ASSERT_EQ(r.col.size(), r.blk.size());
    std::vector<int> seen(ci.size(), 0);
    for (int g = 0; g + 1 < int(r.row_ptr.size()); ++g) {
      std::map<int32_t, int> per_col[2];
      for (int32_t j = r.row_ptr[size_t(g)]; j < r.row_ptr[size_t(g) + 1]; ++j) {
        if (j > r.row_ptr[size_t(g)]) EXPECT_LE(r.col[size_t(j) - 1], r.col[size_t(j)]) << "column order";
        const int b[2] = {r.blk[size_t(j)].x, r.blk[size_t(j)].y};
        EXPECT_TRUE(b[0] >= 0 || b[1] >= 0) << "a position with no block";
        for (int h = 0; h < 2; ++h) {
          if (b[h] < 0) continue;
          const int row = 2 * g + h;
          ASSERT_LT(row, mb);
          EXPECT_GE(b[h], rp[size_t(row)]);
          EXPECT_LT(b[h], rp[size_t(row) + 1]) << "block on the other row's half";
          EXPECT_EQ(ci[size_t(b[h])], r.col[size_t(j)]);
          ++seen[size_t(b[h])];
          ++per_col[h][r.col[size_t(j)]];
        }
      }
      // Positions per column: the larger of the two rows' copies there (the union, with repeats).
      std::map<int32_t, int> want;
      for (int h = 0; h < 2 && 2 * g + h < mb; ++h)
        for (int32_t j = rp[size_t(2 * g + h)]; j < rp[size_t(2 * g + h) + 1]; ++j) ++want[ci[size_t(j)]];
      size_t positions = 0;
      for (const auto& kv : want) {
        positions += size_t(std::max(per_col[0][kv.first], per_col[1][kv.first]));
        EXPECT_EQ(per_col[0][kv.first] + per_col[1][kv.first], kv.second);
      }
      EXPECT_EQ(positions, size_t(r.row_ptr[size_t(g) + 1] - r.row_ptr[size_t(g)]));
    }
    for (size_t j = 0; j < seen.size(); ++j) EXPECT_EQ(seen[j], 1) << "stored block " << j;
    EXPECT_EQ(r.stored, int64_t(ci.size()));
  }
}

TEST(RowPairs, FillSeparatesBandsFromIndependentRows) {
  // A band of 16 blocks (rows r..r+15 of 128 block columns) shares 15 of 16 columns with its
  // neighbour: fill 32 / 34. Rows drawn independently at 12.5% share few.
  std::vector<std::vector<int32_t>> band(64), random(64);
  std::mt19937 rng(3);
  for (int r = 0; r < 64; ++r) {
    for (int c = r; c < r + 16; ++c) band[size_t(r)].push_back(int32_t(c));
    for (int c = 0; c < 128; ++c)
      if (rng() % 8 == 0) random[size_t(r)].push_back(int32_t(c));
  }
  EXPECT_NEAR(pairs_of(band).fill(), 32.0 / 34.0, 1e-12);
  EXPECT_LT(pairs_of(random).fill(), 0.6);
}

// Block rows 2g and 2g + 1 with the same columns: block-diagonal experts qualify; a pair that
// differs in one column, in order, or in length, an odd number of rows and no stored block do not.
TEST(IdenticalRowPairs, BlockDiagonalQualifiesAndAnyDifferenceDoesNot) {
  auto pairs = [](const std::vector<std::vector<int32_t>>& rows) {
    const Pattern p = test::pattern_of(0, rows);
    return identical_row_pairs(p.row_ptr.data(), p.col_idx.data(), p.mb);
  };
  // Two experts of 4 block rows x 2 columns, then an empty pair.
  EXPECT_TRUE(pairs({{0, 1}, {0, 1}, {0, 1}, {0, 1}, {2, 3}, {2, 3}, {2, 3}, {2, 3}, {}, {}}));
  EXPECT_TRUE(pairs({{0, 1}, {0, 1}, {0, 1}, {0, 1}, {1, 2}, {1, 2}}));  // experts that overlap
  EXPECT_FALSE(pairs({{0, 1}, {0, 2}}));
  EXPECT_FALSE(pairs({{0, 1}, {1, 0}}));
  EXPECT_FALSE(pairs({{0, 1}, {0, 1, 2}}));
  EXPECT_FALSE(pairs({{0, 1}, {0, 1}, {2}}));
  EXPECT_FALSE(pairs({{}, {}}));
  EXPECT_FALSE(pairs({}));
  // Lengths only (col_idx = nullptr): a pair that differs in a column passes, one in length not.
  const std::vector<int32_t> rp{0, 2, 4, 6, 9};
  EXPECT_FALSE(identical_row_pairs(rp.data(), nullptr, 4));
  const std::vector<int32_t> same{0, 2, 4, 7, 10};
  EXPECT_TRUE(identical_row_pairs(same.data(), nullptr, 4));
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
