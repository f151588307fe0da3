// The top-k block gate on the GPU (sm_80+): two launches on the caller's stream.
//
//   gate_pool_kernel     one CTA per (b, g, block) of Q (the group's Hq / Hkv heads pooled
//                        together) and of K: reads the block once with 16-byte loads, sums in f32,
//                        writes the mean to the workspace: pooled q [B, Hkv, Mq, D], pooled k
//                        [B, Hkv, Nk, D]. This is the gate's cost: Q and K read once, at copy speed.
//   gate_select_kernel   one CTA per (b, g, R consecutive query blocks): the R x Nk scores
//                        (pooled q . pooled k, f32 FMA over D in order) into shared memory, then one
//                        warp per row picks sink + local + top-k and writes the layout row.
//
// Top-k: src/kernels/topk.cuh (exact, ties -> the lower index, fixed-order reductions: the same
// inputs give the same bits).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/device.hpp"
#include "kernels/dtype.cuh"
#include "kernels/topk.cuh"
#include "plan/gate_internal.hpp"

namespace sparsek {
namespace {

constexpr int kThreads = 256;  // both kernels: 8 warps
constexpr int kMaxRows = 16;   // query blocks per select CTA (fewer when one row's scores are long)
constexpr int kKeyChunk = 128; // pooled k rows staged in shared memory at a time

// ---------------------------------------------------------------- pooling

struct PoolParams {
  const void* q;
  const void* k;
  int64_t q_sb, q_sh, q_ss, k_sb, k_sh, k_ss;  // strides in elements
  int64_t Sq, Skv;
  int Hkv, G, Mq, Nk;
  int64_t q_items;  // B * Hkv * Mq: items [0, q_items) pool Q, the rest pool K
  float* pooled_q;
  float* pooled_k;
};

// 8 consecutive elements: one 16-byte load when aligned (V16), else 8 element loads.
template <class T, bool V16>
__device__ __forceinline__ uint4 load8(const T* p) {
  if constexpr (V16) {
    return __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int x = 0; x < 8; ++x) e[x] = p[x];
    return u;
  }
}
// acc[0..7] += the 8 elements in u.
template <class T>
__device__ __forceinline__ void add8(float (&acc)[8], const uint4& u) {
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int x = 0; x < 8; ++x) acc[x] += dev::to_float(e[x]);
}

// Thread t owns the 16-byte column chunk t % CH of every row it reads and the rows t / CH + m * NRG;
// a full block is BLOCK / NRG loads per thread per head, all issued before the first is used.
template <class T, int D, int BLOCK, bool V16>
__global__ void __launch_bounds__(kThreads) gate_pool_kernel(PoolParams p) {
  constexpr int CH = D / 8;             // 16-byte chunks per row
  constexpr int NRG = kThreads / CH;    // row groups
  constexpr int PER = BLOCK / NRG;      // rows per thread per head in a full block
  static_assert(kThreads % CH == 0 && BLOCK % NRG == 0, "rows must split evenly over the row groups");
  __shared__ float partial[NRG][D];     // 8 KB: one partial sum per row group

  const int t = threadIdx.x, c = t % CH, rg = t / CH;
  int64_t item = blockIdx.x;
  const bool is_q = item < p.q_items;
  if (!is_q) item -= p.q_items;
  const int nblk = is_q ? p.Mq : p.Nk;
  const int64_t blk = item % nblk, bg = item / nblk;  // bg = b * Hkv + g
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int64_t sb = is_q ? p.q_sb : p.k_sb, sh = is_q ? p.q_sh : p.k_sh, ss = is_q ? p.q_ss : p.k_ss;
  const int64_t S = is_q ? p.Sq : p.Skv;
  const int64_t r0 = blk * BLOCK;
  const int nrows = int(S - r0 < BLOCK ? S - r0 : BLOCK);
  const int nheads = is_q ? p.G : 1;
  const int64_t h0 = is_q ? g * p.G : g;
  const T* base = static_cast<const T*>(is_q ? p.q : p.k) + b * sb + r0 * ss + c * 8;

  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int hh = 0; hh < nheads; ++hh) {
    const T* rows = base + (h0 + hh) * sh;
    if (nrows == BLOCK) {
      uint4 v[PER];
#pragma unroll
      for (int m = 0; m < PER; ++m) v[m] = load8<T, V16>(rows + (rg + m * NRG) * ss);
#pragma unroll
      for (int m = 0; m < PER; ++m) add8<T>(acc, v[m]);
    } else {  // the tail block of a sequence
      for (int r = rg; r < nrows; r += NRG) add8<T>(acc, load8<T, V16>(rows + r * ss));
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) partial[rg][c * 8 + e] = acc[e];
  __syncthreads();
  if (t < D) {
    float sum = 0.f;
    for (int r = 0; r < NRG; ++r) sum += partial[r][t];  // fixed order: deterministic
    float* out = is_q ? p.pooled_q + (bg * p.Mq + blk) * D : p.pooled_k + (bg * p.Nk + blk) * D;
    out[t] = sum / float(nheads * nrows);
  }
}

