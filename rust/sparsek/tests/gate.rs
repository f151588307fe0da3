//! The top-k gate through the safe API (the CPU backend) against a reference written here from the
//! rules: integer data (every pooled mean and score exact, so ties are exact and must go to the
//! lower block), GQA, causal, sinks and local blocks, candidates, packed sequences, the scores
//! output, the gate's layout fed to attention, and named errors.
use sparsek::{attention, gate, AttentionOptions, BlockLayout, GateOptions, Status, Tensor4, Tensor4Mut};

mod common;
use common::Rng;

const BLK: usize = 64;

struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    s: usize,
    d: usize,
    q: Vec<f32>,
    k: Vec<f32>,
}

impl Case {
    fn new(rng: &mut Rng, b: usize, hq: usize, hkv: usize, s: usize, d: usize) -> Case {
        let q = (0..b * hq * s * d).map(|_| rng.int()).collect();
        let k = (0..b * hkv * s * d).map(|_| rng.int()).collect();
        Case { b, hq, hkv, s, d, q, k }
    }
    fn nb(&self) -> usize {
        self.s.div_ceil(BLK)
    }
    /// Scores [B, Hkv, Mq, Nk] from the definition: block means (a group's query heads together).
    fn scores(&self) -> Vec<f64> {
        let (s, d, g, nb) = (self.s, self.d, self.hq / self.hkv, self.nb());
        let mut out = vec![0f64; self.b * self.hkv * nb * nb];
        for b in 0..self.b {
            for hk in 0..self.hkv {
                let mean = |x: &[f32], heads: std::ops::Range<usize>, hs: usize, blk: usize| -> Vec<f64> {
                    let rows = blk * BLK..((blk + 1) * BLK).min(s);
                    let n = (heads.len() * rows.len()) as f64;
                    (0..d)
                        .map(|e| {
                            let mut sum = 0f64;
                            for h in heads.clone() {
                                for r in rows.clone() {
                                    sum += x[((b * hs + h) * s + r) * d + e] as f64;
                                }
                            }
                            sum / n
                        })
                        .collect()
                };
                for i in 0..nb {
                    let pq = mean(&self.q, hk * g..hk * g + g, self.hq, i);
                    for j in 0..nb {
                        let pk = mean(&self.k, hk..hk + 1, self.hkv, j);
                        out[((b * self.hkv + hk) * nb + i) * nb + j] = (0..d).map(|e| pq[e] * pk[e]).sum();
                    }
                }
            }
        }
        out
    }
}

/// The selection of one row from the rules: allowed blocks, always-on ones, then the topk best.
fn select(score: &[f64], allowed: &[bool], i: usize, first: usize, o: &GateOptions) -> Vec<i32> {
    let on = |j: usize| (j >= first && j - first < o.sink) || (j <= i && j + o.local > i);
    let mut keep: Vec<usize> = (0..score.len()).filter(|&j| allowed[j] && on(j)).collect();
    let mut others: Vec<usize> = (0..score.len()).filter(|&j| allowed[j] && !on(j)).collect();
    others.sort_by(|&x, &y| score[y].partial_cmp(&score[x]).unwrap().then(x.cmp(&y)));
    keep.extend(others.into_iter().take(o.topk));
    keep.sort();
    keep.into_iter().map(|j| j as i32).collect()
}

/// Runs the gate and compares every row (and the scores, where asked) with the reference.
/// `allowed(b, hk, i, j)` and `first(i)` describe the candidates / packing of the case.
fn check(c: &Case, o: &GateOptions, allowed: impl Fn(usize, usize, usize, usize) -> bool, first: impl Fn(usize) -> usize) {
    let q = Tensor4::new(&c.q, [c.b, c.hq, c.s, c.d]).unwrap();
    let k = Tensor4::new(&c.k, [c.b, c.hkv, c.s, c.d]).unwrap();
    let got = gate(&q, &k, o).unwrap();
    let nb = c.nb();
    let want_scores = c.scores();
    assert_eq!(got.kmax, nb.min(o.topk + o.sink + o.local));
    for b in 0..c.b {
        for hk in 0..c.hkv {
            for i in 0..nb {
                let row = (b * c.hkv + hk) * nb + i;
                let last_row = ((i + 1) * BLK).min(c.s) - 1;
                let ok: Vec<bool> = (0..nb).map(|j| allowed(b, hk, i, j) && (!o.causal || j * BLK <= last_row)).collect();
                let want = select(&want_scores[row * nb..(row + 1) * nb], &ok, i, first(i), o);
                let n = got.kv_num_blocks[row] as usize;
                let have = &got.kv_indices[row * got.kmax..row * got.kmax + n];
                assert_eq!(have, &want[..], "b {b} head {hk} query block {i}");
                assert!(got.kv_indices[row * got.kmax + n..(row + 1) * got.kmax].iter().all(|&x| x == 0), "entries past the count");
                if let Some(s) = &got.scores {
                    for j in 0..nb {
                        let w = if ok[j] { want_scores[row * nb + j] } else { f64::NEG_INFINITY };
                        assert_eq!(s[row * nb + j] as f64, w, "score of b {b} head {hk} block {i}, key block {j}");
                    }
                }
            }
        }
    }
}

