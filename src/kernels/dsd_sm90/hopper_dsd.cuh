// Hopper (sm_90a) DSD kernels: C = alpha * op(A) * B + beta * C with A in BSR, B and C dense, all
// on the device. fp16 / bf16 inputs, fp32 accumulation, f16 / bf16 / f32 output. DDS runs here too,
// as the DSD on the transposes (as_dsd(): C^T = op(B)^T * A^T, only the views change); SDD has its
// own kernel (hopper_sdd_sm90.cu) behind the same variant.
//
// Shape of the computation (docs/KERNELS.md "Hopper sm90 DSD" holds the ladder and the numbers):
//  - A work item is (block row r of op(A), N tile n0): C[r*bm : (r+1)*bm, n0 : n0+BN]. Its K loop
//    walks the row's stored blocks j in [row_ptr[r], row_ptr[r+1]), in K slices of KS = min(bk, 64)
//    (bm x bk: op(A)'s block shape). op(A) = A^T walks the transposed pattern plan() built once
//    (block rows of A^T, and perm: where each block sits in A's values); no values are copied.
//  - A values [nnzb][bm][bk] are one 2-D tensor (nnzb*bm) x bk: slice h of block j is one TMA box
//    at (h*KS, j*bm), K-major in shared memory. op(A) = A^T reads the same tensor as KS rows of the
//    stored block (M contiguous: an MN-major tile, read through the wgmma transpose bit).
//    B row-major (K x N) gives slice h of block j as BN/64 boxes of (KS x 64) at rows
//    col_idx[j]*bk + h*KS (MN-major); B column-major gives one box (KS x BN) of its N rows
//    (K-major). 128-byte swizzle (64-byte where a tile row is 32 elements).
//  - A ring of STAGES shared-memory stages on raw mbarriers. Warpgroup 0 produces (one thread
//    issues the TMA loads); warpgroups 1 and 2 consume with wgmma straight from shared memory.
//    bm = 128: both consumers work on every item, 64 rows each (tile 128 x 256). bm <= 64: each
//    consumer owns every other item of its CTA (ping-pong): the ring is one FIFO, so the main
//    loops take turns and one consumer's epilogue runs under the other's math.
//  - Epilogue: accumulators -> swizzled shared boxes -> TMA stores (full 128-byte L2 rows), in
//    C's orientation (row- or column-major); C that TMA cannot store (unaligned base, leading
//    dimension or N) leaves through the same boxes, copied out by the consumer's threads.
//  - B not TMA-aligned (base address or leading dimension not a multiple of 16 bytes): run() first
//    packs it into workspace in lines that do not straddle L2 lines (pack_lines.cu) and the product
//    reads that.
//  - Persistent grid: prepare() builds the schedule (src/plan/schedule.cpp: N-tile-major, a long
//    item moved ahead just far enough to end with its tile, each item to the least-loaded CTA); the producer
//    streams across work items, so a short row does not pay the pipeline fill.
//  - Narrow tiles (N <= 128, decode) are launched with programmatic stream serialization: their
//    CTAs start and set up while the kernel ahead of them finishes, then wait for it before they
//    touch user memory.
//  - Split rows: an item much longer than one CTA's share of the work (few N tiles, a dominant
//    row) is cut into pieces along its blocks; pieces write raw fp32 sums to partial slots and a
//    second, small launch adds each item's slots in a fixed order and writes C (deterministic).
//  - bm = 32 swaps A and B: the tile is computed as C^T (256 x 32) so that the wide N side is the
//    wgmma M side (wgmma needs M = 64).
//  - Row pairs (64-row blocks whose neighbouring rows share most columns; prepare() decides): the
//    128-row kernel runs block rows 2x and 2x + 1 over the union of their columns, one 64-row half
//    of the A tile per row, so that each B panel is loaded once for both; a half with no block
//    there is not loaded and its consumer skips the stage (produce_pairs(), dev::mainloop()).
//
// This header is the kernels' source; it is compiled only by the generated instance files (see
// hopper_dsd.hpp), each of which instantiates pick_kernel() for one (BM, KS, input dtype).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include "core/device.hpp"
#include "kernels/dtype.cuh"
#include "kernels/sm90/kit/ring.cuh"
#include "kernels/sm90/kit/tma.hpp"
#include "kernels/sm90/kit/tile.cuh"
#include "kernels/dsd_sm90/hopper_dsd.hpp"
#include "kernels/ptx/async.cuh"
#include "kernels/ptx/wgmma.cuh"

