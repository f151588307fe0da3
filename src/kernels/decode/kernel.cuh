// The paged decode kernels (sm_80+, CUDA cores; decode is memory-bound).
//
// decode_split_kernel: one CTA per (request b, key/value head hk, KV chunk, tile of 16 rows). A
// row is (new token j, query head of the group): rows r = j * G + g of the request's G * n, so one
// CTA shares each K/V load among up to 16 of them (n = 1: the group's heads; n = 4 with G = 4:
// all 16). The chunk is a fixed range of the request's page list (the selection's entries, or its
// pages in order), chosen by the host from the shapes alone. K and V stream through shared
// memory in tiles of 16 keys (a page is page_size / 16 tiles) in a kStages-deep cp.async pipeline
// with 16-byte copies; keys past seq_len and tiles of malformed pages (logical page beyond the
// request, physical page outside the cache) are zero-filled and masked, never read. Per tile:
//   scores  S[16 rows][16 keys] = q . k (q pre-scaled by scale * log2 e), masked to -inf
//   softmax one thread per row: running max m and sum l (log2 domain), P = exp2(S - m), alpha
//   PV      one thread per (row, 16 or 8 dims): acc = acc * alpha + P V
// With one chunk the CTA writes O = acc / l and LSE = (m + log2 l) ln 2; else the unnormalized
// acc, m and l of its rows go to the workspace and decode_combine_kernel merges the chunks of a
// row in chunk order (fixed: the same inputs give the same bits).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.cuh"
#include "kernels/ptx/mma_sm80.cuh"  // cp.async

namespace sparsek::decode_gpu {

constexpr int kThreads = 128;
constexpr int kRows = 16;    // rows per CTA
constexpr int kKeys = 16;    // keys per tile
constexpr int kStages = 4;   // tiles in flight per CTA
constexpr int kMaxNew = 16;  // new tokens per request

struct Params {
  const void* q;
  void* o;
  float* lse;
  const void* k;
  const void* v;
  const int32_t* page_table;
  const int32_t* seq_lens;
  const int32_t* cu_seqlens_q;
  const int32_t* sel_indices;  // null: no selection
  const int32_t* sel_counts;
  int64_t q_st, q_sh, o_st, o_sh;                  // token and head strides of q, o (elements)
  int64_t c_sp, c_ss, c_sh;                        // page, slot and head strides of the cache
  int tokens, hq, hkv, group, page_size, num_pages, max_pages, sel_kmax;
  int entries_max;   // sel_kmax or max_pages: the chunks split [0, entries_max)
  int splits, chunk;  // chunk = ceil(entries_max / splits) entries
  int causal;
  int max_new;       // new tokens a request can have: min(16, T - B + 1) (the others have >= 1 each)
  float scale_log2;  // softmax scale * log2(e)
  float* ws_o;       // [B * Hkv, splits, group * max_new, D] unnormalized acc
  float2* ws_ml;     // [B * Hkv, splits, group * max_new] (m, l), log2 domain
};

// The request's new tokens and length, clamped so that malformed arrays cannot send a read or a
// write out of bounds (n to max_new: the grid and the workspace hold group * max_new rows).
struct Request {
  int q0, n, len;
};
__device__ __forceinline__ Request request_of(const Params& p, int b) {
  Request r;
  r.q0 = min(max(p.cu_seqlens_q[b], 0), p.tokens);
  r.n = min(max(p.cu_seqlens_q[b + 1] - r.q0, 0), min(p.max_new, p.tokens - r.q0));
  r.len = int(min(max(int64_t(p.seq_lens[b]), int64_t(0)), int64_t(p.max_pages) * p.page_size));
  return r;
}

// q . k over D: k a row of 16-bit elements in shared memory, q (pre-scaled) floats.
template <int D, class T>
__device__ __forceinline__ float dot_row(const T* k, const float* q) {
  float s = 0.f;
#pragma unroll 4
  for (int c = 0; c < D / 8; ++c) {
    const uint4 raw = *reinterpret_cast<const uint4*>(k + c * 8);
    const T* e = reinterpret_cast<const T*>(&raw);
    const float4 a0 = *reinterpret_cast<const float4*>(q + c * 8);
    const float4 a1 = *reinterpret_cast<const float4*>(q + c * 8 + 4);
    s += a0.x * dev::to_float(e[0]) + a0.y * dev::to_float(e[1]) + a0.z * dev::to_float(e[2]) +
         a0.w * dev::to_float(e[3]) + a1.x * dev::to_float(e[4]) + a1.y * dev::to_float(e[5]) +
         a1.z * dev::to_float(e[6]) + a1.w * dev::to_float(e[7]);
  }
  return s;
}

// The end of a split-kernel CTA for row rr (token rr / G, head hk * G + rr % G) of the 8 threads
// that own its dims pd .. pd + D/8 - 1 (`leader`: one of the 8): with one chunk O = acc / l (0 where
// the row saw nothing) and LSE = (m + log2 l) ln 2; with several, the unnormalized acc and (m, l),
// log2 domain, to the chunk's rows of the workspace. Shared by both variants.
template <int D, class T>
__device__ __forceinline__ void write_row(const Params& p, const Request& rq, int bh, int hk, int split, int rr, int pd,
                                          bool leader, const float (&acc)[D / 8], float m, float l) {
  constexpr int N = D / 8;
  if (p.splits == 1) {
    const int j = rr / p.group, h = hk * p.group + rr % p.group, tok = rq.q0 + j;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    T* o = static_cast<T*>(p.o) + int64_t(tok) * p.o_st + int64_t(h) * p.o_sh + pd;
#pragma unroll
    for (int c = 0; c < N; c += 8) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int x = 0; x < 8; ++x) e[x] = dev::from_float<T>(acc[c + x] * inv);
      *reinterpret_cast<uint4*>(o + c) = raw;
    }
    if (p.lse && leader) p.lse[int64_t(tok) * p.hq + h] = l > 0.f ? (m + log2f(l)) * 0.69314718055994531f : -INFINITY;
  } else {
    const int64_t row = (int64_t(bh) * p.splits + split) * (p.group * p.max_new) + rr;
    float* w = p.ws_o + row * D + pd;
#pragma unroll
    for (int c = 0; c < N; c += 4) *reinterpret_cast<float4*>(w + c) = make_float4(acc[c], acc[c + 1], acc[c + 2], acc[c + 3]);
    if (leader) p.ws_ml[row] = make_float2(m, l);
  }
}

