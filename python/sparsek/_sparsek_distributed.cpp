// sparsek._sparsek: the distributed surfaces, over an NCCL communicator or ranks run in this
// process: the distributed DSD, context-parallel attention, the row partition.
#include "_sparsek_arrays.hpp"

namespace sparsek::py {
namespace {

// A distributed DSD plan (one rank of an NCCL communicator): made once from arrays; run() takes the
// data pointers of arrays with the planned shapes, strides, dtypes and device.
struct PyDistPlan {
  DistributedPlan plan;
};

void run_dist_plan(const PyDistPlan& p, uintptr_t values, uintptr_t b, uintptr_t c, float alpha, float beta,
                   uintptr_t stream) {
  GemmArgs g = p.plan.problem();
  g.sparse.values = reinterpret_cast<void*>(values);
  g.b.data = reinterpret_cast<void*>(b);
  g.c.data = reinterpret_cast<void*>(c);
  g.alpha = alpha;
  g.beta = beta;
  PlanDevice guard(p.plan.device());
  nb::gil_scoped_release release;
  run(p.plan, g, reinterpret_cast<void*>(stream));
}

// ---- context-parallel attention ----
// The plans of every rank this process drives (all ranks without a communicator, or the one rank
// of `comm`), made from the whole problem's shapes and a host layout. Runs take, per rank, its
// shard arrays (packed [B, H, rows, D]) and a stream.
struct PyCpPlans {
  std::vector<DistributedAttentionPlan> plans;
  int device = -1;  // the CUDA device of GPU plans
};

DType dtype_named(const std::string& s) {
  if (s == "float32") return DType::f32;
  if (s == "float16") return DType::f16;
  if (s == "bfloat16") return DType::bf16;
  bad("dtype '" + s + "' is not float32, float16 or bfloat16");
}

const DistributedAttentionPlan& cp_rank(const PyCpPlans& p, int64_t i) {
  if (i < 0 || i >= int64_t(p.plans.size()))
    bad("rank index " + std::to_string(i) + " is out of range [0, " + std::to_string(p.plans.size()) + ")");
  return p.plans[size_t(i)];
}

template <class V>
void same_count(const V& v, size_t n, const char* name) {
  if (v.size() != n)
    bad(std::string(name) + " has " + std::to_string(v.size()) + " arrays, one per rank of the plans (" + std::to_string(n) +
        ") expected");
}

// Per rank the forward's shard arguments (layout, causal and scale are the plans').
std::vector<AttentionArgs> cp_shards(const PyCpPlans& p, const std::vector<In>& q, const std::vector<In>& k,
                                     const std::vector<In>& v, const std::vector<Out>& o, const std::vector<Out>& lse,
                                     std::vector<Place>& places) {
  const size_t n = p.plans.size();
  same_count(q, n, "q"), same_count(k, n, "k"), same_count(v, n, "v"), same_count(o, n, "o"), same_count(lse, n, "lse");
  std::vector<AttentionArgs> out(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string r = "[" + std::to_string(i) + "]";
    AttentionArgs& a = out[i];
    a.q = view4(q[i], "q" + r), a.k = view4(k[i], "k" + r), a.v = view4(v[i], "v" + r), a.o = view4(o[i], "o" + r);
    for (const auto& [arr, name] : {std::pair{&q[i], "q"}, std::pair{&k[i], "k"}, std::pair{&v[i], "v"}})
      places.push_back(place_of(*arr, name + r));
    places.push_back(place_of(o[i], "o" + r));
    a.lse = lse_view(std::optional<Out>(lse[i]), a.q, places);
  }
  return out;
}

std::vector<void*> cp_streams(const std::vector<uintptr_t>& streams, size_t n) {
  std::vector<void*> out(n, nullptr);
  if (!streams.empty()) same_count(streams, n, "streams");
  for (size_t i = 0; i < streams.size(); ++i) out[i] = reinterpret_cast<void*>(streams[i]);
  return out;
}

}  // namespace

void bind_distributed(nb::module_& m) {
  // The distributed DSD over an NCCL communicator given as an integer (an ncclComm_t, e.g. torch's
  // ProcessGroupNCCL comm_ptr()): a collective call on every rank.
  nb::class_<PyDistPlan>(m, "DistributedPlan")
      .def_prop_ro("rank", [](const PyDistPlan& p) { return p.plan.rank(); })
      .def_prop_ro("ranks", [](const PyDistPlan& p) { return p.plan.ranks(); })
      .def_prop_ro("bounds", [](const PyDistPlan& p) { return p.plan.bounds(); })
      .def_prop_ro("variant", [](const PyDistPlan& p) { return p.plan.local() ? p.plan.local().variant() : std::string(); })
      .def("run", &run_dist_plan, nb::arg("values"), nb::arg("b"), nb::arg("c"), nb::arg("alpha"), nb::arg("beta"),
           nb::arg("stream"));
  m.def(
      "plan_dsd_distributed",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, In b, Out c, uintptr_t comm,
         int broadcast_root, bool all_gather, uintptr_t stream) {
        std::vector<Place> places;
        GemmArgs g = dsd_args(rows, cols, row_ptr, col_idx, values, b, c, 0, places);
        DeviceGuard guard(places);
        DistributedOptions o;
        o.broadcast_root = broadcast_root;
        o.all_gather = all_gather;
        o.local.stream = reinterpret_cast<void*>(stream);
        nb::gil_scoped_release release;
        return PyDistPlan{plan_distributed(g, reinterpret_cast<ncclComm*>(comm), o)};
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"), nb::arg("b"),
      nb::arg("c"), nb::arg("comm"), nb::arg("broadcast_root"), nb::arg("all_gather"), nb::arg("stream"));
  m.def("nccl_version", [] { return nccl_version(); });

  // Context-parallel attention: comm != 0 plans this process's one rank of that NCCL communicator
  // (a collective); comm == 0 plans `ranks` ranks run in this process (host arrays, or on `device`).
  nb::class_<PyCpPlans>(m, "AttentionCpPlans")
      .def_prop_ro("size", [](const PyCpPlans& p) { return p.plans.size(); })
      .def("rank", [](const PyCpPlans& p, int64_t i) { return cp_rank(p, i).rank(); })
      .def("ranks", [](const PyCpPlans& p) { return p.plans.empty() ? 0 : p.plans[0].ranks(); })
      .def("q_rows", [](const PyCpPlans& p, int64_t i) {
        const auto& x = cp_rank(p, i);
        return std::vector<int64_t>{x.q_row_begin(), x.q_row_end()};
      })
      .def("kv_rows", [](const PyCpPlans& p, int64_t i) {
        const auto& x = cp_rank(p, i);
        return std::vector<int64_t>{x.kv_row_begin(), x.kv_row_end()};
      })
      .def("recv_bytes", [](const PyCpPlans& p, int64_t i) { return cp_rank(p, i).recv_bytes(); })
      .def("ring_bytes", [](const PyCpPlans& p, int64_t i) { return cp_rank(p, i).ring_bytes(); })
      .def("workspace_bytes", [](const PyCpPlans& p, int64_t i) { return cp_rank(p, i).workspace_bytes(); })
      .def(
          "run",
          [](const PyCpPlans& p, std::vector<In> q, std::vector<In> k, std::vector<In> v, std::vector<Out> o,
             std::vector<Out> lse, std::vector<uintptr_t> streams) {
            std::vector<Place> places;
            const std::vector<AttentionArgs> shards = cp_shards(p, q, k, v, o, lse, places);
            const std::vector<void*> st = cp_streams(streams, p.plans.size());
            PlanDevice guard(p.device);
            nb::gil_scoped_release release;
            run(p.plans, shards, st);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("streams"))
      .def(
          "run_backward",
          [](const PyCpPlans& p, std::vector<In> q, std::vector<In> k, std::vector<In> v, std::vector<Out> o,
             std::vector<Out> lse, std::vector<In> dout, std::vector<Out> dq, std::vector<Out> dk, std::vector<Out> dv,
             bool deterministic, std::vector<uintptr_t> streams) {
            std::vector<Place> places;
            const std::vector<AttentionArgs> fwd = cp_shards(p, q, k, v, o, lse, places);
            const size_t n = p.plans.size();
            same_count(dout, n, "dout"), same_count(dq, n, "dq"), same_count(dk, n, "dk"), same_count(dv, n, "dv");
            std::vector<AttentionBackwardArgs> shards(n);
            for (size_t i = 0; i < n; ++i) {
              const std::string r = "[" + std::to_string(i) + "]";
              AttentionBackwardArgs& b = shards[i];
              b.forward = fwd[i];
              b.dout = view4(dout[i], "dout" + r), b.dq = view4(dq[i], "dq" + r), b.dk = view4(dk[i], "dk" + r),
              b.dv = view4(dv[i], "dv" + r);
              b.deterministic = deterministic;
            }
            const std::vector<void*> st = cp_streams(streams, n);
            PlanDevice guard(p.device);
            nb::gil_scoped_release release;
            run_backward(p.plans, shards, st);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("dout"), nb::arg("dq"),
          nb::arg("dk"), nb::arg("dv"), nb::arg("deterministic"), nb::arg("streams"));
  m.def(
      "plan_attention_cp",
      [](int64_t batch, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d, const std::string& dtype,
         int device, In num, In idx, OptIn fnum, OptIn fidx, int block, bool causal, float scale, uintptr_t comm,
         int ranks) {
        std::vector<Place> places;
        AttentionArgs a;
        a.layout = layout_view(num, idx, fnum, fidx, block, places);
        if (a.layout.memory != Memory::host)
          bad("the layout's arrays must be in host memory (the plan reads them once): pass CPU tensors or NumPy arrays");
        const Memory mem = device >= 0 ? Memory::device : Memory::host;
        const DType dt = dtype_named(dtype);
        a.q = a.o = Tensor4View::packed(nullptr, dt, mem, batch, hq, sq, d);
        a.k = a.v = Tensor4View::packed(nullptr, dt, mem, batch, hkv, skv, d);
        a.causal = causal;
        a.scale = scale;
        PyCpPlans p;
        p.device = device;
        PlanDevice guard(device);
        nb::gil_scoped_release release;
        if (comm) p.plans.push_back(plan_distributed_attention(a, reinterpret_cast<ncclComm*>(comm)));
        else p.plans = plan_distributed_attention(a, ranks);
        return p;
      },
      nb::arg("batch"), nb::arg("hq"), nb::arg("hkv"), nb::arg("sq"), nb::arg("skv"), nb::arg("d"), nb::arg("dtype"),
      nb::arg("device"), nb::arg("kv_num_blocks"), nb::arg("kv_indices"), nb::arg("full_kv_num_blocks").none(),
      nb::arg("full_kv_indices").none(), nb::arg("block"), nb::arg("causal"), nb::arg("scale"), nb::arg("comm"),
      nb::arg("ranks"));
  m.def("partition_block_rows", [](In row_ptr, int64_t mb, int ranks) {
    if (row_ptr.ndim() != 1 || row_ptr.shape(0) != size_t(mb + 1) || row_ptr.device_type() != nb::device::cpu::value ||
        row_ptr.dtype() != nb::dtype<int32_t>())
      bad("row_ptr must be a host int32 array of mb + 1 = " + std::to_string(mb + 1) + " entries");
    return partition_block_rows(static_cast<const int32_t*>(row_ptr.data()), mb, ranks);
  });
}

}  // namespace sparsek::py
