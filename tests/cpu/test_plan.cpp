// plan() / run(): reuse with new values, mismatched args, the one-shot plan cache, the C API.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "plan/plan_internal.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/sparsek.h"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

// Keeps SPARSEK_TUNE / SPARSEK_CACHE from the environment out of these tests: tuning off.
class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("SPARSEK_TUNE", "off", 1);
    clear_one_shot_plan_cache();
  }

 private:
  SavedEnv tune_{"SPARSEK_TUNE"}, cache_{"SPARSEK_CACHE"};  // restored when the test ends
};

CaseSpec dsd_spec(uint64_t seed) {
  CaseSpec s;
  s.kind = OpKind::dsd;
  s.rows = 128;
  s.cols = 96;
  s.bm = 32;
  s.bk = 16;
  s.free = 37;
  s.density = 0.4;
  s.seed = seed;
  return s;
}

void expect_matches_oracle(GemmCase& gc, const std::vector<double>& ref) {
  EXPECT_LE(max_rel_error(gc.args, ref), tolerance(gc.spec.out));
}

TEST(PatternStats, MeanMaxMinSpreadEmpty) {
  const int32_t rp[] = {0, 3, 3, 4, 8};  // rows of 3, 0, 1, 4 blocks
  PatternStats s = pattern_stats(rp, 4);
  EXPECT_EQ(s.rows, 4);
  EXPECT_EQ(s.nnzb, 8);
  EXPECT_DOUBLE_EQ(s.mean, 2.0);
  EXPECT_EQ(s.max, 4);
  EXPECT_EQ(s.min, 0);
  EXPECT_EQ(s.empty_rows, 1);
  EXPECT_NEAR(s.stddev, std::sqrt((1.0 + 4.0 + 1.0 + 4.0) / 4.0), 1e-12);
  PatternStats none = pattern_stats(rp, 0);
  EXPECT_EQ(none.rows, 0);
  EXPECT_EQ(none.nnzb, 0);
}

TEST_F(PlanTest, ReuseWithNewValuesMatchesOracle) {
  auto gc = make_case(dsd_spec(3));
  Plan p = plan(gc->args);
  EXPECT_EQ(p.variant(), "cpu");
  EXPECT_EQ(p.chosen_by(), "heuristic");
  EXPECT_EQ(p.backend(), Backend::cpu);
  EXPECT_EQ(p.stats().nnzb, gc->sparse.nnzb());
  EXPECT_EQ(workspace_bytes(p), 0u);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // New values in place, and new dense buffers (other pointers) for B and C.
    gc->sparse.fill_random(100 + round);
    HostDense b(gc->b->view.rows, gc->b->view.cols, DType::f32);
    b.fill_random(200 + round);
    HostDense c(gc->c->view.rows, gc->c->view.cols, DType::f32);
    c.fill(nan_value());
    gc->b = std::make_unique<HostDense>(std::move(b));
    gc->c = std::make_unique<HostDense>(std::move(c));
    gc->args.b = gc->b->view;
    gc->args.c = gc->c->view;
    gc->args.alpha = 0.5f + float(round);
    const std::vector<double> ref = oracle(gc->args);
    run(p, gc->args);
    expect_matches_oracle(*gc, ref);
  }
}

TEST_F(PlanTest, ReuseWithBetaAndEveryKind) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
    SCOPED_TRACE(to_string(kind));
    CaseSpec s = dsd_spec(9);
    s.kind = kind;
    s.beta = 0.25f;
    auto gc = make_case(s);
    Plan p = plan(gc->args);
    for (int round = 0; round < 2; ++round) {
      gc->sparse.fill_random(300 + round);
      if (gc->a) gc->a->fill_random(400 + round);
      if (gc->b) gc->b->fill_random(500 + round);
      if (kind == OpKind::sdd) gc->sparse.fill_random(600 + round);  // C's old values (beta != 0)
      const std::vector<double> ref = oracle(gc->args);
      run(p, gc->args);
      expect_matches_oracle(*gc, ref);
    }
  }
}

TEST_F(PlanTest, EmptyPatternAndEmptyRows) {
  Pattern none;
  none.mb = 4;
  none.kb = 3;
  none.row_ptr = {0, 0, 0, 0, 0};
  CaseSpec s = dsd_spec(5);
  s.custom = &none;
  s.beta = 0.f;
  auto gc = make_case(s);
  Plan p = plan(gc->args);
  EXPECT_EQ(p.stats().nnzb, 0);
  EXPECT_EQ(p.stats().empty_rows, 4);
  run(p, gc->args);
  for (float v : output_values(*gc)) ASSERT_EQ(v, 0.f);  // beta = 0: zeros, NaN in C must not leak
}

