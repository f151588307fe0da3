// Shared pieces of the CLI (see cli.hpp).
#include "core/cuda_host.hpp"
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>

#include "cli.hpp"
#include "sparsek/tune.hpp"
#include "core/no_gpu.hpp"  // no_gpu_error(): what a build without CUDA says
#include "tools_internal.hpp"

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
  // Base 10: "010" is ten, not eight; "09" is nine.
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0])) || *end != '\0' || errno == ERANGE)
    bad(name, "not an unsigned decimal integer");
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
    throw no_gpu_error("--backend cuda", "--backend cuda: no GPU found: ");
  return info.available && requested != Backend::cpu;
}

int cpu_backend_threads(int requested) {
  return tune_key(GemmArgs{}, PatternStats{}, Backend::cpu, requested).sm_count;
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

void check_host_bytes(const std::string& what, double bytes) {
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (phys > 0 && bytes > phys)
    throw Error(Status::invalid_argument, what + " needs " + fmt(bytes / double(1 << 30), 1) +
                                              " GiB of host memory; this machine has " +
                                              fmt(phys / double(1 << 30), 1) + " GiB");
}

void check_device_bytes(const std::string& what, double bytes) {
  size_t free_b = 0, total_b = 0;
  check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (bytes > double(free_b))
    throw Error(Status::invalid_argument, what + " needs " + fmt(bytes / double(1 << 30), 1) +
                                              " GiB of GPU memory; " + fmt(double(free_b) / double(1 << 30), 1) +
                                              " GiB of " + fmt(double(total_b) / double(1 << 30), 1) + " GiB are free");
}

// ---------------------------------------------------------------------------------------------
// Output

bool stdout_is_tty() { return isatty(STDOUT_FILENO) == 1; }

std::string progress_line(size_t done, size_t total, double elapsed_s, const std::string& what) {
  const size_t width = 24;
  const size_t fill = total ? std::min(done, total) * width / total : width;
  const int pct = total ? int(100.0 * double(std::min(done, total)) / double(total)) : 100;
  char eta[32] = "--:--";
  if (done > 0 && total >= done) {
    const long left = std::lround(elapsed_s / double(done) * double(total - done));
    std::snprintf(eta, sizeof eta, "%ld:%02ld", left / 60, left % 60);
  }
  char head[96];
  std::snprintf(head, sizeof head, "] %3d%%  %zu/%zu  ETA %s", pct, done, total, eta);
  return "[" + std::string(fill, '#') + std::string(width - fill, '.') + head + (what.empty() ? "" : "  " + what);
}

Progress::Progress(bool enabled) : on_(enabled) {
  if (const char* e = std::getenv("SPARSEK_PROGRESS"); e && *e) on_ = std::string(e) != "0";
}

void Progress::step(size_t done, size_t total, const std::string& what) {
  update(progress_line(done, total, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(),
                       what));
}

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

std::string strprintf(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string s(size_t(std::max(n, 0)), '\0');
  std::vsnprintf(s.data(), s.size() + 1, format, again);
  va_end(again);
  return s;
}

std::string fmt_sci(double v) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return "inf";
  char b[64];
  std::snprintf(b, sizeof b, "%.1e", v);
  return b;
}

Json num(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

double lock_wait_seconds(const Args& args) {
  if (args.has("--no-wait") && args.has("--lock-wait")) args.bad("--no-wait", "choose --no-wait or --lock-wait, not both");
  if (args.has("--no-wait")) return 0;
  if (!args.has("--lock-wait")) return 30.0;
  const std::string v = args.str("--lock-wait", "");
  char* end = nullptr;
  const double s = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(s >= 0 && s <= 86400))
    args.bad("--lock-wait", "must be a number of seconds in [0, 86400]");
  return s;
}

std::string printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [&](unsigned char c) {
    char b[8];
    std::snprintf(b, sizeof b, "\\x%02x", c);
    out += b;
  };
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      hex(c);
      ++i;
    } else if (c < 0x80) {
      out += char(c);
      ++i;
    } else {
      // A whole UTF-8 sequence (shortest form, no surrogates, no C1 control U+0080..U+009F) passes.
      const size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
      bool ok = len != 0 && i + len <= s.size();
      uint32_t cp = len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
      for (size_t j = 1; ok && j < len; ++j) {
        const unsigned char d = static_cast<unsigned char>(s[i + j]);
        ok = (d & 0xc0) == 0x80;
        cp = (cp << 6) | (d & 0x3f);
      }
      ok = ok && cp >= 0xa0 && !(cp >= 0xd800 && cp <= 0xdfff) && cp <= 0x10ffff &&
           !(len == 3 && cp < 0x800) && !(len == 4 && cp < 0x10000);
      if (ok) {
        out.append(s, i, len);
        i += len;
      } else {
        hex(c);
        ++i;
      }
    }
  }
  return out;
}

