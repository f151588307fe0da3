// Distributed DSD over a caller's NCCL communicator (include/sparsek/distributed.hpp): plan
// partitions A's block rows by stored blocks and plans each rank's shard with plan(); run
// broadcasts B (option), runs the shard, and all-gathers C (option), all on the caller's stream.
#include "sparsek/distributed.hpp"
#include "sparsek/quantize.hpp"

#include "core/cuda_host.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/device.hpp"
#include "core/nccl.hpp"
#include "plan/partition.hpp"
#include "plan/plan_internal.hpp"

namespace sparsek {

struct DistributedPlan::Impl {
  GemmArgs problem;  // the whole problem, as given
  DistributedOptions options;
  ncclComm* comm = nullptr;
  int rank = 0, ranks = 1, device = -1;
  std::vector<int64_t> bounds;
  int64_t first_block = 0, local_nnzb = 0;  // this rank's stored blocks: [first_block, + local_nnzb)
  int32_t* local_row_ptr = nullptr;         // device: the shard's row_ptr, rebased to start at 0
  Plan local;                               // (declared after local_row_ptr: destroyed before it is freed)
  ~Impl() {
    local = Plan();
    if (local_row_ptr) cudaFree(local_row_ptr);
  }
};

DistributedPlan::DistributedPlan() = default;
DistributedPlan::~DistributedPlan() = default;
DistributedPlan::DistributedPlan(const DistributedPlan&) = default;
DistributedPlan& DistributedPlan::operator=(const DistributedPlan&) = default;
DistributedPlan::DistributedPlan(DistributedPlan&&) noexcept = default;
DistributedPlan& DistributedPlan::operator=(DistributedPlan&&) noexcept = default;

struct DistributedAccess {
  static const DistributedPlan::Impl& impl(const DistributedPlan& p) {
    if (!p.impl_) throw Error(Status::invalid_argument, "the distributed plan is empty (make one with plan_distributed())");
    return *p.impl_;
  }
  static DistributedPlan make(std::shared_ptr<DistributedPlan::Impl> im) {
    DistributedPlan p;
    p.impl_ = std::move(im);
    return p;
  }
};
using DA = DistributedAccess;

int DistributedPlan::rank() const { return DA::impl(*this).rank; }
int DistributedPlan::ranks() const { return DA::impl(*this).ranks; }
int DistributedPlan::device() const { return DA::impl(*this).device; }
const std::vector<int64_t>& DistributedPlan::bounds() const { return DA::impl(*this).bounds; }
int64_t DistributedPlan::row_begin() const { return DA::impl(*this).bounds[DA::impl(*this).rank]; }
int64_t DistributedPlan::row_end() const { return DA::impl(*this).bounds[DA::impl(*this).rank + 1]; }
int64_t DistributedPlan::local_nnzb() const { return DA::impl(*this).local_nnzb; }
const Plan& DistributedPlan::local() const { return DA::impl(*this).local; }
const GemmArgs& DistributedPlan::problem() const { return DA::impl(*this).problem; }

int nccl_version() { return nccl::api().version; }

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(Status::invalid_argument, "distributed plan: " + what); }

// The checks a distributed product adds to the product's own, before anything touches NCCL.
void check_problem(const GemmArgs& g, const DistributedOptions& o) {
  check_enums(g);
  if (g.kind != OpKind::dsd) bad(std::string("kind must be dsd, not ") + to_string(g.kind));
  if (g.op != Op::none) bad(std::string("op must be none (the ranks split A's block rows), not ") + to_string(g.op));
  if (g.sparse.memory != Memory::device || g.b.memory != Memory::device || g.c.memory != Memory::device)
    bad(std::string("A, B and C must be in device memory (A is ") + to_string(g.sparse.memory) + ", B " +
        to_string(g.b.memory) + ", C " + to_string(g.c.memory) + ")");
  if (o.broadcast_root < -1) bad("broadcast_root=" + std::to_string(o.broadcast_root) + " must be -1 (none) or a rank");
  if (o.all_gather && (g.c.layout != Layout::row_major || g.c.ld != g.c.cols))
    bad(std::string("all_gather needs C row-major with ld == N (contiguous rows), but C is ") + to_string(g.c.layout) +
        " with ld=" + std::to_string(g.c.ld) + ", N=" + std::to_string(g.c.cols));
}

