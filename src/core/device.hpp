// Internal: what GPU (if any) answers. Any CUDA error from cudaGetDeviceCount means "no GPU".
#pragma once
#include <string>

namespace sparsek {

struct DeviceInfo {
  bool available = false;
  std::string why_not;  // set when !available
  int device = -1;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t smem_per_block_optin = 0;
  size_t l2_bytes = 0;
  int driver_version = 0, runtime_version = 0;
};

// Makes `dev` current for the scope (restores the previous device).
class DeviceScope {
 public:
  explicit DeviceScope(int dev);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

// Info of the current device, queried once per device and cached (thread-safe).
const DeviceInfo& device_info();

// Throws Error(cuda_error) with the CUDA error text when err != 0. `what` names the call.
void check_cuda(int err, const char* what);

// Whether this build carries sm_90a code for `kernel` (the address of a __global__ function): a
// build for 80 alone runs sm_80 code on Hopper, which for the Hopper kernels is an empty kernel.
// Any CUDA error answers false.
bool has_sm90a_code(const void* kernel);
inline constexpr const char* kNoSm90aCode = "this build carries no sm_90a code (SPARSEK_CUDA_GENCODE lacks 90a)";

}  // namespace sparsek
