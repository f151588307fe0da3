// The one-shot entry gemm() (and dsd/dds/sdd): validate, then plan + run through a small
// in-process cache of plans keyed by the problem (plan.cpp holds plan() and run()), and the cheap
// pattern hash that keys host patterns.
#include "core/cuda_host.hpp"

#include <cstdint>
#include <string>
#include <utility>

#include "core/device.hpp"
#include "plan/plan_internal.hpp"
#include "plan/tuned_choice.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek {

uint64_t hash_pattern(const int32_t* row_ptr, int64_t mb, const int32_t* col_idx, int64_t nnzb) {
  // FNV-style mixing over 64-bit words: a few GB/s, far cheaper than the O(nnzb) checks.
  uint64_t h = 0xcbf29ce484222325ull ^ uint64_t(mb) * 0x9e3779b97f4a7c15ull ^ uint64_t(nnzb);
  auto mix = [&h](const int32_t* p, int64_t n) {
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
      uint64_t w = uint64_t(uint32_t(p[i])) | uint64_t(uint32_t(p[i + 1])) << 32;
      h = (h ^ w) * 0x100000001b3ull;
      h ^= h >> 29;
    }
    if (i < n) h = (h ^ uint64_t(uint32_t(p[i]))) * 0x100000001b3ull;
  };
  if (row_ptr) mix(row_ptr, mb + 1);
  if (col_idx) mix(col_idx, nnzb);
  return h;
}

// ---- the one-shot entry: plan + run through a small LRU of plans keyed by the problem ----
//
// Key: everything a plan is made for (kind, op, shapes, block shape, dtypes, layouts, lds, memory,
// pattern pointers, nnzb) plus the options that steer planning. Host patterns add a hash of
// row_ptr/col_idx, so an array edited in place gets a new plan. Device patterns are keyed by
// their pointers (hashing would need a copy to the host) unless Options::check_indices is set, in
// which case the pattern is copied and checked anyway and its hash joins the key: so a device
// pattern mutated in place between one-shot calls needs check_indices (the default) or an
// explicit plan. Device keys also carry the current device (a plan runs only where it was made)
// and the stream, so a plan's workspace is only ever used in one stream's order; a plan is taken
// out of the cache while it runs, so two threads never share one.
namespace {

struct DenseKey {
  int64_t rows = 0, cols = 0, ld = 0;
  int layout = 0, dtype = 0, memory = 0, scale_group = 0;
  // Device data: a plan may size workspace by the data's alignment (hopper copies a dense operand
  // that is not 16-byte aligned into aligned workspace), so a less aligned pointer gets its own plan.
  bool aligned16 = false;
  bool operator==(const DenseKey& o) const {
    return rows == o.rows && cols == o.cols && ld == o.ld && layout == o.layout && dtype == o.dtype &&
           memory == o.memory && scale_group == o.scale_group && aligned16 == o.aligned16;
  }
};

struct PlanKey {
  int kind = 0, op = 0;
  int64_t rows = 0, cols = 0, nnzb = 0;
  int bm = 0, bk = 0, dtype = 0, memory = 0;
  const int32_t* row_ptr = nullptr;
  const int32_t* col_idx = nullptr;
  DenseKey a, b, c;
  int backend = 0, threads = 0, tune = 0;
  std::string variant;
  void* stream = nullptr;
  int device = -1;  // current CUDA device (a plan runs only on the device it was made on)
  uint64_t pattern_hash = 0;
  bool operator==(const PlanKey& o) const {
    return kind == o.kind && op == o.op && rows == o.rows && cols == o.cols && nnzb == o.nnzb && bm == o.bm &&
           bk == o.bk && dtype == o.dtype && memory == o.memory && row_ptr == o.row_ptr && col_idx == o.col_idx &&
           a == o.a && b == o.b && c == o.c && backend == o.backend && threads == o.threads && tune == o.tune &&
           variant == o.variant && stream == o.stream && device == o.device && pattern_hash == o.pattern_hash;
  }
};

DenseKey dense_key(const DenseView& d) {
  return {d.rows, d.cols, d.ld, int(d.layout), int(d.dtype), int(d.memory), d.scale_group,
          d.memory == Memory::device && reinterpret_cast<uintptr_t>(d.data) % 16 == 0};
}

PlanCache<PlanKey, Plan>& plan_cache() {
  static auto* cache = new PlanCache<PlanKey, Plan>;  // leaked on purpose: no destruction-order issues at exit
  return *cache;
}

}  // namespace

