// Hopper attention backward, the memory-bound passes: before the main kernel, per (batch, key/value
// head) max|K| and max||V row|| (deterministic mode only) and per query row Delta = rowsum(dO o O),
// LSE * log2(e) and the dQ grid scale; after it, the dQ accumulator times its scale -> dq.
// (kernel.cu's header says how the grid scale makes the dQ sum bit-identical.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/device.hpp"
#include "kernels/attn_bwd_sm90/passes.hpp"
#include "kernels/dtype.cuh"

namespace sparsek::attn_bwd_sm90 {

// The memory-bound passes: K/V bounds and preprocess (before the main kernel), postprocess (after).

// The memory-bound passes read rows of D elements 16 bytes (8 elements) per lane: D / 8 lanes per
// row, 256 / D rows per warp step. Every row starts 16-byte aligned (the TMA checks of why_not).
// The 16 bytes are loaded first (several rows' loads in flight), then widened here.
template <bool BF16>
struct Row8 {
  using T = std::conditional_t<BF16, __nv_bfloat16, __half>;
  float v[8];
  __device__ explicit Row8(const uint4 raw) {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = dev::to_float<T>(e[i]);
  }
};

// Sum over the LPR lanes of a row (lanes LPR-aligned within the warp).
template <int LPR>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int m = LPR / 2; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}


// Grid (B * Hkv, chunks of keys), 256 threads; one atomic per warp at the end.
template <bool BF16, int D>
__global__ void __launch_bounds__(256) bwd_kv_bounds(const KvParams kp) {
  using T = std::conditional_t<BF16, __nv_bfloat16, __half>;
  constexpr int LPR = D / 8, RPW = 32 / LPR;
  const int lane = threadIdx.x % 32, c = (lane % LPR) * 8;
  const int64_t bh = blockIdx.x, b = bh / kp.hkv, h = bh % kp.hkv;
  const T* kb = static_cast<const T*>(kp.k) + b * kp.k_sb + h * kp.k_sh + c;
  const T* vb = static_cast<const T*>(kp.v) + b * kp.v_sb + h * kp.v_sh + c;
  unsigned kmax = 0, vmax = 0;
  const int step = gridDim.y * 8 * RPW;
  constexpr int U = 4;  // rows per thread whose loads are in flight together (a missing row reads as 0)
  for (int s0 = (blockIdx.y * 8 + threadIdx.x / 32) * RPW; s0 < kp.skv; s0 += U * step) {  // warp-uniform
    uint4 k_raw[U], v_raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * step + lane / LPR;
      k_raw[u] = v_raw[u] = make_uint4(0, 0, 0, 0);
      if (s < kp.skv) {
        k_raw[u] = *reinterpret_cast<const uint4*>(kb + s * kp.k_ss);
        v_raw[u] = *reinterpret_cast<const uint4*>(vb + s * kp.v_ss);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const Row8<BF16> kr(k_raw[u]), vr(v_raw[u]);
      float norm2 = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        kmax = max(kmax, __float_as_uint(kr.v[i]) & 0x7fffffffu);
        norm2 = fmaf(vr.v[i], vr.v[i], norm2);
      }
      vmax = max(vmax, __float_as_uint(row_sum<LPR>(norm2)));
    }
  }
  kmax = __reduce_max_sync(0xffffffffu, kmax);
  vmax = __reduce_max_sync(0xffffffffu, vmax);
  if (lane == 0) {
    atomicMax(kp.bounds + 2 * bh, kmax);
    atomicMax(kp.bounds + 2 * bh + 1, vmax);
  }
}


// The dQ grid of a row: 1 / u with u = 2^(e - 30), 2^(e-1) <= bound < 2^e (a power of two, so
// scaling by it and by u is exact); 1 for a zero bound (every contribution is 0); NaN when the bound
// is not finite (the postprocess then writes NaN). Computed in double so that the product of three
// finite floats cannot overflow; the exponent is clamped to what a float scale can hold.
__device__ __forceinline__ float dq_grid_scale(double bound) {
  if (!(bound < INFINITY)) return NAN;  // NaN or +inf
  if (!(bound > 0.0)) return 1.f;
  int e;
  frexp(bound, &e);
  return ldexpf(1.f, max(-126, min(30 - e, 126)));
}

