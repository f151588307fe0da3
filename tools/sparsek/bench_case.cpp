// What every `sparsek bench` op shares (see bench_case.hpp).
#include "bench_case.hpp"

#include "core/cuda_host.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace sparsek::cli {

double BenchRow::figure(const std::string& key) const {
  auto it = figures.find(key);
  return it == figures.end() ? kNaN : it->second;
}

Column median_column() {
  return {"median ms", [](const BenchRow& r) { return fmt(r.median_ms, 3); }};
}

Column rate_column(bool gpu) {
  if (gpu) return {"eff TFLOPS", [](const BenchRow& r) { return fmt(r.eff_tflops, 1); }};
  return {"eff GFLOPS", [](const BenchRow& r) { return fmt(r.eff_tflops * 1e3, 2); }};
}

Column fixed_column(std::string header, std::string figure, int digits, double scale) {
  return {std::move(header), [figure = std::move(figure), digits, scale](const BenchRow& r) {
            return fmt(scale * r.figure(figure), digits);
          }};
}

Column sci_column(std::string header, std::string figure) {
  return {std::move(header), [figure = std::move(figure)](const BenchRow& r) { return fmt_sci(r.figure(figure)); }};
}

void add_rates(BenchResult& r) {
  for (BenchRow& x : r.rows)
    if (x.ok() && r.eff_flops > 0) x.eff_tflops = r.eff_flops / (x.median_ms * 1e-3) / 1e12;
}

void print_result(const BenchResult& r, const Table& t) {
  for (const std::string& line : r.intro) std::printf("%s\n", line.c_str());
  if (r.rows.empty() && !r.when_empty.empty()) {
    std::printf("%s\n", r.when_empty.c_str());
  } else if (!t.columns.empty()) {
    std::vector<std::string> header = {t.name_header};
    for (const Column& c : t.columns) header.push_back(c.header);
    if (t.note) header.push_back("note");
    std::vector<std::vector<std::string>> cells;
    for (const BenchRow& x : r.rows) {
      cells.push_back({x.name + (x.peer ? " *" : "")});
      for (const Column& c : t.columns) cells.back().push_back(c.cell(x));
      if (t.note) cells.back().push_back(!x.ok() ? x.status + ": " + x.reason : x.wrong ? r.wrong_note : "");
    }
    cells.insert(cells.end(), r.extra_rows.begin(), r.extra_rows.end());
    print_table(header, cells);
  }
  for (const std::string& line : r.outro) std::printf("%s\n", line.c_str());
}

bool wanted(const std::vector<std::string>& only, const std::string& name) {
  return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
}

BenchRow measure_row(const std::string& name, bool peer, const std::string& why, bool gpu,
                     const std::function<void(BenchRow&)>& measure) {
  BenchRow row;
  row.name = name;
  row.peer = peer;
  if (!why.empty()) {
    row.status = "unsupported";
    row.reason = why;
    return row;
  }
  try {
    measure(row);
  } catch (const Error& e) {
    row.status = e.status() == Status::unsupported ? "unsupported" : "failed";
    row.reason = e.what();
    if (gpu) {
      cudaDeviceSynchronize();
      cudaGetLastError();
    }
  }
  row.median_ms = timing::median(row.times_ms);  // also of a row whose check failed after its timing
  return row;
}

Json bench_json(const std::vector<std::string>& argv, const BenchRun& run, const std::vector<BenchResult>& results) {
  Json j = json_header("bench", argv);
  if (run.op) j["op"] = run.op;
  j["mode"] = run.gpu ? "gpu" : "cpu";
  j["device"] = device_json(run.gpu, run.threads);
  j["settings"] = {{"reps", run.reps}, {"warmup", run.warmup}, {"seed", int64_t(run.seed)}};
  if (run.gpu) j["settings"]["stream_held"] = timing::stream_held();  // how time_gpu() timed the rows
  if (!run.units.empty()) j["units"] = run.units;
  Json ws = Json::array();
  for (const BenchResult& r : results) {
    Json x;
    x["label"] = r.label;
    for (const auto& [key, value] : r.fields.items()) x[key] = value;
    Json vs = Json::array();
    for (const BenchRow& v : r.rows) {
      Json y;
      y["name"] = v.name;
      y["peer"] = v.peer;
      y["status"] = v.status;
      y["reason"] = v.reason;
      y["median_ms"] = num(v.median_ms);
      y["effective_tflops"] = num(v.eff_tflops);
      for (const std::string& f : r.figures) y[f] = num(v.figure(f));
      y["wrong"] = v.wrong;
      Json t = Json::array();
      for (double ms : v.times_ms) t.push_back(num(ms));
      y["times_ms"] = t;
      vs.push_back(y);
    }
    x["variants"] = vs;
    ws.push_back(x);
  }
  j["workloads"] = ws;
  return j;
}

int run_workloads(const std::vector<std::string>& labels,
                  const std::function<BenchResult(size_t, const std::string&)>& measure, const Table& table,
                  const std::vector<std::string>& argv, const BenchRun& run, JsonOutput& json,
                  const std::function<int(Json&)>& amend) {
  std::vector<BenchResult> results;
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string prefix =
        "[" + std::to_string(i + 1) + "/" + std::to_string(labels.size()) + "] " + labels[i] + ": ";
    results.push_back(measure(i, prefix));
    print_result(results.back(), table);
    std::fflush(stdout);
  }
  Json doc = bench_json(argv, run, results);
  const int amend_rc = amend ? amend(doc) : 0;
  if (json.enabled()) {
    json.write(doc);
    std::printf("\n");
    json.say_written();
  }
  int bad = 0, empty = 0;
  for (const BenchResult& r : results) {
    empty += r.rows.empty() && !r.when_empty.empty();
    for (const BenchRow& x : r.rows) bad += x.status == "failed" || x.wrong;
  }
  if (bad) std::printf("%d row(s) failed or gave a wrong result\n", bad);
  if (empty) std::printf("%d workload(s) had no variant to run\n", empty);
  return bad || empty || amend_rc ? 1 : 0;
}

}  // namespace sparsek::cli