#[test]
fn gqa_causal_sinks_and_local_blocks() {
    let mut rng = Rng(7);
    let c = Case::new(&mut rng, 2, 4, 2, 512, 64);
    for (topk, sink, local, causal) in [(2, 1, 1, true), (3, 0, 0, false), (0, 2, 2, true), (100, 0, 0, true), (1, 8, 0, false)] {
        let o = GateOptions { topk, sink, local, block: BLK, causal, scale: Some(1.0), want_scores: true, ..Default::default() };
        check(&c, &o, |_, _, _, _| true, |_| 0);
    }
}

#[test]
fn equal_scores_go_to_the_lower_block() {
    // Key blocks repeat with period 3: every score appears several times in a row, so the top-k
    // cuts through ties.
    let mut rng = Rng(11);
    let mut c = Case::new(&mut rng, 1, 2, 1, 640, 64);
    let (s, d) = (c.s, c.d);
    for r in 3 * BLK..s {
        let src = r % (3 * BLK);
        let row: Vec<f32> = c.k[src * d..(src + 1) * d].to_vec();
        c.k[r * d..(r + 1) * d].copy_from_slice(&row);
    }
    for topk in [1, 2, 4, 5] {
        let o = GateOptions { topk, block: BLK, scale: Some(1.0), want_scores: true, ..Default::default() };
        check(&c, &o, |_, _, _, _| true, |_| 0);
    }
}

#[test]
fn candidates_per_query_head_are_unioned_over_the_group() {
    let mut rng = Rng(3);
    let c = Case::new(&mut rng, 1, 4, 2, 384, 64);
    let nb = c.nb();
    let kmax = 3;
    let (mut num, mut idx) = (vec![0i32; c.hq * nb], vec![0i32; c.hq * nb * kmax]);
    for r in 0..c.hq * nb {
        let mut pick: Vec<i32> = (0..nb as i32).filter(|_| rng.next() % 3 == 1).collect();
        pick.truncate(kmax);
        num[r] = pick.len() as i32;
        idx[r * kmax..r * kmax + pick.len()].copy_from_slice(&pick);
    }
    let cand = BlockLayout::new(&num, &idx, 1, c.hq, nb, kmax, BLK).unwrap();
    let g = c.hq / c.hkv;
    let listed = |h: usize, i: usize, j: usize| idx[(h * nb + i) * kmax..][..num[h * nb + i] as usize].contains(&(j as i32));
    let o = GateOptions { topk: 2, sink: 1, local: 1, block: BLK, causal: true, scale: Some(1.0), candidates: Some(&cand), want_scores: true, ..Default::default() };
    check(&c, &o, |_, hk, i, j| (hk * g..hk * g + g).any(|h| listed(h, i, j)), |_| 0);
}

#[test]
fn packed_sequences_select_within_their_sequences() {
    let mut rng = Rng(5);
    let c = Case::new(&mut rng, 1, 2, 1, 320, 64);
    let cu = [0i32, 100, 100, 320]; // block 1 holds both non-empty sequences
    let seq = |r: usize| cu.iter().rposition(|&x| x as usize <= r).unwrap().min(cu.len() - 2);
    let range = |i: usize| {
        let (r0, r1) = (i * BLK, ((i + 1) * BLK).min(c.s) - 1);
        (cu[seq(r0)] as usize / BLK, (cu[seq(r1) + 1] as usize).div_ceil(BLK))
    };
    let o = GateOptions { topk: 1, sink: 1, local: 1, block: BLK, causal: true, scale: Some(1.0), cu_seqlens: Some(&cu), want_scores: true, ..Default::default() };
    check(&c, &o, |_, _, i, j| j >= range(i).0 && j < range(i).1, |i| range(i).0);
}

#[test]
fn the_gates_layout_runs_attention() {
    let mut rng = Rng(9);
    let c = Case::new(&mut rng, 1, 2, 2, 256, 64);
    let q = Tensor4::new(&c.q, [1, 2, 256, 64]).unwrap();
    let k = Tensor4::new(&c.k, [1, 2, 256, 64]).unwrap();
    let chosen = gate(&q, &k, &GateOptions { topk: 1, sink: 1, local: 1, block: BLK, causal: true, ..Default::default() }).unwrap();
    assert!(chosen.scores.is_none());
    let mut o = vec![f32::NAN; c.q.len()];
    let mut lse = vec![f32::NAN; 2 * 256];
    let opts = AttentionOptions { causal: true, ..Default::default() };
    attention(&q, &k, &k, &mut Tensor4Mut::new(&mut o, [1, 2, 256, 64]).unwrap(), Some(&mut lse), &chosen.layout().unwrap(), &opts).unwrap();
    // local = 1: every query block keeps its own (diagonal) block, so every row attends a key.
    assert!(o.iter().all(|x| x.is_finite()) && lse.iter().all(|x| x.is_finite()), "a row attended nothing");
}

#[test]
fn bad_input_is_a_named_error() {
    let mut rng = Rng(1);
    let c = Case::new(&mut rng, 1, 2, 1, 128, 64);
    let q = Tensor4::new(&c.q, [1, 2, 128, 64]).unwrap();
    let k = Tensor4::new(&c.k, [1, 1, 128, 64]).unwrap();
    let e = gate(&q, &k, &GateOptions { topk: 1, block: 96, ..Default::default() }).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("96"), "{}", e.message());
    let cu = [0i32, 50];
    let e = gate(&q, &k, &GateOptions { topk: 1, block: BLK, cu_seqlens: Some(&cu), ..Default::default() }).unwrap_err();
    assert!(e.message().contains("cu_seqlens[1] = 50 is not the packed length T = q.s = 128"), "{}", e.message());
}
