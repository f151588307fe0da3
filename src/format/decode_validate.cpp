// validate() of decode attention: the cheap checks (shapes, dtypes, strides, memory, pointers,
// aliasing) and the checks of the index arrays' contents. Every error names the argument and the
// value.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "format/decode_internal.hpp"
#include "format/format_internal.hpp"

namespace sparsek {

namespace {

[[noreturn]] void bad_in(const char* op, const std::string& what) {
  throw Error(Status::invalid_argument, std::string(op) + ": " + what);
}
[[noreturn]] void bad(const std::string& what) { bad_in("decode_attention", what); }
std::string num(int64_t v) { return std::to_string(v); }

// The view's dimensions (extent, stride), D innermost with stride 1, do not overlap: sorted by
// stride, each stride is at least the span of the dimensions inside it. Also no overflow.
void check_strides(const char* name, std::vector<std::pair<int64_t, int64_t>> dims, const char* const* names,
                   const char* op = "decode_attention") {
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i].second < 0 || dims[i].second > (int64_t(1) << 40))
      bad_in(op, std::string(name) + "." + names[i] + " = " + num(dims[i].second) + " is negative or too large");
  std::vector<size_t> order(dims.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return dims[a].second < dims[b].second; });
  int64_t span = 1;  // elements the dimensions so far cover (D is contiguous: stride 1)
  for (size_t i : order) {
    if (dims[i].first <= 1) continue;
    if (dims[i].second < span)
      bad_in(op, std::string(name) + "." + names[i] + " = " + num(dims[i].second) + " overlaps the dimensions inside it (needs >= " +
          num(span) + ")");
    span = dims[i].second * dims[i].first;
  }
}

int64_t span_elems(const TokensView& t) { return (t.t - 1) * t.stride_t + (t.h - 1) * t.stride_h + t.d; }
int64_t span_elems(const PagedCacheView& c) {
  return (c.pages - 1) * c.stride_page + (c.page_size - 1) * c.stride_slot + (c.h - 1) * c.stride_h + c.d;
}

void check_dtype(const char* name, DType t, Memory m, const char* op = "decode_attention") {
  if (t != DType::f16 && t != DType::bf16 && t != DType::f32)
    bad_in(op, std::string(name) + " dtype " + to_string(t) + " is not supported (f16, bf16, or f32 on the host)");
  if (t == DType::f32 && m == Memory::device)
    bad_in(op, std::string(name) + " dtype f32 runs on the host only (the GPU takes f16 and bf16)");
}

// The shapes decode attention and page selection share: q [T, Hq, D], the cache's heads, D and pages.
void check_shapes(const TokensView& q, const PagedCacheView& k, const char* op) {
  if (q.t < 1) bad_in(op, "q.t (new tokens) = " + num(q.t) + " must be >= 1");
  if (q.h < 1) bad_in(op, "q.h = " + num(q.h) + " must be >= 1");
  if (q.d != 64 && q.d != 128) bad_in(op, "q.d = " + num(q.d) + " is not supported (64 or 128)");
  if (k.h < 1) bad_in(op, "k.h = " + num(k.h) + " must be >= 1");
  if (q.h % k.h != 0) bad_in(op, "q.h = " + num(q.h) + " is not a multiple of k.h = " + num(k.h));
  if (k.d != q.d) bad_in(op, "k.d = " + num(k.d) + " differs from q.d = " + num(q.d));
  if (k.pages < 1) bad_in(op, "k.pages = " + num(k.pages) + " must be >= 1");
  if (k.page_size < 16 || k.page_size > 128 || k.page_size % 16 != 0)
    bad_in(op, "k.page_size = " + num(k.page_size) + " is not supported (a multiple of 16 in [16, 128])");
}