// This rank's shard of the whole problem g: block rows [bounds[rank], bounds[rank+1]).
GemmArgs shard(const DistributedPlan::Impl& im, const GemmArgs& g) {
  const int64_t r0 = im.bounds[im.rank], rows = (im.bounds[im.rank + 1] - r0) * g.sparse.bm;
  GemmArgs s = g;
  s.sparse.rows = rows;
  s.sparse.nnzb = im.local_nnzb;
  s.sparse.row_ptr = im.local_row_ptr;
  const size_t block_bytes = size_t(g.sparse.bm) * g.sparse.bk * dtype_size(g.sparse.dtype);
  s.sparse.col_idx = im.local_nnzb ? g.sparse.col_idx + im.first_block : nullptr;
  s.sparse.values = im.local_nnzb ? static_cast<char*>(g.sparse.values) + im.first_block * block_bytes : nullptr;
  s.sparse.scales = im.local_nnzb && g.sparse.scales ? g.sparse.scales + im.first_block : nullptr;  // e4m3: per block
  s.c.rows = rows;
  const int64_t first = r0 * g.sparse.bm;  // C's first row of the shard
  const int64_t offset = g.c.layout == Layout::row_major ? first * g.c.ld : first;
  s.c.data = static_cast<char*>(g.c.data) + offset * int64_t(dtype_size(g.c.dtype));
  return s;
}

