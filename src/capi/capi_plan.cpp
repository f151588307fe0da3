// The C API's plan entry points: opaque handles around sparsek::Plan and sparsek::DistributedPlan.
//
// Live handles are kept in a registry, and every entry point looks a handle up there before
// touching it: a destroyed, twice-destroyed or foreign handle is reported as an error instead of
// being dereferenced. (An address reused by a later plan_create is a live handle again: the check
// cannot tell that one from the old.) A run works on its own copy of the Plan (shared state), so a
// destroy on another thread while it runs frees nothing under it.
#include <memory>
#include <string>

#include "capi/capi_internal.hpp"
#include "sparsek/distributed.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/sparsek.h"

struct sparsek_plan_s {
  sparsek::Plan plan;
};
struct sparsek_dist_plan_s {
  sparsek::DistributedPlan plan;
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

// Leaked on purpose: handles may be destroyed during exit.
Registry<sparsek_plan_s>& registry() {
  static auto* r = new Registry<sparsek_plan_s>("sparsek_plan_create");
  return *r;
}
Registry<sparsek_dist_plan_s>& dist_registry() {
  static auto* r = new Registry<sparsek_dist_plan_s>("sparsek_dist_plan_create");
  return *r;
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
    registry().add(h.get());
    *out = h.release();
  });
}

sparsek_status sparsek_plan_run(sparsek_plan p, const sparsek_gemm_args* args, void* stream) {
  return guarded("sparsek_plan_run", [&] {
    if (!p) null_arg("plan");
    if (!args) null_arg("args");
    const Plan plan = registry().get(p);
    run(plan, to_args(*args), stream);
  });
}

sparsek_status sparsek_plan_destroy(sparsek_plan p) {
  return guarded("sparsek_plan_destroy", [&] {
    if (!p) return;
    if (!registry().remove(p)) registry().not_live(p);
    delete p;
  });
}

const char* sparsek_plan_variant(sparsek_plan p) {
  const char* v = p ? registry().variant(p) : nullptr;
  return v ? v : "";
}

sparsek_status sparsek_plan_workspace_bytes(sparsek_plan p, uint64_t* bytes) {
  return guarded("sparsek_plan_workspace_bytes", [&] {
    if (!p) null_arg("plan");
    if (!bytes) null_arg("bytes");
    *bytes = workspace_bytes(registry().get(p));
  });
}

sparsek_status sparsek_dist_plan_create(sparsek_dist_plan* out, const sparsek_gemm_args* problem, struct ncclComm* comm,
                                        const sparsek_dist_options* options, const char* variant) {
  if (out) *out = nullptr;
  return guarded("sparsek_dist_plan_create", [&] {
    if (!out) null_arg("plan");
    if (!problem) null_arg("problem");
    DistributedOptions o;
    if (options) {
      o.broadcast_root = options->broadcast_root;
      o.all_gather = options->all_gather != 0;
    }
    if (variant) o.local.variant = variant;
    auto h = std::make_unique<sparsek_dist_plan_s>();
    h->plan = plan_distributed(to_args(*problem), comm, o);
    dist_registry().add(h.get());
    *out = h.release();
  });
}

sparsek_status sparsek_dist_plan_run(sparsek_dist_plan p, const sparsek_gemm_args* args, void* stream) {
  return guarded("sparsek_dist_plan_run", [&] {
    if (!p) null_arg("plan");
    if (!args) null_arg("args");
    const DistributedPlan plan = dist_registry().get(p);
    run(plan, to_args(*args), stream);
  });
}

sparsek_status sparsek_dist_plan_destroy(sparsek_dist_plan p) {
  return guarded("sparsek_dist_plan_destroy", [&] {
    if (!p) return;
    if (!dist_registry().remove(p)) dist_registry().not_live(p);
    delete p;
  });
}

sparsek_status sparsek_dist_plan_rows(sparsek_dist_plan p, int64_t* row_begin, int64_t* row_end) {
  return guarded("sparsek_dist_plan_rows", [&] {
    if (!p) null_arg("plan");
    if (!row_begin) null_arg("row_begin");
    if (!row_end) null_arg("row_end");
    const DistributedPlan plan = dist_registry().get(p);
    *row_begin = plan.row_begin();
    *row_end = plan.row_end();
  });
}

sparsek_status sparsek_nccl_version(int* version) {
  return guarded("sparsek_nccl_version", [&] {
    if (!version) null_arg("version");
    *version = nccl_version();
  });
}

}  // extern "C"
