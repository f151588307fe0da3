// Context-parallel attention (include/sparsek/distributed.hpp), running: per rank the packing of
// the blocks the others need, the transfers (NCCL, or copies between ranks of this process), the
// two attention calls and their merge, the backward and the return of dk and dv to their holders.
// Planning is attention_cp.cpp.
#include "plan/attention_cp_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/nccl.hpp"
#include "format/format_internal.hpp"

namespace sparsek {

using namespace cp_plan;

namespace {

using Impl = DistributedAttentionPlan::Impl;

// Copies (bytes) or sums (elements) of a span range, on the host or the GPU.
void copy_spans(const Impl& im, const Spans& s, const void* src, void* dst, cudaStream_t stream) {
  if (s.count == 0) return;
  if (!im.host) return cp_gpu::copy(im.dspans.as<Span>() + s.first, s.count, s.longest, src, dst, stream);
  for (int64_t i = s.first; i < s.first + s.count; ++i) {
    const Span& x = im.spans[size_t(i)];
    std::memcpy(static_cast<char*>(dst) + x.to, static_cast<const char*>(src) + x.from, size_t(x.n));
  }
}
void add_spans(const Impl& im, const Spans& s, const void* src, void* dst, cudaStream_t stream) {
  if (s.count == 0) return;
  if (!im.host) return cp_gpu::add(im.dspans.as<Span>() + s.first, s.count, s.longest, src, dst, im.dtype, stream);
  for (int64_t i = s.first; i < s.first + s.count; ++i) {
    const Span& x = im.spans[size_t(i)];
    for (int64_t e = 0; e < x.n; ++e)
      store_from_float(dst, im.dtype, x.to + e, load_as_float(dst, im.dtype, x.to + e) + load_as_float(src, im.dtype, x.from + e));
  }
}
void merge(const Impl& im, const AttentionArgs& s, cudaStream_t stream) {
  const int64_t rows = s.q.b * s.q.h * im.sq_r();
  if (!im.host) return cp_gpu::merge(s.o.data, s.lse, im.o2.p, im.lse2.as<float>(), rows, im.d, im.dtype, stream);
  for (int64_t r = 0; r < rows; ++r) {
    const float l1 = s.lse[r], l2 = im.lse2.as<float>()[r], m = std::max(l1, l2);
    float w1 = 0, w2 = 0, l = -INFINITY;
    if (m != -INFINITY) {
      w1 = std::exp(l1 - m), w2 = std::exp(l2 - m);
      const float sum = w1 + w2;
      l = m + std::log(sum);
      w1 /= sum, w2 /= sum;
    }
    for (int64_t e = r * im.d; e < (r + 1) * im.d; ++e)
      store_from_float(s.o.data, im.dtype, e, w1 * load_as_float(s.o.data, im.dtype, e) + w2 * load_as_float(im.o2.p, im.dtype, e));
    s.lse[r] = l;
  }
}

std::string shape(int64_t b, int64_t h, int64_t s, int64_t d) {
  return "[" + num(b) + ", " + num(h) + ", " + num(s) + ", " + num(d) + "]";
}

// A shard tensor: [b, h, s, d] packed, the plan's dtype and memory (16-byte aligned on the GPU).
void check_shard(const Impl& im, const Tensor4View& t, const std::string& name, int64_t b, int64_t h, int64_t s) {
  const std::string who = "rank " + num(im.rank) + ": " + name;
  if (t.b != b || t.h != h || t.s != s || t.d != im.d)
    bad(who + " is " + shape(t.b, t.h, t.s, t.d) + " but this rank's shard is " + shape(b, h, s, im.d));
  if (t.dtype != im.dtype) bad(who + " is " + to_string(t.dtype) + ", the plan's dtype is " + to_string(im.dtype));
  const Memory want = im.host ? Memory::host : Memory::device;
  if (t.memory != want) bad(who + " is in " + to_string(t.memory) + " memory, the plan's is " + to_string(want));
  if (s == 0) return;
  if (t.stride_s != im.d || t.stride_h != s * im.d || t.stride_b != h * s * im.d)
    bad(who + " must be packed: strides (" + num(t.stride_b) + ", " + num(t.stride_h) + ", " + num(t.stride_s) + "), packed (" +
        num(h * s * im.d) + ", " + num(s * im.d) + ", " + num(im.d) + ")");
  if (!t.data) bad(who + " is null");
  if (!im.host && reinterpret_cast<uintptr_t>(t.data) % 16 != 0) bad(who + " is not 16-byte aligned");
}

void check_forward(const Impl& im, const AttentionArgs& s) {
  const AttentionArgs& P = im.problem;
  check_shard(im, s.q, "q", P.q.b, P.q.h, im.sq_r());
  check_shard(im, s.o, "o", P.q.b, P.q.h, im.sq_r());
  check_shard(im, s.k, "k", P.k.b, P.k.h, im.skv_r());
  check_shard(im, s.v, "v", P.k.b, P.k.h, im.skv_r());
  if (im.sq_r() > 0 && !s.lse) bad("rank " + num(im.rank) + ": lse is null (the two parts are merged by it)");
  if (s.cu_seqlens || s.num_seqs != 0)
    throw Error(Status::unsupported, "rank " + num(im.rank) +
                                         ": a shard with cu_seqlens: distributed attention does not take packed "
                                         "sequences (the plan refuses them too)");
}

void check_backward(const Impl& im, const AttentionBackwardArgs& s) {
  const AttentionArgs& P = im.problem;
  check_forward(im, s.forward);
  check_shard(im, s.dout, "dout", P.q.b, P.q.h, im.sq_r());
  check_shard(im, s.dq, "dq", P.q.b, P.q.h, im.sq_r());
  check_shard(im, s.dk, "dk", P.k.b, P.k.h, im.skv_r());
  check_shard(im, s.dv, "dv", P.k.b, P.k.h, im.skv_r());
}

// One part's attention arguments on the shard s: its layout and keys; o and lse the shard's, or
// (second: the remote part's forward when the local part ran) the plan's second partial result.
AttentionArgs part_args(const Impl& im, const Part& part, const AttentionArgs& s, bool second) {
  const Memory m = im.host ? Memory::host : Memory::device;
  AttentionArgs a;
  a.q = s.q;
  a.layout = part.layout;
  a.causal = part.causal;
  a.scale = im.problem.softmax_scale();
  if (&part == &im.local) {
    a.k = s.k, a.v = s.v;
  } else {
    a.k = Tensor4View::packed(im.kc.p, im.dtype, m, im.problem.k.b, im.problem.k.h, im.remote_rows, im.d);
    a.v = Tensor4View::packed(im.vc.p, im.dtype, m, im.problem.k.b, im.problem.k.h, im.remote_rows, im.d);
  }
  if (second) {
    a.o = Tensor4View::packed(im.o2.p, im.dtype, m, s.q.b, s.q.h, s.q.s, im.d);
    a.lse = im.lse2.as<float>();
  } else {
    a.o = s.o, a.lse = s.lse;
  }
  return a;
}

// Pack the blocks other ranks need (on the side stream, forked from the caller's).
void start(Impl& im, const Tensor4View& k, const Tensor4View& v, cudaStream_t main) {
  if (!im.transfers()) return;
  if (!im.host) {
    check_cuda(cudaEventRecord(im.fork, main), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(im.side, im.fork, 0), "cudaStreamWaitEvent");
  }
  copy_spans(im, im.pack_k, k.data, im.sendbuf.p, im.side);
  copy_spans(im, im.pack_v, v.data, im.sendbuf.p, im.side);
}

// The sends and receives of every rank of this process. back = false: the packed blocks to the
// ranks that need them (side streams); true: the received blocks' dk and dv back to their holders
// (the callers' streams).
void exchange(const std::vector<Impl*>& ims, const std::vector<cudaStream_t>& mains, bool back) {
  if (ims[0]->inproc) {  // every rank is here: copies, each rank pulling what it receives
    auto stream_of = [&](size_t i) { return back ? mains[i] : ims[i]->side; };
    if (!ims[0]->host)  // every rank's copies wait for every rank's packed buffers
      for (size_t i = 0; i < ims.size(); ++i)
        if (ims[i]->ready) check_cuda(cudaEventRecord(ims[i]->ready, stream_of(i)), "cudaEventRecord");
    for (size_t i = 0; i < ims.size(); ++i) {
      Impl* r = ims[i];
      if (!r->transfers()) continue;
      if (!r->host)
        for (const Impl* q : ims)
          if (q->ready) check_cuda(cudaStreamWaitEvent(stream_of(i), q->ready, 0), "cudaStreamWaitEvent");
      for (int p = 0; p < r->ranks; ++p) {
        const Impl& q = *ims[size_t(p)];
        char* dst = back ? r->sendbuf.as<char>() + r->send_off[size_t(p)] : r->recvbuf.as<char>() + r->recv_off[size_t(p)];
        const char* src = back ? q.recvbuf.as<char>() + q.recv_off[size_t(r->rank)] : q.sendbuf.as<char>() + q.send_off[size_t(r->rank)];
        const size_t bytes = size_t(back ? r->send_bytes[size_t(p)] : r->recv_bytes[size_t(p)]);
        if (bytes == 0) continue;
        if (r->host) std::memcpy(dst, src, bytes);
        else check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(i)), "cudaMemcpyAsync (transfer)");
      }
    }
    // The senders' buffers are reused by their next run: every rank's stream waits for these copies
    // (so in this mode a rank's local part does not overlap the transfers).
    if (!ims[0]->host)
      for (size_t i = 0; i < ims.size(); ++i)
        if (ims[i]->ready) {
          check_cuda(cudaEventRecord(ims[i]->ready, stream_of(i)), "cudaEventRecord");
          for (size_t j = 0; j < ims.size(); ++j)
            if (j != i) check_cuda(cudaStreamWaitEvent(mains[j], ims[i]->ready, 0), "cudaStreamWaitEvent");
        }
    return;
  }
  bool any = false;
  for (const Impl* im : ims) any = any || im->transfers();
  if (!any) return;
  const nccl::Api& api = nccl::api();
  nccl::check(api.GroupStart(), "ncclGroupStart");
  nccl::Result r = 0;
  for (size_t i = 0; i < ims.size() && r == 0; ++i) {
    const Impl& im = *ims[i];
    void* stream = back ? static_cast<void*>(mains[i]) : static_cast<void*>(im.side);
    for (int p = 0; p < im.ranks && r == 0; ++p) {
      const size_t sb = size_t(im.send_bytes[size_t(p)]), rb = size_t(im.recv_bytes[size_t(p)]);
      char* send = im.sendbuf.as<char>() + im.send_off[size_t(p)];
      char* recv = im.recvbuf.as<char>() + im.recv_off[size_t(p)];
      if (!back) {
        if (sb && r == 0) r = api.Send(send, sb, nccl::kUint8, p, im.comm, stream);
        if (rb && r == 0) r = api.Recv(recv, rb, nccl::kUint8, p, im.comm, stream);
      } else {
        if (rb && r == 0) r = api.Send(recv, rb, nccl::kUint8, p, im.comm, stream);
        if (sb && r == 0) r = api.Recv(send, sb, nccl::kUint8, p, im.comm, stream);
      }
    }
  }
  const nccl::Result end = api.GroupEnd();
  nccl::check(r, back ? "ncclSend/ncclRecv (dk, dv back to their holders)" : "ncclSend/ncclRecv (key/value blocks)");
  nccl::check(end, "ncclGroupEnd");
}

