// Hopper (sm_90a) block-sparse attention backward: dQ, dK, dV of attention() for the layouts of
// include/sparsek/attention.hpp (D = 64 or 128, f16 / bf16, 128x128 or 64x64 blocks). docs/KERNELS.md
// "Hopper attention backward" holds the design, the numbers and the ladder.
//
// One run is a short sequence of launches on the caller's stream (no host sync, no allocation:
// capturable); step 1 runs on a side stream of the plan, forked from and joined back into it:
//  1. The transposed layout, O(nnz) on the GPU: every in-range entry of the forward layout becomes a
//     (column = key block of a layout row group, query block, full?) record; a stable radix sort by
//     column orders each column's query blocks ascending; a pass writes q_indices (the sorted
//     records) and each column's [begin, end) (q_num_blocks = end - begin).
//  2. Preprocess: per (batch, key/value head) max|K| and max||V row|| (deterministic mode only);
//     per query row Delta = rowsum(dO o O), LSE * log2(e) (+inf for rows that attend nothing or lie
//     past Sq, so that P = 0 there), and the dQ grid scale (below).
//  3. The main kernel, KV-major (FlashAttention-3's shape): an item is one key block of one (batch,
//     key/value head); a persistent grid takes items from an atomic counter (head-major order, so
//     the query tiles and dQ sums of the heads in flight stay in L2). Warp 0 of warpgroup 0 loads
//     the item's K and V tiles once, then, for every query head of the group and every query block
//     of the column, Q and dO tiles of MS rows (+ their Delta / LSE rows) into a 2-stage ring.
//     Consumer warpgroup w owns keys w*64 .. w*64+63 of the block and, per step:
//        S^T = K Q^T, dP^T = V dO^T               (wgmma, both operands from shared memory)
//        P^T = exp2(S^T * scale*log2e - LSE2), masks; dS^T = P^T o (dP^T - Delta)
//        dV += P^T dO, dK += dS^T Q                (wgmma with P^T / dS^T straight from registers)
//        dS^T -> shared memory; dQ_tile = dS K      (wgmma: both warpgroups' dS^T, this warpgroup's
//                                                     64x64 or 64xD part of the step's dQ)
//     and sends its dQ part to a global accumulator with one bulk reduce-add (TMA engine, in L2).
//     dK and dV stay in registers across the item (for GQA they sum over the group) and leave by
//     TMA store at its end; a key block nobody attends gets zeros.
//  4. Postprocess: the accumulator times its scale -> dq in the output dtype.
//
// Determinism: with deterministic (the default) each dQ contribution is rounded to an integer
// multiple of the row's grid unit u and the multiples are added as 32-bit integers. Integer sums
// modulo 2^32 do not depend on the order the contributions arrive in (bit-identical runs), and they
// are exact whenever the final sum fits in 32 bits. u comes from a bound of the row's dQ before the
// softmax scale: |(dS K)_ij| <= max|K| * sum_k |dS_ik| <= max|K| (max||V|| ||dO_i|| + |Delta_i|)
// =: bound_i (sum_k P_ik = 1, |dP_ik| <= ||dO_i|| max||V||; the row's own Delta rather than its
// bound ||dO_i|| max||V||, which also covers an O inconsistent with V), at most
// 2 max|K| max||V|| ||dO_i||. u = 2^(e - 30) with 2^(e-1) <= bound_i < 2^e, so every contribution
// and the sum lie below 2^30 u (a factor 2 of headroom for the rounding of P, dS and the fp32
// products). Each contribution is off by at most u / 2 <= 2^-30 bound_i. The bound needs max|K| and
// max||V|| of the head: one pass over K and V before the main kernel. A row with LSE = -inf (it
// attends nothing, or the forward returned -inf for it) has P = 0, no contributions, and keeps
// dq = 0; any other row whose bound, Delta or LSE is not finite (a NaN or inf in the head's K or V,
// or in the row's O, dO or LSE) gets a NaN dq row: rounding to integers would otherwise turn the
// NaN into 0.
// Otherwise the fp32 contributions are added as they come (FlashAttention's atomic dQ).
// Malformed layouts cannot crash or hang a run: out-of-range indices are dropped, counts clamped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/device.hpp"
#include "kernels/dtype.cuh"
#include "kernels/sm90/kit/ring.cuh"
#include "kernels/sm90/kit/swizzle.cuh"
#include "kernels/sm90/kit/tile_mma.cuh"
#include "kernels/sm90/kit/tma.hpp"
#include "kernels/ptx/async.cuh"
#include "kernels/ptx/wgmma.cuh"
#include "plan/backends.hpp"

namespace sparsek {
namespace sm90_attention_bwd {

// ---------------------------------------------------------------------------------------------
// Compile-time configuration: one per (D, block, dtype).

constexpr int kSmemLimit = 227 * 1024;

template <int D_, int BLOCK_, bool BF16_>
struct Config {
  static constexpr int D = D_;
  static constexpr int BN = BLOCK_;  // keys of an item (= block_kv)
  static constexpr int BM = BLOCK_;  // rows of a query block (= block_q)
  static constexpr bool BF16 = BF16_;
  static constexpr int NWG = BN / 64;  // consumer warpgroups, 64 keys each
  static constexpr int THREADS = 128 * (NWG + 1);
  // Query rows per step: 64, so that the S^T and dP^T accumulators (MS / 2 registers each) fit
  // beside dK and dV (D / 2 each) and the step's dQ parts.
  static constexpr int MS = 64;
  static constexpr int SUB = BM / MS;           // steps per (query block, key block) pair
  static constexpr int CHUNKS = D / 64;         // 64-element (128-byte) swizzle rows across D
  static constexpr int KV_BYTES = BN * D * 2;   // K or V: [CHUNKS][BN rows][64]
  static constexpr int QS_BYTES = MS * D * 2;   // Q or dO step tile: [CHUNKS][MS rows][64]
  static constexpr int ROW_BYTES = MS * 16;     // a step's rows: {LSE2, Delta, dQ grid scale, 0}
  static constexpr int DS_BYTES = BN * MS * 2;  // dS^T: [BN key rows][64 queries]
  // A step's dQ (MS x D) is D / 64 tiles of 64 x 64 (wgmma n64, 32 registers). Two warpgroups take
  // one tile each (D = 128) or take turns step by step (D = 64); one warpgroup takes them all.
  static constexpr int TN = D / 64;
  static constexpr int MY_TILES = NWG == 1 ? TN : 1;  // dQ tiles of a warpgroup in a step it has any
  // One dQ tile per warpgroup and step: the next step's S^T (and at D = 64 its dP^T) is issued
  // before this step's dQ leaves the registers (consume()). D = 128 prefetches S^T only: dP^T's 32
  // registers more would spill at 240. (64x64 blocks at D = 128: one warpgroup takes both dQ tiles
  // of a step, no prefetch.)
  static constexpr bool PREFETCH = MY_TILES == 1;
  static constexpr bool PREFETCH_DP = D == 64;
  // Per-warpgroup output buffer: its dQ tiles (4-byte grid integers or fp32) for the bulk reduce, or
  // dK and dV staged for their TMA stores at the end of an item.
  static constexpr int OUT_BYTES = std::max(MY_TILES * 4096 * 4, 2 * 64 * D * 2);
  static constexpr int FIXED = 2 * KV_BYTES + DS_BYTES + NWG * OUT_BYTES + 256 /* barriers, infos */ + 1024 /* align */;
  static constexpr int STAGE_BYTES = 2 * QS_BYTES + ROW_BYTES;
  static constexpr int CTAS_PER_SM = (NWG == 1 && 2 * (FIXED + 2 * STAGE_BYTES + 1024) <= kSmemLimit) ? 2 : 1;
  static constexpr int BUDGET = kSmemLimit / CTAS_PER_SM - 1024;  // 1 KB per CTA is the driver's
  static constexpr int STAGES = std::min(4, (BUDGET - FIXED) / STAGE_BYTES);
  static constexpr int SMEM = FIXED + STAGES * STAGE_BYTES;
  static constexpr int S_REGS = MS / 2;  // fp32 per thread of an m64 x MS accumulator
  static constexpr int KV_REGS = D / 2;  // fp32 per thread of dK or dV (m64 x D)
  // Register budgets after setmaxnreg (whole warpgroups) share the CTA's launch allocation,
  // THREADS x ENTRY_REGS: the producer needs few (at 24 it spills a few values to L1; the
  // consumers need up to R237 at D = 128).
  static constexpr int ENTRY_REGS = std::min(255, 65536 / (THREADS * CTAS_PER_SM)) / 8 * 8;
  static constexpr int PRODUCER_REGS = NWG == 1 ? 40 : D == 128 ? 24 : 40;
  static constexpr int CONSUMER_REGS = NWG == 1 ? (CTAS_PER_SM == 2 ? 216 : 248) : D == 128 ? 240 : 232;

