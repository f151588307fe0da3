// The Hopper kit: tiles written from registers into shared memory for the TMA (epilogues staging a
// TMA store or a bulk reduce, operands a later wgmma reads): the swizzled addresses, and the
// hand-over of a staging buffer between the threads that fill it and the bulk copy that reads it.
#pragma once
#include <cstdint>

#include "kernels/ptx/async.cuh"
#include "kernels/sm90/kit/tile.cuh"

namespace sparsek::kit {

// Byte offset of 2-byte element (row, col) in a tile stored as [col / 64][row][64 elements]: each
// row is 128 bytes whose 16-byte granules are XOR-swizzled by row % 8 (TMA SWIZZLE_128B, wgmma
// Swizzle::b128); chunks of 64 columns are chunk_bytes apart. The tile must be 1024-byte aligned.
__device__ __forceinline__ uint32_t swizzle128_offset(int row, int col, uint32_t chunk_bytes) {
  return uint32_t(col / 64) * chunk_bytes + uint32_t(row) * 128 +
         ((uint32_t((col % 64) / 8) ^ uint32_t(row % 8)) << 4) + uint32_t(col % 8) * 2;
}

// Where a thread's register pair 4j + 2h (h: fragment row, kit/tile.cuh) of an m64 x N accumulator
// goes in a 64-row tile of 16-bit elements stored [N / 64][64][64], 128B-swizzled (one TMA box
// (64, 64, N / 64)): the pair is two neighbours of a row, one 4-byte store.
// (Written with the compile-time j apart, as swizzle128_offset(r, 8j + 2(lane % 4), 64 * 128) spelled
// out: ptxas does not see that 2(lane % 4) < 8 leaves the granule alone, and the general form cost
// ~30 more instructions per epilogue.)
__device__ __forceinline__ uint32_t fragment_pair_offset(int warp, int lane, int j, int h) {
  const int r = fragment_row(warp, lane, h);
  // (int arithmetic: ptxas folds the compile-time parts into the stores' immediates)
  return uint32_t((j / 8) * (64 * 128) + r * 128 + (((j % 8) ^ (r % 8)) << 4) + 4 * (lane % 4));
}

// Byte offset of (line, byte) in a TMA box of LB-byte lines, swizzled as the TMA writes and reads
// it: 16-byte granules XOR-ed with address bits 7.. (128B: line % 8; 64B: (line / 2) % 4).
template <int LB>
__device__ __forceinline__ int box_offset(int line, int byte) {
  const int o = line * LB + byte;
  return o ^ (((o >> 7) & (LB / 16 - 1)) << 4);
}

// A warpgroup's staging buffer for a bulk copy (TMA store, bulk reduce): before the threads fill
// it, the copy that last read it must be done reading (the waiter, one thread, waits until at most
// PENDING bulk groups still read; then the warpgroup syncs on its named barrier); once filled, the
// threads' generic-proxy writes are fenced for the async proxy and the warpgroup syncs again, and
// then one thread issues the copy and commits its group.
template <int PENDING = 0>
__device__ __forceinline__ void staging_acquire(bool waiter, int barrier) {
  if (waiter) ptx::bulk_wait_group_read<PENDING>();
  ptx::named_barrier_sync(barrier, 128);
}
__device__ __forceinline__ void staging_release(int barrier) {
  ptx::fence_proxy_async_smem();  // the st.shared of the fill are read by the async proxy
  ptx::named_barrier_sync(barrier, 128);
}

}  // namespace sparsek::kit
