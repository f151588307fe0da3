// The tuning cache: key construction, the JSON file, locking and atomic replacement.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/device.hpp"
#include "plan/backends.hpp"
#include "plan/variant.hpp"
#include "sparsek/tune.hpp"
#include "tune/tune_internal.hpp"

namespace sparsek {

namespace {
constexpr const char* kFormat = "sparsek-tune-cache";
constexpr int kFormatVersion = 1;
}  // namespace

// ---------------------------------------------------------------------------------------------
// Modes, paths, identity

const char* to_string(TuneMode m) {
  switch (m) {
    case TuneMode::off: return "off";
    case TuneMode::cached: return "cached";
    case TuneMode::on: return "on";
  }
  return "unknown";
}

TuneMode tune_mode() {
  const char* e = std::getenv("SPARSEK_TUNE");
  if (!e || !*e) return TuneMode::cached;
  std::string s(e);
  if (s == "off") return TuneMode::off;
  if (s == "cached") return TuneMode::cached;
  if (s == "on") return TuneMode::on;
  throw Error(Status::invalid_argument, "SPARSEK_TUNE='" + s + "' is not one of off, cached, on");
}

std::string tune_cache_path() {
  const char* c = std::getenv("SPARSEK_CACHE");
  if (c && *c) return c;
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/sparsek/tune.json";
  return "";
}

namespace {
uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
std::string hex16(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
std::string cpu_model() {
  static const std::string model = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) == 0) {
        size_t colon = line.find(':');
        if (colon != std::string::npos) {
          size_t b = line.find_first_not_of(" \t", colon + 1);
          if (b != std::string::npos) return line.substr(b);
        }
      }
    }
    return std::string("unknown");
  }();
  return model;
}
}  // namespace

std::string kernel_set_hash() {
  static const std::string hash = [] {
    std::string all = std::string("sparsek ") + version();
    for (const Variant& v : variants()) all += std::string("\n") + v.name;
    return hex16(fnv1a(all));
  }();
  return hash;
}

bool TuneKey::operator==(const TuneKey& o) const {
  return backend == o.backend && op == o.op && in_dtype == o.in_dtype && out_dtype == o.out_dtype &&
         layouts == o.layouts && m == o.m && n == o.n && k == o.k && bm == o.bm && bk == o.bk &&
         nnzb == o.nnzb && row_mean == o.row_mean && row_max == o.row_max && row_std == o.row_std &&
         device == o.device && sm_count == o.sm_count && cc == o.cc && driver == o.driver &&
         runtime == o.runtime && library == o.library && kernel_set == o.kernel_set;
}

int64_t pow2_bucket(double x) {
  if (!(x >= 0.5)) return 0;  // also NaN
  if (x > 1e18) x = 1e18;
  return int64_t(1) << std::max(0L, std::lround(std::log2(x)));
}

TuneKey tune_key(const GemmArgs& g, const PatternStats& st, Backend be, int threads) {
  TuneKey k;
  k.backend = be == Backend::cuda ? "cuda" : "cpu";
  k.op = std::string(to_string(g.kind)) + (g.op == Op::trans ? "_t" : "");
  k.in_dtype = to_string(g.kind == OpKind::sdd ? g.a.dtype : g.sparse.dtype);
  // e4m3 with per-128 group scales on the dense input is a different problem for the kernels.
  if (g.kind != OpKind::sdd && (g.kind == OpKind::dsd ? g.b : g.a).scale_group != 0) k.in_dtype += "/g128";
  k.out_dtype = to_string(g.kind == OpKind::sdd ? g.sparse.dtype : g.c.dtype);
  auto lay = [](const DenseView& d) { return d.layout == Layout::row_major ? "row" : "col"; };
  switch (g.kind) {
    case OpKind::dsd: k.layouts = std::string(lay(g.b)) + "," + lay(g.c); break;
    case OpKind::dds: k.layouts = std::string(lay(g.a)) + "," + lay(g.c); break;
    case OpKind::sdd: k.layouts = std::string(lay(g.a)) + "," + lay(g.b); break;
  }
  k.m = g.m();
  k.n = g.n();
  k.k = g.k();
  k.bm = g.sparse.bm;
  k.bk = g.sparse.bk;
  k.nnzb = g.sparse.nnzb;
  k.row_mean = pow2_bucket(st.mean);
  k.row_max = pow2_bucket(double(st.max));
  k.row_std = pow2_bucket(st.stddev);
  if (be == Backend::cuda) {
    const DeviceInfo& d = device_info();
    k.device = d.name;
    k.sm_count = d.sm_count;
    k.cc = d.cc_major * 10 + d.cc_minor;
    k.driver = d.driver_version;
    k.runtime = d.runtime_version;
  } else {
    k.device = "cpu: " + cpu_model();
    k.sm_count = cpu_threads(threads);
  }
  k.library = version();
  k.kernel_set = kernel_set_hash();
  return k;
}

