// GPU tests of paged decode attention (sm_80+) against the fp64 oracle: ragged batches (1- and
// 16-token requests), selections (empty ones too), a request of one page, last pages not full,
// shuffled physical pages, GQA 1/4/8, D 64/128, page sizes 16..128 (48 too), bf16/f16, strided q
// and o, one KV chunk and several (the combine), NaN-poisoned outputs and poisoned cache slots;
// both variants (CUDA cores, mma.sync); bit-identical repeats; run() captured in a CUDA graph and replayed with a new page table,
// lengths and selection; malformed contents through run() (no error, no out-of-bounds read: the
// suite also runs under compute-sanitizer memcheck); device index arrays checked by validate().
// Page selection: the GPU's summaries equal the CPU backend's bit for bit, its selections the
// reference's up to near ties (and the CPU's exactly on integer data), only the new tokens' pages updated, rows past 48 KB of shared
// memory, a CUDA graph, the shared-memory limit's error, malformed contents.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "decode_util.hpp"
#include "page_select_util.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

#define SPARSEK_REQUIRE_SM80()                                                                  \
  do {                                                                                          \
    SPARSEK_REQUIRE_GPU();                                                                      \
    if (::sparsek::device_info().cc_major < 8)                                                  \
      GTEST_SKIP() << "decode needs sm_80+: " << ::sparsek::device_info().name;                 \
  } while (0)

