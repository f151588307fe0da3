// The top-k block gate's entry points: checks (every error names the argument and the value),
// the workspace size, and the dispatch by memory kind: host -> the CPU reference, device -> the
// CUDA kernels on options.stream.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/no_gpu.hpp"
#include "plan/gate_internal.hpp"
#include "sparsek/attention.hpp"

namespace sparsek {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }

std::string str(int64_t v) { return std::to_string(v); }
// A dtype a C caller may have set to any int: its name when it has one (e4m3 too), else its number
// (to_string gives "invalid dtype" without the value).
std::string dtype_text(DType t) { return int(t) >= 0 && int(t) <= 3 ? to_string(t) : str(int(t)); }

int64_t mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) bad(std::string(what) + ": size arithmetic overflows int64");
  return r;
}
int64_t add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) bad(std::string(what) + ": size arithmetic overflows int64");
  return r;
}

// Elements from a tensor's first element to one past its last (0 when it is empty).
int64_t span_elements(const Tensor4View& t, const char* name) {
  if (t.b == 0 || t.h == 0 || t.s == 0 || t.d == 0) return 0;
  int64_t last = mul(t.b - 1, t.stride_b, name);
  last = add(last, mul(t.h - 1, t.stride_h, name), name);
  last = add(last, mul(t.s - 1, t.stride_s, name), name);
  return add(last, t.d, name);
}

void check_tensor(const Tensor4View& t, const char* name) {
  if (int(t.dtype) < 0 || int(t.dtype) > 2)
    bad(std::string(name) + ".dtype = " + dtype_text(t.dtype) + " is not f32 (0), f16 (1) or bf16 (2)");
  if (int(t.memory) < 0 || int(t.memory) > 1)  // (every named value passes: only a number to print)
    bad(std::string(name) + ".memory = " + str(int(t.memory)) + " is not host (0) or device (1)");
  const std::pair<const char*, int64_t> dims[] = {{"b", t.b}, {"h", t.h}, {"s", t.s}, {"d", t.d},
                                                  {"stride_b", t.stride_b}, {"stride_h", t.stride_h},
                                                  {"stride_s", t.stride_s}};
  for (const auto& [field, v] : dims)
    if (v < 0) bad(std::string(name) + "." + field + " = " + str(v) + " is negative");
  if (t.h < 1) bad(std::string(name) + ".h = " + str(t.h) + ": needs at least one head");
  if (t.d != 64 && t.d != 128) bad(std::string(name) + ".d = " + str(t.d) + " is not 64 or 128");
  // The byte extent must be representable too.
  mul(span_elements(t, name), int64_t(dtype_size(t.dtype)), name);
}

// A byte range [lo, hi) of one argument, for the overlap checks.
struct Range {
  const char* name;
  uintptr_t lo, hi;
};
Range range(const char* name, const void* p, int64_t bytes) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  return {name, lo, p && bytes > 0 ? lo + uintptr_t(bytes) : lo};
}
bool overlap(const Range& a, const Range& b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }

void check_candidates(const GateArgs& a, const GateShape& s) {
  const AttentionLayout& c = *a.candidates;
  const std::string n = "candidates";
  if (int(c.memory) < 0 || int(c.memory) > 1)  // (every named value passes: only a number to print)
    bad(n + ".memory = " + str(int(c.memory)) + " is not host (0) or device (1)");
  if (int(c.memory) != int(a.q.memory))
    bad(n + " are in " + to_string(c.memory) + " memory but q is in " + to_string(a.q.memory) + " memory");
  if (c.block_q != a.block || c.block_kv != a.block)
    bad(n + ".block_q = " + str(c.block_q) + " and " + n + ".block_kv = " + str(c.block_kv) +
        " are not both block = " + str(a.block));
  if (c.batch != 1 && c.batch != s.B) bad(n + ".batch = " + str(c.batch) + " is neither 1 nor B = " + str(s.B));
  if (c.heads != 1 && c.heads != s.Hq && c.heads != s.Hkv)
    bad(n + ".heads = " + str(c.heads) + " is not 1, Hq = " + str(s.Hq) + " or Hkv = " + str(s.Hkv));
  if (c.q_blocks != s.Mq)
    bad(n + ".q_blocks = " + str(c.q_blocks) + " differs from ceil(Sq / block) = " + str(s.Mq));
  if (c.kmax < 0) bad(n + ".kmax = " + str(c.kmax) + " is negative");
  if ((c.full_kv_num_blocks == nullptr) != (c.full_kv_indices == nullptr))
    bad(n + ": full_kv_num_blocks and full_kv_indices must be given both or neither");
  if (c.has_full() && c.full_kmax < 0) bad(n + ".full_kmax = " + str(c.full_kmax) + " is negative");
  const int64_t rows = mul(mul(c.batch, c.heads, "candidates"), c.q_blocks, "candidates");
  mul(mul(rows, std::max(c.kmax, c.full_kmax), "candidates"), 4, "candidates");
  if (rows > 0 && !c.kv_num_blocks) bad(n + ".kv_num_blocks is null");
  if (rows > 0 && c.kmax > 0 && !c.kv_indices) bad(n + ".kv_indices is null");
  if (c.memory != Memory::host) return;  // device lists are clamped by the kernel, never read back
  // Host lists: counts in [0, kmax], indices in [0, Nk).
  auto check_list = [&](const int32_t* num, const int32_t* idx, int64_t kmax, const char* nn, const char* in) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bb = r / (c.heads * c.q_blocks), hh = r / c.q_blocks % c.heads, ii = r % c.q_blocks;
      const std::string at = "[" + str(bb) + ", " + str(hh) + ", " + str(ii);
      if (num[r] < 0 || num[r] > kmax)
        bad(n + "." + nn + at + "] = " + str(num[r]) + " is out of range [0, " + str(kmax) + "]");
      for (int64_t e = 0; e < num[r]; ++e) {
        const int32_t j = idx[r * kmax + e];
        if (j < 0 || j >= s.Nk)
          bad(n + "." + in + at + ", " + str(e) + "] = " + str(j) + " is out of range [0, " + str(s.Nk) + ")");
      }
    }
  };
  check_list(c.kv_num_blocks, c.kv_indices, c.kmax, "kv_num_blocks", "kv_indices");
  if (c.has_full()) check_list(c.full_kv_num_blocks, c.full_kv_indices, c.full_kmax, "full_kv_num_blocks",
                               "full_kv_indices");
}

