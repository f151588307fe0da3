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
