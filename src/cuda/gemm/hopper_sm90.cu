// Placeholder until this backend lands: contributes no variants yet.
#include "plan/backends.hpp"
namespace sparsek {
std::vector<Variant> hopper_variants() { return {}; }
}  // namespace sparsek
