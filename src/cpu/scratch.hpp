// Internal: host scratch that the CPU backends size from a problem's extents. A broadcast tensor
// (stride 0) may have an extent as large as int64 allows while the memory behind it stays small,
// so scratch that grows with such an extent is checked against the machine's memory before it is
// allocated: a named error instead of an allocation that fails (or, under a sanitizer, aborts).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "sparsek/types.hpp"

namespace sparsek {

// Physical memory in bytes, or 2^62 when the system does not say.
inline double host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0x1p62;
}

// Throws Error(invalid_argument) "<what>: <use> needs <bytes> of scratch, more than this
// machine's memory (<n>)" when bytes exceed the physical memory. what names the argument and its
// value ("k.s = 1099511627776"); use says what the scratch is for.
inline void check_scratch(double bytes, const std::string& what, const std::string& use) {
  const double have = host_memory_bytes();
  if (bytes <= have) return;
  auto gib = [](double b) {
    char t[64];
    std::snprintf(t, sizeof t, "%.3g GiB", b / double(1ull << 30));
    return std::string(t);
  };
  throw Error(Status::invalid_argument, what + ": " + use + " needs " + gib(bytes) +
                                            " of scratch, more than this machine's memory (" + gib(have) + ")");
}

}  // namespace sparsek
