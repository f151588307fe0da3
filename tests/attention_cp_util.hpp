// Test helpers of context-parallel attention (tests/cpu/test_attention_cp.cpp,
// tests/gpu/test_attention_cp.cpp): a problem's description, a random valid layout, packed host
// tensors of any dtype and the row slices a rank holds.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sparsek/attention.hpp"

namespace sparsek::test {

struct CpCase {
  int64_t batch = 1, hq = 2, hkv = 2, sq = 640, skv = 640, d = 64;
  int block = 128;
  int64_t lbatch = 1, heads = 1;  // the layout's extents
  bool causal = false, full = false;
  int ranks = 2;
  DType dtype = DType::f32;
  uint64_t seed = 1;
};

inline std::string name(const CpCase& c) {
  return "B" + std::to_string(c.batch) + " hq" + std::to_string(c.hq) + " hkv" + std::to_string(c.hkv) + " sq" +
         std::to_string(c.sq) + " skv" + std::to_string(c.skv) + " d" + std::to_string(c.d) + " block" +
         std::to_string(c.block) + " layout[" + std::to_string(c.lbatch) + "," + std::to_string(c.heads) + "]" +
         (c.causal ? " causal" : "") + (c.full ? " full" : "") + " ranks" + std::to_string(c.ranks) + " " +
         to_string(c.dtype) + " seed" + std::to_string(c.seed);
}

struct CpLayout {
  std::vector<int32_t> num, idx, fnum, fidx;
  AttentionLayout view;
};

// Random rows, sorted and unique, the full list disjoint; with causal the diagonal block is in the
// partial list (a row always attends its own block) and the other blocks are earlier ones.
inline CpLayout random_layout(const CpCase& c, std::mt19937_64& rng) {
  const int64_t mq = (c.sq + c.block - 1) / c.block, nk = (c.skv + c.block - 1) / c.block, kmax = 4, fkmax = 2;
  const int64_t rows = c.lbatch * c.heads * mq;
  CpLayout l;
  l.num.assign(size_t(rows), 0), l.idx.assign(size_t(rows * kmax), 0);
  l.fnum.assign(size_t(rows), 0), l.fidx.assign(size_t(rows * fkmax), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % mq;
    std::vector<int32_t> all;
    const int64_t top = c.causal ? std::min(i, nk - 1) : nk - 1;  // with causal: the diagonal and earlier blocks
    for (int64_t j = 0; j <= top; ++j)
      if (!c.causal || j != i) all.push_back(int32_t(j));
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> part, full;
    if (c.causal) part.push_back(int32_t(i));
    size_t at = 0;
    const int64_t np = int64_t(rng() % 3), nf = c.full ? int64_t(rng() % 3) : 0;
    for (; at < all.size() && int64_t(part.size()) < (c.causal ? 1 : 0) + np && int64_t(part.size()) < kmax; ++at)
      part.push_back(all[at]);
    for (; at < all.size() && int64_t(full.size()) < std::min(nf, fkmax); ++at) full.push_back(all[at]);
    std::sort(part.begin(), part.end()), std::sort(full.begin(), full.end());
    l.num[size_t(r)] = int32_t(part.size()), l.fnum[size_t(r)] = int32_t(full.size());
    std::copy(part.begin(), part.end(), l.idx.begin() + r * kmax);
    std::copy(full.begin(), full.end(), l.fidx.begin() + r * fkmax);
  }
  AttentionLayout& v = l.view;
  v.kv_num_blocks = l.num.data(), v.kv_indices = l.idx.data();
  if (c.full) v.full_kv_num_blocks = l.fnum.data(), v.full_kv_indices = l.fidx.data(), v.full_kmax = fkmax;
  v.batch = c.lbatch, v.heads = c.heads, v.q_blocks = mq, v.kmax = kmax;
  v.block_q = v.block_kv = c.block;
  v.memory = Memory::host;
  return l;
}

// A packed host tensor; f32 storage for any dtype is not needed: bytes of the dtype.
struct T4 {
  std::vector<uint8_t> bytes;
  Tensor4View v;
  T4(DType t, int64_t b, int64_t h, int64_t s, int64_t d)
      : bytes(size_t(std::max<int64_t>(1, b * h * s * d)) * dtype_size(t)) {
    v = Tensor4View::packed(bytes.data(), t, Memory::host, b, h, s, d);
  }
  float at(int64_t e) const { return load_as_float(bytes.data(), v.dtype, e); }
  void set(int64_t e, float x) { store_from_float(bytes.data(), v.dtype, e, x); }
  int64_t size() const { return v.b * v.h * v.s * v.d; }
};

inline void randomize(T4& t, std::mt19937_64& rng) {
  std::normal_distribution<float> n(0.f, 1.f);
  for (int64_t e = 0; e < t.size(); ++e) t.set(e, n(rng));
}
inline void poison(T4& t) {
  for (int64_t e = 0; e < t.size(); ++e) t.set(e, std::numeric_limits<float>::quiet_NaN());
}

// Rows [r0, r1) of every (b, h) of a whole tensor, packed.
inline T4 slice(const T4& w, int64_t r0, int64_t r1) {
  T4 s(w.v.dtype, w.v.b, w.v.h, r1 - r0, w.v.d);
  for (int64_t bh = 0; bh < w.v.b * w.v.h; ++bh)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t e = 0; e < w.v.d; ++e) s.set((bh * (r1 - r0) + r - r0) * w.v.d + e, w.at((bh * w.v.s + r) * w.v.d + e));
  return s;
}

}  // namespace sparsek::test
