/* sparsek — C API. Every function returns a sparsek_status; on failure the thread-local text of
 * sparsek_last_error() names the argument and the offending value. Nothing here throws. */
#ifndef SPARSEK_H
#define SPARSEK_H
#include <stdint.h>

#include "sparsek/version.h"

/* Exported from libsparsek (the build hides every other symbol). */
#pragma GCC visibility push(default)

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  SPARSEK_OK = 0,
  SPARSEK_INVALID_ARGUMENT = 1,
  SPARSEK_UNSUPPORTED = 2,
  SPARSEK_CUDA_ERROR = 3,
  SPARSEK_NO_DEVICE = 4,
  SPARSEK_IO_ERROR = 5,
  SPARSEK_INTERNAL = 6,
  SPARSEK_NCCL_ERROR = 7 /* an NCCL call failed: the message names the call and NCCL's error */
} sparsek_status;

/* SPARSEK_E4M3: 8-bit float (1 sign, 4 exponent, 3 mantissa bits; no infinities, largest value 448),
 * an input type of the dsd and dds products only, always with fp32 scales (below). */
typedef enum { SPARSEK_F32 = 0, SPARSEK_F16 = 1, SPARSEK_BF16 = 2, SPARSEK_E4M3 = 3 } sparsek_dtype;
typedef enum { SPARSEK_ROW_MAJOR = 0, SPARSEK_COL_MAJOR = 1 } sparsek_layout;
typedef enum { SPARSEK_OP_NONE = 0, SPARSEK_OP_TRANS = 1 } sparsek_op;
typedef enum { SPARSEK_HOST = 0, SPARSEK_DEVICE = 1 } sparsek_memory;

/* A BSR matrix. E4M3 values carry one fp32 scale per stored block (`scales`, [nnzb], in the values'
 * memory; element = scale * decoded value); other dtypes leave `scales` NULL. Scales must be
 * finite and >= 0. Zero-initialize the struct: later fields default to NULL. */
typedef struct {
  int64_t rows, cols;
  int32_t bm, bk;
  int64_t nnzb;
  const int32_t* row_ptr; /* [rows/bm + 1] */
  const int32_t* col_idx; /* [nnzb] */
  void* values;           /* [nnzb][bm][bk] */
  sparsek_dtype dtype;
  sparsek_memory memory;
  const float* scales;    /* E4M3 only: [nnzb]; else NULL */
} sparsek_bsr;

/* A dense matrix. An E4M3 input carries fp32 scales along its non-reduction dimension, one per
 * token: per row of a dds's A (M x K), per column of a dsd's B (K x N). scale_group 0: one scale
 * per token ([M] or [N] floats); 128: one per token and 128-wide group of K, [M or N][ceil(K/128)]
 * row-major. Element = scale * decoded value. Other dtypes (and outputs) leave scales NULL and
 * scale_group 0. */
typedef struct {
  void* data;
  int64_t rows, cols, ld;
  sparsek_layout layout;
  sparsek_dtype dtype;
  sparsek_memory memory;
  const float* scales;    /* E4M3 only; else NULL */
  int32_t scale_group;    /* E4M3 only: 0 or 128; else 0 */
} sparsek_dense;

/* Thread-local text of the last failure on this thread ("" after a success). */
const char* sparsek_last_error(void);
const char* sparsek_status_string(sparsek_status s);
const char* sparsek_version(void);
/* 1 when a CUDA device answers, else 0. */
int sparsek_has_cuda(void);

/* Products. C's memory (first to last element, padding included; for sdd C's values) must not
 * overlap any input's (values, row_ptr, col_idx, dense operands): an overlap is refused with
 * SPARSEK_INVALID_ARGUMENT naming both operands (products are not computed in place). Enum fields
 * outside their values, and sizes whose byte extent overflows 64 bits, are refused with the value.
 * An output element that no stored block reaches (an empty block row) is beta*C (0 when beta = 0);
 * on the CPU backend also for alpha = +-Inf (the GPU kernels still give Inf*0 = NaN there). alpha
 * and beta must not be NaN. */