// The received blocks into the compact buffer; the side stream joins back later (wait()).
void unpack(Impl& im) {
  if (!im.transfers()) return;
  if (im.remote.on) {
    copy_spans(im, im.unpack_k, im.recvbuf.p, im.kc.p, im.side);
    copy_spans(im, im.unpack_v, im.recvbuf.p, im.vc.p, im.side);
  }
  if (!im.host) check_cuda(cudaEventRecord(im.join, im.side), "cudaEventRecord");
}
void wait(const Impl& im, cudaStream_t main) {
  if (im.transfers() && !im.host) check_cuda(cudaStreamWaitEvent(main, im.join, 0), "cudaStreamWaitEvent");
}

void forward(Impl& im, const AttentionArgs& s, cudaStream_t main) {
  if (im.local.on) {
    const AttentionArgs a = part_args(im, im.local, s, false);
    if (!im.local.fwd) im.local.fwd = plan(a, im.options);
    run(im.local.fwd, a, main);
  }
  wait(im, main);
  if (im.remote.on) {
    const AttentionArgs a = part_args(im, im.remote, s, im.local.on);
    if (!im.remote.fwd) im.remote.fwd = plan(a, im.options);
    run(im.remote.fwd, a, main);
    if (im.local.on) merge(im, s, main);
  }
}

