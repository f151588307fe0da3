// Hostile and careless input, each a regression test of a defect that was found: C overlapping an
// input, out-of-range enums named as valid ones, extents whose byte count overflows, destroyed or
// foreign plan handles, alpha = Inf on empty rows, and a pattern edited in place in a way that
// keeps the one-shot plan cache's hash.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "plan/plan_internal.hpp"
#include "sparsek/plan.hpp"
#include "sparsek/sparsek.h"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class Reliability : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("SPARSEK_TUNE", "off", 1);
    clear_one_shot_plan_cache();
  }

 private:
  SavedEnv tune_{"SPARSEK_TUNE"};
};

CaseSpec spec(OpKind kind, Op op = Op::none) {
  CaseSpec s;
  s.kind = kind;
  s.op = op;
  s.rows = 64;
  s.cols = 64;
  s.bm = 16;
  s.bk = 16;
  s.free = 64;
  s.density = 1.0;  // every block stored
  s.integers = true;
  return s;
}

// Writes `v` as the raw integer a C caller could store in an enum field.
template <class E>
void poke(E& field, int v) {
  static_assert(sizeof(E) == sizeof(int), "enum size");
  std::memcpy(&field, &v, sizeof v);
}

// ---------------------------------------------------------------------------------------------
// C overlapping an input

// The original report: f32 DSD through the C API with C.data == B.data returned OK and half of C
// wrong. Now it is refused, naming both operands.
TEST_F(Reliability, CApiDsdWithCAliasingBIsRefused) {
  auto gc = make_case(spec(OpKind::dsd));
  sparsek_bsr a = to_c(gc->args.sparse);
  sparsek_dense b = to_c(gc->args.b), c = b;  // C is B
  const std::vector<uint8_t> before = gc->b->bytes;
  ASSERT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &b, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  const std::string err = sparsek_last_error();
  EXPECT_TRUE(contains(err, "sparsek_dsd: C overlaps B") && contains(err, "not computed in place")) << err;
  EXPECT_EQ(gc->b->bytes, before) << "B was written";
}

// Every input of every kind: C (or SDD's output values) placed over it is refused by gemm(),
// plan() and run(), the message naming the input; a partial overlap (one shared element) too.
TEST_F(Reliability, EveryOverlapIsRefusedAndNamed) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (const char* input : {"row_ptr", "col_idx", "values", "A", "B"}) {
      const std::string in(input);
      if ((kind == OpKind::dsd && in == "A") || (kind == OpKind::dds && in == "B") ||
          (kind == OpKind::sdd && in == "values"))
        continue;
      SCOPED_TRACE(std::string(to_string(kind)) + " output over " + in);
      auto gc = make_case(spec(kind));
      GemmArgs g = gc->args;
      // The input moved into a scratch buffer of its own, the output placed 4 bytes into it (a
      // partial overlap).
      std::vector<uint8_t> scratch(1 << 20);
      auto move_into_scratch = [&](const void* p, size_t bytes) {
        std::memcpy(scratch.data(), p, bytes);
        return static_cast<void*>(scratch.data());
      };
      const BsrView& sp = g.sparse;
      const size_t es = dtype_size(sp.dtype);
      if (in == "row_ptr")
        g.sparse.row_ptr = static_cast<const int32_t*>(move_into_scratch(sp.row_ptr, size_t(sp.mb() + 1) * 4));
      else if (in == "col_idx")
        g.sparse.col_idx = static_cast<const int32_t*>(move_into_scratch(sp.col_idx, size_t(sp.nnzb) * 4));
      else if (in == "values")
        g.sparse.values = move_into_scratch(sp.values, size_t(sp.nnzb * sp.bm * sp.bk) * es);
      else if (in == "A")
        g.a.data = move_into_scratch(g.a.data, size_t(g.a.rows * g.a.ld) * es);
      else
        g.b.data = move_into_scratch(g.b.data, size_t(g.b.rows * g.b.ld) * es);
      if (kind == OpKind::sdd)
        g.sparse.values = scratch.data() + 4;
      else
        g.c.data = scratch.data() + 4;
      std::string want = in == "row_ptr"   ? "row_ptr"
                         : in == "col_idx" ? "col_idx"
                         : in == "values"  ? "(sparse) values"
                                           : " " + in + " [";
      expect_invalid([&] { gemm(g); }, {"overlap", want});
      expect_invalid([&] { plan(g); }, {"overlap", want});
      GemmArgs planned = g;  // the same inputs, the output where it belongs
      if (kind == OpKind::sdd)
        planned.sparse.values = gc->args.sparse.values;
      else
        planned.c = gc->args.c;
      const Plan p = plan(planned);
      expect_invalid([&] { run(p, g); }, {"overlap", want});
    }
}

