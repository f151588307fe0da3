// Hopper (sm_90a) fp8 DSD kernel: the producer, the consumers with the per-block promotion, the
// epilogue, the launch, the table of built kernels, and the transpose of a row-major B.
//  - A work item is (block row r, N tile n0): C[r*BM : +BM, n0 : n0 + 128]. Its K loop walks the
//    row's stored blocks; one stored block (BM x BK bytes, K-major) and B's matching panel (128 x BK
//    bytes of B^T, K-major: fp8 wgmma reads both operands K-major) are one ring stage.
//  - Each block's product goes to a fresh accumulator (`part`) that is then added into the item's
//    accumulator times the block's scale: the scales vary along K, so they are applied when the
//    block's partial sum is promoted, block by block (DeepGEMM's promotion, at the block's own
//    granularity). The two consumer warpgroups work on every item (128-row blocks: 64 rows each;
//    64-row blocks: 64 columns each), so one warpgroup's promotion runs under the other's wgmmas.
//  - Epilogue: C = alpha * sB[n] * acc (+ beta * C). 16-bit C that the TMA can store, with beta = 0,
//    goes through a swizzled staging tile per consumer and TMA stores (the threads' part is a few
//    shared-memory stores; the tensor cores wait for nothing else); any other C straight from the
//    registers, the pair of adjacent columns one access where C allows. The column scales are loaded
//    before the item's K loop: loaded beside the stores, each one's latency was paid in turn.
//  - B's K must be contiguous for the TMA to load K-major panels: a row-major B (the DSD view's;
//    a DDS layer's row-major activations arrive column-major in that view and need nothing) is
//    transposed into the plan's workspace first (transpose_b).
#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "core/device.hpp"
#include "kernels/dsd_fp8_sm90/config.hpp"
#include "kernels/dtype.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/ptx/wgmma.cuh"
#include "kernels/sm90/kit/ring.cuh"
#include "kernels/sm90/kit/store.cuh"

namespace sparsek::dsd_fp8_sm90 {

// Producer: one warp; lane 0 waits for free slots and issues the TMA loads and the block's scale,
// the warp reads the block columns and scales 32 at a time.
template <class Cfg>
__device__ __forceinline__ void produce(const CUtensorMap* tm_a, const CUtensorMap* tm_b, const Params& p,
                                        int first, int last, uint32_t s_a, uint32_t s_b, uint32_t full,
                                        uint32_t empty, uint32_t scales) {
  const int lane = threadIdx.x % 32;
  kit::Ring<Cfg::STAGES> ring;
  int4 next = first < last ? p.items[first] : make_int4(0, 0, 0, 0);
  for (int it = first; it < last; ++it) {
    const int4 w = next;
    if (it + 1 < last) next = p.items[it + 1];  // one dependent load fewer before the next item's first TMA
    for (int j0 = w.z; j0 < w.w; j0 += 32) {
      int col = 0;
      float sc = 0.f;
      if (lane < w.w - j0) {
        col = p.col_idx[j0 + lane];
        sc = p.a_scales[j0 + lane];
      }
      const int count = min(32, w.w - j0);
      for (int t = 0; t < count; ++t) {
        const int col_t = __shfl_sync(0xffffffffu, col, t);
        const float sc_t = __shfl_sync(0xffffffffu, sc, t);
        if (lane == 0) {
          const uint32_t bar = full + 8 * ring.stage;
          ptx::mbar_wait_or_trap(empty + 8 * ring.stage, ring.phase ^ 1, kit::kWaitLimit);
          ptx::st_shared_u32(scales + 4 * ring.stage, __float_as_uint(sc_t));
          ptx::mbar_arrive_expect_tx(bar, Cfg::STAGE_BYTES);
          // vals: (nnzb * BM rows, BK bytes), box (BK, BM) at block j's rows
          ptx::tma_load_2d(s_a + ring.stage * Cfg::A_BYTES, tm_a, bar, 0, (j0 + t) * Cfg::BM);
          // B^T: (N rows, K bytes), box (BK, BN) at (the block's K, n0)
          ptx::tma_load_2d(s_b + ring.stage * Cfg::B_BYTES, tm_b, bar, col_t * Cfg::BK, w.y);
          ring.advance();
        }
        __syncwarp();
      }
    }
  }
}

// sB[n] of the thread's columns of an item (two per fragment column group j), 0 past N and for a
// row without stored blocks (whose C is beta * C: no Inf * 0 there). Loaded before the item's K
// loop and used only in the epilogue, so that their latency hides under the loop (alpha is
// multiplied there: multiplied here, the loads were waited for before the first wgmma).
template <class Cfg>
__device__ __forceinline__ void column_scales(float (&sb)[Cfg::ACC / 2], const Params& p, int n0, bool used) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < Cfg::ACC / 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = n0 + kit::fragment_col(lane, j, e);
      sb[2 * j + e] = used && n < p.n ? p.b_scales[n] : 0.f;
    }
}

