// CPU backend: DSD, DDS and SDD on host memory, multi-threaded, fp32 accumulation.
//
// Every product is brought onto float operands and one of two loops:
//
//  * row product  O (R x Nc) = S * D     S: float BSR with (p x q) blocks, D: float row-major
//                                         panel (S.kb*q x Np), Np = Nc rounded up to 16.
//      dsd none :  O = C,    S = A,    D = B
//      dsd trans:  O = C,    S = A^T,  D = B
//      dds none :  O = C^T,  S = B^T,  D = A^T      (C^T = B^T A^T)
//      dds trans:  O = C^T,  S = B,    D = A^T      (C^T = B A^T)
//    A work item is (block row of S, 128-column chunk of D); it owns its output tile, so no two
//    threads ever add into the same element.
//  * block product (SDD): each stored block of C = A[rows of the block, :] * B[:, cols of the
//    block]; a work item is one stored block.
//
// Block products: through OpenBLAS's sgemm where the build has it (cpu/blas_cpu.hpp): one call of
// p x cols x q per stored block of a row-product work item (256 columns wide), one of bm x bk x K
// per SDD block; else the 4x16 loop below. Either way the work item accumulates in its own f32
// scratch and write_tile applies alpha and beta, so every semantic is the same on both paths.
//
// Determinism: an output element is reduced by exactly one work item, over S's blocks in stored
// order (k ascending inside a block for the loop; one sgemm per block, on extents fixed by the
// problem, for BLAS), or over k (SDD). The chunking depends only on the problem, never on the
// thread count, and BLAS runs one thread per call (CpuBlasOneThread), so any thread count gives
// bit-identical results.
//
// Threads: OpenMP (dynamic schedule: items differ in length). Options::threads, else
// OMP_NUM_THREADS / omp_get_max_threads(). An output element that no stored block reaches (an
// empty row of S, or K = 0 for SDD) is beta*C, or 0, whatever alpha is (alpha = Inf times an
// empty sum would be NaN).
//
// The plan's state keeps its own copy of the pattern and run() reads only that copy: a caller's
// pattern edited in place after planning (which the one-shot plan cache can miss when the edit
// keeps the pattern hash) can never steer an index out of the planned bounds.
#include <algorithm>
#include <memory>
#include <thread>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/blas_cpu.hpp"
#include "cpu/e4m3_cpu.hpp"
#include "cpu/parallel.hpp"
#include "format/format_internal.hpp"
#include "plan/backends.hpp"

