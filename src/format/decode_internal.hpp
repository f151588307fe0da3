// Internal: decode attention's index arrays read on the host (validation, the CPU backend, the
// oracle), and the checks of their contents.
#pragma once
#include <cstdint>
#include <vector>

#include "sparsek/decode.hpp"

namespace sparsek {

// The index arrays of args, readable on the host: views of host memory or copies of device
// memory (copied after `stream`'s work; refused while `stream` is being captured).
struct DecodeIndices {
  const int32_t* page_table = nullptr;  // [batch, max_pages]
  const int32_t* seq_lens = nullptr;    // [batch]
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1]
  const int32_t* sel_indices = nullptr;   // [batch, Hkv, sel_kmax] or null
  const int32_t* sel_counts = nullptr;    // [batch, Hkv] or null
  std::vector<int32_t> copies[5];
};
// args passed validate(args, false).
DecodeIndices host_decode_indices(const DecodeArgs& args, void* stream);
// The content checks of validate(args, true), on arrays read through ix; errors start with `op`.
void check_decode_contents(const DecodeArgs& args, const DecodeIndices& ix, const char* op = "decode_attention");

// The CPU backend (src/cpu/decode_cpu.cpp): host memory, args passed validate(args, false); the
// index contents are not trusted (counts clamped, out-of-range pages skipped).
void decode_cpu_run(const DecodeArgs& args, int threads);

}  // namespace sparsek

namespace sparsek {
// The CPU backend of page selection (src/cpu/page_select_cpu.cpp): host memory, args passed
// validate(args, op, false); the index contents are not trusted.
void page_summaries_cpu(const PageSelectArgs& args, int threads);
void select_pages_cpu(const PageSelectArgs& args, int threads);
}  // namespace sparsek
