// Attention argument validation and what is read off a layout (its host copy, the content
// checks, effective FLOPs). Every message names the tensor or array, the index and the value.
#include "core/cuda_host.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/device.hpp"
#include "core/no_gpu.hpp"
#include "format/attention_internal.hpp"
#include "format/format_internal.hpp"

namespace sparsek {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }
std::string s(int64_t v) { return std::to_string(v); }

std::string at(const char* name, int64_t b, int64_t h, int64_t i) {
  return std::string(name) + "[" + s(b) + ", " + s(h) + ", " + s(i) + "]";
}
std::string at(const char* name, int64_t b, int64_t h, int64_t i, int64_t j) {
  return std::string(name) + "[" + s(b) + ", " + s(h) + ", " + s(i) + ", " + s(j) + "]";
}

// a * b + c without int64 overflow (all >= 0); false when it would overflow.
bool mul_add(int64_t a, int64_t b, int64_t c, int64_t* out) {
  int64_t p;
  return !__builtin_mul_overflow(a, b, &p) && !__builtin_add_overflow(p, c, out);
}

const char* kDtypes = "f32 (0), f16 (1) or bf16 (2)";
const char* kMemories = "host (0) or device (1)";

// One tensor on its own: enums, extents, strides, pointer, and the byte extent (returned).
int64_t check_tensor(const Tensor4View& t, const char* name) {
  const std::string n(name);
  if (int(t.dtype) < 0 || int(t.dtype) > 2) bad(n + " dtype " + s(int(t.dtype)) + " is not " + kDtypes);
  if (int(t.memory) < 0 || int(t.memory) > 1) bad(n + " memory " + s(int(t.memory)) + " is not " + kMemories);
  const int64_t ext[4] = {t.b, t.h, t.s, t.d};
  const char* ext_name[4] = {".b", ".h", ".s", ".d"};
  for (int e = 0; e < 4; ++e)
    if (ext[e] < 1) bad(n + ext_name[e] + " = " + s(ext[e]) + " must be at least 1");
  const int64_t str[3] = {t.stride_b, t.stride_h, t.stride_s};
  const char* str_name[3] = {".stride_b", ".stride_h", ".stride_s"};
  for (int e = 0; e < 3; ++e)
    if (str[e] < 0) bad(n + str_name[e] + " = " + s(str[e]) + " is negative");
  if (!t.data) bad(n + ".data is null");
  // Last element's offset + 1, in bytes, without overflow.
  int64_t span = t.d;
  for (int e = 0; e < 3; ++e)
    if (!mul_add(ext[e] - 1, str[e], span, &span))
      bad(n + ": the extent of a [" + s(t.b) + ", " + s(t.h) + ", " + s(t.s) + ", " + s(t.d) +
          "] tensor with these strides overflows 64-bit offsets");
  int64_t bytes;
  if (!mul_add(span, int64_t(dtype_size(t.dtype)), 0, &bytes))
    bad(n + ": the byte extent of the tensor overflows 64 bits");
  return bytes;
}

// An output must give every (b, h, s, d) its own element: sorted by stride, each dimension's
// stride must step past everything the smaller ones span (d is contiguous, stride 1).
void check_no_self_overlap(const Tensor4View& t, const char* name) {
  struct Dim {
    int64_t extent, stride;
  };
  Dim dims[3] = {{t.b, t.stride_b}, {t.h, t.stride_h}, {t.s, t.stride_s}};
  std::sort(dims, dims + 3, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t span = t.d;  // elements spanned by the dimensions below (mul_add checked in check_tensor)
  for (const Dim& d : dims) {
    if (d.extent == 1) continue;
    if (d.stride < span)
      bad(std::string(name) + " strides (stride_b = " + s(t.stride_b) + ", stride_h = " + s(t.stride_h) +
          ", stride_s = " + s(t.stride_s) + ", d = " + s(t.d) +
          ") give two positions the same element; an output needs an element per position");
    span = (d.extent - 1) * d.stride + span;
  }
}

std::string range_str(const ByteRange& r) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%#" PRIxPTR ", %#" PRIxPTR ")", r.begin, r.end);
  return buf;
}

