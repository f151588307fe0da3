// sparsek's internals that sparsek's own tools use: the `sparsek` CLI (tools/sparsek/) and the
// benchmarks and timers in bench/. Not part of the API: users must not include this header. It is
// not installed, and what it exposes may change in any release. Everything else the tools call is
// the public API (include/sparsek/); a tool includes those headers and this one, nothing else of src/.
//
// What the tools need beyond the API, and why:
//   - device info (DeviceInfo, device_info()) and check_cuda(): the GPU a run reports, and the one
//     way a failed CUDA call becomes a sparsek::Error;
//   - the variant tables (variants(), find_variant(), attention_variants(),
//     attention_backward_variants() and their lookups): bench, verify and doctor run, check and
//     list every variant by name, not only the one plan() picks;
//   - the fp64 oracle (oracle(), attention_oracle_row(), attention_backward_oracle*()): the
//     reference bench, verify and the attention timers check results against;
//   - the peers' split (peers::PeerState: convert + core) and their versions: bench times a peer
//     library's core call alone, as the peers publish their numbers; doctor reports the versions;
//   - random attention layouts (random_attention_layout(), LayoutArrays, layout_row()): the
//     attention bench's workloads;
//   - NCCL's loader (nccl::api()): the distributed benchmark makes communicators of its own.
#pragma once

#include "core/device.hpp"
#include "core/nccl.hpp"
#include "cpu/oracle.hpp"
#include "format/attention_internal.hpp"
#include "kernels/peers/peers.hpp"
#include "plan/variant.hpp"