// ---------------------------------------------------------------- scores + selection

struct SelectParams {
  const float* pooled_q;  // nullptr with given scores
  const float* pooled_k;
  const float* given;     // [B, Hkv, Mq, Nk] or nullptr
  int64_t Sq;
  int Hq, Hkv, G, Mq, Nk, block, R;  // R: query blocks per CTA
  float scale;
  bool causal;
  int topk, sink, local;
  const int32_t* cu_seqlens;  // packed sequences [nseq + 1], or null
  int64_t nseq;
  // Candidates (c_num == nullptr: none): lists of (batch c_batch, heads c_heads), rows Mq.
  const int32_t* c_num;
  const int32_t* c_idx;
  const int32_t* c_full_num;  // nullptr: no full lists
  const int32_t* c_full_idx;
  int64_t c_batch, c_heads, c_kmax, c_full_kmax;
  int32_t* out_num;  // [B, Hkv, Mq]
  int32_t* out_idx;  // [B, Hkv, Mq, kmax]
  int64_t kmax;
  float* scores;     // [B, Hkv, Mq, Nk] or nullptr
  // Shared-memory layout, in 4-byte words (each offset a multiple of 4: 16-byte aligned).
  int sm_pk, sm_pq, sm_s, sm_bits, sm_seq;
};

struct SelectSmem {
  int pk, pq, s, bits, seq, words;
};
// Pooled k chunk [kKeyChunk][D + 4] (the +4 keeps the float4 reads of 8 consecutive keys on
// distinct banks), pooled q [round_up4(R)][D], the scores / keys [R][Nk] and the candidate
// bitmap [R][ceil(Nk / 32)], packed sequences' rows {first, end} [R][2].
// Rows of pooled q in shared memory: whole groups of 4, as each scoring thread reads 4 rows.
__host__ __device__ inline int round_up4(int r) { return (r + 3) / 4 * 4; }

SelectSmem select_smem(int D, int R, int64_t Nk, bool computed, bool candidates, bool packed) {
  auto up4 = [](int64_t w) { return (w + 3) / 4 * 4; };
  SelectSmem m{};
  int64_t off = 0;
  m.pk = int(off);
  if (computed) off += int64_t(kKeyChunk) * (D + 4);
  m.pq = int(off);
  if (computed) off += int64_t(round_up4(R)) * D;
  m.s = int(off);
  off += up4(int64_t(R) * Nk);
  m.bits = int(off);
  if (candidates) off += up4(int64_t(R) * ((Nk + 31) / 32));
  m.seq = int(off);
  if (packed) off += up4(2 * int64_t(R));
  m.words = int(std::min<int64_t>(off, int64_t(1) << 30));
  return m;
}