// Every padded query row: {LSE * log2e, Delta, dQ grid scale, 0}. Grid (B * Hq, chunks), 256 threads:
// a block takes chunks of 64 rows of one (batch, head), a warp RPW rows at a time.
template <bool BF16, int D>
__global__ void __launch_bounds__(256) bwd_preprocess(const RowParams rp) {
  using T = std::conditional_t<BF16, __nv_bfloat16, __half>;
  constexpr int LPR = D / 8, RPW = 32 / LPR;
  const int lane = threadIdx.x % 32, c = (lane % LPR) * 8;
  const int64_t bh = blockIdx.x, b = bh / rp.hq, h = bh % rp.hq;
  // The head's bounds (deterministic mode): once per block.
  float k_max = 0.f, v_max2 = 0.f;
  if (rp.det) {
    const unsigned* hb = rp.bounds + 2 * (b * (rp.hq / rp.group) + h / rp.group);
    k_max = __uint_as_float(hb[0]), v_max2 = __uint_as_float(hb[1]);
  }
  constexpr int ITERS = 64 / (8 * RPW);  // a warp's row groups in a chunk of 64 rows
  for (int chunk = blockIdx.y; chunk < rp.sq_pad / 64; chunk += gridDim.y) {
    // Every load of the chunk first (the rowinfo stores below could alias them for the compiler,
    // which would otherwise keep one row's loads behind the previous row's store).
    uint4 o_raw[ITERS], g_raw[ITERS];
    float lse_of[ITERS];
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int s = chunk * 64 + (threadIdx.x / 32) * RPW + it * 8 * RPW + lane / LPR;
      o_raw[it] = g_raw[it] = make_uint4(0, 0, 0, 0);
      lse_of[it] = 0.f;
      if (s < rp.sq) {
        o_raw[it] = *reinterpret_cast<const uint4*>(static_cast<const T*>(rp.o) + b * rp.o_sb + h * rp.o_sh +
                                                    s * rp.o_ss + c);
        g_raw[it] = *reinterpret_cast<const uint4*>(static_cast<const T*>(rp.dout) + b * rp.do_sb +
                                                    h * rp.do_sh + s * rp.do_ss + c);
        lse_of[it] = rp.lse[bh * rp.sq + s];
      }
    }
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int s = chunk * 64 + (threadIdx.x / 32) * RPW + it * 8 * RPW + lane / LPR;
      const int64_t r = bh * rp.sq_pad + s;
      const bool live = s < rp.sq;
      float delta = 0.f, norm2 = 0.f;
      if (live) {
        const Row8<BF16> o(o_raw[it]), g(g_raw[it]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          delta = fmaf(o.v[i], g.v[i], delta);
          norm2 = fmaf(g.v[i], g.v[i], norm2);
        }
      }
      delta = row_sum<LPR>(delta);
      norm2 = row_sum<LPR>(norm2);
      if (lane % LPR != 0) continue;
      float4 info = make_float4(INFINITY, 0.f, 1.f, 0.f);  // rows past Sq: P = 0
      if (live) {
        const float lse = lse_of[it];
        // A row that attends nothing has LSE = -inf: +inf makes its P = exp2(s - inf) = 0.
        info.x = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
        info.y = delta;
        if (rp.det && lse != -INFINITY) {  // (a row that attends nothing has no contributions: z = 1)
          const double bound =
              double(k_max) * (sqrt(double(v_max2)) * sqrt(double(norm2)) + fabs(double(delta)));
          // A NaN Delta or LSE (a NaN in O, dO or Q's row) would vanish in the integer rounding.
          info.z = isfinite(delta) && isfinite(lse) ? dq_grid_scale(bound) : NAN;
        }
      }
      rp.rowinfo[r] = info;
    }
  }
}


