// sparsek — block-sparse products.
//
//   DSD: C = alpha * op(A) * B + beta * C     A sparse (BSR), B and C dense
//   DDS: C = alpha * A * op(B) + beta * C     B sparse (BSR), A and C dense
//   SDD: C = alpha * (A * B) + beta * C       on C's stored blocks only (C is BSR)
//
// op() applies to the sparse operand only; a transposed dense operand is expressed through its
// layout (a row-major K x N matrix read column-major is its transpose). Dense operands may be row-
// or column-major with any leading dimension >= their minor extent.
//
// Semantics users rely on: a block row of op(A) with no stored block gives beta*C (zeros when
// beta = 0) (on the CPU backend and the fp8 kernels also for alpha = +-Inf; the 16-bit GPU kernels
// still give Inf * 0 = NaN there); when beta = 0, C is never read (NaN in C does not leak into the
// output).
//
// Products are not computed in place: C's memory (from its first element to its last, padding
// between rows included; for sdd, C's values) must not overlap any input (the sparse operand's
// row_ptr, col_idx and values, the dense inputs). An overlap is refused with an Error naming both.
//
// dtypes: inputs (the sparse values and the dense inputs) all f32, or all f16, or all bf16;
// accumulation in f32; the output may be f16/bf16/f32 for half inputs, f32 for f32 inputs.
//
// e4m3 (fp8) products, DSD and DDS: the sparse values and the dense input are both e4m3 (e4m3
// beside f16/bf16/f32 is refused), each with its fp32 scales (bsr.hpp: one per stored block of the
// sparse operand; one per token of the dense input, optionally per 128-wide group of K too), and
//   C = alpha * (sA ⊙ A) · (sB ⊙ B) + beta * C
// where sX ⊙ X is the matrix of scale * decoded element. Accumulation in f32 (the result is that
// of exact products summed in f32), output f16, bf16 or f32. op() on the sparse operand and dense
// layouts work as for the other dtypes. SDD has no e4m3 form. Scales are checked like the pattern
// (plan(), or every call with check_indices): a scale that is NaN, infinite or negative is refused
// with its array, index and value. quantize.hpp makes e4m3 operands from f32/f16/bf16 ones.
#pragma once
#include <string>

#include "sparsek/bsr.hpp"
#include "sparsek/version.h"

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

enum class OpKind : int { dsd = 0, dds = 1, sdd = 2 };
const char* to_string(OpKind k);

// One product, with pointers. Which slots are used depends on kind:
//   dsd: sparse = A, b = B, c = C        dds: a = A, sparse = B, c = C
//   sdd: a = A, b = B, sparse = C (output values written in place)
struct GemmArgs {
  OpKind kind = OpKind::dsd;
  Op op = Op::none;  // applied to the sparse operand (dsd, dds); must be none for sdd
  float alpha = 1.f, beta = 0.f;
  BsrView sparse;
  DenseView a, b, c;

  // The product's logical sizes: C is M x N, the reduction is over K.
  int64_t m() const;
  int64_t n() const;
  int64_t k() const;
  // Effective FLOPs: only the stored blocks count (2 * nnzb * bm * bk * N for dsd).
  double effective_flops() const;
};

struct Options {
  Backend backend = Backend::automatic;  // automatic: host memory -> cpu, device -> cuda
  std::string variant;                   // force a variant by name ("" = the default choice)
  void* stream = nullptr;                // cudaStream_t for device work
  bool check_indices = true;             // run the O(nnzb) index checks on this call
  int threads = 0;                       // CPU threads (0 = OMP_NUM_THREADS, else every hardware thread)
};

// Validates everything (throws Error naming the bad argument), picks a variant, runs it.
// Device work is enqueued on options.stream and not synchronized. Internally plan() + run()
// through a small cache of recent plans (plan.hpp says what it is keyed by; a device pattern
// edited in place between calls needs check_indices, the default, or an explicit plan).
void gemm(const GemmArgs& args, const Options& options = {});

// Convenience wrappers.
void dsd(const BsrView& a, const DenseView& b, DenseView& c, float alpha = 1.f, float beta = 0.f,
         Op op = Op::none, const Options& options = {});
void dds(const DenseView& a, const BsrView& b, DenseView& c, float alpha = 1.f, float beta = 0.f,
         Op op = Op::none, const Options& options = {});
void sdd(const DenseView& a, const DenseView& b, BsrView& c, float alpha = 1.f, float beta = 0.f,
         const Options& options = {});

// Checks shapes, dtypes, memory kinds, pointers and leading dimensions of a product (and the BSR
// invariants, with the O(nnzb) index checks when check_indices and the indices are on the host).
void validate(const GemmArgs& args, bool check_indices = true);

// Names of the registered variants that support args (first = default choice), and for every
// other variant why not: "name: reason".
std::vector<std::string> supported_variants(const GemmArgs& args);
std::vector<std::string> unsupported_reasons(const GemmArgs& args);

const char* version();  // "MAJOR.MINOR.PATCH" of the library (SPARSEK_VERSION_STRING: of the headers)

}  // namespace sparsek
#pragma GCC visibility pop
