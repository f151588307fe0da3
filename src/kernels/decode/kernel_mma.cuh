// The paged decode split kernel on tensor cores (sm_80+ mma.sync m16n8k16): variant "cuda_mma".
//
// Same grid, chunks, rows, masks, workspace and combine as decode_split_kernel (kernel.cuh); what
// differs is the math of a 16-key tile and who does it. A CTA walks its tiles in groups of four
// (64 keys), two groups in flight (cp.async, 16-byte copies); warp w takes tile w of each group
// and keeps its own online-softmax state for the CTA's 16 rows, FlashAttention-2 style:
//   S = Q K^T   Q's fragments held in registers (loaded once), K fragments by ldmatrix, 2 n-tiles
//               x D/16 k-steps of mma; scaled by scale * log2 e in f32, masked to -inf
//   softmax     row max over the quad (two shuffles), exp2, per-thread partial row sums
//   O += P V    P re-packed from the S accumulators as the A operand, V fragments by
//               ldmatrix.trans, D/8 n-tiles of mma
// At the end the four warps' states are merged in warp order through shared memory (fixed order:
// the same inputs give the same bits), then written as decode_split_kernel writes them.
#pragma once
#include <type_traits>

#include "kernels/decode/kernel.cuh"

namespace sparsek::decode_gpu {

constexpr int kGroup = 4;        // tiles per group (one per warp)
constexpr int kGroupStages = 2;  // groups in flight

template <int D>
constexpr int mma_smem_bytes() {
  // K and V of kGroupStages groups, Q (16-bit), the tile meta; the merge reuses the K/V region.
  return kGroupStages * kGroup * 2 * kKeys * (D + 8) * 2 + kRows * (D + 8) * 2;
}

template <int D, class T>
__global__ void __launch_bounds__(kThreads) decode_split_mma_kernel(const Params p) {
  constexpr int kPitch = D + 8;  // 16-bit elements per smem row: 16-byte aligned rows, ldmatrix conflict-free
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using Tile = T[kKeys][kPitch];
  Tile* ks = reinterpret_cast<Tile*>(smem_raw);                    // [stage * kGroup + tile]
  Tile* vs = ks + kGroupStages * kGroup;                           // same
  T(*qs)[kPitch] = reinterpret_cast<T(*)[kPitch]>(vs + kGroupStages * kGroup);  // [16][kPitch]
  __shared__ int tile_pos[kGroupStages][kGroup], tile_keys[kGroupStages][kGroup];
  __shared__ float2 ml_s[kGroup][kRows];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int bh = blockIdx.x, split = blockIdx.y, tile_r = blockIdx.z;
  const int b = bh / p.hkv, hk = bh % p.hkv;
  const Request rq = request_of(p, b);
  const int rows_all = p.group * rq.n;
  const int r_base = tile_r * kRows;
  if (r_base >= rows_all) return;

  int entries = (rq.len + p.page_size - 1) / p.page_size;
  const int32_t* sel = nullptr;
  if (p.sel_counts) {
    entries = min(max(p.sel_counts[bh], 0), p.sel_kmax);
    sel = p.sel_indices + int64_t(bh) * p.sel_kmax;
  }
  const int e0 = split * p.chunk, e1 = min(e0 + p.chunk, entries);
  const int subs = p.page_size / kKeys;
  const int ntiles = e1 > e0 ? (e1 - e0) * subs : 0;
  const int ngroups = (ntiles + kGroup - 1) / kGroup;
  const int npages = (rq.len + p.page_size - 1) / p.page_size;

  // Q rows of this tile as 16-bit values (rows past the request's are zero).
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, rr = r_base + r;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (rr < rows_all) {
      const int j = rr / p.group, h = hk * p.group + rr % p.group;
      raw = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.q) + int64_t(rq.q0 + j) * p.q_st +
                                            int64_t(h) * p.q_sh + c * 8);
    }
    *reinterpret_cast<uint4*>(&qs[r][c * 8]) = raw;
  }

  // Issues the copies of group g (tiles 4g .. 4g + 3) into stage st; tiles past ntiles or of
  // skipped pages get keys = 0 (their warp skips them) and copy nothing.
  auto issue = [&](int g, int st) {
#pragma unroll
    for (int w = 0; w < kGroup; ++w) {
      const int t = g * kGroup + w;
      int keys = 0, pp = 0, lp = 0, sub = 0;
      if (t < ntiles) {
        const int e = e0 + t / subs;
        sub = t % subs;
        lp = sel ? sel[e] : e;
        if (lp >= 0 && lp < npages) {
          pp = p.page_table[int64_t(b) * p.max_pages + lp];
          if (pp >= 0 && pp < p.num_pages) keys = min(kKeys, max(rq.len - lp * p.page_size - sub * kKeys, 0));
        }
      }
      if (tid == 0) {
        tile_pos[st][w] = keys > 0 ? lp * p.page_size + sub * kKeys : 0;
        tile_keys[st][w] = keys;
      }
      if (keys == 0) continue;
      const int64_t base = int64_t(pp) * p.c_sp + int64_t(hk) * p.c_sh + int64_t(sub * kKeys) * p.c_ss;
      for (int i = tid; i < kKeys * kChunks; i += kThreads) {
        const int key = i / kChunks, c = i % kChunks;
        const bool live = key < keys;  // keys past seq_len: zero-filled, nothing read
        const int64_t off = base + (live ? int64_t(key) * p.c_ss : 0) + c * 8;
        ptx::cp_async_16(ptx::smem_addr(&ks[st * kGroup + w][key][c * 8]), static_cast<const T*>(p.k) + off,
                         live ? 16 : 0);
        ptx::cp_async_16(ptx::smem_addr(&vs[st * kGroup + w][key][c * 8]), static_cast<const T*>(p.v) + off,
                         live ? 16 : 0);
      }
    }
  };

  if (ngroups > 0) issue(0, 0);
  ptx::cp_async_commit();
  __syncthreads();  // qs written

  // Q's A fragments for the D/16 k-steps: ldmatrix x4 of rows 0-7 / 8-15 x columns k0 / k0 + 8.
  uint32_t qf[D / 16][4];
  {
    const int i = lane / 8, row = (i % 2) * 8 + lane % 8, col = (i / 2) * 8;
#pragma unroll
    for (int ks_ = 0; ks_ < D / 16; ++ks_) ptx::ldmatrix_x4(qf[ks_], ptx::smem_addr(&qs[row][ks_ * 16 + col]));
  }

  // This thread's rows (of the 16): r0 = lane / 4 and r1 = r0 + 8; their visible limits.
  const int r0 = lane / 4, r1 = r0 + 8;
  auto limit_of = [&](int r) {
    const int rr = r_base + r;
    if (rr >= rows_all) return -1;
    return p.causal ? rq.len - rq.n + rr / p.group + 1 : rq.len;
  };
  const int lim0 = limit_of(r0), lim1 = limit_of(r1);
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // log2 domain; l: this thread's columns
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  for (int g = 0; g < ngroups; ++g) {
    if (g + 1 < ngroups) issue(g + 1, (g + 1) % kGroupStages);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();  // group g landed (and its meta is visible)
    const int st = g % kGroupStages;
    const int keys = tile_keys[st][warp];
    if (keys > 0) {  // warp-uniform
      const int pos0 = tile_pos[st][warp];
      const Tile& kt = ks[st * kGroup + warp];
      const Tile& vt = vs[st * kGroup + warp];
      // S = Q K^T: two n-tiles of 8 keys.
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      {
        const int i = lane / 8, key = (i / 2) * 8 + lane % 8, col = (i % 2) * 8;
#pragma unroll
        for (int ks_ = 0; ks_ < D / 16; ++ks_) {
          uint32_t kf[4];
          ptx::ldmatrix_x4(kf, ptx::smem_addr(&kt[key][ks_ * 16 + col]));
          ptx::mma_16816<T>(s[0], qf[ks_], kf[0], kf[1]);
          ptx::mma_16816<T>(s[1], qf[ks_], kf[2], kf[3]);
        }
      }
      // Scale and mask; row maxima over the quad.
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = nt * 8 + 2 * (lane % 4) + c, pos = pos0 + key;
          const bool live = key < keys;
          s[nt][c] = live && pos < lim0 ? s[nt][c] * p.scale_log2 : -INFINITY;
          s[nt][2 + c] = live && pos < lim1 ? s[nt][2 + c] * p.scale_log2 : -INFINITY;
          mx0 = fmaxf(mx0, s[nt][c]);
          mx1 = fmaxf(mx1, s[nt][2 + c]);
        }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // A row with nothing seen yet keeps m = -inf: its P is 0 and alpha 1.
      const float a0 = mx0 == -INFINITY ? 1.f : exp2f(m0 - mx0);
      const float a1 = mx1 == -INFINITY ? 1.f : exp2f(m1 - mx1);
      const float b0 = mx0 == -INFINITY ? 0.f : mx0, b1 = mx1 == -INFINITY ? 0.f : mx1;  // exp2(-inf - b) = 0
      m0 = mx0, m1 = mx1;
      float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[nt][c] = exp2f(s[nt][c] - b0);
          s[nt][2 + c] = exp2f(s[nt][2 + c] - b1);
          ps0 += s[nt][c];
          ps1 += s[nt][2 + c];
        }
      l0 = l0 * a0 + ps0;
      l1 = l1 * a1 + ps1;
      // P as the A operand (rows x 16 keys): the S accumulators' layout is the A layout.
      uint32_t pa[4];
      pa[0] = dev::pack2<std::is_same_v<T, __nv_bfloat16>>(s[0][0], s[0][1]);
      pa[1] = dev::pack2<std::is_same_v<T, __nv_bfloat16>>(s[0][2], s[0][3]);
      pa[2] = dev::pack2<std::is_same_v<T, __nv_bfloat16>>(s[1][0], s[1][1]);
      pa[3] = dev::pack2<std::is_same_v<T, __nv_bfloat16>>(s[1][2], s[1][3]);
      // O = O * alpha + P V: V fragments by ldmatrix.trans, two n-tiles of 8 dims per x4.
      const int i = lane / 8, key = (i % 2) * 8 + lane % 8, col = (i / 2) * 8;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        acc[n][0] *= a0, acc[n][1] *= a0, acc[n][2] *= a1, acc[n][3] *= a1;
      }
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        uint32_t vf[4];
        ptx::ldmatrix_x4_trans(vf, ptx::smem_addr(&vt[key][n * 16 + col]));
        ptx::mma_16816<T>(acc[2 * n], pa, vf[0], vf[1]);
        ptx::mma_16816<T>(acc[2 * n + 1], pa, vf[2], vf[3]);
      }
    }
    __syncthreads();  // everyone is done with stage st before the next iteration refills it
  }
  ptx::cp_async_wait<0>();

  // Row sums over the quad, then the four warps merged in warp order.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (lane % 4 == 0) {
    ml_s[warp][r0] = make_float2(m0, l0);
    ml_s[warp][r1] = make_float2(m1, l1);
  }
  __syncthreads();  // the K/V region is free (the last group's compute is done everywhere)
  float* os = reinterpret_cast<float*>(smem_raw);  // [kGroup][16][D] f32 (32 KB at D = 128)
  {
    // Each warp rescales its acc to the merged max before storing, so the merge is a plain sum.
    float M0 = -INFINITY, M1 = -INFINITY;
#pragma unroll
    for (int w = 0; w < kGroup; ++w) M0 = fmaxf(M0, ml_s[w][r0].x), M1 = fmaxf(M1, ml_s[w][r1].x);
    const float f0 = m0 == -INFINITY ? 0.f : exp2f(m0 - M0), f1 = m1 == -INFINITY ? 0.f : exp2f(m1 - M1);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int d = n * 8 + 2 * (lane % 4);
      os[(warp * kRows + r0) * D + d] = acc[n][0] * f0;
      os[(warp * kRows + r0) * D + d + 1] = acc[n][1] * f0;
      os[(warp * kRows + r1) * D + d] = acc[n][2] * f1;
      os[(warp * kRows + r1) * D + d + 1] = acc[n][3] * f1;
    }
  }
  __syncthreads();

  // Thread -> (row pr, dims pd .. pd + D/8 - 1), as decode_split_kernel's epilogue.
  constexpr int kDimsPerThread = D / 8;
  const int pr = tid / 8, pd = (tid % 8) * kDimsPerThread, rr = r_base + pr;
  if (rr >= rows_all) return;
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kGroup; ++w) M = fmaxf(M, ml_s[w][pr].x);
  float L = 0.f;
  if (M != -INFINITY)
#pragma unroll
    for (int w = 0; w < kGroup; ++w) {
      const float2 ml = ml_s[w][pr];
      L += ml.x == -INFINITY ? 0.f : ml.y * exp2f(ml.x - M);
    }
  float o[kDimsPerThread];
#pragma unroll
  for (int x = 0; x < kDimsPerThread; ++x) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kGroup; ++w) v += os[(w * kRows + pr) * D + pd + x];
    o[x] = v;
  }
  write_row<D, T>(p, rq, bh, hk, split, rr, pd, tid % 8 == 0, o, M, L);
}

}  // namespace sparsek::decode_gpu
