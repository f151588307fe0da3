// Host side of the TMA tensor maps (tma.hpp).
#include "cuda/common/tma.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "core/device.hpp"

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
  }
  return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
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

}  // namespace sparsek
