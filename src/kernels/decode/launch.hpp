// Internal: the host side of the paged decode kernels (src/kernels/decode/decode.cu), called by
// the decode plan (src/plan/decode_plan.cpp). Plain C++: no CUDA types.
#pragma once
#include <cstddef>
#include <string>

#include "sparsek/decode.hpp"

namespace sparsek::decode_gpu {

// "" when the kernels can run args (passed validate(args, false), device memory), else why not
// (a dtype, an unaligned pointer or stride).
std::string why_not(const DecodeArgs& args);
// The entries (pages) each request walks at most: sel_kmax with a selection, else max_pages.
int64_t max_entries(const DecodeArgs& args);
// The host's choice of KV chunks for args on a GPU with sm_count SMs: enough CTAs to fill the
// GPU a few times over, at least two pages per chunk, at most 64. Depends on shapes alone, so a
// plan's runs all split the same way (deterministic results).
int default_splits(const DecodeArgs& args, int sm_count);
// Workspace the partials of `splits` chunks need (0 for one chunk).
size_t workspace_bytes(const DecodeArgs& args, int splits);
// The split kernel's flavours: CUDA cores (variant "cuda", kernel.cuh) or mma.sync tensor cores
// (variant "cuda_mma", kernel_mma.cuh). Same results up to rounding; each bit-identical run to run.
enum class Flavor { cuda_cores, mma };
// Once per plan, outside any graph capture: the kernel attributes a launch needs (the mma
// kernel's dynamic shared memory above 48 KB).
void prepare(const DecodeArgs& args, Flavor flavor);
// Enqueues the kernels on `stream` (a cudaStream_t): the split kernel, and with splits > 1 the
// combine. Allocates nothing.
void launch(const DecodeArgs& args, int splits, void* workspace, void* stream, Flavor flavor);

}  // namespace sparsek::decode_gpu

// Page selection (src/kernels/decode/select.cu): args passed validate(args, op, false), device memory.
namespace sparsek::page_select_gpu {
// "" when the kernels can run args, else why not (a dtype, an unaligned pointer, too many pages).
std::string why_not(const PageSelectArgs& args, PageOp op);
// Enqueue on `stream` (a cudaStream_t); allocate nothing.
void update(const PageSelectArgs& args, void* stream);
void select(const PageSelectArgs& args, void* stream);
}  // namespace sparsek::page_select_gpu
