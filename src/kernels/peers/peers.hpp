// Internal: the peer libraries (cuSPARSE, cuBLAS) wrapped as DSD variants, split so that the
// benchmark can time a peer's core library call alone, the way the peers publish their numbers.
//
//   run(args) = convert(args) + core(args)
//     cusparse_bsr:  convert = zero C when beta = 0;        core = cusparseSpMM (BSR_ALG1)
//     cusparse_ell:  convert = gather values into Blocked-ELL layout (+ zero C when beta = 0);
//                    core = cusparseSpMM (BLOCKED_ELL_ALG1)
//     cublas_dense:  convert = scatter values into the densified A; core = cublasGemmEx
//
// The state from the variant's prepare() is a PeerState; core() needs a convert() on the same
// values first (the converted data lives in the state).
#pragma once
#include <string>

#include "plan/variant.hpp"

namespace sparsek::peers {

struct PeerState : VariantState {
  // Both enqueue on `stream` (a cudaStream_t) and do not synchronize.
  virtual void convert(const GemmArgs& args, void* stream) = 0;
  virtual void core(const GemmArgs& args, void* stream) = 0;
};

// Throws Error(cuda_error) naming the call and the library's status name when status != success;
// a NOT_SUPPORTED status becomes Error(unsupported) (the library rejects a valid problem).
void check_cusparse(int status, const char* what);
void check_cublas(int status, const char* what);

// "13.1.0" style versions of the libraries this build links (empty when unavailable).
std::string cublas_version();
std::string cusparse_version();

// Which code the current device loaded for one of the library's kernels (cudaFuncGetAttributes):
// binary_version / ptx_version as major*10+minor. Throws Error(cuda_error) when no image fits.
void kernel_image(int* binary_version, int* ptx_version);

}  // namespace sparsek::peers
