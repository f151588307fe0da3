// Hopper attention backward, consumers: warpgroup wg owns keys wg*64 .. wg*64+63 of every item and,
// per step (MS query rows of one query head against the item's keys):
//    S^T = K Q^T, dP^T = V dO^T               (wgmma, both operands from shared memory)
//    P^T = exp2(S^T * scale*log2e - LSE2), masks; dS^T = P^T o (dP^T - Delta)
//    dV += P^T dO, dK += dS^T Q                (wgmma with P^T / dS^T straight from registers)
//    dS^T -> shared memory; dQ_tile = dS K      (both warpgroups' dS^T; this warpgroup's part of dQ)
// and sends its dQ part to the accumulator (epilogue.cuh). dK and dV stay in registers across the
// item and leave at its end.
#pragma once
#include <type_traits>

#include "kernels/attn_bwd_sm90/config.hpp"
#include "kernels/attn_bwd_sm90/epilogue.cuh"
#include "kernels/dtype.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/ptx/wgmma.cuh"
#include "kernels/sm90/kit/packed.cuh"
#include "kernels/sm90/kit/ring.cuh"
#include "kernels/sm90/kit/store.cuh"
#include "kernels/sm90/kit/tile.cuh"

namespace sparsek::attn_bwd_sm90 {

// P^T = exp2(S^T scale log2e - LSE2) (0 where masked), dS^T = P^T o (dP^T - Delta), in place.
// Element (register 4c + 2h + e) is key key_row + 8h, query row0 + 8c + 2 (lane % 4) + e.
// Masked scores are set to -inf first, in a pass of their own under one uniform branch per step
// (exp2 then gives exactly 0, as the masks require): with the test inside the loop below, ptxas
// if-converted it into ~4 predicated instructions per element, run on every step whether a mask
// applied or not.
// seq (packed sequences): a query attends only keys of its own sequence, tested as "the query is
// among the rows of the key's sequence" (this thread's two keys: two searches, not one per query).
template <class Cfg, bool PACKED>
__device__ __forceinline__ void softmax_grad(float (&s)[Cfg::S_REGS], float (&dp)[Cfg::S_REGS], const float4* rows,
                                             int row0, bool causal, bool tail, bool seq, int key_row,
                                             const Params& p) {
  const int lane = threadIdx.x % 32;
  if constexpr (PACKED) {
    if (tail || causal || seq) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = key_row + 8 * h;
        int lo = INT32_MIN, hi = INT32_MAX;
        if (seq) kit::sequence_rows(p.cu_seqlens, p.nseq, key, lo, hi);
#pragma unroll
        for (int c = 0; c < Cfg::MS / 8; ++c)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int q = row0 + 8 * c + 2 * (lane % 4) + e;
            if (key >= p.skv || (causal && key > q) || q < lo || q >= hi) s[4 * c + 2 * h + e] = -INFINITY;
          }
      }
    }
  } else if (tail || causal) {
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
    // {LSE2, Delta} only (8 bytes of the 16): ptxas loads every row of the step ahead, and at 128-row
    // steps the grid scales' registers too spilled.
    const float2 r0 = *reinterpret_cast<const float2*>(rows + col), r1 = *reinterpret_cast<const float2*>(rows + col + 1);
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
}

// S^T = K Q^T (S: into s) and dP^T = V dO^T (DP: into dp) of the step in ring slot `stage`: this
// warpgroup's 64 keys (k_rows, v_rows: their first row in the K and V tiles) x MS queries. One wgmma
// batch.
template <class Cfg, bool S, bool DP>
__device__ __forceinline__ void issue_sdp(float (&s)[Cfg::S_REGS], float (&dp)[Cfg::S_REGS], const Smem<Cfg>& sm,
                                          int stage, uint32_t k_rows, uint32_t v_rows) {
  using A = typename Cfg::KRows;
  using B = typename Cfg::QRows;
  ptx::wgmma_fence();
  if constexpr (S) kit::mma<A, B, Cfg::MS, Cfg::BF16>(s, k_rows, 0, sm.q(stage), 0, true);
  if constexpr (DP) kit::mma<A, B, Cfg::MS, Cfg::BF16>(dp, v_rows, 0, sm.d(stage), 0, true);
  ptx::wgmma_commit();
}

