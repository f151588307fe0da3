// Validation, the variant tables, and the one-shot entry gemm() = plan + run through a small
// in-process plan cache (plan.cpp holds plan()/run()).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <list>
#include <mutex>
#include <sstream>
#include <utility>

#include "core/device.hpp"
#include "format/format_internal.hpp"
#include "plan/backends.hpp"
#include "plan/plan_internal.hpp"
#include "plan/variant.hpp"
#include "sparsek/gemm.hpp"
#include "sparsek/tune.hpp"

namespace sparsek {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }

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

}  // namespace

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

namespace {
const char* sparse_name(const GemmArgs& g) {
  return g.kind == OpKind::dsd ? "A (sparse)" : g.kind == OpKind::dds ? "B (sparse)" : "C (sparse)";
}
}  // namespace

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t ce = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
  if (ce != cudaSuccess) cudaGetLastError();
  return ce == cudaErrorStreamCaptureImplicit || (ce == cudaSuccess && capture != cudaStreamCaptureStatusNone);
}

HostPattern host_pattern(const BsrView& s, bool with_col_idx, void* stream) {
  HostPattern hp;
  if (s.memory == Memory::host) {
    hp.row_ptr = s.row_ptr;
    hp.col_idx = s.nnzb > 0 ? s.col_idx : nullptr;
    return hp;
  }
  // NOTE: the copies below synchronize, which a stream capture cannot contain (CUDA would
  // invalidate the whole capture): refuse before touching anything, saying what to do instead.
  // cudaErrorStreamCaptureImplicit: the legacy stream while another stream captures globally.
  if (stream_is_capturing(stream))
    bad("the stream is being captured into a CUDA graph, but planning a device pattern reads it on the "
        "host (a synchronizing copy the capture cannot contain): plan before the capture (make the plan, "
        "or run the product once) and capture only the runs");
  if (stream)
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize(options.stream)");
  hp.row_ptr_copy.resize(size_t(s.mb() + 1));
  check_cuda(cudaMemcpy(hp.row_ptr_copy.data(), s.row_ptr, hp.row_ptr_copy.size() * 4, cudaMemcpyDeviceToHost),
             "cudaMemcpy(row_ptr to host)");
  hp.row_ptr = hp.row_ptr_copy.data();
  if (with_col_idx && s.nnzb > 0) {
    hp.col_idx_copy.resize(size_t(s.nnzb));
    check_cuda(cudaMemcpy(hp.col_idx_copy.data(), s.col_idx, hp.col_idx_copy.size() * 4, cudaMemcpyDeviceToHost),
               "cudaMemcpy(col_idx to host)");
    hp.col_idx = hp.col_idx_copy.data();
  }
  return hp;
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

PatternTranspose transposed_pattern(const BsrView& s) {
  const HostPattern hp = host_pattern(s, true);
  const int64_t mb = s.mb(), kb = s.kb(), nnzb = s.nnzb;
  for (int64_t i = 0; i < mb; ++i)
    if (hp.row_ptr[i] < 0 || hp.row_ptr[i + 1] < hp.row_ptr[i] || hp.row_ptr[i + 1] > nnzb)
      bad("row_ptr[" + std::to_string(i + 1) + "]=" + std::to_string(hp.row_ptr[i + 1]) + " is out of order or range");
  if (mb >= 0 && hp.row_ptr[mb] != nnzb)
    bad("row_ptr[" + std::to_string(mb) + "]=" + std::to_string(hp.row_ptr[mb]) + " differs from nnzb=" +
        std::to_string(nnzb));
  for (int64_t j = 0; j < nnzb; ++j)
    if (hp.col_idx[j] < 0 || hp.col_idx[j] >= kb)
      bad("col_idx[" + std::to_string(j) + "]=" + std::to_string(hp.col_idx[j]) + " is out of range [0, " +
          std::to_string(kb) + ")");
  return transpose_pattern(hp.row_ptr, hp.col_idx, mb, kb);
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

// The variant tables, each in default-preference order: the CPU rows, then the GPU ones.
const std::vector<Variant>& variants() {
  static const std::vector<Variant> table = [] {
    std::vector<Variant> t;
    // smalln first: where it applies (N <= 128) it is the one built for the problem (but see
    // heuristic_variant: hopper is faster where it applies above one 64-column N tile, and below
    // it for 64- and 128-wide blocks).
    for (auto* f : {&cpu_variants, &smalln_variants, &hopper_variants, &portable_variants, &peer_variants})
      for (const Variant& v : f()) t.push_back(v);
    return t;
  }();
  return table;
}

const std::vector<AttentionVariant>& attention_variants() {
  static const std::vector<AttentionVariant> table = [] {
    std::vector<AttentionVariant> t;
    for (auto* f : {&cpu_attention_variants, &hopper_attention_variants})
      for (const AttentionVariant& v : f()) t.push_back(v);
    return t;
  }();
  return table;
}

GemmArgs as_dsd(const GemmArgs& g) {
  if (g.kind != OpKind::dds) return g;
  auto transposed = [](DenseView d) {
    std::swap(d.rows, d.cols);
    d.layout = d.layout == Layout::row_major ? Layout::col_major : Layout::row_major;
    return d;
  };
  GemmArgs v = g;
  v.kind = OpKind::dsd;
  v.op = g.op == Op::none ? Op::trans : Op::none;
  v.b = transposed(g.a);
  v.c = transposed(g.c);
  v.a = DenseView{};
  return v;
}

const std::vector<AttentionBackwardVariant>& attention_backward_variants() {
  static const std::vector<AttentionBackwardVariant> table = [] {
    std::vector<AttentionBackwardVariant> t;
    for (auto* f : {&cpu_attention_backward_variants, &hopper_attention_backward_variants})
      for (const AttentionBackwardVariant& v : f()) t.push_back(v);
    return t;
  }();
  return table;
}

// One machinery for every table: Args picks the table.
namespace {
template <class Args> const std::vector<VariantOf<Args>>& table_of();
template <> const std::vector<Variant>& table_of<GemmArgs>() { return variants(); }
template <> const std::vector<AttentionVariant>& table_of<AttentionArgs>() { return attention_variants(); }
template <> const std::vector<AttentionBackwardVariant>& table_of<AttentionBackwardArgs>() {
  return attention_backward_variants();
}

template <class Args>
const VariantOf<Args>* find_in(const std::string& name) {
  for (const VariantOf<Args>& v : table_of<Args>())
    if (name == v.name) return &v;
  return nullptr;
}

template <class Args>
std::string variant_names() {
  std::string s;
  for (const VariantOf<Args>& v : table_of<Args>()) s += (s.empty() ? "" : ", ") + std::string(v.name);
  return s.empty() ? "(none)" : s;
}

const char* backend_name(Backend be) { return be == Backend::cpu ? "cpu" : "cuda"; }

template <class Args>
const VariantOf<Args>* heuristic_in(const Args& args, Backend be, std::string* reasons) {
  for (const VariantOf<Args>& v : table_of<Args>()) {
    if (v.backend != be || v.peer) continue;
    std::string why = v.why_not(args);
    if (why.empty()) return &v;
    if (reasons) *reasons += std::string("; ") + v.name + ": " + why;
  }
  return nullptr;
}

template <class Args>
const VariantOf<Args>& forced_in(const Args& args, const std::string& name, Backend be) {
  const VariantOf<Args>* v = find_in<Args>(name);
  if (!v) bad("options.variant '" + name + "' is not one of: " + variant_names<Args>());
  if (v->backend != be) bad("options.variant '" + name + "' is not a " + backend_name(be) + " variant");
  std::string why = v->why_not(args);
  if (!why.empty())
    throw Error(Status::unsupported, "options.variant '" + name + "' does not support this problem: " + why);
  return *v;
}

template <class Args>
std::vector<std::string> supported_in(const Args& args) {
  std::vector<std::string> out;
  for (const VariantOf<Args>& v : table_of<Args>())
    if (v.why_not(args).empty()) out.push_back(v.name);
  return out;
}

template <class Args>
std::vector<std::string> unsupported_in(const Args& args) {
  std::vector<std::string> out;
  for (const VariantOf<Args>& v : table_of<Args>()) {
    std::string why = v.why_not(args);
    if (!why.empty()) out.push_back(std::string(v.name) + ": " + why);
  }
  return out;
}
}  // namespace

const Variant* find_variant(const std::string& name) { return find_in<GemmArgs>(name); }
const AttentionVariant* find_attention_variant(const std::string& name) { return find_in<AttentionArgs>(name); }
const AttentionBackwardVariant* find_attention_backward_variant(const std::string& name) {
  return find_in<AttentionBackwardArgs>(name);
}

Backend resolve_backend(Memory memory, const Options& o) {
  if (int(o.backend) < 0 || int(o.backend) > 2)
    bad("options.backend must be automatic, cpu or cuda, got " + std::to_string(int(o.backend)));
  // Checked here, at plan time: a plan that takes it would fail on every run.
  if (o.threads < 0) bad("options.threads=" + std::to_string(o.threads) + " is negative");
  Backend be = o.backend;
  if (be == Backend::automatic) be = memory == Memory::host ? Backend::cpu : Backend::cuda;
  Memory want = be == Backend::cpu ? Memory::host : Memory::device;
  if (memory != want)
    bad(std::string("backend ") + backend_name(be) + " needs " + to_string(want) +
        " memory, but the operands are in " + to_string(memory) + " memory");
  if (be == Backend::cuda && !device_info().available)
    throw Error(Status::no_device, "no CUDA device: " + device_info().why_not);
  return be;
}

Backend resolve_backend(const GemmArgs& g, const Options& o) { return resolve_backend(g.sparse.memory, o); }

const Variant* heuristic_variant(const GemmArgs& g, Backend be, std::string* reasons) {
  const Variant* v = heuristic_in(g, be, reasons);
  // Where the Hopper tile kernel applies it is faster than smalln past one 64-column N tile (smalln
  // reads A once per tile), and below it wherever it has its 64-column tiles (blocks of 64 or 128
  // rows and columns). H100, W 14336x4096 25%, 64x64 blocks: N = 1 / 16 / 64 / 128: hopper 19 / 19
  // / 17 / 29 us, smalln 20 / 22 / 40 / 72 us; 128x128 N = 16: 17 against 32 us.
  if (v && std::strcmp(v->name, "smalln") == 0 && (g.b.cols > 64 || hopper_has_narrow_tiles(g)))
    if (const Variant* h = find_in<GemmArgs>("hopper"); h && h->backend == be && h->why_not(g).empty()) return h;
  return v;
}
const AttentionVariant* heuristic_variant(const AttentionArgs& a, Backend be, std::string* reasons) {
  return heuristic_in(a, be, reasons);
}

const AttentionBackwardVariant* heuristic_variant(const AttentionBackwardArgs& a, Backend be, std::string* reasons) {
  return heuristic_in(a, be, reasons);
}

const Variant& forced_variant(const GemmArgs& g, const std::string& name, Backend be) {
  return forced_in(g, name, be);
}
const AttentionVariant& forced_variant(const AttentionArgs& a, const std::string& name, Backend be) {
  return forced_in(a, name, be);
}
const AttentionBackwardVariant& forced_variant(const AttentionBackwardArgs& a, const std::string& name, Backend be) {
  return forced_in(a, name, be);
}

uint64_t hash_pattern(const int32_t* row_ptr, int64_t mb, const int32_t* col_idx, int64_t nnzb) {
  // FNV-style mixing over 64-bit words: a few GB/s, far cheaper than the O(nnzb) checks.
  uint64_t h = 0xcbf29ce484222325ull ^ uint64_t(mb) * 0x9e3779b97f4a7c15ull ^ uint64_t(nnzb);
  auto mix = [&h](const int32_t* p, int64_t n) {
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
      uint64_t w = uint64_t(uint32_t(p[i])) | uint64_t(uint32_t(p[i + 1])) << 32;
      h = (h ^ w) * 0x100000001b3ull;
      h ^= h >> 29;
    }
    if (i < n) h = (h ^ uint64_t(uint32_t(p[i]))) * 0x100000001b3ull;
  };
  if (row_ptr) mix(row_ptr, mb + 1);
  if (col_idx) mix(col_idx, nnzb);
  return h;
}

std::vector<std::string> supported_variants(const GemmArgs& g) { return supported_in(g); }
std::vector<std::string> unsupported_reasons(const GemmArgs& g) { return unsupported_in(g); }
std::vector<std::string> supported_variants(const AttentionArgs& a) { return supported_in(a); }
std::vector<std::string> unsupported_reasons(const AttentionArgs& a) { return unsupported_in(a); }
std::vector<std::string> unsupported_reasons(const AttentionBackwardArgs& a) { return unsupported_in(a); }

// ---- the one-shot entry: plan + run through a small LRU of plans keyed by the problem ----
//
// Key: everything a plan is made for (kind, op, shapes, block shape, dtypes, layouts, lds, memory,
// pattern pointers, nnzb) plus the options that steer planning. Host patterns add a hash of
// row_ptr/col_idx, so an array edited in place gets a new plan. Device patterns are keyed by
// their pointers (hashing would need a copy to the host) unless Options::check_indices is set, in
// which case the pattern is copied and checked anyway and its hash joins the key: so a device
// pattern mutated in place between one-shot calls needs check_indices (the default) or an
// explicit plan. Device keys also carry the current device (a plan runs only where it was made)
// and the stream, so a plan's workspace is only ever used in one stream's order; a plan is taken
// out of the cache while it runs, so two threads never share one.
namespace {

struct DenseKey {
  int64_t rows = 0, cols = 0, ld = 0;
  int layout = 0, dtype = 0, memory = 0;
  // Device data: a plan may size workspace by the data's alignment (hopper copies a dense operand
  // that is not 16-byte aligned into aligned workspace), so a less aligned pointer gets its own plan.
  bool aligned16 = false;
  bool operator==(const DenseKey& o) const {
    return rows == o.rows && cols == o.cols && ld == o.ld && layout == o.layout && dtype == o.dtype &&
           memory == o.memory && aligned16 == o.aligned16;
  }
};

struct PlanKey {
  int kind = 0, op = 0;
  int64_t rows = 0, cols = 0, nnzb = 0;
  int bm = 0, bk = 0, dtype = 0, memory = 0;
  const int32_t* row_ptr = nullptr;
  const int32_t* col_idx = nullptr;
  DenseKey a, b, c;
  int backend = 0, threads = 0, tune = 0;
  std::string variant;
  void* stream = nullptr;
  int device = -1;  // current CUDA device (a plan runs only on the device it was made on)
  uint64_t pattern_hash = 0;
  bool operator==(const PlanKey& o) const {
    return kind == o.kind && op == o.op && rows == o.rows && cols == o.cols && nnzb == o.nnzb && bm == o.bm &&
           bk == o.bk && dtype == o.dtype && memory == o.memory && row_ptr == o.row_ptr && col_idx == o.col_idx &&
           a == o.a && b == o.b && c == o.c && backend == o.backend && threads == o.threads && tune == o.tune &&
           variant == o.variant && stream == o.stream && device == o.device && pattern_hash == o.pattern_hash;
  }
};

DenseKey dense_key(const DenseView& d) {
  return {d.rows, d.cols, d.ld, int(d.layout), int(d.dtype), int(d.memory),
          d.memory == Memory::device && reinterpret_cast<uintptr_t>(d.data) % 16 == 0};
}

PlanCache<PlanKey, Plan>& plan_cache() {
  static auto* cache = new PlanCache<PlanKey, Plan>;  // leaked on purpose: no destruction-order issues at exit
  return *cache;
}

}  // namespace

PlanCacheStats one_shot_plan_cache_stats() { return plan_cache().stats(); }
void clear_one_shot_plan_cache() { plan_cache().clear(); }

void gemm(const GemmArgs& g, const Options& o) {
  validate(g, false);
  Backend be = resolve_backend(g, o);
  PlanKey key;
  key.kind = int(g.kind);
  key.op = int(g.op);
  key.rows = g.sparse.rows;
  key.cols = g.sparse.cols;
  key.nnzb = g.sparse.nnzb;
  key.bm = g.sparse.bm;
  key.bk = g.sparse.bk;
  key.dtype = int(g.sparse.dtype);
  key.memory = int(g.sparse.memory);
  key.row_ptr = g.sparse.row_ptr;
  key.col_idx = g.sparse.col_idx;
  if (g.kind != OpKind::dds) key.b = dense_key(g.b);
  if (g.kind != OpKind::dsd) key.a = dense_key(g.a);
  if (g.kind != OpKind::sdd) key.c = dense_key(g.c);
  key.backend = int(be);
  key.threads = o.threads;
  key.tune = o.variant.empty() ? int(tune_mode()) : -1;
  key.variant = o.variant;
  if (be == Backend::cuda) {
    key.stream = o.stream;
    check_cuda(cudaGetDevice(&key.device), "cudaGetDevice");
  }
  HostPattern hp;
  bool have_pattern = false;
  if (o.check_indices) {
    hp = host_pattern(g.sparse, true, o.stream);
    validate_pattern(g, hp);
    have_pattern = true;
    key.pattern_hash = hash_pattern(hp.row_ptr, g.sparse.mb(), hp.col_idx, g.sparse.nnzb);
  } else if (g.sparse.memory == Memory::host) {
    key.pattern_hash = hash_pattern(g.sparse.row_ptr, g.sparse.mb(), g.sparse.col_idx, g.sparse.nnzb);
  }
  Plan p = plan_cache().take(key);
  if (!p) {
    if (!have_pattern) {
      hp = host_pattern(g.sparse, true, o.stream);
      validate_pattern(g, hp);
    }
    p = make_plan(g, o, be, hp);
  }
  // g passed validate() above and the key pins everything run() would match against the plan.
  run_validated(p, g, o.stream);
  if (be == Backend::cuda && stream_is_capturing(o.stream)) plan_cache().keep_for_graph(p);
  plan_cache().put(std::move(key), std::move(p));
}

namespace {
GemmArgs product(OpKind kind, Op op, float alpha, float beta, const BsrView& sparse) {
  GemmArgs g;
  g.kind = kind;
  g.op = op;
  g.alpha = alpha;
  g.beta = beta;
  g.sparse = sparse;
  return g;
}
}  // namespace

void dsd(const BsrView& a, const DenseView& b, DenseView& c, float alpha, float beta, Op op, const Options& o) {
  GemmArgs g = product(OpKind::dsd, op, alpha, beta, a);
  g.b = b;
  g.c = c;
  gemm(g, o);
}
void dds(const DenseView& a, const BsrView& b, DenseView& c, float alpha, float beta, Op op, const Options& o) {
  GemmArgs g = product(OpKind::dds, op, alpha, beta, b);
  g.a = a;
  g.c = c;
  gemm(g, o);
}
void sdd(const DenseView& a, const DenseView& b, BsrView& c, float alpha, float beta, const Options& o) {
  GemmArgs g = product(OpKind::sdd, Op::none, alpha, beta, c);
  g.a = a;
  g.b = b;
  gemm(g, o);
}

}  // namespace sparsek
