// Internal: the CUDA runtime as sparsek's host code sees it; host .cpp files include this header,
// never <cuda_runtime.h> directly.
//
// With CUDA (SPARSEK_CUDA=ON) it is <cuda_runtime.h>. Without (SPARSEK_NO_CUDA defined: a build
// with SPARSEK_CUDA=OFF, and the clang fuzz build) it declares the part of the runtime API that the
// host code calls, as a runtime that finds no GPU: the device count is 0 and every call that needs
// a device fails with cudaErrorNoDevice, whose text says that this build has no CUDA. So the CPU
// paths compile unchanged, and a GPU path reached anyway fails through the same error handling
// as on a machine without a GPU (the clear "built without CUDA" errors are raised earlier, where
// the backend is chosen: core/no_gpu.hpp, no_gpu_error()).
//
// NOTE: everything here is inline and in namespace sparsek, so it exports no symbol and cannot
// clash with a real CUDA runtime loaded into the same process (a Python process with torch).
// Numeric values are the runtime's own, for the code that compares or prints them.
#pragma once

#ifndef SPARSEK_NO_CUDA
#include <cuda_runtime.h>
#else
#include <cstddef>
#include <cstring>

namespace sparsek {

// The text of every failed call in a build without CUDA.
inline constexpr const char* kNoCudaRuntimeText = "this sparsek was built without CUDA (SPARSEK_CUDA=OFF)";

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorStreamCaptureImplicit = 906,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0 };
inline constexpr unsigned cudaStreamNonBlocking = 0x01;

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
using cudaHostFn_t = void (*)(void*);

// The vector types the host-built schedules hold (vector_types.h).
struct alignas(8) int2 {
  int x, y;
};
inline int2 make_int2(int x, int y) { return {x, y}; }
struct alignas(16) int4 {
  int x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

// The fields sparsek reads (device info, doctor); never filled: no device answers.
struct cudaDeviceProp {
  char name[256];
  int major, minor, multiProcessorCount;
  size_t totalGlobalMem, sharedMemPerBlockOptin;
  int l2CacheSize;
};
struct cudaFuncAttributes {
  int binaryVersion, ptxVersion;
};

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : kNoCudaRuntimeText; }
// Nothing ever fails asynchronously, so there is no sticky or last error to report.
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

// Versions: 0, as the runtime reports them when there is no driver.
inline cudaError_t cudaDriverGetVersion(int* v) { *v = 0; return cudaSuccess; }
inline cudaError_t cudaRuntimeGetVersion(int* v) { *v = 0; return cudaSuccess; }

// No device: none to count, select, query or synchronize.
inline cudaError_t cudaGetDeviceCount(int* n) { *n = 0; return cudaErrorNoDevice; }
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaErrorNoDevice; }
inline cudaError_t cudaSetDevice(int) { return cudaErrorNoDevice; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) { std::memset(p, 0, sizeof *p); return cudaErrorNoDevice; }
inline cudaError_t cudaDeviceSynchronize() { return cudaErrorNoDevice; }
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = 0;
  return cudaErrorNoDevice;
}
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes*, const void*) { return cudaErrorNoDevice; }

// Memory: nothing can be allocated or copied; freeing nothing succeeds, as in the runtime.
inline cudaError_t cudaMalloc(void** p, size_t) { *p = nullptr; return cudaErrorNoDevice; }
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); }
inline cudaError_t cudaFree(void* p) { return p ? cudaErrorNoDevice : cudaSuccess; }
inline cudaError_t cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind) { return cudaErrorNoDevice; }
inline cudaError_t cudaMemcpyAsync(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t = nullptr) {
  return cudaErrorNoDevice;
}
inline cudaError_t cudaMemset(void*, int, size_t) { return cudaErrorNoDevice; }
inline cudaError_t cudaMemsetAsync(void*, int, size_t, cudaStream_t = nullptr) { return cudaErrorNoDevice; }

// Streams and events: none can be made; no stream is ever being captured.
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = nullptr; return cudaErrorNoDevice; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = nullptr; return cudaErrorNoDevice; }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaErrorNoDevice; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaErrorNoDevice; }
inline cudaError_t cudaStreamGetDevice(cudaStream_t, int* d) { *d = 0; return cudaErrorNoDevice; }
inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* c) {
  *c = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
inline cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t, void*) { return cudaErrorNoDevice; }
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = nullptr; return cudaErrorNoDevice; }
inline constexpr unsigned cudaEventDisableTiming = 0x02;
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { *e = nullptr; return cudaErrorNoDevice; }
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaErrorNoDevice; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaErrorNoDevice; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaErrorNoDevice; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaErrorNoDevice; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 0; return cudaErrorNoDevice; }

// Profiler ranges (<cuda_profiler_api.h>).
inline cudaError_t cudaProfilerStart() { return cudaErrorNoDevice; }
inline cudaError_t cudaProfilerStop() { return cudaErrorNoDevice; }

}  // namespace sparsek

// The calling convention of a host function enqueued on a stream (empty on Linux there too).
#define CUDART_CB

// The runtime's special stream handle (a macro there too), for code that names it.
#define cudaStreamPerThread (reinterpret_cast<::sparsek::cudaStream_t>(0x2))
#endif  // SPARSEK_NO_CUDA
