// libFuzzer harness (built with ASan + UBSan by tests/fuzz/CMakeLists.txt) over block-sparse
// attention and the top-k gate through the C API, on the CPU backend.
//
// The input's first byte picks the entry point; the rest is read field by field (a field past the
// end reads as 0). As in fuzz_sparsek.cpp the harness is a careful caller: every array holds as
// many elements as its description says (or the input is skipped), so an ASan report is the
// library's. Beyond "no crash, no sanitizer report, no hang", it checks:
//   - every refusal has a message and a known status, and none is an internal error;
//   - an output over an input, an output whose positions share elements (stride 0), and a layout
//     whose contents break the rules are refused;
//   - an accepted forward equals the fp64 reference (attention_oracle): O and LSE;
//   - an accepted backward from the forward's LSE and O matches the fp64 backward reference within
//     the rounding of those two (the terms' magnitudes, attention_backward_oracle's mag_*); with
//     deterministic a row whose LSE is -inf gets dq = 0 and a row whose LSE is NaN a NaN dq row;
//   - plans (forward and backward) run on a layout edited in place (any int32 values) neither
//     crash nor read out of bounds;
//   - paged decode attention (host memory, C++ API): every refusal names what it refuses and is
//     not an internal error; an accepted call equals the fp64 decode oracle (O, and LSE; a row
//     that sees nothing has O = 0, LSE = -inf); a plan run on index arrays edited after plan()
//     (any int32 values) neither crashes nor reads out of bounds;
//   - context-parallel attention with 1-4 ranks in this process (host memory), on a problem
//     attention() ran: planned (or refused as unsupported: causal cross-attention, a rank with rows
//     and no key/value block at all), run on packed shards, its O and LSE within the rounding of
//     the merge of attention()'s; the backward runs on them;
//   - an accepted gate gives a well-formed layout: counts in [0, kmax], indices ascending, unique,
//     in range and allowed (causal, candidates), the allowed sink and local blocks kept, at most
//     topk others, zeros past the count; scores -inf where a block is not allowed; a broadcast key
//     sequence too long for any machine's scratch is refused by name.
// Work per input is bounded (B * Hq <= 4, sequences <= 160, D 64 or 128; the fp64 references only
// for problems of at most kOracleWork score products).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "capi/capi_internal.hpp"
#include "cpu/oracle.hpp"
#include "format/attention_internal.hpp"
#include "fuzz_common.hpp"
#include "plan/gate_internal.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/decode.hpp"
#include "sparsek/distributed.hpp"
#include "sparsek/sparsek.h"

