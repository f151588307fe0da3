// Host side of the TMA tensor maps (tma.hpp).
#include "kernels/sm90/kit/tma.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "core/device.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek {

PFN_cuTensorMapEncodeTiled_v12000 tma_encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (q != cudaDriverEntryPointSuccess || !f)
      throw Error(Status::cuda_error, "cuTensorMapEncodeTiled is not available from the driver (query result " +
                                          std::to_string(int(q)) + ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

CUtensorMapDataType tma_dtype(DType t) {
  switch (t) {
    case DType::f16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::bf16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::f32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case DType::e4m3: return CU_TENSOR_MAP_DATA_TYPE_UINT8;  // TMA only moves bytes: one per element
  }
  return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

bool c_tma_storable(const DenseView& c) {
  const int64_t es = int64_t(dtype_size(c.dtype)), line = c.layout == Layout::row_major ? c.cols : c.rows;
  return reinterpret_cast<uintptr_t>(c.data) % 16 == 0 && (c.ld * es) % 16 == 0 && (line * es) % 16 == 0;
}

CUtensorMapSwizzle tma_swizzle(int row_bytes) {
  return row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
}

CUtensorMap tma_map(const void* base, DType dtype, int rank, const uint64_t* dims, const uint64_t* byte_strides,
                    const uint32_t* box, CUtensorMapSwizzle swizzle, const char* what) {
  CUtensorMap m;
  std::memset(&m, 0, sizeof(m));
  cuuint64_t d[5] = {}, s[4] = {};
  cuuint32_t b[5] = {}, e[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    if (i + 1 < rank) s[i] = byte_strides[i];
  }
  const CUresult r = tma_encode_tiled()(&m, tma_dtype(dtype), cuuint32_t(rank), const_cast<void*>(base), d, s, b, e,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string shape, strides;
    for (int i = 0; i < rank; ++i) shape += (i ? "x" : "") + std::to_string(dims[i]);
    for (int i = 0; i + 1 < rank; ++i) strides += (i ? "," : "") + std::to_string(byte_strides[i]);
    throw Error(Status::cuda_error, std::string("cuTensorMapEncodeTiled(") + what + ") failed with CUresult " +
                                        std::to_string(int(r)) + " (dims " + shape + ", byte strides " + strides +
                                        ")");
  }
  return m;
}

CUtensorMap tma_map_2d(const void* base, DType dtype, uint64_t inner, uint64_t outer, uint64_t row_bytes,
                       uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle, const char* what,
                       uint64_t chunks, uint32_t box_chunks) {
  const uint64_t dims[3] = {chunks ? box_inner : inner, outer, chunks};
  const uint64_t strides[2] = {row_bytes, box_inner * dtype_size(dtype)};
  const uint32_t box[3] = {box_inner, box_outer, box_chunks};
  return tma_map(base, dtype, chunks ? 3 : 2, dims, strides, box, swizzle, what);
}

CUtensorMap tma_map_bhsd(const Tensor4View& t, int rows, const char* what) {
  const uint64_t es = dtype_size(t.dtype);
  // NOTE: an extent-1 dimension's stride is never used, but the TMA still wants a 16-byte multiple.
  auto stride = [&](int64_t extent, int64_t s) { return extent == 1 ? uint64_t(128) : uint64_t(s) * es; };
  const uint64_t dims[5] = {64, uint64_t(t.s), uint64_t(t.d / 64), uint64_t(t.h), uint64_t(t.b)};
  const uint64_t strides[4] = {stride(t.s, t.stride_s), 128, stride(t.h, t.stride_h), stride(t.b, t.stride_b)};
  const uint32_t box[5] = {64, uint32_t(rows), uint32_t(t.d / 64), 1, 1};
  return tma_map(t.data, t.dtype, 5, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, what);
}

std::string tma_why_not_bhsd(const Tensor4View& t, const char* name) {
  const uint64_t es = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return std::string(name) + " must be 16-byte aligned for TMA (address % 16 = " +
           std::to_string(reinterpret_cast<uintptr_t>(t.data) % 16) + ")";
  const int64_t ext[3] = {t.s, t.h, t.b}, str[3] = {t.stride_s, t.stride_h, t.stride_b};
  const char* sn[3] = {"sequence", "head", "batch"};
  for (int i = 0; i < 3; ++i) {
    if (ext[i] == 1) continue;
    if ((uint64_t(str[i]) * es) % 16 != 0)
      return std::string(name) + "'s " + sn[i] + " stride must be a multiple of 16 bytes for TMA (stride " +
             std::to_string(str[i]) + " elements)";
    if (uint64_t(str[i]) * es >= (uint64_t(1) << 40))
      return std::string(name) + "'s " + sn[i] + " stride is too large for TMA (" + std::to_string(str[i]) + ")";
  }
  if (t.s >= (int64_t(1) << 31) || t.h >= (int64_t(1) << 31) || t.b >= (int64_t(1) << 31))
    return std::string(name) + "'s extents must be below 2^31 (TMA coordinates are 32-bit)";
  return "";
}

}  // namespace sparsek
