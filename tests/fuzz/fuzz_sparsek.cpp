// libFuzzer harness (built with ASan + UBSan by tests/fuzz/CMakeLists.txt) over the validator, the
// C API products and plans, and the tuning-cache reader.
//
// The input's first byte picks the entry point; the rest is read field by field (a field past the
// end reads as 0). The harness is the careful caller the library may assume: every array it
// passes holds as many elements as its description says, so an ASan report is the library's. What
// it then checks, beyond "no crash, no sanitizer report":
//   - C overlapping an input, and an extent whose byte count overflows, are refused;
//   - a product the library accepts equals the fp64 oracle (exactly for f32 outputs: all inputs
//     are small integers), and no byte of C outside its elements (its padding) changed;
//   - a refusal comes with a message; a destroyed plan handle is reported, never used;
//   - after a product, a pattern edited in place (any bytes) under check_indices = false cannot
//     crash the one-shot path.
// Work per input is bounded (at most 6 x 6 blocks, N <= 40) so that executions stay fast.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "capi/capi_internal.hpp"
#include "cpu/oracle.hpp"
#include "fuzz_common.hpp"
#include "sparsek/gemm.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/sparsek.h"
#include "tune/tune_internal.hpp"

namespace {

using namespace sparsek;
using namespace fuzz;

// Per entry point: calls, refusals (bad input reported), accepted calls checked against the
// oracle. Printed at exit when SPARSEK_FUZZ_STATS=1 (the figures of a long run).
struct Count {
  const char* name;
  long calls = 0, refused = 0, checked = 0;
};
Count g_counts[] = {{"sparsek_dsd"}, {"sparsek_dds"}, {"sparsek_sdd"}, {"sparsek_plan_create"}, {"sparsek_plan_run"},
                    {"sparsek_plan_destroy (twice / then run)"}, {"sparsek_bsr_validate"}, {"tuning-cache reader"}};
enum { kDsd, kDds, kSdd, kPlanCreate, kPlanRun, kPlanMisuse, kValidate, kCache };
void count(int which, bool refused, bool checked = false) {
  Count& c = g_counts[which];
  ++c.calls;
  c.refused += refused;
  c.checked += checked;
}
void print_counts() {
  std::fprintf(stderr, "%-40s %10s %10s %10s\n", "entry point", "calls", "refused", "checked");
  for (const Count& c : g_counts) std::fprintf(stderr, "%-40s %10ld %10ld %10ld\n", c.name, c.calls, c.refused, c.checked);
}

int block_size(Reader& r) {
  const uint8_t b = r.u8();
  return b < 248 ? 16 << (b % 4) : int(r.u32());
}

constexpr int64_t kMaxBytes = 1 << 18;   // the largest operand the harness allocates
constexpr int64_t kMaxElements = 1 << 16;  // stored elements of a generated pattern (bounds the work)
constexpr int64_t kMaxEntries = 1 << 12;  // the longest index array

size_t elem_size(int dtype) { return dtype == 0 ? 4 : 2; }

// Small integers in the storage type of `dtype` (exact in f16 / bf16 too).
void fill_ints(std::vector<uint8_t>& b, int dtype, Reader& r) {
  if (dtype < 0 || dtype > 2) return;
  const size_t es = elem_size(dtype), n = b.size() / es;
  for (size_t i = 0; i < n; ++i) store_from_float(b.data(), DType(dtype), int64_t(i), float(int(r.u8() % 9) - 4));
}

// A dense operand: its description and, when the extent fits the harness's budget, storage of
// exactly that extent (padding included).
struct Dense {
  sparsek_dense d{};
  std::vector<uint8_t> store;
  bool overflow = false;   // the extent's byte count overflows int64: must be refused
  bool too_big = false;    // a valid extent the harness does not allocate: no call is made
  bool invalid = false;    // a description validation must refuse (ld, dims, enums)
};

Dense make_dense(Reader& r, int64_t rows, int64_t cols, int dtype, int memory) {
  Dense x;
  const uint8_t shape = r.u8();
  if (shape >= 250) rows = r.i64();
  if (shape == 249) cols = r.i64();
  const int layout = enum_field(r, 2);
  const bool row = layout == 0;
  const int64_t minor = row ? cols : rows, major = row ? rows : cols;
  const uint8_t ldb = r.u8();
  const int64_t ld = ldb >= 240 ? r.i64() : minor > INT64_MAX - 4 ? minor : std::max<int64_t>(minor, 1) + ldb % 4;
  x.d.rows = rows;
  x.d.cols = cols;
  x.d.ld = ld;
  put_enum(x.d.layout, layout);
  put_enum(x.d.dtype, dtype);
  put_enum(x.d.memory, memory);
  x.invalid = rows < 0 || cols < 0 || layout < 0 || layout > 1 || dtype < 0 || dtype > 2 || memory < 0 ||
              memory > 1 || ld < std::max<int64_t>(minor, 1);
  __int128 bytes = 0;
  if (!x.invalid && rows > 0 && cols > 0) {
    const __int128 elems = (__int128(major) - 1) * ld + minor;  // < 2^127: no overflow here
    bytes = elems > INT64_MAX ? __int128(INT64_MAX) + 1 : elems * __int128(elem_size(dtype));
  }
  if (bytes > INT64_MAX) x.overflow = true;
  if (!x.invalid && !x.overflow && bytes > kMaxBytes) x.too_big = true;
  x.store.assign(size_t(!x.invalid && !x.overflow && !x.too_big ? int64_t(bytes) : 16), 0);
  fill_ints(x.store, dtype, r);
  x.d.data = x.store.data();
  if (rows <= 0 || cols <= 0) x.d.data = r.u8() & 1 ? nullptr : x.store.data();
  return x;
}

struct Sparse {
  sparsek_bsr s{};
  std::vector<int32_t> row_ptr, col_idx;
  std::vector<uint8_t> values;
  bool skip = false;  // arrays the harness cannot allocate as described
};

Sparse make_sparse(Reader& r, int dtype, int memory) {
  Sparse x;
  const int bm = block_size(r), bk = block_size(r);
  const int64_t mb = small_or_raw(r, 6), kb = small_or_raw(r, 6);
  __int128 rows = __int128(mb) * bm, cols = __int128(kb) * bk;
  const uint8_t odd = r.u8();
  if (odd >= 250) rows += odd - 249;  // not a multiple of bm
  if (rows > INT64_MAX || rows < INT64_MIN || cols > INT64_MAX || cols < INT64_MIN) {
    rows = mb;
    cols = kb;
  }
  x.s.rows = int64_t(rows);
  x.s.cols = int64_t(cols);
  x.s.bm = bm;
  x.s.bk = bk;
  put_enum(x.s.dtype, dtype);
  put_enum(x.s.memory, memory);
  // row_ptr as the description implies: mb + 1 entries (the library computes mb = rows / bm).
  const int64_t mb_lib = bm > 0 && x.s.rows > 0 ? x.s.rows / bm : 0;  // else refused before any read
  if (mb_lib + 1 > kMaxEntries) {
    x.skip = true;
    return x;
  }
  x.row_ptr.assign(size_t(mb_lib + 1), 0);
  // A valid pattern from one column mask per row, then optional corruption.
  const int64_t kb_lib = bk > 0 && x.s.cols >= 0 ? std::min<int64_t>(x.s.cols / bk, 8) : 0;
  const int64_t max_blocks = bm > 0 && bk > 0 ? std::max<int64_t>(1, kMaxElements / (int64_t(bm) * bk)) : 0;
  for (int64_t i = 0; i < mb_lib; ++i) {
    const uint8_t mask = r.u8();
    for (int64_t c = 0; c < kb_lib; ++c)
      if (mask >> c & 1 && int64_t(x.col_idx.size()) < max_blocks) x.col_idx.push_back(int32_t(c));
    x.row_ptr[size_t(i + 1)] = int32_t(x.col_idx.size());
  }
  int64_t nnzb = int64_t(x.col_idx.size());
  const uint8_t bad = r.u8();
  if (bad >= 200 && !x.row_ptr.empty()) x.row_ptr[r.u8() % x.row_ptr.size()] = int32_t(r.u32());
  if (bad >= 220 && bad < 240 && !x.col_idx.empty()) x.col_idx[r.u8() % x.col_idx.size()] = int32_t(r.u32());
  if (bad >= 240) nnzb = r.u8() < 128 ? int64_t(r.u32() % 64) : r.i64();
  x.s.nnzb = nnzb;
  if (nnzb > kMaxEntries) {
    x.skip = true;
    return x;
  }
  x.col_idx.resize(size_t(std::max<int64_t>(nnzb, 0)), 0);
  const __int128 vbytes = __int128(std::max<int64_t>(nnzb, 0)) * bm * bk * elem_size(dtype);
  if (bm > 0 && bk > 0 && vbytes <= kMaxBytes) {
    x.values.assign(size_t(vbytes), 0);
    fill_ints(x.values, dtype, r);
  } else if (nnzb > 0 && bm > 0 && bk > 0) {
    x.skip = true;
    return x;
  }
  x.s.row_ptr = x.row_ptr.data();
  x.s.col_idx = x.col_idx.empty() ? nullptr : x.col_idx.data();
  x.s.values = x.values.empty() ? nullptr : x.values.data();
  return x;
}

const float kScalars[] = {1.f, 0.f, -1.f, 0.5f, 2.f, -0.f, INFINITY, -INFINITY, NAN, 3.f};

// The library's own conversions (as its C API makes them), for the oracle's views.
using capi::to_view;

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (!a || !b || !an || !bn) return false;
  const uintptr_t x = uintptr_t(a), y = uintptr_t(b);
  return x < y + bn && y < x + an;
}