namespace {

using namespace sparsek;
using namespace fuzz;

struct Count {
  const char* name;
  long calls = 0, refused = 0, checked = 0;
};
Count g_counts[] = {{"sparsek_attention"},
                    {"sparsek_attention_plan_create/run"},
                    {"plan run on an edited layout"},
                    {"sparsek_attention_backward"},
                    {"backward plan on an edited layout"},
                    {"sparsek_gate"},
                    {"decode_attention (paged)"},
                    {"decode plan run on edited indices"},
                    {"context-parallel ranks (host)"},
                    {"packed sequences (one-shot forward)"},
                    {"sparsek_gate on packed sequences"}};
enum { kForward, kPlan, kEdited, kBackward, kBackwardEdited, kGate, kDecode, kDecodeEdited, kCp, kPacked, kGatePacked };
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

// The statuses a host-memory call may return, with a message when it is not ok.
void check_status(sparsek_status st, const char* call) {
  if (st != SPARSEK_OK && std::strlen(sparsek_last_error()) == 0) finding(std::string(call) + ": a refusal without a message");
  if (st == SPARSEK_INTERNAL) finding(std::string(call) + ": an internal error: " + sparsek_last_error());
  if (st != SPARSEK_OK && st != SPARSEK_INVALID_ARGUMENT && st != SPARSEK_UNSUPPORTED && st != SPARSEK_NO_DEVICE)
    finding(std::string(call) + ": status " + std::to_string(int(st)));
}

std::string num(double x) {
  char t[32];
  std::snprintf(t, sizeof t, "%.9g", x);
  return t;
}

size_t elem_size(int dtype) { return dtype == 0 ? 4 : 2; }
bool valid_dtype(int t) { return t >= 0 && t <= 2; }

// A host tensor: its description and storage of exactly its extent.
struct Tensor {
  sparsek_tensor4 t{};
  std::vector<uint8_t> store;
  bool skip = false;  // an extent the harness does not allocate
};
constexpr int64_t kMaxBytes = 1 << 20;

// [b, h, s, d] in `dtype`: packed, [b, s, h, d] order, or (inputs only) broadcast along s.
// Values: multiples of 1/4 (exact in every dtype).
Tensor make_tensor(Reader& r, int64_t b, int64_t h, int64_t s, int64_t d, int dtype, bool input) {
  Tensor x;
  x.t.b = b, x.t.h = h, x.t.s = s, x.t.d = d;
  put_enum(x.t.dtype, dtype);
  put_enum(x.t.memory, 0);
  const uint8_t order = r.u8();
  const bool bshd = order % 4 == 1, broadcast = order % 4 == 2 && input;
  x.t.stride_s = broadcast ? 0 : bshd ? h * d : d;
  x.t.stride_h = bshd ? d : (broadcast ? 1 : s) * d;
  x.t.stride_b = h * (broadcast ? 1 : s) * d;
  if (order >= 252) x.t.stride_s = r.i64() % 4096;  // any stride: negative, overlapping, ...
  if (!valid_dtype(dtype) || b < 1 || h < 1 || s < 1 || d < 1 || x.t.stride_s < 0) {
    x.store.assign(64, 0);
    x.t.data = x.store.data();
    return x;
  }
  const __int128 span = __int128(b - 1) * x.t.stride_b + __int128(h - 1) * x.t.stride_h +
                        __int128(s - 1) * x.t.stride_s + d;
  if (span * __int128(elem_size(dtype)) > kMaxBytes) {
    x.skip = true;
    return x;
  }
  x.store.assign(size_t(span) * elem_size(dtype), 0);
  // Values from a generator seeded by the input (one field, not one per element: the fields
  // after the tensors must still come from the input).
  uint64_t state = 0x9e3779b97f4a7c15ull ^ r.u32();
  const int spread = 1 + r.u8() % 9;  // values in {-spread .. spread} / 4
  for (int64_t i = 0; i < int64_t(span); ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    store_from_float(x.store.data(), DType(dtype), i, float(int(state % uint64_t(2 * spread + 1)) - spread) / 4.f);
  }
  x.t.data = x.store.data();
  return x;
}

// A layout for q blocks x key blocks: rows from bit masks, an optional disjoint full list, then
// optional damage (a count or an index set to any int32).
struct Layout {
  sparsek_attention_layout l{};
  std::vector<int32_t> num, idx, fnum, fidx;
  bool damaged = false;
  bool skip = false;
};
Layout make_layout(Reader& r, int64_t B, int64_t Hq, int64_t Hkv, int64_t mq, int64_t nk, int block) {
  Layout x;
  const uint8_t shape = r.u8();
  x.l.batch = shape & 1 ? B : 1;
  x.l.heads = (shape >> 1) % 3 == 0 ? 1 : (shape >> 1) % 3 == 1 ? Hq : Hkv;
  x.l.q_blocks = mq;
  if (shape >= 250) x.l.q_blocks = mq + (shape % 2 ? 1 : -1);
  if (shape == 249) x.l.heads = r.u8();
  x.l.kmax = std::min<int64_t>(r.u8() % (nk + 2), 8);
  const bool full = r.u8() & 1;
  x.l.full_kmax = full ? std::min<int64_t>(r.u8() % (nk + 2), 8) : 0;
  x.l.block_q = x.l.block_kv = block;
  if (r.u8() >= 250) x.l.block_kv = block == 64 ? 128 : 64;
  put_enum(x.l.memory, r.u8() < 252 ? 0 : int(r.u32()));
  const __int128 rows = __int128(std::max<int64_t>(x.l.batch, 0)) * std::max<int64_t>(x.l.heads, 0) *
                        std::max<int64_t>(x.l.q_blocks, 0);
  if (rows > 4096) {
    x.skip = true;
    return x;
  }
  x.num.assign(size_t(rows), 0);
  x.idx.assign(size_t(rows * x.l.kmax), 0);
  if (full) {
    x.fnum.assign(size_t(rows), 0);
    x.fidx.assign(size_t(rows * x.l.full_kmax), 0);
  }
  for (int64_t row = 0; row < int64_t(rows); ++row) {
    const uint32_t mask = r.u8() | uint32_t(r.u8()) << 8, to_full = r.u8();
    for (int64_t j = 0; j < std::min<int64_t>(nk, 16); ++j) {
      if (!(mask >> j & 1)) continue;
      if (full && to_full >> (j % 8) & 1) {
        if (x.fnum[size_t(row)] < x.l.full_kmax) x.fidx[size_t(row * x.l.full_kmax + x.fnum[size_t(row)]++)] = int32_t(j);
      } else if (x.num[size_t(row)] < x.l.kmax) {
        x.idx[size_t(row * x.l.kmax + x.num[size_t(row)]++)] = int32_t(j);
      }
    }
  }
  for (int e = r.u8() >= 200 ? 1 + r.u8() % 3 : 0; e > 0; --e) {
    std::vector<int32_t>* a[4] = {&x.num, &x.idx, &x.fnum, &x.fidx};
    std::vector<int32_t>& v = *a[r.u8() % 4];
    if (v.empty()) continue;
    const uint8_t kind = r.u8();
    v[r.u8() % v.size()] = kind < 128 ? int32_t(r.u32()) : int32_t(kind % 20) - 4;
    x.damaged = true;
  }
  x.l.kv_num_blocks = x.num.empty() ? nullptr : x.num.data();
  x.l.kv_indices = x.idx.empty() ? nullptr : x.idx.data();
  x.l.full_kv_num_blocks = full ? x.fnum.data() : nullptr;
  x.l.full_kv_indices = full ? (x.fidx.empty() ? x.fnum.data() : x.fidx.data()) : nullptr;
  return x;
}

// Edits the layout's contents in place: any int32 values, the arrays as they are.
void edit_layout(Reader& r, Layout& x) {
  for (int e = 1 + r.u8() % 4; e > 0; --e) {
    std::vector<int32_t>* a[4] = {&x.num, &x.idx, &x.fnum, &x.fidx};
    std::vector<int32_t>& v = *a[r.u8() % 4];
    if (!v.empty()) v[r.u8() % v.size()] = int32_t(r.u32());
  }
}

const float kScales[] = {0.f, 0.125f, 1.f, -0.5f, 1e-3f, 30.f, NAN, INFINITY};

// One attention problem: shapes, tensors, layout, causal, scale.
struct Problem {
  int64_t B = 1, Hq = 1, Hkv = 1, Sq = 1, Skv = 1, D = 64;
  int block = 64, dtype = 0;
  Tensor q, k, v, o;
  std::vector<float> lse;
  Layout layout;
  sparsek_attention_args args{};
  bool skip = false;
  bool must_refuse = false;  // an output over an input, elements shared, or packed with q.s != k.s
  std::vector<int32_t> cu;   // packed sequences' offsets (empty: none)
};

// A sequence length: mostly up to 48 (one block and a tail), sometimes up to 160 (several blocks),
// rarely 0 or negative.
int64_t seq(Reader& r) {
  const uint8_t b = r.u8();
  return b < 216 ? 1 + b % 48 : b < 252 ? 49 + b % 112 : int64_t(r.u32() % 4) - 2;
}

void make_problem(Reader& r, Problem& p) {
  const uint8_t shape = r.u8();
  p.B = 1 + shape % 2;
  p.Hkv = 1 + (shape >> 1) % 2;
  p.Hq = p.Hkv * (1 + (shape >> 2) % 2);
  if (p.B * p.Hq > 4) p.B = 1;
  if (shape >= 252) p.Hq += 1;  // not a multiple of Hkv (or a second query head)
  const uint8_t db = r.u8();
  p.D = db < 200 ? 64 : db < 248 ? 128 : int64_t(r.u32() % 200);
  p.block = r.u8() < 200 ? 64 : (r.u8() < 250 ? 128 : int(r.u32() % 256));
  p.Sq = seq(r);
  p.Skv = seq(r);
  const uint8_t tb = r.u8();
  p.dtype = tb < 160 ? 0 : tb < 205 ? 1 : tb < 250 ? 2 : int(r.u32());
  p.q = make_tensor(r, p.B, p.Hq, p.Sq, p.D, p.dtype, true);
  p.k = make_tensor(r, p.B, p.Hkv, p.Skv, p.D, p.dtype, true);
  p.v = make_tensor(r, p.B, p.Hkv, p.Skv, p.D, p.dtype, true);
  p.o = make_tensor(r, p.B, p.Hq, p.Sq, p.D, p.dtype, false);
  if (p.q.skip || p.k.skip || p.v.skip || p.o.skip) {
    p.skip = true;
    return;
  }
  const int64_t blk = p.block > 0 ? p.block : 64;
  const int64_t mq = p.Sq > 0 ? (p.Sq + blk - 1) / blk : 0, nk = p.Skv > 0 ? (p.Skv + blk - 1) / blk : 0;
  p.layout = make_layout(r, p.B, p.Hq, p.Hkv, mq, nk, p.block);
  if (p.layout.skip) {
    p.skip = true;
    return;
  }
  p.lse.assign(size_t(std::max<int64_t>(p.B * p.Hq * std::max<int64_t>(p.Sq, 0), 1)), NAN);
  sparsek_attention_args& a = p.args;
  a.q = p.q.t, a.k = p.k.t, a.v = p.v.t, a.o = p.o.t;
  a.lse = r.u8() < 230 ? p.lse.data() : nullptr;
  a.layout = p.layout.l;
  a.causal = r.u8() & 1;
  if (r.u8() >= 252) a.causal = int32_t(r.u32());
  const uint8_t sb = r.u8();
  a.scale = sb < 200 ? 0.f : kScales[sb % 8];
  // Aliasing: o over an input (must be refused).
  const uint8_t alias = r.u8();
  if (alias >= 245) {
    void* target = alias % 3 == 0 ? p.q.t.data : alias % 3 == 1 ? p.k.t.data : static_cast<void*>(p.layout.num.data());
    if (target && p.o.store.size()) {
      a.o.data = target;
      p.must_refuse = true;
    }
  }
  // An output whose positions share elements (stride 0 along s) must be refused too.
  if (p.Sq > 1 && p.o.t.stride_s == 0) p.must_refuse = true;
  if (a.lse && alias >= 240 && alias < 245) {
    a.lse = reinterpret_cast<float*>(p.o.store.data());  // lse over o
    p.must_refuse = p.o.store.size() > 0;
  }
  // Packed sequences (one batch row): up to 5 sequences cut at random rows, sometimes an offset
  // broken (refused by the one-shot call, read safely by a plan's run); q.s != k.s must be refused.
  if (p.B == 1 && p.Sq > 0 && r.u8() >= 224) {
    const int n = 1 + r.u8() % 5;
    p.cu.assign(1, 0);
    for (int i = 1; i < n; ++i) p.cu.push_back(int32_t(r.u8() % (p.Sq + 1)));
    p.cu.push_back(int32_t(p.Sq));
    std::sort(p.cu.begin(), p.cu.end());
    if (r.u8() >= 240) p.cu[size_t(r.u8() % (n + 1))] = int32_t(r.u32());
    a.cu_seqlens = p.cu.data();
    a.num_seqs = n;
    if (p.Sq != p.Skv) p.must_refuse = true;
  }
}

// The C++ args of the C ones, converted as the C API converts them.
using capi::to_layout;
using capi::to_view;
AttentionArgs cpp_args(const sparsek_attention_args& a) {
  AttentionArgs x;
  x.q = to_view(a.q), x.k = to_view(a.k), x.v = to_view(a.v), x.o = to_view(a.o);
  x.lse = a.lse;
  x.layout = to_layout(a.layout);
  x.causal = a.causal != 0;
  x.scale = a.scale;
  x.cu_seqlens = a.cu_seqlens, x.num_seqs = a.num_seqs;
  return x;
}

// The fp64 references run on problems up to this many (row, key, d) products: they are slow by
// design, and a fuzzer must keep its executions fast.
constexpr int64_t kOracleWork = int64_t(1) << 20;
bool oracle_affordable(const Problem& p) { return p.B * p.Hq * p.Sq * p.Skv * p.D <= kOracleWork; }

double tol_of(int dtype) { return dtype == 0 ? 1e-5 : dtype == 1 ? 2e-3 : 1.6e-2; }

// The accepted forward's O and LSE against the fp64 reference.
void check_forward(const Problem& p) {
  const AttentionArgs a = cpp_args(p.args);
  const AttentionReference ref = attention_oracle(a);
  const double tol = tol_of(p.dtype);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t s = 0; s < p.Sq; ++s) {
        const int64_t row = (b * p.Hq + h) * p.Sq + s;
        for (int64_t d = 0; d < p.D; ++d) {
          const double got = load_as_float(a.o.data, a.o.dtype, a.o.index(b, h, s, d)), want = ref.o[size_t(row * p.D + d)];
          if (!(std::fabs(got - want) <= tol * (1 + std::fabs(want))))
            finding("O[" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(s) + ", " +
                    std::to_string(d) + "] = " + num(got) + ", reference " + num(want));
        }
        if (!a.lse) continue;
        const double got = a.lse[row], want = ref.lse[size_t(row)];
        const bool same = std::isinf(want) ? got == want : std::fabs(got - want) <= 1e-5 * (1 + std::fabs(want));
        if (!same) finding("LSE[" + std::to_string(row) + "] = " + num(got) + ", reference " + num(want));
      }
}

