// Causal top-k attention layouts as the gate makes them, for the context-parallel benchmarks
// (attention_cp_plan.cpp, distributed_attention.cpp): each query block keeps the diagonal block and
// round(density * key blocks) - 1 random earlier ones (fewer near the start), per query head,
// 128x128 blocks, in host memory.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "sparsek/attention.hpp"

namespace sparsek::bench {

struct CausalTopk {
  std::vector<int32_t> num, idx;
  AttentionLayout view;
};

inline CausalTopk causal_topk(int64_t heads, int64_t nb, double density, uint64_t seed) {
  const int64_t kmax = std::max<int64_t>(1, std::llround(density * double(nb)));
  CausalTopk l;
  l.num.assign(size_t(heads * nb), 0);
  l.idx.assign(size_t(heads * nb * kmax), 0);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> pick;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t k = std::min(kmax, i + 1);
      pick.clear();
      // k - 1 distinct earlier blocks (Floyd's sampling), then the diagonal, ascending.
      for (int64_t t = i - (k - 1); t < i; ++t) {
        const int32_t v = int32_t(std::uniform_int_distribution<int64_t>(0, t)(rng));
        pick.push_back(std::find(pick.begin(), pick.end(), v) == pick.end() ? v : int32_t(t));
      }
      pick.push_back(int32_t(i));
      std::sort(pick.begin(), pick.end());
      const int64_t row = h * nb + i;
      l.num[size_t(row)] = int32_t(pick.size());
      std::copy(pick.begin(), pick.end(), l.idx.begin() + row * kmax);
    }
  AttentionLayout& v = l.view;
  v.kv_num_blocks = l.num.data(), v.kv_indices = l.idx.data();
  v.batch = 1, v.heads = heads, v.q_blocks = nb, v.kmax = kmax;
  v.block_q = v.block_kv = 128;
  v.memory = Memory::host;
  return l;
}

}  // namespace sparsek::bench