// [begin, end) of the bytes a tensor or array may touch (byte_range(): empty for no bytes).
struct Named {
  const char* name;
  ByteRange r;
};
// Outputs must not share a byte with an input or with each other (nothing is computed in place).
void check_apart(const Named* outputs, int n_out, const Named* inputs, int n_in, const char* op) {
  for (int o = 0; o < n_out; ++o) {
    const Named& out = outputs[o];
    for (int i = 0; i < n_in; ++i)
      if (out.r.overlaps(inputs[i].r))
        bad(std::string(out.name) + " overlaps " + inputs[i].name + ": " + out.name + " occupies " +
            range_str(out.r) + " and " + inputs[i].name + " " + range_str(inputs[i].r) + "; " + op +
            " is not computed in place: give " + out.name + " memory of its own");
    for (int e = 0; e < o; ++e)
      if (out.r.overlaps(outputs[e].r))
        bad(std::string(out.name) + " overlaps " + outputs[e].name + ": " + outputs[e].name + " occupies " +
            range_str(outputs[e].r) + " and " + out.name + " " + range_str(out.r));
  }
}

// The byte ranges of a forward problem's inputs (q, k, v, the layout's arrays) and outputs (o,
// lse); a passed validate()'s checks of extents and sizes.
void forward_ranges(const AttentionArgs& a, Named in[8], Named out[2]) {
  const AttentionLayout& l = a.layout;
  const int64_t rows = l.batch * l.heads * l.q_blocks;
  in[0] = {"q", byte_range(a.q.data, check_tensor(a.q, "q"))};
  in[1] = {"k", byte_range(a.k.data, check_tensor(a.k, "k"))};
  in[2] = {"v", byte_range(a.v.data, check_tensor(a.v, "v"))};
  in[3] = {"layout.kv_num_blocks", byte_range(l.kv_num_blocks, rows * 4)};
  in[4] = {"layout.kv_indices", byte_range(l.kv_indices, rows * l.kmax * 4)};
  in[5] = {"layout.full_kv_num_blocks", byte_range(l.full_kv_num_blocks, l.has_full() ? rows * 4 : 0)};
  in[6] = {"layout.full_kv_indices", byte_range(l.full_kv_indices, l.has_full() ? rows * l.full_kmax * 4 : 0)};
  in[7] = {"cu_seqlens", byte_range(a.cu_seqlens, a.cu_seqlens ? (a.num_seqs + 1) * 4 : 0)};
  out[0] = {"o", byte_range(a.o.data, check_tensor(a.o, "o"))};
  out[1] = {"lse", byte_range(a.lse, a.lse ? a.q.b * a.q.h * a.q.s * 4 : 0)};
}

}  // namespace

void check_packed_sequences(const int32_t* cu_seqlens, int64_t num_seqs, int64_t B, int64_t Sq, int64_t Skv) {
  if (cu_seqlens) {
    if (num_seqs < 1)
      bad("num_seqs = " + s(num_seqs) + " with cu_seqlens given: a packed batch holds at least one sequence");
    if (num_seqs >= INT32_MAX) bad("num_seqs = " + s(num_seqs) + " does not fit int32");
    if (B != 1)
      bad("q.b = " + s(B) + " with cu_seqlens: packed sequences are one batch row (B = 1) holding every sequence");
    if (Sq != Skv)
      bad("q.s = " + s(Sq) + " differs from k.s = " + s(Skv) +
          " with cu_seqlens: queries and keys are the same packed tokens");
  } else if (num_seqs != 0) {
    bad("num_seqs = " + s(num_seqs) + " but cu_seqlens is null (give both, or num_seqs = 0)");
  }
}

