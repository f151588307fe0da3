// sparsek._sparsek: the products (dsd, dds, sdd) and their plans, the BSR checks and e4m3
// quantization. Sparse operands arrive as (rows, cols, row_ptr, col_idx, values), dense ones as 2-D
// arrays (the conventions: _sparsek.cpp).
#include "_sparsek_arrays.hpp"

namespace sparsek::py {
namespace {

// A 2-D array as a DenseView: row-major (inner stride 1 along columns) or column-major (inner
// stride 1 along rows), any leading dimension. Strides of extent-1 dimensions do not matter.
template <class A>
DenseView dense_view(const A& a, const std::string& name, bool e4m3_ok = false) {
  if (a.ndim() != 2) bad(name + " must be a 2-D array, got shape " + shape_str(a));
  DenseView d;
  d.rows = int64_t(a.shape(0));
  d.cols = int64_t(a.shape(1));
  d.dtype = value_dtype(a.dtype(), name, e4m3_ok);
  d.memory = place_of(a, name).memory;
  d.data = const_cast<void*>(static_cast<const void*>(a.data()));
  const int64_t s0 = a.stride(0), s1 = a.stride(1), r = d.rows, c = d.cols;
  // An empty array's strides are meaningless (NumPy reports zeros): any layout will do.
  const bool row_major = r * c == 0 || ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= std::max<int64_t>(c, 1)));
  const bool col_major = (r <= 1 || s0 == 1) && (c <= 1 || s1 >= std::max<int64_t>(r, 1));
  if (row_major) {
    d.layout = Layout::row_major;
    d.ld = r <= 1 || r * c == 0 ? std::max<int64_t>(c, 1) : s0;
  } else if (col_major) {
    d.layout = Layout::col_major;
    d.ld = c <= 1 ? std::max<int64_t>(r, 1) : s1;
  } else {
    bad(name + " with shape " + shape_str(a) + " and strides (" + std::to_string(s0) + ", " +
        std::to_string(s1) + ") elements is neither row- nor column-major with a unit inner stride; "
        "pass a contiguous copy");
  }
  return d;
}

void check_index_array(const In& a, const std::string& name) {
  if (a.ndim() != 1) bad(name + " must be a 1-D int32 array, got shape " + shape_str(a));
  if (!(a.dtype() == nb::dtype<int32_t>()))
    bad(name + " dtype " + dtype_str(a.dtype()) + " must be int32");
  if (a.shape(0) > 1 && a.stride(0) != 1)
    bad(name + " must be contiguous (stride " + std::to_string(a.stride(0)) + " elements)");
}

// Sparse operand. values: [nnzb][bm][bk], C-contiguous.
template <class V>
BsrView bsr_view(int64_t rows, int64_t cols, const In& row_ptr, const In& col_idx, const V& values,
                 const std::string& name) {
  check_index_array(row_ptr, name + " row_ptr");
  check_index_array(col_idx, name + " col_idx");
  if (values.ndim() != 3) bad(name + " values must be 3-D [nnzb, bm, bk], got shape " + shape_str(values));
  BsrView v;
  v.rows = rows;
  v.cols = cols;
  v.nnzb = int64_t(col_idx.shape(0));
  v.bm = int(values.shape(1));
  v.bk = int(values.shape(2));
  if (int64_t(values.shape(0)) != v.nnzb)
    bad(name + " values hold " + std::to_string(values.shape(0)) + " blocks but col_idx has nnzb=" +
        std::to_string(v.nnzb));
  const int64_t want_rp = v.bm > 0 && rows % v.bm == 0 ? rows / v.bm + 1 : -1;
  if (want_rp >= 0 && int64_t(row_ptr.shape(0)) != want_rp)
    bad(name + " row_ptr has " + std::to_string(row_ptr.shape(0)) + " entries, expected mb+1=" +
        std::to_string(want_rp) + " for rows=" + std::to_string(rows) + ", bm=" + std::to_string(v.bm));
  const int64_t bb = int64_t(v.bm) * v.bk;
  const bool contiguous = values.size() == 0 ||  // empty: strides are meaningless
                          ((v.bk <= 1 || values.stride(2) == 1) && (v.bm <= 1 || values.stride(1) == v.bk) &&
                           (v.nnzb <= 1 || values.stride(0) == bb));
  if (!contiguous) bad(name + " values must be C-contiguous [nnzb, bm, bk]");
  v.dtype = value_dtype(values.dtype(), name + " values", true);
  Place p = place_of(values, name + " values");
  for (const auto* idx : {&row_ptr, &col_idx}) {
    Place q = place_of(*idx, name + " indices");
    if (q.memory != p.memory || q.device != p.device)
      bad(name + " row_ptr, col_idx and values must be on the same device");
  }
  v.memory = p.memory;
  v.row_ptr = static_cast<const int32_t*>(row_ptr.data());
  v.col_idx = static_cast<const int32_t*>(col_idx.data());
  v.values = const_cast<void*>(static_cast<const void*>(values.data()));
  return v;
}

