//! The declarations link against libsparsek and behave as sparsek.h says.
use sparsek_sys::*;
use std::ffi::CStr;

#[test]
fn links_and_reports_a_version() {
    let v = unsafe { CStr::from_ptr(sparsek_version()) }.to_str().unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"), "the crate follows include/sparsek/version.h");
}

#[test]
fn null_argument_is_named() {
    let s = unsafe { sparsek_bsr_validate(std::ptr::null()) };
    assert_eq!(s, SPARSEK_INVALID_ARGUMENT);
    let msg = unsafe { CStr::from_ptr(sparsek_last_error()) }.to_string_lossy();
    assert!(msg.contains("argument 'a' is NULL"), "message {msg:?}");
    let name = unsafe { CStr::from_ptr(sparsek_status_string(s)) }.to_string_lossy();
    assert_eq!(name, "invalid argument");
}

#[test]
fn struct_sizes_match_the_c_layout() {
    // sparsek_bsr: 2 x i64, 2 x i32, i64, 3 pointers, 2 enums (int), the scales pointer = 72 bytes
    // on LP64.
    assert_eq!(std::mem::size_of::<sparsek_bsr>(), 72);
    // sparsek_dense: pointer, 3 x i64, 3 enums (+4 padding), the scales pointer, scale_group (+4) = 64.
    assert_eq!(std::mem::size_of::<sparsek_dense>(), 64);
    assert_eq!(std::mem::size_of::<sparsek_gemm_args>(), 16 + 72 + 3 * 64);
    assert_eq!(std::mem::offset_of!(sparsek_bsr, scales), 64);
    assert_eq!(std::mem::offset_of!(sparsek_dense, scales), 48);
    assert_eq!(std::mem::offset_of!(sparsek_dense, scale_group), 56);
}

#[test]
fn attention_struct_layouts_match_the_c_layout() {
    // sparsek_tensor4: pointer, 2 enums (int), 7 x i64 = 72 bytes on LP64.
    assert_eq!(std::mem::size_of::<sparsek_tensor4>(), 72);
    // sparsek_attention_layout: 4 pointers, 5 x i64, 2 x i32, the memory enum (+4 padding) = 88.
    assert_eq!(std::mem::size_of::<sparsek_attention_layout>(), 88);
    assert_eq!(std::mem::offset_of!(sparsek_attention_layout, block_q), 72);
    assert_eq!(std::mem::offset_of!(sparsek_attention_layout, memory), 80);
    // sparsek_attention_args: 4 tensors, lse, the layout, causal, scale, cu_seqlens, num_seqs = 408.
    assert_eq!(std::mem::offset_of!(sparsek_attention_args, lse), 288);
    assert_eq!(std::mem::offset_of!(sparsek_attention_args, layout), 296);
    assert_eq!(std::mem::offset_of!(sparsek_attention_args, causal), 384);
    assert_eq!(std::mem::offset_of!(sparsek_attention_args, scale), 388);
    assert_eq!(std::mem::offset_of!(sparsek_attention_args, cu_seqlens), 392);
    assert_eq!(std::mem::offset_of!(sparsek_attention_args, num_seqs), 400);
    assert_eq!(std::mem::size_of::<sparsek_attention_args>(), 408);
    // The backward: the forward's args, 4 tensors, nondeterministic (+4 padding) = 704.
    assert_eq!(std::mem::offset_of!(sparsek_attention_backward_args, dout), 408);
    assert_eq!(std::mem::offset_of!(sparsek_attention_backward_args, nondeterministic), 696);
    assert_eq!(std::mem::size_of::<sparsek_attention_backward_args>(), 704);
}

// A packed host f32 tensor [1, 1, t, d].
fn tensor(data: &mut [f32], t: i64, d: i64) -> sparsek_tensor4 {
    assert_eq!(data.len() as i64, t * d);
    sparsek_tensor4 {
        data: data.as_mut_ptr().cast(),
        dtype: SPARSEK_F32,
        memory: SPARSEK_HOST,
        b: 1,
        h: 1,
        s: t,
        d,
        stride_b: t * d,
        stride_h: t * d,
        stride_s: d,
    }
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(sparsek_last_error()) }.to_string_lossy().into_owned()
}

