// sparsek._sparsek — the only native piece of the Python package. It converts DLPack arrays
// (NumPy, torch, CuPy; host or CUDA memory) into sparsek views and calls the C++ API; everything
// else (allocation, conversions, torch ops) lives in Python, in the caller's framework.
//
// Sparse operands arrive as (rows, cols, row_ptr int32[mb+1], col_idx int32[nnzb],
// values [nnzb][bm][bk]); dense operands as 2-D arrays that are row- or column-major with a unit
// inner stride. e4m3 (fp8) arrays arrive as uint8 arrays of the codes (torch's float8_e4m3fn is
// viewed as uint8 by the Python side) with their float32 scales beside them. sparsek::Error becomes
// ValueError (invalid_argument), NotImplementedError (unsupported), NcclError (a RuntimeError:
// nccl_error) or RuntimeError (everything else), carrying the library's message.
// Plans (plan_dsd/dds/sdd -> Plan.run, plan_attention -> AttentionPlan.run) are the same calls
// split in two: arrays once, then only the data pointers of arrays that the Python caller has
// matched to the planned ones.
// Attention takes q, k, v, o as 4-D [B, H, S, D] arrays (D contiguous, any other strides), lse as
// a contiguous float32 [B, Hq, Sq] array, and the block layout as contiguous int32 arrays
// kv_num_blocks [b, h, Mq], kv_indices [b, h, Mq, kmax] (+ the optional full lists), and packed
// sequences' offsets as an optional contiguous int32 cu_seqlens [num_seqs + 1] beside the layout.
#include "core/cuda_host.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sparsek/attention.hpp"
#include "sparsek/decode.hpp"
#include "sparsek/distributed.hpp"
#include "sparsek/gemm.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/quantize.hpp"

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

DType value_dtype(nb::dlpack::dtype t, const std::string& name, bool e4m3_ok = false) {
  using C = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == uint8_t(C::Float) && t.bits == 32) return DType::f32;
    if (t.code == uint8_t(C::Float) && t.bits == 16) return DType::f16;
    if (t.code == uint8_t(C::Bfloat) && t.bits == 16) return DType::bf16;
    if (e4m3_ok && t.code == uint8_t(C::UInt) && t.bits == 8) return DType::e4m3;  // the codes
  }
  bad(name + " dtype " + dtype_str(t) + " is not supported (float32, float16 or bfloat16" +
      (e4m3_ok ? "; e4m3 as uint8 codes with their scales)" : ")"));
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

using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

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
#ifdef SPARSEK_NO_CUDA
    throw Error(Status::unsupported, std::string("CUDA arrays were passed, but ") + kNoCudaRuntimeText +
                                         ": only the CPU backend is available (pass NumPy arrays)");
#endif
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
// places: where each array lives, for the device guard. e4m3 inputs bring their scales (the
// sparse operand's per block, the dense input's per token: B's columns, A's rows).
GemmArgs dsd_args(int64_t rows, int64_t cols, const In& row_ptr, const In& col_idx, const In& values, const In& b,
                  const Out& c, int op, std::vector<Place>& places, const OptIn& scales = std::nullopt,
                  const OptIn& b_scales = std::nullopt) {
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

// ---- attention and the gate ----

template <class A>
bool c_contiguous(const A& a) {
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) == 0) return true;  // an empty array has no element to misplace (its strides may be anything)
  int64_t want = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != want) return false;
    want *= int64_t(a.shape(i));
  }
  return true;
}

// A [B, H, S, D] array with a unit stride along D.
template <class A>
Tensor4View view4(const A& a, const std::string& name) {
  if (a.ndim() != 4) bad(name + " must be a 4-D array [B, H, S, D], got shape " + shape_str(a));
  Tensor4View t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = value_dtype(a.dtype(), name);
  t.memory = place_of(a, name).memory;
  t.b = int64_t(a.shape(0)), t.h = int64_t(a.shape(1)), t.s = int64_t(a.shape(2)), t.d = int64_t(a.shape(3));
  if (t.b * t.h * t.s * t.d == 0) {  // no element (a rank's empty shard): DLPack may give it any strides
    t.stride_s = t.d, t.stride_h = t.s * t.d, t.stride_b = t.h * t.s * t.d;
    return t;
  }
  if (t.d > 1 && a.stride(3) != 1)
    bad(name + " must have a unit stride along D (its last dimension), got stride " + std::to_string(a.stride(3)) +
        "; pass a copy with .contiguous()");
  t.stride_b = a.stride(0), t.stride_h = a.stride(1), t.stride_s = a.stride(2);
  return t;
}

