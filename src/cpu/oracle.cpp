// The fp64 reference. Deliberately naive and independent of the fast path (src/cpu/gemm_cpu.cpp):
// it walks the stored blocks element by element, reads every operand through DenseView::index and
// load_as_float, and accumulates in double. Slow is fine; obviously right is the point.
#include "cpu/oracle.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "format/attention_internal.hpp"

namespace sparsek {

namespace {

double dense_at(const DenseView& d, int64_t r, int64_t c) {
  return double(load_as_float(d.data, d.dtype, d.index(r, c)));
}

double bsr_at(const BsrView& s, int64_t block, int r, int c) {
  return double(load_as_float(s.values, s.dtype, (block * s.bm + r) * s.bk + c));
}

void require_host(const GemmArgs& g) {
  auto check = [](Memory m, const char* name) {
    if (m != Memory::host)
      throw Error(Status::invalid_argument,
                  std::string("oracle: all operands must be in host memory, but ") + name + " is in device memory");
  };
  check(g.sparse.memory, "the sparse operand");
  if (g.kind != OpKind::dsd) check(g.a.memory, "A");
  if (g.kind != OpKind::dds) check(g.b.memory, "B");
  if (g.kind != OpKind::sdd) check(g.c.memory, "C");
}

}  // namespace

std::vector<double> oracle(const GemmArgs& g) {
  require_host(g);
  const BsrView& s = g.sparse;
  const int64_t M = g.m(), N = g.n(), K = g.k();

  if (g.kind == OpKind::sdd) {
    // Every stored block (i, c) of C: sum over k of A(i*bm + r, k) * B(k, c*bk + cc).
    std::vector<double> out(size_t(s.nnzb * s.bm * s.bk), 0.0);
    for (int64_t i = 0; i < s.mb(); ++i)
      for (int64_t j = s.row_ptr[i]; j < s.row_ptr[i + 1]; ++j)
        for (int r = 0; r < s.bm; ++r)
          for (int cc = 0; cc < s.bk; ++cc) {
            const int64_t row = i * s.bm + r, col = int64_t(s.col_idx[j]) * s.bk + cc;
            double sum = 0.0;
            for (int64_t k = 0; k < K; ++k) sum += dense_at(g.a, row, k) * dense_at(g.b, k, col);
            double v = K > 0 ? double(g.alpha) * sum : 0.0;  // no product term at all when K = 0
            if (g.beta != 0.f) v += double(g.beta) * bsr_at(s, j, r, cc);
            out[size_t((j * s.bm + r) * s.bk + cc)] = v;
          }
    return out;
  }

  if (M == 0 || N == 0) return {};  // an empty C (its other extent may be huge: no work on it)
  // dsd / dds: accumulate the product into sum (M x N, row-major), one stored element at a time.
  // reached: the rows (dsd) or columns (dds) of C that some stored block contributes to; the
  // others get no product term at all (beta*C, or 0), whatever alpha is.
  std::vector<double> sum(size_t(M * N), 0.0);
  std::vector<char> reached(size_t(g.kind == OpKind::dsd ? M : N), 0);
  for (int64_t i = 0; i < s.mb(); ++i)
    for (int64_t j = s.row_ptr[i]; j < s.row_ptr[i + 1]; ++j)
      for (int r = 0; r < s.bm; ++r)
        for (int cc = 0; cc < s.bk; ++cc) {
          const double v = bsr_at(s, j, r, cc);
          // Position of this element in the stored matrix and in op(stored).
          const int64_t sr = i * s.bm + r, sc = int64_t(s.col_idx[j]) * s.bk + cc;
          const int64_t opr = g.op == Op::none ? sr : sc, opc = g.op == Op::none ? sc : sr;
          reached[size_t(g.kind == OpKind::dsd ? opr : opc)] = 1;
          if (g.kind == OpKind::dsd) {
            // C(opr, n) += op(A)(opr, opc) * B(opc, n)
            for (int64_t n = 0; n < N; ++n) sum[size_t(opr * N + n)] += v * dense_at(g.b, opc, n);
          } else {
            // C(m, opc) += A(m, opr) * op(B)(opr, opc)
            for (int64_t m = 0; m < M; ++m) sum[size_t(m * N + opc)] += dense_at(g.a, m, opr) * v;
          }
        }
  std::vector<double> out(sum.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const bool r = reached[size_t(g.kind == OpKind::dsd ? m : n)];
      double v = r ? double(g.alpha) * sum[size_t(m * N + n)] : 0.0;
      if (g.beta != 0.f) v += double(g.beta) * dense_at(g.c, m, n);
      out[size_t(m * N + n)] = v;
    }
  return out;
}

double max_rel_error(const GemmArgs& g, const std::vector<double>& ref) {
  require_host(g);
  std::vector<double> got;
  if (g.kind == OpKind::sdd) {
    const BsrView& s = g.sparse;
    got.resize(size_t(s.nnzb * s.bm * s.bk));
    for (size_t e = 0; e < got.size(); ++e) got[e] = double(load_as_float(s.values, s.dtype, int64_t(e)));
  } else {
    const int64_t M = g.c.rows, N = g.c.cols;
    got.resize(M > 0 && N > 0 ? size_t(M * N) : 0);
    for (int64_t m = 0; m < M && N > 0; ++m)
      for (int64_t n = 0; n < N; ++n) got[size_t(m * N + n)] = dense_at(g.c, m, n);
  }
  if (got.size() != ref.size())
    throw Error(Status::invalid_argument, "max_rel_error: output has " + std::to_string(got.size()) +
                                              " elements but the reference " + std::to_string(ref.size()));
  double scale = 0.0;
  for (double r : ref)
    if (std::isfinite(r)) scale = std::max(scale, std::fabs(r));
  scale += 1e-30;  // an all-zero reference must be matched exactly
  double worst = 0.0;
  for (size_t e = 0; e < ref.size(); ++e) {
    const double x = got[e], r = ref[e];
    if (!std::isfinite(x) || !std::isfinite(r)) {
      // Non-finite output is only right where the reference is the same non-finite value.
      const bool same = (std::isnan(x) && std::isnan(r)) || x == r;
      if (!same) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::fabs(x - r) / scale);
  }
  return worst;
}

// ---- attention ----

void attention_oracle_row(const AttentionArgs& a, int64_t b, int64_t h, int64_t s, double* o, double* lse) {
  const AttentionLayout& l = a.layout;
  const int64_t D = a.q.d, Hq = a.q.h, Hkv = a.k.h, Skv = a.k.s, hk = h / (Hq / Hkv);
  const int64_t r = layout_row(l, Hq, Hkv, b, h, s / l.block_q);
  // The attended keys: the masked list (causal inside it), then the full list; never past Skv.
  std::vector<int64_t> keys;
  auto add = [&](const int32_t* list, int32_t n, bool masked) {
    for (int32_t j = 0; j < n; ++j)
      for (int64_t c = int64_t(list[j]) * l.block_kv; c < std::min(Skv, int64_t(list[j] + 1) * l.block_kv); ++c)
        if (!(masked && a.causal && c > s)) keys.push_back(c);
  };
  add(l.kv_indices + r * l.kmax, l.kv_num_blocks[r], true);
  if (l.has_full()) add(l.full_kv_indices + r * l.full_kmax, l.full_kv_num_blocks[r], false);
  std::fill(o, o + D, 0.0);
  if (keys.empty()) {
    *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  const double scale = double(a.softmax_scale());
  std::vector<double> score(keys.size());
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t e = 0; e < keys.size(); ++e) {
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d)
      dot += double(load_as_float(a.q.data, a.q.dtype, a.q.index(b, h, s, d))) *
             double(load_as_float(a.k.data, a.k.dtype, a.k.index(b, hk, keys[e], d)));
    score[e] = scale * dot;
    mx = std::max(mx, score[e]);
  }
  double sum = 0.0;
  for (double& x : score) sum += (x = std::exp(x - mx));
  for (size_t e = 0; e < keys.size(); ++e)
    for (int64_t d = 0; d < D; ++d)
      o[d] += score[e] / sum * double(load_as_float(a.v.data, a.v.dtype, a.v.index(b, hk, keys[e], d)));
  *lse = mx + std::log(sum);
}

AttentionReference attention_oracle(const AttentionArgs& a) {
  validate(a, true);
  if (a.q.memory != Memory::host)
    throw Error(Status::invalid_argument, "attention oracle: the tensors and the layout must be in host memory");
  const int64_t B = a.q.b, Hq = a.q.h, Sq = a.q.s, D = a.q.d;
  AttentionReference ref;
  ref.o.resize(size_t(B * Hq * Sq * D));
  ref.lse.resize(size_t(B * Hq * Sq));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t s = 0; s < Sq; ++s) {
        const int64_t row = (b * Hq + h) * Sq + s;
        attention_oracle_row(a, b, h, s, &ref.o[size_t(row * D)], &ref.lse[size_t(row)]);
      }
  return ref;
}

}  // namespace sparsek
