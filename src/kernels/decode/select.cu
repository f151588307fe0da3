// Page selection on the GPU (sm_80+): the page summaries' update and the per-(request, head) top-k
// of pages (include/sparsek/decode.hpp gives the semantics; src/cpu/page_select_cpu.cpp the
// reference, which these kernels match bit for bit).
//
//   page_summary_kernel  one CTA per (request, key/value head, page): thread d walks the page's
//                        stored slots of channel d (consecutive threads, consecutive addresses)
//                        and writes its minimum and maximum. Without all_pages only the one or two
//                        pages that hold the new tokens (n <= 16 <= page_size) run.
//   page_select_kernel   one CTA (4 warps) per (request, key/value head); memory-bound. The group's
//                        query vectors (G heads x n new tokens) wait in shared memory as f32. Each
//                        warp copies 32 pages' summaries at a time into its shared-memory tile
//                        (cp.async, coalesced 16-byte chunks), then lane l scores page l of them
//                        in ascending d, as the CPU does; scores go to shared memory as order keys,
//                        and warp 0 runs the exact top-k of src/kernels/topk.cuh and writes the row
//                        ascending.
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
#include "kernels/ptx/mma_sm80.cuh"  // cp.async
#include "kernels/topk.cuh"
#include "plan/gate_internal.hpp"  // gate_order_key

namespace sparsek::page_select_gpu {
namespace {

constexpr int kSelectThreads = 128;  // 4 warps: each stages and scores 32 pages at a time
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kVecChunk = 32;  // query vectors staged in shared memory at a time (at most)
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
  int vec_chunk;  // query vectors per shared-memory chunk: a multiple of 4, <= kVecChunk
  bool all_pages;
};

// A page's summary (min then max, 2 * D elements) in a warp's staging tile, 16 bytes apart from
// the next page's: lane l reads its page at l * record bytes, so the 16-byte reads of 8 consecutive
// lanes (one shared-memory phase) start 4 banks apart.
template <class T, int D>
constexpr int record_bytes() { return 2 * D * int(sizeof(T)) + 16; }

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
  float mn = dev::to_float(src[0]), mx = mn;
  for (int s = 1; s < slots; ++s) {
    const float x = dev::to_float(src[s * p.c_ss]);
    mn = fminf(mn, x);
    mx = fmaxf(mx, x);
  }
  T* dst = static_cast<T*>(p.summaries) + ((int64_t(pp) * p.hkv + hk) * 2) * D + d;
  dst[0] = dev::from_float<T>(mn);  // a cache value: exact
  dst[D] = dev::from_float<T>(mx);
}

// 8 elements of a 16-byte load as floats.
template <class T>
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int x = 0; x < 8; ++x) f[x] = dev::to_float(e[x]);
}

