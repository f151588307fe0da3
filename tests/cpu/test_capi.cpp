// The C API: statuses, thread-local last-error text naming the argument, success clearing it,
// version and feature queries, and products that match the oracle.
#include <cstddef>
#include <cstring>
#include <regex>
#include <string>
#include <thread>

#include "sparsek/sparsek.h"
#include "test_util.hpp"

// The C structs the Rust crate declares too (rust/sparsek-sys/tests/ffi.rs asserts the same
// offsets and sizes on its side): a field moved on either side fails a build or a test.
#define SPARSEK_RUST_LAYOUT(T, f, off) static_assert(offsetof(T, f) == (off), #T "." #f ": keep rust/sparsek-sys in step")
#define SPARSEK_RUST_SIZE(T, n) static_assert(sizeof(T) == (n), #T ": keep rust/sparsek-sys in step")
SPARSEK_RUST_SIZE(sparsek_tokens, 56);
SPARSEK_RUST_LAYOUT(sparsek_tokens, data, 0);
SPARSEK_RUST_LAYOUT(sparsek_tokens, dtype, 8);
SPARSEK_RUST_LAYOUT(sparsek_tokens, memory, 12);
SPARSEK_RUST_LAYOUT(sparsek_tokens, t, 16);
SPARSEK_RUST_LAYOUT(sparsek_tokens, h, 24);
SPARSEK_RUST_LAYOUT(sparsek_tokens, d, 32);
SPARSEK_RUST_LAYOUT(sparsek_tokens, stride_t, 40);
SPARSEK_RUST_LAYOUT(sparsek_tokens, stride_h, 48);
SPARSEK_RUST_SIZE(sparsek_paged_cache, 72);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, data, 0);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, dtype, 8);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, memory, 12);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, pages, 16);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, page_size, 24);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, h, 32);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, d, 40);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, stride_page, 48);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, stride_slot, 56);
SPARSEK_RUST_LAYOUT(sparsek_paged_cache, stride_h, 64);
SPARSEK_RUST_SIZE(sparsek_gate_args, 248);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, q, 0);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, k, 72);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, topk, 144);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, block, 148);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, causal, 152);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, sink, 156);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, local, 160);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, scale, 164);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, candidates, 168);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, given_scores, 176);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, kv_num_blocks, 184);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, kv_indices, 192);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, kmax, 200);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, scores, 208);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, workspace, 216);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, workspace_bytes, 224);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, cu_seqlens, 232);
SPARSEK_RUST_LAYOUT(sparsek_gate_args, num_seqs, 240);
SPARSEK_RUST_SIZE(sparsek_decode_args, 344);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, q, 0);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, k, 56);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, v, 128);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, o, 200);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, lse, 256);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, page_table, 264);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, seq_lens, 272);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, cu_seqlens_q, 280);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, sel_indices, 288);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, sel_counts, 296);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, batch, 304);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, max_pages, 312);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, sel_kmax, 320);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, index_memory, 328);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, causal_new, 332);
SPARSEK_RUST_LAYOUT(sparsek_decode_args, scale, 336);
SPARSEK_RUST_SIZE(sparsek_page_select_args, 240);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, q, 0);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, k, 56);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, summaries, 128);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, page_table, 136);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, seq_lens, 144);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, cu_seqlens_q, 152);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, batch, 160);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, max_pages, 168);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, index_memory, 176);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, sel_indices, 184);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, sel_counts, 192);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, sel_kmax, 200);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, topk, 208);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, sink, 216);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, local, 224);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, all_pages, 232);
SPARSEK_RUST_LAYOUT(sparsek_page_select_args, skip_index_check, 236);
#undef SPARSEK_RUST_LAYOUT
#undef SPARSEK_RUST_SIZE