  static_assert(D == 64 || D == 128, "D must be 64 or 128");
  static_assert(BN == 64 || BN == 128, "blocks are 64x64 or 128x128");
  static_assert(KV_BYTES % 1024 == 0 && QS_BYTES % 1024 == 0 && DS_BYTES % 1024 == 0 && OUT_BYTES % 1024 == 0,
                "swizzled tiles must start 1024-byte aligned (descriptor base offset 0)");
  static_assert(STAGES >= 2, "Q and dO need two stages to load ahead of the math");
  static_assert(SMEM <= BUDGET, "shared memory per CTA exceeds the budget");
  static_assert(128 * PRODUCER_REGS + 128 * NWG * CONSUMER_REGS <= THREADS * ENTRY_REGS,
                "setmaxnreg budgets exceed the CTA's register allocation (setmaxnreg.inc would wait forever)");
};

struct Params {
  int items;             // (batch, kv head, key block) items
  int hq, hkv, group;    // query heads, key/value heads, hq / hkv
  int nkb, skv;          // key blocks, keys
  int sq_pad, r64;       // query rows padded to whole blocks; sq_pad / 64
  int lb, lh, lh_is_kv;  // layout extents (as the forward)
  const int* col_begin;  // [lb * lh * nkb]: a column's records in q_indices
  const int* col_end;
  const int* q_indices;   // records: query block | full << 31
  int* item_counter;      // reset to 0 by the layout pass of every run
  const float4* rowinfo;  // [B, Hq, sq_pad]: {LSE * log2e, Delta, dQ grid scale, 0}
  void* dq_acc;           // int32 (deterministic) or fp32: [B, Hq, r64, D / 64] tiles of 64 x 64
  int det, causal;
  float scale_log2, scale;
};

// The layout column of (batch, query head, key block); the layout's head extent may be 1, Hkv or Hq.
__device__ __forceinline__ int column_of(const Params& p, int b, int hq, int hkv, int j) {
  const int lb = p.lb == 1 ? 0 : b;
  const int lh = p.lh == 1 ? 0 : p.lh_is_kv ? hkv : hq;
  return (lb * p.lh + lh) * p.nkb + j;
}

// ---------------------------------------------------------------------------------------------
// The transposed layout (runs first: it also resets the item counter).

struct LayoutParams {
  const int* kv_num;
  const int* kv_idx;
  const int* full_num;  // null: no full blocks
  const int* full_idx;
  int64_t slots;  // layout rows * (kmax + full_kmax)
  int width, kmax, full_kmax, mq, nkb, ncols;
};

// Sort records: slot (row, t) of the forward layout -> key = its column (ncols when unused).
__global__ void bwd_layout_keys(const LayoutParams lp, unsigned* keys, int* slots, int* col_begin, int* col_end,
                                int* item_counter) {
  const int64_t n = std::max<int64_t>(lp.slots, lp.ncols);
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    if (x < lp.ncols) col_begin[x] = col_end[x] = 0;
    if (x < lp.slots) {
      const int64_t row = x / lp.width;
      const int t = int(x % lp.width);
      int blk = -1;
      if (t < lp.kmax) {
        if (t < min(max(lp.kv_num[row], 0), lp.kmax)) blk = lp.kv_idx[row * lp.kmax + t];
      } else if (lp.full_num && t - lp.kmax < min(max(lp.full_num[row], 0), lp.full_kmax)) {
        blk = lp.full_idx[row * lp.full_kmax + (t - lp.kmax)];
      }
      const int group = int(row / lp.mq);  // (layout batch, layout head)
      keys[x] = blk >= 0 && blk < lp.nkb ? unsigned(group * lp.nkb + blk) : unsigned(lp.ncols);
      slots[x] = int(x);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *item_counter = 0;
}

// After the stable sort by column: q_indices and every column's [begin, end).
__global__ void bwd_layout_columns(const LayoutParams lp, const unsigned* keys, const int* slots, int* q_indices,
                                   int* col_begin, int* col_end) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < lp.slots; e += int64_t(gridDim.x) * blockDim.x) {
    const unsigned key = keys[e];
    if (key >= unsigned(lp.ncols)) continue;  // unused slots sort last
    const int slot = slots[e];
    const int qb = (slot / lp.width) % lp.mq;
    const bool full = slot % lp.width >= lp.kmax;
    q_indices[e] = qb | (full ? int(0x80000000u) : 0);
    if (e == 0 || keys[e - 1] != key) col_begin[key] = int(e);
    if (e + 1 == lp.slots || keys[e + 1] != key) col_end[key] = int(e + 1);
  }
}

// ---------------------------------------------------------------------------------------------
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

// Per (batch, key/value head): {max |K element|, max ||V row||^2} as float bit patterns. Both are
// >= 0, so an unsigned max orders them, and every NaN pattern (sign cleared) lies above +inf's: a
// non-finite value anywhere in the head leaves a non-finite bound. Zeroed before each run.
struct KvParams {
  const void* k;
  const void* v;
  unsigned* bounds;  // [B * Hkv][2]
  int64_t k_sb, k_sh, k_ss, v_sb, v_sh, v_ss;
  int hkv, skv;
};

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

struct RowParams {
  const void* o;
  const void* dout;
  const float* lse;          // [B, Hq, Sq]
  const unsigned* bounds;    // [B * Hkv][2] from bwd_kv_bounds (deterministic mode)
  float4* rowinfo;           // [B, Hq, sq_pad]
  int64_t o_sb, o_sh, o_ss, do_sb, do_sh, do_ss;
  int hq, group, sq, sq_pad, det;
};

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

// dq = accumulator * u * scale (u = 1 / the grid scale; NaN for a row marked non-finite). The
// accumulator tiles hold 64 x 64 elements in the order of a wgmma m64n64 fp32 accumulator: element
// (register r, thread t) at (r / 4) * 512 + t * 4 + r % 4, i.e. row 16 (t / 32) + (t % 32) / 4 +
// 8 ((r / 2) % 2), column 8 (r / 4) + 2 (t % 4) + r % 2. Read 16 bytes per thread, transposed
// through shared memory, written a 128-byte row per warp instruction.
struct DqParams {
  const void* acc;
  const float4* rowinfo;
  void* dq;
  int64_t sb, sh, ss;
  int hq, sq, sq_pad, r64, tn, det;
  float scale;
};

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

// ---------------------------------------------------------------------------------------------
// The main kernel (sm_90a only; the sm_80 pass compiles an empty kernel).

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

using dev::kWaitLimit;

// Shared-memory addresses of one CTA (shared-window, 32-bit): a base and constant offsets, so
// that every address is one register plus an immediate.
template <class Cfg>
struct Smem {
  static constexpr uint32_t K = 0, V = K + Cfg::KV_BYTES, Q = V + Cfg::KV_BYTES;  // tiles; Q, D, ROWS
  static constexpr uint32_t D = Q + Cfg::STAGES * Cfg::QS_BYTES;                  // have STAGES stages
  static constexpr uint32_t DS = D + Cfg::STAGES * Cfg::QS_BYTES;
  static constexpr uint32_t OUT = DS + Cfg::DS_BYTES;
  static constexpr uint32_t ROWS = OUT + Cfg::NWG * Cfg::OUT_BYTES;
  static constexpr uint32_t ITEM_FULL = ROWS + Cfg::STAGES * Cfg::ROW_BYTES;  // barriers: the item's
  static constexpr uint32_t ITEM_EMPTY = ITEM_FULL + 8;                       // K / V tiles and info
  static constexpr uint32_t QD_FULL = ITEM_EMPTY + 8;                         // [STAGES] each
  static constexpr uint32_t QD_EMPTY = QD_FULL + 8 * Cfg::STAGES;
  static constexpr uint32_t ITEM_INFO = QD_EMPTY + 8 * Cfg::STAGES;  // int2 {item id or -1, steps}
  static constexpr uint32_t STAGE_INFO = ITEM_INFO + 8;              // int2 per stage {row0, hq * 2 + full}
  static_assert(STAGE_INFO + 8 * Cfg::STAGES + 1024 <= uint32_t(Cfg::SMEM), "shared memory layout overflows SMEM");
  uint32_t base;  // shared-window address, 1024-byte aligned
  uint8_t* ptr;   // the same as a generic pointer
  __device__ uint32_t k() const { return base + K; }
  __device__ uint32_t v() const { return base + V; }
  __device__ uint32_t q(int s) const { return base + Q + s * Cfg::QS_BYTES; }
  __device__ uint32_t d(int s) const { return base + D + s * Cfg::QS_BYTES; }
  __device__ uint32_t ds() const { return base + DS; }
  __device__ uint32_t out(int wg) const { return base + OUT + wg * Cfg::OUT_BYTES; }
  __device__ uint32_t rows(int s) const { return base + ROWS + s * Cfg::ROW_BYTES; }
  __device__ uint32_t item_full() const { return base + ITEM_FULL; }
  __device__ uint32_t item_empty() const { return base + ITEM_EMPTY; }
  __device__ uint32_t qd_full(int s) const { return base + QD_FULL + 8 * s; }
  __device__ uint32_t qd_empty(int s) const { return base + QD_EMPTY + 8 * s; }
  template <class T>
  __device__ T* at(uint32_t offset) const {
    return reinterpret_cast<T*>(ptr + offset);
  }
};

struct Item {
  int b, hkv, j;
};
__device__ __forceinline__ Item decode(int id, const Params& p) {
  return {id / (p.hkv * p.nkb), (id / p.nkb) % p.hkv, id % p.nkb};
}

// Producer: one warp. Lane 0 issues every load; the warp reads column records 32 at a time.
template <class Cfg>
__device__ __forceinline__ void produce(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                        const CUtensorMap* tm_do, const Params& p, const Smem<Cfg>& sm) {
  const int lane = threadIdx.x % 32;
  dev::Ring<Cfg::STAGES> qr;  // lane 0's (the only lane that uses it)
  uint32_t item_phase = 0;
  for (;;) {
    int id = 0;
    if (lane == 0) id = atomicAdd(p.item_counter, 1);
    id = __shfl_sync(0xffffffffu, id, 0);
    const bool done = id >= p.items;
    const Item it = decode(done ? 0 : id, p);
    // Steps of the item: every query head of the group, every record of its column, SUB each.
    int steps = 0;
    if (!done)
      for (int g0 = 0; g0 < p.group; g0 += 32) {
        int n = 0;
        if (g0 + lane < p.group) {
          const int col = column_of(p, it.b, it.hkv * p.group + g0 + lane, it.hkv, it.j);
          n = p.col_end[col] - p.col_begin[col];
        }
#pragma unroll
        for (int m = 16; m > 0; m /= 2) n += __shfl_xor_sync(0xffffffffu, n, m);
        steps += n;
      }
    steps *= Cfg::SUB;
    if (lane == 0) {
      ptx::mbar_wait_or_trap(sm.item_empty(), item_phase ^ 1, kWaitLimit);
      *sm.template at<int2>(Smem<Cfg>::ITEM_INFO) = make_int2(done ? -1 : id, steps);
      ptx::mbar_arrive_expect_tx(sm.item_full(), steps > 0 ? 2 * Cfg::KV_BYTES : 0);
      if (steps > 0) {
        // k, v: (64 of D, keys, D chunks, kv heads, batch), box (64, BN, CHUNKS, 1, 1)
        ptx::tma_load_5d(sm.k(), tm_k, sm.item_full(), 0, it.j * Cfg::BN, 0, it.hkv, it.b);
        ptx::tma_load_5d(sm.v(), tm_v, sm.item_full(), 0, it.j * Cfg::BN, 0, it.hkv, it.b);
      }
    }
    item_phase ^= 1;
    if (done) break;
    if (steps == 0) continue;
    for (int g = 0; g < p.group; ++g) {
      const int hq = it.hkv * p.group + g;
      const int col = column_of(p, it.b, hq, it.hkv, it.j);
      const int begin = p.col_begin[col], end = p.col_end[col];
      const float4* rows = p.rowinfo + (int64_t(it.b) * p.hq + hq) * p.sq_pad;
      for (int e0 = begin; e0 < end; e0 += 32) {
        const int rec = e0 + lane < end ? p.q_indices[e0 + lane] : 0;
        const int count = min(32, end - e0);
        for (int t = 0; t < count; ++t) {
          const int r_t = __shfl_sync(0xffffffffu, rec, t);
          const int qb = r_t & 0x7fffffff, full = r_t < 0 ? 1 : 0;
          if (lane == 0) {
            for (int h = 0; h < Cfg::SUB; ++h) {
              const int row0 = qb * Cfg::BM + h * Cfg::MS;
              ptx::mbar_wait_or_trap(sm.qd_empty(qr.stage), qr.phase ^ 1, kWaitLimit);
              *sm.template at<int2>(Smem<Cfg>::STAGE_INFO + 8 * qr.stage) = make_int2(row0, hq * 2 + full);
              const uint32_t bar = sm.qd_full(qr.stage);
              ptx::mbar_arrive_expect_tx(bar, 2 * Cfg::QS_BYTES + Cfg::ROW_BYTES);
              // q, dO: (64 of D, rows, D chunks, heads, batch), box (64, MS, CHUNKS, 1, 1)
              ptx::tma_load_5d(sm.q(qr.stage), tm_q, bar, 0, row0, 0, hq, it.b);
              ptx::tma_load_5d(sm.d(qr.stage), tm_do, bar, 0, row0, 0, hq, it.b);
              ptx::bulk_load(sm.rows(qr.stage), rows + row0, Cfg::ROW_BYTES, bar);
              qr.advance();
            }
          }
          __syncwarp();
        }
      }
    }
  }
}

// A 64 x 64 dQ tile = dS K over the item's BN keys: A = dS^T in shared memory read MN-major (the
// step's 64 queries contiguous, BN key rows 128 bytes apart), B = the K tile read MN-major (D
// contiguous; columns 64 n_chunk .. 64 n_chunk + 63).
template <class Cfg>
__device__ __forceinline__ void issue_dq(float (&acc)[32], uint32_t ds, uint32_t k_tile, int n_chunk) {
#pragma unroll
  for (int kk = 0; kk < Cfg::BN / 16; ++kk) {
    const uint64_t da = ptx::smem_desc(ds + kk * 16 * 128, Cfg::BN * 128, 1024, ptx::Swizzle::b128);
    const uint64_t db =
        ptx::smem_desc(k_tile + n_chunk * (Cfg::BN * 128) + kk * 16 * 128, Cfg::BN * 128, 1024, ptx::Swizzle::b128);
    ptx::wgmma_m64k16<64, Cfg::BF16, 1, 1>(acc, da, db, kk > 0 ? 1 : 0);
  }
}

// Consumer warpgroup wg: keys wg*64 .. wg*64+63 of every item.
// Named barriers (128 * NWG threads): 1 = "every warpgroup's dQ wgmma of the last step is done"
// (dS^T may be overwritten), 2 = "dS^T of this step is complete"; 3 + wg = warpgroup wg alone.
// NOTE: the consumers wait without the trap of mbar_wait_or_trap (see the forward kernel: a trap
// block shared between the warpgroup branches makes ptxas compile the consumers within the entry
// register budget); a lost arrival stalls the producer, which traps.
template <class Cfg>
__device__ __forceinline__ void consume(const CUtensorMap* tm_dk, const CUtensorMap* tm_dv, const Params& p,
                                        const Smem<Cfg>& sm, int wg) {
  const int tid = threadIdx.x % 128, lane = tid % 32, warp = tid / 32;
  constexpr int ALL = 128 * Cfg::NWG;
  dev::Ring<Cfg::STAGES> qr;
  uint32_t item_phase = 0;
  const uint32_t out = sm.out(wg);
  uint8_t* out_ptr = sm.template at<uint8_t>(Smem<Cfg>::OUT + wg * Cfg::OUT_BYTES);
  uint8_t* ds_ptr = sm.template at<uint8_t>(Smem<Cfg>::DS);
  const uint32_t k_rows = sm.k() + wg * 64 * 128, v_rows = sm.v() + wg * 64 * 128;  // this warpgroup's keys
  uint32_t dq_turn = 0;  // counts steps: with two warpgroups and one dQ tile they take turns
  float dk[Cfg::KV_REGS], dv[Cfg::KV_REGS];
  for (;;) {
    ptx::mbar_wait(sm.item_full(), item_phase);
    item_phase ^= 1;
    const int2 info = *sm.template at<const int2>(Smem<Cfg>::ITEM_INFO);
    if (info.x < 0) break;
    const Item it = decode(info.x, p);
    const int steps = info.y;
#pragma unroll
    for (int r = 0; r < Cfg::KV_REGS; ++r) dk[r] = dv[r] = 0.f;
    const int key_row = it.j * Cfg::BN + wg * 64 + 16 * warp + lane / 4;  // + 8 * h: this thread's keys
    const bool tail = (it.j + 1) * Cfg::BN > p.skv;
    // Pieces of a step that both step loops below share (inlined lambdas).
    // P^T = exp2(S^T scale log2e - LSE2) (0 where masked), dS^T = P^T o (dP^T - Delta), in place.
    // Element (register 4c + 2h + e) is key key_row + 8h, query row0 + 8c + 2 (lane % 4) + e.
    // Masked scores are set to -inf first, in a pass of their own under one uniform branch per step
    // (exp2 then gives exactly 0, as the masks require): with the test inside the loop below, ptxas
    // if-converted it into ~4 predicated instructions per element, run on every step whether a mask
    // applied or not.
    auto softmax_grad = [&](float(&s)[Cfg::S_REGS], float(&dp)[Cfg::S_REGS], const float4* rows, int row0,
                            bool causal) {
      if (tail || causal) {
#pragma unroll
        for (int c = 0; c < Cfg::MS / 8; ++c)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = key_row + 8 * h, col = 8 * c + 2 * (lane % 4);
              if (key >= p.skv || (causal && key > row0 + col + e)) s[4 * c + 2 * h + e] = -INFINITY;
            }
      }
#pragma unroll
      for (int c = 0; c < Cfg::MS / 8; ++c) {
        const int col = 8 * c + 2 * (lane % 4);
        const float4 r0 = rows[col], r1 = rows[col + 1];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int x = 4 * c + 2 * h + e;
            const float pv = ptx::exp2_approx(fmaf(s[x], p.scale_log2, -(e ? r1.x : r0.x)));
            s[x] = pv;
            dp[x] = pv * (dp[x] - (e ? r1.y : r0.y));
          }
      }
    };
    // dQ tile t of the step (its wgmma complete) -> the output buffer in accumulator-fragment order
    // (the accumulator's layout in global memory too).
    auto stage_dq = [&](float(&dq)[32], int t, float qs0, float qs1) {
#pragma unroll
      for (int r = 0; r < 32; ++r) ptx::fence_operand(dq[r]);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int pos = t * 4096 + c * 512 + tid * 4;
        if (p.det) {  // round to the grid (cvt.rni saturates; a NaN marker row gives 0)
          *reinterpret_cast<int4*>(reinterpret_cast<int*>(out_ptr) + pos) =
              make_int4(__float2int_rn(dq[4 * c] * qs0), __float2int_rn(dq[4 * c + 1] * qs0),
                        __float2int_rn(dq[4 * c + 2] * qs1), __float2int_rn(dq[4 * c + 3] * qs1));
        } else {
          *reinterpret_cast<float4*>(reinterpret_cast<float*>(out_ptr) + pos) =
              make_float4(dq[4 * c], dq[4 * c + 1], dq[4 * c + 2], dq[4 * c + 3]);
        }
      }
    };
    // The end of a step: the stage released, this warpgroup's dQ tiles sent by one bulk reduce-add.
    auto end_step = [&](bool my_dq, int row0, int hq) {
      // Q, dO, the rows and the stage info are read. Every thread arrives: each releases its own
      // generic reads of the rows and the info word (an arrival by lane 0 alone orders the other
      // lanes' reads only through warp convergence, which racecheck reports as a hazard).
      ptx::mbar_arrive(sm.qd_empty(qr.stage));
      qr.advance();
      if (my_dq) {
        ptx::fence_proxy_async_smem();  // st.shared above, read by the bulk reduce (async proxy)
        ptx::named_barrier_sync(3 + wg, 128);
        if (tid == 0) {
          // accumulator: [B, Hq, sq_pad / 64, D / 64] tiles of 64 x 64, this warpgroup's are adjacent
          const int64_t tile = ((int64_t(it.b) * p.hq + hq) * p.r64 + row0 / 64) * Cfg::TN + (Cfg::NWG == 1  ? 0
                                                                                              : Cfg::TN == 2 ? wg
                                                                                                             : 0);
          constexpr uint32_t elems = Cfg::MY_TILES * 4096;
          if (p.det)
            ptx::bulk_reduce_add_u32(static_cast<int*>(p.dq_acc) + tile * 4096, out, elems * 4);
          else
            ptx::bulk_reduce_add_f32(static_cast<float*>(p.dq_acc) + tile * 4096, out, elems * 4);
          ptx::bulk_commit_group();
        }
      }
    };

    if constexpr (!Cfg::PREFETCH) {
      for (int step = 0; step < steps; ++step) {
        ptx::mbar_wait(sm.qd_full(qr.stage), qr.phase);
        const int2 si = *sm.template at<const int2>(Smem<Cfg>::STAGE_INFO + 8 * qr.stage);
        const int row0 = si.x, hq = si.y >> 1;
        const bool causal = p.causal && !(si.y & 1) && it.j * Cfg::BN + Cfg::BN - 1 > row0;
        const uint32_t q_tile = sm.q(qr.stage), d_tile = sm.d(qr.stage);
        const float4* rows = sm.template at<const float4>(Smem<Cfg>::ROWS + qr.stage * Cfg::ROW_BYTES);

        // S^T = K Q^T, dP^T = V dO^T (this warpgroup's 64 keys x MS queries).
        float s[Cfg::S_REGS], dp[Cfg::S_REGS];
        ptx::wgmma_fence();
        dev::mma_rows_rows<Cfg::D, Cfg::MS, Cfg::BF16>(s, k_rows, Cfg::BN * 128, q_tile, Cfg::MS * 128);
        dev::mma_rows_rows<Cfg::D, Cfg::MS, Cfg::BF16>(dp, v_rows, Cfg::BN * 128, d_tile, Cfg::MS * 128);
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
#pragma unroll
        for (int r = 0; r < Cfg::S_REGS; ++r) {
          ptx::fence_operand(s[r]);
          ptx::fence_operand(dp[r]);
        }

        softmax_grad(s, dp, rows, row0, causal);
        uint32_t pa[Cfg::MS / 16][4], da[Cfg::MS / 16][4];
#pragma unroll
        for (int kk = 0; kk < Cfg::MS / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            pa[kk][r] = dev::pack2<Cfg::BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
            da[kk][r] = dev::pack2<Cfg::BF16>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
          }
        // The dQ grid scales of this thread's two dQ rows (read before the stage is released).
        const int dq_row = 16 * warp + lane / 4;
        const float qs0 = rows[dq_row].z, qs1 = rows[dq_row + 8].z;

        // dV += P^T dO, dK += dS^T Q (A from registers).
#pragma unroll
        for (int r = 0; r < Cfg::KV_REGS; ++r) {
          ptx::fence_operand(dk[r]);
          ptx::fence_operand(dv[r]);
        }
        ptx::wgmma_fence();
        dev::mma_regs_rows<Cfg::MS, Cfg::D, Cfg::BF16>(dv, pa, d_tile, Cfg::MS * 128);
        dev::mma_regs_rows<Cfg::MS, Cfg::D, Cfg::BF16>(dk, da, q_tile, Cfg::MS * 128);
        ptx::wgmma_commit();

        // dS^T -> shared memory, once every warpgroup's last dQ wgmma has read the previous one.
        ptx::named_barrier_sync(1, ALL);
#pragma unroll
        for (int kk = 0; kk < Cfg::MS / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int key = wg * 64 + 16 * warp + lane / 4 + 8 * (r & 1);
            const int query = 16 * kk + 8 * (r >> 1) + 2 * (lane % 4);
            *reinterpret_cast<uint32_t*>(ds_ptr + dev::swizzle128_offset(key, query, Cfg::BN * 128)) = da[kk][r];
          }
        ptx::fence_proxy_async_smem();  // st.shared above, read by wgmma (async proxy) below
        ptx::named_barrier_sync(2, ALL);

        // This warpgroup's dQ tiles of the step = dS K -> the output buffer in accumulator-fragment
        // order (the accumulator's layout in global memory too) -> one bulk reduce-add.
        const bool my_dq = Cfg::NWG == 1 || Cfg::TN == 2 || (dq_turn++ & 1) == uint32_t(wg);
        if (my_dq) {
          const int first = Cfg::NWG == 1 ? 0 : Cfg::TN == 2 ? wg : 0;  // its first tile (column chunk)
#pragma unroll 1
          for (int t = 0; t < Cfg::MY_TILES; ++t) {
            float dq[32];
            ptx::wgmma_fence();
            issue_dq<Cfg>(dq, sm.ds(), sm.k(), first + t);
            ptx::wgmma_commit();
            if (t == 0) {
              if (tid == 0) ptx::bulk_wait_group_read<0>();  // the last bulk operation has read the buffer
              ptx::named_barrier_sync(3 + wg, 128);
            }
            ptx::wgmma_wait<0>();
            stage_dq(dq, t, qs0, qs1);
          }
        } else {
          ptx::wgmma_wait<0>();
        }
#pragma unroll
        for (int r = 0; r < Cfg::KV_REGS; ++r) {
          ptx::fence_operand(dk[r]);
          ptx::fence_operand(dv[r]);
        }
        end_step(my_dq, row0, hq);
      }
    } else {
      // One dQ tile per warpgroup and step: the next step's S^T (D = 64: and dP^T) is issued right
      // after this step's dQ product, so that the tensor cores run it while the dQ tile is rounded
      // and stored; s (and dp) then live across steps. D = 128 issues dP^T at the start of its own
      // step: 2 * S_REGS more registers in the dQ epilogue would spill at 240. A second loop rather
      // than one loop for both: the kernels without the prefetch (64x64 blocks at D = 128) keep the
      // SASS they had (a shared step body once scheduled them differently, 2-4% slower).
      float s[Cfg::S_REGS], dp[Cfg::S_REGS];
      auto issue_sdp = [&](uint32_t stage) {
        ptx::wgmma_fence();
        dev::mma_rows_rows<Cfg::D, Cfg::MS, Cfg::BF16>(s, k_rows, Cfg::BN * 128, sm.q(stage), Cfg::MS * 128);
        if constexpr (Cfg::PREFETCH_DP)
          dev::mma_rows_rows<Cfg::D, Cfg::MS, Cfg::BF16>(dp, v_rows, Cfg::BN * 128, sm.d(stage), Cfg::MS * 128);
        ptx::wgmma_commit();
      };
      // NEXT: issue the next step's products too (every step of an item but its last). A
      // compile-time flag: a wgmma on a path that ptxas must treat as divergent serialises every
      // wgmma of the kernel.
      auto step = [&](auto next_tag) {
        constexpr bool NEXT = decltype(next_tag)::value;
        const int2 si = *sm.template at<const int2>(Smem<Cfg>::STAGE_INFO + 8 * qr.stage);
        const int row0 = si.x, hq = si.y >> 1;
        const bool causal = p.causal && !(si.y & 1) && it.j * Cfg::BN + Cfg::BN - 1 > row0;
        const uint32_t q_tile = sm.q(qr.stage), d_tile = sm.d(qr.stage);
        const float4* rows = sm.template at<const float4>(Smem<Cfg>::ROWS + qr.stage * Cfg::ROW_BYTES);
        if constexpr (!Cfg::PREFETCH_DP) {
          ptx::wgmma_fence();
          dev::mma_rows_rows<Cfg::D, Cfg::MS, Cfg::BF16>(dp, v_rows, Cfg::BN * 128, d_tile, Cfg::MS * 128);
          ptx::wgmma_commit();
        }
        ptx::wgmma_wait<0>();
#pragma unroll
        for (int r = 0; r < Cfg::S_REGS; ++r) {
          ptx::fence_operand(s[r]);
          ptx::fence_operand(dp[r]);
        }
        softmax_grad(s, dp, rows, row0, causal);
        // As in the loop above, from here to the dQ product.
        uint32_t pa[Cfg::MS / 16][4], da[Cfg::MS / 16][4];
#pragma unroll
        for (int kk = 0; kk < Cfg::MS / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            pa[kk][r] = dev::pack2<Cfg::BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
            da[kk][r] = dev::pack2<Cfg::BF16>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
          }
        const int dq_row = 16 * warp + lane / 4;
        const float qs0 = rows[dq_row].z, qs1 = rows[dq_row + 8].z;
#pragma unroll
        for (int r = 0; r < Cfg::KV_REGS; ++r) {
          ptx::fence_operand(dk[r]);
          ptx::fence_operand(dv[r]);
        }
        ptx::wgmma_fence();
        dev::mma_regs_rows<Cfg::MS, Cfg::D, Cfg::BF16>(dv, pa, d_tile, Cfg::MS * 128);
        dev::mma_regs_rows<Cfg::MS, Cfg::D, Cfg::BF16>(dk, da, q_tile, Cfg::MS * 128);
        ptx::wgmma_commit();
        ptx::named_barrier_sync(1, ALL);
#pragma unroll
        for (int kk = 0; kk < Cfg::MS / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int key = wg * 64 + 16 * warp + lane / 4 + 8 * (r & 1);
            const int query = 16 * kk + 8 * (r >> 1) + 2 * (lane % 4);
            *reinterpret_cast<uint32_t*>(ds_ptr + dev::swizzle128_offset(key, query, Cfg::BN * 128)) = da[kk][r];
          }
        ptx::fence_proxy_async_smem();
        ptx::named_barrier_sync(2, ALL);

        // One dQ tile per warpgroup and step: D = 128, a tile each; D = 64, the single tile (TN = 1),
        // this warpgroup's on every other step with two.
        const bool my_dq = Cfg::NWG == 1 || Cfg::TN == 2 || (dq_turn++ & 1) == uint32_t(wg);
        float dq[32];
        if (my_dq) {
          ptx::wgmma_fence();
          issue_dq<Cfg>(dq, sm.ds(), sm.k(), Cfg::TN == 2 ? wg : 0);
          ptx::wgmma_commit();
          if (tid == 0) ptx::bulk_wait_group_read<0>();  // the last bulk operation has read the buffer
          ptx::named_barrier_sync(3 + wg, 128);
        }
        if constexpr (NEXT) {
          if (my_dq)
            ptx::wgmma_wait<1>();  // dV and dK have read P^T and dS^T (dQ may still run)
          else
            ptx::wgmma_wait<0>();
          dev::Ring<Cfg::STAGES> next = qr;
          next.advance();
          ptx::mbar_wait(sm.qd_full(next.stage), next.phase);
          issue_sdp(next.stage);  // into s and dp, which this step no longer reads
          ptx::wgmma_wait<1>();   // dQ done (unconditional, so that ptxas sees dq complete on every path)
        } else {
          ptx::wgmma_wait<0>();
        }
        if (my_dq) stage_dq(dq, 0, qs0, qs1);
        if constexpr (!NEXT) {  // (with NEXT the next products are in flight: ptxas would serialise)
#pragma unroll
          for (int r = 0; r < Cfg::KV_REGS; ++r) {
            ptx::fence_operand(dk[r]);
            ptx::fence_operand(dv[r]);
          }
        }
        end_step(my_dq, row0, hq);
      };
      if (steps > 0) {
        ptx::mbar_wait(sm.qd_full(qr.stage), qr.phase);
        issue_sdp(qr.stage);
#pragma unroll 1
        for (int i = 0; i + 1 < steps; ++i) step(std::true_type{});
        step(std::false_type{});
      }
    }
    ptx::mbar_arrive(sm.item_empty());  // K, V and the item info are no longer read (every thread)

    // dK * scale and dV -> bf16 / f16 staging (swizzled [CHUNKS][64][64] each) -> TMA stores.
    if (tid == 0) ptx::bulk_wait_group_read<0>();
    ptx::named_barrier_sync(3 + wg, 128);
