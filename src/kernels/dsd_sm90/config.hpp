// Hopper DSD: what is built (the one config table: the generated instance files, pick() and
// why_not all read it), each configuration's compile-time constants, and the parameters and
// schedule the host and the kernel share. docs/design/dsd_sm90.md says how the kernel works.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "kernels/sm90/kit/launch.hpp"
#include "kernels/sm90/kit/smem.cuh"
#include "kernels/sm90/kit/tile.cuh"
#include "kernels/sm90/kit/tma.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek::dsd_sm90 {

// ---------------------------------------------------------------------------------------------
// The config table. One compiled kernel per built Key. f16 or bf16 C is a run-time choice inside
// one kernel (Params::out_bf16: the two have the same width, so only the conversion instruction
// differs); a template per output dtype would add a third of the kernels and their compile time.
// (The input dtype cannot be: a run-time choice of the wgmma type made ptxas insert warpgroup
// arrives and spill the accumulators.)

// The axes of the generated translation units (one per block height, stage depth and input dtype:
// all kernels in one file took six minutes to compile). src/CMakeLists.txt reads these two lines.
inline constexpr int kBlockRows[] = {32, 64, 128};
inline constexpr int kStageDepths[] = {32, 64};

struct Key {
  int bm = 0, ks = 0;       // op(A)'s block height; K extent of a stage (min(bk, 64))
  bool bf16 = false;        // bf16 (else f16) inputs
  int out_bytes = 2;        // 4: f32 C; 2: f16 or bf16 C
  int cluster = 1;          // CTAs per cluster (2: a pair sharing A by multicast)
  bool a_mn = false;        // op(A) = A^T: MN-major A tiles through the transposed pattern
  bool b_k = false;         // B column-major: K-major B tiles
  bool c_col = false;       // C column-major: the store boxes run down C's columns
  int tile_n = 256;         // N extent of a work tile
  bool c_tma_only = false;  // C the TMA can store: no copy of C by the threads compiled in
  constexpr bool operator==(const Key& o) const {
    return bm == o.bm && ks == o.ks && bf16 == o.bf16 && out_bytes == o.out_bytes && cluster == o.cluster &&
           a_mn == o.a_mn && b_k == o.b_k && c_col == o.c_col && tile_n == o.tile_n && c_tma_only == o.c_tma_only;
  }
};

// Which keys are built. Every (block height, stage depth, dtype, C width, operand layouts) has the
// general kernel (256-column tiles, no cluster, C stored by TMA or copied by the threads). Beyond it,
// only where they measured faster and the targets need them (each family would otherwise add a
// quarter to a third of the kernels and their compile time):
//  - CTA pairs (cluster 2, A multicast): bm = 128, 64-deep stages, K-major A (op none: DSD, and DDS
//    x * W^T);
//  - narrow 64- and 128-column tiles (decode: block-pruned weights are 64x64 or 128x128 blocks):
//    op none, bm >= 64, 64-deep stages, no cluster;
//  - kernels without the threads' copy of C: the 128-row wide-tile kernels with K-major A and
//    row-major 16-bit C (with or without CTA pairs; not f32 C: one of those spilled 20 bytes under
//    the consumer's 168 registers).
constexpr bool built(const Key& k) {
  const bool general = k.cluster == 1 && k.tile_n == 256 && !k.c_tma_only;
  const bool narrow = (k.tile_n == 64 || k.tile_n == 128) && k.bm >= 64 && k.ks == 64 && !k.a_mn && k.cluster == 1 &&
                      !k.c_tma_only;
  const bool big = k.bm == 128 && k.ks == 64 && !k.a_mn && k.tile_n == 256;
  const bool pair = big && k.cluster == 2 && !k.c_tma_only;
  const bool tma_only = big && k.c_tma_only && !k.c_col && k.out_bytes == 2;
  return general || narrow || pair || tma_only;
}

