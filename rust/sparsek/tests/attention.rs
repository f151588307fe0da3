//! Block-sparse attention through the safe API on host tensors (the CPU backend) against a naive
//! f64 reference written here from the definition: random real data, random layouts with empty
//! rows, GQA, a layout shared over the batch, causal, packed sequences, the full lists, the
//! backward (dq, dk, dv; repeated runs bit-identical), bf16, and bad input as named errors.
use sparsek::{attention, attention_backward, AttentionOptions, Bf16, BlockLayout, Element, ForwardOutputs, Status, Tensor4, Tensor4Mut};

mod common;
use common::Rng;

/// One problem: packed [b, h, s, d] f32 tensors and a layout [lb, lh, q_blocks, kmax].
struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    s: usize,
    d: usize,
    block: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    lb: usize,
    lh: usize,
    kmax: usize,
    num: Vec<i32>,
    idx: Vec<i32>,
    full: Option<(Vec<i32>, Vec<i32>, usize)>,
    causal: bool,
    cu: Option<Vec<i32>>,
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    fn new(rng: &mut Rng, b: usize, hq: usize, hkv: usize, s: usize, d: usize, lb: usize, lh: usize) -> Case {
        let block = 64;
        let nb = s.div_ceil(block);
        let kmax = nb.max(1) - 1;
        let mut num = vec![0i32; lb * lh * nb];
        let mut idx = vec![0i32; lb * lh * nb * kmax];
        for (r, n) in num.iter_mut().enumerate() {
            // A random subset of the key blocks, ascending; some rows empty.
            let mut pick: Vec<i32> = (0..nb as i32).filter(|_| rng.below(3) != 0).collect();
            pick.truncate(kmax);
            if r % 5 == 2 {
                pick.clear();
            }
            *n = pick.len() as i32;
            idx[r * kmax..r * kmax + pick.len()].copy_from_slice(&pick);
        }
        let mut fill = |n: usize| (0..n).map(|_| rng.real()).collect::<Vec<f32>>();
        Case {
            b,
            hq,
            hkv,
            s,
            d,
            block,
            q: fill(b * hq * s * d),
            k: fill(b * hkv * s * d),
            v: fill(b * hkv * s * d),
            lb,
            lh,
            kmax,
            num,
            idx,
            full: None,
            causal: false,
            cu: None,
        }
    }
    fn q_blocks(&self) -> usize {
        self.s.div_ceil(self.block)
    }
    fn layout(&self) -> BlockLayout<'_> {
        let l = BlockLayout::new(&self.num, &self.idx, self.lb, self.lh, self.q_blocks(), self.kmax, self.block).unwrap();
        match &self.full {
            Some((n, i, k)) => l.with_full(n, i, *k).unwrap(),
            None => l,
        }
    }
    fn opts(&self) -> AttentionOptions<'_> {
        AttentionOptions { causal: self.causal, scale: Some(0.3), cu_seqlens: self.cu.as_deref() }
    }
    fn q_shape(&self) -> [usize; 4] {
        [self.b, self.hq, self.s, self.d]
    }
    fn kv_shape(&self) -> [usize; 4] {
        [self.b, self.hkv, self.s, self.d]
    }
    fn seq_of(&self, i: usize) -> usize {
        self.cu.as_ref().map_or(0, |c| c.iter().rposition(|&x| x as usize <= i).unwrap())
    }
    /// The keys query row i of (b, h) attends, from the definition.
    fn keys(&self, b: usize, h: usize, i: usize) -> Vec<usize> {
        let hk = h / (self.hq / self.hkv);
        let row_of = |heads: usize| {
            let lh = if heads == 1 { 0 } else if heads == self.hq { h } else { hk };
            ((if self.lb == 1 { 0 } else { b }) * heads + lh) * self.q_blocks() + i / self.block
        };
        let mut keys = vec![];
        let r = row_of(self.lh);
        let listed = |n: &[i32], x: &[i32], kmax: usize, r: usize, masked: bool, keys: &mut Vec<usize>| {
            for e in 0..n[r] as usize {
                let kb = x[r * kmax + e] as usize;
                for j in kb * self.block..((kb + 1) * self.block).min(self.s) {
                    let same_seq = self.seq_of(j) == self.seq_of(i);
                    if same_seq && !(masked && self.causal && j > i) {
                        keys.push(j);
                    }
                }
            }
        };
        listed(&self.num, &self.idx, self.kmax, r, true, &mut keys);
        if let Some((n, x, k)) = &self.full {
            listed(n, x, *k, r, false, &mut keys);
        }
        keys
    }
    /// O, LSE and (for dout) dq, dk, dv in f64 from `q`, `k`, `v` (as f64).
    #[allow(clippy::type_complexity)]
    fn reference(&self, q: &[f64], k: &[f64], v: &[f64], dout: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let (s, d, g) = (self.s, self.d, self.hq / self.hkv);
        let mut o = vec![0f64; q.len()];
        let mut lse = vec![f64::NEG_INFINITY; self.b * self.hq * s];
        let (mut dq, mut dk, mut dv) = (vec![0f64; q.len()], vec![0f64; k.len()], vec![0f64; v.len()]);
        for b in 0..self.b {
            for h in 0..self.hq {
                let kh = (b * self.hkv + h / g) * s;
                for i in 0..s {
                    let qi = &q[((b * self.hq + h) * s + i) * d..][..d];
                    let keys = self.keys(b, h, i);
                    if keys.is_empty() {
                        continue;
                    }
                    let sc: Vec<f64> = keys.iter().map(|&j| 0.3 * (0..d).map(|e| qi[e] * k[(kh + j) * d + e]).sum::<f64>()).collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let l: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                    let row = (b * self.hq + h) * s + i;
                    lse[row] = m + l.ln();
                    let p: Vec<f64> = sc.iter().map(|x| (x - lse[row]).exp()).collect();
                    for (t, &j) in keys.iter().enumerate() {
                        for e in 0..d {
                            o[row * d + e] += p[t] * v[(kh + j) * d + e];
                        }
                    }
                    // Backward of the row: dP = dO . v_j, D = dO . O, dS = P (dP - D).
                    let dor = &dout[row * d..][..d];
                    let big_d: f64 = (0..d).map(|e| dor[e] * o[row * d + e]).sum();
                    for (t, &j) in keys.iter().enumerate() {
                        let dp: f64 = (0..d).map(|e| dor[e] * v[(kh + j) * d + e]).sum();
                        let ds = p[t] * (dp - big_d);
                        for e in 0..d {
                            dq[row * d + e] += 0.3 * ds * k[(kh + j) * d + e];
                            dk[(kh + j) * d + e] += 0.3 * ds * qi[e];
                            dv[(kh + j) * d + e] += p[t] * dor[e];
                        }
                    }
                }
            }
        }
        (o, lse, dq, dk, dv)
    }
}

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|e| e.to_f32() as f64).collect()
}

fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let mut worst = (0.0, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_infinite() {
            assert_eq!(g, w, "{name}[{i}]");
            continue;
        }
        let err = (g - w).abs() / (1.0 + w.abs());
        if err > worst.0 || err.is_nan() {
            worst = (err, i);
        }
    }
    assert!(worst.0 <= tol, "{name}[{}] = {} but the reference gives {} (error {:e} > {tol:e})", worst.1, got[worst.1], want[worst.1], worst.0);
}

/// Forward and backward of `c` in f32 against the reference.
fn check_f32(c: &Case) {
    let (q, k, v) = (Tensor4::new(&c.q, c.q_shape()).unwrap(), Tensor4::new(&c.k, c.kv_shape()).unwrap(), Tensor4::new(&c.v, c.kv_shape()).unwrap());
    let mut o = vec![f32::NAN; c.q.len()];
    let mut lse = vec![f32::NAN; c.b * c.hq * c.s];
    let mut ot = Tensor4Mut::new(&mut o, c.q_shape()).unwrap();
    attention(&q, &k, &v, &mut ot, Some(&mut lse), &c.layout(), &c.opts()).unwrap();
    let dout: Vec<f32> = (0..c.q.len()).map(|i| ((i * 7919) % 23) as f32 / 11.0 - 1.0).collect();
    let (ro, rl, rdq, rdk, rdv) = c.reference(&f64s(&c.q), &f64s(&c.k), &f64s(&c.v), &f64s(&dout));
    assert_close("o", &f64s(&o), &ro, 2e-5);
    assert_close("lse", &f64s(&lse), &rl, 2e-5);

    let backward = |dq: &mut Vec<f32>, dk: &mut Vec<f32>, dv: &mut Vec<f32>| {
        let ov = Tensor4::new(&o, c.q_shape()).unwrap();
        let dov = Tensor4::new(&dout, c.q_shape()).unwrap();
        let fwd = ForwardOutputs { o: &ov, lse: &lse, dout: &dov };
        attention_backward(
            &q,
            &k,
            &v,
            fwd,
            &mut Tensor4Mut::new(dq, c.q_shape()).unwrap(),
            &mut Tensor4Mut::new(dk, c.kv_shape()).unwrap(),
            &mut Tensor4Mut::new(dv, c.kv_shape()).unwrap(),
            &c.layout(),
            &c.opts(),
        )
        .unwrap();
    };
    let (mut dq, mut dk, mut dv) = (vec![f32::NAN; c.q.len()], vec![f32::NAN; c.k.len()], vec![f32::NAN; c.v.len()]);
    backward(&mut dq, &mut dk, &mut dv);
    assert_close("dq", &f64s(&dq), &rdq, 1e-4);
    assert_close("dk", &f64s(&dk), &rdk, 1e-4);
    assert_close("dv", &f64s(&dv), &rdv, 1e-4);
    let (mut dq2, mut dk2, mut dv2) = (vec![0f32; c.q.len()], vec![0f32; c.k.len()], vec![0f32; c.v.len()]);
    backward(&mut dq2, &mut dk2, &mut dv2);
    let bits = |x: &[f32]| x.iter().map(|e| e.to_bits()).collect::<Vec<u32>>();
    assert!(bits(&dq) == bits(&dq2) && bits(&dk) == bits(&dk2) && bits(&dv) == bits(&dv2), "a repeated backward differs");
}