TEST_F(PlanTest, PlanRunsTheIndexChecks) {
  auto gc = make_case(dsd_spec(7));
  const std::vector<int32_t>& rp0 = gc->sparse.row_ptr();
  std::vector<int32_t> ci = gc->sparse.col_idx();
  int64_t row = 0;
  while (row < gc->sparse.mb() && rp0[size_t(row + 1)] - rp0[size_t(row)] < 2) ++row;
  ASSERT_LT(row, gc->sparse.mb()) << "the pattern needs a row with two blocks";
  ci[size_t(rp0[size_t(row)] + 1)] = ci[size_t(rp0[size_t(row)])];  // duplicate column
  GemmArgs bad = gc->args;
  bad.sparse.col_idx = ci.data();
  std::string m = [&] {
    try {
      plan(bad);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  EXPECT_NE(m.find("A (sparse): col_idx must be sorted and unique"), std::string::npos) << m;
  std::vector<int32_t> rp = rp0;
  rp.back() += 1;
  bad = gc->args;
  bad.sparse.row_ptr = rp.data();
  EXPECT_THROW(plan(bad), Error);
}

// Returns the message of the Error f throws (and checks its status).
template <class F>
std::string error_of(F&& f, Status want = Status::invalid_argument) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST_F(PlanTest, MismatchedArgsNameTheDifference) {
  auto gc = make_case(dsd_spec(11));
  Plan p = plan(gc->args);
  auto msg_for = [&](auto edit) {
    GemmArgs g = gc->args;
    edit(g);
    return error_of([&] { run(p, g); });
  };
  std::string m = msg_for([](GemmArgs& g) { g.b.ld += 1; });
  EXPECT_NE(m.find("B.ld is 38, the plan was made for 37"), std::string::npos) << m;
  m = msg_for([](GemmArgs& g) { g.c.cols -= 1; });
  EXPECT_NE(m.find("C.cols"), std::string::npos) << m;
  m = msg_for([](GemmArgs& g) { g.sparse.nnzb -= 1; });
  EXPECT_NE(m.find("sparse.nnzb"), std::string::npos) << m;
  std::vector<int32_t> rp_copy = gc->sparse.row_ptr();
  m = msg_for([&](GemmArgs& g) { g.sparse.row_ptr = rp_copy.data(); });
  EXPECT_NE(m.find("sparse.row_ptr"), std::string::npos) << m;
  m = msg_for([](GemmArgs& g) { g.kind = OpKind::dds; });
  EXPECT_NE(m.find("kind is dds, the plan was made for dsd"), std::string::npos) << m;
  m = msg_for([](GemmArgs& g) { g.b.layout = Layout::col_major; });
  EXPECT_NE(m.find("B.layout"), std::string::npos) << m;
  m = msg_for([](GemmArgs& g) { g.c.dtype = DType::f16; });
  EXPECT_NE(m.find("C.dtype"), std::string::npos) << m;
  // Matching args with a cheap-check failure: still caught.
  m = msg_for([](GemmArgs& g) { g.b.data = nullptr; });
  EXPECT_NE(m.find("B data is null"), std::string::npos) << m;
  m = error_of([&] { run(Plan(), gc->args); });
  EXPECT_NE(m.find("empty"), std::string::npos) << m;
}

TEST_F(PlanTest, LessAlignedPointersAreReCheckedAndRun) {
  auto gc = make_case(dsd_spec(31));
  Plan p = plan(gc->args);
  // B moved to an address that is only 4-byte aligned: the variant is asked again (the CPU
  // backend takes any alignment) and the result is still right.
  const DenseView& b = gc->args.b;
  const size_t n = size_t(b.rows * b.ld);
  std::vector<float> storage(n + 1);
  float* at = storage.data();
  if (reinterpret_cast<uintptr_t>(at) % 8 == 0) ++at;  // 4-byte aligned, not 8
  std::memcpy(at, b.data, n * sizeof(float));
  GemmArgs g = gc->args;
  g.b.data = at;
  const std::vector<double> ref = oracle(g);
  run(p, g);
  EXPECT_LE(max_rel_error(g, ref), tolerance(DType::f32));
}

// The GPU rows of the variant tables, by name: the kernels' rows in a build with CUDA, and in a
// build without it core/no_cuda.cpp's stand-ins, which must keep the same names (a variant asked
// for by name is known in both builds; without CUDA it says so). A change to either side fails here.
TEST(Variants, GpuRowsAreNamedTheSameWithAndWithoutCuda) {
  auto gpu_rows = [](const auto& table) {
    std::string s;
    for (const auto& v : table)
      if (v.backend == Backend::cuda) s += std::string(s.empty() ? "" : " ") + v.name + (v.peer ? "(peer)" : "");
    return s;
  };
  EXPECT_EQ(gpu_rows(variants()),
            "smalln hopper hopper_fp8 portable cusparse_bsr(peer) cusparse_ell(peer) cublas_dense(peer) "
            "cublas_batched(peer)");
  EXPECT_EQ(gpu_rows(attention_variants()), "hopper");
  EXPECT_EQ(gpu_rows(attention_backward_variants()), "hopper");
  if (!kBuiltWithCuda) {
    auto gc = make_case(dsd_spec(3));
    for (const Variant& v : variants())
      if (v.backend == Backend::cuda)
        EXPECT_NE(v.why_not(gc->args).find("built without CUDA"), std::string::npos) << v.name;
  }
}

TEST_F(PlanTest, ForcedVariant) {
  auto gc = make_case(dsd_spec(13));
  Options o;
  o.variant = "cpu";
  Plan p = plan(gc->args, o);
  EXPECT_EQ(p.chosen_by(), "forced");
  o.variant = "no_such_variant";
  std::string m = error_of([&] { plan(gc->args, o); });
  EXPECT_NE(m.find("no_such_variant"), std::string::npos) << m;
}

TEST_F(PlanTest, OneShotPlanCacheHitsAndSeesInPlaceEdits) {
  auto gc = make_case(dsd_spec(17));
  std::vector<double> ref = oracle(gc->args);
  gemm(gc->args);
  expect_matches_oracle(*gc, ref);
  PlanCacheStats s = one_shot_plan_cache_stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.size, 1u);

  // Same problem, new values and a new C buffer: a hit.
  gc->sparse.fill_random(77);
  HostDense c2(gc->c->view.rows, gc->c->view.cols, DType::f32);
  c2.fill(nan_value());
  gc->c = std::make_unique<HostDense>(std::move(c2));
  gc->args.c = gc->c->view;
  ref = oracle(gc->args);
  for (bool check : {true, false}) {
    Options o;
    o.check_indices = check;
    gemm(gc->args, o);
    expect_matches_oracle(*gc, ref);
  }
  s = one_shot_plan_cache_stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);

  // The host pattern edited in place (same pointers, same nnzb): a new plan, right answer.
  Pattern moved;
  moved.mb = gc->sparse.mb();
  moved.kb = gc->sparse.kb();
  moved.row_ptr = gc->sparse.row_ptr();
  moved.col_idx = gc->sparse.col_idx();
  int32_t* ci = const_cast<int32_t*>(gc->args.sparse.col_idx);
  bool edited = false;
  for (int64_t r = 0; r < moved.mb && !edited; ++r) {
    const int32_t b = moved.row_ptr[size_t(r)], e = moved.row_ptr[size_t(r + 1)];
    if (e > b && ci[e - 1] + 1 < moved.kb) {  // shift the row's last block one column right
      ci[e - 1] += 1;
      edited = true;
    }
  }
  ASSERT_TRUE(edited);
  ref = oracle(gc->args);
  Options fast;
  fast.check_indices = false;
  gemm(gc->args, fast);
  expect_matches_oracle(*gc, ref);
  s = one_shot_plan_cache_stats();
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.kept, 0u);  // nothing ran under a CUDA graph capture
}

