// Times the "hopper_fp8" variant (e4m3 block-sparse products with block and per-token scales) beside
// cuBLASLt's dense fp8 GEMM of the same shape, in one process:
//   cmake --build build --target fp8_timer
//   build/fp8_timer [filter ...]    (the rows whose name contains any of the filters)
// Per workload: random e4m3 data written on the device (never zeros), the plan made once, 5 warm-up
// runs, then 30 timed runs (CUDA events, the stream held: timing.hpp); medians reported as effective
// TFLOPS (stored blocks only: 2 * nnzb * bm * bk * N / time) for sparsek, and as the dense rate
// (2 * M * N * K / time) and the same effective rate for cuBLASLt.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"
#include "sparsek/plan.hpp"
#include "dense_fp8.hpp"
#include "timer.cuh"
#include "tools_internal.hpp"

using namespace sparsek;

namespace {

// n e4m3 codes from a hash of the index: uniform in [-1, 1) rounded to e4m3 (never NaN).
__global__ void fill_e4m3(uint8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32) * 40503u ^ seed * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h = h * 3266489917u ^ (h >> 16);
    p[i] = float_to_e4m3(float(h >> 8) * (1.f / 8388608.f) - 1.f).bits;
  }
}

void* device_bytes(size_t n) {
  void* p = nullptr;
  SPARSEK_CHECK_CUDA(cudaMalloc(&p, n ? n : 1));
  return p;
}

struct Work {
  const char* name;
  OpKind kind;   // dsd: C (M x N) = A (sparse M x K) * B (K x N); dds: y (M x N) = x (M x K) * W^T, W sparse N x K
  int64_t m, n, k;
  int bm, bk;
  double density;
  Layout b_layout;  // dsd: B's layout (column-major is read in place, row-major is transposed first)
};

// cuBLASLt's fp8 GEMM of the same shape (both operands K-major, bf16 output, unit scales): the dense
// peer, through the one set-up `sparsek bench --dtype e4m3` uses (tools/sparsek/dense_fp8.hpp).
// Returns the median ms.
double time_cublaslt(int64_t m, int64_t n, int64_t k) {
  uint8_t* a = static_cast<uint8_t*>(device_bytes(size_t(m * k)));
  uint8_t* b = static_cast<uint8_t*>(device_bytes(size_t(k * n)));
  void* d = device_bytes(size_t(m * n) * 2);
  fill_e4m3<<<1024, 256>>>(a, m * k, 1);
  fill_e4m3<<<1024, 256>>>(b, k * n, 2);
  SPARSEK_CHECK_CUDA(cudaGetLastError());
  std::vector<double> ms;
  {
    const timing::DenseFp8Gemm gemm(m, n, k, DType::bf16);
    ms = timing::time_gpu([&](int) { gemm.run(a, b, d, nullptr, nullptr); }, 5, 30, 1);
  }
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), d}) cudaFree(p);
  return timing::median(ms);
}

