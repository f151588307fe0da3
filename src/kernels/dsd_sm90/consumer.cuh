// Hopper DSD, consumers: warpgroups 1 and 2 run the K loop of their items over the ring
// (kit/mainloop.cuh) and the epilogue. Cooperative (bm = 128: both on every item, 64 rows each) or
// ping-pong (bm <= 64: each consumer owns every other item of its CTA, so one consumer's epilogue
// runs under the other's math).
#pragma once
#include "kernels/dsd_sm90/config.hpp"
#include "kernels/dsd_sm90/epilogue.cuh"
#include "kernels/dsd_sm90/producer.cuh"
#include "kernels/ptx/async.cuh"
#include "kernels/sm90/kit/mainloop.cuh"

namespace sparsek::dsd_sm90 {


// Consumer: one warpgroup. Cooperative (bm = 128): every item, rows 64*which.. of it. Ping-pong:
// the items of its parity, walking the ring in step with the producer (it skips the other
// consumer's stages by count).
// NOTE: a ping-pong consumer that skips ahead must not wait on a stage before the other consumer
// has seen every earlier stage complete: mbarrier parity waits cannot tell phase k from phase
// k - 2, so a wait two ring laps ahead would pass on a stale phase. Named barrier 1 + c ("consumer
// c may start") orders the two main loops; the signal goes out once the last stage of an item
// has been seen full (its math still runs), so the hand-over leaves the tensor cores no gap.
template <class Cfg>
__device__ __forceinline__ void consume(const CUtensorMap* tm_c, const Params& p, int first, int last, int which,
                                        uint32_t s_a, uint32_t s_b, uint32_t full, uint32_t empty, uint8_t* ebuf,
                                        uint32_t ebuf_s, uint32_t c_bar) {
  const int tid = threadIdx.x % 128;
  const bool pairs = Cfg::PAIRS_BUILT && p.pair_blk != nullptr;  // (PAIRS_BUILT: op none, perm unused)
  const bool tma = Cfg::C_TMA_ONLY || p.tma_store;  // a constant where C_TMA_ONLY: no threads' copy compiled
  kit::Ring<Cfg::STAGES> ring;
  uint32_t c_phase = 0;
  const int rank = Cfg::CL > 1 ? int(ptx::cluster_ctarank()) : 0;
  // A slot is free once every consumer of every CTA of the cluster is done with it (the peer's
  // multicast writes into this CTA's slot too).
  auto release = [&](uint32_t slot) {
    const uint32_t bar = empty + 8 * slot;
    ptx::mbar_arrive(bar);
    if constexpr (Cfg::CL > 1) {
      if (p.cluster_mode != 1)
        for (int r = 0; r < Cfg::CL; ++r)
          if (r != rank) ptx::mbar_arrive_cluster(ptx::map_to_rank(bar, uint32_t(r)));
    }
  };
  float acc[Cfg::MI][Cfg::ACC];
  SK_PROF(const long long t_start = clock64(); long long prof_full = 0, prof_epi = 0, prof_part = 0;)
#ifdef SPARSEK_HOPPER_PROFILE
  long long* const full_wait = &prof_full;
#else
  long long* const full_wait = nullptr;
#endif
  for (int it = first; it < last; ++it) {
    const int4 w = p.items[it];
    const int nst = (w.w - w.z) * p.kslices;
    if (!Cfg::COOP && ((it - first) & 1) != which) {
      ring.skip(uint32_t(nst));
      continue;
    }
    if (!Cfg::COOP && it > first) ptx::named_barrier_sync(1 + which, 256);  // other one saw item it-1
    const bool hand_over = !Cfg::COOP && it + 1 < last;  // the other consumer runs item it+1
    const bool used = kit::mainloop<Cfg>(acc, nst, ring, s_a, s_b, full, which, hand_over ? 2 - which : -1, release,
                                         pairs ? half_flags<Cfg>(empty) : 0u, full_wait);
    SK_PROF(const long long te = clock64();)
    const int row0 = w.x * Cfg::BM + (Cfg::COOP ? which * 64 : 0), n0 = w.y + rank * Cfg::BN;
    if (p.slot_of) {  // split rows: a piece leaves its sums to hopper_split_reduce
      const int slot = p.slot_of[it];
      if (slot >= 0) {
        store_partial<Cfg>(acc, p, slot, rank, which);
        SK_PROF(prof_part += clock64() - te;)
        continue;
      }
    }
    // A block row with no stored block is beta * C whatever alpha is (+-Inf or NaN times the empty
    // sum would make it NaN); with row pairs, one of the two rows may have none.
    const float alpha = used ? p.alpha : 0.f;
    epilogue_boxed<Cfg>(acc, p, alpha, tm_c, row0, n0, which, ebuf, ebuf_s, c_bar, c_phase, tma);
    SK_PROF(prof_epi += clock64() - te;)
  }
  SK_PROF(if (tid == 0 && which == 0) {
    atomicAdd(&p.prof[kProfConsumer], (unsigned long long)(clock64() - t_start));
    atomicAdd(&p.prof[kProfFullWait], (unsigned long long)prof_full);
    atomicAdd(&p.prof[kProfEpilogue], (unsigned long long)prof_epi);
    atomicAdd(&p.prof[kProfPartial], (unsigned long long)prof_part);
  })
  // The last TMA stores must finish before the CTA (and its shared memory) goes away.
  if (tma && tid == 0) ptx::bulk_wait_group<0>();
}

}  // namespace sparsek::dsd_sm90
