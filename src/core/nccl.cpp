// NCCL through dlopen: see nccl.hpp.
#include "core/nccl.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <type_traits>

#include "sparsek/types.hpp"

namespace sparsek::nccl {

namespace {

std::unique_ptr<Api> load() {
  const char* env = std::getenv("SPARSEK_NCCL_LIBRARY");
  std::string file = env && *env ? env : "libnccl.so.2";
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    const char* why = dlerror();
    throw Error(Status::unsupported,
                "NCCL is not available: dlopen(\"" + file + "\") failed (" + (why ? why : "unknown") +
                    "); install NCCL (libnccl2, or the nvidia-nccl Python wheel) or set SPARSEK_NCCL_LIBRARY "
                    "to the path of libnccl.so.2");
  }
  auto a = std::make_unique<Api>();
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn)
      throw Error(Status::unsupported, "NCCL library \"" + file + "\" has no symbol " + name +
                                           " (too old or not NCCL; set SPARSEK_NCCL_LIBRARY)");
  };
  // NOTE: the handle is never closed: function pointers into it may be held for the process's life.
  sym(a->GetVersion, "ncclGetVersion");
  sym(a->GetErrorString, "ncclGetErrorString");
  sym(a->CommCount, "ncclCommCount");
  sym(a->CommCuDevice, "ncclCommCuDevice");
  sym(a->CommUserRank, "ncclCommUserRank");
  sym(a->Broadcast, "ncclBroadcast");
  sym(a->AllGather, "ncclAllGather");
  sym(a->Send, "ncclSend");
  sym(a->Recv, "ncclRecv");
  sym(a->GroupStart, "ncclGroupStart");
  sym(a->GroupEnd, "ncclGroupEnd");
  sym(a->CommInitAll, "ncclCommInitAll");
  sym(a->CommDestroy, "ncclCommDestroy");
  a->library = file;
  if (a->GetVersion(&a->version) != 0) a->version = 0;
  return a;
}

std::mutex mu;
std::unique_ptr<Api> loaded;  // set once; never reset (callers keep references)

// ncclResult_t's names (nccl.h), for the message.
const char* result_name(Result r) {
  static const char* names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",   "ncclInProgress"};
  return r >= 0 && r < Result(sizeof names / sizeof names[0]) ? names[r] : "ncclResult";
}

}  // namespace

const Api& api() {
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) loaded = load();
  return *loaded;
}

void check(Result r, const char* what) {
  if (r == 0) return;
  const Api* a = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    a = loaded.get();  // no load here: a result code can be reported without the library
  }
  const char* text = a && a->GetErrorString ? a->GetErrorString(r) : nullptr;
  throw Error(Status::nccl_error, std::string("NCCL: ") + what + " failed: " + (text ? text : "no error text") +
                                      " (" + result_name(r) + " = " + std::to_string(r) + ")");
}

}  // namespace sparsek::nccl
