// fp8 (e4m3): the scalar conversions, host quantization of BSR and dense operands, the CPU
// backend's e4m3 products against the fp64 oracle (and the oracle against a product of the
// dequantized operands), and the errors of bad scales.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "sparsek/plan.hpp"
#include "e4m3_util.hpp"
#include "sparsek/quantize.hpp"
#include "test_util.hpp"

namespace sparsek::test {
namespace {

// ---------------------------------------------------------------- conversions

// The value of a code from the format's definition (independent of e4m3_to_float's bit tricks).
double code_value(int code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, mant = code & 7;
  const double mag = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(1.0 + mant / 8.0, exp - 7);
  return sign ? -mag : mag;
}
bool is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

// The code float_to_e4m3 must give, by search: the finite code nearest to x (ties: the even code),
// +-448 beyond the range, 0x7F for NaN.
int reference_code(double x) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(code_value(c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  if (a >= 448) best = 0x7e;
  return sign | best;
}

TEST(E4m3, EveryCodeDecodesExactlyAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float f = e4m3_to_float({uint8_t(c)});
    if (is_nan_code(c)) {
      EXPECT_TRUE(std::isnan(f)) << "code " << c;
      EXPECT_EQ(float_to_e4m3(f).bits, 0x7f) << "code " << c;
      continue;
    }
    EXPECT_EQ(double(f), code_value(c)) << "code " << c;
    EXPECT_EQ(std::signbit(f), c >= 0x80) << "code " << c;  // 0x80 is -0
    EXPECT_EQ(float_to_e4m3(f).bits, c) << "code " << c;
  }
  EXPECT_EQ(e4m3_to_float({0x7e}), 448.f);
  EXPECT_EQ(e4m3_to_float({0x01}), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float({0x07}), 7 * std::ldexp(1.f, -9));
  EXPECT_EQ(e4m3_to_float({0x08}), std::ldexp(1.f, -6));  // smallest normal
}

TEST(E4m3, RoundsToNearestEvenAndSaturates) {
  struct Case {
    float x;
    int code;
  };
  const float s = std::ldexp(1.f, -9);
  const Case cases[] = {
      {0.f, 0x00}, {-0.f, 0x80}, {448.f, 0x7e}, {-448.f, 0xfe}, {449.f, 0x7e}, {464.f, 0x7e}, {480.f, 0x7e},
      {1e30f, 0x7e}, {-1e30f, 0xfe}, {std::numeric_limits<float>::infinity(), 0x7e},
      {-std::numeric_limits<float>::infinity(), 0xfe}, {std::numeric_limits<float>::quiet_NaN(), 0x7f},
      {-std::numeric_limits<float>::quiet_NaN(), 0x7f},
      {s, 0x01}, {0.5f * s, 0x00}, {-0.5f * s, 0x80},  // tie between 0 and the smallest: even (0)
      {0.5000001f * s, 0x01}, {1.5f * s, 0x02}, {2.5f * s, 0x02}, {7.5f * s, 0x08},  // ties to even
      {1e-45f, 0x00}, {-1e-45f, 0x80},                                                // float subnormals
      {1.0625f, 0x38}, {1.0625001f, 0x39}, {1.1875f, 0x3a}, {1.f, 0x38},              // 1 + 1/16: a tie
      {240.f, 0x77}, {248.f, 0x78}, {440.f, 0x7e}, {447.f, 0x7e}, {432.f, 0x7e}, {431.f, 0x7d},
  };
  for (const Case& c : cases) EXPECT_EQ(float_to_e4m3(c.x).bits, c.code) << "x = " << c.x;
}

// Against the search reference over float bit patterns spread across every binade that matters
// (and the ones around them): every 2^11-th pattern between 2^-14 and 2^10, both signs.
TEST(E4m3, MatchesTheNearestCodeBySearch) {
  int bad = 0;
  for (uint32_t u = 0x38800000u; u <= 0x44800000u && bad < 5; u += 2048u + (u & 1u))
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = bits_float(u | sign);
      const int want = reference_code(double(x));
      if (float_to_e4m3(x).bits != want) {
        ADD_FAILURE() << "x = " << x << ": got " << int(float_to_e4m3(x).bits) << ", want " << want;
        ++bad;
      }
    }
  // Every midpoint between neighbouring codes, and a hair either side of it.
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = code_value(c), hi = code_value(c + 1), mid = 0.5 * (lo + hi);
    const float m = float(mid);  // exact: the midpoint has 5 significant bits
    ASSERT_EQ(double(m), mid);
    EXPECT_EQ(float_to_e4m3(m).bits, (c & 1) ? c + 1 : c) << "midpoint above code " << c;
    EXPECT_EQ(float_to_e4m3(std::nextafter(m, 0.f)).bits, c) << "below the midpoint above code " << c;
    EXPECT_EQ(float_to_e4m3(std::nextafter(m, 1e9f)).bits, c + 1) << "above the midpoint above code " << c;
  }
}

TEST(E4m3, DtypeBasics) {
  EXPECT_EQ(int(DType::e4m3), 3);
  EXPECT_EQ(int(SPARSEK_E4M3), 3);
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_STREQ(to_string(DType::e4m3), "e4m3");
  uint8_t raw = 0;
  store_from_float(&raw, DType::e4m3, 0, -3.f);
  EXPECT_EQ(raw, float_to_e4m3(-3.f).bits);
  EXPECT_EQ(load_as_float(&raw, DType::e4m3, 0), -3.f);
}

// ---------------------------------------------------------------- quantization (host)

