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

// An e4m3 input's element is its scale times its code's value, here multiplied in double (exact:
// 4 significant bits times 24). The scale of a dense element depends on the operand's role: a
// token is a row of a DDS's A (K along its columns) or a column of a DSD's B (K along its rows).
double dense_in(const DenseView& d, bool tokens_are_rows, int64_t r, int64_t c) {
  const double v = dense_at(d, r, c);
  if (d.dtype != DType::e4m3) return v;
  const int64_t t = tokens_are_rows ? r : c, k = tokens_are_rows ? c : r, K = tokens_are_rows ? d.cols : d.rows;
  const int64_t groups = d.scale_group == 0 ? 1 : (K + d.scale_group - 1) / d.scale_group;
  const int64_t g = d.scale_group == 0 ? 0 : k / d.scale_group;
  return double(d.scales[t * groups + g]) * v;
}

double bsr_at(const BsrView& s, int64_t block, int r, int c) {
  const double v = double(load_as_float(s.values, s.dtype, (block * s.bm + r) * s.bk + c));
  return s.dtype == DType::e4m3 ? double(s.scales[block]) * v : v;
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
            for (int64_t n = 0; n < N; ++n) sum[size_t(opr * N + n)] += v * dense_in(g.b, false, opc, n);
          } else {
            // C(m, opc) += A(m, opr) * op(B)(opr, opc)
            for (int64_t m = 0; m < M; ++m) sum[size_t(m * N + opc)] += dense_in(g.a, true, m, opr) * v;
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

namespace {
// The keys query row s of (batch b, query head h) attends, in the layout's order: the masked list
// (causal inside it), then the full list; never past Skv. A count outside [0, kmax] is clamped and
// an index outside [0, Nk) skipped (the CPU backward's run() reads unchecked layouts through this;
// validated ones have neither).
// With packed sequences only keys of row s's own sequence (a linear count of the offsets at or
// below each row: independent of the backends' binary searches).
void attended_keys(const AttentionArgs& a, int64_t b, int64_t h, int64_t s, std::vector<int64_t>& keys) {
  const AttentionLayout& l = a.layout;
  const int64_t Skv = a.k.s, nk = (Skv + l.block_kv - 1) / l.block_kv;
  auto sequence = [&](int64_t x) {
    int64_t n = 0;
    for (int64_t i = 1; i < a.num_seqs; ++i) n += a.cu_seqlens[i] <= x;
    return n;
  };
  const int64_t seq = a.cu_seqlens ? sequence(s) : 0;
  const int64_t r = layout_row(l, a.q.h, a.k.h, b, h, s / l.block_q);
  keys.clear();
  auto add = [&](const int32_t* list, int32_t count, int64_t kmax, bool masked) {
    const int64_t n = std::clamp<int64_t>(count, 0, kmax);
    for (int64_t j = 0; j < n; ++j) {
      if (list[j] < 0 || list[j] >= nk) continue;
      for (int64_t c = int64_t(list[j]) * l.block_kv; c < std::min(Skv, int64_t(list[j] + 1) * l.block_kv); ++c)
        if (!(masked && a.causal && c > s) && (!a.cu_seqlens || sequence(c) == seq)) keys.push_back(c);
    }
  };
  add(l.kv_indices + r * l.kmax, l.kv_num_blocks[r], l.kmax, true);
  if (l.has_full()) add(l.full_kv_indices + r * l.full_kmax, l.full_kv_num_blocks[r], l.full_kmax, false);
}

double at(const Tensor4View& t, int64_t b, int64_t h, int64_t s, int64_t d) {
  return double(load_as_float(t.data, t.dtype, t.index(b, h, s, d)));
}
}  // namespace

void attention_oracle_row(const AttentionArgs& a, int64_t b, int64_t h, int64_t s, double* o, double* lse) {
  const int64_t D = a.q.d, hk = h / (a.q.h / a.k.h);
  std::vector<int64_t> keys;
  attended_keys(a, b, h, s, keys);
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
    for (int64_t d = 0; d < D; ++d) dot += at(a.q, b, h, s, d) * at(a.k, b, hk, keys[e], d);
    score[e] = scale * dot;
    mx = std::max(mx, score[e]);
  }
  double sum = 0.0;
  for (double& x : score) sum += (x = std::exp(x - mx));
  for (size_t e = 0; e < keys.size(); ++e)
    for (int64_t d = 0; d < D; ++d)
      o[d] += score[e] / sum * at(a.v, b, hk, keys[e], d);
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

// ---- the attention backward ----

namespace {

// One query row's share of the backward, from the definition. row_terms() computes the row's
// P (exact softmax over its attended keys), dP_j = dO . v_j and Delta = sum_j P_j dP_j, then
// calls term(e) for every attended key e, with
//   ds = scale * P_e (dP_e - Delta)                                   (dq += ds k_e, dk_e += ds q)
//   ds_mag = |scale| * P_e (|dP_e - Delta| + sum_d |O_d dO_d|)            (the rounding bound's weight)
// Returns false (no call) when the row attends nothing.
struct RowTerms {
  std::vector<int64_t> keys;
  std::vector<double> p, dp, q, g, o;
  double ds = 0, ds_mag = 0;
};
template <class Term>
bool row_terms(const AttentionArgs& a, const Tensor4View& dout, int64_t b, int64_t h, int64_t s, bool mags,
               RowTerms& w, const Term& term) {
  const int64_t D = a.q.d, hk = h / (a.q.h / a.k.h);
  const double scale = double(a.softmax_scale());
  attended_keys(a, b, h, s, w.keys);
  if (w.keys.empty()) return false;
  const size_t n = w.keys.size();
  w.q.resize(size_t(D)), w.g.resize(size_t(D)), w.o.assign(size_t(D), 0.0);
  for (int64_t d = 0; d < D; ++d) w.q[size_t(d)] = at(a.q, b, h, s, d), w.g[size_t(d)] = at(dout, b, h, s, d);
  w.p.resize(n);
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t e = 0; e < n; ++e) {
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += w.q[size_t(d)] * at(a.k, b, hk, w.keys[e], d);
    w.p[e] = scale * dot;
    mx = std::max(mx, w.p[e]);
  }
  double sum = 0.0;
  for (double& x : w.p) sum += (x = std::exp(x - mx));
  for (double& x : w.p) x /= sum;
  w.dp.assign(n, 0.0);
  double delta = 0.0;
  for (size_t e = 0; e < n; ++e) {
    for (int64_t d = 0; d < D; ++d) {
      const double v = at(a.v, b, hk, w.keys[e], d);
      w.dp[e] += w.g[size_t(d)] * v;
      if (mags) w.o[size_t(d)] += w.p[e] * v;
    }
    delta += w.p[e] * w.dp[e];
  }
  double o_do = 0.0;  // sum_d |O_d dO_d|: bounds Delta's error when taken from a rounded O
  for (int64_t d = 0; mags && d < D; ++d) o_do += std::fabs(w.o[size_t(d)] * w.g[size_t(d)]);
  for (size_t e = 0; e < n; ++e) {
    w.ds = scale * w.p[e] * (w.dp[e] - delta);
    w.ds_mag = std::fabs(scale) * w.p[e] * (std::fabs(w.dp[e] - delta) + o_do);
    term(e);
  }
  return true;
}

void zero(double* p, int64_t n) {
  if (p) std::fill(p, p + n, 0.0);
}

}  // namespace