namespace sparsek::test {
namespace {

// What a C caller passing an arbitrary int in an enum parameter hands over. (Passing it on by value
// from C++ still loads an out-of-range enum, which UBSan reports here in the test; the library
// itself reads such parameters as integers.)
template <class E>
E raw_enum(int v) {
  E e;
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
  std::memcpy(&e, &v, sizeof(e));
  return e;
}

std::string last() { return sparsek_last_error(); }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

CaseSpec small(OpKind kind, Op op = Op::none) {
  CaseSpec s;
  s.kind = kind;
  s.op = op;
  s.bm = 16;
  s.bk = 32;
  s.rows = 64;
  s.cols = 96;
  s.free = 20;
  s.integers = true;
  s.beta = 0.f;
  return s;
}

TEST(CApi, VersionMatchesCppAndIsSemver) {
  const std::string v = sparsek_version();
  EXPECT_EQ(v, std::string(sparsek::version()));
  EXPECT_TRUE(std::regex_match(v, std::regex("[0-9]+\\.[0-9]+\\.[0-9]+"))) << v;
}

TEST(CApi, StatusStrings) {
  EXPECT_STREQ(sparsek_status_string(SPARSEK_OK), "ok");
  EXPECT_STREQ(sparsek_status_string(SPARSEK_INVALID_ARGUMENT), "invalid argument");
  EXPECT_STREQ(sparsek_status_string(SPARSEK_INTERNAL), "internal error");
  EXPECT_STREQ(sparsek_status_string(raw_enum<sparsek_status>(42)), "unknown status");
  // The C codes and the C++ enum must agree.
  EXPECT_EQ(int(SPARSEK_UNSUPPORTED), int(Status::unsupported));
  EXPECT_EQ(int(SPARSEK_CUDA_ERROR), int(Status::cuda_error));
  EXPECT_EQ(int(SPARSEK_NO_DEVICE), int(Status::no_device));
  EXPECT_EQ(int(SPARSEK_IO_ERROR), int(Status::io_error));
  EXPECT_EQ(int(SPARSEK_INTERNAL), int(Status::internal));
  EXPECT_EQ(int(SPARSEK_NCCL_ERROR), int(Status::nccl_error));
  EXPECT_STREQ(sparsek_status_string(SPARSEK_NCCL_ERROR), "NCCL error");
  EXPECT_STREQ(sparsek_status_string(raw_enum<sparsek_status>(8)), "unknown status");
}

TEST(CApi, HasCudaAgreesWithDeviceInfo) {
  EXPECT_EQ(sparsek_has_cuda(), device_info().available ? 1 : 0);
}

TEST(CApi, ProductsMatchOracle) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
    CaseSpec s = small(kind, kind == OpKind::sdd ? Op::none : Op::trans);
    s.beta = 2.f;
    auto gc = make_case(s);
    const std::vector<double> ref = oracle(gc->args);
    sparsek_bsr sp = to_c(gc->args.sparse);
    sparsek_status st = SPARSEK_INTERNAL;
    if (kind == OpKind::dsd) {
      sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
      st = sparsek_dsd(SPARSEK_OP_TRANS, s.alpha, &sp, &b, s.beta, &c, nullptr);
    } else if (kind == OpKind::dds) {
      sparsek_dense a = to_c(gc->args.a), c = to_c(gc->args.c);
      st = sparsek_dds(SPARSEK_OP_TRANS, s.alpha, &a, &sp, s.beta, &c, nullptr);
    } else {
      sparsek_dense a = to_c(gc->args.a), b = to_c(gc->args.b);
      st = sparsek_sdd(s.alpha, &a, &b, s.beta, &sp, nullptr);
    }
    ASSERT_EQ(st, SPARSEK_OK) << to_string(kind) << ": " << last();
    EXPECT_EQ(last(), "");
    EXPECT_EQ(max_rel_error(gc->args, ref), 0.0) << to_string(kind);
  }
}

TEST(CApi, NullStructPointersNameTheArgument) {
  auto gc = make_case(small(OpKind::dsd));
  sparsek_bsr a = to_c(gc->args.sparse);
  sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, nullptr, &b, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "sparsek_dsd") && contains(last(), "'a'")) << last();
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, nullptr, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "'b'")) << last();
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &b, 0.f, nullptr, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "'c'")) << last();

  sparsek_dense d = b;
  EXPECT_EQ(sparsek_dds(SPARSEK_OP_NONE, 1.f, nullptr, &a, 0.f, &d, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "sparsek_dds") && contains(last(), "'a'")) << last();
  EXPECT_EQ(sparsek_dds(SPARSEK_OP_NONE, 1.f, &d, nullptr, 0.f, &d, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "'b'")) << last();
  EXPECT_EQ(sparsek_sdd(1.f, &b, &b, 0.f, nullptr, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "sparsek_sdd") && contains(last(), "'c'")) << last();
  EXPECT_EQ(sparsek_bsr_validate(nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "'a'")) << last();
}