namespace sparsek {
// Device side in a named namespace: members unused by the sm_80 pass would warn (#177) in an
// unnamed one.
namespace sm90 {

// ---------------------------------------------------------------------------------------------
// Compile-time configuration: one per (bm, KS, input dtype, output width, cluster, operand layouts).
// f16 or bf16 C is a run-time choice inside one kernel (Params::out_bf16: the two have the same
// width, so only the conversion instruction differs); a template per output dtype would add a third
// of the kernels and their compile time. (The input dtype cannot be: a run-time choice of the wgmma
// type made ptxas insert warpgroup arrives and spill the accumulators.)

constexpr int kThreads = 384;                // 3 warpgroups: producer, consumer 0, consumer 1
constexpr int kSmemLimit = 227 * 1024;       // per block on sm_90 (opt-in)

template <int BM_, int KS_, bool BF16_, class TOut_, int CL_, bool A_MN_, bool B_K_, bool C_COL_, int BN_ = 256,
          bool C_TMA_ = false>
struct Config {
  static constexpr int BM = BM_;   // rows of a work tile = rows of op(A)'s blocks
  static constexpr int KS = KS_;   // K extent of one pipeline stage
  static constexpr bool BF16 = BF16_;  // bf16 (else f16) inputs
  using TOut = TOut_;              // float (f32 C) or uint16_t (f16 / bf16 C)
  static constexpr bool A_MN = A_MN_;  // op(A) = A^T: A's tile is MN-major (M contiguous)
  static constexpr bool B_K = B_K_;    // B column-major: B's tile is K-major
  // C column-major: the store boxes run down C's columns. A compile-time choice: one kernel holding
  // the epilogues of both orientations spilled 180 bytes (bm = 64) under the consumer's 168
  // registers; one orientation with its TMA-or-threads choice does not spill.
  static constexpr bool C_COL = C_COL_;
  // C that the TMA can store (c_tma_storable()) only: the epilogue has no copy by the threads. Each
  // box of the general kernel chooses between the two at run time, which cost the 128-row kernels
  // 1-3% on the H100 (docs/KERNELS.md, "The thread path for C"); built for those kernels only.
  static constexpr bool C_TMA_ONLY = C_TMA_;
  static constexpr bool SWAP = BM == 32;  // compute C^T tiles: N is the wgmma M side
  // bm = 128: both consumers run every item, 64 rows each (cooperative). bm <= 64: each consumer
  // owns every other item (ping-pong).
  static constexpr bool COOP = BM == 128;
  // Row pairs (Params::pair_blk): a 128-row tile over two 64-row block rows, one half each; only
  // the cooperative wide-tile kernels with K-major A carry that code.
  static constexpr bool PAIRS_BUILT = COOP && !A_MN_ && BN_ == 256;
  // N extent of a work tile: 256, or 64 / 128 for N <= 64 / N <= 128 (decode: a few columns, where
  // a 256-wide tile would spend 2-256x the tensor work and the stage bytes on columns that do not
  // exist, and two 64-wide tiles would read A twice).
  static constexpr int BN = BN_;
  // Narrow tiles (decode: a few microseconds a call) may start while the kernel ahead of them in
  // the stream finishes (see the kernel): 1.3-1.9 us a call in a stream of decode calls on the
  // H100. The wide ones run 100s of us and keep their launch as it was (docs/KERNELS.md).
  static constexpr bool OVERLAP = BN <= 128;
  static constexpr int MI = SWAP ? BN / 64 : 1;       // wgmma (m64) instructions per k16 step
  static constexpr int WN = SWAP ? BM : BN;           // wgmma N
  static constexpr int ACC = WN / 2;                  // fp32 accumulators / thread / instruction
  static constexpr int ROWS = SWAP ? BM : 64;         // rows of C one consumer writes per item
  using ATile = dev::TileLayout<BM, KS, !A_MN>;       // A tile: (BM of M, KS of K)
  using BTile = dev::TileLayout<BN, KS, B_K>;         // B tile: (BN of N, KS of K)
  static constexpr int A_BYTES = ATile::BYTES;
  // CL = 2 (bm = 128; the default for 128x128 blocks, see prepare()): two CTAs of a cluster run
  // the same block row on neighbouring N tiles; each loads half of every A tile and multicasts it
  // to both.
  static constexpr int CL = CL_;                      // CTAs per cluster (sharing A)
  static constexpr int A_PART = A_BYTES / CL;         // the part of the A tile one CTA of the cluster loads
  // A boxes per stage and CTA: K-major one (BM / CL rows); MN-major one per 64-wide chunk (with a
  // cluster: this CTA's chunk).
  static constexpr int A_BOXES = A_MN && CL == 1 ? ATile::CHUNKS : 1;
  static constexpr int A_BOX_BYTES = A_BYTES / (A_BOXES * CL);
  static constexpr int B_CHUNK = BTile::CHUNK;        // MN-major: one box (KS rows, 64 cols)
  static constexpr int B_BYTES = BTile::BYTES;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  // Epilogue staging: per consumer two (ROWS x 128 B) boxes, 128B-swizzled, stored by TMA.
  static constexpr int CW = 128 / int(sizeof(TOut));  // elements per 128-byte box line
  static constexpr int E_BYTES = ROWS * 128;
  // Column-major C: a box line is a column piece of COL_IW rows (COL_LB bytes), COL_OL columns.
  static constexpr int COL_IW = CW < ROWS ? CW : ROWS;
  static constexpr int COL_LB = COL_IW * int(sizeof(TOut));
  static constexpr int COL_OL = E_BYTES / COL_LB;
  static constexpr int E_TOTAL = 2 * 2 * E_BYTES;
  static constexpr int STAGES = std::min(12, (kSmemLimit - E_TOTAL - 2048) / STAGE_BYTES);
  // Row pairs: a flag word per stage and the producer's stash of 32 16-byte positions (half_flags()).
  static constexpr int PAIR_BYTES = PAIRS_BUILT ? STAGES * 4 + 32 * 16 : 0;
  static constexpr int SMEM = STAGES * STAGE_BYTES + E_TOTAL + 2 * STAGES * 8 + 16 + PAIR_BYTES + 1024;  // + align
  // L2 priorities: A loads evict_last (A is re-read once per N tile), C stores evict_first (never
  // read again): +1-2% on 128x64 / 128x128 blocks on the H100. Not for small stages: there the
  // single producer thread's issue rate is the limit, and the extra instructions cost 3-18%
  // (docs/KERNELS.md, fourth pass).
  static constexpr bool L2_HINTS = BM == 128 && KS == 64;

