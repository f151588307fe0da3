// The C API: thin extern "C" wrappers over the C++ API. Every exception becomes a status and the
// thread-local last-error text; nothing escapes across the C boundary.
#include "sparsek/sparsek.h"

#include <cstring>
#include <new>
#include <string>
#include <type_traits>

#include "core/device.hpp"
#include "sparsek/gemm.hpp"

namespace {

using namespace sparsek;

thread_local std::string g_last_error;

sparsek_status fail(Status s, const std::string& text) {
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
[[noreturn]] void null_arg(const char* name) {
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

BsrView to_view(const sparsek_bsr& b) {
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
  return v;
}

DenseView to_view(const sparsek_dense& d) {
  DenseView v;
  v.data = d.data;
  v.rows = d.rows;
  v.cols = d.cols;
  v.ld = d.ld;
  v.layout = static_cast<Layout>(enum_value(d.layout));
  v.dtype = static_cast<DType>(enum_value(d.dtype));
  v.memory = static_cast<Memory>(enum_value(d.memory));
  return v;
}

Options options_for(void* stream) {
  Options o;
  o.stream = stream;
  return o;
}

}  // namespace

extern "C" {

const char* sparsek_last_error(void) { return g_last_error.c_str(); }

const char* sparsek_status_string(sparsek_status s) {
  const int v = enum_value(s);
  if (v < 0 || v > static_cast<int>(Status::internal)) return "unknown status";
  return to_string(static_cast<Status>(v));
}

const char* sparsek_version(void) { return sparsek::version(); }

int sparsek_has_cuda(void) {
  try {
    return device_info().available ? 1 : 0;
  } catch (...) {
    return 0;  // a failing CUDA query means no usable GPU
  }
}

sparsek_status sparsek_dsd(sparsek_op op_a, float alpha, const sparsek_bsr* a, const sparsek_dense* b, float beta,
                           sparsek_dense* c, void* stream) {
  return guarded("sparsek_dsd", [&] {
    if (!a) null_arg("a");
    if (!b) null_arg("b");
    if (!c) null_arg("c");
    GemmArgs g;
    g.kind = OpKind::dsd;
    g.op = static_cast<Op>(enum_value(op_a));
    g.alpha = alpha;
    g.beta = beta;
    g.sparse = to_view(*a);
    g.b = to_view(*b);
    g.c = to_view(*c);
    gemm(g, options_for(stream));
  });
}

sparsek_status sparsek_dds(sparsek_op op_b, float alpha, const sparsek_dense* a, const sparsek_bsr* b, float beta,
                           sparsek_dense* c, void* stream) {
  return guarded("sparsek_dds", [&] {
    if (!a) null_arg("a");
    if (!b) null_arg("b");
    if (!c) null_arg("c");
    GemmArgs g;
    g.kind = OpKind::dds;
    g.op = static_cast<Op>(enum_value(op_b));
    g.alpha = alpha;
    g.beta = beta;
    g.sparse = to_view(*b);
    g.a = to_view(*a);
    g.c = to_view(*c);
    gemm(g, options_for(stream));
  });
}

sparsek_status sparsek_sdd(float alpha, const sparsek_dense* a, const sparsek_dense* b, float beta, sparsek_bsr* c,
                           void* stream) {
  return guarded("sparsek_sdd", [&] {
    if (!a) null_arg("a");
    if (!b) null_arg("b");
    if (!c) null_arg("c");
    GemmArgs g;
    g.kind = OpKind::sdd;
    g.alpha = alpha;
    g.beta = beta;
    g.sparse = to_view(*c);
    g.a = to_view(*a);
    g.b = to_view(*b);
    gemm(g, options_for(stream));
  });
}

sparsek_status sparsek_bsr_validate(const sparsek_bsr* a) {
  return guarded("sparsek_bsr_validate", [&] {
    if (!a) null_arg("a");
    validate(to_view(*a), true);
  });
}

}  // extern "C"
