// Device pieces of the warp-specialized Hopper kernels (products and attention): the position in
// a ring of shared-memory stages guarded by mbarriers, and the wait limit that turns a lost
// arrival into an error instead of a hang.
#pragma once
#include <cstdint>

namespace sparsek::dev {

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

// The persistent grid's share of a work list built by plan(): list b (one CTA, or one cluster of
// CTAs) runs items [first, last) with first = bounds[b], last = bounds[b + 1].
struct ItemRange {
  int first, last;
};
__device__ __forceinline__ ItemRange item_range(const int* bounds, int list) {
  return {bounds[list], bounds[list + 1]};
}

}  // namespace sparsek::dev
