// `sparsek bench --compare BASELINE`: the performance gate. A baseline is a `bench --json` file
// recorded on one machine (bench/baselines/ holds one per GPU); rows are matched by workload
// (sizes, block shape, density, pattern, dtype) and variant, and a sparsek row (not a peer's) more
// than the threshold slower than its baseline fails the gate.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"

namespace sparsek::cli {

namespace {

[[noreturn]] void io_fail(const std::string& msg) { throw Error(Status::io_error, msg); }

// The machine a bench JSON was recorded on: the GPU's name, or the CPU model and its threads.
std::string machine(const Json& doc) {
  const Json& d = doc.value("device", Json::object());
  if (doc.value("mode", std::string()) == "gpu") return d.value("name", std::string("unknown GPU"));
  return d.value("cpu", std::string("cpu: unknown")) + " (" + std::to_string(d.value("threads", 0)) + " threads)";
}

std::string workload_key(const Json& w) {
  return w.value("label", std::string("?")) + " " + w.value("pattern", std::string("?")) + " " +
         w.value("dtype", std::string("?"));
}

// o[key] when it is an array, else an empty one (a reference: pointers into it stay valid).
const Json& array_at(const Json& o, const char* key) {
  static const Json empty = Json::array();
  return o.is_object() && o.contains(key) && o[key].is_array() ? o[key] : empty;
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The baseline file for `want` (a machine): `path` itself, or the file in the directory `path`
// recorded on that machine.
std::string pick_baseline(const std::string& path, const std::string& want) {
  if (!is_dir(path)) return path;
  DIR* d = ::opendir(path.c_str());
  if (!d) io_fail("cannot read --compare directory " + path);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0) names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  std::string seen;
  for (const std::string& n : names) {
    const std::string f = path + "/" + n;
    try {
      const std::string m = machine(read_json_file(f, "--compare"));
      if (m == want) return f;
      seen += (seen.empty() ? "" : ", ") + n + " (" + m + ")";
    } catch (const Error& e) {
      seen += (seen.empty() ? "" : ", ") + n + " (unreadable)";
    }
  }
  io_fail("no baseline for " + want + " in " + path + (seen.empty() ? " (no .json files)" : " (it holds: " + seen + ")") +
          "; record one with: sparsek bench --json " + path + "/NAME.json");
}

}  // namespace

Json read_json_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) io_fail(std::string("cannot read ") + flag + " " + path + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const std::exception& e) {
    io_fail(std::string(flag) + " " + path + " is not JSON: " + e.what());
  }
}

int bench_gate(const Json& results, const std::string& baseline_path, double threshold_pct, Json* report) {
  const std::string here = machine(results);
  const std::string file = pick_baseline(baseline_path, here);
  const Json base = read_json_file(file, "--compare");
  const std::string there = machine(base);
  if (!results.contains("workloads") || !base.contains("workloads"))
    io_fail("--compare: " + std::string(results.contains("workloads") ? file : "the results") +
            " holds no \"workloads\" (is it a sparsek bench --json file?)");
  if (there != here)
    throw Error(Status::invalid_argument, "--compare " + file + " was recorded on " + there +
                                              ", these results on " + here +
                                              ": a baseline only gates the machine it was recorded on");
  const double limit = 1.0 + threshold_pct / 100.0;
  std::printf("gate: these results against %s (%s, sparsek %s, %s); a row fails when more than %.1f%% slower\n",
              file.c_str(), there.c_str(), base.value("sparsek_version", std::string("?")).c_str(),
              base.value("date", std::string("?")).c_str(), threshold_pct);

  std::vector<std::vector<std::string>> table;
  std::vector<std::string> failures;
  Json rows = Json::array();
  size_t compared = 0, not_run = 0, slower = 0;
  for (const Json& bw : array_at(base, "workloads")) {
    if (!bw.is_object()) continue;
    const std::string key = workload_key(bw);
    const Json* cw = nullptr;
    for (const Json& w : array_at(results, "workloads"))
      if (w.is_object() && workload_key(w) == key) cw = &w;
    for (const Json& bv : array_at(bw, "variants")) {
      if (!bv.is_object() || bv.value("peer", false) || bv.value("status", std::string()) != "ok" ||
          !bv.contains("median_ms") || !bv["median_ms"].is_number())
        continue;
      const std::string name = bv.value("name", std::string("?"));
      const double was = bv["median_ms"].get<double>();
      Json row = {{"workload", key}, {"variant", name}, {"baseline_ms", was}};
      if (!cw) {
        ++not_run;
        row["verdict"] = "not run";
        rows.push_back(row);
        continue;
      }
      const Json* cv = nullptr;
      for (const Json& v : array_at(*cw, "variants"))
        if (v.is_object() && v.value("name", std::string()) == name) cv = &v;
      if (!cv || cv->value("status", std::string()) != "ok" || !cv->contains("median_ms") ||
          !(*cv)["median_ms"].is_number()) {
        const std::string why = cv ? cv->value("status", std::string("?")) + ": " + cv->value("reason", std::string())
                                   : std::string("no such row in these results");
        failures.push_back(key + " / " + name + ": " + fmt(was, 4) + " ms in the baseline, now " + why);
        table.push_back({key, name, fmt(was, 4), "-", "-", "MISSING"});
        row["verdict"] = "missing";
        row["why"] = why;
        rows.push_back(row);
        continue;
      }
      ++compared;
      const double now = (*cv)["median_ms"].get<double>(), ratio = now / was;
      const bool slow = !(ratio <= limit);
      table.push_back({key, name, fmt(was, 4), fmt(now, 4), fmt(ratio, 3), slow ? "SLOWER" : "ok"});
      if (slow) {
        ++slower;
        char b[96];
        std::snprintf(b, sizeof b, ": %.4f ms -> %.4f ms (x%.3f, %+.1f%%)", was, now, ratio, 100.0 * (ratio - 1.0));
        failures.push_back(key + " / " + name + b);
      }
      row["now_ms"] = now;
      row["ratio"] = ratio;
      row["verdict"] = slow ? "slower" : "ok";
      rows.push_back(row);
    }
  }
  if (!table.empty())
    print_table({"workload", "variant", "baseline ms", "now ms", "now/baseline", "verdict"}, table);
  if (not_run) std::printf("(%zu baseline row(s) of workloads not run here are skipped)\n", not_run);
  const bool nothing = compared == 0 && failures.empty();
  if (nothing)
    std::printf("gate: FAILED: no row of these results matches a sparsek row of the baseline (nothing compared)\n");
  else if (failures.empty())
    std::printf("gate: PASSED: %zu row(s) compared, none more than %.1f%% slower\n", compared, threshold_pct);
  else {
    std::printf("gate: FAILED: %zu row(s) more than %.1f%% slower than the baseline, %zu missing (of %zu compared):\n",
                slower, threshold_pct, failures.size() - slower, compared);
    for (const std::string& f : failures) std::printf("  %s\n", f.c_str());
  }
  *report = {{"baseline", file},        {"baseline_machine", there}, {"threshold_pct", threshold_pct},
             {"compared", compared},    {"failed", failures.size()}, {"not_run", not_run},
             {"passed", failures.empty() && !nothing}, {"rows", rows}};
  return failures.empty() && !nothing ? 0 : 1;
}

}  // namespace sparsek::cli
