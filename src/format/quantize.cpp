// e4m3 quantization (sparsek/quantize.hpp): argument checks, the mapping of BSR values and dense
// operands onto tokens x K groups (kernels/quant/quant.hpp's GroupMap), and the host computation.
// Device arrays go to the kernels in src/kernels/quant/, which apply the same rule
// (kernels/quant/rule.hpp) and so give the same bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/cuda_host.hpp"

#include "core/device.hpp"
#include "core/no_gpu.hpp"
#include "cpu/parallel.hpp"
#include "format/format_internal.hpp"
#include "kernels/quant/quant.hpp"
#include "kernels/quant/rule.hpp"
#include "sparsek/quantize.hpp"

namespace sparsek {

using quant::GroupMap;

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }
std::string s(int64_t v) { return std::to_string(v); }
std::string num(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  return buf;
}

// ---- the host computation ----

// Groups per parallel work item: enough work per item that handing it out costs nothing.
int64_t items_per_task(const GroupMap& m) { return std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, m.group)); }

// The first element that is NaN or infinite, as (token, k); false when all are finite.
bool first_non_finite(const void* src, DType dtype, const GroupMap& m, int64_t* bad_t, int64_t* bad_k) {
  for (int64_t t = 0; t < m.tokens; ++t)
    for (int64_t k = 0; k < m.k; ++k)
      if (!std::isfinite(load_as_float(src, dtype, t * m.t_stride + k * m.k_stride))) {
        *bad_t = t;
        *bad_k = k;
        return true;
      }
  return false;
}

void quantize_host(const void* src, DType dtype, const GroupMap& m, uint8_t* codes, float* scales) {
  const int64_t groups = m.groups(), items = m.tokens * groups, per = items_per_task(m);
  const int threads = cpu_threads(0);
  parallel_for((items + per - 1) / per, threads, [&](int64_t task, int) {
    for (int64_t item = task * per; item < std::min(items, (task + 1) * per); ++item) {
      const int64_t t = item / groups, g = item % groups;
      const int64_t k0 = g * m.group, k1 = std::min(m.k, k0 + m.group);
      uint32_t amax = 0;
      for (int64_t k = k0; k < k1; ++k)
        amax = std::max(amax, quant::abs_bits(load_as_float(src, dtype, t * m.t_stride + k * m.k_stride)));
      const float scale = quant::scale_of(amax);
      scales[item] = scale;
      for (int64_t k = k0; k < k1; ++k)
        codes[t * m.out_t_stride + k * m.out_k_stride] =
            quant::code_of(load_as_float(src, dtype, t * m.t_stride + k * m.k_stride), scale);
    }
  });
}

void dequantize_host(const uint8_t* codes, const float* scales, const GroupMap& m, void* dst, DType dtype) {
  const int64_t groups = m.groups();
  parallel_for(m.tokens, cpu_threads(0), [&](int64_t t, int) {
    for (int64_t k = 0; k < m.k; ++k)
      store_from_float(dst, dtype, t * m.out_t_stride + k * m.out_k_stride,
                   quant::value_of(codes[t * m.t_stride + k * m.k_stride], scales[t * groups + k / m.group]));
  });
}

// ---- checks shared by the entry points ----

void check_value_dtype(DType d, const char* fn, const std::string& what) {
  if (d != DType::f32 && d != DType::f16 && d != DType::bf16)
    bad(std::string(fn) + ": " + what + " must be f32, f16 or bf16, got " +
        (int(d) >= 0 && int(d) <= 3 ? std::string(to_string(d)) : "dtype " + s(int(d))));
}

void check_memory(Memory m, const char* fn) {
  if (int(m) < 0 || int(m) > 1) bad(std::string(fn) + ": memory " + s(int(m)) + " is not host (0) or device (1)");
  if (m == Memory::device && !device_info().available)
    throw no_gpu_error(std::string(fn) + ": the arrays are in device memory",
                       std::string(fn) + ": the arrays are in device memory but no CUDA device answers: ");
}

