// Block-pattern generators, for tests, benchmarks and users. All seeded: the same
// (kind, mb, kb, density, seed) gives the same pattern with every compiler and standard library,
// because we draw only raw std::mt19937_64 output (whose sequence the standard fixes) and never
// use std::*_distribution (whose algorithms are implementation-defined).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "format/attention_internal.hpp"
#include "sparsek/bsr.hpp"

namespace sparsek {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }
std::string s(int64_t v) { return std::to_string(v); }

double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
// Uniform in [0, n); modulo bias is < n / 2^64, far below anything a test could see.
int64_t below(std::mt19937_64& rng, int64_t n) { return int64_t(rng() % uint64_t(n)); }

// k distinct sorted values of [0, n) (Floyd's algorithm: k draws, no O(n) shuffle). `seen` is a
// caller-owned scratch of n zeros, left zeroed on return.
void sample_sorted(std::mt19937_64& rng, int64_t n, int64_t k, std::vector<uint8_t>& seen, std::vector<int32_t>& out) {
  const size_t first = out.size();
  for (int64_t j = n - k; j < n; ++j) {
    int64_t t = below(rng, j + 1);
    if (seen[size_t(t)]) t = j;  // j itself was never drawable before: always new
    seen[size_t(t)] = 1;
    out.push_back(int32_t(t));
  }
  std::sort(out.begin() + std::ptrdiff_t(first), out.end());
  for (size_t i = first; i < out.size(); ++i) seen[size_t(out[i])] = 0;
}

// Row lengths of a power-law pattern: Zipf weights 1/(rank+1) scaled so that they sum to `total`,
// water-filled under the cap kb (rows that would exceed kb are full and their excess goes to the
// others), rounded by largest remainder so the sum is exactly `total`.
std::vector<int64_t> zipf_lengths(int64_t mb, int64_t kb, int64_t total) {
  std::vector<double> w(static_cast<size_t>(mb));
  for (int64_t i = 0; i < mb; ++i) w[size_t(i)] = 1.0 / double(i + 1);
  double wsum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<double> x(size_t(mb), 0.0);
  double left = double(total);
  int64_t i = 0;
  // Weights decrease with rank, so the capped rows are a prefix.
  for (; i < mb && left * w[size_t(i)] / wsum >= double(kb); ++i) {
    x[size_t(i)] = double(kb);
    left -= double(kb);
    wsum -= w[size_t(i)];
  }
  for (int64_t j = i; j < mb; ++j) x[size_t(j)] = wsum > 0 ? left * w[size_t(j)] / wsum : 0.0;
  std::vector<int64_t> len(static_cast<size_t>(mb));
  std::vector<std::pair<double, int64_t>> rem;  // (fraction, row)
  int64_t sum = 0;
  for (int64_t j = 0; j < mb; ++j) {
    len[size_t(j)] = std::min<int64_t>(kb, int64_t(std::floor(x[size_t(j)])));
    sum += len[size_t(j)];
    if (len[size_t(j)] < kb) rem.emplace_back(x[size_t(j)] - double(len[size_t(j)]), j);
  }
  // Largest fractions first; ties by row so the result is deterministic.
  std::sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (size_t r = 0; sum < total && r < rem.size(); ++r, ++sum) len[size_t(rem[r].second)]++;
  return len;
}

}  // namespace

const char* to_string(PatternKind k) {
  switch (k) {
    case PatternKind::fixed_k: return "fixed_k";
    case PatternKind::bernoulli: return "bernoulli";
    case PatternKind::power_law: return "power_law";
    case PatternKind::banded: return "banded";
    case PatternKind::block_diagonal: return "block_diagonal";
    case PatternKind::causal: return "causal";
  }
  return "unknown pattern";
}

PatternKind pattern_kind_from_string(const std::string& name) {
  for (PatternKind k : {PatternKind::fixed_k, PatternKind::bernoulli, PatternKind::power_law, PatternKind::banded,
                        PatternKind::block_diagonal, PatternKind::causal})
    if (name == to_string(k)) return k;
  bad("pattern '" + name + "' is not one of: fixed_k, bernoulli, power_law, banded, block_diagonal, causal");
}

