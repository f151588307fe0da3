//! Raw declarations of sparsek's C API (`include/sparsek/sparsek.h`), written by hand and kept in
//! step with that header. Every function returns a [`sparsek_status`]; on failure
//! [`sparsek_last_error`] holds this thread's message, naming the argument and the offending value.
//!
//! Use the `sparsek` crate for a safe API. Enumerations are plain integers here (as in C), so that
//! an out-of-range value coming back from the library can never be undefined behaviour.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_float, c_int, c_void};

pub type sparsek_status = c_int;
pub const SPARSEK_OK: sparsek_status = 0;
pub const SPARSEK_INVALID_ARGUMENT: sparsek_status = 1;
pub const SPARSEK_UNSUPPORTED: sparsek_status = 2;
pub const SPARSEK_CUDA_ERROR: sparsek_status = 3;
pub const SPARSEK_NO_DEVICE: sparsek_status = 4;
pub const SPARSEK_IO_ERROR: sparsek_status = 5;
pub const SPARSEK_INTERNAL: sparsek_status = 6;
pub const SPARSEK_NCCL_ERROR: sparsek_status = 7;

pub type sparsek_dtype = c_int;
pub const SPARSEK_F32: sparsek_dtype = 0;
pub const SPARSEK_F16: sparsek_dtype = 1;
pub const SPARSEK_BF16: sparsek_dtype = 2;
/// 8-bit float (1 sign, 4 exponent, 3 mantissa bits; no infinities, largest value 448): an input
/// type of the dsd and dds products, always with fp32 scales.
pub const SPARSEK_E4M3: sparsek_dtype = 3;

pub type sparsek_layout = c_int;
pub const SPARSEK_ROW_MAJOR: sparsek_layout = 0;
pub const SPARSEK_COL_MAJOR: sparsek_layout = 1;

pub type sparsek_op = c_int;
pub const SPARSEK_OP_NONE: sparsek_op = 0;
pub const SPARSEK_OP_TRANS: sparsek_op = 1;

pub type sparsek_memory = c_int;
pub const SPARSEK_HOST: sparsek_memory = 0;
pub const SPARSEK_DEVICE: sparsek_memory = 1;

/// Which dimension of a dense matrix holds the tokens, one scale each (the other is K).
pub type sparsek_scale_dim = c_int;
pub const SPARSEK_SCALE_ROWS: sparsek_scale_dim = 0;
pub const SPARSEK_SCALE_COLS: sparsek_scale_dim = 1;

pub type sparsek_kind = c_int;
pub const SPARSEK_DSD: sparsek_kind = 0;
pub const SPARSEK_DDS: sparsek_kind = 1;
pub const SPARSEK_SDD: sparsek_kind = 2;

/// A BSR matrix: `row_ptr[rows/bm + 1]`, `col_idx[nnzb]`, `values[nnzb][bm][bk]`; E4M3 values
/// carry `scales[nnzb]` (one per stored block; null for other dtypes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_bsr {
    pub rows: i64,
    pub cols: i64,
    pub bm: i32,
    pub bk: i32,
    pub nnzb: i64,
    pub row_ptr: *const i32,
    pub col_idx: *const i32,
    pub values: *mut c_void,
    pub dtype: sparsek_dtype,
    pub memory: sparsek_memory,
    pub scales: *const c_float,
}

/// A dense matrix of `rows x cols` as stored, with leading dimension `ld`. An E4M3 input carries
/// scales per token (per row of a dds's A, per column of a dsd's B): `[tokens]` for
/// `scale_group` 0, `[tokens][ceil(K / 128)]` for 128; other dtypes leave them null and 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_dense {
    pub data: *mut c_void,
    pub rows: i64,
    pub cols: i64,
    pub ld: i64,
    pub layout: sparsek_layout,
    pub dtype: sparsek_dtype,
    pub memory: sparsek_memory,
    pub scales: *const c_float,
    pub scale_group: i32,
}

/// One product for the plan entry points. Slots by kind: DSD `sparse`=A, `b`, `c`;
/// DDS `a`, `sparse`=B, `c`; SDD `a`, `b`, `sparse`=C (its values are the output).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_gemm_args {
    pub kind: sparsek_kind,
    pub op: sparsek_op,
    pub alpha: c_float,
    pub beta: c_float,
    pub sparse: sparsek_bsr,
    pub a: sparsek_dense,
    pub b: sparsek_dense,
    pub c: sparsek_dense,
}

