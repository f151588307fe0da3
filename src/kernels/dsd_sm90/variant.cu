// The `hopper` variant's DSD side (sm_90a): C = alpha * op(A) * B + beta * C with A in BSR, B and C
// dense, all on the device; DDS runs as the DSD on the transposes (as_dsd(): C^T = op(B)^T * A^T,
// only the views change); SDD problems go to sdd_sm90/. This file is the host side: why_not,
// prepare (the pattern's schedule, src/plan/schedule.cpp, with the choices of heuristics.cpp), run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "kernels/dsd_sm90/config.hpp"
#include "kernels/dsd_sm90/heuristics.hpp"
#include "kernels/dsd_sm90/pack_lines.hpp"
#include "kernels/sdd_sm90/variant.hpp"
#include "kernels/sm90/kit/tma.hpp"
#include "kernels/sm90/kit/workspace.hpp"
#include "plan/backends.hpp"
#include "plan/plan_internal.hpp"
#include "plan/schedule.hpp"

namespace sparsek {

// ---------------------------------------------------------------------------------------------
// The table of compiled kernels: filled once from the generated translation units.

namespace dsd_sm90 {
namespace {
template <int BM, size_t... J>
void add_for_bm(Kernel* t, std::index_sequence<J...>) {
  ((add_instances<BM, kStageDepths[J], false>(t), add_instances<BM, kStageDepths[J], true>(t)), ...);
}
template <size_t... I>
void add_all(Kernel* t, std::index_sequence<I...>) {
  (add_for_bm<kBlockRows[I]>(t, std::make_index_sequence<std::size(kStageDepths)>{}), ...);
}
}  // namespace

const Kernel* find_kernel(const Key& key) {
  static const std::vector<Kernel> table = [] {
    std::vector<Kernel> t(static_cast<size_t>(kNumConfigs));
    add_all(t.data(), std::make_index_sequence<std::size(kBlockRows)>{});
    return t;
  }();
  return kit::find_by_key(table, key);
}
}  // namespace dsd_sm90

namespace {
using namespace dsd_sm90;

int stage_k(int bk) { return bk == 32 ? 32 : 64; }  // Config::KS: K extent of a stage

// The DSD the kernel runs for args (as_dsd): op(A)'s block shape and block rows, and the operand
// layouts that pick the kernel.
struct DsdShape {
  GemmArgs g;          // the DSD view
  bool trans = false;  // op(A) = A^T: MN-major A tiles through the transposed pattern
  bool b_col = false;  // B column-major: K-major B tiles
  bool c_col = false;  // C column-major: the store boxes run down C's columns
  bool c_tma = false;  // C is c_tma_storable(): a kernel without the threads' copy of C where built
  int bm = 0, bk = 0;  // op(A)'s blocks
  int64_t mb = 0;      // op(A)'s block rows
  int tile_n = 256;    // N extent of a work tile
};
// The config key of d's kernel with `cluster` CTAs per cluster and tile width `tile_n`.
Key key_of(const DsdShape& d, int cluster, int tile_n, bool c_tma_only) {
  return {d.bm, stage_k(d.bk), d.g.sparse.dtype == DType::bf16, d.g.c.dtype == DType::f32 ? 4 : 2, cluster,
          d.trans, d.b_col, d.c_col, tile_n, c_tma_only};
}
// 64-column tiles (and 128) are built for d's block shape and layouts (the table says which).
bool narrow_built(const DsdShape& d) { return built(key_of(d, 1, 64, false)); }
// CTA pairs are built for d.
bool pairs_built(const DsdShape& d) { return built(key_of(d, 2, 256, false)); }

// A one-column matrix stored with unit stride is the same bytes in either layout; as column-major
// its line is the whole column (TMA-aligned when the column's bytes are), as row-major every line
// is one element (2 bytes: never TMA-aligned).
DenseView one_column_as_col_major(DenseView v) {
  if (v.cols == 1 && v.layout == Layout::row_major && v.ld == 1) {
    v.layout = Layout::col_major;
    v.ld = std::max<int64_t>(v.rows, 1);
  }
  return v;
}
DsdShape dsd_shape(const GemmArgs& args, const Overrides& o) {
  DsdShape d;
  d.g = as_dsd(args);
  d.g.b = one_column_as_col_major(d.g.b);
  d.g.c = one_column_as_col_major(d.g.c);
  const BsrView& a = d.g.sparse;
  d.trans = d.g.op == Op::trans;
  d.b_col = d.g.b.layout == Layout::col_major;
  d.c_col = d.g.c.layout == Layout::col_major;
  d.c_tma = c_tma_storable(d.g.c);
  d.bm = d.trans ? a.bk : a.bm;
  d.bk = d.trans ? a.bm : a.bk;
  d.mb = d.trans ? a.kb() : a.mb();
  d.tile_n = tile_n_for(o, narrow_built(d), d.g.b.cols);
  return d;
}

// Row pairs: 64-row blocks, op none, 256-column tiles, run on the 128-row kernels that carry the
// code (Config::PAIRS_BUILT): the kernel is then picked as for 128-row blocks (kernel_shape()).
bool row_pairs_apply(const DsdShape& d) { return d.bm == 64 && !d.trans && d.tile_n == 256; }
DsdShape kernel_shape(DsdShape d, bool row_pairs) {
  if (row_pairs) d.bm = 128;
  return d;
}

// The kernel for d: the one without the threads' copy of C where C allows and it is built, CTA
// pairs where asked and built, narrow tiles where built; else the general kernel.
const Kernel* pick(const DsdShape& d, int cluster = 1) {
  for (const Key& k : {key_of(d, cluster, d.tile_n, d.c_tma), key_of(d, cluster, d.tile_n, false),
                       key_of(d, 1, d.tile_n, false), key_of(d, 1, 256, false)})
    if (built(k)) return find_kernel(k);
  return nullptr;
}

// DSD and DDS (as the DSD on the transposes; the messages name the caller's operands): the
// problem's own limits (why_not() checks the device after them).
std::string dsd_why_not(const GemmArgs& args) {
  const DsdShape d = dsd_shape(args, Overrides{});
  const GemmArgs& g = d.g;
  const BsrView& a = g.sparse;
  const int64_t N = g.b.cols, K = g.b.rows;
  if (N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31) || g.c.rows >= (int64_t(1) << 31))
    return "M, N and K must be below 2^31 (TMA coordinates are 32-bit)";
  if (a.nnzb * a.bm >= (int64_t(1) << 31))
    return "nnzb*bm = " + std::to_string(a.nnzb * a.bm) + " must be below 2^31 (TMA coordinates are 32-bit)";
  if (a.nnzb > 0) {
    // NOTE: TMA needs 16-byte aligned base addresses and line strides. A dense B that lacks them
    // is packed by run() (packed_b_ld()); the sparse values are not.
    if (reinterpret_cast<uintptr_t>(a.values) % 16 != 0)
      return std::string(args.kind == OpKind::dds ? "B" : "A") + " values must be 16-byte aligned for TMA (address % 16 = " +
             std::to_string(reinterpret_cast<uintptr_t>(a.values) % 16) + ")";
  }
  return "";
}

std::string why_not_hopper(const GemmArgs& g) {
  const BsrView& s = g.sparse;
  const DType in = g.kind == OpKind::sdd ? g.a.dtype : s.dtype;
  if (in != DType::f16 && in != DType::bf16) return std::string("needs f16 or bf16 inputs, got ") + to_string(in);
  if (s.bm != 32 && s.bm != 64 && s.bm != 128) return "bm=" + std::to_string(s.bm) + " not in {32, 64, 128}";
  if (s.bk != 32 && s.bk != 64 && s.bk != 128) return "bk=" + std::to_string(s.bk) + " not in {32, 64, 128}";
  const bool sdd = g.kind == OpKind::sdd;
  const bool dense_on_device = (g.kind == OpKind::dsd || g.a.memory == Memory::device) &&
                               (g.kind == OpKind::dds || g.b.memory == Memory::device) &&
                               (sdd || g.c.memory == Memory::device);
  if (s.memory != Memory::device || !dense_on_device) return "operands must be in device memory";
  const std::string why = sdd ? hopper_sdd_why_not(g) : dsd_why_not(g);
  if (!why.empty()) return why;
  const DeviceInfo& d = device_info();
  if (!d.available) return "no CUDA device (" + d.why_not + ")";
  if (d.cc_major != 9 || d.cc_minor != 0)
    return "needs an sm_90 GPU (sm_90a code only), found sm_" + std::to_string(d.cc_major) +
           std::to_string(d.cc_minor) + ": the portable variant runs there" +
           (d.cc_major > 9 ? " (JIT-compiled from PTX)" : "");
  static const bool sm90a = has_sm90a_code(kConfigs.empty() ? nullptr : find_kernel(kConfigs[0])->info.func);
  if (!sm90a) return kNoSm90aCode;
  if (sdd) {
    const int smem = hopper_sdd_smem(g);
    if (d.smem_per_block_optin < size_t(smem))
      return "needs " + std::to_string(smem) + " bytes of shared memory per block, the device allows " +
             std::to_string(d.smem_per_block_optin);
    return "";
  }
  const Kernel* k = pick(dsd_shape(g, Overrides{}));
  if (!k) return "no kernel built for this block shape and these layouts";
  return kit::smem_why_not(k->info);
}

// Whether the TMA can read d in place: 16-byte aligned base address and leading dimension
// (hopper_tma_operand_why_not() says which fails). No strings: run() asks on every call.
bool tma_readable(const DenseView& d) {
  return reinterpret_cast<uintptr_t>(d.data) % 16 == 0 && (d.ld * int64_t(dtype_size(d.dtype))) % 16 == 0;
}

// ---- B packed before the product ----
// The DSD view's B (DDS: the caller's A) whose base address or leading dimension is not a multiple
// of 16 bytes is copied by run(), one small kernel ahead of the product on the same stream, into
// workspace whose stored lines (rows when row-major, columns when column-major) never straddle two
// L2 lines (aligned_line_elems(): whole 128-byte lines, or a power of two of 16-64 bytes for short
// ones): a B panel row then fills whole L2 lines (N = 999 measured 190 effective TFLOPS with
// 16-byte lines, 262-265 with 128-byte ones); the product then reads the copy. The tensor maps keep
// B's logical extent, so the copy's line padding is never read (TMA boxes past it are zero-filled).
// pack_lines128 (an experiment switch, heuristics.hpp) also copies a TMA-aligned B whose lines do
// not start 128 bytes apart: measured +19% at N = 1000 with 64x64 blocks, -6% with 128x128, so not
// by default.
// The copy's leading dimension in elements, 0 when B is read in place (or never: no stored block).
int64_t packed_b_ld(const GemmArgs& g, bool pack_lines128) {
  const DenseView& b = g.b;
  if (g.sparse.nnzb == 0) return 0;
  const bool tma_ok = tma_readable(b);
  const bool lines_ok = b.ld % 64 == 0 && reinterpret_cast<uintptr_t>(b.data) % 128 == 0;
  if (tma_ok && (lines_ok || !pack_lines128)) return 0;
  return aligned_line_elems(b.layout == Layout::row_major ? b.cols : b.rows);
}
size_t packed_b_bytes(const GemmArgs& g, bool pack_lines128) {
  const DenseView& b = g.b;
  return size_t(b.layout == Layout::row_major ? b.rows : b.cols) * size_t(packed_b_ld(g, pack_lines128)) *
         dtype_size(b.dtype);
}
// Enqueues the copy and returns the view the product reads (g.b itself when it is read in place).
DenseView pack_b(const GemmArgs& g, const char* name, const LaunchState& st, void* stream) {
  DenseView b = g.b;
  const int64_t ldp = packed_b_ld(g, st.pack_lines128);
  if (ldp == 0) return b;
  // ld is pinned by the plan, but a base address may be less aligned than it was at plan time: a
  // TMA-aligned B is then read in place (slower lines), any other cannot be.
  if (!st.packed_b) {
    if (tma_readable(b)) return b;
    throw Error(Status::unsupported, std::string("hopper: ") + name + " is not 16-byte aligned (address % 16 = " +
                                         std::to_string(reinterpret_cast<uintptr_t>(b.data) % 16) +
                                         ") but was when the plan was made, so the plan holds no room to copy it "
                                         "into; make the plan with " + name + " at this address");
  }
  const bool row = b.layout == Layout::row_major;
  const int64_t lines = row ? b.rows : b.cols, len = row ? b.cols : b.rows;
  pack_lines_16bit(b.data, b.ld, st.packed_b, ldp, lines, len, stream);
  b.data = st.packed_b;
  b.ld = ldp;
  return b;
}

struct HopperState final : VariantState {
  LaunchState ls;
  kit::Workspace ws;  // schedule, transposed pattern, split-row partials, packed B (and profile counters)
  size_t workspace_bytes() const override { return ws.bytes(); }
#ifdef SPARSEK_HOPPER_PROFILE
  ~HopperState() override {
    unsigned long long c[kProfSlots] = {};
    if (ls.prof && cudaMemcpy(c, ls.prof, sizeof(c), cudaMemcpyDeviceToHost) == cudaSuccess && c[kProfConsumer] > 0)
      std::fprintf(stderr,
                   "hopper-profile bm=%d bk=%d cl=%d: consumer 1 waits on full %.1f%%, epilogue %.1f%% "
                   "(of which split-row partial stores %.1f%%); producer waits on empty %.1f%% of its time\n",
                   ls.bm, ls.bk, ls.cluster, 100.0 * c[kProfFullWait] / c[kProfConsumer],
                   100.0 * (c[kProfEpilogue] + c[kProfPartial]) / c[kProfConsumer],
                   100.0 * c[kProfPartial] / c[kProfConsumer],
                   100.0 * c[kProfEmptyWait] / std::max(1ull, c[kProfProducer]));
  }
#endif
};

std::unique_ptr<VariantState> prepare_hopper(const GemmArgs& args, const Options&) {
  if (args.kind == OpKind::sdd) return hopper_sdd_prepare(args);
  const Overrides o = overrides_from_env();
  DsdShape d = dsd_shape(args, o);
  const BsrView& a = d.g.sparse;
  auto state = std::make_unique<HopperState>();
  LaunchState& st = state->ls;
  kit::Workspace& ws = state->ws;
#ifdef SPARSEK_HOPPER_PROFILE
  ws.reserve(&st.prof, kProfSlots);
#endif
  st.mb = d.mb;
  st.n = d.g.b.cols;
  st.nnzb = a.nnzb;
  st.bm = d.bm;
  st.bk = d.bk;
  st.trans = d.trans;
  st.tile_n = d.tile_n;
  // op(A)'s block rows: A's own, or those of the transposed pattern (built here, once), or pairs
  // of A's block rows.
  std::vector<int32_t> row_ptr;
  RowPairs pr;
  PatternTranspose t;
  bool row_pairs = false;
  if (row_pairs_apply(d) && a.nnzb > 0 && o.row_pairs != 0) {
    const HostPattern hp = host_pattern(a, true);
    pr = pair_rows(hp.row_ptr, hp.col_idx, d.mb);
    row_pairs = use_row_pairs(o, pr.fill());
    if (row_pairs) {
      row_ptr = std::move(pr.row_ptr);
      ws.upload(&st.col, pr.col);
      ws.upload(&st.pair_blk, pr.blk);
    }
  }
  if (d.trans) {
    t = transposed_pattern(a);
    row_ptr = std::move(t.row_ptr);
    ws.upload(&st.col, t.col_idx);
    ws.upload(&st.perm, t.src);
  } else if (!row_pairs) {
    row_ptr.assign(size_t(st.mb + 1), 0);
    if (st.mb > 0)
      check_cuda(cudaMemcpy(row_ptr.data(), a.row_ptr, row_ptr.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                 "cudaMemcpy(row_ptr)");
  }
  const DsdShape dk = kernel_shape(d, row_pairs);
  const int64_t tiles = (st.n + d.tile_n - 1) / d.tile_n;
  // Identical neighbouring rows: the lengths first, then (only if they match) the columns.
  auto identical_rows = [&] {
    if (a.nnzb == 0 || !identical_row_pairs(row_ptr.data(), nullptr, d.mb)) return false;
    const HostPattern hp = host_pattern(a, true);
    return identical_row_pairs(hp.row_ptr, hp.col_idx, d.mb);
  };
  st.cluster = cluster_for(o, pairs_built(dk), row_pairs, tiles, d.tile_n, identical_rows);
  const Kernel* k = pick(dk, st.cluster);
  if (!k || k->info.cluster != st.cluster || k->key.tile_n != st.tile_n)
    throw Error(Status::internal, "hopper: no kernel for this configuration");
  kit::set_smem_limit(k->info, "hopper_dsd_kernel");
  // run() picks by the C of its call, whose alignment may differ from this one's: the kernel with
  // (or without) the threads' copy of C is set up as well (the same shared memory and grid).
  DsdShape other = dk;
  other.c_tma = !dk.c_tma;
  if (const Kernel* k2 = pick(other, st.cluster); k2 && k2 != k) kit::set_smem_limit(k2->info, "hopper_dsd_kernel");
  const int lists = k->info.cluster > 1 ? kit::max_active_clusters(k->info, "hopper_dsd_kernel") : device_info().sm_count;
  const Order order = order_for(o, d.bm);
  const Schedule s = build_schedule(row_ptr, st.n, k->key.tile_n * k->info.cluster, d.bk / stage_k(d.bk),
                                    std::max(1, lists), order, split_stages_for(o, row_pairs),
                                    window_for(o, row_pairs, d.bm));
  if (o.verbose)
    std::fprintf(stderr, "hopper: bm=%d bk=%d%s%s tile_n=%d cluster=%d lists=%d items=%zu split items=%d pieces=%d\n",
                 d.bm, d.bk, d.trans ? " (op T)" : "", row_pairs ? " (row pairs)" : "", k->key.tile_n,
                 k->info.cluster, int(s.cta_items.size()) - 1, s.items.size(), int(s.groups.size()), s.slots);
  st.cluster_mode = o.cluster_mode;
  st.overlap = o.overlap;
  st.pack_lines128 = o.pack_lines128;
  st.grid = (int(s.cta_items.size()) - 1) * k->info.cluster;
  // Everything run() must not do under stream capture happens here, once (set_smem_limit above).
  if (a.nnzb > 0) tma_encode_tiled();  // resolves the driver entry point
  if (st.grid > 0) {
    ws.upload(&st.items, s.items);
    ws.upload(&st.cta_items, s.cta_items);
  }
  if (!s.groups.empty()) {
    ws.upload(&st.slot_of, s.slot_of);
    ws.upload(&st.groups, s.groups);
    st.ngroups = int(s.groups.size());
    // One partial tile per piece, per CTA of a cluster and per consumer.
    ws.reserve_bytes(reinterpret_cast<void**>(&st.partials),
                     size_t(s.slots) * size_t(k->info.cluster) * size_t(k->partial_bytes));
  }
  if (const size_t pb = packed_b_bytes(d.g, st.pack_lines128); pb > 0 && st.grid > 0)
    ws.reserve_bytes(&st.packed_b, pb);
  ws.allocate("hopper schedule");
#ifdef SPARSEK_HOPPER_PROFILE
  check_cuda(cudaMemset(st.prof, 0, kProfSlots * sizeof(unsigned long long)), "cudaMemset(hopper profile)");
#endif
  return state;
}

void run_hopper(const GemmArgs& args, const Options& o, VariantState* state) {
  if (args.kind == OpKind::sdd) return hopper_sdd_run(args, o.stream, state);
  auto* hs = dynamic_cast<HopperState*>(state);
  if (!hs) throw Error(Status::internal, "hopper: run() got a state prepared for another variant");
  const LaunchState& st = hs->ls;
  Overrides tile;
  tile.tile_n = st.tile_n;  // as prepare() chose it
  const DsdShape d = dsd_shape(args, tile);
  if (st.mb != d.mb || st.n != d.g.b.cols || st.nnzb != d.g.sparse.nnzb || st.bm != d.bm || st.bk != d.bk ||
      st.trans != d.trans)
    throw Error(Status::internal, "hopper: run() got a state prepared for another shape or pattern");
  if (st.grid == 0) return;  // M == 0 or N == 0: nothing to write
  const Kernel* k = pick(kernel_shape(d, st.pair_blk != nullptr), st.cluster);
  if (!k) throw Error(Status::internal, "hopper: no kernel for this configuration");
  GemmArgs g = d.g;
  g.b = pack_b(d.g, args.kind == OpKind::dds ? "A" : "B", st, o.stream);
  k->launch(g, st, static_cast<cudaStream_t>(o.stream));
}

}  // namespace

std::string hopper_tma_operand_why_not(const DenseView& d, const char* name) {
  if (tma_readable(d)) return "";
  if (reinterpret_cast<uintptr_t>(d.data) % 16 != 0)
    return std::string(name) + " must be 16-byte aligned for TMA (address % 16 = " +
           std::to_string(reinterpret_cast<uintptr_t>(d.data) % 16) + ")";
  return std::string(name) + "'s leading dimension must be a multiple of 16 bytes for TMA (ld=" +
         std::to_string(d.ld) + " -> " + std::to_string(d.ld * int64_t(dtype_size(d.dtype))) + " bytes)";
}

bool hopper_has_narrow_tiles(const GemmArgs& g) {
  return g.kind != OpKind::sdd && narrow_built(dsd_shape(g, Overrides{}));
}

std::vector<Variant> hopper_variants() {
  return {Variant{"hopper", Backend::cuda, false, &why_not_hopper, &prepare_hopper, &run_hopper}};
}

}  // namespace sparsek