/* C = alpha*op(A)*B + beta*C, A sparse. stream: a cudaStream_t or NULL (device work only). */
sparsek_status sparsek_dsd(sparsek_op op_a, float alpha, const sparsek_bsr* a, const sparsek_dense* b,
                           float beta, sparsek_dense* c, void* stream);
/* C = alpha*A*op(B) + beta*C, B sparse. */
sparsek_status sparsek_dds(sparsek_op op_b, float alpha, const sparsek_dense* a, const sparsek_bsr* b,
                           float beta, sparsek_dense* c, void* stream);
/* C = alpha*(A*B) + beta*C on C's stored blocks. */
sparsek_status sparsek_sdd(float alpha, const sparsek_dense* a, const sparsek_dense* b, float beta,
                           sparsek_bsr* c, void* stream);
/* Validates a BSR description (all checks incl. the O(nnzb) index checks for host memory). */
sparsek_status sparsek_bsr_validate(const sparsek_bsr* a);

/* ---- fp8 (E4M3) products ----
 * dsd and dds take E4M3 for the sparse values and the dense input together (E4M3 beside another
 * dtype is SPARSEK_INVALID_ARGUMENT naming both), each with its scales, and compute
 *   C = alpha * (sA . A) (sB . B) + beta * C    (sX . X: every element times its scale)
 * accumulating in fp32; C is F16, BF16 or F32. sdd has no E4M3 form (SPARSEK_UNSUPPORTED). Scales
 * are checked like the pattern: a NaN, infinite or negative scale is refused with its array, index
 * and value.
 *
 * Quantization: a group (a stored block; a token, or a token's 128-wide slice of K) gets
 * scale = amax / 448 (its largest |x| over e4m3's largest value) and codes e4m3(x / scale),
 * rounded to nearest even, saturating; a group of zeros gets scale 0 and zero codes. Host inputs
 * must be finite (else SPARSEK_INVALID_ARGUMENT naming the element); on the GPU a group holding a
 * NaN or infinity gets a NaN scale instead, which the products refuse. Device work goes on `stream`
 * (a cudaStream_t or NULL), unsynchronized; host and device give the same bits. */

/* Which dimension of a dense matrix holds the tokens (one scale each); the other is K. */
typedef enum { SPARSEK_SCALE_ROWS = 0, SPARSEK_SCALE_COLS = 1 } sparsek_scale_dim;

/* *count = the number of scales of `tokens` tokens with reduction length k: tokens for
 * scale_group 0, tokens * ceil(k / 128) for 128. */
sparsek_status sparsek_scale_count(int64_t tokens, int64_t k, int32_t scale_group, int64_t* count);
/* in: F32/F16/BF16 values (scales NULL); values: nnzb*bm*bk bytes of codes, scales: nnzb floats, both
 * in in->memory. The pattern is not read. */
sparsek_status sparsek_quantize_bsr_e4m3(const sparsek_bsr* in, void* values, float* scales, void* stream);
/* in: E4M3 with scales; values: nnzb*bm*bk elements of `dtype` (F32, F16 or BF16) in in->memory. */
sparsek_status sparsek_dequantize_bsr(const sparsek_bsr* in, void* values, sparsek_dtype dtype, void* stream);
/* in: F32/F16/BF16, rows x cols; out: E4M3, the same shape and memory, its own layout and ld;
 * scales: sparsek_scale_count(tokens, K, scale_group) floats. On success out->scales = scales and
 * out->scale_group = scale_group. */
sparsek_status sparsek_quantize_dense_e4m3(const sparsek_dense* in, sparsek_dense* out, float* scales,
                                           sparsek_scale_dim dim, int32_t scale_group, void* stream);
/* in: E4M3 with its scales and scale_group; out: F32/F16/BF16, the same shape and memory. */
sparsek_status sparsek_dequantize_dense(const sparsek_dense* in, const sparsek_dense* out, sparsek_scale_dim dim,
                                        void* stream);