namespace sparsek {

int cpu_threads(int requested) {
  if (requested > 0) return requested;
#ifdef _OPENMP
  return std::max(1, omp_get_max_threads());
#else
  return int(std::max(1u, std::thread::hardware_concurrency()));
#endif
}

namespace {

constexpr int64_t kChunk = 128;  // D columns per row-product work item (multiple of 16)
// D columns per work item when the block products go through BLAS: a 64 x 256 x 64 sgemm ran at
// 103 GFLOPS on one core against 71-76 at 512-4096 columns (docs/design/cpu.md). The accumulator
// is not zeroed first: the first block's call has beta = 0, which BLAS defines as not reading C.
constexpr int64_t kBlasChunk = 256;

// ---------------------------------------------------------------- element access

template <class T> inline float to_f(T v);
template <> inline float to_f<float>(float v) { return v; }
template <> inline float to_f<half_t>(half_t v) { return half_to_float(v); }
template <> inline float to_f<bfloat16_t>(bfloat16_t v) { return bf16_to_float(v); }
template <class T> inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline half_t from_f<half_t>(float v) { return float_to_half(v); }
template <> inline bfloat16_t from_f<bfloat16_t>(float v) { return float_to_bf16(v); }

// Calls f(T*) with the pointer cast to the storage type of dtype.
template <class F>
void with_type(DType d, void* p, const F& f) {
  switch (d) {
    case DType::f32: f(static_cast<float*>(p)); return;
    case DType::f16: f(static_cast<half_t*>(p)); return;
    case DType::bf16: f(static_cast<bfloat16_t*>(p)); return;
    case DType::e4m3: break;  // decoded with its scales instead (cpu/e4m3_cpu.hpp)
  }
  throw Error(Status::internal, "cpu backend: unknown dtype " + std::to_string(int(d)));
}

// The same matrix seen as its transpose (no copy): rows <-> cols and the layout flips.
DenseView transposed(const DenseView& d) {
  DenseView t = d;
  t.rows = d.cols;
  t.cols = d.rows;
  t.layout = d.layout == Layout::row_major ? Layout::col_major : Layout::row_major;
  return t;
}

// Element strides of a dense view: element (r, c) is at r*rs + c*cs.
void strides(const DenseView& d, int64_t& rs, int64_t& cs) {
  if (d.layout == Layout::row_major) {
    rs = d.ld;
    cs = 1;
  } else {
    rs = 1;
    cs = d.ld;
  }
}

// ---------------------------------------------------------------- float operands

// A dense operand as a float row-major panel: rows x width, row stride ld; columns
// [source cols, width) are zero.
struct Panel {
  const float* data = nullptr;
  int64_t width = 0, ld = 0;
  std::vector<float> store;
};

// pad16: round the width up to a multiple of 16 (the micro-kernel's width). An f32 row-major
// source that needs no padding is used in place.
void make_panel(const DenseView& d, bool pad16, int threads, Panel& out) {
  out.width = pad16 ? (d.cols + 15) / 16 * 16 : d.cols;
  if (d.dtype == DType::f32 && d.layout == Layout::row_major && d.cols == out.width) {
    out.data = static_cast<const float*>(d.data);
    out.ld = d.ld;
    return;
  }
  out.ld = std::max<int64_t>(out.width, 1);
  out.store.assign(size_t(d.rows * out.ld), 0.f);
  out.data = out.store.data();
  if (d.dtype == DType::e4m3) return decode_e4m3_panel(d, out.store.data(), out.ld, threads);  // scales applied
  int64_t rs, cs;
  strides(d, rs, cs);
  // Chunks of 16 rows: for column-major sources the inner row loop then reads 16 contiguous
  // elements per column.
  const int64_t chunks = (d.rows + 15) / 16;
  with_type(d.dtype, d.data, [&](auto* src) {
    parallel_for(chunks, threads, [&](int64_t ch, int) {
      const int64_t r0 = ch * 16, r1 = std::min(d.rows, r0 + 16);
      float* dst = out.store.data();
      for (int64_t c = 0; c < d.cols; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[r * out.ld + c] = to_f(src[r * rs + c * cs]);
    });
  });
}

// The pattern-dependent part of a product (prepared once per pattern by plan()).
struct CpuState : VariantState {
  // The planned pattern (the caller's row_ptr / col_idx are not read again).
  std::vector<int32_t> row_ptr, col_idx;
  // Transposed traversal (for dsd trans / dds none): block rows of S = block columns of the
  // stored matrix; t.src[b] = the stored block that S's block b comes from.
  bool transpose = false;
  PatternTranspose t;
  // S's block rows, longest first (load balance; does not change any result).
  std::vector<int32_t> order;
  // SDD: the block row of every stored block of C.
  std::vector<int32_t> block_row;
};

bool needs_transpose(const GemmArgs& g) {
  if (g.kind == OpKind::dsd) return g.op == Op::trans;
  if (g.kind == OpKind::dds) return g.op == Op::none;
  return false;
}

std::unique_ptr<CpuState> build_state(const GemmArgs& g) {
  auto st = std::make_unique<CpuState>();
  const BsrView& a = g.sparse;
  const int64_t mb = a.mb(), kb = a.kb();
  // Nothing to write (run() returns at once): no set-up, whose cost can grow with kb, not C.
  if (g.kind != OpKind::sdd && (g.m() == 0 || g.n() == 0)) return st;
  st->row_ptr.assign(a.row_ptr, a.row_ptr + mb + 1);
  if (a.nnzb > 0) st->col_idx.assign(a.col_idx, a.col_idx + a.nnzb);
  if (g.kind == OpKind::sdd) {
    st->block_row.resize(size_t(a.nnzb));
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t j = st->row_ptr[size_t(i)]; j < st->row_ptr[size_t(i + 1)]; ++j) st->block_row[size_t(j)] = int32_t(i);
    return st;
  }
  int64_t s_mb = mb;
  const int32_t* rp = st->row_ptr.data();
  if (needs_transpose(g)) {
    st->transpose = true;
    st->t = transpose_pattern(st->row_ptr.data(), st->col_idx.data(), mb, kb);
    s_mb = kb;
    rp = st->t.row_ptr.data();
  }
  st->order.resize(size_t(s_mb));
  for (int64_t i = 0; i < s_mb; ++i) st->order[size_t(i)] = int32_t(i);
  std::stable_sort(st->order.begin(), st->order.end(),
                   [&](int32_t x, int32_t y) { return rp[x + 1] - rp[x] > rp[y + 1] - rp[y]; });
  return st;
}

// ---------------------------------------------------------------- micro-kernel

// acc (4 x 16, row stride ldc) += a (4 x K, row stride lda) * b (K x 16, row stride ldb).
// k runs ascending for every element: the reduction order is fixed.
inline void kernel_4x16(const float* __restrict a, int64_t lda, const float* __restrict b, int64_t ldb,
                        int64_t K, float* __restrict acc, int64_t ldc) {
  float c0[16], c1[16], c2[16], c3[16];
  for (int j = 0; j < 16; ++j) {
    c0[j] = acc[j];
    c1[j] = acc[ldc + j];
    c2[j] = acc[2 * ldc + j];
    c3[j] = acc[3 * ldc + j];
  }
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    const float a0 = a[k], a1 = a[lda + k], a2 = a[2 * lda + k], a3 = a[3 * lda + k];
    for (int j = 0; j < 16; ++j) {
      c0[j] += a0 * bk[j];
      c1[j] += a1 * bk[j];
      c2[j] += a2 * bk[j];
      c3[j] += a3 * bk[j];
    }
  }
  for (int j = 0; j < 16; ++j) {
    acc[j] = c0[j];
    acc[ldc + j] = c1[j];
    acc[2 * ldc + j] = c2[j];
    acc[3 * ldc + j] = c3[j];
  }
}

// out (rows x cols at base, strides rs/cs) = alpha*acc + beta*out; out is not read when beta == 0.
// Without contributions (`reached` false) the product term is absent, not alpha*0: beta*out or 0.
template <class T>
void write_tile(T* base, int64_t rs, int64_t cs, int64_t rows, int64_t cols, const float* acc, int64_t ldacc,
                float alpha, float beta, bool reached) {
  auto one = [&](int64_t r, int64_t c) {
    T& o = base[r * rs + c * cs];
    float v = reached ? alpha * acc[r * ldacc + c] : 0.f;
    if (beta != 0.f) v += beta * to_f(o);
    o = from_f<T>(v);
  };
  if (cs == 1 || rs != 1) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) one(r, c);
  } else {  // column-major output: walk down columns
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) one(r, c);
  }
}

