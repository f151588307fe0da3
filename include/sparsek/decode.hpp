// sparsek — decode attention over a paged KV cache, optionally restricted to selected pages.
//
// A batch of B requests, request b holding seq_lens[b] tokens in the cache, of which its
// n_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] newest (1 <= n_b <= 16) are the query tokens of this
// step (one for plain decoding, more for speculative decoding / multi-token prediction):
//
//   q        [T, Hq, D]   rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 are request b's new tokens
//   k, v     [num_pages, page_size, Hkv, D]   the cache, in physical pages
//   page_table int32 [B, max_pages]: logical page p of request b (its tokens p*page_size ..
//            (p+1)*page_size - 1) is physical page page_table[b, p]; only the first
//            ceil(seq_lens[b] / page_size) entries of a row are read
//   seq_lens int32 [B], cu_seqlens_q int32 [B + 1] (cu_seqlens_q[0] = 0, cu_seqlens_q[B] = T)
//   selection (optional): sel_indices int32 [B, Hkv, sel_kmax] logical pages, sel_counts int32
//            [B, Hkv]: key/value head hk of request b sees only the tokens of pages
//            sel_indices[b, hk, 0 : sel_counts[b, hk]] (sorted, unique, < ceil(seq_lens[b] /
//            page_size); the caller includes the newest page if the new tokens should see
//            themselves). Entries past a row's count are ignored.
//
// Query head h reads key/value head h / (Hq / Hkv) (GQA, MQA). With causal_new, new token j
// (0-based among the n_b) of request b, at position seq_lens[b] - n_b + j, sees the key positions
// <= its own; without it every new token sees all seq_lens[b] positions. Then, per (token, head):
//
//   O   = softmax(scale * q . k over the visible keys) V          (O has q's dtype)
//   LSE = log(sum over the visible keys of exp(scale * q . k))    (f32, natural log)
//
// A row that sees no key (an empty selection, or selected pages all after it) gets O = 0 and
// LSE = -inf.
//
// Supported: D 64 or 128; q, k, v, o one dtype (f16 or bf16 on the GPU; f32 too on the CPU);
// page_size a multiple of 16 in [16, 128]; the last dimension (D) contiguous, any other strides
// (the GPU needs strides that are multiples of 8 elements and 16-byte aligned pointers).
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "sparsek/gemm.hpp"  // Options
#include "sparsek/types.hpp"

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

// Non-owning view of a [T, H, D] tensor of tokens; strides in elements, D contiguous.
struct TokensView {
  void* data = nullptr;
  DType dtype = DType::bf16;
  Memory memory = Memory::device;
  int64_t t = 0, h = 0, d = 0;
  int64_t stride_t = 0, stride_h = 0;

  int64_t index(int64_t it, int64_t ih, int64_t id) const { return it * stride_t + ih * stride_h + id; }
  static TokensView packed(void* data, DType dtype, Memory memory, int64_t t, int64_t h, int64_t d) {
    TokensView v;
    v.data = data, v.dtype = dtype, v.memory = memory;
    v.t = t, v.h = h, v.d = d;
    v.stride_h = d, v.stride_t = h * d;
    return v;
  }
};

// Non-owning view of a paged cache [pages, page_size, H, D]; strides in elements, D contiguous.
struct PagedCacheView {
  void* data = nullptr;
  DType dtype = DType::bf16;
  Memory memory = Memory::device;
  int64_t pages = 0, page_size = 0, h = 0, d = 0;
  int64_t stride_page = 0, stride_slot = 0, stride_h = 0;

  int64_t index(int64_t ip, int64_t is, int64_t ih, int64_t id) const {
    return ip * stride_page + is * stride_slot + ih * stride_h + id;
  }
  static PagedCacheView packed(void* data, DType dtype, Memory memory, int64_t pages, int64_t page_size, int64_t h,
                               int64_t d) {
    PagedCacheView v;
    v.data = data, v.dtype = dtype, v.memory = memory;
    v.pages = pages, v.page_size = page_size, v.h = h, v.d = d;
    v.stride_h = d, v.stride_slot = h * d, v.stride_page = page_size * h * d;
    return v;
  }
};

inline constexpr int kDecodeMaxNewTokens = 16;  // new tokens per request and step