void fuzz_forward(Reader& r, bool with_plan) {
  Problem p;
  make_problem(r, p);
  if (p.skip) return;
  sparsek_status st;
  sparsek_attention_plan plan = nullptr;
  if (with_plan) {
    st = sparsek_attention_plan_create(&plan, &p.args, r.u8() < 250 ? nullptr : "cpu");
    check_status(st, "sparsek_attention_plan_create");
    if (st == SPARSEK_OK) {
      if (p.must_refuse) finding("a plan accepted args it must refuse (an output over an input, shared elements, or packed sequences with q.s != k.s)");
      // The plan does not read the layout's contents: check them here, as the one-shot call would.
      bool valid = true;
      try {
        validate(cpp_args(p.args), true);
      } catch (const Error&) {
        valid = false;
      }
      st = sparsek_attention_plan_run(plan, &p.args, nullptr);
      check_status(st, "sparsek_attention_plan_run");
      if (st != SPARSEK_OK) finding("a plan refused to run the args it was made for");
      count(kPlan, false, valid && oracle_affordable(p));
      if (valid && oracle_affordable(p)) check_forward(p);
      // Contents edited in place: undefined values, never a crash or a read out of bounds.
      edit_layout(r, p.layout);
      st = sparsek_attention_plan_run(plan, &p.args, nullptr);
      check_status(st, "sparsek_attention_plan_run (edited layout)");
      count(kEdited, st != SPARSEK_OK);
    } else {
      count(kPlan, true);
    }
    if (sparsek_attention_plan_destroy(plan) != SPARSEK_OK) finding("destroying a live attention plan failed");
    return;
  }
  st = sparsek_attention(&p.args, nullptr);
  check_status(st, "sparsek_attention");
  count(kForward, st != SPARSEK_OK, st == SPARSEK_OK && oracle_affordable(p));
  if (!p.cu.empty()) count(kPacked, st != SPARSEK_OK, st == SPARSEK_OK && oracle_affordable(p));
  if (st != SPARSEK_OK) return;
  if (p.must_refuse) finding("args that must be refused were accepted (an output over an input, shared elements, or packed sequences with q.s != k.s)");
  if (p.layout.damaged) {  // accepted damage must have left a valid layout
    try {
      validate(cpp_args(p.args), true);
    } catch (const Error& e) {
      finding(std::string("a layout validate() refuses was accepted: ") + e.what());
    }
  }
  if (oracle_affordable(p)) check_forward(p);
}

