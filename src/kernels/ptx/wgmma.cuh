// PTX wrappers (sm_90a): warpgroup matrix multiply-accumulate (wgmma.mma_async) with both
// operands in shared memory or A in registers, and the shared-memory matrix descriptors.
#pragma once
#include <cstdint>

namespace sparsek::ptx {

// Descriptor swizzle codes (bits 62-63), matching the TMA swizzle the tile was written with.
enum class Swizzle : uint32_t { none = 0, b128 = 1, b64 = 2, b32 = 3 };

// Shared-memory matrix descriptor: start address, leading- and stride-dimension byte offsets
// (all >> 4), swizzle mode; base offset 0 (tiles are 1024-byte aligned).
//   K-major operand (rows of K contiguous): SBO = byte distance between groups of 8 rows
//     (8 * row bytes); LBO unused with swizzling (1). Advancing K by 16 elements inside a swizzled
//     row is +32 bytes on the start address.
//   MN-major operand (M or N contiguous, 64 elements = 128 B per row with 128B swizzle): LBO = byte
//     distance between 64-element M/N chunks, SBO = byte distance between groups of 8 K rows.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, Swizzle sw) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(sw) << 62);
}

// wgmma.fence: orders earlier register writes to the accumulators (and shared-memory operand
// writes) before the next wgmma.mma_async. Required before the first wgmma of a batch.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins an accumulator register in place across a wait (the compiler may not move reads of it
// above the wgmma.wait_group).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// ---- wgmma.mma_async m64nNk16, f32 accumulators, f16 or bf16 inputs ----
// d[N/2] per thread (fragment layout: kit/tile.cuh, fragment_coord). scale_d = 0 ignores
// the old accumulators (d = A*B), else d += A*B. TA / TB: 0 = K-major, 1 = MN-major (transposed).
#define SK_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define SK_D16(i) SK_D4(i), SK_D4(i + 4), SK_D4(i + 8), SK_D4(i + 12)
#define SK_D64(i) SK_D16(i), SK_D16(i + 16), SK_D16(i + 32), SK_D16(i + 48)

#define SK_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define SK_REGS32 \
  SK_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SK_REGS64                                                                      \
  SK_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SK_REGS128                                                                             \
  SK_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "     \
            "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "      \
            "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
            "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "   \
            "%125, %126, %127"

// ARGS: the operand numbers of descA, descB, scale_d, TA, TB (they follow the accumulators).
#define SK_WGMMA(SHAPE, TY, REGS, A, B, S, TA_, TB_, ...)                                     \
  asm volatile("{\n"                                                                          \
               ".reg .pred p;\n"                                                              \
               "setp.ne.b32 p, %" S ", 0;\n"                                                  \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" REGS "}, %" A ", %" B \
               ", p, 1, 1, %" TA_ ", %" TB_ ";\n"                                              \
               "}\n"                                                                          \
               : __VA_ARGS__                                                                  \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB))

template <int N, bool BF16, int TA, int TB>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                             int scale_d) {
  static_assert(N == 32 || N == 64 || N == 128 || N == 256, "wgmma_m64k16: wrapped shapes are n32, n64, n128, n256");
  if constexpr (N == 32) {
    if constexpr (BF16)
      SK_WGMMA("m64n32k16", "bf16", SK_REGS16, "16", "17", "18", "19", "20", SK_D16(0));
    else
      SK_WGMMA("m64n32k16", "f16", SK_REGS16, "16", "17", "18", "19", "20", SK_D16(0));
  } else if constexpr (N == 64) {
    if constexpr (BF16)
      SK_WGMMA("m64n64k16", "bf16", SK_REGS32, "32", "33", "34", "35", "36", SK_D16(0), SK_D16(16));
    else
      SK_WGMMA("m64n64k16", "f16", SK_REGS32, "32", "33", "34", "35", "36", SK_D16(0), SK_D16(16));
  } else if constexpr (N == 128) {
    if constexpr (BF16)
      SK_WGMMA("m64n128k16", "bf16", SK_REGS64, "64", "65", "66", "67", "68", SK_D64(0));
    else
      SK_WGMMA("m64n128k16", "f16", SK_REGS64, "64", "65", "66", "67", "68", SK_D64(0));
  } else {
    if constexpr (BF16)
      SK_WGMMA("m64n256k16", "bf16", SK_REGS128, "128", "129", "130", "131", "132", SK_D64(0), SK_D64(64));
    else
      SK_WGMMA("m64n256k16", "f16", SK_REGS128, "128", "129", "130", "131", "132", SK_D64(0), SK_D64(64));
  }
}

