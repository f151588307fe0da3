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

Json parse_json(const std::string& text, const std::string& path, const char* flag) {
  try {
    return Json::parse(text);
  } catch (const std::exception& e) {
    // nlohmann's "[json.exception.parse_error.101] parse error at line 3, column 7: ...": the
    // position and the reason, without the library's tag.
    std::string why = e.what();
    if (why.rfind("[json.exception.", 0) == 0 && why.find("] ") != std::string::npos) why.erase(0, why.find("] ") + 2);
    io_fail(std::string(flag) + " " + printable(path) + " is not JSON: " + printable(why));
  }
}

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

// A JSON value for a message: numbers as written (%g: inf stays inf), anything else dumped, made
// printable.
std::string shown(const Json& v) {
  if (v.is_number()) return strprintf("%g", v.get<double>());
  return printable(v.dump(-1, ' ', false, Json::error_handler_t::replace));
}

// Checks the fields of a bench JSON document that the gate reads, before it reads them: the
// wrong type, a missing field or a measured row whose median_ms is not a positive, finite number
// of milliseconds (a corrupt row must fail the gate, never compare as "not slower") is
// Error(invalid_argument) naming `what` (the file), the field and the row.
void check_bench_doc(const Json& doc, const std::string& what) {
  auto bad = [&](const std::string& field, const std::string& why) {
    throw Error(Status::invalid_argument, what + ": " + field + " " + why);
  };
  if (!doc.is_object()) bad("the document", "is " + std::string(doc.type_name()) + ", not a bench --json object");
  auto string_field = [&](const Json& o, const char* key, const std::string& where, bool required) {
    const std::string f = where + "\"" + key + "\"";
    if (!o.contains(key)) {
      if (required) bad(f, "is missing");
      return;
    }
    if (!o[key].is_string()) bad(f, "is " + shown(o[key]) + " (" + o[key].type_name() + "), not a string");
  };
  for (const char* k : {"mode", "sparsek_version", "date"}) string_field(doc, k, "", false);
  if (doc.contains("device")) {
    const Json& d = doc["device"];
    if (!d.is_object()) bad("\"device\"", "is " + shown(d) + " (" + d.type_name() + "), not an object");
    string_field(d, "name", "device.", false);
    string_field(d, "cpu", "device.", false);
    if (d.contains("threads") && !d["threads"].is_number_integer())
      bad("device.\"threads\"", "is " + shown(d["threads"]) + ", not an integer");
  }
  if (!doc.contains("workloads")) bad("\"workloads\"", "is missing (is it a sparsek bench --json file?)");
  const Json& ws = doc["workloads"];
  if (!ws.is_array()) bad("\"workloads\"", "is " + std::string(ws.type_name()) + ", not an array");
  for (size_t i = 0; i < ws.size(); ++i) {
    const Json& w = ws[i];
    const std::string wi = "workloads[" + std::to_string(i) + "]";
    if (!w.is_object()) bad(wi, "is " + std::string(w.type_name()) + ", not an object");
    for (const char* k : {"label", "pattern", "dtype"}) string_field(w, k, wi + ".", true);
    const std::string key = printable(workload_key(w));
    if (!w.contains("variants")) bad(wi + ".\"variants\" (" + key + ")", "is missing");
    const Json& vs = w["variants"];
    if (!vs.is_array()) bad(wi + ".\"variants\" (" + key + ")", "is " + std::string(vs.type_name()) + ", not an array");
    for (size_t j = 0; j < vs.size(); ++j) {
      const Json& v = vs[j];
      const std::string vj = wi + ".variants[" + std::to_string(j) + "]";
      if (!v.is_object()) bad(vj + " (" + key + ")", "is " + std::string(v.type_name()) + ", not an object");
      string_field(v, "name", vj + ".", true);
      const std::string row = vj + " (" + key + " / " + printable(v["name"].get<std::string>()) + ")";
      string_field(v, "status", row + ": ", true);
      string_field(v, "reason", row + ": ", false);
      if (v.contains("peer") && !v["peer"].is_boolean())
        bad(row + ": \"peer\"", "is " + shown(v["peer"]) + ", not true or false");
      if (v["status"].get<std::string>() != "ok") continue;
      if (!v.contains("median_ms")) bad(row + ": \"median_ms\"", "is missing from a measured (status ok) row");
      const Json& ms = v["median_ms"];
      if (!ms.is_number() || !std::isfinite(ms.get<double>()) || !(ms.get<double>() > 0))
        bad(row + ": \"median_ms\"",
            "is " + shown(ms) + ": a measured row's time must be a positive, finite number of milliseconds");
    }
  }
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
    std::string text;
    try {
      text = read_input_file(f, "--compare");
    } catch (const Error& e) {  // a FIFO, a device, no permission: skipped, and said
      seen += (seen.empty() ? "" : ", ") + printable(n) + " (skipped: " + e.what() + ")";
      continue;
    }
    // A file that is not JSON, or not a well-formed bench document, is an error, not skipped.
    const Json doc = parse_json(text, f, "--compare");
    check_bench_doc(doc, "--compare " + printable(f));
    const std::string m = machine(doc);
    if (m == want) return f;
    seen += (seen.empty() ? "" : ", ") + printable(n) + " (" + printable(m) + ")";
  }
  io_fail("no baseline for " + printable(want) + " in " + printable(path) + (seen.empty() ? " (no .json files)" : " (it holds: " + seen + ")") +
          "; record one with: sparsek bench --json " + path + "/NAME.json");
}

}  // namespace