// ---- the backward ----

void fuzz_backward(Reader& r) {
  Problem p;
  make_problem(r, p);
  if (p.skip || !p.args.lse || p.must_refuse) return;
  if (sparsek_attention(&p.args, nullptr) != SPARSEK_OK) return;  // O and LSE of a valid forward
  const int dtype = p.dtype;
  Tensor dout = make_tensor(r, p.B, p.Hq, p.Sq, p.D, dtype, true);
  Tensor dq = make_tensor(r, p.B, p.Hq, p.Sq, p.D, dtype, false);
  Tensor dk = make_tensor(r, p.B, p.Hkv, p.Skv, p.D, dtype, false);
  Tensor dv = make_tensor(r, p.B, p.Hkv, p.Skv, p.D, dtype, false);
  if (dout.skip || dq.skip || dk.skip || dv.skip) return;
  for (Tensor* t : {&dq, &dk, &dv}) std::fill(t->store.begin(), t->store.end(), 0xFF);  // poison: NaN
  sparsek_attention_backward_args g{};
  g.forward = p.args;
  g.dout = dout.t, g.dq = dq.t, g.dk = dk.t, g.dv = dv.t;
  g.nondeterministic = r.u8() >= 192;
  // The LSE as the forward gave it, or with rows set to -inf, NaN, +inf or another value.
  const uint8_t lse_mode = r.u8();
  std::vector<int64_t> set_rows;
  if (lse_mode >= 160) {
    for (int e = 1 + r.u8() % 3; e > 0; --e) {
      const int64_t row = r.u8() % int64_t(p.lse.size());
      const uint8_t w = r.u8() % 4;
      p.lse[size_t(row)] = w == 0 ? -INFINITY : w == 1 ? NAN : w == 2 ? INFINITY : float(int(r.u8()) - 128);
      set_rows.push_back(row);
    }
  }
  const bool with_plan = r.u8() >= 200;
  sparsek_status st;
  if (with_plan) {
    sparsek_attention_backward_plan plan = nullptr;
    st = sparsek_attention_backward_plan_create(&plan, &g, nullptr);
    check_status(st, "sparsek_attention_backward_plan_create");
    if (st == SPARSEK_OK) {
      edit_layout(r, p.layout);  // contents edited in place: the run must stay in bounds
      st = sparsek_attention_backward_plan_run(plan, &g, nullptr);
      check_status(st, "sparsek_attention_backward_plan_run (edited layout)");
    }
    count(kBackwardEdited, st != SPARSEK_OK);
    sparsek_attention_backward_plan_destroy(plan);
    return;
  }
  st = sparsek_attention_backward(&g, nullptr);
  check_status(st, "sparsek_attention_backward");
  count(kBackward, st != SPARSEK_OK, st == SPARSEK_OK && (!set_rows.empty() || oracle_affordable(p)));
  if (st != SPARSEK_OK) return;
  AttentionBackwardArgs ba;
  ba.forward = cpp_args(p.args);
  ba.dout = to_view(dout.t), ba.dq = to_view(dq.t), ba.dk = to_view(dk.t), ba.dv = to_view(dv.t);
  const Tensor4View& vq = ba.dq;
  if (!set_rows.empty()) {
    // The LSE rules, deterministic: -inf -> dq = 0; NaN -> a NaN dq row.
    if (g.nondeterministic) return;
    for (int64_t row : set_rows) {
      const float l = p.lse[size_t(row)];
      const int64_t s = row % p.Sq, h = row / p.Sq % p.Hq, b = row / (p.Sq * p.Hq);
      for (int64_t d = 0; d < p.D; ++d) {
        const float x = load_as_float(vq.data, vq.dtype, vq.index(b, h, s, d));
        if (l == -INFINITY && x != 0.f) finding("dq of a row whose LSE is -inf is " + std::to_string(x));
        if (std::isnan(l) && !std::isnan(x)) finding("dq of a row whose LSE is NaN is " + std::to_string(x));
      }
    }
    return;
  }
  // The forward's own LSE and O: the fp64 backward reference, within the rounding of LSE (f32) and
  // O (the dtype): u_in times the terms' magnitude, plus the output's rounding.
  if (!oracle_affordable(p)) return;
  const AttentionBackwardReference ref = attention_backward_oracle(ba);
  float max_lse = 0;
  for (float l : p.lse)
    if (std::isfinite(l)) max_lse = std::max(max_lse, std::fabs(l));
  const double u_out = dtype == 0 ? 0x1p-24 : dtype == 1 ? 0x1p-11 : 0x1p-8;
  const double u_in = 4 * (0x1p-24 * (8 + max_lse) + (dtype == 0 ? 0.0 : 2 * u_out));
  const double step = dtype == 1 ? 0x1p-24 : 0x1p-126;  // f16 rounds to a subnormal step below 2^-14
  auto check = [&](const Tensor& t, const std::vector<double>& want, const std::vector<double>& mag, const char* name,
                   int64_t H, int64_t S) {
    const Tensor4View v = to_view(t.t);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t d = 0; d < p.D; ++d) {
            const size_t e = size_t(((b * H + h) * S + s) * p.D + d);
            const double got = load_as_float(v.data, v.dtype, v.index(b, h, s, d));
            if (!(std::fabs(got - want[e]) <= 2 * u_out * std::fabs(want[e]) + u_in * mag[e] + step))
              finding(std::string(name) + "[" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(s) +
                      ", " + std::to_string(d) + "] = " + num(got) + ", reference " + num(want[e]) +
                      " (magnitude " + num(mag[e]) + ")");
          }
  };
  check(dq, ref.dq, ref.mag_dq, "dq", p.Hq, p.Sq);
  check(dk, ref.dk, ref.mag_dk, "dk", p.Hkv, p.Skv);
  check(dv, ref.dv, ref.mag_dv, "dv", p.Hkv, p.Skv);
}

