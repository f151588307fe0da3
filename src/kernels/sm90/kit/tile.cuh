// The Hopper kit: operand tiles in shared memory and the wgmmas that read them. One layer for every
// family: the products' A and B tiles, attention's Q, K, V, dO and dS tiles are all TileLayouts,
// read K-major or MN-major through the same descriptors.
#pragma once
#include <cstdint>

#include "kernels/ptx/wgmma.cuh"

namespace sparsek::kit {

// One operand tile: EXT elements of the M (or N) side by K elements of the reduction, ES bytes each
// (2: f16 / bf16; 1: e4m3), in shared-memory rows of one swizzle span (128 or 64 bytes), as a TMA box
// writes it.
//   K-major (KMAJOR: K contiguous): EXT rows of min(K, 128 / ES) elements; a wider K is cut into
//     chunks of that width CHUNK bytes apart ([K / W][EXT][W]: the TMA box (64, EXT, K / 64) of
//     attention's [B, H, S, D] tensors, or the box (K, EXT) of a product's stage).
//   MN-major (M or N contiguous; 16-bit only): K rows of W = min(EXT, WMAX) elements, in EXT / W
//     chunks of K rows each (one TMA box (W, K) per chunk). WMAX = 32 gives 32-wide chunks (64-byte
//     rows) for a tile gathered from 32-wide pieces.
// The swizzle is the row width (128B or 64B), in the TMA map and in the descriptor alike.
// The same bytes may be read both ways by different products (attention's Q is K-major in S = QK^T
// and MN-major in dK += dS^T Q): a TileLayout is a way of reading a region, not the region.
template <int EXT, int K, bool KMAJOR, int WMAX = 64, int ES = 2>
struct TileLayout {
  static constexpr int KDIM = K;
  static constexpr int KSTEP = 32 / ES;  // K of one wgmma: k16 (16-bit), k32 (fp8); 32 bytes either way
  static constexpr int W = KMAJOR ? (K < 128 / ES ? K : 128 / ES) : (EXT < WMAX ? EXT : WMAX);  // elements per row
  static constexpr int ROW_BYTES = W * ES;
  static constexpr int BYTES = EXT * K * ES;
  static constexpr int CHUNK = KMAJOR ? EXT * ROW_BYTES : K * ROW_BYTES;  // one W-wide chunk
  static constexpr int CHUNKS = BYTES / CHUNK;
  static constexpr int TRANS = KMAJOR ? 0 : 1;  // wgmma imm-trans: 1 = M/N-major operand
  static constexpr ptx::Swizzle SWIZZLE = ROW_BYTES == 128 ? ptx::Swizzle::b128 : ptx::Swizzle::b64;
  static_assert(ROW_BYTES == 128 || ROW_BYTES == 64, "tile rows are one 128B or 64B swizzle span");
  static_assert((KMAJOR ? K % W == 0 : EXT % W == 0) && K % KSTEP == 0, "whole chunks and whole wgmma K steps");
  static_assert(KMAJOR || ES == 2, "fp8 operands are K-major (fp8 wgmma has no transpose)");
  static_assert(CHUNK % 1024 == 0, "every chunk starts 1024-byte aligned (descriptor base offset 0)");

  // The descriptor of the m64 (or nN) sub-tile starting at M/N offset e0 (a multiple of 8; of 64
  // when MN-major), wgmma K step kk.
  // K-major: 8-row groups SBO = 8 rows apart, +32 bytes per K step inside the swizzled row, the next
  // chunk of K CHUNK bytes on. MN-major: LBO = the distance between W-wide chunks, SBO = between
  // groups of 8 K rows, +16 rows per k16 step (canonical layouts, PTX ISA "matrix descriptor").
  static __device__ __forceinline__ uint64_t desc(uint32_t base, int e0, int kk) {
    if constexpr (KMAJOR)
      return ptx::smem_desc(base + (kk * KSTEP / W) * CHUNK + e0 * ROW_BYTES + (kk * KSTEP % W) * ES, 16,
                            8 * ROW_BYTES, SWIZZLE);
    else
      return ptx::smem_desc(base + (e0 / W) * CHUNK + kk * 16 * ROW_BYTES, CHUNK, 8 * ROW_BYTES, SWIZZLE);
  }
};

// acc (m64 x N) = A B (first: the first k16 step overwrites acc) or acc += A B, over the tiles' K:
// A = 64 rows of tile AT from its M offset a_e0, B = N rows of tile BT from its N offset b_e0.
template <class AT, class BT, int N, bool BF16>
__device__ __forceinline__ void mma(float (&acc)[N / 2], uint32_t a, int a_e0, uint32_t b, int b_e0, bool first) {
  static_assert(AT::KDIM == BT::KDIM, "A and B tiles must span the same K");
#pragma unroll
  for (int kk = 0; kk < AT::KDIM / 16; ++kk)
    ptx::wgmma_m64k16<N, BF16, AT::TRANS, BT::TRANS>(acc, AT::desc(a, a_e0, kk), BT::desc(b, b_e0, kk),
                                                     first && kk == 0 ? 0 : 1);
}

// acc (m64 x N) += A B over BT's K with A from registers: k16 step kk is a[kk], the A fragment of
// wgmma ...RS (ptx/wgmma.cuh), which is how an fp32 accumulator's registers 8kk..8kk+7 pair up
// (attention feeds P = softmax(S) back as A without leaving the registers).
template <class BT, int N, bool BF16>
__device__ __forceinline__ void mma_rs(float (&acc)[N / 2], const uint32_t (&a)[BT::KDIM / 16][4], uint32_t b,
                                       int b_e0) {
#pragma unroll
  for (int kk = 0; kk < BT::KDIM / 16; ++kk) ptx::wgmma_m64k16_rs<N, BF16, BT::TRANS>(acc, a[kk], BT::desc(b, b_e0, kk), 1);
}

// The m64 x N fp32 accumulator fragment of a thread (warp w of the warpgroup, lane l): register
// 4j + 2h + e holds row 16w + 8h + l/4, column 8j + 2(l%4) + e. Pairs (e = 0, 1) are neighbours
// along a row; packed two to a register they are the A fragment of the next wgmma (mma_rs).
__device__ __forceinline__ int fragment_row(int warp, int lane, int h) { return 16 * warp + lane / 4 + 8 * h; }
__device__ __forceinline__ int fragment_col(int lane, int j, int e) { return 8 * j + 2 * (lane % 4) + e; }

// Where accumulator register 4*j + 2*h + e of instruction mi lands in a product's tile (tile row r,
// tile column n). Swapped (the tile computed as C^T, instruction mi = 64-wide chunk mi of N), the
// fragment's row is the column n and its column the row r.
template <bool SWAP>
__device__ __forceinline__ void fragment_coord(int mi, int j, int h, int e, int warp, int lane, int& r, int& n) {
  // (The same values as fragment_row() / fragment_col(), in the products' order of the terms: ptxas
  // allocates the epilogues' registers differently for the other one, and the 64-row kernels spill.)
  const int fr = warp * 16 + h * 8 + lane / 4, fc = j * 8 + (lane % 4) * 2 + e;
  if constexpr (SWAP) {
    r = fc;
    n = mi * 64 + fr;
  } else {
    r = fr;
    n = fc;
  }
}

}  // namespace sparsek::kit
