// sparsek — block-sparse attention and its top-k block gate.
//
//   O   = softmax(scale * Q K^T restricted to a block layout) V        per (batch, query head)
//   LSE = log(sum over the attended keys of exp(scale * q . k))         per query row (natural log)
//
// Tensors are [B, H, S, D] with D contiguous (stride 1) and any strides for B, H and S. Query
// heads Hq are a multiple of the key/value heads Hkv (GQA / MQA): query head h reads key/value head
// h / (Hq / Hkv). D is 64 or 128; q, k, v and o share one dtype (f16 or bf16 on the GPU; f32 too on
// the CPU); LSE is f32 [B, Hq, Sq], contiguous.
//
// The layout follows FlexAttention's BlockMask: query block i (rows i*block_q ..) of batch b and
// head h attends the key/value blocks
//     kv_indices[b', h', i, 0 : kv_num_blocks[b', h', i]]                 (element masks applied)
//   + full_kv_indices[b', h', i, 0 : full_kv_num_blocks[b', h', i]]       (no element mask; optional)
// where b' = b when the layout's batch extent is B and 0 when it is 1, and h' = h (extent Hq), h / G
// (extent Hkv: one row per group of query heads sharing a key/value head), or 0 (extent 1).
// Indices of one row are sorted, unique, in [0, ceil(Skv / block_kv)), and no block is in both
// lists; entries past a row's count are ignored.
//
// Element masks: keys past Skv are never attended (sequence lengths need not be block multiples);
// with causal, key j is masked for query i when j > i (FlexAttention's q_idx >= kv_idx) inside the
// blocks of kv_indices — blocks in full_kv_indices are attended whole, as FlexAttention does.
// A query row with no attended key (no block, or all masked) gets O = 0 and LSE = -inf.
//
// Packed sequences (varlen: a batch of documents of mixed lengths without padding): with
// cu_seqlens, q, k and v hold one packed sequence (B = 1, Sq = Skv = T) of num_seqs sequences,
// sequence i at rows cu_seqlens[i] .. cu_seqlens[i+1] - 1 (int32, num_seqs + 1 entries,
// 0 = cu_seqlens[0] <= cu_seqlens[1] <= ... <= cu_seqlens[num_seqs] = T, in the layout's memory).
// A query never attends a key of another sequence, in either list (a sequence boundary is a hard
// boundary, as Skv is); causal is then causal within each sequence. The layout is over the packed
// sequence's blocks: a block may hold the end of one sequence and the start of the next.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparsek/gemm.hpp"  // Options
#include "sparsek/types.hpp"

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

// Non-owning view of a [B, H, S, D] tensor; strides in elements, D contiguous.
struct Tensor4View {
  void* data = nullptr;
  DType dtype = DType::bf16;
  Memory memory = Memory::device;
  int64_t b = 0, h = 0, s = 0, d = 0;
  int64_t stride_b = 0, stride_h = 0, stride_s = 0;

  int64_t index(int64_t ib, int64_t ih, int64_t is, int64_t id) const {
    return ib * stride_b + ih * stride_h + is * stride_s + id;
  }
  // A densely packed [b, h, s, d] tensor.
  static Tensor4View packed(void* data, DType dtype, Memory memory, int64_t b, int64_t h, int64_t s, int64_t d) {
    Tensor4View t;
    t.data = data;
    t.dtype = dtype;
    t.memory = memory;
    t.b = b, t.h = h, t.s = s, t.d = d;
    t.stride_s = d, t.stride_h = s * d, t.stride_b = h * s * d;
    return t;
  }
};

// A block layout (FlexAttention BlockMask); the arrays are int32, contiguous.
struct AttentionLayout {
  const int32_t* kv_num_blocks = nullptr;       // [batch, heads, q_blocks]
  const int32_t* kv_indices = nullptr;          // [batch, heads, q_blocks, kmax]
  const int32_t* full_kv_num_blocks = nullptr;  // optional (both or neither), [batch, heads, q_blocks]
  const int32_t* full_kv_indices = nullptr;     // [batch, heads, q_blocks, full_kmax]
  int64_t batch = 1;     // 1 or B
  int64_t heads = 1;     // 1, Hq or Hkv
  int64_t q_blocks = 0;  // ceil(Sq / block_q)
  int64_t kmax = 0, full_kmax = 0;
  int block_q = 128, block_kv = 128;  // 128x128 or 64x64
  Memory memory = Memory::device;