PlanCacheStats one_shot_plan_cache_stats() { return plan_cache().stats(); }
void clear_one_shot_plan_cache() { plan_cache().clear(); }

void gemm(const GemmArgs& g, const Options& o) {
  validate(g, false);
  Backend be = resolve_backend(g, o);
  PlanKey key;
  key.kind = int(g.kind);
  key.op = int(g.op);
  key.rows = g.sparse.rows;
  key.cols = g.sparse.cols;
  key.nnzb = g.sparse.nnzb;
  key.bm = g.sparse.bm;
  key.bk = g.sparse.bk;
  key.dtype = int(g.sparse.dtype);
  key.memory = int(g.sparse.memory);
  key.row_ptr = g.sparse.row_ptr;
  key.col_idx = g.sparse.col_idx;
  if (g.kind != OpKind::dds) key.b = dense_key(g.b);
  if (g.kind != OpKind::dsd) key.a = dense_key(g.a);
  if (g.kind != OpKind::sdd) key.c = dense_key(g.c);
  key.backend = int(be);
  key.threads = o.threads;
  key.tune = o.variant.empty() ? tuned_choice_setting() : -1;
  key.variant = o.variant;
  if (be == Backend::cuda) {
    key.stream = o.stream;
    check_cuda(cudaGetDevice(&key.device), "cudaGetDevice");
  }
  HostPattern hp;
  bool have_pattern = false;
  if (o.check_indices) {
    hp = host_pattern(g.sparse, true, o.stream);
    validate_pattern(g, hp);
    have_pattern = true;
    key.pattern_hash = hash_pattern(hp.row_ptr, g.sparse.mb(), hp.col_idx, g.sparse.nnzb);
  } else if (g.sparse.memory == Memory::host) {
    key.pattern_hash = hash_pattern(g.sparse.row_ptr, g.sparse.mb(), g.sparse.col_idx, g.sparse.nnzb);
  }
  Plan p = plan_cache().take(key);
  if (!p) {
    if (!have_pattern) {
      hp = host_pattern(g.sparse, true, o.stream);
      validate_pattern(g, hp);
    }
    p = make_plan(g, o, be, hp);
  }
  // g passed validate() above and the key pins everything run() would match against the plan.
  run_validated(p, g, o.stream);
  if (be == Backend::cuda && stream_is_capturing(o.stream)) plan_cache().keep_for_graph(p);
  plan_cache().put(std::move(key), std::move(p));
}

namespace {
GemmArgs product(OpKind kind, Op op, float alpha, float beta, const BsrView& sparse) {
  GemmArgs g;
  g.kind = kind;
  g.op = op;
  g.alpha = alpha;
  g.beta = beta;
  g.sparse = sparse;
  return g;
}
}  // namespace

void dsd(const BsrView& a, const DenseView& b, DenseView& c, float alpha, float beta, Op op, const Options& o) {
  GemmArgs g = product(OpKind::dsd, op, alpha, beta, a);
  g.b = b;
  g.c = c;
  gemm(g, o);
}
void dds(const DenseView& a, const BsrView& b, DenseView& c, float alpha, float beta, Op op, const Options& o) {
  GemmArgs g = product(OpKind::dds, op, alpha, beta, b);
  g.a = a;
  g.c = c;
  gemm(g, o);
}
void sdd(const DenseView& a, const DenseView& b, BsrView& c, float alpha, float beta, const Options& o) {
  GemmArgs g = product(OpKind::sdd, Op::none, alpha, beta, c);
  g.a = a;
  g.b = b;
  gemm(g, o);
}

}  // namespace sparsek