  static_assert(BM == 32 || BM == 64 || BM == 128, "bm must be 32, 64 or 128");
  static_assert(KS == 32 || KS == 64, "a stage is 32 or 64 wide in K (one swizzle row)");
  static_assert(A_BOX_BYTES % 1024 == 0 && B_CHUNK % 1024 == 0 && E_BYTES % 1024 == 0,
                "swizzled tiles must start 1024-byte aligned (descriptor base offset 0)");
  static_assert(!A_MN || CL == 1 || A_PART == ATile::CHUNK, "a CTA of a pair loads one 64-wide chunk of A");
  static_assert(STAGES >= 3, "the ring needs at least 3 stages to overlap load and math");
  static_assert(!PAIRS_BUILT || STAGES % 2 == 0, "the row-pair stash after the flag words must be 8-byte aligned");
  static_assert(SMEM <= kSmemLimit, "shared memory per block on sm_90 is 227 KB");
  static_assert(MI * ACC <= 128, "accumulators must fit the consumer's 232-register budget");
  static_assert(CL == 1 || (CL == 2 && COOP), "clusters only for the cooperative bm = 128 layout");
  static_assert(BN == 256 || ((BN == 64 || BN == 128) && !SWAP && CL == 1), "narrow tiles: bm >= 64, no cluster");
  static constexpr int BOXES = BN / CW;               // store boxes per consumer and item
};

// Work item: x = block row, y = first column n0, z = first stored block, w = end stored block.
struct Params {
  const int4* items;      // [total items], grouped by CTA
  const int* cta_items;   // [grid + 1]: CTA b runs items [cta_items[b], cta_items[b + 1])
  const int* col_idx;     // [nnzb]: the block column of op(A) (op T: of the transposed pattern)
  // NOTE: op T never runs row pairs, so the two share a field: Params past 128 bytes made ptxas
  // spill in the 64-row kernels with f32 column-major C.
  union {
    const int* perm;      // op T: [nnzb], where block j of the transposed pattern sits in A's values
    // Row pairs (128-row kernels over a pattern of 64-row blocks, see RowPairs in
    // src/plan/schedule.hpp; null otherwise): an item's block row x is the pair (2x, 2x + 1), its
    // positions index col_idx (the pairs' union columns) and pair_blk: the stored block of each row
    // there (-1: none; that half of the A tile is not loaded and its consumer skips the stage).
    const int2* pair_blk;
  };
  void* c;                // C(m, n) at c[m * c_rs + n * c_cs]
  int64_t c_rs, c_cs;
  int n;                  // N
  int m;                  // M (rows of C): a pair's second block row may lie past it
  int bk;                 // op(A)'s block depth
  int kslices;            // bk / KS: stages per stored block
  int c_pairs;            // direct stores: an accumulator pair is two adjacent, aligned elements
  int tma_store;          // 1: C is TMA-aligned: the epilogue stores through tm_c
  int b3d;                // 1: tm_b is 3-D (64 columns, K, N / 64 chunks): one TMA per stage for B
  int cluster_mode;       // CL = 2 diagnostics: 0 multicast, 1 each CTA loads all of A alone
                          // (no coupling), 2 each loads all of A but slots are freed pairwise
  int out_bf16;           // bf16 (else f16) C when TOut is 16-bit
  float alpha, beta;
  // Split rows (null when the schedule split nothing): per item, the partial slot its raw sums go
  // to (-1: a whole item, written to C here). hopper_split_reduce then sums each split item's
  // slots in order and writes C.
  const int* slot_of;
  float* partials;        // [slot][CTA of the cluster][consumer][MI * ACC / 4][128 threads] float4
  unsigned long long* prof;  // profiling build: [kProfSlots] counters (else null)
};

// NOTE: Params past 128 bytes made ptxas spill in the 64-row kernels (f32 column-major C).
static_assert(sizeof(Params) == 128, "a new Params field must fill a hole or replace one");

// ---------------------------------------------------------------------------------------------
// Device code (sm_90a only; the sm_80 pass compiles an empty kernel).

// Profiling build (-DSPARSEK_HOPPER_PROFILE): counters into Params::prof (ProfSlot). Off: no code.
#ifdef SPARSEK_HOPPER_PROFILE
#define SK_PROF(...) __VA_ARGS__
#else
#define SK_PROF(...)
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

using dev::kWaitLimit;
using dev::out_load;
using dev::out_load2;
using dev::out_store;
using dev::out_store2;

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
  dev::Ring<Cfg::STAGES> ring;
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
            ptx::mbar_wait_or_trap(empty + 8 * stage, phase ^ 1, kWaitLimit);
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
  dev::Ring<Cfg::STAGES> ring;
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
            ptx::mbar_wait_or_trap(empty + 8 * ring.stage, ring.phase ^ 1, kWaitLimit);
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

// Byte offset of (line, byte) in a TMA box of LB-byte lines, swizzled as the TMA writes and reads
// it: 16-byte granules XOR-ed with address bits 7.. (128B: line % 8; 64B: (line / 2) % 4).
template <int LB>
__device__ __forceinline__ int box_offset(int line, int byte) {
  const int o = line * LB + byte;
  return o ^ (((o >> 7) & (LB / 16 - 1)) << 4);
}

// Which store box a fragment (mi, j, h) of this warp falls in, along one side of the box: x is
// the fragment's first coordinate on that side without the lane's part (which is < 8 and never
// crosses a box edge: edges are multiples of 32). Along the side that holds the warp's 16 rows
// (m, or n when swapped) that is X64 (a multiple of 64, compile-time) + warp * 16 + h * 8.
// NOTE: written so that ptxas sees compile-time values and the (uniform) warp index only: a test
// on each element's full coordinates compiled, for column-major C, to a branch per accumulator
// pair in every box (4x the instructions, instruction-cache misses): 340 instead of 585 effective
// TFLOPS at 8192^3 128x128 (docs/KERNELS.md, "Column-major C").
template <int S>
__device__ __forceinline__ int box_of_warp_side(int x64, int warp) {
  static_assert(S == 32 || S == 64, "store boxes are 32 or 64 elements along each side");
  return S == 64 ? x64 / 64 : x64 / 32 + warp / 2;  // warp * 16 + h * 8 < 64; (..) / 32 = warp / 2
}
template <class Cfg>
__device__ __forceinline__ bool in_box(int k, int mi, int j, int warp) {
  constexpr bool C_COL = Cfg::C_COL;
  if constexpr (C_COL) {  // box k: rows (k % IC) * IW + [0, IW), columns (k / IC) * OL + [0, OL)
    constexpr int IW = Cfg::COL_IW, OL = Cfg::COL_OL, IC = Cfg::ROWS / IW;
    const int r_box = Cfg::SWAP ? (j * 8) / IW : IC == 1 ? 0 : box_of_warp_side<IW>(0, warp);
    const int n_box = Cfg::SWAP ? box_of_warp_side<OL>(mi * 64, warp) : (j * 8) / OL;
    return r_box == k % IC && n_box == k / IC;
  } else {  // box k: columns k * CW + [0, CW) of all ROWS rows
    return (Cfg::SWAP ? box_of_warp_side<Cfg::CW>(mi * 64, warp) : (j * 8) / Cfg::CW) == k;
  }
}

// C that TMA cannot store (a base address, leading dimension or line length that is not a
// 16-byte multiple) goes through the same shared-memory boxes, copied to and from C by the
// consumer's threads instead of the TMA: a warp per line, lane l on elements l and l + 32 (each
// warp instruction touches 64 or 128 contiguous bytes of C), masked past N. Raw element copies:
// the conversion and beta happen in the box exactly as on the TMA path (same rounding).
template <class Cfg, bool LOAD>
__device__ __forceinline__ void copy_box(uint8_t* buf, const Params& p, int c0, int c1, int warp, int lane) {
  constexpr bool C_COL = Cfg::C_COL;
  using T = typename Cfg::TOut;
  constexpr int ES = int(sizeof(T));
  constexpr int IW = C_COL ? Cfg::COL_IW : Cfg::CW, LB = IW * ES, OL = C_COL ? Cfg::COL_OL : Cfg::ROWS;
  T* const c = static_cast<T*>(p.c);
  const int64_t ld = C_COL ? p.c_cs : p.c_rs;
#pragma unroll 4
  for (int l = warp; l < OL; l += 4) {
    const int line = c1 + l;  // a row of C (row-major) or a column (column-major)
#pragma unroll
    for (int e = 0; e < IW / 32; ++e) {
      const int q = lane + 32 * e, pos = c0 + q;
      // A row pair's second block row may lie past M (an odd number of block rows); other tiles'
      // rows always exist (M = block rows * bm).
      const bool inside = (C_COL ? line : pos) < p.n && (!Cfg::PAIRS_BUILT || (C_COL ? pos : line) < p.m);
      T* const sh = reinterpret_cast<T*>(buf + box_offset<LB>(l, q * ES));
      T* const gl = c + int64_t(line) * ld + pos;
      if constexpr (LOAD)
        *sh = inside ? *gl : T(0);
      else if (inside)
        *gl = *sh;
    }
  }
}

// The TMA half of a staged box: C's box TMA-loaded into the buffer (beta != 0), and the filled
// buffer stored. Both epilogues below use them.
template <class Cfg>
__device__ __forceinline__ void tma_load_box(const CUtensorMap* tm_c, uint32_t buf_s, int c0, int c1, int tid,
                                             uint32_t c_bar, uint32_t& c_phase) {
  if (tid == 0) {
    ptx::mbar_arrive_expect_tx(c_bar, Cfg::E_BYTES);
    ptx::tma_load_2d(buf_s, tm_c, c_bar, c0, c1);
  }
  ptx::mbar_wait_or_trap(c_bar, c_phase, kWaitLimit);
  c_phase ^= 1;
}
template <class Cfg>
__device__ __forceinline__ void tma_store_box(const CUtensorMap* tm_c, uint32_t buf_s, int c0, int c1, int tid,
                                              int which) {
  ptx::fence_proxy_async_smem();  // the st.shared of the fill are read by the TMA (async proxy)
  ptx::named_barrier_sync(3 + which, 128);
  if (tid == 0) {
    if constexpr (Cfg::L2_HINTS)
      ptx::tma_store_2d_hint(tm_c, buf_s, c0, c1, ptx::l2_policy_evict_first());
    else
      ptx::tma_store_2d(tm_c, buf_s, c0, c1);
    ptx::bulk_commit_group();
  }
}

// Epilogue through shared memory and TMA stores: the tile goes out in boxes of whole 128-byte
// lines (one L2 request per line instead of eight 16-byte pieces), alternating between two
// swizzled buffers so that filling one overlaps the store of the other. Row-major C: box k is
// columns [k*CW, +CW) of the consumer's ROWS rows (a line is a row). Column-major C: box k is rows
// [(k % IC)*IW, +IW) of columns [(k / IC)*OL, +OL) (a line is a column). With beta != 0 the C box
// is first TMA-loaded into the same buffer (c_bar; phase c_phase) and updated in place.
// One box per instantiation: K must be a compile-time constant (a `#pragma unroll` over the boxes
// was not honoured for the larger bodies, which left a run-time membership test on every pair).
// READ_C (beta != 0) and OBF16 (bf16 rather than f16 C; unused for f32 C) are compile-time: as
// run-time tests ptxas re-evaluated both around every fragment (a branch and a constant load each),
// which made the fill ~25 instructions per two accumulator pairs (docs/KERNELS.md, "The epilogue's
// instructions per accumulator pair").
template <class Cfg, int K, bool READ_C, bool OBF16>
__device__ __forceinline__ void epilogue_box(float (&acc)[Cfg::MI][Cfg::ACC], const Params& p, float alpha,
                                             const CUtensorMap* tm_c, int row0, int n0, int which,
                                             uint8_t* ebuf, uint32_t ebuf_s, uint32_t c_bar, uint32_t& c_phase,
                                             bool tma) {
  using T = typename Cfg::TOut;
  constexpr bool C_COL = Cfg::C_COL;
  constexpr int ES = int(sizeof(T));
  constexpr int IW = C_COL ? Cfg::COL_IW : Cfg::CW;     // elements per line
  constexpr int LB = IW * ES;                           // bytes per line (128; 64 for 32-row pieces of 16-bit C)
  constexpr int OL = C_COL ? Cfg::COL_OL : Cfg::ROWS;   // lines per box
  constexpr int IC = C_COL ? Cfg::ROWS / IW : 1;        // column-major: boxes down one column group
  // A fragment's pair (e = 0, 1) is adjacent in a line when it runs along the line (non-swapped
  // pairs run along n, swapped ones along m). Otherwise it spans two lines, and lanes g and g ^ 1
  // (lane ^ 4), which are neighbours along the line, trade one value each: then every thread again
  // holds two neighbours of one line (one 4-byte store, 8-byte for f32, instead of two).
  constexpr bool PAIRED = C_COL == Cfg::SWAP;
  static_assert(OL * LB == Cfg::E_BYTES && (LB == 128 || LB == 64), "a box fills one staging buffer");
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const bool odd_g = (lane >> 2) & 1;
  constexpr bool read_c = READ_C;  // false (beta == 0): C is never read (NaN in C must not leak)
  uint8_t* buf = ebuf + (K & 1) * Cfg::E_BYTES;
  // Unswapped tiles: a pair's byte offset in the box is split into this thread's part, computed
  // once, and a compile-time part (fragment j, h), so that each pair costs one XOR and no swizzle
  // arithmetic. With line = line_rt + line_ct (line_ct a multiple of 8) and byte = byte_rt + byte_ct
  // (disjoint bits, byte_ct on whole 16-byte granules), box_offset<128>(line, byte) =
  // line_ct * 128 + ((line_rt * 128 + (byte_rt ^ X)) ^ byte_ct), X = (line_rt % 8) << 4 the swizzle.
  // Written as (thread part; compile-time part), g = lane / 4, t = lane % 4:
  //   row-major C (pairs along the line): line = (warp*16 + g; h*8), byte = (2t*ES; ((8j) % IW)*ES);
  //   column-major C (after the trade):   line = (2t + odd_g; (8j) % OL),
  //                                       byte = (((warp*16 + (g & ~1)) % IW)*ES; h*8*ES).
  [[maybe_unused]] int split_rt = 0;
  if constexpr (!Cfg::SWAP) {
    static_assert(LB == 128, "unswapped boxes have 128-byte lines");
    const int g = lane >> 2, t = lane & 3;
    if constexpr (PAIRED) {
      split_rt = (warp * 16 + g) * LB + ((2 * t * ES) ^ ((g & 7) << 4));
    } else {
      const int lrt = 2 * t + (odd_g ? 1 : 0);
      split_rt = lrt * LB + ((((warp * 16 + (g & ~1)) % IW) * ES) ^ (lrt << 4));
    }
  }
  const uint32_t buf_s = ebuf_s + (K & 1) * Cfg::E_BYTES;
  // The box's first element: c0 along C's contiguous dimension, c1 along the other.
  const int c0 = C_COL ? row0 + (K % IC) * IW : n0 + K * Cfg::CW;
  const int c1 = C_COL ? n0 + (K / IC) * OL : row0;
  // A pair's values (times alpha; where the pair spans two lines, even g keeps e0 and takes its
  // neighbour's e0, next along the line, and odd g keeps e1 and takes its neighbour's e1) and its
  // byte offset in the box.
  auto pair_values = [&](int mi, int j, int h, float& v0, float& v1) {
    v0 = alpha * acc[mi][4 * j + 2 * h];
    v1 = alpha * acc[mi][4 * j + 2 * h + 1];
    if constexpr (!PAIRED) {
      const float got = __shfl_xor_sync(0xffffffffu, odd_g ? v0 : v1, 4);
      if (odd_g)
        v0 = got;
      else
        v1 = got;
    }
  };
  auto pair_offset = [&](int mi, int j, int h) {
    if constexpr (Cfg::SWAP) {
      int r, n, r1, n1;
      dev::fragment_coord<Cfg::SWAP>(mi, j, h, 0, warp, lane, r, n);
      dev::fragment_coord<Cfg::SWAP>(mi, j, h, 1, warp, lane, r1, n1);
      int line = C_COL ? n % OL : r, pos = C_COL ? r % IW : n % IW;
      if (!PAIRED && odd_g) {
        line = C_COL ? n1 % OL : r1;
        pos = (C_COL ? r1 % IW : n1 % IW) - 1;
      }
      return box_offset<LB>(line, pos * ES);
    } else if constexpr (PAIRED) {
      return (split_rt ^ (((8 * j) % IW) * ES)) + h * 8 * LB;
    } else {
      return (split_rt ^ (h * 8 * ES)) + ((8 * j) % OL) * LB;
    }
  };
  // beta == 0 and 16-bit C: the pairs are converted and packed before the wait for the buffer below,
  // so that the conversion runs while the store of two boxes ago still reads it (that wait was the
  // epilogue's largest stall at 128x128).
  constexpr bool EARLY = !READ_C && sizeof(T) == 2;
  uint32_t packed[EARLY ? Cfg::MI * Cfg::ACC / 2 : 1];  // indexed by fragment: only the box's are live
  if constexpr (EARLY) {
#pragma unroll
    for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
      for (int j = 0; j < Cfg::ACC / 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!in_box<Cfg>(K, mi, j, warp)) continue;  // compile-time or warp-uniform
          float v0, v1;
          pair_values(mi, j, h, v0, v1);
          packed[(mi * (Cfg::ACC / 4) + j) * 2 + h] = dev::pack2<OBF16>(v0, v1);
        }
  }
  // The buffer was last used two boxes ago (an item of one box: one box ago): its store (or copy)
  // must have read it.
  if (tma && tid == 0) ptx::bulk_wait_group_read<Cfg::BOXES % 2 == 0 ? 1 : 0>();
  ptx::named_barrier_sync(3 + which, 128);
  if (read_c) {
    if (!tma) {
      copy_box<Cfg, true>(buf, p, c0, c1, warp, lane);
      ptx::named_barrier_sync(3 + which, 128);
    } else {
      tma_load_box<Cfg>(tm_c, buf_s, c0, c1, tid, c_bar, c_phase);
    }
  }
#pragma unroll
  for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
    for (int j = 0; j < Cfg::ACC / 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!in_box<Cfg>(K, mi, j, warp)) continue;  // compile-time or warp-uniform
        T* e0 = reinterpret_cast<T*>(buf + pair_offset(mi, j, h));
        if constexpr (EARLY) {
          *reinterpret_cast<uint32_t*>(e0) = packed[(mi * (Cfg::ACC / 4) + j) * 2 + h];
        } else {
          float v0, v1;
          pair_values(mi, j, h, v0, v1);
          if constexpr (read_c) {
            const float2 old = out_load2(e0, OBF16);
            v0 += p.beta * old.x;
            v1 += p.beta * old.y;
          }
          out_store2(e0, v0, v1, OBF16);
        }
      }
  if (!tma) {
    ptx::named_barrier_sync(3 + which, 128);
    copy_box<Cfg, false>(buf, p, c0, c1, warp, lane);
    return;
  }
  tma_store_box<Cfg>(tm_c, buf_s, c0, c1, tid, which);
}