void check_no_overlap(const char* fn, std::initializer_list<std::pair<const char*, ByteRange>> outs,
                      std::initializer_list<std::pair<const char*, ByteRange>> ins) {
  std::vector<std::pair<const char*, ByteRange>> all(ins);
  for (const auto& o : outs) {
    for (const auto& i : all)
      if (o.second.overlaps(i.second))
        bad(std::string(fn) + ": " + o.first + " overlaps " + i.first + " (the outputs need memory of their own)");
    all.push_back(o);
  }
}

// A BSR matrix's values as tokens (blocks) x K (the bm * bk elements of a block, contiguous).
GroupMap block_map(const BsrView& v) {
  GroupMap m;
  m.tokens = v.nnzb;
  m.k = int64_t(v.bm) * v.bk;
  m.t_stride = m.out_t_stride = m.k;
  m.k_stride = m.out_k_stride = 1;
  m.group = std::max<int64_t>(1, m.k);
  return m;
}

void check_bsr(const BsrView& in, const char* fn) {
  check_memory(in.memory, fn);
  try {
    validate(in, /*check_indices=*/false);
  } catch (const Error& e) {
    bad(std::string(fn) + ": the matrix: " + e.what());
  }
  int64_t bytes;
  if (__builtin_mul_overflow(in.nnzb, int64_t(in.bm) * in.bk * 4, &bytes))
    bad(std::string(fn) + ": nnzb=" + s(in.nnzb) + " blocks of " + s(in.bm) + "x" + s(in.bk) +
        " overflow a 64-bit byte count");
}

void check_out_ptr(const void* p, int64_t count, size_t align, const char* fn, const char* name) {
  if (count > 0 && !p) bad(std::string(fn) + ": " + name + " is null but " + s(count) + " elements are to be written");
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    bad(std::string(fn) + ": " + name + " is not " + s(int64_t(align)) + "-byte aligned (address % " +
        s(int64_t(align)) + " = " + s(int64_t(reinterpret_cast<uintptr_t>(p) % align)) + ")");
}

// A dense matrix as tokens x K under `dim`; the source's strides from `in`, the destination's
// from `out` (same shape).
GroupMap dense_map(const DenseView& in, const DenseView& out, ScaleDim dim, int scale_group) {
  auto strides = [&](const DenseView& d, int64_t& ts, int64_t& ks) {
    const bool row = d.layout == Layout::row_major;
    // element (r, c) sits at r * (row ? ld : 1) + c * (row ? 1 : ld)
    const int64_t rs = row ? d.ld : 1, cs = row ? 1 : d.ld;
    ts = dim == ScaleDim::rows ? rs : cs;
    ks = dim == ScaleDim::rows ? cs : rs;
  };
  GroupMap m;
  m.tokens = dim == ScaleDim::rows ? in.rows : in.cols;
  m.k = dim == ScaleDim::rows ? in.cols : in.rows;
  strides(in, m.t_stride, m.k_stride);
  strides(out, m.out_t_stride, m.out_k_stride);
  m.group = scale_group == 0 ? std::max<int64_t>(1, m.k) : scale_group;
  return m;
}

// (token, k) back to the matrix's (row, col), for messages.
std::string dense_at(ScaleDim dim, int64_t t, int64_t k) {
  return dim == ScaleDim::rows ? "(" + s(t) + ", " + s(k) + ")" : "(" + s(k) + ", " + s(t) + ")";
}

void check_dim(ScaleDim dim, const char* fn) {
  if (int(dim) < 0 || int(dim) > 1) bad(std::string(fn) + ": dim " + s(int(dim)) + " is not rows (0) or cols (1)");
}

