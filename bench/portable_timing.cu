// Times the portable sm80 variant (through sparsek::gemm, variant "portable") on its target
// workloads, beside cuBLAS dense fp16 at 8192^3 as the machine's dense rate. Inputs are random
// (never zeros), rotated over enough copies that the working set exceeds L2; each timing is the
// median over `reps` batches (CUDA events around `batch` back-to-back calls, the stream held,
// warm-up first: timing.hpp). Every workload's output is spot-checked against fp64 on the host.
//
//   cmake --build build --target portable_timing
//   build/portable_timing [reps [workload substrings, comma-separated]]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"
#include "timer.cuh"

// Tile-configuration experiments (bench/portable_configs.sh): PORTABLE_SRC names a copy of
// src/kernels/sm80/portable_sm80.cu whose portable_config.cuh has other Config<BM> rows, and portable_variants renamed to
// portable_variants_exp; its run() is called directly instead of gemm().
#ifdef PORTABLE_SRC
#include PORTABLE_SRC
#endif

using namespace sparsek;

void call_portable(const GemmArgs& g, const Options& o) {
#ifdef PORTABLE_SRC
  static const Variant v = portable_variants_exp()[0];
  v.run(g, o, nullptr);  // DSD op none / DDS op trans / SDD only: no prepared state needed
#else
  gemm(g, o);
#endif
}

using bench::fill_uniform;

float to_float(const std::vector<uint8_t>& bytes, DType t, size_t i) { return load_as_float(bytes.data(), t, int64_t(i)); }

struct Workload {
  std::string name;
  OpKind kind;
  Op op;
  int64_t M, N, K;
  int bm, bk;
  double density;
  DType in, out;
};

