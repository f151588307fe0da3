// Hopper (sm_90a) block-sparse attention forward: O = softmax(scale * Q K^T on the layout's blocks) V
// and LSE, for q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D] (D = 64 or 128, f16 / bf16), the
// FlexAttention-style layout of include/sparsek/attention.hpp. docs/KERNELS.md "Hopper attention
// forward" holds the ladder and the numbers.
//
// Shape of the computation (FlashAttention-3's, over an index list):
//  - A work item is (batch, query head, query block of BM rows). Items are ordered longest first
//    (a device-side sort of the layout's row lengths, every run: the layout may change every call)
//    and a persistent grid walks them with a fixed stride.
//  - Warpgroup 0 is the producer: one thread TMA-loads the item's Q tile, then for every block the
//    item attends (the partial list, then the full list, read 32 indices at a time by the warp) its
//    K and V tiles into two rings of shared-memory stages, each stage with a small info word (block
//    index, which element masks apply) that the consumers read after the stage's barrier.
//  - Consumer warpgroups (BM / 64 of them, 64 query rows each) run, per key block t,
//        S = Q K_t^T (wgmma, both from shared memory) -> masks -> online softmax in registers ->
//        O += P V_t (wgmma, P straight from the registers as the A operand).
//    The loop is rotated so that one wgmma batch holds P_t V_t and Q K_{t+1}^T; with two consumer
//    warpgroups the batches take turns (named barriers): one warpgroup's softmax runs under the
//    other's tensor-core work (FlashAttention-3's ping-pong). K is released after its QK^T, V after
//    its PV, so loads run two batches ahead.
//  - Epilogue: O / rowsum -> 128B-swizzled shared tile -> one TMA store per warpgroup (rows past Sq
//    are clipped by the tensor map); LSE straight from the registers.
//  - Elements: keys >= Skv masked in the last block; with causal, keys after the query masked in the
//    blocks of kv_indices that reach past the diagonal; full blocks unmasked. Rows with nothing
//    attended give O = 0 and LSE = -inf. Indices outside [0, ceil(Skv / BN)) are treated as a
//    fully masked block (never read out of bounds: the TMA fills zeros), counts are clamped to
//    [0, kmax]: a malformed layout cannot crash or hang the kernel.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device.hpp"
#include "kernels/dtype.cuh"
#include "kernels/sm90/kit/ring.cuh"
#include "kernels/sm90/kit/tile_mma.cuh"
#include "kernels/sm90/kit/tma.hpp"
#include "kernels/ptx/async.cuh"
#include "kernels/ptx/wgmma.cuh"
#include "plan/backends.hpp"

namespace sparsek {
namespace sm90_attention {

// ---------------------------------------------------------------------------------------------
// Compile-time configuration: one per (D, block, dtype).

constexpr int kSmemLimit = 227 * 1024;

template <int D_, int BLOCK_, bool BF16_>
struct Config {
  static constexpr int D = D_;
  static constexpr int BM = BLOCK_;       // query rows of an item (= block_q)
  static constexpr int BN = BLOCK_;       // keys of a key block (= block_kv)
  static constexpr bool BF16 = BF16_;
  static constexpr int NWG = BM / 64;     // consumer warpgroups, 64 query rows each
  static constexpr int THREADS = 128 * (NWG + 1);
  static constexpr int CTAS_PER_SM = NWG == 2 ? 1 : 2;
  static constexpr int CHUNKS = D / 64;   // 64-element (128-byte) swizzle rows across D
  static constexpr int Q_BYTES = BM * D * 2;         // [CHUNKS][BM rows][64]
  static constexpr int KV_BYTES = BN * D * 2;        // [CHUNKS][BN rows][64], K and V alike
  static constexpr int O_BYTES = 64 * D * 2;         // per consumer: [CHUNKS][64 rows][64]
  static constexpr int FIXED = Q_BYTES + NWG * O_BYTES + 1024 /* barriers, infos */ + 1024 /* align */;
  static constexpr int BUDGET = kSmemLimit / CTAS_PER_SM - 1024;  // 1 KB per CTA is the driver's
  static constexpr int STAGES = std::min(4, (BUDGET - FIXED) / (2 * KV_BYTES));
  static constexpr int SMEM = FIXED + STAGES * 2 * KV_BYTES;
  static constexpr int S_REGS = BN / 2;   // fp32 scores per thread (m64 x BN accumulator)
  static constexpr int O_REGS = D / 2;    // fp32 output per thread (m64 x D accumulator)
  // Register budgets after setmaxnreg (whole warpgroups): the producer needs few.
  static constexpr int PRODUCER_REGS = 40;
  static constexpr int CONSUMER_REGS = NWG == 2 ? 232 : 216;

