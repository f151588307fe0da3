// Portable tensor-core kernels (sm_80+): the fallback for every CUDA problem the faster variants
// do not take. cp.async multi-stage pipeline -> ldmatrix -> mma.sync m16n8k16, f32 accumulation.
//
//   DSD  C = alpha * op(A) * B + beta * C      one CTA per (block row of op(A), BN-column tile)
//   DDS  C = alpha * A * op(B) + beta * C      run as DSD on the transposes: C^T = op(B)^T * A^T
//   SDD  Cblk = alpha * A[rows] * B[:, cols] + beta * Cblk   one CTA per (stored block of C, BN columns)
//
// One kernel template serves all three. Its K loop walks a "K stream" of 16-deep slices: for DSD
// the slices of the row's stored blocks one after another (a block of depth bk gives bk/16 slices),
// for SDD the dense K. A pipeline stage holds KC of K (KC / 16 slices), so one stage may hold
// several blocks when bk < KC. Shared-memory tiles keep the global contiguous dimension
// contiguous; ldmatrix.trans turns the M/N-contiguous ones (op(A) = A^T, row-major B) into
// fragments, so no layout needs a copy.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/device.hpp"
#include "kernels/ptx/mma_sm80.cuh"
#include "plan/backends.hpp"
#include "plan/plan_internal.hpp"

