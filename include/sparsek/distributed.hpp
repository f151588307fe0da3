// sparsek — DSD over several GPUs, through a caller's NCCL communicator.
//
//   DistributedPlan p = plan_distributed(problem, comm, options);  // collective: every rank calls it
//   run(p, args, stream);                                           // many times; graph-capturable
//
// Every rank describes the same product C = alpha * A * B + beta * C with device pointers of its
// own GPU: A (BSR, the whole matrix: a rank reads only its block rows' stored blocks), B and C.
// The block rows of A are split into one contiguous range per rank by prefix sums of stored blocks,
// so every rank gets the same share of the work within one block row (not the same number of rows:
// power-law rows stay balanced); a rank may get no rows at all (more ranks than block rows, or
// rows past the share). Each rank computes only its range of C's rows (C is row-sharded: the other
// rows of its C are neither read nor written) through an ordinary plan() of its shard, so a rank's
// rows are bit-identical to a one-GPU run whenever its shard's plan schedules them the same way.
// Options: B broadcast from one rank before each product (the other ranks' B buffers are
// overwritten; an e4m3 B's scales too), and an all-gather of C afterwards (every rank's C then
// holds all rows).
//
// sparsek never creates a communicator: pass the ncclComm_t of this rank (NCCL's, PyTorch's ...).
// NCCL is loaded at run time ($SPARSEK_NCCL_LIBRARY, else libnccl.so.2): without it, building and
// every other function work, and these throw Error(unsupported) saying so.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "sparsek/attention.hpp"
#include "sparsek/plan.hpp"

struct ncclComm;  // NCCL's communicator type: ncclComm_t is ncclComm* (nccl.h need not be included)

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

struct DistributedOptions {
  int broadcast_root = -1;  // >= 0: B is broadcast from this rank at the start of every run
  bool all_gather = false;  // after the product, every rank's C receives every rank's rows
                            // (C must then be row-major with ld == N)
  Options local;            // for each rank's plan of its shard (variant, threads; stream unused)
};

// Rank r owns block rows [bounds[r], bounds[r+1]) of a pattern with row_ptr[0..mb]: the bounds are
// the block-row boundaries whose prefix sums of stored blocks lie nearest r * nnzb / ranks (ties,
// e.g. runs of empty rows or nnzb = 0, go to the even split of rows). bounds[0] = 0, bounds[ranks] =
// mb, non-decreasing. row_ptr: host memory, a BSR row_ptr (row_ptr[0] = 0, non-decreasing). Throws
// Error(invalid_argument) naming the first offending entry of any other row_ptr, and for ranks < 1.
std::vector<int64_t> partition_block_rows(const int32_t* row_ptr, int64_t mb, int ranks);

class DistributedPlan {
 public:
  DistributedPlan();  // empty: run() on it throws
  ~DistributedPlan();
  DistributedPlan(const DistributedPlan&);
  DistributedPlan& operator=(const DistributedPlan&);
  DistributedPlan(DistributedPlan&&) noexcept;
  DistributedPlan& operator=(DistributedPlan&&) noexcept;
  explicit operator bool() const { return impl_ != nullptr; }

  int rank() const;
  int ranks() const;
  int device() const;                         // this rank's CUDA device (the communicator's)
  const std::vector<int64_t>& bounds() const;  // partition_block_rows() of the pattern
  int64_t row_begin() const;                   // this rank's block rows [row_begin, row_end)
  int64_t row_end() const;
  int64_t local_nnzb() const;                  // stored blocks in this rank's rows
  const Plan& local() const;                   // the plan of this rank's shard (empty when it has no rows)
  const GemmArgs& problem() const;             // the whole problem, as given

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend struct DistributedAccess;
};

// One rank per process (torchrun, mpirun): a collective call, made by every rank of comm with the
// same problem (shapes, dtypes, layouts, pattern) and options; they are compared across ranks and
// a difference is an Error on every rank naming the field and both ranks' values. Validates
// everything as plan() does, partitions, and plans this rank's shard on the communicator's device
// (which must be current). Synchronizes; allocates a little device memory (the shard's row_ptr).
DistributedPlan plan_distributed(const GemmArgs& problem, ncclComm* comm, const DistributedOptions& options = {});

// One process driving several GPUs: one problem and one communicator per rank (e.g. from
// ncclCommInitAll), in rank order; each problem's pointers on its rank's device.
std::vector<DistributedPlan> plan_distributed(const std::vector<GemmArgs>& problems,
                                              const std::vector<ncclComm*>& comms,
                                              const DistributedOptions& options = {});

