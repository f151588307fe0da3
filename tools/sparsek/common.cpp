// Shared pieces of the CLI (see cli.hpp).
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>

#include "cli.hpp"
#include "core/device.hpp"
#include "cuda/peers/peers.hpp"

namespace sparsek::cli {

// ---------------------------------------------------------------------------------------------
// Flags

Args::Args(const std::vector<std::string>& argv, const std::vector<FlagSpec>& specs) {
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + a + "' (flags start with --)");
    std::string name = a, value;
    bool inline_value = false;
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& s : specs)
      if (name == s.name) spec = &s;
    if (!spec) throw UsageError("unknown flag '" + name + "' (see --help)");
    if (spec->value) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) throw UsageError(name + " needs a value (" + spec->value + ")");
        value = argv[++i];
      }
    } else if (inline_value) {
      throw UsageError(name + " takes no value (got '" + value + "')");
    }
    values_[name] = value;
  }
}

void Args::bad(const std::string& name, const std::string& why) const {
  auto it = values_.find(name);
  throw UsageError(name + " " + (it != values_.end() ? it->second : std::string("?")) + ": " + why);
}

std::string Args::str(const std::string& name, const std::string& dflt) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : it->second;
}

int64_t Args::integer(const std::string& name, int64_t dflt, int64_t lo, int64_t hi) const {
  if (!has(name)) return dflt;
  const std::string& v = values_.at(name);
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) bad(name, "not an integer");
  if (x < lo || x > hi) bad(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double Args::real(const std::string& name, double dflt, double lo_exclusive, double hi_inclusive) const {
  if (!has(name)) return dflt;
  const std::string& v = values_.at(name);
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x)) bad(name, "not a number");
  if (!(x > lo_exclusive && x <= hi_inclusive)) {
    char b[96];
    std::snprintf(b, sizeof b, "must be in (%g, %g]", lo_exclusive, hi_inclusive);
    bad(name, b);
  }
  return x;
}

uint64_t Args::seed(const std::string& name, uint64_t dflt) const {
  if (!has(name)) return dflt;
  const std::string& v = values_.at(name);
  errno = 0;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v.c_str(), &end, 0);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno == ERANGE) bad(name, "not an unsigned integer");
  return x;
}

DType Args::dtype(const std::string& name, DType dflt) const {
  if (!has(name)) return dflt;
  const std::string& v = values_.at(name);
  for (DType d : {DType::f16, DType::bf16, DType::f32})
    if (v == to_string(d)) return d;
  bad(name, "must be one of f16, bf16, f32");
}

PatternKind Args::pattern(const std::string& name, PatternKind dflt) const {
  if (!has(name)) return dflt;
  try {
    return pattern_kind_from_string(values_.at(name));
  } catch (const Error&) {
    bad(name, "must be one of fixed_k, bernoulli, power_law, banded, block_diagonal, causal");
  }
}

void Args::block(const std::string& name, int* bm, int* bk) const {
  if (!has(name)) return;
  const std::string& v = values_.at(name);
  size_t x = v.find('x');
  if (x == std::string::npos) bad(name, "expected BMxBK, e.g. 64x64");
  auto one = [&](const std::string& part, const char* what) {
    char* end = nullptr;
    long b = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0') bad(name, "expected BMxBK, e.g. 64x64");
    if (b != 16 && b != 32 && b != 64 && b != 128)
      bad(name, std::string(what) + "=" + part + " is not one of 16, 32, 64, 128");
    return int(b);
  };
  *bm = one(v.substr(0, x), "bm");
  *bk = one(v.substr(x + 1), "bk");
}

Backend Args::backend(const std::string& name) const {
  const std::string v = str(name, "auto");
  if (v == "auto") return Backend::automatic;
  if (v == "cpu") return Backend::cpu;
  if (v == "cuda") return Backend::cuda;
  bad(name, "must be auto, cpu or cuda");
}

bool use_gpu(Backend requested) {
  const DeviceInfo& info = device_info();
  if (requested == Backend::cuda && !info.available)
    throw Error(Status::no_device, "--backend cuda: no GPU found: " + info.why_not);
  return info.available && requested != Backend::cpu;
}

