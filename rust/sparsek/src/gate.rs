//! The top-k block gate on host tensors (the CPU backend): a block layout chosen from the content,
//! the layout [`attention`](crate::attention) takes.
//!
//! q `[B, Hq, Sq, D]` and k `[B, Hkv, Skv, D]` are mean-pooled per block (a group's query heads
//! together), scored `scale * pooled_q . pooled_k` per key/value head, and each query block keeps
//! the sink blocks and the `local` blocks up to its own (where allowed) and the `topk` best other
//! allowed blocks (equal scores: the lower block), in ascending order. Allowed: with `causal`, blocks holding a key
//! at or before the block's last query row; with candidates, that layout's blocks; with packed
//! sequences, the blocks of the block's rows' sequences (sinks counted from their first block).
use std::ptr;

use sparsek_sys as sys;

use crate::attention::{packed_sequences, product, to_i64, zeros, BlockLayout, Tensor4};
use crate::error::{check, Error, Result};
use crate::types::Element;

/// What the gate keeps.
#[derive(Debug, Clone, Copy)]
pub struct GateOptions<'a> {
    /// The best other blocks kept per query block.
    pub topk: usize,
    /// Blocks `0 .. sink` (counted from the first block of the block's sequences when packed),
    /// kept where allowed, outside the topk budget. Default 1.
    pub sink: usize,
    /// Blocks `i - local + 1 ..= i`, kept where allowed, outside the topk budget. Default 1.
    pub local: usize,
    /// Query and key block size: 64 or 128.
    pub block: usize,
    pub causal: bool,
    /// `None` (or `Some(0.0)`, as in the C API): 1 / sqrt(D).
    pub scale: Option<f32>,
    /// Select among these blocks only (same block size; heads 1, Hq or Hkv; batch 1 or B).
    pub candidates: Option<&'a BlockLayout<'a>>,
    /// Packed sequences, as [`AttentionOptions::cu_seqlens`](crate::AttentionOptions).
    pub cu_seqlens: Option<&'a [i32]>,
    /// Also return every block's score (`-inf` where a block is not allowed).
    pub want_scores: bool,
}

impl Default for GateOptions<'_> {
    fn default() -> Self {
        GateOptions {
            topk: 0,
            sink: 1,
            local: 1,
            block: 128,
            causal: false,
            scale: None,
            candidates: None,
            cu_seqlens: None,
            want_scores: false,
        }
    }
}

/// The gate's layout, `[B, Hkv, Mq]` counts and `[B, Hkv, Mq, kmax]` ascending indices (zeros
/// past a row's count), with `kmax = min(Nk, topk + sink + local)`; the scores `[B, Hkv, Mq, Nk]`
/// when asked for.
#[derive(Debug, Clone)]
pub struct GateLayout {
    pub kv_num_blocks: Vec<i32>,
    pub kv_indices: Vec<i32>,
    pub batch: usize,
    pub heads: usize,
    pub q_blocks: usize,
    pub kmax: usize,
    pub block: usize,
    pub scores: Option<Vec<f32>>,
}

impl GateLayout {
    /// The layout as attention takes it (one per batch row and key/value head).
    pub fn layout(&self) -> Result<BlockLayout<'_>> {
        BlockLayout::new(&self.kv_num_blocks, &self.kv_indices, self.batch, self.heads, self.q_blocks, self.kmax, self.block)
    }
}

fn to_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(format!("{what}={v} does not fit in int32")))
}

/// Chooses each query block's key blocks from q and k (one element type: f32, F16 or Bf16; D 64 or
/// 128). Everything is checked (the candidates' and cu_seqlens' contents too); the library's error
/// names the argument and the value.
pub fn gate<T: Element>(q: &Tensor4<T>, k: &Tensor4<T>, opts: &GateOptions) -> Result<GateLayout> {
    let [b, _, sq, _] = q.shape();
    let [_, hkv, skv, _] = k.shape();
    // Blocks of a size the library refuses still give sizes here; it names the block.
    let blk = opts.block.max(1);
    let (mq, nk) = (sq.div_ceil(blk), skv.div_ceil(blk));
    let kmax = nk.min(opts.topk.saturating_add(opts.sink).saturating_add(opts.local));
    let rows = product("kv_num_blocks", &[b, hkv, mq])?;
    let mut out = GateLayout {
        kv_num_blocks: zeros("kv_num_blocks", rows)?,
        kv_indices: zeros("kv_indices", product("kv_indices", &[rows, kmax])?)?,
        batch: b,
        heads: hkv,
        q_blocks: mq,
        kmax,
        block: opts.block,
        scores: None,
    };
    if opts.want_scores {
        out.scores = Some(zeros("scores", product("scores", &[rows, nk])?)?);
    }
    let candidates = match opts.candidates {
        Some(c) => Some(c.raw()?),
        None => None,
    };
    let (cu, num_seqs) = packed_sequences(opts.cu_seqlens)?;
    let args = sys::sparsek_gate_args {
        q: q.raw()?,
        k: k.raw()?,
        topk: to_i32("topk", opts.topk)?,
        block: to_i32("block", opts.block)?,
        causal: i32::from(opts.causal),
        sink: to_i32("sink", opts.sink)?,
        local: to_i32("local", opts.local)?,
        scale: opts.scale.unwrap_or(0.0),
        candidates: candidates.as_ref().map_or(ptr::null(), |c| c as *const _),
        given_scores: ptr::null(),
        kv_num_blocks: out.kv_num_blocks.as_mut_ptr(),
        kv_indices: out.kv_indices.as_mut_ptr(),
        kmax: to_i64("kmax", kmax)?,
        scores: out.scores.as_mut().map_or(ptr::null_mut(), |s| s.as_mut_ptr()),
        workspace: ptr::null_mut(),
        workspace_bytes: 0,
        cu_seqlens: cu,
        num_seqs,
    };
    // SAFETY: q, k, the candidates and cu_seqlens point into live slices checked against their
    // shapes; the outputs are this function's own vectors, sized [B, Hkv, Mq(, kmax | Nk)].
    check(unsafe { sys::sparsek_gate(&args, ptr::null_mut()) })?;
    Ok(out)
}