Pattern make_pattern(PatternKind kind, int64_t mb, int64_t kb, double density, uint64_t seed) {
  if (mb < 0 || mb > INT32_MAX) bad("mb=" + s(mb) + " is outside [0, 2^31)");
  if (kb < 0 || kb > INT32_MAX) bad("kb=" + s(kb) + " is outside [0, 2^31)");
  if (!(density > 0.0 && density <= 1.0))  // NaN fails too
    bad("density=" + std::to_string(density) + " is not in (0, 1]");
  if (int(kind) < int(PatternKind::fixed_k) || int(kind) > int(PatternKind::causal))
    bad("pattern kind " + s(int(kind)) + " is not one of fixed_k, bernoulli, power_law, banded, block_diagonal, causal");

  Pattern p;
  p.mb = mb;
  p.kb = kb;
  p.row_ptr.assign(size_t(mb + 1), 0);
  std::mt19937_64 rng(seed);
  // Blocks per row for fixed_k and the band width: round(density*kb), at least 1, at most kb.
  const int64_t k_per_row = std::min<int64_t>(kb, std::max<int64_t>(1, std::llround(density * double(kb))));
  auto end_row = [&](int64_t i) {
    if (int64_t(p.col_idx.size()) > INT32_MAX) bad("pattern nnzb overflows int32 row_ptr");
    p.row_ptr[size_t(i + 1)] = int32_t(p.col_idx.size());
  };

  switch (kind) {
    case PatternKind::fixed_k: {
      std::vector<uint8_t> seen(size_t(kb), 0);
      for (int64_t i = 0; i < mb; ++i) {
        sample_sorted(rng, kb, k_per_row, seen, p.col_idx);
        end_row(i);
      }
      break;
    }
    case PatternKind::bernoulli:
      for (int64_t i = 0; i < mb; ++i) {
        for (int64_t j = 0; j < kb; ++j)
          if (uniform01(rng) < density) p.col_idx.push_back(int32_t(j));
        end_row(i);
      }
      break;
    case PatternKind::power_law: {
      // Same nnzb as density*mb*kb (rounded, at least one block when the grid is not empty).
      int64_t total = std::llround(density * double(mb) * double(kb));
      if (mb * kb > 0) total = std::max<int64_t>(total, 1);
      std::vector<int64_t> len = zipf_lengths(mb, kb, total);
      // Heavy rows in random places, not all at the top (Fisher-Yates).
      for (int64_t i = mb - 1; i > 0; --i) std::swap(len[size_t(i)], len[size_t(below(rng, i + 1))]);
      std::vector<uint8_t> seen(size_t(kb), 0);
      for (int64_t i = 0; i < mb; ++i) {
        sample_sorted(rng, kb, len[size_t(i)], seen, p.col_idx);
        end_row(i);
      }
      break;
    }
    case PatternKind::banded:
      // k_per_row columns centred on the diagonal i*kb/mb, clipped at the edges of the grid.
      for (int64_t i = 0; i < mb; ++i) {
        const int64_t lo = i * kb / mb - (k_per_row - 1) / 2;
        for (int64_t j = std::max<int64_t>(lo, 0); j < std::min<int64_t>(lo + k_per_row, kb); ++j)
          p.col_idx.push_back(int32_t(j));
        end_row(i);
      }
      break;
    case PatternKind::block_diagonal: {
      // g groups (experts) of ~mb/g rows x ~kb/g columns: density 1/g, so g = round(1/density),
      // at most min(mb, kb) so that no group is empty.
      const int64_t g = std::max<int64_t>(1, std::min<int64_t>(std::llround(1.0 / density), std::min(mb, kb)));
      for (int64_t i = 0; i < mb; ++i) {
        const int64_t t = i * g / mb;  // group of this block row
        for (int64_t j = t * kb / g; j < (t + 1) * kb / g; ++j) p.col_idx.push_back(int32_t(j));
        end_row(i);
      }
      break;
    }
    case PatternKind::causal:
      // Lower triangle including the diagonal: col <= i*kb/mb (density is validated, not used).
      for (int64_t i = 0; i < mb; ++i) {
        for (int64_t j = 0; j <= std::min(i * kb / mb, kb - 1); ++j) p.col_idx.push_back(int32_t(j));
        end_row(i);
      }
      break;
  }
  return p;
}

BsrMatrix random_bsr(PatternKind kind, int64_t rows, int64_t cols, int bm, int bk, double density, DType dtype,
                     uint64_t seed, bool integers) {
  validate_shape(rows, cols, bm, bk, dtype);  // before dividing by bm / bk
  Pattern p = make_pattern(kind, rows / bm, cols / bk, density, seed);
  BsrMatrix m(rows, cols, bm, bk, std::move(p.row_ptr), std::move(p.col_idx), dtype);
  m.fill_random(seed, integers);
  return m;
}

// ---- attention layouts ----

const char* to_string(LayoutKind k) {
  switch (k) {
    case LayoutKind::topk: return "topk";
    case LayoutKind::dense: return "dense";
    case LayoutKind::causal: return "causal";
  }
  return "unknown layout";
}

AttentionLayout LayoutArrays::view() const {
  AttentionLayout l;
  l.kv_num_blocks = num.data();
  l.kv_indices = idx.empty() ? nullptr : idx.data();
  if (!full_num.empty()) {
    l.full_kv_num_blocks = full_num.data();
    l.full_kv_indices = full_idx.empty() ? nullptr : full_idx.data();
  }
  l.batch = batch;
  l.heads = heads;
  l.q_blocks = q_blocks;
  l.kmax = kmax;
  l.full_kmax = full_kmax;
  l.block_q = l.block_kv = block;
  l.memory = Memory::host;
  return l;
}

