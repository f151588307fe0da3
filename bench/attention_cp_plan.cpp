// The transfer plan of context-parallel block-sparse attention on its target layouts, on the CPU
// (no GPU needed): per rank the query blocks it computes, its work (stored blocks), and the K/V
// bytes it must receive against ring attention's (every other rank's whole shard).
//
// Layouts: causal top-k as the gate makes them: each query block keeps the diagonal block and
// round(density * key blocks) - 1 random earlier ones (fewer near the start), per query head.
//   build/attention_cp_plan [S ...]    (default 262144 and 1048576; ranks 2 and 4; Hq = Hkv = 16,
//                                       D = 128, 128x128 blocks, bf16, density 12.5%)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "causal_topk.hpp"
#include "sparsek/distributed.hpp"

using namespace sparsek;
using bench::causal_topk;
using bench::CausalTopk;

int main(int argc, char** argv) {
  std::vector<int64_t> seqs;
  for (int a = 1; a < argc; ++a) seqs.push_back(std::atoll(argv[a]));
  if (seqs.empty()) seqs = {262144, 1048576};
  const int64_t H = 16, D = 128, elem = 2;
  std::printf("context-parallel attention, transfer plan: Hq = Hkv = %lld, D = %lld, bf16, 128x128 blocks, causal "
              "top-k 12.5%% (the diagonal + random earlier blocks), one layout per head\n",
              (long long)H, (long long)D);
  std::printf("%9s %5s %4s | %10s %10s %12s | %12s %12s %7s\n", "S", "ranks", "rank", "q blocks", "work",
              "needed held", "recv MB", "ring MB", "ring/x");
  for (int64_t S : seqs) {
    const int64_t nb = (S + 127) / 128;
    const CausalTopk l = causal_topk(H, nb, 0.125, uint64_t(S));
    for (int ranks : {2, 4}) {
      if (S > 300000 && ranks == 2) continue;  // the 1M case is for 4 ranks
      const AttentionShards p = plan_attention_shards(l.view, 1, H, H, S, S, true, ranks);
      double recv = 0, ring = 0;
      for (int r = 0; r < ranks; ++r) {
        const AttentionShardRank& x = p.rank[size_t(r)];
        const double mb = p.recv_bytes(r, D, elem) / 1e6, rmb = p.ring_bytes(r, D, elem) / 1e6;
        recv += mb, ring += rmb;
        std::printf("%9lld %5d %4d | %4lld-%-5lld %10lld %12lld | %12.1f %12.1f %7.2f\n", (long long)S, ranks, r,
                    (long long)x.q_begin, (long long)x.q_end, (long long)(x.work / 2), (long long)x.needed_local, mb,
                    rmb, mb > 0 ? rmb / mb : 0.0);
      }
      std::printf("%9lld %5d  all | %10s %10s %12s | %12.1f %12.1f %7.2f\n", (long long)S, ranks, "", "", "", recv,
                  ring, recv > 0 ? ring / recv : 0.0);
    }
  }
  return 0;
}
