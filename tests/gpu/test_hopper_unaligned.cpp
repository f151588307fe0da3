// GPU tests of the Hopper variant "hopper" on dense operands the TMA cannot read in place: a DSD B
// (or a DDS A, the DSD view's B) whose base address or leading dimension is not a multiple of 16
// bytes is packed into aligned workspace ahead of the product. Against the fp64 oracle on
// NaN-poisoned C with C's padding checked: N in {1, 3, 17, 257, 999}, ld > N, a base address 2
// bytes off, row- and column-major B, op = T, DDS, beta, empty rows, nnzb = 0, bit-identical
// repeats, the workspace the plan reports, and a plan that met an aligned B given a misaligned one.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/oracle.hpp"
#include "kernels/sdd_sm90/variant.hpp"
#include "kernels/dsd_sm90/pack_lines.hpp"
#include "gpu/device_case.hpp"
#include "plan/variant.hpp"
#include "sparsek/plan.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

CaseSpec spec(OpKind kind, Op op, int bm, int bk, int64_t mb, int64_t kb, int64_t free, uint64_t seed) {
  // 2-byte C: a base address 2 bytes off stays element-aligned
  return block_case(kind, op, bm, bk, mb, kb, free, seed, DType::f16);
}

// The dense operand the kernel reads as its B (DDS: the caller's A) and whether the TMA can read it.
const DenseView& dsd_b(const GemmArgs& g) { return g.kind == OpKind::dds ? g.a : g.b; }
bool tma_readable(const GemmArgs& g) { return hopper_tma_operand_why_not(dsd_b(g), "B").empty(); }
// Bytes of its packed copy: stored lines x the copy's stride (aligned_line_elems()).
size_t packed_bytes(const DenseView& b) {
  const bool row = b.layout == Layout::row_major;
  return size_t(row ? b.rows : b.cols) * size_t(aligned_line_elems(row ? b.cols : b.rows)) * dtype_size(b.dtype);
}

// Runs s through a `hopper` plan with every dense operand's device address moved by `offset`
// bytes (twice: the repeat must be bit-identical), checks the oracle and C's padding, and that the
// case really needed the copy (packed = false: that it was read in place); returns C's bytes.
std::vector<uint8_t> check(const CaseSpec& s, size_t offset = 0, bool packed = true) {
  SCOPED_TRACE(describe(s) + (offset ? " dense pointers +" + std::to_string(offset) + " B" : ""));
  auto gc = make_case(s);
  const std::vector<double> ref = oracle(gc->args);  // on the host, before C changes
  const std::vector<uint8_t> before = gc->c->bytes;
  DeviceCase dc(*gc, offset);
  EXPECT_FALSE(tma_readable(dc.args)) << "the case does not exercise the packed copy";
  const Variant* v = find_variant("hopper");
  EXPECT_EQ(v->why_not(dc.args), "") << "hopper does not take this case";
  Options o;
  o.variant = "hopper";
  const Plan p = plan(dc.args, o);
  if (gc->sparse.nnzb() > 0 && packed) {
    EXPECT_GE(p.workspace_bytes(), packed_bytes(dsd_b(dc.args)));
  } else if (!packed) {
    EXPECT_LT(p.workspace_bytes(), packed_bytes(dsd_b(dc.args))) << "copied, not read in place";
  }
  run(p, dc.args);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.download(*gc);
  expect_output_matches(*gc, ref, before);
  const std::vector<uint8_t> first = gc->c->bytes;
  // Again from the same C: the same bytes.
  check_cuda(cudaMemcpy(dc.c->ptr, before.data(), before.size(), cudaMemcpyHostToDevice), "cudaMemcpy C");
  run(p, dc.args);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.download(*gc);
  EXPECT_TRUE(gc->c->bytes == first) << "a repeated run gave different bytes";
  return first;
}

// A pattern with every block row empty except those listed, which hold every block column.
Pattern rows_only(int64_t mb, int64_t kb, const std::vector<int64_t>& full) {
  Pattern p;
  p.mb = mb;
  p.kb = kb;
  p.row_ptr.push_back(0);
  for (int64_t r = 0; r < mb; ++r) {
    for (int64_t x : full)
      if (x == r)
        for (int32_t c = 0; c < kb; ++c) p.col_idx.push_back(c);
    p.row_ptr.push_back(int32_t(p.col_idx.size()));
  }
  return p;
}

// ---- why_not: runs anywhere (no device memory is touched) ----