struct Buf {
  void* p = nullptr;
  size_t n = 0;
  Buf(const void* host, size_t bytes) : n(bytes) {
    if (!n) return;
    check_cuda(cudaMalloc(&p, n), "cudaMalloc");
    upload(host);
  }
  ~Buf() {
    if (p) cudaFree(p);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void upload(const void* host) const {
    if (n) check_cuda(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void download(void* host) const {
    if (n) check_cuda(cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
};

// A DecodeCase in device memory; o and lse poisoned with NaN bytes.
struct DeviceDecode {
  std::unique_ptr<Buf> q, k, v, o, lse, pt, lens, cu, sidx, scnt;
  DecodeArgs args;
  explicit DeviceDecode(const DecodeCase& c) {
    auto up = [](const auto& vec) { return std::make_unique<Buf>(vec.data(), vec.size() * sizeof(vec[0])); };
    q = up(c.q), k = up(c.k), v = up(c.v), o = up(c.o), lse = up(c.lse);
    pt = up(c.page_table), lens = up(c.seq_lens), cu = up(c.cu), sidx = up(c.sel_idx), scnt = up(c.sel_cnt);
    args = c.args;
    args.q.data = q->p, args.k.data = k->p, args.o.data = o->p;
    args.v.data = c.v.empty() ? static_cast<void*>(static_cast<char*>(k->p) + c.v_offset * int64_t(dtype_size(c.args.k.dtype)))
                              : v->p;
    for (auto* t : {&args.q, &args.o}) t->memory = Memory::device;
    for (auto* t : {&args.k, &args.v}) t->memory = Memory::device;
    args.lse = c.lse.empty() ? nullptr : static_cast<float*>(lse->p);
    args.page_table = static_cast<const int32_t*>(pt->p);
    args.seq_lens = static_cast<const int32_t*>(lens->p);
    args.cu_seqlens_q = static_cast<const int32_t*>(cu->p);
    args.sel_indices = c.sel_cnt.empty() ? nullptr : static_cast<const int32_t*>(sidx->p);
    args.sel_counts = c.sel_cnt.empty() ? nullptr : static_cast<const int32_t*>(scnt->p);
    args.index_memory = Memory::device;
    poison();
  }
  // The index arrays of another case of the same extents.
  void upload_indices(const DecodeCase& c) {
    pt->upload(c.page_table.data());
    lens->upload(c.seq_lens.data());
    cu->upload(c.cu.data());
    sidx->upload(c.sel_idx.data());
    scnt->upload(c.sel_cnt.data());
  }
  void poison() {
    check_cuda(cudaMemset(o->p, 0xFF, o->n), "cudaMemset(o)");
    if (lse->n) check_cuda(cudaMemset(lse->p, 0xFF, lse->n), "cudaMemset(lse)");
    check_cuda(cudaDeviceSynchronize(), "poison");
  }
  void download(DecodeCase& c) const {
    check_cuda(cudaDeviceSynchronize(), "decode run");
    o->download(c.o.data());
    lse->download(c.lse.data());
  }
};

const double kTolLse = 2e-3;

// Both GPU variants: CUDA cores and mma.sync.
const char* const kVariants[] = {"cuda", "cuda_mma"};
Options variant(const char* name) {
  Options o;
  o.variant = name;
  return o;
}

// One case on the GPU, each variant, with `splits` KV chunks (0: the plan's choice), against the
// oracle.
void check(const DecodeSpec& s, int splits = 0) {
  DecodeCase c = make_decode_case(s);
  const DecodeReference ref = decode_oracle(c.args);
  DeviceDecode d(c);
  validate(d.args, true);  // the device index arrays read back and checked
  for (const char* v : kVariants) {
    SCOPED_TRACE(s.name() + " splits=" + std::to_string(splits) + " variant=" + v);
    d.poison();
    const DecodePlan p = plan(d.args, variant(v), splits);
    EXPECT_EQ(p.backend(), Backend::cuda);
    EXPECT_EQ(p.variant(), v);
    if (splits > 0) EXPECT_EQ(p.kv_splits(), std::min(splits, 64));
    run(p, d.args);
    d.download(c);
    expect_decode_matches(c, ref, decode_tol_o(s.dtype), kTolLse);
  }
}

TEST(GpuDecode, RaggedBatchesOverShapes) {
  SPARSEK_REQUIRE_SM80();
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{8, 2}, std::pair{8, 1}})
        for (int splits : {1, 3}) {
          DecodeSpec s;
          s.dtype = t, s.d = d, s.hq = hq, s.hkv = hkv;
          s.new_tokens = {1, 16, 4, 1};
          s.seq_lens = {1, 16 + 37, 200, 96};
          s.seed = uint64_t(d + hq * 10 + int(t));
          check(s, splits);
        }
}

TEST(GpuDecode, PageSizes) {
  SPARSEK_REQUIRE_SM80();
  for (int ps : {16, 32, 48, 64, 128})
    for (int splits : {1, 2, 0}) {
      DecodeSpec s;
      s.dtype = DType::bf16;
      s.page_size = ps;
      s.new_tokens = {2, 1, 16};
      s.seq_lens = {ps, 5 * ps + 3, 2 * ps - 1};
      s.seed = uint64_t(ps);
      check(s, splits);
    }
}

TEST(GpuDecode, Selections) {
  SPARSEK_REQUIRE_SM80();
  for (double frac : {0.0, 0.3, 1.0})
    for (int d : {64, 128})
      for (int splits : {1, 4}) {
        DecodeSpec s;
        s.d = d, s.hq = 8, s.hkv = 2, s.page_size = 16;
        s.new_tokens = {1, 16, 5};
        s.seq_lens = {400, 300, 17};
        s.sel_frac = frac;
        s.empty_heads = {1, 4};
        s.dtype = DType::bf16;
        s.seed = uint64_t(frac * 100 + d);
        check(s, splits);
      }
}

TEST(GpuDecode, EmptySelectionEverywhere) {
  SPARSEK_REQUIRE_SM80();
  for (int splits : {1, 3}) {
    DecodeSpec s;
    s.dtype = DType::f16;
    s.sel_frac = 0.5;
    s.hkv = 2;
    s.empty_heads = {0, 1, 2, 3, 4, 5};
    check(s, splits);
  }
}

TEST(GpuDecode, MqaLongContextStridesNotCausal) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 128, s.hq = 16, s.hkv = 1, s.page_size = 64;
  s.new_tokens = {3, 16};
  s.seq_lens = {3000, 1500};
  s.q_pad = 8;
  for (bool causal : {true, false})
    for (int splits : {1, 5, 0}) {
      s.causal = causal;
      s.scale = causal ? 0.f : 0.05f;
      check(s, splits);
    }
}

// Few new tokens in all (T - B + 1 < 16): the grid and workspace shrink to that many rows.
TEST(GpuDecode, FewNewTokens) {
  SPARSEK_REQUIRE_SM80();
  for (auto nt : {std::vector<int>{1, 1, 1, 1}, std::vector<int>{2, 2, 1}, std::vector<int>{1, 3}})
    for (int splits : {1, 4}) {
      DecodeSpec s;
      s.dtype = DType::f16, s.d = 128, s.hq = 8, s.hkv = 2, s.page_size = 16;
      s.new_tokens = nt;
      s.seq_lens.assign(nt.size(), 0);
      for (size_t i = 0; i < nt.size(); ++i) s.seq_lens[i] = int(50 + 97 * i);
      s.sel_frac = splits == 4 ? 0.5 : -1;
      check(s, splits);
    }
}

// K and V interleaved per page in one buffer ([pages, 2, page_size, Hkv, D]): page strides of
// twice a page.
TEST(GpuDecode, CombinedKvBuffer) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 128, s.hq = 8, s.hkv = 2, s.page_size = 32, s.kv_combined = true;
  s.new_tokens = {1, 16, 4};
  s.seq_lens = {200, 100, 33};
  s.sel_frac = 0.5;
  for (int splits : {1, 3}) check(s, splits);
}

TEST(GpuDecode, BitIdenticalRepeats) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 128, s.hq = 8, s.hkv = 2, s.page_size = 16;
  s.new_tokens = {16, 1, 7, 4};
  s.seq_lens = {900, 40, 333, 64};
  s.sel_frac = 0.5;
  DecodeCase c = make_decode_case(s);
  DeviceDecode d(c);
  for (const char* v : kVariants) {
    SCOPED_TRACE(v);
    const DecodePlan p = plan(d.args, variant(v), 6);
    d.poison();
    run(p, d.args);
    d.download(c);
    const std::vector<uint8_t> o1 = c.o;
    const std::vector<float> l1 = c.lse;
    for (int rep = 0; rep < 3; ++rep) {
      d.poison();
      run(p, d.args);
      d.download(c);
      EXPECT_EQ(c.o, o1) << "repeat " << rep;
      EXPECT_EQ(0, std::memcmp(c.lse.data(), l1.data(), l1.size() * 4)) << "repeat " << rep;
    }
  }
}

