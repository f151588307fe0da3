// Problems for the attention checkers / timers (bench/attention_timer.cu, bench/attention_bwd_timer.cu):
// random top-k block layouts (FlexAttention style), inputs uniform in [-1, 1) from a hash (timer.cuh),
// device buffers, and the effective FLOPs of the forward counted on the host.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sparsek/attention.hpp"
#include "timer.cuh"
#include "tools_internal.hpp"

using namespace sparsek;
using bench::fill_uniform;
using bench::to_f;

// The "hopper" variant of an attention table (forward or backward); it is registered in every build.
template <class V>
const V& hopper_variant(const V* v) {
  if (!v) throw Error(Status::internal, "no \"hopper\" attention variant is registered");
  return *v;
}

struct Case {
  std::string name;
  int b = 1, hq = 2, hkv = 2, sq = 256, skv = 256, d = 128, block = 128;
  double density = 0.5;
  bool causal = false, bf16 = true, full = false, empty_rows = false;
  int layout_heads = 0;  // 0: Hq, 1: one row for all heads, 2: Hkv
  int layout_batch = 0;  // 0: B, 1: broadcast
  int kmax_extra = 0;    // kmax beyond the largest count
  float scale = 0.f;
};

// A random top-k layout: each row keeps round(density * allowed) random blocks (causal: j <= i).
// With `full`, blocks strictly below the diagonal (causal) or every other block go to the full list.
struct RandomLayout {
  int64_t lb, lh, mq, kmax, fkmax;
  std::vector<int32_t> num, idx, fnum, fidx;
};
RandomLayout make_layout(const Case& c, std::mt19937& rng) {
  RandomLayout L;
  const int nkb = (c.skv + c.block - 1) / c.block;
  L.mq = (c.sq + c.block - 1) / c.block;
  L.lb = c.layout_batch ? 1 : c.b;
  L.lh = c.layout_heads == 1 ? 1 : c.layout_heads == 2 ? c.hkv : c.hq;
  std::vector<std::vector<int>> part(size_t(L.lb * L.lh * L.mq)), full(part.size());
  int64_t maxp = 0, maxf = 0;
  for (size_t r = 0; r < part.size(); ++r) {
    const int i = int(r % L.mq);
    const int allowed = c.causal ? std::min(nkb, i + 1) : nkb;
    std::vector<int> all(size_t(std::max(allowed, 0)));
    for (int j = 0; j < allowed; ++j) all[size_t(j)] = j;
    std::shuffle(all.begin(), all.end(), rng);
    int keep = int(std::lround(c.density * allowed));
    if (c.empty_rows && r % 3 == 1) keep = 0;
    all.resize(size_t(std::min(keep, allowed)));
    std::sort(all.begin(), all.end());
    for (int j : all) {
      const bool to_full = c.full && (c.causal ? j < i : (j % 2 == 0));
      (to_full ? full[r] : part[r]).push_back(j);
    }
    maxp = std::max<int64_t>(maxp, int64_t(part[r].size()));
    maxf = std::max<int64_t>(maxf, int64_t(full[r].size()));
  }
  L.kmax = maxp + c.kmax_extra;
  L.fkmax = maxf + c.kmax_extra;
  L.num.assign(part.size(), 0);
  L.idx.assign(part.size() * size_t(std::max<int64_t>(L.kmax, 1)), 0);
  L.fnum.assign(part.size(), 0);
  L.fidx.assign(part.size() * size_t(std::max<int64_t>(L.fkmax, 1)), 0);
  for (size_t r = 0; r < part.size(); ++r) {
    L.num[r] = int32_t(part[r].size());
    for (size_t t = 0; t < part[r].size(); ++t) L.idx[r * size_t(L.kmax) + t] = part[r][t];
    L.fnum[r] = int32_t(full[r].size());
    for (size_t t = 0; t < full[r].size(); ++t) L.fidx[r * size_t(L.fkmax) + t] = full[r][t];
  }
  return L;
}

struct Problem {
  Case c;
  RandomLayout L;
  std::vector<uint16_t> q, k, v;
  uint16_t *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  float* dlse = nullptr;
  int32_t *dnum = nullptr, *didx = nullptr, *dfnum = nullptr, *dfidx = nullptr;
  AttentionArgs args;
  double flops = 0;
};

template <class T>
T* upload(const std::vector<T>& v) {
  T* p = nullptr;
  SPARSEK_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)));
  if (!v.empty()) SPARSEK_CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Which blocks row (b, h, i) attends and whether each is from the full list.
