// The variant tables (every backend's rows in default-preference order), lookup by name, the
// backend for a problem's memory, and the choices plan() makes from them: forced by name, or the
// heuristic default. The tuner's choice comes in between (plan/tuned_choice.hpp).
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/no_gpu.hpp"
#include "plan/backends.hpp"
#include "plan/plan_internal.hpp"
#include "plan/variant.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek {

namespace {
[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }

// One table from the backends' rows, in the order given.
template <class Args>
std::vector<VariantOf<Args>> rows_of(std::initializer_list<std::vector<VariantOf<Args>> (*)()> backends) {
  std::vector<VariantOf<Args>> t;
  for (auto* f : backends)
    for (const VariantOf<Args>& v : f()) t.push_back(v);
  return t;
}
}  // namespace

// The variant tables, each in default-preference order: the CPU rows, then the GPU ones.
const std::vector<Variant>& variants() {
  // smalln first: where it applies (N <= 128) it is the one built for the problem (but see
  // heuristic_variant: hopper is faster where it applies above one 64-column N tile, and below
  // it for 64- and 128-wide blocks).
  static const std::vector<Variant> table =
      rows_of<GemmArgs>({&cpu_variants, &smalln_variants, &hopper_variants, &hopper_fp8_variants, &portable_variants, &peer_variants});
  return table;
}

const std::vector<AttentionVariant>& attention_variants() {
  static const std::vector<AttentionVariant> table =
      rows_of<AttentionArgs>({&cpu_attention_variants, &hopper_attention_variants});
  return table;
}

const std::vector<AttentionBackwardVariant>& attention_backward_variants() {
  static const std::vector<AttentionBackwardVariant> table =
      rows_of<AttentionBackwardArgs>({&cpu_attention_backward_variants, &hopper_attention_backward_variants});
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
    throw no_gpu_error(std::string("backend cuda") + (o.backend == Backend::automatic ? " (device memory)" : ""),
                       "no CUDA device: ");
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

std::vector<std::string> supported_variants(const GemmArgs& g) { return supported_in(g); }
std::vector<std::string> unsupported_reasons(const GemmArgs& g) { return unsupported_in(g); }
std::vector<std::string> supported_variants(const AttentionArgs& a) { return supported_in(a); }
std::vector<std::string> unsupported_reasons(const AttentionArgs& a) { return unsupported_in(a); }
std::vector<std::string> unsupported_reasons(const AttentionBackwardArgs& a) { return unsupported_in(a); }

// The products the GPU variants run: DDS as the DSD on the transposes (variant.hpp says why).
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

}  // namespace sparsek
