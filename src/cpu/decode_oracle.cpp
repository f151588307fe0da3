// The fp64 reference of decode attention: straight from the definition in sparsek/decode.hpp,
// one row (token, query head) at a time, no online softmax.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/oracle.hpp"
#include "format/decode_internal.hpp"

namespace sparsek {

DecodeReference decode_oracle(const DecodeArgs& a) {
  if (a.q.memory != Memory::host)
    throw Error(Status::invalid_argument, "decode_oracle: the operands must be in host memory");
  validate(a, true);
  const DecodeIndices ix = host_decode_indices(a, nullptr);
  const int64_t T = a.q.t, Hq = a.q.h, D = a.q.d, Hkv = a.k.h, G = Hq / Hkv, ps = a.k.page_size;
  const double scale = double(a.softmax_scale());
  DecodeReference ref;
  ref.o.assign(size_t(T * Hq * D), 0.0);
  ref.lse.assign(size_t(T * Hq), -std::numeric_limits<double>::infinity());
  std::vector<int64_t> pos;  // visible key positions of one row
  std::vector<double> s;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t q0 = ix.cu_seqlens_q[b], n = ix.cu_seqlens_q[b + 1] - q0, len = ix.seq_lens[b];
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      std::vector<int64_t> pages;
      if (a.has_selection()) {
        const int64_t c = ix.sel_counts[b * Hkv + hk];
        for (int64_t e = 0; e < c; ++e) pages.push_back(ix.sel_indices[(b * Hkv + hk) * a.sel_kmax + e]);
      } else {
        for (int64_t p = 0; p * ps < len; ++p) pages.push_back(p);
      }
      for (int64_t j = 0; j < n; ++j) {
        const int64_t limit = a.causal_new ? len - n + j + 1 : len;  // positions < limit are visible
        pos.clear();
        for (int64_t p : pages)
          for (int64_t x = p * ps; x < std::min((p + 1) * ps, limit); ++x) pos.push_back(x);
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = hk * G + g, t = q0 + j;
          if (pos.empty()) continue;  // O = 0, LSE = -inf
          s.assign(pos.size(), 0.0);
          double mx = -std::numeric_limits<double>::infinity();
          for (size_t i = 0; i < pos.size(); ++i) {
            const int64_t pp = ix.page_table[b * a.max_pages + pos[i] / ps], slot = pos[i] % ps;
            double acc = 0;
            for (int64_t d = 0; d < D; ++d)
              acc += double(load_as_float(a.q.data, a.q.dtype, a.q.index(t, h, d))) *
                     double(load_as_float(a.k.data, a.k.dtype, a.k.index(pp, slot, hk, d)));
            s[i] = scale * acc;
            mx = std::max(mx, s[i]);
          }
          double sum = 0;
          for (double& x : s) sum += (x = std::exp(x - mx));
          double* o = &ref.o[size_t((t * Hq + h) * D)];
          for (size_t i = 0; i < pos.size(); ++i) {
            const int64_t pp = ix.page_table[b * a.max_pages + pos[i] / ps], slot = pos[i] % ps;
            for (int64_t d = 0; d < D; ++d)
              o[d] += s[i] / sum * double(load_as_float(a.v.data, a.v.dtype, a.v.index(pp, slot, hk, d)));
          }
          ref.lse[size_t(t * Hq + h)] = mx + std::log(sum);
        }
      }
    }
  }
  return ref;
}

}  // namespace sparsek
