#include <cstdio>
#include "sparsek/gemm.hpp"
int main() { std::printf("sparsek %s\n", sparsek::version()); return 0; }