/// Opaque plan (`struct sparsek_plan_s`).
#[repr(C)]
pub struct sparsek_plan_s {
    _private: [u8; 0],
}
pub type sparsek_plan = *mut sparsek_plan_s;

/// A `[b, h, s, d]` tensor of block-sparse attention; strides in elements, `d` contiguous.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_tensor4 {
    pub data: *mut c_void,
    pub dtype: sparsek_dtype,
    pub memory: sparsek_memory,
    pub b: i64,
    pub h: i64,
    pub s: i64,
    pub d: i64,
    pub stride_b: i64,
    pub stride_h: i64,
    pub stride_s: i64,
}

/// A block layout (FlexAttention's BlockMask): int32 arrays, contiguous. `kv_num_blocks`
/// `[batch, heads, q_blocks]`, `kv_indices` `[batch, heads, q_blocks, kmax]`; the full lists are
/// both null or both given.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_attention_layout {
    pub kv_num_blocks: *const i32,
    pub kv_indices: *const i32,
    pub full_kv_num_blocks: *const i32,
    pub full_kv_indices: *const i32,
    pub batch: i64,
    pub heads: i64,
    pub q_blocks: i64,
    pub kmax: i64,
    pub full_kmax: i64,
    pub block_q: i32,
    pub block_kv: i32,
    pub memory: sparsek_memory,
}

/// One attention problem. `lse` may be null (not written). Packed sequences: `cu_seqlens`
/// (int32 `[num_seqs + 1]` in the layout's memory) makes q, k and v one packed sequence
/// (b = 1, Sq = Skv = T) of `num_seqs` sequences, sequence i at rows `cu_seqlens[i] ..
/// cu_seqlens[i + 1]`; a query attends only keys of its own sequence. Null and 0: none.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_attention_args {
    pub q: sparsek_tensor4,
    pub k: sparsek_tensor4,
    pub v: sparsek_tensor4,
    pub o: sparsek_tensor4,
    pub lse: *mut c_float,
    pub layout: sparsek_attention_layout,
    pub causal: i32,
    pub scale: c_float,
    pub cu_seqlens: *const i32,
    pub num_seqs: i64,
}

/// The attention backward: `forward` as the forward was called (its o and lse, required), the
/// upstream gradient `dout` and the outputs `dq` (like q), `dk`, `dv` (like k).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_attention_backward_args {
    pub forward: sparsek_attention_args,
    pub dout: sparsek_tensor4,
    pub dq: sparsek_tensor4,
    pub dk: sparsek_tensor4,
    pub dv: sparsek_tensor4,
    pub nondeterministic: i32,
}

/// The top-k block gate: q and k are mean-pooled per block (a group's query heads together),
/// scored `scale * pooled_q . pooled_k` per key/value head, and each query block keeps its sink,
/// local and `topk` best other allowed blocks, ascending (sparsek.h says the rules). Outputs:
/// `kv_num_blocks [B, Hkv, Mq]`, `kv_indices [B, Hkv, Mq, kmax]`, optionally `scores
/// [B, Hkv, Mq, Nk]`. Zero-initialize it: null and 0 in the optional fields mean "not given".
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_gate_args {
    pub q: sparsek_tensor4,
    pub k: sparsek_tensor4,
    pub topk: i32,
    pub block: i32,
    pub causal: i32,
    pub sink: i32,
    pub local: i32,
    pub scale: c_float,
    pub candidates: *const sparsek_attention_layout,
    pub given_scores: *const c_float,
    pub kv_num_blocks: *mut i32,
    pub kv_indices: *mut i32,
    pub kmax: i64,
    pub scores: *mut c_float,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub cu_seqlens: *const i32,
    pub num_seqs: i64,
}

/// A `[t, h, d]` tensor of tokens (decode); strides in elements, `d` contiguous.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_tokens {
    pub data: *mut c_void,
    pub dtype: sparsek_dtype,
    pub memory: sparsek_memory,
    pub t: i64,
    pub h: i64,
    pub d: i64,
    pub stride_t: i64,
    pub stride_h: i64,
}