namespace sparsek {
namespace {

using ptx::cp_async_16;
using ptx::smem_addr;

constexpr int kThreads = 256;  // 8 warps

// Tile configuration per block height BM (= the CTA's rows): output columns per CTA (BN), warp
// grid (WARPS_M x 8 / WARPS_M), K per pipeline stage (KC, a multiple of the 16-deep slice),
// pipeline depth (STAGES), block indices staged per segment (IDX_CAP) and the CTAs per SM the
// register budget aims at (MIN_CTAS, for __launch_bounds__). Chosen by measurement on an H100
// (bench/portable_configs.sh, docs/history/products.md): BM <= 64 gains most from 256-column tiles (more
// mma per loader instruction, half the CTAs paying the prologue); BM = 128 from 64-deep stages
// (half the barriers) while 3 x 32 KB stages still leave room for 2 CTAs per SM. All stay within
// 99 KB of shared memory so that sm_86/sm_89 run them too.
template <int BM>
struct Config;
template <>
struct Config<16> {
  static constexpr int BN = 256, WARPS_M = 1, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2;
};
template <>
struct Config<32> {
  static constexpr int BN = 256, WARPS_M = 1, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2;
};
template <>
struct Config<64> {
  static constexpr int BN = 256, WARPS_M = 2, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2;
};
template <>
struct Config<128> {
  static constexpr int BN = 128, WARPS_M = 2, KC = 64, STAGES = 3, IDX_CAP = 256, MIN_CTAS = 2;
};

// Smallest number of column passes (1, 2, 4, 8) in which the epilogue's f32 output tile, padded
// by 4 floats per row, fits in `bytes` of shared memory in either orientation.
constexpr int epilogue_passes(int bm, int bn, int bytes) {
  int p = 1;
  while (p < 8 && ((bm * (bn / p + 4) * 4 > bytes) || ((bn / p) * (bm + 4) * 4 > bytes))) p *= 2;
  return p;
}

template <int BM>
struct Tile {
  using C = Config<BM>;
  static constexpr int BN = C::BN, KC = C::KC, STAGES = C::STAGES, IDX_CAP = C::IDX_CAP;
  static constexpr int SLICES = KC / 16;  // a slice: 16 of K from one block (the smallest block depth)
  static constexpr int WARPS_M = C::WARPS_M, WARPS_N = (kThreads / 32) / WARPS_M;
  static constexpr int WM = BM / WARPS_M;  // warp tile
  static constexpr int WN = BN / WARPS_N;
  static constexpr int MI = WM / 16;  // m16 fragments per warp
  static constexpr int NI = WN / 8;   // n8 fragments per warp
  static constexpr int A_BYTES = BM * KC * 2;
  static constexpr int B_BYTES = BN * KC * 2;
  static constexpr int SMEM = STAGES * (A_BYTES + B_BYTES) + 2 * IDX_CAP * 4;
  // The epilogue reuses all of it for the f32 output tile, BNP columns at a time.
  static constexpr int C_PASSES = epilogue_passes(BM, BN, SMEM), BNP = BN / C_PASSES;
  static_assert(KC % 16 == 0 && STAGES >= 2, "a stage holds whole 16-deep slices");
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must hold whole m16 fragments and n16 pairs");
  static_assert(SMEM <= 99 * 1024, "sm_86/sm_89 allow at most 99 KB of shared memory per block");
  static_assert(BM * (BNP + 4) * 4 <= SMEM && BNP * (BM + 4) * 4 <= SMEM && BNP % WN == 0,
                "each epilogue pass holds whole warp tiles");
};

// Output columns per CTA for a run-time block height.
int bn_for(int bm) {
  switch (bm) {
    case 16: return Tile<16>::BN;
    case 32: return Tile<32>::BN;
    case 64: return Tile<64>::BN;
    default: return Tile<128>::BN;
  }
}

// Byte offset of 16-byte chunk `c` of row `r` in a tile whose rows are ROW_BYTES long. The chunk
// index is XOR-swizzled with the row so that the 8 row addresses of one ldmatrix matrix (8
// consecutive rows, same logical chunk) fall into 8 different 16-byte bank groups.
template <int ROW_BYTES>
__device__ __forceinline__ int swz(int r, int c) {
  constexpr int CPR = ROW_BYTES / 16;                 // chunks per row
  constexpr int RPL = CPR >= 8 ? 1 : 8 / CPR;         // rows per 128-byte line
  constexpr int MASK = (CPR >= 8 ? 8 : CPR) - 1;
  return r * ROW_BYTES + ((c ^ ((r / RPL) & MASK)) << 4);
}

// v[i] for a run-time i without a stack frame (an indexed register array would go to local memory).
template <typename V, int N>
__device__ __forceinline__ V pick(const V (&v)[N], int i) {
  V x = v[0];
#pragma unroll
  for (int s = 1; s < N; ++s)
    if (i == s) x = v[s];
  return x;
}

// How the CTA's threads copy a (ROWS, ROW_BYTES) shared tile in 16-byte chunks: thread tid takes
// chunk c = tid % CPR of rows r0 + it * RPI, it < IT (consecutive threads on consecutive chunks
// of a row: coalesced global reads).
template <int ROW_BYTES, int ROWS>
struct LoadMap {
  static constexpr int CPR = ROW_BYTES / 16;  // chunks per row
  static constexpr int RPI = kThreads / CPR;  // rows per pass
  static constexpr int IT = (ROWS + RPI - 1) / RPI;
  static_assert(kThreads % CPR == 0 && (RPI % 16 == 0 || RPI == 8), "a pass covers whole or half 16-row slices");
  static_assert(IT <= 32, "b_rows_ok holds one bit per pass");
  // A pass moves RPI rows down, a multiple of swz's 8-row period, so the swizzled offset of pass
  // it is the first pass's plus it * RPI rows.
  int r0, c, soff0;
  // NOTE: r0 is masked to [0, RPI) (true for tid < kThreads) so that the compiler can fold
  // r0 / 16 when RPI == 16.
  __device__ __forceinline__ explicit LoadMap(int tid)
      : r0((tid / CPR) & (RPI - 1)), c(tid % CPR), soff0(swz<ROW_BYTES>(r0, c)) {}
  __device__ __forceinline__ bool active(int it) const { return ROWS % RPI == 0 || r0 + it * RPI < ROWS; }
  __device__ __forceinline__ int soff(int it) const { return soff0 + it * RPI * ROW_BYTES; }
  // In a K-row (M/N-major) tile: the 16-row slice of pass it, and its row inside the slice.
  __device__ __forceinline__ int slice(int it) const { return (r0 + it * RPI) / 16; }
  __device__ __forceinline__ int slice_row(int it) const {
    if constexpr (RPI % 16 == 0) return r0 & 15;  // the same row in every pass
    else return r0 + (it & 1) * 8;                // RPI == 8, r0 < 8
  }
};

// The unaligned-source path of load_chunk: element loads, synchronous. Kept out of line so the
// pipeline's main loop stays small. Its shared stores are published by the same __syncthreads
// that publishes the cp.async data.
__device__ __noinline__ void load_chunk_slow(uint8_t* dst, const uint16_t* src, int valid) {
  uint16_t v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = e < valid ? src[e] : uint16_t(0);
  uint4 u;
  std::memcpy(&u, v, 16);
  *reinterpret_cast<uint4*>(dst) = u;
}

// One 16-byte chunk (8 elements) of a tile: `valid` (0..8) elements are read, the rest are zeros.
// vec: the source is 16-byte aligned (cp.async), else element loads. With valid == 0 nothing is
// read, so src may point anywhere (past the end of a row or matrix).
__device__ __forceinline__ void load_chunk(uint8_t* dst, const uint16_t* src, int valid, bool vec) {
  if (vec) cp_async_16(smem_addr(dst), src, valid * 2);
  else load_chunk_slow(dst, src, valid);
}

__device__ __forceinline__ int clamp8(int64_t n) { return n <= 0 ? 0 : n >= 8 ? 8 : int(n); }
__device__ __forceinline__ int dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

struct Params {
  // DSD: the sparse operand in its effective orientation (op applied). row_ptr/col describe
  // op(A)'s block rows; perm maps a stored position to its block in `vals` (nullptr = identity).
  // SDD: row_ptr/col are C's pattern.
  const int32_t* row_ptr = nullptr;
  const int32_t* col = nullptr;
  const int32_t* perm = nullptr;
  const uint16_t* vals = nullptr;  // [nnzb][bm][bk] as stored (A's orientation before op)
  int bk_eff = 0;                  // depth of op(A)'s blocks
  int log2_slices = 0;             // log2(bk_eff / 16)
  // SDD: dense A (M x K), C's block width and block-row count.
  const uint16_t* a = nullptr;
  int64_t lda = 0;
  int bk = 0;
  int64_t mb = 0;
  // Dense B (K x N) and the output (C dense for DSD, C's values for SDD).
  const uint16_t* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_row_major = true;
  DType c_dtype = DType::f32;
  int64_t N = 0, K = 0;
  float alpha = 1.f, beta = 0.f;
  bool vec_a = true, vec_b = true;  // 16-byte aligned sources (cp.async), else element loads
  bool vec_c = true;                // 4 consecutive output elements form one aligned access
};

// Output element access in the output's dtype (f32 math).
__device__ __forceinline__ float load1(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void store1(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}
// Four neighbours i..i+3 in one access (p + i aligned to 4 elements).
__device__ __forceinline__ float4 load4(const void* p, DType t, int64_t i) {
  if (t == DType::f32) return *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
  const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
  float2 lo, hi;
  if (t == DType::f16) {
    lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  } else {
    lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  }
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void store4(void* p, DType t, int64_t i, float4 v) {
  if (t == DType::f32) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = v;
    return;
  }
  uint2 u;
  if (t == DType::f16) {
    *reinterpret_cast<__half2*>(&u.x) = __floats2half2_rn(v.x, v.y);
    *reinterpret_cast<__half2*>(&u.y) = __floats2half2_rn(v.z, v.w);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(&u.x) = __floats2bfloat162_rn(v.x, v.y);
    *reinterpret_cast<__nv_bfloat162*>(&u.y) = __floats2bfloat162_rn(v.z, v.w);
  }
  *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p) + i) = u;
}

// Writes the CTA's f32 tile from shared memory: out[o * ldo + i] = alpha * t + beta * out, with
// i the output's contiguous index (< inner_valid) and o the other (< outer_valid). Four
// consecutive i per thread, consecutive threads along i: every warp store is contiguous.
template <int OUTER, int INNER>
__device__ __forceinline__ void write_tile(const float* tile, const Params& p, float alpha, void* out, int64_t ldo,
                                           int outer_valid, int inner_valid) {
  constexpr int LD = INNER + 4;  // tile row stride (floats)
  const bool read_c = p.beta != 0.f;  // beta == 0: C is never read (NaN in C must not leak)
  for (int g = threadIdx.x; g < OUTER * INNER / 4; g += kThreads) {
    const int o = g / (INNER / 4), i = (g % (INNER / 4)) * 4;
    if (o >= outer_valid || i >= inner_valid) continue;
    float4 v = *reinterpret_cast<const float4*>(tile + o * LD + i);
    v.x *= alpha, v.y *= alpha, v.z *= alpha, v.w *= alpha;
    const int64_t off = int64_t(o) * ldo + i;
    if (p.vec_c && i + 4 <= inner_valid) {
      if (read_c) {
        const float4 old = load4(out, p.c_dtype, off);
        v.x += p.beta * old.x, v.y += p.beta * old.y, v.z += p.beta * old.z, v.w += p.beta * old.w;
      }
      store4(out, p.c_dtype, off, v);
    } else {
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (i + k < inner_valid)
          store1(out, p.c_dtype, off + k, e[k] + (read_c ? p.beta * load1(out, p.c_dtype, off + k) : 0.f));
    }
  }
}

// The kernel. BM: op(A)'s block height (DSD) or C's (SDD). T: __half or __nv_bfloat16.
// A_KMAJOR: the A tile is K-contiguous in memory (DSD op none; SDD A row-major), else
// M-contiguous (DSD op trans; SDD A column-major). B_KMAJOR: B is column-major.
template <int BM, typename T, bool A_KMAJOR, bool B_KMAJOR, bool SDD>
__global__ void __launch_bounds__(kThreads, Config<BM>::MIN_CTAS) portable_kernel(const Params p) {
  using G = Tile<BM>;
  constexpr int BN = G::BN, KC = G::KC, kStages = G::STAGES, kSlices = G::SLICES, kIdxCap = G::IDX_CAP;
  // Tile shapes in shared memory, per stage (rows x row bytes):
  //   A: K-major (BM, KC*2) | M-major (KC, BM*2)      B: K-major (BN, KC*2) | N-major (KC, BN*2)
  constexpr int A_ROW = A_KMAJOR ? KC * 2 : BM * 2, A_ROWS = A_KMAJOR ? BM : KC;
  constexpr int B_ROW = B_KMAJOR ? KC * 2 : BN * 2, B_ROWS = B_KMAJOR ? BN : KC;
  using LA = LoadMap<A_ROW, A_ROWS>;
  using LB = LoadMap<B_ROW, B_ROWS>;

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sA = smem;                                   // [kStages][A_BYTES]
  uint8_t* sB = smem + kStages * G::A_BYTES;            // [kStages][B_BYTES]
  int32_t* sCol = reinterpret_cast<int32_t*>(sB + kStages * G::B_BYTES);  // [kIdxCap]
  int32_t* sPerm = sCol + kIdxCap;                                          // [kIdxCap]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __builtin_assume(tid < kThreads);
  const int wm = warp / G::WARPS_N, wn = warp % G::WARPS_N;
  const int n0 = blockIdx.y * BN;  // first output column of the tile (within C or C's block)
  const LA la(tid);
  const LB lb(tid);

  // ---- the work item ----
  int64_t row0;                // first output row (DSD: of C; SDD: of A and C, block row * bm)
  int nvalid;                  // valid output columns in this tile
  int nblk = 0, jb = 0;        // DSD: the row's stored blocks and the first one's position
  int64_t blk = 0, bcol0 = 0;  // SDD: the stored block and its first column in B
  if constexpr (!SDD) {
    const int i = blockIdx.x;
    row0 = int64_t(i) * BM;
    nvalid = p.N - n0 < BN ? int(p.N - n0) : BN;
    jb = p.row_ptr[i];
    nblk = p.row_ptr[i + 1] - jb;
  } else {
    blk = blockIdx.x;
    // Block row of the stored block: the last i with row_ptr[i] <= blk.
    int64_t lo = 0, hi = p.mb;  // row_ptr[lo] <= blk < row_ptr[hi]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (p.row_ptr[mid] <= blk) lo = mid; else hi = mid;
    }
    row0 = lo * BM;
    bcol0 = int64_t(p.col[blk]) * p.bk + n0;
    nvalid = p.bk - n0 < BN ? p.bk - n0 : BN;
  }

