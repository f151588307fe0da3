//! Decode attention and page selection through the safe API (the CPU backend) against references
//! written here from the definitions: a ragged batch (1, 4 and 2 new tokens; last pages not
//! full) over shuffled physical pages, GQA, causal_new on and off, a selection, the summaries'
//! update (only the new tokens' pages touched), the Quest bound's top-k on integer data (exact,
//! ties to the lower page), and named errors.
use sparsek::{
    decode_attention, select_pages, update_page_summaries, DecodeOptions, PageSelectOptions, PageSelection, PagedCache,
    Requests, Status, Tokens, TokensMut,
};

mod common;
use common::Rng;

const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 64;
const PS: usize = 16;
const POISON: f32 = 30000.0; // cache slots nobody stores

struct Case {
    seq: Vec<i32>,
    cu: Vec<i32>,
    table: Vec<i32>,
    max_pages: usize,
    pages: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Case {
    fn new(rng: &mut Rng, integers: bool) -> Case {
        let (seq, news) = (vec![40i32, 100, 17], [1usize, 4, 2]);
        let mut cu = vec![0i32];
        for n in news {
            cu.push(cu.last().unwrap() + n as i32);
        }
        let max_pages = 7;
        let pages = 3 + 7 + 2 + 2; // two spare pages nobody owns
        // Physical pages in a shuffled order (a fixed permutation of 0..14).
        let order = [9, 2, 13, 0, 7, 11, 4, 1, 12, 5, 10, 3, 8, 6];
        let mut table = vec![-1i32; 3 * max_pages];
        let mut next = 0;
        for b in 0..3 {
            for p in 0..(seq[b] as usize).div_ceil(PS) {
                table[b * max_pages + p] = order[next];
                next += 1;
            }
        }
        let mut val = |_: usize| if integers { rng.int() } else { rng.real() };
        let t = *cu.last().unwrap() as usize;
        let q = (0..t * HQ * D).map(&mut val).collect();
        let mut k = vec![POISON; pages * PS * HKV * D];
        let mut v = vec![POISON; pages * PS * HKV * D];
        for b in 0..3 {
            for pos in 0..seq[b] as usize {
                let pp = table[b * max_pages + pos / PS] as usize;
                for e in 0..HKV * D {
                    let at = (pp * PS + pos % PS) * HKV * D + e;
                    k[at] = val(0);
                    v[at] = val(0);
                }
            }
        }
        Case { seq, cu, table, max_pages, pages, q, k, v }
    }
    fn t(&self) -> usize {
        *self.cu.last().unwrap() as usize
    }
    fn requests(&self) -> Requests<'_> {
        Requests::new(&self.table, self.max_pages, &self.seq, &self.cu).unwrap()
    }
    fn key_at<'x>(&self, x: &'x [f32], b: usize, pos: usize, hk: usize) -> &'x [f32] {
        let pp = self.table[b * self.max_pages + pos / PS] as usize;
        &x[((pp * PS + pos % PS) * HKV + hk) * D..][..D]
    }
    /// O and LSE in f64 from the definition.
    fn reference(&self, causal_new: bool, sel: Option<&PageSelection>) -> (Vec<f64>, Vec<f64>) {
        let mut o = vec![0f64; self.t() * HQ * D];
        let mut lse = vec![f64::NEG_INFINITY; self.t() * HQ];
        let scale = 1.0 / (D as f64).sqrt();
        for b in 0..3 {
            let (len, q0, n) = (self.seq[b] as usize, self.cu[b] as usize, (self.cu[b + 1] - self.cu[b]) as usize);
            for j in 0..n {
                for h in 0..HQ {
                    let hk = h / (HQ / HKV);
                    let row = (q0 + j) * HQ + h;
                    let qv = &self.q[row * D..][..D];
                    let seen: Vec<usize> = (0..len)
                        .filter(|&p| !causal_new || p <= len - n + j)
                        .filter(|&p| match sel {
                            None => true,
                            Some(s) => {
                                let r = b * HKV + hk;
                                s.indices[r * s.kmax..][..s.counts[r] as usize].contains(&((p / PS) as i32))
                            }
                        })
                        .collect();
                    if seen.is_empty() {
                        continue;
                    }
                    let sc: Vec<f64> = seen
                        .iter()
                        .map(|&p| scale * self.key_at(&self.k, b, p, hk).iter().zip(qv).map(|(a, c)| *a as f64 * *c as f64).sum::<f64>())
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let l: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                    lse[row] = m + l.ln();
                    for (i, &p) in seen.iter().enumerate() {
                        let w = (sc[i] - lse[row]).exp();
                        for (e, x) in self.key_at(&self.v, b, p, hk).iter().enumerate() {
                            o[row * D + e] += w * *x as f64;
                        }
                    }
                }
            }
        }
        (o, lse)
    }
    fn run(&self, causal_new: bool, sel: Option<&PageSelection>) -> (Vec<f32>, Vec<f32>) {
        let mut o = vec![f32::NAN; self.t() * HQ * D];
        let mut lse = vec![f32::NAN; self.t() * HQ];
        decode_attention(
            &Tokens::new(&self.q, [self.t(), HQ, D]).unwrap(),
            &PagedCache::new(&self.k, [self.pages, PS, HKV, D]).unwrap(),
            &PagedCache::new(&self.v, [self.pages, PS, HKV, D]).unwrap(),
            &mut TokensMut::new(&mut o, [self.t(), HQ, D]).unwrap(),
            Some(&mut lse),
            &self.requests(),
            sel,
            &DecodeOptions { causal_new, scale: None },
        )
        .unwrap();
        (o, lse)
    }
}