template <class Cfg, bool READ_C, bool OBF16, int... K>
__device__ __forceinline__ void epilogue_boxes(std::integer_sequence<int, K...>, float (&acc)[Cfg::MI][Cfg::ACC],
                                               const Params& p, float alpha, const CUtensorMap* tm_c, int row0,
                                               int n0, int which, uint8_t* ebuf, uint32_t ebuf_s, uint32_t c_bar,
                                               uint32_t& c_phase, bool tma) {
  (epilogue_box<Cfg, K, READ_C, OBF16>(acc, p, alpha, tm_c, row0, n0, which, ebuf, ebuf_s, c_bar, c_phase, tma),
   ...);
}

// tma: C is TMA-aligned (Params::tma_store); else the boxes are copied by the threads (copy_box).
// beta != 0 and the 16-bit output dtype are chosen here, once per item (see epilogue_box).
template <class Cfg>
__device__ __forceinline__ void epilogue_boxed(float (&acc)[Cfg::MI][Cfg::ACC], const Params& p, float alpha,
                                               const CUtensorMap* tm_c, int row0, int n0, int which,
                                               uint8_t* ebuf, uint32_t ebuf_s, uint32_t c_bar, uint32_t& c_phase,
                                               bool tma) {
  auto boxes = [&](auto read_c, auto obf16) {
    epilogue_boxes<Cfg, decltype(read_c)::value, decltype(obf16)::value>(
        std::make_integer_sequence<int, Cfg::BOXES>{}, acc, p, alpha, tm_c, row0, n0, which, ebuf, ebuf_s, c_bar,
        c_phase, tma);
  };
  using T = std::true_type;
  using F = std::false_type;
  const bool read_c = p.beta != 0.f;
  if constexpr (sizeof(typename Cfg::TOut) == 4) {
    read_c ? boxes(T{}, F{}) : boxes(F{}, F{});
  } else if (read_c) {
    p.out_bf16 ? boxes(T{}, T{}) : boxes(T{}, F{});
  } else {
    p.out_bf16 ? boxes(F{}, T{}) : boxes(F{}, F{});
  }
}