// A 2 x 3-block matrix (bm = 16, bk = 32) with values spread over magnitudes, one all-zero block.
BsrMatrix sample_bsr(DType dtype) {
  const Pattern p = pattern_of(3, {{0, 2}, {1}});
  BsrMatrix m(32, 96, 16, 32, p.row_ptr, p.col_idx, dtype);
  for (int64_t b = 0; b < m.nnzb(); ++b)
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 32; ++c) {
        const float v = b == 1 ? 0.f : std::ldexp(float((r * 32 + c) % 37) - 18.f, int(b) * 3 - 4 + (r + c) % 7);
        m.set_value(b, r, c, v);
      }
  return m;
}

// |x - decoded| within half a step of e4m3 at x (relative 2^-4 for normals, scale * 2^-10 below).
void expect_close_to_quantized(float x, float got, float scale) {
  const double bound = std::max(std::fabs(double(x)) * 0.0625, double(scale) * std::ldexp(1.0, -10)) * (1 + 1e-6);
  EXPECT_LE(std::fabs(double(x) - double(got)), bound) << "x = " << x << ", got " << got << ", scale " << scale;
}

TEST(E4m3, QuantizeBsrPerBlockAmax) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(to_string(dt));
    const BsrMatrix a = sample_bsr(dt);
    const BsrMatrix q = quantize_e4m3(a);
    ASSERT_EQ(q.dtype(), DType::e4m3);
    ASSERT_EQ(q.scales().size(), size_t(a.nnzb()));
    EXPECT_EQ(q.row_ptr(), a.row_ptr());
    EXPECT_EQ(q.col_idx(), a.col_idx());
    for (int64_t b = 0; b < a.nnzb(); ++b) {
      float amax = 0.f;
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(a.value(b, r, c)));
      EXPECT_EQ(q.scales()[size_t(b)], amax / 448.f) << "block " << b;
      float qmax = 0.f;
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 32; ++c) {
          const uint8_t code = q.value_bytes()[size_t((b * 16 + r) * 32 + c)];
          const float x = a.value(b, r, c);
          if (amax == 0.f) {
            EXPECT_EQ(code, 0) << "a zero block's codes are zero";
            continue;
          }
          EXPECT_EQ(code, float_to_e4m3(x / (amax / 448.f)).bits);
          qmax = std::max(qmax, std::fabs(e4m3_to_float({code})));
          expect_close_to_quantized(x, q.value(b, r, c), q.scales()[size_t(b)]);
        }
      if (amax > 0.f) EXPECT_EQ(qmax, 448.f) << "the block's largest value uses the top of the range";
    }
    EXPECT_EQ(q.scales()[1], 0.f);  // the zero block
    // dequantize: scale * decoded, rounded to the dtype asked for.
    for (DType out : {DType::f32, DType::f16, DType::bf16}) {
      const BsrMatrix d = dequantize(q, out);
      ASSERT_EQ(d.dtype(), out);
      for (int64_t b = 0; b < q.nnzb(); ++b)
        for (int r = 0; r < 16; r += 3)
          for (int c = 0; c < 32; c += 5) {
            float want = q.scales()[size_t(b)] * e4m3_to_float({q.value_bytes()[size_t((b * 16 + r) * 32 + c)]});
            store_from_float(&want, out, 0, want);
            EXPECT_EQ(d.value(b, r, c), load_as_float(&want, out, 0));
          }
    }
  }
}

// Values that e4m3 holds exactly, with a block maximum of 448: scale 1, and the round trip is exact.
TEST(E4m3, QuantizeExactValuesRoundTrip) {
  const Pattern p = pattern_of(1, {{0}});
  BsrMatrix a(16, 16, 16, 16, p.row_ptr, p.col_idx, DType::f32);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      const int code = (r * 16 + c) % 0x7f;  // 0 .. 0x7e: every positive finite value
      a.set_value(0, r, c, float(code_value((r + c) % 2 ? code | 0x80 : code)));
    }
  a.set_value(0, 15, 15, 448.f);
  const BsrMatrix q = quantize_e4m3(a);
  EXPECT_EQ(q.scales()[0], 1.f);
  const BsrMatrix d = dequantize(q);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) EXPECT_EQ(d.value(0, r, c), a.value(0, r, c)) << r << "," << c;
}

TEST(E4m3, QuantizeRefusesNonFiniteOnTheHost) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    BsrMatrix a = sample_bsr(DType::f32);
    a.set_value(2, 3, 5, bad);
    const std::string v = std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf";
    expect_invalid([&] { quantize_e4m3(a); }, {"quantize_e4m3", "values[block 2, row 3, col 5]=" + v, "not finite"});
    HostDense x(4, 6, DType::f16);
    x.fill(1.f);
    x.set(2, 1, bad);
    HostDense out(4, 6, DType::e4m3);
    std::vector<float> sc(4);
    expect_invalid([&] { quantize_e4m3(x.view, out.view, sc.data(), ScaleDim::rows); },
                   {"quantize_e4m3", "in(2, 1)=" + v, "not finite"});
  }
}