// ---- the gate ----

// With packed sequences, the key blocks query block i may select: from the block holding the start
// of its first row's sequence to the one holding the end of its last row's. A linear scan (the
// library searches): row r's sequence is the last x < n with cu[x] <= r.
void sequence_blocks(const std::vector<int32_t>& cu, int64_t i, int64_t blk, int64_t T, int64_t& first, int64_t& end) {
  auto seq = [&](int64_t row) {
    size_t s = 0;
    for (size_t x = 0; x + 1 < cu.size(); ++x)
      if (cu[x] <= row) s = x;
    return s;
  };
  const int64_t r0 = i * blk, r1 = std::min((i + 1) * blk, T) - 1;
  first = cu[seq(r0)] / blk;
  end = (int64_t(cu[seq(r1) + 1]) + blk - 1) / blk;
}

void fuzz_gate(Reader& r) {
  Problem p;  // q, k and a candidate layout; v and o unused
  make_problem(r, p);
  if (p.skip) return;
  sparsek_gate_args g{};
  g.q = p.q.t;
  g.k = p.k.t;
  // Rarely: a key sequence broadcast over 2^40 + x rows, whose pooled keys no machine holds.
  const bool huge = r.u8() >= 250 && p.k.t.d > 0;
  if (huge) g.k.s = (int64_t(1) << 40) + r.u8(), g.k.stride_s = 0;
  g.topk = int32_t(small_or_raw(r, 6));
  g.sink = int32_t(small_or_raw(r, 3));
  g.local = int32_t(small_or_raw(r, 3));
  g.block = p.block;
  g.causal = r.u8() & 1;
  const uint8_t sb = r.u8();
  g.scale = sb < 200 ? 0.f : kScales[sb % 8];
  const bool cand = r.u8() >= 160;
  if (cand) g.candidates = &p.args.layout;
  // Packed sequences (one batch row): the problem's offsets, or up to 5 sequences cut at random
  // rows here; sometimes an offset broken, and q.s != k.s: both must be refused.
  std::vector<int32_t> cu = p.cu;
  if (cu.empty() && p.B == 1 && p.Sq > 0 && r.u8() >= 128) {
    const int n = 1 + r.u8() % 5;
    cu.assign(1, 0);
    for (int i = 1; i < n; ++i) cu.push_back(int32_t(r.u8() % (p.Sq + 1)));
    cu.push_back(int32_t(p.Sq));
    std::sort(cu.begin(), cu.end());
    if (r.u8() >= 240) cu[size_t(r.u8() % (n + 1))] = int32_t(r.u32());
  }
  const bool packed = !cu.empty() && !huge;
  if (packed) g.cu_seqlens = cu.data(), g.num_seqs = int64_t(cu.size()) - 1;
  const int64_t blk = g.block == 64 || g.block == 128 ? g.block : 64;
  const int64_t mq = p.Sq > 0 ? (p.Sq + blk - 1) / blk : 0, nk = g.k.s > 0 ? (g.k.s + blk - 1) / blk : 0;
  const int64_t hkv = std::max<int64_t>(p.Hkv, 0), rows = std::max<int64_t>(p.B, 0) * hkv * mq;
  const int64_t budget = std::max<int64_t>(0, int64_t(g.topk) + g.sink + g.local);
  g.kmax = std::min(nk, budget) + r.u8() % 3 - (r.u8() >= 250 ? 1 : 0);
  const int64_t nk_store = huge ? 0 : nk;
  if (rows > 4096 || std::max<int64_t>(g.kmax, 0) > 64) return;
  std::vector<int32_t> num(size_t(rows), -7), idx(size_t(rows * std::max<int64_t>(g.kmax, 0)), -7);
  std::vector<float> scores, given;
  if (r.u8() & 1 && !huge) scores.assign(size_t(rows * nk_store), NAN);
  if (r.u8() >= 200 && !huge) {
    given.resize(size_t(rows * nk_store));
    const float special[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f};
    for (float& x : given) {
      const uint8_t b = r.u8();
      x = b >= 250 ? special[b % 5] : float(int(b % 17) - 8);
    }
    g.given_scores = given.data();
  }
  g.kv_num_blocks = num.data();
  g.kv_indices = idx.empty() ? nullptr : idx.data();
  g.scores = scores.empty() ? nullptr : scores.data();
  const sparsek_status st = sparsek_gate(&g, nullptr);
  check_status(st, "sparsek_gate");
  count(kGate, st != SPARSEK_OK, st == SPARSEK_OK);
  if (packed) count(kGatePacked, st != SPARSEK_OK, st == SPARSEK_OK);
  if (huge) {
    if (st == SPARSEK_OK) finding("a key sequence of 2^40 broadcast rows was accepted");
    // Refused for its scratch (not for another fault of the input): the argument is named.
    if (std::strstr(sparsek_last_error(), "scratch") && !std::strstr(sparsek_last_error(), "k.s = "))
      finding("the scratch refusal does not name k.s");
    return;
  }
  if (packed && st == SPARSEK_OK) {
    bool ok = cu.front() == 0 && cu.back() == p.Sq && p.Sq == g.k.s;
    for (size_t x = 1; x < cu.size(); ++x) ok = ok && cu[x - 1] <= cu[x];
    if (!ok) finding("the gate accepted packed sequences it must refuse (offsets broken, or q.s != k.s)");
  }
  if (st != SPARSEK_OK) return;
  // The rules of a well-formed selection, row by row (b, g, i).
  const AttentionArgs a = cpp_args(p.args);
  std::vector<char> allowed(static_cast<size_t>(nk));
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t i = row % mq, gk = row / mq % hkv, b = row / (mq * hkv);
    const int32_t n = num[size_t(row)];
    if (n < 0 || n > g.kmax) finding("gate count " + std::to_string(n) + " outside [0, kmax]");
    // Allowed blocks: causal, and the candidates' union over the group (as attention.hpp says).
    std::fill(allowed.begin(), allowed.end(), char(!cand));
    if (cand) {
      const AttentionLayout& c = a.layout;
      const int64_t G = p.Hq / hkv, cb = c.batch == 1 ? 0 : b;
      const int64_t h0 = c.heads == hkv ? gk : c.heads == p.Hq ? gk * G : 0;
      const int64_t nh = c.heads == hkv ? 1 : c.heads == p.Hq ? G : 1;
      for (int64_t h = h0; h < h0 + nh; ++h) {
        const int64_t cr = (cb * c.heads + h) * c.q_blocks + i;
        for (int32_t e = 0; e < c.kv_num_blocks[cr]; ++e) allowed[size_t(c.kv_indices[cr * c.kmax + e])] = 1;
        for (int32_t e = 0; c.has_full() && e < c.full_kv_num_blocks[cr]; ++e)
          allowed[size_t(c.full_kv_indices[cr * c.full_kmax + e])] = 1;
      }
    }
    if (g.causal)
      for (int64_t j = 0; j < nk; ++j)
        if (!gate_causal_allows(i, j, blk, p.Sq)) allowed[size_t(j)] = 0;
    // Packed: only the blocks holding keys of the block's rows' sequences; sinks count from the first.
    int64_t first = 0, end = nk;
    if (packed) sequence_blocks(cu, i, blk, p.Sq, first, end);
    for (int64_t j = 0; j < nk; ++j)
      if (j < first || j >= end) allowed[size_t(j)] = 0;
    int64_t always = 0, others = 0;
    std::vector<char> chosen(size_t(nk), 0);
    for (int32_t e = 0; e < n; ++e) {
      const int32_t j = idx[size_t(row * g.kmax + e)];
      if (j < 0 || j >= nk) finding("gate index " + std::to_string(j) + " out of range");
      if (e > 0 && j <= idx[size_t(row * g.kmax + e - 1)]) finding("gate indices not ascending");
      if (!allowed[size_t(j)]) finding("gate chose block " + std::to_string(j) + ", which is not allowed");
      chosen[size_t(j)] = 1;
      gate_always_on(i, j, g.sink, g.local, first) ? ++always : ++others;
    }
    for (int64_t e = n; e < g.kmax; ++e)
      if (idx[size_t(row * g.kmax + e)] != 0) finding("gate entry past the count is not 0");
    for (int64_t j = 0; j < nk; ++j)
      if (allowed[size_t(j)] && gate_always_on(i, j, g.sink, g.local, first) && !chosen[size_t(j)])
        finding("an allowed sink/local block " + std::to_string(j) + " was dropped");
    if (others > g.topk) finding("gate kept more than topk other blocks");
    for (int64_t j = 0; !scores.empty() && j < nk; ++j)
      if (!allowed[size_t(j)] && scores[size_t(row * nk + j)] != -INFINITY) finding("a score of a block not allowed is not -inf");
  }
}