void check_cu_seqlens(const int32_t* cu, int64_t num_seqs, int64_t T) {
  const int64_t n = num_seqs;
  if (cu[0] != 0) bad("cu_seqlens[0] = " + s(cu[0]) + " is not 0 (the first sequence starts at row 0)");
  for (int64_t i = 1; i <= n; ++i)
    if (cu[i] < cu[i - 1])
      bad("cu_seqlens[" + s(i) + "] = " + s(cu[i]) + " is less than cu_seqlens[" + s(i - 1) + "] = " +
          s(cu[i - 1]) + " (offsets never decrease)");
  if (cu[n] != T) bad("cu_seqlens[" + s(n) + "] = " + s(cu[n]) + " is not the packed length T = q.s = " + s(T));
}

void validate(const AttentionArgs& a, bool check_indices) { validate(a, check_indices, nullptr); }

void validate(const AttentionArgs& a, bool check_indices, void* stream) {
  check_tensor(a.q, "q");
  check_tensor(a.k, "k");
  check_tensor(a.v, "v");
  check_tensor(a.o, "o");
  const int64_t B = a.q.b, Hq = a.q.h, Sq = a.q.s, D = a.q.d, Hkv = a.k.h, Skv = a.k.s;
  // Shapes: q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D], o like q.
  if (D != 64 && D != 128) bad("q.d = " + s(D) + " is not 64 or 128");
  auto same = [](const char* what, int64_t got, const char* ref, int64_t want) {
    if (got != want) bad(std::string(what) + " = " + s(got) + " differs from " + ref + " = " + s(want));
  };
  same("k.d", a.k.d, "q.d", D);
  same("v.d", a.v.d, "q.d", D);
  same("o.d", a.o.d, "q.d", D);
  same("k.b", a.k.b, "q.b", B);
  same("v.b", a.v.b, "q.b", B);
  same("o.b", a.o.b, "q.b", B);
  same("v.h", a.v.h, "k.h", Hkv);
  same("v.s", a.v.s, "k.s", Skv);
  same("o.h", a.o.h, "q.h", Hq);
  same("o.s", a.o.s, "q.s", Sq);
  if (Hq % Hkv != 0)
    bad("q.h = " + s(Hq) + " query heads is not a multiple of k.h = " + s(Hkv) + " key/value heads");
  // One dtype, one memory kind.
  const DType dt = a.q.dtype;
  for (const auto& [t, name] : {std::pair{&a.k, "k"}, std::pair{&a.v, "v"}, std::pair{&a.o, "o"}}) {
    if (t->dtype != dt) bad(std::string(name) + " dtype " + to_string(t->dtype) + " differs from q's " + to_string(dt));
    if (t->memory != a.q.memory)
      bad(std::string(name) + " is in " + to_string(t->memory) + " memory but q is in " + to_string(a.q.memory) +
          " memory");
  }
  const AttentionLayout& l = a.layout;
  if (int(l.memory) < 0 || int(l.memory) > 1) bad("layout.memory " + s(int(l.memory)) + " is not " + kMemories);
  if (l.memory != a.q.memory)
    bad(std::string("layout is in ") + to_string(l.memory) + " memory but q is in " + to_string(a.q.memory) +
        " memory");
  if (dt == DType::f32 && a.q.memory == Memory::device)
    bad("dtype f32 is for host memory only (the GPU kernels take f16 or bf16)");
  check_no_self_overlap(a.o, "o");
  if (!std::isfinite(a.scale)) bad("scale = " + std::to_string(a.scale) + " is not finite");

  // The layout's extents.
  if (l.block_q != 64 && l.block_q != 128) bad("layout.block_q = " + s(l.block_q) + " is not 64 or 128");
  if (l.block_kv != l.block_q)
    bad("layout.block_kv = " + s(l.block_kv) + " differs from layout.block_q = " + s(l.block_q) +
        " (blocks are square)");
  if (l.batch != 1 && l.batch != B) bad("layout.batch = " + s(l.batch) + " is neither 1 nor B = " + s(B));
  if (l.heads != 1 && l.heads != Hq && l.heads != Hkv)
    bad("layout.heads = " + s(l.heads) + " is not 1, Hq = " + s(Hq) + " or Hkv = " + s(Hkv));
  const int64_t mq = (Sq + l.block_q - 1) / l.block_q, nk = (Skv + l.block_kv - 1) / l.block_kv;
  if (l.q_blocks != mq)
    bad("layout.q_blocks = " + s(l.q_blocks) + " but Sq = " + s(Sq) + " makes ceil(Sq / block_q) = " + s(mq) +
        " query blocks");
  if (nk > INT32_MAX) bad("Skv = " + s(Skv) + " has more key blocks than int32 indices can name");
  if (l.kmax < 0) bad("layout.kmax = " + s(l.kmax) + " is negative");
  // o holds B * Hq * Sq distinct elements (checked above), so this cannot overflow.
  const int64_t rows = l.batch * l.heads * l.q_blocks;
  int64_t idx_count = 0, full_count = 0;
  if (!mul_add(rows, l.kmax, 0, &idx_count) || idx_count > INT64_MAX / 4)
    bad("layout.kmax = " + s(l.kmax) + ": kv_indices' size overflows 64 bits");
  if (!l.kv_num_blocks) bad("layout.kv_num_blocks is null");
  if (!l.kv_indices && l.kmax > 0) bad("layout.kv_indices is null but layout.kmax = " + s(l.kmax));
  if (l.full_kv_indices && !l.full_kv_num_blocks)
    bad("layout.full_kv_indices is given but layout.full_kv_num_blocks is null (give both or neither)");
  if (l.has_full()) {
    if (l.full_kmax < 0) bad("layout.full_kmax = " + s(l.full_kmax) + " is negative");
    if (!mul_add(rows, l.full_kmax, 0, &full_count) || full_count > INT64_MAX / 4)
      bad("layout.full_kmax = " + s(l.full_kmax) + ": full_kv_indices' size overflows 64 bits");
    if (!l.full_kv_indices && l.full_kmax > 0)
      bad("layout.full_kv_num_blocks is given but layout.full_kv_indices is null while layout.full_kmax = " +
          s(l.full_kmax) + " (give both or neither)");
  }
  int64_t lse_bytes = 0;
  if (a.lse && !mul_add(B * Hq, Sq, 0, &lse_bytes)) bad("lse: B * Hq * Sq overflows 64 bits");
  if (a.lse && !mul_add(lse_bytes, 4, 0, &lse_bytes)) bad("lse: its byte size overflows 64 bits");

  check_packed_sequences(a.cu_seqlens, a.num_seqs, B, Sq, Skv);

  Named inputs[8], outputs[2];
  forward_ranges(a, inputs, outputs);
  check_apart(outputs, 2, inputs, 8, "attention");

  if (check_indices) check_layout_contents(a, stream);
}

