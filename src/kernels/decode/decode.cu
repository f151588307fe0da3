// Host side of the paged decode kernels (kernel.cuh): what they support, the KV split chosen from
// the shapes, the workspace, the launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/device.hpp"
#include "kernels/decode/kernel.cuh"
#include "kernels/decode/kernel_mma.cuh"
#include "kernels/decode/launch.hpp"

namespace sparsek::decode_gpu {

std::string why_not(const DecodeArgs& a) {
  if (a.q.dtype != DType::f16 && a.q.dtype != DType::bf16)
    return std::string("the GPU takes f16 or bf16, not ") + to_string(a.q.dtype);
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (!aligned(a.q.data) || !aligned(a.o.data) || !aligned(a.k.data) || !aligned(a.v.data))
    return "q, o, k and v must be 16-byte aligned on the GPU";
  const int64_t strides[7] = {a.q.stride_t, a.q.stride_h, a.o.stride_t, a.o.stride_h, a.k.stride_page, a.k.stride_slot,
                              a.k.stride_h};
  for (int64_t s : strides)
    if (s % 8 != 0) return "the strides of q, o, k and v must be multiples of 8 elements on the GPU (16-byte loads)";
  const int64_t span = (a.k.pages - 1) * a.k.stride_page + (a.k.page_size - 1) * a.k.stride_slot +
                       (a.k.h - 1) * a.k.stride_h + a.k.d;
  if (span > (int64_t(1) << 40)) return "the cache is too large";
  if (a.q.h / a.k.h > 4096) return "more than 4096 query heads per key/value head";
  if (a.q.t > (int64_t(1) << 30) || a.batch * a.k.h > (int64_t(1) << 30))
    return "too many tokens or (request, head) pairs for one launch";
  return "";
}

int64_t max_entries(const DecodeArgs& a) { return a.has_selection() ? a.sel_kmax : a.max_pages; }

int default_splits(const DecodeArgs& a, int sm_count) {
  const int64_t ctas = a.batch * a.k.h;  // CTAs per chunk (one row tile each when G * n <= 16)
  const int64_t want = (int64_t(std::max(sm_count, 1)) * 4 + ctas - 1) / ctas;
  const int64_t most = std::max<int64_t>(1, max_entries(a) / 2);  // at least two pages per chunk
  return int(std::clamp<int64_t>(std::min(want, most), 1, 64));
}

namespace {
// New tokens one request can have: T - (B - 1) at most, as every other request has one or more.
int max_new_tokens(const DecodeArgs& a) { return int(std::clamp<int64_t>(a.q.t - a.batch + 1, 1, kMaxNew)); }
}  // namespace

size_t workspace_bytes(const DecodeArgs& a, int splits) {
  if (splits <= 1) return 0;
  const int64_t rows = a.batch * a.k.h * splits * (a.q.h / a.k.h) * max_new_tokens(a);
  return size_t(rows) * (size_t(a.q.d) * sizeof(float) + sizeof(float2));
}

namespace {
template <int D, class T>
void launch_typed(const Params& p, int batch, cudaStream_t stream, Flavor flavor) {
  const dim3 grid(unsigned(batch * p.hkv), unsigned(p.splits), unsigned((p.group * p.max_new + kRows - 1) / kRows));
  if (flavor == Flavor::mma) {
    decode_split_mma_kernel<D, T><<<grid, kThreads, mma_smem_bytes<D>(), stream>>>(p);
    check_cuda(cudaGetLastError(), "decode_split_mma_kernel launch");
  } else {
    decode_split_kernel<D, T><<<grid, kThreads, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "decode_split_kernel launch");
  }
  if (p.splits > 1) {
    decode_combine_kernel<D, T><<<unsigned(batch * p.hkv), dim3(D, kCombineRows), 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "decode_combine_kernel launch");
  }
}
}  // namespace

template <int D, class T>
void set_smem() {
  check_cuda(cudaFuncSetAttribute(decode_split_mma_kernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  mma_smem_bytes<D>()),
             "cudaFuncSetAttribute(decode_split_mma_kernel)");
}

void prepare(const DecodeArgs& a, Flavor flavor) {
  if (flavor != Flavor::mma) return;
  const bool bf16 = a.q.dtype == DType::bf16;
  if (a.q.d == 64) bf16 ? set_smem<64, __nv_bfloat16>() : set_smem<64, __half>();
  else bf16 ? set_smem<128, __nv_bfloat16>() : set_smem<128, __half>();
}

void launch(const DecodeArgs& a, int splits, void* workspace, void* stream, Flavor flavor) {
  Params p{};
  p.q = a.q.data, p.o = a.o.data, p.lse = a.lse, p.k = a.k.data, p.v = a.v.data;
  p.page_table = a.page_table, p.seq_lens = a.seq_lens, p.cu_seqlens_q = a.cu_seqlens_q;
  p.sel_indices = a.sel_indices, p.sel_counts = a.sel_counts;
  p.q_st = a.q.stride_t, p.q_sh = a.q.stride_h, p.o_st = a.o.stride_t, p.o_sh = a.o.stride_h;
  p.c_sp = a.k.stride_page, p.c_ss = a.k.stride_slot, p.c_sh = a.k.stride_h;
  p.tokens = int(a.q.t), p.hq = int(a.q.h), p.hkv = int(a.k.h), p.group = int(a.q.h / a.k.h);
  p.page_size = int(a.k.page_size), p.num_pages = int(std::min<int64_t>(a.k.pages, INT32_MAX));
  p.max_pages = int(a.max_pages), p.sel_kmax = int(a.sel_kmax);
  p.entries_max = int(max_entries(a));
  p.splits = std::max(splits, 1);
  p.chunk = std::max(1, (p.entries_max + p.splits - 1) / p.splits);
  p.causal = a.causal_new ? 1 : 0;
  p.max_new = max_new_tokens(a);
  p.scale_log2 = a.softmax_scale() * 1.4426950408889634f;
  if (p.splits > 1) {
    const int64_t rows = a.batch * a.k.h * p.splits * p.group * p.max_new;
    p.ws_o = static_cast<float*>(workspace);
    p.ws_ml = reinterpret_cast<float2*>(static_cast<float*>(workspace) + rows * a.q.d);
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool bf16 = a.q.dtype == DType::bf16;
  const int B = int(a.batch);
  if (a.q.d == 64) {
    if (bf16) launch_typed<64, __nv_bfloat16>(p, B, s, flavor);
    else launch_typed<64, __half>(p, B, s, flavor);
  } else {
    if (bf16) launch_typed<128, __nv_bfloat16>(p, B, s, flavor);
    else launch_typed<128, __half>(p, B, s, flavor);
  }
}

}  // namespace sparsek::decode_gpu