void attention_backward_oracle_head(const AttentionArgs& a, const Tensor4View& dout, int64_t b, int64_t hk,
                                    const BackwardHeadOut& out) {
  const int64_t D = a.q.d, Sq = a.q.s, Skv = a.k.s, G = a.q.h / a.k.h;
  const bool mags = out.mag_dq || out.mag_dk || out.mag_dv;
  zero(out.dq, G * Sq * D), zero(out.mag_dq, G * Sq * D);
  for (double* p : {out.dk, out.dv, out.mag_dk, out.mag_dv}) zero(p, Skv * D);
  if (out.q_live) std::fill(out.q_live, out.q_live + G * Sq, 0);
  if (out.k_live) std::fill(out.k_live, out.k_live + Skv, 0);
  RowTerms w;
  for (int64_t gi = 0; gi < G; ++gi)
    for (int64_t s = 0; s < Sq; ++s) {
      const size_t row = size_t(gi * Sq + s);
      const bool live = row_terms(a, dout, b, hk * G + gi, s, mags, w, [&](size_t e) {
        const int64_t key = w.keys[e];
        if (out.k_live) out.k_live[key] = 1;
        for (int64_t d = 0; d < D; ++d) {
          const double kd = at(a.k, b, hk, key, d), qd = w.q[size_t(d)], gd = w.g[size_t(d)];
          const size_t qi = row * size_t(D) + size_t(d), ki = size_t(key * D + d);
          out.dq[qi] += w.ds * kd;
          out.dk[ki] += w.ds * qd;
          out.dv[ki] += w.p[e] * gd;
          if (out.mag_dq) out.mag_dq[qi] += w.ds_mag * std::fabs(kd);
          if (out.mag_dk) out.mag_dk[ki] += w.ds_mag * std::fabs(qd);
          if (out.mag_dv) out.mag_dv[ki] += w.p[e] * std::fabs(gd);
        }
      });
      if (out.q_live) out.q_live[row] = live;
    }
}

