//! Block-sparse attention on host tensors (the CPU backend): the forward and its backward, with a
//! FlexAttention-style block layout, GQA, causal masking and packed sequences.
//!
//! `O = softmax(scale * Q K^T restricted to the layout's blocks) V`, LSE = the natural log of each
//! row's softmax sum. Query head h reads key/value head `h / (Hq / Hkv)`; with `causal`, key j >
//! query i is masked inside the `kv_indices` blocks (the full lists' blocks are never masked); a row
//! that attends no key gets O = 0 and LSE = -inf.
//! Device memory goes through [`sys::sparsek_attention`](crate::sys::sparsek_attention) and its
//! plans directly.
//!
//! ```no_run
//! use sparsek::{attention, AttentionOptions, BlockLayout, Tensor4, Tensor4Mut};
//! # fn main() -> sparsek::Result<()> {
//! // B = 1, 2 heads, 128 tokens, D = 64, blocks of 64: query block i attends key blocks 0..=i.
//! let (q, k, v) = (vec![0.1f32; 2 * 128 * 64], vec![0.2f32; 2 * 128 * 64], vec![1.0f32; 2 * 128 * 64]);
//! let num = [1, 2];             // [batch 1, heads 1 (shared), q_blocks 2]
//! let idx = [0, -1, 0, 1];      // [.., kmax 2]
//! let layout = BlockLayout::new(&num, &idx, 1, 1, 2, 2, 64)?;
//! let mut o = vec![0f32; q.len()];
//! let mut lse = vec![0f32; 2 * 128];
//! attention(
//!     &Tensor4::new(&q, [1, 2, 128, 64])?,
//!     &Tensor4::new(&k, [1, 2, 128, 64])?,
//!     &Tensor4::new(&v, [1, 2, 128, 64])?,
//!     &mut Tensor4Mut::new(&mut o, [1, 2, 128, 64])?,
//!     Some(&mut lse),
//!     &layout,
//!     &AttentionOptions { causal: true, ..Default::default() },
//! )?;
//! assert_eq!(o[0], 1.0); // every value row is 1
//! # Ok(()) }
//! ```
use std::ffi::c_void;
use std::ptr;

use sparsek_sys as sys;

use crate::error::{check, Error, Result};
use crate::types::Element;

pub(crate) fn to_i64(what: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(format!("{what}={v} does not fit in int64")))
}

/// The product of extents, or an error naming `what` when it overflows (a wrapped product would let
/// a short slice pass a length check).
pub(crate) fn product(what: &str, extents: &[usize]) -> Result<usize> {
    extents
        .iter()
        .try_fold(1usize, |acc, &x| acc.checked_mul(x))
        .ok_or_else(|| Error::invalid(format!("{what} {extents:?} has more elements than a usize holds")))
}

/// `n` zeros, or an error naming `what` when the allocation fails (an output sized from shapes the
/// library has not checked yet must not abort the process).
pub(crate) fn zeros<T: Clone + Default>(what: &str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::invalid(format!("{what} needs {n} elements, more than this process can allocate")))?;
    v.resize(n, T::default());
    Ok(v)
}

/// Shape and strides of a `[b, h, s, d]` tensor (strides in elements, d contiguous).
#[derive(Debug, Clone, Copy)]
struct Dims {
    shape: [usize; 4],
    strides: [usize; 3],
}

/// Checks that the last element of a tensor (`extents` of the outer dimensions with their
/// `strides`, then `d` contiguous elements) lies inside a slice of `len` elements.
pub(crate) fn fits(name: &str, extents: &[usize], strides: &[usize], d: usize, len: usize) -> Result<()> {
    if extents.contains(&0) || d == 0 {
        return Ok(()); // the library names the empty extent
    }
    let last = extents
        .iter()
        .zip(strides)
        .try_fold(d, |acc, (&n, &st)| (n - 1).checked_mul(st).and_then(|x| x.checked_add(acc)));
    match last {
        Some(n) if n <= len => Ok(()),
        _ => Err(Error::invalid(format!("{name} {extents:?} x {d} with strides {strides:?} needs more than its {len} elements"))),
    }
}

impl Dims {
    /// Checks that every element lies inside a slice of `len` elements.
    fn check(shape: [usize; 4], strides: [usize; 3], name: &str, len: usize) -> Result<Dims> {
        fits(name, &shape[..3], &strides, shape[3], len)?;
        Ok(Dims { shape, strides })
    }
    fn raw(&self, data: *mut c_void, dtype: sys::sparsek_dtype) -> Result<sys::sparsek_tensor4> {
        let [b, h, s, d] = self.shape;
        Ok(sys::sparsek_tensor4 {
            data,
            dtype,
            memory: sys::SPARSEK_HOST,
            b: to_i64("b", b)?,
            h: to_i64("h", h)?,
            s: to_i64("s", s)?,
            d: to_i64("d", d)?,
            stride_b: to_i64("stride_b", self.strides[0])?,
            stride_h: to_i64("stride_h", self.strides[1])?,
            stride_s: to_i64("stride_s", self.strides[2])?,
        })
    }
}

