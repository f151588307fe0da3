// The Hopper kit: packed sequences (attention's cu_seqlens). Which sequence a packed row belongs to,
// as a warp (the producers: a ballot per 32 offsets, one round of loads for up to 33 sequences) and
// as one thread (the consumers' element masks: a binary search). Both read only cu[0 .. n] whatever
// cu holds, so malformed offsets give wrong masks, never a read out of bounds.
#pragma once
#include <cstdint>

namespace sparsek::kit {

// The sequences of rows x0 and x1 (uniform over the warp): the number of offsets cu[1 .. n-1] at
// or below each, i.e. the last i in [0, n) with cu[i] <= x for non-decreasing offsets.
__device__ __forceinline__ void warp_sequences_of(const int* cu, int n, int x0, int x1, int& s0, int& s1) {
  const int lane = threadIdx.x % 32;
  s0 = s1 = 0;
  for (int i0 = 1; i0 < n; i0 += 32) {
    const int i = i0 + lane;
    const int c = i < n ? __ldg(cu + i) : INT32_MAX;
    s0 += __popc(__ballot_sync(0xffffffffu, c <= x0));
    s1 += __popc(__ballot_sync(0xffffffffu, c <= x1));
  }
}

// The rows [lo, hi) of row x's sequence (one thread).
__device__ __forceinline__ void sequence_rows(const int* cu, int n, int x, int& lo, int& hi) {
  int a = 0, b = n - 1;  // the sequence is in [a, b]
  while (a < b) {
    const int mid = (a + b + 1) / 2;
    if (__ldg(cu + mid) <= x) a = mid; else b = mid - 1;
  }
  lo = __ldg(cu + a);
  hi = __ldg(cu + a + 1);
}

}  // namespace sparsek::kit
