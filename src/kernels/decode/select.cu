// Page selection on the GPU (sm_80+): the page summaries' update and the per-(request, head) top-k
// of pages (include/sparsek/decode.hpp gives the semantics; src/cpu/page_select_cpu.cpp the
// reference: the summaries match it bit for bit, the bounds up to the f32 rounding of their sums).
//
//   page_summary_kernel  one CTA per (request, key/value head, page): thread d walks the page's
//                        stored slots of channel d (consecutive threads, consecutive addresses)
//                        and writes its minimum and maximum. Without all_pages only the one or two
//                        pages that hold the new tokens (n <= 16 <= page_size) run.
//   page_select_kernel   one CTA (8 warps) per (request, key/value head); meant to be bound by the
//                        summaries' bytes. The group's query vectors (G heads x n new tokens) wait
//                        in shared memory as [q-, q+] rows in the cache's dtype. Each warp loads
//                        16 pages' summaries at a time straight into registers (16-byte chunks)
//                        and bounds them against 8 vectors at a time with tensor-core products
//                        (mma.sync, f32 accumulation); the best bound per page goes to shared
//                        memory as an order key, the CTA finds the exact top-k threshold
//                        (src/kernels/topk.cuh, a radix select) and warp 0 writes the row ascending.
//
// Index contents are not trusted: counts and lengths are clamped, pages outside the cache are
// never read (their score is "not pickable"), writes stay inside the outputs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/device.hpp"
#include "kernels/decode/launch.hpp"
#include "kernels/dtype.cuh"
#include "kernels/ptx/mma_sm80.cuh"  // mma.sync m16n8k16
#include "kernels/topk.cuh"
#include "plan/gate_internal.hpp"  // gate_order_key, summary_min, summary_max

namespace sparsek::page_select_gpu {
namespace {

constexpr int kSelectThreads = 256;  // 8 warps: each loads and scores 16 pages at a time
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kVecChunk = 32;  // query vectors staged in shared memory at a time (at most)
constexpr int kVecTiles = kVecChunk / 8;  // tiles of 8 vectors (the mma's n) in a chunk
constexpr int kMaxNew = 16;

struct Params {
  const void* q;
  const void* k;
  void* summaries;  // [num_pages, hkv, 2, D]
  const int32_t* page_table;
  const int32_t* seq_lens;
  const int32_t* cu_seqlens_q;
  int32_t* sel_indices;
  int32_t* sel_counts;
  int64_t q_st, q_sh, c_sp, c_ss, c_sh;
  int tokens, hkv, group, page_size, num_pages, max_pages;
  int64_t sel_kmax;
  int topk, sink, local;
  int vec_chunk;  // query vectors per shared-memory chunk: a multiple of 8, <= kVecChunk
  bool all_pages;
  bool q_vec16;  // q's rows start on 16 bytes (pointer and both strides): the vectors load 8 at a time
};

// Request b's first new token, new-token count and length, clamped as the decode kernels clamp them.
struct Req {
  int q0, n, len;
};
__device__ __forceinline__ Req request(const Params& p, int b) {
  const int q0 = min(max(p.cu_seqlens_q[b], 0), p.tokens);
  const int n = min(max(p.cu_seqlens_q[b + 1] - q0, 0), min(kMaxNew, p.tokens - q0));
  const int64_t most = int64_t(p.max_pages) * p.page_size;  // < 2^31 (validated)
  const int len = int(p.seq_lens[b] < 0 ? 0 : p.seq_lens[b] > most ? most : p.seq_lens[b]);
  return {q0, n, len};
}

template <class T, int D>
__global__ void __launch_bounds__(D) page_summary_kernel(Params p) {
  const int b = blockIdx.x / p.hkv, hk = blockIdx.x % p.hkv, d = threadIdx.x;
  const Req r = request(p, b);
  const int ps = p.page_size;
  int lp = int(blockIdx.y);
  if (!p.all_pages) lp += max(r.len - r.n, 0) / ps;  // the first page holding a new token
  if (int64_t(lp) * ps >= r.len || (!p.all_pages && r.n == 0)) return;
  const int pp = p.page_table[int64_t(b) * p.max_pages + lp];
  if (pp < 0 || pp >= p.num_pages) return;
  const int slots = min(ps, r.len - lp * ps);
  const T* src = static_cast<const T*>(p.k) + pp * p.c_sp + hk * p.c_sh + d;
  // Four running minima and maxima (slots s, s + 1, s + 2, s + 3), so that the loop's loads are
  // independent and many are in flight; the order does not change the result (summary_min/max
  // define one total order, -0 below +0).
  float mn[4], mx[4];
  const float first = dev::to_float(src[0]);
#pragma unroll
  for (int u = 0; u < 4; ++u) mn[u] = mx[u] = first;
#pragma unroll 4
  for (int s = 1; s + 3 < slots; s += 4) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float x = dev::to_float(src[(s + u) * p.c_ss]);
      mn[u] = summary_min(mn[u], x);
      mx[u] = summary_max(mx[u], x);
    }
  }
  for (int s = 1 + (slots - 1) / 4 * 4; s < slots; ++s) {
    const float x = dev::to_float(src[s * p.c_ss]);
    mn[0] = summary_min(mn[0], x);
    mx[0] = summary_max(mx[0], x);
  }
#pragma unroll
  for (int u = 1; u < 4; ++u) mn[0] = summary_min(mn[0], mn[u]), mx[0] = summary_max(mx[0], mx[u]);
  T* dst = static_cast<T*>(p.summaries) + ((int64_t(pp) * p.hkv + hk) * 2) * D + d;
  dst[0] = dev::from_float<T>(mn[0]);  // a cache value: exact
  dst[D] = dev::from_float<T>(mx[0]);
}

