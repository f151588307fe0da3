// Hopper (sm_90a) block-sparse attention forward: the kernel (warpgroup 0 produces, the others
// consume: producer.cuh, consumer.cuh, epilogue.cuh), its launch and the table of built kernels.
// docs/design/attn_fwd_sm90.md says how it works.
#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "kernels/attn_fwd_sm90/config.hpp"
#include "kernels/attn_fwd_sm90/consumer.cuh"
#include "kernels/attn_fwd_sm90/producer.cuh"
#include "kernels/sm90/kit/tma.hpp"

namespace sparsek::attn_fwd_sm90 {

// Sort keys: every item's block count (the sort orders items longest first).
__global__ void attention_item_lengths(const Params p, unsigned* lengths) {
  for (int id = blockIdx.x * blockDim.x + threadIdx.x; id < p.items; id += gridDim.x * blockDim.x) {
    int64_t row;
    int np, nf;
    item_counts(decode(id, p), p, row, np, nf);
    lengths[id] = unsigned(np + nf);
  }
}

template <class Cfg, bool PACKED>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::CTAS_PER_SM)
    attention_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                         const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const Smem<Cfg> sm{kit::SmemBase::of(smem_raw)};
  if (threadIdx.x == 0) {
    ptx::mbar_init(sm.q_full(), 1);                                       // producer's arrive_expect_tx + Q bytes
    ptx::mbar_init(sm.q_empty(), 128 * Cfg::NWG);                         // every consumer thread (consume())
    kit::init_barriers(sm.k_full(0), Cfg::STAGES, 1);                     // as q_full
    kit::init_barriers(sm.k_empty(0), Cfg::STAGES, 128 * Cfg::NWG);       // as q_empty
    kit::init_barriers(sm.v_full(0), Cfg::STAGES, 1);
    kit::init_barriers(sm.v_empty(0), Cfg::STAGES, 4 * Cfg::NWG);         // lane 0 of each consumer warp
    ptx::fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    if (threadIdx.x < 32) produce<Cfg, PACKED>(&tm_q, &tm_k, &tm_v, p, sm);
  } else {
    ptx::setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    consume<Cfg, PACKED>(&tm_o, p, sm, threadIdx.x / 128 - 1);
  }
#endif
}

template <class Cfg>
void launch(const AttentionArgs& a, const Params& p, int grid, cudaStream_t stream) {
  CUtensorMap tm_q = tma_map_bhsd(a.q, Cfg::BM, "q"), tm_o = tma_map_bhsd(a.o, 64, "o");
  CUtensorMap tm_k, tm_v;  // no keys at all: never read (every item then has no block)
  std::memset(&tm_k, 0, sizeof(tm_k));
  std::memset(&tm_v, 0, sizeof(tm_v));
  if (a.k.s > 0) {
    tm_k = tma_map_bhsd(a.k, Cfg::BN, "k");
    tm_v = tma_map_bhsd(a.v, Cfg::BN, "v");
  }
  if (p.cu_seqlens)
    attention_fwd_kernel<Cfg, true><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(tm_q, tm_k, tm_v, tm_o, p);
  else
    attention_fwd_kernel<Cfg, false><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(tm_q, tm_k, tm_v, tm_o, p);
  check_cuda(cudaGetLastError(), "attention_fwd_kernel launch");
}

template <int I>
Kernel kernel_at() {
  using Cfg = ConfigAt<I>;
  return {kConfigs[I],
          {reinterpret_cast<const void*>(&attention_fwd_kernel<Cfg, false>), Cfg::THREADS, Cfg::SMEM, Cfg::CTAS_PER_SM, 1},
          {reinterpret_cast<const void*>(&attention_fwd_kernel<Cfg, true>), Cfg::THREADS, Cfg::SMEM, Cfg::CTAS_PER_SM, 1},
          &launch<Cfg>};
}
const Kernel* find_kernel(const Key& key) {
  static const auto table = kit::make_kernel_table<kNumConfigs>([](auto i) { return kernel_at<decltype(i)::value>(); });
  return kit::find_by_key(table, key);
}

void launch_item_lengths(const Params& p, unsigned* lengths, cudaStream_t stream) {
  attention_item_lengths<<<std::min((p.items + 255) / 256, 1024), 256, 0, stream>>>(p, lengths);
  check_cuda(cudaGetLastError(), "attention_item_lengths launch");
}

}  // namespace sparsek::attn_fwd_sm90