// ---------------------------------------------------------------- DSD / DDS

void run_row_product(const GemmArgs& g, const Options& o, const CpuState& st) {
  const BsrView& a = g.sparse;
  const bool dds = g.kind == OpKind::dds;
  // Output and dense operand in the row-product frame.
  const DenseView out = dds ? transposed(g.c) : g.c;
  const DenseView dense = dds ? transposed(g.a) : g.b;
  const int64_t R = out.rows, Nc = out.cols;
  if (R == 0 || Nc == 0) return;
  const int threads = thread_count(o, g.effective_flops() + double(R) * double(Nc));

  // S: block shape p x q, float values [nnzb][p][q].
  const int p = st.transpose ? a.bk : a.bm, q = st.transpose ? a.bm : a.bk;
  const int32_t* s_rp = st.transpose ? st.t.row_ptr.data() : st.row_ptr.data();
  const int32_t* s_ci = st.transpose ? st.t.col_idx.data() : st.col_idx.data();
  const int64_t bsz = int64_t(a.bm) * a.bk;
  std::vector<float> s_store;
  const float* s_vals = static_cast<const float*>(a.values);
  if (st.transpose || a.dtype != DType::f32) {
    s_store.resize(size_t(a.nnzb * bsz));
    if (a.dtype == DType::e4m3)  // fp8: decoded with the block scales
      decode_e4m3_blocks(a, st.transpose ? st.t.src.data() : nullptr, st.transpose, s_store.data(), threads);
    else
    with_type(a.dtype, a.values, [&](auto* v) {
      parallel_for(a.nnzb, threads, [&](int64_t t, int) {
        const int64_t j = st.transpose ? st.t.src[size_t(t)] : t;
        const auto* blk = v + j * bsz;
        float* dst = s_store.data() + t * bsz;
        if (st.transpose) {
          for (int r = 0; r < a.bm; ++r)
            for (int c = 0; c < a.bk; ++c) dst[int64_t(c) * a.bm + r] = to_f(blk[int64_t(r) * a.bk + c]);
        } else {
          for (int64_t e = 0; e < bsz; ++e) dst[e] = to_f(blk[e]);
        }
      });
    });
    s_vals = s_store.data();
  }

  Panel d;
  make_panel(dense, /*pad16=*/true, threads, d);

  const int64_t s_mb = R / p;
  // Block products through BLAS where it is there: the chunks are wider (fewer, larger calls).
  const bool blas = cpu_blas_available() && cpu_blas_fits(p, d.width, q, q, d.ld, d.width);
  const int64_t chunk = blas ? kBlasChunk : kChunk;
  const int64_t chunks = (d.width + chunk - 1) / chunk;
  const int workers = int(std::min<int64_t>(threads, s_mb * chunks));
  std::vector<std::vector<float>> accs(size_t(std::max(workers, 1)));
  int64_t rs, cs;
  strides(out, rs, cs);

  std::unique_ptr<CpuBlasOneThread> one_thread;
  if (blas) one_thread = std::make_unique<CpuBlasOneThread>();
  with_type(out.dtype, out.data, [&](auto* cdata) {
    parallel_for(s_mb * chunks, workers, [&](int64_t item, int w) {
      const int64_t i = st.order[size_t(item / chunks)];
      const int64_t n0 = (item % chunks) * chunk;
      const int64_t nt = std::min(chunk, d.width - n0);  // multiple of 16
      const int64_t cols = std::min(nt, Nc - n0);
      if (cols <= 0) return;
      std::vector<float>& acc = accs[size_t(w)];
      if (blas) {
        // acc = sum over S's blocks in stored order of block (p x q) * D rows (q x cols): the
        // same calls, on the same extents, whatever the thread count.
        acc.resize(size_t(p * nt));
        for (int64_t j = s_rp[i]; j < s_rp[i + 1]; ++j)
          cpu_sgemm(p, cols, q, s_vals + j * bsz, q, d.data + int64_t(s_ci[j]) * q * d.ld + n0, d.ld,
                    /*accumulate=*/j > s_rp[i], acc.data(), nt);
      } else {
        acc.assign(size_t(p * nt), 0.f);
        for (int64_t j = s_rp[i]; j < s_rp[i + 1]; ++j) {
          const float* blk = s_vals + j * bsz;                        // (p, q)
          const float* bp = d.data + int64_t(s_ci[j]) * q * d.ld + n0;  // (q, nt), stride d.ld
          for (int r0 = 0; r0 < p; r0 += 4)
            for (int64_t c0 = 0; c0 < nt; c0 += 16)
              kernel_4x16(blk + int64_t(r0) * q, q, bp + c0, d.ld, q, acc.data() + r0 * nt + c0, nt);
        }
      }
      write_tile(cdata + (i * p) * rs + n0 * cs, rs, cs, p, cols, acc.data(), nt, g.alpha, g.beta,
                 s_rp[i + 1] > s_rp[i]);
    });
  });
}

