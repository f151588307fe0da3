// What every `sparsek bench` op shares (the products, attention and the gate): one row type, one
// result with its table, one JSON document, one way to measure a variant's row, one loop over the
// workloads. An op is a case: its flags, its workloads and how one is measured (bench.cpp,
// bench_attention.cpp, bench_gate.cpp); a new op adds a case, not another copy of these:
//   - parse its flags (kWarmupFlag, kJsonFlag, kBackendFlag and its own) and make its workloads;
//   - per workload, a BenchResult: the label, its rows from variant_rows() over its variant table
//     (or measure_row() per row), add_rates(), the JSON fields and the lines around the table;
//   - its Table (the columns after the name: median_column(), rate_column(), its figures);
//   - run_workloads() prints, writes the JSON and gives the exit code.
#pragma once
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "cli.hpp"
#include "tools_internal.hpp"

namespace sparsek::cli {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Flags the bench ops share (each op has --reps too, with defaults of its own).
inline const FlagSpec kWarmupFlag = {"--warmup", "W", "untimed runs first (default 5 GPU, 1 CPU)"};
inline const FlagSpec kJsonFlag = {"--json", "FILE",
                                   "also write every number as JSON (- for stdout; the table then goes to stderr)"};

// One line of a bench table: a variant, a peer's core call, or a derived figure (the gate's floor).
struct BenchRow {
  std::string name;
  bool peer = false;
  std::string status = "ok";  // ok | unsupported | failed
  std::string reason;
  std::vector<double> times_ms;  // every timed run
  double median_ms = kNaN, eff_tflops = kNaN;
  std::map<std::string, double> figures;  // the op's own numbers (BenchResult::figures names them)
  bool wrong = false;                     // measured, but the result failed its check

  bool ok() const { return status == "ok"; }
  double figure(const std::string& key) const;  // NaN when not set
};

// One workload's rows and what is printed around their table.
struct BenchResult {
  std::string label;
  Json fields = Json::object();      // the workload's JSON, between "label" and "variants"
  std::vector<std::string> figures;  // every row's figures, in the order the JSON writes them
  double eff_flops = 0;              // effective FLOPs of one run (0: no rate)
  std::vector<std::string> intro;    // lines above the table
  std::vector<BenchRow> rows;
  std::vector<std::vector<std::string>> extra_rows;  // table lines below the rows (the products' "ideal")
  std::vector<std::string> outro;                    // lines below the table
  std::string wrong_note;  // the note of a row whose result failed its check
  std::string when_empty;  // printed instead of the table when no row ran; such a result fails the run
};

// A column of a bench table: its header and a row's cell.
struct Column {
  std::string header;
  std::function<std::string(const BenchRow&)> cell;
};
Column median_column();                                   // "median ms"
Column rate_column(bool gpu);                             // effective TFLOPS on a GPU, GFLOPS on the CPU
Column fixed_column(std::string header, std::string figure, int digits, double scale = 1);
Column sci_column(std::string header, std::string figure);  // 1.2e-04

// The table of a result: the row's name under `name_header`, the columns, then (with `note`) the
// status, the reason or the wrong note. No columns: no table (the intro and outro say it all).
struct Table {
  std::string name_header = "variant";
  std::vector<Column> columns;
  bool note = true;
};

// eff_tflops of every measured row, from the result's effective FLOPs and the row's median.
void add_rates(BenchResult& r);
// Prints the intro, the table (or when_empty) and the outro.
void print_result(const BenchResult& r, const Table& t);

// Only the listed names (every name when the list is empty).
bool wanted(const std::vector<std::string>& only, const std::string& name);

// The row of one variant (or peer call): "unsupported" with `why` when it is not empty; else
// measure(row) fills the row's times and figures, and the median follows from the times (also when
// a check after the timing failed). An Error thrown while measuring marks the row "unsupported"
// (Status::unsupported) or "failed"; on a GPU the device is synchronized and its error cleared
// first, so that one row's failure does not reach the next.
BenchRow measure_row(const std::string& name, bool peer, const std::string& why, bool gpu,
                     const std::function<void(BenchRow&)>& measure);

// A row per variant of `table` on backend `be` that `only` lists (measure_row()); measure(v, row)
// times and checks one on `args`.
template <class Args, class Measure>
void variant_rows(const std::vector<VariantOf<Args>>& table, Backend be, const Args& args,
                  const std::vector<std::string>& only, std::vector<BenchRow>& rows, const Measure& measure) {
  for (const VariantOf<Args>& v : table)
    if (v.backend == be && wanted(only, v.name))
      rows.push_back(measure_row(v.name, v.peer, v.why_not(args), be == Backend::cuda,
                                 [&](BenchRow& row) { measure(v, row); }));
}

// What the JSON document says about the run as a whole.
struct BenchRun {
  const char* op = nullptr;  // "attention", "gate"; the products' document has no "op"
  bool gpu = false;
  int threads = 0;           // the CPU backend's (reported for a CPU run)
  int reps = 0, warmup = 0;
  uint64_t seed = 0;
  std::string units;         // "" : none
};
// The document (`bench --compare` reads it): json_header, op, mode, device, settings, units, and
// per workload its label, its fields and its rows ("variants").
Json bench_json(const std::vector<std::string>& argv, const BenchRun& run, const std::vector<BenchResult>& results);

// The loop of a variant table's bench: measures every workload (measure(i, prefix): prefix is
// the progress line's "[i/n] label: "), prints each result as it comes, then writes the JSON
// (with `amend` adding to it first, e.g. the performance gate, whose exit code it returns) and
// counts what failed. Returns the exit code: 1 when a row failed or was wrong, a result had no row
// to run (when_empty), or amend returned non-zero.
int run_workloads(const std::vector<std::string>& labels,
                  const std::function<BenchResult(size_t, const std::string&)>& measure, const Table& table, const std::vector<std::string>& argv, const BenchRun& run, JsonOutput& json,
                  const std::function<int(Json&)>& amend = nullptr);

}  // namespace sparsek::cli
