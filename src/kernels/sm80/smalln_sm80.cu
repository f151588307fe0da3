// Small-N DSD kernel (sm_80+): C = alpha * A * B + beta * C with A in BSR and N <= 128 — decode
// against block-pruned weights, a handful of tokens at a time. f16 / bf16 inputs, fp32
// accumulation, f16 / bf16 / f32 output; every block shape in {16, 32, 64, 128}^2; B and C row- or
// column-major with any leading dimension.
//
// At small N the product is bound by A's bytes (N FLOPs per byte of A), not by the tensor cores,
// so this is a streaming kernel, not a tile GEMM (docs/history/products.md "Small-N streaming DSD"):
//  - One CTA per unit: a block row, or a piece of a long one (src/plan/schedule.cpp
//    build_stream_schedule), times one N tile of 8 * NT columns (NT n8 tiles, NT in {1, 2, 4, 8};
//    N = 128 is two tiles, run by neighbouring CTAs so the second read of A hits L2).
//  - A unit's stored blocks are one contiguous span of A's values. Its K work is a stream of
//    16-deep steps (bk / 16 per block); the 4 warps share it: a warp owns TM m16 tiles of the
//    block row and every kgs-th step (kgs = 4 / warps along M). Each warp keeps D steps of loads
//    in flight in registers (A: 8-byte streaming loads, L2 evict-first; B: L1-cached loads of the
//    block's B panel, which is small and shared by many blocks), so a CTA keeps ~32 KB moving.
//  - mma.sync m16n8k16 with a permuted K: thread (g, t) of the fragment holds k = 4t .. 4t + 3 of
//    each 16-deep step (the hardware's k = 2t, 2t+1, 2t+8, 2t+9), so its A rows are one 8-byte
//    load each, and N tile i's fragment column g is B column NT * g + i, so a row-major B gives
//    each thread NT neighbouring columns in one load. Both are relabellings of the same sum.
//  - The k groups' sums are added in a fixed order through shared memory; a row cut into pieces
//    writes raw fp32 sums per piece and smalln_reduce adds them in K order (bit-identical runs,
//    no atomics).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "kernels/ptx/mma_sm80.cuh"
#include "plan/backends.hpp"
#include "plan/schedule.hpp"

