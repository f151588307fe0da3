// Hopper attention backward, what leaves the consumers: a step's dQ tiles (staged in accumulator-
// fragment order, sent by one bulk reduce-add into the dQ accumulator in L2) and, at the end of an
// item, dK and dV (staged 128B-swizzled, stored by TMA).
#pragma once
#include "kernels/attn_bwd_sm90/config.hpp"
#include "kernels/dtype.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/sm90/kit/store.cuh"

namespace sparsek::attn_bwd_sm90 {

// dQ tile t of the step (its wgmma complete) -> the output buffer in accumulator-fragment order
// (the accumulator's layout in global memory too): integers on the row's grid (deterministic; qs0,
// qs1: the grid scales of the thread's two rows) or fp32.
template <class Cfg>
__device__ __forceinline__ void stage_dq(float (&dq)[32], int t, float qs0, float qs1, uint8_t* out_ptr, int tid,
                                         int det) {
#pragma unroll
  for (int r = 0; r < 32; ++r) ptx::fence_operand(dq[r]);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const int pos = t * 4096 + c * 512 + tid * 4;
    if (det) {  // round to the grid (cvt.rni saturates; a NaN marker row gives 0)
      *reinterpret_cast<int4*>(reinterpret_cast<int*>(out_ptr) + pos) =
          make_int4(__float2int_rn(dq[4 * c] * qs0), __float2int_rn(dq[4 * c + 1] * qs0),
                    __float2int_rn(dq[4 * c + 2] * qs1), __float2int_rn(dq[4 * c + 3] * qs1));
    } else {
      *reinterpret_cast<float4*>(reinterpret_cast<float*>(out_ptr) + pos) =
          make_float4(dq[4 * c], dq[4 * c + 1], dq[4 * c + 2], dq[4 * c + 3]);
    }
  }
}

// The staged dQ tiles of this warpgroup -> one bulk reduce-add (integers or fp32) into the
// accumulator [B, Hq, sq_pad / 64, D / 64] tiles of 64 x 64, where this warpgroup's are adjacent
// (tile: {query chunk, D chunk} of the step's first; one warpgroup: the step's D / 64 tiles of 64
// rows).
template <class Cfg>
__device__ __forceinline__ void send_dq(const Params& p, const Item& it, int hq, int row0, int2 tile0, int wg,
                                        int tid, uint32_t out) {
  kit::staging_release(3 + wg);  // the st.shared of stage_dq, read by the bulk reduce
  if (tid == 0) {
    const int64_t tile = ((int64_t(it.b) * p.hq + hq) * p.r64 + row0 / 64 + tile0.x) * Cfg::TN + tile0.y;
    constexpr uint32_t elems = Cfg::MY_TILES * 4096;
    if (p.det)
      ptx::bulk_reduce_add_u32(static_cast<int*>(p.dq_acc) + tile * 4096, out, elems * 4);
    else
      ptx::bulk_reduce_add_f32(static_cast<float*>(p.dq_acc) + tile * 4096, out, elems * 4);
    ptx::bulk_commit_group();
  }
}

// dK * scale and dV of this warpgroup's 64 keys -> bf16 / f16, staged 128B-swizzled ([D / 64][64][64]
// each) -> two TMA stores; keys past Skv are clipped by the tensor maps.
template <class Cfg>
__device__ __forceinline__ void store_dk_dv(const float (&dk)[Cfg::KV_REGS], const float (&dv)[Cfg::KV_REGS],
                                            const CUtensorMap* tm_dk, const CUtensorMap* tm_dv, const Params& p,
                                            const Item& it, int wg, uint32_t out, uint8_t* out_ptr) {
  const int tid = threadIdx.x % 128, lane = tid % 32, warp = tid / 32;
  kit::staging_acquire(tid == 0, 3 + wg);
#pragma unroll
  for (int c = 0; c < Cfg::D / 8; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t off = kit::fragment_pair_offset(warp, lane, c, h);
      *reinterpret_cast<uint32_t*>(out_ptr + off) =
          dev::pack2<Cfg::BF16>(dk[4 * c + 2 * h] * p.scale, dk[4 * c + 2 * h + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(out_ptr + 64 * Cfg::D * 2 + off) =
          dev::pack2<Cfg::BF16>(dv[4 * c + 2 * h], dv[4 * c + 2 * h + 1]);
    }
  kit::staging_release(3 + wg);
  if (tid == 0) {
    // dk, dv: (64 of D, keys, D chunks, kv heads, batch), box (64, 64, D / 64, 1, 1)
    const int key0 = it.j * Cfg::BN + wg * 64;
    ptx::tma_store_5d(tm_dk, out, 0, key0, 0, it.hkv, it.b);
    ptx::tma_store_5d(tm_dv, out + 64 * Cfg::D * 2, 0, key0, 0, it.hkv, it.b);
    ptx::bulk_commit_group();
  }
}

}  // namespace sparsek::attn_bwd_sm90
