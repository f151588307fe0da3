// Hopper (sm_90a) DSD kernels: C = alpha * op(A) * B + beta * C with A in BSR, B and C dense, all on
// the device (DDS runs here too, as the DSD on the transposes). The kernel wiring (warpgroup 0
// produces, 1 and 2 consume: producer.cuh, consumer.cuh, epilogue.cuh), the split rows' second
// launch, the host launch of one configuration, and add_instances(): compiled only by the generated
// translation units, one per (block height, stage depth, input dtype) of config.hpp's axes.
// docs/design/dsd_sm90.md says how the kernels work.
#pragma once
#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "core/device.hpp"
#include "kernels/dsd_sm90/config.hpp"
#include "kernels/dsd_sm90/consumer.cuh"
#include "kernels/dsd_sm90/producer.cuh"

namespace sparsek::dsd_sm90 {

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_dsd_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                      const __grid_constant__ CUtensorMap tm_c, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const kit::SmemBase sm = kit::SmemBase::of(smem_raw);  // Config's regions
  const uint32_t s_a = sm.at(Cfg::A.offset), s_b = sm.at(Cfg::B.offset), s_e = sm.at(Cfg::E.offset);
  const uint32_t full = sm.at(Cfg::FULL.offset), empty = sm.at(Cfg::EMPTY.offset);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::STAGES; ++s) {
      ptx::mbar_init(full + 8 * s, 1);                    // producer's arrive_expect_tx + TMA bytes
      // lane 0 of each consuming warp (of both CTAs of a pair unless cluster_mode 1)
      ptx::mbar_init(empty + 8 * s, (Cfg::COOP ? 8 : 4) * (p.cluster_mode == 1 ? 1 : Cfg::CL));
    }
    kit::init_barriers(sm.at(Cfg::CLOAD.offset), 2, 1);
    ptx::fence_mbar_init();
  }
  // With a cluster, the peer must not multicast into barriers not yet initialised.
  if constexpr (Cfg::CL > 1)
    ptx::cluster_sync();
  else
    __syncthreads();
  // The CTAs of a cluster share one item list (and differ in N tile).
  const kit::ItemRange range = kit::item_range(p.cta_items, int(blockIdx.x / Cfg::CL));
  const int first = range.first, last = range.last;
  // Narrow tiles: programmatic dependent launch (launch() sets the attribute). This CTA may run
  // while the kernel ahead of it in the stream finishes. Everything above touched shared memory
  // and the plan's own item list only; every thread waits for that kernel before it reads or
  // writes user memory (the producer before the block indices, the consumers before C). The kernel
  // after this one may launch now: its CTAs take SMs as ours leave, and wait for ours in turn.
  if constexpr (Cfg::OVERLAP) {
    if (threadIdx.x == 0) ptx::launch_dependents();
  }
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<40>();
    if (threadIdx.x < 32) {
      if constexpr (Cfg::OVERLAP) ptx::grid_dependency_wait();
      if constexpr (Cfg::PAIRS_BUILT) {
        if (p.pair_blk) {
          produce_pairs<Cfg>(&tm_a, &tm_b, p, first, last, s_a, s_b, full, empty);
        } else {
          produce<Cfg>(&tm_a, &tm_b, p, first, last, s_a, s_b, full, empty);
        }
      } else {
        produce<Cfg>(&tm_a, &tm_b, p, first, last, s_a, s_b, full, empty);
      }
    }
    // A CTA stays until its peer no longer writes into it or arrives on its barriers.
    if constexpr (Cfg::CL > 1) ptx::cluster_sync();
  } else {
    ptx::setmaxnreg_inc<232>();
    if constexpr (Cfg::OVERLAP) ptx::grid_dependency_wait();
    const int which = threadIdx.x / 128 - 1;
    const uint32_t e = s_e + which * 2 * Cfg::E_BYTES;
    consume<Cfg>(&tm_c, p, first, last, which, s_a, s_b, full, empty, sm.ptr_at<uint8_t>(Cfg::E.offset, which * 2 * Cfg::E_BYTES),
                 e, sm.at(Cfg::CLOAD.offset, 8 * which));
    if constexpr (Cfg::CL > 1) ptx::cluster_sync();
  }
#endif
}