Json read_json_file(const std::string& path, const char* flag) {
  return parse_json(read_input_file(path, flag), path, flag);
}

int bench_gate(const Json& results, const std::string& results_name, const std::string& baseline_path,
               double threshold_pct, Json* report) {
  check_bench_doc(results, results_name);
  const std::string here = machine(results);
  const std::string file = pick_baseline(baseline_path, here);
  const Json base = read_json_file(file, "--compare");
  check_bench_doc(base, "--compare " + printable(file));
  const std::string there = machine(base);
  if (there != here)
    throw Error(Status::invalid_argument, "--compare " + printable(file) + " was recorded on " + printable(there) +
                                              ", these results on " + printable(here) +
                                              ": a baseline only gates the machine it was recorded on");
  const double limit = 1.0 + threshold_pct / 100.0;
  std::printf("gate: these results against %s (%s, sparsek %s, %s); a row fails when more than %.1f%% slower\n",
              printable(file).c_str(), printable(there).c_str(),
              printable(base.value("sparsek_version", std::string("?"))).c_str(),
              printable(base.value("date", std::string("?"))).c_str(), threshold_pct);

  std::vector<std::vector<std::string>> table;
  std::vector<std::string> failures;
  Json rows = Json::array();
  size_t compared = 0, not_run = 0, slower = 0;
  for (const Json& bw : array_at(base, "workloads")) {
    if (!bw.is_object()) continue;
    const std::string key = workload_key(bw), shown_key = printable(key);
    const Json* cw = nullptr;
    for (const Json& w : array_at(results, "workloads"))
      if (w.is_object() && workload_key(w) == key) cw = &w;
    for (const Json& bv : array_at(bw, "variants")) {
      if (!bv.is_object() || bv.value("peer", false) || bv.value("status", std::string()) != "ok" ||
          !bv.contains("median_ms") || !bv["median_ms"].is_number())
        continue;
      const std::string name = bv.value("name", std::string("?")), shown_name = printable(name);
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
        failures.push_back(shown_key + " / " + shown_name + ": " + fmt(was, 4) + " ms in the baseline, now " +
                           printable(why));
        table.push_back({shown_key, shown_name, fmt(was, 4), "-", "-", "MISSING"});
        row["verdict"] = "missing";
        row["why"] = why;
        rows.push_back(row);
        continue;
      }
      ++compared;
      const double now = (*cv)["median_ms"].get<double>(), ratio = now / was;
      const bool slow = !(ratio <= limit);
      table.push_back({shown_key, shown_name, fmt(was, 4), fmt(now, 4), fmt(ratio, 3), slow ? "SLOWER" : "ok"});
      if (slow) {
        ++slower;
        char b[96];
        std::snprintf(b, sizeof b, ": %.4f ms -> %.4f ms (x%.3f, %+.1f%%)", was, now, ratio, 100.0 * (ratio - 1.0));
        failures.push_back(shown_key + " / " + shown_name + b);
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