// ---------------------------------------------------------------- paged decode attention

// A refusal from the C++ API: a known status with a message, never an internal error.
void check_error(const Error& e, const char* call) {
  if (std::strlen(e.what()) == 0) finding(std::string(call) + ": a refusal without a message");
  if (e.status() == Status::internal) finding(std::string(call) + ": an internal error: " + e.what());
}

void fuzz_decode(Reader& r) {
  const int64_t B = 1 + r.u8() % 4, hkv = 1 + r.u8() % 2, g = 1 + r.u8() % 4, hq = hkv * g;
  const uint8_t db = r.u8();
  const int64_t D = db < 240 ? (db % 2 ? 64 : 128) : 8 * (db - 239);  // sometimes not 64/128
  const uint8_t pb = r.u8();
  const int64_t page = pb < 240 ? 16 * (1 + pb % 4) : pb - 236;  // sometimes not a multiple of 16
  const int64_t num_pages = 1 + r.u8() % 12, max_pages = 1 + r.u8() % 6;
  const DType dt = r.u8() % 3 == 0 ? DType::f32 : r.u8() % 2 ? DType::f16 : DType::bf16;
  std::vector<int32_t> n(static_cast<size_t>(B)), cu(static_cast<size_t>(B) + 1, 0), seq(static_cast<size_t>(B));
  std::vector<int32_t> table(static_cast<size_t>(B * max_pages));
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t x = r.u8();
    n[b] = x < 240 ? 1 + x % 4 : x % 18;  // 0 and 17 new tokens sometimes
    cu[b + 1] = cu[b] + n[b];
    seq[b] = int32_t(small_or_raw(r, max_pages * page));
  }
  if (r.u8() >= 250) cu[size_t(r.u8() % (B + 1))] = int32_t(r.u32());  // a broken cu_seqlens_q
  for (auto& t : table) {
    const uint8_t x = r.u8();
    t = x < 240 ? x % num_pages : int32_t(r.u32());
  }
  const bool sel = r.u8() % 2;
  const int64_t kmax = sel ? 1 + r.u8() % max_pages : 0;
  std::vector<int32_t> sidx(static_cast<size_t>(B * hkv * kmax)), scnt(sel ? static_cast<size_t>(B * hkv) : 0);
  for (auto& c : scnt) c = int32_t(small_or_raw(r, kmax));
  for (size_t i = 0; i < sidx.size(); ++i) {  // mostly ascending runs, sometimes anything
    const uint8_t x = r.u8();
    sidx[i] = x < 240 ? int32_t(i % size_t(kmax) + x % 2) : int32_t(r.u32());
  }
  const int64_t T = std::max<int64_t>(cu[size_t(B)], 0);
  if (T > 96 || D > 256) return;  // bounded work (and a broken total: the harness allocates T rows)
  const size_t es = dtype_size(dt);
  std::vector<uint8_t> q(size_t(std::max<int64_t>(T, 1) * hq * D) * es), o(q.size(), 0xFF);
  std::vector<uint8_t> k(size_t(num_pages * page * hkv * D) * es), v(k.size());
  std::vector<float> lse(size_t(std::max<int64_t>(T, 1) * hq), NAN);
  uint32_t seed = r.u32() | 1u;
  auto fill = [&](std::vector<uint8_t>& x) {
    for (size_t i = 0; i < x.size() / es; ++i) {
      seed = seed * 1664525u + 1013904223u;
      store_from_float(x.data(), dt, int64_t(i), float(int((seed >> 24) % 9) - 4) * 0.25f);
    }
  };
  fill(q), fill(k), fill(v);
  DecodeArgs a;
  a.q = TokensView::packed(q.data(), dt, Memory::host, T, hq, D);
  a.o = TokensView::packed(o.data(), dt, Memory::host, T, hq, D);
  a.k = PagedCacheView::packed(k.data(), dt, Memory::host, num_pages, page, hkv, D);
  a.v = PagedCacheView::packed(v.data(), dt, Memory::host, num_pages, page, hkv, D);
  a.lse = lse.data();
  a.page_table = table.data(), a.seq_lens = seq.data(), a.cu_seqlens_q = cu.data();
  if (sel) a.sel_indices = sidx.data(), a.sel_counts = scnt.data();
  a.batch = B, a.max_pages = max_pages, a.sel_kmax = kmax;
  a.index_memory = Memory::host;
  a.causal_new = r.u8() % 4 != 0;
  a.scale = r.u8() % 2 ? 0.f : 0.125f;

  bool accepted = false;
  try {
    decode_attention(a);
    accepted = true;
  } catch (const Error& e) {
    check_error(e, "decode_attention");
  }
  count(kDecode, !accepted, accepted);
  if (accepted) {
    const DecodeReference ref = decode_oracle(a);
    const double tol = dt == DType::f32 ? 1e-4 : dt == DType::f16 ? 4e-3 : 3e-2;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < hq; ++h) {
        const double rl = ref.lse[size_t(t * hq + h)], gl = lse[size_t(t * hq + h)];
        const bool dead = std::isinf(rl) && rl < 0;
        if (dead ? !(std::isinf(gl) && gl < 0) : !(std::abs(gl - rl) <= tol * (1 + std::abs(rl))))
          finding("decode: lse[" + std::to_string(t) + ", " + std::to_string(h) + "] = " + num(gl) + ", want " + num(rl));
        for (int64_t d = 0; d < D; ++d) {
          const double want = dead ? 0.0 : ref.o[size_t((t * hq + h) * D + d)];
          const double got = load_as_float(o.data(), dt, (t * hq + h) * D + d);
          if (!(std::abs(got - want) <= tol * (1 + std::abs(want))))
            finding("decode: o[" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(d) +
                    "] = " + num(got) + ", want " + num(want));
        }
      }
    // A plan, then a run on index arrays edited in place: any int32 values (the contract: wrong
    // values, never a read outside the cache or the arrays).
    try {
      DecodePlan p = plan(a);
      for (auto* arr : {&table, &seq, &cu, &sidx, &scnt})
        for (auto& x : *arr)
          if (r.u8() >= 200) x = int32_t(r.u32());
      run(p, a);
      count(kDecodeEdited, false, true);
    } catch (const Error& e) {
      check_error(e, "decode plan/run on edited indices");
      count(kDecodeEdited, true);
    }
  }
}

