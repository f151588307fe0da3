// Internal: what the C API's files share (capi.cpp: products and queries; capi_plan.cpp: plans;
// capi_attention.cpp, capi_gate.cpp): the thread-local last-error text, the exception-to-status
// guard and the view conversions.
#pragma once
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_set>

#include "sparsek/attention.hpp"
#include "sparsek/bsr.hpp"
#include "sparsek/sparsek.h"

namespace sparsek::capi {

extern thread_local std::string g_last_error;  // defined in capi.cpp

inline sparsek_status fail(Status s, const std::string& text) {
  g_last_error = text;
  return static_cast<sparsek_status>(static_cast<int>(s));
}

// Runs f(); maps sparsek::Error to its status, bad_alloc and anything else to internal.
template <class F>
sparsek_status guarded(const char* fn, const F& f) {
  try {
    f();
    g_last_error.clear();
    return SPARSEK_OK;
  } catch (const Error& e) {
    return fail(e.status(), std::string(fn) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return fail(Status::internal, std::string(fn) + ": out of host memory");
  } catch (const std::exception& e) {
    return fail(Status::internal, std::string(fn) + ": internal error: " + e.what());
  } catch (...) {
    return fail(Status::internal, std::string(fn) + ": internal error (unknown exception)");
  }
}

// The function name is added by guarded().
[[noreturn]] inline void null_arg(const char* name) {
  throw Error(Status::invalid_argument, std::string("argument '") + name + "' is NULL");
}

// A C caller may pass any int in an enum parameter, but in C++ loading an enum object whose value
// lies outside its enumerators' range is undefined: read the bytes as the underlying integer and
// let validation reject out-of-range values with their value.
template <class E>
int enum_value(const E& e) {
  std::underlying_type_t<E> v;
  static_assert(sizeof(v) == sizeof(E), "enum size");
  std::memcpy(&v, &e, sizeof(v));
  return static_cast<int>(v);
}

inline BsrView to_view(const sparsek_bsr& b) {
  BsrView v;
  v.rows = b.rows;
  v.cols = b.cols;
  v.bm = b.bm;
  v.bk = b.bk;
  v.nnzb = b.nnzb;
  v.row_ptr = b.row_ptr;
  v.col_idx = b.col_idx;
  v.values = b.values;
  v.dtype = static_cast<DType>(enum_value(b.dtype));
  v.memory = static_cast<Memory>(enum_value(b.memory));
  v.scales = b.scales;
  return v;
}

inline DenseView to_view(const sparsek_dense& d) {
  DenseView v;
  v.data = d.data;
  v.rows = d.rows;
  v.cols = d.cols;
  v.ld = d.ld;
  v.layout = static_cast<Layout>(enum_value(d.layout));
  v.dtype = static_cast<DType>(enum_value(d.dtype));
  v.memory = static_cast<Memory>(enum_value(d.memory));
  v.scales = d.scales;
  v.scale_group = d.scale_group;
  return v;
}

inline Tensor4View to_view(const sparsek_tensor4& t) {
  Tensor4View v;
  v.data = t.data;
  v.dtype = static_cast<DType>(enum_value(t.dtype));
  v.memory = static_cast<Memory>(enum_value(t.memory));
  v.b = t.b, v.h = t.h, v.s = t.s, v.d = t.d;
  v.stride_b = t.stride_b, v.stride_h = t.stride_h, v.stride_s = t.stride_s;
  return v;
}

inline AttentionLayout to_layout(const sparsek_attention_layout& l) {
  AttentionLayout v;
  v.kv_num_blocks = l.kv_num_blocks;
  v.kv_indices = l.kv_indices;
  v.full_kv_num_blocks = l.full_kv_num_blocks;
  v.full_kv_indices = l.full_kv_indices;
  v.batch = l.batch, v.heads = l.heads, v.q_blocks = l.q_blocks, v.kmax = l.kmax, v.full_kmax = l.full_kmax;
  v.block_q = l.block_q, v.block_kv = l.block_kv;
  v.memory = static_cast<Memory>(enum_value(l.memory));
  return v;
}

// Live plan handles of one kind (H: a struct with a `plan` member: sparsek_plan_s,
// sparsek_dist_plan_s, sparsek_attention_plan_s); `creator` names the function that makes them,
// for the message about a handle that is not live. Every entry point looks a handle up here before
// touching it: a destroyed, twice-destroyed or foreign handle is an error, never dereferenced.
template <class H>
class Registry {
 public:
  explicit Registry(const char* creator) : creator_(creator) {}
  void add(H* h) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    live_.insert(h);
  }
  // Removes h; false when it was not live.
  bool remove(H* h) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    return live_.erase(h) == 1;
  }
  // A copy of h's plan (shares its state); throws when h is not live.
  decltype(H::plan) get(H* h) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (!live_.count(h)) not_live(h);
    return h->plan;
  }
  // h's plan variant name (storage owned by the plan), or nullptr when h is not live.
  const char* variant(H* h) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return live_.count(h) && h->plan ? h->plan.variant().c_str() : nullptr;
  }
  [[noreturn]] void not_live(const void* h) const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", h);
    throw Error(Status::invalid_argument, std::string("plan ") + buf + " is not a live plan (already destroyed, or not made by " +
                                              creator_ + ")");
  }

 private:
  const char* creator_;
  std::shared_mutex mu_;
  std::unordered_set<H*> live_;
};

}  // namespace sparsek::capi
