// A build without CUDA (SPARSEK_CUDA=OFF): the GPU-only pieces of the timing library (the read
// floor's kernel, cuBLASLt's dense fp8 GEMM) as stand-ins that say why they cannot run. The CLI
// reaches them only on GPU paths, which refuse earlier; these keep the link whole.
#include "core/no_gpu.hpp"
#include "dense_fp8.hpp"
#include "read_floor.hpp"

namespace sparsek::timing {

struct DenseFp8Gemm::Impl {};

DenseFp8Gemm::DenseFp8Gemm(int64_t, int64_t, int64_t, DType) : impl_(nullptr) {
  throw Error(Status::unsupported, std::string("cuBLASLt's dense fp8 GEMM: ") + kNoCudaBuild);
}
DenseFp8Gemm::~DenseFp8Gemm() = default;
void DenseFp8Gemm::run(const void*, const void*, void*, const float*, const float*, void*) const {}

ReadFloor read_time(size_t, ReadConfig, int, int, int, bool, void*) {
  throw Error(Status::unsupported, std::string("the read floor: ") + kNoCudaBuild);
}
ReadFloor read_floor(size_t, int, int, int, bool, void*) {
  throw Error(Status::unsupported, std::string("the read floor: ") + kNoCudaBuild);
}

}  // namespace sparsek::timing