std::string describe(const TuneKey& k) {
  std::ostringstream o;
  o << k.op << " " << k.in_dtype << "->" << k.out_dtype << " " << k.layouts << " M=" << k.m << " N=" << k.n
    << " K=" << k.k << " block " << k.bm << "x" << k.bk << " nnzb=" << k.nnzb << " rows~" << k.row_mean << "/"
    << k.row_max << "/" << k.row_std << " (mean/max/std, pow2) | " << k.backend << " " << k.device;
  if (k.backend == "cuda")
    o << " (" << k.sm_count << " SMs, cc " << k.cc / 10 << "." << k.cc % 10 << ", driver " << k.driver << ", runtime "
      << k.runtime << ")";
  else
    o << " (" << k.sm_count << " threads)";
  o << " | sparsek " << k.library << " kernels " << k.kernel_set;
  return o.str();
}

// ---------------------------------------------------------------------------------------------
// JSON <-> key / entry

namespace tune_detail {

namespace {
std::mutex warn_mu;
std::set<std::string>& warned() {
  static auto* s = new std::set<std::string>;
  return *s;
}

// Bounds on what one entry may hold: a cache file is data anyone could have written.
constexpr size_t kMaxString = 256;     // bytes per string field (device names are ~30)
constexpr size_t kMaxCandidates = 64;  // candidates kept per entry

const nlohmann::json& field(const nlohmann::json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end()) throw std::runtime_error(std::string("missing field '") + name + "'");
  return *it;
}
std::string str_field(const nlohmann::json& obj, const char* name) {
  const nlohmann::json& v = field(obj, name);
  if (!v.is_string()) throw std::runtime_error(std::string("field '") + name + "' is not a string");
  const std::string& s = v.get_ref<const std::string&>();
  if (s.size() > kMaxString)
    throw std::runtime_error(std::string("field '") + name + "' is longer than " + std::to_string(kMaxString) +
                             " bytes");
  return s;
}
// An integer in [lo, hi] (written as an integer, or as a float with an integral value).
int64_t int_field(const nlohmann::json& obj, const char* name, int64_t lo = -(int64_t(1) << 53),
                  int64_t hi = int64_t(1) << 53) {
  const nlohmann::json& v = field(obj, name);
  double d = 0;
  if (v.is_number_integer() && !v.is_number_unsigned())
    d = double(v.get<int64_t>());
  else if (v.is_number_unsigned())
    d = v.get<uint64_t>() > uint64_t(hi) ? double(hi) + 1 : double(v.get<uint64_t>());
  else if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()))
    d = v.get<double>();
  else
    throw std::runtime_error(std::string("field '") + name + "' is not an integer");
  if (d < double(lo) || d > double(hi))
    throw std::runtime_error(std::string("field '") + name + "' is out of range [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "]");
  return int64_t(d);
}
double num_field(const nlohmann::json& obj, const char* name, double fallback) {
  auto it = obj.find(name);
  return it != obj.end() && it->is_number() ? it->get<double>() : fallback;
}
constexpr int64_t kIntMax = INT32_MAX;
}  // namespace