void attention_backward_oracle_row(const AttentionArgs& a, const Tensor4View& dout, int64_t b, int64_t h, int64_t s,
                                   double* dq, double* mag_dq) {
  const int64_t D = a.q.d, hk = h / (a.q.h / a.k.h);
  zero(dq, D), zero(mag_dq, D);
  RowTerms w;
  row_terms(a, dout, b, h, s, mag_dq != nullptr, w, [&](size_t e) {
    for (int64_t d = 0; d < D; ++d) {
      const double kd = at(a.k, b, hk, w.keys[e], d);
      dq[d] += w.ds * kd;
      if (mag_dq) mag_dq[d] += w.ds_mag * std::fabs(kd);
    }
  });
}

void attention_backward_oracle_key_block(const AttentionArgs& a, const Tensor4View& dout, int64_t b, int64_t hk,
                                         int64_t j, double* dk, double* dv, double* mag_dk, double* mag_dv) {
  const AttentionLayout& l = a.layout;
  const int64_t D = a.q.d, G = a.q.h / a.k.h, k0 = j * l.block_kv, n = std::min(a.k.s, k0 + l.block_kv) - k0;
  for (double* p : {dk, dv, mag_dk, mag_dv}) zero(p, n * D);
  RowTerms w;
  std::vector<int64_t> keys;
  for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
    for (int64_t s = 0; s < a.q.s; ++s) {
      attended_keys(a, b, h, s, keys);  // skip rows that attend no key of the block (cheap: no scores)
      if (std::none_of(keys.begin(), keys.end(), [&](int64_t c) { return c >= k0 && c < k0 + n; })) continue;
      row_terms(a, dout, b, h, s, mag_dk || mag_dv, w, [&](size_t e) {
        const int64_t key = w.keys[e];
        if (key < k0 || key >= k0 + n) return;
        for (int64_t d = 0; d < D; ++d) {
          const size_t ki = size_t((key - k0) * D + d);
          dk[ki] += w.ds * w.q[size_t(d)];
          dv[ki] += w.p[e] * w.g[size_t(d)];
          if (mag_dk) mag_dk[ki] += w.ds_mag * std::fabs(w.q[size_t(d)]);
          if (mag_dv) mag_dv[ki] += w.p[e] * std::fabs(w.g[size_t(d)]);
        }
      });
    }
}

AttentionBackwardReference attention_backward_oracle(const AttentionBackwardArgs& args) {
  validate(args, true);
  const AttentionArgs& a = args.forward;
  if (a.q.memory != Memory::host)
    throw Error(Status::invalid_argument, "attention backward oracle: the tensors and the layout must be in host memory");
  const int64_t B = a.q.b, Hq = a.q.h, Sq = a.q.s, D = a.q.d, Hkv = a.k.h, Skv = a.k.s, G = Hq / Hkv;
  AttentionBackwardReference ref;
  for (auto* v : {&ref.dq, &ref.mag_dq}) v->resize(size_t(B * Hq * Sq * D));
  for (auto* v : {&ref.dk, &ref.dv, &ref.mag_dk, &ref.mag_dv}) v->resize(size_t(B * Hkv * Skv * D));
  ref.q_live.resize(size_t(B * Hq * Sq));
  ref.k_live.resize(size_t(B * Hkv * Skv));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      // Packed: the group's query heads hk * G .. hk * G + G - 1 are consecutive.
      const size_t qrow = size_t((b * Hq + hk * G) * Sq), krow = size_t((b * Hkv + hk) * Skv);
      BackwardHeadOut out;
      out.dq = &ref.dq[qrow * size_t(D)], out.mag_dq = &ref.mag_dq[qrow * size_t(D)];
      out.dk = &ref.dk[krow * size_t(D)], out.mag_dk = &ref.mag_dk[krow * size_t(D)];
      out.dv = &ref.dv[krow * size_t(D)], out.mag_dv = &ref.mag_dv[krow * size_t(D)];
      out.q_live = &ref.q_live[qrow], out.k_live = &ref.k_live[krow];
      attention_backward_oracle_head(a, args.dout, b, hk, out);
    }
  return ref;
}

}  // namespace sparsek