template <int D, class T>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(const Params p) {
  constexpr int kPitch = D + 8;  // halves per smem K/V row: 16-byte aligned, spreads the banks
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kDimsPerThread = D / 8;  // PV: 8 threads per row
  __shared__ alignas(16) T ks[kStages][kKeys][kPitch];
  __shared__ alignas(16) T vs[kStages][kKeys][kPitch];
  __shared__ alignas(16) float qs[kRows][D];
  __shared__ float ps_[kRows][kKeys];
  __shared__ float alpha_s[kRows];
  __shared__ float2 ml_s[kRows];
  __shared__ int tile_pos[kStages], tile_keys[kStages];

  const int tid = threadIdx.x;
  const int bh = blockIdx.x, split = blockIdx.y, tile_r = blockIdx.z;
  const int b = bh / p.hkv, hk = bh % p.hkv;
  const Request rq = request_of(p, b);
  const int rows_all = p.group * rq.n;
  const int r_base = tile_r * kRows;
  if (r_base >= rows_all) return;  // this row tile is past the request's rows (uniform exit)

  // The chunk's entries.
  int entries = (rq.len + p.page_size - 1) / p.page_size;
  const int32_t* sel = nullptr;
  if (p.sel_counts) {
    entries = min(max(p.sel_counts[bh], 0), p.sel_kmax);
    sel = p.sel_indices + int64_t(bh) * p.sel_kmax;
  }
  const int e0 = split * p.chunk, e1 = min(e0 + p.chunk, entries);
  const int subs = p.page_size / kKeys;
  const int ntiles = e1 > e0 ? (e1 - e0) * subs : 0;
  const int npages = (rq.len + p.page_size - 1) / p.page_size;

  // q rows of this tile, scaled, as float; rows past the request's are zero (masked below).
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, rr = r_base + r;
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (rr < rows_all) {
      const int j = rr / p.group, h = hk * p.group + rr % p.group;
      const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.q) + int64_t(rq.q0 + j) * p.q_st +
                                                        int64_t(h) * p.q_sh + c * 8);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int x = 0; x < 8; ++x) f[x] = dev::to_float(e[x]) * p.scale_log2;
    }