// Byte ranges, not element sets: C in B's padding (ld > cols) overlaps B's span and is refused;
// C right after B's last element is fine.
TEST_F(Reliability, AdjacentBuffersAreFine) {
  auto gc = make_case(spec(OpKind::dsd));
  const int64_t K = 64, N = 64;
  std::vector<float> buf(size_t(K * N + 64 * N), 0.f);
  GemmArgs g = gc->args;
  g.b.data = buf.data();
  std::memcpy(buf.data(), gc->b->bytes.data(), size_t(K * N) * 4);
  g.c.data = buf.data() + K * N;  // directly after B
  const std::vector<double> ref = oracle(g);
  gemm(g);
  EXPECT_LE(max_rel_error(g, ref), 0.0);
  g.c.data = buf.data() + K * N - 1;  // one shared element
  expect_invalid([&] { gemm(g); }, {"C overlaps B"});
}

// ---------------------------------------------------------------------------------------------
// Out-of-range enums: reported with their number, never as a valid name

TEST_F(Reliability, OutOfRangeEnumsAreNamedByNumber) {
  auto gc = make_case(spec(OpKind::dsd));
  {
    GemmArgs g = gc->args;
    poke(g.b.memory, -3);  // was: "B is in device memory ..."
    expect_invalid([&] { gemm(g); }, {"B memory -3 is not host (0) or device (1)"});
  }
  {
    GemmArgs g = gc->args;
    poke(g.c.layout, 7);  // was: "col-major"
    expect_invalid([&] { gemm(g); }, {"C layout 7"});
  }
  {
    const Plan p = plan(gc->args);
    GemmArgs g = gc->args;
    poke(g.op, 5);  // was: "op is trans, the plan was made for none"
    expect_invalid([&] { run(p, g); }, {"op 5 is not none (0) or trans (1)"});
    g = gc->args;
    poke(g.c.dtype, 4);
    expect_invalid([&] { run(p, g); }, {"C dtype 4"});
    g = gc->args;
    poke(g.kind, -1);
    expect_invalid([&] { run(p, g); }, {"kind -1 is not dsd (0), dds (1) or sdd (2)"});
  }
  Layout l;
  poke(l, 9);
  EXPECT_STREQ(to_string(l), "invalid layout");
  Op o;
  poke(o, 9);
  EXPECT_STREQ(to_string(o), "invalid op");
  Memory m;
  poke(m, 9);
  EXPECT_STREQ(to_string(m), "invalid memory");
  // Through the C API, every enum field of every struct.
  sparsek_bsr a = to_c(gc->args.sparse);
  sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
  sparsek_dense bad = b;
  poke(bad.memory, -3);
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &bad, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(sparsek_last_error(), "memory -3")) << sparsek_last_error();
  bad = c;
  poke(bad.layout, 7);
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &b, 0.f, &bad, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(sparsek_last_error(), "layout 7")) << sparsek_last_error();
  sparsek_bsr bad_a = a;
  poke(bad_a.memory, 2);
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &bad_a, &b, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(sparsek_last_error(), "memory 2")) << sparsek_last_error();
}

// ---------------------------------------------------------------------------------------------
// Extents whose byte count overflows int64

