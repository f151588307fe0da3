// The GPU top-k block gate against the CPU reference (pooled means and scores in double): the
// same problem runs on the host and on the device (outputs poisoned first), and the layouts must
// match. Data with well-separated scores must give identical layouts. Plain uniform random data,
// and rows of 8192 blocks (scores closer than bf16 inputs can separate), may swap blocks whose
// reference scores tie within 1e-4 of the row's largest score (f32 and double order such near
// ties differently); any other difference fails. Scores must agree within 1e-4 of the row's
// largest. Also: given scores (exact), device candidate layouts (clamped, bad entries ignored),
// unaligned rows, CUDA-graph capture, repeated runs bit-identical, and the device-side errors.
#include <cuda_runtime.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gate_test_util.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  DevMem() = default;
  explicit DevMem(size_t n) : bytes(n) {
    if (cudaMalloc(&p, std::max<size_t>(n, 16)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  DevMem(const void* host, size_t n) : DevMem(n) {
    if (n && cudaMemcpy(p, host, n, cudaMemcpyHostToDevice) != cudaSuccess) throw std::runtime_error("cudaMemcpy failed");
  }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(DevMem&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

// The device twin of a host GateCase: q and k uploaded, outputs and workspace on the device.
struct DeviceGate {
  DevMem q, k, num, idx, scores, ws;
  GateArgs args;
  std::vector<int32_t> num_h, idx_h;
  std::vector<float> scores_h;
  explicit DeviceGate(GateCase& c)
      : q(c.q.bytes.data(), c.q.bytes.size()),
        k(c.k.bytes.data(), c.k.bytes.size()),
        num(c.num.size() * 4),
        idx(c.idx.size() * 4),
        scores(c.scores.size() * 4) {
    args = c.args;
    args.q.data = q.p;
    args.k.data = k.p;
    args.q.memory = args.k.memory = Memory::device;
    args.kv_num_blocks = num.as<int32_t>();
    args.kv_indices = idx.as<int32_t>();
    args.scores = c.scores.empty() ? nullptr : scores.as<float>();
    args.workspace_bytes = gate_workspace_bytes(args);
    ws = DevMem(args.workspace_bytes);
    args.workspace = ws.p;
    num_h.resize(c.num.size());
    idx_h.resize(c.idx.size());
    scores_h.resize(c.scores.size());
  }
  void poison() {
    ASSERT_EQ(cudaMemset(num.p, 0x5a, num.bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(idx.p, 0x5a, idx.bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(scores.p, 0xff, scores.bytes), cudaSuccess);  // NaN
    // The memsets run on the legacy stream, which a non-blocking stream does not wait for.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void download() {
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(num_h.data(), num.p, num.bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(idx_h.data(), idx.p, idx.bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(scores_h.data(), scores.p, scores.bytes, cudaMemcpyDeviceToHost));
  }
  void run(const Options& o = {}) {
    poison();
    gate(args, o);
    download();
  }
};

// Scores far apart: q rows a_i * u (+ noise), k rows c_j * u (+ noise), the c_j a shuffled ramp,
// so scores of a row are ~|a_i| |u|^2 / Nk apart, far more than f32 rounding moves them.
void fill_separated(GateCase& c, uint64_t seed) {
  const GateSpec& s = c.spec;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> u(size_t(s.D));
  for (float& x : u) x = uni(rng);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t g = 0; g < s.Hkv; ++g) {
      std::vector<int> perm(size_t(c.Nk));
      std::iota(perm.begin(), perm.end(), 1);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t r = 0; r < s.Skv; ++r) {
        const float cj = float(perm[size_t(r / s.block)]) / float(c.Nk);
        for (int64_t d = 0; d < s.D; ++d) c.k.set(b, g, r, d, cj * u[size_t(d)] + 0.01f * uni(rng));
      }
    }
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < c.Mq; ++i) {
        const float a = (i % 3 == 1 ? -1.f : 1.f) * (0.5f + 0.5f * float((i * 7 + h) % 5) / 5.f);
        for (int64_t r = i * s.block; r < std::min(s.Sq, (i + 1) * s.block); ++r)
          for (int64_t d = 0; d < s.D; ++d) c.q.set(b, h, r, d, a * u[size_t(d)] + 0.01f * uni(rng));
      }
  }
}

std::string describe(const GateSpec& s) {
  return "B=" + std::to_string(s.B) + " Hq=" + std::to_string(s.Hq) + " Hkv=" + std::to_string(s.Hkv) +
         " Sq=" + std::to_string(s.Sq) + " Skv=" + std::to_string(s.Skv) + " D=" + std::to_string(s.D) + " " +
         to_string(s.dtype) + " block=" + std::to_string(s.block) + " topk=" + std::to_string(s.topk) +
         " sink=" + std::to_string(s.sink) + " local=" + std::to_string(s.local) + (s.causal ? " causal" : "") +
         (s.bshd ? " bshd" : "") + (s.pad ? " pad=" + std::to_string(s.pad) : "");
}

std::vector<GateSpec> shapes() {
  std::vector<GateSpec> v;
  for (int D : {64, 128})
    for (int block : {64, 128})
      for (DType t : {DType::bf16, DType::f16}) {
        GateSpec s;
        s.D = D;
        s.block = block;
        s.dtype = t;
        s.Sq = s.Skv = 16 * block;
        s.topk = 3;
        v.push_back(s);
      }
  GateSpec s;
  s.dtype = DType::bf16;
  s.D = 128;
  s.block = 128;
  // GQA 8 / 2, causal, tails, batch 2.
  s.B = 2, s.Hq = 8, s.Hkv = 2, s.Sq = 1000, s.Skv = 1000, s.topk = 2, s.causal = true;
  v.push_back(s);
  // More key blocks than query blocks, wider sink/local, larger kmax, keys [b, s, h, d].
  s = GateSpec();
  s.dtype = DType::f16, s.D = 64, s.block = 64, s.Hq = s.Hkv = 3, s.Sq = 333, s.Skv = 64 * 50 + 7;
  s.topk = 5, s.sink = 2, s.local = 3, s.extra_kmax = 4, s.bshd = true;
  v.push_back(s);
  // Rows not 16-byte aligned (element loads), MQA, more query blocks than key blocks.
  s = GateSpec();
  s.dtype = DType::bf16, s.D = 64, s.block = 128, s.Hq = 4, s.Hkv = 1, s.Sq = 900, s.Skv = 300, s.pad = 1;
  v.push_back(s);
  // One query block (decode), topk past the row length, no sink.
  s = GateSpec();
  s.dtype = DType::bf16, s.D = 128, s.block = 64, s.Sq = 1, s.Skv = 640, s.topk = 20, s.sink = 0;
  v.push_back(s);
  // 33 query blocks (three CTAs, the last one short), topk 0.
  s = GateSpec();
  s.dtype = DType::f16, s.D = 128, s.block = 64, s.Sq = 33 * 64, s.Skv = 40 * 64, s.topk = 0, s.local = 2;
  v.push_back(s);
  return v;
}

TEST(GateGpu, SeparatedScoresGiveIdenticalLayouts) {
  SPARSEK_REQUIRE_GPU();
  for (const GateSpec& s : shapes()) {
    SCOPED_TRACE(describe(s));
    GateCase c(s);
    fill_separated(c, 7);
    c.run_host();
    DeviceGate d(c);
    d.run();
    expect_well_formed(c, d.num_h, d.idx_h);
    expect_same_selection(c, d.num_h, d.idx_h, d.scores_h, 0.0, 1e-4);
  }
}

TEST(GateGpu, RandomDataMatchesUpToNearTies) {
  SPARSEK_REQUIRE_GPU();
  int64_t swapped_rows = 0, rows = 0;
  for (const GateSpec& s : shapes()) {
    SCOPED_TRACE(describe(s));
    GateCase c(s);
    c.q.fill_random(11);
    c.k.fill_random(12);
    c.run_host();
    DeviceGate d(c);
    d.run();
    expect_well_formed(c, d.num_h, d.idx_h);
    int64_t swapped = 0;
    expect_same_selection(c, d.num_h, d.idx_h, d.scores_h, 1e-4, 1e-4, &swapped);
    swapped_rows += swapped;
    rows += int64_t(c.num.size());
  }
  std::printf("[ info     ] %lld of %lld rows differ only by near-tie swaps\n", (long long)swapped_rows,
              (long long)rows);
}

// Packed sequences (boundaries inside blocks, an empty sequence): the GPU selects what the CPU does.
TEST(GateGpu, PackedSequencesMatchTheCpu) {
  SPARSEK_REQUIRE_GPU();
  for (bool causal : {false, true})
    for (int block : {64, 128}) {
      GateSpec s;
      s.dtype = DType::bf16, s.D = 128, s.block = block, s.Hq = 8, s.Hkv = 2, s.topk = 3, s.sink = 1, s.local = 2;
      s.causal = causal;
      s.Sq = s.Skv = 3000;
      SCOPED_TRACE(describe(s));
      GateCase c(s);
      fill_separated(c, 9);
      std::vector<int32_t> cu = {0, 700, 700, 701, 1900, 3000};
      c.args.cu_seqlens = cu.data();
      c.args.num_seqs = 5;
      c.run_host();
      DeviceGate d(c);
      DevMem dcu(cu.data(), cu.size() * 4);
      d.args.cu_seqlens = dcu.as<int32_t>();
      d.run();
      expect_well_formed(c, d.num_h, d.idx_h);
      expect_same_selection(c, d.num_h, d.idx_h, d.scores_h, 0.0, 1e-4);
    }
}

TEST(GateGpu, LongRowsNk8192) {
  SPARSEK_REQUIRE_GPU();
  // 8192 key blocks of 64 (524288 keys), 3 query blocks: one CTA per row, the row's scores in
  // 32 KB of shared memory (more than the default 48 KB in all).
  GateSpec s;
  s.dtype = DType::bf16, s.D = 64, s.block = 64, s.Sq = 3 * 64 - 5, s.Skv = 8192 * 64, s.topk = 1000, s.sink = 4;
  GateCase c(s);
  fill_separated(c, 3);
  c.run_host();
  DeviceGate d(c);
  d.run();
  // 8192 scores per row are ~1/8192 of the row's range apart, as close as bf16 inputs place them:
  // near ties are allowed here.
  expect_well_formed(c, d.num_h, d.idx_h);
  expect_same_selection(c, d.num_h, d.idx_h, d.scores_h, 1e-4, 1e-4);
  // Causal on the same long rows.
  c.args.causal = true;
  c.run_host();
  d.args.causal = true;
  d.run();
  expect_same_selection(c, d.num_h, d.idx_h, d.scores_h, 1e-4, 1e-4);
}

TEST(GateGpu, GivenScoresSelectExactly) {
  SPARSEK_REQUIRE_GPU();
  GateSpec s;
  s.dtype = DType::bf16, s.D = 64, s.block = 64, s.B = 2, s.Hq = 4, s.Hkv = 2, s.Sq = 40 * 64, s.Skv = 300 * 64;
  s.topk = 17;
  s.causal = true;
  GateCase c(s);
  // Many exact ties (few distinct values), -inf, NaN, -0 and +0.
  std::vector<float> given(size_t(s.B * s.Hkv * c.Mq * c.Nk));
  std::mt19937_64 rng(5);
  const float specials[] = {-INFINITY, std::nanf(""), -0.f, 0.f, INFINITY};
  for (float& x : given) {
    const uint64_t r = rng() % 100;
    x = r < 5 ? specials[r] : float(int64_t(rng() % 9) - 4);
  }
  c.args.given_scores = given.data();
  c.run_host();
  DeviceGate d(c);
  DevMem dg(given.data(), given.size() * 4);
  d.args.given_scores = dg.as<float>();
  d.args.q.data = d.args.k.data = nullptr;  // shapes only
  d.args.workspace_bytes = gate_workspace_bytes(d.args);
  EXPECT_EQ(d.args.workspace_bytes, 0u);
  d.run();
  EXPECT_EQ(d.num_h, c.num);
  EXPECT_EQ(d.idx_h, c.idx);
  ASSERT_EQ(d.scores_h.size(), c.scores.size());
  EXPECT_EQ(std::memcmp(d.scores_h.data(), c.scores.data(), c.scores.size() * 4), 0) << "scores differ in bits";
}

TEST(GateGpu, DeviceCandidatesAreClampedAndFiltered) {
  SPARSEK_REQUIRE_GPU();
  GateSpec s;
  s.dtype = DType::f16, s.D = 128, s.block = 128, s.B = 2, s.Hq = 6, s.Hkv = 2, s.Sq = 12 * 128, s.Skv = 20 * 128 - 3;
  s.topk = 3;
  GateCase c(s);
  fill_separated(c, 9);
  // Candidates per query head (heads = Hq: the group's union), batch broadcast, partial and full
  // lists; the device copy also holds out-of-range counts and indices the kernel must ignore.
  const int64_t H = s.Hq, kmax = 6, rows = H * c.Mq;
  std::vector<int32_t> num(static_cast<size_t>(rows)), idx(static_cast<size_t>(rows * kmax), 0),
      fnum(static_cast<size_t>(rows)), fidx(static_cast<size_t>(rows), 0);
  std::vector<int32_t> dnum, didx, dfnum;  // the device lists
  std::mt19937_64 rng(4);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> all(size_t(c.Nk));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    num[size_t(r)] = int32_t(rng() % (kmax + 1));
    std::sort(all.begin(), all.begin() + num[size_t(r)]);
    std::copy(all.begin(), all.begin() + num[size_t(r)], idx.begin() + r * kmax);
    fnum[size_t(r)] = int32_t(rng() % 2);
    fidx[size_t(r)] = all[size_t(kmax)];
  }
  dnum = num, didx = idx, dfnum = fnum;
  // Device-only junk, and the host twin of what the kernel must make of it: a count past kmax
  // (clamped to kmax) whose entries are one valid block and out-of-range indices (ignored); a
  // negative full count (nothing).
  for (int64_t r = 0; r < rows; r += 5) {
    const int32_t valid = int32_t(r % c.Nk);
    dnum[size_t(r)] = int32_t(kmax + 100);
    didx[size_t(r * kmax)] = valid;
    for (int64_t e = 1; e < kmax; ++e) didx[size_t(r * kmax + e)] = e % 2 ? int32_t(c.Nk + e) : -1 - int32_t(e);
    num[size_t(r)] = 1;
    idx[size_t(r * kmax)] = valid;
  }
  for (int64_t r = 2; r < rows; r += 7) dfnum[size_t(r)] = -3, fnum[size_t(r)] = 0;
  const AttentionLayout host = candidate_layout(num, idx, kmax, H, c.Mq, 128, &fnum, &fidx, 1);
  c.args.candidates = &host;
  c.run_host();
  DevMem d_num(dnum.data(), dnum.size() * 4), d_idx(didx.data(), didx.size() * 4),
      d_fnum(dfnum.data(), dfnum.size() * 4), d_fidx(fidx.data(), fidx.size() * 4);
  AttentionLayout dev = host;
  dev.kv_num_blocks = d_num.as<int32_t>();
  dev.kv_indices = d_idx.as<int32_t>();
  dev.full_kv_num_blocks = d_fnum.as<int32_t>();
  dev.full_kv_indices = d_fidx.as<int32_t>();
  dev.memory = Memory::device;
  DeviceGate d(c);
  d.args.candidates = &dev;
  d.run();
  expect_well_formed(c, d.num_h, d.idx_h);
  expect_same_selection(c, d.num_h, d.idx_h, d.scores_h, 0.0, 1e-4);
}

TEST(GateGpu, RepeatedRunsAreBitIdenticalAndStreamOrdered) {
  SPARSEK_REQUIRE_GPU();
  GateSpec s;
  s.dtype = DType::bf16, s.D = 128, s.block = 128, s.Hq = 4, s.Hkv = 2, s.Sq = s.Skv = 2048 + 64, s.topk = 4;
  GateCase c(s);
  c.q.fill_random(21);
  c.k.fill_random(22);
  DeviceGate d(c);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Options o;
  o.stream = st;
  d.run(o);
  const std::vector<int32_t> num = d.num_h, idx = d.idx_h;
  const std::vector<float> sc = d.scores_h;
  for (int rep = 0; rep < 3; ++rep) {
    d.run(o);
    EXPECT_EQ(d.num_h, num);
    EXPECT_EQ(d.idx_h, idx);
    EXPECT_EQ(std::memcmp(d.scores_h.data(), sc.data(), sc.size() * 4), 0);
  }
  CUDA_OK(cudaStreamDestroy(st));
}

TEST(GateGpu, CapturedInACudaGraph) {
  SPARSEK_REQUIRE_GPU();
  GateSpec s;
  s.dtype = DType::f16, s.D = 64, s.block = 64, s.Hq = 2, s.Hkv = 1, s.Sq = 20 * 64, s.Skv = 30 * 64, s.topk = 4;
  GateCase c(s);
  fill_separated(c, 31);
  DeviceGate d(c);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Options o;
  o.stream = st;
  d.poison();
  CUDA_OK(cudaDeviceSynchronize());
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  gate(d.args, o);  // must neither allocate nor synchronize
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t seed : {41, 42}) {
    fill_separated(c, seed);  // new values in the same device buffers
    CUDA_OK(cudaMemcpy(d.q.p, c.q.bytes.data(), c.q.bytes.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d.k.p, c.k.bytes.data(), c.k.bytes.size(), cudaMemcpyHostToDevice));
    d.poison();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    d.download();
    c.run_host();
    expect_same_selection(c, d.num_h, d.idx_h, d.scores_h, 0.0, 1e-4);
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(st));
}

TEST(GateGpu, EmptyProblems) {
  SPARSEK_REQUIRE_GPU();
  GateSpec s;
  s.dtype = DType::bf16;
  s.Skv = 0;  // no key blocks: zero counts
  GateCase c(s);
  DeviceGate d(c);
  d.run();
  for (int32_t n : d.num_h) EXPECT_EQ(n, 0);
  s.Skv = 256;
  s.Sq = 0;  // nothing to write
  GateCase z(s);
  DeviceGate dz(z);
  dz.run();
}

TEST(GateGpu, DeviceErrorsNameTheArgument) {
  SPARSEK_REQUIRE_GPU();
  GateSpec s;
  s.dtype = DType::bf16;
  GateCase c(s);
  DeviceGate d(c);
  GateArgs a = d.args;
  a.workspace = nullptr;
  expect_invalid([&] { gate(a); }, {"workspace is null"});
  a = d.args;
  a.workspace_bytes -= 16;
  expect_invalid([&] { gate(a); }, {"workspace_bytes = ", "is less than gate_workspace_bytes() = "});
  a = d.args;
  a.workspace = static_cast<char*>(a.workspace) + 4;
  expect_invalid([&] { gate(a); }, {"workspace is not 16-byte aligned"});
  a = d.args;
  a.scores = static_cast<float*>(a.workspace);
  expect_invalid([&] { gate(a); }, {"workspace overlaps scores"});
  a = d.args;
  a.q.dtype = a.k.dtype = DType::f32;
  try {
    gate(a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported) << e.what();
  }
  a = d.args;
  Options o;
  o.backend = Backend::cpu;
  expect_invalid([&] { gate(a, o); }, {"options.backend = cpu needs host memory, but q and k are in device memory"});
}

}  // namespace
}  // namespace sparsek::test