namespace sparsek {
// Device side in a named namespace (members unused in one compilation pass would warn in an
// unnamed one).
namespace smalln {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMaxN = 128;     // the variant's domain: N tiles of at most 64 columns, at most two
constexpr int kColCap = 1024;  // stored blocks of one unit (column indices staged in shared memory)

// How B is read (chosen per run from its layout and alignment).
enum BMode : int {
  kRowVec = 0,  // row-major, NT neighbouring columns of a row per load (2 * NT bytes, aligned)
  kColVec = 1,  // k contiguous (column-major, or N = 1 with unit stride): 4 k per 8-byte load
  kScalar = 2,  // anything else: element by element
};

// Warp layout per N-tile width: TM m16 tiles per warp (accumulators: TM * NT * 4 floats per
// thread, at most 64), D steps of loads in flight per warp (register budget, checked by ptxas).
template <int NT, int MODE>
struct Cfg {
  static constexpr int TM = NT == 8 ? 2 : 4;
  static constexpr int TN = 8 * NT;                                  // columns per N tile
  static constexpr int BW = NT >= 2 ? NT / 2 : 1;                    // 32-bit words per B row load
  static constexpr int BREGS = MODE == kRowVec ? 4 * BW : MODE == kColVec ? 2 * NT : 4 * NT;
  static constexpr int STEP_REGS = 4 * TM + BREGS;
  static constexpr int D = STEP_REGS <= 24 ? 4 : STEP_REGS <= 32 ? 3 : 2;
  static_assert(TM * NT <= 16, "accumulators must stay at 64 registers per thread");
};

struct Params {
  const int4* units;  // {block row, first block, end block, partial slot or -1}; CTA b runs unit b / ntiles
  int ntiles;         // N tiles (CTA b runs tile b % ntiles)
  const int* col_idx;
  const uint16_t* vals;  // A values [nnzb][bm][bk]
  int bm, bk, lg_spb;    // lg_spb = log2(bk / 16): 16-deep steps per block
  const uint16_t* b;     // B(k, n) at b[k * b_ks + n * b_ns]
  int64_t b_ks, b_ns;
  void* c;               // C(m, n) at c[m * c_rs + n * c_cs]
  int64_t c_rs, c_cs;
  int c_dtype;           // DType of C
  int n;
  float alpha, beta;
  float* partials;       // split rows: [slot][N tile][bm][TN] raw fp32 sums
};

// One element of C (or of the partial tiles) in any output dtype.
__device__ __forceinline__ float load_out(const void* c, int64_t off, int dt) {
  if (dt == int(DType::f32)) return static_cast<const float*>(c)[off];
  if (dt == int(DType::f16)) return __half2float(static_cast<const __half*>(c)[off]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(c)[off]);
}
__device__ __forceinline__ void store_out(void* c, int64_t off, int dt, float v) {
  if (dt == int(DType::f32))
    static_cast<float*>(c)[off] = v;
  else if (dt == int(DType::f16))
    static_cast<__half*>(c)[off] = __float2half_rn(v);
  else
    static_cast<__nv_bfloat16*>(c)[off] = __float2bfloat16_rn(v);
}
// C(row, col) = alpha * sum + beta * C(row, col); C is never read when beta == 0 (NaN must not leak).
__device__ __forceinline__ void write_c(const Params& p, int64_t row, int col, float sum) {
  const int64_t off = row * p.c_rs + int64_t(col) * p.c_cs;
  float v = p.alpha * sum;
  if (p.beta != 0.f) v += p.beta * load_out(p.c, off, p.c_dtype);
  store_out(p.c, off, p.c_dtype, v);
}

// The registers of one 16-deep step: A rows g and g + 8 of each m16 tile (k = 4t .. 4t + 3, two
// f16x2 words each) and the raw B loads (packed into fragments only at use, after they landed).
template <int NT, int MODE>
struct Step {
  uint2 a[Cfg<NT, MODE>::TM][2];
  uint32_t b[Cfg<NT, MODE>::BREGS];
};

// Where a warp's loads come from. Step s of a unit: block j = s >> lg_spb, depth q = s & (spb - 1).
struct Cursor {
  const uint16_t* a;  // this thread's first A element: row 16 * (first m tile) + g, k = 4t
  int64_t a_block;    // elements per block (bm * bk)
  int bk, lg_spb, tm;
  const int* cols;    // the unit's column indices (shared memory)
  const uint16_t* b;
  int64_t b_ks, b_ns;
  int n_first, n;     // this thread's first B column (n0 + NT * g), N
  int t;
};

template <int NT, int MODE>
__device__ __forceinline__ void load_a(Step<NT, MODE>& st, const Cursor& cu, int s) {
  const int j = s >> cu.lg_spb, q = s & ((1 << cu.lg_spb) - 1);
  const uint16_t* a = cu.a + j * cu.a_block + 16 * q;
#pragma unroll
  for (int m = 0; m < Cfg<NT, MODE>::TM; ++m)
    if (m < cu.tm) {
      // Streamed once: evict-first, so B keeps its place in L1 and L2.
      st.a[m][0] = __ldcs(reinterpret_cast<const uint2*>(a + int64_t(16 * m) * cu.bk));
      st.a[m][1] = __ldcs(reinterpret_cast<const uint2*>(a + int64_t(16 * m + 8) * cu.bk));
    }
}

template <int NT, int MODE>
__device__ __forceinline__ void load_b(Step<NT, MODE>& st, const Cursor& cu, int s) {
  const int j = s >> cu.lg_spb, q = s & ((1 << cu.lg_spb) - 1);
  const int64_t k0 = int64_t(cu.cols[j]) * cu.bk + 16 * q + 4 * cu.t;  // rows k0 .. k0 + 3 of B
  if constexpr (MODE == kRowVec) {
    // Row k0 + e, columns n_first .. n_first + NT - 1 (all inside N, or all outside: N % NT == 0).
    const bool in = cu.n_first < cu.n;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint16_t* src = cu.b + (k0 + e) * cu.b_ks + cu.n_first;
      if constexpr (NT == 1) {
        st.b[e] = in ? uint32_t(__ldg(src)) : 0u;
      } else if constexpr (NT == 2) {
        st.b[e] = in ? __ldg(reinterpret_cast<const unsigned int*>(src)) : 0u;
      } else if constexpr (NT == 4) {
        const uint2 v = in ? __ldg(reinterpret_cast<const uint2*>(src)) : make_uint2(0, 0);
        st.b[2 * e] = v.x;
        st.b[2 * e + 1] = v.y;
      } else {
        const uint4 v = in ? __ldg(reinterpret_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
        st.b[4 * e] = v.x;
        st.b[4 * e + 1] = v.y;
        st.b[4 * e + 2] = v.z;
        st.b[4 * e + 3] = v.w;
      }
    }
  } else if constexpr (MODE == kColVec) {
    // Column n_first + i, rows k0 .. k0 + 3: one 8-byte load, already the fragment's two words.
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const uint2 v = cu.n_first + i < cu.n
                          ? __ldg(reinterpret_cast<const uint2*>(cu.b + int64_t(cu.n_first + i) * cu.b_ns + k0))
                          : make_uint2(0, 0);
      st.b[2 * i] = v.x;
      st.b[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int i = 0; i < NT; ++i)
        st.b[e * NT + i] =
            cu.n_first + i < cu.n ? uint32_t(__ldg(cu.b + (k0 + e) * cu.b_ks + int64_t(cu.n_first + i) * cu.b_ns)) : 0u;
  }
}

// The fragment registers of N tile i: b0 = B(k0, k0 + 1), b1 = B(k0 + 2, k0 + 3) of its column.
template <int NT, int MODE>
__device__ __forceinline__ void b_frag(const Step<NT, MODE>& st, int i, uint32_t& b0, uint32_t& b1) {
  if constexpr (MODE == kRowVec) {
    constexpr int BW = Cfg<NT, MODE>::BW;
    const int w = NT == 1 ? 0 : i / 2;
    const unsigned sel = NT == 1 || i % 2 == 0 ? 0x5410u : 0x7632u;  // low or high halves of two words
    b0 = __byte_perm(st.b[0 * BW + w], st.b[1 * BW + w], sel);
    b1 = __byte_perm(st.b[2 * BW + w], st.b[3 * BW + w], sel);
  } else if constexpr (MODE == kColVec) {
    b0 = st.b[2 * i];
    b1 = st.b[2 * i + 1];
  } else {
    b0 = __byte_perm(st.b[0 * NT + i], st.b[1 * NT + i], 0x5410u);
    b1 = __byte_perm(st.b[2 * NT + i], st.b[3 * NT + i], 0x5410u);
  }
}

template <class T, int NT, int MODE>
__device__ __forceinline__ void mma_step(float (&acc)[Cfg<NT, MODE>::TM][NT][4], const Step<NT, MODE>& st, int tm) {
  uint32_t b0[NT], b1[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) b_frag<NT, MODE>(st, i, b0[i], b1[i]);
#pragma unroll
  for (int m = 0; m < Cfg<NT, MODE>::TM; ++m)
    if (m < tm) {
      // a0 = row g (k 4t, 4t+1), a1 = row g + 8, a2 = row g (k 4t+2, 4t+3), a3 = row g + 8
      const uint32_t a[4] = {st.a[m][0].x, st.a[m][1].x, st.a[m][0].y, st.a[m][1].y};
#pragma unroll
      for (int i = 0; i < NT; ++i) ptx::mma_16816<T>(acc[m][i], a, b0[i], b1[i]);
    }
}

template <class T, int NT, int MODE>
__global__ void __launch_bounds__(kThreads) smalln_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using C = Cfg<NT, MODE>;
  constexpr int TM = C::TM, D = C::D;
  __shared__ int s_col[kColCap];
  __shared__ float4 s_red[kWarps - 1][TM * NT][32];  // the k groups' sums (kg >= 1), lane-major
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int4 u = p.units[blockIdx.x / unsigned(p.ntiles)];
  const int tile = int(blockIdx.x % unsigned(p.ntiles)), n0 = tile * C::TN;
  // Warps along M (mw, each TM m16 tiles, or all of a small block) x k groups (kgs).
  const int mts = p.bm / 16, tm = min(mts, TM), mw = mts / tm, kgs = kWarps / mw;
  const int mgrp = warp % mw, kg = warp / mw;
  const int nblk = u.z - u.y, steps = nblk << p.lg_spb;
  const int mine = steps > kg ? (steps - kg + kgs - 1) / kgs : 0;  // steps kg, kg + kgs, ...

