// The `hopper_fp8` variant (sm_90a): e4m3 products, DSD and DDS (as the DSD on the transposes),
// with one fp32 scale per stored block of the sparse operand and one per token (row of a DDS's A,
// column of a DSD's B) of the dense one. why_not, prepare (the schedule; room for B transposed
// when B's K is not contiguous), run.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "kernels/dsd_fp8_sm90/config.hpp"
#include "kernels/sm90/kit/tma.hpp"
#include "kernels/sm90/kit/workspace.hpp"
#include "plan/backends.hpp"
#include "plan/plan_internal.hpp"
#include "plan/schedule.hpp"

namespace sparsek {
namespace {
using namespace dsd_fp8_sm90;

Key key_of(const GemmArgs& g) { return {g.sparse.bm, g.sparse.bk, g.c.dtype == DType::f32 ? 4 : 2}; }

// The DSD view's B is read K-major: a column-major B in place, a row-major one through a transpose.
bool b_needs_transpose(const GemmArgs& g) { return g.b.layout == Layout::row_major; }

std::string why_not_fp8(const GemmArgs& args) {
  if (args.kind == OpKind::sdd) return "SDD is not built for e4m3";
  const DType in = args.sparse.dtype;
  if (in != DType::e4m3) return std::string("needs e4m3 inputs, got ") + to_string(in);
  const GemmArgs g = as_dsd(args);
  if (g.b.dtype != DType::e4m3)
    return std::string("the dense input must be e4m3 too, got ") + to_string(g.b.dtype);
  if (g.op != Op::none)
    return "the sparse operand must be used as stored (fp8 blocks are read K-major: no transposed pattern)";
  const BsrView& a = g.sparse;
  if (!find_kernel(key_of(g))) {
    std::string shapes;
    for (const Key& k : kConfigs)
      if (k.out_bytes == 2) shapes += (shapes.empty() ? "" : ", ") + std::to_string(k.bm) + "x" + std::to_string(k.bk);
    return "blocks " + std::to_string(a.bm) + "x" + std::to_string(a.bk) + " are not built for e4m3 (built: " +
           shapes + ")";
  }
  if (g.b.scale_group != 0) return "per-128 group scales of the dense input are not built on Hopper (the cpu variant runs them)";
  if (a.memory != Memory::device || g.b.memory != Memory::device || g.c.memory != Memory::device)
    return "operands must be in device memory";
  const int64_t N = g.b.cols, K = g.b.rows;
  if (N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31) || g.c.rows >= (int64_t(1) << 31) ||
      a.nnzb * a.bm >= (int64_t(1) << 31))
    return "M, N, K and nnzb*bm must be below 2^31 (TMA coordinates are 32-bit)";
  if (a.nnzb > 0) {
    if (reinterpret_cast<uintptr_t>(a.values) % 16 != 0)
      return "the sparse values must be 16-byte aligned for TMA (address % 16 = " +
             std::to_string(reinterpret_cast<uintptr_t>(a.values) % 16) + ")";
    if (!b_needs_transpose(g) && (reinterpret_cast<uintptr_t>(g.b.data) % 16 != 0 || g.b.ld % 16 != 0))
      return std::string(args.kind == OpKind::dds ? "A" : "B") +
             " must be 16-byte aligned with a leading dimension that is a multiple of 16 for TMA (ld = " +
             std::to_string(g.b.ld) + ")";
  }
  const DeviceInfo& d = device_info();
  if (!d.available) return "no CUDA device (" + d.why_not + ")";
  if (d.cc_major != 9 || d.cc_minor != 0)
    return "needs an sm_90 GPU (sm_90a code only), found sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor);
  static const bool sm90a = has_sm90a_code(find_kernel(kConfigs[0])->info.func);
  if (!sm90a) return kNoSm90aCode;
  return kit::smem_why_not(find_kernel(key_of(g))->info);
}

struct Fp8State final : VariantState {
  LaunchState ls;
  kit::Workspace ws;
  size_t workspace_bytes() const override { return ws.bytes(); }
};

std::unique_ptr<VariantState> prepare_fp8(const GemmArgs& args, const Options&) {
  const GemmArgs g = as_dsd(args);
  const BsrView& a = g.sparse;
  auto state = std::make_unique<Fp8State>();
  LaunchState& st = state->ls;
  st.mb = a.mb();
  st.n = g.b.cols;
  st.nnzb = a.nnzb;
  st.bm = a.bm;
  st.bk = a.bk;
  const Kernel* k = find_kernel(key_of(g));
  if (!k) throw Error(Status::internal, "hopper_fp8: no kernel for this configuration");
  kit::set_smem_limit(k->info, "dsd_fp8_kernel");
  std::vector<int32_t> row_ptr(size_t(st.mb + 1), 0);
  if (st.mb > 0)
    check_cuda(cudaMemcpy(row_ptr.data(), a.row_ptr, row_ptr.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
               "cudaMemcpy(row_ptr)");
  // Longest items first (no split rows: each item's blocks are promoted in one accumulator).
  const Schedule s = build_schedule(row_ptr, st.n, Config<128, 128, float>::BN, 1, device_info().sm_count,
                                    parse_order("longest"), -1, 0.0);
  st.grid = int(s.cta_items.size()) - 1;
  // (A block row without stored blocks is an item too: its epilogue writes beta * C.)
  if (st.grid > 0) {
    tma_encode_tiled();  // resolves the driver entry point (not under capture); C may be stored by TMA
    state->ws.upload(&st.items, s.items);
    state->ws.upload(&st.cta_items, s.cta_items);
    if (a.nnzb > 0 && b_needs_transpose(g)) state->ws.reserve_bytes(&st.bt, size_t(g.b.rows) * size_t(g.b.cols));
    state->ws.allocate("hopper_fp8 schedule");
  }
  return state;
}

void run_fp8(const GemmArgs& args, const Options& o, VariantState* state) {
  auto* fs = dynamic_cast<Fp8State*>(state);
  const GemmArgs g = as_dsd(args);
  if (!fs || fs->ls.mb != g.sparse.mb() || fs->ls.n != g.b.cols || fs->ls.nnzb != g.sparse.nnzb ||
      fs->ls.bm != g.sparse.bm || fs->ls.bk != g.sparse.bk)
    throw Error(Status::internal, "hopper_fp8: run() got a state prepared for another shape or pattern");
  const LaunchState& st = fs->ls;
  if (st.grid == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(o.stream);
  const void* b = g.b.data;
  int64_t ld = g.b.ld;
  if (st.bt) {
    transpose_b(g.b.data, g.b.ld, g.b.rows, g.b.cols, st.bt, stream);
    b = st.bt;
    ld = g.b.rows;
  }
  find_kernel(key_of(g))->launch(g, b, ld, st, stream);
}

}  // namespace

std::vector<Variant> hopper_fp8_variants() {
  return {Variant{"hopper_fp8", Backend::cuda, false, &why_not_fp8, &prepare_fp8, &run_fp8}};
}

}  // namespace sparsek
