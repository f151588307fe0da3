// Internal: NCCL, loaded at run time (dlopen), so that libsparsek neither links it nor needs it
// unless a distributed product is planned. Only the entry points sparsek calls (and the two the
// tests and the benchmark use to make communicators of their own) are looked up; their types are
// declared here from NCCL's C ABI (nccl.h), which is not included.
#pragma once
#include <cstddef>
#include <string>

struct ncclComm;  // NCCL's communicator: ncclComm_t is ncclComm*

namespace sparsek::nccl {

using Result = int;                  // ncclResult_t: ncclSuccess = 0
constexpr int kUint8 = 1;            // ncclDataType_t ncclUint8: collectives move bytes

struct Api {
  Result (*GetVersion)(int* version);
  const char* (*GetErrorString)(Result result);
  Result (*CommCount)(ncclComm* comm, int* count);
  Result (*CommCuDevice)(ncclComm* comm, int* device);
  Result (*CommUserRank)(ncclComm* comm, int* rank);
  Result (*Broadcast)(const void* send, void* recv, size_t count, int dtype, int root, ncclComm* comm,
                      void* stream);
  Result (*AllGather)(const void* send, void* recv, size_t count, int dtype, ncclComm* comm, void* stream);
  Result (*Send)(const void* send, size_t count, int dtype, int peer, ncclComm* comm, void* stream);
  Result (*Recv)(void* recv, size_t count, int dtype, int peer, ncclComm* comm, void* stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  // Not used by the library (it never makes a communicator): for tests and benchmarks.
  Result (*CommInitAll)(ncclComm** comms, int ndev, const int* devlist);
  Result (*CommDestroy)(ncclComm* comm);
  std::string library;  // the file name given to dlopen
  int version = 0;      // ncclGetVersion: major*10000 + minor*100 + patch (since 2.9)
};

// Loads NCCL once: $SPARSEK_NCCL_LIBRARY if set, else "libnccl.so.2" (the loader's search path;
// a copy already loaded in the process, e.g. by PyTorch, is the one found). Throws
// Error(unsupported) saying what was tried and how to point at the library when it cannot be
// loaded; a failed load is tried again on the next call.
const Api& api();

// Throws Error(nccl_error) "NCCL: <what> failed: <NCCL's text> (<ncclResult name> = r)" when r is
// not ncclSuccess. NCCL's text comes from the loaded library when there is one (an invalid
// communicator reads "invalid argument" there, never a CUDA error).
void check(Result r, const char* what);

}  // namespace sparsek::nccl
