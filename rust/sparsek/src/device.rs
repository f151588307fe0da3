//! Operands in GPU memory, for callers that manage device buffers and streams themselves (for
//! example through the CUDA driver or runtime API). Everything here is `unsafe`: sparsek cannot
//! check that a pointer is a live device allocation of the size the descriptor says.
use std::os::raw::c_void;


use sparsek_sys as sys;

use crate::error::{check, Result};
use crate::types::{DType, Layout, Op, ScaleDim};

/// A `cudaStream_t` (null: the legacy default stream). Device work is enqueued on it, not
/// waited for.
pub type Stream = *mut c_void;

/// A BSR matrix in device memory (see [`BsrMatrix`](crate::BsrMatrix) for the layout). `scales`:
/// e4m3 only, `[nnzb]` in device memory (null otherwise).
#[derive(Debug, Clone, Copy)]
pub struct DeviceBsr {
    pub rows: i64,
    pub cols: i64,
    pub bm: i32,
    pub bk: i32,
    pub nnzb: i64,
    pub row_ptr: *const i32,
    pub col_idx: *const i32,
    pub values: *mut c_void,
    pub dtype: DType,
    pub scales: *const f32,
}

impl DeviceBsr {
    pub(crate) fn raw(&self) -> sys::sparsek_bsr {
        sys::sparsek_bsr {
            rows: self.rows,
            cols: self.cols,
            bm: self.bm,
            bk: self.bk,
            nnzb: self.nnzb,
            row_ptr: self.row_ptr,
            col_idx: self.col_idx,
            values: self.values,
            dtype: self.dtype.raw(),
            memory: sys::SPARSEK_DEVICE,
            scales: self.scales,
        }
    }
}

/// A dense matrix in device memory: `rows x cols` as stored, leading dimension `ld`. `scales` and
/// `scale_group`: an e4m3 input's (as [`DenseRef::with_scales`](crate::DenseRef::with_scales)), in
/// device memory; null and 0 otherwise.
#[derive(Debug, Clone, Copy)]
pub struct DeviceDense {
    pub data: *mut c_void,
    pub rows: i64,
    pub cols: i64,
    pub ld: i64,
    pub layout: Layout,
    pub dtype: DType,
    pub scales: *const f32,
    pub scale_group: i32,
}

impl DeviceDense {
    pub(crate) fn raw(&self) -> sys::sparsek_dense {
        sys::sparsek_dense {
            data: self.data,
            rows: self.rows,
            cols: self.cols,
            ld: self.ld,
            layout: self.layout.raw(),
            dtype: self.dtype.raw(),
            memory: sys::SPARSEK_DEVICE,
            scales: self.scales,
            scale_group: self.scale_group,
        }
    }
}

/// DSD on device operands: `C = alpha * op(A) * B + beta * C`, enqueued on `stream`.
///
/// # Safety
/// Every pointer must be a device allocation (of the current device) at least as large as its
/// descriptor says, live until the work on `stream` completes; C must not overlap the inputs.
pub unsafe fn dsd(
    op: Op,
    alpha: f32,
    a: &DeviceBsr,
    b: &DeviceDense,
    beta: f32,
    c: &DeviceDense,
    stream: Stream,
) -> Result<()> {
    let (a, b, mut c) = (a.raw(), b.raw(), c.raw());
    check(sys::sparsek_dsd(op.raw(), alpha, &a, &b, beta, &mut c, stream))
}

/// DDS on device operands: `C = alpha * A * op(B) + beta * C`, B sparse.
///
/// # Safety
/// As for [`dsd`].
pub unsafe fn dds(
    op: Op,
    alpha: f32,
    a: &DeviceDense,
    b: &DeviceBsr,
    beta: f32,
    c: &DeviceDense,
    stream: Stream,
) -> Result<()> {
    let (a, b, mut c) = (a.raw(), b.raw(), c.raw());
    check(sys::sparsek_dds(op.raw(), alpha, &a, &b, beta, &mut c, stream))
}

