// Hopper DSD, epilogue: the tile leaves through shared-memory boxes of whole 128-byte lines, stored
// by TMA (or copied by the threads where C is not TMA-aligned), beta * C read through the same boxes;
// split rows' pieces leave raw fp32 sums to partial slots instead.
#pragma once
#include <utility>

#include "kernels/dsd_sm90/config.hpp"
#include "kernels/dtype.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/sm90/kit/ring.cuh"
#include "kernels/sm90/kit/store.cuh"
#include "kernels/sm90/kit/tile.cuh"

namespace sparsek::dsd_sm90 {

using dev::out_load;
using dev::out_load2;
using dev::out_store;
using dev::out_store2;

// Which store box a fragment (mi, j, h) of this warp falls in, along one side of the box: x is
// the fragment's first coordinate on that side without the lane's part (which is < 8 and never
// crosses a box edge: edges are multiples of 32). Along the side that holds the warp's 16 rows
// (m, or n when swapped) that is X64 (a multiple of 64, compile-time) + warp * 16 + h * 8.
// NOTE: written so that ptxas sees compile-time values and the (uniform) warp index only: a test
// on each element's full coordinates compiled, for column-major C, to a branch per accumulator
// pair in every box (4x the instructions, instruction-cache misses): 340 instead of 585 effective
// TFLOPS at 8192^3 128x128 (docs/history/products.md, "Column-major C").
template <int S>
__device__ __forceinline__ int box_of_warp_side(int x64, int warp) {
  static_assert(S == 32 || S == 64, "store boxes are 32 or 64 elements along each side");
  return S == 64 ? x64 / 64 : x64 / 32 + warp / 2;  // warp * 16 + h * 8 < 64; (..) / 32 = warp / 2
}
template <class Cfg>
__device__ __forceinline__ bool in_box(int k, int mi, int j, int warp) {
  constexpr bool C_COL = Cfg::C_COL;
  if constexpr (C_COL) {  // box k: rows (k % IC) * IW + [0, IW), columns (k / IC) * OL + [0, OL)
    constexpr int IW = Cfg::COL_IW, OL = Cfg::COL_OL, IC = Cfg::ROWS / IW;
    const int r_box = Cfg::SWAP ? (j * 8) / IW : IC == 1 ? 0 : box_of_warp_side<IW>(0, warp);
    const int n_box = Cfg::SWAP ? box_of_warp_side<OL>(mi * 64, warp) : (j * 8) / OL;
    return r_box == k % IC && n_box == k / IC;
  } else {  // box k: columns k * CW + [0, CW) of all ROWS rows
    return (Cfg::SWAP ? box_of_warp_side<Cfg::CW>(mi * 64, warp) : (j * 8) / Cfg::CW) == k;
  }
}

// C that TMA cannot store (a base address, leading dimension or line length that is not a
// 16-byte multiple) goes through the same shared-memory boxes, copied to and from C by the
// consumer's threads instead of the TMA: a warp per line, lane l on elements l and l + 32 (each
// warp instruction touches 64 or 128 contiguous bytes of C), masked past N. Raw element copies:
// the conversion and beta happen in the box exactly as on the TMA path (same rounding).
template <class Cfg, bool LOAD>
__device__ __forceinline__ void copy_box(uint8_t* buf, const Params& p, int c0, int c1, int warp, int lane) {
  constexpr bool C_COL = Cfg::C_COL;
  using T = typename Cfg::TOut;
  constexpr int ES = int(sizeof(T));
  constexpr int IW = C_COL ? Cfg::COL_IW : Cfg::CW, LB = IW * ES, OL = C_COL ? Cfg::COL_OL : Cfg::ROWS;
  T* const c = static_cast<T*>(p.c);
  const int64_t ld = C_COL ? p.c_cs : p.c_rs;
#pragma unroll 4
  for (int l = warp; l < OL; l += 4) {
    const int line = c1 + l;  // a row of C (row-major) or a column (column-major)
#pragma unroll
    for (int e = 0; e < IW / 32; ++e) {
      const int q = lane + 32 * e, pos = c0 + q;
      // A row pair's second block row may lie past M (an odd number of block rows); other tiles'
      // rows always exist (M = block rows * bm).
      const bool inside = (C_COL ? line : pos) < p.n && (!Cfg::PAIRS_BUILT || (C_COL ? pos : line) < p.m);
      T* const sh = reinterpret_cast<T*>(buf + kit::box_offset<LB>(l, q * ES));
      T* const gl = c + int64_t(line) * ld + pos;
      if constexpr (LOAD)
        *sh = inside ? *gl : T(0);
      else if (inside)
        *gl = *sh;
    }
  }
}

// The TMA half of a staged box: C's box TMA-loaded into the buffer (beta != 0), and the filled
// buffer stored. Both epilogues below use them.
template <class Cfg>
__device__ __forceinline__ void tma_load_box(const CUtensorMap* tm_c, uint32_t buf_s, int c0, int c1, int tid,
                                             uint32_t c_bar, uint32_t& c_phase) {
  if (tid == 0) {
    ptx::mbar_arrive_expect_tx(c_bar, Cfg::E_BYTES);
    ptx::tma_load_2d(buf_s, tm_c, c_bar, c0, c1);
  }
  ptx::mbar_wait_or_trap(c_bar, c_phase, kit::kWaitLimit);
  c_phase ^= 1;
}
template <class Cfg>
__device__ __forceinline__ void tma_store_box(const CUtensorMap* tm_c, uint32_t buf_s, int c0, int c1, int tid,
                                              int which) {
  ptx::fence_proxy_async_smem();  // the st.shared of the fill are read by the TMA (async proxy)
  ptx::named_barrier_sync(3 + which, 128);
  if (tid == 0) {
    if constexpr (Cfg::L2_HINTS)
      ptx::tma_store_2d_hint(tm_c, buf_s, c0, c1, ptx::l2_policy_evict_first());
    else
      ptx::tma_store_2d(tm_c, buf_s, c0, c1);
    ptx::bulk_commit_group();
  }
}

// Epilogue through shared memory and TMA stores: the tile goes out in boxes of whole 128-byte
// lines (one L2 request per line instead of eight 16-byte pieces), alternating between two
// swizzled buffers so that filling one overlaps the store of the other. Row-major C: box k is
// columns [k*CW, +CW) of the consumer's ROWS rows (a line is a row). Column-major C: box k is rows
// [(k % IC)*IW, +IW) of columns [(k / IC)*OL, +OL) (a line is a column). With beta != 0 the C box
// is first TMA-loaded into the same buffer (c_bar; phase c_phase) and updated in place.
// One box per instantiation: K must be a compile-time constant (a `#pragma unroll` over the boxes
// was not honoured for the larger bodies, which left a run-time membership test on every pair).
// READ_C (beta != 0) and OBF16 (bf16 rather than f16 C; unused for f32 C) are compile-time: as
// run-time tests ptxas re-evaluated both around every fragment (a branch and a constant load each),
// which made the fill ~25 instructions per two accumulator pairs (docs/history/products.md, "The epilogue's
// instructions per accumulator pair").
template <class Cfg, int K, bool READ_C, bool OBF16>
__device__ __forceinline__ void epilogue_box(float (&acc)[Cfg::MI][Cfg::ACC], const Params& p, float alpha,
                                             const CUtensorMap* tm_c, int row0, int n0, int which,
                                             uint8_t* ebuf, uint32_t ebuf_s, uint32_t c_bar, uint32_t& c_phase,
                                             bool tma) {
  using T = typename Cfg::TOut;
  constexpr bool C_COL = Cfg::C_COL;
  constexpr int ES = int(sizeof(T));
  constexpr int IW = C_COL ? Cfg::COL_IW : Cfg::CW;     // elements per line
  constexpr int LB = IW * ES;                           // bytes per line (128; 64 for 32-row pieces of 16-bit C)
  constexpr int OL = C_COL ? Cfg::COL_OL : Cfg::ROWS;   // lines per box
  constexpr int IC = C_COL ? Cfg::ROWS / IW : 1;        // column-major: boxes down one column group
  // A fragment's pair (e = 0, 1) is adjacent in a line when it runs along the line (non-swapped
  // pairs run along n, swapped ones along m). Otherwise it spans two lines, and lanes g and g ^ 1
  // (lane ^ 4), which are neighbours along the line, trade one value each: then every thread again
  // holds two neighbours of one line (one 4-byte store, 8-byte for f32, instead of two).
  constexpr bool PAIRED = C_COL == Cfg::SWAP;
  static_assert(OL * LB == Cfg::E_BYTES && (LB == 128 || LB == 64), "a box fills one staging buffer");
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const bool odd_g = (lane >> 2) & 1;
  constexpr bool read_c = READ_C;  // false (beta == 0): C is never read (NaN in C must not leak)
  uint8_t* buf = ebuf + (K & 1) * Cfg::E_BYTES;
  // Unswapped tiles: a pair's byte offset in the box is split into this thread's part, computed
  // once, and a compile-time part (fragment j, h), so that each pair costs one XOR and no swizzle
  // arithmetic. With line = line_rt + line_ct (line_ct a multiple of 8) and byte = byte_rt + byte_ct
  // (disjoint bits, byte_ct on whole 16-byte granules), kit::box_offset<128>(line, byte) =
  // line_ct * 128 + ((line_rt * 128 + (byte_rt ^ X)) ^ byte_ct), X = (line_rt % 8) << 4 the swizzle.
  // Written as (thread part; compile-time part), g = lane / 4, t = lane % 4:
  //   row-major C (pairs along the line): line = (warp*16 + g; h*8), byte = (2t*ES; ((8j) % IW)*ES);
  //   column-major C (after the trade):   line = (2t + odd_g; (8j) % OL),
  //                                       byte = (((warp*16 + (g & ~1)) % IW)*ES; h*8*ES).
  [[maybe_unused]] int split_rt = 0;
  if constexpr (!Cfg::SWAP) {
    static_assert(LB == 128, "unswapped boxes have 128-byte lines");
    const int g = lane >> 2, t = lane & 3;
    if constexpr (PAIRED) {
      split_rt = (warp * 16 + g) * LB + ((2 * t * ES) ^ ((g & 7) << 4));
    } else {
      const int lrt = 2 * t + (odd_g ? 1 : 0);
      split_rt = lrt * LB + ((((warp * 16 + (g & ~1)) % IW) * ES) ^ (lrt << 4));
    }
  }
  const uint32_t buf_s = ebuf_s + (K & 1) * Cfg::E_BYTES;
  // The box's first element: c0 along C's contiguous dimension, c1 along the other.
  const int c0 = C_COL ? row0 + (K % IC) * IW : n0 + K * Cfg::CW;
  const int c1 = C_COL ? n0 + (K / IC) * OL : row0;
  // A pair's values (times alpha; where the pair spans two lines, even g keeps e0 and takes its
  // neighbour's e0, next along the line, and odd g keeps e1 and takes its neighbour's e1) and its
  // byte offset in the box.
  auto pair_values = [&](int mi, int j, int h, float& v0, float& v1) {
    v0 = alpha * acc[mi][4 * j + 2 * h];
    v1 = alpha * acc[mi][4 * j + 2 * h + 1];
    if constexpr (!PAIRED) {
      const float got = __shfl_xor_sync(0xffffffffu, odd_g ? v0 : v1, 4);
      if (odd_g)
        v0 = got;
      else
        v1 = got;
    }
  };
  auto pair_offset = [&](int mi, int j, int h) {
    if constexpr (Cfg::SWAP) {
      int r, n, r1, n1;
      kit::fragment_coord<Cfg::SWAP>(mi, j, h, 0, warp, lane, r, n);
      kit::fragment_coord<Cfg::SWAP>(mi, j, h, 1, warp, lane, r1, n1);
      int line = C_COL ? n % OL : r, pos = C_COL ? r % IW : n % IW;
      if (!PAIRED && odd_g) {
        line = C_COL ? n1 % OL : r1;
        pos = (C_COL ? r1 % IW : n1 % IW) - 1;
      }
      return kit::box_offset<LB>(line, pos * ES);
    } else if constexpr (PAIRED) {
      return (split_rt ^ (((8 * j) % IW) * ES)) + h * 8 * LB;
    } else {
      return (split_rt ^ (h * 8 * ES)) + ((8 * j) % OL) * LB;
    }
  };
  // beta == 0 and 16-bit C: the pairs are converted and packed before the wait for the buffer below,
  // so that the conversion runs while the store of two boxes ago still reads it (that wait was the
  // epilogue's largest stall at 128x128).
  constexpr bool EARLY = !READ_C && sizeof(T) == 2;
  uint32_t packed[EARLY ? Cfg::MI * Cfg::ACC / 2 : 1];  // indexed by fragment: only the box's are live
  if constexpr (EARLY) {
#pragma unroll
    for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
      for (int j = 0; j < Cfg::ACC / 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!in_box<Cfg>(K, mi, j, warp)) continue;  // compile-time or warp-uniform
          float v0, v1;
          pair_values(mi, j, h, v0, v1);
          packed[(mi * (Cfg::ACC / 4) + j) * 2 + h] = dev::pack2<OBF16>(v0, v1);
        }
  }
  // The buffer was last used two boxes ago (an item of one box: one box ago): its store (or copy)
  // must have read it.
  if (tma && tid == 0) ptx::bulk_wait_group_read<Cfg::BOXES % 2 == 0 ? 1 : 0>();
  ptx::named_barrier_sync(3 + which, 128);
  if (read_c) {
    if (!tma) {
      copy_box<Cfg, true>(buf, p, c0, c1, warp, lane);
      ptx::named_barrier_sync(3 + which, 128);
    } else {
      tma_load_box<Cfg>(tm_c, buf_s, c0, c1, tid, c_bar, c_phase);
    }
  }
#pragma unroll
  for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
    for (int j = 0; j < Cfg::ACC / 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!in_box<Cfg>(K, mi, j, warp)) continue;  // compile-time or warp-uniform
        T* e0 = reinterpret_cast<T*>(buf + pair_offset(mi, j, h));
        if constexpr (EARLY) {
          *reinterpret_cast<uint32_t*>(e0) = packed[(mi * (Cfg::ACC / 4) + j) * 2 + h];
        } else {
          float v0, v1;
          pair_values(mi, j, h, v0, v1);
          if constexpr (read_c) {
            const float2 old = out_load2(e0, OBF16);
            v0 += p.beta * old.x;
            v1 += p.beta * old.y;
          }
          out_store2(e0, v0, v1, OBF16);
        }
      }
  if (!tma) {
    ptx::named_barrier_sync(3 + which, 128);
    copy_box<Cfg, false>(buf, p, c0, c1, warp, lane);
    return;
  }
  tma_store_box<Cfg>(tm_c, buf_s, c0, c1, tid, which);
}

