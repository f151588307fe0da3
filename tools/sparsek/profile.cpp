// `sparsek profile`: Nsight Compute (ncu) on one sparsek product launch, its key metrics printed
// as a normalized text file (fixed keys and order, 4 significant digits) that diffs against a
// baseline profile. The tool runs itself under ncu in a child mode that warms up, then brackets
// exactly one run with cudaProfilerStart/Stop (ncu --profile-from-start off).
#ifndef SPARSEK_NO_CUDA
#include <cuda_profiler_api.h>
#endif
#include "core/cuda_host.hpp"
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "sparsek/plan.hpp"
#include "core/no_gpu.hpp"  // no_gpu_error(): what a build without CUDA says
#include "tools_internal.hpp"

extern char** environ;

namespace sparsek::cli {

namespace {

const std::vector<FlagSpec> kSpecs = {
    {"--m", "M", "rows of C (default 8192)"},
    {"--n", "N", "columns of B and C (default 8192)"},
    {"--k", "K", "columns of A = rows of B (default 8192)"},
    {"--block", "BMxBK", "block shape, each of 16, 32, 64, 128 (default 128x128)"},
    {"--density", "D", "fraction of stored blocks, in (0, 1] (default 0.125)"},
    {"--pattern", "NAME", "fixed_k | bernoulli | power_law | banded | block_diagonal | causal (default fixed_k)"},
    {"--dtype", "T", "f16 | bf16 (default f16)"},
    {"--variant", "NAME", "the variant to profile (default: the one plan() picks)"},
    {"--seed", "S", "random seed of the pattern and the values (default 1)"},
    {"--warmup", "W", "runs before the profiled one (default 3)"},
    {"--ncu", "PATH", "the ncu binary (default: $NCU, else ncu on PATH, else the CUDA toolkit's)"},
    {"--out", "FILE", "write the normalized profile to FILE (it is always printed)"},
    {"--raw", "FILE", "keep ncu's own CSV in FILE"},
    {"--from-csv", "FILE", "normalize an existing ncu CSV (ncu --csv --page details) instead of running ncu"},
    {"--json", "FILE", "also write the metrics as JSON (- for stdout)"},
    {"--child", nullptr, "(internal) the run ncu profiles"},
};

// A key metric: its name in the normalized file, a scale, and candidate ncu metrics (the first
// one this ncu knows is used; names differ across GPU generations).
struct Key {
  const char* name;
  double scale;
  std::vector<const char*> metrics;
};
const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"duration_us", 1e-3, {"gpu__time_duration.sum"}},
      {"sm_clock_mhz", 1e-6, {"sm__cycles_elapsed.avg.per_second"}},
      {"sm_throughput_pct", 1, {"sm__throughput.avg.pct_of_peak_sustained_elapsed"}},
      {"sm_busy_pct", 1, {"sm__instruction_throughput.avg.pct_of_peak_sustained_active"}},
      {"tensor_pipe_wgmma_active_pct", 1, {"sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"}},
      {"tensor_pipe_mma_active_pct", 1,
       {"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"}},
      {"l2_throughput_pct", 1,
       {"lts__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sectors.avg.pct_of_peak_sustained_elapsed"}},
      {"l2_bytes_mb", 1e-6, {"lts__t_bytes.sum"}},
      {"dram_throughput_pct", 1,
       {"dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"}},
      {"dram_read_mb", 1e-6, {"dram__bytes_read.sum"}},
      {"dram_write_mb", 1e-6, {"dram__bytes_write.sum"}},
      {"achieved_occupancy_pct", 1, {"sm__warps_active.avg.pct_of_peak_sustained_active"}},
  };
  return k;
}
// Warp stall reasons: cycles stalled per issued instruction, by reason.
const char* kStalls[] = {"long_scoreboard", "barrier",     "wait",          "math_pipe_throttle", "mio_throttle",
                         "short_scoreboard", "membar",     "sleeping",      "lg_throttle",        "not_selected",
                         "selected",         "dispatch_stall", "no_instruction", "drain",         "branch_resolving",
                         "imc_miss",         "tex_throttle", "misc"};
std::string stall_metric(const std::string& r) {
  return "smsp__average_warps_issue_stalled_" + r + "_per_issue_active.ratio";
}

std::string base_name(const std::string& metric) { return metric.substr(0, metric.find('.')); }

// ---- running a program ----

