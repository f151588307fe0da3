// Host schedules of the persistent Hopper kernels (schedule.hpp).
#include "plan/schedule.hpp"

#include "core/cuda_host.hpp"  // make_int4

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <utility>

namespace sparsek {

Order parse_order(const std::string& name) {
  return name == "single" ? Order::single
         : name == "longest" ? Order::longest
         : name == "bigtile" ? Order::bigtile
                             : Order::deadline;
}

Schedule build_schedule(const std::vector<int32_t>& row_ptr, int64_t n, int bn, int kslices, int ctas, Order order,
                        int split_stages, double window_tiles) {
  Schedule s;
  const int64_t mb = int64_t(row_ptr.size()) - 1, tiles = (n + bn - 1) / bn;
  auto len = [](const int4& w) { return w.w - w.z; };
  auto cost = [&](const int4& w) { return int64_t(w.w - w.z) * kslices + 1; };  // + 1: the epilogue
  std::vector<int4> all;
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t r = 0; r < mb; ++r) all.push_back(make_int4(int(r), int(t * bn), row_ptr[r], row_ptr[r + 1]));
  if (all.empty()) {
    s.cta_items = {0};
    return s;
  }
  double total = 0;
  for (const int4& w : all) total += double(cost(w));
  std::vector<int> slot(all.size(), -1);  // partial slot of each entry (-1: a whole item)
  if (order != Order::single && split_stages >= 0) {
    const double share = total / double(ctas);
    const double target = split_stages > 0 ? double(split_stages) : std::max(share, double(kMinPieceStages));
    const double limit = split_stages > 0 ? target : 1.5 * target;
    // Locality (window_tiles > 0): a long item starts about cost / tile_time tiles ahead of its own
    // N tile (deadline order), and every N tile in flight keeps its slice of B hot in L2. Items of
    // long rows (at least twice the mean item) are cut to at most `window` stages, so that the
    // tiles in flight stay few; uniform rows are never cut by this rule, nor is anything when
    // there are no more tiles than the window.
    const bool windowed = split_stages == 0 && window_tiles > 0 && order == Order::deadline && tiles > window_tiles;
    const double window = std::max(double(kMinPieceStages), window_tiles * total / double(tiles) / double(ctas));
    const double mean_cost = total / double(all.size());
    std::vector<int4> out;
    std::vector<int> out_slot;
    for (const int4& w : all) {
      const int64_t L = len(w), st = L * kslices;
      double piece = double(st) > limit ? target : 0.0;  // 0: keep whole
      if (windowed && double(st) > window && double(cost(w)) >= 2.0 * mean_cost)
        piece = piece > 0 ? std::min(piece, window) : window;
      if (piece == 0 || L < 2) {
        out.push_back(w);
        out_slot.push_back(-1);
        continue;
      }
      // The pieces get consecutive slots in K order; the reduction adds them in that order.
      const int64_t P = std::min<int64_t>(L, int64_t(std::ceil(double(st) / piece)));
      s.groups.push_back(make_int4(w.x, w.y, s.slots, int(P)));
      for (int64_t k = 0; k < P; ++k) {
        out.push_back(make_int4(w.x, w.y, int(w.z + L * k / P), int(w.z + L * (k + 1) / P)));
        out_slot.push_back(s.slots++);
      }
    }
    all.swap(out);
    slot.swap(out_slot);
  }
  // Sort indices (stable), then apply.
  std::vector<size_t> idx(all.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  auto tile_major = [&](size_t a, size_t b) {
    return all[a].y != all[b].y ? all[a].y < all[b].y : len(all[a]) > len(all[b]);
  };
  if (order == Order::deadline) {
    // Item of tile t should end by (t + 1) * (one tile's share of a CTA's time): it starts by
    // that minus its cost. Long items move ahead of their tile by as much as they need.
    const double tile_time = total / double(tiles) / double(ctas);
    std::vector<double> key(all.size());
    for (size_t i = 0; i < all.size(); ++i)
      key[i] = double(all[i].y / bn + 1) * tile_time - double(cost(all[i]));
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return key[a] != key[b] ? key[a] < key[b] : len(all[a]) > len(all[b]);
    });
  } else {
    int64_t filled = 0;
    for (int64_t r = 0; r < mb; ++r) filled += row_ptr[r + 1] > row_ptr[r];
    const double mean = filled ? double(row_ptr[mb]) / double(filled) : 0.0;
    auto is_long = [&](size_t i) { return len(all[i]) >= 2.0 * mean && len(all[i]) > 0; };
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      const bool la = is_long(a), lb = is_long(b);
      if (la != lb) return la;
      if (la && order == Order::longest) return len(all[a]) > len(all[b]);
      return tile_major(a, b);
    });
  }
  if (order == Order::single) {
    for (size_t i : idx) s.items.push_back(all[i]);
    s.cta_items.resize(all.size() + 1);
    for (size_t i = 0; i <= all.size(); ++i) s.cta_items[i] = int(i);
    return s;
  }
  const int grid = int(std::min<int64_t>(ctas, int64_t(all.size())));
  using Load = std::pair<int64_t, int>;  // (stages so far, cta)
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int b = 0; b < grid; ++b) heap.push({0, b});
  std::vector<std::vector<size_t>> per(static_cast<size_t>(grid));
  for (size_t i : idx) {
    const Load l = heap.top();
    heap.pop();
    per[size_t(l.second)].push_back(i);
    heap.push({l.first + cost(all[i]), l.second});
  }
  s.cta_items.push_back(0);
  for (const auto& v : per) {
    for (size_t i : v) {
      s.items.push_back(all[i]);
      if (!s.groups.empty()) s.slot_of.push_back(slot[i]);
    }
    s.cta_items.push_back(int(s.items.size()));
  }
  return s;
}