TEST(E4m3, QuantizeBsrViewArguments) {
  const BsrMatrix a = sample_bsr(DType::f32);
  std::vector<uint8_t> codes(size_t(a.nnzb() * 16 * 32));
  std::vector<float> sc(size_t(a.nnzb()));
  expect_invalid([&] { quantize_e4m3(a.view(), nullptr, sc.data()); }, {"values (the output) is null"});
  expect_invalid([&] { quantize_e4m3(a.view(), codes.data(), nullptr); }, {"scales (the output) is null"});
  expect_invalid([&] { quantize_e4m3(a.view(), codes.data(), reinterpret_cast<float*>(codes.data() + 1)); },
                 {"scales (the output) is not 4-byte aligned"});
  expect_invalid([&] { quantize_e4m3(a.view(), a.view().values, sc.data()); },
                 {"values (the output) overlaps the input values"});
  const BsrMatrix q = quantize_e4m3(a);
  expect_invalid([&] { quantize_e4m3(q.view(), codes.data(), sc.data()); }, {"the values must be f32, f16 or bf16, got e4m3"});
  std::vector<float> out(codes.size());
  expect_invalid([&] { dequantize(a.view(), out.data(), DType::f32); }, {"dequantize", "the matrix is f32, not e4m3"});
  expect_invalid([&] { dequantize(q.view(), out.data(), DType::e4m3); }, {"the output dtype must be f32, f16 or bf16"});
  BsrView nos = q.view();
  nos.scales = nullptr;
  expect_invalid([&] { dequantize(nos, out.data(), DType::f32); }, {"scales is null but the values are e4m3"});
  // The view functions and the matrix ones agree.
  quantize_e4m3(a.view(), codes.data(), sc.data());
  EXPECT_EQ(codes, q.value_bytes());
  EXPECT_EQ(sc, q.scales());
}

// The dense rule, recomputed here from its definition for one (token, group).
void check_dense_quantized(const HostDense& in, const HostDense& out, const std::vector<float>& sc, ScaleDim dim,
                           int group) {
  const bool rows = dim == ScaleDim::rows;
  const int64_t tokens = rows ? in.view.rows : in.view.cols, K = rows ? in.view.cols : in.view.rows;
  const int64_t g_len = group ? group : std::max<int64_t>(K, 1), groups = group ? (K + group - 1) / group : 1;
  ASSERT_EQ(int64_t(sc.size()), tokens * groups);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0.f;
      for (int64_t k = g * g_len; k < std::min(K, (g + 1) * g_len); ++k)
        amax = std::max(amax, std::fabs(rows ? in.get(t, k) : in.get(k, t)));
      const float scale = sc[size_t(t * groups + g)];
      ASSERT_EQ(scale, amax / 448.f) << "token " << t << " group " << g;
      for (int64_t k = g * g_len; k < std::min(K, (g + 1) * g_len); ++k) {
        const int64_t r = rows ? t : k, c = rows ? k : t;
        const uint8_t code = out.bytes[size_t(out.view.index(r, c))];
        ASSERT_EQ(code, scale == 0.f ? 0 : float_to_e4m3(in.get(r, c) / scale).bits) << r << "," << c;
      }
    }
}

TEST(E4m3, QuantizeDenseEveryLayoutDimAndGroup) {
  for (const DenseQuantCase& qc : dense_quant_cases()) {
    SCOPED_TRACE(qc.name());
    const auto& [dt, dim, group, lin, lout] = qc;
    HostDense in(37, 300, dt, lin, 3);
    in.fill_random(uint64_t(group + int(dim) * 7 + int(lin) * 13 + int(dt)));
    for (int64_t c = 0; c < 300; ++c) in.set(5, c, 0.f);  // a zero row
    for (int64_t r = 0; r < 37; ++r) in.set(r, 129, 0.f);  // a zero column
    HostDense out(37, 300, DType::e4m3, lout, 5);
    std::memset(out.bytes.data(), 0xAB, out.bytes.size());
    const std::vector<uint8_t> before = out.bytes;
    const int64_t tokens = dim == ScaleDim::rows ? 37 : 300, K = dim == ScaleDim::rows ? 300 : 37;
    std::vector<float> sc(size_t(scale_count(tokens, K, group)), -1.f);
    quantize_e4m3(in.view, out.view, sc.data(), dim, group);
    EXPECT_EQ(out.view.scales, sc.data());
    EXPECT_EQ(out.view.scale_group, group);
    check_dense_quantized(in, out, sc, dim, group);
    // The output's padding is not written.
    for (size_t i = 0; i < out.bytes.size(); ++i) {
      const int64_t major = int64_t(i) / out.view.ld, minor = int64_t(i) % out.view.ld;
      const bool inside = lout == Layout::row_major ? minor < 300 : minor < 37;
      if (!inside) ASSERT_EQ(out.bytes[i], before[i]) << "padding byte " << i << " written";
      (void)major;
    }
    // dequantize brings back scale * decoded.
    HostDense back(37, 300, DType::f32, lin);
    dequantize(out.view, back.view, dim);
    const int64_t groups = group ? (K + group - 1) / group : 1;
    for (int64_t r = 0; r < 37; r += 4)
      for (int64_t c = 0; c < 300; c += 7) {
        const int64_t t = dim == ScaleDim::rows ? r : c, k = dim == ScaleDim::rows ? c : r;
        const float s = sc[size_t(t * groups + (group ? k / group : 0))];
        ASSERT_EQ(back.get(r, c), s * e4m3_to_float({out.bytes[size_t(out.view.index(r, c))]}));
        expect_close_to_quantized(in.get(r, c), back.get(r, c), s);
      }
  }
}

