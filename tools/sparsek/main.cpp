// `sparsek`: bench, verify, doctor, tune, cache, profile. Exit codes: 0 ok, 1 a check failed (or the work could not
// run), 2 a command-line mistake (the message names the flag and the value).
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "cli.hpp"
#include "sparsek/gemm.hpp"

namespace {

void usage() {
  std::printf(
      "Usage: sparsek <command> [flags]\n\n"
      "sparsek %s: block-sparse (BSR) matrix products and attention for NVIDIA Hopper.\n\n"
      "Commands:\n"
      "  bench    time sparsek's variants beside cuSPARSE and cuBLAS (CPU backend when no GPU);\n"
      "           --op attention: block-sparse attention; --op gate: the top-k gate;\n"
      "           --op decode: paged decode attention; --dtype e4m3: fp8 products\n"
      "  verify   randomized correctness sweep against the fp64 oracle\n"
      "  doctor   what this machine has (driver, runtime, GPU, libraries) and what is missing\n"
      "  tune     time every variant on a workload and store the winner in the tuning cache\n"
      "  cache    show or clear the tuning cache\n"
      "  profile  Nsight Compute's key metrics of one sparsek kernel launch, as a diffable text file\n\n"
      "`sparsek <command> --help` lists a command's flags.\n",
      sparsek::version());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("sparsek %s\n", sparsek::version());
    return 0;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> rest(argv + 2, argv + argc);
  try {
    if (cmd == "bench") return sparsek::cli::bench_main(rest);
    if (cmd == "verify") return sparsek::cli::verify_main(rest);
    if (cmd == "doctor") return sparsek::cli::doctor_main(rest);
    if (cmd == "tune") return sparsek::cli::tune_main(rest);
    if (cmd == "cache") return sparsek::cli::cache_main(rest);
    if (cmd == "profile") return sparsek::cli::profile_main(rest);
    std::fprintf(stderr,
                 "sparsek: unknown command '%s' (commands: bench, verify, doctor, tune, cache, profile; see sparsek "
                 "--help)\n",
                 cmd.c_str());
    return 2;
  } catch (const sparsek::cli::UsageError& e) {
    std::fprintf(stderr, "sparsek %s: %s\n", cmd.c_str(), e.what());
    return 2;
  } catch (const sparsek::Error& e) {
    std::fprintf(stderr, "sparsek %s: %s: %s\n", cmd.c_str(), sparsek::to_string(e.status()), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "sparsek %s: out of host memory (do the size flags ask for more than this machine has?)\n",
                 cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparsek %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