/* ---- Plans: check and prepare once per pattern, run many times ---- */
typedef enum { SPARSEK_DSD = 0, SPARSEK_DDS = 1, SPARSEK_SDD = 2 } sparsek_kind;

/* One product. Slots by kind (unused ones are ignored):
 *   DSD: sparse = A, b = B, c = C     DDS: a = A, sparse = B, c = C
 *   SDD: a = A, b = B, sparse = C (its values are the output) */
typedef struct {
  sparsek_kind kind;
  sparsek_op op; /* on the sparse operand; SPARSEK_OP_NONE for SDD */
  float alpha, beta;
  sparsek_bsr sparse;
  sparsek_dense a, b, c;
} sparsek_gemm_args;

typedef struct sparsek_plan_s* sparsek_plan;

/* Makes a plan for `problem`: all checks incl. the O(nnzb) index checks (device indices are copied
 * to the host once), row-length analysis, the variant choice and its set-up. `variant`: NULL or ""
 * = automatic (tuning cache / heuristic per SPARSEK_TUNE), else a variant name. The pattern arrays
 * must outlive the plan unchanged. On failure *plan is set to NULL. */
sparsek_status sparsek_plan_create(sparsek_plan* plan, const sparsek_gemm_args* problem, const char* variant);
/* Runs the plan on args: same kind, op, shapes, dtypes, layouts, lds, memory and pattern pointers
 * as the problem (values, dense pointers, alpha and beta may differ). Allocates nothing; device work
 * goes on `stream` (a cudaStream_t or NULL), unsynchronized, and may be captured in a CUDA graph. */
sparsek_status sparsek_plan_run(sparsek_plan plan, const sparsek_gemm_args* args, void* stream);
/* Frees the plan (NULL is accepted). Every plan function checks its handle against the live ones:
 * a plan already destroyed, or a pointer sparsek_plan_create did not return, gives
 * SPARSEK_INVALID_ARGUMENT (sparsek_plan_variant: ""), never a crash. */
sparsek_status sparsek_plan_destroy(sparsek_plan plan);
/* Name of the chosen variant, valid while the plan lives ("" for a NULL plan). */
const char* sparsek_plan_variant(sparsek_plan plan);
/* Scratch memory the plan holds, in bytes (0 when none). */
sparsek_status sparsek_plan_workspace_bytes(sparsek_plan plan, uint64_t* bytes);

/* ---- Block-sparse attention ----
 *   O = softmax(scale * Q K^T restricted to a block layout) V,  LSE = log of the softmax's sum
 * per query row (natural log). The semantics are those of sparsek/attention.hpp: the layout follows
 * FlexAttention's BlockMask; causal masks key j > query i inside the kv_indices blocks only; keys
 * past Skv are never attended; a row with no attended key gets O = 0 and LSE = -inf; query head h
 * reads key/value head h / (Hq / Hkv). */

/* A [b, h, s, d] tensor; strides in elements, d contiguous. */
typedef struct {
  void* data;
  sparsek_dtype dtype;
  sparsek_memory memory;
  int64_t b, h, s, d;
  int64_t stride_b, stride_h, stride_s;
} sparsek_tensor4;

/* A block layout; int32 arrays, contiguous. full_kv_num_blocks / full_kv_indices: both or NULL. */
typedef struct {
  const int32_t* kv_num_blocks;      /* [batch, heads, q_blocks] */
  const int32_t* kv_indices;         /* [batch, heads, q_blocks, kmax] */
  const int32_t* full_kv_num_blocks; /* [batch, heads, q_blocks] or NULL */
  const int32_t* full_kv_indices;    /* [batch, heads, q_blocks, full_kmax] or NULL */
  int64_t batch;    /* 1 or B */
  int64_t heads;    /* 1, Hq or Hkv */
  int64_t q_blocks; /* ceil(Sq / block_q) */
  int64_t kmax, full_kmax;
  int32_t block_q, block_kv; /* 64 or 128, equal */
  sparsek_memory memory;
} sparsek_attention_layout;

