// The Hopper kit: shared memory. The limits of sm_90, written once, and a typed layout: a family
// lists its regions (tiles, barriers, info words) in order, each placed after the last at its
// alignment, so every offset is a compile-time constant and the total is checked against the
// budget where the layout is declared.
#pragma once
#include <cstdint>

#include "kernels/ptx/async.cuh"

namespace sparsek::kit {

// Dynamic shared memory one block may opt into on sm_90 (227 KB of the SM's 228 KB).
constexpr int kSmemPerBlock = 227 * 1024;
// What the driver keeps per CTA (cudaDevAttrReservedSharedMemoryPerBlock on sm_90).
constexpr int kSmemReservedPerCta = 1024;
// Bytes one of `ctas` CTAs sharing an SM may use.
constexpr int smem_budget(int ctas) { return kSmemPerBlock / ctas - kSmemReservedPerCta; }
// Slack for rounding the dynamic shared-memory base up to 1024 bytes (the 128-byte swizzle and the
// wgmma descriptors' base offset 0 want every tile 1024-byte aligned).
constexpr int kSmemAlignSlack = 1024;

constexpr uint32_t align_up(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }

// One region of a layout: [offset, offset + bytes) from the 1024-aligned base.
struct Region {
  uint32_t offset, bytes;
  constexpr uint32_t end() const { return offset + bytes; }
  // The region after this one (tiles: 1024-aligned; barriers: 8; info words: their size).
  constexpr Region then(uint32_t next_bytes, uint32_t align = 1024) const {
    return {align_up(end(), align), next_bytes};
  }
};
constexpr Region first_region(uint32_t bytes) { return {0, bytes}; }

// A CTA's shared memory: the 1024-aligned base as a shared-window address (wgmma descriptors, TMA,
// mbarriers) and as a generic pointer (plain loads and stores by the threads).
struct SmemBase {
  uint32_t addr;  // the 1024-aligned base (shared window)
  uint8_t* ptr;   // the same as a generic pointer
  __device__ __forceinline__ static SmemBase of(uint8_t* raw) {
    const uint32_t r = ptx::smem_addr(raw);
    const uint32_t a = (r + 1023u) & ~1023u;
    return {a, raw + (a - r)};
  }
  // The address (pointer) `byte` bytes into the region at `offset` (a Region's .offset: regions are
  // static constexpr members, whose offset is read as a constant, never referenced, in device code).
  __device__ __forceinline__ uint32_t at(uint32_t offset, uint32_t byte = 0) const { return addr + offset + byte; }
  template <class T>
  __device__ __forceinline__ T* ptr_at(uint32_t offset, uint32_t byte = 0) const {
    return reinterpret_cast<T*>(ptr + (offset + byte));
  }
};

}  // namespace sparsek::kit
