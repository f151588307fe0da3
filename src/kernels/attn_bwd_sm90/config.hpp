// Hopper attention backward: what is built (the config table), each configuration's compile-time
// constants and shared-memory layout, and the parameters the host, the passes and the main kernel
// share. docs/design/attn_bwd_sm90.md says how it works.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/attn_fwd_sm90/config.hpp"
#include "kernels/sm90/kit/launch.hpp"
#include "kernels/sm90/kit/smem.cuh"
#include "kernels/sm90/kit/tile.cuh"
#include "kernels/sm90/kit/tma.hpp"
#include "sparsek/attention.hpp"

namespace sparsek::attn_bwd_sm90 {

// ---- the config table: the backward is built for every configuration of the forward (its why_not
// asks the forward's first) ----
using attn_fwd_sm90::Key;
using attn_fwd_sm90::kConfigs;
using attn_fwd_sm90::kNumConfigs;

template <int D_, int BLOCK_, bool BF16_>
struct Config {
  static constexpr int D = D_;
  static constexpr int BN = BLOCK_;  // keys of an item (= block_kv)
  static constexpr int BM = BLOCK_;  // rows of a query block (= block_q)
  static constexpr bool BF16 = BF16_;
  static constexpr int NWG = BN / 64;  // consumer warpgroups, 64 keys each
  static constexpr int THREADS = 128 * (NWG + 1);
  // Query rows per step: the S^T and dP^T accumulators (MS / 2 registers each) must fit beside dK
  // and dV (D / 2 each) and the step's dQ tile. 64 at D = 128; 128 at D = 64 with two warpgroups,
  // where 64 rows left each step's barriers, waits and dQ send over half the tensor work of D = 128
  // (FlashAttention-3 takes 128-row steps there too).
  static constexpr int MS = (D == 64 && NWG == 2) ? 128 : 64;
  static constexpr int SUB = BM / MS;           // steps per (query block, key block) pair
  // The operand tiles ([D / 64][rows][64] as a TMA box of a [B, H, S, D] tensor writes them) and how
  // each product reads them:
  using KRows = kit::TileLayout<BN, D, true>;     // S^T = K Q^T, dP^T = V dO^T: A (K or V), K-major
  using QRows = kit::TileLayout<MS, D, true>;     //                              B (Q or dO), K-major
  using QCols = kit::TileLayout<D, MS, false>;    // dV += P^T dO, dK += dS^T Q: B (dO or Q), MN-major
  using DsCols = kit::TileLayout<MS, BN, false>;  // dQ = dS K: A = dS^T [MS / 64][BN keys][64 queries], MN-major
  using KCols = kit::TileLayout<D, BN, false>;    //            B = K, MN-major
  static constexpr int KV_BYTES = KRows::BYTES;  // K or V
  static constexpr int QS_BYTES = QRows::BYTES;  // Q or dO step tile
  static constexpr int ROW_BYTES = MS * 16;      // a step's rows: {LSE2, Delta, dQ grid scale, 0}
  static constexpr int DS_BYTES = DsCols::BYTES;
  // A step's dQ (MS x D) is (MS / 64) x (D / 64) tiles of 64 x 64 (wgmma n64, 32 registers). Two
  // warpgroups take one tile each (D = 128: a 64-column half each; D = 64 with 128-row steps: a
  // 64-row half each) or take turns step by step (one tile); one warpgroup takes them all.
  static constexpr int TN = D / 64;
  static constexpr int DQ_TILES = (MS / 64) * TN;
  static constexpr bool DQ_TURNS = NWG == 2 && DQ_TILES == 1;
  static constexpr int MY_TILES = NWG == 1 ? DQ_TILES : 1;  // dQ tiles of a warpgroup in a step it has any
  static_assert(NWG == 1 || DQ_TILES <= 2, "two warpgroups split a step's dQ in at most two tiles");
  // One dQ tile per warpgroup and step: the next step's S^T (and with 64-row steps at D = 64 its
  // dP^T) is issued before this step's dQ leaves the registers (consume()). S^T only elsewhere:
  // dP^T's MS / 2 registers more would spill. (64x64 blocks at D = 128: one warpgroup takes both dQ
  // tiles of a step, no prefetch.)
  static constexpr bool PREFETCH = MY_TILES == 1;
  static constexpr bool PREFETCH_DP = D == 64 && MS == 64;
  // Per-warpgroup output buffer: its dQ tiles (4-byte grid integers or fp32) for the bulk reduce, or
  // dK and dV staged for their TMA stores at the end of an item.
  static constexpr int OUT_BYTES = std::max(MY_TILES * 4096 * 4, 2 * 64 * D * 2);
  static constexpr int FIXED = 2 * KV_BYTES + DS_BYTES + NWG * OUT_BYTES + 256 /* barriers, infos */ +
                               kit::kSmemAlignSlack;
  static constexpr int STAGE_BYTES = 2 * QS_BYTES + ROW_BYTES;
  static constexpr int CTAS_PER_SM =
      (NWG == 1 && 2 * (FIXED + 2 * STAGE_BYTES + kit::kSmemReservedPerCta) <= kit::kSmemPerBlock) ? 2 : 1;
  static constexpr int BUDGET = kit::smem_budget(CTAS_PER_SM);
  static constexpr int STAGES = std::min(4, (BUDGET - FIXED) / STAGE_BYTES);
  static constexpr int S_REGS = MS / 2;  // fp32 per thread of an m64 x MS accumulator
  static constexpr int KV_REGS = D / 2;  // fp32 per thread of dK or dV (m64 x D)
  // Register budgets after setmaxnreg (whole warpgroups) share the CTA's launch allocation,
  // THREADS x ENTRY_REGS: the producer needs few (at 24 it spills a few values to L1; the
  // consumers need up to R237 at D = 128).
  static constexpr int ENTRY_REGS = std::min(255, 65536 / (THREADS * CTAS_PER_SM)) / 8 * 8;
  static constexpr int PRODUCER_REGS = NWG == 1 ? 40 : (D == 128 || MS == 128) ? 24 : 40;
  static constexpr int CONSUMER_REGS = NWG == 1 ? (CTAS_PER_SM == 2 ? 216 : 248) : (D == 128 || MS == 128) ? 240 : 232;