typedef struct {
  sparsek_tensor4 q;    /* [B, Hq, Sq, D], D 64 or 128; f16 or bf16 (f32 too in host memory) */
  sparsek_tensor4 k, v; /* [B, Hkv, Skv, D], q's dtype */
  sparsek_tensor4 o;    /* output [B, Hq, Sq, D], q's dtype; must not overlap an input */
  float* lse;           /* output [B, Hq, Sq] f32 contiguous, or NULL */
  sparsek_attention_layout layout;
  int32_t causal; /* 0 or 1 */
  float scale;    /* 0: 1 / sqrt(D) */
  /* Packed sequences (varlen), or NULL and 0: q, k and v hold num_seqs sequences one after another
   * (B = 1, Sq = Skv = T), sequence i at rows cu_seqlens[i] .. cu_seqlens[i + 1] - 1; a query
   * attends only keys of its own sequence (causal: within it). int32 [num_seqs + 1] in the layout's
   * memory, 0 = cu_seqlens[0] <= ... <= cu_seqlens[num_seqs] = T. The layout is over the packed
   * sequence's blocks (a block may span a boundary). Zero-initialize the struct: NULL and 0 here
   * mean no packed sequences. */
  const int32_t* cu_seqlens;
  int64_t num_seqs;
} sparsek_attention_args;

/* One shot: checks everything, the layout's contents included (a device layout is copied to the
 * host for that, after waiting for `stream`), then runs. stream: a cudaStream_t or NULL. */
sparsek_status sparsek_attention(const sparsek_attention_args* args, void* stream);

typedef struct sparsek_attention_plan_s* sparsek_attention_plan;

/* Makes a plan for the problem's shapes, strides, dtypes, memory, layout extents, causal, scale
 * and num_seqs (the layout's contents and cu_seqlens are not read). `variant`: NULL or "" = automatic, else a variant
 * name. On failure *plan is set to NULL. */
sparsek_status sparsek_attention_plan_create(sparsek_attention_plan* plan, const sparsek_attention_args* problem,
                                             const char* variant);
/* Runs the plan on args that match the problem but for the pointers (data, layout arrays and
 * cu_seqlens may change; so may their contents, which are not checked: a malformed layout or
 * cu_seqlens gives undefined values, never a crash). Allocates nothing; device work goes on `stream`, unsynchronized, and may
 * be captured in a CUDA graph. */
sparsek_status sparsek_attention_plan_run(sparsek_attention_plan plan, const sparsek_attention_args* args,
                                          void* stream);
/* Frees the plan (NULL is accepted). As for sparsek_plan_destroy, every attention plan function
 * checks its handle against the live ones: a destroyed or foreign handle gives
 * SPARSEK_INVALID_ARGUMENT (sparsek_attention_plan_variant: ""), never a crash. */
sparsek_status sparsek_attention_plan_destroy(sparsek_attention_plan plan);
/* Name of the chosen variant, valid while the plan lives ("" for a NULL plan). */
const char* sparsek_attention_plan_variant(sparsek_attention_plan plan);
/* Scratch memory the plan holds, in bytes (0 when none). */
sparsek_status sparsek_attention_plan_workspace_bytes(sparsek_attention_plan plan, uint64_t* bytes);

/* ---- Decode attention over a paged KV cache ----
 * A batch of requests, each with 1..16 new tokens (the last of its seq_lens tokens), attending its
 * cache pages or only selected pages per key/value head. The semantics are those of
 * sparsek/decode.hpp: new token j of n sees the positions < seq_len - n + j + 1 (causal_new); a
 * row that sees no key gets O = 0 and LSE = -inf; query head h reads key/value head h / (Hq / Hkv). */

/* A [t, h, d] tensor of tokens; strides in elements, d contiguous. */
typedef struct {
  void* data;
  sparsek_dtype dtype;
  sparsek_memory memory;
  int64_t t, h, d;
  int64_t stride_t, stride_h;
} sparsek_tokens;

