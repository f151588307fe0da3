// The C API of the top-k block gate: sparsek_gate_args -> GateArgs, exceptions -> status.
#include <string>

#include "capi/capi_internal.hpp"
#include "sparsek/attention.hpp"
#include "sparsek/sparsek.h"

namespace {

using namespace sparsek;
using namespace sparsek::capi;

// `layout` receives the candidate layout, which args then points to.
GateArgs to_args(const sparsek_gate_args& c, AttentionLayout& layout) {
  if (c.causal != 0 && c.causal != 1)
    throw Error(Status::invalid_argument, "causal = " + std::to_string(c.causal) + " is not 0 or 1");
  GateArgs g;
  g.q = to_view(c.q);
  g.k = to_view(c.k);
  g.topk = c.topk;
  g.block = c.block;
  g.causal = c.causal == 1;
  g.sink = c.sink;
  g.local = c.local;
  g.scale = c.scale;
  if (c.candidates) {
    layout = to_layout(*c.candidates);
    g.candidates = &layout;
  }
  g.given_scores = c.given_scores;
  g.kv_num_blocks = c.kv_num_blocks;
  g.kv_indices = c.kv_indices;
  g.kmax = c.kmax;
  g.scores = c.scores;
  g.workspace = c.workspace;
  g.workspace_bytes = size_t(c.workspace_bytes);
  g.cu_seqlens = c.cu_seqlens;
  g.num_seqs = c.num_seqs;
  return g;
}

}  // namespace

extern "C" {

sparsek_status sparsek_gate_workspace_bytes(const sparsek_gate_args* args, uint64_t* bytes) {
  if (bytes) *bytes = 0;
  return guarded("sparsek_gate_workspace_bytes", [&] {
    if (!args) null_arg("args");
    if (!bytes) null_arg("bytes");
    AttentionLayout layout;
    *bytes = uint64_t(gate_workspace_bytes(to_args(*args, layout)));
  });
}

sparsek_status sparsek_gate(const sparsek_gate_args* args, void* stream) {
  return guarded("sparsek_gate", [&] {
    if (!args) null_arg("args");
    AttentionLayout layout;
    Options o;
    o.stream = stream;
    gate(to_args(*args, layout), o);
  });
}

}  // extern "C"
