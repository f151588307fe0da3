//! Host operands: a BSR matrix that owns or borrows its arrays, and dense views over slices.
use std::borrow::Cow;
use std::os::raw::c_void;

use sparsek_sys as sys;

use crate::error::{check, Error, Result};
use crate::types::{DType, E4m3, Element, Layout, ScaleDim};

fn to_i64(what: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(format!("{what}={v} does not fit in int64")))
}

/// A block-sparse (BSR) matrix in host memory: `row_ptr[rows/bm + 1]`, `col_idx[nnzb]` (sorted
/// and unique within a block row) and `values[nnzb][bm][bk]` (each block row-major). Each array
/// is owned (`Vec`) or borrowed (`&[_]`); writing the values of a borrowed matrix (as the output of
/// [`sdd`](crate::sdd)) copies them first, as `Cow` does.
///
/// An [`E4m3`] matrix also holds `scales[nnzb]`, one fp32 scale per stored block (element =
/// scale * code value): build it with [`with_scales`](Self::with_scales) or [`quantize`](Self::quantize).
#[derive(Debug, Clone)]
pub struct BsrMatrix<'a, T: Element> {
    rows: usize,
    cols: usize,
    bm: usize,
    bk: usize,
    row_ptr: Cow<'a, [i32]>,
    col_idx: Cow<'a, [i32]>,
    values: Cow<'a, [T]>,
    scales: Cow<'a, [f32]>, // e4m3 only: [nnzb]
}

impl<'a, T: Element> BsrMatrix<'a, T> {
    /// A `rows x cols` matrix of `(bm, bk)` blocks. Checks the lengths of the arrays here and the
    /// rest (block shape, divisibility, `row_ptr` and `col_idx` contents) in the library; the error
    /// names the array, the first offending index and its value. (An [`E4m3`] matrix needs its
    /// scales: [`with_scales`](Self::with_scales).)
    pub fn new(
        rows: usize,
        cols: usize,
        block: (usize, usize),
        row_ptr: impl Into<Cow<'a, [i32]>>,
        col_idx: impl Into<Cow<'a, [i32]>>,
        values: impl Into<Cow<'a, [T]>>,
    ) -> Result<Self> {
        BsrMatrix::with_scales(rows, cols, block, row_ptr, col_idx, values, Vec::new())
    }

    /// An [`E4m3`] matrix from its parts: as [`new`](Self::new), plus `scales[nnzb]` (one per stored
    /// block, finite and >= 0). Other element types carry no scales (empty; the library refuses
    /// any).
    pub fn with_scales(
        rows: usize,
        cols: usize,
        block: (usize, usize),
        row_ptr: impl Into<Cow<'a, [i32]>>,
        col_idx: impl Into<Cow<'a, [i32]>>,
        values: impl Into<Cow<'a, [T]>>,
        scales: impl Into<Cow<'a, [f32]>>,
    ) -> Result<Self> {
        let (bm, bk) = block;
        if bm == 0 || bk == 0 {
            return Err(Error::invalid(format!("block ({bm}, {bk}): bm and bk must be one of 16, 32, 64, 128")));
        }
        let m = BsrMatrix {
            rows,
            cols,
            bm,
            bk,
            row_ptr: row_ptr.into(),
            col_idx: col_idx.into(),
            values: values.into(),
            scales: scales.into(),
        };
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
        if !m.scales.is_empty() && m.scales.len() != m.nnzb() {
            return Err(Error::invalid(format!(
                "scales has {} entries but the matrix stores nnzb={} blocks (one scale each)",
                m.scales.len(),
                m.nnzb()
            )));
        }
        m.validate()?;
        Ok(m)
    }

    /// All of the library's checks (pattern, and for e4m3 the scales: finite and >= 0).
    fn validate(&self) -> Result<()> {
        let raw = self.raw()?;
        // SAFETY: the lengths were checked against what the descriptor says; validate only reads.
        check(unsafe { sys::sparsek_bsr_validate(&raw) })
    }

