// The C API's plan entry points: an opaque handle around sparsek::Plan.
//
// Live handles are kept in a registry, and every entry point looks a handle up there before
// touching it: a destroyed, twice-destroyed or foreign handle is reported as an error instead of
// being dereferenced. (An address reused by a later plan_create is a live handle again: the check
// cannot tell that one from the old.) A run works on its own copy of the Plan (shared state), so a
// destroy on another thread while it runs frees nothing under it.
#include <mutex>
#include <shared_mutex>
#include <string>
#include <cstdio>
#include <memory>
#include <unordered_set>

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

class Registry {
 public:
  void add(sparsek_plan_s* h) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    live_.insert(h);
  }
  // Removes h; false when it was not live.
  bool remove(sparsek_plan_s* h) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    return live_.erase(h) == 1;
  }
  // A copy of h's plan (shares its state); throws when h is not live.
  Plan get(sparsek_plan_s* h) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (!live_.count(h)) not_live(h);
    return h->plan;
  }
  // h's plan variant name (storage owned by the plan), or nullptr when h is not live.
  const char* variant(sparsek_plan_s* h) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return live_.count(h) && h->plan ? h->plan.variant().c_str() : nullptr;
  }
  [[noreturn]] static void not_live(const void* h) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", h);
    throw Error(Status::invalid_argument, std::string("plan ") + buf +
                                              " is not a live plan (already destroyed, or not made by "
                                              "sparsek_plan_create)");
  }

 private:
  std::shared_mutex mu_;
  std::unordered_set<sparsek_plan_s*> live_;
};

Registry& registry() {
  static Registry* r = new Registry;  // leaked on purpose: handles may be destroyed during exit
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
    if (!registry().remove(p)) Registry::not_live(p);
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

}  // extern "C"
