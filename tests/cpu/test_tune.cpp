// The autotuner and its cache: JSON, key round-trip, hit/miss, corrupted and mismatched files,
// concurrent writers, SPARSEK_TUNE modes, and tuning the CPU backend end to end.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "plan/backends.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/tune.hpp"
#include "test_util.hpp"
#include "tune/tune_internal.hpp"

namespace sparsek::test {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write_all(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}
bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }
size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// Each test gets its own cache directory and SPARSEK_CACHE; SPARSEK_TUNE is unset (= cached).
class TuneTest : public ::testing::Test {
 protected:
  std::string dir, path;
  void SetUp() override {
    char tmpl[] = "/tmp/sparsek-tune-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    path = dir + "/sub/tune.json";  // the directory is created on the first store
    setenv("SPARSEK_CACHE", path.c_str(), 1);
    unsetenv("SPARSEK_TUNE");
    tune_detail::reset_warnings();
    clear_one_shot_plan_cache();
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  std::vector<std::string> files_in(const std::string& d) {
    std::vector<std::string> out;
    if (DIR* h = opendir(d.c_str())) {
      while (dirent* e = readdir(h))
        if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
      closedir(h);
    }
    return out;
  }
  void make_dir() { ASSERT_EQ(std::system(("mkdir -p '" + dir + "/sub'").c_str()), 0); }

 private:
  SavedEnv tune_{"SPARSEK_TUNE"}, cache_{"SPARSEK_CACHE"};  // restored when the test ends
};

CaseSpec small_dsd(uint64_t seed = 1) {
  CaseSpec s;
  s.kind = OpKind::dsd;
  s.rows = 128;
  s.cols = 128;
  s.bm = 32;
  s.bk = 32;
  s.free = 48;
  s.density = 0.5;
  s.seed = seed;
  return s;
}

TuneKey key_of(const GemmArgs& g) {
  return tune_key(g, pattern_stats(g.sparse.row_ptr, g.sparse.mb()), Backend::cpu);
}

TuneEntry entry_for(const TuneKey& k, const std::string& variant = "cpu") {
  TuneEntry e;
  e.key = k;
  e.variant = variant;
  e.time_ms = 1.5;
  e.default_variant = "cpu";
  e.default_ms = 1.5;
  e.candidates = {{"cpu", 1.5}};
  e.created = "2025-01-01T00:00:00Z";
  return e;
}

// A synthetic key (any device): distinct per i.
TuneKey synthetic_key(int i) {
  TuneKey k;
  k.backend = "cuda";
  k.op = "dsd";
  k.in_dtype = "f16";
  k.out_dtype = "f16";
  k.layouts = "row,row";
  k.m = 1024 + i;
  k.n = k.k = 1024;
  k.bm = k.bk = 64;
  k.nnzb = 64;
  k.row_mean = 4;
  k.row_max = 4;
  k.device = "Test GPU \"quoted\" \xc3\xa9";
  k.sm_count = 132;
  k.cc = 90;
  k.driver = 13000;
  k.runtime = 13000;
  k.library = version();
  k.kernel_set = kernel_set_hash();
  return k;
}

// ---------------------------------------------------------------------------------------------
// The cache reader: any text gives entries or a state, within bounded work, never a throw

std::string cache_doc(const std::string& entries_json) {
  return "{\"format\": \"sparsek-tune-cache\", \"version\": 1, \"entries\": " + entries_json + "}";
}

TEST(CacheReader, MalformedTextIsIgnoredWithItsReason) {
  const char* bad[] = {"{",        "[1,]",      "{\"a\" 1}", "\"\\x\"",  "01",   "nul",    "{\"a\":1}x",
                       "\"abc",     "{\"a\":}",   "+1",        "[",        "1e",   "tru",    "\"\\ud800\""};
  for (const char* t : bad) {
    std::string state;
    EXPECT_TRUE(tune_detail::read_cache_text(t, &state).empty()) << t;
    EXPECT_EQ(state.rfind("unreadable: ", 0), 0u) << t << " -> " << state;
  }
  std::string state;
  EXPECT_TRUE(tune_detail::read_cache_text("[1, 2]", &state).empty());
  EXPECT_EQ(state.rfind("mismatched: not a sparsek tuning cache", 0), 0u) << state;
  EXPECT_TRUE(tune_detail::read_cache_text("  \n", &state).empty());
  EXPECT_EQ(state, "ok");  // blank: an empty cache
  // Every truncation and byte flip of a real document: entries or a state, never a throw.
  const std::string text = cache_doc("[" + tune_detail::to_json(entry_for(synthetic_key(0))).dump() + "]");
  EXPECT_EQ(tune_detail::read_cache_text(text, &state).size(), 1u);
  EXPECT_EQ(state, "ok");
  size_t ignored = 0;
  for (size_t cut = 0; cut < text.size(); ++cut) {
    tune_detail::read_cache_text(text.substr(0, cut), &state);
    ignored += state != "ok";
  }
  EXPECT_GT(ignored, text.size() / 2);
  for (size_t i = 0; i < text.size(); ++i) {
    std::string t = text;
    t[i] = char(t[i] ^ 0x5a);
    EXPECT_NO_THROW(tune_detail::read_cache_text(t, &state));
  }
}

TEST(CacheReader, WorkIsBounded) {
  std::string state;
  // Nesting: bounded (a writer re-dumping a deep document would recurse that deep).
  EXPECT_TRUE(tune_detail::read_cache_text(std::string(100000, '['), &state).empty());
  EXPECT_NE(state.find("nested deeper than 16"), std::string::npos) << state;
  // More entries than the reader takes: the file is ignored, saying why.
  std::string many = "[";
  for (int i = 0; i < 10001; ++i) many += i ? ",{}" : "{}";
  EXPECT_TRUE(tune_detail::read_cache_text(cache_doc(many + "]"), &state).empty());
  EXPECT_NE(state.find("10001 entries (at most 10000"), std::string::npos) << state;
  // An overlong string skips its entry (the others stay).
  nlohmann::json long_dev = tune_detail::to_json(entry_for(synthetic_key(1)));
  long_dev["key"]["device"] = std::string(300, 'x');
  const std::string two = "[" + long_dev.dump() + "," + tune_detail::to_json(entry_for(synthetic_key(2))).dump() + "]";
  std::vector<TuneEntry> got = tune_detail::read_cache_text(cache_doc(two), &state);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].key == synthetic_key(2));
  // Out-of-range integers skip their entry rather than wrap.
  nlohmann::json huge = tune_detail::to_json(entry_for(synthetic_key(3)));
  huge["key"]["bm"] = 1e12;
  EXPECT_TRUE(tune_detail::read_cache_text(cache_doc("[" + huge.dump() + "]"), &state).empty());
  EXPECT_EQ(state, "ok");
}