TEST_F(Reliability, OverflowingExtentsAreRejected) {
  auto gc = make_case(spec(OpKind::dsd));
  GemmArgs g = gc->args;
  g.b.ld = int64_t(1) << 62;  // was accepted: rows * ld overflows
  expect_invalid([&] { gemm(g); }, {"B is 64x64 with ld=4611686018427387904", "overflows"});
  expect_invalid([&] { plan(g); }, {"overflows"});
  sparsek_gemm_args c{};
  c.kind = SPARSEK_DSD;
  c.alpha = 1.f;
  c.sparse = to_c(gc->args.sparse);
  c.b = to_c(g.b);
  c.c = to_c(gc->args.c);
  sparsek_plan p = nullptr;
  EXPECT_EQ(sparsek_plan_create(&p, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(sparsek_last_error(), "B is 64x64 with ld=")) << sparsek_last_error();
  EXPECT_EQ(p, nullptr);
  // Col-major C, and an ld that fits int64 elements but not bytes.
  g = gc->args;
  g.c.layout = Layout::col_major;
  g.c.ld = INT64_MAX / 2;
  expect_invalid([&] { gemm(g); }, {"C is 64x64", "overflows"});
  // A pointer whose extent would wrap around the address space.
  g = gc->args;
  g.b.data = reinterpret_cast<void*>(UINTPTR_MAX - 64);
  expect_invalid([&] { gemm(g); }, {"B data pointer", "wraps around"});
  // The largest extent that still fits is not an overflow.
  DenseView big = gc->args.b;
  big.ld = (INT64_MAX / 4 - 64) / 63;
  EXPECT_NO_THROW(validate(big, "B"));
  big.ld += 1;
  expect_invalid([&] { validate(big, "B"); }, {"overflows"});
}

// ---------------------------------------------------------------------------------------------
// Plan handles

sparsek_gemm_args c_args(GemmCase& gc) {
  sparsek_gemm_args a{};
  a.kind = SPARSEK_DSD;
  a.alpha = 1.f;
  a.sparse = to_c(gc.args.sparse);
  a.b = to_c(gc.args.b);
  a.c = to_c(gc.args.c);
  return a;
}

TEST_F(Reliability, DestroyedAndForeignPlanHandlesAreDetected) {
  auto gc = make_case(spec(OpKind::dsd));
  sparsek_gemm_args a = c_args(*gc);
  sparsek_plan p = nullptr;
  ASSERT_EQ(sparsek_plan_create(&p, &a, nullptr), SPARSEK_OK) << sparsek_last_error();
  ASSERT_EQ(sparsek_plan_run(p, &a, nullptr), SPARSEK_OK);
  ASSERT_EQ(sparsek_plan_destroy(p), SPARSEK_OK);
  // Use after destroy, and a second destroy: errors, not use-after-free.
  EXPECT_EQ(sparsek_plan_run(p, &a, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(sparsek_last_error(), "is not a live plan (already destroyed")) << sparsek_last_error();
  EXPECT_EQ(sparsek_plan_destroy(p), SPARSEK_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(sparsek_last_error(), "sparsek_plan_destroy: plan")) << sparsek_last_error();
  uint64_t ws = 7;
  EXPECT_EQ(sparsek_plan_workspace_bytes(p, &ws), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(ws, 7u);
  EXPECT_STREQ(sparsek_plan_variant(p), "");
  // A pointer that never was a plan is never dereferenced (it points at a float here).
  float not_a_plan[16] = {};
  sparsek_plan foreign = reinterpret_cast<sparsek_plan>(not_a_plan);
  EXPECT_EQ(sparsek_plan_run(foreign, &a, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_EQ(sparsek_plan_destroy(foreign), SPARSEK_INVALID_ARGUMENT);
  EXPECT_STREQ(sparsek_plan_variant(foreign), "");
  EXPECT_EQ(sparsek_plan_destroy(nullptr), SPARSEK_OK);
}

// A plan destroyed on one thread while another runs it: the run finishes on its own reference.
TEST_F(Reliability, DestroyWhileRunningIsSafe) {
  CaseSpec s = spec(OpKind::dsd);
  s.rows = s.cols = 512;
  s.free = 256;
  auto gc = make_case(s);
  sparsek_gemm_args a = c_args(*gc);
  for (int round = 0; round < 20; ++round) {
    sparsek_plan p = nullptr;
    ASSERT_EQ(sparsek_plan_create(&p, &a, nullptr), SPARSEK_OK);
    sparsek_status st = SPARSEK_INTERNAL;
    std::thread t([&] { st = sparsek_plan_run(p, &a, nullptr); });
    EXPECT_EQ(sparsek_plan_destroy(p), SPARSEK_OK);
    t.join();
    EXPECT_TRUE(st == SPARSEK_OK || st == SPARSEK_INVALID_ARGUMENT) << st;  // ran, or found it destroyed
  }
}

// ---------------------------------------------------------------------------------------------
// alpha = +-Inf: an element no stored block reaches is beta*C (0 when beta = 0), not Inf*0 = NaN

TEST_F(Reliability, InfiniteAlphaLeavesEmptyRowsBetaC) {
  Pattern p;
  p.mb = 4;
  p.kb = 4;
  p.row_ptr = {0, 0, 2, 2, 3};  // block rows 0 and 2 empty
  p.col_idx = {0, 3, 1};
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd})
    for (Op op : {Op::none, Op::trans}) {
      if (kind == OpKind::sdd && op == Op::trans) continue;
      for (float alpha : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
        for (float beta : {0.f, 2.f}) {
          SCOPED_TRACE(std::string(to_string(kind)) + " op=" + to_string(op) + " alpha=" + std::to_string(alpha) +
                       " beta=" + std::to_string(beta));
          CaseSpec s = spec(kind, op);
          s.custom = &p;
          s.alpha = alpha;
          s.beta = beta;
          s.free = kind == OpKind::sdd ? 0 : 40;  // sdd: K = 0, no product term anywhere
          auto gc = make_case(s);
          const std::vector<float> before = output_values(*gc);
          const std::vector<double> ref = oracle(gc->args);
          gemm(gc->args);
          const std::vector<float> got = output_values(*gc);
          ASSERT_EQ(got.size(), ref.size());
          size_t finite_beta_c = 0;
          for (size_t e = 0; e < got.size(); ++e) {
            if (std::isnan(ref[e])) {
              EXPECT_TRUE(std::isnan(got[e])) << e;  // a reached element whose sum is 0: Inf*0
              continue;
            }
            EXPECT_EQ(double(got[e]), ref[e]) << "element " << e;
            if (std::isfinite(ref[e])) {
              ++finite_beta_c;
              EXPECT_EQ(got[e], beta == 0.f ? 0.f : beta * before[e]) << "element " << e;
            }
          }
          EXPECT_GT(finite_beta_c, 0u);  // the empty rows (or all of sdd) were checked
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A pattern edited in place so that the one-shot plan cache's hash stays the same

// The hash mixes 64-bit words w: h = (h ^ w) * P; h ^= h >> 29. Both steps are invertible, so
// after any change to one word, the next word can be chosen to bring h back to its old value.
uint64_t unmix(uint64_t h) {
  uint64_t x = h;
  for (int i = 0; i < 3; ++i) x = h ^ (x >> 29);  // inverts h = x ^ (x >> 29)
  uint64_t inv = 1, p = 0x100000001b3ull;          // P^-1 mod 2^64 by Newton's iteration
  for (int i = 0; i < 6; ++i) inv *= 2 - p * inv;
  return x * inv;
}
uint64_t step(uint64_t h, uint64_t w) {
  h = (h ^ w) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

// The reported crash: Python passes check_indices = false; an edit that keeps the hash reused the
// old plan with the new, out-of-range indices. The CPU plan now computes from its own copy of the
// pattern: the planned result, and no read outside the operands (ASan/the fuzzer would see one).
TEST_F(Reliability, InPlaceEditKeepingTheHashCannotCrash) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds, OpKind::sdd}) {
    SCOPED_TRACE(to_string(kind));
    clear_one_shot_plan_cache();
    CaseSpec s = spec(kind, kind == OpKind::dds ? Op::trans : Op::none);
    s.density = 0.5;
    auto gc = make_case(s);
    Options fast;
    fast.check_indices = false;
    const std::vector<double> ref = oracle(gc->args);
    gemm(gc->args, fast);  // planned and cached
    int32_t* ci = const_cast<int32_t*>(gc->args.sparse.col_idx);
    const int64_t mb = gc->args.sparse.mb(), nnzb = gc->args.sparse.nnzb;
    ASSERT_GE(nnzb, 4);
    const uint64_t h0 = hash_pattern(gc->args.sparse.row_ptr, mb, ci, nnzb);
    // The state of the hash before col_idx words 0 and 1, and after word 1.
    const int32_t* rp = gc->args.sparse.row_ptr;
    uint64_t h = 0xcbf29ce484222325ull ^ uint64_t(mb) * 0x9e3779b97f4a7c15ull ^ uint64_t(nnzb);
    int64_t i = 0;
    for (; i + 1 < mb + 1; i += 2) h = step(h, uint64_t(uint32_t(rp[i])) | uint64_t(uint32_t(rp[i + 1])) << 32);
    if (i < mb + 1) h = (h ^ uint64_t(uint32_t(rp[i]))) * 0x100000001b3ull;
    auto word = [&](int k) { return uint64_t(uint32_t(ci[2 * k])) | uint64_t(uint32_t(ci[2 * k + 1])) << 32; };
    const uint64_t after1 = step(step(h, word(0)), word(1));
    const uint64_t w0 = uint64_t(0x7ffffff0u) | uint64_t(0x7ffffff1u) << 32;  // far out of range
    const uint64_t w1 = unmix(after1) ^ step(h, w0);
    ci[0] = int32_t(uint32_t(w0));
    ci[1] = int32_t(uint32_t(w0 >> 32));
    ci[2] = int32_t(uint32_t(w1));
    ci[3] = int32_t(uint32_t(w1 >> 32));
    ASSERT_EQ(hash_pattern(rp, mb, ci, nnzb), h0) << "the crafted edit must keep the hash";
    if (kind != OpKind::sdd) gc->c->fill(nan_value());
    gemm(gc->args, fast);  // a cache hit on the edited pattern
    EXPECT_EQ(one_shot_plan_cache_stats().hits, 1u);
    EXPECT_LE(max_rel_error(gc->args, ref), 0.0) << "the plan computes the pattern it was made for";
    // With the checks on, the edit is caught and named.
    expect_invalid([&] { gemm(gc->args); }, {"col_idx[0]=2147483632", "out of range"});
  }
}

}  // namespace
}  // namespace sparsek::test