// run() captured once, replayed with the index arrays of another step (new page table, lengths,
// new tokens per request, selection) uploaded into the same buffers.
void graph_replay(const char* v) {
  SCOPED_TRACE(v);
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 64, s.hq = 4, s.hkv = 2, s.page_size = 32;
  s.new_tokens = {1, 4, 2};
  s.seq_lens = {300, 120, 250};
  s.sel_frac = 0.4;
  DecodeCase c = make_decode_case(s);
  DeviceDecode d(c);
  const DecodePlan p = plan(d.args, variant(v));
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  run(p, d.args, stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
  check_cuda(cudaStreamSynchronize(stream), "sync");
  d.download(c);
  expect_decode_matches(c, decode_oracle(c.args), decode_tol_o(s.dtype), kTolLse);

  // The next step: same extents (T, batch, max_pages, pages), other contents. The cache, q and
  // the new case's index arrays are uploaded; the graph's pointers stay.
  DecodeSpec s2 = s;
  s2.seed = 77;
  s2.new_tokens = {2, 1, 4};   // same T = 7
  s2.seq_lens = {290, 100, 250};  // 10 + 4 + 8 pages, as before: pages and max_pages unchanged
  DecodeCase c2 = make_decode_case(s2);
  ASSERT_EQ(c2.args.max_pages, c.args.max_pages);
  ASSERT_EQ(c2.args.k.pages, c.args.k.pages);
  d.q->upload(c2.q.data());
  d.k->upload(c2.k.data());
  d.v->upload(c2.v.data());
  d.upload_indices(c2);
  d.poison();
  check_cuda(cudaGraphLaunch(exec, stream), "graph relaunch");
  check_cuda(cudaStreamSynchronize(stream), "sync");
  d.download(c2);
  expect_decode_matches(c2, decode_oracle(c2.args), decode_tol_o(s.dtype), kTolLse);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(GpuDecode, GraphReplayWithNewPageTable) {
  SPARSEK_REQUIRE_SM80();
  for (const char* v : kVariants) graph_replay(v);
}

// Malformed contents through run() (which does not check them): no error, no read outside the
// arrays (compute-sanitizer memcheck), and validate() names the first bad entry.
TEST(GpuDecode, MalformedContents) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::f16, s.hq = 4, s.hkv = 2, s.new_tokens = {1, 4}, s.seq_lens = {70, 40}, s.sel_frac = 0.5;
  DecodeCase c = make_decode_case(s);
  DeviceDecode d(c);
  const DecodePlan p = plan(d.args, Options{}, 2);
  const DecodePlan pm = plan(d.args, variant("cuda_mma"), 2);
  c.page_table[0] = 1 << 30;
  c.seq_lens[0] = 1 << 30;
  c.sel_cnt[1] = 1 << 30;
  c.sel_idx[0] = -5;
  c.cu = {0, 30, 2};
  d.upload_indices(c);
  run(p, d.args);
  run(pm, d.args);
  check_cuda(cudaDeviceSynchronize(), "malformed run");
  try {
    validate(d.args, true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("request 0 has 30 new tokens"), std::string::npos) << e.what();
  }
}


// ---------------------------------------------------------------- page selection

// A PageSelectCase in device memory (the decode case's buffers plus summaries and the outputs).
struct DevicePageSelect {
  DeviceDecode dd;
  std::unique_ptr<Buf> sum, idx, cnt;
  PageSelectArgs args;
  explicit DevicePageSelect(const PageSelectCase& c) : dd(c.dc) {
    auto up = [](const auto& vec) { return std::make_unique<Buf>(vec.data(), vec.size() * sizeof(vec[0])); };
    sum = up(c.summaries), idx = up(c.sel_idx), cnt = up(c.sel_cnt);
    args = c.args;
    args.q = dd.args.q, args.k = dd.args.k;
    args.summaries = sum->p;
    args.page_table = dd.args.page_table, args.seq_lens = dd.args.seq_lens, args.cu_seqlens_q = dd.args.cu_seqlens_q;
    args.sel_indices = static_cast<int32_t*>(idx->p), args.sel_counts = static_cast<int32_t*>(cnt->p);
    args.index_memory = Memory::device;
  }
  void download(std::vector<uint8_t>& s, std::vector<int32_t>& i, std::vector<int32_t>& n) const {
    check_cuda(cudaDeviceSynchronize(), "page selection");
    s.resize(sum->n), i.resize(idx->n / 4), n.resize(cnt->n / 4);
    sum->download(s.data()), idx->download(i.data()), cnt->download(n.data());
  }
};

// CPU and GPU on the same case: the summaries (every page) identical; the selection within
// rounding of the reference's (the GPU sums bounds on the tensor cores, the CPU with fmas in
// ascending d), and on integer data (every sum exact) identical to the CPU's, ties included.
void check_page_select(const DecodeSpec& s, int64_t topk, int64_t sink, int64_t local, bool integers) {
  SCOPED_TRACE(s.name() + " topk=" + std::to_string(topk) + " sink=" + std::to_string(sink) + " local=" +
               std::to_string(local) + (integers ? " integers" : " reals"));
  PageSelectCase c = make_page_select_case(s, topk, sink, local, integers);
  DevicePageSelect d(c);  // poisoned copies
  c.args.all_pages = d.args.all_pages = true;
  Options cpu;
  cpu.backend = Backend::cpu;
  update_page_summaries(c.args, cpu);
  select_pages(c.args, cpu);
  update_page_summaries(d.args);
  select_pages(d.args);
  std::vector<uint8_t> sum;
  std::vector<int32_t> idx, cnt;
  d.download(sum, idx, cnt);
  EXPECT_TRUE(sum == c.summaries) << "the GPU's summaries differ from the CPU's";
  if (integers) {
    EXPECT_EQ(idx, c.sel_idx);
    EXPECT_EQ(cnt, c.sel_cnt);
  }
  expect_selection(c, idx, cnt, integers);
}

TEST(GpuPageSelect, MatchesTheCpu) {
  SPARSEK_REQUIRE_SM80();
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (auto [hq, hkv] : {std::pair{8, 2}, std::pair{8, 1}, std::pair{32, 8}})
        for (int ps : {16, 64})
          for (bool integers : {false, true}) {
            DecodeSpec s;
            s.dtype = t, s.d = d, s.hq = hq, s.hkv = hkv, s.page_size = ps, s.seed = uint64_t(d + hq + ps + int(t));
            // q's rows: packed, padded to 16 bytes (the kernel's 8-element loads), or padded by 3
            // elements (one element at a time).
            s.q_pad = ps == 16 ? 0 : d == 64 ? 3 : 8;
            s.new_tokens = {1, 16, 4, 3};
            s.seq_lens = {1, 40 * ps + 5, 9 * ps, 70 * ps - 1};
            check_page_select(s, 5, 1, 2, integers);
          }
}

TEST(GpuPageSelect, TopkSinkLocalCorners) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 128, s.hq = 4, s.hkv = 2, s.page_size = 16;
  s.new_tokens = {1, 2, 16}, s.seq_lens = {17, 300, 33 * 16};
  for (auto [topk, sink, local] : {std::tuple{0, 0, 0}, std::tuple{1, 0, 0}, std::tuple{1000, 0, 0},
                                   std::tuple{4, 3, 0}, std::tuple{4, 0, 3}, std::tuple{2, 30, 30}, std::tuple{31, 1, 1}})
    for (bool integers : {false, true}) check_page_select(s, topk, sink, local, integers);
}