// One object with 100000 keys (a well-formed 1.4 MB file) took the hand-written reader minutes.
// The bound below is a hang guard, not a performance target: the read takes milliseconds.
TEST(CacheReader, ManyKeysInOneObjectReadQuickly) {
  std::string obj = "{";
  for (int i = 0; i < 100000; ++i) obj += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  obj += "}";
  const std::string text = "{\"format\": \"sparsek-tune-cache\", \"version\": 1, \"extra\": " + obj +
                           ", \"entries\": [" + tune_detail::to_json(entry_for(synthetic_key(0))).dump() + "]}";
  const auto t0 = std::chrono::steady_clock::now();
  std::string state;
  EXPECT_EQ(tune_detail::read_cache_text(text, &state).size(), 1u);
  EXPECT_EQ(state, "ok");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

// ---------------------------------------------------------------------------------------------
// Key

TEST(TuneKeyTest, PowerOfTwoBuckets) {
  EXPECT_EQ(pow2_bucket(0), 0);
  EXPECT_EQ(pow2_bucket(0.4), 0);
  EXPECT_EQ(pow2_bucket(0.7), 1);
  EXPECT_EQ(pow2_bucket(1), 1);
  EXPECT_EQ(pow2_bucket(11), 8);
  EXPECT_EQ(pow2_bucket(12), 16);
  EXPECT_EQ(pow2_bucket(15.9), 16);  // a Bernoulli mean near 16 stays with the exact 16
  EXPECT_EQ(pow2_bucket(16.1), 16);
  EXPECT_EQ(pow2_bucket(22), 16);
  EXPECT_EQ(pow2_bucket(23), 32);
}

TEST(TuneKeyTest, RoundTripAndEveryFieldMatters) {
  auto gc = make_case(small_dsd());
  const TuneKey k = key_of(gc->args);
  EXPECT_EQ(k.backend, "cpu");
  EXPECT_EQ(k.op, "dsd");
  EXPECT_EQ(k.layouts, "row,row");
  EXPECT_EQ(k.m, 128);
  EXPECT_EQ(k.n, 48);
  EXPECT_EQ(k.k, 128);
  EXPECT_EQ(k.nnzb, gc->sparse.nnzb());
  EXPECT_EQ(k.device.rfind("cpu: ", 0), 0u);
  EXPECT_EQ(k.sm_count, cpu_threads(0));
  EXPECT_EQ(k.library, version());
  EXPECT_EQ(k.kernel_set.size(), 16u);
  EXPECT_EQ(tune_key(gc->args, pattern_stats(gc->args.sparse.row_ptr, 4), Backend::cpu, 3).sm_count, 3);

  for (const TuneKey& key : {k, synthetic_key(5)}) {
    TuneKey back = tune_detail::key_from_json(nlohmann::json::parse(tune_detail::to_json(key).dump()));
    EXPECT_TRUE(back == key) << describe(back) << "\nvs\n" << describe(key);
    TuneEntry e = entry_for(key, "some_variant");
    TuneEntry eb = tune_detail::entry_from_json(nlohmann::json::parse(tune_detail::to_json(e).dump()));
    EXPECT_TRUE(eb.key == key);
    EXPECT_EQ(eb.variant, "some_variant");
    EXPECT_EQ(eb.time_ms, 1.5);
    EXPECT_EQ(eb.candidates, e.candidates);
    EXPECT_EQ(eb.created, e.created);
  }
  // Each field takes part in equality.
  std::vector<void (*)(TuneKey&)> edits = {
      [](TuneKey& x) { x.backend = "cuda"; },   [](TuneKey& x) { x.op = "dsd_t"; },
      [](TuneKey& x) { x.in_dtype = "f16"; },   [](TuneKey& x) { x.out_dtype = "bf16"; },
      [](TuneKey& x) { x.layouts = "col,row"; }, [](TuneKey& x) { x.m++; },
      [](TuneKey& x) { x.n++; },                [](TuneKey& x) { x.k++; },
      [](TuneKey& x) { x.bm = 64; },            [](TuneKey& x) { x.bk = 16; },
      [](TuneKey& x) { x.nnzb++; },             [](TuneKey& x) { x.row_mean *= 2; },
      [](TuneKey& x) { x.row_max *= 2; },       [](TuneKey& x) { x.row_std = 64; },
      [](TuneKey& x) { x.device += "x"; },      [](TuneKey& x) { x.sm_count++; },
      [](TuneKey& x) { x.cc = 80; },            [](TuneKey& x) { x.driver++; },
      [](TuneKey& x) { x.runtime++; },          [](TuneKey& x) { x.library = "0.0.0"; },
      [](TuneKey& x) { x.kernel_set = "0000000000000000"; }};
  for (size_t i = 0; i < edits.size(); ++i) {
    TuneKey x = k;
    edits[i](x);
    EXPECT_FALSE(x == k) << "edit " << i;
  }
  EXPECT_THROW(tune_detail::key_from_json(nlohmann::json::parse("{\"backend\": \"cpu\"}")), std::runtime_error);
  nlohmann::json wrong = tune_detail::to_json(k);
  wrong["m"] = 1.5;
  EXPECT_THROW(tune_detail::key_from_json(wrong), std::runtime_error);
}

// ---------------------------------------------------------------------------------------------
// Cache file

TEST_F(TuneTest, HitMissReplace) {
  TuneCache c(path);
  EXPECT_EQ(c.state(), "missing");
  const TuneKey k0 = synthetic_key(0), k1 = synthetic_key(1);
  EXPECT_FALSE(c.lookup(k0));
  c.store(entry_for(k0, "a"));
  EXPECT_EQ(c.state(), "ok");
  auto hit = c.lookup(k0);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->variant, "a");
  EXPECT_FALSE(c.lookup(k1));
  c.store(entry_for(k1, "b"));
  c.store(entry_for(k0, "c"));  // same key: replaced, not duplicated
  EXPECT_EQ(c.entries().size(), 2u);
  EXPECT_EQ(c.lookup(k0)->variant, "c");
  EXPECT_EQ(c.lookup(k1)->variant, "b");
  // Another instance (another process, in effect) sees the file as written.
  TuneCache d(path);
  EXPECT_EQ(d.lookup(k0)->variant, "c");
  // Nothing but the file and its lock sidecar is left in the directory.
  auto files = files_in(dir + "/sub");
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"tune.json", "tune.json.lock"}));
  EXPECT_EQ(c.clear(), 2u);
  EXPECT_EQ(c.state(), "missing");
  EXPECT_FALSE(d.lookup(k0));
}

