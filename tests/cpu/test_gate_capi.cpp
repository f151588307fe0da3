// The top-k block gate on the CPU: scratch sized by the extents of broadcast tensors (and refused by
// name beyond the machine's memory), and the C API (runs, errors, packed sequences). The selection
// rules themselves: test_gate.cpp.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gate_test_util.hpp"
#include "plan/gate_internal.hpp"
#include "sparsek/sparsek.h"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

using V = std::vector<int32_t>;

// ---- scratch sized by the extents of broadcast tensors ----

// A [1, 1, s, 64] f32 view of one row of 64 floats (stride 0 along s: every position reads it).
Tensor4View broadcast_row(std::vector<float>& row, int64_t s) {
  row.assign(64, 0.5f);
  Tensor4View t = Tensor4View::packed(row.data(), DType::f32, Memory::host, 1, 1, s, 64);
  t.stride_s = 0;
  return t;
}

// Lowers the soft address-space limit to what the process maps now plus `extra` bytes, for the
// object's lifetime: an allocation beyond that fails at once (without touching the machine's memory).
class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(uint64_t extra) {
    ok_ = ::getrlimit(RLIMIT_AS, &old_) == 0;
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    ok_ = ok_ && pages > 0;
    if (!ok_) return;
    rlimit cap = old_;
    cap.rlim_cur = rlim_t(uint64_t(pages) * uint64_t(::sysconf(_SC_PAGESIZE)) + extra);
    if (old_.rlim_max != RLIM_INFINITY && cap.rlim_cur > old_.rlim_max) cap.rlim_cur = old_.rlim_max;
    ok_ = ::setrlimit(RLIMIT_AS, &cap) == 0;
  }
  ~AddressSpaceCap() {
    if (ok_) ::setrlimit(RLIMIT_AS, &old_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
};

TEST(Gate, ScratchDoesNotGrowWithTheQuerySequence) {
  // q broadcast over 2^27 rows (2^21 query blocks of 64) and no key: the output is 2^21 counts
  // (8 MiB); a gate that kept every pooled query block (2^21 x 64 doubles, 1 GiB) would not fit
  // under a cap of 256 MiB above what the process maps now.
  std::vector<float> qrow, krow;
  GateArgs a;
  a.q = broadcast_row(qrow, int64_t(1) << 27);
  a.k = broadcast_row(krow, 0);
  a.block = 64;
  a.topk = 2;
  std::vector<int32_t> num(size_t(1) << 21, kPoisonIndex);
  a.kv_num_blocks = num.data();
  AddressSpaceCap cap(256ull << 20);
  if (!cap.ok()) GTEST_SKIP() << "cannot lower RLIMIT_AS here";
  try {
    gate(a);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  EXPECT_EQ(num.front(), 0);
  EXPECT_EQ(num.back(), 0);
}

TEST(Gate, KeyScratchBeyondThisMachinesMemoryIsRefusedByName) {
  // k broadcast over 2^40 rows: 2^34 key blocks, whose pooled keys (2^34 x 64 doubles, 8 TiB) no
  // machine holds. A named error, not an allocation that fails (or aborts under a sanitizer).
  std::vector<float> qrow, krow;
  GateArgs a;
  a.q = broadcast_row(qrow, 64);
  a.k = broadcast_row(krow, int64_t(1) << 40);
  a.block = 64;
  a.topk = 2;
  a.kmax = 4;
  // One buffer: the outputs (num, then idx) below the given scores, whose 2^40-score row spans far
  // past them: no output can overlap that input wherever the heap puts the buffer.
  std::vector<int32_t> buf(6, kPoisonIndex);
  a.kv_num_blocks = buf.data();
  a.kv_indices = buf.data() + 1;
  expect_invalid([&] { gate(a); }, {"k.s = 1099511627776", "17179869184 key blocks", "more than this machine's memory"});
  EXPECT_EQ(buf[0], kPoisonIndex);
  a.k = broadcast_row(krow, int64_t(1) << 46);  // given scores: still a row of Nk (2^40) scores
  a.given_scores = reinterpret_cast<float*>(buf.data() + 5);
  expect_invalid([&] { gate(a); }, {"k.s = 70368744177664", "scratch"});
}

// ---- the C API ----

sparsek_tensor4 c_tensor(const Tensor4View& v) {
  sparsek_tensor4 t{};
  t.data = v.data;
  t.dtype = sparsek_dtype(int(v.dtype));
  t.memory = sparsek_memory(int(v.memory));
  t.b = v.b, t.h = v.h, t.s = v.s, t.d = v.d;
  t.stride_b = v.stride_b, t.stride_h = v.stride_h, t.stride_s = v.stride_s;
  return t;
}

// The C struct of host gate args (as the C API's caller would fill it).
sparsek_gate_args c_gate_args(const GateArgs& a) {
  sparsek_gate_args g{};
  g.q = c_tensor(a.q);
  g.k = c_tensor(a.k);
  g.topk = a.topk, g.block = a.block, g.causal = a.causal ? 1 : 0, g.sink = a.sink, g.local = a.local;
  g.scale = a.scale;
  g.kv_num_blocks = a.kv_num_blocks;
  g.kv_indices = a.kv_indices;
  g.kmax = a.kmax;
  g.scores = a.scores;
  g.cu_seqlens = a.cu_seqlens;
  g.num_seqs = a.num_seqs;
  return g;
}

TEST(GateCApi, RunsAndReportsErrors) {
  GateCase c(hand_spec());
  set_blocks(c, {1, 1, -1, 1, 1, 1, 1, 1}, kC);
  const GateArgs& a = c.host_args();
  sparsek_gate_args g = c_gate_args(a);
  uint64_t bytes = 99;
  ASSERT_EQ(sparsek_gate_workspace_bytes(&g, &bytes), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(bytes, 0u);
  ASSERT_EQ(sparsek_gate(&g, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(c.chosen(0, 0, 2), (V{0, 2, 4, 6}));
  // Candidates through the C struct.
  std::vector<int32_t> num(8, 1), idx(8, 6);
  sparsek_attention_layout cand{};
  cand.kv_num_blocks = num.data();
  cand.kv_indices = idx.data();
  cand.batch = cand.heads = 1;
  cand.q_blocks = 8;
  cand.kmax = 1;
  cand.block_q = cand.block_kv = 64;
  cand.memory = SPARSEK_HOST;
  g.candidates = &cand;
  ASSERT_EQ(sparsek_gate(&g, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(c.chosen(0, 0, 2), (V{6}));
  // Errors: a status and a message naming the argument.
  g.block = 48;
  EXPECT_EQ(sparsek_gate(&g, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("sparsek_gate: block = 48 is not 64 or 128"), std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_gate_workspace_bytes(&g, &bytes), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(sparsek_gate(nullptr, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("'args'"), std::string::npos);
  EXPECT_EQ(sparsek_gate_workspace_bytes(&g, nullptr), SPARSEK_INVALID_ARGUMENT);
  g.block = 64;
  g.causal = 2;
  EXPECT_EQ(sparsek_gate(&g, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("causal = 2 is not 0 or 1"), std::string::npos)
      << sparsek_last_error();
  g.causal = 0;
  int bad_dtype = 9;
  std::memcpy(&g.q.dtype, &bad_dtype, sizeof(int));
  EXPECT_EQ(sparsek_gate(&g, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("q.dtype = 9 is not f32 (0), f16 (1) or bf16 (2)"),
            std::string::npos)
      << sparsek_last_error();
  // An out-of-range memory of the candidates is reported as its number.
  std::memcpy(&g.q.dtype, &a.q.dtype, sizeof(int));
  int bad_memory = 3;
  std::memcpy(&cand.memory, &bad_memory, sizeof(int));
  EXPECT_EQ(sparsek_gate(&g, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("candidates.memory = 3 is not host (0) or device (1)"),
            std::string::npos)
      << sparsek_last_error();
}

TEST(GateCApi, ScratchBeyondThisMachinesMemoryIsANamedError) {
  std::vector<float> qrow, krow;
  GateArgs a;
  a.q = broadcast_row(qrow, 64);
  a.k = broadcast_row(krow, int64_t(1) << 40);
  sparsek_gate_args g{};
  g.q = c_tensor(a.q);
  g.k = c_tensor(a.k);
  g.topk = 2, g.block = 64, g.sink = 1, g.local = 1;
  std::vector<int32_t> num(1), idx(4);
  g.kv_num_blocks = num.data();
  g.kv_indices = idx.data();
  g.kmax = 4;
  EXPECT_EQ(sparsek_gate(&g, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("sparsek_gate: k.s = 1099511627776"), std::string::npos)
      << sparsek_last_error();
}

TEST(GateCApi, PackedSequences) {
  PackedGateCase p;
  GateCase& c = p.c;
  // The C struct gives the C++ call's selection, and names the error.
  c.run_host();
  const std::vector<int32_t> want_num = c.num, want_idx = c.idx;
  const GateArgs& a = c.host_args();
  sparsek_gate_args g = c_gate_args(a);
  g.scores = nullptr;
  ASSERT_EQ(sparsek_gate(&g, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(c.num, want_num);
  EXPECT_EQ(c.idx, want_idx);
  g.num_seqs = 0;
  EXPECT_EQ(sparsek_gate(&g, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("num_seqs = 0 with cu_seqlens given"), std::string::npos)
      << sparsek_last_error();
}

}  // namespace
}  // namespace sparsek::test
