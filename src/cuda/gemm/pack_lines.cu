// Packs a strided matrix of 16-bit elements into 16-byte aligned lines (pack_lines.hpp): the copy
// in front of the Hopper product when its dense operand is not TMA-aligned.
//
// A warp copies 256 consecutive elements of one line per step: lane l moves elements l, l + 32,
// ..., l + 224, so every load and every store instruction of the warp touches 64 consecutive bytes
// (coalesced whatever the source's alignment), and each thread has 8 loads in flight before its
// first store. The source is read with the streaming hint (evict first: it is not read again),
// the packed copy is stored normally, so it is still in L2 when the product reads it next.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/device.hpp"
#include "cuda/gemm/pack_lines.hpp"

namespace sparsek {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = 8;            // elements per lane and step (loads in flight)
constexpr int kChunk = 32 * kPerLane;  // elements per warp and step
constexpr int64_t kMaxBlocks = 32768;  // grid-stride beyond this

__global__ void __launch_bounds__(kThreads)
    pack_lines_kernel(const uint16_t* __restrict__ src, int64_t ld, uint16_t* __restrict__ dst, int64_t ldp,
                      int64_t lines, int64_t len, int64_t chunks) {
  const int lane = int(threadIdx.x % 32);
  const int64_t units = lines * chunks;  // (line, 256-element chunk) pairs
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t u = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; u < units; u += stride) {
    const int64_t line = u / chunks;
    const int64_t j0 = (u - line * chunks) * kChunk + lane;
    const uint16_t* s = src + line * ld;
    uint16_t* d = dst + line * ldp;
    uint16_t v[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t j = j0 + 32 * k;
      v[k] = j < len ? __ldcs(s + j) : uint16_t(0);
    }
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t j = j0 + 32 * k;
      if (j < len) d[j] = v[k];
    }
  }
}

}  // namespace

void pack_lines_16bit(const void* src, int64_t ld, void* dst, int64_t lines, int64_t len, void* stream) {
  if (lines <= 0 || len <= 0) return;
  const int64_t chunks = (len + kChunk - 1) / kChunk;
  const int64_t blocks = std::min(kMaxBlocks, (lines * chunks + kWarps - 1) / kWarps);
  pack_lines_kernel<<<unsigned(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint16_t*>(src), ld, static_cast<uint16_t*>(dst), packed_line_elems(len), lines, len, chunks);
  check_cuda(cudaGetLastError(), "pack_lines_kernel launch");
}

}  // namespace sparsek