#[test]
fn gqa_with_a_layout_per_batch_and_head_and_empty_rows() {
    let mut rng = Rng(17);
    let c = Case::new(&mut rng, 2, 4, 2, 200, 64, 2, 4);
    assert!(c.num.contains(&0), "the case has rows that attend nothing");
    check_f32(&c);
}

#[test]
fn causal_with_a_layout_shared_over_batch_and_heads() {
    let mut rng = Rng(5);
    let mut c = Case::new(&mut rng, 2, 2, 1, 256, 128, 1, 1);
    c.causal = true;
    check_f32(&c);
}

#[test]
fn a_layout_per_key_value_head_with_full_lists() {
    let mut rng = Rng(9);
    let mut c = Case::new(&mut rng, 1, 4, 2, 192, 64, 1, 2);
    c.causal = true;
    // The full lists: the diagonal block of each row where the masked lists skip it.
    let nb = c.q_blocks();
    let (mut n, mut x) = (vec![0i32; 2 * nb], vec![0i32; 2 * nb]);
    for r in 0..2 * nb {
        let qb = (r % nb) as i32;
        if !c.idx[r * c.kmax..r * c.kmax + c.num[r] as usize].contains(&qb) {
            n[r] = 1;
            x[r] = qb;
        }
    }
    c.full = Some((n, x, 1));
    check_f32(&c);
}

#[test]
fn packed_sequences_attend_only_their_own() {
    let mut rng = Rng(3);
    let mut c = Case::new(&mut rng, 1, 2, 2, 200, 64, 1, 1);
    c.causal = true;
    c.cu = Some(vec![0, 70, 70, 150, 200]); // an empty sequence, boundaries inside blocks
    check_f32(&c);
}

#[test]
fn bf16_against_the_reference_on_its_rounded_inputs() {
    let mut rng = Rng(11);
    let c = Case::new(&mut rng, 1, 2, 1, 128, 64, 1, 1);
    let round = |x: &[f32]| x.iter().map(|&e| Bf16::from_f32(e)).collect::<Vec<Bf16>>();
    let (q16, k16, v16) = (round(&c.q), round(&c.k), round(&c.v));
    let (q, k, v) = (Tensor4::new(&q16, c.q_shape()).unwrap(), Tensor4::new(&k16, c.kv_shape()).unwrap(), Tensor4::new(&v16, c.kv_shape()).unwrap());
    let mut o = vec![Bf16::from_f32(f32::NAN); q16.len()];
    attention(&q, &k, &v, &mut Tensor4Mut::new(&mut o, c.q_shape()).unwrap(), None, &c.layout(), &c.opts()).unwrap();
    let (ro, ..) = c.reference(&f64s(&q16), &f64s(&k16), &f64s(&v16), &vec![0.0; q16.len()]);
    assert_close("o (bf16)", &f64s(&o), &ro, 1e-2);
}

