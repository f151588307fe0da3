// Shared test helpers: host dense matrices, poisoning, GPU availability.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/device.hpp"
#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek::test {

// A host dense matrix with owned storage (bytes in `dtype`).
struct HostDense {
  std::vector<uint8_t> bytes;
  DenseView view;
  HostDense(int64_t rows, int64_t cols, DType dtype, Layout layout = Layout::row_major, int64_t pad = 0) {
    view.rows = rows;
    view.cols = cols;
    view.layout = layout;
    view.dtype = dtype;
    view.memory = Memory::host;
    int64_t minor = layout == Layout::row_major ? cols : rows;
    int64_t major = layout == Layout::row_major ? rows : cols;
    view.ld = std::max<int64_t>(minor, 1) + pad;
    bytes.assign(size_t(std::max<int64_t>(major, 1) * view.ld) * dtype_size(dtype), 0);
    view.data = bytes.data();
  }
  float get(int64_t r, int64_t c) const { return load_as_float(view.data, view.dtype, view.index(r, c)); }
  void set(int64_t r, int64_t c, float v) { store_from_float(view.data, view.dtype, view.index(r, c), v); }
  // Uniform [-1, 1) or integers in [-4, 4]; the whole storage (padding too) is written.
  void fill_random(uint64_t seed, bool integers = false) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::uniform_int_distribution<int> ui(-4, 4);
    int64_t n = int64_t(bytes.size() / dtype_size(view.dtype));
    for (int64_t i = 0; i < n; ++i) store_from_float(view.data, view.dtype, i, integers ? float(ui(rng)) : u(rng));
  }
  void fill(float v) {
    int64_t n = int64_t(bytes.size() / dtype_size(view.dtype));
    for (int64_t i = 0; i < n; ++i) store_from_float(view.data, view.dtype, i, v);
  }
};

inline float nan_value() { return std::numeric_limits<float>::quiet_NaN(); }

}  // namespace sparsek::test

// Skips the current test with the reason when no CUDA device answers.
#define SPARSEK_REQUIRE_GPU()                                                       \
  do {                                                                              \
    const auto& info_ = ::sparsek::device_info();                                   \
    if (!info_.available) GTEST_SKIP() << "no GPU: " << info_.why_not;              \
  } while (0)