// Broadcast of B (option), the shard's product, all-gather of C (option), enqueued on `stream` (a
// cudaStream_t of this rank's device, which must be current). args: the planned problem's shapes
// and pattern (values, B and C pointers, alpha and beta may change). Allocates nothing and never
// synchronizes the host: may be captured in a CUDA graph. Every rank must call it (the collectives).
void run(const DistributedPlan& plan, const GemmArgs& args, void* stream = nullptr);

// The same for one process driving several GPUs: per rank (in rank order) a plan, its args and a
// stream of its device. The broadcasts of all ranks are grouped (ncclGroupStart/End), then each
// product is launched, then the all-gathers are grouped. The current device is restored.
void run(const std::vector<DistributedPlan>& plans, const std::vector<GemmArgs>& args,
         const std::vector<void*>& streams);

// ---- Context-parallel attention: the transfer plan (host only) ----
//
// Attention over one sequence split across ranks in block units needs, on each rank, the key/value
// blocks its query rows name in the layout. plan_attention_shards() computes, without any GPU, who
// computes which query blocks, who holds which key/value blocks, and which blocks each rank must
// receive from which other rank: the transfers a block-sparse layout needs, to compare with ring
// attention, which moves every other rank's whole shard to every rank. plan_distributed_attention()
// below runs attention on this plan.
//
// Query blocks are split into one contiguous range per rank by prefix sums of their work (stored
// blocks of the row over batch and heads, each weighted by the query heads it serves; with causal,
// a block on the diagonal counts half), each boundary nearest its ideal r * total / ranks. For
// self-attention (sq == skv, block_q == block_kv) a rank holds the key/value blocks of its own
// query range; otherwise the key/value blocks are split evenly. With causal, a block of kv_indices
// past a row's last query is never needed (it is masked whole); blocks of full_kv_indices are
// attended whole and always needed. A needed block is identified by
// (batch, key/value head, key block): id = (b * hkv + g) * kv_blocks + j.
struct AttentionShardRank {
  int64_t q_begin = 0, q_end = 0;    // query blocks computed here
  int64_t kv_begin = 0, kv_end = 0;  // key/value blocks held here (every batch and head)
  int64_t work = 0;                  // the weighted stored blocks of its rows (half-block units)
  // recv[r]: the ids this rank needs that rank r holds, sorted, unique (recv[own rank] is empty).
  std::vector<std::vector<int64_t>> recv;
  int64_t recv_blocks() const;       // all of recv
  int64_t needed_local = 0;          // needed blocks it already holds
};

struct AttentionShards {
  int ranks = 1;
  int64_t batch = 1, hq = 1, hkv = 1, q_blocks = 0, kv_blocks = 0;
  int block_kv = 128;
  std::vector<AttentionShardRank> rank;  // [ranks]
  // Bytes rank r receives for K and V (d, element size): this plan's, and ring attention's.
  double recv_bytes(int r, int64_t d, int64_t elem_bytes) const;
  double ring_bytes(int r, int64_t d, int64_t elem_bytes) const;
};

// layout: host memory, the shapes of an attention problem with batch `batch`, hq query heads over
// hkv key/value heads (layout.heads is 1, hq or hkv), sq query and skv key positions; causal
// masks blocks past the diagonal (they are never needed). Throws Error(invalid_argument) naming the
// argument and the value (ranks < 1, device memory, extents, a count or an index out of range).
AttentionShards plan_attention_shards(const AttentionLayout& layout, int64_t batch, int64_t hq, int64_t hkv,
                                      int64_t sq, int64_t skv, bool causal, int ranks);