  bool has_full() const { return full_kv_num_blocks != nullptr; }
};

struct AttentionArgs {
  Tensor4View q, k, v;   // q [B, Hq, Sq, D]; k, v [B, Hkv, Skv, D]
  Tensor4View o;         // output [B, Hq, Sq, D], q's dtype
  float* lse = nullptr;  // output [B, Hq, Sq] f32 contiguous; nullptr: not written
  AttentionLayout layout;
  bool causal = false;
  float scale = 0.f;     // 0: 1 / sqrt(D)
  const int32_t* cu_seqlens = nullptr;  // packed sequences (above): [num_seqs + 1], or null
  int64_t num_seqs = 0;                 // sequences in the packed batch (with cu_seqlens)

  float softmax_scale() const { return scale != 0.f ? scale : 1.f / std::sqrt(float(q.d > 0 ? q.d : 1)); }
};

// Checks shapes, dtypes, strides, memory kinds, pointers and the layout's extents; with
// check_indices also the layout's contents (counts in [0, kmax], indices sorted, unique, in range,
// no block in both lists) — device layouts are copied to the host for that. Errors name the
// tensor, the index and the value, e.g. "kv_indices[0, 3, 17, 2] = 140 is out of range [0, 128)".
void validate(const AttentionArgs& args, bool check_indices = true);
// The same with a device layout read in `stream`'s order (a cudaStream_t; the two-argument form
// passes null): the work queued on `stream`, which may still be writing the layout, finishes
// before the layout is copied to the host. The copy synchronizes, so while `stream` is being
// captured into a CUDA graph a device layout's contents are not checked: Error(invalid_argument)
// says to check them before the capture instead.
void validate(const AttentionArgs& args, bool check_indices, void* stream);

// Effective FLOPs: 4 * D * (number of unmasked score elements), summed over batch and heads
// (validates args, layout contents included, then reads the layout; a device layout is copied to
// the host).
double effective_flops(const AttentionArgs& args);

// Plan once for a problem's shapes, strides, dtypes, layout extents, causal and scale; run with
// any data pointers and any layout contents of those extents (the gate makes a new layout every
// step). run() allocates nothing and may be captured in a CUDA graph; it does not check the
// layout's contents (a malformed layout cannot crash or hang it, but gives undefined values):
// validate(args, true) or the one-shot attention() with Options::check_indices does.
class AttentionPlan {
 public:
  AttentionPlan();
  ~AttentionPlan();
  AttentionPlan(const AttentionPlan&);
  AttentionPlan& operator=(const AttentionPlan&);
  AttentionPlan(AttentionPlan&&) noexcept;
  AttentionPlan& operator=(AttentionPlan&&) noexcept;

  explicit operator bool() const { return impl_ != nullptr; }
  const std::string& variant() const;
  Backend backend() const;
  size_t workspace_bytes() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend AttentionPlan plan(const AttentionArgs&, const Options&);
  friend void run(const AttentionPlan&, const AttentionArgs&, void*);
  friend struct AttentionPlanAccess;  // the one-shot attention(), which has checked its args already
};

AttentionPlan plan(const AttentionArgs& problem, const Options& options = {});
void run(const AttentionPlan& plan, const AttentionArgs& args, void* stream = nullptr);

// One shot: validate (the layout's contents too when options.check_indices), plan, run. The last
// 16 plans are kept, keyed by everything a plan is made for plus the pointers' alignment and the
// planning options (and, on the GPU, the stream and the device).
void attention(const AttentionArgs& args, const Options& options = {});

std::vector<std::string> supported_variants(const AttentionArgs& args);
std::vector<std::string> unsupported_reasons(const AttentionArgs& args);

