// Hopper attention forward, epilogue: O / rowsum into the warpgroup's 128B-swizzled staging tile
// and one TMA store (rows past Sq are clipped by the tensor map); LSE straight from the registers.
#pragma once
#include "kernels/attn_fwd_sm90/config.hpp"
#include "kernels/dtype.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/sm90/kit/store.cuh"

namespace sparsek::attn_fwd_sm90 {

template <class Cfg>
__device__ __forceinline__ void epilogue(RowState<Cfg>& st, const CUtensorMap* tm_o, const Params& p, const Item& it,
                                         int row0, int wg, uint32_t s_o, uint8_t* o_ptr) {
  const int tid = threadIdx.x % 128, lane = tid % 32, warp = tid / 32;
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[h] = l > 0.f ? 1.f / l : 0.f;
    const int q = row0 + kit::fragment_row(warp, lane, h);
    if (p.lse && lane % 4 == 0 && q < p.sq)
      p.lse[(int64_t(it.b) * p.hq + it.hq) * p.sq + q] =
          l > 0.f ? (st.m[h] * p.scale_log2 + __log2f(l)) * 0.69314718055994531f : -INFINITY;
  }
  kit::staging_acquire(tid == 0, 3 + wg);  // the staging tile's last TMA store has read it
#pragma unroll
  for (int j = 0; j < Cfg::D / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<uint32_t*>(o_ptr + kit::fragment_pair_offset(warp, lane, j, h)) =
          dev::pack2<Cfg::BF16>(st.o[4 * j + 2 * h] * inv[h], st.o[4 * j + 2 * h + 1] * inv[h]);
  kit::staging_release(3 + wg);
  if (tid == 0) {
    // o: (64 of D, rows, D chunks, heads, batch), box (64, 64, D / 64, 1, 1)
    ptx::tma_store_5d(tm_o, s_o, 0, row0, 0, it.hq, it.b);
    ptx::bulk_commit_group();
  }
}

}  // namespace sparsek::attn_fwd_sm90