Schedule build_sdd_schedule(const std::vector<int32_t>& row_ptr, int group, int ctas) {
  Schedule s;
  std::vector<int4> all;
  for (size_t r = 0; r + 1 < row_ptr.size(); ++r)
    for (int32_t j = row_ptr[r]; j < row_ptr[r + 1]; j += group)
      all.push_back(make_int4(int(r), j, std::min(group, row_ptr[r + 1] - j), 0));
  const int64_t lists = std::min<int64_t>(std::max(ctas, 1), int64_t(all.size()));
  s.cta_items.push_back(0);
  for (int64_t b = 0; b < lists; ++b) {
    for (int64_t i = b; i < int64_t(all.size()); i += lists) s.items.push_back(all[size_t(i)]);
    s.cta_items.push_back(int(s.items.size()));
  }
  return s;
}

StreamSchedule build_stream_schedule(const std::vector<int32_t>& row_ptr, int ctas, int min_piece, int max_piece) {
  StreamSchedule s;
  const int64_t mb = int64_t(row_ptr.size()) - 1;
  if (mb <= 0) return s;
  const int64_t total = int64_t(row_ptr[size_t(mb)]) - row_ptr[0];
  const int64_t share = (total + std::max(1, ctas) - 1) / std::max(1, ctas);
  const int64_t target = std::max<int64_t>(1, std::min<int64_t>(max_piece, std::max<int64_t>(min_piece, share)));
  std::vector<int4> all;
  for (int64_t r = 0; r < mb; ++r) {
    const int j0 = row_ptr[size_t(r)], j1 = row_ptr[size_t(r + 1)];
    const int64_t L = int64_t(j1) - j0;
    if (L <= 2 * target && L <= max_piece) {
      all.push_back(make_int4(int(r), j0, j1, -1));
      continue;
    }
    const int64_t P = (L + target - 1) / target;  // pieces of at most `target` blocks, in K order
    s.groups.push_back(make_int4(int(r), s.slots, int(P), 0));
    for (int64_t k = 0; k < P; ++k)
      all.push_back(make_int4(int(r), int(j0 + L * k / P), int(j0 + L * (k + 1) / P), s.slots++));
  }
  std::stable_sort(all.begin(), all.end(), [](const int4& a, const int4& b) { return a.z - a.y > b.z - b.y; });
  s.units = std::move(all);
  return s;
}

bool identical_row_pairs(const int32_t* row_ptr, const int32_t* col_idx, int64_t mb) {
  if (mb < 2 || mb % 2 != 0 || row_ptr[mb] == row_ptr[0]) return false;
  for (int64_t g = 0; g < mb / 2; ++g) {
    const int32_t b0 = row_ptr[2 * g], b1 = row_ptr[2 * g + 1], len = b1 - b0;
    if (row_ptr[2 * g + 2] - b1 != len || (col_idx && !std::equal(col_idx + b0, col_idx + b1, col_idx + b1)))
      return false;
  }
  return true;
}

RowPairs pair_rows(const int32_t* row_ptr, const int32_t* col_idx, int64_t mb) {
  RowPairs rp;
  const int64_t pairs = (mb + 1) / 2;
  rp.row_ptr.reserve(size_t(pairs + 1));
  rp.row_ptr.push_back(0);
  struct Entry {
    int32_t col, half, blk;
  };
  std::vector<Entry> e;
  for (int64_t g = 0; g < pairs; ++g) {
    e.clear();
    for (int half = 0; half < 2; ++half) {
      const int64_t r = 2 * g + half;
      if (r >= mb) break;
      for (int32_t j = row_ptr[r]; j < row_ptr[r + 1]; ++j) e.push_back({col_idx[j], half, j});
    }
    // Column order; within a column row 2g's copies first, each row's copies in stored order.
    std::stable_sort(e.begin(), e.end(), [](const Entry& x, const Entry& y) {
      return x.col != y.col ? x.col < y.col : x.half < y.half;
    });
    // Per column: its k-th copy in row 2g and its k-th copy in row 2g + 1 share position k.
    for (size_t i = 0; i < e.size();) {
      size_t mid = i, end = i;
      while (end < e.size() && e[end].col == e[i].col) {
        if (e[end].half == 0) ++mid;
        ++end;
      }
      const size_t n0 = mid - i, n1 = end - mid;
      for (size_t k = 0; k < std::max(n0, n1); ++k) {
        const int2 b = make_int2(k < n0 ? e[i + k].blk : -1, k < n1 ? e[mid + k].blk : -1);
        rp.col.push_back(e[i].col);
        rp.blk.push_back(b);
        rp.stored += (b.x >= 0) + (b.y >= 0);
      }
      i = end;
    }
    rp.row_ptr.push_back(int32_t(rp.col.size()));
  }
  return rp;
}

}  // namespace sparsek