void warn_once(const std::string& topic, const std::string& msg) {
  std::lock_guard<std::mutex> lock(warn_mu);
  if (!warned().insert(topic).second) return;
  std::fprintf(stderr, "sparsek: warning: %s\n", msg.c_str());
  std::fflush(stderr);
}
void reset_warnings() {
  std::lock_guard<std::mutex> lock(warn_mu);
  warned().clear();
}

nlohmann::json to_json(const TuneKey& k) {
  return nlohmann::json{{"backend", k.backend},   {"op", k.op},         {"in_dtype", k.in_dtype},
                        {"out_dtype", k.out_dtype}, {"layouts", k.layouts}, {"m", k.m},
                        {"n", k.n},               {"k", k.k},           {"bm", k.bm},
                        {"bk", k.bk},             {"nnzb", k.nnzb},     {"row_mean", k.row_mean},
                        {"row_max", k.row_max},   {"row_std", k.row_std}, {"device", k.device},
                        {"sm_count", k.sm_count}, {"cc", k.cc},         {"driver", k.driver},
                        {"runtime", k.runtime},   {"library", k.library}, {"kernel_set", k.kernel_set}};
}

TuneKey key_from_json(const nlohmann::json& v) {
  if (!v.is_object()) throw std::runtime_error("key is not an object");
  TuneKey k;
  k.backend = str_field(v, "backend");
  k.op = str_field(v, "op");
  k.in_dtype = str_field(v, "in_dtype");
  k.out_dtype = str_field(v, "out_dtype");
  k.layouts = str_field(v, "layouts");
  k.m = int_field(v, "m");
  k.n = int_field(v, "n");
  k.k = int_field(v, "k");
  k.bm = int(int_field(v, "bm", 0, kIntMax));
  k.bk = int(int_field(v, "bk", 0, kIntMax));
  k.nnzb = int_field(v, "nnzb");
  k.row_mean = int_field(v, "row_mean");
  k.row_max = int_field(v, "row_max");
  k.row_std = int_field(v, "row_std");
  k.device = str_field(v, "device");
  k.sm_count = int(int_field(v, "sm_count", 0, kIntMax));
  k.cc = int(int_field(v, "cc", 0, kIntMax));
  k.driver = int(int_field(v, "driver", 0, kIntMax));
  k.runtime = int(int_field(v, "runtime", 0, kIntMax));
  k.library = str_field(v, "library");
  k.kernel_set = str_field(v, "kernel_set");
  return k;
}

nlohmann::json to_json(const TuneEntry& e) {
  nlohmann::json c = nlohmann::json::object();
  for (const auto& kv : e.candidates) c[kv.first] = std::isfinite(kv.second) ? nlohmann::json(kv.second) : nullptr;
  return nlohmann::json{{"key", to_json(e.key)},
                        {"variant", e.variant},
                        {"time_ms", std::isfinite(e.time_ms) ? e.time_ms : 0.0},
                        {"default_variant", e.default_variant},
                        {"default_ms", std::isfinite(e.default_ms) ? e.default_ms : 0.0},
                        {"candidates", c},
                        {"created", e.created}};
}

TuneEntry entry_from_json(const nlohmann::json& v) {
  if (!v.is_object()) throw std::runtime_error("entry is not an object");
  TuneEntry e;
  e.key = key_from_json(field(v, "key"));
  e.variant = str_field(v, "variant");
  if (e.variant.empty()) throw std::runtime_error("field 'variant' is empty");
  e.time_ms = num_field(v, "time_ms", 0);
  e.default_ms = num_field(v, "default_ms", 0);
  if (auto d = v.find("default_variant"); d != v.end() && d->is_string() && d->get_ref<const std::string&>().size() <= kMaxString)
    e.default_variant = d->get<std::string>();
  if (auto c = v.find("candidates"); c != v.end() && c->is_object())
    for (auto it = c->begin(); it != c->end() && e.candidates.size() < kMaxCandidates; ++it)
      if (it.value().is_number() && it.key().size() <= kMaxString) e.candidates.emplace_back(it.key(), it.value().get<double>());
  if (auto t = v.find("created"); t != v.end() && t->is_string() && t->get_ref<const std::string&>().size() <= kMaxString)
    e.created = t->get<std::string>();
  return e;
}

}  // namespace tune_detail