/* A paged cache [pages, page_size, h, d]; strides in elements, d contiguous. */
typedef struct {
  void* data;
  sparsek_dtype dtype;
  sparsek_memory memory;
  int64_t pages, page_size, h, d;
  int64_t stride_page, stride_slot, stride_h;
} sparsek_paged_cache;

typedef struct {
  sparsek_tokens q;          /* [T, Hq, D], D 64 or 128; f16 or bf16 (f32 too in host memory) */
  sparsek_paged_cache k, v;  /* [num_pages, page_size, Hkv, D], page_size a multiple of 16 in [16, 128] */
  sparsek_tokens o;          /* output [T, Hq, D], q's dtype; must not overlap an input */
  float* lse;                /* output [T, Hq] f32 contiguous, or NULL */
  const int32_t* page_table;   /* [batch, max_pages]: physical page of each logical page */
  const int32_t* seq_lens;     /* [batch] */
  const int32_t* cu_seqlens_q; /* [batch + 1] */
  const int32_t* sel_indices;  /* [batch, Hkv, sel_kmax] sorted unique logical pages, or NULL */
  const int32_t* sel_counts;   /* [batch, Hkv], or NULL (both or neither) */
  int64_t batch, max_pages, sel_kmax;
  sparsek_memory index_memory; /* where the int32 arrays live: q's memory */
  int32_t causal_new;          /* 0 or 1 */
  float scale;                 /* 0: 1 / sqrt(D) */
} sparsek_decode_args;

/* One shot: checks everything, the index arrays' contents included (device arrays are copied to
 * the host after waiting for `stream`), plans and runs (on the GPU it allocates and frees a
 * workspace: keep a plan for serving). */
sparsek_status sparsek_decode_attention(const sparsek_decode_args* args, void* stream);

typedef struct sparsek_decode_plan_s* sparsek_decode_plan;
/* Makes a plan for the problem's shapes, strides, dtypes, memory, batch, max_pages, sel_kmax,
 * causal_new and scale (the index arrays' contents are not read). kv_splits: 0 = the heuristic,
 * else the number of KV chunks on the GPU (1..64). On failure *plan is set to NULL. */
sparsek_status sparsek_decode_plan_create(sparsek_decode_plan* plan, const sparsek_decode_args* problem,
                                          int32_t kv_splits);
/* Runs the plan on args that match the problem but for the pointers and the index contents (not
 * checked: malformed ones give wrong values, never an out-of-bounds read). Allocates nothing;
 * device work goes on `stream`, unsynchronized, and may be captured in a CUDA graph. */
sparsek_status sparsek_decode_plan_run(sparsek_decode_plan plan, const sparsek_decode_args* args, void* stream);
/* Frees the plan (NULL is accepted); a destroyed or foreign handle gives SPARSEK_INVALID_ARGUMENT. */
sparsek_status sparsek_decode_plan_destroy(sparsek_decode_plan plan);
/* The plan's KV chunks and workspace bytes (either pointer may be NULL). */
sparsek_status sparsek_decode_plan_info(sparsek_decode_plan plan, int32_t* kv_splits, uint64_t* workspace_bytes);

/* ---- Page selection for decode (the decode gate) ----
 * Per-page key summaries kept beside the cache, summaries [num_pages, Hkv, 2, D] packed in k's
 * dtype and memory ([p, h, 0, :] the per-channel minimum, [p, h, 1, :] the maximum of the page's
 * stored keys), and the choice of pages each key/value head attends, as sparsek/decode.hpp says:
 * a page's score is the largest, over the query heads of the group and the request's new tokens,
 * of sum_d q_d * (q_d >= 0 ? max_d : min_d) (f32: the GPU sums on the tensor cores, so its choice
 * can differ from the CPU's between pages whose scores are within rounding of each other); each
 * (request, key/value head) keeps pages 0..sink-1, the `local` newest pages and the `topk` best
 * others (equal scores: the lower page), in ascending order, with zeros past the count: the
 * selection sparsek_decode_args takes. */