TEST(GpuPageSelect, UpdateTouchesOnlyTheNewTokensPages) {
  SPARSEK_REQUIRE_SM80();
  for (int ps : {16, 32}) {
    DecodeSpec s;
    s.dtype = DType::f16, s.d = 64, s.hq = 4, s.hkv = 2, s.page_size = ps, s.seed = uint64_t(ps);
    s.new_tokens = {1, 16, 4, 1, 3}, s.seq_lens = {1, 16 * ps + 5, 9 * ps, 40 * ps - 1, 2 * ps + 2};
    PageSelectCase c = make_page_select_case(s, 2, 1, 1);
    DevicePageSelect d(c);
    update_page_summaries(d.args);
    std::vector<uint8_t> sum;
    std::vector<int32_t> idx, cnt;
    d.download(sum, idx, cnt);
    expect_summaries(c, sum, false);
  }
}

// 12,000 pages in one row: the select kernel's shared memory past 48 KB (the opt-in).
TEST(GpuPageSelect, LongRowPast48KBOfSharedMemory) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 64, s.hq = 2, s.hkv = 1, s.page_size = 16, s.extra_pages = 1;
  s.new_tokens = {2}, s.seq_lens = {12000 * 16 - 3};
  for (bool integers : {false, true}) check_page_select(s, 500, 4, 8, integers);  // integers: thousands of ties
}