fn assert_close(name: &str, got: &[f32], want: &[f64], tol: f64) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = *g as f64;
        let ok = if w.is_infinite() { g == *w } else { (g - w).abs() <= tol * (1.0 + w.abs()) };
        assert!(ok, "{name}[{i}] = {g} but the reference gives {w}");
    }
}

#[test]
fn a_ragged_batch_against_the_reference() {
    let c = Case::new(&mut Rng(4), false);
    for causal_new in [true, false] {
        let (o, lse) = c.run(causal_new, None);
        let (ro, rl) = c.reference(causal_new, None);
        assert_close("o", &o, &ro, 2e-5);
        assert_close("lse", &lse, &rl, 2e-5);
    }
}

#[test]
fn a_selection_restricts_each_head_to_its_pages() {
    let c = Case::new(&mut Rng(8), false);
    // kmax 3; head 1 of request 2 selects nothing (its rows get O = 0, LSE = -inf).
    let sel = PageSelection {
        indices: vec![0, 2, 0, 1, 0, 0, 0, 3, 6, 1, 4, 6, 1, 0, 0, 0, 0, 0],
        counts: vec![2, 1, 3, 3, 1, 0],
        kmax: 3,
    };
    let (o, lse) = c.run(true, Some(&sel));
    let (ro, rl) = c.reference(true, Some(&sel));
    assert_close("o", &o, &ro, 2e-5);
    assert_close("lse", &lse, &rl, 2e-5);
    assert!(rl.iter().any(|x| x.is_infinite()), "the case has rows that see nothing");
}

/// The Quest bound's selection from the definition, per (request, head), ascending.
fn reference_selection(c: &Case, topk: usize, sink: usize, local: usize) -> Vec<Vec<i32>> {
    let mut rows = vec![];
    for b in 0..3 {
        let (len, q0, n) = (c.seq[b] as usize, c.cu[b] as usize, (c.cu[b + 1] - c.cu[b]) as usize);
        let np = len.div_ceil(PS);
        for hk in 0..HKV {
            let score: Vec<f64> = (0..np)
                .map(|p| {
                    let keys: Vec<&[f32]> = (p * PS..((p + 1) * PS).min(len)).map(|pos| c.key_at(&c.k, b, pos, hk)).collect();
                    let mut best = f64::NEG_INFINITY;
                    for j in 0..n {
                        for h in hk * (HQ / HKV)..(hk + 1) * (HQ / HKV) {
                            let qv = &c.q[((q0 + j) * HQ + h) * D..][..D];
                            let bound: f64 = (0..D)
                                .map(|e| {
                                    let (mn, mx) = keys.iter().fold((f64::MAX, f64::MIN), |(a, z), k| (a.min(k[e] as f64), z.max(k[e] as f64)));
                                    let qe = qv[e] as f64;
                                    qe * if qe >= 0.0 { mx } else { mn }
                                })
                                .sum();
                            best = best.max(bound);
                        }
                    }
                    best
                })
                .collect();
            let on = |p: usize| p < sink || p + local >= np;
            let mut keep: Vec<usize> = (0..np).filter(|&p| on(p)).collect();
            let mut others: Vec<usize> = (0..np).filter(|&p| !on(p)).collect();
            others.sort_by(|&x, &y| score[y].partial_cmp(&score[x]).unwrap().then(x.cmp(&y)));
            keep.extend(others.into_iter().take(topk));
            keep.sort();
            rows.push(keep.into_iter().map(|p| p as i32).collect());
        }
    }
    rows
}

#[test]
fn page_selection_keeps_sinks_local_pages_and_the_best_bounds() {
    let c = Case::new(&mut Rng(6), true);
    let q = Tokens::new(&c.q, [c.t(), HQ, D]).unwrap();
    let k = PagedCache::new(&c.k, [c.pages, PS, HKV, D]).unwrap();
    let mut summaries = vec![-768f32; k.summaries_len()];
    update_page_summaries(&q, &k, &c.requests(), true, &mut summaries).unwrap();
    for (topk, sink, local) in [(2, 1, 1), (1, 0, 0), (0, 2, 1), (10, 0, 0)] {
        let sel = select_pages(&q, &k, &c.requests(), &summaries, &PageSelectOptions { topk, sink, local }).unwrap();
        assert_eq!(sel.kmax, c.max_pages.min(topk + sink + local));
        let want = reference_selection(&c, topk, sink, local);
        for (r, w) in want.iter().enumerate() {
            let n = sel.counts[r] as usize;
            assert_eq!(&sel.indices[r * sel.kmax..r * sel.kmax + n], &w[..], "topk {topk} sink {sink} local {local}, row {r}");
            assert!(sel.indices[r * sel.kmax + n..(r + 1) * sel.kmax].iter().all(|&x| x == 0));
        }
        // The selection is what decode attention takes.
        let (o, _) = c.run(true, Some(&sel));
        let (ro, _) = c.reference(true, Some(&sel));
        assert_close("o on the selection", &o, &ro, 2e-5);
    }
}

