// BSR, dense and product (GemmArgs) validation, and a product's dimensions. Every message names
// the array, the first offending index and its value, so a user can find the bad entry without a
// debugger.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/no_gpu.hpp"
#include "format/format_internal.hpp"
#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek {

namespace {
[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }
std::string s(int64_t v) { return std::to_string(v); }
bool supported_block(int b) { return b == 16 || b == 32 || b == 64 || b == 128; }
// e4m3 takes e4m3 on both sides: say so when one side is.
std::string mixed_hint(DType x, DType y) {
  return x == DType::e4m3 || y == DType::e4m3
             ? " (an e4m3 product takes e4m3 for both inputs: quantize the other one, or dequantize this one)"
             : "";
}
std::string dims(int64_t r, int64_t c) {
  return std::to_string(r) + "x" + std::to_string(c);
}

// Sparse operand's shape after op.
int64_t op_rows(const BsrView& s, Op op) { return op == Op::none ? s.rows : s.cols; }
int64_t op_cols(const BsrView& s, Op op) { return op == Op::none ? s.cols : s.rows; }

void check_dense_shape(const DenseView& d, const char* name, int64_t rows, int64_t cols) {
  if (d.rows != rows || d.cols != cols)
    bad(std::string(name) + " must be " + dims(rows, cols) + " but is " + dims(d.rows, d.cols));
}

const char* sparse_name(const GemmArgs& g) {
  return g.kind == OpKind::dsd ? "A (sparse)" : g.kind == OpKind::dds ? "B (sparse)" : "C (sparse)";
}

const char* kDtypeNames = "f32 (0), f16 (1), bf16 (2) or e4m3 (3)";

std::string num(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  return buf;
}

// Scale values: finite and >= 0 (-0 passes). `name` is the array as the user knows it.
void check_scale_values(const float* scales, int64_t count, const std::string& name) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = scales[i];
    if (!std::isfinite(v))
      bad(name + "[" + s(i) + "]=" + num(v) + " is not finite (scales must be finite and >= 0)");
    if (v < 0.f) bad(name + "[" + s(i) + "]=" + num(v) + " is negative (scales must be finite and >= 0)");
  }
}

// A float array read on the host: itself, or a copy of device memory.
struct HostFloats {
  const float* data = nullptr;
  std::vector<float> copy;
};
HostFloats host_floats(const float* p, int64_t count, Memory memory, const char* what) {
  HostFloats h;
  if (memory == Memory::host || !p || count <= 0) {
    h.data = p;
    return h;
  }
  // copy_to_host moves 4-byte elements: a float's bits travel as an int32's.
  std::vector<int32_t> bits;
  copy_to_host(nullptr,
               "the stream is being captured into a CUDA graph, but checking device scales reads them on the "
               "host: plan before the capture, or run with check_indices off inside it",
               {{reinterpret_cast<const int32_t*>(p), count, &bits, what}});
  h.copy.resize(bits.size());
  std::memcpy(h.copy.data(), bits.data(), bits.size() * sizeof(float));
  h.data = h.copy.data();
  return h;
}

// The dense input of a product that carries per-token scales, if any: the A of a DDS (tokens are
// its rows, K its columns) or the B of a DSD (tokens are its columns, K its rows).
struct DenseScales {
  const DenseView* d = nullptr;
  const char* name = "";
  int64_t tokens = 0, k = 0;
};
DenseScales dense_scales_of(const GemmArgs& g) {
  if (g.kind == OpKind::dds) return {&g.a, "A", g.a.rows, g.a.cols};
  if (g.kind == OpKind::dsd) return {&g.b, "B", g.b.cols, g.b.rows};
  return {};
}

}  // namespace

int64_t scale_count(int64_t tokens, int64_t k, int scale_group) {
  if (tokens < 0 || k < 0) bad("scale_count: tokens=" + s(tokens) + " and k=" + s(k) + " must be >= 0");
  if (scale_group != 0 && scale_group != 128)
    bad("scale_group=" + s(scale_group) + " is not 0 (one scale per token) or 128 (one per 128-wide group of K)");
  const int64_t groups = scale_group == 0 ? 1 : k / 128 + (k % 128 != 0);
  int64_t count, bytes;
  if (__builtin_mul_overflow(tokens, groups, &count) || __builtin_mul_overflow(count, int64_t(4), &bytes))
    bad("scale count " + s(tokens) + " x " + s(groups) + " overflows a 64-bit byte count");
  return count;
}