#pragma unroll
    for (int c = 0; c < Cfg::D / 8; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t off = dev::swizzle128_offset(16 * warp + lane / 4 + 8 * h, 8 * c + 2 * (lane % 4), 64 * 128);
        *reinterpret_cast<uint32_t*>(out_ptr + off) =
            dev::pack2<Cfg::BF16>(dk[4 * c + 2 * h] * p.scale, dk[4 * c + 2 * h + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(out_ptr + 64 * Cfg::D * 2 + off) =
            dev::pack2<Cfg::BF16>(dv[4 * c + 2 * h], dv[4 * c + 2 * h + 1]);
      }
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(3 + wg, 128);
    if (tid == 0) {
      // dk, dv: (64 of D, keys, D chunks, kv heads, batch), box (64, 64, CHUNKS, 1, 1); keys past
      // Skv are clipped by the tensor map.
      const int key0 = it.j * Cfg::BN + wg * 64;
      ptx::tma_store_5d(tm_dk, out, 0, key0, 0, it.hkv, it.b);
      ptx::tma_store_5d(tm_dv, out + 64 * Cfg::D * 2, 0, key0, 0, it.hkv, it.b);
      ptx::bulk_commit_group();
    }
  }
  // The last bulk reduce and TMA stores must finish before the CTA (and its shared memory) goes away.
  if (tid == 0) ptx::bulk_wait_group<0>();
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::CTAS_PER_SM)
    attention_bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                         const __grid_constant__ CUtensorMap tm_dk, const __grid_constant__ CUtensorMap tm_dv,
                         const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const Smem<Cfg> sm{base, smem_raw + (base - raw)};
  if (threadIdx.x == 0) {
    ptx::mbar_init(sm.item_full(), 1);              // producer's arrive_expect_tx + the K / V bytes
    ptx::mbar_init(sm.item_empty(), 128 * Cfg::NWG);  // every consumer thread
    for (int s = 0; s < Cfg::STAGES; ++s) {
      ptx::mbar_init(sm.qd_full(s), 1);
      ptx::mbar_init(sm.qd_empty(s), 128 * Cfg::NWG);
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    if (threadIdx.x < 32) produce<Cfg>(&tm_q, &tm_k, &tm_v, &tm_do, p, sm);
  } else {
    ptx::setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    consume<Cfg>(&tm_dk, &tm_dv, p, sm, threadIdx.x / 128 - 1);
  }
#endif
}

}  // namespace sm90_attention_bwd