// Split rows, second launch: one CTA of 128 threads per (split item, CTA of the cluster, consumer,
// quarter of the fragment) sums the item's partial slots in slot order (the same order in every
// run: bit-identical) and writes C. Thread t reads the fragment registers consumer thread t
// stored, so the fragment coordinates (and store_pair) are the main kernel's. (One CTA per item
// measured 2.4x slower than uniform rows at N = 256: a few CTAs streaming all the partials.)
// group: {block row, N tile (of the cluster's first CTA), first slot, slots}.
template <class Cfg>
__global__ void __launch_bounds__(128) hopper_split_reduce(const int4* groups, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NC = Cfg::COOP ? 2 : 1, V = Cfg::MI * Cfg::ACC / 4, H = 8, PASSES = V / H;
  const int pass = int(blockIdx.x % PASSES), which = int(blockIdx.x / PASSES % NC);
  const int rank = int(blockIdx.x / (PASSES * NC) % Cfg::CL);
  const int4 gr = groups[blockIdx.x / (PASSES * NC * Cfg::CL)];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = gr.x * Cfg::BM + (Cfg::COOP ? which * 64 : 0), n0 = gr.y + rank * Cfg::BN;
  float4 sum[H];
#pragma unroll
  for (int u = 0; u < H; ++u) sum[u] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 2
  for (int k = 0; k < gr.w; ++k) {
    const float4* src = partial_slot<Cfg>(p, gr.z + k, rank, which) + pass * H * 128;
#pragma unroll
    for (int u = 0; u < H; ++u) {
      const float4 t = __ldcg(src + u * 128);
      sum[u].x += t.x;
      sum[u].y += t.y;
      sum[u].z += t.z;
      sum[u].w += t.w;
    }
  }
#pragma unroll
  for (int u = 0; u < H; ++u) {
    const int v = pass * H + u, mi = v / (Cfg::ACC / 4), j = v % (Cfg::ACC / 4);
    int r, n, r1, n1;
    kit::fragment_coord<Cfg::SWAP>(mi, j, 0, 0, warp, lane, r, n);
    kit::fragment_coord<Cfg::SWAP>(mi, j, 0, 1, warp, lane, r1, n1);
    store_pair<Cfg>(p, row0, n0, r, n, r1, n1, p.alpha * sum[u].x, p.alpha * sum[u].y);
    kit::fragment_coord<Cfg::SWAP>(mi, j, 1, 0, warp, lane, r, n);
    kit::fragment_coord<Cfg::SWAP>(mi, j, 1, 1, warp, lane, r1, n1);
    store_pair<Cfg>(p, row0, n0, r, n, r1, n1, p.alpha * sum[u].z, p.alpha * sum[u].w);
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side of one kernel: tensor maps, parameters, launch.

// g: the DSD view (dsd_shape().g).
template <class Cfg>
void launch(const GemmArgs& g, const LaunchState& st, cudaStream_t stream) {
  const BsrView& a = g.sparse;
  using T = typename Cfg::TOut;
  CUtensorMap tm_a, tm_b, tm_c;  // a zero map is never used (no stored block / no TMA store)
  std::memset(&tm_a, 0, sizeof(tm_a));
  std::memset(&tm_b, 0, sizeof(tm_b));
  std::memset(&tm_c, 0, sizeof(tm_c));
  const bool b3d = !Cfg::B_K && g.b.cols % 64 == 0;
  if (a.nnzb > 0) {  // no stored block: the maps are never used (and a zero-size map is invalid)
    // vals: (nnzb * bm_stored, bk_stored). op none: boxes (KS, BM / CL) of a block's rows;
    // op T: boxes (64 or 32 of the stored columns, KS of the stored rows); row pairs: (KS, 64), a
    // half of the tile is one stored block's rows.
    const uint32_t box_inner = Cfg::A_MN ? uint32_t(Cfg::ATile::W) : uint32_t(Cfg::KS);
    const uint32_t box_outer = Cfg::A_MN ? uint32_t(Cfg::KS) : uint32_t(st.pair_blk ? Cfg::BM / 2 : Cfg::BM / Cfg::CL);
    tm_a = tma_map_2d(a.values, a.dtype, uint64_t(a.bk), uint64_t(a.nnzb) * a.bm, uint64_t(a.bk) * 2, box_inner,
                      box_outer, tma_swizzle(Cfg::ATile::ROW_BYTES), "A values");
    if constexpr (Cfg::B_K) {
      // B column-major: N rows of K, boxes (KS, BN)
      tm_b = tma_map_2d(g.b.data, a.dtype, uint64_t(g.b.rows), uint64_t(g.b.cols), uint64_t(g.b.ld) * 2, Cfg::KS,
                        Cfg::BN, tma_swizzle(Cfg::KS * 2), "B");
    } else {
      // NOTE: 3-D only when N is whole 64-column chunks: a partial last chunk would make the map
      // claim memory past column N of B's last row, which the caller need not have allocated.
      tm_b = tma_map_2d(g.b.data, a.dtype, uint64_t(g.b.cols), uint64_t(g.b.rows), uint64_t(g.b.ld) * 2, 64, Cfg::KS,
                        CU_TENSOR_MAP_SWIZZLE_128B, "B", b3d ? uint64_t(g.b.cols / 64) : 0, Cfg::BN / 64);
    }
  }
  Params p{};
  p.b3d = b3d;
  p.items = st.items;
  p.cta_items = st.cta_items;
  p.col_idx = st.trans || st.pair_blk ? st.col : a.col_idx;
  if (st.pair_blk && !Cfg::PAIRS_BUILT) throw Error(Status::internal, "hopper: row pairs need the 128-row wide-tile kernel");
  if (st.pair_blk)
    p.pair_blk = st.pair_blk;
  else
    p.perm = st.perm;
  p.c = g.c.data;
  const bool c_row = g.c.layout == Layout::row_major;
  if (c_row == Cfg::C_COL) throw Error(Status::internal, "hopper: kernel built for the other layout of C");
  p.c_rs = c_row ? g.c.ld : 1;
  p.c_cs = c_row ? 1 : g.c.ld;
  p.n = int(g.b.cols);
  p.m = int(g.c.rows);
  p.bk = st.bk;
  p.kslices = st.bk / Cfg::KS;
  // Direct stores: the pair of a fragment runs along n (along m when swapped); one 2-element
  // access when that direction is contiguous and every pair starts 2-element aligned.
  const bool contiguous = Cfg::SWAP ? !c_row : c_row;
  p.c_pairs = contiguous && (g.c.ld % 2 == 0) && (reinterpret_cast<uintptr_t>(g.c.data) % (2 * sizeof(T)) == 0);
  p.tma_store = c_tma_storable(g.c);
  if (Cfg::C_TMA_ONLY && !p.tma_store) throw Error(Status::internal, "hopper: TMA-only kernel for a C the TMA cannot store");
  if (p.tma_store && c_row)
    tm_c = tma_map_2d(g.c.data, g.c.dtype, uint64_t(g.c.cols), uint64_t(g.c.rows), uint64_t(g.c.ld) * sizeof(T),
                      Cfg::CW, Cfg::ROWS, CU_TENSOR_MAP_SWIZZLE_128B, "C");
  else if (p.tma_store)
    tm_c = tma_map_2d(g.c.data, g.c.dtype, uint64_t(g.c.rows), uint64_t(g.c.cols), uint64_t(g.c.ld) * sizeof(T),
                      Cfg::COL_IW, Cfg::COL_OL, tma_swizzle(Cfg::COL_LB), "C");
  p.out_bf16 = g.c.dtype == DType::bf16;
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.cluster_mode = st.cluster_mode;
  p.slot_of = st.slot_of;
  p.partials = st.partials;
  p.prof = st.prof;
  // (prepare() raised the kernel's shared-memory limit: run() stays capturable in a CUDA graph.)
  const kit::KernelInfo info{nullptr, kThreads, Cfg::SMEM, 1, Cfg::CL};
  kit::launch(info, unsigned(st.grid), stream, Cfg::OVERLAP && st.overlap, &hopper_dsd_kernel<Cfg>,
              "hopper_dsd_kernel launch", tm_a, tm_b, tm_c, p);
  if (st.ngroups > 0) {
    const int per_group = Cfg::CL * (Cfg::COOP ? 2 : 1) * (Cfg::MI * Cfg::ACC / 32);  // see the kernel
    hopper_split_reduce<Cfg><<<st.ngroups * per_group, 128, 0, stream>>>(st.groups, p);
    check_cuda(cudaGetLastError(), "hopper_split_reduce launch");
  }
}

template <int I>
Kernel kernel_at() {
  using Cfg = ConfigAt<I>;
  constexpr int partial = 128 * Cfg::MI * Cfg::ACC * int(sizeof(float)) * (Cfg::COOP ? 2 : 1);
  return {kConfigs[I],
          {reinterpret_cast<const void*>(&hopper_dsd_kernel<Cfg>), kThreads, Cfg::SMEM, 1, Cfg::CL},
          &launch<Cfg>,
          partial};
}
template <int I, int BM, int KS, bool BF16>
void add_one(Kernel* table) {
  if constexpr (kConfigs[I].bm == BM && kConfigs[I].ks == KS && kConfigs[I].bf16 == BF16) table[I] = kernel_at<I>();
}
template <int BM, int KS, bool BF16, int... I>
void add_matching(Kernel* table, std::integer_sequence<int, I...>) {
  (add_one<I, BM, KS, BF16>(table), ...);
}
template <int BM, int KS, bool BF16>
void add_instances(Kernel* table) {
  add_matching<BM, KS, BF16>(table, std::make_integer_sequence<int, kNumConfigs>{});
}

}  // namespace sparsek::dsd_sm90
