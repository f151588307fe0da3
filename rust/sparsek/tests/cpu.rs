//! The safe API on host operands (the CPU backend) against a naive f64 reference, and bad input
//! coming back as the library's named errors. Values are small integers, so that every product
//! is exact in f32 and the comparisons can be exact too.
use sparsek::{dds, dsd, sdd, Bf16, BsrMatrix, DenseMut, DenseRef, Element, Kind, Layout, Op, Plan, Status, F16};

mod common;
use common::Rng;

/// A random BSR matrix: each block present with probability `density`, block row 0 empty when
/// `empty_first_row`, integer values.
fn random_bsr<T: Element>(rng: &mut Rng, rows: usize, cols: usize, block: (usize, usize), density: f64) -> BsrMatrix<'static, T> {
    let (bm, bk) = block;
    let (mut row_ptr, mut col_idx, mut values) = (vec![0i32], vec![], vec![]);
    for br in 0..rows / bm {
        for bc in 0..cols / bk {
            if br != 0 && rng.chance(density) {
                col_idx.push(bc as i32);
                values.extend((0..bm * bk).map(|_| T::from_f32(rng.int())));
            }
        }
        row_ptr.push(col_idx.len() as i32);
    }
    BsrMatrix::new(rows, cols, block, row_ptr, col_idx, values).expect("a valid random matrix")
}

fn random_dense(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.int()).collect()
}

/// Element (r, c) of a stored dense matrix.
fn at(d: &[f32], layout: Layout, ld: usize, r: usize, c: usize) -> f64 {
    d[if layout == Layout::RowMajor { r * ld + c } else { c * ld + r }] as f64
}

#[allow(clippy::too_many_arguments)]
/// C = alpha * X * Y + beta * C0 in f64; X is m x k, Y is k x n, both given as element getters.
fn reference(m: usize, n: usize, k: usize, x: impl Fn(usize, usize) -> f64, y: impl Fn(usize, usize) -> f64, alpha: f64, beta: f64, c0: &[f32]) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k).map(|l| x(i, l) * y(l, j)).sum();
            out[i * n + j] = alpha * s + if beta != 0.0 { beta * c0[i * n + j] as f64 } else { 0.0 };
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((*g as f64 - w).abs() <= 1e-3 * (1.0 + w.abs()), "{what}: element {i}: got {g}, want {w}");
    }
}