template <class Cfg, bool READ_C, bool OBF16, int... K>
__device__ __forceinline__ void epilogue_boxes(std::integer_sequence<int, K...>, float (&acc)[Cfg::MI][Cfg::ACC],
                                               const Params& p, float alpha, const CUtensorMap* tm_c, int row0,
                                               int n0, int which, uint8_t* ebuf, uint32_t ebuf_s, uint32_t c_bar,
                                               uint32_t& c_phase, bool tma) {
  (epilogue_box<Cfg, K, READ_C, OBF16>(acc, p, alpha, tm_c, row0, n0, which, ebuf, ebuf_s, c_bar, c_phase, tma),
   ...);
}

// tma: C is TMA-aligned (Params::tma_store); else the boxes are copied by the threads (copy_box).
// beta != 0 and the 16-bit output dtype are chosen here, once per item (see epilogue_box).
template <class Cfg>
__device__ __forceinline__ void epilogue_boxed(float (&acc)[Cfg::MI][Cfg::ACC], const Params& p, float alpha,
                                               const CUtensorMap* tm_c, int row0, int n0, int which,
                                               uint8_t* ebuf, uint32_t ebuf_s, uint32_t c_bar, uint32_t& c_phase,
                                               bool tma) {
  auto boxes = [&](auto read_c, auto obf16) {
    epilogue_boxes<Cfg, decltype(read_c)::value, decltype(obf16)::value>(
        std::make_integer_sequence<int, Cfg::BOXES>{}, acc, p, alpha, tm_c, row0, n0, which, ebuf, ebuf_s, c_bar,
        c_phase, tma);
  };
  using T = std::true_type;
  using F = std::false_type;
  const bool read_c = p.beta != 0.f;
  if constexpr (sizeof(typename Cfg::TOut) == 4) {
    read_c ? boxes(T{}, F{}) : boxes(F{}, F{});
  } else if (read_c) {
    p.out_bf16 ? boxes(T{}, T{}) : boxes(T{}, F{});
  } else {
    p.out_bf16 ? boxes(F{}, T{}) : boxes(F{}, F{});
  }
}

