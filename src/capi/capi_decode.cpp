// The C API's decode attention: the one-shot call and an opaque handle around
// sparsek::DecodePlan, checked against the live handles as the other plans are; and page
// selection (update_page_summaries, select_pages), one call each.
#include <memory>
#include <string>

#include "capi/capi_internal.hpp"
#include "sparsek/decode.hpp"
#include "sparsek/sparsek.h"

struct sparsek_decode_plan_s {
  sparsek::DecodePlan plan;
};

namespace {

using namespace sparsek;
using namespace sparsek::capi;

Registry<sparsek_decode_plan_s>& registry() {
  static auto* r = new Registry<sparsek_decode_plan_s>("sparsek_decode_plan_create");  // leaked on purpose
  return *r;
}

TokensView to_tokens(const sparsek_tokens& t) {
  TokensView v;
  v.data = t.data;
  v.dtype = static_cast<DType>(enum_value(t.dtype));
  v.memory = static_cast<Memory>(enum_value(t.memory));
  v.t = t.t, v.h = t.h, v.d = t.d;
  v.stride_t = t.stride_t, v.stride_h = t.stride_h;
  return v;
}
PagedCacheView to_cache(const sparsek_paged_cache& c) {
  PagedCacheView v;
  v.data = c.data;
  v.dtype = static_cast<DType>(enum_value(c.dtype));
  v.memory = static_cast<Memory>(enum_value(c.memory));
  v.pages = c.pages, v.page_size = c.page_size, v.h = c.h, v.d = c.d;
  v.stride_page = c.stride_page, v.stride_slot = c.stride_slot, v.stride_h = c.stride_h;
  return v;
}
DecodeArgs to_args(const sparsek_decode_args& c) {
  if (c.causal_new != 0 && c.causal_new != 1)
    throw Error(Status::invalid_argument, "causal_new = " + std::to_string(c.causal_new) + " is not 0 or 1");
  DecodeArgs a;
  a.q = to_tokens(c.q), a.o = to_tokens(c.o);
  a.k = to_cache(c.k), a.v = to_cache(c.v);
  a.lse = c.lse;
  a.page_table = c.page_table, a.seq_lens = c.seq_lens, a.cu_seqlens_q = c.cu_seqlens_q;
  a.sel_indices = c.sel_indices, a.sel_counts = c.sel_counts;
  a.batch = c.batch, a.max_pages = c.max_pages, a.sel_kmax = c.sel_kmax;
  a.index_memory = static_cast<Memory>(enum_value(c.index_memory));
  a.causal_new = c.causal_new == 1;
  a.scale = c.scale;
  return a;
}

PageSelectArgs to_args(const sparsek_page_select_args& c) {
  if (c.all_pages != 0 && c.all_pages != 1)
    throw Error(Status::invalid_argument, "all_pages = " + std::to_string(c.all_pages) + " is not 0 or 1");
  if (c.skip_index_check != 0 && c.skip_index_check != 1)
    throw Error(Status::invalid_argument, "skip_index_check = " + std::to_string(c.skip_index_check) + " is not 0 or 1");
  PageSelectArgs a;
  a.q = to_tokens(c.q);
  a.k = to_cache(c.k);
  a.summaries = c.summaries;
  a.page_table = c.page_table, a.seq_lens = c.seq_lens, a.cu_seqlens_q = c.cu_seqlens_q;
  a.batch = c.batch, a.max_pages = c.max_pages;
  a.index_memory = static_cast<Memory>(enum_value(c.index_memory));
  a.sel_indices = c.sel_indices, a.sel_counts = c.sel_counts, a.sel_kmax = c.sel_kmax;
  a.topk = c.topk, a.sink = c.sink, a.local = c.local;
  a.all_pages = c.all_pages == 1;
  return a;
}

Options page_options(const sparsek_page_select_args& c, void* stream) {
  Options o;
  o.stream = stream;
  o.check_indices = c.skip_index_check == 0;
  return o;
}

}  // namespace

extern "C" {

sparsek_status sparsek_decode_attention(const sparsek_decode_args* args, void* stream) {
  return guarded("sparsek_decode_attention", [&] {
    if (!args) null_arg("args");
    Options o;
    o.stream = stream;
    decode_attention(to_args(*args), o);
  });
}

sparsek_status sparsek_decode_plan_create(sparsek_decode_plan* out, const sparsek_decode_args* problem,
                                          int32_t kv_splits) {
  if (out) *out = nullptr;
  return guarded("sparsek_decode_plan_create", [&] {
    if (!out) null_arg("plan");
    if (!problem) null_arg("problem");
    if (kv_splits < 0 || kv_splits > 64)
      throw Error(Status::invalid_argument, "kv_splits = " + std::to_string(kv_splits) + " is out of range [0, 64]");
    auto h = std::make_unique<sparsek_decode_plan_s>();
    h->plan = plan(to_args(*problem), Options{}, kv_splits);
    registry().add(h.get());
    *out = h.release();
  });
}

sparsek_status sparsek_decode_plan_run(sparsek_decode_plan p, const sparsek_decode_args* args, void* stream) {
  return guarded("sparsek_decode_plan_run", [&] {
    if (!p) null_arg("plan");
    if (!args) null_arg("args");
    const DecodePlan plan = registry().get(p);
    run(plan, to_args(*args), stream);
  });
}

sparsek_status sparsek_decode_plan_destroy(sparsek_decode_plan p) {
  return guarded("sparsek_decode_plan_destroy", [&] {
    if (!p) return;
    if (!registry().remove(p)) registry().not_live(p);
    delete p;
  });
}

sparsek_status sparsek_decode_plan_info(sparsek_decode_plan p, int32_t* kv_splits, uint64_t* workspace_bytes) {
  return guarded("sparsek_decode_plan_info", [&] {
    if (!p) null_arg("plan");
    const DecodePlan plan = registry().get(p);
    if (kv_splits) *kv_splits = plan.kv_splits();
    if (workspace_bytes) *workspace_bytes = uint64_t(plan.workspace_bytes());
  });
}

sparsek_status sparsek_update_page_summaries(const sparsek_page_select_args* args, void* stream) {
  return guarded("sparsek_update_page_summaries", [&] {
    if (!args) null_arg("args");
    update_page_summaries(to_args(*args), page_options(*args, stream));
  });
}

sparsek_status sparsek_select_pages(const sparsek_page_select_args* args, void* stream) {
  return guarded("sparsek_select_pages", [&] {
    if (!args) null_arg("args");
    select_pages(to_args(*args), page_options(*args, stream));
  });
}

}  // extern "C"
