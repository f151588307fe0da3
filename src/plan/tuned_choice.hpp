// Internal: the seam between plan/ and the tuner.
//
// plan() chooses a product's variant in this order: Options::variant ("forced"), then the tuner's
// choice (a tuning cache hit, "cache", or under SPARSEK_TUNE=on a tuning run, "tuned"), then the
// heuristic default ("heuristic"). plan/ declares the tuner's part here and tune/tuned_choice.cpp
// defines it, so nothing in plan/ includes the tuner: the tuner uses plan/ (it plans and runs
// every candidate), never the other way round. A declaration rather than a hook set at start-up:
// the static archive the CLI and tests link would drop an object that only registers itself, and
// plans would silently stop reading the cache there.
#pragma once
#include "plan/variant.hpp"
#include "sparsek/plan.hpp"

namespace sparsek {

struct TunedChoice {
  const Variant* variant = nullptr;  // nullptr: the tuner has no choice (off, or a miss); the heuristic decides
  const char* chosen_by = "";        // "cache" or "tuned" (Plan::chosen_by())
};

// The tuner's choice for g (validated, Options::variant empty) on `be`; stats: g's row lengths.
// Under SPARSEK_TUNE=on a miss runs the tuner, which plans every candidate with Options::variant
// set (so it never comes back here).
TunedChoice tuned_choice(const GemmArgs& g, const Options& o, Backend be, const PatternStats& stats);

// What the tuner's choice depends on beyond the problem and the Options (SPARSEK_TUNE's mode, as a
// number): the one-shot gemm() keys its plans on it, so a plan chosen under one setting is not
// reused under another. Throws Error(invalid_argument) on a SPARSEK_TUNE it does not know.
int tuned_choice_setting();

}  // namespace sparsek
