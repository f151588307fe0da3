// The `hopper` variant's SDD side (sm_90a): why_not, prepare (the schedule of block groups), run.
// dsd_sm90/variant.cu owns the variant row and hands SDD problems here.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "kernels/sdd_sm90/config.hpp"
#include "kernels/sdd_sm90/variant.hpp"
#include "kernels/sm90/kit/workspace.hpp"
#include "plan/plan_internal.hpp"
#include "plan/schedule.hpp"

namespace sparsek {
namespace {
using namespace sdd_sm90;

constexpr int kTileN = 256;  // Config::BN

// The config key of g's kernel (built for every block height, dtype and layout: see config.hpp).
Key key_of(const GemmArgs& g) {
  const bool b_col = g.b.layout == Layout::col_major;
  return {g.sparse.bm, g.a.dtype == DType::bf16, g.sparse.dtype == DType::f32 ? 4 : 2,
          g.a.layout == Layout::col_major, b_col, !b_col && g.sparse.bk == 32 ? 32 : 64};
}

struct SddState final : VariantState {
  LaunchState ls;
  kit::Workspace ws;
  size_t workspace_bytes() const override { return ws.bytes(); }
};

}  // namespace

std::string hopper_sdd_why_not(const GemmArgs& g) {
  const BsrView& c = g.sparse;
  const int64_t M = g.m(), N = g.n(), K = g.k();
  if (M >= (int64_t(1) << 31) || N >= (int64_t(1) << 31) || K >= (int64_t(1) << 31))
    return "M, N and K must be below 2^31 (TMA coordinates are 32-bit)";
  if (K == 0) return "K = 0 (nothing to load; C = beta * C is the portable kernel's)";
  if (!find_kernel(key_of(g))) return "no SDD kernel built for bm=" + std::to_string(c.bm);
  if (c.nnzb == 0) return "";
  const std::string why = hopper_tma_operand_why_not(g.a, "A");
  return why.empty() ? hopper_tma_operand_why_not(g.b, "B") : why;
}

int hopper_sdd_smem(const GemmArgs& g) { return find_kernel(key_of(g))->info.smem; }

std::unique_ptr<VariantState> hopper_sdd_prepare(const GemmArgs& g) {
  const BsrView& c = g.sparse;
  auto state = std::make_unique<SddState>();
  LaunchState& st = state->ls;
  st.mb = c.mb();
  st.nnzb = c.nnzb;
  st.k = g.k();
  st.bm = c.bm;
  st.bk = c.bk;
  const Kernel* k = find_kernel(key_of(g));
  if (!k) throw Error(Status::internal, "hopper (sdd): no kernel for this configuration");
  kit::set_smem_limit(k->info, "hopper_sdd_kernel");
  const HostPattern hp = host_pattern(c, false);
  const std::vector<int32_t> row_ptr(hp.row_ptr, hp.row_ptr + st.mb + 1);
  const Schedule s = build_sdd_schedule(row_ptr, kTileN / c.bk, device_info().sm_count);
  st.grid = int(s.cta_items.size()) - 1;
  // Everything run() must not do under stream capture happens here, once.
  if (st.grid > 0) {
    tma_encode_tiled();  // resolves the driver entry point
    state->ws.upload(&st.items, s.items);
    state->ws.upload(&st.cta_items, s.cta_items);
    state->ws.allocate("hopper sdd schedule");
  }
  return state;
}

void hopper_sdd_run(const GemmArgs& g, void* stream, VariantState* state) {
  auto* ss = dynamic_cast<SddState*>(state);
  const BsrView& c = g.sparse;
  if (!ss || ss->ls.mb != c.mb() || ss->ls.nnzb != c.nnzb || ss->ls.k != g.k() || ss->ls.bm != c.bm ||
      ss->ls.bk != c.bk)
    throw Error(Status::internal, "hopper (sdd): run() got a state prepared for another shape or pattern");
  if (ss->ls.grid == 0) return;  // no stored block: nothing to write
  const Kernel* k = find_kernel(key_of(g));
  if (!k) throw Error(Status::internal, "hopper (sdd): no kernel for this configuration");
  k->launch(g, ss->ls, static_cast<cudaStream_t>(stream));
}

}  // namespace sparsek