TEST(E4m3, QuantizeDenseArguments) {
  HostDense in(8, 130, DType::f32);
  in.fill_random(3);
  HostDense out(8, 130, DType::e4m3);
  std::vector<float> sc(8 * 2);
  expect_invalid([&] { quantize_e4m3(in.view, out.view, sc.data(), ScaleDim::rows, 64); },
                 {"scale_group=64 is not 0", "or 128"});
  expect_invalid([&] { quantize_e4m3(in.view, out.view, sc.data(), ScaleDim(2)); }, {"dim 2 is not rows (0) or cols (1)"});
  HostDense wrong(8, 130, DType::f16);
  expect_invalid([&] { quantize_e4m3(in.view, wrong.view, sc.data(), ScaleDim::rows); }, {"out must be e4m3, got f16"});
  HostDense small(8, 129, DType::e4m3);
  expect_invalid([&] { quantize_e4m3(in.view, small.view, sc.data(), ScaleDim::rows); }, {"out is 8x129 but in is 8x130"});
  expect_invalid([&] { quantize_e4m3(in.view, out.view, nullptr, ScaleDim::rows); }, {"scales (the output) is null"});
  expect_invalid([&] { quantize_e4m3(in.view, out.view, reinterpret_cast<float*>(in.bytes.data()), ScaleDim::rows); },
                 {"scales (the output) overlaps in"});
  expect_invalid([&] { quantize_e4m3(out.view, out.view, sc.data(), ScaleDim::rows); },
                 {"in must be f32, f16 or bf16, got e4m3"});
  // K = 0: every token's scale is 0.
  HostDense empty_in(3, 0, DType::f32), empty_out(3, 0, DType::e4m3);
  std::vector<float> zs(3, 5.f);
  quantize_e4m3(empty_in.view, empty_out.view, zs.data(), ScaleDim::rows);
  EXPECT_EQ(zs, std::vector<float>(3, 0.f));
  // scale_count
  EXPECT_EQ(scale_count(10, 300, 0), 10);
  EXPECT_EQ(scale_count(10, 300, 128), 30);
  EXPECT_EQ(scale_count(10, 256, 128), 20);
  EXPECT_EQ(scale_count(10, 0, 128), 0);
  expect_invalid([] { scale_count(int64_t(1) << 62, int64_t(1) << 20, 128); }, {"overflows a 64-bit byte count"});
  expect_invalid([] { scale_count(-1, 3, 0); }, {"tokens=-1"});
  // dequantize: in must be e4m3 with scales.
  quantize_e4m3(in.view, out.view, sc.data(), ScaleDim::rows, 128);
  HostDense back(8, 130, DType::bf16);
  expect_invalid([&] { dequantize(in.view, back.view, ScaleDim::rows); }, {"dequantize", "in is f32, not e4m3"});
  DenseView nos = out.view;
  nos.scales = nullptr;
  expect_invalid([&] { dequantize(nos, back.view, ScaleDim::rows); }, {"in scales is null but in is e4m3"});
  dequantize(out.view, back.view, ScaleDim::rows);
  const float want = sc[3 * 2 + 1] * e4m3_to_float({out.bytes[size_t(out.view.index(3, 129))]});
  EXPECT_EQ(back.get(3, 129), bf16_to_float(float_to_bf16(want)));
}

TEST(E4m3, BsrMatrixHoldsScales) {
  const Pattern p = pattern_of(2, {{0, 1}});
  BsrMatrix m(16, 32, 16, 16, p.row_ptr, p.col_idx, DType::e4m3);
  ASSERT_EQ(m.scales(), std::vector<float>(2, 1.f));
  EXPECT_EQ(m.view().scales, m.scales().data());
  m.scales()[1] = 0.5f;
  m.set_value(1, 2, 3, 3.f);  // stored as 6 under scale 0.5
  EXPECT_EQ(m.value_bytes()[size_t(256 + 2 * 16 + 3)], float_to_e4m3(6.f).bits);
  EXPECT_EQ(m.value(1, 2, 3), 3.f);
  m.scales()[0] = 0.f;
  m.set_value(0, 0, 0, 0.f);
  expect_invalid([&] { m.set_value(0, 0, 1, 1.f); }, {"block 0 has scale 0"});
  // Conversions keep the scales with their blocks.
  const BsrMatrix t = bsr_transpose(m);
  EXPECT_EQ(t.scales(), (std::vector<float>{0.f, 0.5f}));
  EXPECT_EQ(t.value(1, 3, 2), 3.f);
  const std::vector<float> d = bsr_to_dense(m);
  EXPECT_EQ(d[size_t(2 * 32 + 16 + 3)], 3.f);
  expect_invalid([&] { bsr_to_blocked_ell(m); }, {"Blocked-ELL", "not e4m3"});
  // Builders that take a dtype quantize per block.
  std::vector<float> dense(16 * 32, 0.f);
  dense[5] = 2.f;
  dense[16 + 7] = -896.f;
  const BsrMatrix q = bsr_from_dense(dense.data(), 16, 32, 16, 16, DType::e4m3);
  ASSERT_EQ(q.nnzb(), 2);
  EXPECT_EQ(q.scales()[0], 2.f / 448.f);
  EXPECT_EQ(q.scales()[1], 2.f);
  EXPECT_EQ(q.value(1, 0, 7), -896.f);
  // fill_random: codes of the numbers, scales 1.
  BsrMatrix r = random_bsr(PatternKind::bernoulli, 64, 64, 16, 16, 0.5, DType::e4m3, 3, true);
  for (float s : r.scales()) EXPECT_EQ(s, 1.f);
  for (uint8_t c : r.value_bytes()) EXPECT_LE(std::fabs(e4m3_to_float({c})), 4.f);
}

// ---------------------------------------------------------------- products (CPU backend)

