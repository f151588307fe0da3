// The C API's plan entry points: an opaque handle around sparsek::Plan.
#include <memory>
#include <string>

#include "capi/capi_internal.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/sparsek.h"

struct sparsek_plan_s {
  sparsek::Plan plan;
};

namespace {

using namespace sparsek;
using namespace sparsek::capi;

// Only the slots the kind uses are read; an out-of-range kind or op is rejected by validation
// with its value.
GemmArgs to_args(const sparsek_gemm_args& c) {
  GemmArgs g;
  g.kind = static_cast<OpKind>(enum_value(c.kind));
  g.op = static_cast<Op>(enum_value(c.op));
  g.alpha = c.alpha;
  g.beta = c.beta;
  g.sparse = to_view(c.sparse);
  if (g.kind != OpKind::dsd) g.a = to_view(c.a);
  if (g.kind != OpKind::dds) g.b = to_view(c.b);
  if (g.kind != OpKind::sdd) g.c = to_view(c.c);
  return g;
}

}  // namespace

extern "C" {

sparsek_status sparsek_plan_create(sparsek_plan* out, const sparsek_gemm_args* problem, const char* variant) {
  if (out) *out = nullptr;
  return guarded("sparsek_plan_create", [&] {
    if (!out) null_arg("plan");
    if (!problem) null_arg("problem");
    Options o;
    if (variant) o.variant = variant;
    auto h = std::make_unique<sparsek_plan_s>();
    h->plan = plan(to_args(*problem), o);
    *out = h.release();
  });
}

sparsek_status sparsek_plan_run(sparsek_plan p, const sparsek_gemm_args* args, void* stream) {
  return guarded("sparsek_plan_run", [&] {
    if (!p) null_arg("plan");
    if (!args) null_arg("args");
    run(p->plan, to_args(*args), stream);
  });
}

sparsek_status sparsek_plan_destroy(sparsek_plan p) {
  return guarded("sparsek_plan_destroy", [&] { delete p; });
}

const char* sparsek_plan_variant(sparsek_plan p) {
  if (!p || !p->plan) return "";
  return p->plan.variant().c_str();
}

sparsek_status sparsek_plan_workspace_bytes(sparsek_plan p, uint64_t* bytes) {
  return guarded("sparsek_plan_workspace_bytes", [&] {
    if (!p) null_arg("plan");
    if (!bytes) null_arg("bytes");
    *bytes = workspace_bytes(p->plan);
  });
}

}  // extern "C"
