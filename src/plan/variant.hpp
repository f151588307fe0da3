// Internal: the variant table. Every way of computing a product (CPU, portable CUDA, Hopper,
// cuSPARSE, cuBLAS on the densified matrix) is one row here. Nothing below plan/ knows about
// the tuner; nothing in a kernel knows about the public API beyond GemmArgs.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "sparsek/gemm.hpp"

namespace sparsek {

// What a variant prepares once per (shape, pattern): schedules, transposed patterns, library
// descriptors, workspace. It must not depend on the values (they may change between runs).
struct VariantState {
  virtual ~VariantState() = default;
  // Scratch memory (device or host) this state holds; reported by workspace_bytes(plan).
  virtual size_t workspace_bytes() const { return 0; }
};

struct Variant {
  const char* name;
  Backend backend;  // cpu (host memory) or cuda (device memory)
  bool peer;        // a wrapped library (cuSPARSE, cuBLAS): benchmarked and tunable, never the
                    // heuristic default
  // "" when the variant can run args, else a short reason ("bm=48 not in {16,32,64,128}").
  std::string (*why_not)(const GemmArgs& args);
  // Pattern/shape set-up (may allocate, may copy the pattern to the host); nullptr = none needed.
  std::unique_ptr<VariantState> (*prepare)(const GemmArgs& args, const Options& options);
  // Runs the product (args validated; state from prepare() on the same shape and pattern, or
  // nullptr when prepare is nullptr). Device work goes on options.stream, unsynchronized, and
  // allocates nothing.
  void (*run)(const GemmArgs& args, const Options& options, VariantState* state);
};

// All variants, in default-preference order (the first one that supports a problem is the
// heuristic default).
const std::vector<Variant>& variants();
const Variant* find_variant(const std::string& name);

// A DDS product C = A * op(B) as the DSD C^T = op(B)^T * A^T that the GPU kernels run: the op
// flipped, A^T as the dense B, C^T as C (a row-major matrix read column-major is its transpose,
// so only the views change; nothing is copied). DSD and SDD come back unchanged.
GemmArgs as_dsd(const GemmArgs& g);

}  // namespace sparsek