// Query blocks per CTA: 16 while a CTA's scores fit in 32 KB, fewer for long rows.
int rows_per_cta(int64_t Nk) {
  int R = kMaxRows;
  while (R > 1 && int64_t(R) * Nk * 4 > 32768) R /= 2;
  return R;
}

template <int D>
__global__ void __launch_bounds__(kThreads) gate_select_kernel(SelectParams p) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* pk = smem + p.sm_pk;                                // [kKeyChunk][D + 4]
  float* pq = smem + p.sm_pq;                                // [round_up4(R)][D]
  float* S = smem + p.sm_s;                                  // [R][Nk]: scores, then their keys' bits
  uint32_t* bits = reinterpret_cast<uint32_t*>(smem + p.sm_bits);  // [R][W]
  constexpr int PD = D + 4;

  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int Nk = p.Nk, W = (Nk + 31) / 32;
  const int tiles = (p.Mq + p.R - 1) / p.R;
  const int64_t bg = blockIdx.x / tiles;  // b * Hkv + g
  const int64_t b = bg / p.Hkv, g = bg % p.Hkv;
  const int i0 = int(blockIdx.x % tiles) * p.R;
  const int rows = min(p.R, p.Mq - i0);
  const bool cands = p.c_num != nullptr;
  // Packed sequences: each row's selectable key blocks [seq[2r], seq[2r + 1]).
  int* seq = reinterpret_cast<int*>(smem + p.sm_seq);
  if (p.cu_seqlens) {
    if (t < rows) {
      int64_t first, end;
      gate_sequence_blocks(p.cu_seqlens, p.nseq, i0 + t, p.block, p.Sq, first, end);
      seq[2 * t] = int(first < Nk ? first : Nk);
      seq[2 * t + 1] = int(end < Nk ? end : Nk);
    }
    __syncthreads();
  }

  // 1. The candidate bitmap: the union of the row's lists (counts clamped, bad indices ignored).
  if (cands) {
    for (int w = t; w < p.R * W; w += kThreads) bits[w] = 0u;
    __syncthreads();
    const int64_t cb = p.c_batch == 1 ? 0 : b;
    const bool own = p.c_heads == p.Hkv, group = !own && p.c_heads == p.Hq;
    const int64_t h0 = own ? g : group ? g * p.G : 0;
    const int nh = group ? p.G : 1;
    const int nlists = nh * (p.c_full_num ? 2 : 1);
    for (int task = warp; task < rows * nlists; task += kThreads / 32) {
      const int r = task / nlists, l = task % nlists;
      const bool full = l >= nh;
      const int32_t* num = full ? p.c_full_num : p.c_num;
      const int32_t* idx = full ? p.c_full_idx : p.c_idx;
      const int64_t kmax = full ? p.c_full_kmax : p.c_kmax;
      const int64_t crow = (cb * p.c_heads + h0 + (l % nh)) * p.Mq + i0 + r;
      const int64_t n = num[crow] < 0 ? 0 : num[crow] > kmax ? kmax : num[crow];
      for (int64_t e = lane; e < n; e += 32) {
        const int32_t j = idx[crow * kmax + e];
        if (j >= 0 && j < Nk) atomicOr(&bits[r * W + j / 32], 1u << (j % 32));
      }
    }
    __syncthreads();
  }
  auto allowed = [&](int r, int j) {
    if (p.causal && !gate_causal_allows(i0 + r, j, p.block, p.Sq)) return false;
    if (p.cu_seqlens && (j < seq[2 * r] || j >= seq[2 * r + 1])) return false;
    return !cands || ((bits[r * W + j / 32] >> (j % 32)) & 1u) != 0;
  };
  auto put_score = [&](int r, int j, float v) {
    v = allowed(r, j) ? v : -INFINITY;
    S[r * Nk + j] = v;
    if (p.scores) p.scores[(bg * p.Mq + i0 + r) * int64_t(Nk) + j] = v;
  };

  // 2. The R x Nk scores.
  if (p.given) {
    for (int r = 0; r < rows; ++r)
      for (int j = t; j < Nk; j += kThreads) put_score(r, j, p.given[(bg * p.Mq + i0 + r) * int64_t(Nk) + j]);
  } else if (Nk > 0) {
    // pooled q rows i0 .. i0+R-1 (zeros past Mq and in the rows that round R up to 4)
    for (int e = t; e < round_up4(p.R) * (D / 4); e += kThreads) {
      const int r = e / (D / 4), d4 = e % (D / 4);
      const float4 v = r < rows ? __ldg(reinterpret_cast<const float4*>(p.pooled_q + ((bg * p.Mq + i0 + r) * D + 4 * d4)))
                                : make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(pq + r * D + 4 * d4) = v;
    }
    // Thread t: rows 4*rq .. 4*rq+3 against keys kt and kt + 64 of each chunk (one warp: 32
    // consecutive keys, so its pooled-k reads hit distinct banks and its pooled-q reads broadcast).
    const int kt = t % 64, rq = t / 64;
    const bool active = 4 * rq < rows;
    for (int c0 = 0; c0 < Nk; c0 += kKeyChunk) {
      __syncthreads();  // the previous chunk is consumed (and pq is written, the first time)
      // Eight loads in flight per thread before the first store.
      constexpr int kBatch = 8, kPerThread = kKeyChunk * (D / 4) / kThreads;
      static_assert(kPerThread % kBatch == 0, "chunk loads split into whole batches");
#pragma unroll
      for (int u0 = 0; u0 < kPerThread; u0 += kBatch) {
        float4 v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int e = t + (u0 + u) * kThreads, jj = e / (D / 4), d4 = e % (D / 4);
          v[u] = c0 + jj < Nk ? __ldg(reinterpret_cast<const float4*>(p.pooled_k + ((bg * Nk + c0 + jj) * D + 4 * d4)))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int e = t + (u0 + u) * kThreads, jj = e / (D / 4), d4 = e % (D / 4);
          *reinterpret_cast<float4*>(pk + jj * PD + 4 * d4) = v[u];
        }
      }
      __syncthreads();
      if (active) {
        float acc[4][2] = {};
#pragma unroll 8
        for (int d4 = 0; d4 < D / 4; ++d4) {
          const float4 k0 = *reinterpret_cast<const float4*>(pk + kt * PD + 4 * d4);
          const float4 k1 = *reinterpret_cast<const float4*>(pk + (kt + 64) * PD + 4 * d4);
#pragma unroll
          for (int rr = 0; rr < 4; ++rr) {
            const float4 qv = *reinterpret_cast<const float4*>(pq + (4 * rq + rr) * D + 4 * d4);
            acc[rr][0] = fmaf(qv.w, k0.w, fmaf(qv.z, k0.z, fmaf(qv.y, k0.y, fmaf(qv.x, k0.x, acc[rr][0]))));
            acc[rr][1] = fmaf(qv.w, k1.w, fmaf(qv.z, k1.z, fmaf(qv.y, k1.y, fmaf(qv.x, k1.x, acc[rr][1]))));
          }
        }
#pragma unroll
        for (int rr = 0; rr < 4; ++rr)
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            const int r = 4 * rq + rr, j = c0 + kt + 64 * kk;
            if (r < rows && j < Nk) put_score(r, j, p.scale * acc[rr][kk]);
          }
      }
    }
  }
  __syncthreads();

  // 3. One warp per row: keys, the threshold, the ascending write (src/kernels/topk.cuh).
  for (int r = warp; r < rows; r += kThreads / 32) {
    const int i = i0 + r;
    float* srow = S + r * Nk;
    auto key = [&](int j) { return __float_as_uint(srow[j]); };
    const int first = p.cu_seqlens ? seq[2 * r] : 0;
    auto on = [&](int j) { return allowed(r, j) && gate_always_on(i, j, p.sink, p.local, first); };
    // Every lane reads and rewrites only its own j = lane + 32m: no barrier needed below.
    for (int j = lane; j < Nk; j += 32) {
      const bool ok = allowed(r, j);
      srow[j] = __uint_as_float(ok && !gate_always_on(i, j, p.sink, p.local, first) ? gate_order_key(srow[j]) : 0u);
    }
    const dev::TopkThreshold th = dev::warp_topk_threshold(key, Nk, uint32_t(p.topk));
    const int64_t orow = bg * p.Mq + i;
    int32_t* out = p.out_idx + orow * p.kmax;
    const int pos = dev::warp_write_selected(key, Nk, th, on, out, p.kmax);
    for (int64_t e = pos + lane; e < p.kmax; e += 32) out[e] = 0;
    if (lane == 0) p.out_num[orow] = int32_t(pos < p.kmax ? pos : p.kmax);
  }
}

