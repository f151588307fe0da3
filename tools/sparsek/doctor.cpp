// `sparsek doctor`: what this machine and this build have, what is missing (with the fix), and
// which variants can run here. Exits 0 whenever it could report, GPU or not.
#include "core/cuda_host.hpp"
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.hpp"
#include "cpu/blas_cpu.hpp"
#include "core/no_gpu.hpp"  // kBuiltWithCuda, no_gpu_error(): what a build without CUDA says
#include "tools_internal.hpp"

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

// The oldest Linux driver that runs a CUDA runtime of this major version (NVIDIA's minor-version
// compatibility: CUDA 13.x needs the 580 family, 12.x 525, 11.x 450).
std::string min_driver(int runtime) {
  switch (runtime / 1000) {
    case 13: return "580";
    case 12: return "525";
    case 11: return "450";
    default: return "supporting CUDA " + cuda_version(runtime);
  }
}

// Why no GPU can be used, told apart: no driver at all (no NVIDIA GPU, or its driver is not
// installed), a driver older than the runtime this build links, a driver with no visible device.
struct GpuState {
  std::string state;  // "ok", "no_driver", "driver_too_old", "no_device", "error"
  std::string text, fix;
};

GpuState gpu_state(int driver, int runtime) {
  GpuState g;
  if (!kBuiltWithCuda) {
    g.state = "not_built";
    g.text = kNoCudaBuild;
    g.fix = "for the GPU backends, rebuild with the CUDA toolkit (nvcc on PATH, or -DSPARSEK_CUDA=ON)";
    return g;
  }
  const bool kernel_module = file_exists("/proc/driver/nvidia/version");
  if (driver == 0) {
    g.state = "no_driver";
    if (kernel_module) {
      g.text = "the NVIDIA kernel driver is loaded but its user-space library (libcuda.so.1) is not found";
      g.fix = "install the driver's libraries (or, in a container, run it with the NVIDIA container toolkit)";
    } else {
      g.text = "no NVIDIA driver on this machine: no NVIDIA GPU, or its driver is not installed";
      g.fix = "on a machine with an NVIDIA GPU, install driver " + min_driver(runtime) +
              " or newer; the CPU backend works without one";
    }
    return g;
  }
  if (driver < runtime) {
    g.state = "driver_too_old";
    g.text = "the NVIDIA driver supports CUDA " + cuda_version(driver) + ", older than the CUDA " +
             cuda_version(runtime) + " runtime this build links";
    g.fix = "update the NVIDIA driver to " + min_driver(runtime) + " or newer";
    return g;
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (err != cudaSuccess) cudaGetLastError();
    g.state = err == cudaSuccess || err == cudaErrorNoDevice ? "no_device" : "error";
    g.text = err == cudaSuccess || err == cudaErrorNoDevice
                 ? "the driver answers but shows no GPU"
                 : std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
    g.fix = std::string("check nvidia-smi") +
            (vis ? std::string(" and CUDA_VISIBLE_DEVICES (set to '") + vis + "')" : std::string());
    return g;
  }
  g.state = "ok";
  return g;
}

// Whether `v` can run on this machine and build (its problem domain aside), and why not.
std::string variant_blocker(const Variant& v, const GpuState& gpu, bool has_90a, const std::string& cublas,
                            const std::string& cusparse) {
  if (v.backend == Backend::cpu) return "";
  if (!kBuiltWithCuda) return "not built (SPARSEK_CUDA=OFF)";
  if (gpu.state != "ok") return "no usable GPU (see above)";
  const DeviceInfo& d = device_info();
  const std::string name = v.name;
  if (name == "hopper") {
    if (d.cc_major != 9 || d.cc_minor != 0)
      return "needs compute capability 9.0; this GPU is " + std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor);
    if (!has_90a) return "this build has no sm_90a code";
    return "";
  }
  if (d.cc_major < 8) return "needs compute capability 8.0 or newer";
  if (name.rfind("cublas", 0) == 0 && cublas.empty()) return "cuBLAS is unavailable";
  if (name.rfind("cusparse", 0) == 0 && cusparse.empty()) return "cuSPARSE is unavailable";
  return "";
}

}  // namespace

