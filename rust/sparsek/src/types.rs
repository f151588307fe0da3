//! Element types, layouts and ops.
use sparsek_sys as sys;

/// Element type of an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    Bf16,
    /// fp8: an input type of DSD and DDS, with fp32 scales ([`E4m3`]).
    E4m3,
}

impl DType {
    pub(crate) fn raw(self) -> sys::sparsek_dtype {
        match self {
            DType::F32 => sys::SPARSEK_F32,
            DType::F16 => sys::SPARSEK_F16,
            DType::Bf16 => sys::SPARSEK_BF16,
            DType::E4m3 => sys::SPARSEK_E4M3,
        }
    }
}

/// Storage order of a dense matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    RowMajor,
    ColMajor,
}

impl Layout {
    pub(crate) fn raw(self) -> sys::sparsek_layout {
        match self {
            Layout::RowMajor => sys::SPARSEK_ROW_MAJOR,
            Layout::ColMajor => sys::SPARSEK_COL_MAJOR,
        }
    }
}

/// Which dimension of a dense matrix holds the tokens of an e4m3 operand, one scale each (the
/// other one is K, the reduction): `Rows` for the A of a DDS (`x * W^T`: x's rows), `Cols` for the
/// B of a DSD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleDim {
    Rows,
    Cols,
}

impl ScaleDim {
    pub(crate) fn raw(self) -> sys::sparsek_scale_dim {
        match self {
            ScaleDim::Rows => sys::SPARSEK_SCALE_ROWS,
            ScaleDim::Cols => sys::SPARSEK_SCALE_COLS,
        }
    }
}

/// `op()` of the sparse operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    None,
    Trans,
}