  // ---- per-thread loader constants (hoisted out of the K loop) ----
  // DSD: offsets inside a slice; SDD: offsets from the tile's origin (k0 added per stage).
  int a_off;                 // A element offset of the thread's chunk (first pass)
  int64_t b_off;             // B element offset of the thread's chunk (first pass)
  // N tail: the valid elements of the thread's chunk (N-contiguous B), or whether the N row of
  // pass it is in range (bit it; K-contiguous B).
  int b_valid = 8;
  uint32_t b_rows_ok = ~0u;
  if constexpr (!SDD) {
    a_off = A_KMAJOR ? la.r0 * p.bk_eff + (la.c & 1) * 8 : la.slice_row(0) * BM + la.c * 8;
    b_off = B_KMAJOR ? int64_t(lb.r0) * p.ldb + (lb.c & 1) * 8 : int64_t(lb.slice_row(0)) * p.ldb + lb.c * 8;
  } else {
    a_off = 0;  // SDD offsets are 64-bit and computed per pass below
    b_off = 0;
  }
  if constexpr (B_KMAJOR) {
#pragma unroll
    for (int it = 0; it < LB::IT; ++it)
      if (lb.r0 + it * LB::RPI >= nvalid) b_rows_ok &= ~(1u << it);
  } else {
    b_valid = clamp8(nvalid - lb.c * 8);
  }