void check_cheap(const DecodeArgs& a) {
  const TokensView &q = a.q, &o = a.o;
  const PagedCacheView &k = a.k, &v = a.v;
  for (auto [m, name] : {std::pair{q.memory, "q"}, std::pair{a.index_memory, "index_memory"}})
    if (m != Memory::host && m != Memory::device)
      bad(std::string(name) + " memory = " + num(int(m)) + " is neither host (0) nor device (1)");
  check_shapes(q, k, "decode_attention");
  const int64_t kf[7] = {k.pages, k.page_size, k.h, k.d, k.stride_page, k.stride_slot, k.stride_h};
  const int64_t vf[7] = {v.pages, v.page_size, v.h, v.d, v.stride_page, v.stride_slot, v.stride_h};
  static const char* cf[7] = {"pages", "page_size", "h", "d", "stride_page", "stride_slot", "stride_h"};
  for (int i = 0; i < 7; ++i)
    if (kf[i] != vf[i]) bad(std::string("v.") + cf[i] + " = " + num(vf[i]) + " differs from k." + cf[i] + " = " + num(kf[i]));
  if (o.t != q.t || o.h != q.h || o.d != q.d)
    bad("o is [" + num(o.t) + ", " + num(o.h) + ", " + num(o.d) + "], q is [" + num(q.t) + ", " + num(q.h) + ", " +
        num(q.d) + "]");
  for (auto [t, name] : {std::pair{k.dtype, "k"}, std::pair{v.dtype, "v"}, std::pair{o.dtype, "o"}})
    if (t != q.dtype) bad(std::string(name) + " dtype " + to_string(t) + " differs from q dtype " + to_string(q.dtype));
  check_dtype("q", q.dtype, q.memory);
  for (auto [m, name] : {std::pair{k.memory, "k"}, std::pair{v.memory, "v"}, std::pair{o.memory, "o"},
                         std::pair{a.index_memory, "the index arrays (index_memory)"}})
    if (m != q.memory) bad(std::string(name) + " memory is " + to_string(m) + ", q's is " + to_string(q.memory));
  static const char* tsn[3] = {"stride_t", "stride_h", "d"};
  check_strides("q", {{q.t, q.stride_t}, {q.h, q.stride_h}, {q.d, 1}}, tsn);
  check_strides("o", {{o.t, o.stride_t}, {o.h, o.stride_h}, {o.d, 1}}, tsn);
  static const char* csn[4] = {"stride_page", "stride_slot", "stride_h", "d"};
  check_strides("k", {{k.pages, k.stride_page}, {k.page_size, k.stride_slot}, {k.h, k.stride_h}, {k.d, 1}}, csn);
  if (a.batch < 1) bad("batch = " + num(a.batch) + " must be >= 1");
  if (a.max_pages < 1) bad("max_pages = " + num(a.max_pages) + " must be >= 1");
  if (a.max_pages * k.page_size > (int64_t(1) << 31) - 1)
    bad("max_pages * page_size = " + num(a.max_pages * k.page_size) + " exceeds int32");
  if (q.t < a.batch || q.t > a.batch * kDecodeMaxNewTokens)
    bad("q.t = " + num(q.t) + " new tokens cannot be 1..16 per request for batch = " + num(a.batch));
  for (auto [p, name] : {std::pair{(const void*)q.data, "q.data"}, std::pair{(const void*)k.data, "k.data"},
                         std::pair{(const void*)v.data, "v.data"}, std::pair{(const void*)o.data, "o.data"},
                         std::pair{(const void*)a.page_table, "page_table"}, std::pair{(const void*)a.seq_lens, "seq_lens"},
                         std::pair{(const void*)a.cu_seqlens_q, "cu_seqlens_q"}})
    if (!p) bad(std::string(name) + " is null");
  if ((a.sel_indices == nullptr) != (a.sel_counts == nullptr))
    bad(std::string("sel_indices and sel_counts go together, but only ") + (a.sel_indices ? "sel_indices" : "sel_counts") +
        " is given");
  if (a.has_selection() && (a.sel_kmax < 0 || a.sel_kmax > a.max_pages))
    bad("sel_kmax = " + num(a.sel_kmax) + " is out of range [0, max_pages = " + num(a.max_pages) + "]");
  // Outputs overlap no input and not each other.
  const size_t es = dtype_size(q.dtype);
  const ByteRange ro = byte_range(o.data, span_elems(o) * int64_t(es));
  const ByteRange ins[3] = {byte_range(q.data, span_elems(q) * int64_t(es)), byte_range(k.data, span_elems(k) * int64_t(es)),
                            byte_range(v.data, span_elems(v) * int64_t(es))};
  static const char* inn[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i)
    if (ro.overlaps(ins[i])) bad(std::string("o overlaps ") + inn[i]);
  if (a.lse) {
    const ByteRange rl = byte_range(a.lse, q.t * q.h * 4);
    if (rl.overlaps(ro)) bad("lse overlaps o");
    for (int i = 0; i < 3; ++i)
      if (rl.overlaps(ins[i])) bad(std::string("lse overlaps ") + inn[i]);
  }
}

}  // namespace

