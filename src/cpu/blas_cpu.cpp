// The CPU backend's GEMM through OpenBLAS (see blas_cpu.hpp). Only this file sees cblas.h: the
// build defines SPARSEK_HAVE_OPENBLAS and OpenBLAS's include directory for it alone.
#include "cpu/blas_cpu.hpp"

#include <climits>
#include <mutex>
#include <string>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sparsek/types.hpp"  // Error

#ifdef SPARSEK_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace sparsek {

#ifdef SPARSEK_HAVE_OPENBLAS

namespace {
// Guards the pthreads variant's process-wide thread count (see CpuBlasOneThread).
std::mutex g_mu;
int g_open = 0;   // scopes open
int g_saved = 0;  // the count before the first of them
}  // namespace

bool cpu_blas_available() {
  static const bool ok = openblas_get_parallel() != OPENBLAS_SEQUENTIAL;
  return ok;
}

// The OPENBLAS_CORETYPE that selects OpenBLAS's vector kernels for this CPU when OpenBLAS fell
// back to its generic SSE3 ones ("Prescott": what an OpenBLAS older than the CPU model picks,
// e.g. Debian 12's 0.3.21 on a 5th-generation Xeon), else "".
static std::string coretype_hint() {
  if (std::string(openblas_get_corename()) != "Prescott") return "";
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

std::string cpu_blas_description() {
  std::string s = openblas_get_config();
  while (!s.empty() && s.back() == ' ') s.pop_back();
  s += std::string(", core ") + openblas_get_corename();
  switch (openblas_get_parallel()) {
    case OPENBLAS_SEQUENTIAL:
      s += " (single-threaded variant, not safe to call from several threads: the backend's own loops run)";
      break;
    case OPENBLAS_THREAD: s += " (pthreads, one thread per call)"; break;
    default: s += " (OpenMP, one thread per call)"; break;
  }
  const std::string hint = cpu_blas_available() ? coretype_hint() : "";
  if (!hint.empty())
    s += "; this OpenBLAS does not know the CPU and runs generic kernels: OPENBLAS_CORETYPE=" + hint +
         " in the environment selects its vector kernels (several times faster)";
  return s;
}

bool cpu_blas_fits(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  for (int64_t v : {m, n, k, lda, ldb, ldc})
    if (v < 0 || v > INT_MAX) return false;
  return true;
}

void cpu_sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
               bool accumulate, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(m), blasint(n), blasint(k), 1.f, a, blasint(lda),
              b, blasint(ldb), accumulate ? 1.f : 0.f, c, blasint(ldc));
}

CpuBlasOneThread::CpuBlasOneThread() {
  if (!cpu_blas_available()) return;
  active_ = true;
  if (openblas_get_parallel() == OPENBLAS_THREAD) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_open++ == 0) {
      g_saved = openblas_get_num_threads();
      if (g_saved != 1) openblas_set_num_threads(1);
    }
  } else {
#ifdef _OPENMP
    // OpenBLAS's OpenMP variant runs one thread inside a parallel region, and outside one as many
    // as the calling thread's OpenMP count: the backend's serial path (one thread) is outside.
    saved_omp_ = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
  }
}

CpuBlasOneThread::~CpuBlasOneThread() {
  if (!active_) return;
  if (openblas_get_parallel() == OPENBLAS_THREAD) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (--g_open == 0 && g_saved != 1) openblas_set_num_threads(g_saved);
  } else {
#ifdef _OPENMP
    omp_set_num_threads(saved_omp_);
#endif
  }
}

#else  // built without OpenBLAS

bool cpu_blas_available() { return false; }
std::string cpu_blas_description() { return "none (built without OpenBLAS: the backend's own loops run)"; }
bool cpu_blas_fits(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
void cpu_sgemm(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, bool, float*, int64_t) {
  throw Error(Status::internal, "cpu backend: cpu_sgemm called in a build without OpenBLAS");
}
CpuBlasOneThread::CpuBlasOneThread() {}
CpuBlasOneThread::~CpuBlasOneThread() {}

#endif

}  // namespace sparsek
