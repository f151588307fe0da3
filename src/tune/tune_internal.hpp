// Internal: what plan() and the tests need from the tuning cache beyond the public header.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "sparsek/tune.hpp"
#include "tune/json.hpp"

namespace sparsek::tune_detail {

// Lookup in the process-wide memoized cache for tune_cache_path() (nullopt when no path, no file,
// an ignored file, or no entry). Never throws for file problems; warns once instead.
std::optional<TuneEntry> cached_lookup(const TuneKey& key);

// Prints "sparsek: warning: <msg>" to stderr, at most once per process for each `topic`.
void warn_once(const std::string& topic, const std::string& msg);
// Forgets which topics have warned (tests only).
void reset_warnings();

// The tuner's choice among measured candidates: the fastest correct one if it beats the default's
// median by more than `margin` (0.02 = 2%), else the default; nullptr when none is correct.
const TuneCandidate* pick_winner(const std::vector<TuneCandidate>& candidates, const std::string& default_variant,
                                 double margin);

json::Value to_json(const TuneKey& key);
// Throws std::runtime_error naming the missing or mistyped field.
TuneKey key_from_json(const json::Value& v);
json::Value to_json(const TuneEntry& e);
TuneEntry entry_from_json(const json::Value& v);

}  // namespace sparsek::tune_detail