#pragma unroll
    for (int x = 0; x < 8; ++x) qs[r][c * 8 + x] = f[x];
  }

  // Issues the copies of tile t into stage st (zero-fill where nothing may be read).
  auto issue = [&](int t, int st) {
    const int e = e0 + t / subs, sub = t % subs;
    const int lp = sel ? sel[e] : e;
    int keys = 0, pp = 0;
    if (lp >= 0 && lp < npages) {
      pp = p.page_table[int64_t(b) * p.max_pages + lp];
      if (pp >= 0 && pp < p.num_pages) keys = min(kKeys, max(rq.len - lp * p.page_size - sub * kKeys, 0));
    }
    if (tid == 0) {
      tile_pos[st] = keys > 0 ? lp * p.page_size + sub * kKeys : 0;
      tile_keys[st] = keys;
    }
    const int64_t base = int64_t(keys > 0 ? pp : 0) * p.c_sp + int64_t(hk) * p.c_sh;
    for (int i = tid; i < kKeys * kChunks; i += kThreads) {
      const int key = i / kChunks, c = i % kChunks;
      const bool live = key < keys;
      const int64_t off = base + (live ? int64_t(sub * kKeys + key) * p.c_ss : 0) + c * 8;
      ptx::cp_async_16(ptx::smem_addr(&ks[st][key][c * 8]), static_cast<const T*>(p.k) + off, live ? 16 : 0);
      ptx::cp_async_16(ptx::smem_addr(&vs[st][key][c * 8]), static_cast<const T*>(p.v) + off, live ? 16 : 0);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ntiles) issue(s, s);
    ptx::cp_async_commit();
  }

  // Row state: thread r < kRows keeps m and l of row r (log2 domain).
  float m_run = -INFINITY, l_run = 0.f;
  // PV ownership: row pr, dims pd .. pd + kDimsPerThread - 1.
  const int pr = tid / 8, pd = (tid % 8) * kDimsPerThread;
  float acc[kDimsPerThread];