  Cursor cu;
  cu.a_block = int64_t(p.bm) * p.bk;
  cu.a = p.vals + int64_t(u.y) * cu.a_block + int64_t(16 * mgrp * tm + g) * p.bk + 4 * t;
  cu.bk = p.bk;
  cu.lg_spb = p.lg_spb;
  cu.tm = tm;
  cu.cols = s_col;
  cu.b = p.b;
  cu.b_ks = p.b_ks;
  cu.b_ns = p.b_ns;
  cu.n_first = n0 + NT * g;
  cu.n = p.n;
  cu.t = t;

  float acc[TM][NT][4];
#pragma unroll
  for (int m = 0; m < TM; ++m)
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[m][i][r] = 0.f;

  // Prologue: A needs no column index, so its first D steps are in flight before the unit's
  // column indices are staged; B follows once they are.
  Step<NT, MODE> buf[D];
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < mine) load_a<NT, MODE>(buf[d], cu, kg + d * kgs);
  for (int i = int(threadIdx.x); i < nblk; i += kThreads) s_col[i] = __ldg(p.col_idx + u.y + i);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < mine) load_b<NT, MODE>(buf[d], cu, kg + d * kgs);
  // Steady state: the math of step i, then the loads of step i + D into the same registers.
  for (int base = 0; base < mine; base += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int i = base + d;
      if (i < mine) {
        mma_step<T, NT, MODE>(acc, buf[d], tm);
        if (i + D < mine) {
          load_a<NT, MODE>(buf[d], cu, kg + (i + D) * kgs);
          load_b<NT, MODE>(buf[d], cu, kg + (i + D) * kgs);
        }
      }
    }
  }

  // k groups 1.. hand their sums to k group 0, which adds them in group order (deterministic).
  if (kgs > 1) {
    if (kg > 0)
#pragma unroll
      for (int m = 0; m < TM; ++m)
#pragma unroll
        for (int i = 0; i < NT; ++i)
          s_red[(kg - 1) * mw + mgrp][m * NT + i][lane] =
              make_float4(acc[m][i][0], acc[m][i][1], acc[m][i][2], acc[m][i][3]);
    __syncthreads();
    if (kg == 0)
      for (int k = 1; k < kgs; ++k)
#pragma unroll
        for (int m = 0; m < TM; ++m)
#pragma unroll
          for (int i = 0; i < NT; ++i) {
            const float4 v = s_red[(k - 1) * mw + mgrp][m * NT + i][lane];
            acc[m][i][0] += v.x;
            acc[m][i][1] += v.y;
            acc[m][i][2] += v.z;
            acc[m][i][3] += v.w;
          }
  }
  if (kg != 0) return;
  // Accumulator r of (m, i): row 16 * m-tile + g + 8 * (r / 2), column n0 + NT * (2t + r % 2) + i.
