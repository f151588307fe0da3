// Hopper attention forward, consumers: warpgroup wg owns query rows wg*64 .. wg*64+63 of every
// item and runs, per key block t, S = Q K_t^T (both from shared memory) -> masks -> online softmax
// in registers -> O += P V_t (P straight from the registers). The loop is rotated so that one wgmma
// batch holds P_t V_t and Q K_{t+1}^T; with two consumer warpgroups the batches take turns (named
// barriers), so one warpgroup's softmax runs under the other's tensor-core work.
#pragma once
#include <type_traits>

#include "kernels/attn_fwd_sm90/config.hpp"
#include "kernels/attn_fwd_sm90/epilogue.cuh"
#include "kernels/dtype.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/ptx/wgmma.cuh"
#include "kernels/sm90/kit/packed.cuh"
#include "kernels/sm90/kit/ring.cuh"
#include "kernels/sm90/kit/tile.cuh"

namespace sparsek::attn_fwd_sm90 {

// Masks, online softmax update and P as wgmma A fragments. first: no earlier block (O untouched).
// NOTE: runs while no wgmma of this warpgroup is in flight (the other warpgroup's are), so S and O
// may be written in place. An overlap of this softmax with the warpgroup's own PV (two P register
// sets) measured 2.4x slower: docs/history/attention.md.
// seq_range: the shared-memory slot of the item's {lo, hi} (PACKED: packed sequences).
template <class Cfg, bool PACKED>
__device__ __forceinline__ void softmax(float (&s)[Cfg::S_REGS], RowState<Cfg>& st, uint32_t (&pa)[Cfg::BN / 16][4],
                                        int2 info, int row0, const Params& p, bool first, uint32_t seq_range) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const int flags = info.y;
  if (flags) {  // uniform for the warpgroup; most blocks need no element mask
    const int col0 = info.x * Cfg::BN + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = row0 + 16 * warp + lane / 4 + 8 * h;
      // Packed sequences: the keys of row q's own sequence (rare blocks: near a boundary), the
      // item's when its rows are all in one sequence, else this row's own (a search).
      int lo = INT32_MIN, hi = INT32_MAX;
      if constexpr (PACKED) {
        if (flags & kMaskSequence) {
          const int2 r = ptx::ld_shared_v2(seq_range);
          if (r.y != INT32_MIN) lo = r.x, hi = r.y;
          else kit::sequence_rows(p.cu_seqlens, p.nseq, q, lo, hi);
        }
      }
#pragma unroll
      for (int j = 0; j < Cfg::BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + 8 * j + e;
          bool masked = (flags & kMaskAll) || ((flags & kMaskTail) && col >= p.skv) ||
                        ((flags & kMaskCausal) && col > q);
          if constexpr (PACKED) masked = masked || col < lo || col >= hi;
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
  // Accumulator pair (j, h) is A register 2 * (j % 2) + h of k16 step j / 2 (ptx/wgmma.cuh).
#pragma unroll
  for (int kk = 0; kk < Cfg::BN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[kk][r] = dev::pack2<Cfg::BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

// Consumer warpgroup wg (0 .. NWG-1): query rows wg*64 .. wg*64+63 of every item.
// Named barriers: 1 + w = "warpgroup w may issue its next wgmma batch" (two consumers only);
// 3 + w = warpgroup w's epilogue.
// NOTE: the consumers wait without the trap of mbar_wait_or_trap: ptxas (13.0) then shares the trap
// block between the warpgroup branches and compiles the consumers within the kernel's entry budget
// of 168 registers instead of their setmaxnreg budget (232 bytes of spills at D = 128). A lost
// arrival that stalls the producer (the usual case: the ring fills) still traps there.
template <class Cfg, bool PACKED>
__device__ __forceinline__ void consume(const CUtensorMap* tm_o, const Params& p, const Smem<Cfg>& sm, int wg) {
  using QT = typename Cfg::QTile;
  using KT = typename Cfg::KTile;
  using VT = typename Cfg::VTile;
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
  kit::Ring<Cfg::STAGES> kr, vr;
  uint32_t q_phase = 0;
  const uint32_t s_o = sm.o(wg);  // this warpgroup's staging tile
  uint8_t* const o_ptr = sm.o_ptr(wg);
  RowState<Cfg> st;
  float s[Cfg::S_REGS];
  uint32_t pa[Cfg::BN / 16][4];
  for (int i = blockIdx.x; i < p.items; i += gridDim.x) {
    ptx::mbar_wait(sm.q_full(), q_phase);
    const uint32_t seq_range = PACKED ? sm.seq_range(q_phase) : 0u;
    q_phase ^= 1;
    // Every thread reads the info words and arrives on q_empty and k_empty itself: an arrival by
    // lane 0 alone would order the other lanes' reads before the producer's next write only through
    // the warp's convergence (a racecheck hazard; a __syncwarp() there is compiled away).
    const int2 qi = ptx::ld_shared_v2(sm.q_info());
    const Item it = decode(qi.x, p);
    const int total = qi.y;
    const int row0 = it.qb * Cfg::BM + wg * 64;
#pragma unroll
    for (int r = 0; r < Cfg::O_REGS; ++r) st.o[r] = 0.f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
    if (total == 0) {
      ptx::mbar_arrive(sm.q_empty());
      epilogue<Cfg>(st, tm_o, p, it, row0, wg, s_o, o_ptr);
      continue;
    }
    // Batch 0: S = Q K_0^T (this warpgroup's 64 Q rows against the K tile).
    my_turn();
    ptx::mbar_wait(sm.k_full(kr.stage), kr.phase);
    int2 info = ptx::ld_shared_v2(sm.k_info(kr.stage));
    ptx::wgmma_fence();
    kit::mma<QT, KT, Cfg::BN, Cfg::BF16>(s, sm.q(), wg * 64, sm.k(kr.stage), 0, true);
    ptx::wgmma_commit();
    pass_turn();
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < Cfg::S_REGS; ++r) ptx::fence_operand(s[r]);
    ptx::mbar_arrive(sm.k_empty(kr.stage));
    kr.advance();
    if (total == 1) ptx::mbar_arrive(sm.q_empty());
    softmax<Cfg, PACKED>(s, st, pa, info, row0, p, true, seq_range);
    // Batch t + 1: O += P_t V_t, and S = Q K_{t+1}^T (NEXT: t + 1 < total; the last batch is PV
    // alone). NEXT is a compile-time argument and the last batch its own copy: a wgmma under a
    // run-time `if` inside the batch made ptxas inject a warpgroup arrive and a dummy wgmma into
    // every batch (C7519).
    auto batch = [&](auto next_c, int t) {
      constexpr bool NEXT = decltype(next_c)::value;
      my_turn();
      ptx::mbar_wait(sm.v_full(vr.stage), vr.phase);
      if constexpr (NEXT) {
        ptx::mbar_wait(sm.k_full(kr.stage), kr.phase);
        info = ptx::ld_shared_v2(sm.k_info(kr.stage));
      }
#pragma unroll
      for (int r = 0; r < Cfg::O_REGS; ++r) ptx::fence_operand(st.o[r]);
      ptx::wgmma_fence();
      kit::mma_rs<VT, Cfg::D, Cfg::BF16>(st.o, pa, sm.v(vr.stage), 0);
      if constexpr (NEXT) kit::mma<QT, KT, Cfg::BN, Cfg::BF16>(s, sm.q(), wg * 64, sm.k(kr.stage), 0, true);
      ptx::wgmma_commit();
      pass_turn();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int r = 0; r < Cfg::O_REGS; ++r) ptx::fence_operand(st.o[r]);
      if constexpr (NEXT) {
#pragma unroll
        for (int r = 0; r < Cfg::S_REGS; ++r) ptx::fence_operand(s[r]);
      }
      if (lane == 0) ptx::mbar_arrive(sm.v_empty(vr.stage));
      vr.advance();
      if constexpr (NEXT) {
        ptx::mbar_arrive(sm.k_empty(kr.stage));
        if (t + 2 == total) ptx::mbar_arrive(sm.q_empty());  // the item's last QK^T is done
        kr.advance();
        softmax<Cfg, PACKED>(s, st, pa, info, row0, p, false, seq_range);
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

}  // namespace sparsek::attn_fwd_sm90