// ---- the backward ----
//
// Gradients of attention() for an upstream gradient dO of O:
//   dV = P^T dO,   dS = P o (dP - Delta) with dP = dO V^T and Delta = rowsum(dO o O),
//   dQ = scale * dS K,   dK = scale * dS^T Q,
// where P = exp(scale * Q K^T - LSE) on the attended elements of the layout (the forward's masks)
// and 0 elsewhere. forward.o and forward.lse are the forward's outputs (both required), and every
// backend reads them as given: P comes from forward.lse and Delta from forward.o, neither is
// recomputed from q, k and v (an lse or o that is not the forward's gives these formulas' values,
// not attention's gradients). A row whose LSE is -inf has P = 0: it contributes nothing to dK and
// dV. A NaN LSE makes the row's P NaN, over every key of the blocks its lists name (masked ones
// too), and so the dK and dV of those keys. For GQA dK and dV of a key/value head sum over the
// query heads that share it. A query row that attends nothing gets dQ = 0; a key that no query
// attends gets dK = dV = 0 (written, like every element of dq, dk and dv).
//
// Same inputs, same GPU -> bit-identical dq, dk, dv by default: on the GPU the partial sums of a dQ
// row are rounded to integer multiples of u and added as 32-bit integers, whose sums do not depend
// on the order they arrive in. u is a power of two with u <= 2^-29 * bound, bound = max|K| *
// (max||V|| * ||dO row|| + |Delta row|) <= 2 max|K| max||V|| ||dO row|| (max over the head's keys),
// which |dQ row| (before the scale) cannot exceed, so the sum never overflows; each partial sum (one
// per key block the row attends) is off by at most u / 2 before the scale (for bounds above 2^-96;
// u is at least 2^-126). With deterministic (on every backend) a row whose LSE is -inf (it attends
// nothing) gets dq = 0; in any other row a NaN or inf in the head's K or V, or in the row's O, dO
// or LSE, makes the dq row NaN (instead of being lost in the rounding).
// deterministic = false adds fp32 partial sums in arrival order (no K/V pass; the last bits of dq
// vary between runs), and dq is what the arithmetic gives (an LSE of +inf: P = 0, dq = 0). The CPU
// backend sums in double, in a fixed order, either way.
struct AttentionBackwardArgs {
  AttentionArgs forward;        // q, k, v, o (forward output), lse (required), layout, causal, scale
  Tensor4View dout;             // dO [B, Hq, Sq, D], q's dtype
  Tensor4View dq;               // outputs: dq like q, dk and dv like k
  Tensor4View dk, dv;
  bool deterministic = true;
};

// Checks the forward's arguments (as validate(forward, check_indices); forward.lse required),
// then dout like q, dq like q, dk and dv like k (shape, dtype, memory), and that dq, dk and dv
// overlap no input and no other output. Errors name the tensor and the value.
void validate(const AttentionBackwardArgs& args, bool check_indices = true);

// Plan once for a backward problem (what the forward's plan() is made for, plus dout, dq, dk and
// dv's shapes, strides and dtypes); run with any data pointers, layout contents and deterministic.
// The GPU plan allocates its workspace here (the transposed layout, dQ's accumulator); run()
// allocates nothing and may be captured in a CUDA graph on any stream. The workspace is used in one
// stream's order: runs that may overlap on two streams need a plan each.
class AttentionBackwardPlan {
 public:
  AttentionBackwardPlan();
  ~AttentionBackwardPlan();
  AttentionBackwardPlan(const AttentionBackwardPlan&);
  AttentionBackwardPlan& operator=(const AttentionBackwardPlan&);
  AttentionBackwardPlan(AttentionBackwardPlan&&) noexcept;
  AttentionBackwardPlan& operator=(AttentionBackwardPlan&&) noexcept;

  explicit operator bool() const { return impl_ != nullptr; }
  const std::string& variant() const;
  size_t workspace_bytes() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend AttentionBackwardPlan plan(const AttentionBackwardArgs&, const Options&);
  friend void run(const AttentionBackwardPlan&, const AttentionBackwardArgs&, void*);
  friend struct AttentionPlanAccess;  // the one-shot attention_backward(), as above
};