  static_assert(D == 64 || D == 128, "D must be 64 or 128");
  static_assert(BM == 64 || BM == 128, "blocks are 64x64 or 128x128");
  static_assert(Q_BYTES % 1024 == 0 && KV_BYTES % 1024 == 0 && O_BYTES % 1024 == 0,
                "swizzled tiles must start 1024-byte aligned (descriptor base offset 0)");
  static_assert(STAGES >= 2, "K and V need two stages each to load ahead of the math");
  static_assert(SMEM <= BUDGET, "shared memory per CTA exceeds the budget");
  // A CTA holds THREADS x (its launch-bound register count) registers, never more: the budgets
  // must add up within that (168 x 384 = 64512 for two consumers; 128 x 256 for one).
  static constexpr int CTA_REGS = (65536 / CTAS_PER_SM / THREADS) / 8 * 8 * THREADS;
  static_assert(128 * PRODUCER_REGS + 128 * NWG * CONSUMER_REGS <= CTA_REGS,
                "setmaxnreg budgets exceed the CTA's registers");
};

// Element masks a key block needs (the stage info's flags).
enum : int { kMaskCausal = 1, kMaskTail = 2, kMaskAll = 4 };

struct Params {
  const int* order;         // [items]: item ids, longest first
  int items;
  int hq, hkv, group;       // query heads, key/value heads, hq / hkv
  int mq;                   // query blocks per head
  int sq, skv, nkb;         // sequence lengths; key blocks = ceil(skv / BN)
  // layout: rows [lb][lh][mq]; head index of a row: 0 (lh == 1), the query head, or the kv head
  const int* kv_num;
  const int* kv_idx;
  const int* full_num;      // null when there are no full blocks
  const int* full_idx;
  int lb, lh, lh_is_kv;
  int kmax, full_kmax;
  int causal;
  float scale_log2;         // scale * log2(e)
  float* lse;               // [B, Hq, Sq] or null
};

// item id = ((b * Hkv + kv head) * Mq + query block) * group + head within the group: the query
// heads that share a key/value head are neighbours, so equal-length items that run together read
// the same K and V (from L2).
struct Item {
  int b, hq, hkv, qb;
};
__host__ __device__ __forceinline__ Item decode(int id, const Params& p) {
  Item it;
  const int g = id % p.group;
  id /= p.group;
  it.qb = id % p.mq;
  id /= p.mq;
  it.hkv = id % p.hkv;
  it.b = id / p.hkv;
  it.hq = it.hkv * p.group + g;
  return it;
}
__host__ __device__ __forceinline__ int64_t layout_row(const Item& it, const Params& p) {
  const int lb = p.lb == 1 ? 0 : it.b;
  const int lh = p.lh == 1 ? 0 : p.lh_is_kv ? it.hkv : it.hq;
  return (int64_t(lb) * p.lh + lh) * p.mq + it.qb;
}

// Blocks of an item, each count clamped to [0, kmax].
__device__ __forceinline__ void item_counts(const Item& it, const Params& p, int64_t& row, int& np, int& nf) {
  row = layout_row(it, p);
  np = p.nkb > 0 ? min(max(p.kv_num[row], 0), p.kmax) : 0;
  nf = p.nkb > 0 && p.full_num ? min(max(p.full_num[row], 0), p.full_kmax) : 0;
}

// Sort keys: every item's block count (the sort orders items longest first).
__global__ void attention_item_lengths(const Params p, unsigned* lengths) {
  for (int id = blockIdx.x * blockDim.x + threadIdx.x; id < p.items; id += gridDim.x * blockDim.x) {
    int64_t row;
    int np, nf;
    item_counts(decode(id, p), p, row, np, nf);
    lengths[id] = unsigned(np + nf);
  }
}

// ---------------------------------------------------------------------------------------------
// Device code (sm_90a only; the sm_80 pass compiles an empty kernel).

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

using dev::kWaitLimit;

// Shared-memory addresses of one CTA (shared-window, 32-bit).
template <class Cfg>
struct Smem {
  uint32_t q, o, k, v;              // tiles
  uint32_t q_full, q_empty;         // barriers
  uint32_t k_full, k_empty, v_full, v_empty;  // [STAGES] each, 8 bytes apart
  uint32_t q_info, k_info;          // int2: {item id, blocks}; int2 per K stage: {block, flags}
  __device__ Smem(uint32_t base) {
    q = base;
    o = q + Cfg::Q_BYTES;
    k = o + Cfg::NWG * Cfg::O_BYTES;
    v = k + Cfg::STAGES * Cfg::KV_BYTES;
    q_full = v + Cfg::STAGES * Cfg::KV_BYTES;
    q_empty = q_full + 8;
    k_full = q_empty + 8;
    k_empty = k_full + 8 * Cfg::STAGES;
    v_full = k_empty + 8 * Cfg::STAGES;
    v_empty = v_full + 8 * Cfg::STAGES;
    q_info = v_empty + 8 * Cfg::STAGES;
    k_info = q_info + 8;
  }
};


// Producer: one warp. Lane 0 issues every load; the warp reads the block indices 32 at a time.
template <class Cfg>
__device__ __forceinline__ void produce(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                        const Params& p, const Smem<Cfg>& sm) {
  const int lane = threadIdx.x % 32;
  dev::Ring<Cfg::STAGES> kr, vr;
  uint32_t q_phase = 0;
  for (int i = blockIdx.x; i < p.items; i += gridDim.x) {
    const int id = p.order[i];
    const Item it = decode(id, p);
    int64_t row;
    int np, nf;
    item_counts(it, p, row, np, nf);
    const int total = np + nf;
    if (lane == 0) {
      ptx::mbar_wait_or_trap(sm.q_empty, q_phase ^ 1, kWaitLimit);
      ptx::st_shared_v2(sm.q_info, id, total);
      ptx::mbar_arrive_expect_tx(sm.q_full, total > 0 ? Cfg::Q_BYTES : 0);
      // q: (64 of D, rows, D chunks, heads, batch), box (64, BM, CHUNKS, 1, 1)
      if (total > 0) ptx::tma_load_5d(sm.q, tm_q, sm.q_full, 0, it.qb * Cfg::BM, 0, it.hq, it.b);
    }
    q_phase ^= 1;
    const int q_first = it.qb * Cfg::BM;
    for (int t0 = 0; t0 < total; t0 += 32) {
      // This lane's entry t0 + lane: its block and the masks it needs.
      const int e = t0 + lane;
      int blk = -1, flags = 0;
      if (e < np)
        blk = p.kv_idx[row * p.kmax + e];
      else if (e < total)
        blk = p.full_idx[row * p.full_kmax + (e - np)];
      if (blk < 0 || blk >= p.nkb) {
        blk = -1;  // outside the keys: loaded as zeros, fully masked
        flags = kMaskAll;
      } else {
        if ((blk + 1) * Cfg::BN > p.skv) flags |= kMaskTail;
        if (e < np && p.causal && blk * Cfg::BN + Cfg::BN - 1 > q_first) flags |= kMaskCausal;
      }
      const int count = min(32, total - t0);
      for (int t = 0; t < count; ++t) {
        const int b_t = __shfl_sync(0xffffffffu, blk, t), f_t = __shfl_sync(0xffffffffu, flags, t);
        if (lane == 0) {
          ptx::mbar_wait_or_trap(sm.k_empty + 8 * kr.stage, kr.phase ^ 1, kWaitLimit);
          ptx::st_shared_v2(sm.k_info + 8 * kr.stage, b_t, f_t);
          ptx::mbar_arrive_expect_tx(sm.k_full + 8 * kr.stage, Cfg::KV_BYTES);
          // k, v: (64 of D, keys, D chunks, kv heads, batch), box (64, BN, CHUNKS, 1, 1)
          ptx::tma_load_5d(sm.k + kr.stage * Cfg::KV_BYTES, tm_k, sm.k_full + 8 * kr.stage, 0, b_t * Cfg::BN, 0, it.hkv,
                           it.b);
          kr.advance();
          ptx::mbar_wait_or_trap(sm.v_empty + 8 * vr.stage, vr.phase ^ 1, kWaitLimit);
          ptx::mbar_arrive_expect_tx(sm.v_full + 8 * vr.stage, Cfg::KV_BYTES);
          ptx::tma_load_5d(sm.v + vr.stage * Cfg::KV_BYTES, tm_v, sm.v_full + 8 * vr.stage, 0, b_t * Cfg::BN, 0, it.hkv,
                           it.b);
          vr.advance();
        }
        __syncwarp();
      }
    }
  }
}

// One consumer warpgroup's state for an item: 64 query rows x D of output, and the running max
// and (per-thread partial) sum of its two rows (fragment rows g and g + 8 of its warp).
template <class Cfg>
struct RowState {
  float o[Cfg::O_REGS];
  float m[2], l[2];
};

// Masks, online softmax update and P as wgmma A fragments. first: no earlier block (O untouched).
// NOTE: runs while no wgmma of this warpgroup is in flight (the other warpgroup's are), so S and O
// may be written in place. An overlap of this softmax with the warpgroup's own PV (two P register
// sets) measured 2.4x slower: docs/KERNELS.md.
template <class Cfg>
__device__ __forceinline__ void softmax(float (&s)[Cfg::S_REGS], RowState<Cfg>& st, uint32_t (&pa)[Cfg::BN / 16][4],
                                        int2 info, int row0, const Params& p, bool first) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const int flags = info.y;
  if (flags) {  // uniform for the warpgroup; most blocks need no element mask
    const int col0 = info.x * Cfg::BN + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = row0 + 16 * warp + lane / 4 + 8 * h;
#pragma unroll
      for (int j = 0; j < Cfg::BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + 8 * j + e;
          const bool masked = (flags & kMaskAll) || ((flags & kMaskTail) && col >= p.skv) ||
                              ((flags & kMaskCausal) && col > q);
          if (masked) s[4 * j + 2 * h + e] = -INFINITY;
        }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // Four independent chains: the max and the sum are latency-bound otherwise.
    float m4[4] = {st.m[h], -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < Cfg::BN / 8; ++j) m4[j % 4] = fmaxf(m4[j % 4], fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    float mx = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // NOTE: a row that has seen only masked keys keeps max -inf; exponents then use 0 so that
    // exp2(-inf - -inf) never makes a NaN.
    const float ms = mx == -INFINITY ? 0.f : mx * p.scale_log2;
    if (!first) {
      const float corr = st.m[h] == -INFINITY ? 0.f : ptx::exp2_approx(st.m[h] * p.scale_log2 - ms);
      st.l[h] *= corr;
#pragma unroll
      for (int j = 0; j < Cfg::D / 8; ++j) {
        st.o[4 * j + 2 * h] *= corr;
        st.o[4 * j + 2 * h + 1] *= corr;
      }
    }
    st.m[h] = mx;
    float s4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < Cfg::BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = ptx::exp2_approx(fmaf(s[4 * j + 2 * h + e], p.scale_log2, -ms));
        s[4 * j + 2 * h + e] = v;
        s4[j % 4] += v;
      }
    st.l[h] += (s4[0] + s4[1]) + (s4[2] + s4[3]);
  }
  // Accumulator pair (j, h) is A register 2 * (j % 2) + h of k16 step j / 2 (wgmma.cuh).
#pragma unroll
  for (int kk = 0; kk < Cfg::BN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[kk][r] = dev::pack2<Cfg::BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

// O / rowsum into this warpgroup's swizzled staging tile, one TMA store; LSE from the registers.
template <class Cfg>
__device__ __forceinline__ void epilogue(RowState<Cfg>& st, const CUtensorMap* tm_o, const Params& p, const Item& it,
                                         int row0, int wg, uint32_t s_o, uint8_t* o_ptr) {
  const int tid = threadIdx.x % 128, lane = tid % 32, warp = tid / 32;
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[h] = l > 0.f ? 1.f / l : 0.f;
    const int q = row0 + 16 * warp + lane / 4 + 8 * h;
    if (p.lse && lane % 4 == 0 && q < p.sq)
      p.lse[(int64_t(it.b) * p.hq + it.hq) * p.sq + q] =
          l > 0.f ? (st.m[h] * p.scale_log2 + __log2f(l)) * 0.69314718055994531f : -INFINITY;
  }
  // The staging tile's last TMA store must have read it before it is overwritten.
  if (tid == 0) ptx::bulk_wait_group_read<0>();
  ptx::named_barrier_sync(3 + wg, 128);
  // Row r of the tile (0..63), column c: chunk c / 64, byte (c % 64) * 2 in a 128-byte row whose
  // 16-byte granules are XOR-swizzled by r % 8 (TMA 128B). A pair (c, c + 1) is one 4-byte store.
#pragma unroll
  for (int j = 0; j < Cfg::D / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * warp + lane / 4 + 8 * h;
      const uint32_t off = (j / 8) * (64 * 128) + r * 128 + (((j % 8) ^ (r % 8)) << 4) + 4 * (lane % 4);
      *reinterpret_cast<uint32_t*>(o_ptr + off) =
          dev::pack2<Cfg::BF16>(st.o[4 * j + 2 * h] * inv[h], st.o[4 * j + 2 * h + 1] * inv[h]);
    }
  ptx::fence_proxy_async_smem();  // the st.shared above are read by the TMA (async proxy)
  ptx::named_barrier_sync(3 + wg, 128);
  if (tid == 0) {
    // o: (64 of D, rows, D chunks, heads, batch), box (64, 64, CHUNKS, 1, 1)
    ptx::tma_store_5d(tm_o, s_o, 0, row0, 0, it.hq, it.b);
    ptx::bulk_commit_group();
  }
}

// Consumer warpgroup wg (0 .. NWG-1): query rows wg*64 .. wg*64+63 of every item.
// Named barriers: 1 + w = "warpgroup w may issue its next wgmma batch" (two consumers only);
// 3 + w = warpgroup w's epilogue.
// NOTE: the consumers wait without the trap of mbar_wait_or_trap: ptxas (13.0) then shares the trap
// block between the warpgroup branches and compiles the consumers within the kernel's entry budget
// of 168 registers instead of their setmaxnreg budget (232 bytes of spills at D = 128). A lost
// arrival that stalls the producer (the usual case: the ring fills) still traps there.
template <class Cfg>
__device__ __forceinline__ void consume(const CUtensorMap* tm_o, const Params& p, const Smem<Cfg>& sm, int wg,
                                        uint8_t* o_ptr) {
  const int lane = threadIdx.x % 32;
  constexpr bool PINGPONG = Cfg::NWG == 2;
  auto my_turn = [&] {
    if constexpr (PINGPONG) ptx::named_barrier_sync(1 + wg, 256);
  };
  auto pass_turn = [&] {
    if constexpr (PINGPONG) ptx::named_barrier_arrive(2 - wg, 256);
  };
  // Warpgroup 0 goes first; the matching extra wait is at the end.
  if (PINGPONG && wg == 1) ptx::named_barrier_arrive(1, 256);
  dev::Ring<Cfg::STAGES> kr, vr;
  uint32_t q_phase = 0;
  const uint32_t q_rows = sm.q + wg * 64 * 128;  // this warpgroup's rows in each Q chunk
  const uint32_t s_o = sm.o + wg * Cfg::O_BYTES;
  RowState<Cfg> st;
  float s[Cfg::S_REGS];
  uint32_t pa[Cfg::BN / 16][4];
  for (int i = blockIdx.x; i < p.items; i += gridDim.x) {
    ptx::mbar_wait(sm.q_full, q_phase);
    q_phase ^= 1;
    // Every thread reads the info words and arrives on q_empty and k_empty itself: an arrival by
    // lane 0 alone would order the other lanes' reads before the producer's next write only through
    // the warp's convergence (a racecheck hazard; a __syncwarp() there is compiled away).
    const int2 qi = ptx::ld_shared_v2(sm.q_info);
    const Item it = decode(qi.x, p);
    const int total = qi.y;
    const int row0 = it.qb * Cfg::BM + wg * 64;
#pragma unroll
    for (int r = 0; r < Cfg::O_REGS; ++r) st.o[r] = 0.f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
    if (total == 0) {
      ptx::mbar_arrive(sm.q_empty);
      epilogue<Cfg>(st, tm_o, p, it, row0, wg, s_o, o_ptr);
      continue;
    }
    // Batch 0: S = Q K_0^T.
    my_turn();
    ptx::mbar_wait(sm.k_full + 8 * kr.stage, kr.phase);
    int2 info = ptx::ld_shared_v2(sm.k_info + 8 * kr.stage);
    ptx::wgmma_fence();
    // S = Q K^T: this warpgroup's Q rows (chunks BM rows apart) against the K tile (keys x D).
    dev::mma_rows_rows<Cfg::D, Cfg::BN, Cfg::BF16>(s, q_rows, Cfg::BM * 128, sm.k + kr.stage * Cfg::KV_BYTES,
                                                   Cfg::BN * 128);
    ptx::wgmma_commit();
    pass_turn();
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < Cfg::S_REGS; ++r) ptx::fence_operand(s[r]);
    ptx::mbar_arrive(sm.k_empty + 8 * kr.stage);
    kr.advance();
    if (total == 1) ptx::mbar_arrive(sm.q_empty);
    softmax<Cfg>(s, st, pa, info, row0, p, true);
    // Batch t + 1: O += P_t V_t, and S = Q K_{t+1}^T (NEXT: t + 1 < total; the last batch is PV
    // alone). NEXT is a compile-time argument and the last batch its own copy: a wgmma under a
    // run-time `if` inside the batch made ptxas inject a warpgroup arrive and a dummy wgmma into
    // every batch (C7519).
    auto batch = [&](auto next_c, int t) {
      constexpr bool NEXT = decltype(next_c)::value;
      my_turn();
      ptx::mbar_wait(sm.v_full + 8 * vr.stage, vr.phase);
      if constexpr (NEXT) {
        ptx::mbar_wait(sm.k_full + 8 * kr.stage, kr.phase);
        info = ptx::ld_shared_v2(sm.k_info + 8 * kr.stage);
      }
#pragma unroll
      for (int r = 0; r < Cfg::O_REGS; ++r) ptx::fence_operand(st.o[r]);
      ptx::wgmma_fence();
      dev::mma_regs_rows<Cfg::BN, Cfg::D, Cfg::BF16>(st.o, pa, sm.v + vr.stage * Cfg::KV_BYTES, Cfg::BN * 128);
      if constexpr (NEXT)
        dev::mma_rows_rows<Cfg::D, Cfg::BN, Cfg::BF16>(s, q_rows, Cfg::BM * 128, sm.k + kr.stage * Cfg::KV_BYTES,
                                                       Cfg::BN * 128);
      ptx::wgmma_commit();
      pass_turn();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int r = 0; r < Cfg::O_REGS; ++r) ptx::fence_operand(st.o[r]);
      if constexpr (NEXT) {
#pragma unroll
        for (int r = 0; r < Cfg::S_REGS; ++r) ptx::fence_operand(s[r]);
      }
      if (lane == 0) ptx::mbar_arrive(sm.v_empty + 8 * vr.stage);
      vr.advance();
      if constexpr (NEXT) {
        ptx::mbar_arrive(sm.k_empty + 8 * kr.stage);
        if (t + 2 == total) ptx::mbar_arrive(sm.q_empty);  // the item's last QK^T is done
        kr.advance();
        softmax<Cfg>(s, st, pa, info, row0, p, false);
      }
    };
    for (int t = 0; t + 1 < total; ++t) batch(std::true_type{}, t);
    batch(std::false_type{}, total - 1);
    epilogue<Cfg>(st, tm_o, p, it, row0, wg, s_o, o_ptr);
  }
  if (PINGPONG && wg == 0) my_turn();  // warpgroup 1's last hand-over
  // The last TMA store must finish before the CTA (and its shared memory) goes away.
  if (threadIdx.x % 128 == 0) ptx::bulk_wait_group<0>();
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::CTAS_PER_SM)
    attention_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                         const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const Smem<Cfg> sm((raw + 1023u) & ~1023u);
  if (threadIdx.x == 0) {
    ptx::mbar_init(sm.q_full, 1);                 // producer's arrive_expect_tx + the Q bytes
    ptx::mbar_init(sm.q_empty, 128 * Cfg::NWG);   // every consumer thread (see consume())
    for (int s = 0; s < Cfg::STAGES; ++s) {
      ptx::mbar_init(sm.k_full + 8 * s, 1);
      ptx::mbar_init(sm.k_empty + 8 * s, 128 * Cfg::NWG);  // as q_empty
      ptx::mbar_init(sm.v_full + 8 * s, 1);
      ptx::mbar_init(sm.v_empty + 8 * s, 4 * Cfg::NWG);
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    if (threadIdx.x < 32) produce<Cfg>(&tm_q, &tm_k, &tm_v, p, sm);
  } else {
    ptx::setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    const int wg = threadIdx.x / 128 - 1;
    const uint32_t s_o = sm.o + wg * Cfg::O_BYTES;
    consume<Cfg>(&tm_o, p, sm, wg, smem_raw + (s_o - raw));
  }
#endif
}

}  // namespace sm90_attention