TEST(HopperUnaligned, WhyNotNoLongerNamesTheDenseOperandsAlignment) {
  const Variant* v = find_variant("hopper");
  ASSERT_NE(v, nullptr);
  alignas(256) static char storage[1 << 12];
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.sparse = one_block_device_view(storage);
  g.b = DenseView{storage + 2, 64, 999, 999, Layout::row_major, DType::f16, Memory::device};
  g.c = DenseView{storage, 128, 999, 999, Layout::row_major, DType::f16, Memory::device};
  const auto& d = device_info();
  const bool sm90 = d.available && d.cc_major == 9 && d.cc_minor == 0;
  auto supported = [&](const GemmArgs& x, const char* what) {
    const std::string why = v->why_not(x);
    EXPECT_EQ(why.find("16-byte"), std::string::npos) << what << ": " << why;
    EXPECT_EQ(why.find("leading dimension"), std::string::npos) << what << ": " << why;
    if (sm90) {
      EXPECT_EQ(why, "") << what;
    } else {
      EXPECT_TRUE(why.find("sm_90") != std::string::npos || why.find("no CUDA device") != std::string::npos)
          << what << ": " << why;
    }
  };
  supported(g, "DSD, B 2 bytes off, ld 999");
  g.b.layout = Layout::col_major;
  g.b.ld = 67;
  supported(g, "DSD, column-major B, ld 67");
  g.op = Op::trans;  // op(A) = A^T: 64 x 128, so B is 128 x 999
  g.b = DenseView{storage + 2, 128, 999, 131, Layout::col_major, DType::f16, Memory::device};
  g.c = DenseView{storage, 64, 999, 999, Layout::row_major, DType::f16, Memory::device};
  supported(g, "DSD op T, column-major B 2 bytes off, ld 131");
  // DDS: the dense A is the DSD view's B.
  GemmArgs e = g;
  e.kind = OpKind::dds;
  e.op = Op::none;
  e.b = DenseView{};
  e.a = DenseView{storage + 2, 40, 128, 131, Layout::row_major, DType::f16, Memory::device};
  e.c = DenseView{storage, 40, 64, 64, Layout::row_major, DType::f16, Memory::device};
  supported(e, "DDS, A 2 bytes off, ld 131");
  // The sparse values stay a refusal.
  g.sparse.values = storage + 8;
  EXPECT_NE(v->why_not(g).find("A values must be 16-byte aligned"), std::string::npos) << v->why_not(g);
}

// ---- correctness on the device ----

// The copy itself, bit for bit: every source offset within a 16-byte granule (0..7 elements),
// line lengths around granule and warp-step edges, ld = len and ld > len, lines that are whole
// granules and lines that are not. The source allocation ends exactly at the matrix's last
// element (compute-sanitizer memcheck flags any read past it); the copy is poisoned first and its
// padding must come back zero.
TEST(HopperUnaligned, PackLinesEveryOffsetAndLength) {
  SPARSEK_REQUIRE_GPU();
  struct Shape {
    int64_t lines, len, pad;
  };
  int n = 0;
  for (const Shape sh : {Shape{1, 1, 0}, Shape{3, 3, 0}, Shape{5, 7, 1}, Shape{4, 8, 0}, Shape{6, 9, 5},
                         Shape{3, 17, 0}, Shape{7, 255, 2}, Shape{2, 1023, 0}, Shape{3, 1025, 7}, Shape{9, 999, 0},
                         Shape{5, 1000, 0}, Shape{2, 4100, 3}})
    for (int64_t offset = 0; offset < 8; ++offset)
      for (const int64_t ldp :
           {packed_line_elems(sh.len), aligned_line_elems(sh.len), packed_line_elems(sh.len, 64) + 64}) {
        // The copy's strides: whole granules, what the product uses, and one with a whole chunk of
        // padding-only granules per line (written as zeros without loads).
        SCOPED_TRACE("lines " + std::to_string(sh.lines) + " len " + std::to_string(sh.len) + " ld " +
                     std::to_string(sh.len + sh.pad) + " offset " + std::to_string(offset) + " elements, copy stride " +
                     std::to_string(ldp));
        const int64_t ld = sh.len + sh.pad;
        const int64_t elems = offset + (sh.lines - 1) * ld + sh.len;  // the allocation ends at the last element
        std::vector<uint16_t> src(static_cast<size_t>(elems));
        for (size_t i = 0; i < src.size(); ++i) src[i] = uint16_t(0x3c00 + (i * 2654435761u + uint64_t(n)) % 30011);
        ++n;
        uint16_t *d_src = nullptr, *d_dst = nullptr;
        ASSERT_EQ(cudaMalloc(&d_src, size_t(elems) * 2), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&d_dst, size_t(sh.lines * ldp) * 2), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d_src, src.data(), size_t(elems) * 2, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemset(d_dst, 0x7f, size_t(sh.lines * ldp) * 2), cudaSuccess);  // poison
        pack_lines_16bit(d_src + offset, ld, d_dst, ldp, sh.lines, sh.len, nullptr);
        std::vector<uint16_t> out(static_cast<size_t>(sh.lines * ldp));
        EXPECT_EQ(cudaMemcpy(out.data(), d_dst, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(d_src);
        cudaFree(d_dst);
        int64_t bad = 0;
        for (int64_t i = 0; i < sh.lines; ++i)
          for (int64_t j = 0; j < ldp; ++j) {
            const uint16_t want = j < sh.len ? src[size_t(offset + i * ld + j)] : uint16_t(0);
            if (out[size_t(i * ldp + j)] != want && bad++ < 5)
              ADD_FAILURE() << "line " << i << " element " << j << ": " << out[size_t(i * ldp + j)] << ", want "
                            << want;
          }
        EXPECT_EQ(bad, 0);
      }
}

// Row-major B with ld = N (rows not whole 16-byte granules), every block height, beta = 0 over NaN
// and beta != 0, every output dtype.
TEST(HopperUnaligned, RowMajorBRaggedN) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (int64_t N : {1, 3, 17, 257})
    for (int bm : {32, 64, 128}) {
      CaseSpec s = spec(OpKind::dsd, Op::none, bm, bm == 32 ? 64 : 128, 3, 3, N, uint64_t(1400 + n));
      s.in = n % 2 ? DType::bf16 : DType::f16;
      s.out = n % 3 == 0 ? DType::f32 : s.in;
      s.beta = n % 2 ? 0.5f : 0.f;
      ++n;
      // N = 1 with ld = 1 is one contiguous column: read in place as column-major, not copied.
      check(s, 0, /*packed=*/N != 1);
    }
}