fn packed_strides([_, h, s, d]: [usize; 4]) -> Result<[usize; 3]> {
    Ok([product("a batch row", &[h, s, d])?, s * d, d])
}

/// A read-only `[b, h, s, d]` tensor over a host slice.
#[derive(Debug, Clone, Copy)]
pub struct Tensor4<'a, T: Element> {
    data: &'a [T],
    dims: Dims,
}

impl<'a, T: Element> Tensor4<'a, T> {
    /// Packed: `[b, h, s, d]` row-major.
    pub fn new(data: &'a [T], shape: [usize; 4]) -> Result<Self> {
        Self::with_strides(data, shape, packed_strides(shape)?)
    }
    /// Any strides for b, h and s, in elements (d is contiguous): `[s*h*d, d, h*d]` views a
    /// `[b, s, h, d]` array.
    pub fn with_strides(data: &'a [T], shape: [usize; 4], strides: [usize; 3]) -> Result<Self> {
        Ok(Tensor4 { data, dims: Dims::check(shape, strides, "tensor", data.len())? })
    }
    pub fn shape(&self) -> [usize; 4] {
        self.dims.shape
    }
    pub(crate) fn raw(&self) -> Result<sys::sparsek_tensor4> {
        self.dims.raw(self.data.as_ptr() as *mut c_void, T::DTYPE.raw())
    }
}

/// A writable `[b, h, s, d]` tensor over a host slice (an output).
#[derive(Debug)]
pub struct Tensor4Mut<'a, T: Element> {
    data: &'a mut [T],
    dims: Dims,
}

impl<'a, T: Element> Tensor4Mut<'a, T> {
    /// Packed: `[b, h, s, d]` row-major.
    pub fn new(data: &'a mut [T], shape: [usize; 4]) -> Result<Self> {
        Self::with_strides(data, shape, packed_strides(shape)?)
    }
    /// Any strides for b, h and s, in elements (d is contiguous).
    pub fn with_strides(data: &'a mut [T], shape: [usize; 4], strides: [usize; 3]) -> Result<Self> {
        let dims = Dims::check(shape, strides, "tensor", data.len())?;
        Ok(Tensor4Mut { data, dims })
    }
    pub fn shape(&self) -> [usize; 4] {
        self.dims.shape
    }
    pub fn data(&self) -> &[T] {
        self.data
    }
    fn raw(&mut self) -> Result<sys::sparsek_tensor4> {
        self.dims.raw(self.data.as_mut_ptr() as *mut c_void, T::DTYPE.raw())
    }
}

/// Which key blocks each query block attends (FlexAttention's BlockMask), int32 lists:
/// `kv_num_blocks [batch, heads, q_blocks]` and `kv_indices [batch, heads, q_blocks, kmax]`,
/// row-major; `batch` is 1 or B and `heads` 1, Hq or Hkv (a layout shared over them).
/// [`with_full`](Self::with_full) adds FlexAttention's full lists (blocks that need no mask).
#[derive(Debug, Clone, Copy)]
pub struct BlockLayout<'a> {
    kv_num_blocks: &'a [i32],
    kv_indices: &'a [i32],
    full: Option<(&'a [i32], &'a [i32], usize)>,
    batch: usize,
    heads: usize,
    q_blocks: usize,
    kmax: usize,
    block: usize,
}