// ---------------------------------------------------------------------------------------------
// The file

namespace {

using tune_detail::warn_once;

[[noreturn]] void io_fail(const std::string& msg) { throw Error(Status::io_error, msg); }

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Creates dir and its missing parents, but never a directory that a symbolic link names: a link
// whose target is missing (or a file, a FIFO ...) is an error, so that a stale link can never make
// sparsek create directories elsewhere (such as the link's /nonexistent/... target).
void make_dirs(const std::string& dir, int depth = 0) {
  if (dir.empty() || dir == "." || dir == "/") return;
  if (depth > 64) io_fail("cannot create the tuning cache directory " + dir + ": too many levels");
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) io_fail("cannot create the tuning cache: " + dir + " is not a directory");
    return;
  }
  if (::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    io_fail("cannot create the tuning cache directory: " + dir + " is a symbolic link to a directory that does "
            "not exist; sparsek does not create directories through a link: create it, or point SPARSEK_CACHE "
            "elsewhere");
  make_dirs(parent_dir(dir), depth + 1);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    io_fail("cannot create directory " + dir + " for the tuning cache: " + std::strerror(errno));
}

// The directory the cache file goes in, made if missing (store) unless the cache path is a link:
// a link's target directory is never created (a dangling link is an error naming it).
void prepare_dir(const std::string& path, const std::string& file) {
  if (file == path) return make_dirs(parent_dir(file));
  struct stat st {};
  if (::stat(parent_dir(file).c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    io_fail("the tuning cache " + path + " is a symbolic link to " + file + ", whose directory " +
            parent_dir(file) + " does not exist; sparsek does not create directories through a link: "
            "create it, or point SPARSEK_CACHE elsewhere");
}

// The file a (chain of) symbolic link(s) names, so that writes replace that file rather than the
// link (the rename would turn the link into a regular file, and writers through the link and
// through the target would part ways). The final file need not exist yet.
std::string resolve_links(const std::string& path) {
  std::string p = path;
  for (int hops = 0; hops < 32; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::vector<char> buf(size_t(st.st_size > 0 ? st.st_size : 255) + 1);
    ssize_t n = ::readlink(p.c_str(), buf.data(), buf.size());
    if (n < 0 || size_t(n) >= buf.size())
      io_fail("cannot resolve the tuning cache link " + p + ": " + (n < 0 ? std::strerror(errno) : "it changed"));
    std::string target(buf.data(), size_t(n));
    p = target.empty() || target[0] == '/' ? target : parent_dir(p) + "/" + target;
  }
  io_fail("cannot resolve the tuning cache link " + path + ": more than 32 levels of symbolic links");
}

// Who holds the flock on fd's file: "process <pid>" from /proc/locks (Linux: the holder's pid and
// the inode), else from the pid its holder wrote into the file, else "another process".
std::string lock_holder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    std::ifstream locks("/proc/locks");
    std::string line;
    while (std::getline(locks, line)) {
      // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; a waiter's line has "->" after the number.
      std::istringstream in(line);
      std::string num, kind, mode, access, pid, where;
      if (!(in >> num >> kind) || kind != "FLOCK" || !(in >> mode >> access >> pid >> where)) continue;
      const size_t colon = where.rfind(':');
      if (colon != std::string::npos && where.substr(colon + 1) == std::to_string(st.st_ino) &&
          std::strtol(pid.c_str(), nullptr, 10) > 0)  // (a pid from another pid namespace reads 0 or -1)
        return "process " + pid;
    }
  }
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  const long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
  return pid > 0 ? "process " + std::to_string(pid) : "another process";
}