  // Shared memory: the item's K and V, the Q / dO / rows ring, dS^T, the warpgroups' output buffers,
  // then the barriers and the info words the producer writes beside the loads.
  static constexpr kit::Region K = kit::first_region(KV_BYTES);
  static constexpr kit::Region V = K.then(KV_BYTES);
  static constexpr kit::Region Q = V.then(STAGES * QS_BYTES);
  static constexpr kit::Region DO = Q.then(STAGES * QS_BYTES);
  static constexpr kit::Region DS = DO.then(DS_BYTES);
  static constexpr kit::Region OUT = DS.then(NWG * OUT_BYTES);
  static constexpr kit::Region ROWS = OUT.then(STAGES * ROW_BYTES, 16);
  static constexpr kit::Region ITEM_FULL = ROWS.then(8, 8);   // the item's K / V tiles and info
  static constexpr kit::Region ITEM_EMPTY = ITEM_FULL.then(8, 8);
  static constexpr kit::Region QD_FULL = ITEM_EMPTY.then(8 * STAGES, 8);
  static constexpr kit::Region QD_EMPTY = QD_FULL.then(8 * STAGES, 8);
  static constexpr kit::Region ITEM_INFO = QD_EMPTY.then(8, 8);           // int2 {item id or -1, steps}
  static constexpr kit::Region STAGE_INFO = ITEM_INFO.then(8 * STAGES, 8);  // int2 per stage {row0, hq * 2 + full}
  // Packed sequences: the query rows {lo, hi} the item's keys may be attended by, written with the
  // item info (the consumers compare each step's rows with them).
  static constexpr kit::Region SEQ_RANGE = STAGE_INFO.then(8, 8);
  static constexpr int SMEM = int(SEQ_RANGE.end()) + kit::kSmemAlignSlack;