TEST_F(TuneTest, ReloadsWhenAnotherWriterChangesTheFile) {
  TuneCache reader(path), writer(path);
  const TuneKey k = synthetic_key(3);
  EXPECT_FALSE(reader.lookup(k));
  writer.store(entry_for(k, "late"));
  auto hit = reader.lookup(k);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->variant, "late");
}

TEST_F(TuneTest, CorruptedFileWarnsOnceAndIsIgnored) {
  make_dir();
  const std::string garbage = "{\"format\": \"sparsek-tune-cache\", \"version\": 1, \"entries\": [ {\"key\": ";
  write_all(path, garbage);
  testing::internal::CaptureStderr();
  TuneCache c(path);
  EXPECT_FALSE(c.lookup(synthetic_key(0)));
  EXPECT_EQ(c.state().rfind("unreadable: parse error at line 1, column 69", 0), 0u) << c.state();
  TuneCache c2(path);
  EXPECT_FALSE(c2.lookup(synthetic_key(0)));
  // plan() under SPARSEK_TUNE=cached carries on with the heuristic.
  auto gc = make_case(small_dsd());
  Plan p = plan(gc->args);
  EXPECT_EQ(p.chosen_by(), "heuristic");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "sparsek: warning: tuning cache " + path + " is ignored (unreadable"), 1u) << err;
  // A file sparsek cannot read is not overwritten.
  try {
    c.store(entry_for(synthetic_key(0)));
    ADD_FAILURE() << "store() overwrote an unreadable file";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::io_error);
    EXPECT_NE(std::string(e.what()).find("sparsek cache clear"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(path), garbage);
  // Binary junk as well.
  write_all(path, std::string("\x00\xff\x13garbage", 10));
  TuneCache c3(path);
  EXPECT_FALSE(c3.lookup(synthetic_key(0)));
}

