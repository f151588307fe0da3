// Shared by the host (tests/cpu/test_e4m3.cpp) and device (tests/gpu/test_quantize.cu) e4m3 tests:
// the combinations a dense quantization is checked over.
#pragma once
#include <string>
#include <vector>

#include "sparsek/quantize.hpp"

namespace sparsek::test {

// One dense quantization case: the input's dtype, the dimension that holds the tokens, the scale
// group, and the input's and the output's layouts.
struct DenseQuantCase {
  DType dtype;
  ScaleDim dim;
  int group;
  Layout in, out;
  std::string name() const {
    return std::string(to_string(dtype)) + (dim == ScaleDim::rows ? " rows " : " cols ") + std::to_string(group) +
           " " + to_string(in) + " -> " + to_string(out);
  }
};

// Every combination, in a fixed order.
inline std::vector<DenseQuantCase> dense_quant_cases() {
  std::vector<DenseQuantCase> all;
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (ScaleDim dim : {ScaleDim::rows, ScaleDim::cols})
      for (int group : {0, 128})
        for (Layout lin : {Layout::row_major, Layout::col_major})
          for (Layout lout : {Layout::row_major, Layout::col_major}) all.push_back({dt, dim, group, lin, lout});
  return all;
}

}  // namespace sparsek::test