std::string read_input_file(const std::string& path, const char* flag, size_t max_bytes) {
  auto fail = [&](const std::string& why) {
    throw Error(Status::io_error, std::string("cannot read ") + flag + " " + printable(path) + ": " + why);
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below as not a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail("it is a directory");
  if (!S_ISREG(st.st_mode)) fail("not a regular file (a FIFO, socket or device is not read)");
  auto too_big = [&] {
    fail("larger than " + std::to_string(max_bytes >> 20) + " MiB (the most an input file may hold)");
  };
  if (uint64_t(st.st_size) > max_bytes) too_big();
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(std::strerror(errno));
    if (n == 0) break;
    if (text.size() + size_t(n) > max_bytes) too_big();  // a file that grows while read
    text.append(buf, size_t(n));
  }
  return text;
}

void check_writable(const std::string& path, const char* flag) {
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  if (existed && S_ISDIR(st.st_mode))
    throw Error(Status::io_error, std::string("cannot write ") + flag + " " + path + ": it is a directory");
  // Open for writing without truncating, and remove the file again if this made it.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(Status::io_error, std::string("cannot write ") + flag + " " + path + ": " + std::strerror(errno));
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
}

JsonOutput::JsonOutput(const Args& args, const char* flag) {
  if (!args.has(flag)) return;
  path_ = args.str(flag, "");
  if (path_.empty()) args.bad(flag, "needs a file name (or - for stdout)");
  if (path_ == "-") {
    // The JSON keeps stdout; everything else printed goes to stderr from here on.
    std::fflush(stdout);
    fd_ = ::dup(STDOUT_FILENO);
    if (fd_ < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
      throw Error(Status::io_error, std::string(flag) + " -: cannot redirect stdout: " + std::strerror(errno));
    return;
  }
  check_writable(path_, flag);  // fail now, not after the work
}

void JsonOutput::write(const Json& doc) {
  if (!enabled()) return;
  // replace: a string read from a file that is not UTF-8 is written with U+FFFD, not a throw.
  const std::string text = doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  int fd = fd_ >= 0 ? fd_ : ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(Status::io_error, "cannot write --json " + path_ + ": " + std::strerror(errno));
  size_t off = 0;
  int err = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    off += size_t(n);
  }
  if (fd_ < 0 && ::close(fd) != 0 && !err) err = errno;
  if (err) throw Error(Status::io_error, "cannot write --json " + path_ + ": " + std::strerror(err));
}

void JsonOutput::say_written() const {
  if (enabled() && fd_ < 0) std::printf("wrote %s\n", path_.c_str());
}

Json json_header(const char* tool, const std::vector<std::string>& argv) {
  std::string cmdline = std::string("sparsek ") + tool;
  for (const std::string& a : argv) cmdline += " " + a;
  Json j;
  j["tool"] = std::string("sparsek ") + tool;
  j["sparsek_version"] = version();
  j["date"] = now_utc_iso8601();
  j["command"] = cmdline;
  return j;
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

Json device_json(bool gpu, int threads) {
  const DeviceInfo& d = device_info();
  Json j;
  j["available"] = d.available;
  if (d.available) {
    j["name"] = d.name;
    j["compute_capability"] = std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor);
    j["sm_count"] = d.sm_count;
    j["l2_bytes"] = int64_t(d.l2_bytes);
    j["driver_version"] = d.driver_version;
    j["runtime_version"] = d.runtime_version;
    j["cublas"] = peers::cublas_version();
    j["cusparse"] = peers::cusparse_version();
  } else {
    j["why_not"] = d.why_not;
  }
  if (!gpu) {
    j["cpu"] = tune_key(GemmArgs{}, PatternStats{}, Backend::cpu, threads).device;
    j["threads"] = threads;
  }
  return j;
}

}  // namespace sparsek::cli