std::vector<std::string> Args::list(const std::string& name) const {
  std::vector<std::string> out;
  if (!has(name)) return out;
  std::string v = values_.at(name), cur;
  for (char c : v + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (out.empty()) bad(name, "expected a comma-separated list of names");
  return out;
}

void print_help(const char* usage, const char* about, const std::vector<FlagSpec>& specs) {
  std::printf("Usage: %s\n\n%s\n\nFlags:\n", usage, about);
  for (const FlagSpec& s : specs) {
    std::string left = std::string("  ") + s.name + (s.value ? std::string(" ") + s.value : std::string());
    std::printf("%-26s %s\n", left.c_str(), s.help);
  }
  std::printf("  %-24s %s\n", "--help", "this text");
}

// ---------------------------------------------------------------------------------------------
// Data

uint64_t mix_seed(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull));
  r.next();
  return r.next();
}

HostMatrix::HostMatrix(int64_t rows, int64_t cols, DType dtype, Layout layout, int64_t pad) {
  view.rows = rows;
  view.cols = cols;
  view.layout = layout;
  view.dtype = dtype;
  view.memory = Memory::host;
  int64_t minor = layout == Layout::row_major ? cols : rows;
  int64_t major = layout == Layout::row_major ? rows : cols;
  view.ld = std::max<int64_t>(minor, 1) + pad;
  bytes.assign(size_t(std::max<int64_t>(major, 1) * view.ld) * dtype_size(dtype), 0);
  view.data = bytes.data();
}

bool HostMatrix::is_padding(int64_t i) const {
  int64_t minor = view.layout == Layout::row_major ? view.cols : view.rows;
  int64_t major = view.layout == Layout::row_major ? view.rows : view.cols;
  return i / view.ld >= major || i % view.ld >= minor;
}

void HostMatrix::fill_random(uint64_t seed, bool integers) {
  Rng rng(seed);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t n = int64_t(elements());
  for (int64_t i = 0; i < n; ++i) {
    float v = is_padding(i) ? nan
              : integers    ? float(int(rng.below(9)) - 4)
                            : float(rng.uniform() * 2.0 - 1.0);
    store_from_float(view.data, view.dtype, i, v);
  }
}

DeviceBuffer::DeviceBuffer(size_t n) : bytes(n) {
  if (n) check_cuda(cudaMalloc(&p, n), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (p) cudaFree(p);
}
void DeviceBuffer::upload(const void* src, size_t n) {
  if (n) check_cuda(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice), "cudaMemcpy(host to device)");
}
void DeviceBuffer::download(void* dst, size_t n) const {
  if (n) check_cuda(cudaMemcpy(dst, p, n, cudaMemcpyDeviceToHost), "cudaMemcpy(device to host)");
}

// ---------------------------------------------------------------------------------------------
// Output

bool stdout_is_tty() { return isatty(STDOUT_FILENO) == 1; }

void Progress::update(const std::string& text) {
  if (!on_) return;
  std::printf("\r\033[K%s", text.c_str());
  std::fflush(stdout);
  drawn_ = true;
}

void Progress::clear() {
  if (!on_ || !drawn_) return;
  std::printf("\r\033[K");
  std::fflush(stdout);
  drawn_ = false;
}

void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size(), 0);
  auto widen = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  };
  widen(header);
  for (const auto& r : rows) widen(r);
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) {
      // The last column holds free text (reasons): left-aligned, not padded.
      bool last = i + 1 == r.size();
      std::string cell = r[i];
      if (i == 0 || last)
        s += cell + (last ? "" : std::string(w[i] - cell.size(), ' '));
      else
        s += std::string(w[i] - cell.size(), ' ') + cell;
      if (!last) s += "  ";
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    std::printf("%s\n", s.c_str());
  };
  line(header);
  size_t total = 0;
  for (size_t x : w) total += x + 2;
  std::printf("%s\n", std::string(std::min<size_t>(total, 120), '-').c_str());
  for (const auto& r : rows) line(r);
}

