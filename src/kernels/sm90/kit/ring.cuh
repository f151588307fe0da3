// The Hopper kit: a ring of shared-memory stages guarded by mbarriers, the wait limit that turns a
// lost arrival into an error instead of a hang, and a persistent CTA's share of a plan's work list.
// Every warp-specialized family (products and attention) walks its stages with these.
#pragma once
#include <cstdint>

#include "kernels/ptx/async.cuh"

namespace sparsek::kit {

// A pipeline wait longer than this (~20 s at 2 GHz) is a lost arrival: trap rather than hang.
constexpr long long kWaitLimit = 40'000'000'000LL;

// Stage index and phase parity of a STAGES-deep ring. The producer waits on "empty" with
// parity ^ 1 (a fresh barrier counts as having completed the phase before phase 0), consumers
// wait on "full" with the parity itself.
template <int STAGES>
struct Ring {
  uint32_t stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1;
    }
  }
  // Moves n stages ahead without waiting (a consumer skipping stages that others consume).
  __device__ __forceinline__ void skip(uint32_t n) {
    const uint32_t t = stage + n;
    phase ^= (t / STAGES) & 1;
    stage = t % STAGES;
  }
};

// `count` mbarriers 8 bytes apart from `first`, each completing a phase on `arrivals` arrivals.
// Thread 0 of the CTA calls it; the caller fences (ptx::fence_mbar_init) and syncs after the last.
__device__ __forceinline__ void init_barriers(uint32_t first, int count, uint32_t arrivals) {
  for (int s = 0; s < count; ++s) ptx::mbar_init(first + 8 * s, arrivals);
}

// The persistent grid's share of a work list built by plan(): list b (one CTA, or one cluster of
// CTAs) runs items [first, last) with first = bounds[b], last = bounds[b + 1].
struct ItemRange {
  int first, last;
};
__device__ __forceinline__ ItemRange item_range(const int* bounds, int list) {
  return {bounds[list], bounds[list + 1]};
}

}  // namespace sparsek::kit
