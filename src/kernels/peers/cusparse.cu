// The cuSPARSE peers: SpMM on BSR (BSR_ALG1) and on Blocked-ELL (BLOCKED_ELL_ALG1), and SDDMM on a
// BSR C (common.cu has the overview).
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

namespace sparsek::peers {

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


}  // namespace sparsek::peers
