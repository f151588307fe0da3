// Hopper DSD, producer: one warp; lane 0 waits for free ring slots and issues the TMA loads of A's
// stored blocks and B's panels, the warp stages the block indices (in registers, or for row pairs in
// shared memory) so that no dependent global load sits in front of a TMA issue.
#pragma once
#include "kernels/dsd_sm90/config.hpp"
#include "kernels/ptx/async.cuh"
#include "kernels/sm90/kit/ring.cuh"

namespace sparsek::dsd_sm90 {


// B rows k0 .. k0 + KS of the N tile at n0 (one stage's slice) into b_stage.
template <class Cfg>
__device__ __forceinline__ void load_b_slice(const CUtensorMap* tm_b, const Params& p, uint32_t bar, uint32_t b_stage,
                                             int n0, int k0) {
  if constexpr (Cfg::B_K) {
    // B column-major, (N rows of K): one box (KS, BN) at (k0, n0), K-major
    ptx::tma_load_2d(b_stage, tm_b, bar, k0, n0);
  } else if (p.b3d) {
    // B row-major: BN/64 boxes (64, KS) side by side as one 3-D box (N is whole 64-column chunks)
    ptx::tma_load_3d(b_stage, tm_b, bar, 0, k0, n0 / 64);
  } else {
#pragma unroll
    for (int c = 0; c < Cfg::BN / 64; ++c) ptx::tma_load_2d(b_stage + c * Cfg::B_CHUNK, tm_b, bar, n0 + 64 * c, k0);
  }
}

// One box of an A tile into shared memory; with Cfg::L2_HINTS the loads keep A in L2 (evict_last:
// A is read again for every N tile).
template <class Cfg>
__device__ __forceinline__ void load_a_box(uint32_t dst, const CUtensorMap* tm_a, uint32_t bar, int x, int y) {
  if constexpr (Cfg::L2_HINTS)
    ptx::tma_load_2d_hint(dst, tm_a, bar, x, y, ptx::l2_policy_evict_last());
  else
    ptx::tma_load_2d(dst, tm_a, bar, x, y);
}

// Producer: one warp; lane 0 waits for free slots and issues the TMA loads, the warp stages the
// block indices in registers (32 at a time, the next item's first 32 prefetched a whole item
// ahead) so that no dependent global load sits in front of a TMA issue.
template <class Cfg>
__device__ __forceinline__ void produce(const CUtensorMap* tm_a, const CUtensorMap* tm_b, const Params& p,
                                        int first, int last, uint32_t s_a, uint32_t s_b, uint32_t full,
                                        uint32_t empty) {
  const int lane = threadIdx.x % 32;
  kit::Ring<Cfg::STAGES> ring;
  uint32_t& stage = ring.stage;
  const uint32_t& phase = ring.phase;
  const int rank = Cfg::CL > 1 ? int(ptx::cluster_ctarank()) : 0;
  // Positions [j, end) of the pattern, one per lane: x = the block column of op(A), y = the block
  // in A's values (op T: through perm; else the position itself).
  auto indices = [&](int j, int end) {
    int2 v = make_int2(0, 0);
    if (lane < end - j) {
      v.x = p.col_idx[j + lane];
      v.y = Cfg::A_MN ? p.perm[j + lane] : j + lane;
    }
    return v;
  };
  int4 w = first < last ? p.items[first] : make_int4(0, 0, 0, 0);
  int2 idx = indices(w.z, w.w);
  SK_PROF(const long long t_start = clock64(); long long prof_wait = 0;)
  for (int it = first; it < last; ++it) {
    const bool more = it + 1 < last;
    const int4 wn = more ? p.items[it + 1] : make_int4(0, 0, 0, 0);
    const int2 idx_next = indices(wn.z, wn.w);
    for (int j0 = w.z; j0 < w.w; j0 += 32) {
      if (j0 != w.z) idx = indices(j0, w.w);
      const int count = min(32, w.w - j0);
      for (int t = 0; t < count; ++t) {
        const int col = __shfl_sync(0xffffffffu, idx.x, t);
        const int blk = Cfg::A_MN ? __shfl_sync(0xffffffffu, idx.y, t) : j0 + t;
        if (lane == 0) {
          for (int h = 0; h < p.kslices; ++h) {
            const uint32_t bar = full + 8 * stage;
            SK_PROF(const long long tw = clock64();)
            ptx::mbar_wait_or_trap(empty + 8 * stage, phase ^ 1, kit::kWaitLimit);
            SK_PROF(prof_wait += clock64() - tw;)
            ptx::mbar_arrive_expect_tx(bar, Cfg::STAGE_BYTES);
            // A part `part` of slice h of the block: vals (nnzb*bm_stored, bk_stored).
            //   K-major: box (KS, BM / CL) at (h*KS, blk*BM + part * BM / CL): rows of the block.
            //   MN-major (op T): box (64 or 32, KS) at (part * 64, blk*bk + h*KS): KS rows of the
            //   stored block, one chunk of its columns (= op(A)'s rows).
            auto a_box = [&](int part, int& x, int& y) {
              if constexpr (Cfg::A_MN) {
                x = part * Cfg::ATile::W;
                y = blk * p.bk + h * Cfg::KS;
              } else {
                x = h * Cfg::KS;
                y = blk * Cfg::BM + part * (Cfg::BM / Cfg::CL);
              }
            };
            const uint32_t a_stage = s_a + stage * Cfg::A_BYTES;
            int ax, ay;
            if constexpr (Cfg::CL > 1) {
              if (p.cluster_mode == 0) {
                a_box(rank, ax, ay);
                ptx::tma_load_2d_multicast_hint(a_stage + rank * Cfg::A_PART, tm_a, bar, ax, ay,
                                                uint16_t((1u << Cfg::CL) - 1), ptx::l2_policy_evict_last());
              } else {  // diagnostics: every part of A loaded locally
                for (int r = 0; r < Cfg::CL; ++r) {
                  a_box(r, ax, ay);
                  ptx::tma_load_2d(a_stage + r * Cfg::A_PART, tm_a, bar, ax, ay);
                }
              }
            } else {
#pragma unroll
              for (int c = 0; c < Cfg::A_BOXES; ++c) {
                a_box(c, ax, ay);
                load_a_box<Cfg>(a_stage + c * Cfg::A_BOX_BYTES, tm_a, bar, ax, ay);
              }
            }
            load_b_slice<Cfg>(tm_b, p, bar, s_b + stage * Cfg::B_BYTES, w.y + rank * Cfg::BN, col * p.bk + h * Cfg::KS);
            ring.advance();
          }
        }
        __syncwarp();
      }
    }
    w = wn;
    idx = idx_next;
  }
  SK_PROF(if (lane == 0) {
    atomicAdd(&p.prof[kProfProducer], (unsigned long long)(clock64() - t_start));
    atomicAdd(&p.prof[kProfEmptyWait], (unsigned long long)prof_wait);
  })
}

// Row pairs (Params::pair_blk): after the full and empty barriers and the two C-load barriers
// (see the kernel's layout), a word per ring slot whose bit r says whether half r of the slot's A
// tile was loaded, then the producer's stash of 32 positions (16 bytes each: the block column, then
// the blocks of rows 2x and 2x + 1). Computed from `empty` rather than carried in a register.
template <class Cfg>
__device__ __forceinline__ uint32_t half_flags(uint32_t empty) {
  return empty + 8 * Cfg::STAGES + 16;
}
template <class Cfg>
__device__ __forceinline__ uint32_t pair_stash(uint32_t empty) {
  return half_flags<Cfg>(empty) + 4 * Cfg::STAGES;
}

// Row pairs, one stage: its flag, the barrier's expected bytes and the A tile's halves. Half r (row
// 2x + r's block blk_r, K slice h: 64 rows) goes to rows 64 r.. of the tile; a missing half (-1) is
// not loaded, and the flag tells the consumers, which read it after their wait on this stage's
// barrier (the arrive below releases it). Both CTAs of a cluster see the same halves, so each
// expects the bytes both send.
template <class Cfg>
__device__ __forceinline__ void load_pair_halves(const CUtensorMap* tm_a, const Params& p, uint32_t bar,
                                                 uint32_t a_stage, int h, int blk0, int blk1, int rank,
                                                 uint32_t flag) {
  constexpr uint32_t HALF = Cfg::A_BYTES / 2;
  const uint32_t halves = uint32_t(blk0 >= 0) | (uint32_t(blk1 >= 0) << 1);
  ptx::st_shared_u32(flag, halves);
  ptx::mbar_arrive_expect_tx(bar, Cfg::B_BYTES + uint32_t(__popc(halves)) * HALF);
  auto load = [&](int r, bool multicast) {
    const int x = h * Cfg::KS, y = (r == 0 ? blk0 : blk1) * (Cfg::BM / 2);
    const uint32_t dst = a_stage + uint32_t(r) * HALF;
    if constexpr (Cfg::CL > 1) {
      if (multicast) {
        ptx::tma_load_2d_multicast_hint(dst, tm_a, bar, x, y, uint16_t((1u << Cfg::CL) - 1), ptx::l2_policy_evict_last());
        return;
      }
    }
    load_a_box<Cfg>(dst, tm_a, bar, x, y);
  };
  if (Cfg::CL > 1 && p.cluster_mode == 0) {  // each CTA of the pair multicasts its own half
    if ((halves >> rank) & 1) load(rank, true);
  } else {
    for (int r = 0; r < 2; ++r)
      if ((halves >> r) & 1) load(r, false);
  }
}

// The producer of row pairs: produce()'s loop, but the warp stages 32 positions at a time in shared
// memory (pair_stash) and lane 0 reads each there, instead of three index registers per lane carried
// across the loop and the next item's prefetched (the 40-register producer spilled with them). The
// item and index loads are not hidden a whole item ahead: with 48 KB stages the producer waits on
// free slots most of the time, and the stages in flight cover the loads.
template <class Cfg>
__device__ __forceinline__ void produce_pairs(const CUtensorMap* tm_a, const CUtensorMap* tm_b, const Params& p,
                                              int first, int last, uint32_t s_a, uint32_t s_b, uint32_t full,
                                              uint32_t empty) {
  const int lane = threadIdx.x % 32;
  kit::Ring<Cfg::STAGES> ring;
  const int rank = Cfg::CL > 1 ? int(ptx::cluster_ctarank()) : 0;
  const uint32_t stash = pair_stash<Cfg>(empty);
  for (int it = first; it < last; ++it) {
    const int4 w = p.items[it];
    for (int j0 = w.z; j0 < w.w; j0 += 32) {
      const int count = min(32, w.w - j0);
      if (lane < count) {
        ptx::st_shared_u32(stash + 16 * lane, uint32_t(p.col_idx[j0 + lane]));
        const int2 b = p.pair_blk[j0 + lane];
        ptx::st_shared_v2(stash + 16 * lane + 8, b.x, b.y);
      }
      __syncwarp();
      if (lane == 0) {
        for (int t = 0; t < count; ++t) {
          const int col = int(ptx::ld_shared_u32(stash + 16 * t));
          const int2 b = ptx::ld_shared_v2(stash + 16 * t + 8);
          for (int h = 0; h < p.kslices; ++h) {
            const uint32_t bar = full + 8 * ring.stage;
            ptx::mbar_wait_or_trap(empty + 8 * ring.stage, ring.phase ^ 1, kit::kWaitLimit);
            load_pair_halves<Cfg>(tm_a, p, bar, s_a + ring.stage * Cfg::A_BYTES, h, b.x, b.y, rank,
                                  half_flags<Cfg>(empty) + 4 * ring.stage);
            load_b_slice<Cfg>(tm_b, p, bar, s_b + ring.stage * Cfg::B_BYTES, w.y + rank * Cfg::BN,
                              col * p.bk + h * Cfg::KS);
            ring.advance();
          }
        }
      }
      __syncwarp();  // lane 0 is done with the stash before it is refilled
    }
  }
}

}  // namespace sparsek::dsd_sm90