TEST(GpuPageSelect, CapturedInACudaGraph) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 128, s.hq = 8, s.hkv = 2, s.page_size = 32, s.new_tokens = {1, 4}, s.seq_lens = {900, 77};
  PageSelectCase c = make_page_select_case(s, 4, 1, 1, true);  // integers: the GPU's selection is the CPU's
  DevicePageSelect d(c);
  Options cpu;
  cpu.backend = Backend::cpu;
  c.args.all_pages = true;  // every page's summary, given to the GPU: its graph updates only the new tokens' pages
  update_page_summaries(c.args, cpu);
  select_pages(c.args, cpu);
  d.sum->upload(c.summaries.data());
  cudaStream_t stream;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  Options o;
  o.stream = stream;
  o.check_indices = false;
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  update_page_summaries(d.args, o);
  select_pages(d.args, o);
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check_cuda(cudaGraphLaunch(exec, stream), "launch");
  check_cuda(cudaStreamSynchronize(stream), "sync");
  std::vector<uint8_t> sum;
  std::vector<int32_t> idx, cnt;
  d.download(sum, idx, cnt);
  EXPECT_TRUE(sum == c.summaries);
  EXPECT_EQ(idx, c.sel_idx);
  EXPECT_EQ(cnt, c.sel_cnt);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(GpuPageSelect, TooManyPagesForSharedMemoryIsNamed) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::bf16, s.d = 128, s.hq = 2, s.hkv = 1, s.new_tokens = {1}, s.seq_lens = {40};
  PageSelectCase c = make_page_select_case(s, 1, 1, 1);
  DevicePageSelect d(c);
  const std::vector<int32_t> table(60000, 0);
  const Buf big(table.data(), table.size() * 4);
  d.args.max_pages = 60000;  // the kernel keeps a row's scores in shared memory
  d.args.page_table = static_cast<const int32_t*>(big.p);
  Options o;
  o.check_indices = false;
  try {
    select_pages(d.args, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_NE(std::string(e.what()).find("select_pages: max_pages = 60000 needs"), std::string::npos) << e.what();
  }
}

// Malformed contents without checks: no error, nothing read or written outside the arrays
// (compute-sanitizer memcheck), counts in range.
TEST(GpuPageSelect, MalformedContents) {
  SPARSEK_REQUIRE_SM80();
  DecodeSpec s;
  s.dtype = DType::f16, s.d = 64, s.hq = 4, s.hkv = 2, s.page_size = 16, s.new_tokens = {1, 4}, s.seq_lens = {70, 40};
  PageSelectCase c = make_page_select_case(s, 2, 1, 1);
  DevicePageSelect d(c);
  c.dc.page_table[0] = 1 << 30;
  c.dc.page_table[1] = -3;
  c.dc.seq_lens[0] = 1 << 30;
  c.dc.cu = {0, 30, 2};
  d.dd.upload_indices(c.dc);
  Options o;
  o.check_indices = false;
  d.args.all_pages = true;
  update_page_summaries(d.args, o);
  select_pages(d.args, o);
  std::vector<uint8_t> sum;
  std::vector<int32_t> idx, cnt;
  d.download(sum, idx, cnt);
  for (int32_t n : cnt) EXPECT_TRUE(n >= 0 && n <= d.args.sel_kmax) << n;
}

}  // namespace
}  // namespace sparsek::test