// block_case with e4m3 integer inputs (exact products) and alpha 2.
CaseSpec fp8_case(OpKind kind, Op op, int bm, int bk, int64_t mb, int64_t kb, int64_t free, DType out, uint64_t seed) {
  CaseSpec s = block_case(kind, op, bm, bk, mb, kb, free, seed, out);
  s.in = DType::e4m3;
  s.alpha = 2.f;
  s.integers = true;
  return s;
}

void check(const CaseSpec& s) {
  SCOPED_TRACE(describe(s));
  auto gc = make_case(s);
  run_and_check(*gc);
}

// Every block shape the CPU backend takes, both products, both ops, integer-valued codes with
// power-of-two scales: exact, so every output dtype must match the rounded exact result.
TEST(E4m3Gemm, EveryBlockShapeExact) {
  const int blocks[] = {16, 32, 64, 128};
  uint64_t seed = 1;
  for (OpKind kind : {OpKind::dsd, OpKind::dds})
    for (Op op : {Op::none, Op::trans})
      for (int bm : blocks)
        for (int bk : blocks) {
          ++seed;
          check(fp8_case(kind, op, bm, bk, 2, 3, 19, DType(int(seed % 3)), seed));
        }
}

// Dense layouts, padded leading dimensions, scale groups, beta, output dtypes.
TEST(E4m3Gemm, LayoutsGroupsAndBeta) {
  uint64_t seed = 100;
  for (OpKind kind : {OpKind::dsd, OpKind::dds})
    for (Op op : {Op::none, Op::trans})
      for (int group : {0, 128})
        for (Layout ld : {Layout::row_major, Layout::col_major})
          for (Layout lc : {Layout::row_major, Layout::col_major})
            for (DType out : {DType::f32, DType::f16, DType::bf16}) {
              // K = 320 (op none) or 288 (trans): three groups of 128, the last one partial.
              CaseSpec s = fp8_case(kind, op, 32, 64, 9, 5, 23, out, seed++);
              s.scale_group = group;
              s.la = s.lb = ld;
              s.lc = lc;
              s.pad = 3;
              s.beta = seed % 2 ? -1.f : 0.f;
              check(s);
            }
}

TEST(E4m3Gemm, RealValuedWithinTolerance) {
  uint64_t seed = 300;
  for (OpKind kind : {OpKind::dsd, OpKind::dds})
    for (int group : {0, 128})
      for (DType out : {DType::f32, DType::f16, DType::bf16}) {
        CaseSpec s = fp8_case(kind, Op::none, 64, 64, 4, 5, 70, out, seed++);
        s.integers = false;
        s.alpha = 0.75f;
        s.scale_group = group;
        s.pattern = PatternKind::power_law;
        check(s);
      }
}

// Empty rows, nnzb = 0, N = 1, M = 1.
TEST(E4m3Gemm, EdgeShapes) {
  const Pattern empty_rows = pattern_of(3, {{}, {0, 2}, {}});
  const Pattern none = pattern_of(3, {{}, {}, {}});
  for (const Pattern* p : {&empty_rows, &none})
    for (OpKind kind : {OpKind::dsd, OpKind::dds})
      for (int64_t free : {1, 17}) {
        CaseSpec s = fp8_case(kind, Op::none, 16, 32, 3, 3, free, DType::f32, 7 + uint64_t(free));
        s.custom = p;
        check(s);
      }
}

// The oracle against a product computed from dequantize()'s operands (its own scale indexing):
// scale groups along K for both roles.
TEST(E4m3Gemm, OracleMatchesDequantizedOperands) {
  for (OpKind kind : {OpKind::dsd, OpKind::dds})
    for (int group : {0, 128}) {
      CaseSpec s = fp8_case(kind, Op::none, 16, 64, 2, 5, 6, DType::f32, 11 + uint64_t(group));
      s.scale_group = group;
      auto gc = make_case(s);
      const std::vector<double> ref = oracle(gc->args);
      const BsrMatrix sp = dequantize(gc->sparse, DType::f32);
      const std::vector<float> S = bsr_to_dense(sp);  // rows x cols
      const bool dsd = kind == OpKind::dsd;
      const HostDense& dq = dsd ? *gc->b : *gc->a;
      HostDense D(dq.view.rows, dq.view.cols, DType::f32);
      dequantize(dsd ? gc->args.b : gc->args.a, D.view, dsd ? ScaleDim::cols : ScaleDim::rows);
      const int64_t M = gc->args.m(), N = gc->args.n(), K = gc->args.k();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double sum = 0;
          for (int64_t k = 0; k < K; ++k)
            sum += dsd ? double(S[size_t(m * K + k)]) * D.get(k, n) : double(D.get(m, k)) * S[size_t(k * N + n)];
          ASSERT_EQ(ref[size_t(m * N + n)], 2.0 * sum) << m << "," << n;
        }
    }
}