// ---------------------------------------------------------------------------------------------
// Host side: why_not, set-up (device workspace), the launches of one run.

namespace {
using namespace sm90_attention_bwd;

struct Kernel {
  void (*launch)(const AttentionBackwardArgs&, const Params&, int grid, cudaStream_t) = nullptr;
  void (*setup)() = nullptr;  // raises the dynamic shared-memory limit (not capturable)
  int smem = 0, ctas_per_sm = 1, ms = 64;
};

template <class Cfg>
void launch(const AttentionBackwardArgs& a, const Params& p, int grid, cudaStream_t stream) {
  const AttentionArgs& f = a.forward;
  CUtensorMap tm_q, tm_do;  // no queries at all: never read (every item then has no step)
  std::memset(&tm_q, 0, sizeof(tm_q));
  std::memset(&tm_do, 0, sizeof(tm_do));
  if (f.q.s > 0) {
    tm_q = tma_map_bhsd(f.q, Cfg::MS, "q");
    tm_do = tma_map_bhsd(a.dout, Cfg::MS, "dout");
  }
  const CUtensorMap tm_k = tma_map_bhsd(f.k, Cfg::BN, "k"), tm_v = tma_map_bhsd(f.v, Cfg::BN, "v");
  const CUtensorMap tm_dk = tma_map_bhsd(a.dk, 64, "dk"), tm_dv = tma_map_bhsd(a.dv, 64, "dv");
  attention_bwd_kernel<Cfg><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(tm_q, tm_k, tm_v, tm_do, tm_dk, tm_dv, p);
  check_cuda(cudaGetLastError(), "attention_bwd_kernel launch");
}

template <class Cfg>
void setup_kernel() {
  check_cuda(cudaFuncSetAttribute(&attention_bwd_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM),
             "cudaFuncSetAttribute(attention_bwd_kernel, max dynamic shared memory)");
}

template <int D, int BLOCK, bool BF16>
Kernel kernel_of() {
  using Cfg = Config<D, BLOCK, BF16>;
  return {&launch<Cfg>, &setup_kernel<Cfg>, Cfg::SMEM, Cfg::CTAS_PER_SM, Cfg::MS};
}
template <int BLOCK, bool BF16>
Kernel pick_d(int d) {
  return d == 64 ? kernel_of<64, BLOCK, BF16>() : kernel_of<128, BLOCK, BF16>();
}
Kernel pick(int d, int block, DType dtype) {
  const bool bf16 = dtype == DType::bf16;
  if (block == 64) return bf16 ? pick_d<64, true>(d) : pick_d<64, false>(d);
  return bf16 ? pick_d<128, true>(d) : pick_d<128, false>(d);
}

std::string same_shape(const Tensor4View& t, const Tensor4View& like, const char* name, const char* like_name) {
  if (t.b != like.b || t.h != like.h || t.s != like.s || t.d != like.d)
    return std::string(name) + " must have " + like_name + "'s shape [" + std::to_string(like.b) + ", " +
           std::to_string(like.h) + ", " + std::to_string(like.s) + ", " + std::to_string(like.d) + "], got [" +
           std::to_string(t.b) + ", " + std::to_string(t.h) + ", " + std::to_string(t.s) + ", " + std::to_string(t.d) +
           "]";
  if (t.dtype != like.dtype) return std::string(name) + " must have " + like_name + "'s dtype";
  if (t.memory != Memory::device) return std::string(name) + " must be in device memory";
  return tma_why_not_bhsd(t, name);
}

int64_t layout_width(const AttentionLayout& l) { return l.kmax + (l.has_full() ? l.full_kmax : 0); }

std::string why_not_hopper_bwd(const AttentionBackwardArgs& a) {
  static const std::vector<AttentionVariant> forward = hopper_attention_variants();
  const AttentionArgs& f = a.forward;
  if (!f.lse) return "needs the forward's lse (forward.lse is null)";
  if (f.k.h <= 0 || f.q.h % f.k.h != 0 || f.q.b != f.k.b || f.q.d != f.k.d)
    return "q [" + std::to_string(f.q.b) + ", " + std::to_string(f.q.h) + ", ., " + std::to_string(f.q.d) +
           "] and k [" + std::to_string(f.k.b) + ", " + std::to_string(f.k.h) + ", ., " + std::to_string(f.k.d) +
           "] need the same batch and D, and query heads a multiple of the key/value heads";
  for (const auto& [t, like, name, like_name] :
       {std::tuple<const Tensor4View*, const Tensor4View*, const char*, const char*>{&f.v, &f.k, "v", "k"},
        {&f.o, &f.q, "o", "q"},
        {&a.dout, &f.q, "dout", "q"},
        {&a.dq, &f.q, "dq", "q"},
        {&a.dk, &f.k, "dk", "k"},
        {&a.dv, &f.k, "dv", "k"}}) {
    const std::string w = same_shape(*t, *like, name, like_name);
    if (!w.empty()) return w;
  }
  const std::string why = forward.at(0).why_not(f);  // the forward's operands, layout and device
  if (!why.empty()) return why;
  const AttentionLayout& l = f.layout;
  const int block = l.block_q;
  const int64_t mq = (f.q.s + block - 1) / block, nkb = (f.k.s + block - 1) / block;
  if (l.q_blocks != mq)
    return "layout has " + std::to_string(l.q_blocks) + " query blocks, q needs " + std::to_string(mq);
  if (l.batch * l.heads * mq * layout_width(l) >= (int64_t(1) << 31) ||
      l.batch * l.heads * nkb >= (int64_t(1) << 31) - 1)
    return "the layout is too large for 32-bit record ids";
  if (f.k.b * f.k.h * nkb >= (int64_t(1) << 31)) return "too many (batch, head, key block) items for 32-bit ids";
  static const bool sm90a = has_sm90a_code(reinterpret_cast<const void*>(&attention_bwd_kernel<Config<128, 128, true>>));
  if (!sm90a) return kNoSm90aCode;
  const int smem = pick(int(f.q.d), block, f.q.dtype).smem;
  if (device_info().smem_per_block_optin < size_t(smem))
    return "needs " + std::to_string(smem) + " bytes of shared memory per block, the device allows " +
           std::to_string(device_info().smem_per_block_optin);
  return "";
}

// The plan's device workspace (everything a run needs; sized by the shapes and layout extents).
struct BackwardState final : VariantState {
  LayoutParams lp{};
  int items = 0, grid = 0, key_bits = 1;
  int64_t rows = 0, acc_elems = 0;
  unsigned *keys = nullptr, *keys_sorted = nullptr;
  int *slots = nullptr, *slots_sorted = nullptr, *q_indices = nullptr;
  int *col_begin = nullptr, *col_end = nullptr, *item_counter = nullptr;
  float4* rowinfo = nullptr;
  unsigned* bounds = nullptr;  // [B * Hkv][2]: max|K|, max||V||^2 (bit patterns)
  void* acc = nullptr;         // the dQ accumulator, 4 bytes per element (int32 or fp32)
  void* sort_temp = nullptr;
  size_t sort_bytes = 0, bytes = 0;
  // The transposed layout (short, latency-bound launches) runs on a side stream beside the
  // memory-bound passes: forked from the caller's stream at the start of a run, joined before the
  // main kernel (also under CUDA graph capture, where this becomes a fork and a join of the graph).
  cudaStream_t side = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;
  size_t workspace_bytes() const override { return bytes; }
  ~BackwardState() override {
    if (forked) cudaEventDestroy(forked);
    if (joined) cudaEventDestroy(joined);
    if (side) cudaStreamDestroy(side);
    // NOTE: cudaFree waits for the device, so a launch still using the workspace is safe.
    for (void* q :
         {static_cast<void*>(keys), static_cast<void*>(keys_sorted), static_cast<void*>(slots),
          static_cast<void*>(slots_sorted), static_cast<void*>(q_indices), static_cast<void*>(col_begin),
          static_cast<void*>(col_end), static_cast<void*>(item_counter), static_cast<void*>(rowinfo), static_cast<void*>(bounds),
          acc, sort_temp})
      if (q) cudaFree(q);
  }
};

template <class T>
void alloc(T*& p, int64_t n, size_t& total, const char* what) {
  const size_t bytes = std::max<size_t>(size_t(n), 1) * sizeof(T);
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&p), bytes), what);
  total += bytes;
}