// A float32 scales array: its checks against the arrays it belongs with (`like`: same device),
// C-contiguous. Returns its pointer.
template <class S, class L>
float* scales_array(const S& s, const L& like, const std::string& name) {
  if (!(s.dtype() == nb::dtype<float>())) bad(name + " dtype " + dtype_str(s.dtype()) + " must be float32");
  const Place p = place_of(s, name), q = place_of(like, name);
  if (p.memory != q.memory || p.device != q.device) bad(name + " must be on the same device as the values they scale");
  int64_t want = 1;
  for (size_t i = s.ndim(); i-- > 0;) {
    if (s.shape(i) != 1 && s.stride(i) != want) bad(name + " must be C-contiguous");
    want *= int64_t(s.shape(i));
  }
  return const_cast<float*>(static_cast<const float*>(s.data()));
}

// The sparse operand's e4m3 scales: float32 [nnzb].
void put_bsr_scales(BsrView& v, const OptIn& scales, const In& values, const std::string& name) {
  if (!scales) return;
  if (scales->ndim() != 1 || int64_t(scales->shape(0)) != v.nnzb)
    bad(name + " scales must have shape (nnzb,) = (" + std::to_string(v.nnzb) + ",), got " + shape_str(*scales));
  v.scales = scales_array(*scales, values, name + " scales");
}

// A dense e4m3 input's scales, one per token (the rows when tokens_are_rows, else the columns):
// float32 [tokens] (scale_group 0) or [tokens, ceil(K / 128)] (scale_group 128).
template <class S, class L>
void put_dense_scales(DenseView& d, const S& s, const L& like, const std::string& name, bool tokens_are_rows) {
  const int64_t tokens = tokens_are_rows ? d.rows : d.cols, k = tokens_are_rows ? d.cols : d.rows;
  const int64_t groups = (k + 127) / 128;
  const std::string per = tokens_are_rows ? "row" : "column";
  if (s.ndim() == 1 && int64_t(s.shape(0)) == tokens) {
    d.scale_group = 0;
  } else if (s.ndim() == 2 && int64_t(s.shape(0)) == tokens && int64_t(s.shape(1)) == groups) {
    d.scale_group = 128;
  } else {
    bad(name + " must have shape (" + std::to_string(tokens) + ",) (one per " + per + ") or (" +
        std::to_string(tokens) + ", " + std::to_string(groups) + ") (one per " + per +
        " and 128-wide group of K=" + std::to_string(k) + "), got " + shape_str(s));
  }
  d.scales = scales_array(s, like, name);
}

void run(GemmArgs& g, const std::vector<Place>& places, uintptr_t stream, bool check_indices) {
  DeviceGuard guard(places);
  Options o;
  o.stream = reinterpret_cast<void*>(stream);
  o.check_indices = check_indices;
  nb::gil_scoped_release release;
  gemm(g, o);
}

}  // namespace