TEST_F(TuneTest, DirectoriesAndFifosAreIgnoredWithoutBlocking) {
  make_dir();
  testing::internal::CaptureStderr();
  TuneCache d(dir + "/sub");  // a directory
  EXPECT_FALSE(d.lookup(synthetic_key(0)));
  EXPECT_EQ(d.state(), "unreadable: not a regular file");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  TuneCache f(fifo);  // opening a FIFO for reading would block without O_NONBLOCK
  EXPECT_FALSE(f.lookup(synthetic_key(0)));
  EXPECT_EQ(f.state(), "unreadable: not a regular file");
  EXPECT_THROW(f.store(entry_for(synthetic_key(0))), Error);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "warning"), 2u) << err;
}

TEST_F(TuneTest, MismatchedFilesAreIgnored) {
  make_dir();
  write_all(path, "{\"format\": \"sparsek-tune-cache\", \"version\": 99, \"entries\": []}");
  testing::internal::CaptureStderr();
  TuneCache c(path);
  EXPECT_FALSE(c.lookup(synthetic_key(0)));
  EXPECT_EQ(c.state(), "mismatched: file format version 99, this library reads version 1");
  EXPECT_THROW(c.store(entry_for(synthetic_key(0))), Error);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "warning"), 1u) << err;

  write_all(path, "{\"some\": \"other tool's file\"}");
  TuneCache d(path);
  EXPECT_FALSE(d.lookup(synthetic_key(0)));
  EXPECT_EQ(d.state().rfind("mismatched: not a sparsek tuning cache", 0), 0u) << d.state();
  EXPECT_THROW(d.store(entry_for(synthetic_key(0))), Error);
  EXPECT_EQ(read_all(path), "{\"some\": \"other tool's file\"}");

  write_all(path, "  \n");  // empty (e.g. touched): an empty cache
  TuneCache e(path);
  EXPECT_EQ(e.state(), "ok");
  e.store(entry_for(synthetic_key(0)));
  EXPECT_TRUE(e.lookup(synthetic_key(0)));
}

TEST_F(TuneTest, EntriesOfOtherDevicesAndVersionsAreIgnored) {
  auto gc = make_case(small_dsd());
  const TuneKey mine = key_of(gc->args);
  TuneCache c(path);
  std::vector<void (*)(TuneKey&)> others = {
      [](TuneKey& x) { x.device = "cpu: some other CPU"; }, [](TuneKey& x) { x.sm_count += 1; },
      [](TuneKey& x) { x.library = "0.0.1"; },              [](TuneKey& x) { x.kernel_set = "ffffffffffffffff"; },
      [](TuneKey& x) { x.driver = 12000; },                 [](TuneKey& x) { x.runtime = 12080; },
      [](TuneKey& x) { x.cc = 90; }};
  for (auto edit : others) {
    TuneKey k = mine;
    edit(k);
    c.store(entry_for(k, "cpu"));
  }
  EXPECT_EQ(c.entries().size(), others.size());
  EXPECT_FALSE(c.lookup(mine));
  EXPECT_EQ(plan(gc->args).chosen_by(), "heuristic");
  c.store(entry_for(mine, "cpu"));
  EXPECT_TRUE(c.lookup(mine));
  EXPECT_EQ(plan(gc->args).chosen_by(), "cache");
  EXPECT_EQ(c.entries().size(), others.size() + 1);  // the others are kept for their machines
}