// Every finite code through the product: A holds each code once (scale 1/4 on one block, 2 on the
// other), B is the identity, so C is A's values exactly: subnormals and +-448 included.
TEST(E4m3Gemm, EveryCodeThroughTheProduct) {
  const Pattern p = pattern_of(1, {{0}, {0}});
  BsrMatrix a(32, 16, 16, 16, p.row_ptr, p.col_idx, DType::e4m3);
  a.scales() = {0.25f, 2.f};
  for (int e = 0; e < 512; ++e) {
    int code = e % 256;
    if (is_nan_code(code)) code = 0;
    a.value_bytes()[size_t(e)] = uint8_t(code);
  }
  HostDense b(16, 16, DType::e4m3);
  for (int i = 0; i < 16; ++i) b.set(i, i, 1.f);
  std::vector<float> bs(16, 1.f);
  b.view.scales = bs.data();
  HostDense c(32, 16, DType::f32);
  c.fill(nan_value());
  dsd(a.view(), b.view, c.view);
  for (int64_t blk = 0; blk < 2; ++blk)
    for (int r = 0; r < 16; ++r)
      for (int col = 0; col < 16; ++col) {
        const int code = a.value_bytes()[size_t((blk * 16 + r) * 16 + col)];
        ASSERT_EQ(double(c.get(blk * 16 + r, col)), double(a.scales()[size_t(blk)]) * code_value(code)) << code;
      }
}

// A zero scale makes its block (or token, or group) contribute nothing, whatever its codes.
TEST(E4m3Gemm, ZeroScales) {
  CaseSpec s = fp8_case(OpKind::dsd, Op::none, 16, 16, 3, 9, 5, DType::f32, 21);
  s.scale_group = 128;
  auto gc = make_case(s);
  ASSERT_GE(gc->sparse.nnzb(), 2);
  gc->sparse.scales()[0] = 0.f;
  gc->sparse.scales()[1] = -0.f;  // -0 passes the checks too
  gc->dense_scales[1] = 0.f;
  gc->args.sparse = gc->sparse.view();
  run_and_check(*gc);
}

// ---------------------------------------------------------------- errors

TEST(E4m3Gemm, BadScalesAreNamed) {
  auto dsd_case = [] { return make_case(fp8_case(OpKind::dsd, Op::none, 16, 16, 2, 2, 8, DType::f32, 31)); };
  auto dds_case = [] { return make_case(fp8_case(OpKind::dds, Op::none, 16, 16, 2, 2, 8, DType::f32, 32)); };
  {
    auto gc = dsd_case();
    gc->args.sparse.scales = nullptr;
    expect_invalid([&] { gemm(gc->args); }, {"A (sparse)", "scales is null but the values are e4m3"});
  }
  {
    auto gc = dds_case();
    gc->args.sparse.scales = nullptr;
    expect_invalid([&] { gemm(gc->args); }, {"B (sparse)", "scales is null"});
  }
  {
    auto gc = dsd_case();
    gc->args.b.scales = nullptr;
    expect_invalid([&] { gemm(gc->args); }, {"B scales is null but B is e4m3"});
  }
  {
    auto gc = dds_case();
    gc->args.a.scales = nullptr;
    expect_invalid([&] { gemm(gc->args); }, {"A scales is null but A is e4m3"});
  }
  {
    auto gc = dsd_case();
    gc->args.b.scale_group = 64;
    expect_invalid([&] { gemm(gc->args); }, {"B scale_group=64 is not 0"});
  }
  {
    auto gc = dsd_case();
    gc->args.b.scales = reinterpret_cast<const float*>(reinterpret_cast<const char*>(gc->dense_scales.data()) + 2);
    expect_invalid([&] { gemm(gc->args); }, {"B scales pointer is not 4-byte aligned"});
  }
  // Values: NaN, infinite, negative; the array, the first offending index and the value.
  struct Bad {
    float v;
    const char* text;
  };
  for (const Bad& b : {Bad{nan_value(), "=nan is not finite"}, Bad{std::numeric_limits<float>::infinity(), "=inf is not finite"},
                       Bad{-0.5f, "=-0.5 is negative"}}) {
    {
      auto gc = dsd_case();
      gc->sparse.scales()[1] = b.v;
      gc->args.sparse = gc->sparse.view();
      expect_invalid([&] { gemm(gc->args); }, {std::string("A (sparse) scales[1]") + b.text});
      expect_invalid([&] { plan(gc->args); }, {std::string("A (sparse) scales[1]") + b.text});
      expect_invalid([&] { validate(gc->args.sparse, true); }, {std::string("scales[1]") + b.text});
    }
    {
      auto gc = dds_case();
      gc->dense_scales[3] = b.v;
      expect_invalid([&] { gemm(gc->args); }, {std::string("A scales[3]") + b.text});
      expect_invalid([&] { plan(gc->args); }, {std::string("A scales[3]") + b.text});
    }
    {
      auto gc = dsd_case();
      gc->dense_scales[7] = b.v;
      expect_invalid([&] { gemm(gc->args); }, {std::string("B scales[7]") + b.text});
    }
  }
}

TEST(E4m3Gemm, ScalesOnlyWithE4m3) {
  CaseSpec s;
  s.in = DType::f16;
  s.out = DType::f32;
  auto gc = make_case(s);
  std::vector<float> sc(1024, 1.f);
  {
    GemmArgs g = gc->args;
    g.sparse.scales = sc.data();
    expect_invalid([&] { gemm(g); }, {"A (sparse)", "scales is given but the values are f16"});
  }
  {
    GemmArgs g = gc->args;
    g.b.scales = sc.data();
    expect_invalid([&] { gemm(g); }, {"B scales is given but B is f16"});
  }
  {
    GemmArgs g = gc->args;
    g.b.scale_group = 128;
    expect_invalid([&] { gemm(g); }, {"B scale_group=128 is set but B is f16"});
  }
  {
    GemmArgs g = gc->args;
    g.c.scales = sc.data();
    expect_invalid([&] { gemm(g); }, {"C scales is given"});
  }
}

