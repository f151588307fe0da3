// The C API: thin extern "C" wrappers over the C++ API. Every exception becomes a status and the
// thread-local last-error text; nothing escapes across the C boundary.
#include "sparsek/sparsek.h"

#include <new>
#include <string>

#include "capi/capi_internal.hpp"
#include "core/device.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek::capi {
thread_local std::string g_last_error;
}  // namespace sparsek::capi

namespace {

using namespace sparsek;
using namespace sparsek::capi;

// The C products name their operands a, b, c; the sparse one goes to GemmArgs::sparse, each dense
// one to the slot of its own letter (the slot convention of gemm.hpp).
void put(GemmArgs& g, DenseView GemmArgs::*slot, const sparsek_dense& d) { g.*slot = to_view(d); }
void put(GemmArgs& g, DenseView GemmArgs::*, const sparsek_bsr& s) { g.sparse = to_view(s); }

template <class A, class B, class C>
sparsek_status product(const char* fn, OpKind kind, int op, float alpha, float beta, const A* a, const B* b,
                       const C* c, void* stream) {
  return guarded(fn, [&] {
    if (!a) null_arg("a");
    if (!b) null_arg("b");
    if (!c) null_arg("c");
    GemmArgs g;
    g.kind = kind;
    g.op = static_cast<Op>(op);
    g.alpha = alpha;
    g.beta = beta;
    put(g, &GemmArgs::a, *a);
    put(g, &GemmArgs::b, *b);
    put(g, &GemmArgs::c, *c);
    Options o;
    o.stream = stream;
    gemm(g, o);
  });
}

}  // namespace

extern "C" {

const char* sparsek_last_error(void) { return g_last_error.c_str(); }

const char* sparsek_status_string(sparsek_status s) {
  const int v = enum_value(s);
  if (v < 0 || v > static_cast<int>(Status::nccl_error)) return "unknown status";
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
  return product("sparsek_dsd", OpKind::dsd, enum_value(op_a), alpha, beta, a, b, c, stream);
}

sparsek_status sparsek_dds(sparsek_op op_b, float alpha, const sparsek_dense* a, const sparsek_bsr* b, float beta,
                           sparsek_dense* c, void* stream) {
  return product("sparsek_dds", OpKind::dds, enum_value(op_b), alpha, beta, a, b, c, stream);
}

sparsek_status sparsek_sdd(float alpha, const sparsek_dense* a, const sparsek_dense* b, float beta, sparsek_bsr* c,
                           void* stream) {
  return product("sparsek_sdd", OpKind::sdd, 0, alpha, beta, a, b, c, stream);
}

sparsek_status sparsek_bsr_validate(const sparsek_bsr* a) {
  return guarded("sparsek_bsr_validate", [&] {
    if (!a) null_arg("a");
    validate(to_view(*a), true);
  });
}

}  // extern "C"
