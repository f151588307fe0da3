// GPU test helper: the device twin of a host-built GemmCase (test_util.hpp), so that a case is
// built and checked on the host and run on the device through any CUDA variant.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <stdexcept>

#include "test_util.hpp"

namespace sparsek::test {

// A device copy of a host buffer (its whole storage, leading-dimension padding included).
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const void* host, size_t n, size_t offset = 0) : bytes(n) {
    void* base = nullptr;
    if (cudaMalloc(&base, n + offset + 16) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    raw = base;
    ptr = static_cast<uint8_t*>(base) + offset;  // offset != 0: deliberately misaligned
    if (n && cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy H2D failed");
  }
  void download(void* host) const {
    if (bytes && cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy D2H failed");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(raw); }

 private:
  void* raw = nullptr;
};

// The device twin of a GemmCase: same views, device pointers.
struct DeviceCase {
  std::unique_ptr<DeviceBuffer> row_ptr, col_idx, values, a, b, c;
  std::unique_ptr<DeviceBuffer> sparse_scales, dense_scales;  // e4m3 cases
  GemmArgs args;
  // dense_offset: bytes added to every dense operand's device pointer (misalignment tests).
  explicit DeviceCase(GemmCase& gc, size_t dense_offset = 0) {
    args = gc.args;
    const BsrMatrix& s = gc.sparse;
    row_ptr = std::make_unique<DeviceBuffer>(s.row_ptr().data(), s.row_ptr().size() * 4);
    col_idx = std::make_unique<DeviceBuffer>(s.col_idx().data(), s.col_idx().size() * 4);
    values = std::make_unique<DeviceBuffer>(s.value_bytes().data(), s.value_bytes().size());
    args.sparse.row_ptr = static_cast<const int32_t*>(row_ptr->ptr);
    args.sparse.col_idx = s.nnzb() ? static_cast<const int32_t*>(col_idx->ptr) : nullptr;
    args.sparse.values = s.nnzb() ? values->ptr : nullptr;
    args.sparse.memory = Memory::device;
    auto dense = [&](std::unique_ptr<HostDense>& h, std::unique_ptr<DeviceBuffer>& d, DenseView& v) {
      if (!h) return;
      d = std::make_unique<DeviceBuffer>(h->bytes.data(), h->bytes.size(), dense_offset);
      v.data = d->ptr;
      v.memory = Memory::device;
    };
    dense(gc.a, a, args.a);
    dense(gc.b, b, args.b);
    dense(gc.c, c, args.c);
    if (s.dtype() == DType::e4m3 && s.nnzb()) {
      sparse_scales = std::make_unique<DeviceBuffer>(s.scales().data(), s.scales().size() * 4);
      args.sparse.scales = static_cast<const float*>(sparse_scales->ptr);
    }
    if (!gc.dense_scales.empty()) {
      dense_scales = std::make_unique<DeviceBuffer>(gc.dense_scales.data(), gc.dense_scales.size() * 4);
      (args.kind == OpKind::dsd ? args.b : args.a).scales = static_cast<const float*>(dense_scales->ptr);
    }
  }
  // Copies the output back into the host case (C's whole storage, or C's BSR values).
  void download(GemmCase& gc) const {
    if (gc.args.kind == OpKind::sdd) values->download(gc.sparse.value_bytes().data());
    else c->download(gc.c->bytes.data());
  }
};

}  // namespace sparsek::test
