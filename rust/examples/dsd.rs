//! A block-sparse product from Rust: build a BSR matrix, multiply it (one-shot and through a
//! plan), and see a bad argument come back as a named error.
//!
//!     cargo run --example dsd        (in rust/; finds libsparsek as the crate's build.rs says)
use sparsek::{dsd, BsrMatrix, DenseMut, DenseRef, Op, Plan};

fn main() -> sparsek::Result<()> {
    let (m, k, n) = (256, 256, 64);
    // Keep the left half of the columns: half of the 64x64 blocks are stored.
    let dense: Vec<f32> = (0..m * k).map(|i| if i % k < k / 2 { ((i % 7) as f32) - 3.0 } else { 0.0 }).collect();
    let a: BsrMatrix<f32> = BsrMatrix::from_dense(&dense, m, k, (64, 64))?;
    println!("A: {}x{}, {} of {} blocks stored", a.rows(), a.cols(), a.nnzb(), (m / 64) * (k / 64));

    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32).collect();
    let mut c = vec![0f32; m * n];
    dsd(Op::None, 1.0, &a, &DenseRef::new(&b, k, n)?, 0.0, &mut DenseMut::new(&mut c, m, n)?)?;
    let want: f32 = (0..k).map(|l| dense[l] * b[l * n]).sum();
    println!("one-shot: C[0][0] = {} (expected {want})", c[0]);
    assert_eq!(c[0], want, "integer inputs: the product is exact");

    // Plan once, run many times (the values may change; the pattern and shapes may not).
    let plan = Plan::dsd(Op::None, &a, &DenseRef::new(&b, k, n)?, &DenseMut::new(&mut c, m, n)?, None)?;
    for _ in 0..3 {
        plan.run_dsd(Op::None, 2.0, &a, &DenseRef::new(&b, k, n)?, 0.0, &mut DenseMut::new(&mut c, m, n)?)?;
    }
    println!("plan ({} variant): C[0][0] = {} (expected {})", plan.variant(), c[0], 2.0 * want);
    assert_eq!(c[0], 2.0 * want);

    // Bad input fails loudly, naming the argument and the value.
    let short = vec![0f32; k * n - 1];
    match DenseRef::new(&short, k, n) {
        Err(e) => println!("error, as expected: {e}"),
        Ok(_) => panic!("a short slice must be refused"),
    }
    Ok(())
}
