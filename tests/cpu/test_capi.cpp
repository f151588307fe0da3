// The C API: statuses, thread-local last-error text naming the argument, success clearing it,
// version and feature queries, and products that match the oracle.
#include <cstring>
#include <regex>
#include <string>
#include <thread>

#include "sparsek/sparsek.h"
#include "test_util.hpp"

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
