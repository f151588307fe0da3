//! Host operands: a BSR matrix that owns or borrows its arrays, and dense views over slices.
use std::borrow::Cow;
use std::os::raw::c_void;

use sparsek_sys as sys;

use crate::error::{check, Error, Result};
use crate::types::{Element, Layout};

fn to_i64(what: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(format!("{what}={v} does not fit in int64")))
}

/// A block-sparse (BSR) matrix in host memory: `row_ptr[rows/bm + 1]`, `col_idx[nnzb]` (sorted
/// and unique within a block row) and `values[nnzb][bm][bk]` (each block row-major). Each array
/// is owned (`Vec`) or borrowed (`&[_]`); writing the values of a borrowed matrix (as the output of
/// [`sdd`](crate::sdd)) copies them first, as `Cow` does.
#[derive(Debug, Clone)]
pub struct BsrMatrix<'a, T: Element> {
    rows: usize,
    cols: usize,
    bm: usize,
    bk: usize,
    row_ptr: Cow<'a, [i32]>,
    col_idx: Cow<'a, [i32]>,
    values: Cow<'a, [T]>,
}

impl<'a, T: Element> BsrMatrix<'a, T> {
    /// A `rows x cols` matrix of `(bm, bk)` blocks. Checks the lengths of the arrays here and the
    /// rest (block shape, divisibility, `row_ptr` and `col_idx` contents) in the library; the error
    /// names the array, the first offending index and its value.
    pub fn new(
        rows: usize,
        cols: usize,
        block: (usize, usize),
        row_ptr: impl Into<Cow<'a, [i32]>>,
        col_idx: impl Into<Cow<'a, [i32]>>,
        values: impl Into<Cow<'a, [T]>>,
    ) -> Result<Self> {
        let (bm, bk) = block;
        if bm == 0 || bk == 0 {
            return Err(Error::invalid(format!("block ({bm}, {bk}): bm and bk must be one of 16, 32, 64, 128")));
        }
        let m = BsrMatrix { rows, cols, bm, bk, row_ptr: row_ptr.into(), col_idx: col_idx.into(), values: values.into() };
        let mb = rows / bm;
        if m.row_ptr.len() != mb + 1 {
            return Err(Error::invalid(format!(
                "row_ptr has {} entries but rows/bm + 1 = {}/{} + 1 = {}",
                m.row_ptr.len(),
                rows,
                bm,
                mb + 1
            )));
        }
        let want = m.col_idx.len().checked_mul(bm * bk);
        if want != Some(m.values.len()) {
            return Err(Error::invalid(format!(
                "values has {} elements but nnzb*bm*bk = {}*{}*{} (nnzb = col_idx.len())",
                m.values.len(),
                m.col_idx.len(),
                bm,
                bk
            )));
        }
        let raw = m.raw_with(m.values.as_ptr() as *mut c_void)?;
        // SAFETY: the lengths above match what the descriptor says; validate only reads.
        check(unsafe { sys::sparsek_bsr_validate(&raw) })?;
        Ok(m)
    }

    /// The matrix of the non-zero `(bm, bk)` blocks of a row-major `rows x cols` dense matrix.
    pub fn from_dense(dense: &[f32], rows: usize, cols: usize, block: (usize, usize)) -> Result<BsrMatrix<'static, T>> {
        let (bm, bk) = block;
        if dense.len() != rows * cols {
            return Err(Error::invalid(format!("dense has {} elements, not rows*cols = {rows}*{cols}", dense.len())));
        }
        if bm == 0 || bk == 0 || rows / bm * bm != rows || cols / bk * bk != cols {
            return Err(Error::invalid(format!("block ({bm}, {bk}) does not tile a {rows}x{cols} matrix")));
        }
        let (mut row_ptr, mut col_idx, mut values) = (vec![0i32], Vec::new(), Vec::new());
        for br in 0..rows / bm {
            for bc in 0..cols / bk {
                let at = |r: usize, c: usize| dense[(br * bm + r) * cols + bc * bk + c];
                if (0..bm).any(|r| (0..bk).any(|c| at(r, c) != 0.0)) {
                    col_idx.push(bc as i32);
                    for r in 0..bm {
                        values.extend((0..bk).map(|c| T::from_f32(at(r, c))));
                    }
                }
            }
            row_ptr.push(col_idx.len() as i32);
        }
        BsrMatrix::new(rows, cols, block, row_ptr, col_idx, values)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// `(bm, bk)`.
    pub fn block(&self) -> (usize, usize) {
        (self.bm, self.bk)
    }
    /// Number of stored blocks.
    pub fn nnzb(&self) -> usize {
        self.col_idx.len()
    }
    pub fn row_ptr(&self) -> &[i32] {
        &self.row_ptr
    }
    pub fn col_idx(&self) -> &[i32] {
        &self.col_idx
    }
    pub fn values(&self) -> &[T] {
        &self.values
    }
    /// The values, made owned first if they were borrowed.
    pub fn values_mut(&mut self) -> &mut [T] {
        self.values.to_mut()
    }
    /// An owning copy (borrowed arrays are copied).
    #[must_use]
    pub fn into_owned(self) -> BsrMatrix<'static, T> {
        BsrMatrix {
            rows: self.rows,
            cols: self.cols,
            bm: self.bm,
            bk: self.bk,
            row_ptr: Cow::Owned(self.row_ptr.into_owned()),
            col_idx: Cow::Owned(self.col_idx.into_owned()),
            values: Cow::Owned(self.values.into_owned()),
        }
    }
    /// The matrix as row-major `rows x cols` f32 (absent blocks are zeros).
    #[must_use]
    pub fn to_dense(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        let block = self.bm * self.bk;
        for br in 0..self.row_ptr.len().saturating_sub(1) {
            for j in self.row_ptr[br] as usize..self.row_ptr[br + 1] as usize {
                let bc = self.col_idx[j] as usize;
                for r in 0..self.bm {
                    for c in 0..self.bk {
                        out[(br * self.bm + r) * self.cols + bc * self.bk + c] =
                            self.values[j * block + r * self.bk + c].to_f32();
                    }
                }
            }
        }
        out
    }

    /// The C descriptor with the given values pointer (the pattern is this matrix's).
    pub(crate) fn raw_with(&self, values: *mut c_void) -> Result<sys::sparsek_bsr> {
        Ok(sys::sparsek_bsr {
            rows: to_i64("rows", self.rows)?,
            cols: to_i64("cols", self.cols)?,
            bm: self.bm as i32,
            bk: self.bk as i32,
            nnzb: to_i64("nnzb", self.col_idx.len())?,
            row_ptr: self.row_ptr.as_ptr(),
            col_idx: self.col_idx.as_ptr(),
            values,
            dtype: T::DTYPE.raw(),
            memory: sys::SPARSEK_HOST,
        })
    }
    pub(crate) fn raw(&self) -> Result<sys::sparsek_bsr> {
        self.raw_with(self.values.as_ptr() as *mut c_void)
    }
    pub(crate) fn raw_mut(&mut self) -> Result<sys::sparsek_bsr> {
        let p = self.values.to_mut().as_mut_ptr() as *mut c_void;
        self.raw_with(p)
    }
}

