//! Counter-based random numbers: Philox4x32-10 (Salmon et al., SC 2011), the generator of
//! Random123, cuRAND and JAX. There is no global state: every value is a pure function of a
//! key and the element's index, so results are bit-reproducible on any number of threads and
//! any device, and a tensor's first elements do not depend on its total size.

use rayon::prelude::*;

use crate::cpu::PAR_MIN;
use crate::error::KernelError;
use crate::tensor::{checked_numel, DType, Tensor};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// One Philox4x32-10 block: four 32-bit outputs for a 128-bit counter and a 64-bit key.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The block for element `i` of a stream: counter `(i mod 2³², i div 2³², 0, 0)`.
fn block(i: u64, key: [u32; 2]) -> [u32; 4] {
    philox4x32_10([i as u32, (i >> 32) as u32, 0, 0], key)
}

/// The key of the random stream for a value path (such as `"w1"` or `"layers.0.w"`) under a
/// seed: FNV-1a 64 of the path, xor the seed, split into low and high halves.
pub fn stream_key(seed: u64, path: &str) -> [u32; 2] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in path.as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let k = h ^ seed;
    [k as u32, (k >> 32) as u32]
}

/// A new key derived from `key` and a number, for example a step counter, so that a loop can
/// draw fresh values each iteration. Uses one Philox block on a counter no stream element uses.
pub fn fold_in(key: [u32; 2], data: u64) -> [u32; 2] {
    let r = philox4x32_10([data as u32, (data >> 32) as u32, 0x6d73_6c00, 1], key);
    [r[0], r[1]]
}

/// A uniform in `[0, 1)` with 24 random bits (exactly representable in f32).
fn unit_f32(w: u32) -> f64 {
    (w >> 8) as f64 * (1.0 / (1u64 << 24) as f64)
}

/// A uniform in `[0, 1)` with 53 random bits.
fn unit_f64(lo: u32, hi: u32) -> f64 {
    let bits = ((hi as u64) << 32 | lo as u64) >> 11;
    bits as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Part of a tensor: for each dim, the first index and the count (`Region::whole` is all of it).
/// Element `i` of the whole tensor always draws counter `i`, so a region holds exactly the
/// values the whole tensor has there (a rank's block of a sharded `init`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub shape: Vec<usize>,
    pub start: Vec<usize>,
    pub len: Vec<usize>,
}

impl Region {
    pub fn whole(shape: &[usize]) -> Region {
        Region { shape: shape.to_vec(), start: vec![0; shape.len()], len: shape.to_vec() }
    }

    /// The counter (global row-major index) of the region's `j`-th element.
    fn global(&self, mut j: u64) -> u64 {
        let mut g = 0u64;
        let mut stride = 1u64;
        for d in (0..self.shape.len()).rev() {
            let n = self.len[d].max(1) as u64;
            g += (self.start[d] as u64 + j % n) * stride;
            j /= n;
            stride *= self.shape[d] as u64;
        }
        g
    }

    fn is_whole(&self) -> bool {
        self.len == self.shape
    }
}

/// Fills the region's values with `f(block of element i)`, in parallel for large regions.
fn generate<T: Send, F: Fn([u32; 4]) -> T + Sync + Send>(
    r: &Region,
    key: [u32; 2],
    f: F,
) -> Result<Vec<T>, KernelError> {
    let n = checked_numel(&r.len)?;
    checked_numel(&r.shape)?;
    let at = |j: u64| if r.is_whole() { j } else { r.global(j) };
    Ok(if n >= PAR_MIN {
        (0..n as u64).into_par_iter().map(|j| f(block(at(j), key))).collect()
    } else {
        (0..n as u64).map(|j| f(block(at(j), key))).collect()
    })
}

/// Uniform values in `[lo, hi)`. Element `i` uses counter `i`. For `i32` the values are
/// `floor` of a uniform in `[lo, hi)`; for bool they are `uniform < 0.5`.
pub fn uniform(dtype: DType, shape: &[usize], key: [u32; 2], lo: f64, hi: f64) -> Result<Tensor, KernelError> {
    uniform_region(dtype, &Region::whole(shape), key, lo, hi)
}