impl<'a> BlockLayout<'a> {
    /// `block`: the block size of queries and keys (64 or 128: the library checks it).
    pub fn new(
        kv_num_blocks: &'a [i32],
        kv_indices: &'a [i32],
        batch: usize,
        heads: usize,
        q_blocks: usize,
        kmax: usize,
        block: usize,
    ) -> Result<Self> {
        let rows = product("kv_num_blocks", &[batch, heads, q_blocks])?;
        let entries = product("kv_indices", &[rows, kmax])?;
        if kv_num_blocks.len() < rows {
            return Err(Error::invalid(format!(
                "kv_num_blocks has {} entries but [{batch}, {heads}, {q_blocks}] needs {rows}",
                kv_num_blocks.len()
            )));
        }
        if kv_indices.len() < entries {
            return Err(Error::invalid(format!(
                "kv_indices has {} entries but [{batch}, {heads}, {q_blocks}, {kmax}] needs {entries}",
                kv_indices.len()
            )));
        }
        Ok(BlockLayout { kv_num_blocks, kv_indices, full: None, batch, heads, q_blocks, kmax, block })
    }
    /// The same layout with full lists `[batch, heads, q_blocks]` and `[.., full_kmax]`.
    pub fn with_full(mut self, full_kv_num_blocks: &'a [i32], full_kv_indices: &'a [i32], full_kmax: usize) -> Result<Self> {
        let rows = self.batch * self.heads * self.q_blocks; // checked in new()
        let entries = product("full_kv_indices", &[rows, full_kmax])?;
        if full_kv_num_blocks.len() < rows || full_kv_indices.len() < entries {
            return Err(Error::invalid(format!(
                "full lists have {} and {} entries but [{}, {}, {}] with full_kmax {full_kmax} needs {rows} and {}",
                full_kv_num_blocks.len(),
                full_kv_indices.len(),
                self.batch,
                self.heads,
                self.q_blocks,
                entries
            )));
        }
        self.full = Some((full_kv_num_blocks, full_kv_indices, full_kmax));
        Ok(self)
    }
    pub(crate) fn raw(&self) -> Result<sys::sparsek_attention_layout> {
        let block = i32::try_from(self.block).map_err(|_| Error::invalid(format!("block={} does not fit in int32", self.block)))?;
        let (full_num, full_idx, full_kmax) = match self.full {
            Some((n, i, k)) => (n.as_ptr(), i.as_ptr(), k),
            None => (ptr::null(), ptr::null(), 0),
        };
        Ok(sys::sparsek_attention_layout {
            kv_num_blocks: self.kv_num_blocks.as_ptr(),
            kv_indices: self.kv_indices.as_ptr(),
            full_kv_num_blocks: full_num,
            full_kv_indices: full_idx,
            batch: to_i64("batch", self.batch)?,
            heads: to_i64("heads", self.heads)?,
            q_blocks: to_i64("q_blocks", self.q_blocks)?,
            kmax: to_i64("kmax", self.kmax)?,
            full_kmax: to_i64("full_kmax", full_kmax)?,
            block_q: block,
            block_kv: block,
            memory: sys::SPARSEK_HOST,
        })
    }
}

/// Masking and scale of an attention call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionOptions<'a> {
    /// Key j > query i is masked inside the `kv_indices` blocks, not the full lists' (within each
    /// sequence when packed).
    pub causal: bool,
    /// The softmax scale; `None` (or `Some(0.0)`, as in the C API): 1 / sqrt(D).
    pub scale: Option<f32>,
    /// Packed sequences (varlen): `[num_seqs + 1]` offsets `0 = c[0] <= ... <= c[num_seqs] = T`;
    /// q, k and v are then one packed batch row (b = 1, Sq = Skv = T), sequence i at rows
    /// `c[i] .. c[i + 1]`, and a query attends only keys of its own sequence. The layout is over
    /// the packed rows' blocks.
    pub cu_seqlens: Option<&'a [i32]>,
}

/// The C API's (cu_seqlens, num_seqs) for packed sequences: null and 0 when not packed.
pub(crate) fn packed_sequences(cu_seqlens: Option<&[i32]>) -> Result<(*const i32, i64)> {
    match cu_seqlens {
        Some([]) => Err(Error::invalid("cu_seqlens is empty: it holds num_seqs + 1 >= 2 offsets")),
        Some(c) => Ok((c.as_ptr(), to_i64("num_seqs", c.len() - 1)?)),
        None => Ok((ptr::null(), 0)),
    }
}

fn forward_args<T: Element>(
    q: &Tensor4<T>,
    k: &Tensor4<T>,
    v: &Tensor4<T>,
    o: sys::sparsek_tensor4,
    lse: *mut f32,
    layout: &BlockLayout,
    opts: &AttentionOptions,
) -> Result<sys::sparsek_attention_args> {
    let (cu, num_seqs) = packed_sequences(opts.cu_seqlens)?;
    Ok(sys::sparsek_attention_args {
        q: q.raw()?,
        k: k.raw()?,
        v: v.raw()?,
        o,
        lse,
        layout: layout.raw()?,
        causal: i32::from(opts.causal),
        scale: opts.scale.unwrap_or(0.0),
        cu_seqlens: cu,
        num_seqs,
    })
}

/// The rows of LSE a problem writes: `[B, Hq, Sq]`.
fn lse_len(q: &Tensor4<impl Element>) -> usize {
    let [b, h, s, _] = q.shape();
    b.saturating_mul(h).saturating_mul(s) // saturated: no slice is that long, the check fails
}