/// SDD on device operands: `C = alpha * (A * B) + beta * C` on C's stored blocks.
///
/// # Safety
/// As for [`dsd`]; C's values are written.
pub unsafe fn sdd(
    alpha: f32,
    a: &DeviceDense,
    b: &DeviceDense,
    beta: f32,
    c: &DeviceBsr,
    stream: Stream,
) -> Result<()> {
    let (a, b, mut c) = (a.raw(), b.raw(), c.raw());
    check(sys::sparsek_sdd(alpha, &a, &b, beta, &mut c, stream))
}


/// e4m3 quantization of a device BSR matrix's values (f32, F16 or Bf16): codes into `values`
/// (`nnzb*bm*bk` bytes) and one scale per block into `scales` (`nnzb` floats), on `stream`. A block
/// holding NaN or an infinity gets a NaN scale (the products refuse it).
///
/// # Safety
/// Every pointer must be a device allocation of the current device, as large as the descriptor
/// says, live until the work on `stream` completes; the outputs must not overlap the input.
pub unsafe fn quantize_bsr_e4m3(input: &DeviceBsr, values: *mut c_void, scales: *mut f32, stream: Stream) -> Result<()> {
    check(sys::sparsek_quantize_bsr_e4m3(&input.raw(), values, scales, stream))
}

/// The values (`dtype`: F32, F16 or Bf16) of a device e4m3 BSR matrix with its scales.
///
/// # Safety
/// As for [`quantize_bsr_e4m3`]; `values` holds `nnzb*bm*bk` elements of `dtype`.
pub unsafe fn dequantize_bsr(input: &DeviceBsr, values: *mut c_void, dtype: DType, stream: Stream) -> Result<()> {
    check(sys::sparsek_dequantize_bsr(&input.raw(), values, dtype.raw(), stream))
}

/// e4m3 quantization of a device dense matrix into `out` (dtype E4m3, same shape; its scales and
/// scale_group are set on success), one scale per token along `dim`.
///
/// # Safety
/// As for [`quantize_bsr_e4m3`]; `scales` holds [`scale_count`](crate::scale_count) floats.
pub unsafe fn quantize_dense_e4m3(
    input: &DeviceDense,
    out: &mut DeviceDense,
    scales: *mut f32,
    dim: ScaleDim,
    scale_group: i32,
    stream: Stream,
) -> Result<()> {
    let mut o = out.raw();
    check(sys::sparsek_quantize_dense_e4m3(&input.raw(), &mut o, scales, dim.raw(), scale_group, stream))?;
    out.scales = o.scales;
    out.scale_group = o.scale_group;
    Ok(())
}

/// The values of a device e4m3 dense matrix (with its scales) into `out` (F32, F16 or Bf16).
///
/// # Safety
/// As for [`quantize_bsr_e4m3`].
pub unsafe fn dequantize_dense(input: &DeviceDense, out: &DeviceDense, dim: ScaleDim, stream: Stream) -> Result<()> {
    check(sys::sparsek_dequantize_dense(&input.raw(), &out.raw(), dim.raw(), stream))
}

/// One product on device operands, for [`Plan::for_device`](crate::Plan::for_device). Slots by
/// kind: DSD `sparse` = A, `b`, `c`; DDS `a`, `sparse` = B, `c`; SDD `a`, `b`, `sparse` = C
/// (its values are the output). Unused slots are `None`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceGemm {
    pub kind: crate::Kind,
    /// On the sparse operand (`Op::None` for SDD).
    pub op: Op,
    pub alpha: f32,
    pub beta: f32,
    pub sparse: DeviceBsr,
    pub a: Option<DeviceDense>,
    pub b: Option<DeviceDense>,
    pub c: Option<DeviceDense>,
}

impl DeviceGemm {
    pub(crate) fn raw(&self) -> sys::sparsek_gemm_args {
        let mut g = crate::plan::empty_args(self.kind, self.op, self.alpha, self.beta);
        g.sparse = self.sparse.raw();
        for (slot, d) in [(&mut g.a, &self.a), (&mut g.b, &self.b), (&mut g.c, &self.c)] {
            if let Some(d) = d {
                *slot = d.raw();
            }
        }
        g
    }
}
