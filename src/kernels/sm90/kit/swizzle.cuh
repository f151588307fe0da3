// The 128-byte swizzle of TMA tiles and wgmma shared-memory operands, for code that writes such
// tiles from registers (epilogues staging a TMA store, operands built in shared memory).
#pragma once
#include <cstdint>

namespace sparsek::dev {

// Byte offset of 2-byte element (row, col) in a tile stored as [col / 64][row][64 elements]: each
// row is 128 bytes whose 16-byte granules are XOR-swizzled by row % 8 (TMA SWIZZLE_128B, wgmma
// Swizzle::b128); chunks of 64 columns are chunk_bytes apart. The tile must be 1024-byte aligned.
__device__ __forceinline__ uint32_t swizzle128_offset(int row, int col, uint32_t chunk_bytes) {
  return uint32_t(col / 64) * chunk_bytes + uint32_t(row) * 128 +
         ((uint32_t((col % 64) / 8) ^ uint32_t(row % 8)) << 4) + uint32_t(col % 8) * 2;
}

}  // namespace sparsek::dev
