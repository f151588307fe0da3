// The fuzz build compiles the library's C++ sources with clang and the sanitizers, not its CUDA
// sources (those need nvcc, and ASan cannot see into device code): the CUDA rows of the variant
// tables are empty in this build and the GPU gate is absent. The fuzzer runs with no GPU visible,
// where every CUDA variant refuses and validation stops device-memory problems first anyway; the
// GPU suites and compute-sanitizer cover the kernels.
#include "plan/backends.hpp"
#include "plan/gate_internal.hpp"
#include "kernels/decode/launch.hpp"
#include "kernels/quant/quant.hpp"

namespace sparsek {
std::vector<Variant> smalln_variants() { return {}; }
std::vector<Variant> hopper_variants() { return {}; }
std::vector<Variant> hopper_fp8_variants() { return {}; }
bool hopper_has_narrow_tiles(const GemmArgs&) { return false; }
std::vector<Variant> portable_variants() { return {}; }
std::vector<Variant> peer_variants() { return {}; }
std::vector<AttentionVariant> hopper_attention_variants() { return {}; }
std::vector<AttentionBackwardVariant> hopper_attention_backward_variants() { return {}; }

std::string gate_cuda_why_not(const GateArgs&, const GateShape&) { return "the fuzz build has no CUDA code"; }
void gate_cuda(const GateArgs&, const GateShape&, void*) {
  throw Error(Status::unsupported, "gate: the fuzz build has no CUDA code");
}

namespace decode_gpu {
std::string why_not(const DecodeArgs&) { return "the fuzz build has no CUDA code"; }
int default_splits(const DecodeArgs&, int) { return 1; }
size_t workspace_bytes(const DecodeArgs&, int) { return 0; }
void prepare(const DecodeArgs&, Flavor) {}
void launch(const DecodeArgs&, int, void*, void*, Flavor) {
  throw Error(Status::unsupported, "decode: the fuzz build has no CUDA code");
}
}  // namespace decode_gpu

namespace page_select_gpu {
std::string why_not(const PageSelectArgs&, PageOp) { return "the fuzz build has no CUDA code"; }
void update(const PageSelectArgs&, void*) { throw Error(Status::unsupported, "page selection: the fuzz build has no CUDA code"); }
void select(const PageSelectArgs&, void*) { throw Error(Status::unsupported, "page selection: the fuzz build has no CUDA code"); }
}  // namespace page_select_gpu

namespace quant {
void quantize_gpu(const void*, DType, const GroupMap&, uint8_t*, float*, void*) {
  throw Error(Status::unsupported, "quantize: the fuzz build has no CUDA code");
}
void dequantize_gpu(const uint8_t*, const float*, const GroupMap&, void*, DType, void*) {
  throw Error(Status::unsupported, "dequantize: the fuzz build has no CUDA code");
}
}  // namespace quant
}  // namespace sparsek