  // ---- producer: one stage of A and B into buffer `buf` ----
  // DSD: the stage's K is kSlices 16-deep slices of the row's stored blocks (from position j0,
  // indices staged in sCol/sPerm), nslices of them valid; SDD: K columns step * KC ...
  auto load_stage = [&](int step, int buf, int j0, int nslices) {
    uint8_t* a_s = sA + buf * G::A_BYTES;
    uint8_t* b_s = sB + buf * G::B_BYTES;
    if constexpr (!SDD) {
      // Where each slice starts: A at its 16 of K inside the value block, B at the slice's first
      // K row and column n0.
      const uint16_t* sa[kSlices];
      const uint16_t* sb[kSlices];
      bool ok[kSlices];
#pragma unroll
      for (int s = 0; s < kSlices; ++s) {
        const int sl = step * kSlices + s;
        ok[s] = sl < nslices;
        const int bi = ok[s] ? sl >> p.log2_slices : 0, koff = (sl & ((1 << p.log2_slices) - 1)) * 16;
        const int j = A_KMAJOR ? j0 + bi : sPerm[bi];  // op trans reads blocks through perm
        const int64_t brow = int64_t(sCol[bi]) * p.bk_eff + koff;
        sa[s] = p.vals + int64_t(j) * BM * p.bk_eff + (A_KMAJOR ? koff : koff * BM);
        sb[s] = B_KMAJOR ? p.b + int64_t(n0) * p.ldb + brow : p.b + brow * p.ldb + n0;
      }
#pragma unroll
      for (int it = 0; it < LA::IT; ++it) {
        if (!la.active(it)) break;
        // K-major: the chunk column names the slice (2 chunks each); M-major: the row (16 each).
        const int s = A_KMAJOR ? la.c / 2 : la.slice(it);
        const bool v = pick(ok, s);
        const uint16_t* src =
            pick(sa, s) + a_off + (A_KMAJOR ? it * LA::RPI * p.bk_eff : (la.slice_row(it) - la.slice_row(0)) * BM);
        load_chunk(a_s + la.soff(it), src, v ? 8 : 0, p.vec_a);
      }
#pragma unroll
      for (int it = 0; it < LB::IT; ++it) {
        const int s = B_KMAJOR ? lb.c / 2 : lb.slice(it);
        const int v = pick(ok, s) ? (B_KMAJOR ? ((b_rows_ok >> it) & 1) * 8 : b_valid) : 0;
        const uint16_t* src = pick(sb, s) + b_off +
                              (B_KMAJOR ? it * LB::RPI * p.ldb : (lb.slice_row(it) - lb.slice_row(0)) * p.ldb);
        load_chunk(b_s + lb.soff(it), src, v, p.vec_b);
      }
    } else {
      const int64_t k0 = int64_t(step) * KC;
#pragma unroll
      for (int it = 0; it < LA::IT; ++it) {
        if (!la.active(it)) break;
        const int r = la.r0 + it * LA::RPI;
        if constexpr (A_KMAJOR) {  // A row-major: row row0 + r, K columns k0 + 8c ..
          const int v = clamp8(p.K - k0 - la.c * 8);
          const uint16_t* src = p.a + (row0 + r) * p.lda + k0 + la.c * 8;
          load_chunk(a_s + la.soff(it), src, v, p.vec_a);
        } else {  // A column-major: K row k0 + r, rows row0 + 8c ..
          const int v = k0 + r < p.K ? 8 : 0;
          const uint16_t* src = p.a + (k0 + r) * p.lda + row0 + la.c * 8;
          load_chunk(a_s + la.soff(it), src, v, p.vec_a);
        }
      }
#pragma unroll
      for (int it = 0; it < LB::IT; ++it) {
        const int r = lb.r0 + it * LB::RPI;
        if constexpr (B_KMAJOR) {  // B column-major: column bcol0 + r, K rows k0 + 8c ..
          const int v = (b_rows_ok >> it) & 1 ? clamp8(p.K - k0 - lb.c * 8) : 0;
          const uint16_t* src = p.b + (bcol0 + r) * p.ldb + k0 + lb.c * 8;
          load_chunk(b_s + lb.soff(it), src, v, p.vec_b);
        } else {  // B row-major: K row k0 + r, columns bcol0 + 8c ..
          const int v = k0 + r < p.K ? b_valid : 0;
          const uint16_t* src = p.b + (k0 + r) * p.ldb + bcol0 + lb.c * 8;
          load_chunk(b_s + lb.soff(it), src, v, p.vec_b);
        }
      }
    }
  };