// One accumulator pair (already times alpha) into C at tile coordinates (r, n) and (r1, n1): one
// 2-element access when the pair is adjacent and aligned, else element by element; beta * C added
// when beta != 0 (C is never read when beta == 0: NaN in C must not leak); columns past N skipped.
template <class Cfg>
__device__ __forceinline__ void store_pair(const Params& p, int row0, int n0, int r, int n, int r1, int n1, float v0,
                                           float v1) {
  using T = typename Cfg::TOut;
  T* c = static_cast<T*>(p.c);
  const bool read_c = p.beta != 0.f;
  const bool ok0 = n0 + n < p.n, ok1 = n0 + n1 < p.n;
  const int64_t off0 = int64_t(row0 + r) * p.c_rs + int64_t(n0 + n) * p.c_cs;
  const int64_t off1 = int64_t(row0 + r1) * p.c_rs + int64_t(n0 + n1) * p.c_cs;
  if (p.c_pairs && ok0 && ok1) {
    if (read_c) {
      const float2 old = out_load2(c + off0, p.out_bf16);
      v0 += p.beta * old.x;
      v1 += p.beta * old.y;
    }
    out_store2(c + off0, v0, v1, p.out_bf16);
  } else {
    if (ok0) out_store(c + off0, v0 + (read_c ? p.beta * out_load(c + off0, p.out_bf16) : 0.f), p.out_bf16);
    if (ok1) out_store(c + off1, v1 + (read_c ? p.beta * out_load(c + off1, p.out_bf16) : 0.f), p.out_bf16);
  }
}

// Split rows: a consumer's accumulators as float4 [MI * ACC / 4][128 threads] (thread-major, so
// a warp moves 512 contiguous bytes per access) in partial slot `slot` of this CTA and consumer.
template <class Cfg>
__device__ __forceinline__ float4* partial_slot(const Params& p, int slot, int rank, int which) {
  constexpr int NC = Cfg::COOP ? 2 : 1, V = Cfg::MI * Cfg::ACC / 4;
  const size_t base = (size_t(slot) * Cfg::CL + size_t(rank)) * NC + size_t(Cfg::COOP ? which : 0);
  return reinterpret_cast<float4*>(p.partials) + base * V * 128 + threadIdx.x % 128;
}

// A piece of a split item: its raw sums go to its slot (no alpha, no C).
template <class Cfg>
__device__ __forceinline__ void store_partial(float (&acc)[Cfg::MI][Cfg::ACC], const Params& p, int slot, int rank,
                                              int which) {
  float4* dst = partial_slot<Cfg>(p, slot, rank, which);
#pragma unroll
  for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
    for (int i = 0; i < Cfg::ACC; i += 4)
      __stcg(dst + ((mi * Cfg::ACC + i) / 4) * 128,
             make_float4(acc[mi][i], acc[mi][i + 1], acc[mi][i + 2], acc[mi][i + 3]));
}

