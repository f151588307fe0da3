// Internal: the fp64 reference ("oracle") every backend is checked against.
#pragma once
#include <vector>

#include "sparsek/gemm.hpp"

namespace sparsek {

// Computes the exact-as-possible result of `args` (host operands) in double precision, reading
// inputs through their dtype (so fp16/bf16 rounding of the inputs is included) and C only when
// beta != 0. Output: dsd/dds -> M*N row-major; sdd -> nnzb*bm*bk in C's block order.
std::vector<double> oracle(const GemmArgs& args);

// Largest |got - ref| / (|ref|_max + tiny) over all elements, where got is read from args' output
// (C dense or C's BSR values, host memory). Infinite when any output is NaN/Inf and ref is not.
double max_rel_error(const GemmArgs& args, const std::vector<double>& ref);

}  // namespace sparsek