void validate(const BsrView& a, bool check_indices) {
  if (int(a.dtype) < 0 || int(a.dtype) > 3) bad("values dtype " + s(int(a.dtype)) + " is not " + kDtypeNames);
  if (int(a.memory) < 0 || int(a.memory) > 1) bad("memory " + s(int(a.memory)) + " is not host or device");
  if (!supported_block(a.bm)) bad("block rows bm=" + s(a.bm) + " is not one of 16, 32, 64, 128");
  if (!supported_block(a.bk)) bad("block cols bk=" + s(a.bk) + " is not one of 16, 32, 64, 128");
  if (a.rows < 0) bad("rows=" + s(a.rows) + " is negative");
  if (a.cols < 0) bad("cols=" + s(a.cols) + " is negative");
  if (a.rows % a.bm != 0) bad("rows=" + s(a.rows) + " is not a multiple of bm=" + s(a.bm));
  if (a.cols % a.bk != 0) bad("cols=" + s(a.cols) + " is not a multiple of bk=" + s(a.bk));
  // int32 indices: block counts and nnzb must fit.
  if (a.mb() > INT32_MAX || a.kb() > INT32_MAX) bad("block dims " + s(a.mb()) + "x" + s(a.kb()) + " overflow int32 indices");
  if (a.nnzb < 0) bad("nnzb=" + s(a.nnzb) + " is negative");
  if (a.nnzb > INT32_MAX) bad("nnzb=" + s(a.nnzb) + " overflows the int32 row_ptr");
  if (a.nnzb > a.mb() * a.kb())
    bad("nnzb=" + s(a.nnzb) + " exceeds the " + s(a.mb() * a.kb()) + " block positions of a " + s(a.mb()) + "x" +
        s(a.kb()) + " block grid");
  if (!a.row_ptr) bad("row_ptr is null (it needs mb+1=" + s(a.mb() + 1) + " entries)");
  if (a.nnzb > 0 && !a.col_idx) bad("col_idx is null but nnzb=" + s(a.nnzb));
  if (a.nnzb > 0 && !a.values) bad("values is null but nnzb=" + s(a.nnzb));
  if (a.memory == Memory::device && a.nnzb > 0 &&
      reinterpret_cast<uintptr_t>(a.values) % 16 != 0)
    bad("values pointer is not 16-byte aligned (address % 16 = " + s(int64_t(reinterpret_cast<uintptr_t>(a.values) % 16)) + ")");
  if (a.dtype == DType::e4m3) {
    if (a.nnzb > 0 && !a.scales)
      bad("scales is null but the values are e4m3 (they need one fp32 scale per stored block: nnzb=" + s(a.nnzb) +
          " floats)");
    if (reinterpret_cast<uintptr_t>(a.scales) % 4 != 0)
      bad("scales pointer is not 4-byte aligned (address % 4 = " +
          s(int64_t(reinterpret_cast<uintptr_t>(a.scales) % 4)) + ")");
  } else if (a.scales) {
    bad(std::string("scales is given but the values are ") + to_string(a.dtype) +
        " (only e4m3 values carry scales: pass null)");
  }
  if (!check_indices) return;
  if (a.memory != Memory::host) return;  // caller copies device indices (and scales) to the host first
  const int64_t mb = a.mb(), kb = a.kb();
  if (a.row_ptr[0] != 0) bad("row_ptr[0] must be 0, got " + s(a.row_ptr[0]));
  for (int64_t i = 1; i <= mb; ++i)
    if (a.row_ptr[i] < a.row_ptr[i - 1])
      bad("row_ptr must be non-decreasing: row_ptr[" + s(i) + "]=" + s(a.row_ptr[i]) + " < row_ptr[" + s(i - 1) +
          "]=" + s(a.row_ptr[i - 1]));
  if (a.row_ptr[mb] != a.nnzb) bad("row_ptr[" + s(mb) + "] must equal nnzb=" + s(a.nnzb) + ", got " + s(a.row_ptr[mb]));
  for (int64_t r = 0; r < mb; ++r) {
    for (int64_t j = a.row_ptr[r]; j < a.row_ptr[r + 1]; ++j) {
      int32_t c = a.col_idx[j];
      if (c < 0 || c >= kb)
        bad("col_idx[" + s(j) + "]=" + s(c) + " is out of range [0, " + s(kb) + ") (block row " + s(r) + ")");
      if (j > a.row_ptr[r] && c <= a.col_idx[j - 1])
        bad("col_idx must be sorted and unique within a row: col_idx[" + s(j) + "]=" + s(c) + " after col_idx[" +
            s(j - 1) + "]=" + s(a.col_idx[j - 1]) + " (block row " + s(r) + ")");
    }
  }
  if (a.dtype == DType::e4m3) check_scale_values(a.scales, a.nnzb, "scales");
}

