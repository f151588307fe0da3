// Internal: the fp64 reference ("oracle") every backend is checked against.
#pragma once
#include <vector>

#include "sparsek/attention.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek {

// Computes the exact-as-possible result of `args` (host operands) in double precision, reading
// inputs through their dtype (so fp16/bf16 rounding of the inputs is included; e4m3 inputs as
// scale times code, in double) and C only when beta != 0. Output: dsd/dds -> M*N row-major; sdd -> nnzb*bm*bk in C's block order.
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

// The backward (AttentionBackwardArgs' formulas) in double precision, from the definition: P is
// recomputed from q and k (the forward's masks), Delta = sum_j P_j dP_j; forward.o and
// forward.lse are not read. Beside each gradient element, the sum of the magnitudes of its terms
// (mag): a kernel that rounds P and dS to the input dtype before its products and takes Delta
// from the rounded O errs by at most about u * mag (u: the dtype's unit roundoff), with
//   mag(dV_j) = sum P_j |dO|,   mag(dQ), mag(dK) = |scale| sum P_j (|dP_j - Delta| + sum_e |O_e dO_e|) |k_j| or |q|.
// (Where few keys carry a row, mag can be far above the output's rms.)
struct AttentionBackwardReference {
  std::vector<double> dq, dk, dv;          // [B, Hq, Sq, D], [B, Hkv, Skv, D], [B, Hkv, Skv, D] packed
  std::vector<double> mag_dq, mag_dk, mag_dv;
  std::vector<char> q_live;   // [B, Hq, Sq]: the row attends some key (else dq is exactly 0)
  std::vector<char> k_live;   // [B, Hkv, Skv]: some query attends the key (else dk, dv are exactly 0)
};
// Validates args (validate(args, true)); host memory only. dq, dk, dv of args are not read or
// written.
AttentionBackwardReference attention_backward_oracle(const AttentionBackwardArgs& args);

// One (batch b, key/value head hk) of the above, for args that passed those checks: dq[G][Sq][D]
// (the group's query heads h = hk * G + g, G = Hq / Hkv), dk[Skv][D] and dv[Skv][D] are
// overwritten; the mag_* and *_live outputs (same shapes, live without D) are written when not null.
struct BackwardHeadOut {
  double *dq = nullptr, *dk = nullptr, *dv = nullptr;
  double *mag_dq = nullptr, *mag_dk = nullptr, *mag_dv = nullptr;
  char *q_live = nullptr, *k_live = nullptr;
};
void attention_backward_oracle_head(const AttentionArgs& forward, const Tensor4View& dout, int64_t b, int64_t hk,
                                    const BackwardHeadOut& out);
// Parts of it, for sampled checks of problems too large for the whole reference: dq[0 : D] of
// query row s of head h, and dk, dv [n][D] of the n keys of key block j of key/value head hk
// (mag_*: the magnitudes above, or null).
void attention_backward_oracle_row(const AttentionArgs& forward, const Tensor4View& dout, int64_t b, int64_t h,
                                   int64_t s, double* dq, double* mag_dq);
void attention_backward_oracle_key_block(const AttentionArgs& forward, const Tensor4View& dout, int64_t b,
                                         int64_t hk, int64_t j, double* dk, double* dv, double* mag_dk,
                                         double* mag_dv);

}  // namespace sparsek

// Decode attention (sparsek/decode.hpp) in double precision, from the definition: for every new
// token and query head, the visible key positions (its request's pages or selected pages, up to
// its own position with causal_new), their scores, the softmax, the weighted sum of V.
#include "sparsek/decode.hpp"
namespace sparsek {
struct DecodeReference {
  std::vector<double> o;    // [T, Hq, D] packed
  std::vector<double> lse;  // [T, Hq]; -inf for a row that sees no key
};
// Validates args (contents included; host memory only), then every row.
DecodeReference decode_oracle(const DecodeArgs& args);
}  // namespace sparsek