#pragma unroll
  for (int x = 0; x < kDimsPerThread; ++x) acc[x] = 0.f;
  // Score ownership: key sk, rows sr and sr + 8.
  const int sk = tid % kKeys, sr = tid / kKeys;
  // Causal limits of the score rows: visible positions < limit.
  auto limit_of = [&](int r) {
    const int rr = r_base + r;
    if (rr >= rows_all) return -1;
    return p.causal ? rq.len - rq.n + rr / p.group + 1 : rq.len;
  };
  const int lim0 = limit_of(sr), lim1 = limit_of(sr + 8);

  for (int t = 0; t < ntiles; ++t) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // tile t landed for all; everyone is done with tile t - 1 (its stage, P)
    if (t + kStages - 1 < ntiles) issue(t + kStages - 1, (t + kStages - 1) % kStages);
    ptx::cp_async_commit();
    const int st = t % kStages;

    // Scores (rows past the request's are skipped: with one new token and G = 4 only 4 of the
    // 16 rows live, and the warps that own none of them do nothing).
    {
      const int pos = tile_pos[st] + sk;
      const bool live = sk < tile_keys[st];
      float s0 = -INFINITY, s1 = -INFINITY;
      if (lim0 >= 0) s0 = dot_row<D, T>(&ks[st][sk][0], &qs[sr][0]);
      if (lim1 >= 0) s1 = dot_row<D, T>(&ks[st][sk][0], &qs[sr + 8][0]);
      ps_[sr][sk] = live && pos < lim0 ? s0 : -INFINITY;
      ps_[sr + 8][sk] = live && pos < lim1 ? s1 : -INFINITY;
    }
    __syncthreads();

    // Online softmax, one thread per row.
    if (tid < kRows) {
      float mx = m_run;
#pragma unroll
      for (int k = 0; k < kKeys; ++k) mx = fmaxf(mx, ps_[tid][k]);
      float alpha = 1.f, sum = 0.f;
      if (mx != -INFINITY) {
        alpha = exp2f(m_run - mx);  // m_run = -inf: 0 (nothing summed yet)
#pragma unroll
        for (int k = 0; k < kKeys; ++k) {
          const float e = exp2f(ps_[tid][k] - mx);
          ps_[tid][k] = e;
          sum += e;
        }
        m_run = mx;
      } else {
#pragma unroll
        for (int k = 0; k < kKeys; ++k) ps_[tid][k] = 0.f;
      }
      l_run = l_run * alpha + sum;
      alpha_s[tid] = alpha;
    }
    __syncthreads();

    // acc = acc * alpha + P V (rows past the request's skipped).
    if (r_base + pr < rows_all) {
      const float a = alpha_s[pr];
#pragma unroll
      for (int x = 0; x < kDimsPerThread; ++x) acc[x] *= a;
#pragma unroll 4
      for (int k = 0; k < kKeys; ++k) {
        const float pk = ps_[pr][k];
#pragma unroll
        for (int c = 0; c < kDimsPerThread; c += 8) {
          const uint4 raw = *reinterpret_cast<const uint4*>(&vs[st][k][pd + c]);
          const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int x = 0; x < 8; ++x) acc[c + x] += pk * dev::to_float(e[x]);
        }
      }
    }
  }
  ptx::cp_async_wait<0>();

  if (tid < kRows) ml_s[tid] = make_float2(m_run, l_run);
  __syncthreads();
  const int rr = r_base + pr;
  if (rr >= rows_all) return;
  const float2 ml = ml_s[pr];
  write_row<D, T>(p, rq, bh, hk, split, rr, pd, tid % 8 == 0, acc, ml.x, ml.y);
}

// One CTA of D x kCombineRows threads per (request b, key/value head hk): thread (d, y) merges
// element d of rows y, y + kCombineRows, ... of the request's G * n rows, the chunks in chunk order
// (fixed). Empty chunks carry m = -inf, l = 0 (weight 0). One CTA per (request, head) rather than
// one per row: with one new token most rows do not exist, and empty CTAs still cost launch slots.
constexpr int kCombineRows = 4;
template <int D, class T>
__global__ void __launch_bounds__(D * kCombineRows) decode_combine_kernel(const Params p) {
  const int bh = blockIdx.x, d = threadIdx.x;
  const int b = bh / p.hkv, hk = bh % p.hkv;
  const Request rq = request_of(p, b);
  const int64_t step = p.group * p.max_new;
  for (int rr = threadIdx.y; rr < p.group * rq.n; rr += kCombineRows) {
    const int64_t row0 = int64_t(bh) * p.splits * step + rr;
    float mx = -INFINITY;
    for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, p.ws_ml[row0 + s * step].x);
    float l = 0.f, o = 0.f;
    if (mx != -INFINITY) {
      for (int s = 0; s < p.splits; ++s) {
        const float2 ml = p.ws_ml[row0 + s * step];
        const float w = exp2f(ml.x - mx);  // an empty chunk: exp2(-inf) = 0
        l += ml.y * w;
        o += p.ws_o[(row0 + s * step) * D + d] * w;
      }
    }
    const int j = rr / p.group, h = hk * p.group + rr % p.group, tok = rq.q0 + j;
    static_cast<T*>(p.o)[int64_t(tok) * p.o_st + int64_t(h) * p.o_sh + d] = dev::from_float<T>(l > 0.f ? o / l : 0.f);
    if (p.lse && d == 0) p.lse[int64_t(tok) * p.hq + h] = l > 0.f ? (mx + log2f(l)) * 0.69314718055994531f : -INFINITY;
  }
}

}  // namespace sparsek::decode_gpu