// The problem of each product from its arrays (alpha, beta and the op set by the caller).
// places: where each array lives, for the device guard. e4m3 inputs bring their scales (the
// sparse operand's per block, the dense input's per token: B's columns, A's rows).
// dsd_args is declared in _sparsek_arrays.hpp (with its default arguments): the distributed DSD
// uses it too.
GemmArgs dsd_args(int64_t rows, int64_t cols, const In& row_ptr, const In& col_idx, const In& values, const In& b,
                  const Out& c, int op, std::vector<Place>& places, const OptIn& scales, const OptIn& b_scales) {
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.op = static_cast<Op>(op);
  g.sparse = bsr_view(rows, cols, row_ptr, col_idx, values, "A");
  put_bsr_scales(g.sparse, scales, values, "A");
  g.b = dense_view(b, "B", true);
  if (b_scales) put_dense_scales(g.b, *b_scales, b, "B scales", false);
  g.c = dense_view(c, "C");
  places = {place_of(values, "A"), place_of(b, "B"), place_of(c, "C")};
  return g;
}

namespace {

GemmArgs dds_args(const In& a, int64_t rows, int64_t cols, const In& row_ptr, const In& col_idx, const In& values,
                  const Out& c, int op, std::vector<Place>& places, const OptIn& a_scales = std::nullopt,
                  const OptIn& scales = std::nullopt) {
  GemmArgs g;
  g.kind = OpKind::dds;
  g.op = static_cast<Op>(op);
  g.a = dense_view(a, "A", true);
  if (a_scales) put_dense_scales(g.a, *a_scales, a, "A scales", true);
  g.sparse = bsr_view(rows, cols, row_ptr, col_idx, values, "B");
  put_bsr_scales(g.sparse, scales, values, "B");
  g.c = dense_view(c, "C");
  places = {place_of(a, "A"), place_of(values, "B"), place_of(c, "C")};
  return g;
}
GemmArgs sdd_args(const In& a, const In& b, int64_t rows, int64_t cols, const In& row_ptr, const In& col_idx,
                  const Out& values, std::vector<Place>& places) {
  GemmArgs g;
  g.kind = OpKind::sdd;
  g.a = dense_view(a, "A");
  g.b = dense_view(b, "B");
  g.sparse = bsr_view(rows, cols, row_ptr, col_idx, values, "C");
  places = {place_of(a, "A"), place_of(b, "B"), place_of(values, "C")};
  return g;
}

// A plan made from arrays once; run() then takes only the data pointers of arrays that have the
// planned shapes, strides, dtypes and device (the Python caller keys its plan cache on exactly
// those), so a call converts no array and allocates nothing.
struct PyPlan {
  Plan plan;
  int device = -1;  // CUDA device of the operands (-1: host)
};

PyPlan make_plan(GemmArgs g, const std::vector<Place>& places, uintptr_t stream) {
  DeviceGuard guard(places);
  PyPlan p;
  for (const Place& q : places)
    if (q.memory == Memory::device) p.device = q.device;
  Options o;
  o.stream = reinterpret_cast<void*>(stream);
  nb::gil_scoped_release release;
  p.plan = plan(g, o);
  return p;
}

void run_plan(const PyPlan& p, uintptr_t values, uintptr_t a, uintptr_t b, uintptr_t c, float alpha, float beta,
              uintptr_t stream, uintptr_t scales, uintptr_t dense_scales) {
  GemmArgs g = p.plan.problem();
  g.sparse.values = reinterpret_cast<void*>(values);
  g.a.data = reinterpret_cast<void*>(a);
  g.b.data = reinterpret_cast<void*>(b);
  g.c.data = reinterpret_cast<void*>(c);
  // e4m3: this run's scales (arrays of the planned shapes, as the values are); null otherwise.
  g.sparse.scales = reinterpret_cast<const float*>(scales);
  if (g.kind != OpKind::sdd) (g.kind == OpKind::dsd ? g.b : g.a).scales = reinterpret_cast<const float*>(dense_scales);
  g.alpha = alpha;
  g.beta = beta;
  PlanDevice guard(p.device);
  nb::gil_scoped_release release;
  run(p.plan, g, reinterpret_cast<void*>(stream));
}

}  // namespace