// M = 8256 K = 8192 N = 999's shape class, small: N = 999 (4 N tiles, the last one ragged).
TEST(HopperUnaligned, N999) {
  SPARSEK_REQUIRE_SM90();
  CaseSpec s = spec(OpKind::dsd, Op::none, 64, 64, 3, 4, 999, 1450);
  check(s);
  s.beta = -1.f;
  s.bm = s.bk = 128;
  s.rows = s.cols = 2 * 128;
  s.seed = 1451;
  check(s);
}

// ld > N and not a multiple of 8 elements; the base address 2 bytes off (row- and column-major B).
TEST(HopperUnaligned, LeadingDimensionAndBaseAddress) {
  SPARSEK_REQUIRE_SM90();
  CaseSpec s = spec(OpKind::dsd, Op::none, 64, 64, 3, 3, 100, 1460);
  s.pad_b = 1;  // ld 101
  check(s);
  int n = 0;
  for (Layout lb : {Layout::row_major, Layout::col_major})
    for (int64_t N : {96, 100}) {  // 96: rows whole granules, only the address is off
      CaseSpec t = spec(OpKind::dsd, Op::none, 64, 128, 2, 3, N, uint64_t(1470 + n));
      t.lb = lb;
      t.beta = n % 2 ? 0.f : 0.75f;
      ++n;
      check(t, /*offset=*/2);
    }
  // Column-major B with ld = K + 1.
  CaseSpec c = spec(OpKind::dsd, Op::none, 128, 64, 2, 3, 40, 1480);
  c.lb = Layout::col_major;
  c.pad_b = 1;
  c.out = DType::f32;
  check(c);
}

// op(A) = A^T with an unaligned B, both B layouts.
TEST(HopperUnaligned, Transposed) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (Layout lb : {Layout::row_major, Layout::col_major}) {
    CaseSpec s = spec(OpKind::dsd, Op::trans, 64, 128, 3, 2, 77, uint64_t(1490 + n++));
    s.lb = lb;
    s.pad_b = 2;  // ld 79 (row-major) or K + 2 = 194 (column-major)
    s.beta = 1.f;
    check(s);
  }
}

// DDS: C = A * op(B) with the dense A unaligned (its rows or columns are the DSD view's B lines).
TEST(HopperUnaligned, DdsUnalignedA) {
  SPARSEK_REQUIRE_SM90();
  int n = 0;
  for (Op op : {Op::none, Op::trans})
    for (Layout la : {Layout::row_major, Layout::col_major}) {
      CaseSpec s = spec(OpKind::dds, op, 64, 64, 3, 3, 37, uint64_t(1500 + n));
      s.la = la;
      s.lc = n % 2 ? Layout::col_major : Layout::row_major;
      s.beta = n % 2 ? 0.f : 0.5f;
      ++n;
      if (la == Layout::row_major) s.pad_a = 5;  // A's rows are K long (whole granules): ld K + 5
      check(s);
      check(s, /*offset=*/2);
    }
}

