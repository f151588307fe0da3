//! Decode attention over a paged KV cache, and the page selection that chooses which pages each
//! key/value head reads, on host tensors (the CPU backend).
//!
//! A batch of requests, each with 1..16 new tokens (the last of its `seq_lens[b]` tokens), packed
//! in q `[T, Hq, D]` by `cu_seqlens_q`; the cache `[num_pages, page_size, Hkv, D]` in physical
//! pages, request b's logical page p at `page_table[b * max_pages + p]`. New token j of n sees the
//! positions up to its own (`causal_new`, the default) or all of them; with a selection, only its
//! key/value head's selected pages. A row that sees no key gets O = 0 and LSE = -inf. Device memory
//! goes through `sys::sparsek_decode_*` / `sys::sparsek_select_pages` directly.
use std::ffi::c_void;
use std::ptr;

use sparsek_sys as sys;

use crate::attention::{fits, product, to_i64, zeros};
use crate::error::{check, Error, Result};
use crate::types::Element;

/// A read-only `[t, h, d]` tensor of tokens over a host slice.
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a, T: Element> {
    data: &'a [T],
    shape: [usize; 3],
    strides: [usize; 2],
}

impl<'a, T: Element> Tokens<'a, T> {
    /// Packed `[t, h, d]`.
    pub fn new(data: &'a [T], shape: [usize; 3]) -> Result<Self> {
        Self::with_strides(data, shape, [product("a token", &shape[1..])?, shape[2]])
    }
    /// Strides of t and h in elements (d contiguous).
    pub fn with_strides(data: &'a [T], shape: [usize; 3], strides: [usize; 2]) -> Result<Self> {
        fits("tokens", &shape[..2], &strides, shape[2], data.len())?;
        Ok(Tokens { data, shape, strides })
    }
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }
    fn raw(&self) -> Result<sys::sparsek_tokens> {
        raw_tokens(self.data.as_ptr() as *mut c_void, T::DTYPE.raw(), self.shape, self.strides)
    }
}

fn raw_tokens(data: *mut c_void, dtype: sys::sparsek_dtype, shape: [usize; 3], strides: [usize; 2]) -> Result<sys::sparsek_tokens> {
    Ok(sys::sparsek_tokens {
        data,
        dtype,
        memory: sys::SPARSEK_HOST,
        t: to_i64("t", shape[0])?,
        h: to_i64("h", shape[1])?,
        d: to_i64("d", shape[2])?,
        stride_t: to_i64("stride_t", strides[0])?,
        stride_h: to_i64("stride_h", strides[1])?,
    })
}

/// A writable `[t, h, d]` tensor of tokens (decode's output).
#[derive(Debug)]
pub struct TokensMut<'a, T: Element> {
    data: &'a mut [T],
    shape: [usize; 3],
    strides: [usize; 2],
}

impl<'a, T: Element> TokensMut<'a, T> {
    /// Packed `[t, h, d]`.
    pub fn new(data: &'a mut [T], shape: [usize; 3]) -> Result<Self> {
        let strides = [product("a token", &shape[1..])?, shape[2]];
        Self::with_strides(data, shape, strides)
    }
    /// Strides of t and h in elements (d contiguous).
    pub fn with_strides(data: &'a mut [T], shape: [usize; 3], strides: [usize; 2]) -> Result<Self> {
        fits("tokens", &shape[..2], &strides, shape[2], data.len())?;
        Ok(TokensMut { data, shape, strides })
    }
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }
    pub fn data(&self) -> &[T] {
        self.data
    }
    fn raw(&mut self) -> Result<sys::sparsek_tokens> {
        raw_tokens(self.data.as_mut_ptr() as *mut c_void, T::DTYPE.raw(), self.shape, self.strides)
    }
}

/// A paged cache `[num_pages, page_size, h, d]` over a host slice.
#[derive(Debug, Clone, Copy)]
pub struct PagedCache<'a, T: Element> {
    data: &'a [T],
    shape: [usize; 4],
    strides: [usize; 3],
}

impl<'a, T: Element> PagedCache<'a, T> {
    /// Packed `[num_pages, page_size, h, d]`; page_size a multiple of 16 in [16, 128].
    pub fn new(data: &'a [T], shape: [usize; 4]) -> Result<Self> {
        let [_, ps, h, d] = shape;
        Self::with_strides(data, shape, [product("a page", &[ps, h, d])?, h * d, d])
    }
    /// Strides of the page, the slot and h in elements (d contiguous).
    pub fn with_strides(data: &'a [T], shape: [usize; 4], strides: [usize; 3]) -> Result<Self> {
        fits("cache", &shape[..3], &strides, shape[3], data.len())?;
        Ok(PagedCache { data, shape, strides })
    }
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }
    /// The length of its page summaries, `num_pages * h * 2 * d` ([`update_page_summaries`]).
    pub fn summaries_len(&self) -> usize {
        let [pages, _, h, d] = self.shape;
        // Saturated on overflow: no slice is that long, so the summaries' length check fails.
        pages.saturating_mul(h).saturating_mul(2).saturating_mul(d)
    }
    fn raw(&self) -> Result<sys::sparsek_paged_cache> {
        let [pages, ps, h, d] = self.shape;
        Ok(sys::sparsek_paged_cache {
            data: self.data.as_ptr() as *mut c_void,
            dtype: T::DTYPE.raw(),
            memory: sys::SPARSEK_HOST,
            pages: to_i64("pages", pages)?,
            page_size: to_i64("page_size", ps)?,
            h: to_i64("h", h)?,
            d: to_i64("d", d)?,
            stride_page: to_i64("stride_page", self.strides[0])?,
            stride_slot: to_i64("stride_slot", self.strides[1])?,
            stride_h: to_i64("stride_h", self.strides[2])?,
        })
    }
}