/// Shape of a dense operand and the slice length it needs (checked before any call, so the
/// library never reads or writes past the slice).
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    ld: usize,
    layout: Layout,
}

impl Shape {
    fn check(self, name: &str, len: usize) -> Result<Shape> {
        let (major, minor) = match self.layout {
            Layout::RowMajor => (self.rows, self.cols),
            Layout::ColMajor => (self.cols, self.rows),
        };
        if self.ld < minor {
            return Err(Error::invalid(format!(
                "{name}: ld={} is below its {} extent {minor}",
                self.ld,
                if self.layout == Layout::RowMajor { "column" } else { "row" }
            )));
        }
        let need = if major == 0 || minor == 0 {
            Some(0)
        } else {
            (major - 1).checked_mul(self.ld).and_then(|x| x.checked_add(minor))
        };
        match need {
            Some(n) if n <= len => Ok(self),
            _ => Err(Error::invalid(format!(
                "{name}: a {}x{} {:?} matrix with ld={} needs {} elements, the slice has {len}",
                self.rows,
                self.cols,
                self.layout,
                self.ld,
                need.map_or("more than usize::MAX".to_string(), |n| n.to_string())
            ))),
        }
    }
    fn raw(self, data: *mut c_void, dtype: sys::sparsek_dtype) -> Result<sys::sparsek_dense> {
        Ok(sys::sparsek_dense {
            data,
            rows: to_i64("rows", self.rows)?,
            cols: to_i64("cols", self.cols)?,
            ld: to_i64("ld", self.ld)?,
            layout: self.layout.raw(),
            dtype,
            memory: sys::SPARSEK_HOST,
        })
    }
}

/// A read-only dense matrix over a host slice.
#[derive(Debug, Clone, Copy)]
pub struct DenseRef<'a, T: Element> {
    data: &'a [T],
    shape: Shape,
}

impl<'a, T: Element> DenseRef<'a, T> {
    /// Row-major `rows x cols`, rows packed (`ld = cols`).
    pub fn new(data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        Self::with_layout(data, rows, cols, Layout::RowMajor, cols.max(1))
    }
    /// Any layout and leading dimension (elements between rows, or columns for column-major).
    pub fn with_layout(data: &'a [T], rows: usize, cols: usize, layout: Layout, ld: usize) -> Result<Self> {
        let shape = Shape { rows, cols, ld, layout }.check("dense", data.len())?;
        Ok(DenseRef { data, shape })
    }
    pub fn rows(&self) -> usize {
        self.shape.rows
    }
    pub fn cols(&self) -> usize {
        self.shape.cols
    }
    pub(crate) fn raw(&self) -> Result<sys::sparsek_dense> {
        self.shape.raw(self.data.as_ptr() as *mut c_void, T::DTYPE.raw())
    }
}

/// A writable dense matrix over a host slice (the output of DSD and DDS).
#[derive(Debug)]
pub struct DenseMut<'a, T: Element> {
    data: &'a mut [T],
    shape: Shape,
}

impl<'a, T: Element> DenseMut<'a, T> {
    /// Row-major `rows x cols`, rows packed (`ld = cols`).
    pub fn new(data: &'a mut [T], rows: usize, cols: usize) -> Result<Self> {
        Self::with_layout(data, rows, cols, Layout::RowMajor, cols.max(1))
    }
    /// Any layout and leading dimension.
    pub fn with_layout(data: &'a mut [T], rows: usize, cols: usize, layout: Layout, ld: usize) -> Result<Self> {
        let shape = Shape { rows, cols, ld, layout }.check("dense", data.len())?;
        Ok(DenseMut { data, shape })
    }
    pub fn rows(&self) -> usize {
        self.shape.rows
    }
    pub fn cols(&self) -> usize {
        self.shape.cols
    }
    pub fn data(&self) -> &[T] {
        self.data
    }
    pub(crate) fn raw(&mut self) -> Result<sys::sparsek_dense> {
        self.shape.raw(self.data.as_mut_ptr() as *mut c_void, T::DTYPE.raw())
    }
    pub(crate) fn raw_const(&self) -> Result<sys::sparsek_dense> {
        self.shape.raw(self.data.as_ptr() as *mut c_void, T::DTYPE.raw())
    }
}