/// A paged KV cache `[pages, page_size, h, d]`; strides in elements, `d` contiguous.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_paged_cache {
    pub data: *mut c_void,
    pub dtype: sparsek_dtype,
    pub memory: sparsek_memory,
    pub pages: i64,
    pub page_size: i64,
    pub h: i64,
    pub d: i64,
    pub stride_page: i64,
    pub stride_slot: i64,
    pub stride_h: i64,
}

/// Decode attention over a paged KV cache (sparsek.h gives the semantics). `lse`, `sel_indices`
/// and `sel_counts` may be null (the selection: both or neither).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_decode_args {
    pub q: sparsek_tokens,
    pub k: sparsek_paged_cache,
    pub v: sparsek_paged_cache,
    pub o: sparsek_tokens,
    pub lse: *mut c_float,
    pub page_table: *const i32,
    pub seq_lens: *const i32,
    pub cu_seqlens_q: *const i32,
    pub sel_indices: *const i32,
    pub sel_counts: *const i32,
    pub batch: i64,
    pub max_pages: i64,
    pub sel_kmax: i64,
    pub index_memory: sparsek_memory,
    pub causal_new: i32,
    pub scale: c_float,
}

/// Opaque decode plan (`struct sparsek_decode_plan_s`).
#[repr(C)]
pub struct sparsek_decode_plan_s {
    _private: [u8; 0],
}
pub type sparsek_decode_plan = *mut sparsek_decode_plan_s;

/// Page selection for decode: the summaries' update and the per-(request, key/value head) top-k
/// of pages (sparsek.h gives the rules).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sparsek_page_select_args {
    pub q: sparsek_tokens,
    pub k: sparsek_paged_cache,
    pub summaries: *mut c_void,
    pub page_table: *const i32,
    pub seq_lens: *const i32,
    pub cu_seqlens_q: *const i32,
    pub batch: i64,
    pub max_pages: i64,
    pub index_memory: sparsek_memory,
    pub sel_indices: *mut i32,
    pub sel_counts: *mut i32,
    pub sel_kmax: i64,
    pub topk: i64,
    pub sink: i64,
    pub local: i64,
    pub all_pages: i32,
    pub skip_index_check: i32,
}

/// Opaque attention plan (`struct sparsek_attention_plan_s`).
#[repr(C)]
pub struct sparsek_attention_plan_s {
    _private: [u8; 0],
}
pub type sparsek_attention_plan = *mut sparsek_attention_plan_s;

/// Opaque attention backward plan (`struct sparsek_attention_backward_plan_s`).
#[repr(C)]
pub struct sparsek_attention_backward_plan_s {
    _private: [u8; 0],
}
pub type sparsek_attention_backward_plan = *mut sparsek_attention_backward_plan_s;

