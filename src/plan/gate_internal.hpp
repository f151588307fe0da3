// Internal: the top-k block gate's shape and selection rules, shared by the dispatch (plan/gate.cpp),
// the CPU reference (cpu/gate_cpu.cpp) and the CUDA kernels (kernels/gate/gate.cu), so that the
// rules that decide which blocks a row may and must keep are written once.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "format/attention_internal.hpp"
#include "sparsek/attention.hpp"

#ifdef __CUDACC__
#define SPARSEK_HD __host__ __device__ __forceinline__
#else
#define SPARSEK_HD inline
#endif

namespace sparsek {

// A validated gate problem's sizes. Rows of the result: (b, g, i) for b < B, g < Hkv, i < Mq.
struct GateShape {
  int64_t B = 0, Hq = 0, Hkv = 0, G = 1;  // G = Hq / Hkv query heads per key/value head
  int64_t Sq = 0, Skv = 0, D = 0;
  int64_t Mq = 0, Nk = 0;  // query blocks ceil(Sq / block), key blocks ceil(Skv / block)
  int block = 128;
  float scale = 0.f;       // resolved: never 0
  int64_t rows() const { return B * Hkv * Mq; }
  // The device workspace: pooled q [B, Hkv, Mq, D] then pooled k [B, Hkv, Nk, D], f32.
  int64_t pooled_q_floats() const { return B * Hkv * Mq * D; }
  int64_t pooled_k_floats() const { return B * Hkv * Nk * D; }
};

// Checks the shapes, dtypes, memory kinds and scalar parameters of args (not its pointers) and
// returns its sizes; throws Error naming the argument and the value.
GateShape gate_shape(const GateArgs& args);

void gate_cpu(const GateArgs& args, const GateShape& s);                 // cpu/gate_cpu.cpp
void gate_cuda(const GateArgs& args, const GateShape& s, void* stream);  // kernels/gate/gate.cu
// "" when the GPU gate can run this problem, else why not (e.g. too many key blocks for one row's
// scores in shared memory).
std::string gate_cuda_why_not(const GateArgs& args, const GateShape& s);

// ---- selection rules (host and device) ----

// With causal, key block j is allowed for query block i when it holds a key at or before the
// block's last query row (FlexAttention's q_idx >= kv_idx).
SPARSEK_HD bool gate_causal_allows(int64_t i, int64_t j, int64_t block, int64_t sq) {
  const int64_t last_row = ((i + 1) * block < sq ? (i + 1) * block : sq) - 1;
  return j * block <= last_row;
}

// Sink blocks first .. first+sink-1 and local blocks i-local+1 .. i are kept outside the top-k
// budget (when allowed); first is 0, or with packed sequences the first block of query block i's
// sequences.
SPARSEK_HD bool gate_always_on(int64_t i, int64_t j, int64_t sink, int64_t local, int64_t first = 0) {
  return (j >= first && j - first < sink) || (j <= i && j > i - local);
}

// Packed sequences: the key blocks [first, end) query block i may select, those holding keys of
// the sequences its rows belong to (from its first row's sequence start to its last row's sequence
// end; t = the packed length). Any cu contents give some range and read only cu[0 .. n].
SPARSEK_HD void gate_sequence_blocks(const int32_t* cu, int64_t n, int64_t i, int64_t block, int64_t t,
                                     int64_t& first, int64_t& end) {
  const int64_t last = ((i + 1) * block < t ? (i + 1) * block : t) - 1;
  const int32_t lo = cu[sequence_of(cu, n, i * block)], hi = cu[sequence_of(cu, n, last) + 1];
  first = lo < 0 ? 0 : lo / block;
  end = hi < 0 ? 0 : (int64_t(hi) + block - 1) / block;
}

// Scores as unsigned keys whose order is the scores' order; 0 marks a block top-k may not pick
// (-inf, NaN, or excluded by the caller), so every pickable key is >= 1. -0 and +0 share a key:
// they compare equal, and equal scores go to the lower index.
SPARSEK_HD uint32_t gate_order_key(float v) {
  if (!(v > -INFINITY)) return 0u;  // -inf and NaN
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (u == 0x80000000u) u = 0u;  // -0 -> +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The page summaries' minimum and maximum (page selection), one definition for the CPU and the
// GPU so that both write the same bits: NaN is skipped (as fmin/fmax do), and -0 counts as below +0
// (fmin/fmax may return either zero of a +0/-0 pair; the two backends' libraries differ). Equal
// arguments are identical bits except for that pair, whose sign bits OR (min) or AND (max) decide.
SPARSEK_HD float summary_min(float a, float b) {
  if (a != b) return fminf(a, b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  ua |= ub;
  std::memcpy(&a, &ua, 4);
  return a;
}
SPARSEK_HD float summary_max(float a, float b) {
  if (a != b) return fmaxf(a, b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  ua &= ub;
  std::memcpy(&a, &ua, 4);
  return a;
}

}  // namespace sparsek