#[test]
fn a_b_s_h_d_array_through_strides() {
    // q stored [b, s, h, d] and viewed with strides: the same O as the packed copy gives.
    let mut rng = Rng(21);
    let c = Case::new(&mut rng, 1, 2, 2, 128, 64, 1, 1);
    let (h, s, d) = (c.hq, c.s, c.d);
    let mut bshd = vec![0f32; c.q.len()];
    for hh in 0..h {
        for i in 0..s {
            bshd[(i * h + hh) * d..][..d].copy_from_slice(&c.q[(hh * s + i) * d..][..d]);
        }
    }
    let q = Tensor4::with_strides(&bshd, c.q_shape(), [s * h * d, d, h * d]).unwrap();
    let (k, v) = (Tensor4::new(&c.k, c.kv_shape()).unwrap(), Tensor4::new(&c.v, c.kv_shape()).unwrap());
    let mut o = vec![0f32; c.q.len()];
    attention(&q, &k, &v, &mut Tensor4Mut::new(&mut o, c.q_shape()).unwrap(), None, &c.layout(), &c.opts()).unwrap();
    let (ro, ..) = c.reference(&f64s(&c.q), &f64s(&c.k), &f64s(&c.v), &vec![0.0; c.q.len()]);
    assert_close("o (strided q)", &f64s(&o), &ro, 2e-5);
}

#[test]
fn bad_input_is_a_named_error() {
    let mut rng = Rng(2);
    let mut c = Case::new(&mut rng, 1, 2, 2, 128, 64, 1, 1);
    let (q, k, v) = (Tensor4::new(&c.q, c.q_shape()).unwrap(), Tensor4::new(&c.k, c.kv_shape()).unwrap(), Tensor4::new(&c.v, c.kv_shape()).unwrap());
    let mut o = vec![0f32; c.q.len()];
    let mut short = vec![0f32; 3];

    // Checked by the crate: slices shorter than their shapes.
    let e = attention(&q, &k, &v, &mut Tensor4Mut::new(&mut o, c.q_shape()).unwrap(), Some(&mut short), &c.layout(), &c.opts()).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("lse has 3 entries but [B, Hq, Sq] needs 256"), "{}", e.message());
    let e = BlockLayout::new(&c.num[..1], &c.idx, 1, 1, 2, c.kmax, 64).unwrap_err();
    assert!(e.message().contains("kv_num_blocks has 1 entries but [1, 1, 2] needs 2"), "{}", e.message());

    // Checked by the library, named there: a block index past the key blocks, a cu_seqlens that
    // does not end at the packed length, D = 32.
    c.num[0] = 1;
    c.idx[0] = 9;
    let e = attention(&q, &k, &v, &mut Tensor4Mut::new(&mut o, c.q_shape()).unwrap(), None, &c.layout(), &c.opts()).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("kv_indices") && e.message().contains('9'), "{}", e.message());
    c.idx[0] = 0;
    let cu = [0, 100];
    let opts = AttentionOptions { cu_seqlens: Some(&cu), ..c.opts() };
    let e = attention(&q, &k, &v, &mut Tensor4Mut::new(&mut o, c.q_shape()).unwrap(), None, &c.layout(), &opts).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("cu_seqlens[1] = 100"), "{}", e.message());
    let q32 = Tensor4::new(&c.q, [1, 2, 256, 32]).unwrap();
    let k32 = Tensor4::new(&c.k, [1, 2, 256, 32]).unwrap();
    let mut o32 = vec![0f32; c.q.len()];
    let e = attention(&q32, &k32, &k32, &mut Tensor4Mut::new(&mut o32, [1, 2, 256, 32]).unwrap(), None, &c.layout(), &c.opts()).unwrap_err();
    assert!(e.message().contains("q.d = 32 is not 64 or 128"), "{}", e.message());
}
