// Internal: the CPU backend's single-precision GEMM through OpenBLAS, when the build found it
// (pkg-config `openblas`; SPARSEK_OPENBLAS=OFF or a build without it keeps the backend's own loops).
#pragma once
#include <cstdint>
#include <string>

namespace sparsek {

// True when cpu_sgemm may be called, from any number of the backend's threads at once: the build
// links OpenBLAS and the OpenBLAS loaded at run time is its pthreads or OpenMP variant (the
// single-threaded variant Debian ships is built without locks: concurrent calls race inside it).
// The answer is fixed for the process, so every thread count takes the same path.
bool cpu_blas_available();

// "OpenBLAS 0.3.21 ... (pthreads)" or why the backend's own loops run instead.
std::string cpu_blas_description();

// True when every extent and leading dimension fits the BLAS interface's int.
bool cpu_blas_fits(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc);

// Row-major c (m x n, row stride ldc) = a (m x k, lda) * b (k x n, ldb) + (accumulate ? c : 0).
// With accumulate false, c is not read. Needs cpu_blas_available() and cpu_blas_fits(); runs on
// the calling thread only (inside a CpuBlasOneThread scope).
void cpu_sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
               bool accumulate, float* c, int64_t ldc);

// While one exists, OpenBLAS runs each call on its calling thread: the backend's own threads
// split the work into tiles fixed by the problem, so results are the same bits for any thread
// count, and BLAS threads never pile onto the backend's. Make it on the thread that starts the
// parallel loop, after the loop's thread count is known. The pthreads variant has one
// process-wide thread count: it is set to 1 while any scope is open and restored when the last
// closes (a caller's own OpenBLAS calls meanwhile run on one thread too). The OpenMP variant is
// set through the calling thread's OpenMP thread count, restored at the end.
class CpuBlasOneThread {
 public:
  CpuBlasOneThread();
  ~CpuBlasOneThread();
  CpuBlasOneThread(const CpuBlasOneThread&) = delete;
  CpuBlasOneThread& operator=(const CpuBlasOneThread&) = delete;

 private:
  int saved_omp_ = 0;  // OpenMP variant: the calling thread's count before the scope
  bool active_ = false;
};

}  // namespace sparsek
