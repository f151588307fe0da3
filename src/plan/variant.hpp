// Internal: the variant table. Every way of computing a product (CPU, portable CUDA, Hopper,
// cuSPARSE, cuBLAS on the densified matrix) is one row here. Nothing below plan/ knows about
// the tuner; nothing in a kernel knows about the public API beyond GemmArgs.
#pragma once
#include <string>
#include <vector>

#include "sparsek/gemm.hpp"

namespace sparsek {

struct Variant {
  const char* name;
  Backend backend;  // cpu (host memory) or cuda (device memory)
  bool peer;        // a wrapped library (cuSPARSE, cuBLAS): benchmarked and tunable, never the
                    // heuristic default
  // "" when the variant can run args, else a short reason ("bm=48 not in {16,32,64,128}").
  std::string (*why_not)(const GemmArgs& args);
  // Runs the product. args are already validated. stream is a cudaStream_t for cuda variants.
  void (*run)(const GemmArgs& args, const Options& options);
};

// All variants, in default-preference order (the first one that supports a problem is the
// heuristic default).
const std::vector<Variant>& variants();
const Variant* find_variant(const std::string& name);

}  // namespace sparsek
