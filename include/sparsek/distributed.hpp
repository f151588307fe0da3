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
// attention, which moves every other rank's whole shard to every rank. (Running attention across
// GPUs on this plan is not built yet.)
//
// Query blocks are split into one contiguous range per rank by prefix sums of their work (stored
// blocks of the row over batch and heads, each weighted by the query heads it serves; with causal,
// a block on the diagonal counts half), each boundary nearest its ideal r * total / ranks. For
// self-attention (sq == skv, block_q == block_kv) a rank holds the key/value blocks of its own
// query range; otherwise the key/value blocks are split evenly. A needed block is identified by
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

// The NCCL library sparsek loads and its version (e.g. 22807 for 2.28.7); throws
// Error(unsupported) with the reason when it cannot be loaded.
int nccl_version();

}  // namespace sparsek
#pragma GCC visibility pop