/// The values of `uniform` over a region of the whole tensor.
pub fn uniform_region(dtype: DType, r: &Region, key: [u32; 2], lo: f64, hi: f64) -> Result<Tensor, KernelError> {
    let shape = &r.len;
    let scale = hi - lo;
    Ok(match dtype {
        DType::F32 => {
            let (lo32, scale32) = (lo as f32, scale as f32);
            let v = generate(r, key, |b| {
                let u = lo32 + scale32 * unit_f32(b[0]) as f32;
                // Rounding can reach `hi`; keep the interval half-open.
                if u >= hi as f32 && scale32 > 0.0 {
                    f32::from_bits((hi as f32).to_bits() - 1)
                } else {
                    u
                }
            })?;
            Tensor::from_parts(shape.to_vec(), v)
        }
        DType::F64 => {
            let v = generate(r, key, |b| lo + scale * unit_f64(b[0], b[1]))?;
            Tensor::from_parts(shape.to_vec(), v)
        }
        DType::I32 => {
            let v = generate(r, key, |b| (lo + scale * unit_f64(b[0], b[1])).floor() as i32)?;
            Tensor::from_parts(shape.to_vec(), v)
        }
        DType::Bool => {
            let v = generate(r, key, |b| unit_f64(b[0], b[1]) < 0.5)?;
            Tensor::from_parts(shape.to_vec(), v)
        }
        DType::Bf16 | DType::F16 => uniform_region(DType::F32, r, key, lo, hi)?.cast(dtype),
    })
}

/// Normal values with the given mean and standard deviation: Box–Muller on two uniforms from
/// the one Philox block of each element. Non-float dtypes receive the f64 values cast.
pub fn normal(dtype: DType, shape: &[usize], key: [u32; 2], mean: f64, std: f64) -> Result<Tensor, KernelError> {
    normal_region(dtype, &Region::whole(shape), key, mean, std)
}

/// The values of `normal` over a region of the whole tensor.
pub fn normal_region(dtype: DType, r: &Region, key: [u32; 2], mean: f64, std: f64) -> Result<Tensor, KernelError> {
    let shape = &r.len;
    let value = move |b: [u32; 4]| {
        // u1 lies in (0, 1], so its logarithm is finite.
        let u1 = 1.0 - unit_f64(b[0], b[1]);
        let u2 = unit_f64(b[2], b[3]);
        let r = (-2.0 * u1.ln()).sqrt();
        mean + std * r * (std::f64::consts::TAU * u2).cos()
    };
    // f32 values are rounded as they are made: no f64 copy of the whole tensor is ever held.
    Ok(match dtype {
        DType::F32 => Tensor::from_parts(shape.to_vec(), generate(r, key, |b| value(b) as f32)?),
        _ => Tensor::from_parts(shape.to_vec(), generate(r, key, value)?).cast(dtype),
    })
}

/// A uniformly random permutation of `0..n` (Fisher–Yates; step `i` uses counter `i`).
pub fn permutation(n: usize, key: [u32; 2]) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let b = block(i as u64, key);
        let r = (b[1] as u64) << 32 | b[0] as u64;
        // Multiply-high maps 64 random bits to 0..=i with negligible bias.
        let j = ((r as u128 * (i as u128 + 1)) >> 64) as usize;
        p.swap(i, j);
    }
    p
}

/// Bool values that are true with probability `p`.
pub fn bernoulli(shape: &[usize], key: [u32; 2], p: f64) -> Result<Tensor, KernelError> {
    let v = generate(&Region::whole(shape), key, |b| unit_f64(b[0], b[1]) < p)?;
    Ok(Tensor::from_parts(shape.to_vec(), v))
}

#[cfg(test)]
mod region_tests {
    use super::*;

    #[test]
    fn a_region_holds_the_whole_tensors_values_there() {
        let key = stream_key(7, "w");
        let whole = normal(DType::F32, &[4, 6], key, 0.0, 1.0).unwrap();
        let r = Region { shape: vec![4, 6], start: vec![2, 3], len: vec![2, 3] };
        let part = normal_region(DType::F32, &r, key, 0.0, 1.0).unwrap();
        let w = whole.as_f32().unwrap();
        let want: Vec<f32> = (2..4).flat_map(|i| (3..6).map(move |j| w[i * 6 + j])).collect();
        assert_eq!(part.as_f32().unwrap(), &want[..]);
        let u = uniform_region(DType::F64, &r, key, -1.0, 1.0).unwrap();
        let uw = uniform(DType::F64, &[4, 6], key, -1.0, 1.0).unwrap();
        let uw = uw.as_f64().unwrap();
        let want: Vec<f64> = (2..4).flat_map(|i| (3..6).map(move |j| uw[i * 6 + j])).collect();
        assert_eq!(u.as_f64().unwrap(), &want[..]);
    }
}
