// Internal: what the attention layers share about a layout (format/attention_layout.cpp): its
// host copy, the row a (batch, head, query block) reads, the O(layout) content checks, and a
// seeded random layout for tests and benchmarks (format/patterns.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "sparsek/attention.hpp"

namespace sparsek {

// The layout's arrays readable on the host: views of host memory, or copies of device memory.
struct HostLayout {
  const int32_t* num = nullptr;       // kv_num_blocks       [batch, heads, q_blocks]
  const int32_t* idx = nullptr;       // kv_indices          [batch, heads, q_blocks, kmax]
  const int32_t* full_num = nullptr;  // full_kv_num_blocks  (nullptr: no full lists)
  const int32_t* full_idx = nullptr;  // full_kv_indices     [batch, heads, q_blocks, full_kmax]
  const int32_t* cu_seqlens = nullptr;  // the packed sequences' offsets [num_seqs + 1] (nullptr: none)
  std::vector<int32_t> copies[5];
};
// l passed validate()'s cheap checks. Device arrays are copied through copy_to_host()
// (format_internal.hpp): synchronously, after waiting for `stream` (a cudaStream_t, may be null:
// the caller may have written the layout there), and refused while `stream` is being captured.
HostLayout host_layout(const AttentionLayout& l, void* stream = nullptr);
// The same with args.cu_seqlens too (in the layout's memory).
HostLayout host_layout(const AttentionArgs& args, void* stream = nullptr);

// The sequence (index into cu_seqlens) that packed row x belongs to: the last i in [0, n) with
// cu[i] <= x (empty sequences skipped). Never reads outside cu[0 .. n], whatever cu holds. (Host
// and device: the gate's kernels use it too; the attention kernels have their own in the kit.)
#ifdef __CUDACC__
__host__ __device__
#endif
inline int64_t sequence_of(const int32_t* cu, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The layout row (an index into kv_num_blocks) that query block i of batch b and query head h
// reads: the layout's batch and head extents broadcast (1), match (B, Hq) or, for heads, name
// one row per key/value head (Hkv).
inline int64_t layout_row(const AttentionLayout& l, int64_t hq, int64_t hkv, int64_t b, int64_t h, int64_t i) {
  const int64_t lb = l.batch == 1 ? 0 : b;
  const int64_t lh = l.heads == hq ? h : l.heads == hkv ? h / (hq / hkv) : 0;
  return (lb * l.heads + lh) * l.q_blocks + i;
}

// Packed sequences (cu_seqlens, num_seqs), as attention and the gate take them. The checks that
// read no offsets: with cu_seqlens, 1 <= num_seqs < INT32_MAX, B = 1 and Sq = Skv; without it,
// num_seqs = 0. B, Sq and Skv are q.b, q.s and k.s.
void check_packed_sequences(const int32_t* cu_seqlens, int64_t num_seqs, int64_t B, int64_t Sq, int64_t Skv);
// The offsets themselves, on a host copy cu [num_seqs + 1]: cu[0] = 0, never decreasing, and
// cu[num_seqs] = T (the packed length, q.s).
void check_cu_seqlens(const int32_t* cu, int64_t num_seqs, int64_t T);

// The content checks of validate(args, true) on a host view of args.layout: counts in [0, kmax],
// indices sorted, unique and in range, no block in both lists; cu_seqlens (when hl has it) starts
// at 0, never decreases and ends at T. Errors name the array, the index and the value.
void validate_layout_contents(const AttentionArgs& args, const HostLayout& hl);
// The same on args.layout read through host_layout(args.layout, stream); a device layout with no
// GPU to read it from gives Status::no_device.
void check_layout_contents(const AttentionArgs& args, void* stream = nullptr);

// Effective FLOPs of args read through hl (4 * D * unmasked score elements).
double effective_flops(const AttentionArgs& args, const HostLayout& hl);

// ---- a random layout (host arrays), for tests and benchmarks ----

enum class LayoutKind { topk, dense, causal };

struct LayoutArrays {
  int64_t batch = 1, heads = 1, q_blocks = 0, kmax = 0, full_kmax = 0;
  int block = 128;
  std::vector<int32_t> num, idx;            // kv_num_blocks, kv_indices
  std::vector<int32_t> full_num, full_idx;  // both empty: no full lists
  // A host view (block_q = block_kv = block).
  AttentionLayout view() const;
};

// One row per (batch, head) and query block i over nk = ceil(skv / block) key blocks:
//   topk   - round(density * nk) blocks (at least 1) drawn at random;
//   dense  - every block;
//   causal - every block that holds a key <= the block's last query row (as topk/dense with
//            causal; `causal` is implied).
// With causal, blocks holding only later keys are never kept, the diagonal block (j = i) always
// is when it exists, and blocks with no key past the block's first query row go to the full
// lists (they need no element mask); the rest stay in kv_indices. kmax and full_kmax are the
// longest rows; entries past a row's count are -1. Seeded: the same arguments give the same
// layout everywhere.
// cu_seqlens (packed sequences, batch 1, sq = skv = cu_seqlens.back()): query block i keeps only
// blocks that hold keys of the sequences its rows belong to (the blocks from the first row's
// sequence start to the last row's sequence end), and density is of those: a per-sequence layout.
LayoutArrays random_attention_layout(LayoutKind kind, int64_t batch, int64_t heads, int64_t sq, int64_t skv,
                                     int block, double density, bool causal, uint64_t seed,
                                     const std::vector<int32_t>& cu_seqlens = {});
const char* to_string(LayoutKind k);

}  // namespace sparsek