void row_blocks(const Problem& P, int b, int h, int i, std::vector<std::pair<int, bool>>& out) {
  const Case& c = P.c;
  const int64_t lb = P.L.lb == 1 ? 0 : b;
  const int64_t lh = P.L.lh == 1 ? 0 : (P.L.lh == c.hkv && c.hkv != c.hq) ? h / (c.hq / c.hkv) : h;
  const int64_t r = (lb * P.L.lh + lh) * P.L.mq + i;
  out.clear();
  for (int t = 0; t < P.L.num[size_t(r)]; ++t) out.push_back({P.L.idx[size_t(r * P.L.kmax + t)], false});
  if (c.full)
    for (int t = 0; t < P.L.fnum[size_t(r)]; ++t) out.push_back({P.L.fidx[size_t(r * P.L.fkmax + t)], true});
}

Problem make_problem(const Case& c, uint32_t seed) {
  Problem P;
  P.c = c;
  std::mt19937 rng(seed);
  P.L = make_layout(c, rng);
  const int64_t nq = int64_t(c.b) * c.hq * c.sq * c.d, nk = int64_t(c.b) * c.hkv * c.skv * c.d;
  SPARSEK_CHECK_CUDA(cudaMalloc(&P.dq, std::max<int64_t>(nq, 1) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&P.dk, std::max<int64_t>(nk, 1) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&P.dv, std::max<int64_t>(nk, 1) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&P.dout, std::max<int64_t>(nq, 1) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&P.dlse, std::max<int64_t>(int64_t(c.b) * c.hq * c.sq, 1) * 4));
  const DType dt = c.bf16 ? DType::bf16 : DType::f16;
  fill_uniform(P.dq, dt, nq, seed * 3 + 1);
  fill_uniform(P.dk, dt, nk, seed * 3 + 2);
  fill_uniform(P.dv, dt, nk, seed * 3 + 3);
  SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());
  P.dnum = upload(P.L.num);
  P.didx = upload(P.L.idx);
  P.dfnum = upload(P.L.fnum);
  P.dfidx = upload(P.L.fidx);
  AttentionArgs& a = P.args;
  a.q = Tensor4View::packed(P.dq, dt, Memory::device, c.b, c.hq, c.sq, c.d);
  a.k = Tensor4View::packed(P.dk, dt, Memory::device, c.b, c.hkv, c.skv, c.d);
  a.v = Tensor4View::packed(P.dv, dt, Memory::device, c.b, c.hkv, c.skv, c.d);
  a.o = Tensor4View::packed(P.dout, dt, Memory::device, c.b, c.hq, c.sq, c.d);
  a.lse = P.dlse;
  a.causal = c.causal;
  a.scale = c.scale;
  AttentionLayout& l = a.layout;
  l.kv_num_blocks = P.dnum;
  l.kv_indices = P.didx;
  if (c.full) {
    l.full_kv_num_blocks = P.dfnum;
    l.full_kv_indices = P.dfidx;
    l.full_kmax = P.L.fkmax;
  }
  l.batch = P.L.lb;
  l.heads = P.L.lh;
  l.q_blocks = P.L.mq;
  l.kmax = P.L.kmax;
  l.block_q = l.block_kv = c.block;
  l.memory = Memory::device;
  // Effective FLOPs: unmasked (query, key) pairs.
  std::vector<std::pair<int, bool>> blocks;
  double pairs = 0;
  for (int b = 0; b < c.b; ++b)
    for (int h = 0; h < c.hq; ++h)
      for (int i = 0; i < P.L.mq; ++i) {
        row_blocks(P, b, h, i, blocks);
        for (auto [j, full] : blocks)
          for (int qi = i * c.block; qi < std::min(c.sq, (i + 1) * c.block); ++qi) {
            int hi = std::min(c.skv, (j + 1) * c.block);
            if (c.causal && !full) hi = std::min(hi, qi + 1);
            pairs += std::max(0, hi - j * c.block);
          }
      }
  P.flops = 4.0 * c.d * pairs;
  return P;
}

void free_problem(Problem& P) {
  for (void* p : {static_cast<void*>(P.dq), static_cast<void*>(P.dk), static_cast<void*>(P.dv),
                  static_cast<void*>(P.dout), static_cast<void*>(P.dlse), static_cast<void*>(P.dnum),
                  static_cast<void*>(P.didx), static_cast<void*>(P.dfnum), static_cast<void*>(P.dfidx)})
    cudaFree(p);
}

