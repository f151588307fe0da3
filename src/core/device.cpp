#include "core/device.hpp"

#include "core/cuda_host.hpp"
#include "core/no_gpu.hpp"

#include <map>
#include <mutex>

#include "sparsek/types.hpp"

namespace sparsek {

void check_cuda(int err, const char* what) {
  if (err == 0) return;
  auto e = static_cast<cudaError_t>(err);
  throw Error(Status::cuda_error, std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                                      cudaGetErrorString(e) + ")");
}

DeviceScope::DeviceScope(int dev) {
  check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
  if (dev != prev_) check_cuda(cudaSetDevice(dev), "cudaSetDevice");
}
DeviceScope::~DeviceScope() { cudaSetDevice(prev_); }

Error no_gpu_error(const std::string& what, const std::string& no_device_text) {
  if (!kBuiltWithCuda) return Error(Status::unsupported, what + ": " + kNoCudaBuild);
  return Error(Status::no_device, no_device_text + device_info().why_not);
}

bool has_sm90a_code(const void* kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.binaryVersion >= 90;
}

const DeviceInfo& device_info() {
  static std::mutex mu;
  static std::map<int, DeviceInfo> cache;
  static DeviceInfo none;
  std::lock_guard<std::mutex> lock(mu);
  if (!kBuiltWithCuda) {
    none.why_not = kNoCudaBuild;
    return none;
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    // NOTE: on a machine without a driver this is an error, not 0 devices: both mean "no GPU".
    if (err != cudaSuccess) cudaGetLastError();  // clear the sticky-free error state
    none.available = false;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);  // 0: no driver library at all
    cudaRuntimeGetVersion(&runtime);
    // NOTE: without any driver the runtime reports cudaErrorInsufficientDriver too: tell the two apart.
    if (err == cudaErrorInsufficientDriver && driver == 0)
      none.why_not = "no NVIDIA driver found (no NVIDIA GPU here, or its driver is not installed)";
    else if (err == cudaErrorInsufficientDriver)
      none.why_not = "the NVIDIA driver (CUDA " + std::to_string(driver / 1000) + "." +
                     std::to_string(driver % 1000 / 10) + ") is older than this build's CUDA " +
                     std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) +
                     " runtime: update the driver (sparsek doctor names the version)";
    else
      none.why_not = err != cudaSuccess ? std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) +
                                              " (" + cudaGetErrorString(err) + ")"
                                        : "no CUDA device found";
    return none;
  }
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  DeviceInfo info;
  cudaDeviceProp p{};
  check_cuda(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  info.available = true;
  info.device = dev;
  info.name = p.name;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.sm_count = p.multiProcessorCount;
  info.smem_per_block_optin = p.sharedMemPerBlockOptin;
  info.l2_bytes = p.l2CacheSize;
  cudaDriverGetVersion(&info.driver_version);
  cudaRuntimeGetVersion(&info.runtime_version);
  return cache.emplace(dev, info).first->second;
}

}  // namespace sparsek
