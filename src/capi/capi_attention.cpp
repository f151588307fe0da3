// The C API's attention entry points: the one-shot calls (forward, backward) and an opaque handle
// around sparsek::AttentionPlan, checked against the live handles as the product plans are (a run
// works on its own copy of the plan, so a destroy on another thread frees nothing under it).
#include <memory>
#include <string>

#include "capi/capi_internal.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/distributed.hpp"
#include "sparsek/sparsek.h"

struct sparsek_attention_plan_s {
  sparsek::AttentionPlan plan;
};
struct sparsek_attention_backward_plan_s {
  sparsek::AttentionBackwardPlan plan;
};
struct sparsek_attention_cp_plan_s {
  sparsek::DistributedAttentionPlan plan;
};

namespace {

using namespace sparsek;
using namespace sparsek::capi;

// Leaked on purpose: handles may be destroyed during exit.
Registry<sparsek_attention_plan_s>& registry() {
  static auto* r = new Registry<sparsek_attention_plan_s>("sparsek_attention_plan_create");
  return *r;
}
Registry<sparsek_attention_cp_plan_s>& cp_registry() {
  static auto* r = new Registry<sparsek_attention_cp_plan_s>("sparsek_attention_cp_plan_create");
  return *r;
}
Registry<sparsek_attention_backward_plan_s>& backward_registry() {
  static auto* r = new Registry<sparsek_attention_backward_plan_s>("sparsek_attention_backward_plan_create");
  return *r;
}

// Out-of-range enum values are rejected by validation with their value.
AttentionArgs to_args(const sparsek_attention_args& c) {
  if (c.causal != 0 && c.causal != 1)
    throw Error(Status::invalid_argument, "causal = " + std::to_string(c.causal) + " is not 0 or 1");
  AttentionArgs a;
  a.q = to_view(c.q);
  a.k = to_view(c.k);
  a.v = to_view(c.v);
  a.o = to_view(c.o);
  a.lse = c.lse;
  a.layout = to_layout(c.layout);
  a.causal = c.causal == 1;
  a.scale = c.scale;
  a.cu_seqlens = c.cu_seqlens;  // checked (with num_seqs) by validation, or refused where unsupported
  a.num_seqs = c.num_seqs;
  return a;
}

AttentionBackwardArgs to_backward_args(const sparsek_attention_backward_args& c) {
  if (c.nondeterministic != 0 && c.nondeterministic != 1)
    throw Error(Status::invalid_argument, "nondeterministic = " + std::to_string(c.nondeterministic) + " is not 0 or 1");
  AttentionBackwardArgs a;
  a.forward = to_args(c.forward);
  a.dout = to_view(c.dout);
  a.dq = to_view(c.dq);
  a.dk = to_view(c.dk);
  a.dv = to_view(c.dv);
  a.deterministic = c.nondeterministic == 0;
  return a;
}

}  // namespace

