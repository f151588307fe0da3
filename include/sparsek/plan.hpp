// sparsek — plan once, run many times.
//
//   Plan p = plan(problem, options);   // O(nnzb) checks, pattern analysis, variant choice, set-up
//   run(p, args, stream);              // cheap checks + launch; allocation-free, graph-capturable
//
// A plan is made for one problem: kind, op, shapes, block shape, dtypes, layouts, leading
// dimensions, memory, e4m3 scale groups, and the pattern (row_ptr / col_idx pointers and nnzb).
// The values, the e4m3 scales, the dense pointers, alpha and beta may change between runs (the
// scales' values are checked by plan() and by one-shot calls with check_indices, not by run()).
// The pattern arrays must stay alive and unchanged while the plan is used (a plan does not own
// them).
//
// Thread safety: plan() may run concurrently. One plan may be run from several threads only when
// its runs do not overlap in time on the device: a variant's workspace is used in stream order
// (like a cuBLAS handle's), so give each concurrent stream its own plan.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sparsek/gemm.hpp"

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

// Stored blocks per block row of the sparse operand.
struct PatternStats {
  int64_t rows = 0;        // block rows (mb)
  int64_t nnzb = 0;
  double mean = 0;         // nnzb / rows
  int64_t max = 0, min = 0;
  double stddev = 0;       // population standard deviation ("spread")
  int64_t empty_rows = 0;
};

// row_ptr: host int32[mb + 1], already validated.
PatternStats pattern_stats(const int32_t* row_ptr, int64_t mb);

class Plan {
 public:
  Plan();  // an empty plan: run() on it throws
  ~Plan();
  Plan(const Plan&);             // shares the prepared state (see thread safety above)
  Plan& operator=(const Plan&);
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;

  explicit operator bool() const { return impl_ != nullptr; }
  const std::string& variant() const;  // name of the chosen variant
  // Why this variant: "forced" (Options::variant), "cache" (tuning cache hit), "tuned" (tuned by
  // this call, SPARSEK_TUNE=on), "heuristic" (the default without timing).
  const std::string& chosen_by() const;
  const PatternStats& stats() const;
  const GemmArgs& problem() const;  // the problem the plan was made for (pointers as given)
  Backend backend() const;          // cpu or cuda
  size_t workspace_bytes() const;   // device/host scratch the variant holds (0 when none)

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  friend Plan plan(const GemmArgs&, const Options&);
  friend void run(const Plan&, const GemmArgs&, void*);
  friend struct PlanAccess;
};

// Validates everything, including the O(nnzb) index checks (device indices are copied to the
// host once), analyses row lengths, chooses the variant (Options::variant if set, else the tuning
// cache / tuner per SPARSEK_TUNE, else the heuristic default) and runs its set-up. For a device
// pattern, plan() first waits for options.stream (the pattern may have been uploaded there) and
// then reads the pattern synchronously; Options::check_indices is ignored (plan always checks).
Plan plan(const GemmArgs& problem, const Options& options = {});

// Checks that args match the plan (throws Error(invalid_argument) naming the first difference),
// runs the cheap checks and the variant. Device work goes on `stream` (a cudaStream_t), not
// synchronized. Allocates nothing.
void run(const Plan& plan, const GemmArgs& args, void* stream = nullptr);

// Scratch memory held by the plan's variant, in bytes (0 when none).
size_t workspace_bytes(const Plan& plan);

// The one-shot gemm() keeps the last 16 plans it made (keyed by the problem, the pattern and the
// options; see gemm.hpp). Host patterns are hashed on every call, so editing one in place is
// safe (a CPU plan computes from its own copy of the pattern, so even an edit made to keep the
// 64-bit hash can only give the planned pattern's result, never a read out of bounds). A device pattern is keyed by its pointers unless Options::check_indices (the default)
// copies it anyway: mutating a device pattern in place between one-shot calls needs
// check_indices or an explicit plan. Changes to the tuning cache file reach plans made later.
// A plan that ran while its stream was being captured into a CUDA graph is also kept for the life
// of the process (the graph uses its workspace): `kept` counts those runs, and neither eviction
// nor clear_one_shot_plan_cache() frees them. The attention one-shots do the same.
struct PlanCacheStats {
  size_t hits = 0, misses = 0, size = 0, kept = 0;
};
PlanCacheStats one_shot_plan_cache_stats();
void clear_one_shot_plan_cache();

}  // namespace sparsek
#pragma GCC visibility pop
