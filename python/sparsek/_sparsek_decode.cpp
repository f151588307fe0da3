// sparsek._sparsek: decode attention over a paged KV cache, its plan, and page selection
// (update_page_summaries, select_pages).
#include "_sparsek_arrays.hpp"

namespace sparsek::py {
namespace {

// ---- decode attention over a paged KV cache ----

// A [T, H, D] array with a unit stride along D.
template <class A>
TokensView tokens_view(const A& a, const std::string& name) {
  if (a.ndim() != 3) bad(name + " must be a 3-D array [T, H, D], got shape " + shape_str(a));
  TokensView t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = value_dtype(a.dtype(), name);
  t.memory = place_of(a, name).memory;
  t.t = int64_t(a.shape(0)), t.h = int64_t(a.shape(1)), t.d = int64_t(a.shape(2));
  if (t.d > 1 && a.stride(2) != 1)
    bad(name + " must have a unit stride along D (its last dimension), got stride " + std::to_string(a.stride(2)));
  t.stride_t = a.stride(0), t.stride_h = a.stride(1);
  return t;
}
// A [pages, page_size, H, D] array with a unit stride along D.
template <class A>
PagedCacheView cache_view(const A& a, const std::string& name) {
  if (a.ndim() != 4) bad(name + " must be a 4-D array [pages, page_size, H, D], got shape " + shape_str(a));
  PagedCacheView c;
  c.data = const_cast<void*>(static_cast<const void*>(a.data()));
  c.dtype = value_dtype(a.dtype(), name);
  c.memory = place_of(a, name).memory;
  c.pages = int64_t(a.shape(0)), c.page_size = int64_t(a.shape(1)), c.h = int64_t(a.shape(2)), c.d = int64_t(a.shape(3));
  if (c.d > 1 && a.stride(3) != 1)
    bad(name + " must have a unit stride along D (its last dimension), got stride " + std::to_string(a.stride(3)));
  c.stride_page = a.stride(0), c.stride_slot = a.stride(1), c.stride_h = a.stride(2);
  return c;
}

// sel_indices' entries. With kmax = 0 the array is empty and its pointer may be null (torch reports
// 0 for every empty tensor), while the library wants a pointer beside sel_counts but reads and
// writes no entry: any non-null address will do.
template <class A>
int32_t* sel_entries(const A& a) {
  static int32_t no_entries = 0;
  if (a.size() == 0) return &no_entries;
  return static_cast<int32_t*>(const_cast<void*>(static_cast<const void*>(a.data())));
}

// The library cannot see where a raw pointer lives: every array of a call must be in the memory
// (and on the device) of `ref`, or a kernel would read host memory as device memory.
template <class A>
void same_place(const A& a, const std::string& name, const Place& ref, const std::string& ref_name) {
  const Place p = place_of(a, name);
  if (p.memory != ref.memory || (p.memory == Memory::device && p.device != ref.device))
    bad(name + " is in " + (p.memory == Memory::host ? "host memory" : "CUDA device " + std::to_string(p.device)) +
        " but " + ref_name + " is in " +
        (ref.memory == Memory::host ? "host memory" : "CUDA device " + std::to_string(ref.device)));
}

// The request arrays decode attention and page selection share: int32 page_table [batch,
// max_pages], seq_lens [batch], cu_seqlens_q [batch + 1], checked; their pointers into `a`.
template <class Args>
void set_requests(Args& a, const In& page_table, const In& seq_lens, const In& cu) {
  check_array(page_table, "page_table", 2, true);
  check_array(seq_lens, "seq_lens", 1, true);
  check_array(cu, "cu_seqlens_q", 1, true);
  a.batch = int64_t(page_table.shape(0));
  a.max_pages = int64_t(page_table.shape(1));
  if (int64_t(seq_lens.shape(0)) != a.batch)
    bad("seq_lens has shape " + shape_str(seq_lens) + ", page_table " + shape_str(page_table) + ": one length per request");
  if (int64_t(cu.shape(0)) != a.batch + 1)
    bad("cu_seqlens_q has shape " + shape_str(cu) + ", expected (batch + 1,) = (" + std::to_string(a.batch + 1) + ",)");
  a.page_table = static_cast<const int32_t*>(page_table.data());
  a.seq_lens = static_cast<const int32_t*>(seq_lens.data());
  a.cu_seqlens_q = static_cast<const int32_t*>(cu.data());
}

DecodeArgs decode_args(const In& q, const In& k, const In& v, const Out& o, const OptOut& lse, const In& page_table,
                       const In& seq_lens, const In& cu, const OptIn& sel_idx, const OptIn& sel_cnt, bool causal_new,
                       float scale, std::vector<Place>& places) {
  DecodeArgs a;
  a.q = tokens_view(q, "q");
  a.o = tokens_view(o, "o");
  a.k = cache_view(k, "k_cache");
  a.v = cache_view(v, "v_cache");
  for (const auto& [arr, name] : {std::pair{&q, "q"}, std::pair{&k, "k_cache"}, std::pair{&v, "v_cache"}})
    places.push_back(place_of(*arr, name));
  places.push_back(place_of(o, "o"));
  if (lse) {
    check_array(*lse, "lse", 2, false);
    if (int64_t(lse->shape(0)) != a.q.t || int64_t(lse->shape(1)) != a.q.h)
      bad("lse has shape " + shape_str(*lse) + ", expected [T, Hq]");
    places.push_back(place_of(*lse, "lse"));
    a.lse = static_cast<float*>(const_cast<void*>(static_cast<const void*>(lse->data())));
  }
  set_requests(a, page_table, seq_lens, cu);
  Place ip = place_of(page_table, "page_table");
  for (const auto& [arr, name] : {std::pair{&seq_lens, "seq_lens"}, std::pair{&cu, "cu_seqlens_q"}}) {
    same_place(*arr, name, ip, "page_table");
    places.push_back(place_of(*arr, name));
  }
  places.push_back(ip);
  if (sel_idx.has_value() != sel_cnt.has_value()) bad("sel_indices and sel_counts must be given both or neither");
  if (sel_idx) {
    check_array(*sel_idx, "sel_indices", 3, true);
    check_array(*sel_cnt, "sel_counts", 2, true);
    if (int64_t(sel_idx->shape(0)) != a.batch || int64_t(sel_idx->shape(1)) != a.k.h ||
        int64_t(sel_cnt->shape(0)) != a.batch || int64_t(sel_cnt->shape(1)) != a.k.h)
      bad("sel_indices " + shape_str(*sel_idx) + " and sel_counts " + shape_str(*sel_cnt) +
          " must be [batch, Hkv, kmax] and [batch, Hkv]");
    a.sel_indices = sel_entries(*sel_idx);
    a.sel_counts = static_cast<const int32_t*>(sel_cnt->data());
    a.sel_kmax = int64_t(sel_idx->shape(2));
    same_place(*sel_idx, "sel_indices", ip, "page_table");
    same_place(*sel_cnt, "sel_counts", ip, "page_table");
    places.push_back(place_of(*sel_idx, "sel_indices"));
    places.push_back(place_of(*sel_cnt, "sel_counts"));
  }
  a.index_memory = ip.memory;
  a.causal_new = causal_new;
  a.scale = scale;
  return a;
}

struct PyDecodePlan {
  DecodePlan plan;
  DecodeArgs problem;
  int device = -1;
};

// The plan's problem with its data pointers replaced (lse and the selection only where the problem
// has them; an empty selection row keeps its placeholder, as sel_entries gives one): a run that
// skips the array conversions (tens of microseconds per call from PyTorch).
void run_decode_pointers(const PyDecodePlan& p, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
                         uintptr_t page_table, uintptr_t seq_lens, uintptr_t cu, uintptr_t sel_idx, uintptr_t sel_cnt,
                         uintptr_t stream) {
  DecodeArgs a = p.problem;
  a.q.data = reinterpret_cast<void*>(q);
  a.k.data = reinterpret_cast<void*>(k);
  a.v.data = reinterpret_cast<void*>(v);
  a.o.data = reinterpret_cast<void*>(o);
  if (a.lse) a.lse = reinterpret_cast<float*>(lse);
  a.page_table = reinterpret_cast<const int32_t*>(page_table);
  a.seq_lens = reinterpret_cast<const int32_t*>(seq_lens);
  a.cu_seqlens_q = reinterpret_cast<const int32_t*>(cu);
  if (a.sel_counts) {
    if (a.sel_kmax > 0) a.sel_indices = reinterpret_cast<const int32_t*>(sel_idx);
    a.sel_counts = reinterpret_cast<const int32_t*>(sel_cnt);
  }
  PlanDevice guard(p.device);
  nb::gil_scoped_release release;
  run(p.plan, a, reinterpret_cast<void*>(stream));
}

// ---- page selection for decode (update_page_summaries, select_pages) ----

// summaries [num_pages, Hkv, 2, D], C-contiguous, of `dtype`.
template <class A>
void check_summaries(const A& s, DType dtype, const std::string& dtype_of) {
  if (s.ndim() != 4 || s.shape(2) != 2)
    bad("summaries must be a 4-D array [num_pages, Hkv, 2, D], got shape " + shape_str(s));
  const DType t = value_dtype(s.dtype(), "summaries");
  if (t != dtype)
    bad(std::string("summaries dtype ") + to_string(t) + " differs from " + dtype_of + " dtype " + to_string(dtype));
  if (!c_contiguous(s)) bad("summaries must be contiguous");
}

// The index arrays page selection shares with decode attention: checked, in `ref`'s place.
PageSelectArgs page_select_indices(const In& page_table, const In& seq_lens, const In& cu, const Place& ref,
                                   const std::string& ref_name) {
  PageSelectArgs a;
  set_requests(a, page_table, seq_lens, cu);
  same_place(page_table, "page_table", ref, ref_name);
  same_place(seq_lens, "seq_lens", ref, ref_name);
  same_place(cu, "cu_seqlens_q", ref, ref_name);
  a.index_memory = ref.memory;
  return a;
}

// Runs op after validating the arguments (the index contents too with check_indices: a device copy
// waits for `stream`, with the GIL released), on the arrays' device.
void run_page_op(const PageSelectArgs& a, PageOp op, const Place& where, uintptr_t stream, bool check_indices) {
  DeviceGuard guard({where});
  Options o = options_for(stream, check_indices);
  nb::gil_scoped_release release;
  op == PageOp::select ? select_pages(a, o) : update_page_summaries(a, o);
}

// A page operation made once from the arrays (shapes, strides, dtypes, place: checked then); later
// runs pass only data pointers and never check the index contents (check_indices off: no host
// read, capturable), skipping the array conversions. Nothing to allocate, so any stream may run it.
struct PyPageProblem {
  PageSelectArgs args;
  PageOp op = PageOp::select;
  int device = -1;  // -1: host memory
};

PyPageProblem page_problem(const PageSelectArgs& a, PageOp op, const Place& where) {
  PyPageProblem p;
  p.args = a;
  p.op = op;
  p.device = where.memory == Memory::device ? where.device : -1;
  return p;
}

void run_page_problem(const PyPageProblem& p, PageSelectArgs a, uintptr_t stream) {
  PlanDevice guard(p.device);
  Options o = options_for(stream, false);
  nb::gil_scoped_release release;
  p.op == PageOp::select ? select_pages(a, o) : update_page_summaries(a, o);
}

void set_request_pointers(PageSelectArgs& a, uintptr_t page_table, uintptr_t seq_lens, uintptr_t cu) {
  a.page_table = reinterpret_cast<const int32_t*>(page_table);
  a.seq_lens = reinterpret_cast<const int32_t*>(seq_lens);
  a.cu_seqlens_q = reinterpret_cast<const int32_t*>(cu);
}

// update_page_summaries' arguments, checked (the index contents apart); where: k_cache's place.
PageSelectArgs update_args(const Out& summaries, const In& k, const In& page_table, const In& seq_lens, const In& cu,
                           int64_t tokens, bool all_pages, Place& where) {
  const PagedCacheView kv = cache_view(k, "k_cache");
  where = place_of(k, "k_cache");
  check_summaries(summaries, kv.dtype, "k_cache");
  if (int64_t(summaries.shape(0)) != kv.pages || int64_t(summaries.shape(1)) != kv.h ||
      int64_t(summaries.shape(3)) != kv.d)
    bad("summaries has shape " + shape_str(summaries) + ", expected [num_pages, Hkv, 2, D] = (" +
        std::to_string(kv.pages) + ", " + std::to_string(kv.h) + ", 2, " + std::to_string(kv.d) + ") for k_cache " +
        shape_str(k));
  if (kv.d != 64 && kv.d != 128)
    bad("k_cache has D = " + std::to_string(kv.d) + " (its last dimension): 64 or 128 are supported");
  same_place(summaries, "summaries", where, "k_cache");
  PageSelectArgs a = page_select_indices(page_table, seq_lens, cu, where, "k_cache");
  a.k = kv;
  // update reads q's shape only: T bounds cu_seqlens_q.
  a.q = TokensView::packed(nullptr, kv.dtype, kv.memory, tokens, kv.h, kv.d);
  a.summaries = const_cast<void*>(static_cast<const void*>(summaries.data()));
  a.all_pages = all_pages;
  return a;
}

// select_pages' arguments, checked (the index contents apart); where: q's place. The cache's shape
// comes from the summaries and page_size.
PageSelectArgs select_args(const In& q, const In& summaries, const In& page_table, const In& seq_lens, const In& cu,
                           const Out& sel_idx, const Out& sel_cnt, int64_t page_size, int64_t topk, int64_t sink,
                           int64_t local, Place& where) {
  const TokensView qv = tokens_view(q, "q");
  where = place_of(q, "q");
  check_summaries(summaries, qv.dtype, "q");
  same_place(summaries, "summaries", where, "q");
  const int64_t pages = int64_t(summaries.shape(0)), hkv = int64_t(summaries.shape(1)),
                d = int64_t(summaries.shape(3));
  if (d != qv.d)
    bad("summaries " + shape_str(summaries) + " have D = " + std::to_string(d) + " but q " + shape_str(q) +
        " has D = " + std::to_string(qv.d));
  if (hkv < 1 || qv.h % hkv != 0)
    bad("q has " + std::to_string(qv.h) + " heads, not a multiple of the summaries' Hkv = " + std::to_string(hkv));
  PageSelectArgs a = page_select_indices(page_table, seq_lens, cu, where, "q");
  check_array(sel_idx, "sel_indices", 3, true);
  check_array(sel_cnt, "sel_counts", 2, true);
  if (int64_t(sel_idx.shape(0)) != a.batch || int64_t(sel_idx.shape(1)) != hkv ||
      int64_t(sel_cnt.shape(0)) != a.batch || int64_t(sel_cnt.shape(1)) != hkv)
    bad("sel_indices " + shape_str(sel_idx) + " and sel_counts " + shape_str(sel_cnt) +
        " must be [batch, Hkv, kmax] and [batch, Hkv] with batch = " + std::to_string(a.batch) +
        ", Hkv = " + std::to_string(hkv));
  same_place(sel_idx, "sel_indices", where, "q");
  same_place(sel_cnt, "sel_counts", where, "q");
  a.q = qv;
  // select reads the cache's shape only (k.data stays null).
  a.k = PagedCacheView::packed(nullptr, qv.dtype, qv.memory, pages, page_size, hkv, d);
  a.summaries = const_cast<void*>(static_cast<const void*>(summaries.data()));
  a.sel_indices = sel_entries(sel_idx);
  a.sel_counts = static_cast<int32_t*>(sel_cnt.data());
  a.sel_kmax = int64_t(sel_idx.shape(2));
  a.topk = topk, a.sink = sink, a.local = local;
  return a;
}

}  // namespace

void bind_decode(nb::module_& m) {
  // ---- decode attention over a paged KV cache ----
  // One shot: validate (the index arrays' contents too with check_indices), plan, run on `stream`.
  m.def(
      "decode_attention",
      [](In q, In k, In v, Out o, OptOut lse, In page_table, In seq_lens, In cu, OptIn sel_idx, OptIn sel_cnt,
         bool causal_new, float scale, uintptr_t stream, bool check_indices) {
        std::vector<Place> places;
        DecodeArgs a = decode_args(q, k, v, o, lse, page_table, seq_lens, cu, sel_idx, sel_cnt, causal_new, scale, places);
        DeviceGuard guard(places);
        Options opt = options_for(stream, check_indices);
        nb::gil_scoped_release release;
        decode_attention(a, opt);
      },
      nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("o"), nb::arg("lse").none(),
      nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"), nb::arg("sel_indices").none(),
      nb::arg("sel_counts").none(), nb::arg("causal_new"), nb::arg("scale"), nb::arg("stream") = 0,
      nb::arg("check_indices") = true);

  // A plan for the arrays' shapes; run() takes the same arrays again (their data may change, the
  // shapes, strides, dtypes and devices must not: run() checks them) and allocates nothing.
  nb::class_<PyDecodePlan>(m, "DecodePlan")
      .def_prop_ro("kv_splits", [](const PyDecodePlan& p) { return p.plan.kv_splits(); })
      .def_prop_ro("workspace_bytes", [](const PyDecodePlan& p) { return p.plan.workspace_bytes(); })
      .def(
          "run",
          [](const PyDecodePlan& p, In q, In k, In v, Out o, OptOut lse, In page_table, In seq_lens, In cu,
             OptIn sel_idx, OptIn sel_cnt, uintptr_t stream) {
            std::vector<Place> places;
            DecodeArgs a = decode_args(q, k, v, o, lse, page_table, seq_lens, cu, sel_idx, sel_cnt,
                                       p.problem.causal_new, p.problem.scale, places);
            PlanDevice guard(p.device);
            nb::gil_scoped_release release;
            run(p.plan, a, reinterpret_cast<void*>(stream));
          },
          nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("o"), nb::arg("lse").none(),
          nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"), nb::arg("sel_indices").none(),
          nb::arg("sel_counts").none(), nb::arg("stream") = 0)
      // run() with data pointers only (0 for lse and the selection where the plan has none): the
      // arrays must have the plan's shapes, strides, dtypes and device (the caller's promise).
      .def("run_pointers", &run_decode_pointers, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("o"),
           nb::arg("lse"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"),
           nb::arg("sel_indices"), nb::arg("sel_counts"), nb::arg("stream"));
  m.def(
      "plan_decode",
      [](In q, In k, In v, Out o, OptOut lse, In page_table, In seq_lens, In cu, OptIn sel_idx, OptIn sel_cnt,
         bool causal_new, float scale, int kv_splits) {
        std::vector<Place> places;
        DecodeArgs a = decode_args(q, k, v, o, lse, page_table, seq_lens, cu, sel_idx, sel_cnt, causal_new, scale, places);
        DeviceGuard guard(places);
        PyDecodePlan p;
        p.problem = a;
        for (const Place& x : places)
          if (x.memory == Memory::device) p.device = x.device;
        nb::gil_scoped_release release;
        p.plan = plan(a, Options{}, kv_splits);
        return p;
      },
      nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("o"), nb::arg("lse").none(),
      nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"), nb::arg("sel_indices").none(),
      nb::arg("sel_counts").none(), nb::arg("causal_new"), nb::arg("scale"), nb::arg("kv_splits") = 0);

  // ---- page selection for decode ----
  // The summaries of the pages holding the new tokens (every stored page with all_pages), in place.
  // tokens: T, the rows of the step's q (cu_seqlens_q[batch] must equal it when checked).
  m.def(
      "update_page_summaries",
      [](Out summaries, In k, In page_table, In seq_lens, In cu, int64_t tokens, bool all_pages, uintptr_t stream,
         bool check_indices) {
        Place where;
        const PageSelectArgs a = update_args(summaries, k, page_table, seq_lens, cu, tokens, all_pages, where);
        run_page_op(a, PageOp::update_summaries, where, stream, check_indices);
      },
      nb::arg("summaries"), nb::arg("k_cache"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"),
      nb::arg("tokens"), nb::arg("all_pages"), nb::arg("stream") = 0, nb::arg("check_indices") = true);
  // The selection of pages per (request, key/value head) into sel_indices [B, Hkv, kmax] and
  // sel_counts [B, Hkv]; the cache's shape comes from the summaries and page_size.
  m.def(
      "select_pages",
      [](In q, In summaries, In page_table, In seq_lens, In cu, Out sel_idx, Out sel_cnt, int64_t page_size,
         int64_t topk, int64_t sink, int64_t local, uintptr_t stream, bool check_indices) {
        Place where;
        const PageSelectArgs a =
            select_args(q, summaries, page_table, seq_lens, cu, sel_idx, sel_cnt, page_size, topk, sink, local, where);
        run_page_op(a, PageOp::select, where, stream, check_indices);
      },
      nb::arg("q"), nb::arg("summaries"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"),
      nb::arg("sel_indices"), nb::arg("sel_counts"), nb::arg("page_size"), nb::arg("topk"), nb::arg("sink"),
      nb::arg("local"), nb::arg("stream") = 0, nb::arg("check_indices") = true);

  // The same two operations made once (checked like the calls above), then run with data pointers
  // only: no array conversions, no index check (check_indices off), nothing allocated.
  nb::class_<PyPageProblem>(m, "PageProblem")
      .def(
          "run_select",
          [](const PyPageProblem& p, uintptr_t q, uintptr_t summaries, uintptr_t page_table, uintptr_t seq_lens,
             uintptr_t cu, uintptr_t sel_idx, uintptr_t sel_cnt, uintptr_t stream) {
            if (p.op != PageOp::select) bad("run_select on an update_page_summaries problem");
            PageSelectArgs a = p.args;
            a.q.data = reinterpret_cast<void*>(q);
            a.summaries = reinterpret_cast<void*>(summaries);
            set_request_pointers(a, page_table, seq_lens, cu);
            if (a.sel_kmax > 0) a.sel_indices = reinterpret_cast<int32_t*>(sel_idx);
            a.sel_counts = reinterpret_cast<int32_t*>(sel_cnt);
            run_page_problem(p, a, stream);
          },
          nb::arg("q"), nb::arg("summaries"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"),
          nb::arg("sel_indices"), nb::arg("sel_counts"), nb::arg("stream"))
      .def(
          "run_update",
          [](const PyPageProblem& p, uintptr_t summaries, uintptr_t k, uintptr_t page_table, uintptr_t seq_lens,
             uintptr_t cu, uintptr_t stream) {
            if (p.op != PageOp::update_summaries) bad("run_update on a select_pages problem");
            PageSelectArgs a = p.args;
            a.summaries = reinterpret_cast<void*>(summaries);
            a.k.data = reinterpret_cast<void*>(k);
            set_request_pointers(a, page_table, seq_lens, cu);
            run_page_problem(p, a, stream);
          },
          nb::arg("summaries"), nb::arg("k_cache"), nb::arg("page_table"), nb::arg("seq_lens"),
          nb::arg("cu_seqlens_q"), nb::arg("stream"));
  m.def(
      "select_pages_problem",
      [](In q, In summaries, In page_table, In seq_lens, In cu, Out sel_idx, Out sel_cnt, int64_t page_size,
         int64_t topk, int64_t sink, int64_t local) {
        Place where;
        const PageSelectArgs a =
            select_args(q, summaries, page_table, seq_lens, cu, sel_idx, sel_cnt, page_size, topk, sink, local, where);
        DeviceGuard guard({where});
        validate(a, PageOp::select, false);
        return page_problem(a, PageOp::select, where);
      },
      nb::arg("q"), nb::arg("summaries"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"),
      nb::arg("sel_indices"), nb::arg("sel_counts"), nb::arg("page_size"), nb::arg("topk"), nb::arg("sink"),
      nb::arg("local"));
  m.def(
      "update_page_summaries_problem",
      [](Out summaries, In k, In page_table, In seq_lens, In cu, int64_t tokens, bool all_pages) {
        Place where;
        const PageSelectArgs a = update_args(summaries, k, page_table, seq_lens, cu, tokens, all_pages, where);
        DeviceGuard guard({where});
        validate(a, PageOp::update_summaries, false);
        return page_problem(a, PageOp::update_summaries, where);
      },
      nb::arg("summaries"), nb::arg("k_cache"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"),
      nb::arg("tokens"), nb::arg("all_pages"));
}

}  // namespace sparsek::py
