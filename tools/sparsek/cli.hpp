// Shared pieces of the `sparsek` CLI: flag parsing (bad flags -> exit code 2 with a message naming
// the flag and the value), host/device buffers, random data, progress, tables and JSON output; the
// timing is timing.hpp's.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"
#include "timing.hpp"  // the benchmarks' timing (also the timers' in bench/)

namespace sparsek::cli {

// The CLI's JSON documents (nlohmann's ordered_json keeps keys in the order written).
using Json = nlohmann::ordered_json;

// A command-line mistake: main() prints it with the subcommand's name and exits with code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct FlagSpec {
  const char* name;   // "--m"
  const char* value;  // value placeholder ("N", "FILE"), or nullptr for a switch
  const char* help;
};

// Parses `--name value`, `--name=value` and switches against a subcommand's flag table. `--help`
// / `-h` sets help(). Unknown flags, missing values and positional arguments throw UsageError.
class Args {
 public:
  Args(const std::vector<std::string>& argv, const std::vector<FlagSpec>& specs);
  bool help() const { return help_; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string str(const std::string& name, const std::string& dflt) const;
  // Typed getters: the value must parse completely and lie in [lo, hi], else UsageError naming
  // the flag and the value.
  int64_t integer(const std::string& name, int64_t dflt, int64_t lo, int64_t hi) const;
  double real(const std::string& name, double dflt, double lo_exclusive, double hi_inclusive) const;
  uint64_t seed(const std::string& name, uint64_t dflt) const;  // decimal (a leading 0 is not octal)
  DType dtype(const std::string& name, DType dflt) const;
  PatternKind pattern(const std::string& name, PatternKind dflt) const;
  void block(const std::string& name, int* bm, int* bk) const;  // "BMxBK", each in {16,32,64,128}
  Backend backend(const std::string& name) const;                // auto | cpu | cuda (default auto)
  std::vector<std::string> list(const std::string& name) const;  // "a,b,c"
  [[noreturn]] void bad(const std::string& name, const std::string& why) const;

 private:
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

void print_help(const char* usage, const char* about, const std::vector<FlagSpec>& specs);

// Flags that several subcommands take (Args::backend(), Args::integer("--threads", ...)).
inline const FlagSpec kBackendFlag = {"--backend", "B", "auto | cpu | cuda (default auto: cuda when a GPU answers)"};
inline const FlagSpec kThreadsFlag = {"--threads", "T",
                                      "CPU backend threads (default: OMP_NUM_THREADS, else every hardware thread)"};

// How long tune and cache clear wait for another process's lock on the tuning cache: --lock-wait
// SEC (default 30) or --no-wait (0: one try). The library then fails naming the holder (exit 1).
inline const FlagSpec kLockWaitFlag = {"--lock-wait", "SEC",
                                       "how long to wait when another process holds the tuning cache's lock "
                                       "(default 30; then exit 1 naming the holder)"};
inline const FlagSpec kNoWaitFlag = {"--no-wait", nullptr, "fail at once (exit 1) when another process holds the "
                                                           "tuning cache's lock"};
double lock_wait_seconds(const Args& args);

// Whether the work runs on the GPU: --backend cuda (throws Error(no_device) when none answers) or
// auto with a GPU.
bool use_gpu(Backend requested);
// The CPU backend's threads for Options::threads = requested (0: OMP_NUM_THREADS, else every
// hardware thread), as the tuning key records them.
int cpu_backend_threads(int requested);

// The GPU workload table (docs/BENCHMARKS.md): size^3 products, fixed_k pattern. `sparsek bench` runs it by
// default on a GPU; `sparsek tune --spec-workloads` tunes each one (defined in bench.cpp).
struct SpecWorkload {
  int64_t size;
  int bm, bk;
  double density;
};
const std::vector<SpecWorkload>& spec_workloads();

// The most bytes an input file of the CLI (a baseline, --from results, an ncu CSV) may hold.
constexpr size_t kMaxInputBytes = size_t(256) << 20;
// A regular file read whole, at most max_bytes: Error(io_error) naming `flag`, the path and the
// reason (missing, not a regular file -- a FIFO or a device is never opened for blocking reads --,
// larger than the bound).
std::string read_input_file(const std::string& path, const char* flag, size_t max_bytes = kMaxInputBytes);
// A JSON file read that way (Error(io_error) naming `flag`, the path and the reason, or the parse
// error with its position).
Json read_json_file(const std::string& path, const char* flag);

// Text from a file made safe to print on a terminal: control characters (escape sequences among
// them), C1 controls and bytes that are not UTF-8 are shown as \xNN; \n, \r and \t as such.
std::string printable(const std::string& s);

// Fails now (Error(io_error) naming `flag`, the path and the reason) unless `path` can be opened
// for writing; a file this call made is removed again. For output written after the work.
void check_writable(const std::string& path, const char* flag);

// `bench --compare`: results (bench's JSON; `results_name` says where they came from) against the
// baseline at `baseline` (a bench JSON file, or a directory holding one per machine: the one of the
// results' machine is used). Both documents are checked first: a field of the wrong type, a missing
// one, or a measured row whose median_ms is not a positive finite number is Error(invalid_argument)
// naming the file and the field. Prints the comparison; fills *report; returns 0 (no sparsek row more
// than threshold_pct slower), else 1.
int bench_gate(const Json& results, const std::string& results_name, const std::string& baseline,
               double threshold_pct, Json* report);

// ---- subcommands (one file each) ----
int bench_main(const std::vector<std::string>& argv);
int bench_attention_main(const std::vector<std::string>& argv);  // bench --op attention (bench_attention.cpp)
int bench_gate_main(const std::vector<std::string>& argv);  // bench --op gate (bench_gate.cpp)
int bench_decode_main(const std::vector<std::string>& argv);  // bench --op decode (bench_decode.cpp)
int verify_main(const std::vector<std::string>& argv);
int doctor_main(const std::vector<std::string>& argv);
int tune_main(const std::vector<std::string>& argv);   // tune.cpp
int cache_main(const std::vector<std::string>& argv);  // cache.cpp
int profile_main(const std::vector<std::string>& argv);  // profile.cpp
// doctor's tuning-cache section (cache.cpp); appends problems to `missing`.
void doctor_tune_cache(std::vector<std::string>& missing);

// ---- random data (splitmix64: fast, and the same sequence everywhere) ----
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
  template <typename T> const T& pick(const std::vector<T>& v) { return v[size_t(below(int64_t(v.size())))]; }
};
uint64_t mix_seed(uint64_t a, uint64_t b);

// A host dense matrix with owned bytes (padding included) and its view.
struct HostMatrix {
  std::vector<uint8_t> bytes;
  DenseView view;
  HostMatrix() = default;
  HostMatrix(int64_t rows, int64_t cols, DType dtype, Layout layout, int64_t pad);
  size_t elements() const { return bytes.size() / dtype_size(view.dtype); }
  bool is_padding(int64_t storage_index) const;  // outside the rows x cols extent
  // Uniform [-1, 1) or integers in [-4, 4] inside the extent; the padding gets NaN (so a kernel
  // that reads padding is caught).
  void fill_random(uint64_t seed, bool integers);
  void fill_bytes(uint8_t b) { std::fill(bytes.begin(), bytes.end(), b); }
};

// ---- device buffers (CUDA runtime; only used when a GPU answers) ----
struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; o.bytes = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceBuffer();
  void upload(const void* src, size_t n);
  void download(void* dst, size_t n) const;
};