TEST(E4m3Gemm, MixedDtypesSddAndOutput) {
  {  // e4m3 sparse with an f16 dense input: both dtypes named
    auto gc = make_case(fp8_case(OpKind::dsd, Op::none, 16, 16, 2, 2, 8, DType::f32, 41));
    HostDense b16(gc->b->view.rows, gc->b->view.cols, DType::f16);
    gc->args.b = b16.view;
    expect_invalid([&] { gemm(gc->args); }, {"B dtype f16 differs from A's e4m3", "both inputs"});
  }
  {  // f16 sparse with an e4m3 dense input
    CaseSpec s;
    s.kind = OpKind::dds;
    s.in = DType::f16;
    auto gc = make_case(s);
    HostDense a8(gc->a->view.rows, gc->a->view.cols, DType::e4m3);
    std::vector<float> sc(size_t(a8.view.rows), 1.f);
    a8.view.scales = sc.data();
    gc->args.a = a8.view;
    expect_invalid([&] { gemm(gc->args); }, {"A dtype e4m3 differs from B's f16"});
  }
  {  // e4m3 output
    auto gc = make_case(fp8_case(OpKind::dsd, Op::none, 16, 16, 2, 2, 8, DType::f32, 42));
    HostDense c8(gc->c->view.rows, gc->c->view.cols, DType::e4m3);
    gc->args.c = c8.view;
    expect_invalid([&] { gemm(gc->args); }, {"C dtype e4m3 is not an output dtype"});
  }
  {  // SDD: unsupported, clearly
    CaseSpec s;
    s.kind = OpKind::sdd;
    s.in = DType::f16;
    auto gc = make_case(s);
    HostDense a8(gc->a->view.rows, gc->a->view.cols, DType::e4m3), b8(gc->b->view.rows, gc->b->view.cols, DType::e4m3);
    gc->args.a = a8.view;
    gc->args.b = b8.view;
    try {
      gemm(gc->args);
      ADD_FAILURE() << "sdd with e4m3 inputs ran";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::unsupported);
      EXPECT_NE(std::string(e.what()).find("sdd does not take e4m3"), std::string::npos) << e.what();
    }
  }
}

TEST(E4m3Gemm, OutputMustNotOverlapScales) {
  auto gc = make_case(fp8_case(OpKind::dsd, Op::none, 16, 16, 2, 2, 8, DType::f32, 51));
  std::vector<float> shared(4096, 1.f);
  gc->args.c.data = shared.data();
  gc->args.c.ld = gc->args.c.cols;
  gc->args.b.scales = shared.data() + 3;
  expect_invalid([&] { gemm(gc->args); }, {"C overlaps B scales"});
}

// A plan is made for a scale group; the scales themselves may change between runs.
TEST(E4m3Gemm, PlansPinTheScaleGroup) {
  CaseSpec s = fp8_case(OpKind::dds, Op::none, 32, 64, 9, 5, 11, DType::f32, 61);
  auto gc = make_case(s);
  const Plan p = plan(gc->args);
  EXPECT_EQ(p.variant(), "cpu");
  const std::vector<double> ref = oracle(gc->args);
  run(p, gc->args);
  expect_output_matches(*gc, ref, gc->c->bytes);
  // New scales: the same plan gives the new product.
  for (float& x : gc->dense_scales) x *= 2.f;
  const std::vector<double> ref2 = oracle(gc->args);
  run(p, gc->args);
  expect_output_matches(*gc, ref2, gc->c->bytes);
  GemmArgs g = gc->args;
  std::vector<float> grouped(size_t(scale_count(g.a.rows, g.a.cols, 128)), 1.f);
  g.a.scales = grouped.data();
  g.a.scale_group = 128;
  expect_invalid([&] { run(p, g); }, {"A.scale_group is 128, the plan was made for 0"});
}

// The GPU variants say why they do not take e4m3 (no device needed: why_not reads no data).
TEST(E4m3Gemm, OtherVariantsSayWhyNot) {
  SPARSEK_REQUIRE_CUDA_BUILD();
  alignas(16) static uint8_t bytes[1 << 16];
  GemmArgs g;
  g.kind = OpKind::dsd;
  g.sparse = one_block_device_view(bytes);
  g.sparse.dtype = DType::e4m3;
  g.sparse.scales = reinterpret_cast<const float*>(bytes);
  g.b = DenseView{bytes, 64, 64, 64, Layout::row_major, DType::e4m3, Memory::device};
  g.b.scales = reinterpret_cast<const float*>(bytes);
  g.c = DenseView{bytes + 32768, 128, 64, 64, Layout::row_major, DType::f16, Memory::device};
  const std::vector<std::string> why = unsupported_reasons(g);
  int named = 0;
  for (const std::string& w : why) {
    const std::string name = w.substr(0, w.find(':'));
    if (name == "portable" || name == "smalln" || name == "hopper") {
      EXPECT_NE(w.find("needs f16 or bf16 inputs, got e4m3"), std::string::npos) << w;
      ++named;
    } else if (name == "cusparse_bsr" || name == "cusparse_ell" || name == "cublas_dense" || name == "cublas_batched") {
      EXPECT_NE(w.find("got e4m3"), std::string::npos) << w;
      ++named;
    }
  }
  EXPECT_GE(named, 3) << "reasons: " << why.size();
  for (const std::string& v : supported_variants(g)) EXPECT_TRUE(v == "hopper_fp8") << v << " claims an e4m3 problem";
}

// ---------------------------------------------------------------- the C API