// A 16x8x16 tensor-core product per (16 pages, 8 query vectors, 16 summary elements). The bound
// Σ_d q_d · (q_d >= 0 ? max_d : min_d) is the dot product of [q-, q+] (q- = min(q, 0), q+ = max(q,
// 0), exact in the cache's dtype) with a page's summary [min, max]: the summaries are the A operand
// as they lie in memory (a row per page) and the vectors the B operand. A k-step needs, per thread,
// elements 2t, 2t+1, 2t+8, 2t+9 of its rows; any permutation of k applied to both operands gives
// the same dot products, so thread t of a row group takes whole 16-byte chunks instead: chunk
// t + 4s of its two pages (g, g + 8) feeds two k-steps (elements 0-3, then 4-7), and the vectors
// are staged so that the same chunk of a vector's [q-, q+] row gives the matching B registers.
template <class T, int D>
__global__ void __launch_bounds__(kSelectThreads, 2) page_select_kernel(Params p) {
  constexpr int CH = 2 * D * int(sizeof(T)) / 16;  // 16-byte chunks per page summary (and per [q-, q+] row)
  constexpr int HALF = CH / 8;                     // of them per thread and page in half a tile
  constexpr int QROW = 2 * D * int(sizeof(T)) + 64;  // bytes per staged vector: rows g, g + 1 64 bytes apart mod 128
  extern __shared__ float4 smem4[];
  char* qs = reinterpret_cast<char*>(smem4);                                   // [vec_chunk][QROW]
  float* score = reinterpret_cast<float*>(qs + p.vec_chunk * QROW);            // [max_pages]: scores, then order keys
  uint32_t* scratch = reinterpret_cast<uint32_t*>(score + p.max_pages);        // [259]: the top-k's histogram
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tq = lane % 4;
  const int b = blockIdx.x / p.hkv, hk = blockIdx.x % p.hkv;
  const Req r = request(p, b);
  const int ps = p.page_size;
  const int npages = (r.len + ps - 1) / ps;
  const int nvec = p.group * r.n;  // vector i: new token i / G, query head hk * G + i % G
  const int32_t* table = p.page_table + int64_t(b) * p.max_pages;
  const char* sums = static_cast<const char*>(p.summaries) + int64_t(hk) * 2 * D * int64_t(sizeof(T));
  const int64_t page_bytes = int64_t(p.hkv) * 2 * D * int64_t(sizeof(T));

  // Physical pages g and g + 8 of the warp's tile at j0 (-1: outside the request or the cache).
  auto lookup = [&](int j0, int (&pp)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = j0 + g + 8 * h;
      pp[h] = j < npages ? table[j] : -1;
      if (pp[h] >= p.num_pages) pp[h] = -1;
    }
  };
  // Half a tile's summaries (chunks tq + 4s, s in [HALF * half, HALF * half + HALF), of pages pp[0]
  // and pp[1]) into registers; a page of -1 reads as zeros.
  auto load = [&](const int (&pp)[2], int half, uint4 (&buf)[2][HALF]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4* src = reinterpret_cast<const uint4*>(sums + (pp[h] >= 0 ? pp[h] : 0) * page_bytes);
#pragma unroll
      for (int s = 0; s < HALF; ++s)
        buf[h][s] = pp[h] >= 0 ? src[tq + 4 * (HALF * half + s)] : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  // Those chunks' share of the bounds of pages g and g + 8 against every tile of 8 vectors.
  auto bound = [&](const uint4 (&buf)[2][HALF], int half, int ntiles, float (&acc)[kVecTiles][4]) {
#pragma unroll
    for (int nt = 0; nt < kVecTiles; ++nt) {
      if (nt >= ntiles) break;
      const char* qv = qs + (nt * 8 + g) * QROW + (tq + 4 * HALF * half) * 16;
#pragma unroll
      for (int s = 0; s < HALF; ++s) {
        const uint4 bq = *reinterpret_cast<const uint4*>(qv + s * 64);
        ptx::mma_16816<T>(acc[nt], {buf[0][s].x, buf[1][s].x, buf[0][s].y, buf[1][s].y}, bq.x, bq.y);
        ptx::mma_16816<T>(acc[nt], {buf[0][s].z, buf[1][s].z, buf[0][s].w, buf[1][s].w}, bq.z, bq.w);
      }
    }
  };
  for (int j = t; j < npages; j += kSelectThreads) score[j] = -INFINITY;
  for (int c0 = 0; c0 < nvec; c0 += p.vec_chunk) {
    const int nv = min(p.vec_chunk, nvec - c0), ntiles = (nv + 7) / 8;
    // The warp's first tile: its pages and first half in flight while the vectors are staged.
    int pp[2];
    uint4 first[2][HALF], second[2][HALF];
    lookup(warp * 16, pp);
    load(pp, 0, first);
    __syncthreads();  // the previous chunk is consumed (and the scores initialized, the first time)
    // Zero vectors up to whole tiles of 8. Eight elements a thread where q's rows allow 16-byte
    // loads (most calls: one load each, one round trip), else one.
    const T* q = static_cast<const T*>(p.q);
    auto vec_row = [&](int i) {  // vector c0 + i: new token (c0 + i) / G, query head hk * G + (c0 + i) % G
      return q + int64_t(r.q0 + (c0 + i) / p.group) * p.q_st + int64_t(hk * p.group + (c0 + i) % p.group) * p.q_sh;
    };
    if (p.q_vec16) {
      for (int e = t; e < ntiles * D; e += kSelectThreads) {  // e: 8 elements of vector e / (D / 8)
        const int i = e / (D / 8), d = e % (D / 8) * 8;
        const uint4 u = i < nv ? *reinterpret_cast<const uint4*>(vec_row(i) + d) : make_uint4(0u, 0u, 0u, 0u);
        const T* x = reinterpret_cast<const T*>(&u);
        uint4 neg, pos;
        T* n8 = reinterpret_cast<T*>(&neg);
        T* p8 = reinterpret_cast<T*>(&pos);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float f = dev::to_float(x[j]);
          n8[j] = dev::from_float<T>(f < 0.f ? f : 0.f);
          p8[j] = dev::from_float<T>(f > 0.f ? f : 0.f);
        }
        T* row = reinterpret_cast<T*>(qs + i * QROW);
        *reinterpret_cast<uint4*>(row + d) = neg;      // q-, against the minima
        *reinterpret_cast<uint4*>(row + D + d) = pos;  // q+, against the maxima
      }
    } else {
      for (int e = t; e < ntiles * 8 * D; e += kSelectThreads) {
        const int i = e / D, d = e % D;
        const float x = i < nv ? dev::to_float(vec_row(i)[d]) : 0.f;
        T* row = reinterpret_cast<T*>(qs + i * QROW);
        row[d] = dev::from_float<T>(x < 0.f ? x : 0.f);
        row[D + d] = dev::from_float<T>(x > 0.f ? x : 0.f);
      }
    }
    __syncthreads();
    // Each warp: 16 pages at a time, in two halves, with the next half always in flight while one
    // is bounded: this tile's second half while its first is, the next tile's first while its
    // second is.
    for (int j0 = warp * 16; j0 < npages; j0 += kSelectWarps * 16) {
      load(pp, 1, second);
      int next[2];
      lookup(j0 + kSelectWarps * 16, next);
      float acc[kVecTiles][4] = {};
      bound(first, 0, ntiles, acc);
      load(next, 0, first);
      bound(second, 1, ntiles, acc);
      // acc[nt]: pages g (0, 1) and g + 8 (2, 3) against vectors 2tq, 2tq + 1 of tile nt; zero
      // vectors past nv are not bounds. fmaxf drops NaN: a NaN bound never wins.
      float best[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kVecTiles; ++nt) {
        const int v = nt * 8 + 2 * tq;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (v < nv) best[h] = fmaxf(best[h], acc[nt][2 * h]);
          if (v + 1 < nv) best[h] = fmaxf(best[h], acc[nt][2 * h + 1]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        best[h] = fmaxf(best[h], __shfl_xor_sync(0xffffffffu, best[h], 1));
        best[h] = fmaxf(best[h], __shfl_xor_sync(0xffffffffu, best[h], 2));
        const int j = j0 + g + 8 * h;  // this warp's page in every chunk
        if (tq == 0 && pp[h] >= 0) score[j] = fmaxf(score[j], best[h]);
      }
      pp[0] = next[0], pp[1] = next[1];
    }
  }
  __syncthreads();
  // Order keys; sink and local pages are kept outside the top-k budget.
  auto always_on = [&](int j) { return j < p.sink || j >= npages - p.local; };
  for (int j = t; j < npages; j += kSelectThreads)
    score[j] = __uint_as_float(always_on(j) ? 0u : gate_order_key(score[j]));
  __syncthreads();
  auto key = [&](int j) { return __float_as_uint(score[j]); };
  const dev::TopkThreshold th = dev::block_topk_threshold<kSelectThreads>(key, npages, uint32_t(p.topk), scratch);
  if (warp != 0) return;
  int32_t* out = p.sel_indices + int64_t(blockIdx.x) * p.sel_kmax;
  const int pos = dev::warp_write_selected(key, npages, th, always_on, out, p.sel_kmax);
  for (int64_t e = pos + lane; e < p.sel_kmax; e += 32) out[e] = 0;
  if (lane == 0) p.sel_counts[blockIdx.x] = int32_t(pos < p.sel_kmax ? pos : p.sel_kmax);
}

