// Internal: the variant tables. Every way of computing a product (CPU, portable CUDA, Hopper,
// cuSPARSE, cuBLAS on the densified matrix) or attention (CPU, Hopper) is one row here. Nothing
// below plan/ knows about the tuner; nothing in a kernel knows about the public API beyond its
// args (GemmArgs, AttentionArgs, AttentionBackwardArgs).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "sparsek/attention.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek {

// What a variant prepares once per (shape, pattern): schedules, transposed patterns, library
// descriptors, workspace. It must not depend on the values (they may change between runs).
struct VariantState {
  virtual ~VariantState() = default;
  // Scratch memory (device or host) this state holds; reported by workspace_bytes(plan).
  virtual size_t workspace_bytes() const { return 0; }
};

// One row of a variant table. Args is the problem type: GemmArgs for the products,
// AttentionArgs for attention (one machinery, each with its own args).
template <class Args>
struct VariantOf {
  const char* name;
  Backend backend;  // cpu (host memory) or cuda (device memory)
  bool peer;        // a wrapped library (cuSPARSE, cuBLAS): benchmarked and tunable, never the
                    // heuristic default
  // "" when the variant can run args, else a short reason ("bm=48 not in {16,32,64,128}").
  std::string (*why_not)(const Args& args);
  // Shape/pattern set-up (may allocate, may copy the pattern to the host); nullptr = none needed.
  std::unique_ptr<VariantState> (*prepare)(const Args& args, const Options& options);
  // Runs the problem (args validated; state from prepare() on the same shape and pattern, or
  // nullptr when prepare is nullptr). Device work goes on options.stream, unsynchronized, and
  // allocates nothing.
  void (*run)(const Args& args, const Options& options, VariantState* state);
};
using Variant = VariantOf<GemmArgs>;
using AttentionVariant = VariantOf<AttentionArgs>;
using AttentionBackwardVariant = VariantOf<AttentionBackwardArgs>;

// All variants, in default-preference order (the first one that supports a problem is the
// heuristic default).
const std::vector<Variant>& variants();
const Variant* find_variant(const std::string& name);
const std::vector<AttentionVariant>& attention_variants();
const AttentionVariant* find_attention_variant(const std::string& name);
const std::vector<AttentionBackwardVariant>& attention_backward_variants();
const AttentionBackwardVariant* find_attention_backward_variant(const std::string& name);

// A DDS product C = A * op(B) as the DSD C^T = op(B)^T * A^T that the GPU kernels run: the op
// flipped, A^T as the dense B, C^T as C (a row-major matrix read column-major is its transpose,
// so only the views change; nothing is copied). DSD and SDD come back unchanged.
GemmArgs as_dsd(const GemmArgs& g);

}  // namespace sparsek