// ---- Context-parallel attention: running it ----
//
// Attention over one sequence whose query rows and key/value rows are split over ranks as
// plan_attention_shards() says. Each rank holds, packed ([B, H, rows, D] contiguous):
//   q, o  [B, Hq, q_rows, D] and lse [B, Hq, q_rows]: its query rows [q_row_begin, q_row_end)
//   k, v  [B, Hkv, kv_rows, D]: its key/value rows [kv_row_begin, kv_row_end)
// (in the backward also dout and dq like q, dk and dv like k). run() sends every other rank the
// key/value blocks its rows name (nothing else), computes attention over the blocks it holds while
// its own arrive (the transfers on a second stream), then over the received blocks, and merges the
// two partial results by their LSE. run_backward() moves the same blocks, computes both parts'
// gradients, adds the two dq, and sends the received blocks' dk and dv back to their holders, which
// add them to their own in rank order. Transfers are NCCL send/receive of packed blocks.
//
// Results: with one rank, bit-identical to attention() / attention_backward() on the whole
// problem. With several, the same bits from run to run (fixed-order merges and sums, the parts'
// deterministic backward) but not the one-GPU bits: a row's softmax is merged from two partial
// results rounded to the output dtype, and a received block's dk and dv arrive rounded to the
// tensors' dtype before they are added (error of the order of that dtype's rounding).
//
// Restrictions: the layout in host memory (its contents are fixed at plan time: a new layout needs
// a new plan); with causal, self-attention (sq == skv, block_q == block_kv); a rank whose query
// rows need blocks but which holds no key/value rows and receives none is refused at plan time.
class DistributedAttentionPlan {
 public:
  DistributedAttentionPlan();  // empty: run() on it throws
  ~DistributedAttentionPlan();
  DistributedAttentionPlan(const DistributedAttentionPlan&);
  DistributedAttentionPlan& operator=(const DistributedAttentionPlan&);
  DistributedAttentionPlan(DistributedAttentionPlan&&) noexcept;
  DistributedAttentionPlan& operator=(DistributedAttentionPlan&&) noexcept;
  explicit operator bool() const { return impl_ != nullptr; }

  int rank() const;
  int ranks() const;
  const AttentionShards& shards() const;  // the transfer plan (every rank's)
  int64_t q_row_begin() const;            // this rank's query rows [q_row_begin, q_row_end)
  int64_t q_row_end() const;
  int64_t kv_row_begin() const;           // its key/value rows [kv_row_begin, kv_row_end)
  int64_t kv_row_end() const;
  double recv_bytes() const;              // K and V bytes it receives per run (the backward sends as many back)
  double ring_bytes() const;              // what ring attention would move to it
  size_t workspace_bytes() const;         // device (or host) memory the plan holds for this rank: the
                                          // transfer buffers, the received blocks and their gradients,
                                          // the second partial result (not its attention calls' own)

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend struct DistributedAttentionAccess;
};

// problem: the whole attention problem: q [B, Hq, Sq, D], k, v [B, Hkv, Skv, D] (shapes, dtype and
// memory; data pointers, strides, o and lse are ignored), the layout in host memory, causal, scale.
// A collective call: every rank of comm passes the same problem (shapes and layout contents are
// compared across ranks; a difference is an Error on every rank naming the field). Allocates this
// rank's buffers (received blocks, a second partial output, the backward's sums) and a stream.
DistributedAttentionPlan plan_distributed_attention(const AttentionArgs& problem, ncclComm* comm,
                                                    const Options& options = {});
// One process driving several GPUs: one communicator per rank, in rank order.
std::vector<DistributedAttentionPlan> plan_distributed_attention(const AttentionArgs& problem,
                                                                 const std::vector<ncclComm*>& comms,
                                                                 const Options& options = {});
// Without communicators: `ranks` ranks in this process, the transfers plain copies: on host memory
// (the CPU backend), or on the current GPU (device memory; every rank's stream then waits for the
// copies, so nothing overlaps). To check a layout's split and its results without several GPUs.
std::vector<DistributedAttentionPlan> plan_distributed_attention(const AttentionArgs& problem, int ranks,
                                                                 const Options& options = {});

// This rank's forward on its shards (shard.layout, causal and scale are the plan's and are
// ignored; lse is required). stream: a cudaStream_t of the rank's device. The first run of a plan
// plans its two local attention calls (and allocates their workspace); later runs allocate nothing
// and never synchronize the host (capturable in a CUDA graph). Every rank must call it.
void run(const DistributedAttentionPlan& plan, const AttentionArgs& shard, void* stream = nullptr);
void run_backward(const DistributedAttentionPlan& plan, const AttentionBackwardArgs& shard, void* stream = nullptr);
// Several ranks of this process (a plan each, in rank order; streams: one per rank, or empty for
// each device's default stream). Host plans run here, one rank after another.
void run(const std::vector<DistributedAttentionPlan>& plans, const std::vector<AttentionArgs>& shards,
         const std::vector<void*>& streams = {});
void run_backward(const std::vector<DistributedAttentionPlan>& plans, const std::vector<AttentionBackwardArgs>& shards,
                  const std::vector<void*>& streams = {});

// The NCCL library sparsek loads and its version (e.g. 22807 for 2.28.7); throws
// Error(unsupported) with the reason when it cannot be loaded.
int nccl_version();

}  // namespace sparsek
#pragma GCC visibility pop