template <class T, int D>
__global__ void __launch_bounds__(kSelectThreads) page_select_kernel(Params p) {
  constexpr int RB = record_bytes<T, D>(), CH = 2 * D * int(sizeof(T)) / 16;  // 16-byte chunks per summary
  extern __shared__ float4 smem4[];
  char* tiles = reinterpret_cast<char*>(smem4);                   // [warps][32 pages][RB]
  float* qs = reinterpret_cast<float*>(tiles + kSelectWarps * 32 * RB);  // [vec_chunk][D]
  float* score = qs + p.vec_chunk * D;                             // [max_pages]: scores, then order keys
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int b = blockIdx.x / p.hkv, hk = blockIdx.x % p.hkv;
  const Req r = request(p, b);
  const int ps = p.page_size;
  const int npages = (r.len + ps - 1) / ps;
  const int nvec = p.group * r.n;  // vector i: new token i / G, query head hk * G + i % G
  const int32_t* table = p.page_table + int64_t(b) * p.max_pages;
  char* tile = tiles + warp * 32 * RB;
  const uint32_t tile_s = ptx::smem_addr(tile);

  for (int j = t; j < npages; j += kSelectThreads) score[j] = -INFINITY;
  for (int c0 = 0; c0 < nvec; c0 += p.vec_chunk) {
    const int nv = min(p.vec_chunk, nvec - c0);
    __syncthreads();  // the previous chunk is consumed (and the scores initialized, the first time)
    for (int e = t; e < (nv + 3) / 4 * 4 * D; e += kSelectThreads) {  // zeros up to whole groups of 4
      const int i = c0 + e / D, d = e % D;
      const T* qrow = static_cast<const T*>(p.q) + int64_t(r.q0 + i / p.group) * p.q_st +
                      int64_t(hk * p.group + i % p.group) * p.q_sh;
      qs[e] = e / D < nv ? dev::to_float(qrow[d]) : 0.f;
    }
    __syncthreads();
    // Each warp: 32 pages at a time, their summaries copied in coalesced 16-byte chunks (pages
    // outside the request or the cache are zero-filled and never scored), then lane l scores page
    // j0 + l from shared memory.
    for (int j0 = warp * 32; j0 < npages; j0 += kSelectThreads) {
      const int j = j0 + lane;
      const int pp = j < npages ? table[j] : -1;
      const bool valid = pp >= 0 && pp < p.num_pages;
#pragma unroll 4
      for (int c = lane; c < 32 * CH; c += 32) {
        const int rr = c / CH, off = c % CH;
        const int prr = __shfl_sync(0xffffffffu, valid ? pp : -1, rr);
        const char* src = static_cast<const char*>(p.summaries) +
                          ((int64_t(prr < 0 ? 0 : prr) * p.hkv + hk) * 2 * D) * int64_t(sizeof(T)) + off * 16;
        ptx::cp_async_16(tile_s + rr * RB + off * 16, src, prr < 0 ? 0 : 16);
      }
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
      __syncwarp();
      if (valid) {
        const char* rec = tile + lane * RB;
        float best = score[j];
        for (int v0 = 0; v0 < nv; v0 += 4) {
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
          for (int d8 = 0; d8 < D / 8; ++d8) {
            float mn[8], mx[8];
            unpack8<T>(*reinterpret_cast<const uint4*>(rec + d8 * 16), mn);
            unpack8<T>(*reinterpret_cast<const uint4*>(rec + D * int(sizeof(T)) + d8 * 16), mx);
#pragma unroll
            for (int v = 0; v < 4; ++v) {  // vectors past nv are zeros, their bounds unused
              const float* qv = qs + (v0 + v) * D + 8 * d8;  // the same address in every lane: broadcast
              const float4 qa = *reinterpret_cast<const float4*>(qv), qb = *reinterpret_cast<const float4*>(qv + 4);
              const float qx[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
              for (int x = 0; x < 8; ++x) acc[v] = __fmaf_rn(qx[x], qx[x] >= 0.f ? mx[x] : mn[x], acc[v]);
            }
          }
#pragma unroll
          for (int v = 0; v < 4; ++v)
            if (v0 + v < nv && acc[v] > best) best = acc[v];  // a NaN bound never wins
        }
        score[j] = best;
      }
      __syncwarp();  // the tile is consumed before the next copy into it
    }
  }
  __syncthreads();
  // Order keys; sink and local pages are kept outside the top-k budget.
  auto always_on = [&](int j) { return j < p.sink || j >= npages - p.local; };
  for (int j = t; j < npages; j += kSelectThreads)
    score[j] = __uint_as_float(always_on(j) ? 0u : gate_order_key(score[j]));
  __syncthreads();
  if (warp != 0) return;
  auto key = [&](int j) { return __float_as_uint(score[j]); };
  const dev::TopkThreshold th = dev::warp_topk_threshold(key, npages, uint32_t(p.topk));
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
  p.vec_chunk = int(std::min<int64_t>(kVecChunk, (most + 3) / 4 * 4));
  return p;
}

size_t select_smem_bytes(const PageSelectArgs& a) {
  const int64_t rb = 2 * a.q.d * int64_t(dtype_size(a.k.dtype)) + 16;
  return size_t(kSelectWarps * 32 * rb) + size_t(params(a).vec_chunk * a.q.d + a.max_pages) * 4;
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
