// The tuner's side of plan()'s variant choice (plan/tuned_choice.hpp says where it sits): the
// tuning cache, and under SPARSEK_TUNE=on a tuning run on a miss.
#include "plan/tuned_choice.hpp"

#include "plan/variant.hpp"
#include "sparsek/tune.hpp"
#include "tune/tune_internal.hpp"

namespace sparsek {

TunedChoice tuned_choice(const GemmArgs& g, const Options& o, Backend be, const PatternStats& stats) {
  const TuneMode mode = tune_mode();
  if (mode == TuneMode::off) return {};
  const TuneKey key = tune_key(g, stats, be, o.threads);
  if (auto hit = tune_detail::cached_lookup(key)) {
    const Variant* c = find_variant(hit->variant);
    // An entry naming a variant this build lacks, or one that cannot run these exact args
    // (e.g. an alignment the tuned problem had), is not used.
    if (c && c->backend == be && c->why_not(g).empty()) return {c, "cache"};
  }
  if (mode != TuneMode::on) return {};
  TuneReport rep = tune(g, o);
  if (!rep.store_error.empty()) tune_detail::warn_once("tune-store", "tuning result not stored: " + rep.store_error);
  return {find_variant(rep.entry.variant), "tuned"};
}

int tuned_choice_setting() { return int(tune_mode()); }

}  // namespace sparsek
