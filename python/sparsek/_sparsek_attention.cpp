// sparsek._sparsek: block-sparse attention (forward, backward), its plans and the top-k block gate.
#include "_sparsek_arrays.hpp"

namespace sparsek::py {
namespace {

std::string where(const Place& p) {
  return p.memory == Memory::host ? std::string("host memory") : "CUDA device " + std::to_string(p.device);
}

// Packed sequences: cu_seqlens int32 [num_seqs + 1], contiguous, where `home` is (attention: the
// layout, places[0]; the gate: q). Its contents are the library's to check.
template <class Args>
void put_cu_seqlens(Args& a, const OptIn& cu, std::vector<Place>& places, const Place& home, const char* home_name) {
  if (!cu) return;
  check_array(*cu, "cu_seqlens", 1, true);
  if (cu->shape(0) < 2)
    bad("cu_seqlens has shape " + shape_str(*cu) +
        ": it holds num_seqs + 1 >= 2 offsets (0, the ends of the sequences, T)");
  const Place p = place_of(*cu, "cu_seqlens");
  if (p.memory != home.memory || p.device != home.device)
    bad("cu_seqlens is in " + where(p) + " but " + home_name + " is in " + where(home) + ": cu_seqlens must be where " +
        home_name + " is");
  places.push_back(p);
  a.cu_seqlens = static_cast<const int32_t*>(cu->data());
  a.num_seqs = int64_t(cu->shape(0)) - 1;
}

AttentionArgs attention_args(const In& q, const In& k, const In& v, const Out& o, const OptOut& lse, const In& num,
                             const In& idx, const OptIn& fnum, const OptIn& fidx, int block, bool causal, float scale,
                             std::vector<Place>& places, const OptIn& cu_seqlens = std::nullopt) {
  AttentionArgs a;
  a.layout = layout_view(num, idx, fnum, fidx, block, places);
  put_cu_seqlens(a, cu_seqlens, places, places[0], "the layout");
  a.q = view4(q, "q");
  a.k = view4(k, "k");
  a.v = view4(v, "v");
  a.o = view4(o, "o");
  places.push_back(place_of(q, "q"));
  places.push_back(place_of(k, "k"));
  places.push_back(place_of(v, "v"));
  places.push_back(place_of(o, "o"));
  a.lse = lse_view(lse, a.q, places);
  a.causal = causal;
  a.scale = scale;
  return a;
}

AttentionBackwardArgs backward_args(const In& q, const In& k, const In& v, const In& o, const In& lse,
                                    const In& dout, const Out& dq, const Out& dk, const Out& dv, const In& num,
                                    const In& idx, const OptIn& fnum, const OptIn& fidx, int block, bool causal,
                                    float scale, bool deterministic, std::vector<Place>& places,
                                    const OptIn& cu_seqlens = std::nullopt) {
  AttentionBackwardArgs b;
  b.forward.layout = layout_view(num, idx, fnum, fidx, block, places);
  put_cu_seqlens(b.forward, cu_seqlens, places, places[0], "the layout");
  b.forward.q = view4(q, "q");
  b.forward.k = view4(k, "k");
  b.forward.v = view4(v, "v");
  b.forward.o = view4(o, "o");
  b.forward.lse = lse_view(std::optional<In>(lse), b.forward.q, places);
  b.forward.causal = causal;
  b.forward.scale = scale;
  b.dout = view4(dout, "dout");
  b.dq = view4(dq, "dq");
  b.dk = view4(dk, "dk");
  b.dv = view4(dv, "dv");
  for (const auto& [arr, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&o, "o"},
                                  std::pair{&dout, "dout"}})
    places.push_back(place_of(*arr, name));
  for (const auto& [arr, name] : {std::pair{&dq, "dq"}, std::pair{&dk, "dk"}, std::pair{&dv, "dv"}})
    places.push_back(place_of(*arr, name));
  b.deterministic = deterministic;
  return b;
}

// validate(args, true) for a layout anywhere: a device layout is read in `stream`'s order (the
// indices may still be in flight there), with the GIL released while the copy waits for it.
void check_layout_contents(const AttentionArgs& a, const std::vector<Place>& places, uintptr_t stream) {
  validate(a, false);  // a bad argument raises before anything touches a device
  DeviceGuard guard(places);
  nb::gil_scoped_release release;
  validate(a, true, reinterpret_cast<void*>(stream));
}

struct PyAttentionPlan {
  AttentionPlan plan;
  AttentionArgs problem;
  int device = -1;
};

PyAttentionPlan make_attention_plan(const AttentionArgs& a, const std::vector<Place>& places, uintptr_t stream) {
  DeviceGuard guard(places);
  PyAttentionPlan p;
  p.problem = a;
  for (const Place& q : places)
    if (q.memory == Memory::device) p.device = q.device;
  Options o = options_for(stream, false);
  nb::gil_scoped_release release;
  p.plan = plan(a, o);
  return p;
}

// A problem's data pointers replaced (lse, the full-block lists and cu_seqlens only where the
// problem has them).
void set_pointers(AttentionArgs& a, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t num,
                  uintptr_t idx, uintptr_t fnum, uintptr_t fidx, uintptr_t cu_seqlens) {
  a.q.data = reinterpret_cast<void*>(q);
  a.k.data = reinterpret_cast<void*>(k);
  a.v.data = reinterpret_cast<void*>(v);
  a.o.data = reinterpret_cast<void*>(o);
  if (a.lse) a.lse = reinterpret_cast<float*>(lse);
  a.layout.kv_num_blocks = reinterpret_cast<const int32_t*>(num);
  a.layout.kv_indices = reinterpret_cast<const int32_t*>(idx);
  if (a.layout.has_full()) {
    a.layout.full_kv_num_blocks = reinterpret_cast<const int32_t*>(fnum);
    a.layout.full_kv_indices = reinterpret_cast<const int32_t*>(fidx);
  }
  if (a.cu_seqlens) a.cu_seqlens = reinterpret_cast<const int32_t*>(cu_seqlens);
}

void run_attention_plan(const PyAttentionPlan& p, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
                        uintptr_t num, uintptr_t idx, uintptr_t fnum, uintptr_t fidx, uintptr_t stream,
                        uintptr_t cu_seqlens) {
  AttentionArgs a = p.problem;
  set_pointers(a, q, k, v, o, lse, num, idx, fnum, fidx, cu_seqlens);
  PlanDevice guard(p.device);
  nb::gil_scoped_release release;
  run(p.plan, a, reinterpret_cast<void*>(stream));
}

// A backward problem made once from the arrays (their shapes, strides, dtypes, device) with its
// plan (and the plan's workspace); later calls pass only data pointers, skipping the array
// conversions (tens of microseconds per call from PyTorch). A run allocates nothing, so it may be
// captured in a CUDA graph on any stream; the caller keeps one problem per stream.
struct PyAttentionBackwardProblem {
  AttentionBackwardArgs problem;
  AttentionBackwardPlan plan;
  int device = -1;
};

void run_attention_backward_problem(const PyAttentionBackwardProblem& p, uintptr_t q, uintptr_t k, uintptr_t v,
                                    uintptr_t o, uintptr_t lse, uintptr_t dout, uintptr_t dq, uintptr_t dk,
                                    uintptr_t dv, uintptr_t num, uintptr_t idx, uintptr_t fnum, uintptr_t fidx,
                                    uintptr_t stream, uintptr_t cu_seqlens) {
  AttentionBackwardArgs b = p.problem;
  set_pointers(b.forward, q, k, v, o, lse, num, idx, fnum, fidx, cu_seqlens);  // the backward's lse is never null
  b.dout.data = reinterpret_cast<void*>(dout);
  b.dq.data = reinterpret_cast<void*>(dq);
  b.dk.data = reinterpret_cast<void*>(dk);
  b.dv.data = reinterpret_cast<void*>(dv);
  PlanDevice guard(p.device);
  nb::gil_scoped_release release;
  run(p.plan, b, reinterpret_cast<void*>(stream));
}

// The gate's problem from its arrays (outputs included; the workspace is set by the caller).
GateArgs gate_args(const In& q, const In& k, int topk, int block, bool causal, int sink, int local, float scale,
                   const std::optional<AttentionLayout>& candidates, const OptIn& given, const Out& num,
                   const Out& idx, const OptOut& scores, std::vector<Place>& places) {
  GateArgs g;
  g.q = view4(q, "q");
  g.k = view4(k, "k");
  places.push_back(place_of(q, "q"));
  places.push_back(place_of(k, "k"));
  g.topk = topk, g.block = block, g.causal = causal, g.sink = sink, g.local = local, g.scale = scale;
  const int64_t mq = block > 0 ? (g.q.s + block - 1) / block : 0, nk = block > 0 ? (g.k.s + block - 1) / block : 0;
  const int64_t want[3] = {g.q.b, g.k.h, mq};
  auto check_rows = [&](const auto& a, const char* name, int64_t last) {
    bool ok = true;
    for (size_t i = 0; i < 3; ++i) ok = ok && int64_t(a.shape(i)) == want[i];
    if (last >= 0) ok = ok && int64_t(a.shape(3)) == last;
    if (!ok)
      bad(std::string(name) + " has shape " + shape_str(a) + ", expected [B, Hkv, ceil(Sq / block)" +
          (last >= 0 ? ", ceil(Skv / block)" : "") + "] = (" + std::to_string(want[0]) + ", " +
          std::to_string(want[1]) + ", " + std::to_string(want[2]) + (last >= 0 ? ", " + std::to_string(last) : "") +
          ")");
  };
  check_array(num, "kv_num_blocks", 3, true);
  check_array(idx, "kv_indices", 4, true);
  check_rows(num, "kv_num_blocks", -1);
  check_rows(idx, "kv_indices", -1);
  g.kv_num_blocks = static_cast<int32_t*>(num.data());
  g.kv_indices = static_cast<int32_t*>(idx.data());
  g.kmax = int64_t(idx.shape(3));
  places.push_back(place_of(num, "kv_num_blocks"));
  places.push_back(place_of(idx, "kv_indices"));
  if (given) {
    check_array(*given, "scores (given)", 4, false);
    check_rows(*given, "scores (given)", nk);
    g.given_scores = static_cast<const float*>(given->data());
    places.push_back(place_of(*given, "scores (given)"));
  }
  if (scores) {
    check_array(*scores, "scores", 4, false);
    check_rows(*scores, "scores", nk);
    g.scores = static_cast<float*>(scores->data());
    places.push_back(place_of(*scores, "scores"));
  }
  if (candidates) g.candidates = &*candidates;
  return g;
}

}  // namespace