// C = alpha * sb[n] * acc (+ beta * C): this consumer's 64 rows x WN columns at (row0, n0). Through the
// staging tile (s_stage, stage_ptr) and TMA stores where Params::tma_c, else from the registers.
template <class Cfg>
__device__ __forceinline__ void epilogue(const float (&acc)[Cfg::ACC], const float (&sb)[Cfg::ACC / 2],
                                         const CUtensorMap* tm_c, const Params& p, int row0, int n0, bool used,
                                         int which, uint32_t s_stage, uint8_t* stage_ptr) {
  using T = typename Cfg::TOut;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const float alpha = used ? p.alpha : 0.f;  // a row without stored blocks is beta * C whatever alpha is
  if constexpr (Cfg::STAGED) {
    if (p.tma_c) {
      kit::staging_acquire(tid == 0, 1 + which);  // the tile's last TMA store has read it
#pragma unroll
      for (int j = 0; j < Cfg::ACC / 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float v0 = alpha * sb[2 * j] * acc[4 * j + 2 * h];
          const float v1 = alpha * sb[2 * j + 1] * acc[4 * j + 2 * h + 1];
          *reinterpret_cast<uint32_t*>(stage_ptr + kit::fragment_pair_offset(warp, lane, j, h)) =
              p.out_bf16 ? dev::pack2<true>(v0, v1) : dev::pack2<false>(v0, v1);
        }
      kit::staging_release(1 + which);
      if (tid == 0) {
        // C: (N, M), boxes (64, 64); columns and rows outside C are not written
#pragma unroll
        for (int c = 0; c < Cfg::WN / 64; ++c) ptx::tma_store_2d(tm_c, s_stage + c * 64 * 128, n0 + 64 * c, row0);
        ptx::bulk_commit_group();
      }
      return;
    }
  }
  T* c = static_cast<T*>(p.c);
  const bool read_c = p.beta != 0.f;
#pragma unroll
  for (int j = 0; j < Cfg::ACC / 4; ++j) {
    const int n = n0 + kit::fragment_col(lane, j, 0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = row0 + kit::fragment_row(warp, lane, h);
      const float v0 = alpha * sb[2 * j] * acc[4 * j + 2 * h];
      const float v1 = alpha * sb[2 * j + 1] * acc[4 * j + 2 * h + 1];
      const int64_t off0 = int64_t(m) * p.c_rs + int64_t(n) * p.c_cs;
      if (p.c_pairs && n + 1 < p.n) {
        float o0 = v0, o1 = v1;
        if (read_c) {
          const float2 old = dev::out_load2(c + off0, p.out_bf16);
          o0 += p.beta * old.x;
          o1 += p.beta * old.y;
        }
        dev::out_store2(c + off0, o0, o1, p.out_bf16);
      } else {
        if (n < p.n)
          dev::out_store(c + off0, v0 + (read_c ? p.beta * dev::out_load(c + off0, p.out_bf16) : 0.f), p.out_bf16);
        if (n + 1 < p.n) {
          const int64_t off1 = off0 + p.c_cs;
          dev::out_store(c + off1, v1 + (read_c ? p.beta * dev::out_load(c + off1, p.out_bf16) : 0.f), p.out_bf16);
        }
      }
    }
  }
}

