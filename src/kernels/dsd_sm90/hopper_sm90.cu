// The `hopper` variant's DSD side (sm_90a): C = alpha * op(A) * B + beta * C with A in BSR, B and C
// dense, all on the device; DDS runs as the DSD on the transposes (as_dsd(): C^T = op(B)^T * A^T,
// only the views change); SDD problems go to hopper_sdd_sm90.cu. This file is the host side:
// why_not, prepare (the schedule, src/plan/schedule.cpp), run. The kernels and what they do are in
// hopper_dsd.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "kernels/sm90/kit/tma.hpp"
#include "kernels/dsd_sm90/hopper_dsd.hpp"
#include "kernels/sdd_sm90/hopper_sdd.hpp"
#include "kernels/dsd_sm90/pack_lines.hpp"
#include "plan/backends.hpp"
#include "plan/plan_internal.hpp"
#include "plan/schedule.hpp"

namespace sparsek {

// ---------------------------------------------------------------------------------------------
// Host side: why_not, schedule, run.

namespace {
using namespace sm90;

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
  int tile_n = 256;    // N extent of a work tile: 64 / 128 for N <= 64 / 128 where built (pick_kernel())
};
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
// 64- and 128-column tiles exist for bm >= 64, 64-deep stages and op none (see pick_kernel()).
bool narrow_built(const DsdShape& d) { return d.bm >= 64 && stage_k(d.bk) == 64 && !d.trans; }
DsdShape dsd_shape(const GemmArgs& args) {
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
  // Narrow tiles for N <= 128 (decode): the tensor work and the B bytes of a stage follow N, and A
  // is read by one N tile only.
  const int64_t n = d.g.b.cols;
  d.tile_n = !narrow_built(d) ? 256 : n <= 64 ? 64 : n <= 128 ? 128 : 256;
  return d;
}

// CTA pairs exist for bm = 128 with 64-deep stages and op none (see pick_kernel()).
bool pairs_built(const DsdShape& d) { return d.bm == 128 && stage_k(d.bk) == 64 && !d.trans; }

// Row pairs: 64-row blocks, op none, 256-column tiles (the 128-row kernels that carry the code,
// Config::PAIRS_BUILT). The kernel is then picked as for 128-row blocks (kernel_shape()).
bool row_pairs_apply(const DsdShape& d) { return d.bm == 64 && !d.trans && d.tile_n == 256; }
DsdShape kernel_shape(DsdShape d, bool row_pairs) {
  if (row_pairs) d.bm = 128;
  return d;
}
// Row pairs run when at least this share of the pairs' half-tiles hold a stored block
// (RowPairs::fill()): the 128-row kernel measured ~1.4x the 64-row one's rate on the H100 (8192^3,
// 12.5%: 128x128 blocks ~560-585 effective TFLOPS, 64x64 ~400), so below ~0.7 the halves it
// leaves idle cost more than the B loads it saves. Banded and lower-triangular rows pair at
// 0.94-1.0, independent random rows at ~0.5 (12.5%); docs/KERNELS.md, "Row pairs".
constexpr double kRowPairMinFill = 0.75;
template <int BM>
Kernel pick_bm(const DsdShape& d, int cluster) {
  const DType out = d.g.c.dtype;
  const bool bf16 = d.g.sparse.dtype == DType::bf16;
  if (stage_k(d.bk) == 32)
    return bf16 ? pick_kernel<BM, 32, true>(d.trans, d.b_col, d.c_col, d.c_tma, cluster, d.tile_n, out)
                : pick_kernel<BM, 32, false>(d.trans, d.b_col, d.c_col, d.c_tma, cluster, d.tile_n, out);
  return bf16 ? pick_kernel<BM, 64, true>(d.trans, d.b_col, d.c_col, d.c_tma, cluster, d.tile_n, out)
              : pick_kernel<BM, 64, false>(d.trans, d.b_col, d.c_col, d.c_tma, cluster, d.tile_n, out);
}
// cluster: 2 selects the A-multicast pair where pairs_built() (other shapes ignore it).
Kernel pick(const DsdShape& d, int cluster = 1) {
  switch (d.bm) {
    case 32: return pick_bm<32>(d, cluster);
    case 64: return pick_bm<64>(d, cluster);
    case 128: return pick_bm<128>(d, cluster);
  }
  return {};
}



// DSD and DDS (as the DSD on the transposes; the messages name the caller's operands): the
// problem's own limits (why_not() checks the device after them).
std::string dsd_why_not(const GemmArgs& args) {
  const DsdShape d = dsd_shape(args);
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
  static const bool sm90a = has_sm90a_code(pick_kernel<128, 64, false>(false, false, false, false, 1, 256, DType::f32).func);
  if (!sm90a) return kNoSm90aCode;
  const int smem = sdd ? hopper_sdd_smem(g) : pick(dsd_shape(g)).smem;
  if (d.smem_per_block_optin < size_t(smem))
    return "needs " + std::to_string(smem) + " bytes of shared memory per block, the device allows " +
           std::to_string(d.smem_per_block_optin);
  return "";
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string(fallback);
}

// Copies a host vector into a new device allocation and counts its bytes.
template <class T>
void upload(const std::vector<T>& v, T** dst, size_t& bytes) {
  check_cuda(cudaMalloc(dst, std::max<size_t>(v.size(), 1) * sizeof(T)), "cudaMalloc(hopper schedule)");
  if (!v.empty())
    check_cuda(cudaMemcpy(*dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy(hopper schedule)");
  bytes += v.size() * sizeof(T);
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
// 16-byte lines, 262-265 with 128-byte ones; docs/KERNELS.md, "B's lines and L2 lines"); the
// product then reads the copy. The tensor maps keep B's logical extent, so the
// copy's line padding is never read (TMA boxes past it are zero-filled).
// pack_lines128 (SPARSEK_HOPPER_PACK_B=lines128, an experiment switch) also copies a TMA-aligned B
// whose lines do not start 128 bytes apart: measured +19% at N = 1000 with 64x64 blocks, -6% with
// 128x128, so not by default.
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
DenseView pack_b(const GemmArgs& g, const char* name, const HopperState& st, void* stream) {
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

std::unique_ptr<VariantState> prepare_hopper(const GemmArgs& args, const Options&) {
  if (args.kind == OpKind::sdd) return hopper_sdd_prepare(args);
  DsdShape d = dsd_shape(args);
  const BsrView& a = d.g.sparse;
  auto st = std::make_unique<HopperState>();
#ifdef SPARSEK_HOPPER_PROFILE
  check_cuda(cudaMalloc(&st->prof, kProfSlots * sizeof(unsigned long long)), "cudaMalloc(hopper profile)");
  check_cuda(cudaMemset(st->prof, 0, kProfSlots * sizeof(unsigned long long)), "cudaMemset(hopper profile)");
#endif
  st->mb = d.mb;
  st->n = d.g.b.cols;
  st->nnzb = a.nnzb;
  st->bm = d.bm;
  st->bk = d.bk;
  st->trans = d.trans;
  // SPARSEK_HOPPER_TILE_N = 64 | 128 | 256 overrides the N extent of the work tile where all are built.
  const std::string tn = env_or("SPARSEK_HOPPER_TILE_N", "");
  if (narrow_built(d) && (tn == "64" || tn == "128" || tn == "256")) d.tile_n = std::atoi(tn.c_str());
  st->tile_n = d.tile_n;
  // op(A)'s block rows: A's own, or those of the transposed pattern (built here, once), or pairs
  // of A's block rows. SPARSEK_HOPPER_ROW_PAIRS = on | off overrides the choice of pairs.
  std::vector<int32_t> row_ptr;
  const std::string rp = env_or("SPARSEK_HOPPER_ROW_PAIRS", "");
  bool row_pairs = false;
  if (row_pairs_apply(d) && a.nnzb > 0 && rp != "off") {
    const HostPattern hp = host_pattern(a, true);
    RowPairs pr = pair_rows(hp.row_ptr, hp.col_idx, d.mb);
    row_pairs = rp == "on" || pr.fill() >= kRowPairMinFill;
    if (row_pairs) {
      row_ptr = std::move(pr.row_ptr);
      upload(pr.col, &st->col, st->bytes);
      upload(pr.blk, &st->pair_blk, st->bytes);
    }
  }
  if (d.trans) {
    PatternTranspose t = transposed_pattern(a);
    row_ptr = std::move(t.row_ptr);
    upload(t.col_idx, &st->col, st->bytes);
    upload(t.src, &st->perm, st->bytes);
  } else if (!row_pairs) {
    row_ptr.assign(size_t(st->mb + 1), 0);
    if (st->mb > 0)
      check_cuda(cudaMemcpy(row_ptr.data(), a.row_ptr, row_ptr.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                 "cudaMemcpy(row_ptr)");
  }
  // Experiment switches (docs/KERNELS.md): SPARSEK_HOPPER_SCHEDULE = deadline | bigtile | longest |
  // single; SPARSEK_HOPPER_SPLIT = off | <piece length in stages> (default: automatic).
  // Default order: longest first at 128-row blocks, deadline otherwise. On the H100 (8192^3, one
  // run, docs/KERNELS.md "Skewed rows at 128-row blocks"), longest first ran power-law rows 5-6%
  // faster at 128x128 and 128x64 and lower-triangular rows 2.5% faster than the deadline order with
  // its window, and uniform, banded and block-diagonal rows the same; at 64x64 it ran power-law
  // rows 18% slower.
  const Order order = parse_order(env_or("SPARSEK_HOPPER_SCHEDULE", d.bm == 128 ? "longest" : "deadline"));
  // Row pairs never split: a piece's partial sums would need to know which of its two rows had a
  // block (alpha must not touch a row without one), and rows that share columns are rarely skewed.
  const std::string split = row_pairs ? "off" : env_or("SPARSEK_HOPPER_SPLIT", "");
  const int split_stages = split.empty() ? 0 : split == "off" ? -1 : std::max(1, std::atoi(split.c_str()));
  // Pairs of CTAs (a cluster of 2) share A by multicast; an item then spans two neighbouring N
  // tiles (one per CTA), and the persistent grid is as many pairs as fit. Default: 128x128 blocks
  // with an even number of N tiles (no CTA of a pair left without a tile), where the pair measured
  // 3-7% faster on the H100, and 128x64 (+3-5%); 128x32 measured 4-5% slower (docs/KERNELS.md,
  // third and fourth passes). Not where every two neighbouring block rows have the same columns
  // (block-diagonal experts): their items read the same B panels at the same time, L2 serves them,
  // and the pair's lock-step cost more than the A loads it saves (H100, 8192^3 128x128 block-
  // diagonal: 585 with pairs, 618 without; docs/KERNELS.md, "CTA pairs and identical rows").
  // SPARSEK_HOPPER_CLUSTER=1 / =2 forces it off / on where pairs_built().
  const std::string clu = env_or("SPARSEK_HOPPER_CLUSTER", "");
  const int64_t tiles = (st->n + d.tile_n - 1) / d.tile_n;
  const DsdShape dk = kernel_shape(d, row_pairs);
  bool pair_default = tiles % 2 == 0;
  if (pair_default && clu.empty() && pairs_built(dk) && !row_pairs && a.nnzb > 0 && d.tile_n == 256 &&
      identical_row_pairs(row_ptr.data(), nullptr, d.mb)) {  // the lengths match: compare the columns
    const HostPattern hp = host_pattern(a, true);
    pair_default = !identical_row_pairs(hp.row_ptr, hp.col_idx, d.mb);
  }
  st->cluster = pairs_built(dk) && d.tile_n == 256 && (!clu.empty() ? std::atoi(clu.c_str()) == 2 : pair_default) ? 2 : 1;
  const Kernel k = pick(dk, st->cluster);
  if (!k.launch || k.tile_n != st->tile_n) throw Error(Status::internal, "hopper: no kernel for this configuration");
  k.setup();
  // run() picks by the C of its call, whose alignment may differ from this one's: the kernel with
  // (or without) the threads' copy of C is set up as well (the same shared memory and grid).
  DsdShape other = dk;
  other.c_tma = !dk.c_tma;
  if (const Kernel k2 = pick(other, st->cluster); k2.launch && k2.func != k.func) k2.setup();
  const int lists = k.cluster > 1 ? k.max_clusters() : device_info().sm_count;
  // Skewed rows under the deadline order: one N tile's slice of B is 4-8 MB at bm = 128, so the few
  // tiles L2 holds must not be outrun by long rows started tiles ahead; their items are cut to at
  // most `window` tiles' worth of a CTA's time (docs/KERNELS.md, "Skewed rows at 128-row blocks";
  // only the deadline order cuts, so at bm = 128 only when SPARSEK_HOPPER_SCHEDULE=deadline).
  // SPARSEK_HOPPER_WINDOW = <tiles> | off overrides (any block height).
  const std::string win = env_or("SPARSEK_HOPPER_WINDOW", "");
  const double window = row_pairs || win == "off" ? 0.0 : !win.empty() ? std::atof(win.c_str()) : d.bm == 128 ? 3.0 : 0.0;
  const Schedule s = build_schedule(row_ptr, st->n, k.tile_n * k.cluster, d.bk / stage_k(d.bk), std::max(1, lists), order,
                                    split_stages, window);
  if (std::getenv("SPARSEK_HOPPER_VERBOSE"))
    std::fprintf(stderr, "hopper: bm=%d bk=%d%s%s tile_n=%d cluster=%d lists=%d items=%zu split items=%d pieces=%d\n",
                 d.bm, d.bk, d.trans ? " (op T)" : "", row_pairs ? " (row pairs)" : "", k.tile_n, k.cluster,
                 int(s.cta_items.size()) - 1, s.items.size(), int(s.groups.size()), s.slots);
  st->cluster_mode = std::max(0, std::min(2, std::atoi(env_or("SPARSEK_HOPPER_CLUSTER_MODE", "0").c_str())));
  // Narrow tiles start under the previous kernel's tail (Config::OVERLAP); SPARSEK_HOPPER_OVERLAP
  // = off launches them as the wide ones (an experiment switch).
  st->overlap = env_or("SPARSEK_HOPPER_OVERLAP", "") != "off";
  st->grid = (int(s.cta_items.size()) - 1) * k.cluster;
  // Everything run() must not do under stream capture happens here, once (k.setup() above).
  if (a.nnzb > 0) tma_encode_tiled();  // resolves the driver entry point
  if (st->grid > 0) {
    upload(s.items, &st->items, st->bytes);
    upload(s.cta_items, &st->cta_items, st->bytes);
  }
  if (!s.groups.empty()) {
    upload(s.slot_of, &st->slot_of, st->bytes);
    upload(s.groups, &st->groups, st->bytes);
    st->ngroups = int(s.groups.size());
    // One partial tile per piece, per CTA of a cluster and per consumer.
    const size_t pbytes = size_t(s.slots) * size_t(k.cluster) * size_t(k.partial_bytes);
    check_cuda(cudaMalloc(&st->partials, pbytes), "cudaMalloc(hopper split-row partials)");
    st->bytes += pbytes;
  }
  st->pack_lines128 = env_or("SPARSEK_HOPPER_PACK_B", "") == "lines128";  // experiment switch (packed_b_ld())
  if (const size_t pb = packed_b_bytes(d.g, st->pack_lines128); pb > 0 && st->grid > 0) {
    check_cuda(cudaMalloc(&st->packed_b, pb), "cudaMalloc(hopper packed B)");
    st->bytes += pb;
  }
  return st;
}

void run_hopper(const GemmArgs& args, const Options& o, VariantState* state) {
  if (args.kind == OpKind::sdd) return hopper_sdd_run(args, o.stream, state);
  auto* st = dynamic_cast<HopperState*>(state);
  DsdShape d = dsd_shape(args);
  if (!st || st->mb != d.mb || st->n != d.g.b.cols || st->nnzb != d.g.sparse.nnzb || st->bm != d.bm ||
      st->bk != d.bk || st->trans != d.trans)
    throw Error(Status::internal, "hopper: run() got a state prepared for another shape or pattern");
  if (st->grid == 0) return;  // M == 0 or N == 0: nothing to write
  d.tile_n = st->tile_n;  // as prepare() chose it
  const Kernel k = pick(kernel_shape(d, st->pair_blk != nullptr), st->cluster);
  if (!k.launch) throw Error(Status::internal, "hopper: no kernel for this configuration");
  GemmArgs g = d.g;
  g.b = pack_b(d.g, args.kind == OpKind::dds ? "A" : "B", *st, o.stream);
  k.launch(g, *st, static_cast<cudaStream_t>(o.stream));
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

bool hopper_has_narrow_tiles(const GemmArgs& g) { return g.kind != OpKind::sdd && narrow_built(dsd_shape(g)); }

std::vector<Variant> hopper_variants() {
  return {Variant{"hopper", Backend::cuda, false, &why_not_hopper, &prepare_hopper, &run_hopper}};
}

}  // namespace sparsek