// Zero scales for tokens with K = 0 (their groups hold nothing; the kernels visit none).
void zero_scales(float* scales, int64_t count, Memory mem, void* stream) {
  if (count <= 0) return;
  if (mem == Memory::host) {
    std::fill(scales, scales + count, 0.f);
    return;
  }
  check_cuda(int(cudaMemsetAsync(scales, 0, size_t(count) * 4, static_cast<cudaStream_t>(stream))),
             "cudaMemsetAsync(scales)");
}

}  // namespace

// ---- block-sparse ----

void quantize_e4m3(const BsrView& in, void* values, float* scales, void* stream) {
  const char* fn = "quantize_e4m3";
  check_value_dtype(in.dtype, fn, "the values");
  check_bsr(in, fn);
  const int64_t n = in.nnzb * in.bm * in.bk;
  check_out_ptr(values, n, 1, fn, "values (the output)");
  check_out_ptr(scales, in.nnzb, 4, fn, "scales (the output)");
  check_no_overlap(fn, {{"values (the output)", byte_range(values, n)}, {"scales (the output)", byte_range(scales, in.nnzb * 4)}},
                   {{"the input values", byte_range(in.values, n * int64_t(dtype_size(in.dtype)))}});
  const GroupMap m = block_map(in);
  if (in.memory == Memory::device) {
    quant::quantize_gpu(in.values, in.dtype, m, static_cast<uint8_t*>(values), scales, stream);
    return;
  }
  int64_t t, k;
  if (first_non_finite(in.values, in.dtype, m, &t, &k))
    bad(std::string(fn) + ": values[block " + s(t) + ", row " + s(k / in.bk) + ", col " + s(k % in.bk) +
        "]=" + num(load_as_float(in.values, in.dtype, t * m.t_stride + k)) +
        " is not finite (e4m3 quantization needs finite values)");
  quantize_host(in.values, in.dtype, m, static_cast<uint8_t*>(values), scales);
}

void dequantize(const BsrView& in, void* values, DType dtype, void* stream) {
  const char* fn = "dequantize";
  check_bsr(in, fn);
  if (in.dtype != DType::e4m3) bad(std::string(fn) + ": the matrix is " + to_string(in.dtype) + ", not e4m3");
  check_value_dtype(dtype, fn, "the output dtype");
  const int64_t n = in.nnzb * in.bm * in.bk;
  check_out_ptr(values, n, dtype_size(dtype), fn, "values (the output)");
  check_no_overlap(fn, {{"values (the output)", byte_range(values, n * int64_t(dtype_size(dtype)))}},
                   {{"the input values", byte_range(in.values, n)}, {"the input scales", byte_range(in.scales, in.nnzb * 4)}});
  const GroupMap m = block_map(in);
  if (in.memory == Memory::device) {
    quant::dequantize_gpu(static_cast<const uint8_t*>(in.values), in.scales, m, values, dtype, stream);
    return;
  }
  dequantize_host(static_cast<const uint8_t*>(in.values), in.scales, m, values, dtype);
}

BsrMatrix quantize_e4m3(const BsrMatrix& a) {
  check_value_dtype(a.dtype(), "quantize_e4m3", "the values");
  BsrMatrix q(a.rows(), a.cols(), a.bm(), a.bk(), a.row_ptr(), a.col_idx(), DType::e4m3);
  quantize_e4m3(a.view(), q.value_bytes().data(), q.scales().data());
  return q;
}

BsrMatrix dequantize(const BsrMatrix& a, DType dtype) {
  check_value_dtype(dtype, "dequantize", "the output dtype");
  BsrMatrix d(a.rows(), a.cols(), a.bm(), a.bk(), a.row_ptr(), a.col_idx(), dtype);
  dequantize(a.view(), d.value_bytes().data(), dtype);
  return d;
}

// ---- dense ----

