// sparsek._sparsek — the only native piece of the Python package. It converts DLPack arrays
// (NumPy, torch, CuPy; host or CUDA memory) into sparsek views and calls the C++ API; everything
// else (allocation, conversions, torch ops) lives in Python, in the caller's framework.
//
// Sparse operands arrive as (rows, cols, row_ptr int32[mb+1], col_idx int32[nnzb],
// values [nnzb][bm][bk]); dense operands as 2-D arrays that are row- or column-major with a unit
// inner stride. e4m3 (fp8) arrays arrive as uint8 arrays of the codes (torch's float8_e4m3fn is
// viewed as uint8 by the Python side) with their float32 scales beside them. sparsek::Error becomes
// ValueError (invalid_argument), NotImplementedError (unsupported), NcclError (a RuntimeError:
// nccl_error) or RuntimeError (everything else), carrying the library's message.
// Plans (plan_dsd/dds/sdd -> Plan.run, plan_attention -> AttentionPlan.run) are the same calls
// split in two: arrays once, then only the data pointers of arrays that the Python caller has
// matched to the planned ones.
// Attention takes q, k, v, o as 4-D [B, H, S, D] arrays (D contiguous, any other strides), lse as
// a contiguous float32 [B, Hq, Sq] array, and the block layout as contiguous int32 arrays
// kv_num_blocks [b, h, Mq], kv_indices [b, h, Mq, kmax] (+ the optional full lists), and packed
// sequences' offsets as an optional contiguous int32 cu_seqlens [num_seqs + 1] beside the layout.
//
// One file per surface, each adding its functions and classes through a bind_* function; the
// array helpers they share are in _sparsek_arrays.hpp:
//   _sparsek_products.cpp     dsd, dds, sdd, their plans, validate_bsr, e4m3 quantization
//   _sparsek_distributed.cpp  the distributed DSD, context-parallel attention, partition_block_rows
//   _sparsek_attention.cpp    attention (forward, backward), its plans, the top-k gate
//   _sparsek_decode.cpp       decode attention over a paged KV cache, page selection
#include "_sparsek_arrays.hpp"

using namespace sparsek;

NB_MODULE(_sparsek, m) {
  m.doc() = "sparsek native binding: converts DLPack arrays to sparsek views and calls the C++ API";

  // NCCL failures get a RuntimeError of their own (sparsek.distributed.NcclError), so that a caller
  // can tell them from the library's other runtime errors.
  PyObject* nccl_error = PyErr_NewException("sparsek._sparsek.NcclError", PyExc_RuntimeError, nullptr);
  m.attr("NcclError") = nb::steal(nccl_error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* nccl) {
        try {
          std::rethrow_exception(p);
        } catch (const Error& e) {
          PyObject* type = e.status() == Status::invalid_argument ? PyExc_ValueError
                           : e.status() == Status::unsupported    ? PyExc_NotImplementedError
                           : e.status() == Status::nccl_error     ? static_cast<PyObject*>(nccl)
                                                                  : PyExc_RuntimeError;
          PyErr_SetString(type, e.what());
        }
      },
      nccl_error);

  // NOTE: plans are cached on the pattern's tensors (the Python side), which may still be alive
  // when the interpreter tears the module down; nanobind would report them as leaks.
  nb::set_leak_warnings(false);

  m.def("version", &version);

  py::bind_products(m);
  py::bind_distributed(m);
  py::bind_attention(m);
  py::bind_decode(m);
}
