// Internal: what the tuner's side of plan()'s choice (tuned_choice.cpp) and the tests need from the
// tuning cache beyond the public header.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sparsek/tune.hpp"

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

nlohmann::json to_json(const TuneKey& key);
// Throws std::runtime_error naming the missing, mistyped, out-of-range or overlong field.
TuneKey key_from_json(const nlohmann::json& v);
nlohmann::json to_json(const TuneEntry& e);
TuneEntry entry_from_json(const nlohmann::json& v);

// The reader of a cache file's text, as TuneCache uses it: the well-formed entries, and in *state
// "ok" or why the text is ignored. Bounded work on any input (size, depth, entry count, string
// lengths); never throws for bad text.
std::vector<TuneEntry> read_cache_text(const std::string& text, std::string* state);

}  // namespace sparsek::tune_detail
