// Index arrays read on the host: the one copy path for device arrays (a BSR pattern here, an
// attention layout in attention_layout.cpp), the sparse operand's pattern, and its transpose.
#include "core/cuda_host.hpp"

#include <string>

#include "core/device.hpp"
#include "format/format_internal.hpp"

namespace sparsek {

namespace {
[[noreturn]] void bad(const std::string& msg) { throw Error(Status::invalid_argument, msg); }

// check_cuda(), but a failed call's error is cleared first: the caller's next CUDA call (a
// framework's launch check, say) must not report it again as its own.
void check_cleared(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  check_cuda(e, what);
}
}  // namespace

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t ce = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
  if (ce != cudaSuccess) cudaGetLastError();
  return ce == cudaErrorStreamCaptureImplicit || (ce == cudaSuccess && capture != cudaStreamCaptureStatusNone);
}

void copy_to_host(void* stream, const char* capture_refusal, std::initializer_list<HostCopy> copies) {
  // NOTE: the copies below synchronize, which a stream capture cannot contain (CUDA would
  // invalidate the whole capture): refuse before touching anything, saying what to do instead.
  // cudaErrorStreamCaptureImplicit: the legacy stream while another stream captures globally.
  if (stream_is_capturing(stream)) bad(capture_refusal);
  if (stream)
    check_cleared(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize(options.stream)");
  for (const HostCopy& c : copies) {
    if (!c.src || c.count <= 0) continue;
    c.dst->resize(size_t(c.count));
    check_cleared(cudaMemcpy(c.dst->data(), c.src, size_t(c.count) * 4, cudaMemcpyDeviceToHost), c.what);
  }
}

HostPattern host_pattern(const BsrView& s, bool with_col_idx, void* stream) {
  HostPattern hp;
  if (s.memory == Memory::host) {
    hp.row_ptr = s.row_ptr;
    hp.col_idx = s.nnzb > 0 ? s.col_idx : nullptr;
    return hp;
  }
  copy_to_host(stream,
               "the stream is being captured into a CUDA graph, but planning a device pattern reads it on the "
               "host (a synchronizing copy the capture cannot contain): plan before the capture (make the plan, "
               "or run the product once) and capture only the runs",
               {{s.row_ptr, s.mb() + 1, &hp.row_ptr_copy, "cudaMemcpy(row_ptr to host)"},
                {with_col_idx ? s.col_idx : nullptr, s.nnzb, &hp.col_idx_copy, "cudaMemcpy(col_idx to host)"}});
  hp.row_ptr = hp.row_ptr_copy.data();
  if (!hp.col_idx_copy.empty()) hp.col_idx = hp.col_idx_copy.data();
  return hp;
}

PatternTranspose transposed_pattern(const BsrView& s) {
  const HostPattern hp = host_pattern(s, true);
  const int64_t mb = s.mb(), kb = s.kb(), nnzb = s.nnzb;
  for (int64_t i = 0; i < mb; ++i)
    if (hp.row_ptr[i] < 0 || hp.row_ptr[i + 1] < hp.row_ptr[i] || hp.row_ptr[i + 1] > nnzb)
      bad("row_ptr[" + std::to_string(i + 1) + "]=" + std::to_string(hp.row_ptr[i + 1]) + " is out of order or range");
  if (mb >= 0 && hp.row_ptr[mb] != nnzb)
    bad("row_ptr[" + std::to_string(mb) + "]=" + std::to_string(hp.row_ptr[mb]) + " differs from nnzb=" +
        std::to_string(nnzb));
  for (int64_t j = 0; j < nnzb; ++j)
    if (hp.col_idx[j] < 0 || hp.col_idx[j] >= kb)
      bad("col_idx[" + std::to_string(j) + "]=" + std::to_string(hp.col_idx[j]) + " is out of range [0, " +
          std::to_string(kb) + ")");
  return transpose_pattern(hp.row_ptr, hp.col_idx, mb, kb);
}

}  // namespace sparsek
