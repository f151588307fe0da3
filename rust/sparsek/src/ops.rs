//! The products on host operands (the CPU backend). Each call validates everything and plans
//! through the library's small cache of recent plans; use [`Plan`](crate::Plan) to plan once.
use std::ptr;

use sparsek_sys as sys;

use crate::error::{check, Result};
use crate::matrix::{BsrMatrix, DenseMut, DenseRef};
use crate::types::{Element, Op};

/// DSD: `C = alpha * op(A) * B + beta * C`, A sparse. The inputs share one element type; C may be
/// `f32` for half inputs. With `beta = 0`, C is never read. [`E4m3`](crate::E4m3) inputs carry their
/// scales (A per block, B per column) and give an f32, F16 or Bf16 C.
pub fn dsd<T: Element, U: Element>(
    op: Op,
    alpha: f32,
    a: &BsrMatrix<T>,
    b: &DenseRef<T>,
    beta: f32,
    c: &mut DenseMut<U>,
) -> Result<()> {
    let (a, b, mut c) = (a.raw()?, b.raw_input("B", false)?, c.raw()?);
    // SAFETY: the descriptors point into live slices whose lengths were checked against the
    // shapes; C is borrowed mutably for the call.
    check(unsafe { sys::sparsek_dsd(op.raw(), alpha, &a, &b, beta, &mut c, ptr::null_mut()) })
}

/// DDS: `C = alpha * A * op(B) + beta * C`, B sparse (e4m3: A's scales per row).
pub fn dds<T: Element, U: Element>(
    op: Op,
    alpha: f32,
    a: &DenseRef<T>,
    b: &BsrMatrix<T>,
    beta: f32,
    c: &mut DenseMut<U>,
) -> Result<()> {
    let (a, b, mut c) = (a.raw_input("A", true)?, b.raw()?, c.raw()?);
    // SAFETY: as in dsd.
    check(unsafe { sys::sparsek_dds(op.raw(), alpha, &a, &b, beta, &mut c, ptr::null_mut()) })
}

/// SDD: `C = alpha * (A * B) + beta * C` on the stored blocks of C only (C's values are written;
/// borrowed values are copied first).
pub fn sdd<T: Element, U: Element>(
    alpha: f32,
    a: &DenseRef<T>,
    b: &DenseRef<T>,
    beta: f32,
    c: &mut BsrMatrix<U>,
) -> Result<()> {
    let (a, b, mut c) = (a.raw()?, b.raw()?, c.raw_mut()?);
    // SAFETY: as in dsd; C's values are owned and borrowed mutably for the call.
    check(unsafe { sys::sparsek_sdd(alpha, &a, &b, beta, &mut c, ptr::null_mut()) })
}