// Empty block rows (beta * C there), and no stored block at all (B never read: nothing packed).
TEST(HopperUnaligned, EmptyRowsAndNoBlocks) {
  SPARSEK_REQUIRE_SM90();
  const Pattern some = rows_only(4, 3, {1, 3});
  CaseSpec s = spec(OpKind::dsd, Op::none, 64, 64, 4, 3, 33, 1520);
  s.custom = &some;
  check(s);
  s.beta = 2.f;
  check(s, /*offset=*/2);
  const Pattern none = rows_only(4, 3, {});
  CaseSpec z = spec(OpKind::dsd, Op::none, 64, 64, 4, 3, 33, 1530);
  z.custom = &none;
  check(z);
  z.beta = 0.5f;
  check(z, /*offset=*/2);
}

// The default choice (no variant named) is hopper for an unaligned N above the small-N range.
TEST(HopperUnaligned, DefaultChoice) {
  SPARSEK_REQUIRE_SM90();
  auto gc = make_case(spec(OpKind::dsd, Op::none, 64, 64, 3, 4, 999, 1540));
  DeviceCase dc(*gc);
  ASSERT_FALSE(tma_readable(dc.args));
  EXPECT_EQ(plan(dc.args).variant(), "hopper");
}

// A plan made for a 16-byte aligned B holds no room for a copy: given a misaligned B it says so
// (no crash, nothing written); the one-shot API makes a plan of its own for it.
TEST(HopperUnaligned, PlanMadeForAnAlignedB) {
  SPARSEK_REQUIRE_SM90();
  CaseSpec s = spec(OpKind::dsd, Op::none, 64, 64, 3, 3, 96, 1550);
  auto gc = make_case(s);
  const std::vector<double> ref = oracle(gc->args);
  const std::vector<uint8_t> before = gc->c->bytes;
  DeviceCase aligned(*gc), off(*gc, 2);
  off.args.sparse = aligned.args.sparse;  // the plan is for one pattern (its device pointers)
  Options o;
  o.variant = "hopper";
  const Plan p = plan(aligned.args, o);
  EXPECT_LT(p.workspace_bytes(), packed_bytes(aligned.args.b)) << "aligned B: nothing to copy";
  try {
    run(p, off.args);
    FAIL() << "expected Error(unsupported)";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_NE(std::string(e.what()).find("B is not 16-byte aligned"), std::string::npos) << e.what();
  }
  clear_one_shot_plan_cache();
  gemm(aligned.args, o);
  gemm(off.args, o);  // same shape, less aligned B: not the cached plan
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  off.download(*gc);
  expect_output_matches(*gc, ref, before);
}

// 128-row blocks with 16-bit C that the TMA can store run a kernel without the threads' copy of C;
// a plan made for such a C, given one the TMA cannot store (base 2 bytes off), runs the general
// kernel instead (prepare() set up both), and back. Both match the oracle, with CTA pairs (an even
// number of N tiles) and without, and give the same bytes.
TEST(HopperUnaligned, PlanMadeForATmaStorableC) {
  SPARSEK_REQUIRE_SM90();
  for (const auto& [bk, n] : {std::pair<int, int64_t>{128, 512}, {64, 768}}) {
    CaseSpec s = spec(OpKind::dsd, Op::none, 128, bk, 3, 4, n, 1560 + uint64_t(bk));
    SCOPED_TRACE(describe(s));
    auto gc = make_case(s);
    const std::vector<double> ref = oracle(gc->args);
    const std::vector<uint8_t> before = gc->c->bytes;
    DeviceCase aligned(*gc), off(*gc, 2);
    off.args.sparse = aligned.args.sparse;  // the plan is for one pattern (its device pointers)
    off.args.b = aligned.args.b;            // B read in place: only C moves
    Options o;
    o.variant = "hopper";
    const Plan p = plan(aligned.args, o);
    std::vector<uint8_t> first;
    for (DeviceCase* dc : {&aligned, &off, &aligned}) {
      check_cuda(cudaMemcpy(dc->c->ptr, before.data(), before.size(), cudaMemcpyHostToDevice), "cudaMemcpy C");
      run(p, dc->args);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      dc->download(*gc);
      expect_output_matches(*gc, ref, before);
      if (first.empty()) first = gc->c->bytes;
      EXPECT_TRUE(gc->c->bytes == first) << (dc == &off ? "the threads' copy of C" : "a repeat")
                                         << " gave different bytes";
    }
  }
}

}  // namespace
}  // namespace sparsek::test