    /// The e4m3 matrix of this one (f32, F16 or Bf16 values): per stored block, scale = amax / 448
    /// and the values' codes under it (nearest even, saturating; a zero block gets scale 0). The
    /// values must be finite (else an error naming the element).
    pub fn quantize(&self) -> Result<BsrMatrix<'static, E4m3>> {
        let mut values = vec![E4m3::default(); self.values.len()];
        let mut scales = vec![0f32; self.nnzb()];
        let raw = self.raw()?;
        // SAFETY: values and scales have nnzb*bm*bk and nnzb entries, as the function writes.
        check(unsafe {
            sys::sparsek_quantize_bsr_e4m3(&raw, values.as_mut_ptr() as *mut c_void, scales.as_mut_ptr(), std::ptr::null_mut())
        })?;
        BsrMatrix::with_scales(
            self.rows,
            self.cols,
            (self.bm, self.bk),
            self.row_ptr.to_vec(),
            self.col_idx.to_vec(),
            values,
            scales,
        )
    }

    /// The matrix of an e4m3 one in `U` (f32, F16 or Bf16): scale * code value, rounded to `U`.
    pub fn dequantize<U: Element>(&self) -> Result<BsrMatrix<'static, U>> {
        let mut values = vec![U::default(); self.values.len()];
        let raw = self.raw()?;
        // SAFETY: values has nnzb*bm*bk entries of U, as the function writes.
        check(unsafe {
            sys::sparsek_dequantize_bsr(&raw, values.as_mut_ptr() as *mut c_void, U::DTYPE.raw(), std::ptr::null_mut())
        })?;
        BsrMatrix::new(self.rows, self.cols, (self.bm, self.bk), self.row_ptr.to_vec(), self.col_idx.to_vec(), values)
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
    /// The block scales of an e4m3 matrix (`[nnzb]`; empty for other element types).
    pub fn scales(&self) -> &[f32] {
        &self.scales
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
            scales: Cow::Owned(self.scales.into_owned()),
        }
    }
    /// The matrix as row-major `rows x cols` f32 (absent blocks are zeros; e4m3: scale * value).
    #[must_use]
    pub fn to_dense(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        let block = self.bm * self.bk;
        for br in 0..self.row_ptr.len().saturating_sub(1) {
            for j in self.row_ptr[br] as usize..self.row_ptr[br + 1] as usize {
                let bc = self.col_idx[j] as usize;
                let scale = self.scales.get(j).copied().unwrap_or(1.0);
                for r in 0..self.bm {
                    for c in 0..self.bk {
                        let v = self.values[j * block + r * self.bk + c].to_f32();
                        out[(br * self.bm + r) * self.cols + bc * self.bk + c] =
                            if self.scales.is_empty() { v } else { scale * v };
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
            scales: if self.scales.is_empty() { std::ptr::null() } else { self.scales.as_ptr() },
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
            scales: std::ptr::null(),
            scale_group: 0,
        })
    }
}

/// How many scales `tokens` tokens with reduction length `k` have for `scale_group` (0 or 128).
pub fn scale_count(tokens: usize, k: usize, scale_group: i32) -> Result<usize> {
    let mut n = 0i64;
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::sparsek_scale_count(to_i64("tokens", tokens)?, to_i64("k", k)?, scale_group, &mut n) })?;
    Ok(n as usize)
}

/// A read-only dense matrix over a host slice. An [`E4m3`] input carries its scales
/// ([`with_scales`](Self::with_scales)).
#[derive(Debug, Clone, Copy)]
pub struct DenseRef<'a, T: Element> {
    data: &'a [T],
    shape: Shape,
    scales: &'a [f32],
    scale_group: i32,
}