#[test]
fn equal_bounds_go_to_the_lower_page() {
    // Request 1's full pages all hold page 0's keys: equal summaries, equal bounds.
    let mut c = Case::new(&mut Rng(12), true);
    let first = c.table[c.max_pages] as usize;
    for p in 1..6 {
        let pp = c.table[c.max_pages + p] as usize;
        let src: Vec<f32> = c.k[first * PS * HKV * D..(first + 1) * PS * HKV * D].to_vec();
        c.k[pp * PS * HKV * D..(pp + 1) * PS * HKV * D].copy_from_slice(&src);
    }
    let q = Tokens::new(&c.q, [c.t(), HQ, D]).unwrap();
    let k = PagedCache::new(&c.k, [c.pages, PS, HKV, D]).unwrap();
    let mut summaries = vec![0f32; k.summaries_len()];
    update_page_summaries(&q, &k, &c.requests(), true, &mut summaries).unwrap();
    for topk in [1, 2, 3] {
        let sel = select_pages(&q, &k, &c.requests(), &summaries, &PageSelectOptions { topk, sink: 0, local: 1 }).unwrap();
        let want = reference_selection(&c, topk, 0, 1);
        for (r, w) in want.iter().enumerate() {
            assert_eq!(&sel.indices[r * sel.kmax..][..sel.counts[r] as usize], &w[..], "topk {topk}, row {r}");
        }
    }
}

#[test]
fn the_update_touches_only_the_new_tokens_pages() {
    let c = Case::new(&mut Rng(2), false);
    let q = Tokens::new(&c.q, [c.t(), HQ, D]).unwrap();
    let k = PagedCache::new(&c.k, [c.pages, PS, HKV, D]).unwrap();
    let mut s = vec![-768f32; k.summaries_len()];
    update_page_summaries(&q, &k, &c.requests(), false, &mut s).unwrap();
    let mut touched = vec![false; c.pages];
    for b in 0..3 {
        let (len, n) = (c.seq[b] as usize, (c.cu[b + 1] - c.cu[b]) as usize);
        for p in (len - n) / PS..len.div_ceil(PS) {
            let pp = c.table[b * c.max_pages + p] as usize;
            touched[pp] = true;
            for hk in 0..HKV {
                for e in 0..D {
                    let vals: Vec<f32> = (p * PS..((p + 1) * PS).min(len)).map(|pos| c.key_at(&c.k, b, pos, hk)[e]).collect();
                    let mn = vals.iter().cloned().fold(f32::MAX, f32::min);
                    let mx = vals.iter().cloned().fold(f32::MIN, f32::max);
                    assert_eq!(s[(pp * HKV + hk) * 2 * D + e], mn, "request {b} page {p} head {hk} channel {e}: min");
                    assert_eq!(s[((pp * HKV + hk) * 2 + 1) * D + e], mx, "request {b} page {p} head {hk} channel {e}: max");
                }
            }
        }
    }
    for (pp, t) in touched.iter().enumerate() {
        if !t {
            assert!(s[pp * HKV * 2 * D..(pp + 1) * HKV * 2 * D].iter().all(|&x| x == -768.0), "page {pp} was written");
        }
    }
}

#[test]
fn bad_input_is_a_named_error() {
    let mut c = Case::new(&mut Rng(1), false);
    let e = Requests::new(&c.table, c.max_pages, &c.seq, &c.cu[..3]).unwrap_err();
    assert!(e.message().contains("cu_seqlens_q has 3 entries but 3 requests (seq_lens) need 4"), "{}", e.message());
    c.table[1] = 900; // request 0's second page, outside the cache
    let mut o = vec![0f32; c.t() * HQ * D];
    let e = decode_attention(
        &Tokens::new(&c.q, [c.t(), HQ, D]).unwrap(),
        &PagedCache::new(&c.k, [c.pages, PS, HKV, D]).unwrap(),
        &PagedCache::new(&c.v, [c.pages, PS, HKV, D]).unwrap(),
        &mut TokensMut::new(&mut o, [c.t(), HQ, D]).unwrap(),
        None,
        &c.requests(),
        None,
        &DecodeOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("page_table[0, 1] = 900"), "{}", e.message());
    let k = PagedCache::new(&c.k, [c.pages, PS, HKV, D]).unwrap();
    let mut short = vec![0f32; 10];
    let e = update_page_summaries(&Tokens::new(&c.q, [c.t(), HQ, D]).unwrap(), &k, &c.requests(), true, &mut short).unwrap_err();
    assert!(e.message().contains("summaries has 10 elements"), "{}", e.message());
}
