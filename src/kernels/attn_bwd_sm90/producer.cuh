// Hopper attention backward, producer: one warp takes items (a key block of one (batch, key/value
// head)) from the atomic counter, counts the item's steps over the transposed layout, loads K and V
// once, then for every query head of the group and every query block of the column the Q and dO
// tiles of MS rows and their row statistics into a ring. Lane 0 issues every load; the warp reads
// the column records 32 at a time.
#pragma once
#include "kernels/attn_bwd_sm90/config.hpp"
#include "kernels/ptx/async.cuh"
#include "kernels/sm90/kit/packed.cuh"
#include "kernels/sm90/kit/ring.cuh"

namespace sparsek::attn_bwd_sm90 {

template <class Cfg, bool PACKED>
__device__ __forceinline__ void produce(const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                        const CUtensorMap* tm_do, const Params& p, const Smem<Cfg>& sm) {
  const int lane = threadIdx.x % 32;
  kit::Ring<Cfg::STAGES> qr;  // lane 0's (the only lane that uses it)
  uint32_t item_phase = 0;
  for (;;) {
    int id = 0;
    if (lane == 0) id = atomicAdd(p.item_counter, 1);
    id = __shfl_sync(0xffffffffu, id, 0);
    const bool done = id >= p.items;
    const Item it = decode(done ? 0 : id, p);
    // Steps of the item: every query head of the group, every record of its column, SUB each.
    int steps = 0;
    if (!done)
      for (int g0 = 0; g0 < p.group; g0 += 32) {
        int n = 0;
        if (g0 + lane < p.group) {
          const int col = column_of(p, it.b, it.hkv * p.group + g0 + lane, it.hkv, it.j);
          n = p.col_end[col] - p.col_begin[col];
        }
#pragma unroll
        for (int m = 16; m > 0; m /= 2) n += __shfl_xor_sync(0xffffffffu, n, m);
        steps += n;
      }
    steps *= Cfg::SUB;
    // Packed sequences: the query rows {lo, hi} every key of this block may be attended by (none
    // when the keys span sequences); the consumers mask the steps with rows outside them.
    int2 seq_range = make_int2(0, INT32_MAX);
    if (PACKED && steps > 0) {
      int s0, s1;
      kit::warp_sequences_of(p.cu_seqlens, p.nseq, it.j * Cfg::BN, min((it.j + 1) * Cfg::BN, p.skv) - 1, s0, s1);
      seq_range = s0 == s1 ? make_int2(__ldg(p.cu_seqlens + s0), __ldg(p.cu_seqlens + s0 + 1)) : make_int2(0, INT32_MIN);
    }
    if (lane == 0) {
      ptx::mbar_wait_or_trap(sm.item_empty(), item_phase ^ 1, kit::kWaitLimit);
      *sm.item_info() = make_int2(done ? -1 : id, steps);
      if constexpr (PACKED) *sm.seq_range() = seq_range;
      ptx::mbar_arrive_expect_tx(sm.item_full(), steps > 0 ? 2 * Cfg::KV_BYTES : 0);
      if (steps > 0) {
        // k, v: (64 of D, keys, D chunks, kv heads, batch), box (64, BN, CHUNKS, 1, 1)
        ptx::tma_load_5d(sm.k(), tm_k, sm.item_full(), 0, it.j * Cfg::BN, 0, it.hkv, it.b);
        ptx::tma_load_5d(sm.v(), tm_v, sm.item_full(), 0, it.j * Cfg::BN, 0, it.hkv, it.b);
      }
    }
    item_phase ^= 1;
    if (done) break;
    if (steps == 0) continue;
    for (int g = 0; g < p.group; ++g) {
      const int hq = it.hkv * p.group + g;
      const int col = column_of(p, it.b, hq, it.hkv, it.j);
      const int begin = p.col_begin[col], end = p.col_end[col];
      const float4* rows = p.rowinfo + (int64_t(it.b) * p.hq + hq) * p.sq_pad;
      for (int e0 = begin; e0 < end; e0 += 32) {
        const int rec = e0 + lane < end ? p.q_indices[e0 + lane] : 0;
        const int count = min(32, end - e0);
        for (int t = 0; t < count; ++t) {
          const int r_t = __shfl_sync(0xffffffffu, rec, t);
          const int qb = r_t & 0x7fffffff, full = r_t < 0 ? 1 : 0;
          if (lane == 0) {
            for (int h = 0; h < Cfg::SUB; ++h) {
              const int row0 = qb * Cfg::BM + h * Cfg::MS;
              ptx::mbar_wait_or_trap(sm.qd_empty(qr.stage), qr.phase ^ 1, kit::kWaitLimit);
              *sm.stage_info(qr.stage) = make_int2(row0, hq * 2 + full);
              const uint32_t bar = sm.qd_full(qr.stage);
              ptx::mbar_arrive_expect_tx(bar, 2 * Cfg::QS_BYTES + Cfg::ROW_BYTES);
              // q, dO: (64 of D, rows, D chunks, heads, batch), box (64, MS, CHUNKS, 1, 1)
              ptx::tma_load_5d(sm.q(qr.stage), tm_q, bar, 0, row0, 0, hq, it.b);
              ptx::tma_load_5d(sm.d(qr.stage), tm_do, bar, 0, row0, 0, hq, it.b);
              ptx::bulk_load(sm.rows(qr.stage), rows + row0, Cfg::ROW_BYTES, bar);
              qr.advance();
            }
          }
          __syncwarp();
        }
      }
    }
  }
}

}  // namespace sparsek::attn_bwd_sm90