/// The forward: O (and LSE `[B, Hq, Sq]`, f32, where given) from q `[B, Hq, Sq, D]`, k and v
/// `[B, Hkv, Skv, D]` (one element type: f32, [`F16`](crate::F16) or [`Bf16`](crate::Bf16); D 64 or
/// 128) and the layout. Everything is checked, the layout's contents too; the library's error names
/// the argument and the value.
pub fn attention<T: Element>(
    q: &Tensor4<T>,
    k: &Tensor4<T>,
    v: &Tensor4<T>,
    o: &mut Tensor4Mut<T>,
    lse: Option<&mut [f32]>,
    layout: &BlockLayout,
    opts: &AttentionOptions,
) -> Result<()> {
    let lse_ptr = match lse {
        Some(l) if l.len() < lse_len(q) => {
            return Err(Error::invalid(format!("lse has {} entries but [B, Hq, Sq] needs {}", l.len(), lse_len(q))))
        }
        Some(l) => l.as_mut_ptr(),
        None => ptr::null_mut(),
    };
    let args = forward_args(q, k, v, o.raw()?, lse_ptr, layout, opts)?;
    // SAFETY: every pointer comes from a live slice whose length was checked against its shape
    // (the layout's and LSE's too); o and lse are borrowed mutably for the call.
    check(unsafe { sys::sparsek_attention(&args, ptr::null_mut()) })
}

/// The forward's outputs and the upstream gradient, the backward's inputs.
#[derive(Debug, Clone, Copy)]
pub struct ForwardOutputs<'a, T: Element> {
    /// O as the forward wrote it.
    pub o: &'a Tensor4<'a, T>,
    /// LSE `[B, Hq, Sq]` as the forward wrote it.
    pub lse: &'a [f32],
    /// dL/dO, like q.
    pub dout: &'a Tensor4<'a, T>,
}

/// The backward: dq (like q), dk and dv (like k) from the forward's inputs, its outputs and dL/dO.
/// Repeated runs give the same bits.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Element>(
    q: &Tensor4<T>,
    k: &Tensor4<T>,
    v: &Tensor4<T>,
    fwd: ForwardOutputs<T>,
    dq: &mut Tensor4Mut<T>,
    dk: &mut Tensor4Mut<T>,
    dv: &mut Tensor4Mut<T>,
    layout: &BlockLayout,
    opts: &AttentionOptions,
) -> Result<()> {
    if fwd.lse.len() < lse_len(q) {
        return Err(Error::invalid(format!("lse has {} entries but [B, Hq, Sq] needs {}", fwd.lse.len(), lse_len(q))));
    }
    let forward = forward_args(q, k, v, fwd.o.raw()?, fwd.lse.as_ptr() as *mut f32, layout, opts)?;
    let args = sys::sparsek_attention_backward_args {
        forward,
        dout: fwd.dout.raw()?,
        dq: dq.raw()?,
        dk: dk.raw()?,
        dv: dv.raw()?,
        nondeterministic: 0,
    };
    // SAFETY: as in attention(); the forward's o and lse are only read.
    check(unsafe { sys::sparsek_attention_backward(&args, ptr::null_mut()) })
}

impl<'a, T: Element> Tensor4Mut<'a, T> {
    /// A read-only view of the same tensor (a forward's O as the backward's input).
    pub fn view(&self) -> Tensor4<'_, T> {
        Tensor4 { data: self.data, dims: self.dims }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_past_the_slice_are_refused() {
        let x = [0f32; 64];
        assert!(Tensor4::new(&x, [1, 1, 1, 64]).is_ok());
        let e = Tensor4::new(&x, [1, 1, 2, 64]).unwrap_err();
        assert!(e.message().contains("needs more than its 64 elements"), "{}", e.message());
        let e = Tensor4::with_strides(&x, [1, 2, 1, 32], [64, 40, 32]).unwrap_err();
        assert!(e.message().contains("strides [64, 40, 32]"), "{}", e.message());
    }

    #[test]
    fn extents_whose_product_overflows_are_refused() {
        let x = [0f32; 64];
        let e = Tensor4::new(&x, [1, usize::MAX / 2, 4, 64]).unwrap_err();
        assert!(e.message().contains("more elements than a usize holds"), "{}", e.message());
        // 2^62 x 4 wraps to 0: only the overflow check can refuse it.
        let e = BlockLayout::new(&[0; 4], &[0; 4], 1 << 62, 4, 1, 1, 64).unwrap_err();
        assert!(e.message().contains("kv_num_blocks [4611686018427387904, 4, 1] has more elements than a usize holds"), "{}", e.message());
    }
}