// One product through the C API (one-shot, or a plan), checked as the file header says.
void fuzz_product(Reader& r, bool with_plan) {
  const int kind = enum_field(r, 3), op = enum_field(r, 2);
  // The product functions take the op by value (a C caller's int); from C++ an out-of-range value
  // can only be handed over inside a struct, without loading it: the plan path does that.
  if (op < 0 || op > 1 || kind < 0 || kind > 2) with_plan = true;
  const int in_dtype = enum_field(r, 3);
  const uint8_t ob = r.u8();
  const int out_dtype = in_dtype == 0 ? (ob < 250 ? 0 : int(ob % 3)) : int(ob % 3);
  const int memory = r.u8() < 250 ? 0 : 1;  // device memory: refused here (no GPU answers)
  const int sparse_dtype = kind == 2 ? out_dtype : in_dtype;
  Sparse sp = make_sparse(r, sparse_dtype, memory);
  if (sp.skip) return;
  const bool tr = op == 1;
  // The free extent (N, M or K): up to 40, fewer when the pattern is large (work ~ elements x free).
  const int64_t stored = std::max<int64_t>(int64_t(sp.values.size()) / int64_t(elem_size(sparse_dtype)), 1);
  const int64_t srows = sp.s.rows, scols = sp.s.cols,
                free = std::min<int64_t>(r.u8() % 41, std::max<int64_t>(1, (1 << 19) / stored));
  int64_t M = 0, N = 0, K = 0;
  if (kind == 1) {
    K = tr ? scols : srows;
    N = tr ? srows : scols;
    M = free;
  } else if (kind == 2) {
    M = srows;
    N = scols;
    K = free;
  } else {
    M = tr ? scols : srows;
    K = tr ? srows : scols;
    N = free;
  }
  Dense a = make_dense(r, M, K, in_dtype, memory), b = make_dense(r, K, N, in_dtype, memory),
        c = make_dense(r, M, N, out_dtype, memory);
  const bool uses_a = kind == 1 || kind == 2, uses_b = kind != 1, uses_c = kind != 2;
  if ((uses_a && a.too_big) || (uses_b && b.too_big) || (uses_c && c.too_big)) return;
  const float alpha = kScalars[r.u8() % 10], beta = kScalars[r.u8() % 10];
  if (beta == 0.f)  // C is never read: NaN there must not leak
    for (size_t i = 0; i < c.store.size(); ++i) c.store[i] = 0xFF;

  // Deliberate aliasing: the output placed over an input.
  const uint8_t alias = r.u8();
  void* out_ptr = kind == 2 ? sp.s.values : c.d.data;
  if (alias >= 240) {
    const int which = alias % 5;
    void* target = which == 0   ? static_cast<void*>(b.store.data())
                   : which == 1 ? static_cast<void*>(a.store.data())
                   : which == 2 ? static_cast<void*>(sp.values.data())
                   : which == 3 ? static_cast<void*>(sp.row_ptr.data())
                                : static_cast<void*>(sp.col_idx.data());
    if (target) {
      if (kind == 2)
        sp.s.values = target;
      else
        c.d.data = target;
      out_ptr = target;
    }
  }
  // The spans the library must compare (the harness's own arithmetic, for its expectations).
  auto span = [](const Dense& d) -> size_t {
    if (d.invalid || d.overflow || d.d.rows <= 0 || d.d.cols <= 0) return 0;
    const bool row = capi::enum_value(d.d.layout) == 0;
    const int64_t major = row ? d.d.rows : d.d.cols, minor = row ? d.d.cols : d.d.rows;
    return size_t(((major - 1) * d.d.ld + minor) * int64_t(elem_size(capi::enum_value(d.d.dtype))));
  };
  const int64_t nnzb = sp.s.nnzb;
  const size_t vbytes = nnzb > 0 && sp.s.bm > 0 && sp.s.bk > 0
                            ? size_t(nnzb) * size_t(sp.s.bm) * size_t(sp.s.bk) * elem_size(sparse_dtype) : 0;
  const size_t out_span = kind == 2 ? vbytes : span(c);
  bool aliased = false;
  if (alias >= 240 && out_span > 0) {
    aliased = (uses_b && overlaps(out_ptr, out_span, b.d.data, span(b))) ||
              (uses_a && overlaps(out_ptr, out_span, a.d.data, span(a))) ||
              (kind != 2 && overlaps(out_ptr, out_span, sp.s.values, vbytes)) ||
              overlaps(out_ptr, out_span, sp.s.row_ptr, sp.row_ptr.size() * 4) ||
              overlaps(out_ptr, out_span, sp.s.col_idx, size_t(std::max<int64_t>(nnzb, 0)) * 4);
    // A non-aliased placement over a buffer too small for the output is not a valid call: skip.
    if (!aliased) return;
  }
  const bool must_refuse = aliased || (uses_a && a.overflow) || (uses_b && b.overflow) || (uses_c && c.overflow);

  // Snapshot of the output before the call: the oracle reads it (beta != 0), and its padding
  // must come back unchanged.
  std::vector<uint8_t> before_c = c.store, before_v = sp.values;

  sparsek_status st = SPARSEK_INTERNAL;
  sparsek_plan plan = nullptr;
  sparsek_gemm_args ga{};
  put_enum(ga.kind, kind);
  put_enum(ga.op, op);
  ga.alpha = alpha;
  ga.beta = beta;
  ga.sparse = sp.s;
  ga.a = a.d;
  ga.b = b.d;
  ga.c = c.d;
  int entry = kind == 0 ? kDsd : kind == 1 ? kDds : kSdd;
  if (with_plan) {
    st = sparsek_plan_create(&plan, &ga, r.u8() < 250 ? nullptr : "cpu");
    entry = kPlanCreate;
    if (st == SPARSEK_OK) {
      count(kPlanCreate, false);
      st = sparsek_plan_run(plan, &ga, nullptr);
      entry = kPlanRun;
    }
  } else if (kind == 0) {
    sparsek_op o;
    put_enum(o, op);
    st = sparsek_dsd(o, alpha, &sp.s, &b.d, beta, &c.d, nullptr);
  } else if (kind == 1) {
    sparsek_op o;
    put_enum(o, op);
    st = sparsek_dds(o, alpha, &a.d, &sp.s, beta, &c.d, nullptr);
  } else {
    st = sparsek_sdd(alpha, &a.d, &b.d, beta, &sp.s, nullptr);
  }
  count(entry, st != SPARSEK_OK, st == SPARSEK_OK);
  if (st != SPARSEK_OK && std::strlen(sparsek_last_error()) == 0) finding("a refusal without a message");
  if (st < SPARSEK_OK || st > SPARSEK_INTERNAL) finding("an unknown status " + std::to_string(int(st)));
  if (st == SPARSEK_INTERNAL) finding(std::string("an internal error: ") + sparsek_last_error());
  if (must_refuse && st == SPARSEK_OK)
    finding(aliased ? "C overlapping an input was accepted" : "an overflowing extent was accepted");
  if ((kind < 0 || kind > 2 || op < 0 || op > 1) && st == SPARSEK_OK) finding("an out-of-range kind or op was accepted");

  if (st == SPARSEK_OK) {
    // The product equals the oracle's, computed on the snapshot of the output.
    GemmArgs g;
    g.kind = OpKind(kind);
    g.op = Op(op);
    g.alpha = alpha;
    g.beta = beta;
    g.sparse = to_view(sp.s);
    if (uses_a) g.a = to_view(a.d);
    if (uses_b) g.b = to_view(b.d);
    if (uses_c) g.c = to_view(c.d);
    GemmArgs snap = g;
    if (kind == 2)
      snap.sparse.values = before_v.data();
    else
      snap.c.data = before_c.data();
    const std::vector<double> ref = oracle(snap);
    const double tol = out_dtype == 0 ? 0.0 : out_dtype == 1 ? 2e-3 : 1.6e-2;
    const double err = max_rel_error(g, ref);
    if (!(err <= tol)) finding("a product differs from the oracle: max rel error " + std::to_string(err));
    if (uses_c) {  // C's padding untouched
      const DenseView v = to_view(c.d);
      const size_t es = elem_size(out_dtype);
      for (size_t i = 0; i < c.store.size() / es; ++i) {
        const int64_t major = int64_t(i) / v.ld, minor = int64_t(i) % v.ld;
        const bool inside = v.layout == Layout::row_major ? major < v.rows && minor < v.cols
                                                          : minor < v.rows && major < v.cols;
        if (!inside && std::memcmp(&c.store[i * es], &before_c[i * es], es) != 0)
          finding("C's padding was written (storage element " + std::to_string(i) + ")");
      }
    }
    // The pattern edited in place (any bytes, same arrays), then the one-shot path without the
    // index checks: it may compute anything for the new pattern but must not crash or read out
    // of bounds (the plan cache may hand back the plan of the old pattern).
    if (!sp.col_idx.empty() || !sp.row_ptr.empty()) {
      for (int e = r.u8() % 4; e > 0; --e) {
        if (r.u8() & 1 && !sp.col_idx.empty())
          sp.col_idx[r.u8() % sp.col_idx.size()] = int32_t(r.u32());
        else if (!sp.row_ptr.empty())
          sp.row_ptr[r.u8() % sp.row_ptr.size()] = int32_t(r.u32());
      }
      Options o;
      o.check_indices = r.u8() & 1;
      try {
        gemm(g, o);
      } catch (const Error&) {
      }
      if (with_plan) sparsek_plan_run(plan, &ga, nullptr);  // the plan owns its pattern: runs
    }
  }
  if (plan) {
    if (sparsek_plan_destroy(plan) != SPARSEK_OK) finding("destroying a live plan failed");
    if (r.u8() & 1) {
      if (sparsek_plan_run(plan, &ga, nullptr) != SPARSEK_INVALID_ARGUMENT) finding("a destroyed plan ran");
      if (sparsek_plan_destroy(plan) != SPARSEK_INVALID_ARGUMENT) finding("a plan was destroyed twice");
      count(kPlanMisuse, true);
    }
  }
}

