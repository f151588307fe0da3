// The one-shot entry: validate -> pick a variant -> run. (A plan/run split sits on the same
// pieces: validation and the variant table.)
#include <cuda_runtime.h>

#include <sstream>

#include "core/device.hpp"
#include "plan/backends.hpp"
#include "plan/variant.hpp"
#include "sparsek/gemm.hpp"

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

void validate(const GemmArgs& g, bool check_indices) {
  const char* sname = g.kind == OpKind::dsd ? "A (sparse)" : g.kind == OpKind::dds ? "B (sparse)" : "C (sparse)";
  if (int(g.op) != 0 && int(g.op) != 1) bad("op must be none or trans, got " + std::to_string(int(g.op)));
  if (g.kind == OpKind::sdd && g.op != Op::none) bad("op must be none for sdd (got trans)");
  if (int(g.kind) < 0 || int(g.kind) > 2) bad("kind must be dsd, dds or sdd, got " + std::to_string(int(g.kind)));
  // BSR invariants (cheap ones always; index checks when asked and reachable from the host).
  try {
    validate(g.sparse, check_indices && g.sparse.memory == Memory::host);
  } catch (const Error& e) {
    bad(std::string(sname) + ": " + e.what());
  }
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
  if (g.sparse.memory == Memory::device && check_indices && g.sparse.nnzb >= 0) {
    // Copy the pattern to the host once and run the O(nnzb) checks there.
    std::vector<int32_t> rp(size_t(g.sparse.mb() + 1)), ci(size_t(g.sparse.nnzb));
    check_cuda(cudaMemcpy(rp.data(), g.sparse.row_ptr, rp.size() * 4, cudaMemcpyDeviceToHost),
               "cudaMemcpy(row_ptr)");
    if (!ci.empty())
      check_cuda(cudaMemcpy(ci.data(), g.sparse.col_idx, ci.size() * 4, cudaMemcpyDeviceToHost),
                 "cudaMemcpy(col_idx)");
    BsrView h = g.sparse;
    h.row_ptr = rp.data();
    h.col_idx = ci.data();
    h.values = ci.empty() ? nullptr : reinterpret_cast<void*>(1);  // values are not read by the checks
    h.memory = Memory::host;
    try {
      validate(h, true);
    } catch (const Error& e) {
      bad(std::string(sname) + ": " + e.what());
    }
  }
  const int64_t M = g.m(), N = g.n(), K = g.k();
  DType in = g.sparse.dtype;
  switch (g.kind) {
    case OpKind::dsd:
      validate(g.b, "B");
      validate(g.c, "C");
      check_dense_shape(g.b, "B", K, g.b.cols);
      check_dense_shape(g.c, "C", M, N);
      if (g.b.dtype != in)
        bad(std::string("B dtype ") + to_string(g.b.dtype) + " differs from A's " + to_string(in));
      break;
    case OpKind::dds:
      validate(g.a, "A");
      validate(g.c, "C");
      check_dense_shape(g.a, "A", g.a.rows, K);
      check_dense_shape(g.c, "C", M, N);
      if (g.a.dtype != in)
        bad(std::string("A dtype ") + to_string(g.a.dtype) + " differs from B's " + to_string(in));
      break;
    case OpKind::sdd:
      validate(g.a, "A");
      validate(g.b, "B");
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

const std::vector<Variant>& variants() {
  static const std::vector<Variant> table = [] {
    std::vector<Variant> t;
    for (auto* f : {&cpu_variants, &hopper_variants, &portable_variants, &peer_variants})
      for (const Variant& v : f()) t.push_back(v);
    return t;
  }();
  return table;
}

const Variant* find_variant(const std::string& name) {
  for (const Variant& v : variants())
    if (name == v.name) return &v;
  return nullptr;
}

namespace {
Backend backend_for(const GemmArgs& g, const Options& o) {
  if (o.backend != Backend::automatic) return o.backend;
  return g.sparse.memory == Memory::host ? Backend::cpu : Backend::cuda;
}
void run_variant(const Variant& v, const GemmArgs& g, const Options& o) {
  std::unique_ptr<VariantState> state = v.prepare ? v.prepare(g, o) : nullptr;
  v.run(g, o, state.get());
}
std::string variant_names() {
  std::string s;
  for (const Variant& v : variants()) s += (s.empty() ? "" : ", ") + std::string(v.name);
  return s;
}
}  // namespace

std::vector<std::string> supported_variants(const GemmArgs& g) {
  std::vector<std::string> out;
  for (const Variant& v : variants())
    if (v.why_not(g).empty()) out.push_back(v.name);
  return out;
}

std::vector<std::string> unsupported_reasons(const GemmArgs& g) {
  std::vector<std::string> out;
  for (const Variant& v : variants()) {
    std::string why = v.why_not(g);
    if (!why.empty()) out.push_back(std::string(v.name) + ": " + why);
  }
  return out;
}

void gemm(const GemmArgs& g, const Options& o) {
  validate(g, o.check_indices);
  Backend be = backend_for(g, o);
  Memory want = be == Backend::cpu ? Memory::host : Memory::device;
  if (g.sparse.memory != want)
    bad(std::string("backend ") + (be == Backend::cpu ? "cpu" : "cuda") + " needs " + to_string(want) +
        " memory, but the operands are in " + to_string(g.sparse.memory) + " memory");
  if (be == Backend::cuda && !device_info().available)
    throw Error(Status::no_device, "no CUDA device: " + device_info().why_not);
  if (!o.variant.empty()) {
    const Variant* v = find_variant(o.variant);
    if (!v) bad("variant '" + o.variant + "' is not one of: " + variant_names());
    if (v->backend != be)
      bad("variant '" + o.variant + "' is not a " + (be == Backend::cpu ? "cpu" : "cuda") + " variant");
    std::string why = v->why_not(g);
    if (!why.empty()) throw Error(Status::unsupported, "variant '" + o.variant + "' does not support this problem: " + why);
    run_variant(*v, g, o);
    return;
  }
  std::string reasons;
  for (const Variant& v : variants()) {
    if (v.backend != be || v.peer) continue;
    std::string why = v.why_not(g);
    if (why.empty()) {
      run_variant(v, g, o);
      return;
    }
    reasons += std::string("; ") + v.name + ": " + why;
  }
  throw Error(Status::unsupported, "no variant supports this problem" + reasons);
}

void dsd(const BsrView& a, const DenseView& b, DenseView& c, float alpha, float beta, Op op, const Options& o) {
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.op = op;
  g.alpha = alpha;
  g.beta = beta;
  g.sparse = a;
  g.b = b;
  g.c = c;
  gemm(g, o);
}
void dds(const DenseView& a, const BsrView& b, DenseView& c, float alpha, float beta, Op op, const Options& o) {
  GemmArgs g;
  g.kind = OpKind::dds;
  g.op = op;
  g.alpha = alpha;
  g.beta = beta;
  g.sparse = b;
  g.a = a;
  g.c = c;
  gemm(g, o);
}
void sdd(const DenseView& a, const DenseView& b, BsrView& c, float alpha, float beta, const Options& o) {
  GemmArgs g;
  g.kind = OpKind::sdd;
  g.alpha = alpha;
  g.beta = beta;
  g.sparse = c;
  g.a = a;
  g.b = b;
  gemm(g, o);
}

}  // namespace sparsek
