//! fp8 (e4m3) through the safe API on host operands: quantization (the library's bits, the
//! crate's own conversions), exact products against an f64 reference, and the named errors of
//! missing or bad scales.
use sparsek::{
    dequantize_dense, dsd, quantize_dense, scale_count, BsrMatrix, DenseMut, DenseRef, E4m3, Element, Op,
    Plan, ScaleDim, Status,
};

/// A 64 x 96 matrix of 32 x 32 blocks (4 of 6 stored), integers in [-4, 4] with a 448 in every
/// block, so that every block's scale is exactly 1 and its values are e4m3 codes.
fn exact_matrix() -> BsrMatrix<'static, f32> {
    let row_ptr = vec![0, 2, 4];
    let col_idx = vec![0, 2, 1, 2];
    let values: Vec<f32> = (0..4 * 32 * 32)
        .map(|i| if i % 1024 == 5 { 448.0 } else { ((i * 7 + i / 13) % 9) as f32 - 4.0 })
        .collect();
    BsrMatrix::new(64, 96, (32, 32), row_ptr, col_idx, values).unwrap()
}

#[test]
fn quantize_gives_scale_one_and_exact_codes() {
    let a = exact_matrix();
    let q = a.quantize().unwrap();
    assert_eq!(q.scales(), &[1.0; 4]);
    for (x, c) in a.values().iter().zip(q.values()) {
        assert_eq!(*c, E4m3::from_f32(*x), "the library's code of {x} is the crate's");
        assert_eq!(c.to_f32(), *x);
    }
    let d: BsrMatrix<f32> = q.dequantize().unwrap();
    assert_eq!(d.values(), a.values());
    assert_eq!(q.to_dense(), a.to_dense());
}

#[test]
fn quantize_scales_by_the_block_maximum() {
    let mut a = exact_matrix().into_owned();
    a.values_mut()[1024..2048].iter_mut().for_each(|v| *v *= 0.001); // block 1: amax 0.448
    let q = a.quantize().unwrap();
    assert_eq!(q.scales()[1], (448.0f32 * 0.001) / 448.0);
    let top = q.values()[1024..2048].iter().map(|c| c.to_f32().abs()).fold(0f32, f32::max);
    assert_eq!(top, 448.0);
}

#[test]
fn products_are_exact() {
    let a = exact_matrix().quantize().unwrap();
    let dense_a = a.to_dense(); // 64 x 96
    // DSD: C (64 x 5) = A (64 x 96) * B (96 x 5), B's scales per column.
    let b: Vec<f32> = (0..96 * 5).map(|i| if i < 5 { 448.0 } else { (i % 9) as f32 - 4.0 }).collect();
    let (bq, bs) = quantize_dense(&DenseRef::new(&b, 96, 5).unwrap(), ScaleDim::Cols, 0).unwrap();
    assert_eq!(bs, vec![1.0; 5]);
    let bref = DenseRef::new(&bq, 96, 5).unwrap().with_scales(&bs, 0);
    let mut c = vec![f32::NAN; 64 * 5];
    dsd(Op::None, 2.0, &a, &bref, 0.0, &mut DenseMut::new(&mut c, 64, 5).unwrap()).unwrap();
    for i in 0..64 {
        for j in 0..5 {
            let want: f64 = (0..96).map(|k| dense_a[i * 96 + k] as f64 * b[k * 5 + j] as f64).sum();
            assert_eq!(c[i * 5 + j] as f64, 2.0 * want, "C[{i}, {j}]");
        }
    }
    // DDS: Y (3 x 64) = X (3 x 96) * A^T, X's scales per row in groups of 128 (one group here).
    let x: Vec<f32> = (0..3 * 96).map(|i| if i % 96 == 0 { 448.0 } else { (i % 5) as f32 - 2.0 }).collect();
    let (xq, xs) = quantize_dense(&DenseRef::new(&x, 3, 96).unwrap(), ScaleDim::Rows, 128).unwrap();
    assert_eq!(xs.len(), scale_count(3, 96, 128).unwrap());
    let xref = DenseRef::new(&xq, 3, 96).unwrap().with_scales(&xs, 128);
    let mut y = vec![0f32; 3 * 64];
    let plan = Plan::dds(Op::Trans, &xref, &a, &DenseMut::new(&mut y, 3, 64).unwrap(), None).unwrap();
    plan.run_dds(Op::Trans, 1.0, &xref, &a, 0.0, &mut DenseMut::new(&mut y, 3, 64).unwrap()).unwrap();
    for i in 0..3 {
        for j in 0..64 {
            let want: f64 = (0..96).map(|k| x[i * 96 + k] as f64 * dense_a[j * 96 + k] as f64).sum();
            assert_eq!(y[i * 64 + j] as f64, want, "Y[{i}, {j}]");
        }
    }
    let back: Vec<f32> = dequantize_dense(&xref, ScaleDim::Rows).unwrap();
    assert_eq!(back, x);
}

#[test]
fn bad_scales_are_named() {
    let a = exact_matrix();
    let q = a.quantize().unwrap();
    // An e4m3 matrix without scales, with the wrong count, with a negative one.
    let e = BsrMatrix::new(64, 96, (32, 32), q.row_ptr(), q.col_idx(), q.values()).unwrap_err();
    assert!(e.message().contains("scales is null but the values are e4m3"), "{e}");
    let e = BsrMatrix::with_scales(64, 96, (32, 32), q.row_ptr(), q.col_idx(), q.values(), vec![1.0; 3]).unwrap_err();
    assert!(e.message().contains("scales has 3 entries but the matrix stores nnzb=4"), "{e}");
    let e = BsrMatrix::with_scales(64, 96, (32, 32), q.row_ptr(), q.col_idx(), q.values(), vec![1.0, -1.0, 1.0, 1.0])
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("scales[1]=-1 is negative"), "{e}");
    // A dense input's scales: too few for its role, missing, bad group; mixing dtypes.
    let b = vec![E4m3::from_f32(1.0); 96 * 5];
    let short = [1.0f32; 4];
    let mut c = vec![0f32; 64 * 5];
    let e = dsd(Op::None, 1.0, &q, &DenseRef::new(&b, 96, 5).unwrap().with_scales(&short, 0), 0.0,
                &mut DenseMut::new(&mut c, 64, 5).unwrap()).unwrap_err();
    assert!(e.message().contains("B scales has 4 entries but B (96x5, scale_group 0) needs 5"), "{e}");
    let e = dsd(Op::None, 1.0, &q, &DenseRef::new(&b, 96, 5).unwrap(), 0.0, &mut DenseMut::new(&mut c, 64, 5).unwrap())
        .unwrap_err();
    assert!(e.message().contains("B scales is null but B is e4m3"), "{e}");
    let e = scale_count(5, 96, 64).unwrap_err();
    assert!(e.message().contains("scale_group=64"), "{e}");
    // (A and B of one product share an element type in this API: mixing e4m3 with f32 does not compile.)
    let e = quantize_dense(&DenseRef::new(&[f32::NAN, 1.0], 1, 2).unwrap(), ScaleDim::Rows, 0).unwrap_err();
    assert!(e.message().contains("in(0, 0)=nan is not finite"), "{e}");
}