// Consumer: one warpgroup. Cooperative (bm = 128): every item, rows 64*which.. of it. Ping-pong:
// the items of its parity, walking the ring in step with the producer (it skips the other
// consumer's stages by count).
// NOTE: a ping-pong consumer that skips ahead must not wait on a stage before the other consumer
// has seen every earlier stage complete: mbarrier parity waits cannot tell phase k from phase
// k - 2, so a wait two ring laps ahead would pass on a stale phase. Named barrier 1 + c ("consumer
// c may start") orders the two main loops; the signal goes out once the last stage of an item
// has been seen full (its math still runs), so the hand-over leaves the tensor cores no gap.
template <class Cfg>
__device__ __forceinline__ void consume(const CUtensorMap* tm_c, const Params& p, int first, int last, int which,
                                        uint32_t s_a, uint32_t s_b, uint32_t full, uint32_t empty, uint8_t* ebuf,
                                        uint32_t ebuf_s, uint32_t c_bar) {
  const int tid = threadIdx.x % 128;
  const bool pairs = Cfg::PAIRS_BUILT && p.pair_blk != nullptr;  // (PAIRS_BUILT: op none, perm unused)
  const bool tma = Cfg::C_TMA_ONLY || p.tma_store;  // a constant where C_TMA_ONLY: no threads' copy compiled
  dev::Ring<Cfg::STAGES> ring;
  uint32_t c_phase = 0;
  const int rank = Cfg::CL > 1 ? int(ptx::cluster_ctarank()) : 0;
  // A slot is free once every consumer of every CTA of the cluster is done with it (the peer's
  // multicast writes into this CTA's slot too).
  auto release = [&](uint32_t slot) {
    const uint32_t bar = empty + 8 * slot;
    ptx::mbar_arrive(bar);
    if constexpr (Cfg::CL > 1) {
      if (p.cluster_mode != 1)
        for (int r = 0; r < Cfg::CL; ++r)
          if (r != rank) ptx::mbar_arrive_cluster(ptx::map_to_rank(bar, uint32_t(r)));
    }
  };
  float acc[Cfg::MI][Cfg::ACC];
  SK_PROF(const long long t_start = clock64(); long long prof_full = 0, prof_epi = 0, prof_part = 0;)
#ifdef SPARSEK_HOPPER_PROFILE
  long long* const full_wait = &prof_full;
#else
  long long* const full_wait = nullptr;
#endif
  for (int it = first; it < last; ++it) {
    const int4 w = p.items[it];
    const int nst = (w.w - w.z) * p.kslices;
    if (!Cfg::COOP && ((it - first) & 1) != which) {
      ring.skip(uint32_t(nst));
      continue;
    }
    if (!Cfg::COOP && it > first) ptx::named_barrier_sync(1 + which, 256);  // other one saw item it-1
    const bool hand_over = !Cfg::COOP && it + 1 < last;  // the other consumer runs item it+1
    const bool used = dev::mainloop<Cfg>(acc, nst, ring, s_a, s_b, full, which, hand_over ? 2 - which : -1, release,
                                         pairs ? half_flags<Cfg>(empty) : 0u, full_wait);
    SK_PROF(const long long te = clock64();)
    const int row0 = w.x * Cfg::BM + (Cfg::COOP ? which * 64 : 0), n0 = w.y + rank * Cfg::BN;
    if (p.slot_of) {  // split rows: a piece leaves its sums to hopper_split_reduce
      const int slot = p.slot_of[it];
      if (slot >= 0) {
        store_partial<Cfg>(acc, p, slot, rank, which);
        SK_PROF(prof_part += clock64() - te;)
        continue;
      }
    }
    // A block row with no stored block is beta * C whatever alpha is (+-Inf or NaN times the empty
    // sum would make it NaN); with row pairs, one of the two rows may have none.
    const float alpha = used ? p.alpha : 0.f;
    epilogue_boxed<Cfg>(acc, p, alpha, tm_c, row0, n0, which, ebuf, ebuf_s, c_bar, c_phase, tma);
    SK_PROF(prof_epi += clock64() - te;)
  }
  SK_PROF(if (tid == 0 && which == 0) {
    atomicAdd(&p.prof[kProfConsumer], (unsigned long long)(clock64() - t_start));
    atomicAdd(&p.prof[kProfFullWait], (unsigned long long)prof_full);
    atomicAdd(&p.prof[kProfEpilogue], (unsigned long long)prof_epi);
    atomicAdd(&p.prof[kProfPartial], (unsigned long long)prof_part);
  })
  // The last TMA stores must finish before the CTA (and its shared memory) goes away.
  if (tma && tid == 0) ptx::bulk_wait_group<0>();
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_dsd_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                      const __grid_constant__ CUtensorMap tm_c, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // smem: A stages [STAGES][A_BYTES] | B stages [STAGES][B_BYTES] | C boxes [2 consumers][2][E_BYTES]
  //       | full[STAGES] | empty[STAGES] | cload[2] (C boxes loaded for beta != 0)
  //       | row pairs only: half flags[STAGES] | the producer's stash [32][16 B] (half_flags())
  const uint32_t raw = ptx::smem_addr(smem_raw);
  const uint32_t s_a = (raw + 1023u) & ~1023u;
  const uint32_t s_b = s_a + Cfg::STAGES * Cfg::A_BYTES;
  const uint32_t s_e = s_b + Cfg::STAGES * Cfg::B_BYTES;
  const uint32_t full = s_e + Cfg::E_TOTAL;
  const uint32_t empty = full + 8 * Cfg::STAGES;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::STAGES; ++s) {
      ptx::mbar_init(full + 8 * s, 1);                    // producer's arrive_expect_tx + TMA bytes
      // lane 0 of each consuming warp (of both CTAs of a pair unless cluster_mode 1)
      ptx::mbar_init(empty + 8 * s, (Cfg::COOP ? 8 : 4) * (p.cluster_mode == 1 ? 1 : Cfg::CL));
    }
    ptx::mbar_init(empty + 8 * Cfg::STAGES, 1);
    ptx::mbar_init(empty + 8 * Cfg::STAGES + 8, 1);
    ptx::fence_mbar_init();
  }
  // With a cluster, the peer must not multicast into barriers not yet initialised.
  if constexpr (Cfg::CL > 1)
    ptx::cluster_sync();
  else
    __syncthreads();
  // The CTAs of a cluster share one item list (and differ in N tile).
  const dev::ItemRange range = dev::item_range(p.cta_items, int(blockIdx.x / Cfg::CL));
  const int first = range.first, last = range.last;
  // Narrow tiles: programmatic dependent launch (launch() sets the attribute). This CTA may run
  // while the kernel ahead of it in the stream finishes. Everything above touched shared memory
  // and the plan's own item list only; every thread waits for that kernel before it reads or
  // writes user memory (the producer before the block indices, the consumers before C). The kernel
  // after this one may launch now: its CTAs take SMs as ours leave, and wait for ours in turn.
  if constexpr (Cfg::OVERLAP) {
    if (threadIdx.x == 0) ptx::launch_dependents();
  }
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<40>();
    if (threadIdx.x < 32) {
      if constexpr (Cfg::OVERLAP) ptx::grid_dependency_wait();
      if constexpr (Cfg::PAIRS_BUILT) {
        if (p.pair_blk) {
          produce_pairs<Cfg>(&tm_a, &tm_b, p, first, last, s_a, s_b, full, empty);
        } else {
          produce<Cfg>(&tm_a, &tm_b, p, first, last, s_a, s_b, full, empty);
        }
      } else {
        produce<Cfg>(&tm_a, &tm_b, p, first, last, s_a, s_b, full, empty);
      }
    }
    // A CTA stays until its peer no longer writes into it or arrives on its barriers.
    if constexpr (Cfg::CL > 1) ptx::cluster_sync();
  } else {
    ptx::setmaxnreg_inc<232>();
    if constexpr (Cfg::OVERLAP) ptx::grid_dependency_wait();
    const int which = threadIdx.x / 128 - 1;
    const uint32_t e = s_e + which * 2 * Cfg::E_BYTES;
    consume<Cfg>(&tm_c, p, first, last, which, s_a, s_b, full, empty, smem_raw + (e - raw), e,
                 empty + 8 * Cfg::STAGES + 8 * which);
    if constexpr (Cfg::CL > 1) ptx::cluster_sync();
  }
