//! What the integration tests share: a small deterministic generator (xorshift64*), so the tests
//! need no crate. Each test file uses some of its methods.
#![allow(dead_code)]

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// An integer in [-4, 4] (products and sums of a few stay exact in f32).
    pub fn int(&mut self) -> f32 {
        (self.next() % 9) as f32 - 4.0
    }
    /// A real in [-1, 1).
    pub fn real(&mut self) -> f32 {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
    }
    /// True with probability p.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    /// An index in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