TEST(E4m3Capi, ProductQuantizeAndErrors) {
  auto gc = make_case(fp8_case(OpKind::dsd, Op::none, 16, 32, 3, 4, 9, DType::f32, 71));
  const std::vector<double> ref = oracle(gc->args);
  sparsek_bsr a = to_c(gc->args.sparse);
  sparsek_dense b = to_c(gc->args.b), c = to_c(gc->args.c);
  ASSERT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 2.f, &a, &b, 0.f, &c, nullptr), SPARSEK_OK) << sparsek_last_error();
  expect_output_matches(*gc, ref, gc->c->bytes);
  ASSERT_EQ(sparsek_bsr_validate(&a), SPARSEK_OK) << sparsek_last_error();

  sparsek_bsr nos = a;
  nos.scales = nullptr;
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &nos, &b, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("sparsek_dsd: A (sparse): scales is null"), std::string::npos)
      << sparsek_last_error();
  std::vector<float> bad(gc->dense_scales);
  bad[2] = -1.f;
  sparsek_dense bb = b;
  bb.scales = bad.data();
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &bb, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("B scales[2]=-1 is negative"), std::string::npos)
      << sparsek_last_error();
  bb = b;
  bb.scale_group = 7;
  EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &bb, 0.f, &c, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("B scale_group=7"), std::string::npos) << sparsek_last_error();
  sparsek_bsr nan_scale = a;
  std::vector<float> sn(gc->sparse.scales());
  sn[0] = nan_value();
  nan_scale.scales = sn.data();
  EXPECT_EQ(sparsek_bsr_validate(&nan_scale), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("scales[0]=nan is not finite"), std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_sdd(1.f, &b, &b, 0.f, &a, nullptr), SPARSEK_UNSUPPORTED);
  {  // scales on an f16 operand
    CaseSpec s16;
    s16.in = DType::f16;
    auto g16 = make_case(s16);
    sparsek_bsr a16 = to_c(g16->args.sparse);
    sparsek_dense b16 = to_c(g16->args.b), c16 = to_c(g16->args.c);
    b16.scales = bad.data();
    EXPECT_EQ(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a16, &b16, 0.f, &c16, nullptr), SPARSEK_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sparsek_last_error()).find("B scales is given but B is f16"), std::string::npos)
        << sparsek_last_error();
  }

  // Quantize through C: the same bits as C++.
  const BsrMatrix f = random_bsr(PatternKind::bernoulli, 64, 64, 16, 32, 0.5, DType::bf16, 5);
  const BsrMatrix q = quantize_e4m3(f);
  std::vector<uint8_t> codes(size_t(f.nnzb() * 16 * 32));
  std::vector<float> sc(size_t(f.nnzb()));
  sparsek_bsr fc = to_c(f.view());
  ASSERT_EQ(sparsek_quantize_bsr_e4m3(&fc, codes.data(), sc.data(), nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(codes, q.value_bytes());
  EXPECT_EQ(sc, q.scales());
  sparsek_bsr qc = to_c(q.view());
  std::vector<uint16_t> back(codes.size());
  ASSERT_EQ(sparsek_dequantize_bsr(&qc, back.data(), SPARSEK_BF16, nullptr), SPARSEK_OK) << sparsek_last_error();
  const BsrMatrix d = dequantize(q, DType::bf16);
  EXPECT_EQ(std::memcmp(back.data(), d.value_bytes().data(), back.size() * 2), 0);
  EXPECT_EQ(sparsek_dequantize_bsr(&qc, back.data(), sparsek_dtype(9), nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("dtype 9 is not SPARSEK_F32"), std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_quantize_bsr_e4m3(nullptr, codes.data(), sc.data(), nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("argument 'in' is NULL"), std::string::npos);

  HostDense x(5, 200, DType::f32, Layout::col_major, 2);
  x.fill_random(9);
  HostDense xq(5, 200, DType::e4m3);
  int64_t n = 0;
  ASSERT_EQ(sparsek_scale_count(5, 200, 128, &n), SPARSEK_OK);
  ASSERT_EQ(n, 10);
  std::vector<float> xs(static_cast<size_t>(n));
  sparsek_dense xc = to_c(x.view), xqc = to_c(xq.view);
  ASSERT_EQ(sparsek_quantize_dense_e4m3(&xc, &xqc, xs.data(), SPARSEK_SCALE_ROWS, 128, nullptr), SPARSEK_OK)
      << sparsek_last_error();
  EXPECT_EQ(xqc.scales, xs.data());
  EXPECT_EQ(xqc.scale_group, 128);
  check_dense_quantized(x, xq, xs, ScaleDim::rows, 128);
  HostDense y(5, 200, DType::f32);
  sparsek_dense yc = to_c(y.view);
  ASSERT_EQ(sparsek_dequantize_dense(&xqc, &yc, SPARSEK_SCALE_ROWS, nullptr), SPARSEK_OK) << sparsek_last_error();
  EXPECT_EQ(y.get(4, 199), xs[9] * e4m3_to_float({xq.bytes[size_t(xq.view.index(4, 199))]}));
  EXPECT_EQ(sparsek_quantize_dense_e4m3(&xc, &xqc, xs.data(), sparsek_scale_dim(5), 0, nullptr), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("dim 5 is not SPARSEK_SCALE_ROWS"), std::string::npos)
      << sparsek_last_error();
  EXPECT_EQ(sparsek_scale_count(5, 200, 3, &n), SPARSEK_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sparsek_last_error()).find("scale_group=3"), std::string::npos) << sparsek_last_error();
}

}  // namespace
}  // namespace sparsek::test