void validate_shape(int64_t rows, int64_t cols, int bm, int bk, DType dtype) {
  // An empty pattern (nnzb = 0, a one-entry row_ptr) runs only the cheap checks.
  static const int32_t zero = 0;
  BsrView v;
  v.rows = rows;
  v.cols = cols;
  v.bm = bm;
  v.bk = bk;
  v.nnzb = 0;
  v.row_ptr = &zero;
  v.dtype = dtype;
  validate(v, /*check_indices=*/false);
}

void validate(const DenseView& d, const char* name) {
  const std::string n(name);
  if (int(d.dtype) < 0 || int(d.dtype) > 3) bad(n + " dtype " + s(int(d.dtype)) + " is not " + kDtypeNames);
  if (int(d.layout) < 0 || int(d.layout) > 1) bad(n + " layout " + s(int(d.layout)) + " is not row- or col-major");
  if (int(d.memory) < 0 || int(d.memory) > 1) bad(n + " memory " + s(int(d.memory)) + " is not host or device");
  if (d.rows < 0) bad(n + " rows=" + s(d.rows) + " is negative");
  if (d.cols < 0) bad(n + " cols=" + s(d.cols) + " is negative");
  const int64_t minor = d.layout == Layout::row_major ? d.cols : d.rows;
  if (d.ld < std::max<int64_t>(minor, 1))
    bad(n + " ld=" + s(d.ld) + " is smaller than its " + (d.layout == Layout::row_major ? "cols=" : "rows=") +
        s(minor) + " (" + to_string(d.layout) + ")");
  if (d.rows > 0 && d.cols > 0 && !d.data) bad(n + " data is null for a " + s(d.rows) + "x" + s(d.cols) + " matrix");
  // Scales: e4m3 only (how many a product needs depends on the operand's role: validate(GemmArgs)).
  if (d.dtype == DType::e4m3) {
    if (d.scale_group != 0 && d.scale_group != 128)
      bad(n + " scale_group=" + s(d.scale_group) +
          " is not 0 (one scale per token) or 128 (one per token and 128-wide group of K)");
    if (d.rows > 0 && d.cols > 0 && !d.scales)
      bad(n + " scales is null but " + n + " is e4m3 (it needs fp32 scales, one per token)");
    if (reinterpret_cast<uintptr_t>(d.scales) % 4 != 0)
      bad(n + " scales pointer is not 4-byte aligned (address % 4 = " +
          s(int64_t(reinterpret_cast<uintptr_t>(d.scales) % 4)) + ")");
  } else {
    if (d.scales)
      bad(n + " scales is given but " + n + " is " + to_string(d.dtype) + " (only e4m3 operands carry scales: pass null)");
    if (d.scale_group != 0)
      bad(n + " scale_group=" + s(d.scale_group) + " is set but " + n + " is " + to_string(d.dtype) +
          " (only e4m3 operands carry scales: leave it 0)");
  }
  // The extent, from the first element to the last ((major - 1) * ld + minor elements), must be
  // addressable: else the index arithmetic of every backend would overflow.
  if (d.rows > 0 && d.cols > 0) {
    const int64_t major = d.layout == Layout::row_major ? d.rows : d.cols;
    const int64_t es = int64_t(dtype_size(d.dtype)), max_elems = INT64_MAX / es;
    if (minor > max_elems || major - 1 > (max_elems - minor) / d.ld)
      bad(n + " is " + s(d.rows) + "x" + s(d.cols) + " with ld=" + s(d.ld) + ": its extent of (" + s(major) +
          " - 1) * ld + " + s(minor) + " elements overflows a 64-bit byte count");
    const uint64_t bytes = uint64_t(((major - 1) * d.ld + minor) * es);
    if (bytes > UINTPTR_MAX - reinterpret_cast<uintptr_t>(d.data))
      bad(n + " data pointer + its extent of " + std::to_string(bytes) + " bytes wraps around the address space");
  }
}