impl Op {
    pub(crate) fn raw(self) -> sys::sparsek_op {
        match self {
            Op::None => sys::SPARSEK_OP_NONE,
            Op::Trans => sys::SPARSEK_OP_TRANS,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
    impl Sealed for super::E4m3 {}
}

/// The element types sparsek computes with: `f32` (CPU backend), [`F16`], [`Bf16`], and [`E4m3`]
/// codes (whose values also need their scales).
pub trait Element: Copy + Default + sealed::Sealed + 'static {
    const DTYPE: DType;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

/// IEEE half precision, stored as its bits (conversions round to nearest even).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct F16(pub u16);

/// fp8 e4m3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, 0x7F/0xFF are
/// NaN, largest value 448), stored as its bits. An e4m3 operand stands for scale * value: its
/// scales travel beside it ([`BsrMatrix::with_scales`](crate::BsrMatrix), [`DenseRef::with_scales`](crate::DenseRef)).
/// `from_f32` rounds to nearest even and saturates at +-448 (NaN becomes 0x7F, -0 stays -0);
/// `to_f32` is exact.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct E4m3(pub u8);

impl Element for E4m3 {
    const DTYPE: DType = DType::E4m3;
    fn from_f32(x: f32) -> E4m3 {
        let u = x.to_bits();
        let sign = ((u >> 24) & 0x80) as u8;
        let a = u & 0x7fff_ffff;
        if a > 0x7f80_0000 {
            return E4m3(0x7f); // NaN
        }
        if a >= 0x43e0_0000 {
            return E4m3(sign | 0x7e); // >= 448 (infinities too): saturate
        }
        if a < 0x3c80_0000 {
            // Below 2^-6: a multiple of 2^-9; |x| * 2^9 (exact) rounded to an integer, ties to even.
            let v = f32::from_bits(a) * 512.0;
            let mut m = v as u32;
            let frac = v - m as f32;
            if frac > 0.5 || (frac == 0.5 && m & 1 == 1) {
                m += 1;
            }
            return E4m3(sign | m as u8);
        }
        // Keep 3 of the 23 mantissa bits, ties to even; a carry bumps the exponent by itself.
        let exp = (a >> 23) - 120; // rebias 127 -> 7: 1..15 here
        let rest = a & 0xf_ffff;
        let mut code = (exp << 3) | ((a >> 20) & 7);
        if rest > 0x8_0000 || (rest == 0x8_0000 && code & 1 == 1) {
            code += 1;
        }
        E4m3(sign | code as u8)
    }
    fn to_f32(self) -> f32 {
        let sign = ((self.0 & 0x80) as u32) << 24;
        let exp = ((self.0 >> 3) & 0xf) as u32;
        let mant = (self.0 & 7) as u32;
        if exp == 0xf && mant == 7 {
            return f32::from_bits(sign | 0x7fc0_0000);
        }
        if exp == 0 {
            let v = mant as f32 * 0.001_953_125; // mant * 2^-9
            return if sign != 0 { -v } else { v };
        }
        f32::from_bits(sign | ((exp + 120) << 23) | (mant << 20))
    }
}

/// bfloat16, stored as its bits (conversions round to nearest even).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
    fn from_f32(x: f32) -> Bf16 {
        let u = x.to_bits();
        if u & 0x7fff_ffff > 0x7f80_0000 {
            return Bf16(((u >> 16) | 0x40) as u16); // quiet NaN
        }
        let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1));
        Bf16((rounded >> 16) as u16)
    }
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl Element for F16 {
    const DTYPE: DType = DType::F16;
    fn from_f32(x: f32) -> F16 {
        let u = x.to_bits();
        let sign = ((u >> 16) & 0x8000) as u16;
        let a = u & 0x7fff_ffff;
        if a > 0x7f80_0000 {
            return F16(sign | 0x7e00); // NaN
        }
        if a >= 0x477f_f000 {
            return F16(sign | 0x7c00); // overflow (after rounding) -> inf
        }
        if a < 0x3880_0000 {
            // Subnormal half or zero: in units of 2^-24, rounded to nearest even by the FPU
            // (adding 0.5 moves the value's ulp to 2^-24).
            let v = f32::from_bits(a) + 0.5;
            return F16(sign | (v.to_bits() - 0x3f00_0000) as u16);
        }
        let odd = (a >> 13) & 1;
        // Rebias the exponent (-112 << 23) and round the 13 dropped bits to nearest even.
        let r = a.wrapping_add(0xc800_0fff).wrapping_add(odd);
        F16(sign | (r >> 13) as u16)
    }
    fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let mant = h & 0x3ff;
        if exp == 0x1f {
            return f32::from_bits(sign | 0x7f80_0000 | (mant << 13));
        }
        if exp == 0 {
            let v = mant as f32 * 5.960_464_5e-8; // mant * 2^-24
            return if sign != 0 { -v } else { v };
        }
        f32::from_bits(sign | ((exp + 112) << 23) | (mant << 13))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trips_and_rounds_to_nearest_even() {
        for &x in &[0.0f32, 1.0, -2.5, 65504.0, 6.103_515_6e-5, 5.960_464_5e-8, 0.333_333_34] {
            let h = F16::from_f32(x);
            assert!((h.to_f32() - x).abs() <= x.abs() * 1e-3 + 1e-7, "{x} -> {h:?} -> {}", h.to_f32());
        }
        assert_eq!(F16::from_f32(1.0).0, 0x3c00);
        assert_eq!(F16::from_f32(65520.0).0, 0x7c00); // rounds up to inf
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even mantissa (1.0)
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0).0, 0x3c00);
        assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
        assert_eq!(Bf16::from_f32(-3.0).to_f32(), -3.0);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn e4m3_codes_round_trip_and_round_to_nearest_even() {
        for c in 0..=255u8 {
            let x = E4m3(c).to_f32();
            if c & 0x7f == 0x7f {
                assert!(x.is_nan(), "code {c}");
                continue;
            }
            assert_eq!(E4m3::from_f32(x).0, c, "code {c} -> {x}");
        }
        assert_eq!(E4m3(0x7e).to_f32(), 448.0);
        assert_eq!(E4m3(0x01).to_f32(), 1.0 / 512.0);
        assert_eq!(E4m3::from_f32(1e9).0, 0x7e);
        assert_eq!(E4m3::from_f32(f32::NEG_INFINITY).0, 0xfe);
        assert_eq!(E4m3::from_f32(f32::NAN).0, 0x7f);
        assert_eq!(E4m3::from_f32(-0.0).0, 0x80);
        assert_eq!(E4m3::from_f32(1.0625).0, 0x38); // 1 + 1/16: halfway between 1 and 1.125, to even
        assert_eq!(E4m3::from_f32(2.5 / 512.0).0, 0x02); // halfway between two subnormals, to even
    }
}