#[test]
fn library_version_matches_the_crate() {
    // The version is written once, in include/sparsek/version.h; the crates must follow it.
    assert_eq!(sparsek::version(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn dsd_matches_the_reference() {
    let mut rng = Rng(7);
    // (rows, cols, block, n, density, op, B layout, alpha, beta)
    let cases = [
        (64, 96, (32, 32), 40, 0.5, Op::None, Layout::RowMajor, 1.0, 0.0),
        (128, 64, (16, 64), 1, 0.7, Op::None, Layout::ColMajor, 2.0, 0.5),   // N = 1
        (64, 128, (64, 32), 33, 1.0, Op::Trans, Layout::RowMajor, 1.0, -1.0), // fully dense, op = trans
        (32, 32, (32, 32), 8, 0.0, Op::None, Layout::RowMajor, 1.0, 0.0),    // nnzb = 0
        (128, 128, (128, 128), 5, 1.0, Op::None, Layout::RowMajor, 1.0, 0.0), // one block row of one block... + empty
    ];
    for (ci, &(rows, cols, block, n, density, op, b_layout, alpha, beta)) in cases.iter().enumerate() {
        let a: BsrMatrix<f32> = random_bsr(&mut rng, rows, cols, block, density);
        let (m, k) = if op == Op::None { (rows, cols) } else { (cols, rows) };
        let b = random_dense(&mut rng, k * n);
        let ldb = if b_layout == Layout::RowMajor { n } else { k };
        let c0 = random_dense(&mut rng, m * n);
        let ad = a.to_dense();
        let want = reference(
            m,
            n,
            k,
            |i, l| if op == Op::None { ad[i * cols + l] as f64 } else { ad[l * cols + i] as f64 },
            |l, j| at(&b, b_layout, ldb, l, j),
            alpha as f64,
            beta as f64,
            &c0,
        );
        // beta = 0 must never read C: poison it with NaN then.
        let mut c = if beta == 0.0 { vec![f32::NAN; m * n] } else { c0.clone() };
        let bv = DenseRef::with_layout(&b, k, n, b_layout, ldb).unwrap();
        dsd(op, alpha, &a, &bv, beta, &mut DenseMut::new(&mut c, m, n).unwrap()).unwrap();
        assert_close(&c, &want, &format!("dsd case {ci}"));
    }
}

#[test]
fn dds_matches_the_reference() {
    let mut rng = Rng(11);
    for &(op, alpha, beta) in &[(Op::None, 1.0f32, 0.0f32), (Op::Trans, 0.5, 2.0)] {
        let (rows, cols, m) = (96, 64, 17);
        let b: BsrMatrix<f32> = random_bsr(&mut rng, rows, cols, (32, 16), 0.4);
        let (k, n) = if op == Op::None { (rows, cols) } else { (cols, rows) };
        let a = random_dense(&mut rng, m * k);
        let c0 = random_dense(&mut rng, m * n);
        let bd = b.to_dense();
        let want = reference(m, n, k, |i, l| a[i * k + l] as f64, |l, j| {
            if op == Op::None { bd[l * cols + j] as f64 } else { bd[j * cols + l] as f64 }
        }, alpha as f64, beta as f64, &c0);
        let mut c = if beta == 0.0 { vec![f32::NAN; m * n] } else { c0.clone() };
        dds(op, alpha, &DenseRef::new(&a, m, k).unwrap(), &b, beta, &mut DenseMut::new(&mut c, m, n).unwrap()).unwrap();
        assert_close(&c, &want, &format!("dds op={op:?}"));
    }
}

#[test]
fn sdd_writes_only_the_stored_blocks() {
    let mut rng = Rng(13);
    let (m, n, k) = (64, 96, 40);
    let pattern: BsrMatrix<f32> = random_bsr(&mut rng, m, n, (32, 32), 0.5);
    let a = random_dense(&mut rng, m * k);
    let b = random_dense(&mut rng, k * n);
    let full = reference(m, n, k, |i, l| a[i * k + l] as f64, |l, j| b[l * n + j] as f64, 1.5, 0.0, &[]);
    let before = pattern.clone();
    let mut c = pattern.clone();
    let c0 = before.to_dense();
    sdd(1.5, &DenseRef::new(&a, m, k).unwrap(), &DenseRef::new(&b, k, n).unwrap(), 1.0, &mut c).unwrap();
    // Stored blocks: 1.5 * A*B + C0; absent blocks stay absent (zero in the dense image).
    let dense = c.to_dense();
    let mask = {
        let mut ones = pattern.clone();
        ones.values_mut().iter_mut().for_each(|v| *v = 1.0);
        ones.to_dense()
    };
    let want: Vec<f64> = (0..m * n).map(|i| if mask[i] == 1.0 { full[i] + c0[i] as f64 } else { 0.0 }).collect();
    assert_close(&dense, &want, "sdd");
    assert_eq!(c.row_ptr(), before.row_ptr());
}

#[test]
fn half_inputs_with_f32_output() {
    fn run<T: Element>(seed: u64) {
        let mut rng = Rng(seed);
        let a: BsrMatrix<T> = random_bsr(&mut rng, 64, 64, (16, 32), 0.6);
        let b: Vec<T> = (0..64 * 24).map(|_| T::from_f32(rng.int())).collect();
        let mut c = vec![f32::NAN; 64 * 24];
        dsd(Op::None, 1.0, &a, &DenseRef::new(&b, 64, 24).unwrap(), 0.0, &mut DenseMut::new(&mut c, 64, 24).unwrap()).unwrap();
        let ad = a.to_dense();
        let want = reference(64, 24, 64, |i, l| ad[i * 64 + l] as f64, |l, j| b[l * 24 + j].to_f32() as f64, 1.0, 0.0, &[]);
        assert_close(&c, &want, "half inputs");
    }
    run::<F16>(3);
    run::<Bf16>(5);
}

#[test]
fn a_plan_runs_many_times_and_refuses_another_pattern() {
    let mut rng = Rng(17);
    let a: BsrMatrix<f32> = random_bsr(&mut rng, 64, 64, (32, 32), 0.5);
    let b = random_dense(&mut rng, 64 * 8);
    let mut c = vec![0f32; 64 * 8];
    let plan = Plan::dsd(Op::None, &a, &DenseRef::new(&b, 64, 8).unwrap(), &DenseMut::new(&mut c, 64, 8).unwrap(), Some("cpu")).unwrap();
    assert_eq!(plan.variant(), "cpu");
    assert_eq!(plan.workspace_bytes().unwrap(), 0);
    for round in 0..3 {
        let mut a2 = a.clone();
        a2.values_mut().iter_mut().for_each(|v| *v = rng.int());
        let ad = a2.to_dense();
        let want = reference(64, 8, 64, |i, l| ad[i * 64 + l] as f64, |l, j| b[l * 8 + j] as f64, 1.0, 0.0, &[]);
        c.iter_mut().for_each(|x| *x = f32::NAN);
        plan.run_dsd(Op::None, 1.0, &a2, &DenseRef::new(&b, 64, 8).unwrap(), 0.0, &mut DenseMut::new(&mut c, 64, 8).unwrap()).unwrap();
        assert_close(&c, &want, &format!("plan round {round}"));
    }
    let other = BsrMatrix::<f32>::from_dense(&[1.0; 64 * 64], 64, 64, (32, 32)).unwrap(); // row 0 stored: a differs
    let e = plan
        .run_dsd(Op::None, 1.0, &other, &DenseRef::new(&b, 64, 8).unwrap(), 0.0, &mut DenseMut::new(&mut c, 64, 8).unwrap())
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("a: its pattern"), "{e}");
    let e = plan.run_sdd(1.0, &DenseRef::new(&b, 64, 8).unwrap(), &DenseRef::new(&b, 8, 64).unwrap(), 0.0, &mut a.clone()).unwrap_err();
    assert!(e.message().contains(&format!("computes {:?}", Kind::Dsd)), "{e}");
}

#[test]
fn bad_input_is_a_named_error() {
    // col_idx out of range: the library names the array, the index and the value.
    let e = BsrMatrix::<f32>::new(32, 64, (16, 32), vec![0, 1, 2], vec![0, 5], vec![0.0; 2 * 16 * 32]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("col_idx[1]=5"), "{e}");
    // A block shape that is not one of 16, 32, 64, 128.
    let e = BsrMatrix::<f32>::new(48, 48, (48, 48), vec![0, 0], vec![], vec![]).unwrap_err();
    assert!(e.message().contains("48"), "{e}");
    // Slice lengths are checked before the library is called.
    let e = BsrMatrix::<f32>::new(32, 32, (16, 16), vec![0, 1], vec![0], vec![0.0; 256]).unwrap_err();
    assert!(e.message().contains("row_ptr has 2 entries"), "{e}");
    let e = BsrMatrix::<f32>::new(32, 32, (16, 16), vec![0, 1, 1], vec![0], vec![0.0; 10]).unwrap_err();
    assert!(e.message().contains("values has 10 elements"), "{e}");
    let e = DenseRef::new(&[0f32; 10], 4, 4).unwrap_err();
    assert!(e.message().contains("needs 16 elements, the slice has 10"), "{e}");
    // Shapes that do not fit together: the library names the operand and both shapes.
    let a = BsrMatrix::<f32>::from_dense(&[1.0; 32 * 32], 32, 32, (16, 16)).unwrap();
    let b = vec![0f32; 16 * 4];
    let mut c = vec![0f32; 32 * 4];
    let e = dsd(Op::None, 1.0, &a, &DenseRef::new(&b, 16, 4).unwrap(), 0.0, &mut DenseMut::new(&mut c, 32, 4).unwrap()).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("32x4") && e.message().contains("16x4"), "{e}");
    // An unknown variant is named.
    let e = Plan::dsd(Op::None, &a, &DenseRef::new(&[0f32; 32 * 4], 32, 4).unwrap(), &DenseMut::new(&mut c, 32, 4).unwrap(), Some("warp9"))
        .unwrap_err();
    assert!(e.message().contains("warp9"), "{e}");
}

#[test]
fn device_operands_without_a_gpu_say_so() {
    if sparsek::has_cuda() {
        return; // the pointers below are not device allocations: only meaningful without a GPU
    }
    use sparsek::device::{self, DeviceBsr, DeviceDense};
    use sparsek::DType;
    // Addresses that look like device allocations; nothing dereferences them on the host, and
    // without a GPU nothing is launched.
    let fake = |addr: usize| addr as *mut std::os::raw::c_void;
    let row_ptr = [0i32, 0, 0];
    let a = DeviceBsr { rows: 32, cols: 32, bm: 16, bk: 16, nnzb: 0, row_ptr: row_ptr.as_ptr(), col_idx: fake(0x10000) as *const i32, values: fake(0x20000), dtype: DType::F16, scales: std::ptr::null() };
    let b = DeviceDense { data: fake(0x30000), rows: 32, cols: 8, ld: 8, layout: Layout::RowMajor, dtype: DType::F16, scales: std::ptr::null(), scale_group: 0 };
    let c = DeviceDense { data: fake(0x40000), ..b };
    let e = unsafe { device::dsd(Op::None, 1.0, &a, &b, 0.0, &c, std::ptr::null_mut()) }.unwrap_err();
    // NoDevice on a machine without a GPU; Unsupported, saying so, from a libsparsek built without CUDA.
    let without_cuda = e.status() == Status::Unsupported && e.message().contains("built without CUDA");
    assert!(e.status() == Status::NoDevice || without_cuda, "{e}");
}
