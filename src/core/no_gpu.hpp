// Internal: whether this build carries its GPU backends, and the error a GPU path gives when no
// GPU answers (for want of a device, or of CUDA in the build).
#pragma once
#include <string>

#include "sparsek/types.hpp"

namespace sparsek {

// SPARSEK_CUDA=ON builds the GPU backends. Without them (SPARSEK_CUDA=OFF, and the fuzz build) no
// device ever answers (core/cuda_host.hpp), and every GPU path says why (no_gpu_error()).
#ifdef SPARSEK_NO_CUDA
inline constexpr bool kBuiltWithCuda = false;
#else
inline constexpr bool kBuiltWithCuda = true;
#endif
inline constexpr const char* kNoCudaBuild =
    "this sparsek was built without CUDA (SPARSEK_CUDA=OFF): only the CPU backend is available";

// The error for `what` (what needed a GPU: "backend cuda", "operands in device memory") when no GPU
// answers (device_info().available is false): in a build without CUDA Status::unsupported,
// "<what>: this sparsek was built without CUDA ..."; else Status::no_device, `no_device_text`
// followed by device_info().why_not. (core/device.cpp)
Error no_gpu_error(const std::string& what, const std::string& no_device_text);

}  // namespace sparsek
