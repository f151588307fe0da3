//! Plans: check and prepare once per pattern (validation, row-length analysis, variant choice,
//! set-up), then run many times without allocating.
use std::ffi::{CStr, CString};
use std::os::raw::c_void;
use std::ptr;

use sparsek_sys as sys;

use crate::device::{DeviceGemm, Stream};
use crate::error::{check, Error, Result};
use crate::matrix::{BsrMatrix, DenseMut, DenseRef};
use crate::types::{Element, Op};

/// Which product a plan computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `C = alpha * op(A) * B + beta * C`, A sparse.
    Dsd,
    /// `C = alpha * A * op(B) + beta * C`, B sparse.
    Dds,
    /// `C = alpha * (A * B) + beta * C` on C's stored blocks.
    Sdd,
}

pub(crate) fn empty_args(kind: Kind, op: Op, alpha: f32, beta: f32) -> sys::sparsek_gemm_args {
    // SAFETY: every field is an integer, a float or a raw pointer, for which all-zero is valid.
    let mut g: sys::sparsek_gemm_args = unsafe { std::mem::zeroed() };
    g.kind = match kind {
        Kind::Dsd => sys::SPARSEK_DSD,
        Kind::Dds => sys::SPARSEK_DDS,
        Kind::Sdd => sys::SPARSEK_SDD,
    };
    g.op = op.raw();
    g.alpha = alpha;
    g.beta = beta;
    g
}

/// A host plan keeps its own copy of the pattern: the library needs the pattern arrays to stay
/// alive and unchanged while the plan lives, and the caller's matrix may be dropped or edited.
#[derive(Debug)]
struct HostPattern {
    kind: Kind,
    rows: usize,
    cols: usize,
    block: (usize, usize),
    row_ptr: Vec<i32>,
    col_idx: Vec<i32>,
}

/// A prepared product. Made for one problem (kind, op, shapes, block shape, dtypes, layouts,
/// leading dimensions, memory, pattern); the values, the dense data, alpha and beta may change
/// between runs. Dropping it frees the library's plan.
///
/// A plan may move between threads, but runs must not overlap in time (its workspace is used in
/// stream order): give each concurrent stream its own plan.
#[derive(Debug)]
pub struct Plan {
    raw: sys::sparsek_plan,
    host: Option<HostPattern>,
}

// SAFETY: the handle is not tied to the thread that made it; `Plan` is not `Sync`, so two threads
// cannot run one plan at the same time through safe code.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: raw came from sparsek_plan_create and is destroyed once. Destroying cannot fail
        // for a valid handle, and a destructor has no caller to tell.
        unsafe {
            sys::sparsek_plan_destroy(self.raw);
        }
    }
}

fn variant_cstring(variant: Option<&str>) -> Result<Option<CString>> {
    variant
        .map(|v| CString::new(v).map_err(|_| Error::invalid(format!("variant {v:?} contains a NUL byte"))))
        .transpose()
}

impl Plan {
    fn create(args: &sys::sparsek_gemm_args, variant: Option<&str>, host: Option<HostPattern>) -> Result<Plan> {
        let variant = variant_cstring(variant)?;
        let mut raw: sys::sparsek_plan = ptr::null_mut();
        let name = variant.as_ref().map_or(ptr::null(), |v| v.as_ptr());
        // SAFETY: args points at live, length-checked host memory (or, for device plans, at what
        // the unsafe caller vouched for); the pattern pointers are the plan's own copy.
        check(unsafe { sys::sparsek_plan_create(&mut raw, args, name) })?;
        Ok(Plan { raw, host })
    }

    fn host_plan<T: Element>(kind: Kind, sparse: &BsrMatrix<T>, mut args: sys::sparsek_gemm_args, variant: Option<&str>) -> Result<Plan> {
        let pattern = HostPattern {
            kind,
            rows: sparse.rows(),
            cols: sparse.cols(),
            block: sparse.block(),
            row_ptr: sparse.row_ptr().to_vec(),
            col_idx: sparse.col_idx().to_vec(),
        };
        args.sparse.row_ptr = pattern.row_ptr.as_ptr();
        args.sparse.col_idx = pattern.col_idx.as_ptr();
        Plan::create(&args, variant, Some(pattern))
    }

    /// Plans DSD (`C = alpha * op(A) * B + beta * C`) for A's pattern and these shapes.
    /// `variant`: `None` for the automatic choice, or a variant's name (`"cpu"`, ...).
    pub fn dsd<T: Element, U: Element>(
        op: Op,
        a: &BsrMatrix<T>,
        b: &DenseRef<T>,
        c: &DenseMut<U>,
        variant: Option<&str>,
    ) -> Result<Plan> {
        let mut g = empty_args(Kind::Dsd, op, 1.0, 0.0);
        g.sparse = a.raw()?;
        g.b = b.raw_input("B", false)?;
        g.c = c.raw_const()?;
        Plan::host_plan(Kind::Dsd, a, g, variant)
    }

    /// Plans DDS (`C = alpha * A * op(B) + beta * C`) for B's pattern and these shapes.
    pub fn dds<T: Element, U: Element>(
        op: Op,
        a: &DenseRef<T>,
        b: &BsrMatrix<T>,
        c: &DenseMut<U>,
        variant: Option<&str>,
    ) -> Result<Plan> {
        let mut g = empty_args(Kind::Dds, op, 1.0, 0.0);
        g.a = a.raw_input("A", true)?;
        g.sparse = b.raw()?;
        g.c = c.raw_const()?;
        Plan::host_plan(Kind::Dds, b, g, variant)
    }

