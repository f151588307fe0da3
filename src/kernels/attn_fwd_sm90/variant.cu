// The `hopper` attention variant, forward: why_not, prepare (the item order's workspace), run (the
// item order sorted on the GPU, longest first, then the kernel).
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "kernels/attn_fwd_sm90/config.hpp"
#include "kernels/sm90/kit/tma.hpp"
#include "kernels/sm90/kit/workspace.hpp"
#include "plan/backends.hpp"

namespace sparsek {
namespace {
using namespace attn_fwd_sm90;

Key key_of(const AttentionArgs& a) { return {int(a.q.d), a.layout.block_q, a.q.dtype == DType::bf16}; }

std::string why_not_hopper(const AttentionArgs& a) {
  if (a.q.memory != Memory::device || a.layout.memory != Memory::device)
    return "operands and layout must be in device memory";
  if (a.q.dtype != DType::f16 && a.q.dtype != DType::bf16)
    return std::string("needs f16 or bf16 inputs, got ") + to_string(a.q.dtype);
  const auto num = [](int x) { return std::to_string(x); };
  if (!kit::any_built(kConfigs, [&](const Key& k) { return k.d == a.q.d; }))
    return "D=" + std::to_string(a.q.d) + " not in {" + kit::built_values(kConfigs, [](const Key& k) { return k.d; }, ", ", num) + "}";
  const int block = a.layout.block_q;
  if (a.layout.block_kv != block || !kit::any_built(kConfigs, [&](const Key& k) { return k.block == block; }))
    return "blocks must be " +
           kit::built_values(kConfigs, [](const Key& k) { return k.block; }, " or ", [](int b) { return std::to_string(b) + "x" + std::to_string(b); }) +
           ", got " + std::to_string(a.layout.block_q) + "x" + std::to_string(a.layout.block_kv);
  for (const auto& [t, name] : {std::pair<const Tensor4View*, const char*>{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"},
                                {&a.o, "o"}}) {
    const std::string why = tma_why_not_bhsd(*t, name);
    if (!why.empty()) return why;
  }
  if (a.q.b * a.q.h * ((a.q.s + block - 1) / block) >= (int64_t(1) << 31))
    return "too many (batch, head, query block) items for 32-bit ids";
  const DeviceInfo& d = device_info();
  if (!d.available) return "no CUDA device (" + d.why_not + ")";
  if (d.cc_major != 9 || d.cc_minor != 0)
    return "needs an sm_90a GPU (Hopper), found sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor);
  static const bool sm90a = has_sm90a_code(find_kernel({128, 128, true})->info.func);
  if (!sm90a) return kNoSm90aCode;
  const Kernel* k = find_kernel(key_of(a));
  if (!k) return "no kernel built for D=" + std::to_string(a.q.d) + ", block " + std::to_string(block);
  return kit::smem_why_not(k->info);
}

// The plan's device workspace: the item order (sorted every run) and the sort's scratch.
struct AttentionState final : VariantState {
  int items = 0, grid = 0, key_bits = 1;
  unsigned* lengths = nullptr;  // [items] sort keys: blocks per item
  unsigned* lengths_out = nullptr;
  int* ids = nullptr;           // [items] 0 .. items-1 (sort values)
  int* order = nullptr;         // [items] sorted ids
  void* sort_temp = nullptr;
  size_t sort_bytes = 0;
  kit::Workspace ws;
  size_t workspace_bytes() const override { return ws.bytes(); }
};

int items_of(const AttentionArgs& a) {
  const int block = a.layout.block_q;
  return int(a.q.b * a.q.h * ((a.q.s + block - 1) / block));
}

std::unique_ptr<VariantState> prepare_hopper(const AttentionArgs& a, const Options&) {
  auto st = std::make_unique<AttentionState>();
  const Kernel& k = *find_kernel(key_of(a));
  kit::set_smem_limit(a.cu_seqlens ? k.packed_info : k.info, "attention_fwd_kernel");
  tma_encode_tiled();  // resolves the driver entry point (not under capture)
  st->items = items_of(a);
  st->grid = std::max(1, std::min(st->items, device_info().sm_count * k.info.ctas_per_sm));
  const int64_t max_len = a.layout.kmax + (a.layout.has_full() ? a.layout.full_kmax : 0);
  while ((int64_t(1) << st->key_bits) <= max_len) ++st->key_bits;
  if (st->items > 0) {
    std::vector<int> ids(size_t(st->items));
    std::iota(ids.begin(), ids.end(), 0);
    check_cuda(cub::DeviceRadixSort::SortPairsDescending(nullptr, st->sort_bytes, st->lengths, st->lengths_out,
                                                         st->ids, st->order, st->items, 0, st->key_bits),
               "cub::DeviceRadixSort (size query)");
    st->ws.reserve(&st->lengths, st->items);
    st->ws.reserve(&st->lengths_out, st->items);
    st->ws.upload(&st->ids, ids);
    st->ws.reserve(&st->order, st->items);
    st->ws.reserve_bytes(&st->sort_temp, st->sort_bytes);
    st->ws.allocate("attention item order");
  }
  return st;
}

void run_hopper(const AttentionArgs& a, const Options& o, VariantState* state) {
  auto* st = dynamic_cast<AttentionState*>(state);
  if (!st || st->items != items_of(a))
    throw Error(Status::internal, "attention hopper: run() got a state prepared for another shape");
  if (st->items == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(o.stream);
  const AttentionLayout& l = a.layout;
  Params p{};
  p.order = st->order;
  p.items = st->items;
  p.hq = int(a.q.h);
  p.hkv = int(a.k.h);
  p.group = int(a.q.h / a.k.h);
  p.mq = int((a.q.s + l.block_q - 1) / l.block_q);
  p.sq = int(a.q.s);
  p.skv = int(a.k.s);
  p.nkb = int((a.k.s + l.block_kv - 1) / l.block_kv);
  p.kv_num = l.kv_num_blocks;
  p.kv_idx = l.kv_indices;
  p.full_num = l.has_full() ? l.full_kv_num_blocks : nullptr;
  p.full_idx = l.has_full() ? l.full_kv_indices : nullptr;
  p.lb = int(l.batch);
  p.lh = int(l.heads);
  p.lh_is_kv = l.heads == a.k.h && l.heads != a.q.h;
  p.kmax = int(l.kmax);
  p.full_kmax = int(l.full_kmax);
  p.causal = a.causal;
  p.scale_log2 = a.softmax_scale() * 1.4426950408889634f;
  p.lse = a.lse;
  p.cu_seqlens = a.cu_seqlens;
  p.nseq = int(a.num_seqs);
  launch_item_lengths(p, st->lengths, stream);
  size_t bytes = st->sort_bytes;
  check_cuda(cub::DeviceRadixSort::SortPairsDescending(st->sort_temp, bytes, st->lengths, st->lengths_out, st->ids,
                                                       st->order, st->items, 0, st->key_bits, stream),
             "cub::DeviceRadixSort (item order)");
  find_kernel(key_of(a))->launch(a, p, st->grid, stream);
}

}  // namespace

std::vector<AttentionVariant> hopper_attention_variants() {
  return {AttentionVariant{"hopper", Backend::cuda, false, &why_not_hopper, &prepare_hopper, &run_hopper}};
}

}  // namespace sparsek