// Returns the median milliseconds per call; prints a table row.
void run_workload(const Workload& w, int reps) {
  // The sparse operand's shape (as stored): dsd A is M x K (op none) or K x M (trans); dds B is
  // K x N (none) or N x K (trans); sdd C is M x N.
  int64_t srows, scols;
  switch (w.kind) {
    case OpKind::dsd: srows = w.op == Op::none ? w.M : w.K; scols = w.op == Op::none ? w.K : w.M; break;
    case OpKind::dds: srows = w.op == Op::none ? w.K : w.N; scols = w.op == Op::none ? w.N : w.K; break;
    default: srows = w.M; scols = w.N; break;
  }
  const Pattern pat = make_pattern(PatternKind::fixed_k, srows / w.bm, scols / w.bk, w.density, 12345);
  const int64_t nnzb = pat.nnzb();
  const DType sdt = w.kind == OpKind::sdd ? w.out : w.in;
  const size_t vals_n = size_t(nnzb) * w.bm * w.bk;
  // Dense operands, row-major: dsd B (K x N), C (M x N); dds A (M x K), C; sdd A (M x K), B (K x N).
  const size_t a_n = size_t(w.M) * w.K, b_n = size_t(w.K) * w.N, c_n = size_t(w.M) * w.N;
  const size_t set_bytes = vals_n * dtype_size(sdt) + (w.kind != OpKind::dsd ? a_n * dtype_size(w.in) : 0) +
                           (w.kind != OpKind::dds ? b_n * dtype_size(w.in) : 0) +
                           (w.kind != OpKind::sdd ? c_n * dtype_size(w.out) : 0);
  int device = 0;
  SPARSEK_CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  SPARSEK_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  // Enough input sets that consecutive calls never find their operands in L2.
  const int nsets = std::max(2, std::min(8, int(3.0 * prop.l2CacheSize / double(set_bytes)) + 1));

  int32_t *d_rp = nullptr, *d_ci = nullptr;
  SPARSEK_CHECK_CUDA(cudaMalloc(&d_rp, pat.row_ptr.size() * 4));
  SPARSEK_CHECK_CUDA(cudaMalloc(&d_ci, std::max<size_t>(pat.col_idx.size(), 1) * 4));
  SPARSEK_CHECK_CUDA(cudaMemcpy(d_rp, pat.row_ptr.data(), pat.row_ptr.size() * 4, cudaMemcpyHostToDevice));
  SPARSEK_CHECK_CUDA(cudaMemcpy(d_ci, pat.col_idx.data(), pat.col_idx.size() * 4, cudaMemcpyHostToDevice));
  std::vector<GemmArgs> args(static_cast<size_t>(nsets));
  std::vector<void*> bufs;
  auto alloc = [&](size_t n, DType t, uint32_t seed) {
    void* p = nullptr;
    SPARSEK_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * dtype_size(t)));
    fill_uniform(p, t, int64_t(n), seed);
    bufs.push_back(p);
    return p;
  };
  auto dense = [&](int64_t r, int64_t c, DType t, void* p) {
    DenseView v;
    v.data = p;
    v.rows = r;
    v.cols = c;
    v.ld = c;
    v.layout = Layout::row_major;
    v.dtype = t;
    v.memory = Memory::device;
    return v;
  };
  for (int s = 0; s < nsets; ++s) {
    GemmArgs& g = args[size_t(s)];
    g.kind = w.kind;
    g.op = w.op;
    g.alpha = 1.f;
    g.beta = 0.f;
    g.sparse.rows = srows;
    g.sparse.cols = scols;
    g.sparse.bm = w.bm;
    g.sparse.bk = w.bk;
    g.sparse.nnzb = nnzb;
    g.sparse.row_ptr = d_rp;
    g.sparse.col_idx = d_ci;
    g.sparse.values = alloc(vals_n, sdt, 1 + 7 * s);  // same seed per set: same problem
    g.sparse.dtype = sdt;
    g.sparse.memory = Memory::device;
    if (w.kind != OpKind::dsd) g.a = dense(w.M, w.K, w.in, alloc(a_n, w.in, 2));
    if (w.kind != OpKind::dds) g.b = dense(w.K, w.N, w.in, alloc(b_n, w.in, 3));
    if (w.kind != OpKind::sdd) g.c = dense(w.M, w.N, w.out, alloc(c_n, w.out, 4));
  }
  SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());

  Options o;
  o.variant = "portable";
  o.check_indices = false;  // checked once below; timing measures the kernel, not validation
  gemm(args[0], Options{o.backend, o.variant, nullptr, true});  // validates the pattern once
  call_portable(args[0], o);
  SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());

  // Each timing brackets `batch` calls (twice around the input sets); 3 batches of warm-up first.
  const int batch = 2 * nsets;
  const std::vector<double> t =
      timing::time_gpu([&](int s) { call_portable(args[size_t(s)], o); }, 3 * batch, reps, nsets, batch);
  const double ms = timing::median(t);
  const double tmin = *std::min_element(t.begin(), t.end()), tmax = *std::max_element(t.begin(), t.end());
  const double flops = args[0].effective_flops();

  // Spot check set 0 against fp64 on 512 sampled outputs.
  const GemmArgs& g = args[0];
  auto down = [&](const void* p, size_t n, DType t) {
    std::vector<uint8_t> h(n * dtype_size(t));
    SPARSEK_CHECK_CUDA(cudaMemcpy(h.data(), p, h.size(), cudaMemcpyDeviceToHost));
    return h;
  };
  const std::vector<uint8_t> hv = down(g.sparse.values, vals_n, sdt);
  const std::vector<uint8_t> ha = w.kind != OpKind::dsd ? down(g.a.data, a_n, w.in) : std::vector<uint8_t>();
  const std::vector<uint8_t> hb = w.kind != OpKind::dds ? down(g.b.data, b_n, w.in) : std::vector<uint8_t>();
  const std::vector<uint8_t> hc = w.kind != OpKind::sdd ? down(g.c.data, c_n, w.out) : std::vector<uint8_t>();
  uint64_t rng = 88172645463325252ull;
  auto next = [&]() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; };
  // Sparse element (r, c) of the stored matrix, 0 when its block is not stored.
  auto sparse_at = [&](int64_t r, int64_t c) -> double {
    const int64_t bi = r / w.bm, bj = c / w.bk;
    for (int32_t j = pat.row_ptr[size_t(bi)]; j < pat.row_ptr[size_t(bi + 1)]; ++j)
      if (pat.col_idx[size_t(j)] == bj)
        return to_float(hv, sdt, size_t(j) * w.bm * w.bk + size_t(r % w.bm) * w.bk + size_t(c % w.bk));
    return 0.0;
  };
  double worst = 0, scale = 0;
  for (int s = 0; s < 512; ++s) {
    double ref = 0, got = 0;
    if (w.kind == OpKind::sdd) {
      const int64_t j = int64_t(next() % uint64_t(nnzb)), r = int64_t(next() % w.bm), c = int64_t(next() % w.bk);
      int64_t bi = 0;
      while (pat.row_ptr[size_t(bi + 1)] <= j) ++bi;
      const int64_t gr = bi * w.bm + r, gc = int64_t(pat.col_idx[size_t(j)]) * w.bk + c;
      for (int64_t k = 0; k < w.K; ++k)
        ref += double(to_float(ha, w.in, size_t(gr * w.K + k))) * to_float(hb, w.in, size_t(k * w.N + gc));
      got = to_float(hv, sdt, size_t(j) * w.bm * w.bk + size_t(r) * w.bk + size_t(c));
    } else {
      const int64_t r = int64_t(next() % uint64_t(w.M)), c = int64_t(next() % uint64_t(w.N));
      for (int64_t k = 0; k < w.K; ++k) {
        if (w.kind == OpKind::dsd) {
          const double a = w.op == Op::none ? sparse_at(r, k) : sparse_at(k, r);
          if (a != 0) ref += a * to_float(hb, w.in, size_t(k * w.N + c));
        } else {
          const double b = w.op == Op::none ? sparse_at(k, c) : sparse_at(c, k);
          if (b != 0) ref += double(to_float(ha, w.in, size_t(r * w.K + k))) * b;
        }
      }
      got = to_float(hc, w.out, size_t(r * w.N + c));
    }
    worst = std::max(worst, std::fabs(got - ref));
    scale = std::max(scale, std::fabs(ref));
  }
  std::printf("%-44s %9.4f ms  %7.1f eff TFLOPS  (min %.4f max %.4f, %d sets x %d calls, err %.1e)\n",
              w.name.c_str(), ms, flops / (ms * 1e-3) / 1e12, tmin, tmax, nsets, batch, worst / (scale + 1e-30));
  std::printf("RESULT|%s|%.5f|%.2f|%.2e\n", w.name.c_str(), ms, flops / (ms * 1e-3) / 1e12, worst / (scale + 1e-30));
  std::fflush(stdout);
  for (void* p : bufs) SPARSEK_CHECK_CUDA(cudaFree(p));
  SPARSEK_CHECK_CUDA(cudaFree(d_rp));
  SPARSEK_CHECK_CUDA(cudaFree(d_ci));
}