// A contiguous int32 / float32 array of the given rank.
template <class A>
void check_array(const A& a, const std::string& name, size_t ndim, bool is_int) {
  if (a.ndim() != ndim)
    bad(name + " must be a " + std::to_string(ndim) + "-D array, got shape " + shape_str(a));
  const bool ok = is_int ? a.dtype() == nb::dtype<int32_t>() : a.dtype() == nb::dtype<float>();
  if (!ok) bad(name + " dtype " + dtype_str(a.dtype()) + " must be " + (is_int ? "int32" : "float32"));
  if (!c_contiguous(a)) bad(name + " must be contiguous");
}

// The layout's arrays: kv_num_blocks [b, h, Mq], kv_indices [b, h, Mq, kmax], optional full lists.
template <class N, class I>
AttentionLayout layout_view(const N& num, const I& idx, const std::optional<N>& fnum, const std::optional<I>& fidx,
                            int block, std::vector<Place>& places) {
  check_array(num, "kv_num_blocks", 3, true);
  check_array(idx, "kv_indices", 4, true);
  AttentionLayout l;
  l.batch = int64_t(num.shape(0)), l.heads = int64_t(num.shape(1)), l.q_blocks = int64_t(num.shape(2));
  auto same_rows = [&](const I& x, const char* xn, const N& n, const char* nn) {
    for (size_t i = 0; i < 3; ++i)
      if (x.shape(i) != n.shape(i))
        bad(std::string(xn) + " has shape " + shape_str(x) + " but " + nn + " has shape " + shape_str(n) +
            " (the first three dimensions must match)");
  };
  same_rows(idx, "kv_indices", num, "kv_num_blocks");
  l.kv_num_blocks = static_cast<const int32_t*>(num.data());
  l.kv_indices = static_cast<const int32_t*>(idx.data());
  l.kmax = int64_t(idx.shape(3));
  if (fnum.has_value() != fidx.has_value())
    bad("full_kv_num_blocks and full_kv_indices must be given both or neither");
  places.push_back(place_of(num, "kv_num_blocks"));
  places.push_back(place_of(idx, "kv_indices"));
  if (fnum) {
    check_array(*fnum, "full_kv_num_blocks", 3, true);
    check_array(*fidx, "full_kv_indices", 4, true);
    same_rows(*fidx, "full_kv_indices", *fnum, "full_kv_num_blocks");
    for (size_t i = 0; i < 3; ++i)
      if (fnum->shape(i) != num.shape(i))
        bad("full_kv_num_blocks has shape " + shape_str(*fnum) + " but kv_num_blocks has shape " + shape_str(num));
    l.full_kv_num_blocks = static_cast<const int32_t*>(fnum->data());
    l.full_kv_indices = static_cast<const int32_t*>(fidx->data());
    l.full_kmax = int64_t(fidx->shape(3));
    places.push_back(place_of(*fnum, "full_kv_num_blocks"));
    places.push_back(place_of(*fidx, "full_kv_indices"));
  }
  for (size_t i = 1; i < places.size(); ++i)
    if (places[i].memory != places[0].memory || places[i].device != places[0].device)
      bad("the layout's arrays must all be on one device");
  l.memory = places[0].memory;
  l.block_q = l.block_kv = block;
  return l;
}

// A [B, Hq, Sq] float32 contiguous array (the log-sum-exp), or nullptr.
template <class A>
float* lse_view(const std::optional<A>& lse, const Tensor4View& q, std::vector<Place>& places) {
  if (!lse) return nullptr;
  check_array(*lse, "lse", 3, false);
  if (int64_t(lse->shape(0)) != q.b || int64_t(lse->shape(1)) != q.h || int64_t(lse->shape(2)) != q.s)
    bad("lse has shape " + shape_str(*lse) + ", expected [B, Hq, Sq] = (" + std::to_string(q.b) + ", " +
        std::to_string(q.h) + ", " + std::to_string(q.s) + ")");
  places.push_back(place_of(*lse, "lse"));
  return static_cast<float*>(const_cast<void*>(static_cast<const void*>(lse->data())));
}

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