// Every key of the axes above, built or not, to f.
template <class F>
constexpr void visit_keys(F&& f) {
  for (int bm : kBlockRows)
    for (int ks : kStageDepths)
      for (int bf16 = 0; bf16 < 2; ++bf16)
        for (int out : {2, 4})
          for (int cl : {1, 2})
            for (int a_mn = 0; a_mn < 2; ++a_mn)
              for (int b_k = 0; b_k < 2; ++b_k)
                for (int c_col = 0; c_col < 2; ++c_col)
                  for (int tn : {64, 128, 256})
                    for (int only = 0; only < 2; ++only)
                      f(Key{bm, ks, bf16 != 0, out, cl, a_mn != 0, b_k != 0, c_col != 0, tn, only != 0});
}
inline constexpr int kNumConfigs = [] {
  int n = 0;
  visit_keys([&](const Key& k) { n += built(k) ? 1 : 0; });
  return n;
}();
inline constexpr std::array<Key, kNumConfigs> kConfigs = [] {
  std::array<Key, kNumConfigs> t{};
  int i = 0;
  visit_keys([&](const Key& k) {
    if (built(k)) t[size_t(i++)] = k;
  });
  return t;
}();

// ---------------------------------------------------------------------------------------------
// Compile-time configuration of one kernel.

constexpr int kThreads = 384;  // 3 warpgroups: producer, consumer 0, consumer 1

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
  // 1-3% on the H100 (docs/history/products.md, "The thread path for C"); built for those kernels only.
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
  // H100. The wide ones run 100s of us and keep their launch as it was (docs/history/products.md).
  static constexpr bool OVERLAP = BN <= 128;
  static constexpr int MI = SWAP ? BN / 64 : 1;       // wgmma (m64) instructions per k16 step
  static constexpr int WN = SWAP ? BM : BN;           // wgmma N
  static constexpr int ACC = WN / 2;                  // fp32 accumulators / thread / instruction
  static constexpr int ROWS = SWAP ? BM : 64;         // rows of C one consumer writes per item
  using ATile = kit::TileLayout<BM, KS, !A_MN>;       // A tile: (BM of M, KS of K)
  using BTile = kit::TileLayout<BN, KS, B_K>;         // B tile: (BN of N, KS of K)
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
  static constexpr int STAGES = std::min(12, (kit::kSmemPerBlock - E_TOTAL - 2048) / STAGE_BYTES);
  // Row pairs: a flag word per stage and the producer's stash of 32 16-byte positions (half_flags()).
  static constexpr int PAIR_BYTES = PAIRS_BUILT ? STAGES * 4 + 32 * 16 : 0;
  // Shared memory: A stages | B stages | C boxes [2 consumers][2][E_BYTES] | full[STAGES] |
  // empty[STAGES] | cload[2] (C boxes loaded for beta != 0) | row pairs only: a flag word per stage
  // and the producer's stash of 32 positions (producer.cuh's half_flags()).
  static constexpr kit::Region A = kit::first_region(STAGES * A_BYTES);
  static constexpr kit::Region B = A.then(STAGES * B_BYTES);
  static constexpr kit::Region E = B.then(E_TOTAL);
  static constexpr kit::Region FULL = E.then(8 * STAGES, 8);
  static constexpr kit::Region EMPTY = FULL.then(8 * STAGES, 8);
  static constexpr kit::Region CLOAD = EMPTY.then(16, 8);
  static constexpr kit::Region PAIRS = CLOAD.then(PAIR_BYTES, 8);
  static constexpr int SMEM = int(PAIRS.end()) + kit::kSmemAlignSlack;
  // L2 priorities: A loads evict_last (A is re-read once per N tile), C stores evict_first (never
  // read again): +1-2% on 128x64 / 128x128 blocks on the H100. Not for small stages: there the
  // single producer thread's issue rate is the limit, and the extra instructions cost 3-18%
  // (docs/history/products.md, fourth pass).
  static constexpr bool L2_HINTS = BM == 128 && KS == 64;

  static_assert(BM == 32 || BM == 64 || BM == 128, "bm must be 32, 64 or 128");
  static_assert(KS == 32 || KS == 64, "a stage is 32 or 64 wide in K (one swizzle row)");
  static_assert(A_BOX_BYTES % 1024 == 0 && B_CHUNK % 1024 == 0 && E_BYTES % 1024 == 0,
                "swizzled tiles must start 1024-byte aligned (descriptor base offset 0)");
  static_assert(!A_MN || CL == 1 || A_PART == ATile::CHUNK, "a CTA of a pair loads one 64-wide chunk of A");
  static_assert(STAGES >= 3, "the ring needs at least 3 stages to overlap load and math");
  static_assert(!PAIRS_BUILT || STAGES % 2 == 0, "the row-pair stash after the flag words must be 8-byte aligned");
  static_assert(SMEM <= kit::kSmemPerBlock, "shared memory per block on sm_90 is 227 KB");
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

