// Host side of a kernel's launch (launch.hpp).
#include "kernels/sm90/kit/launch.hpp"

#include <algorithm>
#include <string>

namespace sparsek::kit {

void set_smem_limit(const KernelInfo& k, const char* name) {
  check_cuda(cudaFuncSetAttribute(k.func, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem),
             (std::string("cudaFuncSetAttribute(") + name + ", max dynamic shared memory)").c_str());
}

std::string smem_why_not(const KernelInfo& k) {
  const DeviceInfo& d = device_info();
  if (d.smem_per_block_optin >= size_t(k.smem)) return "";
  return "needs " + std::to_string(k.smem) + " bytes of shared memory per block, the device allows " +
         std::to_string(d.smem_per_block_optin);
}

LaunchConfig::LaunchConfig(const KernelInfo& k, unsigned grid, cudaStream_t stream, bool overlap) : cfg{} {
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(unsigned(k.threads));
  cfg.dynamicSmemBytes = size_t(k.smem);
  cfg.stream = stream;
  cfg.attrs = attrs;
  if (k.cluster > 1) {
    cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = unsigned(k.cluster);
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
  }
  if (overlap) {
    cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
}

int max_active_clusters(const KernelInfo& k, const char* name) {
  const int sms = device_info().sm_count;
  const LaunchConfig lc(k, unsigned(k.cluster * std::max(1, sms / k.cluster)), nullptr, false);
  int n = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&n, k.func, &lc.cfg),
             (std::string("cudaOccupancyMaxActiveClusters(") + name + ")").c_str());
  return n;
}

}  // namespace sparsek::kit