DecodeIndices host_decode_indices(const DecodeArgs& a, void* stream) {
  DecodeIndices ix;
  const int64_t B = a.batch, hkv = a.k.h;
  if (a.index_memory == Memory::host) {
    ix.page_table = a.page_table, ix.seq_lens = a.seq_lens, ix.cu_seqlens_q = a.cu_seqlens_q;
    ix.sel_indices = a.sel_indices, ix.sel_counts = a.sel_counts;
    return ix;
  }
  copy_to_host(stream,
               "decode_attention: the index arrays are in device memory and the stream is being captured into a "
               "CUDA graph: check their contents before the capture (validate(args, true)) and capture run() alone",
               {{a.page_table, B * a.max_pages, &ix.copies[0], "cudaMemcpy(page_table to host)"},
                {a.seq_lens, B, &ix.copies[1], "cudaMemcpy(seq_lens to host)"},
                {a.cu_seqlens_q, B + 1, &ix.copies[2], "cudaMemcpy(cu_seqlens_q to host)"},
                {a.sel_indices, a.has_selection() ? B * hkv * a.sel_kmax : 0, &ix.copies[3],
                 "cudaMemcpy(sel_indices to host)"},
                {a.sel_counts, a.has_selection() ? B * hkv : 0, &ix.copies[4], "cudaMemcpy(sel_counts to host)"}});
  ix.page_table = ix.copies[0].data(), ix.seq_lens = ix.copies[1].data(), ix.cu_seqlens_q = ix.copies[2].data();
  if (a.has_selection()) ix.sel_indices = ix.copies[3].data(), ix.sel_counts = ix.copies[4].data();
  return ix;
}

