// cuBLASLt's dense fp8 GEMM (see dense_fp8.hpp).
#include "dense_fp8.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "timing.hpp"

namespace sparsek::timing {

namespace {
void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(s == CUBLAS_STATUS_NOT_SUPPORTED ? Status::unsupported : Status::cuda_error,
                std::string("cuBLASLt ") + what + " failed: status " + std::to_string(int(s)));
}
}  // namespace

struct DenseFp8Gemm::Impl {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* ws = nullptr;
  size_t ws_bytes = size_t(32) << 20;
  float* one = nullptr;  // device 1.0f: the scale a null scale pointer stands for

  ~Impl() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (cublasLtMatrixLayout_t l : {la, lb, ld})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (lt) cublasLtDestroy(lt);
    if (ws) cudaFree(ws);
    if (one) cudaFree(one);
  }
};

DenseFp8Gemm::DenseFp8Gemm(int64_t m, int64_t n, int64_t k, DType out) : impl_(new Impl) {
  try {
    Impl& s = *impl_;
    if (out != DType::bf16 && out != DType::f16 && out != DType::f32)
      throw Error(Status::invalid_argument, "DenseFp8Gemm: output dtype must be bf16, f16 or f32");
    const cudaDataType_t dt = out == DType::bf16 ? CUDA_R_16BF : out == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
    check_lt(cublasLtCreate(&s.lt), "cublasLtCreate");
    check_lt(cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    // Column-major, as cuBLASLt sees it: C^T (n x m, ld n: our row-major C) = op_T(B stored k x n,
    // ld k: our row-major n x k B) * A^T (stored k x m, ld k: our row-major m x k A). The "TN" form
    // is the one fp8 takes.
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), "TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)), "TRANSB");
    check_lt(cublasLtMatrixLayoutCreate(&s.la, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&s.lb, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&s.ld, dt, uint64_t(n), uint64_t(m), n), "layout C");
    SPARSEK_CHECK_CUDA(cudaMalloc(&s.ws, s.ws_bytes));
    // The scale pointers are part of what the heuristic answers for: set before it, to the same kind
    // of value run() sets (a device float), never left null (an algorithm chosen without them was
    // refused by cublasLtMatmul with status 15 once run() set them, on an H200).
    const float host_one = 1.f;
    SPARSEK_CHECK_CUDA(cudaMalloc(&s.one, sizeof(float)));
    SPARSEK_CHECK_CUDA(cudaMemcpy(s.one, &host_one, sizeof(float), cudaMemcpyHostToDevice));
    check_lt(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &s.one, sizeof(s.one)),
             "A_SCALE_POINTER");
    check_lt(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &s.one, sizeof(s.one)),
             "B_SCALE_POINTER");
    check_lt(cublasLtMatmulPreferenceCreate(&s.pref), "preference");
    check_lt(cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &s.ws_bytes,
                                                  sizeof(s.ws_bytes)),
             "workspace");
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(s.lt, s.desc, s.la, s.lb, s.ld, s.ld, s.pref, 1, &heur, &found);
    if (h != CUBLAS_STATUS_SUCCESS || found == 0)
      throw Error(Status::unsupported, "cuBLASLt has no fp8 algorithm for m=" + std::to_string(m) + " n=" +
                                           std::to_string(n) + " k=" + std::to_string(k) + " with " + to_string(out) +
                                           " output (status " + std::to_string(int(h)) + ")");
    s.algo = heur.algo;
  } catch (...) {
    delete impl_;
    throw;
  }
}

DenseFp8Gemm::~DenseFp8Gemm() { delete impl_; }

void DenseFp8Gemm::run(const void* a, const void* b, void* c, const float* a_scale, const float* b_scale,
                       void* stream) const {
  Impl& s = *impl_;
  // cuBLASLt's A is our B and its B our A: the scales follow (null: 1).
  if (!a_scale) a_scale = s.one;
  if (!b_scale) b_scale = s.one;
  check_lt(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)),
           "A_SCALE_POINTER");
  check_lt(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)),
           "B_SCALE_POINTER");
  const float one = 1.f, zero = 0.f;
  check_lt(cublasLtMatmul(s.lt, s.desc, &one, b, s.la, a, s.lb, &zero, c, s.ld, c, s.ld, &s.algo, s.ws, s.ws_bytes,
                          static_cast<cudaStream_t>(stream)),
           "cublasLtMatmul");
}

}  // namespace sparsek::timing
