// Hopper attention backward, the passes around the main kernel: the transposed layout (layout.cu)
// and the memory-bound passes (passes.cu): K/V bounds and row statistics before, dq after. Their
// parameters and launchers, as the variant's run() drives them.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sparsek::attn_bwd_sm90 {

// ---- the transposed layout (runs first: it also resets the item counter) ----
struct LayoutParams {
  const int* kv_num;
  const int* kv_idx;
  const int* full_num;  // null: no full blocks
  const int* full_idx;
  int64_t slots;  // layout rows * (kmax + full_kmax)
  int width, kmax, full_kmax, mq, nkb, ncols;
};
// The transposed layout's buffers (the plan's workspace) and its sort scratch.
struct LayoutBuffers {
  unsigned *keys, *keys_sorted;
  int *slots, *slots_sorted, *q_indices, *col_begin, *col_end, *item_counter;
  void* sort_temp;
  size_t sort_bytes;
  int key_bits;
};
// Bytes of sort scratch for lp's slots (cub's size query).
size_t transposed_layout_scratch(const LayoutParams& lp, int key_bits);
// q_indices and every column's [begin, end) from the forward layout, on `stream`: every in-range entry
// becomes a (column, query block, full?) record; a stable radix sort by column orders each column's
// query blocks ascending; a pass writes the sorted records and the columns' bounds.
void transposed_layout(const LayoutParams& lp, const LayoutBuffers& b, cudaStream_t stream);

// ---- the memory-bound passes ----

// Per (batch, key/value head): {max |K element|, max ||V row||^2} as float bit patterns. Both are
// >= 0, so an unsigned max orders them, and every NaN pattern (sign cleared) lies above +inf's: a
// non-finite value anywhere in the head leaves a non-finite bound. Zeroed before each run.
struct KvParams {
  const void* k;
  const void* v;
  unsigned* bounds;  // [B * Hkv][2]
  int64_t k_sb, k_sh, k_ss, v_sb, v_sh, v_ss;
  int hkv, skv;
};

struct RowParams {
  const void* o;
  const void* dout;
  const float* lse;          // [B, Hq, Sq]
  const unsigned* bounds;    // [B * Hkv][2] from bwd_kv_bounds (deterministic mode)
  float4* rowinfo;           // [B, Hq, sq_pad]
  int64_t o_sb, o_sh, o_ss, do_sb, do_sh, do_ss;
  int hq, group, sq, sq_pad, det;
};


// dq = accumulator * u * scale (u = 1 / the grid scale; NaN for a row marked non-finite). The
// accumulator tiles hold 64 x 64 elements in the order of a wgmma m64n64 fp32 accumulator: element
// (register r, thread t) at (r / 4) * 512 + t * 4 + r % 4, i.e. row 16 (t / 32) + (t % 32) / 4 +
// 8 ((r / 2) % 2), column 8 (r / 4) + 2 (t % 4) + r % 2. Read 16 bytes per thread, transposed
// through shared memory, written a 128-byte row per warp instruction.
struct DqParams {
  const void* acc;
  const float4* rowinfo;
  void* dq;
  int64_t sb, sh, ss;
  int hq, sq, sq_pad, r64, tn, det;
  float scale;
};

void launch_kv_bounds(const KvParams& kp, bool bf16, int d, int64_t heads, int64_t chunks, cudaStream_t stream);
void launch_preprocess(const RowParams& rp, bool bf16, int d, int64_t heads, int64_t chunks, cudaStream_t stream);
void launch_postprocess(const DqParams& dp, bool bf16, int64_t tiles, cudaStream_t stream);

}  // namespace sparsek::attn_bwd_sm90