ByteRange byte_range(const DenseView& d) {
  if (d.rows <= 0 || d.cols <= 0 || !d.data) return {};
  const bool row = d.layout == Layout::row_major;
  const int64_t major = row ? d.rows : d.cols, minor = row ? d.cols : d.rows;
  const uintptr_t b = reinterpret_cast<uintptr_t>(d.data);
  return {b, b + uintptr_t(((major - 1) * d.ld + minor) * int64_t(dtype_size(d.dtype)))};
}

ByteRange byte_range(const void* p, int64_t bytes) {
  if (!p || bytes <= 0) return {};
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  return {b, b + uintptr_t(bytes)};
}

// ---- a product: its dimensions and its validation ----

int64_t GemmArgs::m() const {
  switch (kind) {
    case OpKind::dsd: return op_rows(sparse, op);
    case OpKind::dds: return a.rows;
    case OpKind::sdd: return sparse.rows;
  }
  return 0;
}
int64_t GemmArgs::n() const {
  switch (kind) {
    case OpKind::dsd: return b.cols;
    case OpKind::dds: return op_cols(sparse, op);
    case OpKind::sdd: return sparse.cols;
  }
  return 0;
}
int64_t GemmArgs::k() const {
  switch (kind) {
    case OpKind::dsd: return op_cols(sparse, op);
    case OpKind::dds: return op_rows(sparse, op);
    case OpKind::sdd: return a.cols;
  }
  return 0;
}
double GemmArgs::effective_flops() const {
  // Every stored block multiplies with the dense extent that is not blocked.
  double block = double(sparse.nnzb) * sparse.bm * sparse.bk;
  switch (kind) {
    case OpKind::dsd: return 2.0 * block * double(n());
    case OpKind::dds: return 2.0 * block * double(m());
    case OpKind::sdd: return 2.0 * block * double(k());
  }
  return 0;
}

void validate_pattern(const GemmArgs& g, const HostPattern& hp, bool check_scales) {
  BsrView h = g.sparse;
  h.row_ptr = hp.row_ptr;
  h.col_idx = hp.col_idx;
  // The pattern's checks only: values and scales are not read here (the cheap checks of the real
  // view ran before), so stand-ins of a dtype without scales take their place.
  h.values = g.sparse.nnzb > 0 ? reinterpret_cast<void*>(16) : nullptr;
  h.dtype = DType::f32;
  h.scales = nullptr;
  h.memory = Memory::host;
  try {
    validate(h, true);
  } catch (const Error& e) {
    bad(std::string(sparse_name(g)) + ": " + e.what());
  }
  if (!check_scales) return;
  // e4m3 scales are checked with the pattern (their values, like its indices, are O(nnzb)); a
  // device array is read through a host copy (its stream was waited for by host_pattern()).
  if (g.sparse.dtype == DType::e4m3) {
    const HostFloats sc =
        host_floats(g.sparse.scales, g.sparse.nnzb, g.sparse.memory, "cudaMemcpy(sparse scales to host)");
    check_scale_values(sc.data, g.sparse.nnzb, std::string(sparse_name(g)) + " scales");
  }
  const DenseScales ds = dense_scales_of(g);
  if (ds.d && ds.d->dtype == DType::e4m3 && ds.d->rows > 0 && ds.d->cols > 0) {
    const int64_t count = scale_count(ds.tokens, ds.k, ds.d->scale_group);
    const HostFloats d = host_floats(ds.d->scales, count, ds.d->memory, "cudaMemcpy(dense scales to host)");
    check_scale_values(d.data, count, std::string(ds.name) + " scales");
  }
}

