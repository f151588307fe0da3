// Attention's plan(), run() and one-shot attention(), and the backward's plan(), run() and
// attention_backward(), in the products' shape (plan.cpp, one_shot.cpp). A plan is made for shapes,
// strides, dtypes, memory, the layout's extents, causal and scale; never for the layout's contents,
// which may change on every run (a gate makes a new layout every step): plan() and run() do not
// read them.
#include "core/cuda_host.hpp"

#include <cstring>

#include "core/device.hpp"
#include "format/attention_internal.hpp"
#include "plan/plan_internal.hpp"
#include "sparsek/attention.hpp"

namespace sparsek {

namespace {
// The pointers a variant may care about the alignment of.
constexpr int kPointers = 9;
void data_alignment(const AttentionArgs& a, int out[kPointers]) {
  const AttentionLayout& l = a.layout;
  const void* p[kPointers] = {a.q.data,      a.k.data,   a.v.data,           a.o.data,       a.lse,
                              l.kv_num_blocks, l.kv_indices, l.full_kv_num_blocks, l.full_kv_indices};
  for (int i = 0; i < kPointers; ++i) out[i] = align_log2(p[i]);
}
}  // namespace

struct AttentionPlan::Impl {
  AttentionArgs problem;  // as given to plan(); run() args must match it but for the pointers
  Backend backend = Backend::cpu;
  const AttentionVariant* variant = nullptr;
  std::string variant_name;
  int threads = 0;
  int device = -1;            // CUDA device current at plan() (cuda plans)
  int align[kPointers] = {};  // alignment (log2, capped) of the planned pointers
  std::unique_ptr<VariantState> state;
};

AttentionPlan::AttentionPlan() = default;
AttentionPlan::~AttentionPlan() = default;
AttentionPlan::AttentionPlan(const AttentionPlan&) = default;
AttentionPlan& AttentionPlan::operator=(const AttentionPlan&) = default;
AttentionPlan::AttentionPlan(AttentionPlan&&) noexcept = default;
AttentionPlan& AttentionPlan::operator=(AttentionPlan&&) noexcept = default;

namespace {
[[noreturn]] void empty_plan() {
  throw Error(Status::invalid_argument, "the attention plan is empty (make one with sparsek::plan())");
}
}  // namespace

const std::string& AttentionPlan::variant() const {
  if (!impl_) empty_plan();
  return impl_->variant_name;
}
Backend AttentionPlan::backend() const {
  if (!impl_) empty_plan();
  return impl_->backend;
}
size_t AttentionPlan::workspace_bytes() const {
  if (!impl_) empty_plan();
  return impl_->state ? impl_->state->workspace_bytes() : 0;
}

namespace {
// plan()'s variant (Options::variant, else the heuristic default) and its prepared state, for the
// forward and the backward alike. `what` names the product in the no-variant error.
template <class Args>
const VariantOf<Args>& choose_variant(const Args& problem, const Options& options, Backend be, const char* what) {
  if (!options.variant.empty()) return forced_variant(problem, options.variant, be);
  std::string reasons;
  const VariantOf<Args>* v = heuristic_variant(problem, be, &reasons);
  if (!v) throw Error(Status::unsupported, std::string("no ") + what + " variant supports this problem" + reasons);
  return *v;
}
template <class Args>
std::unique_ptr<VariantState> prepare_state(const VariantOf<Args>& v, const Args& problem, Backend be, int threads) {
  if (!v.prepare) return nullptr;
  Options po;
  po.backend = be;
  po.threads = threads;
  po.check_indices = false;
  return v.prepare(problem, po);
}
}  // namespace

AttentionPlan plan(const AttentionArgs& problem, const Options& options) {
  validate(problem, false);
  const Backend be = resolve_backend(problem.q.memory, options);
  auto impl = std::make_shared<AttentionPlan::Impl>();
  impl->problem = problem;
  impl->backend = be;
  impl->threads = options.threads;
  if (be == Backend::cuda) check_cuda(cudaGetDevice(&impl->device), "cudaGetDevice");
  impl->variant = &choose_variant(problem, options, be, "attention");
  impl->variant_name = impl->variant->name;
  data_alignment(problem, impl->align);
  impl->state = prepare_state(*impl->variant, problem, be, options.threads);
  AttentionPlan p;
  p.impl_ = std::move(impl);
  return p;
}

namespace {

std::string num(int64_t v) { return std::to_string(v); }

// Only compares; strings are built on a mismatch alone, so a matching call allocates nothing.
void match_tensor(const Tensor4View& g, const Tensor4View& p, const char* name) {
  const int64_t got[7] = {g.b, g.h, g.s, g.d, g.stride_b, g.stride_h, g.stride_s};
  const int64_t want[7] = {p.b, p.h, p.s, p.d, p.stride_b, p.stride_h, p.stride_s};
  static const char* field[7] = {".b", ".h", ".s", ".d", ".stride_b", ".stride_h", ".stride_s"};
  for (int i = 0; i < 7; ++i)
    if (got[i] != want[i]) plan_mismatch(name + std::string(field[i]), num(got[i]), num(want[i]));
  if (g.dtype != p.dtype) plan_mismatch(name + std::string(" dtype"), to_string(g.dtype), to_string(p.dtype));
  if (g.memory != p.memory) plan_mismatch(name + std::string(" memory"), to_string(g.memory), to_string(p.memory));
}

void match(const AttentionArgs& g, const AttentionArgs& p) {
  match_tensor(g.q, p.q, "q");
  match_tensor(g.k, p.k, "k");
  match_tensor(g.v, p.v, "v");
  match_tensor(g.o, p.o, "o");
  const AttentionLayout &l = g.layout, &m = p.layout;
  const int64_t got[7] = {l.batch, l.heads, l.q_blocks, l.kmax, l.has_full() ? l.full_kmax : 0, l.block_q, l.block_kv};
  const int64_t want[7] = {m.batch, m.heads, m.q_blocks, m.kmax, m.has_full() ? m.full_kmax : 0, m.block_q, m.block_kv};
  static const char* field[7] = {"layout.batch", "layout.heads", "layout.q_blocks", "layout.kmax",
                                 "layout.full_kmax", "layout.block_q", "layout.block_kv"};
  for (int i = 0; i < 7; ++i)
    if (got[i] != want[i]) plan_mismatch(field[i], num(got[i]), num(want[i]));
  if (l.memory != m.memory) plan_mismatch("layout.memory", to_string(l.memory), to_string(m.memory));
  auto lists = [](bool full) { return std::string(full ? "with" : "without") + " full lists"; };
  if (l.has_full() != m.has_full()) plan_mismatch("the layout", lists(l.has_full()), lists(m.has_full()));
  auto yn = [](bool b) { return std::string(b ? "true" : "false"); };
  if (g.causal != p.causal) plan_mismatch("causal", yn(g.causal), yn(p.causal));
  auto packed = [](const AttentionArgs& a) {
    return a.cu_seqlens ? "packed sequences (num_seqs = " + num(a.num_seqs) + ")" : std::string("no cu_seqlens");
  };
  if ((g.cu_seqlens != nullptr) != (p.cu_seqlens != nullptr) || g.num_seqs != p.num_seqs)
    plan_mismatch("cu_seqlens", packed(g), packed(p));
  if (g.softmax_scale() != p.softmax_scale())
    plan_mismatch("the softmax scale", std::to_string(g.softmax_scale()), std::to_string(p.softmax_scale()));
}

// Whether any of n pointers is less aligned now than when the plan was made.
bool less_aligned(const int* now, const int* planned, int n) {
  for (int i = 0; i < n; ++i)
    if (now[i] < planned[i]) return true;
  return false;
}

// What every run needs once args match the plan and pass the cheap checks.
void launch(const AttentionPlan::Impl& im, const AttentionArgs& args, void* stream) {
  int al[kPointers];
  data_alignment(args, al);
  launch_variant(*im.variant, im.backend, im.device, im.threads, less_aligned(al, im.align, kPointers), args,
                 im.state.get(), stream);
}

}  // namespace

// The one-shot entries run their cached plans through launch(): their args passed validate() and
// their cache key pins everything run() would match against the plan.
struct AttentionPlanAccess {
  static const AttentionPlan::Impl& impl(const AttentionPlan& p) { return *p.impl_; }
  static const AttentionBackwardPlan::Impl& impl(const AttentionBackwardPlan& p) { return *p.impl_; }
};

void run(const AttentionPlan& p, const AttentionArgs& args, void* stream) {
  if (!p.impl_) empty_plan();
  match(args, p.impl_->problem);
  validate(args, false);  // the cheap checks: null pointers, outputs overlapping inputs
  launch(*p.impl_, args, stream);
}

// ---- the one-shot entry: validate + plan + run, through a small cache of plans ----
//
// Key: everything a plan is made for (all but the pointers and the layout's contents), the
// alignment of every pointer (a plan is chosen for it), and the options that steer planning; for
// cuda, the stream (a plan's workspace is used in one stream's order) and the current device.
namespace {

struct AttentionKey {
  std::vector<int64_t> fields;
  std::string variant;
  bool operator==(const AttentionKey& o) const { return fields == o.fields && variant == o.variant; }
};

AttentionKey key_of(const AttentionArgs& a, const Options& o, Backend be) {
  AttentionKey k;
  auto& f = k.fields;
  for (const Tensor4View* t : {&a.q, &a.k, &a.v, &a.o})
    f.insert(f.end(), {t->b, t->h, t->s, t->d, t->stride_b, t->stride_h, t->stride_s, int64_t(t->dtype),
                       int64_t(t->memory)});
  const AttentionLayout& l = a.layout;
  f.insert(f.end(), {l.batch, l.heads, l.q_blocks, l.kmax, l.has_full() ? l.full_kmax : -1, l.block_q, l.block_kv,
                     int64_t(l.memory), int64_t(a.causal), a.cu_seqlens ? a.num_seqs : -1});
  float scale = a.softmax_scale();
  uint32_t bits;
  std::memcpy(&bits, &scale, 4);
  f.push_back(int64_t(bits));
  int al[kPointers];
  data_alignment(a, al);
  f.insert(f.end(), al, al + kPointers);
  f.insert(f.end(), {int64_t(be), int64_t(o.threads)});
  if (be == Backend::cuda) {
    int dev = -1;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    f.insert(f.end(), {int64_t(reinterpret_cast<intptr_t>(o.stream)), int64_t(dev)});
  }
  k.variant = o.variant;
  return k;
}

PlanCache<AttentionKey, AttentionPlan>& attention_plan_cache() {
  static auto* cache = new PlanCache<AttentionKey, AttentionPlan>;  // leaked on purpose (exit order)
  return *cache;
}

}  // namespace

void attention(const AttentionArgs& args, const Options& options) {
  validate(args, false);
  if (options.check_indices) check_layout_contents(args, options.stream);
  const Backend be = resolve_backend(args.q.memory, options);
  AttentionKey key = key_of(args, options, be);
  AttentionPlan p = attention_plan_cache().take(key);
  if (!p) p = plan(args, options);
  launch(AttentionPlanAccess::impl(p), args, options.stream);
  if (be == Backend::cuda && stream_is_capturing(options.stream)) attention_plan_cache().keep_for_graph(p);
  attention_plan_cache().put(std::move(key), std::move(p));
}

// ---- the backward's plan(), run() and one-shot entry (a cache like attention()'s) ----

namespace {
// The forward's pointers, then dout, dq, dk, dv.
constexpr int kBackwardPointers = kPointers + 4;
void backward_alignment(const AttentionBackwardArgs& a, int out[kBackwardPointers]) {
  data_alignment(a.forward, out);
  const void* p[4] = {a.dout.data, a.dq.data, a.dk.data, a.dv.data};
  for (int i = 0; i < 4; ++i) out[kPointers + i] = align_log2(p[i]);
}
}  // namespace

struct AttentionBackwardPlan::Impl {
  AttentionBackwardArgs problem;  // as given to plan(); run() args must match it but for the pointers
  const AttentionBackwardVariant* variant = nullptr;
  std::string variant_name;
  Backend backend = Backend::cpu;
  int device = -1;  // CUDA device current at plan() (cuda plans)
  int threads = 0;
  int align[kBackwardPointers] = {};
  std::unique_ptr<VariantState> state;  // the GPU variant's workspace
};

AttentionBackwardPlan::AttentionBackwardPlan() = default;
AttentionBackwardPlan::~AttentionBackwardPlan() = default;
AttentionBackwardPlan::AttentionBackwardPlan(const AttentionBackwardPlan&) = default;
AttentionBackwardPlan& AttentionBackwardPlan::operator=(const AttentionBackwardPlan&) = default;
AttentionBackwardPlan::AttentionBackwardPlan(AttentionBackwardPlan&&) noexcept = default;
AttentionBackwardPlan& AttentionBackwardPlan::operator=(AttentionBackwardPlan&&) noexcept = default;

namespace {
[[noreturn]] void empty_backward_plan() {
  throw Error(Status::invalid_argument, "the attention backward plan is empty (make one with sparsek::plan())");
}

// As the forward's launch().
void launch(const AttentionBackwardPlan::Impl& im, const AttentionBackwardArgs& args, void* stream) {
  int al[kBackwardPointers];
  backward_alignment(args, al);
  launch_variant(*im.variant, im.backend, im.device, im.threads, less_aligned(al, im.align, kBackwardPointers),
                 args, im.state.get(), stream);
}
}  // namespace

const std::string& AttentionBackwardPlan::variant() const {
  if (!impl_) empty_backward_plan();
  return impl_->variant_name;
}
size_t AttentionBackwardPlan::workspace_bytes() const {
  if (!impl_) empty_backward_plan();
  return impl_->state ? impl_->state->workspace_bytes() : 0;
}

AttentionBackwardPlan plan(const AttentionBackwardArgs& problem, const Options& options) {
  validate(problem, false);
  const Backend be = resolve_backend(problem.forward.q.memory, options);
  auto impl = std::make_shared<AttentionBackwardPlan::Impl>();
  impl->problem = problem;
  impl->backend = be;
  impl->threads = options.threads;
  if (be == Backend::cuda) check_cuda(cudaGetDevice(&impl->device), "cudaGetDevice");
  impl->variant = &choose_variant(problem, options, be, "attention backward");
  impl->variant_name = impl->variant->name;
  backward_alignment(problem, impl->align);
  impl->state = prepare_state(*impl->variant, problem, be, options.threads);
  AttentionBackwardPlan p;
  p.impl_ = std::move(impl);
  return p;
}

void run(const AttentionBackwardPlan& p, const AttentionBackwardArgs& args, void* stream) {
  if (!p.impl_) empty_backward_plan();
  const AttentionBackwardPlan::Impl& im = *p.impl_;
  match(args.forward, im.problem.forward);
  match_tensor(args.dout, im.problem.dout, "dout");
  match_tensor(args.dq, im.problem.dq, "dq");
  match_tensor(args.dk, im.problem.dk, "dk");
  match_tensor(args.dv, im.problem.dv, "dv");
  validate(args, false);  // the cheap checks: null pointers, outputs overlapping inputs or each other
  launch(im, args, stream);
}

// The one-shot cache's key: the forward's key plus the gradient tensors' shapes, strides, dtypes
// and the alignment of their pointers.
namespace {

AttentionKey backward_key_of(const AttentionBackwardArgs& a, const Options& o, Backend be) {
  AttentionKey k = key_of(a.forward, o, be);
  auto& f = k.fields;
  for (const Tensor4View* t : {&a.dout, &a.dq, &a.dk, &a.dv})
    f.insert(f.end(), {t->b, t->h, t->s, t->d, t->stride_b, t->stride_h, t->stride_s, int64_t(t->dtype),
                       int64_t(t->memory), int64_t(align_log2(t->data))});
  return k;
}

PlanCache<AttentionKey, AttentionBackwardPlan>& backward_plan_cache() {
  static auto* cache = new PlanCache<AttentionKey, AttentionBackwardPlan>;  // leaked on purpose (exit order)
  return *cache;
}

}  // namespace

void attention_backward(const AttentionBackwardArgs& args, const Options& options) {
  validate(args, false);
  const AttentionArgs& f = args.forward;
  if (options.check_indices) check_layout_contents(f, options.stream);
  const Backend be = resolve_backend(f.q.memory, options);
  AttentionKey key = backward_key_of(args, options, be);
  AttentionBackwardPlan p = backward_plan_cache().take(key);
  if (!p) p = plan(args, options);
  launch(AttentionPlanAccess::impl(p), args, options.stream);
  if (be == Backend::cuda && stream_is_capturing(options.stream)) backward_plan_cache().keep_for_graph(p);
  backward_plan_cache().put(std::move(key), std::move(p));
}

}  // namespace sparsek
