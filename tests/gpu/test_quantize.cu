// e4m3 on the GPU: the scalar conversions in device code and the quantization kernels
// (src/kernels/quant) against the host functions, bit for bit; a non-finite input gives its group
// a NaN scale there, which a product refuses by index. Skipped without a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "device_case.hpp"
#include "e4m3_util.hpp"
#include "sparsek/quantize.hpp"

namespace sparsek::test {
namespace {

__global__ void convert_kernel(const float* x, uint8_t* e4m3, uint16_t* half_bits, uint16_t* bf16_bits, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    e4m3[i] = float_to_e4m3(x[i]).bits;
    half_bits[i] = float_to_half(x[i]).bits;
    bf16_bits[i] = float_to_bf16(x[i]).bits;
  }
}

__global__ void decode_kernel(uint32_t* out) {
  const int c = threadIdx.x;  // 256 threads: every code
  out[c] = float_bits(e4m3_to_float({uint8_t(c)}));
}

// n zero bytes on the device.
std::unique_ptr<DeviceBuffer> zeros(size_t n) {
  const std::vector<uint8_t> z(n);
  return std::make_unique<DeviceBuffer>(z.data(), n);
}

template <class T>
std::vector<T> download(const DeviceBuffer& d) {
  std::vector<T> h(d.bytes / sizeof(T));
  d.download(h.data());
  return h;
}

// The first index where two byte arrays differ, or -1.
int64_t first_difference(const void* a, const void* b, size_t bytes) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < bytes; ++i)
    if (x[i] != y[i]) return int64_t(i);
  return -1;
}