// One rank's planning up to the exchange: every check, the partition and the shard's plan.
// `ranks`: the communicator's size.
std::shared_ptr<DistributedPlan::Impl> plan_rank(const GemmArgs& g, ncclComm* comm, int rank, int ranks, int device,
                                                  const DistributedOptions& o, RankProblem& desc) {
  check_problem(g, o);
  if (o.broadcast_root >= ranks)
    bad("broadcast_root=" + std::to_string(o.broadcast_root) + " is not a rank of the communicator (" +
        std::to_string(ranks) + " ranks)");
  validate(g, false);
  HostPattern hp = host_pattern(g.sparse, true, o.local.stream);
  validate_pattern(g, hp);
  desc = describe(g, o, hp.row_ptr, hp.col_idx);

  auto im = std::make_shared<DistributedPlan::Impl>();
  im->problem = g;
  im->options = o;
  im->comm = comm;
  im->rank = rank;
  im->ranks = ranks;
  im->device = device;
  im->bounds = partition_block_rows(hp.row_ptr, g.sparse.mb(), ranks);
  const int64_t r0 = im->bounds[rank], r1 = im->bounds[rank + 1];
  im->first_block = hp.row_ptr[r0];
  im->local_nnzb = int64_t(hp.row_ptr[r1]) - hp.row_ptr[r0];
  if (r1 > r0) {
    std::vector<int32_t> rp(size_t(r1 - r0) + 1);
    for (int64_t i = r0; i <= r1; ++i) rp[size_t(i - r0)] = int32_t(hp.row_ptr[i] - im->first_block);
    void* d = nullptr;
    check_cuda(cudaMalloc(&d, rp.size() * sizeof(int32_t)), "cudaMalloc (shard row_ptr)");
    im->local_row_ptr = static_cast<int32_t*>(d);
    check_cuda(cudaMemcpy(d, rp.data(), rp.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy (shard row_ptr)");
    im->local = plan(shard(*im, g), o.local);
  }
  return im;
}

// Gathers every rank's RankProblem (one per local rank: comms[i] is rank ranks_of[i]) and checks
// them; throws the same error on every rank.
void exchange(const std::vector<ncclComm*>& comms, const std::vector<int>& rank_of, const std::vector<int>& device_of,
              int ranks, const std::vector<RankProblem>& mine) {
  const nccl::Api& api = nccl::api();
  const size_t n = comms.size(), bytes = sizeof(RankProblem);
  std::vector<void*> buf(n, nullptr);
  std::vector<cudaStream_t> streams(n, nullptr);
  // Frees each stream and buffer once (a handle is cleared when freed: destroying a stream twice is
  // undefined and crashes), so it may run on any path.
  auto release = [&] {
    for (size_t i = 0; i < n; ++i) {
      DeviceScope d(device_of[i]);
      if (streams[i]) cudaStreamDestroy(streams[i]);
      if (buf[i]) cudaFree(buf[i]);
      streams[i] = nullptr;
      buf[i] = nullptr;
    }
  };
  std::vector<std::vector<RankProblem>> all(n, std::vector<RankProblem>(size_t(ranks)));
  try {
    for (size_t i = 0; i < n; ++i) {
      DeviceScope d(device_of[i]);
      check_cuda(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "cudaStreamCreate");
      check_cuda(cudaMalloc(&buf[i], bytes * ranks), "cudaMalloc (plan exchange)");
      char* slot = static_cast<char*>(buf[i]) + bytes * rank_of[i];
      check_cuda(cudaMemcpy(slot, &mine[i], bytes, cudaMemcpyHostToDevice), "cudaMemcpy (plan exchange)");
    }
    nccl::check(api.GroupStart(), "ncclGroupStart");
    nccl::Result r = 0;
    for (size_t i = 0; i < n && r == 0; ++i) {
      char* slot = static_cast<char*>(buf[i]) + bytes * rank_of[i];
      r = api.AllGather(slot, buf[i], bytes, nccl::kUint8, comms[i], streams[i]);
    }
    nccl::Result end = api.GroupEnd();
    nccl::check(r, "ncclAllGather (plan exchange)");
    nccl::check(end, "ncclGroupEnd");
    for (size_t i = 0; i < n; ++i) {
      DeviceScope d(device_of[i]);
      check_cuda(cudaMemcpyAsync(all[i].data(), buf[i], bytes * ranks, cudaMemcpyDeviceToHost, streams[i]),
                 "cudaMemcpyAsync (plan exchange)");
      check_cuda(cudaStreamSynchronize(streams[i]), "cudaStreamSynchronize (plan exchange)");
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  // The comparison throws the ranks' (expected) errors: after the release, outside the try.
  for (size_t i = 0; i < n; ++i) check_same_problem(all[i]);
}

}  // namespace

std::vector<DistributedPlan> plan_distributed(const std::vector<GemmArgs>& problems, const std::vector<ncclComm*>& comms,
                                              const DistributedOptions& options) {
  if (comms.empty()) bad("comms is empty (one communicator per rank driven by this process)");
  if (problems.size() != comms.size())
    bad("problems has " + std::to_string(problems.size()) + " entries but comms has " + std::to_string(comms.size()));
  for (size_t i = 0; i < comms.size(); ++i)
    if (!comms[i]) bad("comm" + (comms.size() > 1 ? "[" + std::to_string(i) + "]" : std::string()) + " is null (pass this rank's ncclComm_t)");
  const nccl::Api& api = nccl::api();
  const size_t n = comms.size();
  std::vector<int> rank_of(n), device_of(n), count(n);
  for (size_t i = 0; i < n; ++i) {
    nccl::check(api.CommCount(comms[i], &count[i]), "ncclCommCount");
    nccl::check(api.CommUserRank(comms[i], &rank_of[i]), "ncclCommUserRank");
    nccl::check(api.CommCuDevice(comms[i], &device_of[i]), "ncclCommCuDevice");
    if (count[i] < 1) bad("the communicator has " + std::to_string(count[i]) + " ranks");
    if (count[i] != count[0])
      bad("comms[" + std::to_string(i) + "] has " + std::to_string(count[i]) + " ranks but comms[0] has " +
          std::to_string(count[0]));
  }
  if (n == 1) {  // one rank per process: the communicator's device must be the current one
    int cur = -1;
    check_cuda(cudaGetDevice(&cur), "cudaGetDevice");
    if (cur != device_of[0])
      bad("the communicator is on CUDA device " + std::to_string(device_of[0]) + " but device " + std::to_string(cur) +
          " is current");
  }
  // Every rank plans its shard, keeping any error for the exchange (a rank that threw here would
  // leave the others waiting in the all-gather).
  std::vector<std::shared_ptr<DistributedPlan::Impl>> impls(n);
  std::vector<RankProblem> desc(n);
  for (size_t i = 0; i < n; ++i) {
    try {
      DeviceScope d(device_of[i]);
      impls[i] = plan_rank(problems[i], comms[i], rank_of[i], count[0], device_of[i], options, desc[i]);
    } catch (const Error& e) {
      desc[i].status = int64_t(e.status());
      std::strncpy(desc[i].error, e.what(), sizeof desc[i].error - 1);
    } catch (const std::exception& e) {
      desc[i].status = int64_t(Status::internal);
      std::strncpy(desc[i].error, e.what(), sizeof desc[i].error - 1);
    }
  }
  exchange(comms, rank_of, device_of, count[0], desc);
  std::vector<DistributedPlan> plans;
  for (auto& im : impls) plans.push_back(DA::make(std::move(im)));
  return plans;
}

DistributedPlan plan_distributed(const GemmArgs& problem, ncclComm* comm, const DistributedOptions& options) {
  return plan_distributed(std::vector<GemmArgs>{problem}, std::vector<ncclComm*>{comm}, options).front();
}

namespace {

// Elements of a dense operand's storage, from its first element to its last.
int64_t span(const DenseView& d) {
  if (d.rows == 0 || d.cols == 0) return 0;
  return d.layout == Layout::row_major ? (d.rows - 1) * d.ld + d.cols : (d.cols - 1) * d.ld + d.rows;
}

void check_run(const DistributedPlan::Impl& im, const GemmArgs& args) {
  check_enums(args);
  match_planned(args, im.problem);
  validate(args, false);
}

void broadcast_b(const DistributedPlan::Impl& im, const GemmArgs& args, void* stream) {
  if (im.options.broadcast_root < 0) return;
  const size_t bytes = size_t(span(args.b)) * dtype_size(args.b.dtype);
  nccl::check(nccl::api().Broadcast(args.b.data, args.b.data, bytes, nccl::kUint8, im.options.broadcast_root, im.comm, stream),
              "ncclBroadcast (B)");
  if (args.b.dtype == DType::e4m3 && args.b.scales) {  // an e4m3 B travels with its scales
    const size_t count = size_t(scale_count(args.b.cols, args.b.rows, args.b.scale_group));
    float* sc = const_cast<float*>(args.b.scales);  // in place: the root's values reach the others
    nccl::check(nccl::api().Broadcast(sc, sc, count * 4, nccl::kUint8, im.options.broadcast_root, im.comm, stream),
                "ncclBroadcast (B's scales)");
  }
}

void product(const DistributedPlan::Impl& im, const GemmArgs& args, void* stream) {
  if (im.local) run(im.local, shard(im, args), stream);
}

// An all-gather of unequal row ranges: one in-place broadcast per rank, rooted at the rank that owns
// the rows, fused in one group (NCCL's all-gather moves equal counts only).
void gather_c(const DistributedPlan::Impl& im, const GemmArgs& args, void* stream) {
  if (!im.options.all_gather) return;
  const nccl::Api& api = nccl::api();
  const int64_t row_bytes = args.c.ld * int64_t(dtype_size(args.c.dtype)) * args.sparse.bm;
  nccl::check(api.GroupStart(), "ncclGroupStart");
  nccl::Result r = 0;
  for (int k = 0; k < im.ranks && r == 0; ++k) {
    const int64_t rows = im.bounds[k + 1] - im.bounds[k];
    if (rows == 0) continue;
    char* p = static_cast<char*>(args.c.data) + im.bounds[k] * row_bytes;
    r = api.Broadcast(p, p, size_t(rows * row_bytes), nccl::kUint8, k, im.comm, stream);
  }
  nccl::Result end = api.GroupEnd();
  nccl::check(r, "ncclBroadcast (all-gather of C)");
  nccl::check(end, "ncclGroupEnd");
}

void check_device(const DistributedPlan::Impl& im) {
  int cur = -1;
  check_cuda(cudaGetDevice(&cur), "cudaGetDevice");
  if (cur != im.device)
    throw Error(Status::invalid_argument, "run: the distributed plan is for CUDA device " + std::to_string(im.device) +
                                              " (its communicator's) but device " + std::to_string(cur) + " is current");
}

}  // namespace

void run(const DistributedPlan& plan, const GemmArgs& args, void* stream) {
  const DistributedPlan::Impl& im = DA::impl(plan);
  check_device(im);
  check_run(im, args);  // everything before the first collective
  broadcast_b(im, args, stream);
  product(im, args, stream);
  gather_c(im, args, stream);
}

void run(const std::vector<DistributedPlan>& plans, const std::vector<GemmArgs>& args, const std::vector<void*>& streams) {
  if (plans.size() != args.size() || plans.size() != streams.size())
    throw Error(Status::invalid_argument, "run: plans, args and streams must have one entry per rank, but have " +
                                              std::to_string(plans.size()) + ", " + std::to_string(args.size()) + " and " +
                                              std::to_string(streams.size()));
  for (size_t i = 0; i < plans.size(); ++i) {
    const DistributedPlan::Impl& im = DA::impl(plans[i]);
    DeviceScope d(im.device);
    check_run(im, args[i]);
  }
  const nccl::Api& api = nccl::api();
  auto grouped = [&](void (*step)(const DistributedPlan::Impl&, const GemmArgs&, void*)) {
    nccl::check(api.GroupStart(), "ncclGroupStart");
    try {
      for (size_t i = 0; i < plans.size(); ++i) {
        DeviceScope d(DA::impl(plans[i]).device);
        step(DA::impl(plans[i]), args[i], streams[i]);
      }
    } catch (...) {
      api.GroupEnd();
      throw;
    }
    nccl::check(api.GroupEnd(), "ncclGroupEnd");
  };
  grouped(broadcast_b);
  for (size_t i = 0; i < plans.size(); ++i) {
    DeviceScope d(DA::impl(plans[i]).device);
    product(DA::impl(plans[i]), args[i], streams[i]);
  }
  grouped(gather_c);
}

}  // namespace sparsek
