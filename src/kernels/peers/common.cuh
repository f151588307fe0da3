// Internal to the peers: what the cuSPARSE and cuBLAS wrappers share (common.cu) and each peer's
// variant row (why_not, prepare), which common.cu lists in peer_variants().
#pragma once
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/peers/peers.hpp"
#include "plan/variant.hpp"

namespace sparsek::peers {

int grid_for(int64_t work, int per);
// C = beta * C (beta = 0 never reads C), on s.
void scale_c(const DenseView& c, float beta, cudaStream_t s);
// C = 0 (cuSPARSE does not promise to leave C unread when beta = 0).
void zero_c(const DenseView& c, cudaStream_t s);
cudaDataType cuda_type(DType d);
// Device memory, a type combination the libraries take, int32 extents (as the DSD the peers run).
std::string common_why_not(const GemmArgs& args);
std::vector<int32_t> copy_to_host(const int32_t* p, int64_t n, Memory mem);

// A device buffer owned by a state.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  void alloc(size_t n, const char* what);
  ~DevBuf();
  template <typename T> T* as() const { return static_cast<T*>(p); }
};
int32_t* upload(DevBuf& buf, const std::vector<int32_t>& h, const char* what);
// Stored blocks of g's sparse operand into a row-major 2-D destination (densified A, or Blocked-ELL
// values; common.cu's place_blocks says how the positions are chosen).
void launch_place(const GemmArgs& g, void* dst, const int32_t* block_row, const int32_t* col_idx, int slots,
                  int64_t ld_elems, cudaStream_t s);
// run() of every peer: the PeerState's convert, then its core.
void peer_run(const GemmArgs& g, const Options& o, VariantState* state);

// The rows of peer_variants(): cusparse.cu, cublas.cu.
std::string bsr_why_not(const GemmArgs& args);
std::string ell_why_not(const GemmArgs& args);
std::unique_ptr<VariantState> cusparse_prepare(const GemmArgs& args, bool ell);
std::string cublas_why_not(const GemmArgs& g);
std::unique_ptr<VariantState> cublas_prepare(const GemmArgs& g, const Options&);
std::string batched_why_not(const GemmArgs& g);
std::unique_ptr<VariantState> batched_prepare(const GemmArgs& g, const Options&);

}  // namespace sparsek::peers