/// The batch of requests: `page_table [batch, max_pages]`, `seq_lens [batch]` (the new tokens
/// included) and `cu_seqlens_q [batch + 1]` (request b's new tokens are q's rows
/// `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]`).
#[derive(Debug, Clone, Copy)]
pub struct Requests<'a> {
    page_table: &'a [i32],
    seq_lens: &'a [i32],
    cu_seqlens_q: &'a [i32],
    max_pages: usize,
}

impl<'a> Requests<'a> {
    pub fn new(page_table: &'a [i32], max_pages: usize, seq_lens: &'a [i32], cu_seqlens_q: &'a [i32]) -> Result<Self> {
        let batch = seq_lens.len();
        if cu_seqlens_q.len() != batch + 1 {
            return Err(Error::invalid(format!(
                "cu_seqlens_q has {} entries but {batch} requests (seq_lens) need {}",
                cu_seqlens_q.len(),
                batch + 1
            )));
        }
        let entries = product("page_table", &[batch, max_pages])?;
        if page_table.len() < entries {
            return Err(Error::invalid(format!(
                "page_table has {} entries but [{batch}, {max_pages}] needs {entries}",
                page_table.len()
            )));
        }
        Ok(Requests { page_table, seq_lens, cu_seqlens_q, max_pages })
    }
    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }
}

/// Which logical pages each (request, key/value head) reads: `counts [batch, Hkv]` and ascending
/// `indices [batch, Hkv, kmax]` ([`select_pages`] makes one).
#[derive(Debug, Clone)]
pub struct PageSelection {
    pub indices: Vec<i32>,
    pub counts: Vec<i32>,
    pub kmax: usize,
}

/// What [`select_pages`] keeps per (request, key/value head): pages `0 .. sink`, the `local` newest
/// and the `topk` best others. Default: topk 0, sink 1, local 1 (the newest page, so new tokens
/// see themselves).
#[derive(Debug, Clone, Copy)]
pub struct PageSelectOptions {
    pub topk: usize,
    pub sink: usize,
    pub local: usize,
}

impl Default for PageSelectOptions {
    fn default() -> Self {
        PageSelectOptions { topk: 0, sink: 1, local: 1 }
    }
}

/// Masking and scale of a decode step.
#[derive(Debug, Clone, Copy)]
pub struct DecodeOptions {
    /// New token j of n sees positions up to its own (else all `seq_len` of them).
    pub causal_new: bool,
    /// `None` (or `Some(0.0)`, as in the C API): 1 / sqrt(D).
    pub scale: Option<f32>,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions { causal_new: true, scale: None }
    }
}

/// One decode step: O `[T, Hq, D]` (and LSE `[T, Hq]`, f32, where given) from the step's q, the
/// cache and the requests, reading only `selection`'s pages where one is given. Everything is
/// checked, the index arrays' contents too; the library's error names the argument and the value.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention<T: Element>(
    q: &Tokens<T>,
    k: &PagedCache<T>,
    v: &PagedCache<T>,
    o: &mut TokensMut<T>,
    lse: Option<&mut [f32]>,
    requests: &Requests,
    selection: Option<&PageSelection>,
    opts: &DecodeOptions,
) -> Result<()> {
    let [t, hq, _] = q.shape();
    let hkv = k.shape()[2];
    let lse_rows = t.saturating_mul(hq);
    let lse_ptr = match lse {
        Some(l) if l.len() < lse_rows => return Err(Error::invalid(format!("lse has {} entries but [T, Hq] needs {lse_rows}", l.len()))),
        Some(l) => l.as_mut_ptr(),
        None => ptr::null_mut(),
    };
    let (sel_idx, sel_cnt, sel_kmax) = match selection {
        Some(s) => {
            let rows = product("the selection's counts", &[requests.batch(), hkv])?;
            let entries = product("the selection's indices", &[rows, s.kmax])?;
            if s.counts.len() < rows || s.indices.len() < entries {
                return Err(Error::invalid(format!(
                    "the selection has {} counts and {} indices but [{}, {hkv}] with kmax {} needs {rows} and {}",
                    s.counts.len(),
                    s.indices.len(),
                    requests.batch(),
                    s.kmax,
                    entries
                )));
            }
            (s.indices.as_ptr(), s.counts.as_ptr(), s.kmax)
        }
        None => (ptr::null(), ptr::null(), 0),
    };
    let args = sys::sparsek_decode_args {
        q: q.raw()?,
        k: k.raw()?,
        v: v.raw()?,
        o: o.raw()?,
        lse: lse_ptr,
        page_table: requests.page_table.as_ptr(),
        seq_lens: requests.seq_lens.as_ptr(),
        cu_seqlens_q: requests.cu_seqlens_q.as_ptr(),
        sel_indices: sel_idx,
        sel_counts: sel_cnt,
        batch: to_i64("batch", requests.batch())?,
        max_pages: to_i64("max_pages", requests.max_pages)?,
        sel_kmax: to_i64("kmax", sel_kmax)?,
        index_memory: sys::SPARSEK_HOST,
        causal_new: i32::from(opts.causal_new),
        scale: opts.scale.unwrap_or(0.0),
    };
    // SAFETY: every pointer comes from a live slice whose length was checked against its shape;
    // o and lse are borrowed mutably for the call.
    check(unsafe { sys::sparsek_decode_attention(&args, ptr::null_mut()) })
}