  // acc: (MI x 16, NI x 8) per warp, 4 f32 per m16n8 fragment
  float acc[G::MI][G::NI][4];
#pragma unroll
  for (int mi = 0; mi < G::MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < G::NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

  // Warps whose columns all lie past the valid ones (N tails, narrow SDD blocks) skip the math.
  const bool warp_active = wn * G::WN < nvalid;
  const int li = lane >> 3, lr = lane & 7;  // ldmatrix: matrix index, row within it

  // ---- consumer: one stage from buffer `buf` into acc ----
  auto mma_stage = [&](int buf) {
    const uint32_t a_s = smem_addr(sA + buf * G::A_BYTES);
    const uint32_t b_s = smem_addr(sB + buf * G::B_BYTES);
#pragma unroll
    for (int kk = 0; kk < KC; kk += 16) {
      uint32_t af[G::MI][4], bf[G::NI][2];
#pragma unroll
      for (int mi = 0; mi < G::MI; ++mi) {
        const int m = wm * G::WM + mi * 16;
        if constexpr (A_KMAJOR)  // matrices (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) (m8-15,k8-15)
          ptx::ldmatrix_x4(af[mi], a_s + swz<A_ROW>(m + (lane & 15), kk / 8 + (lane >> 4)));
        else  // the same matrices read from K-rows, transposed
          ptx::ldmatrix_x4_trans(af[mi], a_s + swz<A_ROW>(kk + lr + (li >> 1) * 8, m / 8 + (li & 1)));
      }
#pragma unroll
      for (int ni = 0; ni < G::NI; ni += 2) {
        const int n = wn * G::WN + ni * 8;
        uint32_t r[4];  // b0,b1 of n-fragment ni, then of ni+1
        if constexpr (B_KMAJOR)
          ptx::ldmatrix_x4(r, b_s + swz<B_ROW>(n + lr + (li >> 1) * 8, kk / 8 + (li & 1)));
        else
          ptx::ldmatrix_x4_trans(r, b_s + swz<B_ROW>(kk + lr + (li & 1) * 8, n / 8 + (li >> 1)));
        bf[ni][0] = r[0], bf[ni][1] = r[1], bf[ni + 1][0] = r[2], bf[ni + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < G::MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < G::NI; ++ni) ptx::mma_16816<T>(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
  };

  // ---- pipeline: kStages - 1 stages in flight while one is consumed ----
  auto run_pipeline = [&](int nsteps, int j0, int nslices) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < nsteps) load_stage(s, s, j0, nslices);
      ptx::cp_async_commit();
    }
    for (int step = 0; step < nsteps; ++step) {
      ptx::cp_async_wait<kStages - 2>();
      // Publishes stage `step` and retires every warp's reads of the buffer refilled next.
      __syncthreads();
      if (step + kStages - 1 < nsteps)
        load_stage(step + kStages - 1, (step + kStages - 1) % kStages, j0, nslices);
      ptx::cp_async_commit();
      if (warp_active) mma_stage(step % kStages);
    }
    ptx::cp_async_wait<0>();
  };

  if constexpr (!SDD) {
    // The row's block indices go to shared memory first (a global load feeding every cp.async
    // address would sit on the pipeline's critical path), kIdxCap at a time.
    for (int seg = 0; seg < nblk; seg += kIdxCap) {
      const int n = nblk - seg < kIdxCap ? nblk - seg : kIdxCap;
      __syncthreads();  // the previous segment is done with sCol/sPerm and the buffers
      for (int t = tid; t < n; t += kThreads) {
        sCol[t] = p.col[jb + seg + t];
        if (!A_KMAJOR) sPerm[t] = p.perm[jb + seg + t];
      }
      __syncthreads();
      const int nslices = n << p.log2_slices;
      run_pipeline((nslices + kSlices - 1) / kSlices, jb + seg, nslices);
    }
  } else {
    run_pipeline(int((p.K + KC - 1) / KC), 0, 0);
  }
  __syncthreads();  // every warp is done with the pipeline buffers: reuse them for the output

  // ---- epilogue: acc -> shared f32 tile laid out like the output (its contiguous index
  // inner), then coalesced out = alpha * acc + beta * out; BNP columns per pass ----
  float* tile = reinterpret_cast<float*>(smem);
  const bool col_major = !SDD && !p.c_row_major;  // tile (BNP, BM + 4) instead of (BM, BNP + 4)
  const int es = dtype_bytes(p.c_dtype);
  // out(r, c) of this CTA's tile: C's block (bm, bk) row-major for SDD, else C at (row0, n0).
  uint8_t* out = static_cast<uint8_t*>(p.c) +
                 (SDD ? blk * BM * p.bk + n0 : col_major ? int64_t(n0) * p.ldc + row0 : row0 * p.ldc + n0) * es;
  const int64_t ldo = SDD ? p.bk : p.ldc;
  // An output with no product terms (a block row with no stored block, SDD with K = 0) is beta * C
  // whatever alpha is: alpha = +-Inf or NaN times the empty sum would make it NaN.
  const float alpha = (SDD ? p.K == 0 : nblk == 0) ? 0.f : p.alpha;
#pragma unroll
  for (int pass = 0; pass < G::C_PASSES; ++pass) {
    const int c0 = pass * G::BNP;  // first column of the pass
    if (c0 >= nvalid) break;
    if (pass > 0) __syncthreads();  // the previous pass has read the tile
    if (warp_active && wn * G::WN / G::BNP == pass) {
      const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
      for (int mi = 0; mi < G::MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < G::NI; ++ni)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = wm * G::WM + mi * 16 + g + h * 8, c = wn * G::WN + ni * 8 + t4 * 2 - c0;
            const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
            if (col_major) {
              tile[c * (BM + 4) + r] = v0;
              tile[(c + 1) * (BM + 4) + r] = v1;
            } else {
              *reinterpret_cast<float2*>(tile + r * (G::BNP + 4) + c) = make_float2(v0, v1);
            }
          }
    }
    __syncthreads();
    const int ncols = nvalid - c0 < G::BNP ? nvalid - c0 : G::BNP;
    if (col_major) write_tile<G::BNP, BM>(tile, p, alpha, out + int64_t(c0) * ldo * es, ldo, ncols, BM);
    else write_tile<BM, G::BNP>(tile, p, alpha, out + int64_t(c0) * es, ldo, BM, ncols);
  }
}