// One accumulator pair (already times alpha) into C at tile coordinates (r, n) and (r1, n1): one
// 2-element access when the pair is adjacent and aligned, else element by element; beta * C added
// when beta != 0 (C is never read when beta == 0: NaN in C must not leak); columns past N skipped.
template <class Cfg>
__device__ __forceinline__ void store_pair(const Params& p, int row0, int n0, int r, int n, int r1, int n1, float v0,
                                           float v1) {
  using T = typename Cfg::TOut;
  T* c = static_cast<T*>(p.c);
  const bool read_c = p.beta != 0.f;
  const bool ok0 = n0 + n < p.n, ok1 = n0 + n1 < p.n;
  const int64_t off0 = int64_t(row0 + r) * p.c_rs + int64_t(n0 + n) * p.c_cs;
  const int64_t off1 = int64_t(row0 + r1) * p.c_rs + int64_t(n0 + n1) * p.c_cs;
  if (p.c_pairs && ok0 && ok1) {
    if (read_c) {
      const float2 old = out_load2(c + off0, p.out_bf16);
      v0 += p.beta * old.x;
      v1 += p.beta * old.y;
    }
    out_store2(c + off0, v0, v1, p.out_bf16);
  } else {
    if (ok0) out_store(c + off0, v0 + (read_c ? p.beta * out_load(c + off0, p.out_bf16) : 0.f), p.out_bf16);
    if (ok1) out_store(c + off1, v1 + (read_c ? p.beta * out_load(c + off1, p.out_bf16) : 0.f), p.out_bf16);
  }
}

