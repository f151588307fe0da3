// Hopper (sm_90a) SDD kernel: C = alpha * (A * B) + beta * C on C's stored blocks only (C in BSR,
// A and B dense, all on the device). fp16 / bf16 inputs, fp32 accumulation, f16 / bf16 / f32 C.
// The kernel (producer, consumers with the products' K loop, epilogue), its launch and the table of
// built kernels. docs/design/sdd_sm90.md says how it works.
//  - A work item is a group of up to BN / bk neighbouring stored blocks of one block row r of C
//    (pattern positions j0 .. j0 + G): the tile C[r*bm : +bm, the G blocks' columns] is 256 columns
//    wide however narrow the blocks, so the wgmma N (the swapped M when bm = 32) stays 256. Its K
//    loop is the dense K of A's rows and the G blocks' columns of B, KS = 64 per stage; the TMA
//    zero-fills the K tail of the last stage. A group with fewer than BN / bk blocks leaves the
//    rest of the tile unloaded; those columns are computed on stale data and never stored.
//  - A's tile is K-major (A row-major) or MN-major (A column-major: boxes of 64 or 32 rows). B's
//    G blocks sit side by side: MN-major chunks of min(bk, 64) columns (B row-major; 32-wide
//    chunks use the 64-byte swizzle) or K-major rows (B column-major, one box per block).
//  - Producer warp, ring of mbarrier stages, cooperative (bm = 128) or ping-pong (bm <= 64)
//    consumer warpgroups, the swap for bm = 32 and the wgmma issue are the DSD kernel's (the kit's
//    mainloop.cuh).
//  - Epilogue straight from the registers into the blocks' values (row-major inside a block; the
//    pair of adjacent columns as one access): the dense K loop makes it a small share of an item.
#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "core/device.hpp"
#include "kernels/dtype.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/sdd_sm90/config.hpp"
#include "kernels/sm90/kit/mainloop.cuh"
#include "kernels/sm90/kit/ring.cuh"

