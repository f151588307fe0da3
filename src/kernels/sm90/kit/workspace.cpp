// A variant state's device memory as one allocation (workspace.hpp).
#include "kernels/sm90/kit/workspace.hpp"

#include <cuda_runtime.h>

#include <string>

#include "core/device.hpp"

namespace sparsek::kit {

void Workspace::add(void** slot, size_t bytes, const void* host, size_t host_bytes) {
  const size_t offset = (bytes_ + 255) / 256 * 256;
  pieces_.push_back({slot, offset, bytes, host, host_bytes});
  bytes_ = offset + bytes;
}

void Workspace::allocate(const char* what) {
  if (pieces_.empty() || base_) return;
  check_cuda(cudaMalloc(&base_, bytes_), (std::string("cudaMalloc(") + what + ", " + std::to_string(bytes_) +
                                          " bytes)").c_str());
  for (const Piece& p : pieces_) {
    *p.slot = static_cast<char*>(base_) + p.offset;
    if (p.host_bytes > 0)
      check_cuda(cudaMemcpy(*p.slot, p.host, p.host_bytes, cudaMemcpyHostToDevice),
                 (std::string("cudaMemcpy(") + what + ")").c_str());
  }
}

// NOTE: cudaFree waits for the device, so a launch still reading the workspace is safe (the
// one-shot API destroys a plan right after enqueueing its run).
Workspace::~Workspace() {
  if (base_) cudaFree(base_);
}

}  // namespace sparsek::kit
