// Packs a strided matrix of 16-bit elements into aligned lines (pack_lines.hpp): the copy in front
// of the Hopper product when its dense operand is not TMA-aligned.
//
// A thread writes whole 16-byte granules of the copy. The 16 source bytes of a granule start at
// an even but otherwise arbitrary address, so the thread reads the two aligned 16-byte granules
// that hold them and shifts the pair into place (the offset is the same for every granule of a
// line, so the shift is uniform across the warp). A warp covers 32 consecutive granules of one
// line per step, every load and store instruction touches 512 contiguous bytes, and each thread
// has kPerLane granules' loads in flight before its first store. The second aligned load of a
// granule is the first of its neighbour's (the next lane), so it hits L1; only the source bytes
// once come from DRAM. Loads that would cross the end of the matrix (the last granules of the last
// line) read element by element instead, so nothing past the caller's last element is touched.
// The first granule of a misaligned matrix starts up to 14 bytes before its first element: those
// bytes lie in the same 16-byte aligned granule, so in the caller's allocation (device
// allocations start at least 16-byte aligned); they are read and discarded.
// The source is read with the L1-cached non-coherent path; the packed copy is stored normally so
// it is still in L2 when the product reads it next.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/device.hpp"
#include "kernels/dsd_sm90/pack_lines.hpp"

namespace sparsek {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = 4;             // granules per lane and step (loads in flight: two each)
constexpr int kChunk = 32 * kPerLane;   // granules per warp and step
constexpr int64_t kMaxBlocks = 32768;   // grid-stride beyond this

// The aligned granule at byte address `a`, or the part of it before `end` (2-byte loads) when it
// crosses the end of the matrix; bytes past `end` read as zero.
__device__ __forceinline__ uint4 load_granule(uintptr_t a, uintptr_t end) {
  if (a + 16 <= end) return __ldg(reinterpret_cast<const uint4*>(a));
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uintptr_t p = a + 2 * e;
    if (p < end) w[e / 2] |= uint32_t(__ldg(reinterpret_cast<const uint16_t*>(p))) << (16 * (e % 2));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Bytes [off, off + 16) of the 32-byte pair lo:hi (off even, 0 <= off < 16).
__device__ __forceinline__ uint4 shift_pair(uint4 lo, uint4 hi, unsigned off) {
  uint32_t x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int i = 0; i < 6; ++i) x[i] = (off & 8) ? x[i + 2] : x[i];
#pragma unroll
  for (int i = 0; i < 5; ++i) x[i] = (off & 4) ? x[i + 1] : x[i];
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = (off & 2) ? __funnelshift_r(x[i], x[i + 1], 16) : x[i];
  return make_uint4(x[0], x[1], x[2], x[3]);
}

// Keeps the first `keep` (0..8) elements of a granule, zeroes the rest.
__device__ __forceinline__ uint4 keep_elems(uint4 v, int keep) {
  uint32_t x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int n = keep - 2 * i;  // elements of word i to keep
    x[i] = n >= 2 ? x[i] : n == 1 ? (x[i] & 0xffffu) : 0u;
  }
  return make_uint4(x[0], x[1], x[2], x[3]);
}

__global__ void __launch_bounds__(kThreads)
    pack_lines_kernel(const uint16_t* __restrict__ src, int64_t ld, uint16_t* __restrict__ dst, int64_t ldp,
                      int64_t lines, int64_t len, int64_t chunks) {
  const int lane = int(threadIdx.x % 32);
  const int64_t granules = ldp / 8;  // per line of the copy
  const uintptr_t end = reinterpret_cast<uintptr_t>(src + (lines - 1) * ld + len);
  const int64_t units = lines * chunks;  // (line, chunk of kChunk granules) pairs
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t u = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; u < units; u += stride) {
    const int64_t line = u / chunks;
    const int64_t g0 = (u - line * chunks) * kChunk + lane;
    const uintptr_t s = reinterpret_cast<uintptr_t>(src + line * ld);
    const unsigned off = unsigned(s % 16);  // the same for the whole line: no divergence
    const uintptr_t base = s - off;
    uint4 lo[kPerLane], hi[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t g = g0 + 32 * k;
      lo[k] = hi[k] = make_uint4(0, 0, 0, 0);
      if (g >= granules || 8 * g >= len) continue;  // past the line, or padding only (zeros)
      // The granule's source bytes: [s + 16 g, s + 16 g + need), need <= 16.
      const unsigned need = unsigned(2 * std::min<int64_t>(8, len - 8 * g));
      const uintptr_t a = base + 16 * uintptr_t(g);
      lo[k] = load_granule(a, end);
      if (off + need > 16) hi[k] = load_granule(a + 16, end);
    }
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t g = g0 + 32 * k;
      if (g >= granules) continue;
      const uint4 v = keep_elems(shift_pair(lo[k], hi[k], off), int(std::min<int64_t>(8, len - 8 * g)));
      *reinterpret_cast<uint4*>(dst + line * ldp + 8 * g) = v;
    }
  }
}

}  // namespace

void pack_lines_16bit(const void* src, int64_t ld, void* dst, int64_t ldp, int64_t lines, int64_t len, void* stream) {
  if (lines <= 0 || len <= 0) return;
  const int64_t chunks = (ldp / 8 + kChunk - 1) / kChunk;
  const int64_t blocks = std::min(kMaxBlocks, (lines * chunks + kWarps - 1) / kWarps);
  pack_lines_kernel<<<unsigned(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint16_t*>(src), ld, static_cast<uint16_t*>(dst), ldp, lines, len, chunks);
  check_cuda(cudaGetLastError(), "pack_lines_kernel launch");
}

}  // namespace sparsek