// cuBLAS fp16 x fp16 -> fp16 (fp32 accumulate), n^3: the machine's dense tensor-core rate.
void cublas_dense(int64_t n, int reps) {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { std::printf("cuBLAS unavailable\n"); return; }
  const int sets = 2;
  std::vector<void*> A(sets), B(sets), C(sets);
  for (int s = 0; s < sets; ++s) {
    SPARSEK_CHECK_CUDA(cudaMalloc(&A[s], size_t(n * n) * 2));
    SPARSEK_CHECK_CUDA(cudaMalloc(&B[s], size_t(n * n) * 2));
    SPARSEK_CHECK_CUDA(cudaMalloc(&C[s], size_t(n * n) * 2));
    fill_uniform(A[s], DType::f16, n * n, 5);
    fill_uniform(B[s], DType::f16, n * n, 6);
  }
  const float alpha = 1.f, beta = 0.f;
  auto call = [&](int s) {
    cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &alpha, A[s], CUDA_R_16F,
                                     int(n), B[s], CUDA_R_16F, int(n), &beta, C[s], CUDA_R_16F, int(n),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(Status::cuda_error, "cublasGemmEx failed: " + std::to_string(int(st)));
  };
  const double ms = timing::median(timing::time_gpu(call, 4, reps, sets, 4));  // 4 calls per timing
  std::printf("%-44s %9.4f ms  %7.1f TFLOPS (dense)\n", ("cuBLAS fp16 dense " + std::to_string(n) + "^3").c_str(), ms,
              2.0 * double(n) * n * n / (ms * 1e-3) / 1e12);
  for (int s = 0; s < sets; ++s) {
    SPARSEK_CHECK_CUDA(cudaFree(A[s]));
    SPARSEK_CHECK_CUDA(cudaFree(B[s]));
    SPARSEK_CHECK_CUDA(cudaFree(C[s]));
  }
  cublasDestroy(h);
}