// ---------------------------------------------------------------- SDD

void run_sdd(const GemmArgs& g, const Options& o, const CpuState& st) {
  const BsrView& c = g.sparse;
  if (c.nnzb == 0) return;
  const int threads = thread_count(o, g.effective_flops() + double(c.nnzb) * c.bm * c.bk);
  Panel a, b;
  make_panel(g.a, /*pad16=*/false, threads, a);  // (M, K)
  make_panel(g.b, /*pad16=*/false, threads, b);  // (K, N); N = kb*bk is a multiple of 16
  const int64_t K = g.a.cols;
  const int bm = c.bm, bk = c.bk;
  const int64_t bsz = int64_t(bm) * bk;
  const int workers = int(std::min<int64_t>(threads, c.nnzb));
  std::vector<std::vector<float>> accs(size_t(std::max(workers, 1)));
  // One BLAS call per stored block (bm x bk x K) where BLAS is there.
  const bool blas = K > 0 && cpu_blas_available() && cpu_blas_fits(bm, bk, K, a.ld, b.ld, bk);
  std::unique_ptr<CpuBlasOneThread> one_thread;
  if (blas) one_thread = std::make_unique<CpuBlasOneThread>();
  with_type(c.dtype, c.values, [&](auto* vals) {
    parallel_for(c.nnzb, workers, [&](int64_t j, int w) {
      std::vector<float>& acc = accs[size_t(w)];
      acc.assign(size_t(bsz), 0.f);
      if (K > 0) {  // (with K = 0, A and B may have no storage at all: no pointer into them)
        const float* ap = a.data + int64_t(st.block_row[size_t(j)]) * bm * a.ld;  // (bm, K), stride a.ld
        const float* bp = b.data + int64_t(st.col_idx[size_t(j)]) * bk;           // (K, bk), stride b.ld
        if (blas) {
          cpu_sgemm(bm, bk, K, ap, a.ld, bp, b.ld, /*accumulate=*/false, acc.data(), bk);
        } else {
          for (int r0 = 0; r0 < bm; r0 += 4)
            for (int c0 = 0; c0 < bk; c0 += 16)
              kernel_4x16(ap + int64_t(r0) * a.ld, a.ld, bp + c0, b.ld, K, acc.data() + r0 * bk + c0, bk);
        }
      }
      write_tile(vals + j * bsz, bk, 1, bm, bk, acc.data(), bk, g.alpha, g.beta, K > 0);
    });
  });
}

