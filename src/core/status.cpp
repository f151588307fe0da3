#include "sparsek/gemm.hpp"
#include "sparsek/types.hpp"

namespace sparsek {

const char* to_string(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::invalid_argument: return "invalid argument";
    case Status::unsupported: return "unsupported";
    case Status::cuda_error: return "CUDA error";
    case Status::no_device: return "no CUDA device";
    case Status::io_error: return "I/O error";
    case Status::internal: return "internal error";
    case Status::nccl_error: return "NCCL error";
  }
  return "unknown status";
}
const char* to_string(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
  }
  return "invalid dtype";
}
// Out-of-range values (a C caller may pass any int) never read as a valid name; validation
// reports them with their number.
const char* to_string(Layout l) {
  switch (l) {
    case Layout::row_major: return "row-major";
    case Layout::col_major: return "col-major";
  }
  return "invalid layout";
}
const char* to_string(Op o) {
  switch (o) {
    case Op::none: return "none";
    case Op::trans: return "trans";
  }
  return "invalid op";
}
const char* to_string(Memory m) {
  switch (m) {
    case Memory::host: return "host";
    case Memory::device: return "device";
  }
  return "invalid memory";
}
const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::dsd: return "dsd";
    case OpKind::dds: return "dds";
    case OpKind::sdd: return "sdd";
  }
  return "invalid kind";
}
size_t dtype_size(DType d) {
  switch (d) {
    case DType::f32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::e4m3: return 1;
  }
  return 4;  // out of range (validation refuses it first); the widest keeps byte counts safe
}

const char* version() { return SPARSEK_VERSION_STRING; }

}  // namespace sparsek