// Values in [-1, 1) from a small LCG (reproducible without a crate).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32) / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Packed sequences through the FFI (CPU backend): the forward against attention over each
/// sequence alone computed here, the backward's dv summing to each sequence's length for dout = 1
/// (no key receives another sequence's probability), and a bad last offset named.
#[test]
fn packed_sequences_attend_only_their_own_keys() {
    const T: usize = 100;
    const D: usize = 64;
    let cu: [i32; 4] = [0, 30, 30, 100]; // boundary inside the first block, an empty sequence
    let (mut q, mut k, mut v) = (random(T * D, 1), random(T * D, 2), random(T * D, 3));
    let (mut o, mut lse) = (vec![f32::NAN; T * D], vec![f32::NAN; T]);
    let num = [2i32, 2]; // every block: 2 query blocks x 2 key blocks of 64
    let idx = [0i32, 1, 0, 1];
    let layout = sparsek_attention_layout {
        kv_num_blocks: num.as_ptr(),
        kv_indices: idx.as_ptr(),
        full_kv_num_blocks: std::ptr::null(),
        full_kv_indices: std::ptr::null(),
        batch: 1,
        heads: 1,
        q_blocks: 2,
        kmax: 2,
        full_kmax: 0,
        block_q: 64,
        block_kv: 64,
        memory: SPARSEK_HOST,
    };
    let args = sparsek_attention_args {
        q: tensor(&mut q, T as i64, D as i64),
        k: tensor(&mut k, T as i64, D as i64),
        v: tensor(&mut v, T as i64, D as i64),
        o: tensor(&mut o, T as i64, D as i64),
        lse: lse.as_mut_ptr(),
        layout,
        causal: 0,
        scale: 0.0,
        cu_seqlens: cu.as_ptr(),
        num_seqs: 3,
    };
    let s = unsafe { sparsek_attention(&args, std::ptr::null_mut()) };
    assert_eq!(s, SPARSEK_OK, "{}", last_error());
    let scale = 1.0 / (D as f64).sqrt();
    for (i, w) in cu.windows(2).enumerate() {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        for r in lo..hi {
            let scores: Vec<f64> = (lo..hi)
                .map(|c| scale * (0..D).map(|d| q[r * D + d] as f64 * k[c * D + d] as f64).sum::<f64>())
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            assert!((lse[r] as f64 - (m + sum.ln())).abs() < 1e-5, "sequence {i} row {r}: lse {}", lse[r]);
            for d in 0..D {
                let want: f64 = (lo..hi).map(|c| (scores[c - lo] - m).exp() / sum * v[c * D + d] as f64).sum();
                assert!((o[r * D + d] as f64 - want).abs() < 1e-5, "sequence {i} row {r} d {d}: {} vs {want}", o[r * D + d]);
            }
        }
    }

    let mut dout = vec![1.0f32; T * D];
    let (mut dq, mut dk, mut dv) = (vec![f32::NAN; T * D], vec![f32::NAN; T * D], vec![f32::NAN; T * D]);
    let back = sparsek_attention_backward_args {
        forward: args,
        dout: tensor(&mut dout, T as i64, D as i64),
        dq: tensor(&mut dq, T as i64, D as i64),
        dk: tensor(&mut dk, T as i64, D as i64),
        dv: tensor(&mut dv, T as i64, D as i64),
        nondeterministic: 0,
    };
    let s = unsafe { sparsek_attention_backward(&back, std::ptr::null_mut()) };
    assert_eq!(s, SPARSEK_OK, "{}", last_error());
    for w in cu.windows(2) {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        let total: f64 = (lo..hi).map(|c| dv[c * D] as f64).sum();
        assert!((total - (hi - lo) as f64).abs() < 1e-4, "rows {lo}..{hi}: dv sums to {total}");
    }
    assert!(dq.iter().chain(&dk).all(|x| x.is_finite()));

    let bad = [0i32, 30, 30, 99];
    let mut wrong = back;
    wrong.forward.cu_seqlens = bad.as_ptr();
    assert_eq!(unsafe { sparsek_attention_backward(&wrong, std::ptr::null_mut()) }, SPARSEK_INVALID_ARGUMENT);
    assert!(last_error().contains("cu_seqlens[3] = 99 is not the packed length T = q.s = 100"), "{}", last_error());
    let mut none = args;
    none.num_seqs = 0;
    assert_eq!(unsafe { sparsek_attention(&none, std::ptr::null_mut()) }, SPARSEK_INVALID_ARGUMENT);
    assert!(last_error().contains("num_seqs = 0 with cu_seqlens given"), "{}", last_error());
}

/// Every field's offset and the size of the gate's, decode's and page selection's structs, as the C
/// compiler lays them out on LP64 (the same numbers are static_asserts in tests/cpu/test_capi.cpp,
/// so a change on either side fails a test).
#[test]
fn gate_and_decode_struct_layouts_match_the_c_layout() {
    macro_rules! layout {
        ($t:ty, $size:expr, $($f:ident = $off:expr),+ $(,)?) => {
            $(assert_eq!(std::mem::offset_of!($t, $f), $off, concat!(stringify!($t), ".", stringify!($f)));)+
            assert_eq!(std::mem::size_of::<$t>(), $size, stringify!($t));
        };
    }
    layout!(sparsek_tokens, 56, data = 0, dtype = 8, memory = 12, t = 16, h = 24, d = 32, stride_t = 40, stride_h = 48);
    layout!(sparsek_paged_cache, 72, data = 0, dtype = 8, memory = 12, pages = 16, page_size = 24, h = 32, d = 40, stride_page = 48, stride_slot = 56, stride_h = 64);
    layout!(sparsek_gate_args, 248, q = 0, k = 72, topk = 144, block = 148, causal = 152, sink = 156, local = 160, scale = 164, candidates = 168, given_scores = 176, kv_num_blocks = 184, kv_indices = 192, kmax = 200, scores = 208, workspace = 216, workspace_bytes = 224, cu_seqlens = 232, num_seqs = 240);
    layout!(sparsek_decode_args, 344, q = 0, k = 56, v = 128, o = 200, lse = 256, page_table = 264, seq_lens = 272, cu_seqlens_q = 280, sel_indices = 288, sel_counts = 296, batch = 304, max_pages = 312, sel_kmax = 320, index_memory = 328, causal_new = 332, scale = 336);
    layout!(sparsek_page_select_args, 240, q = 0, k = 56, summaries = 128, page_table = 136, seq_lens = 144, cu_seqlens_q = 152, batch = 160, max_pages = 168, index_memory = 176, sel_indices = 184, sel_counts = 192, sel_kmax = 200, topk = 208, sink = 216, local = 224, all_pages = 232, skip_index_check = 236);
}
