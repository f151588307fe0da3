// What the libFuzzer harnesses share: the input reader, the finding report, C enum fields and
// small-or-raw numbers.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "sparsek/sparsek.h"

namespace fuzz {

// The input read field by field; a field past the end reads as 0.
struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(u8()) << (8 * i);
    return v;
  }
  int64_t i64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(u8()) << (8 * i);
    return int64_t(v);
  }
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    n = 0;
    return s;
  }
};

// A property the library broke: printed with the C API's last error, then abort (libFuzzer saves
// the input).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\nlast error: %s\n", what.c_str(), sparsek_last_error());
  std::abort();
}

// Stores an arbitrary int in a C enum field the way a C caller would (no C++ enum load).
template <class E>
void put_enum(E& field, int v) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
  std::memcpy(&field, &v, sizeof v);
}
// An enum value: mostly one of its `count` values, sometimes any int.
inline int enum_field(Reader& r, int count) {
  const uint8_t b = r.u8();
  return b < 248 ? b % count : int(r.u32());
}
// Mostly a value in [0, max], sometimes any int64.
inline int64_t small_or_raw(Reader& r, int64_t max) {
  const uint8_t b = r.u8();
  return b < 244 ? b % (max + 1) : r.i64();
}

}  // namespace fuzz