// ---------------------------------------------------------------------------------------------
// Host side: why_not, set-up (workspace for the item order), launch.

namespace {
using namespace sm90_attention;

struct Kernel {
  void (*launch)(const AttentionArgs&, const Params&, int grid, cudaStream_t) = nullptr;
  void (*setup)() = nullptr;  // raises the dynamic shared-memory limit (not capturable)
  int smem = 0, ctas_per_sm = 1, block = 128;
};

template <class Cfg>
void launch(const AttentionArgs& a, const Params& p, int grid, cudaStream_t stream) {
  CUtensorMap tm_q = tma_map_bhsd(a.q, Cfg::BM, "q"), tm_o = tma_map_bhsd(a.o, 64, "o");
  CUtensorMap tm_k, tm_v;  // no keys at all: never read (every item then has no block)
  std::memset(&tm_k, 0, sizeof(tm_k));
  std::memset(&tm_v, 0, sizeof(tm_v));
  if (a.k.s > 0) {
    tm_k = tma_map_bhsd(a.k, Cfg::BN, "k");
    tm_v = tma_map_bhsd(a.v, Cfg::BN, "v");
  }
  attention_fwd_kernel<Cfg><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(tm_q, tm_k, tm_v, tm_o, p);
  check_cuda(cudaGetLastError(), "attention_fwd_kernel launch");
}

template <class Cfg>
void setup_kernel() {
  check_cuda(cudaFuncSetAttribute(&attention_fwd_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM),
             "cudaFuncSetAttribute(attention_fwd_kernel, max dynamic shared memory)");
}

template <int D, int BLOCK, bool BF16>
Kernel kernel_of() {
  using Cfg = Config<D, BLOCK, BF16>;
  return {&launch<Cfg>, &setup_kernel<Cfg>, Cfg::SMEM, Cfg::CTAS_PER_SM, BLOCK};
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

std::string why_not_hopper(const AttentionArgs& a) {
  if (a.q.memory != Memory::device || a.layout.memory != Memory::device)
    return "operands and layout must be in device memory";
  if (a.q.dtype != DType::f16 && a.q.dtype != DType::bf16)
    return std::string("needs f16 or bf16 inputs, got ") + to_string(a.q.dtype);
  if (a.q.d != 64 && a.q.d != 128) return "D=" + std::to_string(a.q.d) + " not in {64, 128}";
  const int block = a.layout.block_q;
  if ((block != 64 && block != 128) || a.layout.block_kv != block)
    return "blocks must be 64x64 or 128x128, got " + std::to_string(a.layout.block_q) + "x" +
           std::to_string(a.layout.block_kv);
  for (const auto& [t, name] : {std::pair<const Tensor4View*, const char*>{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"},
                                {&a.o, "o"}}) {
    const std::string why = tma_why_not_bhsd(*t, name);
    if (!why.empty()) return why;
  }
  if (a.q.b * a.q.h * ((a.q.s + block - 1) / block) >= (int64_t(1) << 31))
    return "too many (batch, head, query block) items for 32-bit ids";
  const DeviceInfo& d = device_info();
  if (!d.available) return "no CUDA device (" + d.why_not + ")";
  if (d.cc_major != 9 || d.cc_minor != 0)
    return "needs an sm_90a GPU (Hopper), found sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor);
  static const bool sm90a = has_sm90a_code(reinterpret_cast<const void*>(&attention_fwd_kernel<Config<128, 128, true>>));
  if (!sm90a) return kNoSm90aCode;
  const int smem = pick(int(a.q.d), block, a.q.dtype).smem;
  if (d.smem_per_block_optin < size_t(smem))
    return "needs " + std::to_string(smem) + " bytes of shared memory per block, the device allows " +
           std::to_string(d.smem_per_block_optin);
  return "";
}

// The plan's device workspace: the item order (sorted every run) and the sort's scratch.
struct AttentionState final : VariantState {
  int items = 0, grid = 0, key_bits = 1;
  unsigned* lengths = nullptr;  // [items] sort keys: blocks per item
  unsigned* lengths_out = nullptr;
  int* ids = nullptr;         // [items] 0 .. items-1 (sort values)
  int* order = nullptr;       // [items] sorted ids
  void* sort_temp = nullptr;
  size_t sort_bytes = 0, bytes = 0;
  size_t workspace_bytes() const override { return bytes; }
  ~AttentionState() override {
    // NOTE: cudaFree waits for the device, so a launch still reading the order is safe.
    for (void* q : {static_cast<void*>(lengths), static_cast<void*>(lengths_out), static_cast<void*>(ids),
                    static_cast<void*>(order), sort_temp})
      if (q) cudaFree(q);
  }
};

int items_of(const AttentionArgs& a) {
  const int block = a.layout.block_q;
  return int(a.q.b * a.q.h * ((a.q.s + block - 1) / block));
}

std::unique_ptr<VariantState> prepare_hopper(const AttentionArgs& a, const Options&) {
  auto st = std::make_unique<AttentionState>();
  const Kernel k = pick(int(a.q.d), a.layout.block_q, a.q.dtype);
  k.setup();
  tma_encode_tiled();  // resolves the driver entry point (not under capture)
  st->items = items_of(a);
  st->grid = std::max(1, std::min(st->items, device_info().sm_count * k.ctas_per_sm));
  const int64_t max_len = a.layout.kmax + (a.layout.has_full() ? a.layout.full_kmax : 0);
  while ((int64_t(1) << st->key_bits) <= max_len) ++st->key_bits;
  if (st->items > 0) {
    const size_t n = size_t(st->items) * sizeof(int);
    for (void** q : {reinterpret_cast<void**>(&st->lengths), reinterpret_cast<void**>(&st->lengths_out),
                     reinterpret_cast<void**>(&st->ids), reinterpret_cast<void**>(&st->order)})
      check_cuda(cudaMalloc(q, n), "cudaMalloc(attention item order)");
    std::vector<int> ids(size_t(st->items));
    std::iota(ids.begin(), ids.end(), 0);
    check_cuda(cudaMemcpy(st->ids, ids.data(), n, cudaMemcpyHostToDevice), "cudaMemcpy(attention item ids)");
    check_cuda(cub::DeviceRadixSort::SortPairsDescending(nullptr, st->sort_bytes, st->lengths, st->lengths_out,
                                                         st->ids, st->order, st->items, 0, st->key_bits),
               "cub::DeviceRadixSort (size query)");
    check_cuda(cudaMalloc(&st->sort_temp, std::max<size_t>(st->sort_bytes, 16)), "cudaMalloc(attention sort)");
    st->bytes = 4 * n + st->sort_bytes;
  }
  return st;
}

void run_hopper(const AttentionArgs& a, const Options& o, VariantState* state) {
  auto* st = dynamic_cast<AttentionState*>(state);
  if (!st || st->items != items_of(a))
    throw Error(Status::internal, "attention hopper: run() got a state prepared for another shape");
  if (st->items == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(o.stream);
  const AttentionLayout& l = a.layout;
  Params p{};
  p.order = st->order;
  p.items = st->items;
  p.hq = int(a.q.h);
  p.hkv = int(a.k.h);
  p.group = int(a.q.h / a.k.h);
  p.mq = int((a.q.s + l.block_q - 1) / l.block_q);
  p.sq = int(a.q.s);
  p.skv = int(a.k.s);
  p.nkb = int((a.k.s + l.block_kv - 1) / l.block_kv);
  p.kv_num = l.kv_num_blocks;
  p.kv_idx = l.kv_indices;
  p.full_num = l.has_full() ? l.full_kv_num_blocks : nullptr;
  p.full_idx = l.has_full() ? l.full_kv_indices : nullptr;
  p.lb = int(l.batch);
  p.lh = int(l.heads);
  p.lh_is_kv = l.heads == a.k.h && l.heads != a.q.h;
  p.kmax = int(l.kmax);
  p.full_kmax = int(l.full_kmax);
  p.causal = a.causal;
  p.scale_log2 = a.softmax_scale() * 1.4426950408889634f;
  p.lse = a.lse;
  attention_item_lengths<<<std::min((st->items + 255) / 256, 1024), 256, 0, stream>>>(p, st->lengths);
  check_cuda(cudaGetLastError(), "attention_item_lengths launch");
  size_t bytes = st->sort_bytes;
  check_cuda(cub::DeviceRadixSort::SortPairsDescending(st->sort_temp, bytes, st->lengths, st->lengths_out, st->ids,
                                                       st->order, st->items, 0, st->key_bits, stream),
             "cub::DeviceRadixSort (item order)");
  pick(int(a.q.d), l.block_q, a.q.dtype).launch(a, p, st->grid, stream);
}

}  // namespace

std::vector<AttentionVariant> hopper_attention_variants() {
  return {AttentionVariant{"hopper", Backend::cuda, false, &why_not_hopper, &prepare_hopper, &run_hopper}};
}

}  // namespace sparsek