// sparsek: one plan, timed runs. Returns the median ms and the stored blocks.
double time_sparsek(const Work& w, int64_t* nnzb_out) {
  // The sparse operand: A (dsd, M x K) or W (dds, N x K), bm x bk blocks.
  const int64_t rows = w.kind == OpKind::dsd ? w.m : w.n, cols = w.k;
  const Pattern pat = make_pattern(PatternKind::fixed_k, rows / w.bm, cols / w.bk, w.density, 7);
  const int64_t nnzb = int64_t(pat.col_idx.size());
  *nnzb_out = nnzb;
  int32_t* rp = static_cast<int32_t*>(device_bytes(pat.row_ptr.size() * 4));
  int32_t* ci = static_cast<int32_t*>(device_bytes(pat.col_idx.size() * 4));
  SPARSEK_CHECK_CUDA(cudaMemcpy(rp, pat.row_ptr.data(), pat.row_ptr.size() * 4, cudaMemcpyHostToDevice));
  SPARSEK_CHECK_CUDA(cudaMemcpy(ci, pat.col_idx.data(), pat.col_idx.size() * 4, cudaMemcpyHostToDevice));
  uint8_t* vals = static_cast<uint8_t*>(device_bytes(size_t(nnzb) * w.bm * w.bk));
  fill_e4m3<<<1024, 256>>>(vals, nnzb * w.bm * w.bk, 3);
  const std::vector<float> block_scales(size_t(nnzb), 1.f / 64), token_scales(size_t(w.kind == OpKind::dsd ? w.n : w.m), 0.5f);
  float* bs = static_cast<float*>(device_bytes(block_scales.size() * 4));
  float* ts = static_cast<float*>(device_bytes(token_scales.size() * 4));
  SPARSEK_CHECK_CUDA(cudaMemcpy(bs, block_scales.data(), block_scales.size() * 4, cudaMemcpyHostToDevice));
  SPARSEK_CHECK_CUDA(cudaMemcpy(ts, token_scales.data(), token_scales.size() * 4, cudaMemcpyHostToDevice));
  uint8_t* dense = static_cast<uint8_t*>(device_bytes(size_t(w.k) * size_t(w.kind == OpKind::dsd ? w.n : w.m)));
  fill_e4m3<<<1024, 256>>>(dense, w.k * (w.kind == OpKind::dsd ? w.n : w.m), 4);
  void* c = device_bytes(size_t(w.m * w.n) * 2);
  SPARSEK_CHECK_CUDA(cudaGetLastError());

  GemmArgs g;
  g.kind = w.kind;
  g.op = w.kind == OpKind::dds ? Op::trans : Op::none;
  g.sparse = BsrView{rows, cols, w.bm, w.bk, nnzb, rp, ci, vals, DType::e4m3, Memory::device};
  g.sparse.scales = bs;
  DenseView d;
  d.data = dense;
  d.dtype = DType::e4m3;
  d.memory = Memory::device;
  d.scales = ts;
  if (w.kind == OpKind::dsd) {
    d.rows = w.k, d.cols = w.n, d.layout = w.b_layout, d.ld = w.b_layout == Layout::row_major ? w.n : w.k;
    g.b = d;
  } else {
    d.rows = w.m, d.cols = w.k, d.layout = Layout::row_major, d.ld = w.k;
    g.a = d;
  }
  g.c = DenseView{c, w.m, w.n, w.n, Layout::row_major, DType::bf16, Memory::device};
  Options o;
  o.variant = "hopper_fp8";
  const Plan p = plan(g, o);
  const std::vector<double> ms = timing::time_gpu([&](int) { run(p, g, nullptr); }, 5, 30, 1);
  SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());
  for (void* q : {static_cast<void*>(rp), static_cast<void*>(ci), static_cast<void*>(vals), static_cast<void*>(bs),
                  static_cast<void*>(ts), static_cast<void*>(dense), c})
    cudaFree(q);
  return timing::median(ms);
}

int timer_main(int argc, char** argv) {
  const std::vector<Work> works = {
      {"dsd 8192^3 128x128 12.5% B col-major", OpKind::dsd, 8192, 8192, 8192, 128, 128, 0.125, Layout::col_major},
      {"dsd 8192^3 128x128 12.5% B row-major (+ transpose)", OpKind::dsd, 8192, 8192, 8192, 128, 128, 0.125,
       Layout::row_major},
      {"dsd 8192^3 64x64 12.5% B col-major", OpKind::dsd, 8192, 8192, 8192, 64, 64, 0.125, Layout::col_major},
      {"dds layer x*W^T 4096 tokens W 14336x4096 64x64 25%", OpKind::dds, 4096, 14336, 4096, 64, 64, 0.25,
       Layout::col_major},
      {"dds layer x*W^T 4096 tokens W 14336x4096 128x128 25%", OpKind::dds, 4096, 14336, 4096, 128, 128, 0.25,
       Layout::col_major},
      {"decode N=16 W 14336x4096 64x64 25%", OpKind::dds, 16, 14336, 4096, 64, 64, 0.25, Layout::col_major},
      {"decode N=128 W 14336x4096 64x64 25%", OpKind::dds, 128, 14336, 4096, 64, 64, 0.25, Layout::col_major},
  };
  std::printf("%-52s %10s %10s %12s %12s %8s\n", "workload", "sparsek ms", "eff TFLOPS", "cuBLASLt ms",
              "dense TFLOPS", "x dense");
  for (const Work& w : works) {
    bool want = argc < 2;
    for (int i = 1; i < argc; ++i) want = want || std::string(w.name).find(argv[i]) != std::string::npos;
    if (!want) continue;
    int64_t nnzb = 0;
    const double ms = time_sparsek(w, &nnzb);
    const double eff = 2.0 * double(nnzb) * w.bm * w.bk * double(w.kind == OpKind::dsd ? w.n : w.m) / (ms * 1e9);
    const double lt = time_cublaslt(w.m, w.n, w.k);
    const double dense = 2.0 * double(w.m) * double(w.n) * double(w.k) / (lt * 1e9);
    std::printf("%-52s %10.4f %10.1f %12.4f %12.1f %8.2f\n", w.name, ms, eff, lt, dense, lt / ms);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::run_timer("fp8_timer", [&] { return timer_main(argc, argv); }); }