namespace {

// C must not share a byte with any input: every backend reads inputs while it writes C, so an
// overlap gives a wrong answer (or a race on the GPU). Ranges span first to last element.
void check_no_aliasing(const GemmArgs& g) {
  const BsrView& s = g.sparse;
  const int64_t value_bytes = s.nnzb * s.bm * s.bk * int64_t(dtype_size(s.dtype));
  struct Named {
    const char* name;
    ByteRange range;
  };
  std::vector<Named> inputs;
  inputs.push_back({"the sparse operand's row_ptr", byte_range(s.row_ptr, (s.mb() + 1) * 4)});
  inputs.push_back({"the sparse operand's col_idx", byte_range(s.col_idx, s.nnzb * 4)});
  if (g.kind != OpKind::sdd) inputs.push_back({"A (sparse) values", byte_range(s.values, value_bytes)});
  if (g.kind == OpKind::dds) inputs.back().name = "B (sparse) values";
  if (g.kind != OpKind::dsd) inputs.push_back({"A", byte_range(g.a)});
  if (g.kind != OpKind::dds) inputs.push_back({"B", byte_range(g.b)});
  if (s.scales) inputs.push_back({g.kind == OpKind::dds ? "B (sparse) scales" : "A (sparse) scales",
                                  byte_range(s.scales, s.nnzb * 4)});
  const DenseScales ds = dense_scales_of(g);
  if (ds.d && ds.d->scales && ds.d->dtype == DType::e4m3)
    inputs.push_back({ds.d == &g.a ? "A scales" : "B scales",
                      byte_range(ds.d->scales, scale_count(ds.tokens, ds.k, ds.d->scale_group) * 4)});
  const bool sdd = g.kind == OpKind::sdd;
  const ByteRange out = sdd ? byte_range(s.values, value_bytes) : byte_range(g.c);
  for (const Named& in : inputs)
    if (out.overlaps(in.range)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ": C occupies [%#zx, %#zx) and %s [%#zx, %#zx)", size_t(out.begin),
                    size_t(out.end), in.name, size_t(in.range.begin), size_t(in.range.end));
      bad(std::string(sdd ? "C (sparse) values overlap " : "C overlaps ") + in.name + buf +
          "; products are not computed in place: give C memory of its own");
    }
}

}  // namespace

void check_enums(const GemmArgs& g) {
  auto range = [](int v, int hi, const std::string& what, const char* names) {
    if (v < 0 || v > hi) bad(what + " " + std::to_string(v) + " is not " + names);
  };
  range(int(g.kind), 2, "kind", "dsd (0), dds (1) or sdd (2)");
  range(int(g.op), 1, "op", "none (0) or trans (1)");
  const std::string sp = sparse_name(g);
  range(int(g.sparse.dtype), 3, sp + " dtype", kDtypeNames);
  range(int(g.sparse.memory), 1, sp + " memory", "host (0) or device (1)");
  auto dense = [&](const DenseView& d, const std::string& n) {
    range(int(d.dtype), 3, n + " dtype", kDtypeNames);
    range(int(d.layout), 1, n + " layout", "row-major (0) or col-major (1)");
    range(int(d.memory), 1, n + " memory", "host (0) or device (1)");
  };
  if (g.kind != OpKind::dsd) dense(g.a, "A");
  if (g.kind != OpKind::dds) dense(g.b, "B");
  if (g.kind != OpKind::sdd) dense(g.c, "C");
}

void validate(const GemmArgs& g, bool check_indices) {
  validate_description(g, check_indices);
  check_no_aliasing(g);
}