void quantize_e4m3(const DenseView& in, DenseView& out, float* scales, ScaleDim dim, int scale_group, void* stream) {
  const char* fn = "quantize_e4m3";
  check_dim(dim, fn);
  check_value_dtype(in.dtype, fn, "in");
  check_memory(in.memory, fn);
  validate(in, "in");
  const int64_t tokens = dim == ScaleDim::rows ? in.rows : in.cols, K = dim == ScaleDim::rows ? in.cols : in.rows;
  const int64_t count = scale_count(tokens, K, scale_group);
  if (out.dtype != DType::e4m3)
    bad(std::string(fn) + ": out must be e4m3, got " +
        (int(out.dtype) >= 0 && int(out.dtype) <= 3 ? std::string(to_string(out.dtype)) : "dtype " + s(int(out.dtype))));
  if (out.rows != in.rows || out.cols != in.cols)
    bad(std::string(fn) + ": out is " + s(out.rows) + "x" + s(out.cols) + " but in is " + s(in.rows) + "x" + s(in.cols));
  if (out.memory != in.memory)
    bad(std::string(fn) + ": out is in " + to_string(out.memory) + " memory but in is in " + to_string(in.memory) +
        " memory");
  check_out_ptr(scales, count, 4, fn, "scales (the output)");
  DenseView o = out;
  o.scales = scales;
  o.scale_group = scale_group;
  validate(o, "out");
  check_no_overlap(fn, {{"out", byte_range(o)}, {"scales (the output)", byte_range(scales, count * 4)}},
                   {{"in", byte_range(in)}});
  const GroupMap m = dense_map(in, o, dim, scale_group);
  if (K == 0) {
    zero_scales(scales, count, in.memory, stream);
  } else if (in.memory == Memory::device) {
    quant::quantize_gpu(in.data, in.dtype, m, static_cast<uint8_t*>(o.data), scales, stream);
  } else {
    int64_t t, k;
    if (first_non_finite(in.data, in.dtype, m, &t, &k))
      bad(std::string(fn) + ": in" + dense_at(dim, t, k) + "=" +
          num(load_as_float(in.data, in.dtype, t * m.t_stride + k * m.k_stride)) +
          " is not finite (e4m3 quantization needs finite values)");
    quantize_host(in.data, in.dtype, m, static_cast<uint8_t*>(o.data), scales);
  }
  out.scales = scales;
  out.scale_group = scale_group;
}

void dequantize(const DenseView& in, const DenseView& out, ScaleDim dim, void* stream) {
  const char* fn = "dequantize";
  check_dim(dim, fn);
  check_memory(in.memory, fn);
  if (in.dtype != DType::e4m3)
    bad(std::string(fn) + ": in is " +
        (int(in.dtype) >= 0 && int(in.dtype) <= 3 ? std::string(to_string(in.dtype)) : "dtype " + s(int(in.dtype))) +
        ", not e4m3");
  validate(in, "in");
  validate(out, "out");
  check_value_dtype(out.dtype, fn, "out");
  if (out.rows != in.rows || out.cols != in.cols)
    bad(std::string(fn) + ": out is " + s(out.rows) + "x" + s(out.cols) + " but in is " + s(in.rows) + "x" + s(in.cols));
  if (out.memory != in.memory)
    bad(std::string(fn) + ": out is in " + to_string(out.memory) + " memory but in is in " + to_string(in.memory) +
        " memory");
  const int64_t tokens = dim == ScaleDim::rows ? in.rows : in.cols, K = dim == ScaleDim::rows ? in.cols : in.rows;
  const int64_t count = scale_count(tokens, K, in.scale_group);
  check_no_overlap(fn, {{"out", byte_range(out)}}, {{"in", byte_range(in)}, {"in's scales", byte_range(in.scales, count * 4)}});
  const GroupMap m = dense_map(in, out, dim, in.scale_group);
  if (in.memory == Memory::device)
    quant::dequantize_gpu(static_cast<const uint8_t*>(in.data), in.scales, m, out.data, out.dtype, stream);
  else
    dequantize_host(static_cast<const uint8_t*>(in.data), in.scales, m, out.data, out.dtype);
}

}  // namespace sparsek