// ---- context-parallel attention (ranks in this process, host memory) ----

// Rows [r0, r1) of every (b, h) of a view (any strides), packed, as f32/f16/bf16 bytes.
std::vector<uint8_t> packed_rows(const Tensor4View& t, int64_t r0, int64_t r1) {
  std::vector<uint8_t> out(size_t(std::max<int64_t>(1, t.b * t.h * (r1 - r0) * t.d)) * dtype_size(t.dtype));
  int64_t e = 0;
  for (int64_t b = 0; b < t.b; ++b)
    for (int64_t h = 0; h < t.h; ++h)
      for (int64_t s = r0; s < r1; ++s)
        for (int64_t d = 0; d < t.d; ++d) store_from_float(out.data(), t.dtype, e++, load_as_float(t.data, t.dtype, t.index(b, h, s, d)));
  return out;
}

void fuzz_context_parallel(Reader& r) {
  Problem p;
  make_problem(r, p);
  const int ranks = 1 + r.u8() % 4;
  if (p.skip || p.must_refuse || !p.args.lse) return;
  if (sparsek_attention(&p.args, nullptr) != SPARSEK_OK) return;  // only what attention() runs
  const AttentionArgs whole = cpp_args(p.args);
  std::vector<DistributedAttentionPlan> plans;
  try {
    plans = plan_distributed_attention(whole, ranks);
  } catch (const Error& e) {
    check_error(e, "plan_distributed_attention");
    if (e.status() != Status::unsupported)
      finding(std::string("plan_distributed_attention refused a problem attention() ran: ") + e.what());
    count(kCp, true);
    return;
  }
  const DType dt = whole.q.dtype;
  std::vector<std::vector<uint8_t>> store;  // per rank: q k v o dout dq dk dv
  std::vector<std::vector<float>> lse(static_cast<size_t>(ranks));
  std::vector<AttentionArgs> fwd;
  for (int i = 0; i < ranks; ++i) {
    const auto& pl = plans[size_t(i)];
    const int64_t q0 = pl.q_row_begin(), q1 = pl.q_row_end(), k0 = pl.kv_row_begin(), k1 = pl.kv_row_end();
    store.push_back(packed_rows(whole.q, q0, q1));
    store.push_back(packed_rows(whole.k, k0, k1));
    store.push_back(packed_rows(whole.v, k0, k1));
    store.push_back(std::vector<uint8_t>(store[size_t(i) * 4].size(), 0xFF));  // o: poison (NaN)
    lse[size_t(i)].assign(size_t(std::max<int64_t>(1, p.B * p.Hq * (q1 - q0))), NAN);
  }
  for (int i = 0; i < ranks; ++i) {
    const auto& pl = plans[size_t(i)];
    const int64_t nq = pl.q_row_end() - pl.q_row_begin(), nkv = pl.kv_row_end() - pl.kv_row_begin();
    AttentionArgs a;
    auto view = [&](int j, int64_t h, int64_t rows) {
      return Tensor4View::packed(store[size_t(i) * 4 + size_t(j)].data(), dt, Memory::host, p.B, h, rows, p.D);
    };
    a.q = view(0, p.Hq, nq), a.k = view(1, p.Hkv, nkv), a.v = view(2, p.Hkv, nkv), a.o = view(3, p.Hq, nq);
    a.lse = lse[size_t(i)].data();
    fwd.push_back(a);
  }
  try {
    run(plans, fwd);
  } catch (const Error& e) {
    finding(std::string("a context-parallel plan refused its own shards: ") + e.what());
  }
  const bool checked = oracle_affordable(p);
  count(kCp, false, checked);
  const double tol = 4 * tol_of(p.dtype);
  for (int i = 0; i < ranks; ++i) {
    const auto& pl = plans[size_t(i)];
    const int64_t q0 = pl.q_row_begin(), nq = pl.q_row_end() - q0;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t s = 0; s < nq; ++s) {
          const int64_t row = (b * p.Hq + h) * nq + s;
          const double lw = whole.lse[(b * p.Hq + h) * p.Sq + q0 + s], lg = lse[size_t(i)][size_t(row)];
          if (std::isfinite(lw) && !(std::fabs(lg - lw) <= 1e-4 * (1 + std::fabs(lw))))
            finding("context-parallel LSE on rank " + std::to_string(i) + " row " + std::to_string(row) + " = " + num(lg) +
                    ", attention() " + num(lw));
          if (std::isinf(lw) && lg != lw) finding("context-parallel LSE " + num(lg) + " where attention() gives " + num(lw));
          for (int64_t d = 0; d < p.D; ++d) {
            const double want = load_as_float(whole.o.data, dt, whole.o.index(b, h, q0 + s, d));
            const double got = load_as_float(fwd[size_t(i)].o.data, dt, row * p.D + d);
            if (std::isfinite(want) && std::isfinite(lw) && !(std::fabs(got - want) <= tol * (1 + std::fabs(want))))
              finding("context-parallel O on rank " + std::to_string(i) + " [" + std::to_string(b) + ", " + std::to_string(h) +
                      ", " + std::to_string(q0 + s) + ", " + std::to_string(d) + "] = " + num(got) + ", attention() " + num(want));
          }
        }
  }
  // The backward on those outputs: it must run (values are checked by the C++ tests).
  std::vector<std::vector<uint8_t>> grads;
  std::vector<AttentionBackwardArgs> bwd;
  for (int i = 0; i < ranks; ++i) {
    AttentionBackwardArgs g;
    g.forward = fwd[size_t(i)];
    for (const Tensor4View* t : {&g.forward.q, &g.forward.q, &g.forward.k, &g.forward.v})  // dout, dq, dk, dv
      grads.emplace_back(std::max<size_t>(1, size_t(t->b * t->h * t->s * t->d)) * dtype_size(dt), uint8_t(0x3C));
    const size_t at = size_t(i) * 4;
    auto like = [&](size_t j, const Tensor4View& t) { Tensor4View x = t; x.data = grads[at + j].data(); return x; };
    g.dout = like(0, g.forward.q), g.dq = like(1, g.forward.q), g.dk = like(2, g.forward.k), g.dv = like(3, g.forward.v);
    g.deterministic = r.u8() < 192;
    bwd.push_back(g);
  }
  try {
    run_backward(plans, bwd);
  } catch (const Error& e) {
    finding(std::string("a context-parallel plan refused its own backward shards: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("SPARSEK_TUNE", "off", 1);
  if (const char* e = std::getenv("SPARSEK_FUZZ_STATS"); e && std::string(e) == "1") std::atexit(print_counts);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  const uint8_t which = r.u8();
  switch (which % 4) {
    case 0: which >= 128 ? fuzz_decode(r) : fuzz_forward(r, false); break;
    case 1: which >= 128 ? fuzz_context_parallel(r) : fuzz_forward(r, true); break;
    case 2: fuzz_backward(r); break;
    default: fuzz_gate(r); break;
  }
  return 0;
}
