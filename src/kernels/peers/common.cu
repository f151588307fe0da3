// Peers as variants: cuSPARSE SpMM on BSR (BSR_ALG1), cuSPARSE SpMM on Blocked-ELL
// (BLOCKED_ELL_ALG1, uniform rows and square blocks only), cuSPARSE SDDMM on a BSR C, and cuBLAS
// GEMM on the densified sparse operand (SDD: the whole dense product, then C's blocks gathered), and
// cuBLAS strided-batched GEMM over the experts of a block-diagonal A: cusparse.cu and cublas.cu.
// This file holds what they share (errors, versions, the values-only kernels of run(), checks) and
// the table of their variant rows.
// DDS runs as the DSD on the transposes (as_dsd: C^T = op(B)^T * A^T, only the views change), so
// the SpMM peers take it where that DSD is untransposed. They are benchmarked beside sparsek's
// kernels and are tuner candidates, never the default.
//
// Pattern work (copies of the indices, descriptors, buffers, library handles) happens in
// prepare(); run() only touches values: it converts them (gather / scatter kernels) and calls the
// library. See peers.hpp for the convert/core split the benchmark uses.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "kernels/dtype.cuh"
#include "kernels/peers/common.cuh"
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


// C = beta * C over a (major x minor) array with leading dimension ld; beta = 0 never reads C.
template <typename T>
__global__ void scale_matrix(T* c, int64_t major, int64_t minor, int64_t ld, float beta) {
  int64_t n = major * minor;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / minor, col = i % minor;
    T* p = c + r * ld + col;
    *p = beta == 0.f ? dev::from_float<T>(0.f) : dev::from_float<T>(beta * dev::to_float<T>(*p));
  }
}

}  // namespace

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

void DevBuf::alloc(size_t n, const char* what) {
  bytes = n;
  if (n == 0) return;
  check_cuda(cudaMalloc(&p, n), what);
}
DevBuf::~DevBuf() {
  if (p) cudaFree(p);
}

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


void peer_run(const GemmArgs& g, const Options& o, VariantState* state) {
  auto* st = static_cast<peers::PeerState*>(state);
  st->convert(g, o.stream);
  st->core(g, o.stream);
}

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