// An exclusive flock on "<path>.lock", held for the object's lifetime, taken within wait_s seconds
// (0: one try) or Error(io_error) naming the lock file and its holder: a holder that never lets go
// (stopped, hung on a network file system) must not hang tune or cache clear. The holder writes its
// pid into the file for that message. The sidecar is never deleted: removing a lock file while
// another process waits on it would split the lock.
class FileLock {
 public:
  FileLock(const std::string& path, double wait_s) {
    std::string lp = path + ".lock";
    fd_ = ::open(lp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) io_fail("cannot open the tuning cache lock " + lp + ": " + std::strerror(errno));
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::milliseconds(1);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e == EINTR) continue;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (e != EWOULDBLOCK || waited >= wait_s) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%.1f", waited);
        const std::string why = e != EWOULDBLOCK ? std::string(std::strerror(e))
                                                 : "it is held by " + lock_holder(fd_) + " (waited " + secs + " s)";
        ::close(fd_);
        io_fail("cannot lock the tuning cache: " + lp + ": " + why);
      }
      using Seconds = std::chrono::duration<double>;
      std::this_thread::sleep_for(std::min(Seconds(pause), Seconds(wait_s - waited)));
      pause = std::min(pause * 2, std::chrono::milliseconds(100));
    }
    // The pid, for another process's message; a lock without it is still a lock.
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// Bounds on the work any file can cause (a real cache is ~1 KB per entry): plan() reads it.
constexpr int64_t kMaxCacheBytes = 8ll << 20;
constexpr size_t kMaxEntries = 10000;
constexpr int kMaxDepth = 16;  // the format nests 4 deep
constexpr int kNotRegular = -1, kTooLarge = -2;

// 0 and the text; ENOENT when missing; kNotRegular (a directory, FIFO, device: never block on or
// slurp one), kTooLarge; else the errno.
int read_text(const std::string& path, std::string& out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errno;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxCacheBytes) {
    int why = S_ISREG(st.st_mode) ? kTooLarge : kNotRegular;
    ::close(fd);
    return why;
  }
  out.clear();
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      return e;
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
    if (int64_t(out.size()) > kMaxCacheBytes) {
      ::close(fd);
      return kTooLarge;
    }
  }
  ::close(fd);
  return 0;
}

std::string read_error(int err) {
  if (err == kNotRegular) return "not a regular file";
  if (err == kTooLarge) return "larger than " + std::to_string(kMaxCacheBytes >> 20) + " MiB";
  return std::strerror(err);
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// A parsed file: the document (kept whole so that a merge preserves what we do not understand),
// its well-formed entries, and a state ("ok" or why it is ignored).
struct Parsed {
  std::string state = "ok";
  nlohmann::json root = nlohmann::json::object();
  std::vector<TuneEntry> entries;
  bool usable() const { return state == "ok"; }
};

// JSON text -> document, nesting bounded (a deeply nested value would make the writer's dump
// recurse that deep); throws with nlohmann's message (which names the byte) on malformed text.
nlohmann::json parse_json(const std::string& text) {
  auto bounded = [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxDepth) throw std::runtime_error("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    return true;
  };
  return nlohmann::json::parse(text, bounded);
}

Parsed parse_cache(const std::string& path, const std::string& text) {
  Parsed p;
  if (blank(text)) return p;  // e.g. made by touch: an empty cache
  try {
    p.root = parse_json(text);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos)
      what = what.substr(what.find("] ") + 2);  // "parse error at line 1, column 69: ..." is enough
    p.state = "unreadable: " + what;
    return p;
  }
  auto fmt = p.root.is_object() ? p.root.find("format") : p.root.end();
  if (!p.root.is_object() || fmt == p.root.end() || *fmt != kFormat) {
    p.state = std::string("mismatched: not a sparsek tuning cache (no \"format\": \"") + kFormat + "\")";
    return p;
  }
  auto ver = p.root.find("version");
  if (ver == p.root.end() || !ver->is_number() || *ver != kFormatVersion) {
    std::string got = ver != p.root.end() && ver->is_number() ? ver->dump() : std::string("missing");
    p.state = "mismatched: file format version " + got + ", this library reads version " +
              std::to_string(kFormatVersion);
    return p;
  }
  auto entries = p.root.find("entries");
  if (entries == p.root.end() || !entries->is_array()) {
    p.state = "unreadable: \"entries\" is missing or not an array";
    return p;
  }
  if (entries->size() > kMaxEntries) {
    p.state = "unreadable: " + std::to_string(entries->size()) + " entries (at most " + std::to_string(kMaxEntries) +
              " are read)";
    return p;
  }
  for (size_t i = 0; i < entries->size(); ++i) {
    try {
      p.entries.push_back(tune_detail::entry_from_json((*entries)[i]));
    } catch (const std::exception& e) {
      warn_once(path + "#entry", "tuning cache " + path + ": entry " + std::to_string(i) + " skipped (" + e.what() + ")");
    }
  }
  return p;
}

