// Internal: the pieces plan(), the one-shot gemm() and the tuner share.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/variant.hpp"
#include "sparsek/plan.hpp"

namespace sparsek {

// The sparse operand's pattern, readable on the host: a view of host memory, or a copy of
// device memory.
struct HostPattern {
  const int32_t* row_ptr = nullptr;  // [mb + 1]
  const int32_t* col_idx = nullptr;  // [nnzb] (nullptr when not fetched or nnzb = 0)
  std::vector<int32_t> row_ptr_copy, col_idx_copy;
};
// s passed the cheap checks. Device memory is copied (synchronously); col_idx only when asked.
// `stream` (a cudaStream_t, may be null) is waited for first: the caller may have queued the
// pattern's upload there, and our copies run on the legacy default stream, which does not order
// itself after non-blocking streams.
HostPattern host_pattern(const BsrView& s, bool with_col_idx = true, void* stream = nullptr);

// The enum fields of g's kind, op and used operands are in range (else Error naming the field
// and the number): what must hold before any message prints one by name.
void check_enums(const GemmArgs& g);

// validate(g) but for the aliasing check: for a problem described with placeholder pointers
// (the tuner's, which runs on operands of its own).
void validate_description(const GemmArgs& g, bool check_indices);

// The O(nnzb) index checks of g's sparse operand read through hp; errors name the operand.
void validate_pattern(const GemmArgs& g, const HostPattern& hp);

// cpu or cuda (Options::backend, else by memory kind); checks the memory kind fits and, for
// cuda, that a GPU answers. Also rejects a negative Options::threads.
Backend resolve_backend(const GemmArgs& g, const Options& o);
// The heuristic default: the first non-peer variant of `be` that supports g (nullptr if none;
// then *reasons says why each one does not).
const Variant* heuristic_variant(const GemmArgs& g, Backend be, std::string* reasons = nullptr);
// Options::variant by name; throws when unknown, of another backend, or not supporting g.
const Variant& forced_variant(const GemmArgs& g, const std::string& name, Backend be);

// Throws Error(invalid_argument) naming the first field where args differ from the planned problem
// (all but the values, dense data pointers, alpha and beta); allocates nothing when they match.
void match_planned(const GemmArgs& args, const GemmArgs& planned);

// plan() once the cheap checks passed and hp holds the validated pattern (with col_idx).
Plan make_plan(const GemmArgs& g, const Options& o, Backend be, const HostPattern& hp);
// run() without its argument checks, for a caller that has made them (gemm(): validate() on args,
// and a plan found under a key that pins everything run() would compare).
void run_validated(const Plan& p, const GemmArgs& args, void* stream);
// What run(p, args, stream) ends in: the plan's variant, its prepared state and the Options run()
// hands it. Only for measuring run()'s own cost against the bare launch (sparsek tune
// --run-overhead); calling variant->run directly skips every check run() makes.
struct PlanLaunch {
  const Variant* variant = nullptr;
  VariantState* state = nullptr;
  Options options;
};
PlanLaunch plan_launch(const Plan& p, void* stream);

// A cheap 64-bit hash of a pattern (not cryptographic: tells an edited pattern from the old one).
uint64_t hash_pattern(const int32_t* row_ptr, int64_t mb, const int32_t* col_idx, int64_t nnzb);

}  // namespace sparsek