#pragma unroll
  for (int m = 0; m < TM; ++m) {
    if (m >= tm) continue;
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = 16 * (mgrp * tm + m) + g + 8 * (r / 2), col = n0 + NT * (2 * t + r % 2) + i;
        if (u.w >= 0)  // a piece of a split row: raw sums to its slot
          p.partials[((int64_t(u.w) * p.ntiles + tile) * p.bm + row) * C::TN + (col - n0)] = acc[m][i][r];
        else if (col < p.n)
          write_c(p, int64_t(u.x) * p.bm + row, col, acc[m][i][r]);
      }
  }
#endif
}

// Split rows, second launch: C = alpha * (sum of the row's piece slots, in K order) + beta * C.
// One thread per element; group {block row, first slot, slots, 0}.
__global__ void smalln_reduce(const int4* groups, int ngroups, int tn, const Params p) {
  const int64_t per_group = int64_t(p.ntiles) * p.bm * tn, total = per_group * ngroups;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int4 gr = groups[idx / per_group];
    const int64_t rest = idx % per_group;  // (tile, row, column) inside the group
    const int tile = int(rest / (int64_t(p.bm) * tn)), row = int(rest / tn % p.bm), c = int(rest % tn);
    const int col = tile * tn + c;
    if (col >= p.n) continue;
    float sum = 0.f;
    for (int k = 0; k < gr.z; ++k)
      sum += p.partials[((int64_t(gr.y + k) * p.ntiles + tile) * p.bm + row) * tn + c];
    write_c(p, int64_t(gr.x) * p.bm + row, col, sum);
  }
}

}  // namespace smalln