struct Ran {
  int status = -1;  // exit code, or -1 when it could not start / was killed
  std::string output;
};
Ran run_program(const std::vector<std::string>& argv, const std::string& out_file) {
  Ran r;
  std::vector<char*> av;
  for (const std::string& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, av[0], &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) {
    r.output = std::strerror(err);
    return r;
  }
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
  std::ifstream in(out_file);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

bool executable(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

// The ncu binary, or "" when there is none (`tried` lists where it looked).
std::string find_ncu(const Args& args, std::string* tried) {
  if (args.has("--ncu")) {
    const std::string p = args.str("--ncu", "");
    *tried = p;
    return executable(p) ? p : "";
  }
  std::vector<std::string> cands;
  if (const char* e = std::getenv("NCU"); e && *e) {
    cands.push_back(e);
    *tried = std::string("$NCU=") + e + ", ";
  }
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    std::string dir;
    while (std::getline(ss, dir, ':'))
      if (!dir.empty()) cands.push_back(dir + "/ncu");
  }
  cands.push_back("/usr/local/cuda/bin/ncu");
  *tried += "PATH, /usr/local/cuda/bin/ncu";
  for (const std::string& c : cands)
    if (executable(c)) return c;
  return "";
}

// ---- ncu's CSV ----

std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> f;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      f.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  f.push_back(cur);
  return f;
}

// One profiled kernel: its name and metric -> (value, unit).
struct Kernel {
  std::string id, name;
  std::map<std::string, std::pair<double, std::string>> metrics;
};

// ncu --csv --page details: a header row naming "ID", "Kernel Name", "Metric Name", "Metric Unit"
// and "Metric Value" among its columns, then one row per (kernel, metric). Other lines (ncu's
// ==PROF== messages, the program's own output) are skipped.
std::vector<Kernel> parse_details_csv(const std::string& text) {
  std::vector<Kernel> out;
  std::istringstream in(text);
  std::string line;
  int c_id = -1, c_kernel = -1, c_metric = -1, c_unit = -1, c_value = -1;
  size_t width = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '"') continue;
    std::vector<std::string> f = csv_fields(line);
    if (c_metric < 0) {
      for (size_t i = 0; i < f.size(); ++i) {
        if (f[i] == "ID") c_id = int(i);
        if (f[i] == "Kernel Name") c_kernel = int(i);
        if (f[i] == "Metric Name") c_metric = int(i);
        if (f[i] == "Metric Unit") c_unit = int(i);
        if (f[i] == "Metric Value") c_value = int(i);
      }
      if (c_metric < 0 || c_value < 0 || c_kernel < 0 || c_id < 0) c_metric = -1;
      width = f.size();
      continue;
    }
    if (f.size() != width) continue;
    const std::string& id = f[size_t(c_id)];
    if (out.empty() || out.back().id != id) out.push_back({id, f[size_t(c_kernel)], {}});
    std::string v = f[size_t(c_value)];
    v.erase(std::remove(v.begin(), v.end(), ','), v.end());  // "1,234.5" in some locales
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (!v.empty() && end && *end == '\0')
      out.back().metrics[f[size_t(c_metric)]] = {x, c_unit >= 0 ? f[size_t(c_unit)] : ""};
  }
  return out;
}

// ncu reports some metrics in scaled units when --print-units base is not honoured: bring them
// back to base units (bytes, ns, Hz).
double in_base_units(double v, const std::string& unit) {
  static const std::map<std::string, double> k = {
      {"Kbyte", 1e3}, {"Mbyte", 1e6}, {"Gbyte", 1e9}, {"KB", 1e3},  {"MB", 1e6},   {"GB", 1e9},
      {"usecond", 1e3}, {"msecond", 1e6}, {"us", 1e3}, {"ms", 1e6}, {"Khz", 1e3}, {"Mhz", 1e6},
      {"Ghz", 1e9},   {"KHz", 1e3},   {"MHz", 1e6},  {"GHz", 1e9}, {"cycle/usecond", 1e6}, {"cycle/nsecond", 1e9}};
  auto it = k.find(unit);
  return it == k.end() ? v : v * it->second;
}

