//! Safe Rust API of sparsek: block-sparse (BSR) matrix products on the CPU and NVIDIA GPUs.
//!
//! - DSD `C = alpha * op(A) * B + beta * C` with A sparse ([`dsd`]),
//! - DDS `C = alpha * A * op(B) + beta * C` with B sparse ([`dds`]),
//! - SDD `C = alpha * (A * B) + beta * C` on the stored blocks of C ([`sdd`]);
//! - block-sparse attention, forward and backward ([`attention`], [`attention_backward`]), with a
//!   FlexAttention-style [`BlockLayout`], GQA, causal masking and packed sequences, and the top-k
//!   block [`gate`] that chooses such a layout from q and k;
//! - decode attention over a paged KV cache ([`decode_attention`]) and the page selection that
//!   chooses which pages it reads ([`update_page_summaries`], [`select_pages`]).
//!
//! fp8: [`E4m3`] operands carry fp32 scales (one per stored block of the sparse operand, one per
//! token of the dense one): [`BsrMatrix::quantize`], [`quantize_dense`], then [`dsd`] / [`dds`].
//!
//! Host operands ([`BsrMatrix`], [`DenseRef`], [`DenseMut`]) run on the CPU backend; device
//! pointers go through the `unsafe` functions of [`device`], with a CUDA stream. [`Plan`] checks
//! and prepares a problem once and runs it many times. Every failure is an [`Error`] carrying the
//! library's status and its message, which names the argument and the offending value.
//!
//! ```no_run
//! use sparsek::{dsd, BsrMatrix, DenseMut, DenseRef, Op};
//! # fn main() -> sparsek::Result<()> {
//! // A 64x64 matrix of 32x32 blocks, all four stored.
//! let a: BsrMatrix<f32> = BsrMatrix::from_dense(&[1.0; 64 * 64], 64, 64, (32, 32))?;
//! let b = vec![1.0f32; 64 * 8];
//! let mut c = vec![0.0f32; 64 * 8];
//! dsd(Op::None, 1.0, &a, &DenseRef::new(&b, 64, 8)?, 0.0, &mut DenseMut::new(&mut c, 64, 8)?)?;
//! assert_eq!(c[0], 64.0);
//! # Ok(()) }
//! ```
//!
//! The crate links libsparsek (found at build time through `SPARSEK_DIR`, pkg-config, or the
//! repository's CMake build tree); at run time libsparsek must be on the loader's path.
use std::ffi::CStr;

pub use sparsek_sys as sys;

mod attention;
mod decode;
pub mod device;
mod gate;
mod error;
mod matrix;
mod ops;
mod plan;
mod types;

pub use attention::{attention, attention_backward, AttentionOptions, BlockLayout, ForwardOutputs, Tensor4, Tensor4Mut};
pub use decode::{
    decode_attention, select_pages, update_page_summaries, DecodeOptions, PageSelectOptions, PageSelection, PagedCache, Requests,
    Tokens, TokensMut,
};
pub use error::{Error, Result, Status};
pub use gate::{gate, GateLayout, GateOptions};
pub use matrix::{dequantize_dense, quantize_dense, scale_count, BsrMatrix, DenseMut, DenseRef};
pub use ops::{dds, dsd, sdd};
pub use plan::{Kind, Plan};
pub use types::{Bf16, DType, Element, Layout, Op, ScaleDim, E4m3, F16};

/// The library's version, "MAJOR.MINOR.PATCH".
#[must_use]
pub fn version() -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::sparsek_version()) }.to_string_lossy().into_owned()
}

/// Whether a CUDA device answers (without one, only host operands can be used).
#[must_use]
pub fn has_cuda() -> bool {
    // SAFETY: no arguments; never fails.
    unsafe { sys::sparsek_has_cuda() != 0 }
}