typedef struct {
  sparsek_tokens q;      /* [T, Hq, D] the step's new tokens; update reads its shape only (data may be NULL) */
  sparsek_paged_cache k; /* [num_pages, page_size, Hkv, D] the key cache; select reads its shape only */
  void* summaries;       /* [num_pages, Hkv, 2, D] packed, k's dtype and memory */
  const int32_t* page_table;   /* [batch, max_pages] */
  const int32_t* seq_lens;     /* [batch], the new tokens included */
  const int32_t* cu_seqlens_q; /* [batch + 1] */
  int64_t batch, max_pages;
  sparsek_memory index_memory; /* where the int32 arrays (outputs too) live: k's memory */
  int32_t* sel_indices;        /* select's output [batch, Hkv, sel_kmax] */
  int32_t* sel_counts;         /* select's output [batch, Hkv] */
  int64_t sel_kmax;            /* in [min(max_pages, topk + sink + local), max_pages] */
  int64_t topk, sink, local;   /* select: each >= 0 */
  int32_t all_pages;       /* update: 0 = the pages holding the new tokens, 1 = every stored page (after a prefill) */
  int32_t skip_index_check; /* 0: check the index arrays' contents (device arrays are copied to the host
                               after waiting for `stream`); 1: do not (CUDA-graph capturable; malformed
                               contents give wrong results, never an access outside the arrays) */
} sparsek_page_select_args;

/* Recomputes the summaries of the pages holding each request's new tokens (of every stored page
 * with all_pages), from all their stored slots; call it once the step's keys are in the cache.
 * Host memory runs on the CPU, device memory on the GPU on `stream` (a cudaStream_t or NULL),
 * unsynchronized and allocation-free. */
sparsek_status sparsek_update_page_summaries(const sparsek_page_select_args* args, void* stream);
/* Scores the pages and writes the selection (sel_indices, sel_counts); as the update otherwise. */
sparsek_status sparsek_select_pages(const sparsek_page_select_args* args, void* stream);

/* ---- The attention backward ----
 * Gradients of sparsek_attention for an upstream gradient dout of o (the semantics of
 * attention_backward in sparsek/attention.hpp): dv = P^T dout, dq = scale dS k, dk = scale dS^T q
 * with dS = P o (dout v^T - rowsum(dout o o)); for GQA dk and dv of a key/value head sum over its
 * query heads. Every element of dq, dk and dv is written (0 where nothing is attended). */
typedef struct {
  sparsek_attention_args forward; /* q, k, v, o (the forward's output), lse (its lse, required), the
                                     layout, causal, scale and cu_seqlens of the forward call */
  sparsek_tensor4 dout;           /* [B, Hq, Sq, D], q's dtype */
  sparsek_tensor4 dq;             /* output like q */
  sparsek_tensor4 dk, dv;         /* outputs like k; no output may overlap an input or another output */
  int32_t nondeterministic;       /* 0: repeated runs are bit-identical (the default); 1: dq's partial
                                     sums are added in arrival order (faster; its last bits vary) */
} sparsek_attention_backward_args;

/* One shot, like sparsek_attention: checks everything (the layout's contents too), then runs on
 * `stream` (a cudaStream_t or NULL) for device memory, on the CPU for host memory. The plan (and
 * its device workspace) is made on the first call for a shape and reused after. */
sparsek_status sparsek_attention_backward(const sparsek_attention_backward_args* args, void* stream);

typedef struct sparsek_attention_backward_plan_s* sparsek_attention_backward_plan;

/* Makes a backward plan for the problem's shapes, strides, dtypes, memory, layout extents, causal,
 * scale and num_seqs (the layout's contents and cu_seqlens are not read); the device workspace (the transposed layout,
 * dq's accumulator) is allocated here. `variant`: NULL or "" = automatic, else a variant name. On
 * failure *plan is set to NULL. */
sparsek_status sparsek_attention_backward_plan_create(sparsek_attention_backward_plan* plan,
                                                      const sparsek_attention_backward_args* problem,
                                                      const char* variant);
