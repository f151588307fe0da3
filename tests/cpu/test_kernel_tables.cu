// The Hopper families' config tables against what the build compiled: every configuration a table
// says is built has a kernel registered for it (the generated translation units and the table
// agree), with a function, a block size and shared memory within sm_90's limit. No GPU needed: the
// tables hold host function pointers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "kernels/attn_bwd_sm90/config.hpp"
#include "kernels/attn_fwd_sm90/config.hpp"
#include "kernels/dsd_sm90/config.hpp"
#include "kernels/dsd_sm90/heuristics.hpp"
#include "kernels/sdd_sm90/config.hpp"

namespace sparsek {
namespace {

template <class Kernel>
void expect_usable(const Kernel* k, const std::string& what) {
  ASSERT_NE(k, nullptr) << what << ": built by the table but no kernel registered";
  EXPECT_NE(k->info.func, nullptr) << what;
  EXPECT_NE(k->launch, nullptr) << what;
  EXPECT_GT(k->info.threads, 0) << what;
  EXPECT_GT(k->info.smem, 0) << what;
  EXPECT_LE(k->info.smem, kit::kSmemPerBlock) << what;
}

TEST(KernelTables, EveryBuiltDsdConfigurationHasItsKernel) {
  std::set<const void*> funcs;
  for (const dsd_sm90::Key& key : dsd_sm90::kConfigs) {
    const std::string what = "dsd bm=" + std::to_string(key.bm) + " ks=" + std::to_string(key.ks) +
                             " tile_n=" + std::to_string(key.tile_n) + " cluster=" + std::to_string(key.cluster);
    const dsd_sm90::Kernel* k = dsd_sm90::find_kernel(key);
    expect_usable(k, what);
    if (!k) continue;
    EXPECT_TRUE(k->key == key) << what;
    EXPECT_EQ(k->info.cluster, key.cluster) << what;
    funcs.insert(k->info.func);
  }
  EXPECT_EQ(funcs.size(), dsd_sm90::kConfigs.size()) << "two configurations share a kernel";
}

TEST(KernelTables, DsdTableHoldsWhatTheRulesBuild) {
  // Every block height and stage depth has the general kernel in both dtypes, C widths and layouts.
  for (int bm : dsd_sm90::kBlockRows)
    for (int ks : dsd_sm90::kStageDepths)
      for (bool bf16 : {false, true})
        for (int out : {2, 4})
          for (bool a_mn : {false, true}) {
            dsd_sm90::Key k;
            k.bm = bm, k.ks = ks, k.bf16 = bf16, k.out_bytes = out, k.a_mn = a_mn;
            EXPECT_TRUE(dsd_sm90::built(k)) << "general kernel bm=" << bm << " ks=" << ks;
          }
  // CTA pairs and narrow tiles only where the rules say.
  dsd_sm90::Key pair;
  pair.bm = 128, pair.ks = 64, pair.cluster = 2;
  EXPECT_TRUE(dsd_sm90::built(pair));
  pair.a_mn = true;
  EXPECT_FALSE(dsd_sm90::built(pair)) << "CTA pairs are built for K-major A only";
  dsd_sm90::Key narrow;
  narrow.bm = 32, narrow.ks = 64, narrow.tile_n = 64;
  EXPECT_FALSE(dsd_sm90::built(narrow)) << "narrow tiles need bm >= 64";
  narrow.bm = 64;
  EXPECT_TRUE(dsd_sm90::built(narrow));
  EXPECT_EQ(dsd_sm90::find_kernel(dsd_sm90::Key{48, 64}), nullptr);
}

TEST(KernelTables, EveryAttentionAndSddConfigurationHasItsKernel) {
  for (const attn_fwd_sm90::Key& key : attn_fwd_sm90::kConfigs)
    expect_usable(attn_fwd_sm90::find_kernel(key), "attention forward D=" + std::to_string(key.d));
  for (const attn_bwd_sm90::Key& key : attn_bwd_sm90::kConfigs)
    expect_usable(attn_bwd_sm90::find_kernel(key), "attention backward D=" + std::to_string(key.d));
  for (int i = 0; i < sdd_sm90::kNumConfigs; ++i)
    expect_usable(sdd_sm90::find_kernel(sdd_sm90::config_at(i)), "sdd config " + std::to_string(i));
  EXPECT_EQ(attn_fwd_sm90::find_kernel({96, 128, false}), nullptr);
}

// The experiment switches are read in one place and mean what heuristics.hpp says.
TEST(KernelTables, HopperOverridesFromTheEnvironment) {
  const char* names[] = {"SPARSEK_HOPPER_TILE_N", "SPARSEK_HOPPER_ROW_PAIRS", "SPARSEK_HOPPER_CLUSTER",
                         "SPARSEK_HOPPER_SPLIT", "SPARSEK_HOPPER_WINDOW", "SPARSEK_HOPPER_OVERLAP"};
  for (const char* n : names) unsetenv(n);
  dsd_sm90::Overrides o = dsd_sm90::overrides_from_env();
  EXPECT_EQ(o.tile_n, 0);
  EXPECT_EQ(o.row_pairs, -1);
  EXPECT_EQ(dsd_sm90::tile_n_for(o, true, 16), 64);
  EXPECT_EQ(dsd_sm90::tile_n_for(o, true, 100), 128);
  EXPECT_EQ(dsd_sm90::tile_n_for(o, false, 16), 256);
  EXPECT_TRUE(dsd_sm90::use_row_pairs(o, 0.8));
  EXPECT_FALSE(dsd_sm90::use_row_pairs(o, 0.5));
  EXPECT_EQ(dsd_sm90::cluster_for(o, true, false, 32, 256, [] { return false; }), 2);
  EXPECT_EQ(dsd_sm90::cluster_for(o, true, false, 31, 256, [] { return false; }), 1) << "odd tile count";
  EXPECT_EQ(dsd_sm90::cluster_for(o, true, false, 32, 256, [] { return true; }), 1) << "identical rows";
  EXPECT_DOUBLE_EQ(dsd_sm90::window_for(o, false, 128), 3.0);
  setenv("SPARSEK_HOPPER_TILE_N", "256", 1);
  setenv("SPARSEK_HOPPER_ROW_PAIRS", "off", 1);
  setenv("SPARSEK_HOPPER_CLUSTER", "1", 1);
  setenv("SPARSEK_HOPPER_SPLIT", "off", 1);
  setenv("SPARSEK_HOPPER_WINDOW", "off", 1);
  setenv("SPARSEK_HOPPER_OVERLAP", "off", 1);
  o = dsd_sm90::overrides_from_env();
  EXPECT_EQ(dsd_sm90::tile_n_for(o, true, 16), 256);
  EXPECT_FALSE(dsd_sm90::use_row_pairs(o, 1.0));
  EXPECT_EQ(dsd_sm90::cluster_for(o, true, false, 32, 256, [] { return false; }), 1);
  EXPECT_EQ(dsd_sm90::split_stages_for(o, false), -1);
  EXPECT_DOUBLE_EQ(dsd_sm90::window_for(o, false, 128), 0.0);
  EXPECT_FALSE(o.overlap);
  for (const char* n : names) unsetenv(n);
}

}  // namespace
}  // namespace sparsek