void bind_products(nb::module_& m) {
  // C = alpha * A * B + beta * C, A sparse.
  m.def(
      "dsd",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, In b, Out c, float alpha, float beta,
         int op, uintptr_t stream, bool check_indices, OptIn scales, OptIn b_scales) {
        std::vector<Place> places;
        GemmArgs g = dsd_args(rows, cols, row_ptr, col_idx, values, b, c, op, places, scales, b_scales);
        g.alpha = alpha;
        g.beta = beta;
        run(g, places, stream, check_indices);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"), nb::arg("b"),
      nb::arg("c"), nb::arg("alpha"), nb::arg("beta"), nb::arg("op") = 0, nb::arg("stream") = 0,
      nb::arg("check_indices") = true, nb::arg("scales").none() = nb::none(), nb::arg("b_scales").none() = nb::none());

  // C = alpha * A * B + beta * C, B sparse.
  m.def(
      "dds",
      [](In a, int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, Out c, float alpha, float beta,
         int op, uintptr_t stream, bool check_indices, OptIn a_scales, OptIn scales) {
        std::vector<Place> places;
        GemmArgs g = dds_args(a, rows, cols, row_ptr, col_idx, values, c, op, places, a_scales, scales);
        g.alpha = alpha;
        g.beta = beta;
        run(g, places, stream, check_indices);
      },
      nb::arg("a"), nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"),
      nb::arg("c"), nb::arg("alpha"), nb::arg("beta"), nb::arg("op") = 0, nb::arg("stream") = 0,
      nb::arg("check_indices") = true, nb::arg("a_scales").none() = nb::none(), nb::arg("scales").none() = nb::none());

  // C = alpha * (A * B) + beta * C on C's stored blocks; C's values are written in place.
  m.def(
      "sdd",
      [](In a, In b, int64_t rows, int64_t cols, In row_ptr, In col_idx, Out values, float alpha, float beta,
         uintptr_t stream, bool check_indices) {
        std::vector<Place> places;
        GemmArgs g = sdd_args(a, b, rows, cols, row_ptr, col_idx, values, places);
        g.alpha = alpha;
        g.beta = beta;
        run(g, places, stream, check_indices);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"),
      nb::arg("values"), nb::arg("alpha"), nb::arg("beta"), nb::arg("stream") = 0, nb::arg("check_indices") = true);

  // Plans: plan_dsd / plan_dds / plan_sdd take the arrays of the calls above (without alpha and
  // beta) and do plan()'s once-per-pattern work; Plan.run takes the data pointers of arrays with
  // the planned shapes, strides, dtypes and device.
  nb::class_<PyPlan>(m, "Plan")
      .def_prop_ro("variant", [](const PyPlan& p) { return p.plan.variant(); })
      .def_prop_ro("chosen_by", [](const PyPlan& p) { return p.plan.chosen_by(); })
      .def_prop_ro("workspace_bytes", [](const PyPlan& p) { return p.plan.workspace_bytes(); })
      .def("run", &run_plan, nb::arg("values"), nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("alpha"),
           nb::arg("beta"), nb::arg("stream"), nb::arg("scales") = 0, nb::arg("dense_scales") = 0);
  m.def(
      "plan_dsd",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, In b, Out c, int op, uintptr_t stream,
         OptIn scales, OptIn b_scales) {
        std::vector<Place> places;
        GemmArgs g = dsd_args(rows, cols, row_ptr, col_idx, values, b, c, op, places, scales, b_scales);
        return make_plan(g, places, stream);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"), nb::arg("b"),
      nb::arg("c"), nb::arg("op"), nb::arg("stream"), nb::arg("scales").none() = nb::none(),
      nb::arg("b_scales").none() = nb::none());
  m.def(
      "plan_dds",
      [](In a, int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, Out c, int op, uintptr_t stream,
         OptIn a_scales, OptIn scales) {
        std::vector<Place> places;
        GemmArgs g = dds_args(a, rows, cols, row_ptr, col_idx, values, c, op, places, a_scales, scales);
        return make_plan(g, places, stream);
      },
      nb::arg("a"), nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"),
      nb::arg("c"), nb::arg("op"), nb::arg("stream"), nb::arg("a_scales").none() = nb::none(),
      nb::arg("scales").none() = nb::none());
  m.def(
      "plan_sdd",
      [](In a, In b, int64_t rows, int64_t cols, In row_ptr, In col_idx, Out values, uintptr_t stream) {
        std::vector<Place> places;
        GemmArgs g = sdd_args(a, b, rows, cols, row_ptr, col_idx, values, places);
        return make_plan(g, places, stream);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"),
      nb::arg("values"), nb::arg("stream"));

  // The BSR invariants. Cheap checks always; with check_indices the O(nnzb) index checks
  // too (device indices are copied to the host first, as the library's own validation does).
  m.def(
      "validate_bsr",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, bool check_indices, uintptr_t stream,
         OptIn scales) {
        BsrView v = bsr_view(rows, cols, row_ptr, col_idx, values, "BSR");
        put_bsr_scales(v, scales, values, "BSR");
        validate(v, check_indices && v.memory == Memory::host);
        if (!check_indices || v.memory == Memory::host) return;
        DeviceGuard guard({place_of(values, "values")});
        // On the caller's stream: the indices may still be in flight there (a non-blocking stream
        // does not order with the legacy default stream that a plain cudaMemcpy would use).
        auto s = reinterpret_cast<cudaStream_t>(stream);
        std::vector<int32_t> rp(size_t(v.mb() + 1)), ci(size_t(v.nnzb));
        std::vector<float> sc(v.scales ? size_t(v.nnzb) : 0);  // e4m3: checked with the indices
        cudaError_t e = cudaMemcpyAsync(rp.data(), v.row_ptr, rp.size() * 4, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess && !ci.empty())
          e = cudaMemcpyAsync(ci.data(), v.col_idx, ci.size() * 4, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess && !sc.empty())
          e = cudaMemcpyAsync(sc.data(), v.scales, sc.size() * 4, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) {
          cudaGetLastError();
          throw Error(Status::cuda_error, std::string("copying BSR indices to the host failed: ") +
                                              cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
        }
        BsrView h = v;
        h.memory = Memory::host;
        h.row_ptr = rp.data();
        h.col_idx = ci.data();
        if (v.scales) h.scales = sc.data();
        validate(h, true);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"),
      nb::arg("check_indices") = true, nb::arg("stream") = 0, nb::arg("scales").none() = nb::none());

  // ---- e4m3 quantization (sparsek/quantize.hpp): outputs allocated by the Python caller ----
  // A BSR matrix's values -> codes (uint8 [nnzb, bm, bk]) and scales (float32 [nnzb]).
  m.def(
      "quantize_bsr",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, Out codes, Out scales, uintptr_t stream) {
        BsrView v = bsr_view(rows, cols, row_ptr, col_idx, values, "BSR");
        const BsrView q = bsr_view(rows, cols, row_ptr, col_idx, codes, "BSR codes:");
        if (q.dtype != DType::e4m3 || q.bm != v.bm || q.bk != v.bk)
          bad("codes must be a uint8 array of the values' shape " + shape_str(values) + ", got " + shape_str(codes) +
              " " + dtype_str(codes.dtype()));
        if (scales.ndim() != 1 || int64_t(scales.shape(0)) != v.nnzb)
          bad("scales must have shape (" + std::to_string(v.nnzb) + ",), got " + shape_str(scales));
        float* sc = scales_array(scales, values, "scales");
        DeviceGuard guard({place_of(values, "values"), place_of(codes, "codes")});
        nb::gil_scoped_release release;
        quantize_e4m3(v, q.values, sc, reinterpret_cast<void*>(stream));
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"), nb::arg("codes"),
      nb::arg("scales"), nb::arg("stream") = 0);
  // Codes and scales -> values (float32/float16/bfloat16 [nnzb, bm, bk]).
  m.def(
      "dequantize_bsr",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In codes, In scales, Out values, uintptr_t stream) {
        BsrView q = bsr_view(rows, cols, row_ptr, col_idx, codes, "BSR");
        put_bsr_scales(q, scales, codes, "BSR");
        const BsrView v = bsr_view(rows, cols, row_ptr, col_idx, values, "BSR output:");
        if (v.bm != q.bm || v.bk != q.bk) bad("values must have the codes' shape " + shape_str(codes) + ", got " + shape_str(values));
        DeviceGuard guard({place_of(codes, "codes"), place_of(values, "values")});
        nb::gil_scoped_release release;
        dequantize(q, v.values, v.dtype, reinterpret_cast<void*>(stream));
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("codes"), nb::arg("scales"),
      nb::arg("values"), nb::arg("stream") = 0);
  // A dense 2-D array -> codes (uint8, its shape) and scales: [tokens] or [tokens, ceil(K/128)]
  // (the group follows from the scales' shape); dim 0: tokens are rows, 1: columns.
  m.def(
      "quantize_dense",
      [](In x, Out codes, Out scales, int dim, uintptr_t stream) {
        if (dim != 0 && dim != 1) bad("dim " + std::to_string(dim) + " is not 0 (rows) or 1 (columns)");
        const DenseView in = dense_view(x, "x");
        DenseView out = dense_view(codes, "codes", true);
        put_dense_scales(out, scales, codes, "scales", dim == 0);
        float* sc = const_cast<float*>(out.scales);
        const int group = out.scale_group;
        out.scales = nullptr;
        out.scale_group = 0;
        DeviceGuard guard({place_of(x, "x"), place_of(codes, "codes"), place_of(scales, "scales")});
        nb::gil_scoped_release release;
        quantize_e4m3(in, out, sc, static_cast<ScaleDim>(dim), group, reinterpret_cast<void*>(stream));
      },
      nb::arg("x"), nb::arg("codes"), nb::arg("scales"), nb::arg("dim"), nb::arg("stream") = 0);
  m.def(
      "dequantize_dense",
      [](In codes, In scales, Out x, int dim, uintptr_t stream) {
        if (dim != 0 && dim != 1) bad("dim " + std::to_string(dim) + " is not 0 (rows) or 1 (columns)");
        DenseView in = dense_view(codes, "codes", true);
        put_dense_scales(in, scales, codes, "scales", dim == 0);
        const DenseView out = dense_view(x, "out");
        DeviceGuard guard({place_of(codes, "codes"), place_of(x, "out")});
        nb::gil_scoped_release release;
        dequantize(in, out, static_cast<ScaleDim>(dim), reinterpret_cast<void*>(stream));
      },
      nb::arg("codes"), nb::arg("scales"), nb::arg("out"), nb::arg("dim"), nb::arg("stream") = 0);

  // Block-shape checks of a (rows x cols) matrix cut into (bm x bk) blocks, before any array exists:
  // the library's own messages for a bad block shape or non-divisible dims.
  m.def(
      "check_block_shape",
      [](int64_t rows, int64_t cols, int bm, int bk) { validate_shape(rows, cols, bm, bk); },
      nb::arg("rows"), nb::arg("cols"), nb::arg("bm"), nb::arg("bk"));
}

}  // namespace sparsek::py