LayoutArrays random_attention_layout(LayoutKind kind, int64_t batch, int64_t heads, int64_t sq, int64_t skv,
                                     int block, double density, bool causal, uint64_t seed,
                                     const std::vector<int32_t>& cu) {
  if (batch < 1 || heads < 1 || sq < 1 || skv < 1)
    bad("attention layout extents batch=" + s(batch) + " heads=" + s(heads) + " sq=" + s(sq) + " skv=" + s(skv) +
        " must all be at least 1");
  if (block != 64 && block != 128) bad("attention layout block=" + s(block) + " is not 64 or 128");
  if (!(density > 0.0 && density <= 1.0)) bad("density=" + std::to_string(density) + " is not in (0, 1]");
  if (int(kind) < 0 || int(kind) > int(LayoutKind::causal)) bad("layout kind " + s(int(kind)) + " is not topk, dense or causal");
  causal = causal || kind == LayoutKind::causal;
  if (!cu.empty() && (batch != 1 || sq != skv || cu.front() != 0 || cu.back() != sq || !std::is_sorted(cu.begin(), cu.end())))
    bad("packed attention layout: batch=" + s(batch) + " sq=" + s(sq) + " skv=" + s(skv) +
        " need batch 1, sq = skv and cu_seqlens non-decreasing from 0 to sq");
  LayoutArrays out;
  out.batch = batch;
  out.heads = heads;
  out.block = block;
  out.q_blocks = (sq + block - 1) / block;
  const int64_t nk = (skv + block - 1) / block, rows = batch * heads * out.q_blocks;
  const int64_t k_topk = std::min<int64_t>(nk, std::max<int64_t>(1, std::llround(density * double(nk))));
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> seen(size_t(nk), 0);
  std::vector<std::vector<int32_t>> part(static_cast<size_t>(rows)), full(static_cast<size_t>(rows));
  std::vector<int32_t> chosen;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % out.q_blocks;
    // The blocks [first, end) that may be kept. With causal, block j holds a key <= the block's
    // last query row ((i+1)*block - 1 or sq - 1) exactly when j <= i.
    int64_t first = 0, end = nk, k = k_topk;
    if (!cu.empty()) {
      const int64_t n = int64_t(cu.size()) - 1;
      const int64_t s0 = sequence_of(cu.data(), n, i * block), s1 = sequence_of(cu.data(), n, std::min(sq, (i + 1) * block) - 1);
      first = cu[size_t(s0)] / block;
      end = (cu[size_t(s1) + 1] + block - 1) / block;
      k = std::min<int64_t>(end - first, std::max<int64_t>(1, std::llround(density * double(end - first))));
    }
    if (causal) end = std::min(end, i + 1);
    const int64_t allowed = end - first;
    chosen.clear();
    if (kind != LayoutKind::topk) {
      for (int64_t j = first; j < end; ++j) chosen.push_back(int32_t(j));
    } else if (causal && i < nk) {  // the diagonal block, then k - 1 of the blocks before it
      sample_sorted(rng, allowed - 1, std::min(k, allowed) - 1, seen, chosen);
      for (int32_t& j : chosen) j += int32_t(first);
      chosen.push_back(int32_t(i));
    } else {
      sample_sorted(rng, allowed, std::min(k, allowed), seen, chosen);
      for (int32_t& j : chosen) j += int32_t(first);
    }
    for (int32_t j : chosen) {
      // Unmasked whole: every key of block j is <= the block's first query row.
      const bool whole = causal && std::min(skv, (int64_t(j) + 1) * block) - 1 <= i * block;
      (whole ? full : part)[size_t(r)].push_back(j);
    }
    out.kmax = std::max<int64_t>(out.kmax, int64_t(part[size_t(r)].size()));
    out.full_kmax = std::max<int64_t>(out.full_kmax, int64_t(full[size_t(r)].size()));
  }
  auto pack = [rows](const std::vector<std::vector<int32_t>>& lists, int64_t kmax, std::vector<int32_t>& num,
                     std::vector<int32_t>& idx) {
    num.resize(size_t(rows));
    idx.assign(size_t(rows * kmax), -1);
    for (int64_t r = 0; r < rows; ++r) {
      num[size_t(r)] = int32_t(lists[size_t(r)].size());
      std::copy(lists[size_t(r)].begin(), lists[size_t(r)].end(), idx.begin() + r * kmax);
    }
  };
  pack(part, out.kmax, out.num, out.idx);
  if (causal) pack(full, out.full_kmax, out.full_num, out.full_idx);
  else out.full_kmax = 0;
  return out;
}

}  // namespace sparsek