void fuzz_validate(Reader& r) {
  Sparse sp = make_sparse(r, enum_field(r, 3), r.u8() < 250 ? 0 : int(r.u32()));
  if (sp.skip) return;
  const sparsek_status st = sparsek_bsr_validate(&sp.s);
  count(kValidate, st != SPARSEK_OK);
  if (st != SPARSEK_OK && st != SPARSEK_INVALID_ARGUMENT && st != SPARSEK_NO_DEVICE)
    finding("sparsek_bsr_validate returned " + std::to_string(int(st)));
  // What validation accepts, the oracle can walk (it trusts the invariants without checking).
  GemmArgs g;
  g.sparse = to_view(sp.s);
  if (st == SPARSEK_OK && g.sparse.memory == Memory::host && g.sparse.dtype == DType::f32 && sp.s.rows <= 4096 &&
      sp.s.cols <= 4096) {
    std::vector<float> b(size_t(std::max<int64_t>(sp.s.cols, 1)), 1.f), c(size_t(std::max<int64_t>(sp.s.rows, 1)));
    g.b = {b.data(), sp.s.cols, 1, 1, Layout::row_major, DType::f32, Memory::host};
    g.c = {c.data(), sp.s.rows, 1, 1, Layout::row_major, DType::f32, Memory::host};
    oracle(g);
  }
}

void fuzz_cache(Reader& r) {
  std::string state;
  const std::vector<TuneEntry> e = tune_detail::read_cache_text(r.rest(), &state);
  count(kCache, state != "ok");
  if (state.empty()) finding("the cache reader gave no state");
  if (state != "ok" && !e.empty()) finding("an ignored cache file gave entries");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Tuning off: a product must not read the developer's cache; warnings would flood the log.
  setenv("SPARSEK_TUNE", "off", 1);
  if (const char* e = std::getenv("SPARSEK_FUZZ_STATS"); e && std::string(e) == "1") std::atexit(print_counts);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  switch (r.u8() % 4) {
    case 0: fuzz_product(r, false); break;
    case 1: fuzz_product(r, true); break;
    case 2: fuzz_validate(r); break;
    default: fuzz_cache(r); break;
  }
  // The one-shot plan cache keeps plans between calls: empty it, so that every input frees what it
  // allocated (and the leak checker has nothing to chase but real leaks).
  clear_one_shot_plan_cache();
  return 0;
}