// Split rows: a consumer's accumulators as float4 [MI * ACC / 4][128 threads] (thread-major, so
// a warp moves 512 contiguous bytes per access) in partial slot `slot` of this CTA and consumer.
template <class Cfg>
__device__ __forceinline__ float4* partial_slot(const Params& p, int slot, int rank, int which) {
  constexpr int NC = Cfg::COOP ? 2 : 1, V = Cfg::MI * Cfg::ACC / 4;
  const size_t base = (size_t(slot) * Cfg::CL + size_t(rank)) * NC + size_t(Cfg::COOP ? which : 0);
  return reinterpret_cast<float4*>(p.partials) + base * V * 128 + threadIdx.x % 128;
}

// A piece of a split item: its raw sums go to its slot (no alpha, no C).
template <class Cfg>
__device__ __forceinline__ void store_partial(float (&acc)[Cfg::MI][Cfg::ACC], const Params& p, int slot, int rank,
                                              int which) {
  float4* dst = partial_slot<Cfg>(p, slot, rank, which);
#pragma unroll
  for (int mi = 0; mi < Cfg::MI; ++mi)
#pragma unroll
    for (int i = 0; i < Cfg::ACC; i += 4)
      __stcg(dst + ((mi * Cfg::ACC + i) / 4) * 128,
             make_float4(acc[mi][i], acc[mi][i + 1], acc[mi][i + 2], acc[mi][i + 3]));
}

}  // namespace sparsek::dsd_sm90