// ---- the same with A from registers (wgmma ...RS): four 32-bit registers per thread, each two
// 16-bit elements, in the m64k16 A fragment layout: warp w of the warpgroup holds rows 16w..16w+15;
// with g = lane / 4 and t = lane % 4, a[0] = (row g, cols 2t, 2t+1), a[1] = (row g+8, same cols),
// a[2] = (row g, cols 8+2t, 9+2t), a[3] = (row g+8, cols 8+2t, 9+2t). That is exactly how an fp32
// accumulator fragment's registers 8k..8k+7 pair up for k16 step k (attention: P = softmax(S) is
// fed back as A without leaving the registers). B from shared memory, TB: 0 K-major, 1 MN-major.
// ARGS: the operand numbers of the four A registers, descB, scale_d, TB.
#define SK_WGMMA_RS(SHAPE, TY, REGS, A0, A1, A2, A3, B, S, TB_, ...)                                  \
  asm volatile("{\n"                                                                                 \
               ".reg .pred p;\n"                                                                     \
               "setp.ne.b32 p, %" S ", 0;\n"                                                         \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" REGS "}, {%" A0 ", %" A1 \
               ", %" A2 ", %" A3 "}, %" B ", p, 1, 1, %" TB_ ";\n"                                   \
               "}\n"                                                                                 \
               : __VA_ARGS__                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB))

template <int N, bool BF16, int TB>
__device__ __forceinline__ void wgmma_m64k16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                                int scale_d) {
  static_assert(N == 64 || N == 128, "wgmma_m64k16_rs: wrapped shapes are n64, n128");
  if constexpr (N == 64) {
    if constexpr (BF16)
      SK_WGMMA_RS("m64n64k16", "bf16", SK_REGS32, "32", "33", "34", "35", "36", "37", "38", SK_D16(0), SK_D16(16));
    else
      SK_WGMMA_RS("m64n64k16", "f16", SK_REGS32, "32", "33", "34", "35", "36", "37", "38", SK_D16(0), SK_D16(16));
  } else {
    if constexpr (BF16)
      SK_WGMMA_RS("m64n128k16", "bf16", SK_REGS64, "64", "65", "66", "67", "68", "69", "70", SK_D64(0));
    else
      SK_WGMMA_RS("m64n128k16", "f16", SK_REGS64, "64", "65", "66", "67", "68", "69", "70", SK_D64(0));
  }
}

// ---- e4m3 inputs (fp8), f32 accumulators: m64nNk32, both operands K-major from shared memory
// (fp8 wgmma has no transpose: a tile whose K is not contiguous must be transposed before). The
// accumulator fragment is the f16 form's (N / 2 registers). ARGS: descA, descB, scale_d.
#define SK_WGMMA_E4M3(SHAPE, REGS, A, B, S, ...)                                                \
  asm volatile("{\n"                                                                            \
               ".reg .pred p;\n"                                                                \
               "setp.ne.b32 p, %" S ", 0;\n"                                                    \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32.e4m3.e4m3 {" REGS "}, %" A ", %" B    \
               ", p, 1, 1;\n"                                                                   \
               "}\n"                                                                            \
               : __VA_ARGS__                                                                    \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))

template <int N>
__device__ __forceinline__ void wgmma_m64k32_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N == 64 || N == 128, "wgmma_m64k32_e4m3: wrapped shapes are n64, n128");
  if constexpr (N == 64)
    SK_WGMMA_E4M3("m64n64k32", SK_REGS32, "32", "33", "34", SK_D16(0), SK_D16(16));
  else
    SK_WGMMA_E4M3("m64n128k32", SK_REGS64, "64", "65", "66", SK_D64(0));
}

#undef SK_WGMMA_E4M3
#undef SK_WGMMA_RS
#undef SK_WGMMA
#undef SK_REGS128
#undef SK_REGS64
#undef SK_REGS32
#undef SK_REGS16
#undef SK_D64
#undef SK_D16
#undef SK_D4

}  // namespace sparsek::ptx