struct FileSig {
  bool exists = false;
  int64_t mtime_ns = 0, ctime_ns = 0, size = -1, ino = 0;
};
FileSig file_sig(const std::string& path) {
  FileSig s;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return s;
  s.exists = true;
  s.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  s.size = int64_t(st.st_size);
  s.ino = int64_t(st.st_ino);
  return s;
}

// Writes text to a fresh temp file beside path and renames it over path (atomic on POSIX).
// path is a resolved one (no symbolic link).
void replace_file(const std::string& path, const std::string& text) {
  static std::atomic<unsigned> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) io_fail("cannot write the tuning cache: " + tmp + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      io_fail("cannot write the tuning cache: " + tmp + ": " + std::strerror(e));
    }
    off += size_t(n);
  }
  // fsync before rename: a crash must leave the old file or the new one, never a torn one.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    io_fail("cannot write the tuning cache: " + tmp + ": " + std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    io_fail("cannot replace the tuning cache " + path + ": " + std::strerror(e));
  }
}

constexpr const char* kFix = "remove it (sparsek cache clear) or point SPARSEK_CACHE at another file";

uint64_t key_hash(const TuneKey& k) {
  uint64_t h = fnv1a(k.backend);
  for (const std::string* s : {&k.op, &k.in_dtype, &k.out_dtype, &k.layouts, &k.device, &k.library, &k.kernel_set})
    h = fnv1a(*s, h ^ 0x1f);
  for (int64_t v : {k.m, k.n, k.k, int64_t(k.bm), int64_t(k.bk), k.nnzb, k.row_mean, k.row_max, k.row_std,
                    int64_t(k.sm_count), int64_t(k.cc), int64_t(k.driver), int64_t(k.runtime)})
    h = (h ^ uint64_t(v)) * 0x100000001b3ull;
  return h;
}

}  // namespace

namespace tune_detail {
std::vector<TuneEntry> read_cache_text(const std::string& text, std::string* state) {
  Parsed p = parse_cache("(text)", text);
  if (state) *state = p.state;
  return p.usable() ? std::move(p.entries) : std::vector<TuneEntry>{};
}
}  // namespace tune_detail

TuneCache::TuneCache(std::string path) : path_(std::move(path)) {}

void TuneCache::set_lock_wait(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds))
    throw Error(Status::invalid_argument,
                "set_lock_wait: seconds=" + std::to_string(seconds) + " must be finite and >= 0");
  lock_wait_s_ = seconds;
}

void TuneCache::refresh() {
  // No file to read: an empty cache, read again once a file appears (sig_size_ = -1 matches none).
  auto missing = [this] {
    entries_.clear();
    index_.clear();
    state_ = "missing";
    loaded_ = true;
    sig_size_ = -1;
  };
  if (path_.empty()) return missing();
  FileSig s = file_sig(path_);
  if (!s.exists) return missing();
  if (loaded_ && s.mtime_ns == sig_mtime_ns_ && s.size == sig_size_ && s.ino == sig_ino_ &&
      s.ctime_ns == sig_ctime_ns_)
    return;
  std::string text;
  int err = read_text(path_, text);
  if (err == ENOENT) return missing();  // replaced between stat and open: the next call sees the new file
  if (err != 0) {
    entries_.clear();
    state_ = "unreadable: " + read_error(err);
  } else {
    Parsed p = parse_cache(path_, text);
    state_ = p.state;
    entries_ = p.usable() ? std::move(p.entries) : std::vector<TuneEntry>{};
  }
  // Last entry per key wins (store() keeps one per key; a hand-edited file might hold two).
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_[key_hash(entries_[i].key)] = i;
  if (state_ != "ok")
    warn_once(path_, "tuning cache " + path_ + " is ignored (" + state_ + "); " + kFix);
  loaded_ = true;
  sig_mtime_ns_ = s.mtime_ns;
  sig_ctime_ns_ = s.ctime_ns;
  sig_size_ = s.size;
  sig_ino_ = s.ino;
}

