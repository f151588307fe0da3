/* sparsek — the library version. This is the one place it is written: CMakeLists.txt and
 * pyproject.toml read the three numbers below, and a test checks the Rust crates against them. */
#ifndef SPARSEK_VERSION_H
#define SPARSEK_VERSION_H

#define SPARSEK_VERSION_MAJOR 0
#define SPARSEK_VERSION_MINOR 1
#define SPARSEK_VERSION_PATCH 0

/* One number for compile-time checks: 0.1.0 -> 100, 1.2.3 -> 10203. */
#define SPARSEK_VERSION (SPARSEK_VERSION_MAJOR * 10000 + SPARSEK_VERSION_MINOR * 100 + SPARSEK_VERSION_PATCH)

#define SPARSEK_VERSION_STR_(x) #x
#define SPARSEK_VERSION_STR(x) SPARSEK_VERSION_STR_(x)
/* "MAJOR.MINOR.PATCH" of the headers; sparsek_version() / sparsek::version() give the library's. */
#define SPARSEK_VERSION_STRING                                            \
  SPARSEK_VERSION_STR(SPARSEK_VERSION_MAJOR) "." SPARSEK_VERSION_STR(SPARSEK_VERSION_MINOR) "." \
  SPARSEK_VERSION_STR(SPARSEK_VERSION_PATCH)

#endif /* SPARSEK_VERSION_H */