std::string sig4(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

// The normalized file: '#' lines describe the run, then "key value" lines in a fixed order.
std::string normalize(const std::vector<Kernel>& ks, const std::string& header, Json* j) {
  std::string out = header;
  Json kj = Json::array();
  for (size_t i = 0; i < ks.size(); ++i) {
    const Kernel& k = ks[i];
    out += "# kernel " + std::to_string(i + 1) + " of " + std::to_string(ks.size()) + ": " + printable(k.name) + "\n";
    Json m = Json::object();
    auto line = [&](const std::string& key, double v) {
      char b[128];
      std::snprintf(b, sizeof b, "%-36s %s\n", (ks.size() > 1 ? "k" + std::to_string(i + 1) + "." + key : key).c_str(),
                    sig4(v).c_str());
      out += b;
      m[key] = v;
    };
    for (const Key& key : keys())
      for (const char* metric : key.metrics)
        if (auto it = k.metrics.find(metric); it != k.metrics.end()) {
          line(key.name, in_base_units(it->second.first, it->second.second) * key.scale);
          break;
        }
    for (const char* r : kStalls)
      if (auto it = k.metrics.find(stall_metric(r)); it != k.metrics.end())
        line(std::string("stall_") + r, it->second.first);
    kj.push_back({{"kernel", k.name}, {"metrics", m}});
  }
  *j = kj;
  return out;
}

// ---- the profiled run (child mode) ----

// The workload flags, parsed and checked (UsageError naming the flag: exit 2). The parent checks
// them before it looks for ncu or a GPU, so a mistake fails at once, not inside the profiled child.
struct Workload {
  int64_t m, n, k;
  int bm = 128, bk = 128;
  double density;
  PatternKind kind;
  DType dtype;
  uint64_t seed;
  int warmup;
  std::string variant;
};
Workload parse_workload(const Args& args) {
  Workload w;
  const int64_t big = int64_t(1) << 20;
  w.m = args.integer("--m", 8192, 1, big);
  w.n = args.integer("--n", 8192, 1, big);
  w.k = args.integer("--k", 8192, 1, big);
  args.block("--block", &w.bm, &w.bk);
  w.density = args.real("--density", 0.125, 0.0, 1.0);
  w.kind = args.pattern("--pattern", PatternKind::fixed_k);
  w.dtype = args.dtype("--dtype", DType::f16);
  w.seed = args.seed("--seed", 1);
  w.warmup = int(args.integer("--warmup", 3, 0, 1000));
  if (w.m % w.bm) args.bad("--m", "must be a multiple of the block's rows (" + std::to_string(w.bm) + ")");
  if (w.k % w.bk) args.bad("--k", "must be a multiple of the block's columns (" + std::to_string(w.bk) + ")");
  w.variant = args.str("--variant", "");
  if (args.has("--variant")) {
    const Variant* v = find_variant(w.variant);
    if (!v) {
      std::string known;
      for (const Variant& x : variants())
        if (x.backend == Backend::cuda && !x.peer) known += (known.empty() ? "" : ", ") + std::string(x.name);
      args.bad("--variant", "unknown variant (GPU variants: " + known + ")");
    }
    if (v->backend != Backend::cuda || v->peer) args.bad("--variant", "not a sparsek GPU variant");
  }
  return w;
}

int child(const Args& args) {
  const Workload w = parse_workload(args);
  if (!device_info().available) throw no_gpu_error("profile", "profile: no GPU: ");
  const int64_t m = w.m, n = w.n, k = w.k;
  const int bm = w.bm, bk = w.bk;
  const double density = w.density;
  const PatternKind kind = w.kind;
  const DType dtype = w.dtype;
  const uint64_t seed = w.seed;
  const int warmup = w.warmup;
  const double es = double(dtype_size(dtype)),
               bytes = (std::min(1.0, density * 1.01) * double(m) * double(k) + double(k) * double(n)) * es;
  const std::string what = "the workload --m " + std::to_string(m) + " --n " + std::to_string(n) + " --k " +
                           std::to_string(k);
  check_host_bytes(what, bytes);
  check_device_bytes(what, bytes + double(m) * double(n) * es);
  BsrMatrix a = random_bsr(kind, m, k, bm, bk, density, dtype, seed);
  HostMatrix b(k, n, dtype, Layout::row_major, 0);
  b.fill_random(mix_seed(seed, 2), false);
  DeviceBuffer rp(a.row_ptr().size() * 4), ci(std::max<size_t>(a.col_idx().size(), 1) * 4),
      vals(std::max<size_t>(a.value_bytes().size(), 16)), db(b.bytes.size()), dc(size_t(m * n) * dtype_size(dtype));
  rp.upload(a.row_ptr().data(), rp.bytes);
  ci.upload(a.col_idx().data(), a.col_idx().size() * 4);
  vals.upload(a.value_bytes().data(), a.value_bytes().size());
  db.upload(b.bytes.data(), b.bytes.size());
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.sparse = a.view();
  g.sparse.row_ptr = static_cast<const int32_t*>(rp.p);
  g.sparse.col_idx = static_cast<const int32_t*>(ci.p);
  g.sparse.values = vals.p;
  g.sparse.memory = Memory::device;
  g.b = b.view;
  g.b.data = db.p;
  g.b.memory = Memory::device;
  g.c = {dc.p, m, n, n, Layout::row_major, dtype, Memory::device};
  Options o;
  o.backend = Backend::cuda;
  o.variant = w.variant;
  const Plan p = plan(g, o);
  std::fprintf(stderr, "sparsek profile: variant %s (%s)\n", p.variant().c_str(), p.chosen_by().c_str());
  for (int i = 0; i < warmup; ++i) run(p, g);
  check_cuda(cudaDeviceSynchronize(), "warm-up runs");
  check_cuda(cudaProfilerStart(), "cudaProfilerStart");
  run(p, g);
  check_cuda(cudaDeviceSynchronize(), "the profiled run");
  check_cuda(cudaProfilerStop(), "cudaProfilerStop");
  return 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[noreturn]] void ncu_failed(const std::string& ncu, const Ran& r) {
  const std::string& o = r.output;
  if (o.find("ERR_NVGPUCTRPERM") != std::string::npos)
    throw Error(Status::cuda_error,
                "ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM). Run it as root, or let "
                "every user profile: put 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in a file "
                "under /etc/modprobe.d/ and reload the nvidia module (or reboot); in a container, start it "
                "with --cap-add=SYS_ADMIN. See https://developer.nvidia.com/ERR_NVGPUCTRPERM");
  std::string tail = o.size() > 2000 ? o.substr(o.size() - 2000) : o;
  throw Error(Status::cuda_error, ncu + " failed (exit " + std::to_string(r.status) + "):\n" + tail);
}

}  // namespace