// What the one-shot entries do with a plan that ran under a CUDA graph capture (a GPU test captures
// one): the cache keeps a copy that neither eviction nor clear() drops.
TEST(PlanCacheInternals, PlansKeptForGraphsOutliveEvictionAndClear) {
  using Cache = PlanCache<int, std::shared_ptr<int>>;
  Cache cache;
  auto p = std::make_shared<int>(7);
  const std::weak_ptr<int> alive = p;
  cache.put(0, p);
  cache.keep_for_graph(p);
  p.reset();
  for (int k = 1; k <= int(Cache::kCapacity); ++k) cache.put(k, std::make_shared<int>(k));
  EXPECT_FALSE(cache.take(0)) << "the oldest plan was evicted";
  EXPECT_EQ(cache.stats().size, Cache::kCapacity);
  cache.clear();
  EXPECT_EQ(cache.stats().size, 0u);
  EXPECT_EQ(cache.stats().kept, 1u);
  EXPECT_FALSE(alive.expired()) << "the kept plan was freed";
}

// A graph re-captured in a loop runs the same plan under every capture: it is kept once.
TEST(PlanCacheInternals, APlanCapturedAgainIsKeptOnce) {
  PlanCache<int, std::shared_ptr<int>> cache;
  auto p = std::make_shared<int>(7), q = std::make_shared<int>(7);
  for (int i = 0; i < 100; ++i) cache.keep_for_graph(p);
  EXPECT_EQ(cache.stats().kept, 1u);
  cache.keep_for_graph(q);  // an equal value, another plan
  EXPECT_EQ(cache.stats().kept, 2u);
  // The library's own plan handles: copies share one state.
  PlanCache<int, Plan> plans;
  auto gc = make_case(dsd_spec(23));
  const Plan a = plan(gc->args), b = a, c = plan(gc->args);
  plans.keep_for_graph(a);
  plans.keep_for_graph(b);
  EXPECT_EQ(plans.stats().kept, 1u) << "a copy of a kept plan was kept again";
  plans.keep_for_graph(c);
  EXPECT_EQ(plans.stats().kept, 2u) << "another plan for the same problem is another state";
}