// ---- host side ----

bool is_block_dim(int d) { return d == 16 || d == 32 || d == 64 || d == 128; }
int log2i(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}
bool aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// The pattern of A^T on the device: block rows of A^T (= block columns of A), the block row of A
// each entry came from (its column in A^T), and its position in A's values.
struct TransposedPattern : VariantState {
  int32_t* row_ptr = nullptr;  // [kb + 1]
  int32_t* col = nullptr;      // [nnzb]
  int32_t* perm = nullptr;     // [nnzb]
  size_t bytes = 0;
  size_t workspace_bytes() const override { return bytes; }
  ~TransposedPattern() override {
    cudaFree(row_ptr);
    cudaFree(col);
    cudaFree(perm);
  }
};

// DSD runs on op(A) = A^T when asked (dsd, trans), and DDS with op none becomes a DSD on B^T.
bool needs_transpose(const GemmArgs& g) { return g.kind != OpKind::sdd && as_dsd(g).op == Op::trans; }

// NOTE: a kernel may use more than 48 KB of dynamic shared memory only after a per-kernel,
// per-device opt-in. It is done for every instantiation at once, on first use per device (from
// prepare(), i.e. plan(), so that run() makes no such call inside a CUDA-graph capture).
template <int BM, typename T, bool AK, bool BK, bool SDD>
void opt_in_smem() {
  check_cuda(cudaFuncSetAttribute(portable_kernel<BM, T, AK, BK, SDD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Tile<BM>::SMEM),
             "cudaFuncSetAttribute(portable_kernel, max dynamic shared memory)");
}
template <typename T, bool AK, bool BK, bool SDD>
void opt_in_smem_all_bm() {
  opt_in_smem<16, T, AK, BK, SDD>();
  opt_in_smem<32, T, AK, BK, SDD>();
  opt_in_smem<64, T, AK, BK, SDD>();
  opt_in_smem<128, T, AK, BK, SDD>();
}
template <typename T, bool SDD>
void opt_in_smem_all_layouts() {
  opt_in_smem_all_bm<T, true, true, SDD>();
  opt_in_smem_all_bm<T, true, false, SDD>();
  opt_in_smem_all_bm<T, false, true, SDD>();
  opt_in_smem_all_bm<T, false, false, SDD>();
}
void ensure_smem_opt_in() {
  static std::atomic<uint64_t> done{0};  // bit d: device d is set up (devices >= 64: every time)
  static std::mutex mu;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return;
  std::lock_guard<std::mutex> lock(mu);
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return;
  opt_in_smem_all_layouts<__half, false>();
  opt_in_smem_all_layouts<__half, true>();
  opt_in_smem_all_layouts<__nv_bfloat16, false>();
  opt_in_smem_all_layouts<__nv_bfloat16, true>();
  done.fetch_or(bit, std::memory_order_release);
}