  static_assert(D == 64 || D == 128, "D must be 64 or 128");
  static_assert(BN == 64 || BN == 128, "blocks are 64x64 or 128x128");
  static_assert(OUT_BYTES % 1024 == 0, "swizzled tiles must start 1024-byte aligned (descriptor base offset 0)");
  static_assert(STAGES >= 2, "Q and dO need two stages to load ahead of the math");
  static_assert(SMEM <= BUDGET, "shared memory per CTA exceeds the budget");
  static_assert(128 * PRODUCER_REGS + 128 * NWG * CONSUMER_REGS <= THREADS * ENTRY_REGS,
                "setmaxnreg budgets exceed the CTA's register allocation (setmaxnreg.inc would wait forever)");
};
template <int I>
using ConfigAt = Config<kConfigs[I].d, kConfigs[I].block, kConfigs[I].bf16>;

// A CTA's shared memory (Config's regions): shared-window addresses and generic pointers.
template <class Cfg>
struct Smem {
  kit::SmemBase base;
  __device__ uint32_t k() const { return base.at(Cfg::K.offset); }
  __device__ uint32_t v() const { return base.at(Cfg::V.offset); }
  __device__ uint32_t q(int s) const { return base.at(Cfg::Q.offset, s * Cfg::QS_BYTES); }
  __device__ uint32_t d(int s) const { return base.at(Cfg::DO.offset, s * Cfg::QS_BYTES); }
  __device__ uint32_t ds() const { return base.at(Cfg::DS.offset); }
  __device__ uint32_t out(int wg) const { return base.at(Cfg::OUT.offset, wg * Cfg::OUT_BYTES); }
  __device__ uint32_t rows(int s) const { return base.at(Cfg::ROWS.offset, s * Cfg::ROW_BYTES); }
  __device__ uint32_t item_full() const { return base.at(Cfg::ITEM_FULL.offset); }
  __device__ uint32_t item_empty() const { return base.at(Cfg::ITEM_EMPTY.offset); }
  __device__ uint32_t qd_full(int s) const { return base.at(Cfg::QD_FULL.offset, 8 * s); }
  __device__ uint32_t qd_empty(int s) const { return base.at(Cfg::QD_EMPTY.offset, 8 * s); }
  __device__ int2* item_info() const { return base.ptr_at<int2>(Cfg::ITEM_INFO.offset); }
  __device__ int2* seq_range() const { return base.ptr_at<int2>(Cfg::SEQ_RANGE.offset); }
  __device__ int2* stage_info(int s) const { return base.ptr_at<int2>(Cfg::STAGE_INFO.offset, 8 * s); }
  __device__ const float4* rows_ptr(int s) const { return base.ptr_at<const float4>(Cfg::ROWS.offset, s * Cfg::ROW_BYTES); }
  __device__ uint8_t* out_ptr(int wg) const { return base.ptr_at<uint8_t>(Cfg::OUT.offset, wg * Cfg::OUT_BYTES); }
  __device__ uint8_t* ds_ptr() const { return base.ptr_at<uint8_t>(Cfg::DS.offset); }
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
  const int* cu_seqlens;  // packed sequences [nseq + 1] (B = 1), or null
  int nseq;
};

// The layout column of (batch, query head, key block); the layout's head extent may be 1, Hkv or Hq.
__device__ __forceinline__ int column_of(const Params& p, int b, int hq, int hkv, int j) {
  const int lb = p.lb == 1 ? 0 : b;
  const int lh = p.lh == 1 ? 0 : p.lh_is_kv ? hkv : hq;
  return (lb * p.lh + lh) * p.nkb + j;
}

struct Item {
  int b, hkv, j;
};
// (Unsigned: ids and extents are never negative, and unsigned division is the shorter sequence,
// which the producer's 24 registers feel.)
__device__ __forceinline__ Item decode(int id, const Params& p) {
  const unsigned u = unsigned(id), hkv = unsigned(p.hkv), nkb = unsigned(p.nkb);
  return {int(u / (hkv * nkb)), int((u / nkb) % hkv), int(u % nkb)};
}

// ---- host side of the main kernel (kernel.cu) ----
// Each configuration is built twice: without packed sequences (info) and with them (packed_info).
struct Kernel {
  Key key;
  kit::KernelInfo info, packed_info;
  void (*launch)(const AttentionBackwardArgs& a, const Params& p, int grid, cudaStream_t stream);
};
// The built kernel for key, or null.
const Kernel* find_kernel(const Key& key);

}  // namespace sparsek::attn_bwd_sm90