std::string fmt(double v, int digits) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::string fmt_sci(double v) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return "inf";
  char b[64];
  std::snprintf(b, sizeof b, "%.1e", v);
  return b;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += c;
        }
    }
  }
  return o;
}

void Json::sep(const char* key) {
  if (!first_.back()) s_ += ",";
  first_.back() = false;
  s_ += "\n" + std::string(2 * (first_.size() - 1), ' ');
  if (key) s_ += "\"" + json_escape(key) + "\": ";
}
Json& Json::begin_object(const char* key) {
  if (!s_.empty()) sep(key);
  s_ += "{";
  first_.push_back(true);
  return *this;
}
Json& Json::end_object() {
  first_.pop_back();
  s_ += "\n" + std::string(2 * (first_.size() - 1), ' ') + "}";
  return *this;
}
Json& Json::begin_array(const char* key) {
  sep(key);
  s_ += "[";
  first_.push_back(true);
  return *this;
}
Json& Json::end_array() {
  first_.pop_back();
  s_ += "]";
  return *this;
}
Json& Json::kv(const char* key, const std::string& v) {
  sep(key);
  s_ += "\"" + json_escape(v) + "\"";
  return *this;
}
Json& Json::kv(const char* key, double v) {
  sep(key);
  if (!std::isfinite(v)) {
    s_ += "null";  // JSON has no NaN/Inf
  } else {
    char b[64];
    std::snprintf(b, sizeof b, "%.10g", v);
    s_ += b;
  }
  return *this;
}
Json& Json::kv(const char* key, int64_t v) {
  sep(key);
  s_ += std::to_string(v);
  return *this;
}
Json& Json::kv(const char* key, bool v) {
  sep(key);
  s_ += v ? "true" : "false";
  return *this;
}
Json& Json::value(double v) { return kv(nullptr, v); }
Json& Json::kv(const char* key, const std::vector<double>& v) {
  begin_array(key);
  for (double x : v) value(x);
  return end_array();
}

void write_json_file(const std::string& path, const Json& j) {
  std::ofstream f(path);
  f << j.str() << "\n";
  if (!f) throw Error(Status::io_error, "could not write --json " + path);
}

std::string now_utc_iso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

std::string block_str(int bm, int bk) { return std::to_string(bm) + "x" + std::to_string(bk); }

// ---------------------------------------------------------------------------------------------
// Timing

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {
struct GpuTimer {
  std::vector<cudaEvent_t> ev;
  explicit GpuTimer(int reps) : ev(size_t(2 * reps)) {
    for (auto& e : ev) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~GpuTimer() {
    for (auto& e : ev) cudaEventDestroy(e);
  }
};
}  // namespace

std::vector<double> time_gpu(const std::function<void(int)>& run, int warmup, int reps, int sets) {
  for (int i = 0; i < warmup; ++i) run(i % sets);
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  GpuTimer t(reps);
  for (int i = 0; i < reps; ++i) {
    check_cuda(cudaEventRecord(t.ev[size_t(2 * i)], nullptr), "cudaEventRecord");
    run((warmup + i) % sets);
    check_cuda(cudaEventRecord(t.ev[size_t(2 * i + 1)], nullptr), "cudaEventRecord");
  }
  check_cuda(cudaEventSynchronize(t.ev.back()), "timed runs");
  std::vector<double> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float x = 0;
    check_cuda(cudaEventElapsedTime(&x, t.ev[size_t(2 * i)], t.ev[size_t(2 * i + 1)]), "cudaEventElapsedTime");
    ms[size_t(i)] = x;
  }
  return ms;
}

void json_device(Json& j) {
  const DeviceInfo& d = device_info();
  j.begin_object("device");
  j.kv("available", d.available);
  if (d.available) {
    j.kv("name", d.name).kv("compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor));
    j.kv("sm_count", d.sm_count).kv("l2_bytes", int64_t(d.l2_bytes));
    j.kv("driver_version", d.driver_version).kv("runtime_version", d.runtime_version);
    j.kv("cublas", peers::cublas_version()).kv("cusparse", peers::cusparse_version());
  } else {
    j.kv("why_not", d.why_not);
  }
  j.end_object();
}

}  // namespace sparsek::cli