void validate(const AttentionBackwardArgs& a, bool check_indices) {
  const AttentionArgs& f = a.forward;
  validate(f, false);
  if (!f.lse) bad("forward.lse is null: the backward needs the forward's lse");
  // dout and dq like q, dk and dv like k: shape, dtype, memory; each output one element per position.
  struct Like {
    const Tensor4View* t;
    const char* name;
    const Tensor4View* like;
    const char* like_name;
  };
  const Like likes[] = {{&a.dout, "dout", &f.q, "q"}, {&a.dq, "dq", &f.q, "q"}, {&a.dk, "dk", &f.k, "k"},
                        {&a.dv, "dv", &f.k, "k"}};
  int64_t bytes[4];
  for (int i = 0; i < 4; ++i) {
    const Like& x = likes[i];
    bytes[i] = check_tensor(*x.t, x.name);
    const Tensor4View &t = *x.t, &w = *x.like;
    if (t.b != w.b || t.h != w.h || t.s != w.s || t.d != w.d)
      bad(std::string(x.name) + " is [" + s(t.b) + ", " + s(t.h) + ", " + s(t.s) + ", " + s(t.d) + "] but " +
          x.like_name + " is [" + s(w.b) + ", " + s(w.h) + ", " + s(w.s) + ", " + s(w.d) + "]: " + x.name +
          " must have " + x.like_name + "'s shape");
    if (t.dtype != w.dtype)
      bad(std::string(x.name) + " dtype " + to_string(t.dtype) + " differs from " + x.like_name + "'s " +
          to_string(w.dtype));
    if (t.memory != f.q.memory)
      bad(std::string(x.name) + " is in " + to_string(t.memory) + " memory but q is in " + to_string(f.q.memory) +
          " memory");
    if (i > 0) check_no_self_overlap(t, x.name);
  }
  Named inputs[11], fwd_out[2];
  forward_ranges(f, inputs, fwd_out);
  inputs[8] = fwd_out[0];  // o and lse are the backward's inputs
  inputs[9] = fwd_out[1];
  inputs[10] = {"dout", byte_range(a.dout.data, bytes[0])};
  const Named outputs[3] = {{"dq", byte_range(a.dq.data, bytes[1])},
                            {"dk", byte_range(a.dk.data, bytes[2])},
                            {"dv", byte_range(a.dv.data, bytes[3])}};
  check_apart(outputs, 3, inputs, 11, "the attention backward");
  if (check_indices) check_layout_contents(f);
}