// ---------------------------------------------------------------------------------------------
// Host side: the variant "smalln".

namespace {
using namespace smalln;

int nt_for(int64_t n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }

struct SmallNState final : VariantState {
  // What the schedule was built for (run() checks it).
  int64_t mb = 0, n = 0, nnzb = 0;
  int bm = 0, bk = 0;
  int nunits = 0, ngroups = 0;
  int4* units = nullptr;
  int4* groups = nullptr;
  float* partials = nullptr;
  size_t bytes = 0;
  size_t workspace_bytes() const override { return bytes; }
  ~SmallNState() override {
    // NOTE: cudaFree waits for the device, so a launch still reading these is safe.
    for (void* q : {static_cast<void*>(units), static_cast<void*>(groups), static_cast<void*>(partials)})
      if (q) cudaFree(q);
  }
};

using KernelFn = void (*)(Params);
template <class T, int NT>
KernelFn kernel_mode(int mode) {
  switch (mode) {
    case kRowVec: return &smalln_kernel<T, NT, kRowVec>;
    case kColVec: return &smalln_kernel<T, NT, kColVec>;
    default: return &smalln_kernel<T, NT, kScalar>;
  }
}
template <class T>
KernelFn kernel_nt(int nt, int mode) {
  switch (nt) {
    case 1: return kernel_mode<T, 1>(mode);
    case 2: return kernel_mode<T, 2>(mode);
    case 4: return kernel_mode<T, 4>(mode);
    default: return kernel_mode<T, 8>(mode);
  }
}
KernelFn kernel_for(DType in, int nt, int mode) {
  return in == DType::bf16 ? kernel_nt<__nv_bfloat16>(nt, mode) : kernel_nt<__half>(nt, mode);
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
bool block_dim(int d) { return d == 16 || d == 32 || d == 64 || d == 128; }

std::string why_not_smalln(const GemmArgs& g) {
  if (g.kind != OpKind::dsd) return std::string("runs dsd only, not ") + to_string(g.kind);
  if (g.op != Op::none) return "op(A) = trans is not supported (A is streamed as stored)";
  const BsrView& a = g.sparse;
  if (a.dtype != DType::f16 && a.dtype != DType::bf16)
    return std::string("needs f16 or bf16 inputs, got ") + to_string(a.dtype);
  if (!block_dim(a.bm)) return "bm=" + std::to_string(a.bm) + " not in {16, 32, 64, 128}";
  if (!block_dim(a.bk)) return "bk=" + std::to_string(a.bk) + " not in {16, 32, 64, 128}";
  if (a.memory != Memory::device || g.b.memory != Memory::device || g.c.memory != Memory::device)
    return "operands must be in device memory";
  if (g.b.cols > kMaxN) return "N=" + std::to_string(g.b.cols) + " is above " + std::to_string(kMaxN) + " (small N only)";
  if (a.nnzb > 0 && !aligned(a.values, 8))
    return "A values must be 8-byte aligned (address % 8 = " +
           std::to_string(reinterpret_cast<uintptr_t>(a.values) % 8) + ")";
  if (a.mb() > INT32_MAX / 2 || a.nnzb > INT32_MAX) return "more than 2^30 block rows or 2^31 stored blocks";
  const DeviceInfo& d = device_info();
  if (!d.available) return "no CUDA device: " + d.why_not;
  if (d.cc_major < 8)
    return "needs compute capability 8.0+ (device " + d.name + " is " + std::to_string(d.cc_major) + "." +
           std::to_string(d.cc_minor) + ")";
  return "";
}

// Copies a host vector into a new device allocation and counts its bytes.
template <class T>
void upload(const std::vector<T>& v, T** dst, size_t& bytes) {
  check_cuda(cudaMalloc(dst, v.size() * sizeof(T)), "cudaMalloc(smalln schedule)");
  check_cuda(cudaMemcpy(*dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy(smalln schedule)");
  bytes += v.size() * sizeof(T);
}

std::unique_ptr<VariantState> prepare_smalln(const GemmArgs& g, const Options&) {
  const BsrView& a = g.sparse;
  auto st = std::make_unique<SmallNState>();
  st->mb = a.mb();
  st->n = g.b.cols;
  st->nnzb = a.nnzb;
  st->bm = a.bm;
  st->bk = a.bk;
  std::vector<int32_t> row_ptr(size_t(st->mb + 1), 0);
  if (st->mb > 0)
    check_cuda(cudaMemcpy(row_ptr.data(), a.row_ptr, row_ptr.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
               "cudaMemcpy(row_ptr)");
  // A piece of at least 32 KB of A: below that a CTA's start-up outweighs its streaming.
  const int block_bytes = a.bm * a.bk * 2;
  const StreamSchedule s =
      build_stream_schedule(row_ptr, device_info().sm_count, std::max(1, 32768 / block_bytes), kColCap);
  const int nt = nt_for(st->n), ntiles = int((st->n + 8 * nt - 1) / (8 * nt));
  if (int64_t(s.units.size()) * std::max(1, ntiles) > INT32_MAX)
    throw Error(Status::unsupported, "smalln: too many work units for one launch");
  st->nunits = int(s.units.size());
  st->ngroups = int(s.groups.size());
  if (st->nunits > 0) upload(s.units, &st->units, st->bytes);
  if (st->ngroups > 0) {
    upload(s.groups, &st->groups, st->bytes);
    const size_t pbytes = size_t(s.slots) * size_t(ntiles) * size_t(a.bm) * size_t(8 * nt) * sizeof(float);
    check_cuda(cudaMalloc(&st->partials, pbytes), "cudaMalloc(smalln split-row partials)");
    st->bytes += pbytes;
  }
  return st;
}

void run_smalln(const GemmArgs& g, const Options& o, VariantState* state) {
  auto* st = dynamic_cast<SmallNState*>(state);
  const BsrView& a = g.sparse;
  if (!st || st->mb != a.mb() || st->n != g.b.cols || st->nnzb != a.nnzb || st->bm != a.bm || st->bk != a.bk)
    throw Error(Status::internal, "smalln: run() got a state prepared for another shape or pattern");
  const int64_t N = g.b.cols;
  if (st->nunits == 0 || N == 0) return;
  const int nt = nt_for(N), tn = 8 * nt, ntiles = int((N + tn - 1) / tn);
  Params p{};
  p.units = st->units;
  p.ntiles = ntiles;
  p.col_idx = a.col_idx;
  p.vals = static_cast<const uint16_t*>(a.values);
  p.bm = a.bm;
  p.bk = a.bk;
  p.lg_spb = a.bk == 16 ? 0 : a.bk == 32 ? 1 : a.bk == 64 ? 2 : 3;
  p.b = static_cast<const uint16_t*>(g.b.data);
  const bool b_row = g.b.layout == Layout::row_major;
  p.b_ks = b_row ? g.b.ld : 1;
  p.b_ns = b_row ? 1 : g.b.ld;
  if (N == 1) p.b_ns = 0;  // one column: only k moves (a unit-stride row-major vector is k-contiguous)
  int mode = kScalar;
  if (p.b_ks == 1 && aligned(p.b, 8) && p.b_ns % 4 == 0)
    mode = kColVec;
  else if (p.b_ns == 1 && p.b_ks % nt == 0 && N % nt == 0 && aligned(p.b, size_t(2 * nt)))
    mode = kRowVec;
  p.c = g.c.data;
  const bool c_row = g.c.layout == Layout::row_major;
  p.c_rs = c_row ? g.c.ld : 1;
  p.c_cs = c_row ? 1 : g.c.ld;
  p.c_dtype = int(g.c.dtype);
  p.n = int(N);
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.partials = st->partials;
  cudaStream_t stream = static_cast<cudaStream_t>(o.stream);
  kernel_for(a.dtype, nt, mode)<<<unsigned(st->nunits) * unsigned(ntiles), kThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "smalln_kernel launch");
  if (st->ngroups > 0) {
    const int64_t total = int64_t(st->ngroups) * ntiles * a.bm * tn;
    const int blocks = int(std::min<int64_t>((total + 255) / 256, int64_t(device_info().sm_count) * 8));
    smalln_reduce<<<blocks, 256, 0, stream>>>(st->groups, st->ngroups, tn, p);
    check_cuda(cudaGetLastError(), "smalln_reduce launch");
  }
}

}  // namespace

std::vector<Variant> smalln_variants() {
  return {Variant{"smalln", Backend::cuda, false, &why_not_smalln, &prepare_smalln, &run_smalln}};
}

}  // namespace sparsek