#endif
}

// Split rows, second launch: one CTA of 128 threads per (split item, CTA of the cluster, consumer,
// quarter of the fragment) sums the item's partial slots in slot order (the same order in every
// run: bit-identical) and writes C. Thread t reads the fragment registers consumer thread t
// stored, so the fragment coordinates (and store_pair) are the main kernel's. (One CTA per item
// measured 2.4x slower than uniform rows at N = 256: a few CTAs streaming all the partials.)
// group: {block row, N tile (of the cluster's first CTA), first slot, slots}.
template <class Cfg>
__global__ void __launch_bounds__(128) hopper_split_reduce(const int4* groups, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NC = Cfg::COOP ? 2 : 1, V = Cfg::MI * Cfg::ACC / 4, H = 8, PASSES = V / H;
  const int pass = int(blockIdx.x % PASSES), which = int(blockIdx.x / PASSES % NC);
  const int rank = int(blockIdx.x / (PASSES * NC) % Cfg::CL);
  const int4 gr = groups[blockIdx.x / (PASSES * NC * Cfg::CL)];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = gr.x * Cfg::BM + (Cfg::COOP ? which * 64 : 0), n0 = gr.y + rank * Cfg::BN;
  float4 sum[H];
#pragma unroll
  for (int u = 0; u < H; ++u) sum[u] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 2
  for (int k = 0; k < gr.w; ++k) {
    const float4* src = partial_slot<Cfg>(p, gr.z + k, rank, which) + pass * H * 128;
#pragma unroll
    for (int u = 0; u < H; ++u) {
      const float4 t = __ldcg(src + u * 128);
      sum[u].x += t.x;
      sum[u].y += t.y;
      sum[u].z += t.z;
      sum[u].w += t.w;
    }
  }
#pragma unroll
  for (int u = 0; u < H; ++u) {
    const int v = pass * H + u, mi = v / (Cfg::ACC / 4), j = v % (Cfg::ACC / 4);
    int r, n, r1, n1;
    dev::fragment_coord<Cfg::SWAP>(mi, j, 0, 0, warp, lane, r, n);
    dev::fragment_coord<Cfg::SWAP>(mi, j, 0, 1, warp, lane, r1, n1);
    store_pair<Cfg>(p, row0, n0, r, n, r1, n1, p.alpha * sum[u].x, p.alpha * sum[u].y);
    dev::fragment_coord<Cfg::SWAP>(mi, j, 1, 0, warp, lane, r, n);
    dev::fragment_coord<Cfg::SWAP>(mi, j, 1, 1, warp, lane, r1, n1);
    store_pair<Cfg>(p, row0, n0, r, n, r1, n1, p.alpha * sum[u].z, p.alpha * sum[u].w);
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side of one kernel: tensor maps, parameters, launch.


// A launch of `grid` CTAs of the kernel: in clusters of Cfg::CL when CL > 1, and with
// programmatic stream serialization when `overlap` (the kernel may start before the one ahead of
// it ends; see the kernel). attrs: storage for the attributes, which the config points to.
template <class Cfg>
cudaLaunchConfig_t launch_config(unsigned grid, cudaStream_t stream, cudaLaunchAttribute (&attrs)[2], bool overlap) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = Cfg::SMEM;
  cfg.stream = stream;
  cfg.attrs = attrs;
  if (Cfg::CL > 1) {
    cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = Cfg::CL;
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
  }
  if (overlap) {
    cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
  return cfg;
}

// g: the DSD view (dsd_shape().g).
template <class Cfg>
void launch(const GemmArgs& g, const HopperState& st, cudaStream_t stream) {
  const BsrView& a = g.sparse;
  using T = typename Cfg::TOut;
  CUtensorMap tm_a, tm_b, tm_c;  // a zero map is never used (no stored block / no TMA store)
  std::memset(&tm_a, 0, sizeof(tm_a));
  std::memset(&tm_b, 0, sizeof(tm_b));
  std::memset(&tm_c, 0, sizeof(tm_c));
  const bool b3d = !Cfg::B_K && g.b.cols % 64 == 0;
  if (a.nnzb > 0) {  // no stored block: the maps are never used (and a zero-size map is invalid)
    // vals: (nnzb * bm_stored, bk_stored). op none: boxes (KS, BM / CL) of a block's rows;
    // op T: boxes (64 or 32 of the stored columns, KS of the stored rows); row pairs: (KS, 64), a
    // half of the tile is one stored block's rows.
    const uint32_t box_inner = Cfg::A_MN ? uint32_t(Cfg::ATile::W) : uint32_t(Cfg::KS);
    const uint32_t box_outer = Cfg::A_MN ? uint32_t(Cfg::KS) : uint32_t(st.pair_blk ? Cfg::BM / 2 : Cfg::BM / Cfg::CL);
    tm_a = tma_map_2d(a.values, a.dtype, uint64_t(a.bk), uint64_t(a.nnzb) * a.bm, uint64_t(a.bk) * 2, box_inner,
                      box_outer, tma_swizzle(Cfg::ATile::ROW_BYTES), "A values");
    if constexpr (Cfg::B_K) {
      // B column-major: N rows of K, boxes (KS, BN)
      tm_b = tma_map_2d(g.b.data, a.dtype, uint64_t(g.b.rows), uint64_t(g.b.cols), uint64_t(g.b.ld) * 2, Cfg::KS,
                        Cfg::BN, tma_swizzle(Cfg::KS * 2), "B");
    } else {
      // NOTE: 3-D only when N is whole 64-column chunks: a partial last chunk would make the map
      // claim memory past column N of B's last row, which the caller need not have allocated.
      tm_b = tma_map_2d(g.b.data, a.dtype, uint64_t(g.b.cols), uint64_t(g.b.rows), uint64_t(g.b.ld) * 2, 64, Cfg::KS,
                        CU_TENSOR_MAP_SWIZZLE_128B, "B", b3d ? uint64_t(g.b.cols / 64) : 0, Cfg::BN / 64);
    }
  }
  Params p{};
  p.b3d = b3d;
  p.items = st.items;
  p.cta_items = st.cta_items;
  p.col_idx = st.trans || st.pair_blk ? st.col : a.col_idx;
  if (st.pair_blk && !Cfg::PAIRS_BUILT) throw Error(Status::internal, "hopper: row pairs need the 128-row wide-tile kernel");
  if (st.pair_blk)
    p.pair_blk = st.pair_blk;
  else
    p.perm = st.perm;
  p.c = g.c.data;
  const bool c_row = g.c.layout == Layout::row_major;
  if (c_row == Cfg::C_COL) throw Error(Status::internal, "hopper: kernel built for the other layout of C");
  p.c_rs = c_row ? g.c.ld : 1;
  p.c_cs = c_row ? 1 : g.c.ld;
  p.n = int(g.b.cols);
  p.m = int(g.c.rows);
  p.bk = st.bk;
  p.kslices = st.bk / Cfg::KS;
  // Direct stores: the pair of a fragment runs along n (along m when swapped); one 2-element
  // access when that direction is contiguous and every pair starts 2-element aligned.
  const bool contiguous = Cfg::SWAP ? !c_row : c_row;
  p.c_pairs = contiguous && (g.c.ld % 2 == 0) && (reinterpret_cast<uintptr_t>(g.c.data) % (2 * sizeof(T)) == 0);
  p.tma_store = c_tma_storable(g.c);
  if (Cfg::C_TMA_ONLY && !p.tma_store) throw Error(Status::internal, "hopper: TMA-only kernel for a C the TMA cannot store");
  if (p.tma_store && c_row)
    tm_c = tma_map_2d(g.c.data, g.c.dtype, uint64_t(g.c.cols), uint64_t(g.c.rows), uint64_t(g.c.ld) * sizeof(T),
                      Cfg::CW, Cfg::ROWS, CU_TENSOR_MAP_SWIZZLE_128B, "C");
  else if (p.tma_store)
    tm_c = tma_map_2d(g.c.data, g.c.dtype, uint64_t(g.c.rows), uint64_t(g.c.cols), uint64_t(g.c.ld) * sizeof(T),
                      Cfg::COL_IW, Cfg::COL_OL, tma_swizzle(Cfg::COL_LB), "C");
  p.out_bf16 = g.c.dtype == DType::bf16;
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.cluster_mode = st.cluster_mode;
  p.slot_of = st.slot_of;
  p.partials = st.partials;
  p.prof = st.prof;
  // (prepare() raised the kernel's shared-memory limit: run() stays capturable in a CUDA graph.)
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t cfg = launch_config<Cfg>(unsigned(st.grid), stream, attrs, Cfg::OVERLAP && st.overlap);
  check_cuda(cudaLaunchKernelEx(&cfg, &hopper_dsd_kernel<Cfg>, tm_a, tm_b, tm_c, p), "hopper_dsd_kernel launch");
  if (st.ngroups > 0) {
    const int per_group = Cfg::CL * (Cfg::COOP ? 2 : 1) * (Cfg::MI * Cfg::ACC / 32);  // see the kernel
    hopper_split_reduce<Cfg><<<st.ngroups * per_group, 128, 0, stream>>>(st.groups, p);
    check_cuda(cudaGetLastError(), "hopper_split_reduce launch");
  }
}

template <class Cfg>
void setup_kernel() {
  check_cuda(cudaFuncSetAttribute(&hopper_dsd_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM),
             "cudaFuncSetAttribute(hopper_dsd_kernel, max dynamic shared memory)");
}

template <class Cfg>
int max_clusters() {
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t cfg =
      launch_config<Cfg>(unsigned(Cfg::CL * std::max(1, device_info().sm_count / Cfg::CL)), nullptr, attrs, false);
  int n = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&n, &hopper_dsd_kernel<Cfg>, &cfg), "cudaOccupancyMaxActiveClusters");
  return n;
}