void zero(const Impl& im, const Tensor4View& t, cudaStream_t main) {
  const size_t bytes = size_t(t.b * t.h * t.s * t.d * im.es);
  if (bytes == 0) return;
  if (im.host) std::memset(t.data, 0, bytes);
  else check_cuda(cudaMemsetAsync(t.data, 0, bytes, main), "cudaMemsetAsync (dk, dv)");
}

// Both parts' gradients; the remote part's dk and dv packed for their holders.
void backward(Impl& im, const AttentionBackwardArgs& s, cudaStream_t main) {
  const Memory m = im.host ? Memory::host : Memory::device;
  if (im.local.on) {
    AttentionBackwardArgs b = s;
    b.forward = part_args(im, im.local, s.forward, false);
    if (!im.local.bwd) im.local.bwd = plan(b, im.options);
    run(im.local.bwd, b, main);
  } else {
    zero(im, s.dk, main), zero(im, s.dv, main);
  }
  wait(im, main);
  if (im.remote.on) {
    AttentionBackwardArgs b = s;
    b.forward = part_args(im, im.remote, s.forward, false);  // the merged o and lse
    if (im.local.on) b.dq = Tensor4View::packed(im.dq2.p, im.dtype, m, s.dq.b, s.dq.h, s.dq.s, im.d);
    b.dk = Tensor4View::packed(im.dkc.p, im.dtype, m, im.problem.k.b, im.problem.k.h, im.remote_rows, im.d);
    b.dv = Tensor4View::packed(im.dvc.p, im.dtype, m, im.problem.k.b, im.problem.k.h, im.remote_rows, im.d);
    if (!im.remote.bwd) im.remote.bwd = plan(b, im.options);
    run(im.remote.bwd, b, main);
    if (im.local.on) add_spans(im, im.dq_sum, im.dq2.p, s.dq.data, main);
    copy_spans(im, im.back_k, im.dkc.p, im.recvbuf.p, main);
    copy_spans(im, im.back_v, im.dvc.p, im.recvbuf.p, main);
  }
}

