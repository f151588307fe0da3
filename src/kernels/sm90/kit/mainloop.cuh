// The Hopper kit: the products' consumer K loop (DSD and SDD): the wgmmas of one ring stage, and a
// consumer warpgroup's walk over the stages of a work item.
#pragma once
#include <cstdint>

#include "kernels/ptx/async.cuh"
#include "kernels/ptx/wgmma.cuh"
#include "kernels/sm90/kit/ring.cuh"
#include "kernels/sm90/kit/tile.cuh"

namespace sparsek::kit {

// The wgmmas of one stage for one consumer warpgroup. Cfg provides ATile (BM x KS), BTile
// (BN x KS), KS, MI, WN, ACC, BF16, SWAP, COOP (and A_BYTES, B_BYTES: the stage strides, for
// mainloop()).
//   Not swapped: acc (64 rows of the tile x BN) += A rows [64 * which (cooperative) ..] x B.
//   Swapped (bm = 32): acc[mi] (64 columns of the tile x BM) += B^T chunk mi x A^T: the wide N
//   side is the wgmma M side (wgmma needs M = 64).
template <class Cfg>
__device__ __forceinline__ void mma_stage(float (&acc)[Cfg::MI][Cfg::ACC], uint32_t a, uint32_t b, int which) {
  using AT = typename Cfg::ATile;
  using BT = typename Cfg::BTile;
#pragma unroll
  for (int kk = 0; kk < Cfg::KS / 16; ++kk) {
#pragma unroll
    for (int mi = 0; mi < Cfg::MI; ++mi) {
      if constexpr (!Cfg::SWAP) {
        const uint64_t da = AT::desc(a, Cfg::COOP ? which * 64 : 0, kk), db = BT::desc(b, 0, kk);
        ptx::wgmma_m64k16<Cfg::WN, Cfg::BF16, AT::TRANS, BT::TRANS>(acc[mi], da, db, 1);
      } else {
        const uint64_t da = BT::desc(b, mi * 64, kk), db = AT::desc(a, 0, kk);
        ptx::wgmma_m64k16<Cfg::WN, Cfg::BF16, BT::TRANS, AT::TRANS>(acc[mi], da, db, 1);
      }
    }
  }
}

// One consumer warpgroup's K loop over the next nst stages of the ring: acc = the sum of their
// wgmmas. Each stage is waited for full, its wgmmas issued, one wgmma group kept in flight, and the
// previous stage's slot given back (release(slot), by lane 0 of each warp). hand_to >= 0 names the
// named barrier the other ping-pong consumer waits on before its next item: it is signalled once
// the last stage has been seen full (its math still runs), so the tensor cores get the other
// consumer's wgmmas without a gap. wait_cycles (profiling builds; null otherwise): the clock64
// cycles spent waiting for full stages are added to it.
// half_flags (cooperative tiles over row pairs; 0 otherwise): the shared-memory address of a word
// per ring slot whose bit h says whether half h of the stage's A tile was loaded; a consumer whose
// half is missing gives the stage back without a wgmma (a zero half would turn Inf or NaN in B rows
// that only the other row reads into NaN here). Returns whether any stage held this consumer's rows
// (false: its rows have no stored block in this item, so alpha must not touch them).
template <class Cfg, class Ring, class Release>
__device__ __forceinline__ bool mainloop(float (&acc)[Cfg::MI][Cfg::ACC], int nst, Ring& ring, uint32_t s_a,
                                         uint32_t s_b, uint32_t full, int which, int hand_to, Release&& release,
                                         uint32_t half_flags, long long* wait_cycles) {
  const int lane = threadIdx.x % 32;
  if (nst == 0 && hand_to >= 0) ptx::named_barrier_arrive(hand_to, 256);
#pragma unroll
  for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
    for (int i = 0; i < Cfg::ACC; ++i) acc[mi][i] = 0.f;
  uint32_t prev = 0;
  bool have_prev = false;
  bool used = nst > 0 && !half_flags;
  for (int s = 0; s < nst; ++s) {
    const long long t0 = wait_cycles ? clock64() : 0;
    ptx::mbar_wait_or_trap(full + 8 * ring.stage, ring.phase, kWaitLimit);
    if (wait_cycles) *wait_cycles += clock64() - t0;
    if (s == nst - 1 && hand_to >= 0) ptx::named_barrier_arrive(hand_to, 256);
    if (half_flags) {
      // Lane 0 reads the flag and hands it to the others, so that the read comes before the slot's
      // release in the releasing thread's own program order.
      const uint32_t f =
          __shfl_sync(0xffffffffu, lane == 0 ? ptx::ld_shared_u32(half_flags + 4 * ring.stage) : 0u, 0);
      // NOTE: a stage without this consumer's half is given back at once and the loop goes on
      // (`continue`), rather than its wgmmas sitting in an `if`: ptxas serialized every wgmma of
      // the kernel around a conditional one (C7520), which cost the 128x128 product 15% on the H100.
      if (!((f >> which) & 1u)) {
        // The slot of the last stage with this half goes back first: holding it while skipping
        // STAGES - 1 more would wait on its own refill (two rows with few shared columns deadlocked).
        if (have_prev) {
          ptx::wgmma_wait<0>();
          if (lane == 0) release(prev);
          have_prev = false;
        }
        if (lane == 0) release(ring.stage);
        ring.advance();
        continue;
      }
      used = true;
    }
    ptx::wgmma_fence();
    mma_stage<Cfg>(acc, s_a + ring.stage * Cfg::A_BYTES, s_b + ring.stage * Cfg::B_BYTES, which);
    ptx::wgmma_commit();
    // Keep this stage's group in flight; the previous one is done, so its slot goes back.
    ptx::wgmma_wait<1>();
    if (have_prev && lane == 0) release(prev);
    prev = ring.stage;
    have_prev = true;
    ring.advance();
  }
  ptx::wgmma_wait<0>();
  if (have_prev && lane == 0) release(prev);
#pragma unroll
  for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
    for (int i = 0; i < Cfg::ACC; ++i) ptx::fence_operand(acc[mi][i]);
  return used;
}

}  // namespace sparsek::kit