std::optional<TuneEntry> TuneCache::lookup(const TuneKey& key) {
  refresh();
  auto it = index_.find(key_hash(key));
  if (it == index_.end()) return std::nullopt;
  if (entries_[it->second].key == key) return entries_[it->second];
  // Another key with the same hash was last: look through all of them.
  for (auto e = entries_.rbegin(); e != entries_.rend(); ++e)
    if (e->key == key) return *e;
  return std::nullopt;
}

std::vector<TuneEntry> TuneCache::entries() {
  refresh();
  return entries_;
}

std::string TuneCache::state() {
  refresh();
  return state_;
}

void TuneCache::store(const TuneEntry& entry) {
  if (path_.empty()) io_fail("no tuning cache path: set SPARSEK_CACHE or HOME");
  const std::string file = resolve_links(path_);
  prepare_dir(path_, file);
  FileLock lock(file, lock_wait_s_);
  // Re-read under the lock: another process may have added entries since we last looked.
  std::string text;
  int err = read_text(file, text);
  if (err != 0 && err != ENOENT)
    io_fail("cannot read the tuning cache " + path_ + " (" + read_error(err) + "); " + kFix);
  Parsed p = parse_cache(path_, err == ENOENT ? std::string() : text);
  if (!p.usable())
    io_fail("tuning cache " + path_ + " is " + p.state + "; not overwriting a file sparsek does not recognise: " + kFix);
  nlohmann::json root = std::move(p.root);
  nlohmann::json kept = nlohmann::json::array();
  if (auto old = root.find("entries"); old != root.end())
    for (nlohmann::json& e : *old) {
      bool same = false;
      try {
        if (e.is_object())
          if (auto k = e.find("key"); k != e.end()) same = tune_detail::key_from_json(*k) == entry.key;
      } catch (const std::exception&) {
        // malformed entries are kept as they are: not ours to judge, not ours to delete
      }
      if (!same) kept.push_back(std::move(e));
    }
  if (kept.size() >= kMaxEntries)
    io_fail("tuning cache " + path_ + " holds " + std::to_string(kept.size()) + " entries, the most it may: " + kFix);
  kept.push_back(tune_detail::to_json(entry));
  root["format"] = kFormat;
  root["version"] = kFormatVersion;
  root["entries"] = std::move(kept);
  replace_file(file, root.dump(2) + "\n");
  loaded_ = false;  // re-read on the next lookup
}

size_t TuneCache::clear() {
  if (path_.empty()) return 0;
  const std::string file = resolve_links(path_);  // a link is kept; the file it names goes
  struct stat st {};
  if (::stat(parent_dir(file).c_str(), &st) != 0) return 0;  // no directory, no file: nothing made
  FileLock lock(file, lock_wait_s_);
  std::string text;
  size_t n = 0;
  if (read_text(file, text) == 0) n = parse_cache(path_, text).entries.size();
  if (::unlink(file.c_str()) != 0 && errno != ENOENT)
    io_fail("cannot remove the tuning cache " + file + ": " + std::strerror(errno));
  loaded_ = false;
  return n;
}

namespace tune_detail {

std::optional<TuneEntry> cached_lookup(const TuneKey& key) {
  static std::mutex mu;
  static auto* caches = new std::map<std::string, std::unique_ptr<TuneCache>>;
  std::string path = tune_cache_path();
  if (path.empty()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu);
  auto& c = (*caches)[path];
  if (!c) c = std::make_unique<TuneCache>(path);
  return c->lookup(key);
}

}  // namespace tune_detail

}  // namespace sparsek