void check_decode_contents(const DecodeArgs& a, const DecodeIndices& ix, const char* op) {
  const int64_t B = a.batch, ps = a.k.page_size, hkv = a.k.h, T = a.q.t;
  if (ix.cu_seqlens_q[0] != 0) bad_in(op, "cu_seqlens_q[0] = " + num(ix.cu_seqlens_q[0]) + " must be 0");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = int64_t(ix.cu_seqlens_q[b + 1]) - ix.cu_seqlens_q[b];
    if (n < 1 || n > kDecodeMaxNewTokens)
      bad_in(op, "request " + num(b) + " has " + num(n) + " new tokens (cu_seqlens_q[" + num(b + 1) + "] - cu_seqlens_q[" +
          num(b) + "]; must be 1..16: cu_seqlens_q must increase)");
    const int64_t len = ix.seq_lens[b];
    if (len < n)
      bad_in(op, "seq_lens[" + num(b) + "] = " + num(len) + " is less than the request's " + num(n) + " new tokens");
    if (len > a.max_pages * ps)
      bad_in(op, "seq_lens[" + num(b) + "] = " + num(len) + " is beyond the request's max_pages * page_size = " +
          num(a.max_pages * ps) + " tokens");
    const int64_t used = (len + ps - 1) / ps;
    for (int64_t p = 0; p < used; ++p) {
      const int64_t pp = ix.page_table[b * a.max_pages + p];
      if (pp < 0 || pp >= a.k.pages)
        bad_in(op, "page_table[" + num(b) + ", " + num(p) + "] = " + num(pp) + " is out of range [0, " + num(a.k.pages) + ")");
    }
    if (!a.has_selection()) continue;
    for (int64_t h = 0; h < hkv; ++h) {
      const int64_t c = ix.sel_counts[b * hkv + h];
      if (c < 0 || c > a.sel_kmax)
        bad_in(op, "sel_counts[" + num(b) + ", " + num(h) + "] = " + num(c) + " is out of range [0, sel_kmax = " +
            num(a.sel_kmax) + "]");
      const int32_t* row = ix.sel_indices + (b * hkv + h) * a.sel_kmax;
      for (int64_t e = 0; e < c; ++e) {
        const std::string at = "sel_indices[" + num(b) + ", " + num(h) + ", " + num(e) + "] = " + num(row[e]);
        if (row[e] < 0 || row[e] >= used)
          bad_in(op, at + " is out of range [0, " + num(used) + ") (the request's pages: seq_lens[" + num(b) + "] = " +
              num(len) + ")");
        if (e > 0 && row[e] <= row[e - 1])
          bad_in(op, at + (row[e] == row[e - 1] ? " repeats the entry before it" : " is below the entry before it (must be sorted)"));
      }
    }
  }
  if (ix.cu_seqlens_q[B] != T)
    bad_in(op, "cu_seqlens_q[" + num(B) + "] = " + num(ix.cu_seqlens_q[B]) + " differs from q.t = " + num(T));
}

namespace {
// The decode arguments page selection shares (shapes, index arrays): their content checks.
DecodeArgs as_decode_args(const PageSelectArgs& a) {
  DecodeArgs d;
  d.q = a.q;
  d.k = d.v = a.k;
  d.page_table = a.page_table, d.seq_lens = a.seq_lens, d.cu_seqlens_q = a.cu_seqlens_q;
  d.batch = a.batch, d.max_pages = a.max_pages;
  d.index_memory = a.index_memory;
  return d;
}
}  // namespace