void validate_description(const GemmArgs& g, bool check_indices) {
  // Enumerations first: nothing below may print an out-of-range value as a valid name.
  check_enums(g);
  if (g.kind == OpKind::sdd && g.op != Op::none) bad("op must be none for sdd (got trans)");
  // e4m3 is an input type: no output takes it, and SDD (whose output is the sparse operand) has
  // no e4m3 form. Said here, before the operands' own checks ask an output for scales.
  if (g.kind == OpKind::sdd && (g.a.dtype == DType::e4m3 || g.b.dtype == DType::e4m3 || g.sparse.dtype == DType::e4m3))
    throw Error(Status::unsupported, std::string("sdd does not take e4m3 operands (A is ") + to_string(g.a.dtype) +
                                         ", B " + to_string(g.b.dtype) + ", C " + to_string(g.sparse.dtype) +
                                         "): e4m3 products are dsd and dds");
  if (g.kind != OpKind::sdd && g.c.dtype == DType::e4m3)
    bad("C dtype e4m3 is not an output dtype: C must be f16, bf16 or f32");
  const char* sname = sparse_name(g);
  // BSR invariants: the cheap ones here, the O(nnzb) index checks on a host view of the pattern.
  try {
    validate(g.sparse, false);
  } catch (const Error& e) {
    bad(std::string(sname) + ": " + e.what());
  }
  // The dense operands' own checks (enums, dims, ld, extent) before anything compares them.
  if (g.kind != OpKind::dsd) validate(g.a, "A");
  if (g.kind != OpKind::dds) validate(g.b, "B");
  if (g.kind != OpKind::sdd) validate(g.c, "C");
  // All operands in one memory space.
  Memory mem = g.sparse.memory;
  auto same_mem = [&](const DenseView& d, const char* name) {
    if (d.memory != mem)
      bad(std::string(name) + " is in " + to_string(d.memory) + " memory but the sparse operand is in " +
          to_string(mem) + " memory");
  };
  if (g.kind != OpKind::dds) same_mem(g.b, "B");
  if (g.kind != OpKind::dsd) same_mem(g.a, "A");
  if (g.kind != OpKind::sdd) same_mem(g.c, "C");
  // Device operands need a device before anything touches them (the index copy below included).
  if (mem == Memory::device && !device_info().available)
    throw no_gpu_error("operands in device memory", "operands are in device memory but no CUDA device answers: ");
  if (check_indices) validate_pattern(g, host_pattern(g.sparse, true));
  const int64_t M = g.m(), N = g.n(), K = g.k();
  DType in = g.sparse.dtype;
  switch (g.kind) {
    case OpKind::dsd:
      check_dense_shape(g.b, "B", K, g.b.cols);
      check_dense_shape(g.c, "C", M, N);
      if (g.b.dtype != in)
        bad(std::string("B dtype ") + to_string(g.b.dtype) + " differs from A's " + to_string(in) + mixed_hint(in, g.b.dtype));
      break;
    case OpKind::dds:
      check_dense_shape(g.a, "A", g.a.rows, K);
      check_dense_shape(g.c, "C", M, N);
      if (g.a.dtype != in)
        bad(std::string("A dtype ") + to_string(g.a.dtype) + " differs from B's " + to_string(in) + mixed_hint(in, g.a.dtype));
      break;
    case OpKind::sdd:
      in = g.a.dtype;
      check_dense_shape(g.a, "A", M, g.a.cols);
      check_dense_shape(g.b, "B", K, N);
      if (g.b.dtype != in)
        bad(std::string("B dtype ") + to_string(g.b.dtype) + " differs from A's " + to_string(in));
      break;
  }
  DType out = g.kind == OpKind::sdd ? g.sparse.dtype : g.c.dtype;
  if (in == DType::f32 && out != DType::f32)
    bad(std::string("output dtype must be f32 for f32 inputs, got ") + to_string(out));
  // The dense e4m3 input's scales must be addressable: their count (tokens x groups of K) in bytes
  // and their last byte.
  const DenseScales ds = dense_scales_of(g);
  if (ds.d && ds.d->dtype == DType::e4m3 && ds.d->scales) {
    const int64_t count = scale_count(ds.tokens, ds.k, ds.d->scale_group);
    if (uint64_t(count) * 4 > UINTPTR_MAX - reinterpret_cast<uintptr_t>(ds.d->scales))
      bad(std::string(ds.name) + " scales pointer + its " + s(count) + " floats wraps around the address space");
  }
  if (g.sparse.dtype == DType::e4m3 && g.sparse.scales &&
      uint64_t(g.sparse.nnzb) * 4 > UINTPTR_MAX - reinterpret_cast<uintptr_t>(g.sparse.scales))
    bad(std::string(sname) + " scales pointer + its " + s(g.sparse.nnzb) + " floats wraps around the address space");
  if (!(g.alpha == g.alpha) || !(g.beta == g.beta))
    bad("alpha and beta must not be NaN (alpha=" + std::to_string(g.alpha) + ", beta=" + std::to_string(g.beta) + ")");
}

}  // namespace sparsek
