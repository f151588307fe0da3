// sparsek._sparsek — the only native piece of the Python package. It converts DLPack arrays
// (NumPy, torch, CuPy; host or CUDA memory) into sparsek views and calls the C++ API; everything
// else (allocation, conversions, torch ops) lives in Python, in the caller's framework.
//
// Sparse operands arrive as (rows, cols, row_ptr int32[mb+1], col_idx int32[nnzb],
// values [nnzb][bm][bk]); dense operands as 2-D arrays that are row- or column-major with a unit
// inner stride. sparsek::Error becomes ValueError (invalid_argument), NotImplementedError
// (unsupported) or RuntimeError (everything else), carrying the library's message.
// Plans (plan_dsd/dds/sdd -> Plan.run) are the same calls split in two: arrays once, then only the
// data pointers of arrays that the Python caller has matched to the planned ones.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsek/distributed.hpp"
#include "sparsek/gemm.hpp"
#include "sparsek/plan.hpp"

namespace nb = nanobind;
using namespace sparsek;

namespace {

using In = nb::ndarray<nb::ro>;  // read-only access is enough (accepts read-only NumPy arrays)
using Out = nb::ndarray<>;       // written: must be writable

[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }

template <class A>
std::string shape_str(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string dtype_str(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  const char* kind = t.code == uint8_t(C::Int)     ? "int"
                     : t.code == uint8_t(C::UInt)  ? "uint"
                     : t.code == uint8_t(C::Float) ? "float"
                     : t.code == uint8_t(C::Bfloat) ? "bfloat"
                     : t.code == uint8_t(C::Bool)  ? "bool"
                     : t.code == uint8_t(C::Complex) ? "complex"
                                                      : "code";
  return std::string(kind) + std::to_string(t.bits);
}

DType value_dtype(nb::dlpack::dtype t, const std::string& name) {
  using C = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == uint8_t(C::Float) && t.bits == 32) return DType::f32;
    if (t.code == uint8_t(C::Float) && t.bits == 16) return DType::f16;
    if (t.code == uint8_t(C::Bfloat) && t.bits == 16) return DType::bf16;
  }
  bad(name + " dtype " + dtype_str(t) + " is not supported (float32, float16 or bfloat16)");
}

// Where an array lives: host (CPU or pinned) or a CUDA device (id >= 0).
struct Place {
  Memory memory = Memory::host;
  int device = -1;
};

template <class A>
Place place_of(const A& a, const std::string& name) {
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: return {Memory::host, -1};
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: return {Memory::device, a.device_id()};
    default:
      bad(name + " is on DLPack device type " + std::to_string(a.device_type()) +
          ", only CPU and CUDA arrays are supported");
  }
}

