// Device pieces of the Hopper product kernels (DSD/DDS in hopper_sm90.cu, SDD in
// hopper_sdd_sm90.cu): how an operand tile of one pipeline stage sits in shared memory (as the
// TMA wrote it) and the wgmma descriptors that read it, the wgmma issue of one stage, a consumer's
// K loop over the ring, and where an accumulator register lands in the output tile.
#pragma once
#include <cstdint>

#include "kernels/sm90/kit/ring.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/ptx/wgmma.cuh"

namespace sparsek::dev {

// One operand tile of a stage: EXT elements of the M (or N) side x KS of K, 16-bit elements.
//   K-major (KMAJOR): EXT rows of KS elements (rows of 128 or 64 bytes, swizzled to match): the
//     TMA box (KS, EXT) of a matrix whose K is contiguous.
//   MN-major: KS rows of W = min(EXT, WMAX) elements (128- or 64-byte rows), in EXT / W chunks of
//     KS rows each: one TMA box (W, KS) per chunk of a matrix whose M (N) is contiguous. WMAX = 32
//     gives 32-wide chunks (64-byte rows) for a tile gathered from 32-wide pieces.
// The swizzle is the row width (128B or 64B), in the TMA map and in the descriptor alike.
// desc(base, e0, kk): the sub-tile starting at M/N offset e0 (a multiple of 64, or 0), k16 step kk.
template <int EXT, int KS, bool KMAJOR, int WMAX = 64>
struct TileLayout {
  static constexpr int W = KMAJOR ? KS : (EXT < WMAX ? EXT : WMAX);  // elements per shared-memory row
  static constexpr int ROW_BYTES = W * 2;
  static constexpr int BYTES = EXT * KS * 2;
  static constexpr int CHUNK = KMAJOR ? BYTES : KS * ROW_BYTES;  // MN-major: one W-wide chunk
  static constexpr int CHUNKS = BYTES / CHUNK;
  static constexpr int TRANS = KMAJOR ? 0 : 1;  // wgmma imm-trans: 1 = M/N-major operand
  static constexpr ptx::Swizzle SWIZZLE = ROW_BYTES == 128 ? ptx::Swizzle::b128 : ptx::Swizzle::b64;
  static_assert(ROW_BYTES == 128 || ROW_BYTES == 64, "tile rows are one 128B or 64B swizzle span");
  static_assert((KMAJOR || EXT % W == 0) && KS % 16 == 0, "whole chunks and whole k16 steps");
  static_assert(CHUNK % 1024 == 0, "every chunk starts 1024-byte aligned (descriptor base offset 0)");

  // K-major: 8-row groups SBO = 8 rows apart, +32 bytes per k16 inside the swizzled row.
  // MN-major: LBO = the distance between W-wide chunks, SBO = between groups of 8 K rows, and
  // +16 rows per k16 step (canonical MN-major layouts, PTX ISA "matrix descriptor").
  static __device__ __forceinline__ uint64_t desc(uint32_t base, int e0, int kk) {
    if constexpr (KMAJOR)
      return ptx::smem_desc(base + e0 * ROW_BYTES + kk * 32, 16, 8 * ROW_BYTES, SWIZZLE);
    else
      return ptx::smem_desc(base + (e0 / W) * CHUNK + kk * 16 * ROW_BYTES, CHUNK, 8 * ROW_BYTES, SWIZZLE);
  }
};

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

// Where accumulator register 4*j + 2*h + e of instruction mi lands in the consumer's tile (tile
// row r, tile column n). wgmma m64nN fragment of thread (warp, lane): row 16*warp + 8*h + lane/4,
// column 8*j + 2*(lane%4) + e. Swapped, that row is the column n (within 64-wide chunk mi) and
// that column the row r.
template <bool SWAP>
__device__ __forceinline__ void fragment_coord(int mi, int j, int h, int e, int warp, int lane, int& r, int& n) {
  const int fr = warp * 16 + h * 8 + lane / 4, fc = j * 8 + (lane % 4) * 2 + e;
  if constexpr (SWAP) {
    r = fc;
    n = mi * 64 + fr;
  } else {
    r = fr;
    n = fc;
  }
}

}  // namespace sparsek::dev
