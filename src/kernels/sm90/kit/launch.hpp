// The Hopper kit, host side: a compiled kernel as the host drives it (its function, block size,
// shared memory, CTAs per SM and cluster), set once in plan() and launched by run(), and the lookup
// of a family's config table. Every sm_90a family describes its kernels with these.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <set>
#include <type_traits>
#include <string>
#include <utility>

#include "core/device.hpp"

namespace sparsek::kit {

struct KernelInfo {
  const void* func = nullptr;  // the __global__ function (attributes, occupancy, has_sm90a_code)
  int threads = 0;             // block size
  int smem = 0;                // dynamic shared memory it needs
  int ctas_per_sm = 1;         // CTAs that share an SM: the persistent grid is sm_count * this
  int cluster = 1;             // CTAs per cluster
};

// Raises the kernel's dynamic shared-memory limit to what it needs. Not capturable in a CUDA graph:
// call it in plan() / prepare(), never in run().
void set_smem_limit(const KernelInfo& k, const char* name);
// "" when the device lets a block have the kernel's shared memory, else the reason.
std::string smem_why_not(const KernelInfo& k);
// Clusters of the kernel that fit on the device at once (after set_smem_limit).
int max_active_clusters(const KernelInfo& k, const char* name);

// A launch of `grid` CTAs: in clusters when k.cluster > 1, and with programmatic stream
// serialization when `overlap` (the kernel may start before the one ahead of it in the stream ends;
// the kernel itself must wait, griddepcontrol.wait, before touching memory that one writes).
struct LaunchConfig {
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t cfg;
  LaunchConfig(const KernelInfo& k, unsigned grid, cudaStream_t stream, bool overlap);
  LaunchConfig(const LaunchConfig&) = delete;  // cfg points into attrs
};

template <class... Params, class... Args>
void launch(const KernelInfo& k, unsigned grid, cudaStream_t stream, bool overlap, void (*kernel)(Params...),
            const char* name, Args&&... args) {
  const LaunchConfig lc(k, grid, stream, overlap);
  check_cuda(cudaLaunchKernelEx(&lc.cfg, kernel, std::forward<Args>(args)...), name);
}

// A family's registered kernels: make(std::integral_constant<int, I>{}) for every I < N (the entries
// of its config table), in one array; and the entry whose key equals `key` (null: not built).
template <class F, int... I>
auto make_kernel_table(F make, std::integer_sequence<int, I...>) {
  using Kernel = decltype(make(std::integral_constant<int, 0>{}));
  return std::array<Kernel, sizeof...(I)>{make(std::integral_constant<int, I>{})...};
}
template <int N, class F>
auto make_kernel_table(F make) {
  return make_kernel_table(make, std::make_integer_sequence<int, N>{});
}
template <class Table, class Key>
const typename Table::value_type* find_by_key(const Table& table, const Key& key) {
  for (const auto& k : table)
    if (k.launch && k.key == key) return &k;
  return nullptr;
}

// A family's config table (an array of keys: what is built) as why_not tells it: whether any entry
// has pred(key), and the distinct values of one field, each written by `text`, joined by `sep`.
template <class Key, size_t N, class P>
bool any_built(const Key (&table)[N], P pred) {
  for (const Key& k : table)
    if (pred(k)) return true;
  return false;
}
template <class Key, size_t N, class F, class T>
std::string built_values(const Key (&table)[N], F field, const char* sep, T text) {
  std::set<int> v;
  for (const Key& k : table) v.insert(field(k));
  std::string s;
  for (int x : v) s += (s.empty() ? "" : sep) + text(x);
  return s;
}

}  // namespace sparsek::kit
