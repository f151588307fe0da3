// Internal: the Hopper DSD kernels as the host side sees them. hopper_sm90.cu (the variant row:
// why_not, prepare, run) picks a kernel through pick_kernel(); the kernels (hopper_dsd.cuh) are
// compiled in one translation unit per (block height, stage depth, input dtype) that the build
// generates (src/CMakeLists.txt): all of them in one file took six minutes to compile and were the
// critical path of the whole build.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "plan/plan_internal.hpp"

namespace sparsek {
namespace sm90 {

inline int stage_k(int bk) { return bk == 32 ? 32 : 64; }  // Config::KS: K extent of a stage

// Profiling build (-DSPARSEK_HOPPER_PROFILE, docs/KERNELS.md): clock64() counters summed over the
// CTAs: what consumer warpgroup 1 waits on and what the producer waits on.
enum ProfSlot { kProfConsumer, kProfFullWait, kProfEpilogue, kProfPartial, kProfProducer, kProfEmptyWait, kProfSlots };

struct HopperState final : VariantState {
  // What the schedule was built for (run() checks it).
  int64_t mb = 0, n = 0, nnzb = 0;
  int bm = 0, bk = 0;
  bool trans = false;
  int grid = 0;
  int cluster_mode = 0;  // Params::cluster_mode
  int cluster = 1;  // CTAs per cluster (Config::CL)
  int tile_n = 256;  // N extent of a work tile (Config::BN)
  // Narrow tiles launched with programmatic stream serialization: the kernel may start while the
  // kernel ahead of it in the stream finishes (it waits for it before touching user memory).
  bool overlap = true;
  int4* items = nullptr;
  int* cta_items = nullptr;
  int* col = nullptr;        // op T: the transposed pattern's block columns (Params::col_idx)
  int* perm = nullptr;       // op T: Params::perm
  // Row pairs (bm = 64 patterns whose neighbouring block rows share most columns; see
  // prepare_hopper()): the 128-row kernel runs pairs of block rows over the union of their
  // columns (col: the union's block columns); null otherwise.
  int2* pair_blk = nullptr;
  int* slot_of = nullptr;    // split rows (Params::slot_of); null when nothing was split
  int4* groups = nullptr;    // split items for hopper_split_reduce
  int ngroups = 0;
  float* partials = nullptr;
  void* packed_b = nullptr;  // B packed: its copy with aligned lines (see packed_b_ld())
  bool pack_lines128 = false;  // also pack a TMA-aligned B whose lines are not 128-byte aligned (packed_b_ld())
  unsigned long long* prof = nullptr;  // profiling build: ProfSlot counters (Params::prof)
  size_t bytes = 0;  // schedule, transposed pattern, split-row buffers and packed B on the device
  size_t workspace_bytes() const override { return bytes; }
  ~HopperState() override {
#ifdef SPARSEK_HOPPER_PROFILE
    unsigned long long c[kProfSlots] = {};
    if (prof && cudaMemcpy(c, prof, sizeof(c), cudaMemcpyDeviceToHost) == cudaSuccess && c[kProfConsumer] > 0)
      std::fprintf(stderr,
                   "hopper-profile bm=%d bk=%d cl=%d: consumer 1 waits on full %.1f%%, epilogue %.1f%% "
                   "(of which split-row partial stores %.1f%%); producer waits on empty %.1f%% of its time\n",
                   bm, bk, cluster, 100.0 * c[kProfFullWait] / c[kProfConsumer],
                   100.0 * (c[kProfEpilogue] + c[kProfPartial]) / c[kProfConsumer],
                   100.0 * c[kProfPartial] / c[kProfConsumer], 100.0 * c[kProfEmptyWait] / std::max(1ull, c[kProfProducer]));
#endif
    // NOTE: cudaFree waits for the device to finish, so a launch still reading the schedule is
    // safe (the one-shot API destroys the state right after enqueueing).
    for (void* q : {static_cast<void*>(items), static_cast<void*>(cta_items), static_cast<void*>(col),
                    static_cast<void*>(perm), static_cast<void*>(pair_blk), static_cast<void*>(slot_of),
                    static_cast<void*>(groups), static_cast<void*>(partials), packed_b, static_cast<void*>(prof)})
      if (q) cudaFree(q);
  }
};

// C (the DSD view's) that the epilogue can store through the TMA.
// NOTE: TMA stores need a 16-byte aligned base and line stride, and lines that are a whole number
// of 16-byte granules: with N * sizeof(T) % 16 != 0 (row-major) the H100 wrote the rest of the
// last granule, i.e. into C's padding past column N (found by `sparsek verify --variants hopper`).
// Column-major lines are M long (a multiple of the block height).
inline bool c_tma_storable(const DenseView& c) {
  const int64_t es = int64_t(dtype_size(c.dtype)), line = c.layout == Layout::row_major ? c.cols : c.rows;
  return reinterpret_cast<uintptr_t>(c.data) % 16 == 0 && (c.ld * es) % 16 == 0 && (line * es) % 16 == 0;
}

// One compiled kernel, as the host drives it.
using Launcher = void (*)(const GemmArgs& g, const HopperState& st, cudaStream_t stream);  // g: the DSD view
struct Kernel {
  Launcher launch = nullptr;
  int smem = 0;                 // dynamic shared memory it needs
  void (*setup)() = nullptr;    // raises the kernel's dynamic shared-memory limit (not capturable)
  int cluster = 1;                  // CTAs per cluster
  int (*max_clusters)() = nullptr;  // clusters that fit on the device at once (after setup)
  const void* func = nullptr;       // the __global__ function (for cudaFuncGetAttributes)
  int tile_n = 256;                 // N extent of a work tile (Config::BN)
  int partial_bytes = 0;            // split rows: one partial slot, per CTA of a cluster
};

// The kernel for op(A)'s block height BM, stage depth KS and input dtype (bf16 or f16), the operand
// layouts (trans: op(A) = A^T; b_col, c_col: B, C column-major), whether C is c_tma_storable() (a
// kernel without the threads' copy of C where built: BM = 128, KS = 64, op none, row-major 16-bit
// C, 256-column tiles; else ignored), CTAs per cluster (2 only where built:
// BM = 128, KS = 64, op none; else ignored), the N extent of a work tile (64 or 128 only where built:
// BM >= 64, KS = 64, op none, cluster 1; else 256) and C's dtype. Defined in hopper_dsd.cuh and
// instantiated in the generated files only: a caller sees this declaration and compiles no kernel.
template <int BM, int KS, bool BF16>
Kernel pick_kernel(bool trans, bool b_col, bool c_col, bool c_tma, int cluster, int tile_n, DType out);

}  // namespace sm90
}  // namespace sparsek
