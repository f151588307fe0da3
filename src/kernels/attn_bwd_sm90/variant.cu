// The `hopper` attention variant, backward: why_not, prepare (the plan's device workspace), run (the
// launches of one run: transposed layout beside the memory-bound passes, the main kernel, dq).
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.hpp"
#include "kernels/attn_bwd_sm90/config.hpp"
#include "kernels/attn_bwd_sm90/passes.hpp"
#include "kernels/sm90/kit/tma.hpp"
#include "kernels/sm90/kit/workspace.hpp"
#include "plan/backends.hpp"

namespace sparsek {
namespace {
using namespace attn_bwd_sm90;

Key key_of(const AttentionBackwardArgs& a) {
  return {int(a.forward.q.d), a.forward.layout.block_q, a.forward.q.dtype == DType::bf16};
}

std::string same_shape(const Tensor4View& t, const Tensor4View& like, const char* name, const char* like_name) {
  if (t.b != like.b || t.h != like.h || t.s != like.s || t.d != like.d)
    return std::string(name) + " must have " + like_name + "'s shape [" + std::to_string(like.b) + ", " +
           std::to_string(like.h) + ", " + std::to_string(like.s) + ", " + std::to_string(like.d) + "], got [" +
           std::to_string(t.b) + ", " + std::to_string(t.h) + ", " + std::to_string(t.s) + ", " + std::to_string(t.d) +
           "]";
  if (t.dtype != like.dtype) return std::string(name) + " must have " + like_name + "'s dtype";
  if (t.memory != Memory::device) return std::string(name) + " must be in device memory";
  return tma_why_not_bhsd(t, name);
}

int64_t layout_width(const AttentionLayout& l) { return l.kmax + (l.has_full() ? l.full_kmax : 0); }

std::string why_not_hopper_bwd(const AttentionBackwardArgs& a) {
  static const std::vector<AttentionVariant> forward = hopper_attention_variants();
  const AttentionArgs& f = a.forward;
  if (!f.lse) return "needs the forward's lse (forward.lse is null)";
  if (f.k.h <= 0 || f.q.h % f.k.h != 0 || f.q.b != f.k.b || f.q.d != f.k.d)
    return "q [" + std::to_string(f.q.b) + ", " + std::to_string(f.q.h) + ", ., " + std::to_string(f.q.d) +
           "] and k [" + std::to_string(f.k.b) + ", " + std::to_string(f.k.h) + ", ., " + std::to_string(f.k.d) +
           "] need the same batch and D, and query heads a multiple of the key/value heads";
  for (const auto& [t, like, name, like_name] :
       {std::tuple<const Tensor4View*, const Tensor4View*, const char*, const char*>{&f.v, &f.k, "v", "k"},
        {&f.o, &f.q, "o", "q"},
        {&a.dout, &f.q, "dout", "q"},
        {&a.dq, &f.q, "dq", "q"},
        {&a.dk, &f.k, "dk", "k"},
        {&a.dv, &f.k, "dv", "k"}}) {
    const std::string w = same_shape(*t, *like, name, like_name);
    if (!w.empty()) return w;
  }
  const std::string why = forward.at(0).why_not(f);  // the forward's operands, layout and device
  if (!why.empty()) return why;
  const AttentionLayout& l = f.layout;
  const int block = l.block_q;
  const int64_t mq = (f.q.s + block - 1) / block, nkb = (f.k.s + block - 1) / block;
  if (l.q_blocks != mq)
    return "layout has " + std::to_string(l.q_blocks) + " query blocks, q needs " + std::to_string(mq);
  if (l.batch * l.heads * mq * layout_width(l) >= (int64_t(1) << 31) ||
      l.batch * l.heads * nkb >= (int64_t(1) << 31) - 1)
    return "the layout is too large for 32-bit record ids";
  if (f.k.b * f.k.h * nkb >= (int64_t(1) << 31)) return "too many (batch, head, key block) items for 32-bit ids";
  const Kernel* k = attn_bwd_sm90::find_kernel(key_of(a));
  if (!k) return "no backward kernel built for D=" + std::to_string(f.q.d) + ", block " + std::to_string(block);
  static const bool sm90a = has_sm90a_code(attn_bwd_sm90::find_kernel({128, 128, true})->info.func);
  if (!sm90a) return kNoSm90aCode;
  return kit::smem_why_not(k->info);
}

// The plan's device workspace (everything a run needs; sized by the shapes and layout extents).
struct BackwardState final : VariantState {
  LayoutParams lp{};
  LayoutBuffers lb{};
  int items = 0, grid = 0;
  int64_t rows = 0, acc_elems = 0;
  float4* rowinfo = nullptr;
  unsigned* bounds = nullptr;  // [B * Hkv][2]: max|K|, max||V||^2 (bit patterns)
  int* acc = nullptr;          // the dQ accumulator, 4 bytes per element (int32 or fp32)
  kit::Workspace ws;
  // The transposed layout (short, latency-bound launches) runs on a side stream beside the
  // memory-bound passes: forked from the caller's stream at the start of a run, joined before the
  // main kernel (also under CUDA graph capture, where this becomes a fork and a join of the graph).
  // The side stream has the device's highest priority: at the same priority its few-CTA kernels
  // waited for the passes' CTAs to drain, and the chain of five launches ended after the passes.
  cudaStream_t side = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;
  size_t workspace_bytes() const override { return ws.bytes(); }
  ~BackwardState() override {
    if (forked) cudaEventDestroy(forked);
    if (joined) cudaEventDestroy(joined);
    if (side) cudaStreamDestroy(side);
  }
};

std::unique_ptr<VariantState> prepare_hopper_bwd(const AttentionBackwardArgs& a, const Options&) {
  auto st = std::make_unique<BackwardState>();
  const AttentionArgs& f = a.forward;
  const AttentionLayout& l = f.layout;
  const int block = l.block_q;
  const Kernel& k = *attn_bwd_sm90::find_kernel(key_of(a));
  kit::set_smem_limit(a.forward.cu_seqlens ? k.packed_info : k.info, "attention_bwd_kernel");
  tma_encode_tiled();  // resolves the driver entry point (not under capture)
  const int64_t mq = (f.q.s + block - 1) / block, nkb = (f.k.s + block - 1) / block;
  LayoutParams& lp = st->lp;
  lp.width = int(layout_width(l));
  lp.kmax = int(l.kmax);
  lp.full_kmax = l.has_full() ? int(l.full_kmax) : 0;
  lp.mq = int(mq);
  lp.nkb = int(nkb);
  lp.ncols = int(l.batch * l.heads * nkb);
  lp.slots = l.batch * l.heads * mq * lp.width;
  LayoutBuffers& lb = st->lb;
  lb.key_bits = 1;
  while ((int64_t(1) << lb.key_bits) <= lp.ncols) ++lb.key_bits;
  lb.sort_bytes = transposed_layout_scratch(lp, lb.key_bits);
  st->items = int(f.k.b * f.k.h * nkb);
  st->grid = std::max(1, std::min(st->items, device_info().sm_count * k.info.ctas_per_sm));
  st->rows = f.q.b * f.q.h * mq * block;
  st->acc_elems = st->rows * f.q.d;
  kit::Workspace& ws = st->ws;
  ws.reserve(&lb.keys, lp.slots);
  ws.reserve(&lb.keys_sorted, lp.slots);
  ws.reserve(&lb.slots, lp.slots);
  ws.reserve(&lb.slots_sorted, lp.slots);
  ws.reserve(&lb.q_indices, lp.slots);
  ws.reserve(&lb.col_begin, lp.ncols);
  ws.reserve(&lb.col_end, lp.ncols);
  ws.reserve(&lb.item_counter, 1);
  ws.reserve_bytes(&lb.sort_temp, lb.sort_bytes);
  ws.reserve(&st->rowinfo, st->rows);
  ws.reserve(&st->bounds, 2 * f.k.b * f.k.h);
  ws.reserve(&st->acc, st->acc_elems);
  ws.allocate("attention backward workspace");
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  check_cuda(cudaStreamCreateWithPriority(&st->side, cudaStreamNonBlocking, greatest),
             "cudaStreamCreate(attention backward layout)");
  check_cuda(cudaEventCreateWithFlags(&st->forked, cudaEventDisableTiming), "cudaEventCreate(attention backward)");
  check_cuda(cudaEventCreateWithFlags(&st->joined, cudaEventDisableTiming), "cudaEventCreate(attention backward)");
  return st;
}

void run_hopper_bwd(const AttentionBackwardArgs& a, const Options& o, VariantState* state) {
  auto* st = dynamic_cast<BackwardState*>(state);
  const AttentionArgs& f = a.forward;
  const AttentionLayout& l = f.layout;
  const int block = l.block_q;
  if (!st || st->items != int(f.k.b * f.k.h * ((f.k.s + block - 1) / block)) ||
      st->rows != f.q.b * f.q.h * ((f.q.s + block - 1) / block) * block || st->lp.width != int(layout_width(l)))
    throw Error(Status::internal, "attention backward hopper: run() got a state prepared for another shape");
  const cudaStream_t stream = static_cast<cudaStream_t>(o.stream);
  const bool bf16 = f.q.dtype == DType::bf16;
  const int64_t mq = (f.q.s + block - 1) / block;
  check_cuda(cudaEventRecord(st->forked, stream), "cudaEventRecord(attention backward fork)");
  check_cuda(cudaStreamWaitEvent(st->side, st->forked, 0), "cudaStreamWaitEvent(attention backward fork)");

  // 1. The heads' K/V bounds (deterministic dQ), row statistics, and a zero dQ accumulator.
  if (st->rows > 0 && a.deterministic) {
    check_cuda(cudaMemsetAsync(st->bounds, 0, size_t(2 * f.k.b * f.k.h) * sizeof(unsigned), stream),
               "cudaMemsetAsync(K/V bounds)");
    KvParams kp{};
    kp.k = f.k.data;
    kp.v = f.v.data;
    kp.bounds = st->bounds;
    kp.k_sb = f.k.stride_b, kp.k_sh = f.k.stride_h, kp.k_ss = f.k.stride_s;
    kp.v_sb = f.v.stride_b, kp.v_sh = f.v.stride_h, kp.v_ss = f.v.stride_s;
    kp.hkv = int(f.k.h);
    kp.skv = int(f.k.s);
    // About 8 blocks (2048 threads) per SM over all heads.
    const int64_t heads = f.k.b * f.k.h;
    const int64_t by = std::max<int64_t>(
        1, std::min<int64_t>({(f.k.s + 127) / 128, (8 * device_info().sm_count + heads - 1) / heads, 65535}));
    if (heads > 0 && f.k.s > 0) launch_kv_bounds(kp, bf16, int(f.k.d), heads, by, stream);
  }
  if (st->rows > 0) {
    RowParams rp{};
    rp.o = f.o.data;
    rp.dout = a.dout.data;
    rp.lse = f.lse;
    rp.bounds = st->bounds;
    rp.det = a.deterministic;
    rp.group = int(f.q.h / f.k.h);
    rp.rowinfo = st->rowinfo;
    rp.o_sb = f.o.stride_b, rp.o_sh = f.o.stride_h, rp.o_ss = f.o.stride_s;
    rp.do_sb = a.dout.stride_b, rp.do_sh = a.dout.stride_h, rp.do_ss = a.dout.stride_s;
    rp.hq = int(f.q.h);
    rp.sq = int(f.q.s);
    rp.sq_pad = int(mq * block);
    launch_preprocess(rp, bf16, int(f.q.d), f.q.b * f.q.h, std::min<int64_t>(mq * block / 64, 65535), stream);
    check_cuda(cudaMemsetAsync(st->acc, 0, size_t(st->acc_elems) * 4, stream), "cudaMemsetAsync(dQ accumulator)");
  }

  // 2. The transposed layout (and the item counter's reset): short launches on the side stream,
  //    enqueued while the GPU runs the memory-bound passes above (their host time hidden), and run
  //    beside them.
  LayoutParams lp = st->lp;
  lp.kv_num = l.kv_num_blocks;
  lp.kv_idx = l.kv_indices;
  lp.full_num = l.has_full() ? l.full_kv_num_blocks : nullptr;
  lp.full_idx = l.has_full() ? l.full_kv_indices : nullptr;
  transposed_layout(lp, st->lb, st->side);
  check_cuda(cudaEventRecord(st->joined, st->side), "cudaEventRecord(attention backward join)");
  check_cuda(cudaStreamWaitEvent(stream, st->joined, 0), "cudaStreamWaitEvent(attention backward join)");

  // 3. The main kernel.
  Params p{};
  p.items = st->items;
  p.hq = int(f.q.h);
  p.hkv = int(f.k.h);
  p.group = int(f.q.h / f.k.h);
  p.nkb = lp.nkb;
  p.skv = int(f.k.s);
  p.sq_pad = int(mq * block);
  p.r64 = p.sq_pad / 64;
  p.lb = int(l.batch);
  p.lh = int(l.heads);
  p.lh_is_kv = l.heads == f.k.h && l.heads != f.q.h;
  p.col_begin = st->lb.col_begin;
  p.col_end = st->lb.col_end;
  p.q_indices = st->lb.q_indices;
  p.item_counter = st->lb.item_counter;
  p.rowinfo = st->rowinfo;
  p.dq_acc = st->acc;
  p.det = a.deterministic;
  p.causal = f.causal;
  p.scale = f.softmax_scale();
  p.cu_seqlens = f.cu_seqlens;
  p.nseq = int(f.num_seqs);
  p.scale_log2 = p.scale * 1.4426950408889634f;
  if (st->items > 0) attn_bwd_sm90::find_kernel(key_of(a))->launch(a, p, st->grid, stream);

  // 4. dq = accumulator * its grid unit * scale.
  if (st->rows > 0 && f.q.s > 0) {
    DqParams dp{};
    dp.acc = st->acc;
    dp.rowinfo = st->rowinfo;
    dp.dq = a.dq.data;
    dp.sb = a.dq.stride_b, dp.sh = a.dq.stride_h, dp.ss = a.dq.stride_s;
    dp.hq = int(f.q.h);
    dp.sq = int(f.q.s);
    dp.sq_pad = p.sq_pad;
    dp.r64 = p.r64;
    dp.tn = int(f.q.d / 64);
    dp.det = a.deterministic;
    dp.scale = p.scale;
    launch_postprocess(dp, bf16, f.q.b * f.q.h * p.r64 * dp.tn, stream);
  }
}

}  // namespace

std::vector<AttentionBackwardVariant> hopper_attention_backward_variants() {
  return {AttentionBackwardVariant{"hopper", Backend::cuda, false, &why_not_hopper_bwd, &prepare_hopper_bwd,
                                   &run_hopper_bwd}};
}

}  // namespace sparsek
