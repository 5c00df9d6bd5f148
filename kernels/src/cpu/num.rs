//! Numeric element traits shared by the CPU kernels: `Num` for f32/f64/i32, `Float` for f32/f64.

use crate::tensor::Element;

/// Arithmetic element types. Integer arithmetic wraps (msl checks ranges in its type system,
/// and a kernel must never panic on data).
pub(crate) trait Num:
    Element + std::ops::Add<Output = Self> + std::ops::Sub<Output = Self> + std::ops::Mul<Output = Self>
{
    fn add_w(self, o: Self) -> Self;
    fn mul_w(self, o: Self) -> Self;
    fn abs_w(self) -> Self;
    /// -1, 0 or 1 (NaN stays NaN).
    fn sign(self) -> Self;
    /// The larger value; NaN wins, like `numpy.maximum`.
    fn max_p(self, o: Self) -> Self;
    /// The smaller value; NaN wins, like `numpy.minimum`.
    fn min_p(self, o: Self) -> Self;
    fn is_nan_v(self) -> bool;
    fn from_usize(n: usize) -> Self;
}

macro_rules! impl_num_float {
    ($t:ty) => {
        impl Num for $t {
            #[inline(always)]
            fn add_w(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul_w(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn abs_w(self) -> Self {
                self.abs()
            }
            #[inline(always)]
            fn sign(self) -> Self {
                if self > 0.0 {
                    1.0
                } else if self < 0.0 {
                    -1.0
                } else {
                    self
                }
            }
            #[inline(always)]
            fn max_p(self, o: Self) -> Self {
                if self.is_nan() || self >= o {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn min_p(self, o: Self) -> Self {
                if self.is_nan() || self <= o {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn is_nan_v(self) -> bool {
                self.is_nan()
            }
            #[inline(always)]
            fn from_usize(n: usize) -> Self {
                n as $t
            }
        }
    };
}
impl_num_float!(f32);
impl_num_float!(f64);

impl Num for i32 {
    #[inline(always)]
    fn add_w(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn mul_w(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
    #[inline(always)]
    fn abs_w(self) -> Self {
        self.wrapping_abs()
    }
    #[inline(always)]
    fn sign(self) -> Self {
        self.signum()
    }
    #[inline(always)]
    fn max_p(self, o: Self) -> Self {
        self.max(o)
    }
    #[inline(always)]
    fn min_p(self, o: Self) -> Self {
        self.min(o)
    }
    #[inline(always)]
    fn is_nan_v(self) -> bool {
        false
    }
    #[inline(always)]
    fn from_usize(n: usize) -> Self {
        n as i32
    }
}

/// Floating-point element types.
pub(crate) trait Float: Num + std::ops::Div<Output = Self> + std::ops::Neg<Output = Self> {
    const NEG_INFINITY: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn floor(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn rem(self, o: Self) -> Self;
    fn is_finite(self) -> bool;
    fn from_f64c(v: f64) -> Self;
}

macro_rules! impl_float {
    ($t:ty, $exp:path, $tanh:path, $erf:path, $rem:path) => {
        impl Float for $t {
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            #[inline(always)]
            fn rem(self, o: Self) -> Self {
                $rem(self, o)
            }
            #[inline(always)]
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            #[inline(always)]
            fn from_f64c(v: f64) -> Self {
                v as $t
            }
        }
    };
}
impl_float!(f32, crate::math::exp_f32, crate::math::tanh_f32, libm::erff, crate::math::rem_floor_f32);
impl_float!(f64, f64::exp, f64::tanh, libm::erf, crate::math::rem_floor_f64);

/// Sum of a contiguous slice with eight accumulators in blocks and pairwise combination of
/// blocks (the scheme NumPy uses), so that long f32 sums keep their accuracy.
#[inline(always)]
pub(crate) fn sum_contig<T: Num>(x: &[T]) -> T {
    const BLOCK: usize = 128;
    if x.len() <= BLOCK {
        let mut acc = [T::zero(); 8];
        let chunks = x.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for k in 0..8 {
                acc[k] = acc[k].add_w(c[k]);
            }
        }
        let mut s = ((acc[0].add_w(acc[1])).add_w(acc[2].add_w(acc[3])))
            .add_w((acc[4].add_w(acc[5])).add_w(acc[6].add_w(acc[7])));
        for &v in rest {
            s = s.add_w(v);
        }
        s
    } else {
        let half = (x.len() / 2).div_ceil(8) * 8;
        sum_contig(&x[..half]).add_w(sum_contig(&x[half..]))
    }
}