fn page_args<T: Element>(
    q: &Tokens<T>,
    k: &PagedCache<T>,
    summaries: *mut c_void,
    summaries_len: usize,
    requests: &Requests,
) -> Result<sys::sparsek_page_select_args> {
    if summaries_len < k.summaries_len() {
        return Err(Error::invalid(format!(
            "summaries has {summaries_len} elements but [num_pages, Hkv, 2, D] needs {}",
            k.summaries_len()
        )));
    }
    Ok(sys::sparsek_page_select_args {
        q: q.raw()?,
        k: k.raw()?,
        summaries,
        page_table: requests.page_table.as_ptr(),
        seq_lens: requests.seq_lens.as_ptr(),
        cu_seqlens_q: requests.cu_seqlens_q.as_ptr(),
        batch: to_i64("batch", requests.batch())?,
        max_pages: to_i64("max_pages", requests.max_pages)?,
        index_memory: sys::SPARSEK_HOST,
        sel_indices: ptr::null_mut(),
        sel_counts: ptr::null_mut(),
        sel_kmax: 0,
        topk: 0,
        sink: 0,
        local: 0,
        all_pages: 0,
        skip_index_check: 0,
    })
}

/// Recomputes the page summaries (`[num_pages, Hkv, 2, D]`: each page's per-channel minimum, then
/// maximum, of its stored keys) of the pages holding each request's new tokens, or of every stored
/// page with `all_pages` (after a prefill). q gives the step's shape (its values are not read).
pub fn update_page_summaries<T: Element>(
    q: &Tokens<T>,
    k: &PagedCache<T>,
    requests: &Requests,
    all_pages: bool,
    summaries: &mut [T],
) -> Result<()> {
    let mut args = page_args(q, k, summaries.as_mut_ptr() as *mut c_void, summaries.len(), requests)?;
    args.all_pages = i32::from(all_pages);
    // SAFETY: as in decode_attention; the summaries are borrowed mutably and long enough.
    check(unsafe { sys::sparsek_update_page_summaries(&args, ptr::null_mut()) })
}

/// Chooses each (request, key/value head)'s pages from the summaries: pages `0 .. sink`, the
/// `local` newest and the `topk` best others by the bound of Quest (the largest over the group's
/// query vectors of `sum_d q_d * (q_d >= 0 ? max_d : min_d)`; equal scores: the lower page),
/// ascending, `kmax = min(max_pages, topk + sink + local)`. The selection decode_attention takes.
pub fn select_pages<T: Element>(
    q: &Tokens<T>,
    k: &PagedCache<T>,
    requests: &Requests,
    summaries: &[T],
    opts: &PageSelectOptions,
) -> Result<PageSelection> {
    let (topk, sink, local) = (opts.topk, opts.sink, opts.local);
    let kmax = requests.max_pages.min(topk.saturating_add(sink).saturating_add(local));
    let rows = product("sel_counts", &[requests.batch(), k.shape()[2]])?;
    let mut sel = PageSelection {
        indices: zeros("sel_indices", product("sel_indices", &[rows, kmax])?)?,
        counts: zeros("sel_counts", rows)?,
        kmax,
    };
    let mut args = page_args(q, k, summaries.as_ptr() as *mut c_void, summaries.len(), requests)?;
    args.sel_indices = sel.indices.as_mut_ptr();
    args.sel_counts = sel.counts.as_mut_ptr();
    args.sel_kmax = to_i64("kmax", kmax)?;
    args.topk = to_i64("topk", topk)?;
    args.sink = to_i64("sink", sink)?;
    args.local = to_i64("local", local)?;
    // SAFETY: as in decode_attention; the outputs are this function's own vectors of the sizes the
    // library writes, and the summaries are only read.
    check(unsafe { sys::sparsek_select_pages(&args, ptr::null_mut()) })?;
    Ok(sel)
}
