// Decode attention's plan(), run() and one-shot decode_attention(). A plan is made for shapes,
// strides, dtypes, memory kinds, batch, max_pages, sel_kmax, causal_new and scale; never for the
// index arrays' contents, which change every step (new tokens, new pages, a new selection):
// plan() and run() do not read them. The GPU plan picks the KV split from the shapes and
// allocates the partials' workspace; run() allocates nothing.
#include "core/cuda_host.hpp"

#include <algorithm>
#include <string>

#include "core/device.hpp"
#include "format/decode_internal.hpp"
#include "kernels/decode/launch.hpp"
#include "plan/plan_internal.hpp"
#include "sparsek/decode.hpp"

namespace sparsek {

struct DecodePlan::Impl {
  DecodeArgs problem;
  Backend backend = Backend::cpu;
  std::string variant_name;
  int threads = 0;
  int device = -1;
  int splits = 1;
  decode_gpu::Flavor flavor = decode_gpu::Flavor::cuda_cores;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  ~Impl() {
    if (!workspace) return;
    int cur = -1;
    const bool switched = cudaGetDevice(&cur) == cudaSuccess && cur != device && cudaSetDevice(device) == cudaSuccess;
    cudaFree(workspace);
    if (switched) cudaSetDevice(cur);
  }
};

DecodePlan::DecodePlan() = default;
DecodePlan::~DecodePlan() = default;
DecodePlan::DecodePlan(const DecodePlan&) = default;
DecodePlan& DecodePlan::operator=(const DecodePlan&) = default;
DecodePlan::DecodePlan(DecodePlan&&) noexcept = default;
DecodePlan& DecodePlan::operator=(DecodePlan&&) noexcept = default;

namespace {
[[noreturn]] void empty_plan() {
  throw Error(Status::invalid_argument, "the decode plan is empty (make one with sparsek::plan())");
}
std::string num(int64_t v) { return std::to_string(v); }

void match_tokens(const TokensView& g, const TokensView& p, const char* name) {
  const int64_t got[5] = {g.t, g.h, g.d, g.stride_t, g.stride_h};
  const int64_t want[5] = {p.t, p.h, p.d, p.stride_t, p.stride_h};
  static const char* field[5] = {".t", ".h", ".d", ".stride_t", ".stride_h"};
  for (int i = 0; i < 5; ++i)
    if (got[i] != want[i]) plan_mismatch(name + std::string(field[i]), num(got[i]), num(want[i]));
  if (g.dtype != p.dtype) plan_mismatch(name + std::string(" dtype"), to_string(g.dtype), to_string(p.dtype));
  if (g.memory != p.memory) plan_mismatch(name + std::string(" memory"), to_string(g.memory), to_string(p.memory));
}
void match_cache(const PagedCacheView& g, const PagedCacheView& p, const char* name) {
  const int64_t got[7] = {g.pages, g.page_size, g.h, g.d, g.stride_page, g.stride_slot, g.stride_h};
  const int64_t want[7] = {p.pages, p.page_size, p.h, p.d, p.stride_page, p.stride_slot, p.stride_h};
  static const char* field[7] = {".pages", ".page_size", ".h", ".d", ".stride_page", ".stride_slot", ".stride_h"};
  for (int i = 0; i < 7; ++i)
    if (got[i] != want[i]) plan_mismatch(name + std::string(field[i]), num(got[i]), num(want[i]));
  if (g.dtype != p.dtype) plan_mismatch(name + std::string(" dtype"), to_string(g.dtype), to_string(p.dtype));
  if (g.memory != p.memory) plan_mismatch(name + std::string(" memory"), to_string(g.memory), to_string(p.memory));
}
void match(const DecodeArgs& g, const DecodeArgs& p) {
  match_tokens(g.q, p.q, "q");
  match_tokens(g.o, p.o, "o");
  match_cache(g.k, p.k, "k");
  match_cache(g.v, p.v, "v");
  const int64_t got[3] = {g.batch, g.max_pages, g.has_selection() ? g.sel_kmax : -1};
  const int64_t want[3] = {p.batch, p.max_pages, p.has_selection() ? p.sel_kmax : -1};
  static const char* field[3] = {"batch", "max_pages", "sel_kmax (-1: no selection)"};
  for (int i = 0; i < 3; ++i)
    if (got[i] != want[i]) plan_mismatch(field[i], num(got[i]), num(want[i]));
  if (g.index_memory != p.index_memory)
    plan_mismatch("index_memory", to_string(g.index_memory), to_string(p.index_memory));
  auto yn = [](bool b) { return std::string(b ? "true" : "false"); };
  if (g.causal_new != p.causal_new) plan_mismatch("causal_new", yn(g.causal_new), yn(p.causal_new));
  if ((g.lse != nullptr) != (p.lse != nullptr))
    plan_mismatch("lse", g.lse ? "given" : "null", p.lse ? "given" : "null");
  if (g.softmax_scale() != p.softmax_scale())
    plan_mismatch("the softmax scale", std::to_string(g.softmax_scale()), std::to_string(p.softmax_scale()));
}

void launch(const DecodePlan::Impl& im, const DecodeArgs& args, void* stream) {
  if (im.backend == Backend::cpu) {
    decode_cpu_run(args, im.threads);
    return;
  }
  int cur = -1;
  check_cuda(cudaGetDevice(&cur), "cudaGetDevice");
  if (cur != im.device)
    throw Error(Status::invalid_argument, "decode run: the current CUDA device is " + num(cur) +
                                              ", the plan was made on device " + num(im.device));
  const std::string why = decode_gpu::why_not(args);  // pointers may be less aligned than planned
  if (!why.empty()) throw Error(Status::unsupported, "decode run: " + why);
  decode_gpu::launch(args, im.splits, im.workspace, stream, im.flavor);
}
}  // namespace

Backend DecodePlan::backend() const {
  if (!impl_) empty_plan();
  return impl_->backend;
}
const std::string& DecodePlan::variant() const {
  if (!impl_) empty_plan();
  return impl_->variant_name;
}
int DecodePlan::kv_splits() const {
  if (!impl_) empty_plan();
  return impl_->splits;
}
size_t DecodePlan::workspace_bytes() const {
  if (!impl_) empty_plan();
  return impl_->workspace_bytes;
}

DecodePlan plan(const DecodeArgs& problem, const Options& options) { return plan(problem, options, 0); }

DecodePlan plan(const DecodeArgs& problem, const Options& options, int kv_splits) {
  validate(problem, false);
  const Backend be = resolve_backend(problem.q.memory, options);
  auto impl = std::make_shared<DecodePlan::Impl>();
  impl->problem = problem;
  impl->backend = be;
  impl->threads = options.threads;
  // The variants: "cpu" on the host; "cuda_mma" (mma.sync, the default: 2.4-4.5x faster than "cuda" on
  // an H200, docs/design/decode.md) and "cuda" (CUDA cores) on the GPU.
  const std::string& v = options.variant;
  if (be == Backend::cpu) {
    if (!v.empty() && v != "cpu")
      throw Error(Status::unsupported, "decode plan: variant '" + v + "' does not exist for the cpu backend (its only "
                                       "variant is 'cpu')");
    impl->variant_name = "cpu";
  } else {
    if (!v.empty() && v != "cuda" && v != "cuda_mma")
      throw Error(Status::unsupported, "decode plan: variant '" + v + "' does not exist for the cuda backend "
                                       "('cuda' or 'cuda_mma')");
    impl->variant_name = v.empty() ? "cuda_mma" : v;
    impl->flavor = impl->variant_name == "cuda_mma" ? decode_gpu::Flavor::mma : decode_gpu::Flavor::cuda_cores;
  }
  if (be == Backend::cuda) {
    check_cuda(cudaGetDevice(&impl->device), "cudaGetDevice");
    const std::string why = decode_gpu::why_not(problem);
    if (!why.empty()) throw Error(Status::unsupported, "decode plan: " + why);
    decode_gpu::prepare(problem, impl->flavor);
    impl->splits = kv_splits > 0 ? std::min(kv_splits, 64) : decode_gpu::default_splits(problem, device_info().sm_count);
    impl->workspace_bytes = decode_gpu::workspace_bytes(problem, impl->splits);
    if (impl->workspace_bytes) {
      const cudaError_t err = cudaMalloc(&impl->workspace, impl->workspace_bytes);
      if (err != cudaSuccess) {
        impl->workspace = nullptr;
        cudaGetLastError();
        throw Error(Status::cuda_error, "decode plan: cudaMalloc of the " + num(int64_t(impl->workspace_bytes)) +
                                            "-byte workspace failed: " + cudaGetErrorString(err));
      }
    }
  }
  DecodePlan p;
  p.impl_ = std::move(impl);
  return p;
}

void run(const DecodePlan& p, const DecodeArgs& args, void* stream) {
  if (!p.impl_) empty_plan();
  match(args, p.impl_->problem);
  validate(args, false);  // the cheap checks: null pointers, outputs overlapping inputs
  launch(*p.impl_, args, stream);
}

namespace {
// Page selection: one call each, no plan (nothing to allocate or to choose: one kernel per call).
void page_op(const PageSelectArgs& args, PageOp op, const Options& options) {
  const char* name = op == PageOp::select ? "select_pages" : "update_page_summaries";
  validate(args, op, options.check_indices, options.stream);
  if (resolve_backend(args.k.memory, options) == Backend::cpu) {
    if (!options.variant.empty() && options.variant != "cpu")
      throw Error(Status::unsupported, std::string(name) + ": variant '" + options.variant +
                                           "' does not exist for the cpu backend (its only variant is 'cpu')");
    op == PageOp::select ? select_pages_cpu(args, options.threads) : page_summaries_cpu(args, options.threads);
    return;
  }
  if (!options.variant.empty() && options.variant != "cuda")
    throw Error(Status::unsupported, std::string(name) + ": variant '" + options.variant +
                                         "' does not exist for the cuda backend (its only variant is 'cuda')");
  const std::string why = page_select_gpu::why_not(args, op);
  if (!why.empty()) throw Error(Status::unsupported, std::string(name) + ": " + why);
  op == PageOp::select ? page_select_gpu::select(args, options.stream) : page_select_gpu::update(args, options.stream);
}
}  // namespace

void update_page_summaries(const PageSelectArgs& args, const Options& options) {
  page_op(args, PageOp::update_summaries, options);
}
void select_pages(const PageSelectArgs& args, const Options& options) { page_op(args, PageOp::select, options); }

void decode_attention(const DecodeArgs& args, const Options& options) {
  validate(args, options.check_indices, options.stream);
  const DecodePlan p = plan(args, options);
  run(p, args, options.stream);
}

}  // namespace sparsek
