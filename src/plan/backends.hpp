// Internal: each backend contributes its rows of the variant table (variants.cpp lists them in
// default-preference order).
#pragma once
#include <vector>

#include "plan/variant.hpp"

namespace sparsek {

std::vector<Variant> cpu_variants();       // src/cpu
std::vector<Variant> smalln_variants();    // src/kernels/sm80/smalln_sm80.cu
std::vector<Variant> hopper_variants();      // src/kernels/dsd_sm90/variant.cu (and sdd_sm90/)
std::vector<Variant> hopper_fp8_variants();  // src/kernels/dsd_fp8_sm90/variant.cu
// Whether hopper runs this DSD/DDS on its 64-column work tiles when N <= 64 (src/kernels/dsd_sm90/variant.cu).
bool hopper_has_narrow_tiles(const GemmArgs& g);
std::vector<Variant> portable_variants();  // src/kernels/sm80/portable_sm80.cu
std::vector<Variant> peer_variants();      // src/kernels/peers (cuSPARSE, cuBLAS dense)

std::vector<AttentionVariant> cpu_attention_variants();     // src/cpu/attention_cpu.cpp
std::vector<AttentionVariant> hopper_attention_variants();  // src/kernels/attn_fwd_sm90/variant.cu
std::vector<AttentionBackwardVariant> cpu_attention_backward_variants();     // src/cpu/attention_cpu.cpp
std::vector<AttentionBackwardVariant> hopper_attention_backward_variants();  // src/kernels/attn_bwd_sm90/variant.cu

// The CPU backend's thread count for Options::threads = requested: itself when > 0, else
// OpenMP's default (OMP_NUM_THREADS, else the hardware threads).
int cpu_threads(int requested);

}  // namespace sparsek
