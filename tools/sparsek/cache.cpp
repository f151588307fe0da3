// `sparsek cache show|clear`: inspects or removes the tuning cache; also the cache section of
// `sparsek doctor`.
#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"
#include "sparsek/tune.hpp"
#include "tools_internal.hpp"

namespace sparsek::cli {

namespace {

// Would plan() on this machine and build use the entry? (Shape fields aside.)
std::string foreign_reason(const TuneKey& k) {
  if (k.library != version()) return "made by sparsek " + k.library;
  if (k.kernel_set != kernel_set_hash()) return "made with another kernel set";
  if (k.backend == "cuda") {
    const DeviceInfo& d = device_info();
    if (!d.available) return "for a GPU; none here";
    if (k.device != d.name || k.sm_count != d.sm_count || k.cc != d.cc_major * 10 + d.cc_minor)
      return "for another GPU";
    if (k.driver != d.driver_version || k.runtime != d.runtime_version) return "for another driver/runtime";
  } else {
    // The CPU model and thread count: compare with a key made here.
    GemmArgs g;
    TuneKey here = tune_key(g, PatternStats{}, Backend::cpu, k.sm_count);
    if (k.device != here.device) return "for another CPU";
  }
  return "";
}

std::string mode_text() {
  try {
    return to_string(tune_mode());
  } catch (const Error& e) {
    return std::string("invalid (") + e.what() + ")";
  }
}

const char* kUsage = "sparsek cache show|clear [--json FILE] [--lock-wait SEC | --no-wait]";
const char* kAbout =
    "show: the tuning cache's path, state and entries (entries for another GPU, driver or sparsek\n"
    "build are listed but not used here). clear: removes the cache file (when the path is a\n"
    "symbolic link, the file it names; the link stays). clear takes the cache's lock: when another\n"
    "process holds it, clear waits --lock-wait seconds, then fails (exit 1) naming that process.\n"
    "The cache is $SPARSEK_CACHE, else ~/.cache/sparsek/tune.json.";

}  // namespace

int cache_main(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> specs = {
      {"--json", "FILE", "also write the result (show: the state and entries) as JSON (- for stdout)"},
      {kLockWaitFlag.name, kLockWaitFlag.value, "clear: how long to wait when another process holds the cache's lock "
                                                "(default 30; then exit 1 naming the holder)"},
      {kNoWaitFlag.name, kNoWaitFlag.value, "clear: fail at once (exit 1) when another process holds the cache's lock"}};
  std::string action = argv.empty() ? "" : argv[0];
  std::vector<std::string> rest(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  if (action == "--help" || action == "-h") {
    print_help(kUsage, kAbout, specs);
    return 0;
  }
  Args args(rest, specs);
  if (args.help()) {
    print_help(kUsage, kAbout, specs);
    return 0;
  }
  if (action != "show" && action != "clear")
    throw UsageError(action.empty() ? "needs an action: show or clear" : "unknown action '" + action + "' (show or clear)");
  for (const char* f : {"--lock-wait", "--no-wait"})
    if (action != "clear" && args.has(f)) args.bad(f, "only goes with clear (show takes no lock)");
  const double lock_wait = lock_wait_seconds(args);
  JsonOutput json(args);
  Json doc = json_header("cache", argv);
  doc["action"] = action;
  const std::string path = tune_cache_path();
  if (path.empty()) {
    std::printf("no tuning cache path: neither $SPARSEK_CACHE nor $HOME is set\n");
    doc["path"] = nullptr;
    json.write(doc);
    return action == "show" ? 0 : 1;
  }
  TuneCache cache(path);
  if (action == "clear") {
    cache.set_lock_wait(lock_wait);  // a held lock: Error(io_error) naming the holder, exit 1
    size_t n = cache.clear();
    std::printf("removed %s (%zu entr%s)\n", printable(path).c_str(), n, n == 1 ? "y" : "ies");
    doc["path"] = path;
    doc["removed_entries"] = n;
    json.write(doc);
    return 0;
  }
  const std::string state = cache.state();
  const std::vector<TuneEntry> entries = cache.entries();
  // Everything printed from the file (and the environment) goes through printable(): a cache file
  // may hold terminal escape sequences, which must be shown, not obeyed. (The JSON escapes them.)
  std::printf("tuning cache %s: %s, %zu entr%s (SPARSEK_TUNE=%s)\n", printable(path).c_str(), printable(state).c_str(),
              entries.size(), entries.size() == 1 ? "y" : "ies", printable(mode_text()).c_str());
  doc["path"] = path;
  doc["state"] = state;
  doc["tune_mode"] = mode_text();
  doc["entries"] = Json::array();
  for (size_t i = 0; i < entries.size(); ++i) {
    const TuneEntry& e = entries[i];
    std::string foreign = foreign_reason(e.key);
    Json cands = Json::object();
    for (const auto& kv : e.candidates) cands[kv.first] = num(kv.second);
    doc["entries"].push_back({{"key", describe(e.key)}, {"variant", e.variant}, {"time_ms", num(e.time_ms)},
                              {"default_variant", e.default_variant}, {"default_ms", num(e.default_ms)},
                              {"candidates_ms", cands}, {"created", e.created},
                              {"used_here", foreign.empty()}, {"not_used_because", foreign}});
    std::printf("[%zu] %s\n", i + 1, printable(describe(e.key)).c_str());
    std::printf("    -> %s %.4f ms", printable(e.variant).c_str(), e.time_ms);
    if (!e.default_variant.empty() && e.default_ms > 0)
      std::printf(" (default %s %.4f ms, %.2fx)", printable(e.default_variant).c_str(), e.default_ms,
                  e.time_ms > 0 ? e.default_ms / e.time_ms : 1.0);
    std::printf(", tuned %s", e.created.empty() ? "(unknown time)" : printable(e.created).c_str());
    if (!foreign.empty()) std::printf("  [not used here: %s]", printable(foreign).c_str());
    std::printf("\n");
    if (e.candidates.size() > 1) {
      std::string c;
      for (const auto& kv : e.candidates) c += (c.empty() ? "" : ", ") + printable(kv.first) + " " + fmt(kv.second, 4);
      std::printf("    candidates (ms): %s\n", c.c_str());
    }
  }
  json.write(doc);
  json.say_written();
  return 0;
}

void doctor_tune_cache(std::vector<std::string>& missing) {
  std::printf("\ntuning cache\n");
  const std::string path = tune_cache_path(), mode = mode_text();
  std::printf("  SPARSEK_TUNE           %s\n", printable(mode).c_str());
  if (mode.rfind("invalid", 0) == 0) missing.push_back("SPARSEK_TUNE must be off, cached or on");
  if (path.empty()) {
    std::printf("  path                   (no $HOME and no $SPARSEK_CACHE: tuning results are not kept)\n");
    missing.push_back("no tuning cache path: set SPARSEK_CACHE=/path/to/tune.json");
    return;
  }
  TuneCache cache(path);
  const std::string state = cache.state();
  std::printf("  path                   %s\n", printable(path).c_str());
  if (state == "missing") {
    std::printf("  state                  not created yet (sparsek tune, or SPARSEK_TUNE=on, writes it)\n");
    return;
  }
  size_t usable = 0;
  const std::vector<TuneEntry> entries = cache.entries();
  for (const TuneEntry& e : entries) usable += foreign_reason(e.key).empty();
  std::printf("  state                  %s, %zu entr%s (%zu for this machine and build)\n", printable(state).c_str(),
              entries.size(), entries.size() == 1 ? "y" : "ies", usable);
  if (state != "ok")
    missing.push_back("the tuning cache is ignored (" + state + "): run `sparsek cache clear` or set SPARSEK_CACHE");
}

}  // namespace sparsek::cli