/* Runs the plan on args that match the problem but for the pointers, the contents of the layout
 * and of cu_seqlens, and nondeterministic. Allocates nothing; device work goes on `stream` (any stream), unsynchronized,
 * and may be captured in a CUDA graph. The workspace is used in one stream's order: runs that may
 * overlap on two streams need a plan each. */
sparsek_status sparsek_attention_backward_plan_run(sparsek_attention_backward_plan plan,
                                                   const sparsek_attention_backward_args* args, void* stream);
/* Frees the plan (NULL is accepted); handles are checked as the forward plan's are. */
sparsek_status sparsek_attention_backward_plan_destroy(sparsek_attention_backward_plan plan);
/* Name of the chosen variant, valid while the plan lives ("" for a NULL or dead plan). */
const char* sparsek_attention_backward_plan_variant(sparsek_attention_backward_plan plan);
/* Scratch memory the plan holds, in bytes (0 when none). */
sparsek_status sparsek_attention_backward_plan_workspace_bytes(sparsek_attention_backward_plan plan,
                                                               uint64_t* bytes);

/* ---- The top-k block gate: a block layout chosen from the content ---- */

/* Q and K are mean-pooled per block (GQA: a group's query heads together), scored
 * scale * pooled_q . pooled_k per key/value head, and each query block keeps the sink blocks
 * 0..sink-1, the local blocks i-local+1..i and the topk best other blocks (ties: the lower index),
 * among the allowed ones (causal: blocks at or before the block's last query row; candidates: that
 * layout's blocks). Result: counts [B, Hkv, Mq] and ascending indices [B, Hkv, Mq, kmax] (zeros past
 * a row's count), Mq = ceil(Sq / block), Nk = ceil(Skv / block). */
typedef struct {
  sparsek_tensor4 q, k; /* q [B, Hq, Sq, D], k [B, Hkv, Skv, D]; D 64 or 128 */
  int32_t topk;
  int32_t block;        /* 64 or 128 */
  int32_t causal;       /* 0 or 1 */
  int32_t sink, local;
  float scale;          /* 0: 1 / sqrt(D) */
  const sparsek_attention_layout* candidates; /* NULL, or select among these blocks only */
  const float* given_scores; /* NULL, or f32 [B, Hkv, Mq, Nk]: select only (q, k give shapes) */
  int32_t* kv_num_blocks;    /* out [B, Hkv, Mq] */
  int32_t* kv_indices;       /* out [B, Hkv, Mq, kmax], kmax >= min(Nk, topk + sink + local) */
  int64_t kmax;
  float* scores;             /* NULL, or out f32 [B, Hkv, Mq, Nk] (-inf where not allowed) */
  void* workspace;           /* device memory: sparsek_gate_workspace_bytes() bytes, 16-byte aligned */
  uint64_t workspace_bytes;
  /* Packed sequences, or NULL and 0 (as sparsek_attention_args'; B = 1, Sq = Skv, in q's memory):
   * query block i selects only among the blocks holding keys of its rows' sequences, and its sink
   * blocks count from the first of them. Zero-initialize the struct. */
  const int32_t* cu_seqlens;
  int64_t num_seqs;
} sparsek_gate_args;

/* Device scratch the gate needs for args (0 for host memory or given scores). */
sparsek_status sparsek_gate_workspace_bytes(const sparsek_gate_args* args, uint64_t* bytes);
/* Runs the gate: host memory on the CPU, device memory on the GPU on `stream` (a cudaStream_t or
 * NULL), unsynchronized, allocation-free and CUDA-graph capturable. */
sparsek_status sparsek_gate(const sparsek_gate_args* args, void* stream);
/* ---- Several GPUs: DSD over a caller's NCCL communicator ----
 * Every rank describes the same product (A whole, B, C: device pointers of its own GPU) and calls
 * these together. A's block rows are split into one range per rank by prefix sums of stored blocks
 * (equal work within one block row; a rank may get none); each rank computes only its rows of C.
 * NCCL is loaded at run time ($SPARSEK_NCCL_LIBRARY, else libnccl.so.2); without it these return
 * SPARSEK_UNSUPPORTED saying so. sparsek never creates a communicator. */