// Every check gate() makes; returns the shape.
GateShape validate_gate(const GateArgs& a, const Options& o) {
  const GateShape s = gate_shape(a);
  const Memory mem = a.q.memory;
  if (int(o.backend) < 0 || int(o.backend) > 2)
    bad("options.backend = " + str(int(o.backend)) + " is not automatic (0), cpu (1) or cuda (2)");
  if (o.backend != Backend::automatic && (o.backend == Backend::cpu) != (mem == Memory::host))
    bad(std::string("options.backend = ") + (o.backend == Backend::cpu ? "cpu" : "cuda") + " needs " +
        (o.backend == Backend::cpu ? "host" : "device") + " memory, but q and k are in " + to_string(mem) +
        " memory");
  if (!o.variant.empty()) bad("options.variant '" + o.variant + "': the gate has no variants to choose from");
  if (o.threads < 0) bad("options.threads = " + str(o.threads) + " is negative");

  const int64_t kv_num = s.rows();
  const int64_t kv_idx = mul(kv_num, a.kmax, "kv_indices");
  const int64_t score_n = mul(kv_num, s.Nk, "scores");
  mul(kv_idx, 4, "kv_indices");
  mul(score_n, 4, "scores");
  if (!a.given_scores) {
    if (span_elements(a.q, "q") > 0 && !a.q.data) bad("q.data is null");
    if (span_elements(a.k, "k") > 0 && !a.k.data) bad("k.data is null");
  }
  if (kv_num > 0 && !a.kv_num_blocks) bad("kv_num_blocks is null");
  if (kv_idx > 0 && !a.kv_indices) bad("kv_indices is null");
  if (a.candidates) check_candidates(a, s);
  // Packed sequences: attention's checks and messages (format/attention_layout.cpp). Device
  // offsets are not read back: the kernels read any contents safely.
  check_packed_sequences(a.cu_seqlens, a.num_seqs, s.B, s.Sq, s.Skv);
  if (a.cu_seqlens && mem == Memory::host) check_cu_seqlens(a.cu_seqlens, a.num_seqs, s.Sq);

  if (mem == Memory::device) {
    if (!device_info().available)
      throw no_gpu_error("the gate on q and k in device memory",
                         "q and k are in device memory but no CUDA device answers: ");
    const size_t need = gate_workspace_bytes(a);
    if (need > 0 && !a.workspace) bad("workspace is null (the gate needs " + str(int64_t(need)) + " bytes)");
    if (need > 0 && reinterpret_cast<uintptr_t>(a.workspace) % 16)
      bad("workspace is not 16-byte aligned");
    if (a.workspace_bytes < need)
      bad("workspace_bytes = " + str(int64_t(a.workspace_bytes)) + " is less than gate_workspace_bytes() = " +
          str(int64_t(need)));
    const std::string why = gate_cuda_why_not(a, s);
    if (!why.empty()) throw Error(Status::unsupported, "the GPU gate cannot run this problem: " + why);
  }

  // Outputs must not overlap an input or each other.
  std::vector<Range> inputs = {
      range("q", a.q.data, span_elements(a.q, "q") * int64_t(dtype_size(a.q.dtype))),
      range("k", a.k.data, span_elements(a.k, "k") * int64_t(dtype_size(a.k.dtype))),
      range("given_scores", a.given_scores, a.given_scores ? score_n * 4 : 0),
      range("cu_seqlens", a.cu_seqlens, a.cu_seqlens ? (a.num_seqs + 1) * 4 : 0)};
  if (const AttentionLayout* c = a.candidates) {
    const int64_t rows = c->batch * c->heads * c->q_blocks;
    inputs.push_back(range("candidates.kv_num_blocks", c->kv_num_blocks, rows * 4));
    inputs.push_back(range("candidates.kv_indices", c->kv_indices, rows * c->kmax * 4));
    if (c->has_full()) {
      inputs.push_back(range("candidates.full_kv_num_blocks", c->full_kv_num_blocks, rows * 4));
      inputs.push_back(range("candidates.full_kv_indices", c->full_kv_indices, rows * c->full_kmax * 4));
    }
  }
  const std::vector<Range> outputs = {
      range("kv_num_blocks", a.kv_num_blocks, kv_num * 4), range("kv_indices", a.kv_indices, kv_idx * 4),
      range("scores", a.scores, a.scores ? score_n * 4 : 0),
      range("workspace", a.workspace, mem == Memory::device ? int64_t(gate_workspace_bytes(a)) : 0)};
  for (size_t x = 0; x < outputs.size(); ++x) {
    for (const Range& in : inputs)
      if (overlap(outputs[x], in)) bad(std::string(outputs[x].name) + " overlaps the input " + in.name);
    for (size_t y = 0; y < x; ++y)
      if (overlap(outputs[x], outputs[y])) bad(std::string(outputs[x].name) + " overlaps " + outputs[y].name);
  }
  return s;
}

}  // namespace