std::unique_ptr<VariantState> prepare_portable(const GemmArgs& g, const Options&) {
  ensure_smem_opt_in();
  if (!needs_transpose(g)) return nullptr;
  const PatternTranspose t = transposed_pattern(g.sparse);
  auto st = std::make_unique<TransposedPattern>();
  auto upload = [](int32_t*& dst, const std::vector<int32_t>& v, const char* what) {
    check_cuda(cudaMalloc(&dst, std::max<size_t>(v.size(), 1) * 4), what);
    if (!v.empty()) check_cuda(cudaMemcpy(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice), what);
  };
  upload(st->row_ptr, t.row_ptr, "cudaMalloc/cudaMemcpy(transposed row_ptr)");
  upload(st->col, t.col_idx, "cudaMalloc/cudaMemcpy(transposed col_idx)");
  upload(st->perm, t.src, "cudaMalloc/cudaMemcpy(transposed permutation)");
  st->bytes = (t.row_ptr.size() + t.col_idx.size() + t.src.size()) * 4;
  return st;
}

// grid: (work items, column tiles of `ncols`).
template <int BM, typename T, bool AK, bool BK, bool SDD>
void launch(const Params& p, unsigned items, int64_t ncols, cudaStream_t stream) {
  const dim3 grid(items, unsigned((ncols + Tile<BM>::BN - 1) / Tile<BM>::BN));
  portable_kernel<BM, T, AK, BK, SDD><<<grid, kThreads, Tile<BM>::SMEM, stream>>>(p);
  check_cuda(cudaGetLastError(), "portable_kernel launch");
}

// Runtime -> compile-time: block height, dtype, the two operand orientations, DSD or SDD.
template <typename T, bool AK, bool BK, bool SDD>
void launch_bm(int bm, const Params& p, unsigned items, int64_t ncols, cudaStream_t s) {
  switch (bm) {
    case 16: return launch<16, T, AK, BK, SDD>(p, items, ncols, s);
    case 32: return launch<32, T, AK, BK, SDD>(p, items, ncols, s);
    case 64: return launch<64, T, AK, BK, SDD>(p, items, ncols, s);
    case 128: return launch<128, T, AK, BK, SDD>(p, items, ncols, s);
  }
  throw Error(Status::internal, "portable: block height " + std::to_string(bm) + " has no kernel");
}
template <bool SDD>
void dispatch(DType in, bool a_kmajor, bool b_kmajor, int bm, const Params& p, unsigned items, int64_t ncols,
              cudaStream_t s) {
  auto go = [&](auto t) {
    using T = decltype(t);
    if (a_kmajor && b_kmajor) return launch_bm<T, true, true, SDD>(bm, p, items, ncols, s);
    if (a_kmajor) return launch_bm<T, true, false, SDD>(bm, p, items, ncols, s);
    if (b_kmajor) return launch_bm<T, false, true, SDD>(bm, p, items, ncols, s);
    return launch_bm<T, false, false, SDD>(bm, p, items, ncols, s);
  };
  if (in == DType::f16) go(__half{});
  else go(__nv_bfloat16{});
}

constexpr int64_t kMaxGridY = 65535;

