// Internal: the fp64 reference ("oracle") every backend is checked against.
#pragma once
#include <vector>

#include "sparsek/attention.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek {

// Computes the exact-as-possible result of `args` (host operands) in double precision, reading
// inputs through their dtype (so fp16/bf16 rounding of the inputs is included) and C only when
// beta != 0. Output: dsd/dds -> M*N row-major; sdd -> nnzb*bm*bk in C's block order.
std::vector<double> oracle(const GemmArgs& args);

// Largest |got - ref| / (|ref|_max + tiny) over all elements, where got is read from args' output
// (C dense or C's BSR values, host memory). Infinite when any output is NaN/Inf and ref is not.
double max_rel_error(const GemmArgs& args, const std::vector<double>& ref);

// Attention (sparsek/attention.hpp) in double precision, straight from the definition: per query
// row, the keys its layout row attends (masks applied), their scores, the softmax, the weighted
// sum of V. Inputs are read through their dtype; o and lse of args are not touched.
struct AttentionReference {
  std::vector<double> o;    // [B, Hq, Sq, D] packed
  std::vector<double> lse;  // [B, Hq, Sq]; -inf for a row that attends no key
};
// Validates args (layout contents included; host memory only), then every row.
AttentionReference attention_oracle(const AttentionArgs& args);
// One query row (batch b, query head h, row s) of args, which passed validate(args, true) and
// whose q, k, v and layout are in host memory: o[0 : D] and *lse.
void attention_oracle_row(const AttentionArgs& args, int64_t b, int64_t h, int64_t s, double* o, double* lse);

}  // namespace sparsek