// ---------------------------------------------------------------- variant

std::string cpu_why_not(const GemmArgs& g) {
  auto dev = [](const char* name) {
    return std::string("cpu backend needs host memory, but ") + name + " is in device memory";
  };
  if (g.sparse.memory != Memory::host) return dev(g.kind == OpKind::sdd ? "C" : g.kind == OpKind::dsd ? "A" : "B");
  if (g.kind != OpKind::dds && g.b.memory != Memory::host) return dev("B");
  if (g.kind != OpKind::dsd && g.a.memory != Memory::host) return dev("A");
  if (g.kind != OpKind::sdd && g.c.memory != Memory::host) return dev("C");
  return "";
}

std::unique_ptr<VariantState> cpu_prepare(const GemmArgs& g, const Options&) { return build_state(g); }

void cpu_run(const GemmArgs& g, const Options& o, VariantState* state) {
  std::unique_ptr<CpuState> own;
  const CpuState* st = dynamic_cast<const CpuState*>(state);
  if (!st) {  // prepare() always makes one; a caller that skipped it gets the same work here
    own = build_state(g);
    st = own.get();
  }
  if (g.kind == OpKind::sdd)
    run_sdd(g, o, *st);
  else
    run_row_product(g, o, *st);
}

}  // namespace

std::vector<Variant> cpu_variants() {
  return {Variant{"cpu", Backend::cpu, false, &cpu_why_not, &cpu_prepare, &cpu_run}};
}

}  // namespace sparsek