// Consumer warpgroup `which`: every item, its half (rows with 128-row blocks, columns with 64).
// Per stage: wait full, part = A_block x B_panel (the block's wgmmas), acc += scale * part, give the
// slot back. With Cfg::PIPELINED, two `part` accumulators alternate so that the promotion of one
// block runs while the next block's wgmmas are in flight (wait<1>); otherwise each block's wgmmas
// are waited for before its promotion (config.hpp says where each is used and why). A block row
// with no stored block gives beta * C (epilogue's `used`).
template <class Cfg>
__device__ __forceinline__ void consume(const CUtensorMap* tm_c, const Params& p, int first, int last, int which,
                                        uint32_t s_a, uint32_t s_b, uint32_t full, uint32_t empty, uint32_t scales,
                                        uint32_t s_stage, uint8_t* stage_ptr) {
  using AT = typename Cfg::ATile;
  using BT = typename Cfg::BTile;
  const int lane = threadIdx.x % 32;
  const int a_e0 = Cfg::SPLIT_M ? 64 * which : 0, b_e0 = Cfg::SPLIT_M ? 0 : 64 * which;
  kit::Ring<Cfg::STAGES> ring;
  float acc[Cfg::ACC], part0[Cfg::ACC], part1[Cfg::ACC];
  // Wait for the next stage, note its slot and scale, issue its wgmmas into d (one commit group).
  auto issue = [&](float(&d)[Cfg::ACC], int& stage, float& scale) {
    ptx::mbar_wait(full + 8 * ring.stage, ring.phase);
    stage = ring.stage;
    scale = __uint_as_float(ptx::ld_shared_u32(scales + 4 * stage));
    const uint32_t a = s_a + stage * Cfg::A_BYTES, b = s_b + stage * Cfg::B_BYTES;
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BK / 32; ++kk)
      ptx::wgmma_m64k32_e4m3<Cfg::WN>(d, AT::desc(a, a_e0, kk), BT::desc(b, b_e0, kk), kk > 0 ? 1 : 0);
    ptx::wgmma_commit();
    ring.advance();
  };
  // d's group has completed (the caller waited): give its slot back and promote it into acc.
  auto fold = [&](float(&d)[Cfg::ACC], int stage, float scale) {
#pragma unroll
    for (int i = 0; i < Cfg::ACC; ++i) ptx::fence_operand(d[i]);
    if (lane == 0) ptx::mbar_arrive(empty + 8 * stage);
#pragma unroll
    for (int i = 0; i < Cfg::ACC; ++i) acc[i] = fmaf(scale, d[i], acc[i]);
  };
  int4 next = first < last ? p.items[first] : make_int4(0, 0, 0, 0);
  for (int it = first; it < last; ++it) {
    const int4 w = next;
    if (it + 1 < last) next = p.items[it + 1];  // its latency hides under this item
    float sb[Cfg::ACC / 2];
    column_scales<Cfg>(sb, p, w.y + b_e0, w.w > w.z);
#pragma unroll
    for (int i = 0; i < Cfg::ACC; ++i) acc[i] = 0.f;
    int st0 = 0, st1 = 0;
    float sc0 = 0.f, sc1 = 0.f;
    if constexpr (!Cfg::PIPELINED) {
      for (int j = w.z; j < w.w; ++j) {
        issue(part0, st0, sc0);
        ptx::wgmma_wait<0>();
        fold(part0, st0, sc0);
      }
    } else if (w.w > w.z) {  // part0 / part1 alternate; at the loop's top part0's block is in flight
      issue(part0, st0, sc0);
      for (int j = w.z + 1;; j += 2) {
        if (j == w.w) {
          ptx::wgmma_wait<0>();
          fold(part0, st0, sc0);
          break;
        }
        issue(part1, st1, sc1);
        ptx::wgmma_wait<1>();
        fold(part0, st0, sc0);
        if (j + 1 == w.w) {
          ptx::wgmma_wait<0>();
          fold(part1, st1, sc1);
          break;
        }
        issue(part0, st0, sc0);
        ptx::wgmma_wait<1>();
        fold(part1, st1, sc1);
      }
    }
    epilogue<Cfg>(acc, sb, tm_c, p, w.x * Cfg::BM + a_e0, w.y + b_e0, w.w > w.z, which, s_stage, stage_ptr);
  }
  if (threadIdx.x % 128 == 0) ptx::bulk_wait_group<0>();  // the staging tile stays until its stores are done
}

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    dsd_fp8_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                   const __grid_constant__ CUtensorMap tm_c, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const kit::SmemBase sm = kit::SmemBase::of(smem_raw);  // Config's regions
  const uint32_t s_a = sm.at(Cfg::A.offset), s_b = sm.at(Cfg::B.offset);
  const uint32_t full = sm.at(Cfg::FULL.offset), empty = sm.at(Cfg::EMPTY.offset), scales = sm.at(Cfg::SCALE.offset);
  if (threadIdx.x == 0) {
    kit::init_barriers(full, Cfg::STAGES, 1);      // producer's arrive_expect_tx + TMA bytes
    kit::init_barriers(empty, Cfg::STAGES, 8);     // lane 0 of each of the 8 consumer warps
    ptx::fence_mbar_init();
  }
  __syncthreads();
  const kit::ItemRange range = kit::item_range(p.cta_items, int(blockIdx.x));
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<40>();
    if (threadIdx.x < 32) produce<Cfg>(&tm_a, &tm_b, p, range.first, range.last, s_a, s_b, full, empty, scales);
  } else {
    ptx::setmaxnreg_inc<232>();
    const int which = threadIdx.x / 128 - 1;
    consume<Cfg>(&tm_c, p, range.first, range.last, which, s_a, s_b, full, empty, scales,
                 sm.at(Cfg::STAGING.offset, which * Cfg::STAGING_BYTES),
                 sm.ptr_at<uint8_t>(Cfg::STAGING.offset, which * Cfg::STAGING_BYTES));
  }