// ---------------------------------------------------------------- host side

template <class T, int D, int BLOCK>
void launch_pool(const PoolParams& pp, int64_t items, bool v16, cudaStream_t stream) {
  if (v16)
    gate_pool_kernel<T, D, BLOCK, true><<<unsigned(items), kThreads, 0, stream>>>(pp);
  else
    gate_pool_kernel<T, D, BLOCK, false><<<unsigned(items), kThreads, 0, stream>>>(pp);
}
template <class T>
void launch_pool_t(const PoolParams& pp, int64_t items, int D, int block, bool v16, cudaStream_t stream) {
  if (D == 64 && block == 64) launch_pool<T, 64, 64>(pp, items, v16, stream);
  if (D == 64 && block == 128) launch_pool<T, 64, 128>(pp, items, v16, stream);
  if (D == 128 && block == 64) launch_pool<T, 128, 64>(pp, items, v16, stream);
  if (D == 128 && block == 128) launch_pool<T, 128, 128>(pp, items, v16, stream);
}

// 16-byte loads need a 16-byte aligned base and strides of whole 16-byte chunks.
bool aligned16(const Tensor4View& t) {
  const int64_t e = 16 / int64_t(dtype_size(t.dtype));
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride_b % e == 0 && t.stride_h % e == 0 &&
         t.stride_s % e == 0;
}

}  // namespace

