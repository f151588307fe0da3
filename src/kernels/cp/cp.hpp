// Internal: the memory-bound kernels of context-parallel attention (src/plan/attention_cp.cpp):
// moving packed key/value blocks between a rank's shards and its transfer buffers, adding
// gradients, and merging two partial attention results by their LSE. Plain C++: no CUDA types.
// The host-memory equivalents are in attention_cp.cpp.
#pragma once
#include <cstdint>

#include "sparsek/types.hpp"

namespace sparsek::cp_gpu {

// A run of n contiguous elements (or bytes, for copy) at src + from in one buffer and dst + to in another.
struct Span {
  int64_t from = 0, to = 0, n = 0;
};

// dst[s.to + i] = src[s.from + i] for i < s.n bytes, for each of `count` spans (device memory);
// every offset and length a multiple of 16 bytes. longest: the largest s.n (sizes the grid).
void copy(const Span* spans, int64_t count, int64_t longest, const void* src, void* dst, void* stream);
// dst[s.to + i] = round(dst[s.to + i] + src[s.from + i]) in float, elements of dtype (bf16 or f16),
// for each span; spans write disjoint elements (they run concurrently).
void add(const Span* spans, int64_t count, int64_t longest, const void* src, void* dst, DType dtype, void* stream);
// Rows of d elements (packed, row r at r * d): with w1 = exp(lse - m), w2 = exp(lse2 - m),
// m = max(lse, lse2): o = (w1 o + w2 o2) / (w1 + w2), lse = m + log(w1 + w2); both -inf: o = 0,
// lse = -inf. In place in o and lse.
void merge(void* o, float* lse, const void* o2, const float* lse2, int64_t rows, int64_t d, DType dtype, void* stream);

}  // namespace sparsek::cp_gpu
