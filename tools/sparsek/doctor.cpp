// `sparsek doctor`: what this machine and this build have, and what is missing (with the fix).
// Exits 0 whenever it could report, GPU or not.
#include <cuda_runtime.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.hpp"
#include "core/device.hpp"
#include "cuda/peers/peers.hpp"
#include "plan/variant.hpp"

#ifndef SPARSEK_CUDA_GENCODE_LIST
#define SPARSEK_CUDA_GENCODE_LIST "unknown (not defined by the build)"
#endif
#ifndef SPARSEK_CUDA_PTX_LIST
#define SPARSEK_CUDA_PTX_LIST ""
#endif

namespace sparsek::cli {

namespace {

std::string cuda_version(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

bool file_exists(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0;
}

}  // namespace

int doctor_main(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> specs = {};
  Args args(argv, specs);
  if (args.help()) {
    print_help("sparsek doctor",
               "Reports the CUDA driver and runtime, the GPUs and their compute capability, which kernel\n"
               "code this build holds (sm_90a for the Hopper fast path), the cuBLAS/cuSPARSE versions,\n"
               "the tuning-cache path, and what is missing with how to fix it. Exits 0 when it could report.",
               specs);
    return 0;
  }
  std::vector<std::string> missing;
  const std::string gencode = SPARSEK_CUDA_GENCODE_LIST;
  const bool has_90a = gencode.find("90a") != std::string::npos;

  std::printf("sparsek %s doctor\n\n", version());
  std::printf("build\n");
  std::printf("  CUDA gencode           %s (SASS for:", gencode.c_str());
  {
    std::string cur;
    for (char c : gencode + ",") {
      if (c == ',' || c == ';') {
        if (!cur.empty()) std::printf(" sm_%s", cur.c_str());
        cur.clear();
      } else {
        cur += c;
      }
    }
  }
  std::printf(")\n");
  const std::string ptx = SPARSEK_CUDA_PTX_LIST;
  std::printf("  PTX                    %s\n",
              ptx.empty() ? "none (GPUs newer than the SASS targets get no kernel)"
                          : ("compute_" + ptx + " (newer GPUs JIT-compile the portable kernel from it)").c_str());
  std::printf("  sm_90a (Hopper path)   %s\n", has_90a ? "built in" : "NOT built");
  std::printf("  compiled against CUDA  %s\n", cuda_version(CUDART_VERSION).c_str());

  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  std::printf("\nCUDA\n");
  std::printf("  runtime (linked)       %s\n", cuda_version(runtime).c_str());
  std::printf("  driver                 %s\n", driver ? cuda_version(driver).c_str() : "none found");
  if (!driver)
    missing.push_back("no NVIDIA driver: install one that supports CUDA " + cuda_version(runtime) +
                      " (nvidia-driver package); the CPU backend works without it");
  else if (driver < runtime)
    missing.push_back("driver supports CUDA " + cuda_version(driver) + " but the runtime is " + cuda_version(runtime) +
                      ": update the NVIDIA driver");

  std::string cublas = peers::cublas_version(), cusparse = peers::cusparse_version();
  std::printf("  cuBLAS                 %s\n", cublas.empty() ? "unavailable" : cublas.c_str());
  std::printf("  cuSPARSE               %s\n", cusparse.empty() ? "unavailable" : cusparse.c_str());

  std::printf("\nGPU\n");
  const DeviceInfo& info = device_info();
  if (!info.available) {
    std::printf("  none: %s\n", info.why_not.c_str());
    if (driver) missing.push_back("no GPU answered (" + info.why_not + "): check nvidia-smi and CUDA_VISIBLE_DEVICES");
  } else {
    int count = 0;
    cudaGetDeviceCount(&count);
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp p{};
      if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
      std::printf("  [%d] %s%s\n", d, p.name, d == info.device ? "  (current)" : "");
      std::printf("      compute capability %d.%d, %d SMs, %.1f GiB, L2 %.0f MiB, smem/block opt-in %zu KiB\n",
                  p.major, p.minor, p.multiProcessorCount, double(p.totalGlobalMem) / (1 << 30),
                  double(p.l2CacheSize) / (1 << 20), size_t(p.sharedMemPerBlockOptin) / 1024);
    }
    int bin = 0, ptx_version = 0;
    try {
      peers::kernel_image(&bin, &ptx_version);
      // A binary version matching the GPU but no SASS built for it: the driver JIT-compiled the PTX.
      const std::string cc = std::to_string(info.cc_major) + std::to_string(info.cc_minor);
      const bool jit = gencode.find(cc) == std::string::npos && bin == info.cc_major * 10 + info.cc_minor;
      std::printf("  kernel image loaded    %s sm_%d (ptx %d) for this %d.%d GPU\n",
                  jit ? "JIT-compiled from PTX to" : "SASS", bin, ptx_version, info.cc_major, info.cc_minor);
      if (jit)
        std::printf("                         (the portable kernel runs; first use per GPU model compiles it,\n"
                    "                          the driver caches the result; sm_90a's Hopper path is Hopper-only)\n");
      if (bin / 10 != info.cc_major && !jit)
        missing.push_back("this GPU runs sm_" + std::to_string(bin) + " code: add " + cc +
                          " to -DSPARSEK_CUDA_GENCODE for native code");
    } catch (const Error& e) {
      std::printf("  kernel image           none usable: %s\n", e.what());
      missing.push_back("no kernel image for compute capability " + std::to_string(info.cc_major) + "." +
                        std::to_string(info.cc_minor) + ": rebuild with -DSPARSEK_CUDA_GENCODE including " +
                        std::to_string(info.cc_major) + std::to_string(info.cc_minor) +
                        " (or -DSPARSEK_CUDA_PTX=80 for PTX that the driver JIT-compiles)");
    }
    if (info.cc_major < 8)
      missing.push_back("compute capability " + std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor) +
                        " is below 8.0: sparsek's CUDA kernels need sm_80+ (the peers and the CPU backend still run)");
    if (info.cc_major == 9 && info.cc_minor == 0 && !has_90a)
      missing.push_back("Hopper GPU but no sm_90a code: reconfigure with -DSPARSEK_CUDA_GENCODE='80;90a' for the "
                        "TMA + WGMMA fast path");
  }

  std::printf("\nvariants\n");
  for (const Variant& v : variants())
    std::printf("  %-22s %s%s\n", v.name, v.backend == Backend::cpu ? "cpu" : "cuda", v.peer ? " (peer)" : "");

  doctor_tune_cache(missing);

  std::printf("\n");
  if (missing.empty()) {
    std::printf("nothing missing\n");
  } else {
    std::printf("missing (%zu)\n", missing.size());
    for (const std::string& m : missing) std::printf("  - %s\n", m.c_str());
  }
  return 0;
}

}  // namespace sparsek::cli
