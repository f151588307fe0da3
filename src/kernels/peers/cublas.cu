// The cuBLAS peers: GEMM on the densified sparse operand (SDD: the whole dense product, then C's
// blocks gathered), and strided-batched GEMM over the experts of a block-diagonal A (common.cu has
// the overview).
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
namespace {

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
      dst[t] = beta == 0.f ? dev::from_float<T>(v) : dev::from_float<T>(v + beta * dev::to_float<T>(dst[t]));
    }
  }
}

}  // namespace

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


}  // namespace sparsek::peers