GateShape gate_shape(const GateArgs& a) {
  check_tensor(a.q, "q");
  check_tensor(a.k, "k");
  GateShape s;
  s.B = a.q.b;
  s.Hq = a.q.h;
  s.Hkv = a.k.h;
  s.Sq = a.q.s;
  s.Skv = a.k.s;
  s.D = a.q.d;
  if (a.k.b != s.B) bad("k.b = " + str(a.k.b) + " differs from q.b = " + str(s.B));
  if (a.k.d != s.D) bad("k.d = " + str(a.k.d) + " differs from q.d = " + str(s.D));
  if (s.Hq % s.Hkv) bad("q.h = " + str(s.Hq) + " is not a multiple of k.h = " + str(s.Hkv));
  s.G = s.Hq / s.Hkv;
  if (a.k.dtype != a.q.dtype)
    bad(std::string("k.dtype = ") + to_string(a.k.dtype) + " differs from q.dtype = " + to_string(a.q.dtype));
  if (a.k.memory != a.q.memory)
    bad(std::string("k is in ") + to_string(a.k.memory) + " memory but q is in " + to_string(a.q.memory) +
        " memory");
  if (a.q.memory == Memory::device && a.q.dtype == DType::f32)
    throw Error(Status::unsupported, "q.dtype = f32: the GPU gate reads f16 or bf16 (f32 runs on host memory)");
  if (a.block != 64 && a.block != 128) bad("block = " + str(a.block) + " is not 64 or 128");
  if (a.topk < 0) bad("topk = " + str(a.topk) + " is negative");
  if (a.sink < 0) bad("sink = " + str(a.sink) + " is negative");
  if (a.local < 0) bad("local = " + str(a.local) + " is negative");
  if (!std::isfinite(a.scale)) bad("scale = " + std::to_string(a.scale) + " is not finite");
  s.block = a.block;
  s.scale = a.scale != 0.f ? a.scale : float(1.0 / std::sqrt(double(s.D)));
  s.Mq = (s.Sq + a.block - 1) / a.block;
  s.Nk = (s.Skv + a.block - 1) / a.block;
  const int64_t budget = int64_t(a.topk) + a.sink + a.local;
  if (a.kmax < std::min(s.Nk, budget))
    bad("kmax = " + str(a.kmax) + " is less than min(Nk = " + str(s.Nk) + ", topk + sink + local = " +
        str(budget) + ")");
  // Row counts and the workspace size must be representable.
  mul(mul(mul(s.B, s.Hkv, "q"), s.Mq + s.Nk, "q"), s.D * 4, "workspace");
  return s;
}

size_t gate_workspace_bytes(const GateArgs& a) {
  const GateShape s = gate_shape(a);
  if (a.q.memory == Memory::host || a.given_scores) return 0;
  return size_t(s.pooled_q_floats() + s.pooled_k_floats()) * 4;
}

void gate(const GateArgs& args, const Options& options) {
  const GateShape s = validate_gate(args, options);
  if (args.q.memory == Memory::host)
    gate_cpu(args, s);
  else
    gate_cuda(args, s, options.stream);
}

}  // namespace sparsek
