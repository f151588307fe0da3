// Times the "hopper" variant on the DSD target workloads and the shapes beside them:
//   cmake --build build --target hopper_timer
//   build/hopper_timer [filter ...]    (the rows whose name contains any of the filters)
// Per workload: random data generated on the device, the schedule prepared once, 5 warm-up runs,
// then 40 timed runs (20 for the single-item schedule; CUDA events between the runs, the stream
// held: timing.hpp), median reported as effective TFLOPS (2 * nnzb * bm * bk * N / time). Inputs
// rotate over several sets when one set fits in L2. 64 sampled outputs are checked against an fp64
// host reference.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"
#include "timer.cuh"
#include "tools_internal.hpp"

using namespace sparsek;
using bench::fill_uniform;
using bench::to_f;

struct Work {
  const char* name;
  int64_t m, k, n;
  int bm, bk;
  double density;
  PatternKind kind;
  DType dt;
  bool also_single;     // also time the non-persistent schedule (one item per CTA)
  bool cols = false;    // B and C column-major (the DSD view of the layer forward y = x * W^T)
  float beta = 0.f;     // beta != 0: C is read (the check runs once more on a C of known values)
  bool c32 = false;     // f32 C
};

struct Set {
  void* vals = nullptr;
  void* b = nullptr;
  void* c = nullptr;
};

// Times v->run over the sets; returns the median ms.
double time_runs(const Variant* v, std::vector<GemmArgs>& args, VariantState* st, int reps) {
  Options o;
  o.backend = Backend::cuda;
  const std::vector<double> ms = timing::time_gpu([&](int s) { v->run(args[size_t(s)], o, st); }, 5, reps,
                                                  int(args.size()));
  SPARSEK_CHECK_CUDA(cudaGetLastError());
  return timing::median(ms);
}

struct Row {
  std::string name;
  double tf_persistent = 0, tf_single = 0, ms = 0, err = 0;
};

