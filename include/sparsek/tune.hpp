// sparsek — the autotuner and its persistent cache.
//
// Tuning times every variant of the backend that supports a problem (peers included) on its own
// random operands of the problem's shapes and pattern (never the caller's buffers): warm-up, then
// the median of repeated timings (host: steady clock; device: CUDA events, inputs rotated through
// enough copies to exceed L2). Each candidate's output is checked against a reference (the fp64
// oracle, or the default variant's output for problems too large for the oracle) before it may
// win, and a winner must beat the default variant by more than 2%.
//
// The cache is one JSON file, $SPARSEK_CACHE or ~/.cache/sparsek/tune.json. Writes take a flock
// on "<file>.lock", re-read the file, merge, and replace it atomically (temp file + rename), so
// concurrent tuners keep each other's entries. An unreadable or mismatched file gives one warning
// on stderr per process and is ignored, never a crash; so is a file beyond the reader's bounds
// (8 MiB, 10000 entries, 256-byte strings, 16 levels of nesting). When the path is a symbolic
// link, the file it names is the one replaced or removed (the link stays).
//
// SPARSEK_TUNE: off (heuristic only), cached (default: a cache hit is used, else the heuristic),
// on (misses are tuned and stored).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sparsek/gemm.hpp"
#include "sparsek/plan.hpp"

// Exported from libsparsek (the build hides every other symbol).
#pragma GCC visibility push(default)

namespace sparsek {

enum class TuneMode { off, cached, on };
const char* to_string(TuneMode m);
// SPARSEK_TUNE (unset or "" -> cached). Throws Error(invalid_argument) on any other value.
TuneMode tune_mode();
// $SPARSEK_CACHE, else $HOME/.cache/sparsek/tune.json ("" when neither is set).
std::string tune_cache_path();
// Hash of the registered variant names and the library version (16 hex digits): entries made by
// another kernel set never match.
std::string kernel_set_hash();

// Everything a tuning result depends on. Row-length statistics are bucketed to powers of two
// (rounded in log2, so the common exact values 1, 2, 4, ... sit mid-bucket).
struct TuneKey {
  std::string backend;  // "cpu" | "cuda"
  std::string op;       // "dsd" | "dsd_t" | "dds" | "dds_t" | "sdd"
  std::string in_dtype, out_dtype;
  std::string layouts;  // the dense operands in slot order, e.g. "row,row" (dsd: B,C)
  int64_t m = 0, n = 0, k = 0;
  int bm = 0, bk = 0;
  int64_t nnzb = 0;
  int64_t row_mean = 0, row_max = 0, row_std = 0;  // buckets
  std::string device;   // GPU name, or "cpu: <model>"
  int sm_count = 0;     // SMs, or CPU threads used
  int cc = 0;           // compute capability major*10+minor (0 on the CPU)
  int driver = 0, runtime = 0;  // CUDA driver / runtime versions (0 on the CPU)
  std::string library;  // sparsek version
  std::string kernel_set;

  bool operator==(const TuneKey& o) const;
  bool operator!=(const TuneKey& o) const { return !(*this == o); }
};

// Power-of-two bucket (rounded in log2): 0 -> 0, 0.7 -> 1, 11 -> 8, 12 -> 16.
int64_t pow2_bucket(double x);
// The key of a problem on the current machine. threads: CPU threads (0 = hardware concurrency).
TuneKey tune_key(const GemmArgs& problem, const PatternStats& stats, Backend backend, int threads = 0);
// One line: "dsd f16->f16 row,row 8192x8192x8192 64x64 nnzb=... rows~16/16/2 on NVIDIA H100 ...".
std::string describe(const TuneKey& key);

struct TuneEntry {
  TuneKey key;
  std::string variant;          // the winner
  double time_ms = 0;           // its median
  std::string default_variant;  // the heuristic's choice
  double default_ms = 0;
  std::vector<std::pair<std::string, double>> candidates;  // correct candidates: name, median ms
  std::string created;          // UTC, ISO 8601
};

// The cache file. Reads are memoized per instance and refreshed when the file changes. One
// instance is not thread-safe; separate instances (threads, processes) may share the file.
class TuneCache {
 public:
  explicit TuneCache(std::string path = tune_cache_path());
  const std::string& path() const { return path_; }

  std::optional<TuneEntry> lookup(const TuneKey& key);
  // Locks, re-reads, replaces any entry with the same key, writes a temp file and renames it.
  // Throws Error(io_error) when the directory or file cannot be written.
  void store(const TuneEntry& entry);
  std::vector<TuneEntry> entries();  // every well-formed entry in the file (any device)
  // "missing", "ok", or why the file is ignored ("unreadable: ...", "mismatched: ...").
  std::string state();
  // Removes the file (under the lock). Returns the number of entries it held.
  size_t clear();
  // How long store() and clear() wait for another process's lock on the file before they throw
  // Error(io_error) naming the lock file and the holder's pid: 30 s by default; 0 tries once
  // without waiting. Negative or non-finite: Error(invalid_argument).
  void set_lock_wait(double seconds);

 private:
  std::string path_;
  // Memo of the parsed file, keyed by its stat signature.
  bool loaded_ = false;
  int64_t sig_mtime_ns_ = 0, sig_ctime_ns_ = 0, sig_size_ = -1, sig_ino_ = 0;
  std::vector<TuneEntry> entries_;
  std::unordered_map<uint64_t, size_t> index_;  // hash of a key -> its last entry
  std::string state_ = "missing";
  double lock_wait_s_ = 30;
  void refresh();
};

struct TuneCandidate {
  std::string variant;
  double median_ms = 0;  // valid when ran
  double error = 0;      // max |got - ref| / max |ref|
  bool ran = false;      // ran without throwing
  bool correct = false;  // within tolerance of the reference
  std::string note;      // why it was rejected, when it was
};

struct TuneReport {
  TuneEntry entry;                       // what won (entry.variant) and the key
  std::vector<TuneCandidate> candidates; // in table order
  std::string reference;                 // "oracle (fp64)" or "default variant <name>"
  double speedup = 1;                    // default_ms / winner ms (1 when the default won)
  bool stored = false;
  std::string store_error;               // why it was not stored, when storing was asked for
};

struct TuneOptions {
  int warmup = 2;
  int min_reps = 5, max_reps = 100;
  double seconds_per_candidate = 0.3;  // budget for one candidate's timed repetitions
  double margin = 0.02;                // a winner must be > 2% faster than the default
  uint64_t seed = 0x5eedULL;
  bool store = true;                   // write the result to the cache
  std::string cache_path;              // "" = tune_cache_path()
  // Called before each candidate (done = candidates finished so far) and once at the end.
  std::function<void(size_t done, size_t total, const std::string& variant)> progress;
};

// Tunes `problem` (shapes, pattern, dtypes, layouts; its value and dense pointers are never
// read or written and may be null) for the backend options select. Throws Error(unsupported) when no variant
// supports it, Error(internal) when no candidate produces a correct result.
TuneReport tune(const GemmArgs& problem, const Options& options = {}, const TuneOptions& tune_options = {});

}  // namespace sparsek
#pragma GCC visibility pop
