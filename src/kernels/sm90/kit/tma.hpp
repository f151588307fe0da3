// Internal (host): TMA tensor maps for the Hopper kernels (products and attention).
//
// The driver's cuTensorMapEncodeTiled is fetched at run time through the runtime
// (cudaGetDriverEntryPointByVersion): libcuda is never linked, so the library loads on machines
// without a driver.
#pragma once
#include <cuda.h>  // CUtensorMap and the driver enums only
#include <cudaTypedefs.h>

#include <cstdint>

#include <string>

#include "sparsek/types.hpp"

namespace sparsek {

struct Tensor4View;  // sparsek/attention.hpp
struct DenseView;    // sparsek/gemm.hpp

// The driver entry point (resolved once; throws Error(cuda_error) when the driver lacks it).
// Call it in plan()/prepare(): the first call must not happen under stream capture.
PFN_cuTensorMapEncodeTiled_v12000 tma_encode_tiled();

CUtensorMapDataType tma_dtype(DType t);
// The swizzle of a box whose shared-memory rows are `row_bytes` long (128 or 64).
CUtensorMapSwizzle tma_swizzle(int row_bytes);

// Tensor map over an array whose innermost dimension is contiguous. dims[0] is the innermost
// extent (elements); byte_strides[i] is the stride of dims[i + 1]; box[i] the box extent.
// 128-byte swizzle wants box[0] * element size == 128 (64-byte: 64). rank in [1, 5].
CUtensorMap tma_map(const void* base, DType dtype, int rank, const uint64_t* dims, const uint64_t* byte_strides,
                    const uint32_t* box, CUtensorMapSwizzle swizzle, const char* what);

// Row-major (outer x inner) array with rows `row_bytes` apart, boxes (box_inner, box_outer). With
// chunks > 0 it is 3-D: the inner dimension cut into `chunks` pieces of box_inner elements side by
// side (dims: box_inner, outer, chunks; the chunk stride is box_inner elements), so that one box of
// (box_inner, box_outer, box_chunks) covers box_chunks neighbouring 2-D boxes.
CUtensorMap tma_map_2d(const void* base, DType dtype, uint64_t inner, uint64_t outer, uint64_t row_bytes,
                       uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle, const char* what,
                       uint64_t chunks = 0, uint32_t box_chunks = 1);

// Attention tensors [B, H, S, D] (D contiguous, 64 or 128) as (64 of D, S, D / 64 chunks, H, B):
// one box of (64, rows, D / 64, 1, 1) is a whole [chunk][row][64] tile, 128B-swizzled. Rows past S
// read as zeros and are not written.
CUtensorMap tma_map_bhsd(const Tensor4View& t, int rows, const char* what);
// "" when tma_map_bhsd can describe t (16-byte aligned base and strides, 32-bit extents), else why.
std::string tma_why_not_bhsd(const Tensor4View& t, const char* name);

// Whether an epilogue may write dense C (a product's output) by TMA stores.
// NOTE: TMA stores need a 16-byte aligned base and line stride, and lines that are a whole number
// of 16-byte granules: with N * sizeof(T) % 16 != 0 (row-major) the H100 wrote the rest of the
// last granule, i.e. into C's padding past column N (found by `sparsek verify --variants hopper`).
// Column-major lines are M long.
bool c_tma_storable(const DenseView& c);

}  // namespace sparsek
