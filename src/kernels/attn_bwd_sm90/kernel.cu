// Hopper (sm_90a) block-sparse attention backward: dQ, dK, dV of attention() for the layouts of
// include/sparsek/attention.hpp (D = 64 or 128, f16 / bf16, 128x128 or 64x64 blocks): the main
// kernel, its launch and the table of built kernels. docs/design/attn_bwd_sm90.md says how it works.
//
// One run is a short sequence of launches on the caller's stream (no host sync, no allocation:
// capturable; variant.cu): the transposed layout (layout.cu) on a side stream of the plan, forked
// from and joined back into it; the memory-bound passes (passes.cu); this kernel; the postprocess.
// The main kernel is KV-major (FlashAttention-3's shape): an item is one key block of one (batch,
// key/value head); a persistent grid takes items from an atomic counter (head-major order, so the
// query tiles and dQ sums of the heads in flight stay in L2). Warp 0 of warpgroup 0 produces
// (producer.cuh); consumer warpgroup w owns keys w*64 .. w*64+63 of the block (consumer.cuh).
//
// Determinism: with deterministic (the default) each dQ contribution is rounded to an integer
// multiple of the row's grid unit u and the multiples are added as 32-bit integers. Integer sums
// modulo 2^32 do not depend on the order the contributions arrive in (bit-identical runs), and they
// are exact whenever the final sum fits in 32 bits. u comes from a bound of the row's dQ before the
// softmax scale: |(dS K)_ij| <= max|K| * sum_k |dS_ik| <= max|K| (max||V|| ||dO_i|| + |Delta_i|)
// =: bound_i (sum_k P_ik = 1, |dP_ik| <= ||dO_i|| max||V||; the row's own Delta rather than its
// bound ||dO_i|| max||V||, which also covers an O inconsistent with V), at most
// 2 max|K| max||V|| ||dO_i||. u = 2^(e - 30) with 2^(e-1) <= bound_i < 2^e, so every contribution
// and the sum lie below 2^30 u (a factor 2 of headroom for the rounding of P, dS and the fp32
// products). Each contribution is off by at most u / 2 <= 2^-30 bound_i. The bound needs max|K| and
// max||V|| of the head: one pass over K and V before the main kernel. A row with LSE = -inf (it
// attends nothing, or the forward returned -inf for it) has P = 0, no contributions, and keeps
// dq = 0; any other row whose bound, Delta or LSE is not finite (a NaN or inf in the head's K or V,
// or in the row's O, dO or LSE) gets a NaN dq row: rounding to integers would otherwise turn the
// NaN into 0.
// Otherwise the fp32 contributions are added as they come (FlashAttention's atomic dQ).
// Malformed layouts cannot crash or hang a run: out-of-range indices are dropped, counts clamped.
#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "kernels/attn_bwd_sm90/config.hpp"
#include "kernels/attn_bwd_sm90/consumer.cuh"
#include "kernels/attn_bwd_sm90/producer.cuh"
#include "kernels/sm90/kit/tma.hpp"

namespace sparsek::attn_bwd_sm90 {

template <class Cfg, bool PACKED>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::CTAS_PER_SM)
    attention_bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                         const __grid_constant__ CUtensorMap tm_dk, const __grid_constant__ CUtensorMap tm_dv,
                         const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const Smem<Cfg> sm{kit::SmemBase::of(smem_raw)};
  if (threadIdx.x == 0) {
    ptx::mbar_init(sm.item_full(), 1);                                // producer's arrive_expect_tx + K / V bytes
    ptx::mbar_init(sm.item_empty(), 128 * Cfg::NWG);                  // every consumer thread
    kit::init_barriers(sm.qd_full(0), Cfg::STAGES, 1);
    kit::init_barriers(sm.qd_empty(0), Cfg::STAGES, 128 * Cfg::NWG);
    ptx::fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    if (threadIdx.x < 32) produce<Cfg, PACKED>(&tm_q, &tm_k, &tm_v, &tm_do, p, sm);
  } else {
    ptx::setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    consume<Cfg, PACKED>(&tm_dk, &tm_dv, p, sm, threadIdx.x / 128 - 1);
  }
#endif
}

template <class Cfg>
void launch(const AttentionBackwardArgs& a, const Params& p, int grid, cudaStream_t stream) {
  const AttentionArgs& f = a.forward;
  CUtensorMap tm_q, tm_do;  // no queries at all: never read (every item then has no step)
  std::memset(&tm_q, 0, sizeof(tm_q));
  std::memset(&tm_do, 0, sizeof(tm_do));
  if (f.q.s > 0) {
    tm_q = tma_map_bhsd(f.q, Cfg::MS, "q");
    tm_do = tma_map_bhsd(a.dout, Cfg::MS, "dout");
  }
  const CUtensorMap tm_k = tma_map_bhsd(f.k, Cfg::BN, "k"), tm_v = tma_map_bhsd(f.v, Cfg::BN, "v");
  const CUtensorMap tm_dk = tma_map_bhsd(a.dk, 64, "dk"), tm_dv = tma_map_bhsd(a.dv, 64, "dv");
  if (p.cu_seqlens)
    attention_bwd_kernel<Cfg, true><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(tm_q, tm_k, tm_v, tm_do, tm_dk, tm_dv, p);
  else
    attention_bwd_kernel<Cfg, false><<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(tm_q, tm_k, tm_v, tm_do, tm_dk, tm_dv, p);
  check_cuda(cudaGetLastError(), "attention_bwd_kernel launch");
}

template <int I>
Kernel kernel_at() {
  using Cfg = ConfigAt<I>;
  return {kConfigs[I],
          {reinterpret_cast<const void*>(&attention_bwd_kernel<Cfg, false>), Cfg::THREADS, Cfg::SMEM, Cfg::CTAS_PER_SM, 1},
          {reinterpret_cast<const void*>(&attention_bwd_kernel<Cfg, true>), Cfg::THREADS, Cfg::SMEM, Cfg::CTAS_PER_SM, 1},
          &launch<Cfg>};
}
const Kernel* find_kernel(const Key& key) {
  static const auto table = kit::make_kernel_table<kNumConfigs>([](auto i) { return kernel_at<decltype(i)::value>(); });
  return kit::find_by_key(table, key);
}

}  // namespace sparsek::attn_bwd_sm90