extern "C" {

sparsek_status sparsek_attention_backward(const sparsek_attention_backward_args* args, void* stream) {
  return guarded("sparsek_attention_backward", [&] {
    if (!args) null_arg("args");
    Options o;
    o.stream = stream;
    attention_backward(to_backward_args(*args), o);
  });
}

sparsek_status sparsek_attention(const sparsek_attention_args* args, void* stream) {
  return guarded("sparsek_attention", [&] {
    if (!args) null_arg("args");
    Options o;
    o.stream = stream;
    attention(to_args(*args), o);
  });
}

sparsek_status sparsek_attention_plan_create(sparsek_attention_plan* out, const sparsek_attention_args* problem,
                                             const char* variant) {
  if (out) *out = nullptr;
  return guarded("sparsek_attention_plan_create", [&] {
    if (!out) null_arg("plan");
    if (!problem) null_arg("problem");
    Options o;
    if (variant) o.variant = variant;
    auto h = std::make_unique<sparsek_attention_plan_s>();
    h->plan = plan(to_args(*problem), o);
    registry().add(h.get());
    *out = h.release();
  });
}

sparsek_status sparsek_attention_plan_run(sparsek_attention_plan p, const sparsek_attention_args* args, void* stream) {
  return guarded("sparsek_attention_plan_run", [&] {
    if (!p) null_arg("plan");
    if (!args) null_arg("args");
    const AttentionPlan plan = registry().get(p);
    run(plan, to_args(*args), stream);
  });
}

sparsek_status sparsek_attention_plan_destroy(sparsek_attention_plan p) {
  return guarded("sparsek_attention_plan_destroy", [&] {
    if (!p) return;
    if (!registry().remove(p)) registry().not_live(p);
    delete p;
  });
}

const char* sparsek_attention_plan_variant(sparsek_attention_plan p) {
  const char* v = p ? registry().variant(p) : nullptr;
  return v ? v : "";
}

sparsek_status sparsek_attention_plan_workspace_bytes(sparsek_attention_plan p, uint64_t* bytes) {
  return guarded("sparsek_attention_plan_workspace_bytes", [&] {
    if (!p) null_arg("plan");
    if (!bytes) null_arg("bytes");
    *bytes = registry().get(p).workspace_bytes();
  });
}

sparsek_status sparsek_attention_backward_plan_create(sparsek_attention_backward_plan* out,
                                                      const sparsek_attention_backward_args* problem,
                                                      const char* variant) {
  if (out) *out = nullptr;
  return guarded("sparsek_attention_backward_plan_create", [&] {
    if (!out) null_arg("plan");
    if (!problem) null_arg("problem");
    Options o;
    if (variant) o.variant = variant;
    auto h = std::make_unique<sparsek_attention_backward_plan_s>();
    h->plan = plan(to_backward_args(*problem), o);
    backward_registry().add(h.get());
    *out = h.release();
  });
}

sparsek_status sparsek_attention_backward_plan_run(sparsek_attention_backward_plan p,
                                                   const sparsek_attention_backward_args* args, void* stream) {
  return guarded("sparsek_attention_backward_plan_run", [&] {
    if (!p) null_arg("plan");
    if (!args) null_arg("args");
    const AttentionBackwardPlan plan = backward_registry().get(p);
    run(plan, to_backward_args(*args), stream);
  });
}

sparsek_status sparsek_attention_backward_plan_destroy(sparsek_attention_backward_plan p) {
  return guarded("sparsek_attention_backward_plan_destroy", [&] {
    if (!p) return;
    if (!backward_registry().remove(p)) backward_registry().not_live(p);
    delete p;
  });
}

const char* sparsek_attention_backward_plan_variant(sparsek_attention_backward_plan p) {
  const char* v = p ? backward_registry().variant(p) : nullptr;
  return v ? v : "";
}

sparsek_status sparsek_attention_backward_plan_workspace_bytes(sparsek_attention_backward_plan p, uint64_t* bytes) {
  return guarded("sparsek_attention_backward_plan_workspace_bytes", [&] {
    if (!p) null_arg("plan");
    if (!bytes) null_arg("bytes");
    *bytes = backward_registry().get(p).workspace_bytes();
  });
}

sparsek_status sparsek_attention_cp_plan_create(sparsek_attention_cp_plan* out, const sparsek_attention_args* problem,
                                                struct ncclComm* comm) {
  if (out) *out = nullptr;
  return guarded("sparsek_attention_cp_plan_create", [&] {
    if (!out) null_arg("plan");
    if (!problem) null_arg("problem");
    auto h = std::make_unique<sparsek_attention_cp_plan_s>();
    h->plan = plan_distributed_attention(to_args(*problem), comm);
    cp_registry().add(h.get());
    *out = h.release();
  });
}

sparsek_status sparsek_attention_cp_plan_rows(sparsek_attention_cp_plan p, int64_t* q_begin, int64_t* q_end,
                                              int64_t* kv_begin, int64_t* kv_end) {
  return guarded("sparsek_attention_cp_plan_rows", [&] {
    if (!p) null_arg("plan");
    const DistributedAttentionPlan plan = cp_registry().get(p);
    if (q_begin) *q_begin = plan.q_row_begin();
    if (q_end) *q_end = plan.q_row_end();
    if (kv_begin) *kv_begin = plan.kv_row_begin();
    if (kv_end) *kv_end = plan.kv_row_end();
  });
}

sparsek_status sparsek_attention_cp_plan_run(sparsek_attention_cp_plan p, const sparsek_attention_args* shard,
                                             void* stream) {
  return guarded("sparsek_attention_cp_plan_run", [&] {
    if (!p) null_arg("plan");
    if (!shard) null_arg("shard");
    run(cp_registry().get(p), to_args(*shard), stream);
  });
}

sparsek_status sparsek_attention_cp_plan_run_backward(sparsek_attention_cp_plan p,
                                                      const sparsek_attention_backward_args* shard, void* stream) {
  return guarded("sparsek_attention_cp_plan_run_backward", [&] {
    if (!p) null_arg("plan");
    if (!shard) null_arg("shard");
    run_backward(cp_registry().get(p), to_backward_args(*shard), stream);
  });
}

sparsek_status sparsek_attention_cp_plan_destroy(sparsek_attention_cp_plan p) {
  return guarded("sparsek_attention_cp_plan_destroy", [&] {
    if (!p) return;
    if (!cp_registry().remove(p)) cp_registry().not_live(p);
    delete p;
  });
}

}  // extern "C"