Params params(const PageSelectArgs& a) {
  Params p{};
  p.q = a.q.data, p.k = a.k.data, p.summaries = a.summaries;
  p.page_table = a.page_table, p.seq_lens = a.seq_lens, p.cu_seqlens_q = a.cu_seqlens_q;
  p.sel_indices = a.sel_indices, p.sel_counts = a.sel_counts;
  p.q_st = a.q.stride_t, p.q_sh = a.q.stride_h;
  p.c_sp = a.k.stride_page, p.c_ss = a.k.stride_slot, p.c_sh = a.k.stride_h;
  p.tokens = int(a.q.t), p.hkv = int(a.k.h), p.group = int(a.q.h / a.k.h);
  p.page_size = int(a.k.page_size), p.num_pages = int(std::min<int64_t>(a.k.pages, INT32_MAX));
  p.max_pages = int(a.max_pages);
  p.sel_kmax = a.sel_kmax;
  p.topk = int(a.topk), p.sink = int(a.sink), p.local = int(a.local);
  p.all_pages = a.all_pages;
  // The most vectors a request brings: G * min(16, T - B + 1) (every other request has >= 1 token).
  const int64_t most = (a.q.h / a.k.h) * std::clamp<int64_t>(a.q.t - a.batch + 1, 1, kMaxNew);
  p.vec_chunk = int(std::min<int64_t>(kVecChunk, (most + 7) / 8 * 8));
  p.q_vec16 = reinterpret_cast<uintptr_t>(a.q.data) % 16 == 0 && a.q.stride_t % 8 == 0 && a.q.stride_h % 8 == 0;
  return p;
}