template <int I>
using ConfigAt = Config<kConfigs[I].bm, kConfigs[I].ks, kConfigs[I].bf16,
                        std::conditional_t<kConfigs[I].out_bytes == 4, float, uint16_t>, kConfigs[I].cluster,
                        kConfigs[I].a_mn, kConfigs[I].b_k, kConfigs[I].c_col, kConfigs[I].tile_n,
                        kConfigs[I].c_tma_only>;

// Profiling build (-DSPARSEK_HOPPER_PROFILE, docs/design/dsd_sm90.md): clock64() counters summed over
// the CTAs: what consumer warpgroup 1 waits on and what the producer waits on.
enum ProfSlot { kProfConsumer, kProfFullWait, kProfEpilogue, kProfPartial, kProfProducer, kProfEmptyWait, kProfSlots };
#ifdef SPARSEK_HOPPER_PROFILE
#define SK_PROF(...) __VA_ARGS__
#else
#define SK_PROF(...)
#endif

// ---------------------------------------------------------------------------------------------
// Host side of the kernels.

// What a launch needs of the plan's schedule (prepare() builds it; device pointers).
struct LaunchState {
  int64_t mb = 0, n = 0, nnzb = 0;  // what it was built for (run() checks it)
  int bm = 0, bk = 0;
  bool trans = false;
  int grid = 0;
  int cluster_mode = 0;  // Params::cluster_mode
  int cluster = 1;       // CTAs per cluster (Config::CL)
  int tile_n = 256;      // N extent of a work tile (Config::BN)
  // Narrow tiles launched with programmatic stream serialization: the kernel may start while the
  // kernel ahead of it in the stream finishes (it waits for it before touching user memory).
  bool overlap = true;
  int4* items = nullptr;
  int* cta_items = nullptr;
  int* col = nullptr;        // op T: the transposed pattern's block columns (Params::col_idx); row pairs: the union's
  int* perm = nullptr;       // op T: Params::perm
  int2* pair_blk = nullptr;  // row pairs (Params::pair_blk); null otherwise
  int* slot_of = nullptr;    // split rows (Params::slot_of); null when nothing was split
  int4* groups = nullptr;    // split items for hopper_split_reduce
  int ngroups = 0;
  float* partials = nullptr;
  void* packed_b = nullptr;  // B packed into aligned lines (variant.cu's packed_b_ld())
  bool pack_lines128 = false;
  unsigned long long* prof = nullptr;  // profiling build: ProfSlot counters (Params::prof)
};

// C (the DSD view's) that the epilogue can store through the TMA.
// One compiled kernel, as the host drives it. g: the DSD view (variant.cu's dsd_shape()).
struct Kernel {
  Key key;
  kit::KernelInfo info;
  void (*launch)(const GemmArgs& g, const LaunchState& s, cudaStream_t stream) = nullptr;
  int partial_bytes = 0;  // split rows: one partial slot, per CTA of a cluster
};

// Fills table[i] for every kConfigs[i] of this (block height, stage depth, dtype): defined in
// kernel.cuh, instantiated by the generated translation units only.
template <int BM, int KS, bool BF16>
void add_instances(Kernel* table);
// The kernel built for key, or null.
const Kernel* find_kernel(const Key& key);

}  // namespace sparsek::dsd_sm90