TEST_F(PlanTest, OneShotCacheKeysOnOptions) {
  auto gc = make_case(dsd_spec(19));
  gemm(gc->args);
  Options o;
  o.variant = "cpu";
  gemm(gc->args, o);  // forced variant: another plan
  o.threads = 1;
  gemm(gc->args, o);  // another thread count: another plan
  gemm(gc->args, o);  // hit
  PlanCacheStats s = one_shot_plan_cache_stats();
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.size, 3u);
}

// ---- C API ----

TEST_F(PlanTest, CApiPlanLifecycle) {
  auto gc = make_case(dsd_spec(23));
  sparsek_gemm_args a{};
  a.kind = SPARSEK_DSD;
  a.op = SPARSEK_OP_NONE;
  a.alpha = 1.f;
  a.beta = 0.f;
  a.sparse = to_c(gc->args.sparse);
  a.b = to_c(gc->args.b);
  a.c = to_c(gc->args.c);
  sparsek_plan p = nullptr;
  ASSERT_EQ(sparsek_plan_create(&p, &a, nullptr), SPARSEK_OK) << sparsek_last_error();
  ASSERT_NE(p, nullptr);
  EXPECT_STREQ(sparsek_plan_variant(p), "cpu");
  uint64_t ws = 123;
  EXPECT_EQ(sparsek_plan_workspace_bytes(p, &ws), SPARSEK_OK);
  EXPECT_EQ(ws, 0u);
  for (int round = 0; round < 2; ++round) {
    gc->sparse.fill_random(900 + round);
    gc->c->fill(nan_value());
    const std::vector<double> ref = oracle(gc->args);
    ASSERT_EQ(sparsek_plan_run(p, &a, nullptr), SPARSEK_OK) << sparsek_last_error();
    expect_matches_oracle(*gc, ref);
  }
  // Mismatch: a clear status and text.
  sparsek_gemm_args wrong = a;
  wrong.b.ld += 2;
  EXPECT_EQ(sparsek_plan_run(p, &wrong, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("sparsek_plan_run: run: args do not match the plan: B.ld"),
            std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_plan_destroy(p), SPARSEK_OK);
  EXPECT_EQ(sparsek_plan_destroy(nullptr), SPARSEK_OK);
}

TEST_F(PlanTest, CApiPlanErrors) {
  auto gc = make_case(dsd_spec(29));
  sparsek_gemm_args a{};
  a.kind = SPARSEK_DSD;
  a.sparse = to_c(gc->args.sparse);
  a.b = to_c(gc->args.b);
  a.c = to_c(gc->args.c);
  sparsek_plan p = reinterpret_cast<sparsek_plan>(0x1);
  EXPECT_EQ(sparsek_plan_create(&p, nullptr, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);  // set to NULL on failure
  EXPECT_NE(std::string(sparsek_last_error()).find("'problem' is NULL"), std::string::npos);
  EXPECT_EQ(sparsek_plan_create(nullptr, &a, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(sparsek_plan_create(&p, &a, "bogus"), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("bogus"), std::string::npos);
  const int seven = 7;  // what a C caller can pass; never materialised as a C++ enum value
  std::memcpy(&a.kind, &seven, sizeof seven);
  EXPECT_EQ(sparsek_plan_create(&p, &a, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("kind"), std::string::npos) << sparsek_last_error();
  EXPECT_EQ(sparsek_plan_run(nullptr, &a, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_STREQ(sparsek_plan_variant(nullptr), "");
}

}  // namespace
}  // namespace sparsek::test
