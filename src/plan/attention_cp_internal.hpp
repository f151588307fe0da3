// Internal: the plan of context-parallel attention shared by its two halves, planning
// (attention_cp.cpp) and running (attention_cp_run.cpp): a rank's buffers, its two attention calls
// ("local": the key/value blocks it holds; "remote": the blocks it receives, kept in a compact
// buffer) and the spans that move blocks between shards, transfer buffers and the compact buffer.
#pragma once
#include "sparsek/distributed.hpp"

#include "core/cuda_host.hpp"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "kernels/cp/cp.hpp"

namespace sparsek {

namespace cp_plan {

using cp_gpu::Span;

[[noreturn]] inline void bad(const std::string& what) {
  throw Error(Status::invalid_argument, "distributed attention: " + what);
}
inline std::string num(int64_t v) { return std::to_string(v); }

// One allocation of a rank: device memory on its device, or host memory.
struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  bool host = false;
  int device = -1;
  Buffer() = default;
  Buffer(size_t n, bool on_host, int dev) : bytes(n), host(on_host), device(dev) {
    if (n == 0) return;
    if (host) {
      p = ::operator new(n);
      std::memset(p, 0, n);
    } else {
      check_cuda(cudaMalloc(&p, n), "cudaMalloc (distributed attention)");
      check_cuda(cudaMemset(p, 0, n), "cudaMemset (distributed attention)");
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(p, o.p), std::swap(bytes, o.bytes), std::swap(host, o.host), std::swap(device, o.device);
    return *this;
  }
  ~Buffer() {
    if (!p) return;
    if (host) {
      ::operator delete(p);
    } else {
      DeviceScope d(device);
      cudaFree(p);
    }
  }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

// A range of the plan's spans: [first, first + count), the longest `longest` (bytes or elements).
struct Spans {
  int64_t first = 0, count = 0, longest = 0;
};

// One of a rank's two attention calls.
struct Part {
  bool on = false;
  bool causal = false;
  int64_t skv = 0;  // key rows of the call
  std::vector<int32_t> num, idx, fnum, fidx;  // its layout, host
  Buffer dlayout;                             // the same four arrays on the device (GPU plans)
  AttentionLayout layout;
  AttentionPlan fwd;  // planned at the first run (the shards' pointers are needed)
  AttentionBackwardPlan bwd;
};


}  // namespace cp_plan

struct DistributedAttentionPlan::Impl {
  using Buffer = cp_plan::Buffer;
  using Part = cp_plan::Part;
  using Spans = cp_plan::Spans;
  using Span = cp_plan::Span;
  AttentionArgs problem;  // the whole problem's shapes (pointers cleared; the layout lives in the parts)
  Options options;
  ncclComm* comm = nullptr;
  bool host = false;    // host memory (the CPU backend)
  bool inproc = false;  // every rank in this process without NCCL: transfers are copies
  int rank = 0, ranks = 1, device = -1;
  AttentionShards shards;
  int64_t q0 = 0, q1 = 0, kv0 = 0, kv1 = 0;  // rows
  DType dtype = DType::bf16;
  int64_t d = 0, es = 0, block_bytes = 0;  // a packed key/value block: block_kv * d * es bytes
  Part local, remote;
  int64_t remote_rows = 0;  // rows per (batch, key/value head) of the compact buffer
  // Transfer buffers: per peer a section of K blocks then V blocks, in the order of the ids.
  std::vector<int64_t> send_off, send_bytes, recv_off, recv_bytes;
  Buffer sendbuf, recvbuf, kc, vc, o2, lse2, dq2, dkc, dvc;
  // Spans (bytes for copies, elements for sums), on the host and (GPU) the device.
  std::vector<Span> spans;
  Buffer dspans;
  Spans pack_k, pack_v, unpack_k, unpack_v, back_k, back_v;
  std::vector<Spans> sum_k, sum_v;  // per peer: its returned dk / dv added into the shards
  Spans dq_sum;                     // one span over the whole dq shard (elements)
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaEvent_t ready = nullptr;  // in-process GPU ranks: this rank's buffer is ready for the others' copies

  bool transfers() const { return sendbuf.bytes || recvbuf.bytes; }  // this rank sends or receives blocks
  int64_t sq_r() const { return q1 - q0; }
  int64_t skv_r() const { return kv1 - kv0; }
  ~Impl() {
    if (side || fork || join || ready) {
      DeviceScope s(device);
      if (side) cudaStreamDestroy(side);
      for (cudaEvent_t e : {fork, join, ready})
        if (e) cudaEventDestroy(e);
    }
  }
};


struct DistributedAttentionAccess {
  static DistributedAttentionPlan::Impl& impl(const DistributedAttentionPlan& p) {
    if (!p.impl_) throw Error(Status::invalid_argument, "distributed attention: the plan is empty");
    return *p.impl_;
  }
  static DistributedAttentionPlan make(std::shared_ptr<DistributedAttentionPlan::Impl> im) {
    DistributedAttentionPlan p;
    p.impl_ = std::move(im);
    return p;
  }
};
using DAA = DistributedAttentionAccess;

}  // namespace sparsek