void validate(const PageSelectArgs& a, PageOp op_kind, bool check_contents, void* stream) {
  const bool sel = op_kind == PageOp::select;
  const char* op = sel ? "select_pages" : "update_page_summaries";
  auto fail = [&](const std::string& what) { bad_in(op, what); };
  const TokensView& q = a.q;
  const PagedCacheView& k = a.k;
  for (auto [m, name] : {std::pair{k.memory, "k"}, std::pair{a.index_memory, "index_memory"}})
    if (m != Memory::host && m != Memory::device)
      fail(std::string(name) + " memory = " + num(int(m)) + " is neither host (0) nor device (1)");
  if (a.index_memory != k.memory)
    fail(std::string("the index arrays (index_memory) are in ") + to_string(a.index_memory) + " memory, k in " + to_string(k.memory));
  check_shapes(q, k, op);
  check_dtype("k", k.dtype, k.memory, op);
  static const char* csn[4] = {"stride_page", "stride_slot", "stride_h", "d"};
  check_strides("k", {{k.pages, k.stride_page}, {k.page_size, k.stride_slot}, {k.h, k.stride_h}, {k.d, 1}}, csn, op);
  if (sel) {
    if (q.memory != k.memory) fail(std::string("q memory is ") + to_string(q.memory) + ", k's is " + to_string(k.memory));
    if (q.dtype != k.dtype) fail(std::string("q dtype ") + to_string(q.dtype) + " differs from k dtype " + to_string(k.dtype));
    static const char* tsn[3] = {"stride_t", "stride_h", "d"};
    check_strides("q", {{q.t, q.stride_t}, {q.h, q.stride_h}, {q.d, 1}}, tsn, op);
  }
  if (a.batch < 1) fail("batch = " + num(a.batch) + " must be >= 1");
  if (a.max_pages < 1) fail("max_pages = " + num(a.max_pages) + " must be >= 1");
  if (a.max_pages * k.page_size > (int64_t(1) << 31) - 1)
    fail("max_pages * page_size = " + num(a.max_pages * k.page_size) + " exceeds int32");
  if (q.t < a.batch || q.t > a.batch * kDecodeMaxNewTokens)
    fail("q.t = " + num(q.t) + " new tokens cannot be 1..16 per request for batch = " + num(a.batch));
  std::vector<std::pair<const void*, const char*>> need = {
      {a.summaries, "summaries"}, {a.page_table, "page_table"}, {a.seq_lens, "seq_lens"}, {a.cu_seqlens_q, "cu_seqlens_q"}};
  if (sel) {
    need.insert(need.end(), {{q.data, "q.data"}, {a.sel_indices, "sel_indices"}, {a.sel_counts, "sel_counts"}});
  } else {
    need.push_back({k.data, "k.data"});
  }
  for (auto [ptr, name] : need)
    if (!ptr) fail(std::string(name) + " is null");
  const size_t es = dtype_size(k.dtype);
  const ByteRange rs = byte_range(a.summaries, k.pages * k.h * 2 * k.d * int64_t(es));
  if (sel) {
    for (auto [v, name] : {std::pair{a.topk, "topk"}, std::pair{a.sink, "sink"}, std::pair{a.local, "local"}})
      if (v < 0 || v > INT32_MAX) fail(std::string(name) + " = " + num(v) + " is out of range [0, 2^31 - 1]");
    const int64_t most = std::min(a.max_pages, a.topk + a.sink + a.local);
    if (a.sel_kmax < most || a.sel_kmax > a.max_pages)
      fail("sel_kmax = " + num(a.sel_kmax) + " is out of range [min(max_pages, topk + sink + local) = " + num(most) +
           ", max_pages = " + num(a.max_pages) + "]");
    // The outputs overlap nothing the call reads, nor each other.
    const ByteRange ri = byte_range(a.sel_indices, a.batch * k.h * a.sel_kmax * 4);
    const ByteRange rc = byte_range(a.sel_counts, a.batch * k.h * 4);
    if (ri.overlaps(rc)) fail("sel_indices overlaps sel_counts");
    const ByteRange ins[5] = {byte_range(a.page_table, a.batch * a.max_pages * 4), byte_range(a.seq_lens, a.batch * 4),
                              byte_range(a.cu_seqlens_q, (a.batch + 1) * 4), rs,
                              byte_range(q.data, span_elems(q) * int64_t(es))};
    static const char* inn[5] = {"page_table", "seq_lens", "cu_seqlens_q", "summaries", "q"};
    for (int i = 0; i < 5; ++i) {
      if (ri.overlaps(ins[i])) fail(std::string("sel_indices overlaps ") + inn[i]);
      if (rc.overlaps(ins[i])) fail(std::string("sel_counts overlaps ") + inn[i]);
    }
  } else if (rs.overlaps(byte_range(k.data, span_elems(k) * int64_t(es)))) {
    fail("summaries overlaps k");
  }
  if (!check_contents) return;
  const DecodeArgs d = as_decode_args(a);
  const DecodeIndices ix = host_decode_indices(d, stream);
  check_decode_contents(d, ix, op);
}

void validate(const DecodeArgs& a, bool check_contents, void* stream) {
  check_cheap(a);
  if (!check_contents) return;
  const DecodeIndices ix = host_decode_indices(a, stream);
  check_decode_contents(a, ix);
}

}  // namespace sparsek