#endif
}

template <class Cfg>
void launch(const GemmArgs& g, const void* b_kmajor, int64_t b_ld, const LaunchState& st, cudaStream_t stream) {
  const BsrView& a = g.sparse;
  using T = typename Cfg::TOut;
  CUtensorMap tm_a, tm_b, tm_c;  // tm_a, tm_b: never used without stored blocks; tm_c: unless p.tma_c
  std::memset(&tm_a, 0, sizeof(tm_a));
  std::memset(&tm_b, 0, sizeof(tm_b));
  std::memset(&tm_c, 0, sizeof(tm_c));
  if (a.nnzb > 0) {
    // vals: (nnzb * BM rows, BK bytes), boxes (BK, BM); B^T: (N rows, K bytes), boxes (BK, BN)
    tm_a = tma_map_2d(a.values, DType::e4m3, uint64_t(Cfg::BK), uint64_t(a.nnzb) * Cfg::BM, uint64_t(Cfg::BK), Cfg::BK,
                      Cfg::BM, tma_swizzle(Cfg::ATile::ROW_BYTES), "A values");
    tm_b = tma_map_2d(b_kmajor, DType::e4m3, uint64_t(g.b.rows), uint64_t(g.b.cols), uint64_t(b_ld), Cfg::BK, Cfg::BN,
                      tma_swizzle(Cfg::BTile::ROW_BYTES), "B");
  }
  Params p{};
  p.items = st.items;
  p.cta_items = st.cta_items;
  p.col_idx = a.col_idx;
  p.a_scales = a.scales;
  p.b_scales = g.b.scales;
  p.c = g.c.data;
  const bool c_row = g.c.layout == Layout::row_major;
  p.c_rs = c_row ? g.c.ld : 1;
  p.c_cs = c_row ? 1 : g.c.ld;
  p.n = int(g.b.cols);
  p.c_pairs = c_row && g.c.ld % 2 == 0 && reinterpret_cast<uintptr_t>(g.c.data) % (2 * sizeof(T)) == 0;
  p.out_bf16 = g.c.dtype == DType::bf16;
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.tma_c = Cfg::STAGED && c_row && g.beta == 0.f && c_tma_storable(g.c);
  if (p.tma_c)  // C: (N, M) row-major, boxes (64, 64), as the staging tiles are laid out
    tm_c = tma_map_2d(g.c.data, g.c.dtype, uint64_t(g.c.cols), uint64_t(g.c.rows), uint64_t(g.c.ld) * 2, 64, 64,
                      tma_swizzle(128), "C");
  const kit::KernelInfo info{nullptr, kThreads, Cfg::SMEM, 1, 1};
  kit::launch(info, unsigned(st.grid), stream, false, &dsd_fp8_kernel<Cfg>, "dsd_fp8_kernel launch", tm_a, tm_b, tm_c, p);
}