TEST_F(TuneTest, MalformedEntryIsSkippedAndPreserved) {
  make_dir();
  const TuneKey k = synthetic_key(7);
  nlohmann::json odd = {{"key", "not an object"}, {"note", "from the future"}};
  nlohmann::json root = {{"format", "sparsek-tune-cache"},
                         {"version", 1},
                         {"entries", {odd, 42, tune_detail::to_json(entry_for(k, "kept"))}}};
  write_all(path, root.dump());
  testing::internal::CaptureStderr();
  TuneCache c(path);
  EXPECT_EQ(c.lookup(k)->variant, "kept");
  EXPECT_EQ(c.state(), "ok");
  c.store(entry_for(synthetic_key(8), "new"));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "entry 0 skipped"), 1u) << err;
  const std::string text = read_all(path);
  EXPECT_NE(text.find("from the future"), std::string::npos);  // not ours to delete
  EXPECT_EQ(c.entries().size(), 2u);
}

// A cache path that is a symbolic link: writes go to the file it names, the link stays a link,
// and writers through the link and through the target see one file.
TEST_F(TuneTest, SymlinkedCacheStaysALink) {
  make_dir();
  const std::string target = dir + "/shared.json", link = dir + "/sub/tune.json";
  ASSERT_EQ(::symlink("../shared.json", link.c_str()), 0);  // relative, dangling until the first store
  TuneCache via_link(link), via_target(target);
  via_link.store(entry_for(synthetic_key(1), "one"));
  struct stat st {};
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced by a regular file";
  ASSERT_EQ(::lstat(target.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  via_target.store(entry_for(synthetic_key(2), "two"));
  EXPECT_EQ(via_link.lookup(synthetic_key(2))->variant, "two");
  EXPECT_EQ(via_target.lookup(synthetic_key(1))->variant, "one");
  via_link.store(entry_for(synthetic_key(3), "three"));
  EXPECT_EQ(via_target.entries().size(), 3u);
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  // clear through the link removes the cache it names and keeps the link.
  EXPECT_EQ(via_link.clear(), 3u);
  EXPECT_FALSE(exists(target));
  EXPECT_EQ(::lstat(link.c_str(), &st), 0);
  // A loop of links is an I/O error naming the path, not a hang.
  const std::string a = dir + "/loop_a", b = dir + "/loop_b";
  ASSERT_EQ(::symlink(b.c_str(), a.c_str()), 0);
  ASSERT_EQ(::symlink(a.c_str(), b.c_str()), 0);
  try {
    TuneCache(a).store(entry_for(synthetic_key(4)));
    ADD_FAILURE() << "no error for a loop of links";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::io_error);
    EXPECT_NE(std::string(e.what()).find("levels of symbolic links"), std::string::npos) << e.what();
  }
}

TEST_F(TuneTest, ALinkNeverMakesSparsekCreateDirectories) {
  make_dir();
  // The cache path is a link to a file in directories that do not exist: store names the link and
  // creates nothing; clear has nothing to remove.
  const std::string link = dir + "/sub/tune.json", target = dir + "/missing/deeper/tune.json";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  TuneCache c(link);
  try {
    c.store(entry_for(synthetic_key(1)));
    ADD_FAILURE() << "stored through a dangling link";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::io_error);
    EXPECT_NE(std::string(e.what()).find(link + " is a symbolic link to " + target), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not create directories through a link"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.clear(), 0u);
  EXPECT_FALSE(exists(dir + "/missing")) << "the link's target directory was created";
  // A directory of the path that is a dangling link is not created through either.
  const std::string via_dir = dir + "/linked";
  ASSERT_EQ(::symlink((dir + "/absent").c_str(), via_dir.c_str()), 0);
  TuneCache d(via_dir + "/more/tune.json");
  try {
    d.store(entry_for(synthetic_key(2)));
    ADD_FAILURE() << "stored through a dangling directory link";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::io_error);
    EXPECT_NE(std::string(e.what()).find(via_dir + " is a symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.clear(), 0u);
  EXPECT_FALSE(exists(dir + "/absent"));
  // A link to a directory that exists is followed as any path is.
  ASSERT_EQ(::mkdir((dir + "/real").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((dir + "/real").c_str(), (dir + "/to_real").c_str()), 0);
  TuneCache e(dir + "/to_real/new/tune.json");
  e.store(entry_for(synthetic_key(3)));
  EXPECT_TRUE(exists(dir + "/real/new/tune.json"));
}

// Runs f in a child process and returns its exit code, or -1 when it has not finished within
// `seconds` (the child is then killed): a call that would wait without bound fails the test
// instead of hanging it.
int in_child(const std::function<int()>& f, double seconds) {
  const pid_t pid = fork();
  if (pid == 0) _exit(f());
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
}

TEST_F(TuneTest, AHeldLockIsWaitedForWithABoundAndItsHolderNamed) {
  TuneCache(path).store(entry_for(synthetic_key(0)));
  // This process holds the lock (as a sparsek writer would: its pid in the file).
  const std::string lock = path + ".lock";
  const int fd = ::open(lock.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const std::string me = std::to_string(::getpid());
  ASSERT_EQ(::ftruncate(fd, 0), 0);
  ASSERT_EQ(::pwrite(fd, me.data(), me.size(), 0), ssize_t(me.size()));
  // In a child (this process holds the lock): exit code 10 + the tenths of a second it waited when
  // the error names the lock file and this process; 1: no error; 2: another error.
  auto attempt = [&](double wait, bool clear) {
    return [&, wait, clear] {
      TuneCache c(path);
      c.set_lock_wait(wait);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        if (clear) c.clear();
        else c.store(entry_for(synthetic_key(1)));
        return 1;
      } catch (const Error& e) {
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::string m = e.what();
        const bool named = e.status() == Status::io_error && m.find(lock) != std::string::npos &&
                           m.find("held by process " + me) != std::string::npos;
        if (!named) std::fprintf(stderr, "unexpected message: %s\n", m.c_str());
        return named ? 10 + std::min(80, int(took * 10)) : 2;
      }
    };
  };
  int rc = in_child(attempt(0.5, false), 20);
  ASSERT_NE(rc, -1) << "store waited on the held lock without bound";
  ASSERT_GE(rc, 10) << "store: " << rc;
  EXPECT_GE(rc - 10, 4) << "store gave up before its 0.5 s";
  EXPECT_LE(rc - 10, 30) << "store waited far beyond its 0.5 s";
  rc = in_child(attempt(0, true), 20);  // clear, one try
  ASSERT_GE(rc, 10) << "clear: " << rc;
  EXPECT_LE(rc - 10, 2) << "a wait of 0 must not wait";
  // Released: the next store goes through.
  ASSERT_EQ(::flock(fd, LOCK_UN), 0);
  ::close(fd);
  TuneCache c(path);
  c.set_lock_wait(0);
  c.store(entry_for(synthetic_key(1)));
  EXPECT_EQ(c.entries().size(), 2u);
  for (double bad : {-1.0, double(NAN), double(INFINITY)}) {
    try {
      c.set_lock_wait(bad);
      ADD_FAILURE() << "set_lock_wait(" << bad << ") accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
      EXPECT_NE(std::string(e.what()).find("set_lock_wait: seconds="), std::string::npos) << e.what();
    }
  }
}

TEST_F(TuneTest, OversizedFileIsIgnored) {
  make_dir();
  write_all(path, cache_doc("[]") + std::string((8 << 20) + 1, ' '));
  testing::internal::CaptureStderr();
  TuneCache c(path);
  EXPECT_EQ(c.state(), "unreadable: larger than 8 MiB");
  EXPECT_FALSE(c.lookup(synthetic_key(0)));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("is ignored (unreadable: larger than 8 MiB)"), std::string::npos) << err;
}

TEST_F(TuneTest, TwoProcessesTuningAtOnceKeepBothEntries) {
  constexpr int kProcs = 4, kEach = 12;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        TuneCache c(path);  // a separate instance per process, all writing the same file
        for (int i = 0; i < kEach; ++i) c.store(entry_for(synthetic_key(p * 100 + i), "v" + std::to_string(p)));
      } catch (...) {
        rc = 1;
      }
      _exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  TuneCache c(path);
  EXPECT_EQ(c.state(), "ok");
  EXPECT_EQ(c.entries().size(), size_t(kProcs * kEach));
  for (int p = 0; p < kProcs; ++p)
    for (int i = 0; i < kEach; ++i) {
      auto hit = c.lookup(synthetic_key(p * 100 + i));
      ASSERT_TRUE(hit) << p << "/" << i;
      EXPECT_EQ(hit->variant, "v" + std::to_string(p));
    }
  EXPECT_EQ(files_in(dir + "/sub").size(), 2u);  // no temp files left behind
}

TEST_F(TuneTest, TwoThreadsWithSeparateInstancesKeepBothEntries) {
  auto work = [&](int t) {
    TuneCache c(path);
    for (int i = 0; i < 15; ++i) c.store(entry_for(synthetic_key(t * 100 + i)));
  };
  std::thread a(work, 1), b(work, 2);
  a.join();
  b.join();
  EXPECT_EQ(TuneCache(path).entries().size(), 30u);
}

TEST_F(TuneTest, UnwritableLocationIsAnIoError) {
  make_dir();
  write_all(dir + "/file", "x");
  TuneCache c(dir + "/file/tune.json");  // parent is a regular file
  try {
    c.store(entry_for(synthetic_key(0)));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::io_error);
    EXPECT_NE(std::string(e.what()).find("is not a directory"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(c.lookup(synthetic_key(0)));  // and reading it is just a miss
}

// ---------------------------------------------------------------------------------------------
// SPARSEK_TUNE

TEST_F(TuneTest, ModeFromEnvironment) {
  EXPECT_EQ(tune_mode(), TuneMode::cached);
  setenv("SPARSEK_TUNE", "", 1);
  EXPECT_EQ(tune_mode(), TuneMode::cached);
  setenv("SPARSEK_TUNE", "off", 1);
  EXPECT_EQ(tune_mode(), TuneMode::off);
  setenv("SPARSEK_TUNE", "on", 1);
  EXPECT_EQ(tune_mode(), TuneMode::on);
  setenv("SPARSEK_TUNE", "cached", 1);
  EXPECT_EQ(tune_mode(), TuneMode::cached);
  setenv("SPARSEK_TUNE", "yes", 1);
  try {
    tune_mode();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "SPARSEK_TUNE='yes' is not one of off, cached, on");
  }
  auto gc = make_case(small_dsd());
  EXPECT_THROW(gemm(gc->args), Error);  // a bad mode is loud, not ignored
  EXPECT_EQ(tune_cache_path(), path);
  unsetenv("SPARSEK_CACHE");
  const char* home = std::getenv("HOME");
  if (home) EXPECT_EQ(tune_cache_path(), std::string(home) + "/.cache/sparsek/tune.json");
}

TEST_F(TuneTest, OffIgnoresTheCacheAndCachedUsesIt) {
  auto gc = make_case(small_dsd());
  TuneCache(path).store(entry_for(key_of(gc->args), "cpu"));
  setenv("SPARSEK_TUNE", "off", 1);
  EXPECT_EQ(plan(gc->args).chosen_by(), "heuristic");
  setenv("SPARSEK_TUNE", "cached", 1);
  Plan p = plan(gc->args);
  EXPECT_EQ(p.chosen_by(), "cache");
  EXPECT_EQ(p.variant(), "cpu");
  Options forced;
  forced.variant = "cpu";
  EXPECT_EQ(plan(gc->args, forced).chosen_by(), "forced");
}

TEST_F(TuneTest, CachedMissUsesTheHeuristicAndWritesNothing) {
  auto gc = make_case(small_dsd());
  Plan p = plan(gc->args);
  EXPECT_EQ(p.chosen_by(), "heuristic");
  gemm(gc->args);
  EXPECT_FALSE(exists(path));
}

TEST_F(TuneTest, EntryNamingAnUnknownVariantFallsBack) {
  auto gc = make_case(small_dsd());
  TuneCache(path).store(entry_for(key_of(gc->args), "variant_from_a_newer_build"));
  Plan p = plan(gc->args);
  EXPECT_EQ(p.chosen_by(), "heuristic");
  EXPECT_EQ(p.variant(), "cpu");
}

TEST_F(TuneTest, OnTunesMissesStoresThemAndHitsAfterwards) {
  setenv("SPARSEK_TUNE", "on", 1);
  auto gc = make_case(small_dsd());
  Plan p = plan(gc->args);
  EXPECT_EQ(p.chosen_by(), "tuned");
  EXPECT_EQ(p.variant(), "cpu");
  TuneCache c(path);
  auto hit = c.lookup(key_of(gc->args));
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->variant, "cpu");
  EXPECT_GT(hit->time_ms, 0);
  EXPECT_EQ(plan(gc->args).chosen_by(), "cache");
  // The one-shot path with a fresh shape tunes too, and computes the right answer.
  CaseSpec s = small_dsd(2);
  s.free = 20;
  auto gc2 = make_case(s);
  const std::vector<double> ref = oracle(gc2->args);
  gemm(gc2->args);
  EXPECT_LE(max_rel_error(gc2->args, ref), tolerance(DType::f32));
  EXPECT_EQ(c.entries().size(), 2u);
}

// ---------------------------------------------------------------------------------------------
// The tuner

TEST_F(TuneTest, TunesTheCpuBackendOnItsOwnOperands) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
    SCOPED_TRACE(to_string(kind));
    CaseSpec s = small_dsd(4);
    s.kind = kind;
    s.in = DType::bf16;
    s.out = DType::f32;
    s.beta = kind == OpKind::dds ? 0.5f : 0.f;
    auto gc = make_case(s);
    // The caller's buffers must come back untouched.
    const std::vector<uint8_t> values = gc->sparse.value_bytes();
    const std::vector<uint8_t> cbytes = gc->c ? gc->c->bytes : std::vector<uint8_t>();
    TuneOptions to;
    to.seconds_per_candidate = 0.02;
    size_t calls = 0;
    to.progress = [&](size_t done, size_t total, const std::string&) {
      EXPECT_LE(done, total);
      ++calls;
    };
    TuneReport r = tune(gc->args, {}, to);
    EXPECT_EQ(r.reference, "oracle (fp64)");
    ASSERT_EQ(r.candidates.size(), 1u);
    EXPECT_EQ(r.candidates[0].variant, "cpu");
    EXPECT_TRUE(r.candidates[0].correct) << r.candidates[0].note;
    EXPECT_LE(r.candidates[0].error, 1e-3);
    EXPECT_GT(r.candidates[0].median_ms, 0);
    EXPECT_EQ(r.entry.variant, "cpu");
    EXPECT_EQ(r.entry.default_variant, "cpu");
    EXPECT_DOUBLE_EQ(r.speedup, 1.0);
    EXPECT_TRUE(r.stored) << r.store_error;
    EXPECT_EQ(calls, 2u);  // before the one candidate, and at the end
    EXPECT_EQ(gc->sparse.value_bytes(), values);
    if (gc->c) EXPECT_EQ(gc->c->bytes, cbytes);
    EXPECT_TRUE(TuneCache(path).lookup(r.entry.key));
  }
  EXPECT_EQ(TuneCache(path).entries().size(), 3u);
}

TEST_F(TuneTest, TuneRejectsBadProblemsAndCanSkipStoring) {
  auto gc = make_case(small_dsd());
  GemmArgs bad = gc->args;
  bad.b.rows += 1;
  EXPECT_THROW(tune(bad), Error);
  TuneOptions to;
  to.store = false;
  to.seconds_per_candidate = 0.01;
  TuneReport r = tune(gc->args, {}, to);
  EXPECT_FALSE(r.stored);
  EXPECT_FALSE(exists(path));
}

TEST(PickWinner, MarginCorrectnessAndFallbacks) {
  auto cand = [](const char* n, double ms, bool ok) {
    TuneCandidate c;
    c.variant = n;
    c.median_ms = ms;
    c.ran = true;
    c.correct = ok;
    return c;
  };
  using tune_detail::pick_winner;
  std::vector<TuneCandidate> v = {cand("def", 1.0, true), cand("fast", 0.985, true)};
  EXPECT_EQ(pick_winner(v, "def", 0.02)->variant, "def");  // 1.5% faster: not enough
  v[1].median_ms = 0.97;
  EXPECT_EQ(pick_winner(v, "def", 0.02)->variant, "fast");  // 3.1% faster: wins
  v[1].correct = false;
  EXPECT_EQ(pick_winner(v, "def", 0.02)->variant, "def");  // wrong results never win
  v[1].correct = true;
  v[0].correct = false;
  EXPECT_EQ(pick_winner(v, "def", 0.02)->variant, "fast");  // a broken default loses
  v[1].correct = false;
  EXPECT_EQ(pick_winner(v, "def", 0.02), nullptr);
  v = {cand("def", 1.0, true), cand("b", 0.9, true), cand("c", 0.5, true)};
  EXPECT_EQ(pick_winner(v, "def", 0.02)->variant, "c");
}

}  // namespace
}  // namespace sparsek::test