Row run_work(const Work& w, const Variant* v) {
  Row row;
  row.name = w.name;
  const bool bf16 = w.dt == DType::bf16;
  Pattern pat = make_pattern(w.kind, w.m / w.bm, w.k / w.bk, w.density, 42);
  const int64_t nnzb = pat.nnzb();
  int32_t *d_rp, *d_ci;
  SPARSEK_CHECK_CUDA(cudaMalloc(&d_rp, pat.row_ptr.size() * 4));
  SPARSEK_CHECK_CUDA(cudaMalloc(&d_ci, std::max<size_t>(1, pat.col_idx.size()) * 4));
  SPARSEK_CHECK_CUDA(cudaMemcpy(d_rp, pat.row_ptr.data(), pat.row_ptr.size() * 4, cudaMemcpyHostToDevice));
  SPARSEK_CHECK_CUDA(cudaMemcpy(d_ci, pat.col_idx.data(), pat.col_idx.size() * 4, cudaMemcpyHostToDevice));
  const int64_t nv = nnzb * w.bm * w.bk, nb = w.k * w.n, nc = w.m * w.n;
  const double set_bytes = 2.0 * double(nv + nb + nc);
  const int sets = int(std::min(4.0, std::ceil(200e6 / set_bytes)));
  std::vector<Set> S(static_cast<size_t>(sets));
  std::vector<GemmArgs> args;
  for (int s = 0; s < sets; ++s) {
    SPARSEK_CHECK_CUDA(cudaMalloc(&S[s].vals, size_t(nv) * 2));
    SPARSEK_CHECK_CUDA(cudaMalloc(&S[s].b, size_t(nb) * 2));
    SPARSEK_CHECK_CUDA(cudaMalloc(&S[s].c, size_t(nc) * (w.c32 ? 4 : 2)));
    fill_uniform(S[s].vals, w.dt, nv, 11 + s);
    fill_uniform(S[s].b, w.dt, nb, 23 + s);
    // NaN poison: beta = 0 must overwrite it
    SPARSEK_CHECK_CUDA(cudaMemset(S[s].c, 0xff, size_t(nc) * (w.c32 ? 4 : 2)));
    GemmArgs g;
    g.kind = OpKind::dsd;
    g.sparse = BsrView{w.m, w.k, w.bm, w.bk, nnzb, d_rp, d_ci, S[s].vals, w.dt, Memory::device};
    const Layout lay = w.cols ? Layout::col_major : Layout::row_major;
    g.b = DenseView{S[s].b, w.k, w.n, w.cols ? w.k : w.n, lay, w.dt, Memory::device};
    g.c = DenseView{S[s].c, w.m, w.n, w.cols ? w.m : w.n, lay, w.c32 ? DType::f32 : w.dt, Memory::device};
    g.beta = w.beta;
    args.push_back(g);
  }
  SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());
  const std::string why = v->why_not(args[0]);
  if (!why.empty()) {
    std::printf("%s: hopper does not support it: %s\n", w.name, why.c_str());
    return row;
  }
  Options o;
  o.backend = Backend::cuda;
  const double flops = 2.0 * double(nnzb) * w.bm * w.bk * double(w.n);
  // The schedule the caller asked for (SPARSEK_HOPPER_SCHEDULE), restored after the single-item pass.
  const char* env = std::getenv("SPARSEK_HOPPER_SCHEDULE");
  const std::string asked = env ? env : "";
  auto restore = [&] {
    if (asked.empty())
      unsetenv("SPARSEK_HOPPER_SCHEDULE");
    else
      setenv("SPARSEK_HOPPER_SCHEDULE", asked.c_str(), 1);
  };
  {
    auto st = v->prepare(args[0], o);
    const double ms = time_runs(v, args, st.get(), 40);
    row.ms = ms;
    row.tf_persistent = flops / (ms * 1e-3) / 1e12;
  }
  if (w.also_single) {
    setenv("SPARSEK_HOPPER_SCHEDULE", "single", 1);
    auto st = v->prepare(args[0], o);
    const double ms = time_runs(v, args, st.get(), 20);
    row.tf_single = flops / (ms * 1e-3) / 1e12;
    restore();
    auto st2 = v->prepare(args[0], o);  // leave set 0's C from the persistent schedule for the check
    v->run(args[0], o, st2.get());
  }
  SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());
  // Check 64 sampled outputs of set 0 against fp64 on the host.
  std::vector<uint16_t> hv(static_cast<size_t>(nv)), hb(static_cast<size_t>(nb)), hc(static_cast<size_t>(nc));
  std::vector<uint16_t> hc0;  // beta != 0: C before the checked run (16-bit C only)
  if (w.beta != 0.f && !w.c32) {
    fill_uniform(S[0].c, w.dt, nc, 31);
    hc0.resize(static_cast<size_t>(nc));
    SPARSEK_CHECK_CUDA(cudaMemcpy(hc0.data(), S[0].c, hc0.size() * 2, cudaMemcpyDeviceToHost));
    auto st = v->prepare(args[0], o);
    v->run(args[0], o, st.get());
    SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());
  }
  SPARSEK_CHECK_CUDA(cudaMemcpy(hv.data(), S[0].vals, hv.size() * 2, cudaMemcpyDeviceToHost));
  SPARSEK_CHECK_CUDA(cudaMemcpy(hb.data(), S[0].b, hb.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> hc32(w.c32 ? static_cast<size_t>(nc) : 0);
  if (w.c32)
    SPARSEK_CHECK_CUDA(cudaMemcpy(hc32.data(), S[0].c, hc32.size() * 4, cudaMemcpyDeviceToHost));
  else
    SPARSEK_CHECK_CUDA(cudaMemcpy(hc.data(), S[0].c, hc.size() * 2, cudaMemcpyDeviceToHost));
  std::mt19937_64 rng(5);
  double worst = 0;
  for (int t = 0; t < 64; ++t) {
    const int64_t m = int64_t(rng() % uint64_t(w.m)), n = int64_t(rng() % uint64_t(w.n));
    const int64_t r = m / w.bm, rr = m % w.bm;
    double ref = 0, mag = 0;
    for (int32_t j = pat.row_ptr[r]; j < pat.row_ptr[r + 1]; ++j)
      for (int c = 0; c < w.bk; ++c) {
        const double a = to_f(hv[size_t((int64_t(j) * w.bm + rr) * w.bk + c)], bf16);
        const int64_t kk = int64_t(pat.col_idx[j]) * w.bk + c;
        const double b = to_f(hb[size_t(w.cols ? kk + n * w.k : kk * w.n + n)], bf16);
        ref += a * b;
        mag += std::fabs(a * b);
      }
    const size_t ci = size_t(w.cols ? m + n * w.m : m * w.n + n);
    if (!hc0.empty()) {
      ref += double(w.beta) * to_f(hc0[ci], bf16);
      mag += std::fabs(double(w.beta) * to_f(hc0[ci], bf16));
    }
    const double got = w.c32 ? double(hc32[ci]) : to_f(hc[ci], bf16);
    const double e = std::fabs(got - ref) / std::max(1.0, mag);
    worst = std::isfinite(got) ? std::max(worst, e) : INFINITY;
  }
  row.err = worst;
  for (auto& s : S) {
    SPARSEK_CHECK_CUDA(cudaFree(s.vals));
    SPARSEK_CHECK_CUDA(cudaFree(s.b));
    SPARSEK_CHECK_CUDA(cudaFree(s.c));
  }
  SPARSEK_CHECK_CUDA(cudaFree(d_rp));
  SPARSEK_CHECK_CUDA(cudaFree(d_ci));
  return row;
}

double cublas_dense_tflops(int64_t n, bool bf16) {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
  void *a, *b, *c;
  SPARSEK_CHECK_CUDA(cudaMalloc(&a, size_t(n * n) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&b, size_t(n * n) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&c, size_t(n * n) * 2));
  const DType dt = bf16 ? DType::bf16 : DType::f16;
  fill_uniform(a, dt, n * n, 1);
  fill_uniform(b, dt, n * n, 2);
  const float one = 1.f, zero = 0.f;
  const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  auto go = [&] {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &one, a, t, int(n), b, t, int(n), &zero, c,
                        t, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  const double ms = timing::median(timing::time_gpu([&](int) { go(); }, 5, 20, 1));
  SPARSEK_CHECK_CUDA(cudaFree(a));
  SPARSEK_CHECK_CUDA(cudaFree(b));
  SPARSEK_CHECK_CUDA(cudaFree(c));
  cublasDestroy(h);
  return 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
}

int timer_main(int argc, char** argv) {
  const std::vector<std::string> filters(argv + 1, argv + argc);
  auto wanted = [&](const std::string& name) {
    if (filters.empty()) return true;
    for (const std::string& f : filters)
      if (name.find(f) != std::string::npos) return true;
    return false;
  };
  const Variant* v = find_variant("hopper");
  if (!v) {
    std::fprintf(stderr, "no hopper variant\n");
    return 1;
  }
  cudaDeviceProp prop{};
  SPARSEK_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const Work works[] = {
      {"8192^3 128x128 12.5% f16", 8192, 8192, 8192, 128, 128, 0.125, PatternKind::fixed_k, DType::f16, true},
      {"8192^3 128x128 12.5% bf16", 8192, 8192, 8192, 128, 128, 0.125, PatternKind::fixed_k, DType::bf16, false},
      {"8192^3 64x64 12.5% f16", 8192, 8192, 8192, 64, 64, 0.125, PatternKind::fixed_k, DType::f16, true},
      {"8192^3 32x32 12.5% f16", 8192, 8192, 8192, 32, 32, 0.125, PatternKind::fixed_k, DType::f16, false},
      {"4096^3 64x64 12.5% f16", 4096, 4096, 4096, 64, 64, 0.125, PatternKind::fixed_k, DType::f16, true},
      {"8192^3 128x128 25% f16", 8192, 8192, 8192, 128, 128, 0.25, PatternKind::fixed_k, DType::f16, false},
      {"8192^3 128x32 6.25% f16", 8192, 8192, 8192, 128, 32, 0.0625, PatternKind::fixed_k, DType::f16, false},
      {"8192^3 128x64 12.5% f16", 8192, 8192, 8192, 128, 64, 0.125, PatternKind::fixed_k, DType::f16, false},
      {"8192^3 64x64 12.5% power-law f16", 8192, 8192, 8192, 64, 64, 0.125, PatternKind::power_law, DType::f16, false},
      // Few N tiles: one long row is many CTAs' share of the work (split rows)
      {"8192^2 N=256 64x64 12.5% f16", 8192, 8192, 256, 64, 64, 0.125, PatternKind::fixed_k, DType::f16, false},
      {"8192^2 N=256 64x64 12.5% power-law f16", 8192, 8192, 256, 64, 64, 0.125, PatternKind::power_law, DType::f16, false},
      {"8192^2 N=512 128x128 12.5% f16", 8192, 8192, 512, 128, 128, 0.125, PatternKind::fixed_k, DType::f16, false},
      {"8192^2 N=512 128x128 12.5% power-law f16", 8192, 8192, 512, 128, 128, 0.125, PatternKind::power_law, DType::f16, false},
      // Structured patterns and the other operand layouts (the serving and products tables' rows)
      {"8192^3 128x128 12.5% power-law f16", 8192, 8192, 8192, 128, 128, 0.125, PatternKind::power_law, DType::f16, false},
      {"8192^3 128x128 block-diagonal f16", 8192, 8192, 8192, 128, 128, 0.125, PatternKind::block_diagonal, DType::f16, false},
      {"8192^3 64x64 12.5% banded f16", 8192, 8192, 8192, 64, 64, 0.125, PatternKind::banded, DType::f16, false},
      {"8192^3 64x64 causal f16", 8192, 8192, 8192, 64, 64, 0.5, PatternKind::causal, DType::f16, false},
      {"8192^3 128x128 12.5% B, C col-major f16", 8192, 8192, 8192, 128, 128, 0.125, PatternKind::fixed_k, DType::f16, false, true},
      {"8192^3 128x128 12.5% beta 0.5 f16", 8192, 8192, 8192, 128, 128, 0.125, PatternKind::fixed_k, DType::f16, false, false, 0.5f},
      {"8192^3 128x128 12.5% f32 C f16", 8192, 8192, 8192, 128, 128, 0.125, PatternKind::fixed_k, DType::f16, false, false, 0.f, true},
      {"8192^3 64x64 12.5% f32 C f16", 8192, 8192, 8192, 64, 64, 0.125, PatternKind::fixed_k, DType::f16, false, false, 0.f, true},
  };
  std::vector<Row> rows;
  for (const Work& w : works) {
    if (!wanted(w.name)) continue;
    rows.push_back(run_work(w, v));
    std::fflush(stdout);
  }
  const double dense = filters.empty() ? cublas_dense_tflops(8192, false) : 0;
  std::printf("\n%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("%-36s %10s %10s %12s %10s\n", "workload", "ms", "TFLOPS", "single-item", "max err");
  for (const Row& r : rows)
    std::printf("%-36s %10.3f %10.1f %12.1f %10.2e\n", r.name.c_str(), r.ms, r.tf_persistent, r.tf_single, r.err);
  if (dense > 0) std::printf("cuBLAS dense f16 8192^3: %.1f TFLOPS\n", dense);
  return 0;
}

int main(int argc, char** argv) {
  return bench::run_timer("hopper_timer", [&] { return timer_main(argc, argv); });
}
