// Peers as variants: cuSPARSE SpMM on BSR (BSR_ALG1), cuSPARSE SpMM on Blocked-ELL
// (BLOCKED_ELL_ALG1, uniform rows and square blocks only), cuSPARSE SDDMM on a BSR C, and cuBLAS
// GEMM on the densified sparse operand (SDD: the whole dense product, then C's blocks gathered), and
// cuBLAS strided-batched GEMM over the experts of a block-diagonal A.
// DDS runs as the DSD on the transposes (as_dsd: C^T = op(B)^T * A^T, only the views change), so
// the SpMM peers take it where that DSD is untransposed. They are benchmarked beside sparsek's
// kernels and are tuner candidates, never the default.
//
// Pattern work (copies of the indices, descriptors, buffers, library handles) happens in
// prepare(); run() only touches values: it converts them (gather / scatter kernels below) and
// calls the library. See peers.hpp for the convert/core split the benchmark uses.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "kernels/peers/peers.hpp"
#include "plan/backends.hpp"
#include "plan/plan_internal.hpp"

namespace sparsek {
namespace peers {

// ---------------------------------------------------------------------------------------------
// Errors and versions

void check_cusparse(int status, const char* what) {
  if (status == CUSPARSE_STATUS_SUCCESS) return;
  auto st = static_cast<cusparseStatus_t>(status);
  std::string msg = std::string(what) + " failed: " + cusparseGetErrorName(st) + " (" + cusparseGetErrorString(st) + ")";
  throw Error(st == CUSPARSE_STATUS_NOT_SUPPORTED ? Status::unsupported : Status::cuda_error, msg);
}

void check_cublas(int status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  auto st = static_cast<cublasStatus_t>(status);
  std::string msg = std::string(what) + " failed: " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")";
  throw Error(st == CUBLAS_STATUS_NOT_SUPPORTED ? Status::unsupported : Status::cuda_error, msg);
}

namespace {
std::string version_of(int (*get)(libraryPropertyType, int*)) {
  int a = 0, b = 0, c = 0;
  if (get(MAJOR_VERSION, &a) || get(MINOR_VERSION, &b) || get(PATCH_LEVEL, &c)) return "";
  return std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c);
}
int cublas_prop(libraryPropertyType t, int* v) { return int(cublasGetProperty(t, v)); }
int cusparse_prop(libraryPropertyType t, int* v) { return int(cusparseGetProperty(t, v)); }
}  // namespace

std::string cublas_version() { return version_of(&cublas_prop); }
std::string cusparse_version() { return version_of(&cusparse_prop); }

// ---------------------------------------------------------------------------------------------
// Kernels (values-only work of run())

namespace {

// Copies stored block j (bm x bk, row-major, `vals` = [nnzb][bm][bk]) into a row-major 2-D
// destination at block position (row_block(j), col_block(j)) with leading dimension ld:
//   densify:  row_block = block_row[j], col_block = col_idx[j], ld = cols      (dense A)
//   ELL:      row_block = j / slots,    col_block = j % slots,   ld = slots*bk (Blocked-ELL values)
// One CTA per block; 16-byte vectors (bk * elem >= 32 bytes and every row start is 16-byte
// aligned: values are 16-byte aligned (validated) and ld * elem is a multiple of 32).
__global__ void place_blocks(const uint4* __restrict__ vals, uint4* __restrict__ dst, int64_t nnzb,
                             const int32_t* __restrict__ block_row, const int32_t* __restrict__ col_idx,
                             int slots, int bm, int vec_per_row, int64_t ld_vec) {
  for (int64_t j = blockIdx.x; j < nnzb; j += gridDim.x) {
    int64_t rb = block_row ? block_row[j] : j / slots;
    int64_t cb = col_idx ? col_idx[j] : j % slots;
    const uint4* src = vals + j * int64_t(bm) * vec_per_row;
    uint4* out = dst + rb * bm * ld_vec + cb * vec_per_row;
    for (int t = threadIdx.x; t < bm * vec_per_row; t += blockDim.x) {
      int r = t / vec_per_row, c = t % vec_per_row;
      out[r * ld_vec + c] = src[t];
    }
  }
}

// NOTE: inline: for an explicit specialization of a __device__ template, nvcc's host pass emits
// a stub with default visibility, which libsparsek would export.
template <typename T> __device__ float to_f(T v);
template <> __device__ inline float to_f<float>(float v) { return v; }
template <> __device__ inline float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ inline float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ T from_f(float v);
template <> __device__ inline float from_f<float>(float v) { return v; }
template <> __device__ inline __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// C = beta * C over a (major x minor) array with leading dimension ld; beta = 0 never reads C.
template <typename T>
__global__ void scale_matrix(T* c, int64_t major, int64_t minor, int64_t ld, float beta) {
  int64_t n = major * minor;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / minor, col = i % minor;
    T* p = c + r * ld + col;
    *p = beta == 0.f ? from_f<T>(0.f) : from_f<T>(beta * to_f<T>(*p));
  }
}

// SDD through a dense product: block j of C (bm x bk, row-major in `vals`) = alpha * D[its rows,
// its columns] + beta * block (beta = 0 never reads it); D is row-major with ldd columns.
template <typename T>
__global__ void gather_blocks(const float* __restrict__ d, int64_t ldd, T* vals, int64_t nnzb,
                              const int32_t* __restrict__ block_row, const int32_t* __restrict__ col_idx, int bm,
                              int bk, float alpha, float beta) {
  for (int64_t j = blockIdx.x; j < nnzb; j += gridDim.x) {
    const float* src = d + int64_t(block_row[j]) * bm * ldd + int64_t(col_idx[j]) * bk;
    T* dst = vals + j * bm * bk;
    for (int t = threadIdx.x; t < bm * bk; t += blockDim.x) {
      const float v = alpha * src[int64_t(t / bk) * ldd + t % bk];
      dst[t] = beta == 0.f ? from_f<T>(v) : from_f<T>(v + beta * to_f<T>(dst[t]));
    }
  }
}

int grid_for(int64_t work, int per) {
  int64_t g = (work + per - 1) / per;
  return int(g < 1 ? 1 : (g > 65535 * 8 ? 65535 * 8 : g));
}

void scale_c(const DenseView& c, float beta, cudaStream_t s) {
  int64_t major = c.layout == Layout::row_major ? c.rows : c.cols;
  int64_t minor = c.layout == Layout::row_major ? c.cols : c.rows;
  if (major == 0 || minor == 0) return;
  int grid = grid_for(major * minor, 256);
  switch (c.dtype) {
    case DType::f32: scale_matrix<<<grid, 256, 0, s>>>(static_cast<float*>(c.data), major, minor, c.ld, beta); break;
    case DType::f16: scale_matrix<<<grid, 256, 0, s>>>(static_cast<__half*>(c.data), major, minor, c.ld, beta); break;
    case DType::bf16:
      scale_matrix<<<grid, 256, 0, s>>>(static_cast<__nv_bfloat16*>(c.data), major, minor, c.ld, beta);
      break;
  }
  check_cuda(cudaGetLastError(), "scale_matrix launch");
}

// NOTE: cuSPARSE does not promise to leave C unread when beta = 0, and our semantics say NaN in C
// must not leak; zero C first (a cheap memset next to the product).
void zero_c(const DenseView& c, cudaStream_t s) {
  int64_t major = c.layout == Layout::row_major ? c.rows : c.cols;
  int64_t minor = c.layout == Layout::row_major ? c.cols : c.rows;
  if (major == 0 || minor == 0) return;
  size_t es = dtype_size(c.dtype);
  check_cuda(cudaMemset2DAsync(c.data, size_t(c.ld) * es, 0, size_t(minor) * es, size_t(major), s),
             "cudaMemset2DAsync(C)");
}

cudaDataType cuda_type(DType d) {
  switch (d) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// ---------------------------------------------------------------------------------------------
// Support checks shared by the three peers

// Device memory, a type combination the libraries take, int32 extents. DSD and DDS are checked
// as the DSD the peers run (as_dsd).
std::string common_why_not(const GemmArgs& args) {
  const GemmArgs g = as_dsd(args);
  if (g.sparse.memory != Memory::device) return "needs device memory (operands are in host memory)";
  const bool sdd = g.kind == OpKind::sdd;
  const DType in = sdd ? g.a.dtype : g.sparse.dtype, out = sdd ? g.sparse.dtype : g.c.dtype;
  if (in == DType::e4m3) return "needs f16, bf16 or f32 inputs, got e4m3 (the libraries' sparse products have no fp8 form)";
  if (in != DType::f32 && out != DType::f32 && out != in)
    return std::string("output ") + to_string(out) + " with " + to_string(in) +
           " inputs is not a cuSPARSE/cuBLAS type combination (use " + to_string(in) + " or f32)";
  const int64_t lim = INT_MAX;
  if (g.m() > lim || g.n() > lim || g.k() > lim || g.a.ld > lim || g.b.ld > lim || g.c.ld > lim)
    return "a dimension or leading dimension exceeds int32 (library limit)";
  return "";
}

std::vector<int32_t> copy_to_host(const int32_t* p, int64_t n, Memory mem) {
  std::vector<int32_t> h(static_cast<size_t>(n));
  if (n == 0) return h;
  if (mem == Memory::host) {
    for (int64_t i = 0; i < n; ++i) h[size_t(i)] = p[i];
  } else {
    check_cuda(cudaMemcpy(h.data(), p, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy(pattern)");
  }
  return h;
}

// A device buffer owned by a state.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  void alloc(size_t n, const char* what) {
    bytes = n;
    if (n == 0) return;
    check_cuda(cudaMalloc(&p, n), what);
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  template <typename T> T* as() const { return static_cast<T*>(p); }
};

int32_t* upload(DevBuf& buf, const std::vector<int32_t>& h, const char* what) {
  buf.alloc(h.size() * sizeof(int32_t), what);
  if (!h.empty()) check_cuda(cudaMemcpy(buf.p, h.data(), h.size() * sizeof(int32_t), cudaMemcpyHostToDevice), what);
  return buf.as<int32_t>();
}

void launch_place(const GemmArgs& g, void* dst, const int32_t* block_row, const int32_t* col_idx, int slots,
                  int64_t ld_elems, cudaStream_t s) {
  const BsrView& a = g.sparse;
  if (a.nnzb == 0) return;
  size_t es = dtype_size(a.dtype);
  int vec_per_row = int(a.bk * es / 16);
  int64_t ld_vec = int64_t(ld_elems * es / 16);
  int grid = int(a.nnzb < 65535 * 4 ? a.nnzb : 65535 * 4);
  place_blocks<<<grid, 256, 0, s>>>(static_cast<const uint4*>(a.values), static_cast<uint4*>(dst), a.nnzb, block_row,
                                    col_idx, slots, a.bm, vec_per_row, ld_vec);
  check_cuda(cudaGetLastError(), "place_blocks launch");
}

// ---------------------------------------------------------------------------------------------
// cuSPARSE (BSR and Blocked-ELL share everything but the matrix descriptor)

struct CusparseState : peers::PeerState {
  bool ell = false;
  cusparseHandle_t handle = nullptr;
  cusparseSpMatDescr_t mat = nullptr;
  cusparseDnMatDescr_t b = nullptr, c = nullptr;
  DevBuf row_ptr, col_idx, ell_values, buffer;
  int slots = 0;  // ELL: blocks per block row
  bool empty = false;  // nnzb = 0 or an empty extent: no library call, C = beta * C

  ~CusparseState() override {
    if (mat) cusparseDestroySpMat(mat);
    if (b) cusparseDestroyDnMat(b);
    if (c) cusparseDestroyDnMat(c);
    if (handle) cusparseDestroy(handle);
  }

  void convert(const GemmArgs& args, void* stream) override {
    const GemmArgs g = as_dsd(args);
    auto s = static_cast<cudaStream_t>(stream);
    if (empty) return;
    if (g.beta == 0.f) zero_c(g.c, s);
    if (ell) launch_place(g, ell_values.p, nullptr, nullptr, slots, int64_t(slots) * g.sparse.bk, s);
  }

  void core(const GemmArgs& args, void* stream) override {
    const GemmArgs g = as_dsd(args);
    auto s = static_cast<cudaStream_t>(stream);
    if (empty) {
      scale_c(g.c, g.beta, s);
      return;
    }
    check_cusparse(cusparseSetStream(handle, s), "cusparseSetStream");
    if (!ell) check_cusparse(cusparseSpMatSetValues(mat, g.sparse.values), "cusparseSpMatSetValues(A)");
    check_cusparse(cusparseDnMatSetValues(b, g.b.data), "cusparseDnMatSetValues(B)");
    check_cusparse(cusparseDnMatSetValues(c, g.c.data), "cusparseDnMatSetValues(C)");
    float alpha = g.alpha, beta = g.beta;
    check_cusparse(cusparseSpMM(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha,
                                mat, b, &beta, c, CUDA_R_32F,
                                ell ? CUSPARSE_SPMM_BLOCKED_ELL_ALG1 : CUSPARSE_SPMM_BSR_ALG1, buffer.p),
                   "cusparseSpMM");
  }
};

std::unique_ptr<VariantState> sddmm_prepare(const GemmArgs& g);

std::unique_ptr<VariantState> cusparse_prepare(const GemmArgs& args, bool ell) {
  if (args.kind == OpKind::sdd) return sddmm_prepare(args);
  const GemmArgs g = as_dsd(args);
  auto st = std::make_unique<CusparseState>();
  st->ell = ell;
  const BsrView& a = g.sparse;
  if (a.nnzb == 0 || g.m() == 0 || g.n() == 0 || g.k() == 0) {
    st->empty = true;
    return st;
  }
  check_cusparse(cusparseCreate(&st->handle), "cusparseCreate");
  std::vector<int32_t> ci = copy_to_host(a.col_idx, a.nnzb, a.memory);
  cudaDataType vt = cuda_type(a.dtype);
  if (ell) {
    // Uniform rows (checked by why_not): BSR's col_idx, row by row, IS the ELL column index
    // array [mb][slots]; the values need the gather of convert().
    st->slots = int(a.nnzb / a.mb());
    int32_t* d_ci = upload(st->col_idx, ci, "cudaMalloc(ELL col_idx)");
    st->ell_values.alloc(size_t(a.nnzb) * a.bm * a.bk * dtype_size(a.dtype), "cudaMalloc(ELL values)");
    check_cusparse(cusparseCreateBlockedEll(&st->mat, a.rows, a.cols, a.bm, int64_t(st->slots) * a.bk, d_ci,
                                            st->ell_values.p, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, vt),
                   "cusparseCreateBlockedEll");
  } else {
    std::vector<int32_t> rp = copy_to_host(a.row_ptr, a.mb() + 1, a.memory);
    int32_t* d_rp = upload(st->row_ptr, rp, "cudaMalloc(BSR row_ptr)");
    int32_t* d_ci = upload(st->col_idx, ci, "cudaMalloc(BSR col_idx)");
    // values: a placeholder here, set per run (they may move between runs)
    check_cusparse(cusparseCreateBsr(&st->mat, a.mb(), a.kb(), a.nnzb, a.bm, a.bk, d_rp, d_ci, a.values,
                                     CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, vt,
                                     CUSPARSE_ORDER_ROW),
                   "cusparseCreateBsr");
  }
  auto order = [](Layout l) { return l == Layout::row_major ? CUSPARSE_ORDER_ROW : CUSPARSE_ORDER_COL; };
  check_cusparse(cusparseCreateDnMat(&st->b, g.b.rows, g.b.cols, g.b.ld, g.b.data, vt, order(g.b.layout)),
                 "cusparseCreateDnMat(B)");
  check_cusparse(cusparseCreateDnMat(&st->c, g.c.rows, g.c.cols, g.c.ld, g.c.data, cuda_type(g.c.dtype),
                                     order(g.c.layout)),
                 "cusparseCreateDnMat(C)");
  float alpha = g.alpha, beta = g.beta;
  size_t bytes = 0;
  check_cusparse(cusparseSpMM_bufferSize(st->handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                         &alpha, st->mat, st->b, &beta, st->c, CUDA_R_32F,
                                         ell ? CUSPARSE_SPMM_BLOCKED_ELL_ALG1 : CUSPARSE_SPMM_BSR_ALG1, &bytes),
                 "cusparseSpMM_bufferSize");
  st->buffer.alloc(bytes, "cudaMalloc(cuSPARSE buffer)");
  return st;
}

// cuSPARSE SDDMM with C in BSR: C = alpha * (A * B) on C's pattern + beta * C.
struct SddmmState : peers::PeerState {
  cusparseHandle_t handle = nullptr;
  cusparseSpMatDescr_t mat_c = nullptr;
  cusparseDnMatDescr_t mat_a = nullptr, mat_b = nullptr;
  DevBuf row_ptr, col_idx, buffer;
  bool empty = false;  // nnzb = 0 or K = 0: no library call

  ~SddmmState() override {
    if (mat_c) cusparseDestroySpMat(mat_c);
    if (mat_a) cusparseDestroyDnMat(mat_a);
    if (mat_b) cusparseDestroyDnMat(mat_b);
    if (handle) cusparseDestroy(handle);
  }
  // NOTE: as for SpMM, cuSPARSE does not promise to leave C unread when beta = 0: zero it first.
  void convert(const GemmArgs& g, void* stream) override {
    const BsrView& c = g.sparse;
    if (g.beta == 0.f && c.nnzb > 0)
      check_cuda(cudaMemsetAsync(c.values, 0, size_t(c.nnzb) * c.bm * c.bk * dtype_size(c.dtype),
                                 static_cast<cudaStream_t>(stream)),
                 "cudaMemsetAsync(C values)");
  }
  void core(const GemmArgs& g, void* stream) override {
    const BsrView& c = g.sparse;
    if (empty) {
      if (c.nnzb > 0) {
        DenseView v{c.values, c.nnzb, int64_t(c.bm) * c.bk, int64_t(c.bm) * c.bk, Layout::row_major, c.dtype,
                    Memory::device};
        scale_c(v, g.beta, static_cast<cudaStream_t>(stream));
      }
      return;
    }
    check_cusparse(cusparseSetStream(handle, static_cast<cudaStream_t>(stream)), "cusparseSetStream");
    check_cusparse(cusparseSpMatSetValues(mat_c, c.values), "cusparseSpMatSetValues(C)");
    check_cusparse(cusparseDnMatSetValues(mat_a, g.a.data), "cusparseDnMatSetValues(A)");
    check_cusparse(cusparseDnMatSetValues(mat_b, g.b.data), "cusparseDnMatSetValues(B)");
    float alpha = g.alpha, beta = g.beta;
    check_cusparse(cusparseSDDMM(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha,
                                 mat_a, mat_b, &beta, mat_c, CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, buffer.p),
                   "cusparseSDDMM");
  }
};

auto dn_order(Layout l) { return l == Layout::row_major ? CUSPARSE_ORDER_ROW : CUSPARSE_ORDER_COL; }

std::unique_ptr<VariantState> sddmm_prepare(const GemmArgs& g) {
  auto st = std::make_unique<SddmmState>();
  const BsrView& c = g.sparse;
  if (c.nnzb == 0 || g.k() == 0) {
    st->empty = true;
    return st;
  }
  check_cusparse(cusparseCreate(&st->handle), "cusparseCreate");
  int32_t* d_rp = upload(st->row_ptr, copy_to_host(c.row_ptr, c.mb() + 1, c.memory), "cudaMalloc(BSR row_ptr)");
  int32_t* d_ci = upload(st->col_idx, copy_to_host(c.col_idx, c.nnzb, c.memory), "cudaMalloc(BSR col_idx)");
  check_cusparse(cusparseCreateBsr(&st->mat_c, c.mb(), c.kb(), c.nnzb, c.bm, c.bk, d_rp, d_ci, c.values,
                                   CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, cuda_type(c.dtype),
                                   CUSPARSE_ORDER_ROW),
                 "cusparseCreateBsr(C)");
  const cudaDataType in = cuda_type(g.a.dtype);
  check_cusparse(cusparseCreateDnMat(&st->mat_a, g.a.rows, g.a.cols, g.a.ld, g.a.data, in, dn_order(g.a.layout)),
                 "cusparseCreateDnMat(A)");
  check_cusparse(cusparseCreateDnMat(&st->mat_b, g.b.rows, g.b.cols, g.b.ld, g.b.data, in, dn_order(g.b.layout)),
                 "cusparseCreateDnMat(B)");
  float alpha = g.alpha, beta = g.beta;
  size_t bytes = 0;
  check_cusparse(cusparseSDDMM_bufferSize(st->handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                          &alpha, st->mat_a, st->mat_b, &beta, st->mat_c, CUDA_R_32F,
                                          CUSPARSE_SDDMM_ALG_DEFAULT, &bytes),
                 "cusparseSDDMM_bufferSize");
  st->buffer.alloc(bytes, "cudaMalloc(cuSPARSE SDDMM buffer)");
  return st;
}

// What the SpMM peers run a DSD or DDS as: they read the sparse operand untransposed only.
const char* kSpmmOp = "supports op(A) = none only (dsd op none, dds op trans)";

std::string bsr_why_not(const GemmArgs& args) {
  std::string why = common_why_not(args);
  if (!why.empty()) return why;
  const GemmArgs g = as_dsd(args);
  if (g.kind == OpKind::dsd && g.op != Op::none) return std::string("cuSPARSE BSR SpMM ") + kSpmmOp;
  // NOTE: cuSPARSE 12.6 (CUDA 13.0) rejects these in cusparseCreateBsr ("non-square block isn't
  // supported"), although the descriptor takes separate row and column block sizes.
  if (g.sparse.bm != g.sparse.bk)
    return "cuSPARSE BSR needs square blocks (bm=" + std::to_string(g.sparse.bm) + ", bk=" +
           std::to_string(g.sparse.bk) + ")";
  return "";
}

std::string ell_why_not(const GemmArgs& args) {
  std::string why = common_why_not(args);
  if (!why.empty()) return why;
  if (args.kind == OpKind::sdd) return "cuSPARSE has no Blocked-ELL sampled product (sdd)";
  const GemmArgs g = as_dsd(args);
  const BsrView& a = g.sparse;
  if (g.op != Op::none) return std::string("cuSPARSE Blocked-ELL SpMM ") + kSpmmOp;
  if (a.bm != a.bk)
    return "Blocked-ELL needs square blocks (bm=" + std::to_string(a.bm) + ", bk=" + std::to_string(a.bk) + ")";
  // NOTE: measured on H100 (cuSPARSE 12.6): Blocked-ELL SpMM on f32 inputs gave a max relative
  // error of 2.9e-4 against the fp64 oracle (BSR SpMM and cuBLAS: ~1e-6), i.e. it computes at
  // reduced (TF32-like) precision; sparsek's f32 contract is full fp32.
  if (a.dtype == DType::f32)
    return "cuSPARSE Blocked-ELL computes f32 inputs at reduced (TF32-like) precision; f16/bf16 only";
  if (a.nnzb == 0 || a.mb() == 0) return "nnzb = 0 (no Blocked-ELL columns)";
  std::vector<int32_t> rp;
  try {
    rp = copy_to_host(a.row_ptr, a.mb() + 1, a.memory);
  } catch (const Error& e) {
    return std::string("could not read row_ptr: ") + e.what();
  }
  int64_t per = rp[1] - rp[0];
  for (int64_t i = 1; i < a.mb(); ++i) {
    int64_t n = rp[size_t(i + 1)] - rp[size_t(i)];
    if (n != per)
      return "Blocked-ELL needs the same block count in every block row (row 0 has " + std::to_string(per) +
             ", row " + std::to_string(i) + " has " + std::to_string(n) + ")";
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// cuBLAS on the densified A

struct CublasState : peers::PeerState {
  cublasHandle_t handle = nullptr;
  DevBuf dense, block_row, col_idx, workspace;

  ~CublasState() override {
    if (handle) cublasDestroy(handle);
  }

  // DSD / DDS: scatter the sparse operand's values into its densified copy. SDD: nothing.
  void convert(const GemmArgs& args, void* stream) override {
    if (args.kind == OpKind::sdd) return;
    launch_place(args, dense.p, block_row.as<int32_t>(), col_idx.as<int32_t>(), 0, args.sparse.cols,
                 static_cast<cudaStream_t>(stream));
  }

  void core(const GemmArgs& args, void* stream) override {
    if (args.kind == OpKind::sdd) return core_sdd(args, static_cast<cudaStream_t>(stream));
    const GemmArgs g = as_dsd(args);
    const int64_t M = g.m(), N = g.n(), K = g.k();
    if (M == 0 || N == 0) return;
    if (K == 0) {  // nothing densified to multiply: C = beta * C
      scale_c(g.c, g.beta, static_cast<cudaStream_t>(stream));
      return;
    }
    check_cublas(cublasSetStream(handle, static_cast<cudaStream_t>(stream)), "cublasSetStream");
    float alpha = g.alpha, beta = g.beta;
    cudaDataType in = cuda_type(g.sparse.dtype), out = cuda_type(g.c.dtype);
    // The densified A is row-major rows x cols: to column-major cuBLAS it is A^T with lda = cols.
    const int lda = int(g.sparse.cols > 0 ? g.sparse.cols : 1);
    const bool b_row = g.b.layout == Layout::row_major;
    cublasStatus_t st;
    if (g.c.layout == Layout::col_major) {
      // C (M x N) = op(A) * B
      cublasOperation_t op_a = g.op == Op::none ? CUBLAS_OP_T : CUBLAS_OP_N;
      cublasOperation_t op_b = b_row ? CUBLAS_OP_T : CUBLAS_OP_N;
      st = cublasGemmEx(handle, op_a, op_b, int(M), int(N), int(K), &alpha, dense.p, in, lda, g.b.data, in,
                        int(g.b.ld), &beta, g.c.data, out, int(g.c.ld), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
      // Row-major C is column-major C^T (N x M) = B^T * op(A)^T
      cublasOperation_t op_b = b_row ? CUBLAS_OP_N : CUBLAS_OP_T;
      cublasOperation_t op_a = g.op == Op::none ? CUBLAS_OP_N : CUBLAS_OP_T;
      st = cublasGemmEx(handle, op_b, op_a, int(N), int(M), int(K), &alpha, g.b.data, in, int(g.b.ld), dense.p, in,
                        lda, &beta, g.c.data, out, int(g.c.ld), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    check_cublas(st, "cublasGemmEx");
  }

  // SDD: the whole product D = A * B (row-major f32, M x N), then C's blocks gathered from it.
  void core_sdd(const GemmArgs& g, cudaStream_t stream) {
    const BsrView& c = g.sparse;
    const int64_t M = g.m(), N = g.n(), K = g.k();
    if (c.nnzb == 0) return;
    if (K == 0) {
      DenseView v{c.values, c.nnzb, int64_t(c.bm) * c.bk, int64_t(c.bm) * c.bk, Layout::row_major, c.dtype,
                  Memory::device};
      scale_c(v, g.beta, stream);
      return;
    }
    check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
    // Row-major D is column-major D^T (N x M) = B^T * A^T.
    const float one = 1.f, zero = 0.f;
    const cudaDataType in = cuda_type(g.a.dtype);
    check_cublas(cublasGemmEx(handle, g.b.layout == Layout::row_major ? CUBLAS_OP_N : CUBLAS_OP_T,
                              g.a.layout == Layout::row_major ? CUBLAS_OP_N : CUBLAS_OP_T, int(N), int(M), int(K), &one,
                              g.b.data, in, int(g.b.ld), g.a.data, in, int(g.a.ld), &zero, dense.p, CUDA_R_32F, int(N),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
    const int grid = int(c.nnzb < 65535 * 4 ? c.nnzb : 65535 * 4);
    const float* d = dense.as<float>();
    switch (c.dtype) {
      case DType::f32:
        gather_blocks<<<grid, 256, 0, stream>>>(d, N, static_cast<float*>(c.values), c.nnzb, block_row.as<int32_t>(),
                                                col_idx.as<int32_t>(), c.bm, c.bk, g.alpha, g.beta);
        break;
      case DType::f16:
        gather_blocks<<<grid, 256, 0, stream>>>(d, N, static_cast<__half*>(c.values), c.nnzb, block_row.as<int32_t>(),
                                                col_idx.as<int32_t>(), c.bm, c.bk, g.alpha, g.beta);
        break;
      case DType::bf16:
        gather_blocks<<<grid, 256, 0, stream>>>(d, N, static_cast<__nv_bfloat16*>(c.values), c.nnzb,
                                                block_row.as<int32_t>(), col_idx.as<int32_t>(), c.bm, c.bk, g.alpha,
                                                g.beta);
        break;
    }
    check_cuda(cudaGetLastError(), "gather_blocks launch");
  }
};

std::unique_ptr<VariantState> cublas_prepare(const GemmArgs& g, const Options&) {
  auto st = std::make_unique<CublasState>();
  const BsrView& a = g.sparse;
  check_cublas(cublasCreate(&st->handle), "cublasCreate");
  // 32 MiB is what cuBLAS recommends for Hopper; owning it keeps run() allocation-free.
  st->workspace.alloc(size_t(32) << 20, "cudaMalloc(cuBLAS workspace)");
  check_cublas(cublasSetWorkspace(st->handle, st->workspace.p, st->workspace.bytes), "cublasSetWorkspace");
  // DSD / DDS: the densified sparse operand (zeros outside the stored blocks depend on the
  // pattern only: written once here). SDD: the whole dense product in f32.
  const size_t bytes = size_t(a.rows) * size_t(a.cols) * (g.kind == OpKind::sdd ? 4 : dtype_size(a.dtype));
  st->dense.alloc(bytes, "cudaMalloc(densified operand)");
  if (bytes && g.kind != OpKind::sdd) check_cuda(cudaMemset(st->dense.p, 0, bytes), "cudaMemset(densified operand)");
  std::vector<int32_t> rp = copy_to_host(a.row_ptr, a.mb() + 1, a.memory);
  std::vector<int32_t> br(static_cast<size_t>(a.nnzb));
  for (int64_t r = 0; r < a.mb(); ++r)
    for (int32_t j = rp[size_t(r)]; j < rp[size_t(r + 1)]; ++j) br[size_t(j)] = int32_t(r);
  upload(st->block_row, br, "cudaMalloc(block_row)");
  upload(st->col_idx, copy_to_host(a.col_idx, a.nnzb, a.memory), "cudaMalloc(col_idx)");
  return st;
}

std::string cublas_why_not(const GemmArgs& g) { return common_why_not(g); }

// ---------------------------------------------------------------------------------------------
// cuBLAS strided-batched GEMM over the experts of a block-diagonal A (the call torch.bmm makes
// for a stack of expert weights): E diagonal groups, each rb block rows by cb block columns and
// fully stored. A's values are scattered into an [E][rb*bm][cb*bk] stack once per run, as the
// dense peer densifies A; B's and C's experts are row ranges of B and C.

// The experts of a block-diagonal pattern: every block row of group e (rows [e*rb, (e+1)*rb))
// stores exactly the block columns [e*cb, (e+1)*cb), in ascending order. 0 experts: not such a
// pattern (why_not says which row breaks it).
struct Experts {
  int64_t count = 0, rb = 0, cb = 0;
  std::string why_not;
};

Experts find_experts(const int32_t* rp, const int32_t* ci, int64_t mb, int64_t kb) {
  Experts x;
  if (mb == 0 || !ci || rp[mb] == 0) {
    x.why_not = "A stores no block";
    return x;
  }
  // Expert 0: the leading block rows that store cb blocks starting at column 0.
  x.cb = rp[1] - rp[0];
  while (x.cb > 0 && x.rb < mb && rp[size_t(x.rb + 1)] - rp[size_t(x.rb)] == x.cb && ci[size_t(rp[size_t(x.rb)])] == 0)
    ++x.rb;
  if (x.rb == 0 || mb % x.rb != 0 || kb % x.cb != 0 || mb / x.rb != kb / x.cb) {
    x.why_not = "A is not block-diagonal with equal, fully stored experts (block row 0 stores " +
                std::to_string(x.cb) + " of " + std::to_string(kb) + " block columns)";
    return x;
  }
  for (int64_t r = 0; r < mb; ++r) {
    const int64_t first = (r / x.rb) * x.cb;
    bool ok = rp[size_t(r + 1)] - rp[size_t(r)] == x.cb;
    for (int64_t j = 0; ok && j < x.cb; ++j) ok = ci[size_t(rp[size_t(r)] + j)] == first + j;
    if (!ok) {
      x.why_not = "A is not block-diagonal with equal, fully stored experts (block row " + std::to_string(r) +
                  " does not store exactly block columns " + std::to_string(first) + ".." +
                  std::to_string(first + x.cb - 1) + ")";
      return x;
    }
  }
  x.count = mb / x.rb;
  return x;
}

struct BatchedState : peers::PeerState {
  cublasHandle_t handle = nullptr;
  DevBuf stack, block_row, local_col, workspace;
  Experts ex;

  ~BatchedState() override {
    if (handle) cublasDestroy(handle);
  }

  void convert(const GemmArgs& g, void* stream) override {
    launch_place(g, stack.p, block_row.as<int32_t>(), local_col.as<int32_t>(), 0, ex.cb * g.sparse.bk,
                 static_cast<cudaStream_t>(stream));
  }

  void core(const GemmArgs& g, void* stream) override {
    const int64_t me = ex.rb * g.sparse.bm, ke = ex.cb * g.sparse.bk, N = g.n();
    if (N == 0) return;
    check_cublas(cublasSetStream(handle, static_cast<cudaStream_t>(stream)), "cublasSetStream");
    const float alpha = g.alpha, beta = g.beta;
    const cudaDataType in = cuda_type(g.sparse.dtype), out = cuda_type(g.c.dtype);
    const bool b_row = g.b.layout == Layout::row_major, c_row = g.c.layout == Layout::row_major;
    // Expert e: A_e is the stack's e-th me x ke row-major matrix, B_e rows [e*ke, (e+1)*ke) of B,
    // C_e rows [e*me, (e+1)*me) of C.
    const long long stride_a = me * ke, stride_b = b_row ? ke * g.b.ld : ke, stride_c = c_row ? me * g.c.ld : me;
    cublasStatus_t st;
    if (c_row) {  // column-major C_e^T (N x me) = B_e^T * A_e^T
      st = cublasGemmStridedBatchedEx(handle, b_row ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(me), int(ke),
                                      &alpha, g.b.data, in, int(g.b.ld), stride_b, stack.p, in, int(ke), stride_a,
                                      &beta, g.c.data, out, int(g.c.ld), stride_c, int(ex.count), CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT);
    } else {  // C_e (me x N) = A_e * B_e
      st = cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, b_row ? CUBLAS_OP_T : CUBLAS_OP_N, int(me), int(N), int(ke),
                                      &alpha, stack.p, in, int(ke), stride_a, g.b.data, in, int(g.b.ld), stride_b,
                                      &beta, g.c.data, out, int(g.c.ld), stride_c, int(ex.count), CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT);
    }
    check_cublas(st, "cublasGemmStridedBatchedEx");
  }
};

std::string batched_why_not(const GemmArgs& g) {
  if (std::string why = common_why_not(g); !why.empty()) return why;
  if (g.kind != OpKind::dsd || g.op != Op::none) return "runs the DSD product with op none only";
  const BsrView& a = g.sparse;
  if (a.mb() == 0 || a.nnzb == 0) return "A stores no block";
  try {
    const HostPattern hp = host_pattern(a);
    return find_experts(hp.row_ptr, hp.col_idx, a.mb(), a.kb()).why_not;
  } catch (const Error& e) {
    return std::string("could not read the pattern: ") + e.what();
  }
}

std::unique_ptr<VariantState> batched_prepare(const GemmArgs& g, const Options&) {
  auto st = std::make_unique<BatchedState>();
  const BsrView& a = g.sparse;
  const HostPattern hp = host_pattern(a);
  const int32_t *rp = hp.row_ptr, *ci = hp.col_idx;
  st->ex = find_experts(rp, ci, a.mb(), a.kb());
  if (st->ex.count == 0) throw Error(Status::unsupported, "cublas_batched: " + st->ex.why_not);
  check_cublas(cublasCreate(&st->handle), "cublasCreate");
  st->workspace.alloc(size_t(32) << 20, "cudaMalloc(cuBLAS workspace)");
  check_cublas(cublasSetWorkspace(st->handle, st->workspace.p, st->workspace.bytes), "cublasSetWorkspace");
  st->stack.alloc(size_t(a.rows) * size_t(st->ex.cb * a.bk) * dtype_size(a.dtype), "cudaMalloc(expert stack)");
  std::vector<int32_t> br(static_cast<size_t>(a.nnzb)), lc(static_cast<size_t>(a.nnzb));
  for (int64_t r = 0; r < a.mb(); ++r)
    for (int32_t j = rp[size_t(r)]; j < rp[size_t(r + 1)]; ++j) {
      br[size_t(j)] = int32_t(r);
      lc[size_t(j)] = int32_t(ci[size_t(j)] - (r / st->ex.rb) * st->ex.cb);
    }
  upload(st->block_row, br, "cudaMalloc(block_row)");
  upload(st->local_col, lc, "cudaMalloc(local columns)");
  return st;
}

void peer_run(const GemmArgs& g, const Options& o, VariantState* state) {
  auto* st = static_cast<peers::PeerState*>(state);
  st->convert(g, o.stream);
  st->core(g, o.stream);
}

}  // namespace

void kernel_image(int* binary_version, int* ptx_version) {
  cudaFuncAttributes attr{};
  check_cuda(cudaFuncGetAttributes(&attr, place_blocks), "cudaFuncGetAttributes(place_blocks)");
  *binary_version = attr.binaryVersion;
  *ptx_version = attr.ptxVersion;
}

}  // namespace peers

std::vector<Variant> peer_variants() {
  return {
      {"cusparse_bsr", Backend::cuda, true, &peers::bsr_why_not,
       [](const GemmArgs& g, const Options&) { return peers::cusparse_prepare(g, false); }, &peers::peer_run},
      {"cusparse_ell", Backend::cuda, true, &peers::ell_why_not,
       [](const GemmArgs& g, const Options&) { return peers::cusparse_prepare(g, true); }, &peers::peer_run},
      {"cublas_dense", Backend::cuda, true, &peers::cublas_why_not, &peers::cublas_prepare, &peers::peer_run},
      {"cublas_batched", Backend::cuda, true, &peers::batched_why_not, &peers::batched_prepare, &peers::peer_run},
  };
}

}  // namespace sparsek