struct ncclComm; /* NCCL's ncclComm_t is struct ncclComm* */
typedef struct {
  int broadcast_root; /* >= 0: B is broadcast from this rank at the start of every run; -1: none */
  int all_gather;     /* non-zero: afterwards every rank's C holds all rows (C row-major, ld == N) */
} sparsek_dist_options;
typedef struct sparsek_dist_plan_s* sparsek_dist_plan;

/* Collective: plans this rank's shard on the communicator's device (which must be current); the
 * ranks' problems and options are compared, and a difference (or any rank's failure) is reported
 * on every rank. options: NULL = no broadcast, no all-gather. variant: as sparsek_plan_create's.
 * Synchronizes. On failure *plan is set to NULL. */
sparsek_status sparsek_dist_plan_create(sparsek_dist_plan* plan, const sparsek_gemm_args* problem, struct ncclComm* comm,
                                        const sparsek_dist_options* options, const char* variant);
/* Broadcast of B (option), this rank's product, all-gather of C (option), on `stream` of the plan's
 * device; every rank calls it. Allocates nothing, never synchronizes: CUDA-graph capturable. */
sparsek_status sparsek_dist_plan_run(sparsek_dist_plan plan, const sparsek_gemm_args* args, void* stream);
sparsek_status sparsek_dist_plan_destroy(sparsek_dist_plan plan); /* NULL is accepted */
/* This rank's block rows [*row_begin, *row_end) (C's rows times bm). */
sparsek_status sparsek_dist_plan_rows(sparsek_dist_plan plan, int64_t* row_begin, int64_t* row_end);
/* Context-parallel attention: one sequence's attention split across the ranks of an NCCL
 * communicator, each rank receiving only the key/value blocks its query rows name (see
 * include/sparsek/distributed.hpp and docs/guide-distributed.md). problem: the whole problem's
 * shapes, dtype and memory (device), the layout in host memory, causal and scale (data pointers,
 * o and lse ignored; packed sequences, cu_seqlens, give SPARSEK_UNSUPPORTED). Collective: every rank passes the same problem; a difference (or any rank's
 * failure) is reported on every rank. On failure *plan is set to NULL. */
typedef struct sparsek_attention_cp_plan_s* sparsek_attention_cp_plan;
sparsek_status sparsek_attention_cp_plan_create(sparsek_attention_cp_plan* plan, const sparsek_attention_args* problem,
                                                struct ncclComm* comm);
/* This rank's query rows [*q_begin, *q_end) and key/value rows [*kv_begin, *kv_end): its shards hold
 * them, packed [B, H, rows, D]. */
sparsek_status sparsek_attention_cp_plan_rows(sparsek_attention_cp_plan plan, int64_t* q_begin, int64_t* q_end,
                                              int64_t* kv_begin, int64_t* kv_end);
/* The forward on this rank's shards (q, k, v, o, lse required; layout, causal and scale are the
 * plan's), and the backward (forward's o and lse as the forward wrote them; dout, dq, dk, dv), on
 * `stream` of the communicator's device; every rank calls them. The first run of a plan plans its
 * local attention calls; later runs allocate nothing and never synchronize (CUDA-graph capturable). */
sparsek_status sparsek_attention_cp_plan_run(sparsek_attention_cp_plan plan, const sparsek_attention_args* shard,
                                             void* stream);
sparsek_status sparsek_attention_cp_plan_run_backward(sparsek_attention_cp_plan plan,
                                                      const sparsek_attention_backward_args* shard, void* stream);
sparsek_status sparsek_attention_cp_plan_destroy(sparsek_attention_cp_plan plan); /* NULL is accepted */
/* The loaded NCCL's version (e.g. 22807 for 2.28.7), or SPARSEK_UNSUPPORTED when it cannot be loaded. */
sparsek_status sparsek_nccl_version(int* version);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif /* SPARSEK_H */