TEST(CApi, BadShapeNamesOperandAndValue) {
  auto gc = make_case(small(OpKind::dsd));
  sparsek_bsr a = to_c(gc->args.sparse);
  sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
  c.rows = 63;  // must be 64
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &b, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "C") && contains(last(), "63")) << last();
  c.rows = 64;
  b.ld = 3;  // smaller than its 20 columns
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &b, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "B") && contains(last(), "ld=3")) << last();
}

TEST(CApi, OutOfRangeEnumsAreRejected) {
  auto gc = make_case(small(OpKind::dsd));
  sparsek_bsr a = to_c(gc->args.sparse);
  sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
  EXPECT_EQ(sparsek_dsd(raw_enum<sparsek_op>(7), 1.f, &a, &b, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "op") && contains(last(), "7")) << last();
  sparsek_dense bad = b;
  const int nine = 9;
  std::memcpy(&bad.dtype, &nine, sizeof(nine));  // as a C caller would store it
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &bad, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "dtype 9")) << last();
  sparsek_bsr badbm = a;
  badbm.bm = 48;
  EXPECT_EQ(sparsek_bsr_validate(&badbm), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "bm=48")) << last();
}

TEST(CApi, BsrValidateReportsTheIndex) {
  auto gc = make_case(small(OpKind::dsd));
  sparsek_bsr a = to_c(gc->args.sparse);
  ASSERT_EQ(sparsek_bsr_validate(&a), SPARSEK_OK) << last();
  ASSERT_GT(a.nnzb, 1);
  std::vector<int32_t> ci(gc->sparse.col_idx());
  ci[1] = 1000;  // out of range (kb = 3)
  a.col_idx = ci.data();
  EXPECT_EQ(sparsek_bsr_validate(&a), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last(), "col_idx[1]=1000")) << last();
}

TEST(CApi, SuccessClearsLastError) {
  auto gc = make_case(small(OpKind::dsd));
  sparsek_bsr a = to_c(gc->args.sparse);
  sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
  ASSERT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, nullptr, &b, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  ASSERT_NE(last(), "");
  ASSERT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &b, 0.f, &c, nullptr), SPARSEK_OK) << last();
  EXPECT_EQ(last(), "");
  ASSERT_EQ(sparsek_bsr_validate(nullptr), SPARSEK_INVALID_ARGUMENT);
  ASSERT_EQ(sparsek_bsr_validate(&a), SPARSEK_OK);
  EXPECT_EQ(last(), "");
}

TEST(CApi, LastErrorIsThreadLocal) {
  ASSERT_EQ(sparsek_bsr_validate(nullptr), SPARSEK_INVALID_ARGUMENT);
  const std::string mine = last();
  std::string other_before, other_after;
  std::thread t([&] {
    other_before = sparsek_last_error();
    auto gc = make_case(small(OpKind::dsd));
    sparsek_bsr a = to_c(gc->args.sparse);
    sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
    c.cols = 5;
    sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &b, 0.f, &c, nullptr);
    other_after = sparsek_last_error();
  });
  t.join();
  EXPECT_EQ(other_before, "") << "a new thread sees another thread's error";
  EXPECT_NE(other_after, "");
  EXPECT_EQ(last(), mine) << "another thread's failure replaced this thread's error";
}

// Without a GPU, operands in device memory cannot run: a failure status with a message, never OK.
TEST(CApi, DeviceMemoryWithoutGpuFails) {
  if (sparsek_has_cuda()) GTEST_SKIP() << "a GPU answers: this checks the no-GPU path";
  auto gc = make_case(small(OpKind::dsd));
  sparsek_bsr a = to_c(gc->args.sparse);
  sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
  a.memory = b.memory = c.memory = SPARSEK_DEVICE;
  const sparsek_status st = sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &b, 0.f, &c, nullptr);
  EXPECT_EQ(st, sparsek_status(no_gpu_status())) << sparsek_status_string(st) << ": " << last();
  EXPECT_NE(last().find(no_gpu_text("no CUDA device")), std::string::npos) << last();
}

}  // namespace
}  // namespace sparsek::test