size_t select_smem_bytes(const PageSelectArgs& a) {
  const int64_t qrow = 2 * a.q.d * int64_t(dtype_size(a.k.dtype)) + 64;  // the kernel's QROW
  return size_t(params(a).vec_chunk * qrow) + size_t(a.max_pages + 259) * 4;
}

template <class T, int D>
void launch_typed(const Params& p, PageOp op, unsigned ctas, unsigned pages, size_t bytes, cudaStream_t stream) {
  if (op == PageOp::update_summaries) {
    page_summary_kernel<T, D><<<dim3(ctas, pages), D, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "page_summary_kernel launch");
    return;
  }
  // NOTE: more than 48 KB of dynamic shared memory needs a per-kernel opt-in; set to the device's
  // limit (one value for every call, so concurrent callers cannot undo each other).
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(page_select_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(device_info().smem_per_block_optin)),
               "cudaFuncSetAttribute(page_select_kernel, max dynamic shared memory)");
  page_select_kernel<T, D><<<ctas, kSelectThreads, bytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "page_select_kernel launch");
}

void launch(const PageSelectArgs& a, PageOp op, void* stream_ptr) {
  const Params p = params(a);
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const unsigned ctas = unsigned(a.batch * a.k.h), pages = unsigned(a.all_pages ? a.max_pages : 2);
  const size_t bytes = select_smem_bytes(a);
  const bool bf16 = a.k.dtype == DType::bf16;
  if (a.q.d == 64) {
    if (bf16) launch_typed<__nv_bfloat16, 64>(p, op, ctas, pages, bytes, stream);
    else launch_typed<__half, 64>(p, op, ctas, pages, bytes, stream);
  } else {
    if (bf16) launch_typed<__nv_bfloat16, 128>(p, op, ctas, pages, bytes, stream);
    else launch_typed<__half, 128>(p, op, ctas, pages, bytes, stream);
  }
}

}  // namespace

std::string why_not(const PageSelectArgs& a, PageOp op) {
  if (a.k.dtype != DType::f16 && a.k.dtype != DType::bf16)
    return std::string("the GPU takes f16 or bf16, not ") + to_string(a.k.dtype);
  if (reinterpret_cast<uintptr_t>(a.summaries) % 16 != 0) return "summaries must be 16-byte aligned on the GPU";
  if (a.k.pages > INT32_MAX || a.batch * a.k.h > INT32_MAX) return "too many pages or (request, head) pairs";
  if (op == PageOp::select) {
    const size_t bytes = select_smem_bytes(a), limit = device_info().smem_per_block_optin;
    if (bytes > limit)
      return "max_pages = " + std::to_string(a.max_pages) + " needs " + std::to_string(bytes) +
             " bytes of shared memory per (request, head), more than the device's " + std::to_string(limit);
  }
  return "";
}

void update(const PageSelectArgs& a, void* stream) { launch(a, PageOp::update_summaries, stream); }
void select(const PageSelectArgs& a, void* stream) { launch(a, PageOp::select, stream); }

}  // namespace sparsek::page_select_gpu