    /// Plans SDD (`C = alpha * (A * B) + beta * C` on C's blocks) for C's pattern and these shapes.
    pub fn sdd<T: Element, U: Element>(
        a: &DenseRef<T>,
        b: &DenseRef<T>,
        c: &BsrMatrix<U>,
        variant: Option<&str>,
    ) -> Result<Plan> {
        let mut g = empty_args(Kind::Sdd, Op::None, 1.0, 0.0);
        g.a = a.raw()?;
        g.b = b.raw()?;
        g.sparse = c.raw()?;
        Plan::host_plan(Kind::Sdd, c, g, variant)
    }

    /// Plans a product on device operands.
    ///
    /// # Safety
    /// The pattern arrays (`problem.sparse.row_ptr`, `col_idx`) must stay allocated and unchanged
    /// while the plan lives, and every pointer must be valid as for [`device::dsd`](crate::device::dsd)
    /// (plan() reads the device pattern once, synchronously).
    pub unsafe fn for_device(problem: &DeviceGemm, variant: Option<&str>) -> Result<Plan> {
        Plan::create(&problem.raw(), variant, None)
    }

    /// Runs a device plan on `stream` (allocation-free; may be captured in a CUDA graph).
    ///
    /// # Safety
    /// As for [`device::dsd`](crate::device::dsd); `args` must match the planned problem (the
    /// library checks the shapes and the pattern pointers and names the first difference).
    pub unsafe fn run_device(&self, args: &DeviceGemm, stream: Stream) -> Result<()> {
        check(sys::sparsek_plan_run(self.raw, &args.raw(), stream))
    }

    /// This host plan's pattern, after checking that `m` has the same one.
    fn pattern_for<T: Element>(&self, kind: Kind, name: &str, m: &BsrMatrix<T>) -> Result<&HostPattern> {
        let p = self
            .host
            .as_ref()
            .ok_or_else(|| Error::invalid("this plan was made for device operands: use run_device"))?;
        if p.kind != kind {
            return Err(Error::invalid(format!("this plan computes {:?}, not {:?}", p.kind, kind)));
        }
        if (m.rows(), m.cols(), m.block()) != (p.rows, p.cols, p.block)
            || m.row_ptr() != p.row_ptr.as_slice()
            || m.col_idx() != p.col_idx.as_slice()
        {
            return Err(Error::invalid(format!(
                "{name}: its pattern ({}x{}, block {:?}, nnzb={}) is not the one the plan was made for \
                 ({}x{}, block {:?}, nnzb={})",
                m.rows(),
                m.cols(),
                m.block(),
                m.nnzb(),
                p.rows,
                p.cols,
                p.block,
                p.col_idx.len()
            )));
        }
        Ok(p)
    }

    fn run_host(&self, mut g: sys::sparsek_gemm_args, p: &HostPattern) -> Result<()> {
        g.sparse.row_ptr = p.row_ptr.as_ptr();
        g.sparse.col_idx = p.col_idx.as_ptr();
        // SAFETY: host descriptors over live, length-checked slices; the pattern is the plan's own.
        check(unsafe { sys::sparsek_plan_run(self.raw, &g, ptr::null_mut::<c_void>()) })
    }

    /// Runs a DSD plan: same pattern and shapes as planned; values, data, alpha, beta may differ.
    pub fn run_dsd<T: Element, U: Element>(
        &self,
        op: Op,
        alpha: f32,
        a: &BsrMatrix<T>,
        b: &DenseRef<T>,
        beta: f32,
        c: &mut DenseMut<U>,
    ) -> Result<()> {
        let p = self.pattern_for(Kind::Dsd, "a", a)?;
        let mut g = empty_args(Kind::Dsd, op, alpha, beta);
        g.sparse = a.raw()?;
        g.b = b.raw_input("B", false)?;
        g.c = c.raw()?;
        self.run_host(g, p)
    }

    /// Runs a DDS plan.
    pub fn run_dds<T: Element, U: Element>(
        &self,
        op: Op,
        alpha: f32,
        a: &DenseRef<T>,
        b: &BsrMatrix<T>,
        beta: f32,
        c: &mut DenseMut<U>,
    ) -> Result<()> {
        let p = self.pattern_for(Kind::Dds, "b", b)?;
        let mut g = empty_args(Kind::Dds, op, alpha, beta);
        g.a = a.raw_input("A", true)?;
        g.sparse = b.raw()?;
        g.c = c.raw()?;
        self.run_host(g, p)
    }

    /// Runs an SDD plan (C's values are written).
    pub fn run_sdd<T: Element, U: Element>(
        &self,
        alpha: f32,
        a: &DenseRef<T>,
        b: &DenseRef<T>,
        beta: f32,
        c: &mut BsrMatrix<U>,
    ) -> Result<()> {
        let p = self.pattern_for(Kind::Sdd, "c", c)?;
        let mut g = empty_args(Kind::Sdd, Op::None, alpha, beta);
        g.a = a.raw()?;
        g.b = b.raw()?;
        g.sparse = c.raw_mut()?;
        self.run_host(g, p)
    }

    /// Name of the variant the plan chose (`"cpu"`, `"hopper"`, `"portable"`, ...).
    #[must_use]
    pub fn variant(&self) -> String {
        // SAFETY: valid while the plan lives; copied at once.
        unsafe { CStr::from_ptr(sys::sparsek_plan_variant(self.raw)) }.to_string_lossy().into_owned()
    }

    /// Scratch memory the plan holds, in bytes.
    pub fn workspace_bytes(&self) -> Result<u64> {
        let mut bytes = 0u64;
        // SAFETY: a live plan and a valid out-pointer.
        check(unsafe { sys::sparsek_plan_workspace_bytes(self.raw, &mut bytes) })?;
        Ok(bytes)
    }
}
