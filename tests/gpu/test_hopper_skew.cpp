// Skewed rows on the Hopper variant at 128-row blocks: the default schedule (longest first), and
// the deadline order, which cuts the items of long rows to a window of N tiles
// (SPARSEK_HOPPER_WINDOW; default 3 for bm = 128, when there are more tiles than that) whose pieces
// go through the split-row reduction. Right against the fp64 oracle and
// bit-identical over repeats, with the default window, a window small enough to cut every long row
// (the problem is kept small for the host oracle: two pair tiles), and none.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/oracle.hpp"
#include "gpu/device_case.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

// Plans (prepare() reads the switches; the one-shot gemm() could reuse a cached plan made under
// other ones) and runs the case through "hopper"; returns C's bytes and the plan's workspace.
std::vector<uint8_t> run_hopper(GemmCase& gc, size_t* workspace = nullptr) {
  DeviceCase dc(gc);
  Options o;
  o.backend = Backend::cuda;
  o.variant = "hopper";
  const Plan p = plan(dc.args, o);
  if (workspace) *workspace = p.workspace_bytes();
  run(p, dc.args, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "hopper kernel";
  std::vector<uint8_t> got(gc.c->bytes.size());
  dc.c->download(got.data());
  return got;
}

TEST(HopperSkew, LongRowsCutByTheWindow) {
  SPARSEK_REQUIRE_SM90();
  // Zipf-like row lengths (K = 1536 at 128x128 and 128x64): a few long rows, short and empty ones.
  for (int bk : {128, 64}) {
    const int kb = 1536 / bk;
    const std::vector<int> lens = bk == 128 ? std::vector<int>{12, 9, 6, 0, 4, 3, 2, 1}
                                            : std::vector<int>{24, 17, 12, 0, 8, 6, 5, 4};
    Pattern p;
    p.mb = int64_t(lens.size());
    p.kb = kb;
    p.row_ptr = {0};
    for (size_t r = 0; r < lens.size(); ++r) {
      std::vector<int32_t> cols;
      for (int j = 0; j < lens[r]; ++j) cols.push_back(int32_t((j * 7 + int(r)) % kb));  // distinct: gcd(7, kb) = 1
      std::sort(cols.begin(), cols.end());
      p.col_idx.insert(p.col_idx.end(), cols.begin(), cols.end());
      p.row_ptr.push_back(int32_t(p.col_idx.size()));
    }
    CaseSpec s;
    s.custom = &p;
    s.bm = 128;
    s.bk = bk;
    s.rows = p.mb * 128;
    s.cols = 1536;
    s.free = 776;  // four 256-column tiles: two CTA-pair items per row, the last ragged
    s.in = DType::f16;
    s.out = DType::f32;
    s.alpha = 1.25f;
    s.seed = uint64_t(bk);
    SCOPED_TRACE(describe(s));
    auto gc = make_case(s);
    const std::vector<double> ref = oracle(gc->args);
    size_t none = 0;
    {
      EnvFor off("SPARSEK_HOPPER_SPLIT", "off");
      run_hopper(*gc, &none);
    }
    {
      SCOPED_TRACE("default schedule (longest first at 128-row blocks)");
      const std::vector<uint8_t> first = run_hopper(*gc);
      EXPECT_TRUE(run_hopper(*gc) == first) << "repeat differs";
      gc->c->bytes = first;
      EXPECT_LE(max_rel_error(gc->args, ref), 5e-5);
    }
    // The window cuts under the deadline order (at 128-row blocks the default is longest first).
    EnvFor deadline("SPARSEK_HOPPER_SCHEDULE", "deadline");
    for (const char* window : {static_cast<const char*>(nullptr), "0.05", "off"}) {
      SCOPED_TRACE(std::string("SPARSEK_HOPPER_WINDOW=") + (window ? window : "(default)"));
      EnvFor w("SPARSEK_HOPPER_WINDOW", window);
      size_t ws = 0;
      const std::vector<uint8_t> first = run_hopper(*gc, &ws);
      if (window && std::string(window) == "0.05")  // a window of 16 stages: the long rows are cut
        EXPECT_GT(ws, none) << "no row was cut";
      EXPECT_TRUE(run_hopper(*gc) == first) << "repeat differs";
      gc->c->bytes = first;
      EXPECT_LE(max_rel_error(gc->args, ref), 5e-5);
    }
  }
}

}  // namespace
}  // namespace sparsek::test