void bind_attention(nb::module_& m) {
  // ---- attention ----
  // One shot: validate (the layout's contents too with check_indices), plan (cached by the
  // library), run on `stream`.
  m.def(
      "attention",
      [](In q, In k, In v, Out o, OptOut lse, In num, In idx, OptIn fnum, OptIn fidx, int block, bool causal,
         float scale, uintptr_t stream, bool check_indices, OptIn cu_seqlens) {
        std::vector<Place> places;
        AttentionArgs a =
            attention_args(q, k, v, o, lse, num, idx, fnum, fidx, block, causal, scale, places, cu_seqlens);
        DeviceGuard guard(places);
        Options opt = options_for(stream, check_indices);
        nb::gil_scoped_release release;
        attention(a, opt);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse").none(), nb::arg("kv_num_blocks"),
      nb::arg("kv_indices"), nb::arg("full_kv_num_blocks").none(), nb::arg("full_kv_indices").none(),
      nb::arg("block"), nb::arg("causal"), nb::arg("scale"), nb::arg("stream") = 0, nb::arg("check_indices") = true,
      nb::arg("cu_seqlens").none() = nb::none());

  // Every check attention() makes, the layout's contents included (a device layout is copied to
  // the host on `stream`), without running anything.
  m.def(
      "check_attention",
      [](In q, In k, In v, Out o, OptOut lse, In num, In idx, OptIn fnum, OptIn fidx, int block, bool causal,
         float scale, uintptr_t stream, OptIn cu_seqlens) {
        std::vector<Place> places;
        AttentionArgs a =
            attention_args(q, k, v, o, lse, num, idx, fnum, fidx, block, causal, scale, places, cu_seqlens);
        check_layout_contents(a, places, stream);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse").none(), nb::arg("kv_num_blocks"),
      nb::arg("kv_indices"), nb::arg("full_kv_num_blocks").none(), nb::arg("full_kv_indices").none(),
      nb::arg("block"), nb::arg("causal"), nb::arg("scale"), nb::arg("stream") = 0,
      nb::arg("cu_seqlens").none() = nb::none());

  // Why no variant can run this problem (empty when one can); invalid arguments raise.
  m.def(
      "attention_unsupported_reasons",
      [](In q, In k, In v, Out o, OptOut lse, In num, In idx, OptIn fnum, OptIn fidx, int block, bool causal,
         float scale, OptIn cu_seqlens) {
        std::vector<Place> places;
        AttentionArgs a =
            attention_args(q, k, v, o, lse, num, idx, fnum, fidx, block, causal, scale, places, cu_seqlens);
        DeviceGuard guard(places);
        validate(a, false);  // a bad argument raises (ValueError naming it)
        // The library lists each variant's reason; a problem that one variant runs has none.
        return supported_variants(a).empty() ? unsupported_reasons(a) : std::vector<std::string>{};
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse").none(), nb::arg("kv_num_blocks"),
      nb::arg("kv_indices"), nb::arg("full_kv_num_blocks").none(), nb::arg("full_kv_indices").none(),
      nb::arg("block"), nb::arg("causal"), nb::arg("scale"), nb::arg("cu_seqlens").none() = nb::none());

  nb::class_<PyAttentionPlan>(m, "AttentionPlan")
      .def_prop_ro("variant", [](const PyAttentionPlan& p) { return p.plan.variant(); })
      .def_prop_ro("workspace_bytes", [](const PyAttentionPlan& p) { return p.plan.workspace_bytes(); })
      .def("run", &run_attention_plan, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"),
           nb::arg("kv_num_blocks"), nb::arg("kv_indices"), nb::arg("full_kv_num_blocks"),
           nb::arg("full_kv_indices"), nb::arg("stream"), nb::arg("cu_seqlens") = 0);
  m.def(
      "plan_attention",
      [](In q, In k, In v, Out o, OptOut lse, In num, In idx, OptIn fnum, OptIn fidx, int block, bool causal,
         float scale, uintptr_t stream, OptIn cu_seqlens) {
        std::vector<Place> places;
        AttentionArgs a =
            attention_args(q, k, v, o, lse, num, idx, fnum, fidx, block, causal, scale, places, cu_seqlens);
        return make_attention_plan(a, places, stream);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse").none(), nb::arg("kv_num_blocks"),
      nb::arg("kv_indices"), nb::arg("full_kv_num_blocks").none(), nb::arg("full_kv_indices").none(),
      nb::arg("block"), nb::arg("causal"), nb::arg("scale"), nb::arg("stream"),
      nb::arg("cu_seqlens").none() = nb::none());

  // dq, dk, dv of attention for the upstream gradient dout (o and lse: the forward's outputs): the
  // problem is made once from the arrays, each run passes data pointers.
  m.def(
      "attention_backward_problem",
      [](In q, In k, In v, In o, In lse, In dout, Out dq, Out dk, Out dv, In num, In idx, OptIn fnum, OptIn fidx,
         int block, bool causal, float scale, bool deterministic, OptIn cu_seqlens) {
        std::vector<Place> places;
        PyAttentionBackwardProblem p;
        p.problem = backward_args(q, k, v, o, lse, dout, dq, dk, dv, num, idx, fnum, fidx, block, causal, scale,
                                  deterministic, places, cu_seqlens);
        DeviceGuard guard(places);  // one device for every array, or a clear error
        for (const Place& x : places)
          if (x.memory == Memory::device) p.device = x.device;
        p.plan = plan(p.problem);
        return p;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("dout"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), nb::arg("kv_num_blocks"), nb::arg("kv_indices"),
      nb::arg("full_kv_num_blocks").none(), nb::arg("full_kv_indices").none(), nb::arg("block"), nb::arg("causal"),
      nb::arg("scale"), nb::arg("deterministic") = true, nb::arg("cu_seqlens").none() = nb::none());
  nb::class_<PyAttentionBackwardProblem>(m, "AttentionBackwardProblem")
      .def("run", &run_attention_backward_problem, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
           nb::arg("lse"), nb::arg("dout"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("kv_num_blocks"),
           nb::arg("kv_indices"), nb::arg("full_kv_num_blocks"), nb::arg("full_kv_indices"), nb::arg("stream"),
           nb::arg("cu_seqlens") = 0);
  m.def(
      "attention_backward_unsupported_reasons",
      [](In q, In k, In v, In o, In lse, In dout, Out dq, Out dk, Out dv, In num, In idx, OptIn fnum, OptIn fidx,
         int block, bool causal, float scale, bool deterministic, OptIn cu_seqlens) {
        std::vector<Place> places;
        AttentionBackwardArgs b = backward_args(q, k, v, o, lse, dout, dq, dk, dv, num, idx, fnum, fidx, block,
                                                causal, scale, deterministic, places, cu_seqlens);
        DeviceGuard guard(places);
        return unsupported_reasons(b);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("dout"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), nb::arg("kv_num_blocks"), nb::arg("kv_indices"),
      nb::arg("full_kv_num_blocks").none(), nb::arg("full_kv_indices").none(), nb::arg("block"), nb::arg("causal"),
      nb::arg("scale"), nb::arg("deterministic") = true, nb::arg("cu_seqlens").none() = nb::none());

  // ---- the top-k block gate ----
  // Writes kv_num_blocks / kv_indices (and scores when given); candidates (cand_*) restrict the
  // choice, given_scores replace the pooled scores. workspace: a device uint8 array of at least
  // gate_workspace_bytes() bytes (None on the host).
  auto gate_fn = [](In q, In k, Out num, Out idx, int topk, int block, bool causal, int sink, int local, float scale,
                    OptIn cnum, OptIn cidx, OptIn cfnum, OptIn cfidx, OptIn given, OptOut scores, OptOut workspace,
                    uintptr_t stream, bool size_only, OptIn cu) -> size_t {
    std::vector<Place> places, cand_places;
    std::optional<AttentionLayout> cand;
    if (cnum.has_value() != cidx.has_value()) bad("candidates: give both kv_num_blocks and kv_indices");
    if (cnum) cand = layout_view(*cnum, *cidx, cfnum, cfidx, block, cand_places);
    GateArgs g = gate_args(q, k, topk, block, causal, sink, local, scale, cand, given, num, idx, scores, places);
    put_cu_seqlens(g, cu, places, place_of(q, "q"), "q");
    places.insert(places.end(), cand_places.begin(), cand_places.end());
    DeviceGuard guard(places);
    if (size_only) return gate_workspace_bytes(g);
    if (workspace) {
      if (workspace->ndim() != 1 || !(workspace->dtype() == nb::dtype<uint8_t>()) || !c_contiguous(*workspace))
        bad("workspace must be a contiguous 1-D uint8 array, got shape " + shape_str(*workspace));
      g.workspace = workspace->data();
      g.workspace_bytes = workspace->shape(0);
    }
    Options opt = options_for(stream, true);
    nb::gil_scoped_release release;
    gate(g, opt);
    return 0;
  };
  m.def(
      "gate",
      [gate_fn](In q, In k, Out num, Out idx, int topk, int block, bool causal, int sink, int local, float scale,
                OptIn cnum, OptIn cidx, OptIn cfnum, OptIn cfidx, OptIn given, OptOut scores, OptOut workspace,
                uintptr_t stream, OptIn cu) {
        gate_fn(q, k, num, idx, topk, block, causal, sink, local, scale, cnum, cidx, cfnum, cfidx, given, scores,
                workspace, stream, false, cu);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("kv_num_blocks"), nb::arg("kv_indices"), nb::arg("topk"), nb::arg("block"),
      nb::arg("causal"), nb::arg("sink"), nb::arg("local"), nb::arg("scale"), nb::arg("cand_num").none(),
      nb::arg("cand_idx").none(), nb::arg("cand_full_num").none(), nb::arg("cand_full_idx").none(),
      nb::arg("given_scores").none(), nb::arg("scores").none(), nb::arg("workspace").none(), nb::arg("stream") = 0,
      nb::arg("cu_seqlens").none() = nb::none());
  m.def(
      "gate_workspace_bytes",
      [gate_fn](In q, In k, Out num, Out idx, int topk, int block, bool causal, int sink, int local, float scale,
                OptIn cnum, OptIn cidx, OptIn cfnum, OptIn cfidx, OptIn given, OptOut scores, OptIn cu) {
        return gate_fn(q, k, num, idx, topk, block, causal, sink, local, scale, cnum, cidx, cfnum, cfidx, given,
                       scores, std::nullopt, 0, true, cu);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("kv_num_blocks"), nb::arg("kv_indices"), nb::arg("topk"), nb::arg("block"),
      nb::arg("causal"), nb::arg("sink"), nb::arg("local"), nb::arg("scale"), nb::arg("cand_num").none(),
      nb::arg("cand_idx").none(), nb::arg("cand_full_num").none(), nb::arg("cand_full_idx").none(),
      nb::arg("given_scores").none(), nb::arg("scores").none(), nb::arg("cu_seqlens").none() = nb::none());
}

}  // namespace sparsek::py
