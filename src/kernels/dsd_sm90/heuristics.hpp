// Hopper DSD, the plan's choices: the N extent of a work tile, row pairs, CTA pairs, the item order,
// row splits and the L2 window, and the experiment switches that override them. Host side only,
// apart from the kernels: prepare() asks here and builds what the answers say. Every
// SPARSEK_HOPPER_* environment switch is read in heuristics.cpp and nowhere else.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "plan/schedule.hpp"

namespace sparsek::dsd_sm90 {

// The overrides of one plan (experiments and tests; each "auto" where unset).
struct Overrides {
  int tile_n = 0;             // SPARSEK_HOPPER_TILE_N = 64 | 128 | 256 (0: auto)
  int row_pairs = -1;         // SPARSEK_HOPPER_ROW_PAIRS = on | off (1 | 0; -1: auto)
  int cluster = 0;            // SPARSEK_HOPPER_CLUSTER = 1 | 2 (0: auto)
  std::string order;          // SPARSEK_HOPPER_SCHEDULE = deadline | bigtile | longest | single ("": auto)
  int split = 0;              // SPARSEK_HOPPER_SPLIT = off | <piece length in stages> (-1: off; 0: auto)
  double window = -1;         // SPARSEK_HOPPER_WINDOW = off | <tiles> (0: off; -1: auto)
  int cluster_mode = 0;       // SPARSEK_HOPPER_CLUSTER_MODE = 0 | 1 | 2 (CTA-pair diagnostics, Params::cluster_mode)
  bool overlap = true;        // SPARSEK_HOPPER_OVERLAP = off: narrow tiles launched as the wide ones
  bool pack_lines128 = false; // SPARSEK_HOPPER_PACK_B = lines128: copy a TMA-aligned B whose lines are not 128-byte aligned
  bool verbose = false;       // SPARSEK_HOPPER_VERBOSE: print the plan's choices to stderr
};
// The overrides the environment sets now.
Overrides overrides_from_env();

// The N extent of a work tile: 64 / 128 for N <= 64 / 128 where narrow tiles are built (the tensor
// work and the B bytes of a stage follow N, and A is read by one N tile only), else 256.
int tile_n_for(const Overrides& o, bool narrow_built, int64_t n);
// Whether 64-row block rows run in pairs on the 128-row kernel, given the share of the pairs'
// half-tiles that hold a stored block (RowPairs::fill()).
bool use_row_pairs(const Overrides& o, double fill);
// Whether a cluster of two CTAs shares A, where CTA pairs are built for the kernel: `tiles` N tiles,
// `identical_rows()` whether every two neighbouring block rows have the same columns (asked only
// when it matters: it reads the pattern).
int cluster_for(const Overrides& o, bool pairs_built, bool row_pairs, int64_t tiles, int tile_n,
                const std::function<bool()>& identical_rows);
Order order_for(const Overrides& o, int bm);
// Piece length of split rows in stages (0: automatic; -1: never split).
int split_stages_for(const Overrides& o, bool row_pairs);
// The L2 window of the deadline order in N tiles (0: none).
double window_for(const Overrides& o, bool row_pairs, int bm);

}  // namespace sparsek::dsd_sm90