extern "C" {
    pub fn sparsek_last_error() -> *const c_char;
    pub fn sparsek_status_string(s: sparsek_status) -> *const c_char;
    pub fn sparsek_version() -> *const c_char;
    pub fn sparsek_has_cuda() -> c_int;

    pub fn sparsek_dsd(
        op_a: sparsek_op,
        alpha: c_float,
        a: *const sparsek_bsr,
        b: *const sparsek_dense,
        beta: c_float,
        c: *mut sparsek_dense,
        stream: *mut c_void,
    ) -> sparsek_status;
    pub fn sparsek_dds(
        op_b: sparsek_op,
        alpha: c_float,
        a: *const sparsek_dense,
        b: *const sparsek_bsr,
        beta: c_float,
        c: *mut sparsek_dense,
        stream: *mut c_void,
    ) -> sparsek_status;
    pub fn sparsek_sdd(
        alpha: c_float,
        a: *const sparsek_dense,
        b: *const sparsek_dense,
        beta: c_float,
        c: *mut sparsek_bsr,
        stream: *mut c_void,
    ) -> sparsek_status;
    pub fn sparsek_bsr_validate(a: *const sparsek_bsr) -> sparsek_status;

    pub fn sparsek_scale_count(tokens: i64, k: i64, scale_group: i32, count: *mut i64) -> sparsek_status;
    pub fn sparsek_quantize_bsr_e4m3(
        input: *const sparsek_bsr,
        values: *mut c_void,
        scales: *mut c_float,
        stream: *mut c_void,
    ) -> sparsek_status;
    pub fn sparsek_dequantize_bsr(
        input: *const sparsek_bsr,
        values: *mut c_void,
        dtype: sparsek_dtype,
        stream: *mut c_void,
    ) -> sparsek_status;
    pub fn sparsek_quantize_dense_e4m3(
        input: *const sparsek_dense,
        out: *mut sparsek_dense,
        scales: *mut c_float,
        dim: sparsek_scale_dim,
        scale_group: i32,
        stream: *mut c_void,
    ) -> sparsek_status;
    pub fn sparsek_dequantize_dense(
        input: *const sparsek_dense,
        out: *const sparsek_dense,
        dim: sparsek_scale_dim,
        stream: *mut c_void,
    ) -> sparsek_status;

    pub fn sparsek_plan_create(
        plan: *mut sparsek_plan,
        problem: *const sparsek_gemm_args,
        variant: *const c_char,
    ) -> sparsek_status;
    pub fn sparsek_plan_run(plan: sparsek_plan, args: *const sparsek_gemm_args, stream: *mut c_void) -> sparsek_status;
    pub fn sparsek_plan_destroy(plan: sparsek_plan) -> sparsek_status;
    pub fn sparsek_plan_variant(plan: sparsek_plan) -> *const c_char;
    pub fn sparsek_plan_workspace_bytes(plan: sparsek_plan, bytes: *mut u64) -> sparsek_status;

    pub fn sparsek_attention(args: *const sparsek_attention_args, stream: *mut c_void) -> sparsek_status;
    pub fn sparsek_attention_plan_create(
        plan: *mut sparsek_attention_plan,
        problem: *const sparsek_attention_args,
        variant: *const c_char,
    ) -> sparsek_status;
    pub fn sparsek_attention_plan_run(
        plan: sparsek_attention_plan,
        args: *const sparsek_attention_args,
        stream: *mut c_void,
    ) -> sparsek_status;
    pub fn sparsek_attention_plan_destroy(plan: sparsek_attention_plan) -> sparsek_status;
    pub fn sparsek_attention_plan_variant(plan: sparsek_attention_plan) -> *const c_char;
    pub fn sparsek_attention_plan_workspace_bytes(plan: sparsek_attention_plan, bytes: *mut u64) -> sparsek_status;

    pub fn sparsek_attention_backward(args: *const sparsek_attention_backward_args, stream: *mut c_void)
        -> sparsek_status;
    pub fn sparsek_attention_backward_plan_create(
        plan: *mut sparsek_attention_backward_plan,
        problem: *const sparsek_attention_backward_args,
        variant: *const c_char,
    ) -> sparsek_status;
    pub fn sparsek_attention_backward_plan_run(
        plan: sparsek_attention_backward_plan,
        args: *const sparsek_attention_backward_args,
        stream: *mut c_void,
    ) -> sparsek_status;
    pub fn sparsek_attention_backward_plan_destroy(plan: sparsek_attention_backward_plan) -> sparsek_status;
    pub fn sparsek_attention_backward_plan_variant(plan: sparsek_attention_backward_plan) -> *const c_char;
    pub fn sparsek_attention_backward_plan_workspace_bytes(
        plan: sparsek_attention_backward_plan,
        bytes: *mut u64,
    ) -> sparsek_status;

    pub fn sparsek_decode_attention(args: *const sparsek_decode_args, stream: *mut c_void) -> sparsek_status;
    pub fn sparsek_decode_plan_create(
        plan: *mut sparsek_decode_plan,
        problem: *const sparsek_decode_args,
        kv_splits: i32,
    ) -> sparsek_status;
    pub fn sparsek_decode_plan_run(plan: sparsek_decode_plan, args: *const sparsek_decode_args, stream: *mut c_void)
        -> sparsek_status;
    pub fn sparsek_decode_plan_destroy(plan: sparsek_decode_plan) -> sparsek_status;
    pub fn sparsek_decode_plan_info(plan: sparsek_decode_plan, kv_splits: *mut i32, workspace_bytes: *mut u64)
        -> sparsek_status;
    pub fn sparsek_update_page_summaries(args: *const sparsek_page_select_args, stream: *mut c_void) -> sparsek_status;
    pub fn sparsek_select_pages(args: *const sparsek_page_select_args, stream: *mut c_void) -> sparsek_status;

    pub fn sparsek_gate_workspace_bytes(args: *const sparsek_gate_args, bytes: *mut u64) -> sparsek_status;
    pub fn sparsek_gate(args: *const sparsek_gate_args, stream: *mut c_void) -> sparsek_status;
}
