// BSR and dense validation. Every message names the array, the first offending index
// and its value, so a user can find the bad entry without a debugger.
#include <algorithm>
#include <cstdint>
#include <string>

#include "format/format_internal.hpp"
#include "sparsek/bsr.hpp"

namespace sparsek {

namespace {
[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }
std::string s(int64_t v) { return std::to_string(v); }
bool supported_block(int b) { return b == 16 || b == 32 || b == 64 || b == 128; }
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

}  // namespace sparsek