// A 64 x 64 dQ tile = dS K over the item's BN keys: A = dS^T in shared memory read MN-major (the
// step's queries 64 q_chunk .. 64 q_chunk + 63 contiguous, BN key rows 128 bytes apart), B = the K
// tile read MN-major (D contiguous; columns 64 n_chunk .. 64 n_chunk + 63). One wgmma batch.
template <class Cfg>
__device__ __forceinline__ void issue_dq(float (&acc)[32], const Smem<Cfg>& sm, int q_chunk, int n_chunk) {
  ptx::wgmma_fence();
  kit::mma<typename Cfg::DsCols, typename Cfg::KCols, 64, Cfg::BF16>(acc, sm.ds(), 64 * q_chunk, sm.k(), 64 * n_chunk,
                                                                     true);
  ptx::wgmma_commit();
}

// The dQ tile warpgroup wg takes in a step where it has one (two warpgroups): {query chunk, D chunk}.
template <class Cfg>
__device__ __forceinline__ int2 my_dq_tile(int wg) {
  if constexpr (Cfg::DQ_TURNS) return make_int2(0, 0);
  else if constexpr (Cfg::TN == 2) return make_int2(0, wg);
  else return make_int2(wg, 0);
}

// Consumer warpgroup wg: keys wg*64 .. wg*64+63 of every item.
// Named barriers (128 * NWG threads): 1 = "every warpgroup's dQ wgmma of the last step is done"
// (dS^T may be overwritten), 2 = "dS^T of this step is complete"; 3 + wg = warpgroup wg alone.
// NOTE: the consumers wait without the trap of mbar_wait_or_trap (see the forward kernel: a trap
// block shared between the warpgroup branches makes ptxas compile the consumers within the entry
// register budget); a lost arrival stalls the producer, which traps.
template <class Cfg, bool PACKED>
__device__ __forceinline__ void consume(const CUtensorMap* tm_dk, const CUtensorMap* tm_dv, const Params& p,
                                        const Smem<Cfg>& sm, int wg) {
  using QCols = typename Cfg::QCols;
  const int tid = threadIdx.x % 128, lane = tid % 32, warp = tid / 32;
  constexpr int ALL = 128 * Cfg::NWG;
  kit::Ring<Cfg::STAGES> qr;
  uint32_t item_phase = 0;
  const uint32_t out = sm.out(wg);
  uint8_t* out_ptr = sm.out_ptr(wg);
  uint8_t* ds_ptr = sm.ds_ptr();
  const uint32_t k_rows = sm.k() + wg * 64 * 128, v_rows = sm.v() + wg * 64 * 128;  // this warpgroup's keys
  uint32_t dq_turn = 0;  // counts steps: with two warpgroups and one dQ tile they take turns
  float dk[Cfg::KV_REGS], dv[Cfg::KV_REGS];
  for (;;) {
    ptx::mbar_wait(sm.item_full(), item_phase);
    item_phase ^= 1;
    const int2 info = *sm.item_info();
    if (info.x < 0) break;
    const Item it = decode(info.x, p);
    const int steps = info.y;
#pragma unroll
    for (int r = 0; r < Cfg::KV_REGS; ++r) dk[r] = dv[r] = 0.f;
    const int key_row = it.j * Cfg::BN + wg * 64 + 16 * warp + lane / 4;  // + 8 * h: this thread's keys
    const bool tail = (it.j + 1) * Cfg::BN > p.skv;
    // S^T and dP^T: with PREFETCH they live across steps (the next step's are issued under this
    // step's dQ), without it each step issues and reads its own.
    float s[Cfg::S_REGS], dp[Cfg::S_REGS];

    // One step. NEXT (PREFETCH only): issue the next step's products too (every step of an item but
    // its last). A compile-time flag: a wgmma on a path that ptxas must treat as divergent
    // serialises every wgmma of the kernel. Without PREFETCH (64x64 blocks at D = 128: one
    // warpgroup takes both dQ tiles of a step) the step waits for its own stage and issues its own
    // S^T and dP^T, and the dQ tiles go one after the other.
    auto step = [&](auto next_tag) {
      [[maybe_unused]] constexpr bool NEXT = decltype(next_tag)::value;
      if constexpr (!Cfg::PREFETCH) ptx::mbar_wait(sm.qd_full(qr.stage), qr.phase);
      const int2 si = *sm.stage_info(qr.stage);
      const int row0 = si.x, hq = si.y >> 1;
      const bool causal = p.causal && !(si.y & 1) && it.j * Cfg::BN + Cfg::BN - 1 > row0;
      bool seq = false;
      if constexpr (PACKED) {  // (packed sequences have Sq = Skv)
        const int2 r = *sm.seq_range();
        seq = row0 < r.x || min(row0 + Cfg::MS, p.skv) > r.y;
      }
      const uint32_t q_tile = sm.q(qr.stage), d_tile = sm.d(qr.stage);
      const float4* rows = sm.rows_ptr(qr.stage);
      if constexpr (!Cfg::PREFETCH)
        issue_sdp<Cfg, true, true>(s, dp, sm, qr.stage, k_rows, v_rows);
      else if constexpr (!Cfg::PREFETCH_DP)
        issue_sdp<Cfg, false, true>(s, dp, sm, qr.stage, k_rows, v_rows);  // dP^T alone (S^T: issued by the step before)
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int r = 0; r < Cfg::S_REGS; ++r) {
        ptx::fence_operand(s[r]);
        ptx::fence_operand(dp[r]);
      }
      softmax_grad<Cfg, PACKED>(s, dp, rows, row0, causal, tail, seq, key_row, p);
      uint32_t pa[Cfg::MS / 16][4], da[Cfg::MS / 16][4];
#pragma unroll
      for (int kk = 0; kk < Cfg::MS / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          pa[kk][r] = dev::pack2<Cfg::BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
          da[kk][r] = dev::pack2<Cfg::BF16>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
        }
      // The dQ grid scales of this thread's two dQ rows (read before the stage is released).
      const int2 dq_tile = my_dq_tile<Cfg>(wg);
      const int dq_row = 64 * dq_tile.x + 16 * warp + lane / 4;
      const float qs0 = rows[dq_row].z, qs1 = rows[dq_row + 8].z;

      // dV += P^T dO, dK += dS^T Q (A from registers).
#pragma unroll
      for (int r = 0; r < Cfg::KV_REGS; ++r) {
        ptx::fence_operand(dk[r]);
        ptx::fence_operand(dv[r]);
      }
      ptx::wgmma_fence();
      kit::mma_rs<QCols, Cfg::D, Cfg::BF16>(dv, pa, d_tile, 0);
      kit::mma_rs<QCols, Cfg::D, Cfg::BF16>(dk, da, q_tile, 0);
      ptx::wgmma_commit();

      // dS^T -> shared memory, once every warpgroup's last dQ wgmma has read the previous one.
      ptx::named_barrier_sync(1, ALL);
#pragma unroll
      for (int kk = 0; kk < Cfg::MS / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int key = wg * 64 + 16 * warp + lane / 4 + 8 * (r & 1);
          const int query = 16 * kk + 8 * (r >> 1) + 2 * (lane % 4);
          *reinterpret_cast<uint32_t*>(ds_ptr + kit::swizzle128_offset(key, query, Cfg::BN * 128)) = da[kk][r];
        }
      ptx::fence_proxy_async_smem();  // st.shared above, read by wgmma (async proxy) below
      ptx::named_barrier_sync(2, ALL);

      // This warpgroup's dQ tiles of the step = dS K -> the output buffer (stage_dq). Two warpgroups
      // and two tiles: one each; a single tile: this warpgroup's on every other step; one
      // warpgroup: every tile.
      const bool my_dq = !Cfg::DQ_TURNS || (dq_turn++ & 1) == uint32_t(wg);
      if constexpr (!Cfg::PREFETCH) {
        if (my_dq) {
#pragma unroll 1
          for (int t = 0; t < Cfg::MY_TILES; ++t) {
            float dq[32];
            issue_dq<Cfg>(dq, sm, dq_tile.x, dq_tile.y + t);
            if (t == 0) kit::staging_acquire(tid == 0, 3 + wg);  // the last bulk reduce has read the buffer
            ptx::wgmma_wait<0>();
            stage_dq<Cfg>(dq, t, qs0, qs1, out_ptr, tid, p.det);
          }
        } else {
          ptx::wgmma_wait<0>();
        }
#pragma unroll
        for (int r = 0; r < Cfg::KV_REGS; ++r) {
          ptx::fence_operand(dk[r]);
          ptx::fence_operand(dv[r]);
        }
      } else {
        // The next step's S^T (D = 64: and dP^T) is issued right after this step's dQ product, so
        // that the tensor cores run it while the dQ tile is rounded and stored.
        float dq[32];
        if (my_dq) {
          issue_dq<Cfg>(dq, sm, dq_tile.x, dq_tile.y);
          kit::staging_acquire(tid == 0, 3 + wg);  // the last bulk reduce has read the buffer
        }
        if constexpr (NEXT) {
          if (my_dq)
            ptx::wgmma_wait<1>();  // dV and dK have read P^T and dS^T (dQ may still run)
          else
            ptx::wgmma_wait<0>();
          kit::Ring<Cfg::STAGES> next = qr;
          next.advance();
          ptx::mbar_wait(sm.qd_full(next.stage), next.phase);
          issue_sdp<Cfg, true, Cfg::PREFETCH_DP>(s, dp, sm, next.stage, k_rows, v_rows);  // s, dp: no longer read here
          ptx::wgmma_wait<1>();  // dQ done (unconditional, so that ptxas sees dq complete on every path)
        } else {
          ptx::wgmma_wait<0>();
        }
        if (my_dq) stage_dq<Cfg>(dq, 0, qs0, qs1, out_ptr, tid, p.det);
        if constexpr (!NEXT) {  // (with NEXT the next products are in flight: ptxas would serialise)
#pragma unroll
          for (int r = 0; r < Cfg::KV_REGS; ++r) {
            ptx::fence_operand(dk[r]);
            ptx::fence_operand(dv[r]);
          }
        }
      }
      // Q, dO, the rows and the stage info are read. Every thread arrives: each releases its own
      // generic reads of the rows and the info word (an arrival by lane 0 alone orders the other
      // lanes' reads only through warp convergence, which racecheck reports as a hazard).
      ptx::mbar_arrive(sm.qd_empty(qr.stage));
      qr.advance();
      if (my_dq) send_dq<Cfg>(p, it, hq, row0, dq_tile, wg, tid, out);
    };

    if constexpr (!Cfg::PREFETCH) {
      for (int i = 0; i < steps; ++i) step(std::false_type{});
    } else if (steps > 0) {
      ptx::mbar_wait(sm.qd_full(qr.stage), qr.phase);
      issue_sdp<Cfg, true, Cfg::PREFETCH_DP>(s, dp, sm, qr.stage, k_rows, v_rows);
#pragma unroll 1
      for (int i = 0; i + 1 < steps; ++i) step(std::true_type{});
      step(std::false_type{});
    }
    ptx::mbar_arrive(sm.item_empty());  // K, V and the item info are no longer read (every thread)
    store_dk_dv<Cfg>(dk, dv, tm_dk, tm_dv, p, it, wg, out, out_ptr);
  }
  // The last bulk reduce and TMA stores must finish before the CTA (and its shared memory) goes away.
  if (tid == 0) ptx::bulk_wait_group<0>();
}

}  // namespace sparsek::attn_bwd_sm90