impl<'a, T: Element> DenseRef<'a, T> {
    /// Row-major `rows x cols`, rows packed (`ld = cols`).
    pub fn new(data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        Self::with_layout(data, rows, cols, Layout::RowMajor, cols.max(1))
    }
    /// Any layout and leading dimension (elements between rows, or columns for column-major).
    pub fn with_layout(data: &'a [T], rows: usize, cols: usize, layout: Layout, ld: usize) -> Result<Self> {
        let shape = Shape { rows, cols, ld, layout }.check("dense", data.len())?;
        Ok(DenseRef { data, shape, scales: &[], scale_group: 0 })
    }
    /// The same matrix with e4m3 scales, one per token (per row of a DDS's A, per column of a
    /// DSD's B): `[tokens]` for `scale_group` 0, `[tokens][ceil(K / 128)]` for 128. The products
    /// check the length against the operand's role.
    #[must_use]
    pub fn with_scales(mut self, scales: &'a [f32], scale_group: i32) -> Self {
        self.scales = scales;
        self.scale_group = scale_group;
        self
    }
    pub fn rows(&self) -> usize {
        self.shape.rows
    }
    pub fn cols(&self) -> usize {
        self.shape.cols
    }
    pub fn scales(&self) -> &[f32] {
        self.scales
    }
    pub(crate) fn raw(&self) -> Result<sys::sparsek_dense> {
        let mut d = self.shape.raw(self.data.as_ptr() as *mut c_void, T::DTYPE.raw())?;
        d.scales = if self.scales.is_empty() { std::ptr::null() } else { self.scales.as_ptr() };
        d.scale_group = self.scale_group;
        Ok(d)
    }
    /// raw() for a product's dense input named `name`, whose tokens are its rows (a DDS's A) or
    /// its columns (a DSD's B): given scales must be as many as the library will read.
    pub(crate) fn raw_input(&self, name: &str, tokens_are_rows: bool) -> Result<sys::sparsek_dense> {
        if !self.scales.is_empty() {
            let (tokens, k) = if tokens_are_rows { (self.shape.rows, self.shape.cols) } else { (self.shape.cols, self.shape.rows) };
            let need = scale_count(tokens, k, self.scale_group)?;
            if self.scales.len() < need {
                return Err(Error::invalid(format!(
                    "{name} scales has {} entries but {name} ({}x{}, scale_group {}) needs {need}",
                    self.scales.len(),
                    self.shape.rows,
                    self.shape.cols,
                    self.scale_group
                )));
            }
        }
        self.raw()
    }
}

/// Quantizes a dense matrix (f32, F16 or Bf16) to e4m3: returns the codes (row-major, the same
/// `rows x cols`) and the scales, one per token along `dim` (per 128-wide group of K too for
/// `scale_group` 128): scale = amax / 448, nearest even, saturating. Values must be finite.
pub fn quantize_dense<T: Element>(x: &DenseRef<T>, dim: ScaleDim, scale_group: i32) -> Result<(Vec<E4m3>, Vec<f32>)> {
    let (rows, cols) = (x.rows(), x.cols());
    let (tokens, k) = if dim == ScaleDim::Rows { (rows, cols) } else { (cols, rows) };
    let mut scales = vec![0f32; scale_count(tokens, k, scale_group)?];
    let mut codes = vec![E4m3::default(); rows * cols];
    let input = x.raw()?;
    let mut out = Shape { rows, cols, ld: cols.max(1), layout: Layout::RowMajor }
        .check("codes", codes.len())?
        .raw(codes.as_mut_ptr() as *mut c_void, DType::E4m3.raw())?;
    // SAFETY: the output descriptor covers `codes`, scales holds the scale count.
    check(unsafe {
        sys::sparsek_quantize_dense_e4m3(&input, &mut out, scales.as_mut_ptr(), dim.raw(), scale_group, std::ptr::null_mut())
    })?;
    Ok((codes, scales))
}

/// The values of an e4m3 matrix with its scales (`q.with_scales`), row-major in `U`.
pub fn dequantize_dense<U: Element>(q: &DenseRef<E4m3>, dim: ScaleDim) -> Result<Vec<U>> {
    let (rows, cols) = (q.rows(), q.cols());
    let mut values = vec![U::default(); rows * cols];
    let input = q.raw_input("q", dim == ScaleDim::Rows)?;
    let out = Shape { rows, cols, ld: cols.max(1), layout: Layout::RowMajor }
        .check("values", values.len())?
        .raw(values.as_mut_ptr() as *mut c_void, U::DTYPE.raw())?;
    // SAFETY: the output descriptor covers `values`; the input's scales were length-checked.
    check(unsafe { sys::sparsek_dequantize_dense(&input, &out, dim.raw(), std::ptr::null_mut()) })?;
    Ok(values)
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
