// Shared pieces of the `sparsek` CLI: flag parsing (bad flags -> exit code 2 with a message naming
// the flag and the value), host/device buffers, random data, progress, tables and JSON.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sparsek/bsr.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek::cli {

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
  uint64_t seed(const std::string& name, uint64_t dflt) const;
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

// Whether the work runs on the GPU: --backend cuda (throws Error(no_device) when none answers) or
// auto with a GPU.
bool use_gpu(Backend requested);

// SPEC §6's GPU workload table: size^3 products, fixed_k pattern. `sparsek bench` runs it by
// default on a GPU; `sparsek tune --spec-workloads` tunes each one (defined in bench.cpp).
struct SpecWorkload {
  int64_t size;
  int bm, bk;
  double density;
};
const std::vector<SpecWorkload>& spec_workloads();

// ---- subcommands (one file each) ----
int bench_main(const std::vector<std::string>& argv);
int bench_gate_main(const std::vector<std::string>& argv);  // bench --op gate (bench_gate.cpp)
int verify_main(const std::vector<std::string>& argv);
int doctor_main(const std::vector<std::string>& argv);
int tune_main(const std::vector<std::string>& argv);   // tune.cpp
int cache_main(const std::vector<std::string>& argv);  // cache.cpp
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

// ---- output ----
// True when stdout is a terminal: only then do long jobs draw a progress line.
bool stdout_is_tty();
class Progress {
 public:
  explicit Progress(bool enabled) : on_(enabled) {}
  void update(const std::string& text);  // redraws one line
  void clear();
  ~Progress() { clear(); }

 private:
  bool on_;
  bool drawn_ = false;
};

// Left-aligned first column, right-aligned others; widths from the content.
void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
std::string fmt(double v, int digits);  // fixed, "-" for NaN
std::string fmt_sci(double v);          // 1.2e-04, "-" for NaN, "inf"

// Minimal JSON writer (objects, arrays, strings, numbers, booleans).
class Json {
 public:
  Json& begin_object(const char* key = nullptr);
  Json& end_object();
  Json& begin_array(const char* key = nullptr);
  Json& end_array();
  Json& kv(const char* key, const std::string& v);
  Json& kv(const char* key, const char* v) { return kv(key, std::string(v)); }
  Json& kv(const char* key, double v);
  Json& kv(const char* key, int64_t v);
  Json& kv(const char* key, int v) { return kv(key, int64_t(v)); }
  Json& kv(const char* key, bool v);
  Json& value(double v);
  const std::string& str() const { return s_; }

 private:
  void sep(const char* key);
  std::string s_;
  std::vector<bool> first_{true};
};
std::string json_escape(const std::string& s);

std::string now_utc_iso8601();
std::string block_str(int bm, int bk);

}  // namespace sparsek::cli
