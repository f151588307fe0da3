// Placeholder: the Hopper attention forward kernel (sm_90a) replaces this file and its empty row
// list; until then attention runs on the CPU backend only.
#include "plan/backends.hpp"

namespace sparsek {

std::vector<AttentionVariant> hopper_attention_variants() { return {}; }

}  // namespace sparsek