std::string gate_cuda_why_not(const GateArgs& a, const GateShape& s) {
  const int R = rows_per_cta(s.Nk);
  const SelectSmem m = select_smem(int(s.D), R, s.Nk, a.given_scores == nullptr, a.candidates != nullptr,
                                   a.cu_seqlens != nullptr);
  const size_t limit = device_info().smem_per_block_optin;
  if (size_t(m.words) * 4 > limit)
    return "Nk=" + std::to_string(s.Nk) + " key blocks: one row's scores need " + std::to_string(int64_t(m.words) * 4) +
           " bytes of shared memory, more than the device's " + std::to_string(limit);
  const int64_t pool_items = s.B * s.Hkv * (s.Mq + s.Nk);
  const int64_t select_ctas = s.B * s.Hkv * ((s.Mq + R - 1) / R);
  if (pool_items > 0x7fffffff || select_ctas > 0x7fffffff || s.Mq > 0x7fffffff || s.Nk > 0x7fffffff)
    return "B * Hkv * (Mq + Nk) = " + std::to_string(pool_items) + " blocks exceed one launch's grid";
  if (s.G > 0x7fffffff || s.Hkv > 0x7fffffff) return "too many heads";
  return "";
}

void gate_cuda(const GateArgs& a, const GateShape& s, void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (s.rows() == 0) return;
  const bool given = a.given_scores != nullptr;
  float* pooled_q = static_cast<float*>(a.workspace);
  float* pooled_k = given ? nullptr : pooled_q + s.pooled_q_floats();

  if (!given && s.Nk > 0) {
    PoolParams pp{};
    pp.q = a.q.data;
    pp.k = a.k.data;
    pp.q_sb = a.q.stride_b, pp.q_sh = a.q.stride_h, pp.q_ss = a.q.stride_s;
    pp.k_sb = a.k.stride_b, pp.k_sh = a.k.stride_h, pp.k_ss = a.k.stride_s;
    pp.Sq = s.Sq, pp.Skv = s.Skv;
    pp.Hkv = int(s.Hkv), pp.G = int(s.G), pp.Mq = int(s.Mq), pp.Nk = int(s.Nk);
    pp.q_items = s.B * s.Hkv * s.Mq;
    pp.pooled_q = pooled_q;
    pp.pooled_k = pooled_k;
    const int64_t items = pp.q_items + s.B * s.Hkv * s.Nk;
    const bool v16 = aligned16(a.q) && aligned16(a.k);
    if (a.q.dtype == DType::f16)
      launch_pool_t<__half>(pp, items, int(s.D), s.block, v16, stream);
    else
      launch_pool_t<__nv_bfloat16>(pp, items, int(s.D), s.block, v16, stream);
    check_cuda(cudaGetLastError(), "gate_pool_kernel launch");
  }

  SelectParams sp{};
  sp.pooled_q = pooled_q;
  sp.pooled_k = pooled_k;
  sp.given = a.given_scores;
  sp.Sq = s.Sq;
  sp.Hq = int(s.Hq), sp.Hkv = int(s.Hkv), sp.G = int(s.G), sp.Mq = int(s.Mq), sp.Nk = int(s.Nk);
  sp.block = s.block;
  sp.R = rows_per_cta(s.Nk);
  sp.scale = s.scale;
  sp.causal = a.causal;
  sp.topk = a.topk, sp.sink = a.sink, sp.local = a.local;
  sp.cu_seqlens = a.cu_seqlens;
  sp.nseq = a.num_seqs;
  if (const AttentionLayout* c = a.candidates) {
    sp.c_num = c->kv_num_blocks;
    sp.c_idx = c->kv_indices;
    sp.c_full_num = c->full_kv_num_blocks;
    sp.c_full_idx = c->full_kv_indices;
    sp.c_batch = c->batch, sp.c_heads = c->heads, sp.c_kmax = c->kmax, sp.c_full_kmax = c->full_kmax;
  }
  sp.out_num = a.kv_num_blocks;
  sp.out_idx = a.kv_indices;
  sp.kmax = a.kmax;
  sp.scores = a.scores;
  const SelectSmem m = select_smem(int(s.D), sp.R, s.Nk, !given, a.candidates != nullptr, a.cu_seqlens != nullptr);
  sp.sm_pk = m.pk, sp.sm_pq = m.pq, sp.sm_s = m.s, sp.sm_bits = m.bits, sp.sm_seq = m.seq;
  const size_t bytes = size_t(m.words) * 4;
  const unsigned ctas = unsigned(s.B * s.Hkv * ((s.Mq + sp.R - 1) / sp.R));
  auto launch = [&](auto kernel) {
    // NOTE: more than 48 KB of dynamic shared memory needs a per-kernel opt-in; it is set to the
    // device's limit (one value for every call, so concurrent callers cannot undo each other).
    if (bytes > 48 * 1024)
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(device_info().smem_per_block_optin)),
                 "cudaFuncSetAttribute(gate_select_kernel, max dynamic shared memory)");
    kernel<<<ctas, kThreads, bytes, stream>>>(sp);
  };
  if (s.D == 64)
    launch(gate_select_kernel<64>);
  else
    launch(gate_select_kernel<128>);
  check_cuda(cudaGetLastError(), "gate_select_kernel launch");
}

}  // namespace sparsek
