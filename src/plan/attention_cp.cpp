// Context-parallel attention (include/sparsek/distributed.hpp), planning: per rank both attention
// calls' layouts (the whole layout's rows of this rank, split by where each block lives and
// renumbered), the packed transfer buffers and the spans (attention_cp_internal.hpp); the ranks'
// problems compared across ranks. Running is attention_cp_run.cpp.
#include "plan/attention_cp_internal.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/nccl.hpp"

namespace sparsek {

using namespace cp_plan;

DistributedAttentionPlan::DistributedAttentionPlan() = default;
DistributedAttentionPlan::~DistributedAttentionPlan() = default;
DistributedAttentionPlan::DistributedAttentionPlan(const DistributedAttentionPlan&) = default;
DistributedAttentionPlan& DistributedAttentionPlan::operator=(const DistributedAttentionPlan&) = default;
DistributedAttentionPlan::DistributedAttentionPlan(DistributedAttentionPlan&&) noexcept = default;
DistributedAttentionPlan& DistributedAttentionPlan::operator=(DistributedAttentionPlan&&) noexcept = default;

int DistributedAttentionPlan::rank() const { return DAA::impl(*this).rank; }
int DistributedAttentionPlan::ranks() const { return DAA::impl(*this).ranks; }
const AttentionShards& DistributedAttentionPlan::shards() const { return DAA::impl(*this).shards; }
int64_t DistributedAttentionPlan::q_row_begin() const { return DAA::impl(*this).q0; }
int64_t DistributedAttentionPlan::q_row_end() const { return DAA::impl(*this).q1; }
int64_t DistributedAttentionPlan::kv_row_begin() const { return DAA::impl(*this).kv0; }
int64_t DistributedAttentionPlan::kv_row_end() const { return DAA::impl(*this).kv1; }
double DistributedAttentionPlan::recv_bytes() const {
  const auto& im = DAA::impl(*this);
  return im.shards.recv_bytes(im.rank, im.d, im.es);
}
size_t DistributedAttentionPlan::workspace_bytes() const {
  const auto& im = DAA::impl(*this);
  size_t n = im.dspans.bytes + im.local.dlayout.bytes + im.remote.dlayout.bytes;
  for (const Buffer* b : {&im.sendbuf, &im.recvbuf, &im.kc, &im.vc, &im.o2, &im.lse2, &im.dq2, &im.dkc, &im.dvc}) n += b->bytes;
  return n;
}
double DistributedAttentionPlan::ring_bytes() const {
  const auto& im = DAA::impl(*this);
  return im.shards.ring_bytes(im.rank, im.d, im.es);
}

namespace {

// The checks of the whole problem that need no data (the two attention calls check the rest when
// they are planned).
void check_problem(const AttentionArgs& a) {
  const Tensor4View &q = a.q, &k = a.k, &v = a.v;
  if (q.dtype != k.dtype || q.dtype != v.dtype)
    bad(std::string("q, k and v must share one dtype (") + to_string(q.dtype) + ", " + to_string(k.dtype) + ", " +
        to_string(v.dtype) + ")");
  if (q.dtype != DType::bf16 && q.dtype != DType::f16 && q.dtype != DType::f32)
    bad(std::string("dtype ") + to_string(q.dtype) + " is not f16, bf16 or f32");
  if (q.memory != k.memory || q.memory != v.memory) bad("q, k and v must be in one kind of memory");
  if (q.b < 1 || q.h < 1 || q.s < 1 || q.d < 1) bad("q is [" + num(q.b) + ", " + num(q.h) + ", " + num(q.s) + ", " + num(q.d) + "]: every extent must be >= 1");
  if (k.b != q.b || v.b != q.b) bad("k.b = " + num(k.b) + ", v.b = " + num(v.b) + " differ from q.b = " + num(q.b));
  if (k.d != q.d || v.d != q.d) bad("k.d = " + num(k.d) + ", v.d = " + num(v.d) + " differ from q.d = " + num(q.d));
  if (k.h < 1 || v.h != k.h || q.h % k.h != 0)
    bad("q.h = " + num(q.h) + ", k.h = " + num(k.h) + ", v.h = " + num(v.h) + ": k.h = v.h must divide q.h");
  if (k.s < 1 || v.s != k.s) bad("k.s = " + num(k.s) + ", v.s = " + num(v.s) + " must be equal and >= 1");
  if (a.cu_seqlens || a.num_seqs != 0)
    throw Error(Status::unsupported,
                "distributed attention: packed sequences (cu_seqlens) are not supported; split the packed batch "
                "by sequence, or run attention() on one GPU");
  if (a.causal && (q.s != k.s || a.layout.block_q != a.layout.block_kv))
    throw Error(Status::unsupported, "distributed attention: causal needs self-attention (q.s = k.s, block_q = block_kv); got q.s = " +
                                         num(q.s) + ", k.s = " + num(k.s) + ", blocks " + num(a.layout.block_q) + "x" + num(a.layout.block_kv));
}

// FNV-1a over bytes: the problem compared across ranks.
struct Hash {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  void add(int64_t v) { add(&v, sizeof v); }
};

void hash_problem(const AttentionArgs& a, uint64_t& shapes, uint64_t& layout) {
  Hash s;
  for (const Tensor4View* t : {&a.q, &a.k, &a.v}) {
    for (int64_t x : {t->b, t->h, t->s, t->d, int64_t(t->dtype), int64_t(t->memory)}) s.add(x);
  }
  const AttentionLayout& l = a.layout;
  for (int64_t x : {l.batch, l.heads, l.q_blocks, l.kmax, l.has_full() ? l.full_kmax : -1, int64_t(l.block_q),
                    int64_t(l.block_kv), int64_t(a.causal)})
    s.add(x);
  const float sc = a.softmax_scale();
  s.add(&sc, sizeof sc);
  shapes = s.h;
  Hash h;
  const int64_t rows = l.batch * l.heads * l.q_blocks;
  h.add(l.kv_num_blocks, size_t(rows) * 4);
  h.add(l.kv_indices, size_t(rows * l.kmax) * 4);
  if (l.has_full()) {
    h.add(l.full_kv_num_blocks, size_t(rows) * 4);
    h.add(l.full_kv_indices, size_t(rows * l.full_kmax) * 4);
  }
  layout = h.h;
}

// Builds one rank's plan (host work, then its buffers). The layout was checked by
// plan_attention_shards().
std::shared_ptr<DistributedAttentionPlan::Impl> plan_rank(const AttentionArgs& a, const AttentionShards& sh, int rank,
                                                         int device, bool host, bool inproc, ncclComm* comm, const Options& o) {
  auto imp = std::make_shared<DistributedAttentionPlan::Impl>();
  auto& im = *imp;
  im.problem = a;
  for (Tensor4View* t : {&im.problem.q, &im.problem.k, &im.problem.v, &im.problem.o}) t->data = nullptr;
  im.problem.lse = nullptr;
  im.problem.layout = AttentionLayout{};
  im.options = o;
  im.comm = comm, im.host = host, im.inproc = inproc, im.rank = rank, im.ranks = sh.ranks, im.device = device;
  im.shards = sh;
  const AttentionLayout& l = a.layout;
  const int64_t B = a.q.b, hq = a.q.h, hkv = a.k.h, G = hq / hkv, sq = a.q.s, skv = a.k.s;
  const int bq = l.block_q, bk = l.block_kv;
  const int64_t nk = sh.kv_blocks;
  const AttentionShardRank& me = sh.rank[size_t(rank)];
  im.q0 = std::min(me.q_begin * bq, sq), im.q1 = std::min(me.q_end * bq, sq);
  im.kv0 = std::min(me.kv_begin * bk, skv), im.kv1 = std::min(me.kv_end * bk, skv);
  im.dtype = a.q.dtype, im.d = a.q.d, im.es = int64_t(dtype_size(a.q.dtype));
  im.block_bytes = int64_t(bk) * im.d * im.es;
  auto rows_of = [&](int64_t j) { return std::min<int64_t>(bk, skv - j * bk); };

  // The compact buffer: per (batch, kv head) the received blocks ascending in slots. When the
  // sequence's last block is partial and received anywhere, it has a slot of its own after every
  // other block's (the call masks the keys past its rows only in its last slot, so no whole block
  // may sit there).
  std::vector<std::vector<int32_t>> got(size_t(B * hkv));
  for (int p = 0; p < sh.ranks; ++p)
    for (int64_t id : me.recv[size_t(p)]) got[size_t(id / nk)].push_back(int32_t(id % nk));
  const bool partial_last = rows_of(nk - 1) < bk;
  int64_t slots = 0;  // for whole blocks
  bool tail = false;
  for (auto& g : got) {
    std::sort(g.begin(), g.end());
    const bool has_tail = partial_last && !g.empty() && g.back() == nk - 1;
    tail = tail || has_tail;
    slots = std::max<int64_t>(slots, int64_t(g.size()) - (has_tail ? 1 : 0));
  }
  im.remote_rows = slots * bk + (tail ? rows_of(nk - 1) : 0);
  auto slot_of = [&](int64_t bg, int64_t j) {
    if (j == nk - 1 && partial_last) return slots;
    const auto& g = got[size_t(bg)];
    return int64_t(std::lower_bound(g.begin(), g.end(), int32_t(j)) - g.begin());
  };

  // The two layouts: rows [q_begin, q_end) of the whole one; each entry goes to the call that has
  // its block (local index j - kv_begin, or its slot), in its own list; under causal a kv_indices
  // block of another rank past the row is dropped (masked whole: plan_attention_shards never sends it).
  const int64_t mq = me.q_end - me.q_begin, lrows = l.batch * l.heads;
  auto last_row = [&](int64_t i) { return std::min((i + 1) * bq, sq) - 1; };
  for (Part* part : {&im.local, &im.remote}) {
    const bool is_local = part == &im.local;
    int64_t kmax = 1, fkmax = 1;
    std::vector<std::vector<int32_t>> rows(size_t(lrows * mq)), frows(size_t(lrows * mq));
    for (int64_t lb = 0; lb < l.batch; ++lb)
      for (int64_t lh = 0; lh < l.heads; ++lh) {
        const int64_t bg = (l.batch == 1 ? 0 : lb) * hkv + (l.heads == 1 ? 0 : l.heads == hkv ? lh : lh / G);
        for (int64_t i = me.q_begin; i < me.q_end; ++i)
          for (int full = 0; full < (l.has_full() ? 2 : 1); ++full) {
            const int64_t row = (lb * l.heads + lh) * l.q_blocks + i;
            const int32_t* idx = full ? l.full_kv_indices : l.kv_indices;
            const int64_t km = full ? l.full_kmax : l.kmax, n = (full ? l.full_kv_num_blocks : l.kv_num_blocks)[row];
            auto& out = (full ? frows : rows)[size_t((lb * l.heads + lh) * mq + i - me.q_begin)];
            for (int64_t e = 0; e < n; ++e) {
              const int64_t j = idx[row * km + e];
              const bool held = j >= me.kv_begin && j < me.kv_end;
              if (held != is_local) continue;
              if (is_local) out.push_back(int32_t(j - me.kv_begin));
              else if (full || !a.causal || j * bk <= last_row(i)) out.push_back(int32_t(slot_of(bg, j)));
            }
            (full ? fkmax : kmax) = std::max<int64_t>(full ? fkmax : kmax, int64_t(out.size()));
          }
      }
    part->num.assign(size_t(lrows * mq), 0), part->idx.assign(size_t(lrows * mq * kmax), 0);
    for (size_t r = 0; r < rows.size(); ++r) {
      part->num[r] = int32_t(rows[r].size());
      std::copy(rows[r].begin(), rows[r].end(), part->idx.begin() + ptrdiff_t(r * size_t(kmax)));
    }
    AttentionLayout& pl = part->layout;
    pl.batch = l.batch, pl.heads = l.heads, pl.q_blocks = mq, pl.kmax = kmax;
    pl.block_q = bq, pl.block_kv = bk;
    if (l.has_full()) {
      part->fnum.assign(size_t(lrows * mq), 0), part->fidx.assign(size_t(lrows * mq * fkmax), 0);
      for (size_t r = 0; r < frows.size(); ++r) {
        part->fnum[r] = int32_t(frows[r].size());
        std::copy(frows[r].begin(), frows[r].end(), part->fidx.begin() + ptrdiff_t(r * size_t(fkmax)));
      }
      pl.full_kmax = fkmax;
    }
    part->skv = is_local ? im.skv_r() : im.remote_rows;
    part->causal = is_local && a.causal;
    part->on = mq > 0 && part->skv > 0;
  }
  if (im.sq_r() > 0 && !im.local.on && !im.remote.on)
    throw Error(Status::unsupported, "distributed attention: rank " + num(rank) + " computes query rows [" + num(im.q0) + ", " +
                                         num(im.q1) + ") but holds no key/value row and receives none: use fewer ranks");

  // Transfers and spans.
  const int R = sh.ranks;
  im.send_off.assign(size_t(R), 0), im.send_bytes.assign(size_t(R), 0);
  im.recv_off.assign(size_t(R), 0), im.recv_bytes.assign(size_t(R), 0);
  int64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < R; ++p) {
    im.send_off[size_t(p)] = send_total;
    im.send_bytes[size_t(p)] = 2 * int64_t(sh.rank[size_t(p)].recv[size_t(rank)].size()) * im.block_bytes;
    send_total += im.send_bytes[size_t(p)];
    im.recv_off[size_t(p)] = recv_total;
    im.recv_bytes[size_t(p)] = 2 * int64_t(me.recv[size_t(p)].size()) * im.block_bytes;
    recv_total += im.recv_bytes[size_t(p)];
  }
  auto list = [&](Spans& s, auto&& fill) {
    s.first = int64_t(im.spans.size());
    fill();
    s.count = int64_t(im.spans.size()) - s.first;
    for (int64_t i = s.first; i < s.first + s.count; ++i) s.longest = std::max(s.longest, im.spans[size_t(i)].n);
  };
  const int64_t skv_r = im.skv_r(), bb = im.block_bytes, es = im.es;
  // Byte offset of block j (held here) of (b, g) in a k or v shard, and of slot s in the compact buffer.
  auto shard_at = [&](int64_t bg, int64_t j) { return (bg * skv_r + j * bk - im.kv0) * im.d * es; };
  auto compact_at = [&](int64_t bg, int64_t j) { return (bg * im.remote_rows + slot_of(bg, j) * bk) * im.d * es; };
  for (int kv = 0; kv < 2; ++kv)  // pack: the shard's blocks other ranks need -> send sections
    list(kv ? im.pack_v : im.pack_k, [&] {
      for (int p = 0; p < R; ++p) {
        const auto& ids = sh.rank[size_t(p)].recv[size_t(rank)];
        for (size_t t = 0; t < ids.size(); ++t) {
          const int64_t j = ids[t] % nk;
          im.spans.push_back({shard_at(ids[t] / nk, j), im.send_off[size_t(p)] + (int64_t(kv * ids.size()) + int64_t(t)) * bb,
                              rows_of(j) * im.d * es});
        }
      }
    });
  for (int kv = 0; kv < 2; ++kv)  // unpack: receive sections -> compact buffer
    list(kv ? im.unpack_v : im.unpack_k, [&] {
      for (int p = 0; p < R; ++p) {
        const auto& ids = me.recv[size_t(p)];
        for (size_t t = 0; t < ids.size(); ++t) {
          const int64_t j = ids[t] % nk;
          im.spans.push_back({im.recv_off[size_t(p)] + (int64_t(kv * ids.size()) + int64_t(t)) * bb,
                              compact_at(ids[t] / nk, j), rows_of(j) * im.d * es});
        }
      }
    });
  for (int kv = 0; kv < 2; ++kv) {  // back: the compact dk, dv -> receive sections (the unpack reversed)
    const Spans& u = kv ? im.unpack_v : im.unpack_k;
    list(kv ? im.back_v : im.back_k, [&] {
      for (int64_t i = u.first; i < u.first + u.count; ++i) {
        const Span s = im.spans[size_t(i)];
        im.spans.push_back({s.to, s.from, s.n});
      }
    });
  }
  im.sum_k.assign(size_t(R), {}), im.sum_v.assign(size_t(R), {});
  for (int kv = 0; kv < 2; ++kv)  // sums: what peer p returns (in its send section) -> + the shard, in elements
    for (int p = 0; p < R; ++p)
      list((kv ? im.sum_v : im.sum_k)[size_t(p)], [&] {
        const auto& ids = sh.rank[size_t(p)].recv[size_t(rank)];
        for (size_t t = 0; t < ids.size(); ++t) {
          const int64_t j = ids[t] % nk;
          im.spans.push_back({(im.send_off[size_t(p)] + (int64_t(kv * ids.size()) + int64_t(t)) * bb) / es,
                              shard_at(ids[t] / nk, j) / es, rows_of(j) * im.d});
        }
      });