template <bool BF16>
__global__ void __launch_bounds__(128) bwd_postprocess(const DqParams dp) {
  using T = std::conditional_t<BF16, __nv_bfloat16, __half>;
  __shared__ float tile[64][65];
  __shared__ float row_mul[64];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t t_idx = blockIdx.x;
  const int dchunk = int(t_idx % dp.tn), rt = int((t_idx / dp.tn) % dp.r64);
  const int64_t bh = t_idx / (int64_t(dp.tn) * dp.r64);
  const int row_base = rt * 64;
  const int r = 16 * warp + lane / 4, c = 2 * (lane % 4);
  // The rows' multipliers, loaded with the tile (a load per row inside the store loop below would
  // put one L2 round trip per row on each warp's path).
  const float4* ri = dp.rowinfo + bh * dp.sq_pad + row_base;
  if (tid < 64) row_mul[tid] = (dp.det ? 1.f / ri[tid].z : 1.f) * dp.scale;  // 1 / z: a power of two (or NaN), exact
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const int64_t pos = t_idx * 4096 + q * 512 + tid * 4;
    float4 v;
    if (dp.det) {
      const int4 x = *reinterpret_cast<const int4*>(static_cast<const int*>(dp.acc) + pos);
      v = make_float4(float(x.x), float(x.y), float(x.z), float(x.w));
    } else {
      v = *reinterpret_cast<const float4*>(static_cast<const float*>(dp.acc) + pos);
    }
    tile[r][8 * q + c] = v.x;
    tile[r][8 * q + c + 1] = v.y;
    tile[r + 8][8 * q + c] = v.z;
    tile[r + 8][8 * q + c + 1] = v.w;
  }
  __syncthreads();
  const int64_t b = bh / dp.hq, h = bh % dp.hq;
  for (int rr = warp; rr < 64 && row_base + rr < dp.sq; rr += 4) {
    const float mul = row_mul[rr];
    T* out = static_cast<T*>(dp.dq) + b * dp.sb + h * dp.sh + int64_t(row_base + rr) * dp.ss + dchunk * 64;
    *reinterpret_cast<typename dev::Pair<T>::type*>(out + 2 * lane) =
        dev::make_pair2<T>(tile[rr][2 * lane] * mul, tile[rr][2 * lane + 1] * mul);
  }
}


void launch_kv_bounds(const KvParams& kp, bool bf16, int d, int64_t heads, int64_t chunks, cudaStream_t stream) {
  const auto kernel = bf16 ? (d == 64 ? bwd_kv_bounds<true, 64> : bwd_kv_bounds<true, 128>)
                           : (d == 64 ? bwd_kv_bounds<false, 64> : bwd_kv_bounds<false, 128>);
  kernel<<<dim3(unsigned(heads), unsigned(chunks)), 256, 0, stream>>>(kp);
  check_cuda(cudaGetLastError(), "bwd_kv_bounds launch");
}

void launch_preprocess(const RowParams& rp, bool bf16, int d, int64_t heads, int64_t chunks, cudaStream_t stream) {
  const auto kernel = bf16 ? (d == 64 ? bwd_preprocess<true, 64> : bwd_preprocess<true, 128>)
                           : (d == 64 ? bwd_preprocess<false, 64> : bwd_preprocess<false, 128>);
  kernel<<<dim3(unsigned(heads), unsigned(chunks)), 256, 0, stream>>>(rp);
  check_cuda(cudaGetLastError(), "bwd_preprocess launch");
}

void launch_postprocess(const DqParams& dp, bool bf16, int64_t tiles, cudaStream_t stream) {
  (bf16 ? bwd_postprocess<true> : bwd_postprocess<false>)<<<unsigned(tiles), 128, 0, stream>>>(dp);
  check_cuda(cudaGetLastError(), "bwd_postprocess launch");
}

}  // namespace sparsek::attn_bwd_sm90