template <int I>
Kernel kernel_at() {
  using Cfg = ConfigAt<I>;
  return {kConfigs[I], {reinterpret_cast<const void*>(&dsd_fp8_kernel<Cfg>), kThreads, Cfg::SMEM, 1, 1}, &launch<Cfg>};
}

const Kernel* find_kernel(const Key& key) {
  static const auto table = kit::make_kernel_table<kNumConfigs>([](auto i) { return kernel_at<decltype(i)::value>(); });
  return kit::find_by_key(table, key);
}

// B (K x N, N contiguous) -> B^T (N x K, K contiguous), 64 x 64 byte tiles through shared memory.
// A whole tile with 16-byte aligned rows on both sides (`vec`) moves as one 16-byte load and one
// 16-byte store per thread; edge tiles and unaligned operands go byte by byte.
__global__ void __launch_bounds__(256) transpose_b_kernel(const uint8_t* b, int64_t ld, int64_t k, int64_t n,
                                                          uint8_t* bt, bool vec) {
  __shared__ __align__(16) uint8_t tile[64][80];  // 80: rows stay 16-byte aligned, banks spread
  const int64_t k0 = int64_t(blockIdx.y) * 64, n0 = int64_t(blockIdx.x) * 64;
  if (vec && k0 + 64 <= k && n0 + 64 <= n) {
    const int r = threadIdx.x / 4, q = threadIdx.x % 4;
    *reinterpret_cast<uint4*>(&tile[r][16 * q]) =  // r along K, 16 bytes along N
        __ldg(reinterpret_cast<const uint4*>(b + (k0 + r) * ld + n0 + 16 * q));
    __syncthreads();
    uint32_t w[4] = {0u, 0u, 0u, 0u};  // r along N, 16 bytes along K
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i / 4] |= uint32_t(tile[16 * q + i][r]) << (8 * (i % 4));
    *reinterpret_cast<uint4*>(bt + (n0 + r) * k + k0 + 16 * q) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
  for (int i = threadIdx.x; i < 64 * 64; i += 256) {
    const int r = i / 64, c = i % 64;  // r along K, c along N (consecutive threads: consecutive n)
    tile[r][c] = k0 + r < k && n0 + c < n ? b[(k0 + r) * ld + n0 + c] : uint8_t(0);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 64 * 64; i += 256) {
    const int r = i / 64, c = i % 64;  // r along N, c along K
    if (n0 + r < n && k0 + c < k) bt[(n0 + r) * k + k0 + c] = tile[c][r];
  }
}

void transpose_b(const void* b, int64_t ld, int64_t k, int64_t n, void* bt, cudaStream_t stream) {
  const dim3 grid(unsigned((n + 63) / 64), unsigned((k + 63) / 64));
  const bool vec = ld % 16 == 0 && k % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(bt) % 16 == 0;
  transpose_b_kernel<<<grid, 256, 0, stream>>>(static_cast<const uint8_t*>(b), ld, k, n, static_cast<uint8_t*>(bt),
                                               vec);
  check_cuda(cudaGetLastError(), "transpose_b_kernel launch");
}

}  // namespace sparsek::dsd_fp8_sm90