TEST(QuantizeGpu, ConversionsMatchTheHostBitForBit) {
  SPARSEK_REQUIRE_GPU();
  // Every 64th float bit pattern of both signs (NaNs, infinities and subnormals included).
  std::vector<float> x;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 64 + (u & 0xff)) x.push_back(bits_float(uint32_t(u)));
  for (float f : {0.f, -0.f, 448.f, 464.f, 480.f, std::numeric_limits<float>::infinity(), 1e-45f})
    x.push_back(f);
  const int64_t n = int64_t(x.size());
  DeviceBuffer dx(x.data(), x.size() * 4);
  auto de = zeros(x.size()), dh = zeros(x.size() * 2), db = zeros(x.size() * 2);
  convert_kernel<<<1024, 256>>>(static_cast<const float*>(dx.ptr), static_cast<uint8_t*>(de->ptr),
                                static_cast<uint16_t*>(dh->ptr), static_cast<uint16_t*>(db->ptr), n);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto e = download<uint8_t>(*de);
  const auto h = download<uint16_t>(*dh);
  const auto b = download<uint16_t>(*db);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i)
    if (e[size_t(i)] != float_to_e4m3(x[size_t(i)]).bits || h[size_t(i)] != float_to_half(x[size_t(i)]).bits ||
        b[size_t(i)] != float_to_bf16(x[size_t(i)]).bits) {
      ADD_FAILURE() << "x bits " << std::hex << float_bits(x[size_t(i)]) << ": device e4m3/half/bf16 " << int(e[size_t(i)])
                    << "/" << h[size_t(i)] << "/" << b[size_t(i)] << ", host " << int(float_to_e4m3(x[size_t(i)]).bits)
                    << "/" << float_to_half(x[size_t(i)]).bits << "/" << float_to_bf16(x[size_t(i)]).bits;
      ++bad;
    }
  auto dd = zeros(256 * 4);
  decode_kernel<<<1, 256>>>(static_cast<uint32_t*>(dd->ptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto d = download<uint32_t>(*dd);
  for (int c = 0; c < 256; ++c) EXPECT_EQ(d[size_t(c)], float_bits(e4m3_to_float({uint8_t(c)}))) << "code " << c;
}

// A BSR matrix with varied magnitudes per block, a zero block and one of tiny values.
BsrMatrix varied_bsr(int bm, int bk, DType dt, uint64_t seed) {
  BsrMatrix a = random_bsr(PatternKind::bernoulli, 4 * bm, 5 * bk, bm, bk, 0.6, DType::f32, seed);
  std::vector<float> v(size_t(a.nnzb()) * bm * bk);
  for (size_t i = 0; i < v.size(); ++i) v[i] = a.value(int64_t(i / (bm * bk)), int(i / bk % bm), int(i % bk));
  for (int64_t j = 0; j < a.nnzb(); ++j)
    for (int64_t e = 0; e < int64_t(bm) * bk; ++e) {
      float& x = v[size_t(j * bm * bk + e)];
      // (magnitudes 2^-9 .. 2^9: f16 holds them all)
      x = j == 0 ? 0.f : j == 1 ? x * 1e-40f : std::ldexp(x, int(j % 7) * 3 - 9);
    }
  BsrMatrix out(a.rows(), a.cols(), bm, bk, a.row_ptr(), a.col_idx(), dt);
  for (size_t i = 0; i < v.size(); ++i) store_from_float(out.value_bytes().data(), dt, int64_t(i), v[i]);
  return out;
}

TEST(QuantizeGpu, BsrMatchesTheHostBitForBit) {
  SPARSEK_REQUIRE_GPU();
  const std::pair<int, int> shapes[] = {{16, 16}, {32, 128}, {128, 64}, {128, 128}};
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (auto [bm, bk] : shapes) {
      SCOPED_TRACE(std::string(to_string(dt)) + " " + std::to_string(bm) + "x" + std::to_string(bk));
      const BsrMatrix a = varied_bsr(bm, bk, dt, uint64_t(bm * 7 + bk));
      ASSERT_GE(a.nnzb(), 3);
      const BsrMatrix q = quantize_e4m3(a);  // the host
      const size_t n = size_t(a.nnzb()) * bm * bk;
      DeviceBuffer rp(a.row_ptr().data(), a.row_ptr().size() * 4), ci(a.col_idx().data(), a.col_idx().size() * 4),
          vals(a.value_bytes().data(), a.value_bytes().size());
      auto codes_buf = zeros(n), sc_buf = zeros(size_t(a.nnzb()) * 4);
      DeviceBuffer &codes = *codes_buf, &sc = *sc_buf;
      BsrView v = a.view();
      v.row_ptr = static_cast<const int32_t*>(rp.ptr);
      v.col_idx = static_cast<const int32_t*>(ci.ptr);
      v.values = vals.ptr;
      v.memory = Memory::device;
      quantize_e4m3(v, codes.ptr, static_cast<float*>(sc.ptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto dcodes = download<uint8_t>(codes);
      const auto dsc = download<float>(sc);
      EXPECT_EQ(first_difference(dcodes.data(), q.value_bytes().data(), n), -1);
      EXPECT_EQ(first_difference(dsc.data(), q.scales().data(), dsc.size() * 4), -1);
      // And back, into every output dtype.
      for (DType out : {DType::f32, DType::f16, DType::bf16}) {
        const BsrMatrix d = dequantize(q, out);
        auto dout_buf = zeros(n * dtype_size(out));
        DeviceBuffer& dout = *dout_buf;
        BsrView qv = v;
        qv.values = codes.ptr;
        qv.dtype = DType::e4m3;
        qv.scales = static_cast<const float*>(sc.ptr);
        dequantize(qv, dout.ptr, out);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = download<uint8_t>(dout);
        EXPECT_EQ(first_difference(got.data(), d.value_bytes().data(), got.size()), -1) << to_string(out);
      }
    }
}

TEST(QuantizeGpu, DenseMatchesTheHostBitForBit) {
  SPARSEK_REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  for (const DenseQuantCase& qc : dense_quant_cases()) {
    SCOPED_TRACE(qc.name());
    const auto& [dt, dim, group, lin, lout] = qc;
    HostDense in(45, 333, dt, lin, 7);
    in.fill_random(uint64_t(group) + 3 * uint64_t(dim) + uint64_t(dt));
    for (int64_t c = 0; c < 333; ++c) in.set(3, c, 0.f);
    for (int64_t r = 0; r < 45; ++r) in.set(r, 200, in.get(r, 200) * 1e3f);
    HostDense out(45, 333, DType::e4m3, lout, 9);
    const int64_t tokens = dim == ScaleDim::rows ? 45 : 333, K = dim == ScaleDim::rows ? 333 : 45;
    std::vector<float> sc(size_t(scale_count(tokens, K, group)));
    quantize_e4m3(in.view, out.view, sc.data(), dim, group);  // the host

    // The device output starts poisoned inside the matrix and as the host's outside it: the
    // kernel must write every element and leave the padding alone.
    std::vector<uint8_t> poisoned = out.bytes;
    for (int64_t r = 0; r < 45; ++r)
      for (int64_t c = 0; c < 333; ++c) poisoned[size_t(out.view.index(r, c))] = 0xAB;
    DeviceBuffer din(in.bytes.data(), in.bytes.size()), dout(poisoned.data(), poisoned.size());
    auto dsc_buf = zeros(sc.size() * 4);
    DeviceBuffer& dsc = *dsc_buf;
    DenseView vin = in.view, vout = out.view;
    vin.data = din.ptr;
    vin.memory = Memory::device;
    vout.data = dout.ptr;
    vout.memory = Memory::device;
    vout.scales = nullptr;
    vout.scale_group = 0;
    quantize_e4m3(vin, vout, static_cast<float*>(dsc.ptr), dim, group, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(vout.scales, static_cast<const float*>(dsc.ptr));
    const auto got = download<uint8_t>(dout);
    const auto gsc = download<float>(dsc);
    EXPECT_EQ(first_difference(got.data(), out.bytes.data(), got.size()), -1);
    EXPECT_EQ(first_difference(gsc.data(), sc.data(), sc.size() * 4), -1);
    for (DType o : {DType::f32, DType::bf16}) {
      HostDense back(45, 333, o, lin, 2), dback_h(45, 333, o, lin, 2);
      dequantize(out.view, back.view, dim);
      DeviceBuffer dback(dback_h.bytes.data(), dback_h.bytes.size());
      DenseView vb = dback_h.view;
      vb.data = dback.ptr;
      vb.memory = Memory::device;
      dequantize(vout, vb, dim, s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      dback.download(dback_h.bytes.data());
      // (padding: both hold zeros from construction)
      EXPECT_EQ(first_difference(dback_h.bytes.data(), back.bytes.data(), back.bytes.size()), -1) << to_string(o);
    }
  }
  cudaStreamDestroy(s);
}

// Host inputs must be finite; on the device the group holding a NaN or an infinity gets a NaN
// scale (and NaN codes), the other groups their usual bits, and a product refuses the NaN scale.
TEST(QuantizeGpu, NonFiniteGivesANanScaleThatProductsRefuse) {
  SPARSEK_REQUIRE_GPU();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    HostDense x(6, 256, DType::f16);
    x.fill_random(4);
    HostDense clean = x;  // the same values with the bad one zeroed, for the other groups' bits
    clean.view.data = clean.bytes.data();
    clean.set(2, 130, 0.f);
    x.set(2, 130, bad);
    HostDense q(6, 256, DType::e4m3);
    std::vector<float> sc(12);
    quantize_e4m3(clean.view, q.view, sc.data(), ScaleDim::rows, 128);
    DeviceBuffer dx(x.bytes.data(), x.bytes.size());
    auto dq_buf = zeros(q.bytes.size()), dsc_buf = zeros(12 * 4);
    DeviceBuffer &dq = *dq_buf, &dsc = *dsc_buf;
    DenseView vx = x.view, vq = q.view;
    vx.data = dx.ptr;
    vx.memory = Memory::device;
    vq.data = dq.ptr;
    vq.memory = Memory::device;
    quantize_e4m3(vx, vq, static_cast<float*>(dsc.ptr), ScaleDim::rows, 128);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto gsc = download<float>(dsc);
    const auto gq = download<uint8_t>(dq);
    for (int t = 0; t < 6; ++t)
      for (int g = 0; g < 2; ++g) {
        const size_t i = size_t(t * 2 + g);
        if (t == 2 && g == 1) {
          EXPECT_TRUE(std::isnan(gsc[i]));
          for (int k = 128; k < 256; ++k) EXPECT_EQ(gq[size_t(2 * 256 + k)], 0x7f) << k;
        } else {
          EXPECT_EQ(gsc[i], sc[i]) << t << "," << g;
        }
      }
    // A DDS with this A: its NaN scale is refused by index (the checks copy device scales).
    const Pattern p = pattern_of(2, {{0, 1}, {}});  // two block rows of 128 (the second empty)
    BsrMatrix w(256, 256, 128, 128, p.row_ptr, p.col_idx, DType::e4m3);
    DeviceBuffer wrp(w.row_ptr().data(), w.row_ptr().size() * 4), wci(w.col_idx().data(), 8),
        wv(w.value_bytes().data(), w.value_bytes().size()), ws(w.scales().data(), 8);
    HostDense c(6, 256, DType::f32);
    DeviceBuffer dc(c.bytes.data(), c.bytes.size());
    GemmArgs g;
    g.kind = OpKind::dds;
    g.op = Op::trans;
    g.sparse = w.view();
    g.sparse.row_ptr = static_cast<const int32_t*>(wrp.ptr);
    g.sparse.col_idx = static_cast<const int32_t*>(wci.ptr);
    g.sparse.values = wv.ptr;
    g.sparse.scales = static_cast<const float*>(ws.ptr);
    g.sparse.memory = Memory::device;
    g.a = vq;
    g.c = c.view;
    g.c.data = dc.ptr;
    g.c.memory = Memory::device;
    expect_invalid([&] { gemm(g); }, {"A scales[5]=nan is not finite"});
  }
}

}  // namespace
}  // namespace sparsek::test