// A 2-D array as a DenseView: row-major (inner stride 1 along columns) or column-major (inner
// stride 1 along rows), any leading dimension. Strides of extent-1 dimensions do not matter.
template <class A>
DenseView dense_view(const A& a, const std::string& name) {
  if (a.ndim() != 2) bad(name + " must be a 2-D array, got shape " + shape_str(a));
  DenseView d;
  d.rows = int64_t(a.shape(0));
  d.cols = int64_t(a.shape(1));
  d.dtype = value_dtype(a.dtype(), name);
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
  v.dtype = value_dtype(values.dtype(), name + " values");
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

// Makes the arrays' CUDA device current for the call (and restores the previous one).
class DeviceGuard {
 public:
  explicit DeviceGuard(const std::vector<Place>& places) {
    int dev = -1;
    for (const Place& p : places) {
      if (p.memory != Memory::device) continue;
      if (dev >= 0 && p.device != dev)
        bad("operands are on different CUDA devices (" + std::to_string(dev) + " and " +
            std::to_string(p.device) + ")");
      dev = p.device;
    }
    if (dev < 0) return;
    int cur = 0;
    if (cudaGetDevice(&cur) != cudaSuccess) {
      cudaGetLastError();
      throw Error(Status::no_device, "CUDA arrays were passed but cudaGetDevice failed");
    }
    if (cur != dev) {
      if (cudaSetDevice(dev) != cudaSuccess) {
        cudaGetLastError();
        throw Error(Status::cuda_error, "cudaSetDevice(" + std::to_string(dev) + ") failed");
      }
      prev_ = cur;
    }
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

void run(GemmArgs& g, const std::vector<Place>& places, uintptr_t stream, bool check_indices) {
  DeviceGuard guard(places);
  Options o;
  o.stream = reinterpret_cast<void*>(stream);
  o.check_indices = check_indices;
  nb::gil_scoped_release release;
  gemm(g, o);
}

// The problem of each product from its arrays (alpha, beta and the op set by the caller).
// places: where each array lives, for the device guard.
GemmArgs dsd_args(int64_t rows, int64_t cols, const In& row_ptr, const In& col_idx, const In& values, const In& b,
                  const Out& c, int op, std::vector<Place>& places) {
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.op = static_cast<Op>(op);
  g.sparse = bsr_view(rows, cols, row_ptr, col_idx, values, "A");
  g.b = dense_view(b, "B");
  g.c = dense_view(c, "C");
  places = {place_of(values, "A"), place_of(b, "B"), place_of(c, "C")};
  return g;
}
GemmArgs dds_args(const In& a, int64_t rows, int64_t cols, const In& row_ptr, const In& col_idx, const In& values,
                  const Out& c, int op, std::vector<Place>& places) {
  GemmArgs g;
  g.kind = OpKind::dds;
  g.op = static_cast<Op>(op);
  g.a = dense_view(a, "A");
  g.sparse = bsr_view(rows, cols, row_ptr, col_idx, values, "B");
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

// Sets the plan's device current for a run (and restores the previous one).
class PlanDevice {
 public:
  explicit PlanDevice(int dev) {
    if (dev < 0) return;
    int cur = 0;
    if (cudaGetDevice(&cur) != cudaSuccess || (cur != dev && cudaSetDevice(dev) != cudaSuccess)) {
      cudaGetLastError();
      throw Error(Status::cuda_error, "cannot make CUDA device " + std::to_string(dev) + " current");
    }
    if (cur != dev) prev_ = cur;
  }
  ~PlanDevice() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

void run_plan(const PyPlan& p, uintptr_t values, uintptr_t a, uintptr_t b, uintptr_t c, float alpha, float beta,
              uintptr_t stream) {
  GemmArgs g = p.plan.problem();
  g.sparse.values = reinterpret_cast<void*>(values);
  g.a.data = reinterpret_cast<void*>(a);
  g.b.data = reinterpret_cast<void*>(b);
  g.c.data = reinterpret_cast<void*>(c);
  g.alpha = alpha;
  g.beta = beta;
  PlanDevice guard(p.device);
  nb::gil_scoped_release release;
  run(p.plan, g, reinterpret_cast<void*>(stream));
}

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

}  // namespace

NB_MODULE(_sparsek, m) {
  m.doc() = "sparsek native binding: converts DLPack arrays to sparsek views and calls the C++ API";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* type = e.status() == Status::invalid_argument ? PyExc_ValueError
                       : e.status() == Status::unsupported    ? PyExc_NotImplementedError
                                                              : PyExc_RuntimeError;
      PyErr_SetString(type, e.what());
    }
  });

  // NOTE: plans are cached on the pattern's tensors (the Python side), which may still be alive
  // when the interpreter tears the module down; nanobind would report them as leaks.
  nb::set_leak_warnings(false);

  m.def("version", &version);

  // C = alpha * A * B + beta * C, A sparse.
  m.def(
      "dsd",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, In b, Out c, float alpha, float beta,
         int op, uintptr_t stream, bool check_indices) {
        std::vector<Place> places;
        GemmArgs g = dsd_args(rows, cols, row_ptr, col_idx, values, b, c, op, places);
        g.alpha = alpha;
        g.beta = beta;
        run(g, places, stream, check_indices);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"), nb::arg("b"),
      nb::arg("c"), nb::arg("alpha"), nb::arg("beta"), nb::arg("op") = 0, nb::arg("stream") = 0,
      nb::arg("check_indices") = true);

  // C = alpha * A * B + beta * C, B sparse.
  m.def(
      "dds",
      [](In a, int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, Out c, float alpha, float beta,
         int op, uintptr_t stream, bool check_indices) {
        std::vector<Place> places;
        GemmArgs g = dds_args(a, rows, cols, row_ptr, col_idx, values, c, op, places);
        g.alpha = alpha;
        g.beta = beta;
        run(g, places, stream, check_indices);
      },
      nb::arg("a"), nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"),
      nb::arg("c"), nb::arg("alpha"), nb::arg("beta"), nb::arg("op") = 0, nb::arg("stream") = 0,
      nb::arg("check_indices") = true);

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
           nb::arg("beta"), nb::arg("stream"));
  m.def(
      "plan_dsd",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, In b, Out c, int op, uintptr_t stream) {
        std::vector<Place> places;
        GemmArgs g = dsd_args(rows, cols, row_ptr, col_idx, values, b, c, op, places);
        return make_plan(g, places, stream);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"), nb::arg("b"),
      nb::arg("c"), nb::arg("op"), nb::arg("stream"));
  m.def(
      "plan_dds",
      [](In a, int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, Out c, int op, uintptr_t stream) {
        std::vector<Place> places;
        GemmArgs g = dds_args(a, rows, cols, row_ptr, col_idx, values, c, op, places);
        return make_plan(g, places, stream);
      },
      nb::arg("a"), nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"),
      nb::arg("c"), nb::arg("op"), nb::arg("stream"));
  m.def(
      "plan_sdd",
      [](In a, In b, int64_t rows, int64_t cols, In row_ptr, In col_idx, Out values, uintptr_t stream) {
        std::vector<Place> places;
        GemmArgs g = sdd_args(a, b, rows, cols, row_ptr, col_idx, values, places);
        return make_plan(g, places, stream);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"),
      nb::arg("values"), nb::arg("stream"));

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
  m.def("partition_block_rows", [](In row_ptr, int64_t mb, int ranks) {
    if (row_ptr.ndim() != 1 || row_ptr.shape(0) != size_t(mb + 1) || row_ptr.device_type() != nb::device::cpu::value ||
        row_ptr.dtype() != nb::dtype<int32_t>())
      bad("row_ptr must be a host int32 array of mb + 1 = " + std::to_string(mb + 1) + " entries");
    return partition_block_rows(static_cast<const int32_t*>(row_ptr.data()), mb, ranks);
  });

  // The BSR invariants (SPEC §2). Cheap checks always; with check_indices the O(nnzb) index checks
  // too (device indices are copied to the host first, as the library's own validation does).
  m.def(
      "validate_bsr",
      [](int64_t rows, int64_t cols, In row_ptr, In col_idx, In values, bool check_indices, uintptr_t stream) {
        BsrView v = bsr_view(rows, cols, row_ptr, col_idx, values, "BSR");
        validate(v, check_indices && v.memory == Memory::host);
        if (!check_indices || v.memory == Memory::host) return;
        DeviceGuard guard({place_of(values, "values")});
        // On the caller's stream: the indices may still be in flight there (a non-blocking stream
        // does not order with the legacy default stream that a plain cudaMemcpy would use).
        auto s = reinterpret_cast<cudaStream_t>(stream);
        std::vector<int32_t> rp(size_t(v.mb() + 1)), ci(size_t(v.nnzb));
        cudaError_t e = cudaMemcpyAsync(rp.data(), v.row_ptr, rp.size() * 4, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess && !ci.empty())
          e = cudaMemcpyAsync(ci.data(), v.col_idx, ci.size() * 4, cudaMemcpyDeviceToHost, s);
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
        validate(h, true);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("values"),
      nb::arg("check_indices") = true, nb::arg("stream") = 0);

  // Block-shape checks of a (rows x cols) matrix cut into (bm x bk) blocks, before any array exists:
  // the library's own messages for a bad block shape or non-divisible dims.
  m.def(
      "check_block_shape",
      [](int64_t rows, int64_t cols, int bm, int bk) { validate_shape(rows, cols, bm, bk); },
      nb::arg("rows"), nb::arg("cols"), nb::arg("bm"), nb::arg("bk"));
}
