// Internal (host): schedules of the persistent Hopper kernels, built once per pattern by plan()
// and consumed by the kernels' device-side item loop (src/kernels/sm90/kit/ring.cuh).
#pragma once
#include "core/cuda_host.hpp"  // int4, make_int4 (vector_types.h)

#include <cstdint>
#include <string>
#include <vector>

namespace sparsek {

// Item order of the persistent product schedule (SPARSEK_HOPPER_SCHEDULE; docs/history/products.md
// measures them).
enum class Order {
  deadline,  // default below 128-row blocks: one N-tile-major list; an item goes as early as it
             // must to end with its tile (long rows start a few tiles ahead, not all at once)
  bigtile,   // items of rows >= 2x the mean length first, then the rest; each group N-tile-major,
             // longest first within a tile (second pass)
  longest,   // the same, but the long rows' items longest first across all tiles (first pass);
             // the default at 128-row blocks (dsd_sm90/heuristics.cpp says why)
  single,    // one item per CTA, non-persistent (the ladder's baseline); never splits
};
// "deadline" | "bigtile" | "longest" | "single"; anything else is the default (deadline).
Order parse_order(const std::string& name);

// A product work item is {block row, first column n0, first stored block, end stored block}.
struct Schedule {
  std::vector<int4> items;
  std::vector<int> slot_of;    // per item, its split-row partial slot (-1: whole); empty when nothing was split
  std::vector<int4> groups;    // split items: {block row, n0, first slot, slots}
  std::vector<int> cta_items;  // [lists + 1]: list b runs items [cta_items[b], cta_items[b + 1])
  int slots = 0;               // partial slots (one per piece)
};

// A piece shorter than this (in stages) costs more in its partial tile than it saves.
constexpr int kMinPieceStages = 16;

// Work items (block row, bn-wide N tile) of a DSD product for `ctas` persistent work lists; each
// item goes to the least-loaded list in order (ties: lowest index, so uniform rows go round-robin
// and keep that order). Tile-major order keeps the CTAs running at the same time on the B panels
// of one or two N tiles, with A in L2. The cost of an item is its stored blocks times `kslices`
// pipeline stages, plus one for the epilogue.
// Split rows: an item much longer than one list's share of all the work would set the makespan on
// its own (few N tiles, one dominant row), so it is cut into pieces of about that share along its
// stored blocks. split_stages: 0 automatic, < 0 never, > 0 forced piece length (tests).
// A piece writes its raw sums to a partial slot; a second launch adds each item's slots in K
// order and writes C, so nothing waits inside the persistent kernel.
// window_tiles > 0 (deadline order, automatic splitting): also cut every item longer than that many
// N tiles' worth of a CTA's time, so that no item starts more than that many tiles ahead of its
// own; used where one N tile's slice of B is large (128-row blocks: L2 holds only a few of them).
Schedule build_schedule(const std::vector<int32_t>& row_ptr, int64_t n, int bn, int kslices, int ctas, Order order,
                        int split_stages, double window_tiles = 0);

// Row pairs (the Hopper kernel's 128-row tiles over 64-row blocks): block rows 2g and 2g + 1 of a
// pattern walked together over the union of their block columns, so that one B panel load serves
// both rows. Position j of pair g (j in [row_ptr[g], row_ptr[g + 1])) is block column col[j], and
// blk[j] = {stored block of row 2g there, of row 2g + 1} (-1: that row has none at col[j]; a column
// stored several times in a row: its k-th copies in the two rows share a position). Positions run
// in ascending column order, so a row's sum runs over its blocks in column order. A pattern with an odd number
// of block rows ends with a pair whose second row does not exist (always -1).
struct RowPairs {
  std::vector<int32_t> row_ptr;  // [pairs + 1]
  std::vector<int32_t> col;      // [positions]
  std::vector<int2> blk;         // [positions]
  int64_t stored = 0;            // stored blocks (every one appears exactly once)
  // Fraction of the pairs' half-tiles that hold a stored block: the share of the 128-row tiles'
  // tensor work that is not spent on a missing half (1: neighbouring rows share every column).
  double fill() const { return col.empty() ? 0.0 : double(stored) / (2.0 * double(col.size())); }
};
RowPairs pair_rows(const int32_t* row_ptr, const int32_t* col_idx, int64_t mb);

// Whether block rows 2g and 2g + 1 have the same block columns in the same order, for every g
// (block-diagonal experts, whole dense bands): an even, non-zero number of rows and at least one
// stored block. col_idx = nullptr compares the rows' lengths only (a cheap first test). Items of
// such rows that run at the same time read the same B panels, which L2 then serves, so sharing A
// by multicast between CTA pairs gains nothing there (dsd_sm90/heuristics.cpp).
bool identical_row_pairs(const int32_t* row_ptr, const int32_t* col_idx, int64_t mb);

// Schedule of the small-N streaming kernel (src/kernels/sm80/smalln_sm80.cu): one unit per CTA, the
// whole of N (in N tiles that the kernel adds itself). A unit is a block row, or a piece of one:
// {block row, first stored block, end stored block, partial slot (-1: the whole row, written to C)}.
// The kernel is bound by A's bytes, and every unit runs at about the same rate while the units in
// flight share the memory bandwidth, so a unit only needs cutting when it alone would outlast the
// others: rows longer than twice `target` (and every row longer than `max_piece`, the column
// indices a CTA stages) are cut into pieces of at most `target` blocks, where target = the stored
// blocks / `ctas`, at least `min_piece`. Pieces write raw fp32 sums to their own partial slots (in
// K order); a second launch adds each split row's slots in that order (deterministic).
// Units are ordered longest first (the hardware starts CTAs in index order).
struct StreamSchedule {
  std::vector<int4> units;
  std::vector<int4> groups;  // split rows: {block row, first slot, slots, 0}
  int slots = 0;
};
StreamSchedule build_stream_schedule(const std::vector<int32_t>& row_ptr, int ctas, int min_piece, int max_piece);

// Work items of an SDD product (C's pattern row_ptr): each block row's stored blocks in groups of
// up to `group` neighbours, {block row, first position, blocks in the group, 0}, for `ctas`
// persistent lists. Every item runs the same dense K loop, so list b takes items b, b + lists, ...
// in row order (the items running at the same time share A's rows and lie close in B).
Schedule build_sdd_schedule(const std::vector<int32_t>& row_ptr, int group, int ctas);

}  // namespace sparsek