void run_portable(const GemmArgs& g, const Options& o, VariantState* state) {
  ensure_smem_opt_in();  // no CUDA call once prepare() has run on this device
  cudaStream_t stream = static_cast<cudaStream_t>(o.stream);
  const BsrView& s = g.sparse;
  Params p;
  p.alpha = g.alpha;
  p.beta = g.beta;
  if (g.kind == OpKind::sdd) {
    const int64_t M = g.m(), K = g.k();
    if (s.nnzb == 0 || M == 0) return;
    p.row_ptr = s.row_ptr;
    p.col = s.col_idx;
    p.a = static_cast<const uint16_t*>(g.a.data);
    p.lda = g.a.ld;
    p.b = static_cast<const uint16_t*>(g.b.data);
    p.ldb = g.b.ld;
    p.c = s.values;
    p.c_dtype = s.dtype;
    p.bk = s.bk;
    p.mb = s.mb();
    p.N = g.n();
    p.K = K;
    p.vec_a = aligned(p.a, 16) && p.lda % 8 == 0;
    p.vec_b = aligned(p.b, 16) && p.ldb % 8 == 0;
    p.vec_c = aligned(p.c, 4 * dtype_size(s.dtype));  // bk % 4 == 0: every row stays aligned
    dispatch<true>(g.a.dtype, g.a.layout == Layout::row_major, g.b.layout == Layout::col_major, s.bm, p,
                   unsigned(s.nnzb), s.bk, stream);
    return;
  }
  // DSD on (op(A), B, C); DDS as DSD on (op(B)^T, A^T, C^T) (as_dsd: only the views change).
  const GemmArgs d = as_dsd(g);
  const DenseView &B = d.b, &C = d.c;
  const bool trans = needs_transpose(g);
  const int bm_eff = trans ? s.bk : s.bm, bk_eff = trans ? s.bm : s.bk;
  const int64_t mb_eff = trans ? s.kb() : s.mb();
  if (mb_eff == 0 || C.cols == 0) return;
  if (trans) {
    auto* t = dynamic_cast<TransposedPattern*>(state);
    if (!t) throw Error(Status::internal, "portable: op(A) = A^T needs the transposed pattern from prepare()");
    p.row_ptr = t->row_ptr;
    p.col = t->col;
    p.perm = t->perm;
  } else {
    p.row_ptr = s.row_ptr;
    p.col = s.col_idx;
  }
  p.vals = static_cast<const uint16_t*>(s.values);
  p.bk_eff = bk_eff;
  p.log2_slices = log2i(bk_eff / 16);
  p.b = static_cast<const uint16_t*>(B.data);
  p.ldb = B.ld;
  p.c = C.data;
  p.ldc = C.ld;
  p.c_row_major = C.layout == Layout::row_major;
  p.c_dtype = C.dtype;
  p.N = C.cols;
  p.K = B.rows;
  p.vec_a = aligned(p.vals, 16);
  p.vec_b = aligned(p.b, 16) && p.ldb % 8 == 0;
  p.vec_c = aligned(p.c, 4 * dtype_size(C.dtype)) && p.ldc % 4 == 0;
  dispatch<false>(s.dtype, !trans, B.layout == Layout::col_major, bm_eff, p, unsigned(mb_eff), C.cols, stream);
}

// Whether the current GPU can run this file's kernels: SASS built for it, or PTX (compute_80 by
// default) that the driver JIT-compiles on a GPU newer than every SASS target.
bool has_code_for_device() {
  static const bool yes = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, &portable_kernel<64, __half, false, false, false>) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return true;
  }();
  return yes;
}

std::string why_not_portable(const GemmArgs& g) {
  const BsrView& s = g.sparse;
  if (s.memory != Memory::device) return "operands are in host memory (the portable kernel runs on the GPU)";
  const DType in = g.kind == OpKind::sdd ? g.a.dtype : s.dtype;
  if (in == DType::f32) return "f32 inputs: tensor-core variants need f16/bf16";
  if (in != DType::f16 && in != DType::bf16) return std::string("needs f16 or bf16 inputs, got ") + to_string(in);
  if (!is_block_dim(s.bm)) return "bm=" + std::to_string(s.bm) + " not in {16,32,64,128}";
  if (!is_block_dim(s.bk)) return "bk=" + std::to_string(s.bk) + " not in {16,32,64,128}";
  if (g.kind != OpKind::sdd) {
    const int64_t n = g.kind == OpKind::dsd ? g.n() : g.m();  // DDS runs as DSD on C^T
    const int bn = bn_for(needs_transpose(g) ? s.bk : s.bm);  // by op(A)'s block height (DSD view)
    if ((n + bn - 1) / bn > kMaxGridY)
      return "N=" + std::to_string(n) + " exceeds the grid limit (" + std::to_string(kMaxGridY * bn) + ")";
  }
  if (s.nnzb > INT32_MAX) return "nnzb=" + std::to_string(s.nnzb) + " exceeds int32";
  const DeviceInfo& d = device_info();
  if (!d.available) return "no CUDA device: " + d.why_not;
  if (d.cc_major < 8)
    return "needs compute capability 8.0+ (device " + d.name + " is " + std::to_string(d.cc_major) + "." +
           std::to_string(d.cc_minor) + ")";
  if (!has_code_for_device())
    return "this build holds no code for compute capability " + std::to_string(d.cc_major) + "." +
           std::to_string(d.cc_minor) + " (no SASS for it and no PTX: configure with -DSPARSEK_CUDA_PTX=80)";
  return "";
}

}  // namespace

std::vector<Variant> portable_variants() {
  return {Variant{"portable", Backend::cuda, false, &why_not_portable, &prepare_portable, &run_portable}};
}

}  // namespace sparsek