  const int64_t qrows = a.q.b * a.q.h * im.sq_r();
  list(im.dq_sum, [&] { im.spans.push_back({0, 0, qrows * im.d}); });

  // Buffers.
  im.sendbuf = Buffer(size_t(send_total), host, device);
  im.recvbuf = Buffer(size_t(recv_total), host, device);
  if (im.remote.on) {
    const size_t kc_bytes = size_t(B * hkv * im.remote_rows * im.d * es);
    im.kc = Buffer(kc_bytes, host, device), im.vc = Buffer(kc_bytes, host, device);
    im.dkc = Buffer(kc_bytes, host, device), im.dvc = Buffer(kc_bytes, host, device);
    if (im.local.on) {
      im.o2 = Buffer(size_t(qrows * im.d * es), host, device);
      im.lse2 = Buffer(size_t(qrows) * 4, host, device);
      im.dq2 = Buffer(size_t(qrows * im.d * es), host, device);
    }
  }
  for (Part* part : {&im.local, &im.remote}) {
    AttentionLayout& pl = part->layout;
    pl.memory = host ? Memory::host : Memory::device;
    if (host) {
      pl.kv_num_blocks = part->num.data(), pl.kv_indices = part->idx.data();
      if (l.has_full()) pl.full_kv_num_blocks = part->fnum.data(), pl.full_kv_indices = part->fidx.data();
      continue;
    }
    const size_t n0 = part->num.size(), n1 = part->idx.size(), n2 = part->fnum.size(), n3 = part->fidx.size();
    part->dlayout = Buffer((n0 + n1 + n2 + n3) * 4, false, device);
    int32_t* base = part->dlayout.as<int32_t>();
    auto put = [&](int32_t* at, const std::vector<int32_t>& v) {
      if (!v.empty()) check_cuda(cudaMemcpy(at, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy (layout)");
      return at;
    };
    pl.kv_num_blocks = put(base, part->num), pl.kv_indices = put(base + n0, part->idx);
    if (l.has_full()) pl.full_kv_num_blocks = put(base + n0 + n1, part->fnum), pl.full_kv_indices = put(base + n0 + n1 + n2, part->fidx);
  }
  if (!host) {
    im.dspans = Buffer(im.spans.size() * sizeof(Span), false, device);
    if (!im.spans.empty())
      check_cuda(cudaMemcpy(im.dspans.p, im.spans.data(), im.spans.size() * sizeof(Span), cudaMemcpyHostToDevice),
                 "cudaMemcpy (spans)");
    if (im.transfers()) {
      check_cuda(cudaStreamCreateWithFlags(&im.side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      check_cuda(cudaEventCreateWithFlags(&im.fork, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      check_cuda(cudaEventCreateWithFlags(&im.join, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      check_cuda(cudaEventCreateWithFlags(&im.ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
  }
  return imp;
}

// What every rank sends the others at plan time: its problem's hashes, or the error it met.
struct RankCheck {
  uint64_t shapes = 0, layout = 0;
  int64_t status = 0;
  char error[400] = {};
};

void all_gather_checks(const std::vector<ncclComm*>& comms, const std::vector<int>& rank_of, const std::vector<int>& device_of,
                       int ranks, const std::vector<RankCheck>& mine) {
  const nccl::Api& api = nccl::api();
  const size_t n = comms.size(), bytes = sizeof(RankCheck);
  std::vector<Buffer> buf;
  std::vector<std::vector<RankCheck>> all(n, std::vector<RankCheck>(size_t(ranks)));
  for (size_t i = 0; i < n; ++i) {
    DeviceScope d(device_of[i]);
    buf.emplace_back();
    buf.back() = Buffer(bytes * size_t(ranks), false, device_of[i]);
    check_cuda(cudaMemcpy(buf.back().as<char>() + bytes * size_t(rank_of[i]), &mine[i], bytes, cudaMemcpyHostToDevice),
               "cudaMemcpy (plan check)");
  }
  nccl::check(api.GroupStart(), "ncclGroupStart");
  nccl::Result r = 0;
  for (size_t i = 0; i < n && r == 0; ++i)
    r = api.AllGather(buf[i].as<char>() + bytes * size_t(rank_of[i]), buf[i].p, bytes, nccl::kUint8, comms[i], nullptr);
  const nccl::Result end = api.GroupEnd();
  nccl::check(r, "ncclAllGather (plan check)");
  nccl::check(end, "ncclGroupEnd");
  for (size_t i = 0; i < n; ++i) {
    DeviceScope d(device_of[i]);
    check_cuda(cudaMemcpy(all[i].data(), buf[i].p, bytes * size_t(ranks), cudaMemcpyDeviceToHost), "cudaMemcpy (plan check)");
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& v = all[i];
    for (int p = 0; p < ranks; ++p)
      if (v[size_t(p)].status != 0)
        throw Error(Status(v[size_t(p)].status), "distributed attention: on rank " + num(p) + ": " + v[size_t(p)].error);
    for (int p = 1; p < ranks; ++p) {
      if (v[size_t(p)].shapes != v[0].shapes)
        bad("rank " + num(p) + "'s problem (shapes, dtype, blocks, causal or scale) differs from rank 0's");
      if (v[size_t(p)].layout != v[0].layout) bad("rank " + num(p) + "'s layout contents differ from rank 0's");
    }
  }
}

std::vector<DistributedAttentionPlan> plan_all(const AttentionArgs& problem, const std::vector<ncclComm*>& comms, int inproc_ranks,
                                               const Options& o) {
  const bool inproc = inproc_ranks > 0, host = problem.q.memory == Memory::host;
  const size_t n = inproc ? size_t(inproc_ranks) : comms.size();
  std::vector<int> rank_of(n), device_of(n, -1);
  int ranks = inproc_ranks;
  if (!inproc) {
    if (comms.empty()) bad("comms is empty (one communicator per rank driven by this process)");
    for (size_t i = 0; i < n; ++i)
      if (!comms[i]) bad(n == 1 ? std::string("comm is null (pass this rank's ncclComm_t)")
                                : "comms[" + num(int64_t(i)) + "] is null (pass this rank's ncclComm_t)");
    const nccl::Api& api = nccl::api();
    for (size_t i = 0; i < n; ++i) {
      int count = 0;
      nccl::check(api.CommCount(comms[i], &count), "ncclCommCount");
      nccl::check(api.CommUserRank(comms[i], &rank_of[i]), "ncclCommUserRank");
      nccl::check(api.CommCuDevice(comms[i], &device_of[i]), "ncclCommCuDevice");
      if (i > 0 && count != ranks) bad("comms[" + num(int64_t(i)) + "] has " + num(count) + " ranks but comms[0] has " + num(ranks));
      ranks = count;
    }
    if (n == 1) {
      int cur = -1;
      check_cuda(cudaGetDevice(&cur), "cudaGetDevice");
      if (cur != device_of[0])
        bad("the communicator is on CUDA device " + num(device_of[0]) + " but device " + num(cur) + " is current");
    }
  } else {
    int cur = -1;
    if (!host) check_cuda(cudaGetDevice(&cur), "cudaGetDevice");
    for (size_t i = 0; i < n; ++i) rank_of[i] = int(i), device_of[i] = cur;
  }
  // Every rank plans, keeping its error for the exchange (a rank that threw here would leave the
  // others waiting in the all-gather).
  std::vector<std::shared_ptr<DistributedAttentionPlan::Impl>> impls(n);
  std::vector<RankCheck> checks(n);
  for (size_t i = 0; i < n; ++i) {
    try {
      check_problem(problem);
      if (!inproc && host) bad("with NCCL communicators q, k and v must be in device memory");
      const AttentionShards sh = plan_attention_shards(problem.layout, problem.q.b, problem.q.h, problem.k.h, problem.q.s,
                                                       problem.k.s, problem.causal, ranks);
      hash_problem(problem, checks[i].shapes, checks[i].layout);
      if (host) {
        impls[i] = plan_rank(problem, sh, rank_of[i], -1, true, true, nullptr, o);
      } else {
        DeviceScope d(device_of[i]);
        impls[i] = plan_rank(problem, sh, rank_of[i], device_of[i], false, inproc, inproc ? nullptr : comms[i], o);
      }
    } catch (const Error& e) {
      if (inproc) throw;
      checks[i].status = int64_t(e.status());
      std::strncpy(checks[i].error, e.what(), sizeof checks[i].error - 1);
    } catch (const std::exception& e) {
      if (inproc) throw;
      checks[i].status = int64_t(Status::internal);
      std::strncpy(checks[i].error, e.what(), sizeof checks[i].error - 1);
    }
  }
  if (!inproc) all_gather_checks(comms, rank_of, device_of, ranks, checks);
  std::vector<DistributedAttentionPlan> plans;
  for (auto& im : impls) plans.push_back(DAA::make(std::move(im)));
  return plans;
}

}  // namespace

DistributedAttentionPlan plan_distributed_attention(const AttentionArgs& problem, ncclComm* comm, const Options& options) {
  return plan_all(problem, std::vector<ncclComm*>{comm}, 0, options).front();
}
std::vector<DistributedAttentionPlan> plan_distributed_attention(const AttentionArgs& problem,
                                                                 const std::vector<ncclComm*>& comms, const Options& options) {
  return plan_all(problem, comms, 0, options);
}
std::vector<DistributedAttentionPlan> plan_distributed_attention(const AttentionArgs& problem, int ranks,
                                                                 const Options& options) {
  if (ranks < 1) bad("ranks = " + num(ranks) + " must be >= 1");
  return plan_all(problem, {}, ranks, options);
}

}  // namespace sparsek