AttentionBackwardPlan plan(const AttentionBackwardArgs& problem, const Options& options = {});
void run(const AttentionBackwardPlan& plan, const AttentionBackwardArgs& args, void* stream = nullptr);

// One shot, like attention(): validate (the layout's contents too when options.check_indices),
// plan (cached like the forward's: per shape, stream and device), run on options.stream. dq, dk and
// dv may not overlap any input. Host memory runs the fp64-accumulating CPU reference.
void attention_backward(const AttentionBackwardArgs& args, const Options& options = {});
std::vector<std::string> unsupported_reasons(const AttentionBackwardArgs& args);

// ---- the top-k block gate ----
//
// Scores a block layout from the content: Q and K are mean-pooled per block (rows past Sq / Skv
// excluded; for GQA the query heads of a group are pooled together), scores[b, g, i, j] =
// scale * pooled_q[b, g, i] . pooled_k[b, g, j] per key/value head g, and each query block keeps
//   - sink: key blocks 0 .. sink-1,
//   - local: key blocks i-local+1 .. i (the diagonal block and those before it),
//   - the topk best-scoring other blocks (ties: the lower index; a block scored -inf or NaN is
//     never picked by top-k),
// all limited to the allowed blocks of [0, Nk), Nk = ceil(Skv / block): with causal, blocks j with
// j*block <= the block's last query row; with a candidate layout, only that layout's blocks (its
// full and partial lists together; with heads = Hq != Hkv, the union over the group's query heads).
// The result is a layout with heads = Hkv, q_blocks = ceil(Sq / block), indices ascending; entries
// past a row's count are 0. There is no gradient through the selection.
// Host memory runs on the CPU (f32, f16, bf16; a host candidate layout's contents are checked);
// device memory on the GPU (f16, bf16; allocation-free, on options.stream, graph-capturable; a
// device candidate layout is not read back: counts are clamped to [0, kmax] and out-of-range
// indices ignored).
struct GateArgs {
  Tensor4View q, k;  // q [B, Hq, Sq, D], k [B, Hkv, Skv, D]
  int topk = 0;
  int block = 128;   // 64 or 128: block_q = block_kv
  bool causal = false;
  int sink = 1, local = 1;
  float scale = 0.f;  // 0: 1 / sqrt(D)
  // Optional: select among these blocks only (block size `block`, heads 1, Hq or Hkv; batch 1 or B).
  const AttentionLayout* candidates = nullptr;
  // Optional: scores given by the caller (a learned scorer), f32 [B, Hkv, Mq, Nk] contiguous; the
  // gate then only selects (q and k are used for their shapes alone).
  const float* given_scores = nullptr;
  // Optional: packed sequences, as attention's (B = 1, Sq = Skv = T, int32 [num_seqs + 1] in q's
  // memory). Query block i may select only the key blocks holding keys of its rows' sequences (from
  // its first row's sequence start to its last row's sequence end), and its sink blocks count from
  // the first of them. A block holding two sequences' tokens is pooled across the boundary.
  const int32_t* cu_seqlens = nullptr;
  int64_t num_seqs = 0;
  // Outputs: [B, Hkv, Mq] and [B, Hkv, Mq, kmax] (kmax >= min(Nk, topk + sink + local)), and
  // optionally the scores [B, Hkv, Mq, Nk] f32 (not-allowed blocks -inf).
  int32_t* kv_num_blocks = nullptr;
  int32_t* kv_indices = nullptr;
  int64_t kmax = 0;
  float* scores = nullptr;
  // Device scratch of at least gate_workspace_bytes(args) bytes, 16-byte aligned (device memory
  // only; nullptr on the host), and its size in bytes (checked).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
size_t gate_workspace_bytes(const GateArgs& args);
void gate(const GateArgs& args, const Options& options = {});

}  // namespace sparsek
#pragma GCC visibility pop
