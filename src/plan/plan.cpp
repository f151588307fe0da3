// plan(): the O(nnzb) work done once per pattern (checks, row-length analysis, variant choice,
// the variant's set-up); run(): matches args to the plan and launches, allocation-free.
#include "sparsek/plan.hpp"

#include "core/cuda_host.hpp"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <set>

#include "core/device.hpp"
#include "plan/plan_internal.hpp"
#include "plan/tuned_choice.hpp"

namespace sparsek {

struct Plan::Impl {
  GemmArgs problem;  // as given to plan(); run() args must match it (values may differ)
  Backend backend = Backend::cpu;
  const Variant* variant = nullptr;
  std::string variant_name, chosen_by;
  PatternStats stats;
  int threads = 0;
  int device = -1;  // CUDA device current at plan() (cuda plans)
  int align[4] = {};  // alignment (log2, capped) of the planned values, a, b, c pointers
  std::unique_ptr<VariantState> state;
};

Plan::Plan() = default;
Plan::~Plan() = default;
Plan::Plan(const Plan&) = default;
Plan& Plan::operator=(const Plan&) = default;
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;

namespace {
void data_alignment(const GemmArgs& g, int out[4]) {
  out[0] = align_log2(g.sparse.values);
  out[1] = align_log2(g.a.data);
  out[2] = align_log2(g.b.data);
  out[3] = align_log2(g.c.data);
}
[[noreturn]] void empty_plan() {
  throw Error(Status::invalid_argument, "the plan is empty (make one with sparsek::plan())");
}
}  // namespace

const std::string& Plan::variant() const {
  if (!impl_) empty_plan();
  return impl_->variant_name;
}
const std::string& Plan::chosen_by() const {
  if (!impl_) empty_plan();
  return impl_->chosen_by;
}
const PatternStats& Plan::stats() const {
  if (!impl_) empty_plan();
  return impl_->stats;
}
const GemmArgs& Plan::problem() const {
  if (!impl_) empty_plan();
  return impl_->problem;
}
Backend Plan::backend() const {
  if (!impl_) empty_plan();
  return impl_->backend;
}
size_t Plan::workspace_bytes() const {
  if (!impl_) empty_plan();
  return impl_->state ? impl_->state->workspace_bytes() : 0;
}
size_t workspace_bytes(const Plan& p) { return p.workspace_bytes(); }

PatternStats pattern_stats(const int32_t* row_ptr, int64_t mb) {
  PatternStats s;
  s.rows = mb;
  if (mb <= 0) return s;
  s.nnzb = row_ptr[mb] - row_ptr[0];
  s.mean = double(s.nnzb) / double(mb);
  s.min = INT64_MAX;
  double sq = 0;
  for (int64_t r = 0; r < mb; ++r) {
    int64_t len = row_ptr[r + 1] - row_ptr[r];
    s.max = std::max(s.max, len);
    s.min = std::min(s.min, len);
    s.empty_rows += len == 0;
    double d = double(len) - s.mean;
    sq += d * d;
  }
  s.stddev = std::sqrt(sq / double(mb));
  return s;
}

struct PlanAccess {
  static Plan make(std::unique_ptr<Plan::Impl> impl) {
    Plan p;
    p.impl_ = std::shared_ptr<Plan::Impl>(std::move(impl));
    return p;
  }
  static const Plan::Impl* impl(const Plan& p) { return p.impl_.get(); }
};

Plan make_plan(const GemmArgs& g, const Options& o, Backend be, const HostPattern& hp) {
  auto impl = std::make_unique<Plan::Impl>();
  impl->problem = g;
  impl->backend = be;
  impl->threads = o.threads;
  impl->stats = pattern_stats(hp.row_ptr, g.sparse.mb());
  if (be == Backend::cuda) check_cuda(cudaGetDevice(&impl->device), "cudaGetDevice");

  const Variant* v = nullptr;
  if (!o.variant.empty()) {
    v = &forced_variant(g, o.variant, be);
    impl->chosen_by = "forced";
  } else {
    const TunedChoice tuned = tuned_choice(g, o, be, impl->stats);  // the seam: plan/tuned_choice.hpp
    v = tuned.variant;
    impl->chosen_by = tuned.chosen_by;
    if (!v) {
      std::string reasons;
      v = heuristic_variant(g, be, &reasons);
      if (!v) throw Error(Status::unsupported, "no variant supports this problem" + reasons);
      impl->chosen_by = "heuristic";
    }
  }
  impl->variant = v;
  impl->variant_name = v->name;
  data_alignment(g, impl->align);
  if (v->prepare) {
    Options po;
    po.backend = be;
    po.threads = o.threads;
    po.check_indices = false;
    impl->state = v->prepare(g, po);
  }
  return PlanAccess::make(std::move(impl));
}

Plan plan(const GemmArgs& problem, const Options& options) {
  validate(problem, false);
  Backend be = resolve_backend(problem, options);
  HostPattern hp = host_pattern(problem.sparse, true, options.stream);
  validate_pattern(problem, hp);
  return make_plan(problem, options, be, hp);
}

void plan_mismatch(const std::string& what, const std::string& got, const std::string& want) {
  throw Error(Status::invalid_argument,
              "run: args do not match the plan: " + what + " is " + got + ", the plan was made for " + want);
}

namespace {

std::string ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
std::string num(int64_t v) { return std::to_string(v); }

void match_dense(const DenseView& got, const DenseView& want, const char* name) {
  std::string n(name);
  if (got.rows != want.rows) plan_mismatch(n + ".rows", num(got.rows), num(want.rows));
  if (got.cols != want.cols) plan_mismatch(n + ".cols", num(got.cols), num(want.cols));
  if (got.ld != want.ld) plan_mismatch(n + ".ld", num(got.ld), num(want.ld));
  if (got.layout != want.layout) plan_mismatch(n + ".layout", to_string(got.layout), to_string(want.layout));
  if (got.dtype != want.dtype) plan_mismatch(n + ".dtype", to_string(got.dtype), to_string(want.dtype));
  if (got.memory != want.memory) plan_mismatch(n + ".memory", to_string(got.memory), to_string(want.memory));
  if (got.scale_group != want.scale_group) plan_mismatch(n + ".scale_group", num(got.scale_group), num(want.scale_group));
}

}  // namespace

// Only compares; the strings are built on a mismatch alone, so a matching call allocates nothing.
void match_planned(const GemmArgs& g, const GemmArgs& p) {
  if (g.kind != p.kind) plan_mismatch("kind", to_string(g.kind), to_string(p.kind));
  if (g.op != p.op) plan_mismatch("op", to_string(g.op), to_string(p.op));
  const BsrView &s = g.sparse, &t = p.sparse;
  if (s.rows != t.rows) plan_mismatch("sparse.rows", num(s.rows), num(t.rows));
  if (s.cols != t.cols) plan_mismatch("sparse.cols", num(s.cols), num(t.cols));
  if (s.bm != t.bm) plan_mismatch("sparse.bm", num(s.bm), num(t.bm));
  if (s.bk != t.bk) plan_mismatch("sparse.bk", num(s.bk), num(t.bk));
  if (s.nnzb != t.nnzb) plan_mismatch("sparse.nnzb", num(s.nnzb), num(t.nnzb));
  if (s.dtype != t.dtype) plan_mismatch("sparse.dtype", to_string(s.dtype), to_string(t.dtype));
  if (s.memory != t.memory) plan_mismatch("sparse.memory", to_string(s.memory), to_string(t.memory));
  if (s.row_ptr != t.row_ptr) plan_mismatch("sparse.row_ptr", ptr(s.row_ptr), ptr(t.row_ptr));
  if (s.col_idx != t.col_idx && s.nnzb > 0) plan_mismatch("sparse.col_idx", ptr(s.col_idx), ptr(t.col_idx));
  if (g.kind != OpKind::dsd) match_dense(g.a, p.a, "A");
  if (g.kind != OpKind::dds) match_dense(g.b, p.b, "B");
  if (g.kind != OpKind::sdd) match_dense(g.c, p.c, "C");
}

namespace {

// What every run needs once args are known to match the plan and to pass the cheap checks.
void launch(const Plan::Impl& im, const GemmArgs& args, void* stream) {
  int al[4];
  data_alignment(args, al);
  const bool less_aligned = al[0] < im.align[0] || al[1] < im.align[1] || al[2] < im.align[2] || al[3] < im.align[3];
  launch_variant(*im.variant, im.backend, im.device, im.threads, less_aligned, args, im.state.get(), stream);
}

}  // namespace

void run(const Plan& p, const GemmArgs& args, void* stream) {
  if (!p.impl_) empty_plan();
  check_enums(args);  // the mismatch messages below print enum values by name
  match_planned(args, p.impl_->problem);
  validate(args, false);  // the cheap checks: null pointers, extents, aliasing, NaN alpha/beta
  launch(*p.impl_, args, stream);
}

void run_validated(const Plan& p, const GemmArgs& args, void* stream) {
  const Plan::Impl* im = PlanAccess::impl(p);
  if (!im) empty_plan();
  launch(*im, args, stream);
}

PlanLaunch plan_launch(const Plan& p, void* stream) {
  const Plan::Impl* im = PlanAccess::impl(p);
  if (!im) empty_plan();
  PlanLaunch l;
  l.variant = im->variant;
  l.state = im->state.get();
  l.options = plan_run_options(im->backend, im->threads, stream);  // as launch() builds them
  return l;
}

void check_plan_device(Backend be, int planned_device) {
  if (be != Backend::cuda) return;
  int dev = -1;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev != planned_device)
    throw Error(Status::invalid_argument, "run: the plan was made on CUDA device " + num(planned_device) +
                                              " but device " + num(dev) + " is current");
}

Options plan_run_options(Backend be, int threads, void* stream) {
  Options o;  // default-constructed: its empty variant string allocates nothing
  o.backend = be;
  o.stream = stream;
  o.check_indices = false;
  o.threads = threads;
  return o;
}

}  // namespace sparsek