HostLayout host_layout(const AttentionArgs& a, void* stream) {
  HostLayout hl = host_layout(a.layout, stream);
  if (!a.cu_seqlens) return hl;
  if (a.layout.memory == Memory::host) {
    hl.cu_seqlens = a.cu_seqlens;
    return hl;
  }
  copy_to_host(stream,
               "the stream is being captured into a CUDA graph, but checking cu_seqlens reads it on the host (a "
               "synchronizing copy the capture cannot contain): check it before the capture and capture the calls "
               "with check_indices off",
               {{a.cu_seqlens, a.num_seqs + 1, &hl.copies[4], "cudaMemcpy(cu_seqlens to host)"}});
  hl.cu_seqlens = hl.copies[4].data();
  return hl;
}

HostLayout host_layout(const AttentionLayout& l, void* stream) {
  HostLayout hl;
  const int64_t rows = l.batch * l.heads * l.q_blocks;
  const int32_t* src[4] = {l.kv_num_blocks, l.kv_indices, l.full_kv_num_blocks, l.full_kv_indices};
  const int32_t** dst[4] = {&hl.num, &hl.idx, &hl.full_num, &hl.full_idx};
  if (l.memory == Memory::host) {
    for (int a = 0; a < 4; ++a) *dst[a] = src[a];
    return hl;
  }
  const int64_t count[4] = {rows, rows * l.kmax, l.has_full() ? rows : 0, l.has_full() ? rows * l.full_kmax : 0};
  static const char* what[4] = {"cudaMemcpy(kv_num_blocks to host)", "cudaMemcpy(kv_indices to host)",
                                "cudaMemcpy(full_kv_num_blocks to host)", "cudaMemcpy(full_kv_indices to host)"};
  copy_to_host(stream,
               "the stream is being captured into a CUDA graph, but checking a device layout's contents reads it "
               "on the host (a synchronizing copy the capture cannot contain): check the layout before the "
               "capture and capture the calls with check_indices off",
               {{src[0], count[0], &hl.copies[0], what[0]},
                {src[1], count[1], &hl.copies[1], what[1]},
                {src[2], count[2], &hl.copies[2], what[2]},
                {src[3], count[3], &hl.copies[3], what[3]}});
  for (int a = 0; a < 4; ++a)
    if (!hl.copies[a].empty()) *dst[a] = hl.copies[a].data();
  return hl;
}

void check_layout_contents(const AttentionArgs& a, void* stream) {
  if (a.layout.memory == Memory::device && !device_info().available)
    throw no_gpu_error("the layout is in device memory", "the layout is in device memory but no CUDA device answers: ");
  validate_layout_contents(a, host_layout(a, stream));
}

