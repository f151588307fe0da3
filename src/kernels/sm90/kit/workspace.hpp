// The Hopper kit, host side: a variant state's device memory as one allocation. prepare() names
// the pieces it needs (arrays to fill later, and host arrays to upload), allocate() makes one
// cudaMalloc, points every piece into it (256-byte aligned, as cudaMalloc's own) and uploads; the
// destructor frees it. One allocation per plan: one call to fail, one number for workspace_bytes().
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparsek::kit {

class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();

  // A piece of `count` elements (at least one: a pointer that is never null), assigned to *slot by
  // allocate(). `slot` must stay where it is until then (a member of the heap-allocated state).
  template <class T>
  void reserve(T** slot, int64_t count) {
    add(reinterpret_cast<void**>(slot), size_t(count > 0 ? count : 1) * sizeof(T), nullptr, 0);
  }
  // `bytes` untyped bytes (scratch of a library call such as cub's sort).
  void reserve_bytes(void** slot, size_t bytes) { add(slot, bytes > 0 ? bytes : 1, nullptr, 0); }
  // The same, filled with a copy of `host` (which must stay alive until allocate()).
  template <class T>
  void upload(T** slot, const std::vector<T>& host) {
    add(reinterpret_cast<void**>(slot), (host.empty() ? 1 : host.size()) * sizeof(T), host.data(),
        host.size() * sizeof(T));
  }
  // One cudaMalloc for every piece named so far; throws Error(cuda_error) naming `what` on failure.
  void allocate(const char* what);
  size_t bytes() const { return bytes_; }

 private:
  struct Piece {
    void** slot;
    size_t offset, bytes;
    const void* host;
    size_t host_bytes;
  };
  void add(void** slot, size_t bytes, const void* host, size_t host_bytes);
  std::vector<Piece> pieces_;
  size_t bytes_ = 0;
  void* base_ = nullptr;
};

}  // namespace sparsek::kit
