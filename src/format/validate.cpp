// BSR, dense and product (GemmArgs) validation, and a product's dimensions. Every message names
// the array, the first offending index and its value, so a user can find the bad entry without a
// debugger.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "format/format_internal.hpp"
#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek {

namespace {
[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }
std::string s(int64_t v) { return std::to_string(v); }
bool supported_block(int b) { return b == 16 || b == 32 || b == 64 || b == 128; }
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

}  // namespace

void validate(const BsrView& a, bool check_indices) {
  if (int(a.dtype) < 0 || int(a.dtype) > 2) bad("values dtype " + s(int(a.dtype)) + " is not f32, f16 or bf16");
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
  if (!check_indices) return;
  if (a.memory != Memory::host) return;  // caller copies device indices to the host first
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
  if (int(d.dtype) < 0 || int(d.dtype) > 2) bad(n + " dtype " + s(int(d.dtype)) + " is not f32, f16 or bf16");
  if (int(d.layout) < 0 || int(d.layout) > 1) bad(n + " layout " + s(int(d.layout)) + " is not row- or col-major");
  if (int(d.memory) < 0 || int(d.memory) > 1) bad(n + " memory " + s(int(d.memory)) + " is not host or device");
  if (d.rows < 0) bad(n + " rows=" + s(d.rows) + " is negative");
  if (d.cols < 0) bad(n + " cols=" + s(d.cols) + " is negative");
  const int64_t minor = d.layout == Layout::row_major ? d.cols : d.rows;
  if (d.ld < std::max<int64_t>(minor, 1))
    bad(n + " ld=" + s(d.ld) + " is smaller than its " + (d.layout == Layout::row_major ? "cols=" : "rows=") +
        s(minor) + " (" + to_string(d.layout) + ")");
  if (d.rows > 0 && d.cols > 0 && !d.data) bad(n + " data is null for a " + s(d.rows) + "x" + s(d.cols) + " matrix");
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

void validate_pattern(const GemmArgs& g, const HostPattern& hp) {
  BsrView h = g.sparse;
  h.row_ptr = hp.row_ptr;
  h.col_idx = hp.col_idx;
  h.values = g.sparse.nnzb > 0 ? reinterpret_cast<void*>(16) : nullptr;  // values are not read by the checks
  h.memory = Memory::host;
  try {
    validate(h, true);
  } catch (const Error& e) {
    bad(std::string(sparse_name(g)) + ": " + e.what());
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
  range(int(g.sparse.dtype), 2, sp + " dtype", "f32 (0), f16 (1) or bf16 (2)");
  range(int(g.sparse.memory), 1, sp + " memory", "host (0) or device (1)");
  auto dense = [&](const DenseView& d, const std::string& n) {
    range(int(d.dtype), 2, n + " dtype", "f32 (0), f16 (1) or bf16 (2)");
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
    throw Error(Status::no_device, "operands are in device memory but no CUDA device answers: " + device_info().why_not);
  if (check_indices) validate_pattern(g, host_pattern(g.sparse, true));
  const int64_t M = g.m(), N = g.n(), K = g.k();
  DType in = g.sparse.dtype;
  switch (g.kind) {
    case OpKind::dsd:
      check_dense_shape(g.b, "B", K, g.b.cols);
      check_dense_shape(g.c, "C", M, N);
      if (g.b.dtype != in)
        bad(std::string("B dtype ") + to_string(g.b.dtype) + " differs from A's " + to_string(in));
      break;
    case OpKind::dds:
      check_dense_shape(g.a, "A", g.a.rows, K);
      check_dense_shape(g.c, "C", M, N);
      if (g.a.dtype != in)
        bad(std::string("A dtype ") + to_string(g.a.dtype) + " differs from B's " + to_string(in));
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
  if (!(g.alpha == g.alpha) || !(g.beta == g.beta))
    bad("alpha and beta must not be NaN (alpha=" + std::to_string(g.alpha) + ", beta=" + std::to_string(g.beta) + ")");
}

}  // namespace sparsek
