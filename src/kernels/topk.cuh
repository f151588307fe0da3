// Exact top-k over order keys, shared by the block gate (src/kernels/gate) and the decode page
// selection (src/kernels/decode/select.cu); sm_80+, no PTX.
//
// Keys are order-preserving u32 (gate_order_key: 0 = not pickable). Without a sort: find T, the
// k-th largest key, most significant bits first; keys > T are taken, and of the keys == T the
// lowest indices, as many as k still needs: "ties -> the lower index". Two ways to find T:
//   warp_topk_threshold   one warp, two bits per pass (16 passes over the keys, three counts each):
//                         for many short rows, a warp each (the gate);
//   block_topk_threshold  a whole CTA, eight bits per pass (4 passes, a shared-memory histogram):
//                         for one long row per CTA (the page selection).
// Counts are exact integers: the same keys give the same T whatever the order of the additions.
#pragma once
#include <cstdint>

namespace sparsek::dev {

__device__ __forceinline__ uint32_t warp_count(uint32_t v) { return __reduce_add_sync(0xffffffffu, v); }

struct TopkThreshold {
  uint32_t T = 0u;     // take keys > T ...
  uint32_t need = 0u;  // ... and the first `need` keys == T (by index)
};

// Over keys key(j), j in [0, n): each lane reads j = lane + 32m only. k = 0 takes nothing; fewer
// than k pickable keys takes them all.
template <class Key>
__device__ TopkThreshold warp_topk_threshold(Key key, int n, uint32_t k) {
  const int lane = threadIdx.x % 32;
  uint32_t pickable = 0;
  for (int j = lane; j < n; j += 32) pickable += key(j) != 0u;
  TopkThreshold th;
  const uint32_t E = warp_count(pickable);
  if (E <= k) return th;  // T = 0: every pickable key
  if (k == 0u) {
    th.T = 0xffffffffu;  // none
    return th;
  }
  uint32_t T = 0u;  // invariant: count(key >= T) >= k; each pass fixes two more bits of the largest such T
  for (int shift = 30; shift >= 0; shift -= 2) {
    const uint32_t c1 = T | (1u << shift), c2 = T | (2u << shift), c3 = T | (3u << shift);
    uint32_t n1 = 0, n2 = 0, n3 = 0;
    for (int j = lane; j < n; j += 32) {
      const uint32_t x = key(j);
      n1 += x >= c1;
      n2 += x >= c2;
      n3 += x >= c3;
    }
    n1 = warp_count(n1);
    n2 = warp_count(n2);
    n3 = warp_count(n3);
    T = n3 >= k ? c3 : n2 >= k ? c2 : n1 >= k ? c1 : T;
  }
  uint32_t above = 0;
  for (int j = lane; j < n; j += 32) above += key(j) > T;
  th.T = T;
  th.need = k - warp_count(above);  // >= 1: T is the k-th largest key
  return th;
}

// The same threshold found by all THREADS threads of the CTA (every thread must call it; it
// synchronizes the CTA). scratch: 256 + 3 words of shared memory. Each pass histograms the next
// 8 bits of the keys that share the bits fixed so far, and keeps the largest digit whose suffix
// count still reaches the k the pass needs. When that digit's keys are exactly the ones still
// needed, every key from the digit up is taken and the passes stop early (T = the digit's smallest
// key - 1, need 0): with distinct scores, usually after two passes.
template <int THREADS, class Key>
__device__ TopkThreshold block_topk_threshold(Key key, int n, uint32_t k, uint32_t* scratch) {
  static_assert(THREADS % 32 == 0 && THREADS >= 256, "a thread per histogram bin");
  const int t = threadIdx.x, lane = t % 32;
  uint32_t* hist = scratch;  // [256]
  uint32_t* found = scratch + 256;  // [3]: the digit, the count above it, the count in it
  if (t == 0) found[0] = 0u;
  __syncthreads();
  uint32_t pickable = 0;
  for (int j = t; j < n; j += THREADS) pickable += key(j) != 0u;
  pickable = warp_count(pickable);
  if (lane == 0 && pickable) atomicAdd(&found[0], pickable);
  __syncthreads();
  const uint32_t E = found[0];
  TopkThreshold th;
  if (E <= k) return th;  // T = 0: every pickable key
  if (k == 0u) {
    th.T = 0xffffffffu;  // none
    return th;
  }
  uint32_t T = 0u, rem = k;  // keys sharing T's fixed bits: rem of them are still to be taken
  for (int shift = 24; shift >= 0; shift -= 8) {
    const uint32_t fixed = shift == 24 ? 0u : ~0u << (shift + 8);
    __syncthreads();  // the previous pass read found[]
    if (t < 256) hist[t] = 0u;
    __syncthreads();
    for (int j = t; j < n; j += THREADS) {
      const uint32_t x = key(j);
      if ((x & fixed) == T) atomicAdd(&hist[(x >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (t < 32) {  // lane l holds digits 255 - 8l down to 248 - 8l: the suffix count from the top
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += c[e] = hist[255 - 8 * lane - e];
      uint32_t above = sum;  // inclusive scan over lanes (lane 0 = the largest digits)
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, above, o);
        if (lane >= o) above += y;
      }
      above -= sum;  // keys with a larger digit than this lane's
      if (above < rem && above + sum >= rem) {  // exactly one lane: the k-th key's digit is here
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (above + c[e] >= rem) {
            found[0] = uint32_t(255 - 8 * lane - e), found[1] = above, found[2] = c[e];
            break;
          }
          above += c[e];
        }
      }
    }
    __syncthreads();
    T |= found[0] << shift;
    rem -= found[1];
    if (found[2] == rem && T != 0u) {  // (T = 0 would take the unpickable keys too)
      th.T = T - 1u;
      return th;  // need = 0: every key > T, none tied
    }
  }
  th.T = T;
  th.need = rem;  // >= 1: T is the k-th largest key
  return th;
}

// Writes, ascending, every j with always_on(j) or picked by th into out[0 .. kmax) and returns how
// many were taken (the caller clamps to kmax; always_on keys should be 0 so they are not counted
// twice).
template <class Key, class On>
__device__ int warp_write_selected(Key key, int n, TopkThreshold th, On always_on, int32_t* out, int64_t kmax) {
  const int lane = threadIdx.x % 32;
  const uint32_t lt = (1u << lane) - 1u;
  int pos = 0;
  uint32_t ties = 0;
  for (int j0 = 0; j0 < n; j0 += 32) {
    const int j = j0 + lane;
    const bool in = j < n;
    const uint32_t x = in ? key(j) : 0u;
    const bool on = in && always_on(j);
    const bool tie = th.need > 0u && x == th.T;
    const uint32_t tie_mask = __ballot_sync(0xffffffffu, tie);
    const bool take = on || x > th.T || (tie && ties + __popc(tie_mask & lt) < th.need);
    const uint32_t take_mask = __ballot_sync(0xffffffffu, take);
    const int at = pos + __popc(take_mask & lt);
    if (take && at < kmax) out[at] = j;
    pos += __popc(take_mask);
    ties += __popc(tie_mask);
  }
  return pos;
}

}  // namespace sparsek::dev
