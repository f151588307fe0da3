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
//
// portable_config.cuh holds the tile configurations, portable_kernel.cuh the kernel; this file is
// the variant (why_not, prepare, run) and the launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/device.hpp"
#include "kernels/sm80/portable_kernel.cuh"
#include "plan/backends.hpp"
#include "plan/plan_internal.hpp"

namespace sparsek {
namespace {

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