template <class Cfg>
Kernel kernel_of() {
  constexpr int partial = 128 * Cfg::MI * Cfg::ACC * int(sizeof(float)) * (Cfg::COOP ? 2 : 1);
  return {&launch<Cfg>, Cfg::SMEM, &setup_kernel<Cfg>, Cfg::CL, &max_clusters<Cfg>,
          reinterpret_cast<const void*>(&hopper_dsd_kernel<Cfg>), Cfg::BN, partial};
}

// Run-time -> compile time within one (BM, KS, input dtype): operand layouts, CTAs per cluster, C's
// layout and output width (f16 or bf16 C is a run-time parameter of the kernel).
template <int BM, int KS, int CL, bool BF16, bool AMN, bool BK, int BN = 256>
Kernel pick_out(bool c_col, DType out) {
  if (c_col)
    return out == DType::f32 ? kernel_of<Config<BM, KS, BF16, float, CL, AMN, BK, true, BN>>()
                             : kernel_of<Config<BM, KS, BF16, uint16_t, CL, AMN, BK, true, BN>>();
  return out == DType::f32 ? kernel_of<Config<BM, KS, BF16, float, CL, AMN, BK, false, BN>>()
                           : kernel_of<Config<BM, KS, BF16, uint16_t, CL, AMN, BK, false, BN>>();
}
template <int BM, int KS, bool BF16>
Kernel pick_kernel(bool trans, bool b_col, bool c_col, bool c_tma, int cluster, int tile_n, DType out) {
  // CTA pairs (cluster 2: A multicast) are built for bm = 128 with 64-deep stages and K-major A
  // tiles (op none: DSD, and DDS x * W^T): where they measured faster, and where the targets need
  // them. Instantiating them for every layout and stage depth would add a quarter of the kernels.
  // Narrow (64- and 128-column) tiles are built for op none, bm >= 64 and 64-deep stages: the
  // decode shapes (block-pruned weights are 64x64 or 128x128 blocks).
  if constexpr (BM >= 64 && KS == 64) {
    if (tile_n == 64 && !trans)
      return b_col ? pick_out<BM, KS, 1, BF16, false, true, 64>(c_col, out)
                   : pick_out<BM, KS, 1, BF16, false, false, 64>(c_col, out);
    if (tile_n == 128 && !trans)
      return b_col ? pick_out<BM, KS, 1, BF16, false, true, 128>(c_col, out)
                   : pick_out<BM, KS, 1, BF16, false, false, 128>(c_col, out);
  }
  if constexpr (BM == 128 && KS == 64) {
    // 16-bit row-major C that the TMA can store, on the wide-tile kernels with K-major A (the
    // 128-row DSD, with or without CTA pairs, and row pairs): kernels without the threads' copy of
    // C. (Not for f32 C: one of those spilled 20 bytes under the consumer's 168 registers.)
    if (c_tma && !c_col && !trans && tile_n == 256 && out != DType::f32) {
      if (cluster == 2)
        return b_col ? kernel_of<Config<BM, KS, BF16, uint16_t, 2, false, true, false, 256, true>>()
                     : kernel_of<Config<BM, KS, BF16, uint16_t, 2, false, false, false, 256, true>>();
      return b_col ? kernel_of<Config<BM, KS, BF16, uint16_t, 1, false, true, false, 256, true>>()
                   : kernel_of<Config<BM, KS, BF16, uint16_t, 1, false, false, false, 256, true>>();
    }
    if (cluster == 2 && !trans)
      return b_col ? pick_out<BM, KS, 2, BF16, false, true>(c_col, out) : pick_out<BM, KS, 2, BF16, false, false>(c_col, out);
  }
  if (trans) return b_col ? pick_out<BM, KS, 1, BF16, true, true>(c_col, out) : pick_out<BM, KS, 1, BF16, true, false>(c_col, out);
  return b_col ? pick_out<BM, KS, 1, BF16, false, true>(c_col, out) : pick_out<BM, KS, 1, BF16, false, false>(c_col, out);
}

}  // namespace sm90
}  // namespace sparsek