std::unique_ptr<VariantState> prepare_hopper_bwd(const AttentionBackwardArgs& a, const Options&) {
  auto st = std::make_unique<BackwardState>();
  const AttentionArgs& f = a.forward;
  const AttentionLayout& l = f.layout;
  const int block = l.block_q;
  const Kernel k = pick(int(f.q.d), block, f.q.dtype);
  k.setup();
  tma_encode_tiled();  // resolves the driver entry point (not under capture)
  const int64_t mq = (f.q.s + block - 1) / block, nkb = (f.k.s + block - 1) / block;
  LayoutParams& lp = st->lp;
  lp.width = int(layout_width(l));
  lp.kmax = int(l.kmax);
  lp.full_kmax = l.has_full() ? int(l.full_kmax) : 0;
  lp.mq = int(mq);
  lp.nkb = int(nkb);
  lp.ncols = int(l.batch * l.heads * nkb);
  lp.slots = l.batch * l.heads * mq * lp.width;
  while ((int64_t(1) << st->key_bits) <= lp.ncols) ++st->key_bits;
  st->items = int(f.k.b * f.k.h * nkb);
  st->grid = std::max(1, std::min(st->items, device_info().sm_count * k.ctas_per_sm));
  st->rows = f.q.b * f.q.h * mq * block;
  st->acc_elems = st->rows * f.q.d;
  size_t& total = st->bytes;
  alloc(st->keys, lp.slots, total, "cudaMalloc(attention backward sort keys)");
  alloc(st->keys_sorted, lp.slots, total, "cudaMalloc(attention backward sort keys)");
  alloc(st->slots, lp.slots, total, "cudaMalloc(attention backward sort values)");
  alloc(st->slots_sorted, lp.slots, total, "cudaMalloc(attention backward sort values)");
  alloc(st->q_indices, lp.slots, total, "cudaMalloc(attention backward q_indices)");
  alloc(st->col_begin, lp.ncols, total, "cudaMalloc(attention backward columns)");
  alloc(st->col_end, lp.ncols, total, "cudaMalloc(attention backward columns)");
  alloc(st->item_counter, 1, total, "cudaMalloc(attention backward item counter)");
  alloc(st->rowinfo, st->rows, total, "cudaMalloc(attention backward row statistics)");
  alloc(st->bounds, 2 * f.k.b * f.k.h, total, "cudaMalloc(attention backward K/V bounds)");
  check_cuda(cudaStreamCreateWithFlags(&st->side, cudaStreamNonBlocking), "cudaStreamCreate(attention backward layout)");
  check_cuda(cudaEventCreateWithFlags(&st->forked, cudaEventDisableTiming), "cudaEventCreate(attention backward)");
  check_cuda(cudaEventCreateWithFlags(&st->joined, cudaEventDisableTiming), "cudaEventCreate(attention backward)");
  int* acc = nullptr;
  alloc(acc, st->acc_elems, total, "cudaMalloc(attention backward dQ accumulator)");
  st->acc = acc;
  if (lp.slots > 0) {
    check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, st->sort_bytes, st->keys, st->keys_sorted, st->slots,
                                               st->slots_sorted, int(lp.slots), 0, st->key_bits),
               "cub::DeviceRadixSort (size query)");
    check_cuda(cudaMalloc(&st->sort_temp, std::max<size_t>(st->sort_bytes, 16)), "cudaMalloc(attention backward sort)");
    total += std::max<size_t>(st->sort_bytes, 16);
  }
  return st;
}