// Host memory a job needs, checked before allocating: Error(invalid_argument) naming `what`, the
// size and the machine's memory when it cannot fit (instead of std::bad_alloc with no size).
void check_host_bytes(const std::string& what, double bytes);
// The same for device memory (against the free memory cudaMemGetInfo reports).
void check_device_bytes(const std::string& what, double bytes);

// ---- output ----
// True when stdout is a terminal: only then do long jobs draw a progress line.
bool stdout_is_tty();
// One progress line: "[#########...............]  37%  12/32  ETA 0:41  what" (ETA from the
// elapsed time per finished step; "ETA --:--" before the first).
std::string progress_line(size_t done, size_t total, double elapsed_s, const std::string& what);
class Progress {
 public:
  // SPARSEK_PROGRESS=1 forces the line on (=0 off) whatever stdout is.
  explicit Progress(bool enabled);
  void update(const std::string& text);  // redraws one line
  // Draws progress_line(done, total, seconds since construction, what).
  void step(size_t done, size_t total, const std::string& what);
  void clear();
  ~Progress() { clear(); }

 private:
  bool on_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Left-aligned first column, right-aligned others; widths from the content.
void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
std::string fmt(double v, int digits);  // fixed, "-" for NaN
std::string fmt_sci(double v);          // 1.2e-04, "-" for NaN, "inf"
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));  // printf into a string

// A number that is not finite becomes null in JSON (which has no NaN).
Json num(double v);

// `--json FILE` of a subcommand, opened before any work so that an unwritable path fails at once
// (Error(io_error) naming the path and the reason). FILE "-" writes the JSON to stdout and moves
// the human-readable text to stderr.
class JsonOutput {
 public:
  JsonOutput() = default;
  JsonOutput(const Args& args, const char* flag = "--json");
  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  void write(const Json& doc);  // pretty-printed; Error(io_error) with the reason
  // "wrote FILE" for a file, nothing for stdout.
  void say_written() const;

 private:
  std::string path_;
  int fd_ = -1;  // stdout's original descriptor when path_ is "-"
};
// The header every subcommand's JSON starts with.
Json json_header(const char* tool, const std::vector<std::string>& argv);

// The "device" object of a bench's JSON: the GPU that answered (or why none did); for a CPU run
// (gpu false) also the CPU model and the thread count.
Json device_json(bool gpu, int threads);

std::string now_utc_iso8601();
std::string block_str(int bm, int bk);

}  // namespace sparsek::cli