int doctor_main(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> specs = {{"--json", "FILE", "also write the report as JSON (- for stdout)"}};
  Args args(argv, specs);
  if (args.help()) {
    print_help("sparsek doctor [--json FILE]",
               "Reports the CUDA driver and runtime, the GPUs and their compute capability, which kernel\n"
               "code this build holds (sm_90a for the Hopper fast path), the cuBLAS/cuSPARSE versions,\n"
               "which variants can run here, the tuning-cache path, and what is missing with how to fix\n"
               "it (no NVIDIA driver, a driver too old for this build's CUDA runtime, no visible GPU).\n"
               "Exits 0 when it could report.",
               specs);
    return 0;
  }
  JsonOutput json(args);
  Json doc = json_header("doctor", argv);
  std::vector<std::string> missing;
  const std::string gencode = SPARSEK_CUDA_GENCODE_LIST;
  const bool has_90a = kBuiltWithCuda && gencode.find("90a") != std::string::npos;

  std::printf("sparsek %s doctor\n\n", version());
  std::printf("build\n");
  std::string sass;
  {
    std::string cur;
    for (char c : gencode + ",") {
      if (c == ',' || c == ';') {
        if (!cur.empty()) sass += " sm_" + cur;
        cur.clear();
      } else {
        cur += c;
      }
    }
  }
  std::printf("  CUDA                   %s\n", kBuiltWithCuda ? "built in (SPARSEK_CUDA=ON)" : "NOT built (SPARSEK_CUDA=OFF): CPU backend only");
  const std::string ptx = SPARSEK_CUDA_PTX_LIST;
  if (kBuiltWithCuda) {
    std::printf("  CUDA gencode           %s (SASS for:%s)\n", gencode.c_str(), sass.c_str());
    std::printf("  PTX                    %s\n",
                ptx.empty() ? "none (GPUs newer than the SASS targets get no kernel)"
                            : ("compute_" + ptx + " (newer GPUs JIT-compile the portable kernel from it)").c_str());
    std::printf("  sm_90a (Hopper path)   %s\n", has_90a ? "built in" : "NOT built");
  }
#ifdef CUDART_VERSION
  const int compiled_cuda = CUDART_VERSION;
#else
  const int compiled_cuda = 0;  // built without CUDA
#endif
  std::printf("  compiled against CUDA  %s\n", cuda_version(compiled_cuda).c_str());
  const std::string blas = cpu_blas_description();
  std::printf("  CPU backend BLAS       %s\n", blas.c_str());
  doc["build"] = {{"gencode", gencode}, {"ptx", ptx}, {"sm_90a", has_90a}, {"cuda", cuda_version(compiled_cuda)},
                  {"cuda_built", kBuiltWithCuda},
                  {"cpu_blas", blas}};

  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  const GpuState gpu = gpu_state(driver, runtime);
  std::printf("\nCUDA\n");
  const std::string cublas = peers::cublas_version(), cusparse = peers::cusparse_version();
  if (!kBuiltWithCuda) {
    std::printf("  none linked            this build has no CUDA code (SPARSEK_CUDA=OFF)\n");
  } else {
    std::printf("  runtime (linked)       %s (needs NVIDIA driver %s or newer)\n", cuda_version(runtime).c_str(),
                min_driver(runtime).c_str());
    std::printf("  driver                 %s\n",
                driver ? ("supports CUDA " + cuda_version(driver)).c_str() : "none found");
    std::printf("  cuBLAS                 %s\n", cublas.empty() ? "unavailable" : cublas.c_str());
    std::printf("  cuSPARSE               %s\n", cusparse.empty() ? "unavailable" : cusparse.c_str());
  }
  doc["cuda"] = {{"runtime", cuda_version(runtime)}, {"min_driver", min_driver(runtime)},
                 {"driver_supports", driver ? Json(cuda_version(driver)) : Json(nullptr)},
                 {"cublas", cublas}, {"cusparse", cusparse}};

  std::printf("\nGPU\n");
  Json gpus = Json::array();
  if (gpu.state != "ok") {
    std::printf("  none usable: %s\n", gpu.text.c_str());
    missing.push_back(gpu.text + ": " + gpu.fix);
  } else {
    const DeviceInfo& info = device_info();
    int count = 0;
    cudaGetDeviceCount(&count);
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp p{};
      if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
      std::printf("  [%d] %s%s\n", d, p.name, d == info.device ? "  (current)" : "");
      std::printf("      compute capability %d.%d, %d SMs, %.1f GiB, L2 %.0f MiB, smem/block opt-in %zu KiB\n",
                  p.major, p.minor, p.multiProcessorCount, double(p.totalGlobalMem) / (1 << 30),
                  double(p.l2CacheSize) / (1 << 20), size_t(p.sharedMemPerBlockOptin) / 1024);
      gpus.push_back({{"index", d}, {"name", p.name}, {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
                      {"sm_count", p.multiProcessorCount}, {"memory_bytes", int64_t(p.totalGlobalMem)}});
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
  doc["gpu"] = {{"state", gpu.state}, {"why_not", gpu.text}, {"fix", gpu.fix}, {"devices", gpus}};

  std::printf("\nvariants (can run here?)\n");
  Json vj = Json::array();
  std::string runnable;
  for (const Variant& v : variants()) {
    const std::string why = variant_blocker(v, gpu, has_90a, cublas, cusparse);
    std::printf("  %-22s %-5s %s%s\n", v.name, v.backend == Backend::cpu ? "cpu" : "cuda",
                why.empty() ? "yes" : ("no: " + why).c_str(), v.peer ? " (peer)" : "");
    if (why.empty()) runnable += (runnable.empty() ? "" : ", ") + std::string(v.name);
    vj.push_back({{"name", v.name}, {"backend", v.backend == Backend::cpu ? "cpu" : "cuda"}, {"peer", v.peer},
                  {"runs_here", why.empty()}, {"why_not", why}});
  }
  std::printf("  can run here: %s\n", runnable.c_str());
  doc["variants"] = vj;

  doctor_tune_cache(missing);

  std::printf("\n");
  if (missing.empty()) {
    std::printf("nothing missing\n");
  } else {
    std::printf("missing (%zu)\n", missing.size());
    for (const std::string& m : missing) std::printf("  - %s\n", m.c_str());
  }
  doc["missing"] = missing;
  if (json.enabled()) {
    json.write(doc);
    json.say_written();
  }
  return 0;
}

}  // namespace sparsek::cli
