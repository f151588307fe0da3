// A build without CUDA (SPARSEK_CUDA=OFF, and the clang fuzz build, which compiles the C++ sources
// alone: ASan cannot see into device code) has none of the .cu files: this file stands in for what
// the host code calls of them. The variant tables keep their CUDA rows by name, so that asking for
// one by name, or listing why each variant cannot run, says that this build has no CUDA; every GPU
// entry point reports the same. Normally nothing reaches the entry points below: the backend is
// chosen first and refuses device memory (core/no_gpu.hpp, no_gpu_error()).
// The CUDA runtime's own calls have their stand-ins in core/cuda_host.hpp.
#ifndef SPARSEK_NO_CUDA
#error "core/no_cuda.cpp belongs to builds without CUDA (SPARSEK_NO_CUDA defined) only"
#endif

#include <string>

#include "core/device.hpp"
#include "core/no_gpu.hpp"
#include "kernels/cp/cp.hpp"
#include "kernels/decode/launch.hpp"
#include "kernels/peers/peers.hpp"
#include "kernels/quant/quant.hpp"
#include "plan/backends.hpp"
#include "plan/gate_internal.hpp"

namespace sparsek {

namespace {
[[noreturn]] void no_cuda(const std::string& what) { throw Error(Status::unsupported, what + ": " + kNoCudaBuild); }
}  // namespace

namespace {
// A CUDA row that is not built: it supports no problem, saying why. (Its name must be the real
// row's: tests/cpu/test_plan.cpp, GpuVariantNames, checks both builds against one list.)
template <class Args>
VariantOf<Args> not_built(const char* name, bool peer = false) {
  return {name, Backend::cuda, peer, [](const Args&) { return std::string(kNoCudaBuild); }, nullptr,
          [](const Args&, const Options&, VariantState*) { no_cuda("a GPU variant"); }};
}
}  // namespace

std::vector<Variant> smalln_variants() { return {not_built<GemmArgs>("smalln")}; }
std::vector<Variant> hopper_variants() { return {not_built<GemmArgs>("hopper")}; }
std::vector<Variant> hopper_fp8_variants() { return {not_built<GemmArgs>("hopper_fp8")}; }
bool hopper_has_narrow_tiles(const GemmArgs&) { return false; }
std::vector<Variant> portable_variants() { return {not_built<GemmArgs>("portable")}; }
std::vector<Variant> peer_variants() {
  return {not_built<GemmArgs>("cusparse_bsr", true), not_built<GemmArgs>("cusparse_ell", true),
          not_built<GemmArgs>("cublas_dense", true), not_built<GemmArgs>("cublas_batched", true)};
}
std::vector<AttentionVariant> hopper_attention_variants() { return {not_built<AttentionArgs>("hopper")}; }
std::vector<AttentionBackwardVariant> hopper_attention_backward_variants() {
  return {not_built<AttentionBackwardArgs>("hopper")};
}

std::string gate_cuda_why_not(const GateArgs&, const GateShape&) { return kNoCudaBuild; }
void gate_cuda(const GateArgs&, const GateShape&, void*) { no_cuda("the gate on the GPU"); }

namespace decode_gpu {
std::string why_not(const DecodeArgs&) { return kNoCudaBuild; }
int default_splits(const DecodeArgs&, int) { return 1; }
size_t workspace_bytes(const DecodeArgs&, int) { return 0; }
void prepare(const DecodeArgs&, Flavor) { no_cuda("decode on the GPU"); }
void launch(const DecodeArgs&, int, void*, void*, Flavor) { no_cuda("decode on the GPU"); }
}  // namespace decode_gpu

namespace cp_gpu {
void copy(const Span*, int64_t, int64_t, const void*, void*, void*) { no_cuda("distributed attention on the GPU"); }
void add(const Span*, int64_t, int64_t, const void*, void*, DType, void*) { no_cuda("distributed attention on the GPU"); }
void merge(void*, float*, const void*, const float*, int64_t, int64_t, DType, void*) { no_cuda("distributed attention on the GPU"); }
}  // namespace cp_gpu

namespace page_select_gpu {
std::string why_not(const PageSelectArgs&, PageOp) { return kNoCudaBuild; }
void update(const PageSelectArgs&, void*) { no_cuda("update_page_summaries"); }
void select(const PageSelectArgs&, void*) { no_cuda("select_pages"); }
}  // namespace page_select_gpu

namespace quant {
void quantize_gpu(const void*, DType, const GroupMap&, uint8_t*, float*, void*) { no_cuda("quantize on the GPU"); }
void dequantize_gpu(const uint8_t*, const float*, const GroupMap&, void*, DType, void*) {
  no_cuda("dequantize on the GPU");
}
}  // namespace quant

namespace peers {
void check_cusparse(int status, const char* what) {
  if (status != 0) no_cuda(what);
}
void check_cublas(int status, const char* what) {
  if (status != 0) no_cuda(what);
}
std::string cublas_version() { return ""; }
std::string cusparse_version() { return ""; }
void kernel_image(int*, int*) { no_cuda("the cuBLAS kernel image"); }
}  // namespace peers

}  // namespace sparsek
