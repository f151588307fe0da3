// The helpers that every surface of sparsek._sparsek shares (the module: _sparsek.cpp): DLPack
// arrays -> sparsek views, the argument checks (their messages are the Python errors' text), the
// device guards. Private to the extension: included by its .cpp files only.
#pragma once

#include "core/cuda_host.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// Every surface sees the whole C++ API, as when the bindings were one file.
#include "sparsek/attention.hpp"
#include "sparsek/decode.hpp"
#include "sparsek/distributed.hpp"
#include "sparsek/gemm.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/quantize.hpp"

namespace nb = nanobind;

namespace sparsek::py {

using In = nb::ndarray<nb::ro>;  // read-only access is enough (accepts read-only NumPy arrays)
using Out = nb::ndarray<>;       // written: must be writable
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

[[noreturn]] inline void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }

template <class A>
std::string shape_str(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

inline std::string dtype_str(nb::dlpack::dtype t) {
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

inline DType value_dtype(nb::dlpack::dtype t, const std::string& name, bool e4m3_ok = false) {
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

inline Options options_for(uintptr_t stream, bool check_indices) {
  Options o;
  o.stream = reinterpret_cast<void*>(stream);
  o.check_indices = check_indices;
  return o;
}

// ---- 4-D arrays and the block layout (attention, the gate, context-parallel attention) ----

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

// The DSD problem from its arrays (defined with the other products' in _sparsek_products.cpp; the
// distributed DSD plans it too).
GemmArgs dsd_args(int64_t rows, int64_t cols, const In& row_ptr, const In& col_idx, const In& values, const In& b,
                  const Out& c, int op, std::vector<Place>& places, const OptIn& scales = std::nullopt,
                  const OptIn& b_scales = std::nullopt);

// The surfaces, one file each; NB_MODULE (_sparsek.cpp) calls them in this order.
void bind_products(nb::module_& m);     // _sparsek_products.cpp
void bind_distributed(nb::module_& m);  // _sparsek_distributed.cpp
void bind_attention(nb::module_& m);    // _sparsek_attention.cpp
void bind_decode(nb::module_& m);       // _sparsek_decode.cpp

}  // namespace sparsek::py