void validate_layout_contents(const AttentionArgs& a, const HostLayout& hl) {
  const AttentionLayout& l = a.layout;
  if (hl.cu_seqlens) check_cu_seqlens(hl.cu_seqlens, a.num_seqs, a.q.s);
  const int64_t nk = (a.k.s + l.block_kv - 1) / l.block_kv;
  auto check_list = [&](const int32_t* num, const int32_t* idx, int64_t kmax, const char* num_name,
                        const char* idx_name, int64_t r, int64_t b, int64_t h, int64_t i) {
    const int32_t n = num[r];
    if (n < 0 || n > kmax)
      bad(at(num_name, b, h, i) + " = " + s(n) + " is out of range [0, " + s(kmax) + "] (kmax = " + s(kmax) + ")");
    const int32_t* row = idx + r * kmax;
    for (int32_t j = 0; j < n; ++j) {
      if (row[j] < 0 || row[j] >= nk)
        bad(at(idx_name, b, h, i, j) + " = " + s(row[j]) + " is out of range [0, " + s(nk) + ")");
      if (j > 0 && row[j] <= row[j - 1])
        bad(at(idx_name, b, h, i, j) + " = " + s(row[j]) + " is not greater than " + at(idx_name, b, h, i, j - 1) +
            " = " + s(row[j - 1]) + " (a row's indices must be sorted and unique)");
    }
  };
  for (int64_t b = 0, r = 0; b < l.batch; ++b)
    for (int64_t h = 0; h < l.heads; ++h)
      for (int64_t i = 0; i < l.q_blocks; ++i, ++r) {
        check_list(hl.num, hl.idx, l.kmax, "kv_num_blocks", "kv_indices", r, b, h, i);
        if (!l.has_full()) continue;
        check_list(hl.full_num, hl.full_idx, l.full_kmax, "full_kv_num_blocks", "full_kv_indices", r, b, h, i);
        // Both rows are sorted: one merge finds a block named twice.
        const int32_t *p = hl.idx + r * l.kmax, *f = hl.full_idx + r * l.full_kmax;
        for (int32_t x = 0, y = 0; x < hl.num[r] && y < hl.full_num[r];) {
          if (p[x] == f[y])
            bad(at("full_kv_indices", b, h, i, y) + " = " + s(f[y]) + " is also " + at("kv_indices", b, h, i, x) +
                " (a block is either masked or full, not both)");
          if (p[x] < f[y]) ++x; else ++y;
        }
      }
}

double effective_flops(const AttentionArgs& a, const HostLayout& hl) {
  const AttentionLayout& l = a.layout;
  const int64_t Sq = a.q.s, Skv = a.k.s, bq = l.block_q, bk = l.block_kv;
  double elements = 0;
  for (int64_t b = 0; b < a.q.b; ++b)
    for (int64_t h = 0; h < a.q.h; ++h)
      for (int64_t i = 0; i < l.q_blocks; ++i) {
        const int64_t r = layout_row(l, a.q.h, a.k.h, b, h, i);
        const int64_t r0 = i * bq, r1 = std::min(Sq, r0 + bq);
        auto add = [&](const int32_t* list, int32_t n, bool masked) {
          for (int32_t j = 0; j < n; ++j) {
            const int64_t c0 = int64_t(list[j]) * bk, c1 = std::min(Skv, c0 + bk);
            if (hl.cu_seqlens) {  // each row's keys: its own sequence's, causal inside the masked list
              for (int64_t q = r0; q < r1; ++q) {
                const int64_t d = sequence_of(hl.cu_seqlens, a.num_seqs, q);
                int64_t hi = std::min<int64_t>(c1, hl.cu_seqlens[d + 1]);
                if (masked && a.causal) hi = std::min(hi, q + 1);
                elements += double(std::max<int64_t>(0, hi - std::max<int64_t>(c0, hl.cu_seqlens[d])));
              }
              continue;
            }
            if (!(masked && a.causal)) {
              elements += double((r1 - r0) * (c1 - c0));
              continue;
            }
            for (int64_t q = r0; q < r1; ++q) elements += double(std::max<int64_t>(0, std::min(q + 1, c1) - c0));
          }
        };
        add(hl.idx + r * l.kmax, hl.num[r], true);
        if (l.has_full()) add(hl.full_idx + r * l.full_kmax, hl.full_num[r], false);
      }
  return 4.0 * double(a.q.d) * elements;
}

double effective_flops(const AttentionArgs& args) {
  validate(args, true);
  return effective_flops(args, host_layout(args));
}

}  // namespace sparsek