struct DecodeArgs {
  TokensView q;          // [T, Hq, D]
  PagedCacheView k, v;   // [num_pages, page_size, Hkv, D], same shape and strides
  TokensView o;          // output [T, Hq, D], q's dtype and memory
  float* lse = nullptr;  // output [T, Hq] f32 contiguous; nullptr: not written
  // int32 index arrays, contiguous, all in `index_memory`.
  const int32_t* page_table = nullptr;    // [batch, max_pages]
  const int32_t* seq_lens = nullptr;      // [batch]
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1]
  const int32_t* sel_indices = nullptr;   // optional (both or neither): [batch, Hkv, sel_kmax]
  const int32_t* sel_counts = nullptr;    // [batch, Hkv]
  int64_t batch = 0, max_pages = 0, sel_kmax = 0;
  Memory index_memory = Memory::device;
  bool causal_new = true;
  float scale = 0.f;  // 0: 1 / sqrt(D)

  bool has_selection() const { return sel_counts != nullptr; }
  float softmax_scale() const { return scale != 0.f ? scale : 1.f / std::sqrt(float(q.d > 0 ? q.d : 1)); }
};

// Checks shapes, dtypes, strides, memory kinds and pointers; with check_contents also the index
// arrays' contents (device arrays are copied to the host in `stream`'s order, which synchronizes;
// refused while `stream` is being captured): cu_seqlens_q starts at 0, ends at T, each request has
// 1..16 new tokens and no more than its seq_len; seq_lens fit the request's max_pages pages;
// page_table entries that are read are in [0, num_pages); selection counts in [0, sel_kmax],
// indices sorted, unique, in [0, ceil(seq_len / page_size)). Errors name the array, the index
// and the value, e.g. "page_table[1, 3] = 900 is out of range [0, 512)".
void validate(const DecodeArgs& args, bool check_contents = true, void* stream = nullptr);

// Plan once for shapes, strides, dtypes, memory kinds, batch, max_pages, sel_kmax (with or
// without a selection), causal_new and scale; run with any pointers and any index contents of
// those extents. The GPU plan allocates its workspace (the split-KV partials) here; run()
// allocates nothing, launches in `stream` and may be captured in a CUDA graph. run() does not
// check the index contents: bad contents give wrong values but never a read outside the cache,
// the page table or the selection (counts are clamped, out-of-range pages skipped). The workspace
// is used in one stream's order: runs that may overlap on two streams need a plan each. Copies of
// a plan share its workspace.
class DecodePlan {
 public:
  DecodePlan();
  ~DecodePlan();
  DecodePlan(const DecodePlan&);
  DecodePlan& operator=(const DecodePlan&);
  DecodePlan(DecodePlan&&) noexcept;
  DecodePlan& operator=(DecodePlan&&) noexcept;

  explicit operator bool() const { return impl_ != nullptr; }
  Backend backend() const;
  const std::string& variant() const;
  int kv_splits() const;  // how many chunks the GPU splits each request's pages into (1 on the CPU)
  size_t workspace_bytes() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend DecodePlan plan(const DecodeArgs&, const Options&, int);
  friend void run(const DecodePlan&, const DecodeArgs&, void*);
};

// Options::backend picks the backend (automatic: by q's memory); Options::threads the CPU threads;
// Options::variant: "cpu" on the host; "cuda_mma" (mma.sync tensor cores; the default) or "cuda"
// (CUDA cores) on the GPU (sm_80+).
DecodePlan plan(const DecodeArgs& problem, const Options& options = {});
// The same with the number of KV chunks forced (0: the heuristic; GPU only; clamped to [1, 64]).
DecodePlan plan(const DecodeArgs& problem, const Options& options, int kv_splits);
void run(const DecodePlan& plan, const DecodeArgs& args, void* stream = nullptr);

// One shot: validate (the index contents too when options.check_indices), plan, run on
// options.stream. No plan cache: a GPU call allocates its workspace and frees it (which
// synchronizes the device), so it is for tests and scripts; serving code keeps a plan and calls
// run(), which is what may be captured in a CUDA graph.
void decode_attention(const DecodeArgs& args, const Options& options = {});

