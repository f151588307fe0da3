// GPU test helpers of the distributed suites (tests/gpu/test_distributed.cpp,
// tests/gpu/test_attention_cp.cpp): NCCL communicators made by the test, device copies of host bytes.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/nccl.hpp"

namespace sparsek::test {

// Communicators over devices 0..n-1, made by one process (destroyed at the end).
struct Comms {
  std::vector<ncclComm*> c;
  explicit Comms(int n) : c(size_t(n), nullptr) {
    std::vector<int> devs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) devs[size_t(i)] = i;
    nccl::check(nccl::api().CommInitAll(c.data(), n, devs.data()), "ncclCommInitAll");
  }
  ~Comms() {
    for (ncclComm* x : c)
      if (x) nccl::api().CommDestroy(x);
  }
};

// A device allocation holding a copy of host bytes, on the current device.
struct Dev {
  void* p = nullptr;
  size_t n = 0;
  explicit Dev(const void* host, size_t bytes) : n(bytes) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    if (bytes && cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) throw std::runtime_error("cudaMemcpy");
  }
  ~Dev() { cudaFree(p); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(n);
    if (n && cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("cudaMemcpy D2H");
    return h;
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

}  // namespace sparsek::test