// What the other ranks returned, added to this rank's dk and dv in rank order.
void sum_returned(const Impl& im, const AttentionBackwardArgs& s, cudaStream_t main) {
  for (int p = 0; p < im.ranks; ++p) {
    add_spans(im, im.sum_k[size_t(p)], im.sendbuf.p, s.dk.data, main);
    add_spans(im, im.sum_v[size_t(p)], im.sendbuf.p, s.dv.data, main);
  }
}

std::vector<Impl*> impls_of(const std::vector<DistributedAttentionPlan>& plans, size_t shards, const std::vector<void*>& streams,
                            std::vector<cudaStream_t>& mains) {
  if (plans.empty()) bad("plans is empty");
  if (shards != plans.size()) bad("plans has " + num(int64_t(plans.size())) + " entries but shards has " + num(int64_t(shards)));
  if (!streams.empty() && streams.size() != plans.size())
    bad("streams has " + num(int64_t(streams.size())) + " entries: pass one per plan, or none");
  std::vector<Impl*> ims;
  for (const auto& p : plans) ims.push_back(&DAA::impl(p));
  if (ims[0]->inproc) {
    if (int(ims.size()) != ims[0]->ranks)
      bad("the " + num(ims[0]->ranks) + " ranks of a plan without communicators run together: pass every rank's plan, in rank order");
    for (size_t i = 0; i < ims.size(); ++i)
      if (!ims[i]->inproc || ims[i]->rank != int(i) || ims[i]->ranks != ims[0]->ranks || ims[i]->host != ims[0]->host)
        bad("plans[" + num(int64_t(i)) + "] is not rank " + num(int64_t(i)) + " of the first plan's ranks");
  } else {
    for (size_t i = 0; i < ims.size(); ++i)
      if (ims[i]->inproc) bad("plans mixes plans with and without communicators");
  }
  mains.assign(ims.size(), nullptr);
  for (size_t i = 0; i < streams.size(); ++i) {
    mains[i] = static_cast<cudaStream_t>(streams[i]);
    // A stream of another device than the plan's would fail later as an invalid handle (the plan's
    // events and side stream live on its device). (The null stream is the plan's device's; under
    // graph capture the check is left to the eager runs before it, so that the query never meets a
    // capture.)
    int dev = -1;
    if (mains[i] && !ims[i]->host && !stream_is_capturing(mains[i]) &&
        cudaStreamGetDevice(mains[i], &dev) == cudaSuccess && dev != ims[i]->device)
      bad("streams[" + num(int64_t(i)) + "] is on CUDA device " + num(int64_t(dev)) + " but plans[" + num(int64_t(i)) +
          "] was made on device " + num(int64_t(ims[i]->device)) + " (the device current when it was planned)");
  }
  return ims;
}

