// The C API's e4m3 quantization: wrappers over sparsek/quantize.hpp.
#include "sparsek/sparsek.h"

#include "capi/capi_internal.hpp"
#include "sparsek/quantize.hpp"

namespace {

using namespace sparsek;
using namespace sparsek::capi;

ScaleDim scale_dim(int v) {
  if (v != 0 && v != 1)
    throw Error(Status::invalid_argument,
                "dim " + std::to_string(v) + " is not SPARSEK_SCALE_ROWS (0) or SPARSEK_SCALE_COLS (1)");
  return static_cast<ScaleDim>(v);
}

DType out_dtype(int v) {
  if (v < 0 || v > 2)
    throw Error(Status::invalid_argument,
                "dtype " + std::to_string(v) + " is not SPARSEK_F32 (0), SPARSEK_F16 (1) or SPARSEK_BF16 (2)");
  return static_cast<DType>(v);
}

}  // namespace

extern "C" {

sparsek_status sparsek_scale_count(int64_t tokens, int64_t k, int32_t scale_group, int64_t* count) {
  return guarded("sparsek_scale_count", [&] {
    if (!count) null_arg("count");
    *count = scale_count(tokens, k, scale_group);
  });
}

sparsek_status sparsek_quantize_bsr_e4m3(const sparsek_bsr* in, void* values, float* scales, void* stream) {
  return guarded("sparsek_quantize_bsr_e4m3", [&] {
    if (!in) null_arg("in");
    quantize_e4m3(to_view(*in), values, scales, stream);
  });
}

sparsek_status sparsek_dequantize_bsr(const sparsek_bsr* in, void* values, sparsek_dtype dtype, void* stream) {
  return guarded("sparsek_dequantize_bsr", [&] {
    if (!in) null_arg("in");
    dequantize(to_view(*in), values, out_dtype(enum_value(dtype)), stream);
  });
}

sparsek_status sparsek_quantize_dense_e4m3(const sparsek_dense* in, sparsek_dense* out, float* scales,
                                           sparsek_scale_dim dim, int32_t scale_group, void* stream) {
  return guarded("sparsek_quantize_dense_e4m3", [&] {
    if (!in) null_arg("in");
    if (!out) null_arg("out");
    DenseView o = to_view(*out);
    quantize_e4m3(to_view(*in), o, scales, scale_dim(enum_value(dim)), scale_group, stream);
    out->scales = o.scales;
    out->scale_group = o.scale_group;
  });
}

sparsek_status sparsek_dequantize_dense(const sparsek_dense* in, const sparsek_dense* out, sparsek_scale_dim dim,
                                        void* stream) {
  return guarded("sparsek_dequantize_dense", [&] {
    if (!in) null_arg("in");
    if (!out) null_arg("out");
    dequantize(to_view(*in), to_view(*out), scale_dim(enum_value(dim)), stream);
  });
}

}  // extern "C"
