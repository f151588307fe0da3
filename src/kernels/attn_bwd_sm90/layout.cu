// Hopper attention backward, the transposed layout: the forward layout's rows (query blocks) turned
// into columns (key blocks) on the GPU in O(nnz), every run (the layout may change between runs).
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/device.hpp"
#include "kernels/attn_bwd_sm90/passes.hpp"

namespace sparsek::attn_bwd_sm90 {

// Sort records: slot (row, t) of the forward layout -> key = its column (ncols when unused).
__global__ void bwd_layout_keys(const LayoutParams lp, unsigned* keys, int* slots, int* col_begin, int* col_end,
                                int* item_counter) {
  const int64_t n = std::max<int64_t>(lp.slots, lp.ncols);
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    if (x < lp.ncols) col_begin[x] = col_end[x] = 0;
    if (x < lp.slots) {
      const int64_t row = x / lp.width;
      const int t = int(x % lp.width);
      int blk = -1;
      if (t < lp.kmax) {
        if (t < min(max(lp.kv_num[row], 0), lp.kmax)) blk = lp.kv_idx[row * lp.kmax + t];
      } else if (lp.full_num && t - lp.kmax < min(max(lp.full_num[row], 0), lp.full_kmax)) {
        blk = lp.full_idx[row * lp.full_kmax + (t - lp.kmax)];
      }
      const int group = int(row / lp.mq);  // (layout batch, layout head)
      keys[x] = blk >= 0 && blk < lp.nkb ? unsigned(group * lp.nkb + blk) : unsigned(lp.ncols);
      slots[x] = int(x);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *item_counter = 0;
}

// After the stable sort by column: q_indices and every column's [begin, end).
__global__ void bwd_layout_columns(const LayoutParams lp, const unsigned* keys, const int* slots, int* q_indices,
                                   int* col_begin, int* col_end) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < lp.slots; e += int64_t(gridDim.x) * blockDim.x) {
    const unsigned key = keys[e];
    if (key >= unsigned(lp.ncols)) continue;  // unused slots sort last
    const int slot = slots[e];
    const int qb = (slot / lp.width) % lp.mq;
    const bool full = slot % lp.width >= lp.kmax;
    q_indices[e] = qb | (full ? int(0x80000000u) : 0);
    if (e == 0 || keys[e - 1] != key) col_begin[key] = int(e);
    if (e + 1 == lp.slots || keys[e + 1] != key) col_end[key] = int(e + 1);
  }
}

static int blocks_for(int64_t n, int threads) {
  return int(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 4096)));
}


size_t transposed_layout_scratch(const LayoutParams& lp, int key_bits) {
  size_t bytes = 0;
  if (lp.slots > 0)
    check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<unsigned*>(nullptr),
                                               static_cast<unsigned*>(nullptr), static_cast<int*>(nullptr),
                                               static_cast<int*>(nullptr), int(lp.slots), 0, key_bits),
               "cub::DeviceRadixSort (size query)");
  return bytes;
}

void transposed_layout(const LayoutParams& lp, const LayoutBuffers& b, cudaStream_t stream) {
  bwd_layout_keys<<<blocks_for(std::max<int64_t>(lp.slots, lp.ncols), 256), 256, 0, stream>>>(
      lp, b.keys, b.slots, b.col_begin, b.col_end, b.item_counter);
  check_cuda(cudaGetLastError(), "bwd_layout_keys launch");
  if (lp.slots == 0) return;
  size_t bytes = b.sort_bytes;
  check_cuda(cub::DeviceRadixSort::SortPairs(b.sort_temp, bytes, b.keys, b.keys_sorted, b.slots, b.slots_sorted,
                                             int(lp.slots), 0, b.key_bits, stream),
             "cub::DeviceRadixSort (transposed layout)");
  bwd_layout_columns<<<blocks_for(lp.slots, 256), 256, 0, stream>>>(lp, b.keys_sorted, b.slots_sorted, b.q_indices,
                                                                  b.col_begin, b.col_end);
  check_cuda(cudaGetLastError(), "bwd_layout_columns launch");
}

}  // namespace sparsek::attn_bwd_sm90