int blocks_for(int64_t n, int threads) {
  return int(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 4096)));
}

void run_hopper_bwd(const AttentionBackwardArgs& a, const Options& o, VariantState* state) {
  auto* st = dynamic_cast<BackwardState*>(state);
  const AttentionArgs& f = a.forward;
  const AttentionLayout& l = f.layout;
  const int block = l.block_q;
  if (!st || st->items != int(f.k.b * f.k.h * ((f.k.s + block - 1) / block)) ||
      st->rows != f.q.b * f.q.h * ((f.q.s + block - 1) / block) * block || st->lp.width != int(layout_width(l)))
    throw Error(Status::internal, "attention backward hopper: run() got a state prepared for another shape");
  const cudaStream_t stream = static_cast<cudaStream_t>(o.stream);
  const bool bf16 = f.q.dtype == DType::bf16;
  const int64_t mq = (f.q.s + block - 1) / block;
  check_cuda(cudaEventRecord(st->forked, stream), "cudaEventRecord(attention backward fork)");
  check_cuda(cudaStreamWaitEvent(st->side, st->forked, 0), "cudaStreamWaitEvent(attention backward fork)");

  // 1. The heads' K/V bounds (deterministic dQ), row statistics, and a zero dQ accumulator.
  if (st->rows > 0 && a.deterministic) {
    check_cuda(cudaMemsetAsync(st->bounds, 0, size_t(2 * f.k.b * f.k.h) * sizeof(unsigned), stream),
               "cudaMemsetAsync(K/V bounds)");
    KvParams kp{};
    kp.k = f.k.data;
    kp.v = f.v.data;
    kp.bounds = st->bounds;
    kp.k_sb = f.k.stride_b, kp.k_sh = f.k.stride_h, kp.k_ss = f.k.stride_s;
    kp.v_sb = f.v.stride_b, kp.v_sh = f.v.stride_h, kp.v_ss = f.v.stride_s;
    kp.hkv = int(f.k.h);
    kp.skv = int(f.k.s);
    // About 8 blocks (2048 threads) per SM over all heads.
    const int64_t heads = f.k.b * f.k.h;
    const int64_t by = std::max<int64_t>(
        1, std::min<int64_t>({(f.k.s + 127) / 128, (8 * device_info().sm_count + heads - 1) / heads, 65535}));
    if (heads > 0 && f.k.s > 0) {
      const auto kernel = bf16 ? (f.k.d == 64 ? bwd_kv_bounds<true, 64> : bwd_kv_bounds<true, 128>)
                               : (f.k.d == 64 ? bwd_kv_bounds<false, 64> : bwd_kv_bounds<false, 128>);
      kernel<<<dim3(unsigned(heads), unsigned(by)), 256, 0, stream>>>(kp);
      check_cuda(cudaGetLastError(), "bwd_kv_bounds launch");
    }
  }
  if (st->rows > 0) {
    RowParams rp{};
    rp.o = f.o.data;
    rp.dout = a.dout.data;
    rp.lse = f.lse;
    rp.bounds = st->bounds;
    rp.det = a.deterministic;
    rp.group = int(f.q.h / f.k.h);
    rp.rowinfo = st->rowinfo;
    rp.o_sb = f.o.stride_b, rp.o_sh = f.o.stride_h, rp.o_ss = f.o.stride_s;
    rp.do_sb = a.dout.stride_b, rp.do_sh = a.dout.stride_h, rp.do_ss = a.dout.stride_s;
    rp.hq = int(f.q.h);
    rp.sq = int(f.q.s);
    rp.sq_pad = int(mq * block);
    const auto kernel = bf16 ? (f.q.d == 64 ? bwd_preprocess<true, 64> : bwd_preprocess<true, 128>)
                             : (f.q.d == 64 ? bwd_preprocess<false, 64> : bwd_preprocess<false, 128>);
    kernel<<<dim3(unsigned(f.q.b * f.q.h), unsigned(std::min<int64_t>(mq * block / 64, 65535))), 256, 0, stream>>>(rp);
    check_cuda(cudaGetLastError(), "bwd_preprocess launch");
    check_cuda(cudaMemsetAsync(st->acc, 0, size_t(st->acc_elems) * 4, stream),
               "cudaMemsetAsync(dQ accumulator)");
  }

  // 2. The transposed layout (and the item counter's reset): many short launches on the side
  //    stream, enqueued while the GPU runs the memory-bound passes above (their host time hidden),
  //    and run beside them.
  LayoutParams lp = st->lp;
  lp.kv_num = l.kv_num_blocks;
  lp.kv_idx = l.kv_indices;
  lp.full_num = l.has_full() ? l.full_kv_num_blocks : nullptr;
  lp.full_idx = l.has_full() ? l.full_kv_indices : nullptr;
  bwd_layout_keys<<<blocks_for(std::max<int64_t>(lp.slots, lp.ncols), 256), 256, 0, st->side>>>(
      lp, st->keys, st->slots, st->col_begin, st->col_end, st->item_counter);
  check_cuda(cudaGetLastError(), "bwd_layout_keys launch");
  if (lp.slots > 0) {
    size_t bytes = st->sort_bytes;
    check_cuda(cub::DeviceRadixSort::SortPairs(st->sort_temp, bytes, st->keys, st->keys_sorted, st->slots,
                                               st->slots_sorted, int(lp.slots), 0, st->key_bits, st->side),
               "cub::DeviceRadixSort (transposed layout)");
    bwd_layout_columns<<<blocks_for(lp.slots, 256), 256, 0, st->side>>>(lp, st->keys_sorted, st->slots_sorted,
                                                                      st->q_indices, st->col_begin, st->col_end);
    check_cuda(cudaGetLastError(), "bwd_layout_columns launch");
  }
  check_cuda(cudaEventRecord(st->joined, st->side), "cudaEventRecord(attention backward join)");
  check_cuda(cudaStreamWaitEvent(stream, st->joined, 0), "cudaStreamWaitEvent(attention backward join)");

  // 3. The main kernel.
  Params p{};
  p.items = st->items;
  p.hq = int(f.q.h);
  p.hkv = int(f.k.h);
  p.group = int(f.q.h / f.k.h);
  p.nkb = lp.nkb;
  p.skv = int(f.k.s);
  p.sq_pad = int(mq * block);
  p.r64 = p.sq_pad / 64;
  p.lb = int(l.batch);
  p.lh = int(l.heads);
  p.lh_is_kv = l.heads == f.k.h && l.heads != f.q.h;
  p.col_begin = st->col_begin;
  p.col_end = st->col_end;
  p.q_indices = st->q_indices;
  p.item_counter = st->item_counter;
  p.rowinfo = st->rowinfo;
  p.dq_acc = st->acc;
  p.det = a.deterministic;
  p.causal = f.causal;
  p.scale = f.softmax_scale();
  p.scale_log2 = p.scale * 1.4426950408889634f;
  if (st->items > 0) pick(int(f.q.d), block, f.q.dtype).launch(a, p, st->grid, stream);

  // 4. dq = accumulator * its grid unit * scale.
  if (st->rows > 0 && f.q.s > 0) {
    DqParams dp{};
    dp.acc = st->acc;
    dp.rowinfo = st->rowinfo;
    dp.dq = a.dq.data;
    dp.sb = a.dq.stride_b, dp.sh = a.dq.stride_h, dp.ss = a.dq.stride_s;
    dp.hq = int(f.q.h);
    dp.sq = int(f.q.s);
    dp.sq_pad = p.sq_pad;
    dp.r64 = p.r64;
    dp.tn = int(f.q.d / 64);
    dp.det = a.deterministic;
    dp.scale = p.scale;
    const int64_t tiles = f.q.b * f.q.h * p.r64 * dp.tn;
    (bf16 ? bwd_postprocess<true> : bwd_postprocess<false>)<<<unsigned(tiles), 128, 0, stream>>>(dp);
    check_cuda(cudaGetLastError(), "bwd_postprocess launch");
  }
}

}  // namespace

std::vector<AttentionBackwardVariant> hopper_attention_backward_variants() {
  return {AttentionBackwardVariant{"hopper", Backend::cuda, false, &why_not_hopper_bwd, &prepare_hopper_bwd,
                                   &run_hopper_bwd}};
}

}  // namespace sparsek