Options options_for(uintptr_t stream, bool check_indices) {
  Options o;
  o.stream = reinterpret_cast<void*>(stream);
  o.check_indices = check_indices;
  return o;
}

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
  check_array(page_table, "page_table", 2, true);
  check_array(seq_lens, "seq_lens", 1, true);
  check_array(cu, "cu_seqlens_q", 1, true);
  PageSelectArgs a;
  a.batch = int64_t(page_table.shape(0));
  a.max_pages = int64_t(page_table.shape(1));
  if (int64_t(seq_lens.shape(0)) != a.batch)
    bad("seq_lens has shape " + shape_str(seq_lens) + ", page_table " + shape_str(page_table) + ": one length per request");
  if (int64_t(cu.shape(0)) != a.batch + 1)
    bad("cu_seqlens_q has shape " + shape_str(cu) + ", expected (batch + 1,) = (" + std::to_string(a.batch + 1) + ",)");
  same_place(page_table, "page_table", ref, ref_name);
  same_place(seq_lens, "seq_lens", ref, ref_name);
  same_place(cu, "cu_seqlens_q", ref, ref_name);
  a.page_table = static_cast<const int32_t*>(page_table.data());
  a.seq_lens = static_cast<const int32_t*>(seq_lens.data());
  a.cu_seqlens_q = static_cast<const int32_t*>(cu.data());
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

NB_MODULE(_sparsek, m) {
  m.doc() = "sparsek native binding: converts DLPack arrays to sparsek views and calls the C++ API";

  // NCCL failures get a RuntimeError of their own (sparsek.distributed.NcclError), so that a caller
  // can tell them from the library's other runtime errors.
  PyObject* nccl_error = PyErr_NewException("sparsek._sparsek.NcclError", PyExc_RuntimeError, nullptr);
  m.attr("NcclError") = nb::steal(nccl_error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* nccl) {
        try {
          std::rethrow_exception(p);
        } catch (const Error& e) {
          PyObject* type = e.status() == Status::invalid_argument ? PyExc_ValueError
                           : e.status() == Status::unsupported    ? PyExc_NotImplementedError
                           : e.status() == Status::nccl_error     ? static_cast<PyObject*>(nccl)
                                                                  : PyExc_RuntimeError;
          PyErr_SetString(type, e.what());
        }
      },
      nccl_error);

  // NOTE: plans are cached on the pattern's tensors (the Python side), which may still be alive
  // when the interpreter tears the module down; nanobind would report them as leaks.
  nb::set_leak_warnings(false);

  m.def("version", &version);

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
          nb::arg("sel_counts").none(), nb::arg("stream") = 0);
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
        const PagedCacheView kv = cache_view(k, "k_cache");
        const Place where = place_of(k, "k_cache");
        check_summaries(summaries, kv.dtype, "k_cache");
        if (int64_t(summaries.shape(0)) != kv.pages || int64_t(summaries.shape(1)) != kv.h ||
            int64_t(summaries.shape(3)) != kv.d)
          bad("summaries has shape " + shape_str(summaries) + ", expected [num_pages, Hkv, 2, D] = (" +
              std::to_string(kv.pages) + ", " + std::to_string(kv.h) + ", 2, " + std::to_string(kv.d) +
              ") for k_cache " + shape_str(k));
        if (kv.d != 64 && kv.d != 128)
          bad("k_cache has D = " + std::to_string(kv.d) + " (its last dimension): 64 or 128 are supported");
        same_place(summaries, "summaries", where, "k_cache");
        PageSelectArgs a = page_select_indices(page_table, seq_lens, cu, where, "k_cache");
        a.k = kv;
        // update reads q's shape only: T bounds cu_seqlens_q.
        a.q = TokensView::packed(nullptr, kv.dtype, kv.memory, tokens, kv.h, kv.d);
        a.summaries = const_cast<void*>(static_cast<const void*>(summaries.data()));
        a.all_pages = all_pages;
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
        const TokensView qv = tokens_view(q, "q");
        const Place where = place_of(q, "q");
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
        run_page_op(a, PageOp::select, where, stream, check_indices);
      },
      nb::arg("q"), nb::arg("summaries"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("cu_seqlens_q"),
      nb::arg("sel_indices"), nb::arg("sel_counts"), nb::arg("page_size"), nb::arg("topk"), nb::arg("sink"),
      nb::arg("local"), nb::arg("stream") = 0, nb::arg("check_indices") = true);

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
