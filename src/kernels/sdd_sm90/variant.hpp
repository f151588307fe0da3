// Internal: the two families behind the `hopper` variant. dsd_sm90/variant.cu (DSD, and DDS as the
// DSD on the transposes) owns the variant row and hands SDD problems to sdd_sm90/variant.cu.
#pragma once
#include <memory>
#include <string>

#include "plan/variant.hpp"

namespace sparsek {

// dsd_sm90/variant.cu: "" when the TMA can read the dense operand d (16-byte aligned base, leading
// dimension a multiple of 16 bytes), else the reason, naming the operand as `name`.
std::string hopper_tma_operand_why_not(const DenseView& d, const char* name);

// sdd_sm90/variant.cu. why_not: the problem's own limits ("" = supported); the caller has checked
// dtypes, block shape and memory, and checks the device and smem after it.
std::string hopper_sdd_why_not(const GemmArgs& g);
int hopper_sdd_smem(const GemmArgs& g);  // dynamic shared memory of the kernel g runs on
std::unique_ptr<VariantState> hopper_sdd_prepare(const GemmArgs& g);
void hopper_sdd_run(const GemmArgs& g, void* stream, VariantState* state);

}  // namespace sparsek