int profile_main(const std::vector<std::string>& argv) {
  Args args(argv, kSpecs);
  if (args.help()) {
    print_help("sparsek profile [workload flags] [--out FILE] [--json FILE]",
               "Runs Nsight Compute (ncu) on one launch of a sparsek DSD product (after --warmup runs)\n"
               "and prints its key metrics as a normalized text file: '#' lines name the run, the GPU\n"
               "and the kernel, then one 'key value' line per metric in a fixed order (duration, SM\n"
               "clock, SM throughput and busy, tensor pipes, L2 and DRAM throughput and bytes, achieved\n"
               "occupancy, warp stall reasons per issued instruction), 4 significant digits, so that two\n"
               "profiles diff line by line. Needs ncu and a GPU; says what to do when ncu is missing or\n"
               "may not read the performance counters.",
               kSpecs);
    return 0;
  }
  if (args.has("--child")) return child(args);
  // Every flag and output path is checked before anything runs (exit 2 for a flag, 1 for a path).
  const Workload w = parse_workload(args);
  JsonOutput json(args);
  const std::string out_path = args.str("--out", ""), raw_path = args.str("--raw", "");
  if (args.has("--out") && out_path.empty()) args.bad("--out", "needs a file name");
  if (args.has("--raw") && raw_path.empty()) args.bad("--raw", "needs a file name");
  if (!out_path.empty()) check_writable(out_path, "--out");
  if (!raw_path.empty()) check_writable(raw_path, "--raw");
  std::string csv, header;

  if (args.has("--from-csv")) {
    const std::string f = args.str("--from-csv", "");
    csv = read_input_file(f, "--from-csv");  // a regular file, bounded: never a FIFO's endless wait
    if (csv.empty()) throw Error(Status::io_error, "cannot read --from-csv " + printable(f) + ": it is empty");
    header = "# sparsek profile of " + printable(f) + "\n";
  } else {
    std::string tried;
    const std::string ncu = find_ncu(args, &tried);
    if (ncu.empty())
      throw Error(Status::unsupported,
                  "ncu (Nsight Compute) not found (looked at: " + tried +
                      "). Install it (Debian/Ubuntu with NVIDIA's CUDA repository: apt-get install "
                      "cuda-nsight-compute-13-0; else NVIDIA's Nsight Compute installer), then put it on PATH, "
                      "set NCU, or pass --ncu /path/to/ncu");
    if (!device_info().available)
      throw no_gpu_error("profile (runs the kernel on a GPU)", "profile needs a GPU to run the kernel on: ");
    char dir_tmpl[] = "/tmp/sparsek-profile-XXXXXX";
    if (!::mkdtemp(dir_tmpl)) throw Error(Status::io_error, std::string("cannot make a temp directory: ") + std::strerror(errno));
    const std::string dir = dir_tmpl;
    // The metrics this ncu knows (names differ across GPUs and ncu versions).
    Ran q = run_program({ncu, "--query-metrics"}, dir + "/query.txt");
    if (q.status != 0) ncu_failed(ncu, q);
    std::set<std::string> known;
    {
      std::istringstream in(q.output);
      std::string word;
      while (in >> word)
        if (word.find("__") != std::string::npos) known.insert(word);
    }
    std::string metrics;
    auto want = [&](const std::string& m) {
      if (known.empty() || known.count(base_name(m))) metrics += (metrics.empty() ? "" : ",") + m;
    };
    for (const Key& k : keys())
      for (const char* m : k.metrics) want(m);
    for (const char* r : kStalls) want(stall_metric(r));
    std::vector<std::string> cmd = {ncu, "--profile-from-start", "off", "--metrics", metrics, "--csv", "--page",
                                    "details", "--print-units", "base", "--log-file", dir + "/ncu.csv",
                                    "/proc/self/exe"};
    // ncu resolves /proc/self/exe in its own process: name this binary explicitly.
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) throw Error(Status::io_error, "cannot find this program's path (/proc/self/exe)");
    cmd.back() = std::string(self, size_t(n));
    cmd.push_back("profile");
    for (const std::string& a : argv) cmd.push_back(a);
    cmd.push_back("--child");
    std::printf("running: %s ... (the program's output: %s/run.txt)\n", ncu.c_str(), dir.c_str());
    std::fflush(stdout);
    Ran r = run_program(cmd, dir + "/run.txt");
    const std::string log = read_file(dir + "/ncu.csv");
    if (r.status != 0 || log.find("ERR_NVGPUCTRPERM") != std::string::npos) {
      r.output += "\n" + log;
      ncu_failed(ncu, r);
    }
    csv = log;
    const DeviceInfo& d = device_info();
    header = "# sparsek profile: dsd " + std::string(to_string(w.dtype)) + " " + std::to_string(w.m) + "x" +
             std::to_string(w.n) + "x" + std::to_string(w.k) + " block " + block_str(w.bm, w.bk) + " " +
             to_string(w.kind) + " density " + args.str("--density", "0.125") + " variant " +
             (w.variant.empty() ? std::string("(plan's choice)") : w.variant) + "\n# on " + d.name + " (cc " + std::to_string(d.cc_major) + "." +
             std::to_string(d.cc_minor) + ", " + std::to_string(d.sm_count) + " SMs), sparsek " + version() + "\n";
    std::string chosen;
    {
      std::istringstream in(r.output);
      std::string line;
      while (std::getline(in, line))
        if (line.rfind("sparsek profile: variant ", 0) == 0) chosen = line.substr(17);
    }
    if (!chosen.empty()) header += "# " + chosen + "\n";
    std::string cleanup = "rm -rf '" + dir + "'";
    if (std::system(cleanup.c_str()) != 0) std::fprintf(stderr, "sparsek profile: could not remove %s\n", dir.c_str());
  }
  if (!raw_path.empty()) {
    std::ofstream f(raw_path, std::ios::binary);
    f << csv;
    if (!f) throw Error(Status::io_error, "cannot write --raw " + raw_path);
  }
  const std::vector<Kernel> ks = parse_details_csv(csv);
  if (ks.empty())
    throw Error(Status::internal, "ncu's output holds no profiled kernel (keep it with --raw FILE to look)");
  Json kj;
  const std::string text = normalize(ks, header, &kj);
  std::printf("%s", text.c_str());
  if (!out_path.empty()) {
    std::ofstream f(out_path, std::ios::binary);
    f << text;
    if (!f) throw Error(Status::io_error, "cannot write --out " + out_path);
    std::printf("wrote %s\n", out_path.c_str());
  }
  if (json.enabled()) {
    Json doc = json_header("profile", argv);
    doc["kernels"] = kj;
    json.write(doc);
    json.say_written();
  }
  return 0;
}

}  // namespace sparsek::cli