namespace sparsek::sdd_sm90 {

// Producer: one warp. Per stage, lane 0 waits for the free slot, announces the bytes and loads A;
// then lane g loads the B columns of block g of the group (its block column read once per item,
// one item ahead), so the B loads of a stage issue in parallel.
template <class Cfg>
__device__ __forceinline__ void produce(const CUtensorMap* tm_a, const CUtensorMap* tm_b, const Params& p,
                                        int first, int last, uint32_t s_a, uint32_t s_b, uint32_t full,
                                        uint32_t empty) {
  const int lane = threadIdx.x % 32;
  kit::Ring<Cfg::STAGES> ring;
  auto col_of = [&](const int4& w) { return lane < w.z ? p.col_idx[w.y + lane] : 0; };
  int4 w = first < last ? p.items[first] : make_int4(0, 0, 0, 0);
  int col = col_of(w);
  for (int it = first; it < last; ++it) {
    const int4 wn = it + 1 < last ? p.items[it + 1] : make_int4(0, 0, 0, 0);
    const int col_next = col_of(wn);
    const int row = w.x * Cfg::BM;
    for (int s = 0; s < p.kstages; ++s) {
      const uint32_t bar = full + 8 * ring.stage;
      const int k0 = s * Cfg::KS;
      if (lane == 0) {
        ptx::mbar_wait_or_trap(empty + 8 * ring.stage, ring.phase ^ 1, kit::kWaitLimit);
        ptx::mbar_arrive_expect_tx(bar, Cfg::A_BYTES + w.z * p.bk * Cfg::KS * 2);  // the loaded part of B
        // A rows r*bm ..: row-major (K contiguous): box (KS, BM) at (k0, row); column-major
        // (M contiguous): boxes (W, KS) at (row + c*W, k0)
        const uint32_t a_dst = s_a + ring.stage * Cfg::A_BYTES;
        if constexpr (Cfg::A_MN) {
#pragma unroll
          for (int c = 0; c < Cfg::ATile::CHUNKS; ++c)
            ptx::tma_load_2d(a_dst + c * Cfg::ATile::CHUNK, tm_a, bar, row + c * Cfg::ATile::W, k0);
        } else {
          ptx::tma_load_2d(a_dst, tm_a, bar, k0, row);
        }
      }
      __syncwarp();  // the bytes are announced before any B load lands
      // B columns col*bk .. of block `lane` of the group, at its place in the tile: column-major
      // (K contiguous): box (KS, bk) at (k0, col*bk), bk rows of the tile; row-major (N
      // contiguous): bk / BW boxes (BW, KS) at (col*bk + c*BW, k0), one chunk each.
      if (lane < w.z) {
        const uint32_t b_dst = s_b + ring.stage * Cfg::B_BYTES;
        if constexpr (Cfg::B_K) {
          ptx::tma_load_2d(b_dst + lane * p.bk * Cfg::KS * 2, tm_b, bar, k0, col * p.bk);
        } else {
          for (int c = 0; c < p.bk / Cfg::BW; ++c)
            ptx::tma_load_2d(b_dst + (lane * p.bk / Cfg::BW + c) * Cfg::BTile::CHUNK, tm_b, bar, col * p.bk + c * Cfg::BW,
                             k0);
        }
      }
      ring.advance();
    }
    w = wn;
    col = col_next;
  }
}

// The consumer's tile into C's values: tile element (r, n) is row r of block j0 + n / bk, column
// n % bk (columns past the group's blocks are not stored). beta == 0: C is never read.
template <class Cfg>
__device__ __forceinline__ void epilogue(float (&acc)[Cfg::MI][Cfg::ACC], const Params& p, const int4& w, int row0) {
  using T = typename Cfg::TOut;
  T* c = static_cast<T*>(p.c);
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const bool read_c = p.beta != 0.f;
  const int64_t block = int64_t(Cfg::BM) * p.bk;
  // NOTE: shifts by log2(bk) here let the compiler hoist every element's offset out of the
  // unrolled loop and spill ~1.3 KB; the divisions are not hoisted.
  auto offset = [&](int r, int n) { return (w.y + n / p.bk) * block + int64_t(row0 + r) * p.bk + n % p.bk; };
  auto one = [&](int64_t off, float v) {
    dev::out_store(c + off, v + (read_c ? p.beta * dev::out_load(c + off, p.out_bf16) : 0.f), p.out_bf16);
  };
#pragma unroll
  for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
    for (int j = 0; j < Cfg::ACC / 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int r, n, r1, n1;
        kit::fragment_coord<Cfg::SWAP>(mi, j, h, 0, warp, lane, r, n);
        kit::fragment_coord<Cfg::SWAP>(mi, j, h, 1, warp, lane, r1, n1);
        if (n / p.bk >= w.z) continue;  // the pair shares its block (n1 = n, or n + 1 of an even n)
        float v0 = p.alpha * acc[mi][4 * j + 2 * h], v1 = p.alpha * acc[mi][4 * j + 2 * h + 1];
        const int64_t off0 = offset(r, n);
        if (!Cfg::SWAP && p.c_pairs) {  // (n, n + 1): adjacent in the block row
          if (read_c) {
            const float2 old = dev::out_load2(c + off0, p.out_bf16);
            v0 += p.beta * old.x;
            v1 += p.beta * old.y;
          }
          dev::out_store2(c + off0, v0, v1, p.out_bf16);
        } else {
          one(off0, v0);
          one(offset(r1, n1), v1);
        }
      }
}

// Consumer: one warpgroup; cooperative (bm = 128: rows 64*which of every item) or ping-pong (the
// items of its parity). The ring walk, the hand-over between ping-pong consumers and the slot
// release follow the DSD kernel's consume() (dsd_sm90/consumer.cuh has the reasoning).
template <class Cfg>
__device__ __forceinline__ void consume(const Params& p, int first, int last, int which, uint32_t s_a, uint32_t s_b,
                                        uint32_t full, uint32_t empty) {
  kit::Ring<Cfg::STAGES> ring;
  auto release = [&](uint32_t slot) { ptx::mbar_arrive(empty + 8 * slot); };
  float acc[Cfg::MI][Cfg::ACC];
  for (int it = first; it < last; ++it) {
    if (!Cfg::COOP && ((it - first) & 1) != which) {
      ring.skip(uint32_t(p.kstages));
      continue;
    }
    const int4 w = p.items[it];
    if (!Cfg::COOP && it > first) ptx::named_barrier_sync(1 + which, 256);  // other one saw item it-1
    const bool hand_over = !Cfg::COOP && it + 1 < last;                    // the other consumer runs item it+1
    kit::mainloop<Cfg>(acc, p.kstages, ring, s_a, s_b, full, which, hand_over ? 2 - which : -1, release, 0u, nullptr);
    epilogue<Cfg>(acc, p, w, Cfg::COOP ? which * 64 : 0);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_sdd_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                      const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const kit::SmemBase sm = kit::SmemBase::of(smem_raw);  // Config's regions
  const uint32_t s_a = sm.at(Cfg::A.offset), s_b = sm.at(Cfg::B.offset);
  const uint32_t full = sm.at(Cfg::FULL.offset), empty = sm.at(Cfg::EMPTY.offset);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::STAGES; ++s) {
      ptx::mbar_init(full + 8 * s, 1);                     // producer's arrive_expect_tx + TMA bytes
      ptx::mbar_init(empty + 8 * s, Cfg::COOP ? 8 : 4);    // lane 0 of each consuming warp
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  const kit::ItemRange range = kit::item_range(p.cta_items, int(blockIdx.x));
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<40>();
    if (threadIdx.x < 32) produce<Cfg>(&tm_a, &tm_b, p, range.first, range.last, s_a, s_b, full, empty);
  } else {
    ptx::setmaxnreg_inc<232>();
    consume<Cfg>(p, range.first, range.last, threadIdx.x / 128 - 1, s_a, s_b, full, empty);
  }
#endif
}

template <class Cfg>
void launch(const GemmArgs& g, const LaunchState& st, cudaStream_t stream) {
  const BsrView& c = g.sparse;
  const DType in = g.a.dtype;
  const int64_t K = g.k();
  // A (M x K): row-major -> (K inner, M rows), boxes (KS, BM); column-major -> (M inner, K rows),
  // boxes (W, KS). B (K x N): row-major -> (N inner, K rows), boxes (BW, KS); column-major ->
  // (K inner, N rows), boxes (KS, bk).
  const CUtensorMap tm_a =
      Cfg::A_MN ? tma_map_2d(g.a.data, in, uint64_t(g.a.rows), uint64_t(K), uint64_t(g.a.ld) * 2, Cfg::ATile::W,
                             Cfg::KS, tma_swizzle(Cfg::ATile::ROW_BYTES), "A")
                : tma_map_2d(g.a.data, in, uint64_t(K), uint64_t(g.a.rows), uint64_t(g.a.ld) * 2, Cfg::KS, Cfg::BM,
                             CU_TENSOR_MAP_SWIZZLE_128B, "A");
  const CUtensorMap tm_b =
      Cfg::B_K ? tma_map_2d(g.b.data, in, uint64_t(K), uint64_t(g.b.cols), uint64_t(g.b.ld) * 2, Cfg::KS,
                            uint32_t(c.bk), CU_TENSOR_MAP_SWIZZLE_128B, "B")
               : tma_map_2d(g.b.data, in, uint64_t(g.b.cols), uint64_t(K), uint64_t(g.b.ld) * 2, Cfg::BW, Cfg::KS,
                            tma_swizzle(Cfg::BW * 2), "B");
  Params p{};
  p.items = st.items;
  p.cta_items = st.cta_items;
  p.col_idx = c.col_idx;
  p.c = c.values;
  p.bk = c.bk;
  p.kstages = int((K + Cfg::KS - 1) / Cfg::KS);
  p.c_pairs = reinterpret_cast<uintptr_t>(c.values) % (2 * sizeof(typename Cfg::TOut)) == 0;
  p.out_bf16 = c.dtype == DType::bf16;
  p.alpha = g.alpha;
  p.beta = g.beta;
  // (prepare() raised the kernel's shared-memory limit: run() stays capturable in a CUDA graph.)
  hopper_sdd_kernel<Cfg><<<st.grid, kThreads, Cfg::SMEM, stream>>>(tm_a, tm_b, p);
  check_cuda(cudaGetLastError(), "hopper_sdd_kernel launch");
}

template <int I>
Kernel kernel_at() {
  using Cfg = ConfigAt<I>;
  return {config_at(I), {reinterpret_cast<const void*>(&hopper_sdd_kernel<Cfg>), kThreads, Cfg::SMEM, 1, 1},
          &launch<Cfg>};
}
const Kernel* find_kernel(const Key& key) {
  static const auto table = kit::make_kernel_table<kNumConfigs>([](auto i) { return kernel_at<decltype(i)::value>(); });
  return kit::find_by_key(table, key);
}

}  // namespace sparsek::sdd_sm90