// Runs f(i) with rank i's device current (GPU plans).
template <class F>
void each(const std::vector<Impl*>& ims, F&& f) {
  for (size_t i = 0; i < ims.size(); ++i) {
    if (ims[i]->host) {
      f(i);
    } else {
      DeviceScope d(ims[i]->device);
      f(i);
    }
  }
}

}  // namespace

void run(const std::vector<DistributedAttentionPlan>& plans, const std::vector<AttentionArgs>& shards,
         const std::vector<void*>& streams) {
  std::vector<cudaStream_t> mains;
  const std::vector<Impl*> ims = impls_of(plans, shards.size(), streams, mains);
  for (size_t i = 0; i < ims.size(); ++i) check_forward(*ims[i], shards[i]);
  each(ims, [&](size_t i) { start(*ims[i], shards[i].k, shards[i].v, mains[i]); });
  exchange(ims, mains, false);
  each(ims, [&](size_t i) {
    unpack(*ims[i]);
    forward(*ims[i], shards[i], mains[i]);
  });
}

void run(const DistributedAttentionPlan& plan, const AttentionArgs& shard, void* stream) {
  run(std::vector<DistributedAttentionPlan>{plan}, std::vector<AttentionArgs>{shard}, std::vector<void*>{stream});
}

void run_backward(const std::vector<DistributedAttentionPlan>& plans, const std::vector<AttentionBackwardArgs>& shards,
                  const std::vector<void*>& streams) {
  std::vector<cudaStream_t> mains;
  const std::vector<Impl*> ims = impls_of(plans, shards.size(), streams, mains);
  for (size_t i = 0; i < ims.size(); ++i) check_backward(*ims[i], shards[i]);
  each(ims, [&](size_t i) { start(*ims[i], shards[i].forward.k, shards[i].forward.v, mains[i]); });
  exchange(ims, mains, false);
  each(ims, [&](size_t i) {
    unpack(*ims[i]);
    backward(*ims[i], shards[i], mains[i]);
  });
  exchange(ims, mains, true);
  each(ims, [&](size_t i) { sum_returned(*ims[i], shards[i], mains[i]); });
}

void run_backward(const DistributedAttentionPlan& plan, const AttentionBackwardArgs& shard, void* stream) {
  run_backward(std::vector<DistributedAttentionPlan>{plan}, std::vector<AttentionBackwardArgs>{shard},
               std::vector<void*>{stream});
}

}  // namespace sparsek
