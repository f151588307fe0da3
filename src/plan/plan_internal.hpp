// Internal: the pieces plan(), the one-shot gemm() and the tuner share (a product's validation
// and its pattern read on the host come from format/format_internal.hpp).
#pragma once
#include <cstdint>
#include <iterator>
#include <list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "format/format_internal.hpp"
#include "plan/variant.hpp"
#include "sparsek/plan.hpp"

namespace sparsek {

// cpu or cuda (Options::backend, else by memory kind); checks the memory kind fits and, for
// cuda, that a GPU answers. Also rejects a negative Options::threads.
Backend resolve_backend(Memory memory, const Options& o);
Backend resolve_backend(const GemmArgs& g, const Options& o);  // by the sparse operand's memory
// The heuristic default: the first non-peer variant of `be` that supports the problem (nullptr if
// none; then *reasons says why each one does not).
const Variant* heuristic_variant(const GemmArgs& g, Backend be, std::string* reasons = nullptr);
const AttentionVariant* heuristic_variant(const AttentionArgs& a, Backend be, std::string* reasons = nullptr);
const AttentionBackwardVariant* heuristic_variant(const AttentionBackwardArgs& a, Backend be,
                                                  std::string* reasons = nullptr);
// Options::variant by name; throws when unknown, of another backend, or not supporting the problem.
const Variant& forced_variant(const GemmArgs& g, const std::string& name, Backend be);
const AttentionVariant& forced_variant(const AttentionArgs& a, const std::string& name, Backend be);
const AttentionBackwardVariant& forced_variant(const AttentionBackwardArgs& a, const std::string& name, Backend be);

// run()'s error when args differ from the planned problem, for products and attention alike:
// "run: args do not match the plan: <what> is <got>, the plan was made for <want>". Callers build
// the strings on a mismatch alone, so a matching run allocates nothing.
[[noreturn]] void plan_mismatch(const std::string& what, const std::string& got, const std::string& want);
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

// The one-shot entries' plan caches (gemm(), attention()): the most recently used plans under
// their keys, up to a capacity. A plan is taken out while it runs, so two threads never share one.
// A plan that ran while its stream was being captured is also kept for the life of the process
// (keep_for_graph): the graph holds its workspace and schedule, and when the graph is destroyed is
// not visible here. Eviction and clear() then drop only the cache's own copy (the state is shared).
// The state that copies of a plan share (what tells two handles of one plan from two plans): the
// plan classes' variant name lives in it.
template <class P>
const void* shared_state(const P& p) {
  return &p.variant();
}
template <class T>
const void* shared_state(const std::shared_ptr<T>& p) {
  return p.get();
}

template <class Key, class P>
class PlanCache {
 public:
  static constexpr size_t kCapacity = 16;
  // Removes and returns the plan for key (an empty P on a miss).
  P take(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (it->first == key) {
        P p = std::move(it->second);
        lru_.erase(it);
        ++hits_;
        return p;
      }
    ++misses_;
    return P();
  }
  void put(Key key, P p) {
    std::list<std::pair<Key, P>> evicted;  // destroyed outside the lock (may free device memory)
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (it->first == key) {
        evicted.splice(evicted.end(), lru_, it);
        break;
      }
    lru_.emplace_front(std::move(key), std::move(p));
    while (lru_.size() > kCapacity) evicted.splice(evicted.end(), lru_, std::prev(lru_.end()));
  }
  void clear() {
    std::list<std::pair<Key, P>> evicted;
    std::lock_guard<std::mutex> lock(mu_);
    evicted.swap(lru_);
    hits_ = misses_ = 0;
  }
  // A plan captured again (a graph re-captured in a loop) is kept once, not once per capture.
  void keep_for_graph(const P& p) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const P& k : kept_)
      if (shared_state(k) == shared_state(p)) return;
    kept_.push_back(p);
  }
  PlanCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {hits_, misses_, lru_.size(), kept_.size()};
  }

 private:
  std::mutex mu_;
  std::list<std::pair<Key, P>> lru_;  // most recently used first
  std::vector<P> kept_;               // plans run under a stream capture (never dropped)
  size_t hits_ = 0, misses_ = 0;
};

// run()'s last step, for products and attention alike: the plan's CUDA device must be current
// (cuda plans); when a pointer is less aligned than at plan time the variant is asked again (only
// then: why_not() may be slow, and reading a device pattern would break graph capture); the
// variant runs under the Options every plan run gets.
void check_plan_device(Backend be, int planned_device);
Options plan_run_options(Backend be, int threads, void* stream);
template <class Args>
void launch_variant(const VariantOf<Args>& v, Backend be, int device, int threads, bool less_aligned,
                    const Args& args, VariantState* state, void* stream) {
  check_plan_device(be, device);
  if (less_aligned) {
    const std::string why = v.why_not(args);
    if (!why.empty())
      throw Error(Status::unsupported, std::string("run: variant '") + v.name + "' cannot run these args: " + why);
  }
  v.run(args, plan_run_options(be, threads, stream), state);
}

// log2 of a pointer's alignment, capped at 256 bytes (null counts as fully aligned).
inline int align_log2(const void* p) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 0;
  while (a < 8 && !(v & (uintptr_t(1) << a))) ++a;
  return a;
}

}  // namespace sparsek
