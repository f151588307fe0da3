// Hopper DSD, the plan's choices (heuristics.hpp). Each default says where it was measured;
// docs/design/dsd_sm90.md has the reasoning and docs/history/ the runs.
#include "kernels/dsd_sm90/heuristics.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace sparsek::dsd_sm90 {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string(fallback);
}

// Row pairs run when at least this share of the pairs' half-tiles hold a stored block: the 128-row
// kernel measured ~1.4x the 64-row one's rate on the H100 (8192^3, 12.5%: 128x128 blocks ~560-585
// effective TFLOPS, 64x64 ~400), so below ~0.7 the halves it leaves idle cost more than the B loads
// it saves. Banded and lower-triangular rows pair at 0.94-1.0, independent random rows at ~0.5
// (12.5%).
constexpr double kRowPairMinFill = 0.75;

}  // namespace

Overrides overrides_from_env() {
  Overrides o;
  const std::string tn = env_or("SPARSEK_HOPPER_TILE_N", "");
  if (tn == "64" || tn == "128" || tn == "256") o.tile_n = std::atoi(tn.c_str());
  const std::string rp = env_or("SPARSEK_HOPPER_ROW_PAIRS", "");
  o.row_pairs = rp == "on" ? 1 : rp == "off" ? 0 : -1;
  const std::string clu = env_or("SPARSEK_HOPPER_CLUSTER", "");
  if (!clu.empty()) o.cluster = std::atoi(clu.c_str()) == 2 ? 2 : 1;
  o.order = env_or("SPARSEK_HOPPER_SCHEDULE", "");
  const std::string split = env_or("SPARSEK_HOPPER_SPLIT", "");
  o.split = split.empty() ? 0 : split == "off" ? -1 : std::max(1, std::atoi(split.c_str()));
  const std::string win = env_or("SPARSEK_HOPPER_WINDOW", "");
  o.window = win.empty() ? -1.0 : win == "off" ? 0.0 : std::atof(win.c_str());
  o.cluster_mode = std::max(0, std::min(2, std::atoi(env_or("SPARSEK_HOPPER_CLUSTER_MODE", "0").c_str())));
  o.overlap = env_or("SPARSEK_HOPPER_OVERLAP", "") != "off";
  o.pack_lines128 = env_or("SPARSEK_HOPPER_PACK_B", "") == "lines128";
  o.verbose = std::getenv("SPARSEK_HOPPER_VERBOSE") != nullptr;
  return o;
}

int tile_n_for(const Overrides& o, bool narrow_built, int64_t n) {
  if (!narrow_built) return 256;
  if (o.tile_n) return o.tile_n;
  return n <= 64 ? 64 : n <= 128 ? 128 : 256;
}

bool use_row_pairs(const Overrides& o, double fill) {
  if (o.row_pairs >= 0) return o.row_pairs == 1;
  return fill >= kRowPairMinFill;
}

// Pairs of CTAs (a cluster of 2) share A by multicast; an item then spans two neighbouring N tiles
// (one per CTA), and the persistent grid is as many pairs as fit. Default: 128x128 blocks with an
// even number of N tiles (no CTA of a pair left without a tile), where the pair measured 3-7% faster
// on the H100, and 128x64 (+3-5%); 128x32 measured 4-5% slower. Not where every two neighbouring
// block rows have the same columns (block-diagonal experts): their items read the same B panels at
// the same time, L2 serves them, and the pair's lock-step cost more than the A loads it saves
// (H100, 8192^3 128x128 block-diagonal: 585 with pairs, 618 without).
int cluster_for(const Overrides& o, bool pairs_built, bool row_pairs, int64_t tiles, int tile_n,
                const std::function<bool()>& identical_rows) {
  if (!pairs_built || tile_n != 256) return 1;
  if (o.cluster) return o.cluster;
  if (tiles % 2 != 0) return 1;
  return !row_pairs && identical_rows() ? 1 : 2;
}

// Longest first at 128-row blocks, deadline otherwise. On the H100 (8192^3), longest first ran
// power-law rows 5-6% faster at 128x128 and 128x64 and lower-triangular rows 2.5% faster than the
// deadline order with its window, and uniform, banded and block-diagonal rows the same; at 64x64 it
// ran power-law rows 18% slower.
Order order_for(const Overrides& o, int bm) {
  return parse_order(!o.order.empty() ? o.order : bm == 128 ? "longest" : "deadline");
}

// Row pairs never split: a piece's partial sums would need to know which of its two rows had a
// block (alpha must not touch a row without one), and rows that share columns are rarely skewed.
int split_stages_for(const Overrides& o, bool row_pairs) { return row_pairs ? -1 : o.split; }

// Skewed rows under the deadline order: one N tile's slice of B is 4-8 MB at bm = 128, so the few
// tiles L2 holds must not be outrun by long rows started tiles ahead; their items are cut to at most
// `window` tiles' worth of a CTA's time (only the deadline order cuts, so at bm = 128 only when the
// order is forced to deadline).
double window_for(const Overrides& o, bool row_pairs, int bm) {
  if (row_pairs) return 0.0;
  if (o.window >= 0) return o.window;
  return bm == 128 ? 3.0 : 0.0;
}

}  // namespace sparsek::dsd_sm90