// ---------------------------------------------------------------- page selection (the decode gate)
//
// Chooses the pages each key/value head attends in a decode step, from per-page key summaries kept
// beside the cache (the bound of Quest, Tang et al. 2024):
//
//   summaries [num_pages, Hkv, 2, D] in the cache's dtype and memory, packed: for physical page p and
//            key/value head h, [p, h, 0, :] is the per-channel minimum and [p, h, 1, :] the maximum
//            of the keys in the page's stored slots (those below the owning request's seq_len).
//            Minima and maxima of cache values are cache values: no rounding.
//
// update_page_summaries() recomputes, from all their stored slots, the summaries of the pages that
// hold request b's new tokens (positions seq_lens[b] - n_b .. seq_lens[b] - 1, n_b from
// cu_seqlens_q), or of every page below seq_lens[b] with all_pages (after a prefill). Call it once
// the step's keys are in the cache. It reads k, page_table, seq_lens, cu_seqlens_q. Requests that
// share a physical page (a shared prefix) must agree on its stored slots.
//
// select_pages() scores every page p < ceil(seq_lens[b] / page_size) of request b for key/value
// head hk with the largest bound on q . k over the page's keys that any of the group's query vectors
// reaches (query heads hk*G .. hk*G+G-1 of the request's n_b new tokens, G = Hq / Hkv):
//
//   score = max over those q of  sum over d = 0..D-1 of  min(q_d, 0) * min_d + max(q_d, 0) * max_d
//
// (= q_d * (q_d >= 0 ? max_d : min_d) for finite values; a summary holding an infinity can make a
// bound NaN, and a NaN bound is never picked). The sums are f32: on the CPU fused multiply-adds in
// ascending d, on the GPU tensor-core products (f16/bf16 inputs, exact products, f32 accumulation in
// the hardware's order). The two backends can differ in the last bits of a score, and so choose
// differently between pages whose scores are that close; each is deterministic run to run, and on
// data whose sums are exact in f32 (small integers) they choose the same pages. It keeps pages 0 .. sink-1, the `local` newest pages and the `topk` best of the others (equal
// scores: the lower page; NaN and -inf scores are never picked), in ascending order:
// sel_indices[b, hk, 0 : sel_counts[b, hk]] (entries past the count are set to 0), the selection
// decode_attention() takes. With local >= 1 the page holding the newest tokens is always kept.
// It reads q (the scale does not change the order), the summaries, page_table (the physical page
// of each logical one), seq_lens and cu_seqlens_q; k only for its shape (k.data may be null).
// update_page_summaries reads q's shape only (q.t bounds cu_seqlens_q; q.data may be null).
struct PageSelectArgs {
  TokensView q;        // [T, Hq, D] the step's new tokens (select_pages)
  PagedCacheView k;    // [num_pages, page_size, Hkv, D] the key cache
  void* summaries = nullptr;  // [num_pages, Hkv, 2, D], k's dtype and memory
  // int32 index arrays, contiguous, in `index_memory`, as in DecodeArgs.
  const int32_t* page_table = nullptr;    // [batch, max_pages]
  const int32_t* seq_lens = nullptr;      // [batch]
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1]
  int64_t batch = 0, max_pages = 0;
  Memory index_memory = Memory::device;
  // select_pages' outputs, in index_memory: [batch, Hkv, sel_kmax] and [batch, Hkv];
  // sel_kmax >= min(max_pages, topk + sink + local).
  int32_t* sel_indices = nullptr;
  int32_t* sel_counts = nullptr;
  int64_t sel_kmax = 0;
  int64_t topk = 0, sink = 1, local = 1;
  bool all_pages = false;  // update_page_summaries: every stored page, not only the new tokens'
};

// Checks what `op` (update_page_summaries or select_pages) reads and writes: shapes, dtypes,
// strides, memory kinds, pointers, outputs overlapping inputs; with check_contents also the index
// arrays (as validate(DecodeArgs) does: device arrays are copied to the host in `stream`'s order).
enum class PageOp { update_summaries, select };
void validate(const PageSelectArgs& args, PageOp op, bool check_contents = true, void* stream = nullptr);

// Validate (contents too when options.check_indices), then run on options.stream (k's memory, that
// of the cache and the summaries, picks the backend: the CPU for host memory, the GPU (sm_80+) for
// device memory). Allocation-free: a GPU
// call may be captured in a CUDA graph (with check_indices off). Bad index contents give wrong
// selections, never a read or write outside the arrays.
void update_page_summaries(const PageSelectArgs& args, const Options& options = {});
void select_pages(const PageSelectArgs& args, const Options& options = {});

}  // namespace sparsek
#pragma GCC visibility pop
