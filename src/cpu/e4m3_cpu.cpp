// e4m3 operands of the CPU backend decoded to fp32 (e4m3_cpu.hpp).
#include "cpu/e4m3_cpu.hpp"

#include <algorithm>

#include "cpu/parallel.hpp"
#include "kernels/quant/rule.hpp"

namespace sparsek {

void decode_e4m3_blocks(const BsrView& a, const int32_t* src, bool transpose, float* out, int threads) {
  const int64_t bsz = int64_t(a.bm) * a.bk;
  const auto* codes = static_cast<const uint8_t*>(a.values);
  parallel_for(a.nnzb, threads, [&](int64_t t, int) {
    const int64_t j = src ? src[t] : t;
    const uint8_t* blk = codes + j * bsz;
    const float scale = a.scales[j];
    float* dst = out + t * bsz;
    if (transpose) {
      for (int r = 0; r < a.bm; ++r)
        for (int c = 0; c < a.bk; ++c) dst[int64_t(c) * a.bm + r] = quant::value_of(blk[int64_t(r) * a.bk + c], scale);
    } else {
      for (int64_t e = 0; e < bsz; ++e) dst[e] = quant::value_of(blk[e], scale);
    }
  });
}

void decode_e4m3_panel(const DenseView& d, float* out, int64_t ld, int threads) {
  const auto* codes = static_cast<const uint8_t*>(d.data);
  const int64_t K = d.rows, groups = d.scale_group == 0 ? 1 : (K + d.scale_group - 1) / d.scale_group;
  const int64_t group = d.scale_group == 0 ? std::max<int64_t>(K, 1) : d.scale_group;
  const bool row = d.layout == Layout::row_major;
  // Chunks of 16 rows (as the backend's own panels): a column-major source is read 16 contiguous
  // codes per column.
  parallel_for((K + 15) / 16, threads, [&](int64_t ch, int) {
    const int64_t r0 = ch * 16, r1 = std::min(K, r0 + 16);
    for (int64_t c = 0; c < d.cols; ++c) {
      const float* sc = d.scales + c * groups;
      for (int64_t r = r0; r < r1; ++r)
        out[r * ld + c] = quant::value_of(codes[row ? r * d.ld + c : c * d.ld + r], sc[r / group]);
    }
  });
}

}  // namespace sparsek
