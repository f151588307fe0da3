// Hopper attention forward, producer: one warp walks the CTA's items; lane 0 issues every TMA load
// (the item's Q tile, then K and V of every key block the item attends, into two rings), the warp
// reads the block indices 32 at a time and works out which element masks each block needs.
#pragma once
#include "kernels/attn_fwd_sm90/config.hpp"
#include "kernels/ptx/async.cuh"
#include "kernels/sm90/kit/packed.cuh"
#include "kernels/sm90/kit/ring.cuh"

namespace sparsek::attn_fwd_sm90 {

template <class Cfg, bool PACKED>
__device__ __forceinline__ void produce(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                        const Params& p, const Smem<Cfg>& sm) {
  const int lane = threadIdx.x % 32;
  kit::Ring<Cfg::STAGES> kr, vr;
  uint32_t q_phase = 0;
  for (int i = blockIdx.x; i < p.items; i += gridDim.x) {
    const int id = p.order[i];
    const Item it = decode(id, p);
    int64_t row;
    int np, nf;
    item_counts(it, p, row, np, nf);
    const int total = np + nf;
    // Packed sequences: the keys [seq_lo, seq_hi) every row of this query block may attend; a
    // block outside them (or any block, when the rows span sequences) gets kMaskSequence.
    int seq_lo = 0, seq_hi = INT32_MAX;
    if (PACKED && total > 0) {
      int s0, s1;
      kit::warp_sequences_of(p.cu_seqlens, p.nseq, it.qb * Cfg::BM, min((it.qb + 1) * Cfg::BM, p.sq) - 1, s0, s1);
      if (s0 == s1) {
        seq_lo = __ldg(p.cu_seqlens + s0);
        seq_hi = __ldg(p.cu_seqlens + s0 + 1);
      } else {
        seq_hi = INT32_MIN;
      }
    }
    if (lane == 0) {
      ptx::mbar_wait_or_trap(sm.q_empty(), q_phase ^ 1, kit::kWaitLimit);
      ptx::st_shared_v2(sm.q_info(), id, total);
      if constexpr (PACKED) ptx::st_shared_v2(sm.seq_range(q_phase), seq_lo, seq_hi);
      ptx::mbar_arrive_expect_tx(sm.q_full(), total > 0 ? Cfg::Q_BYTES : 0);
      // q: (64 of D, rows, D chunks, heads, batch), box (64, BM, D / 64, 1, 1)
      if (total > 0) ptx::tma_load_5d(sm.q(), tm_q, sm.q_full(), 0, it.qb * Cfg::BM, 0, it.hq, it.b);
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
        if (PACKED && (blk * Cfg::BN < seq_lo || min((blk + 1) * Cfg::BN, p.skv) > seq_hi)) flags |= kMaskSequence;
      }
      const int count = min(32, total - t0);
      for (int t = 0; t < count; ++t) {
        const int b_t = __shfl_sync(0xffffffffu, blk, t), f_t = __shfl_sync(0xffffffffu, flags, t);
        if (lane == 0) {
          ptx::mbar_wait_or_trap(sm.k_empty(kr.stage), kr.phase ^ 1, kit::kWaitLimit);
          ptx::st_shared_v2(sm.k_info(kr.stage), b_t, f_t);
          ptx::mbar_arrive_expect_tx(sm.k_full(kr.stage), Cfg::KV_BYTES);
          // k, v: (64 of D, keys, D chunks, kv heads, batch), box (64, BN, D / 64, 1, 1)
          ptx::tma_load_5d(sm.k(kr.stage), tm_k, sm.k_full(kr.stage), 0, b_t * Cfg::BN, 0, it.hkv, it.b);
          kr.advance();
          ptx::mbar_wait_or_trap(sm.v_empty(vr.stage), vr.phase ^ 1, kit::kWaitLimit);
          ptx::mbar_arrive_expect_tx(sm.v_full(vr.stage), Cfg::KV_BYTES);
          ptx::tma_load_5d(sm.v(vr.stage), tm_v, sm.v_full(vr.stage), 0, b_t * Cfg::BN, 0, it.hkv, it.b);
          vr.advance();
        }
        __syncwarp();
      }
    }
  }
}

}  // namespace sparsek::attn_fwd_sm90