bool selected(const std::string& name, const std::string& filters) {
  if (filters.empty()) return true;
  size_t start = 0;
  while (start <= filters.size()) {
    const size_t end = std::min(filters.find(',', start), filters.size());
    if (name.find(filters.substr(start, end - start)) != std::string::npos) return true;
    start = end + 1;
  }
  return false;
}

int timer_main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  const std::string only = argc > 2 ? argv[2] : "";
  cudaDeviceProp prop{};
  SPARSEK_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB; median of %d batches\n", prop.name, prop.multiProcessorCount,
              int(prop.l2CacheSize >> 20), reps);
  const DType h = DType::f16, b = DType::bf16, f = DType::f32;
  const std::vector<Workload> ws = {
      {"dsd 8192^3 128x32 6.25% f16->f16 (target)", OpKind::dsd, Op::none, 8192, 8192, 8192, 128, 32, 0.0625, h, h},
      {"dsd 8192^3 128x32 6.25% f16->f32", OpKind::dsd, Op::none, 8192, 8192, 8192, 128, 32, 0.0625, h, f},
      {"dsd 8192^3 128x32 6.25% bf16->bf16", OpKind::dsd, Op::none, 8192, 8192, 8192, 128, 32, 0.0625, b, b},
      {"dsd 8192^3 128x128 12.5% f16", OpKind::dsd, Op::none, 8192, 8192, 8192, 128, 128, 0.125, h, h},
      {"dsd 8192^3 64x64 12.5% f16", OpKind::dsd, Op::none, 8192, 8192, 8192, 64, 64, 0.125, h, h},
      {"dsd 8192^3 32x32 12.5% f16", OpKind::dsd, Op::none, 8192, 8192, 8192, 32, 32, 0.125, h, h},
      {"dsd 4096^3 64x64 12.5% f16", OpKind::dsd, Op::none, 4096, 4096, 4096, 64, 64, 0.125, h, h},
      {"dsd 8192^3 128x128 25% f16", OpKind::dsd, Op::none, 8192, 8192, 8192, 128, 128, 0.25, h, h},
      {"dsd 8192^3 16x16 12.5% f16", OpKind::dsd, Op::none, 8192, 8192, 8192, 16, 16, 0.125, h, h},
      {"dds op=trans (x W^T) 8192^3 128x32 6.25% f16", OpKind::dds, Op::trans, 8192, 8192, 8192, 128, 32, 0.0625, h, h},
      {"sdd 8192^3 128x128 12.5% f16", OpKind::sdd, Op::none, 8192, 8192, 8192, 128, 128, 0.125, h, h},
  };
  for (const Workload& w : ws)
    if (selected(w.name, only)) run_workload(w, reps);
  if (only.empty()) cublas_dense(8192, reps);
  return 0;
}

int main(int argc, char** argv) {
  return bench::run_timer("portable_timing", [&] { return timer_main(argc, argv); });
}
