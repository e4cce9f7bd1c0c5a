//! Host-side data: random inputs, encoding to and decoding from a dtype's bytes, poison values.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use trident_core::ir::DType;

/// Inputs at least this long are converted on every core (a benchmark's MoE weights are
/// hundreds of millions of values, converted while the GPU waits).
const PARALLEL: usize = 1 << 20;

/// `f` over `items` in chunks, one per core when `parallel`, concatenated in order.
fn chunked<I: Sync, T: Send>(items: &[I], parallel: bool, f: impl Fn(&[I]) -> Vec<T> + Sync) -> Vec<T> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !parallel || cores == 1 || items.is_empty() {
        return f(items);
    }
    let parts: Vec<Vec<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = items.chunks(items.len().div_ceil(cores)).map(|c| s.spawn(|| f(c))).collect();
        handles.into_iter().map(|h| h.join().expect("a conversion thread")).collect()
    });
    parts.into_iter().flatten().collect()
}

/// Encodes values into `d`'s little-endian memory representation (rounding to nearest).
pub fn encode(values: &[f64], d: DType) -> Vec<u8> {
    chunked(values, values.len() >= PARALLEL, |v| encode_serial(v, d))
}

fn encode_serial(values: &[f64], d: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * d.size_bytes() as usize);
    for &v in values {
        match d {
            DType::F16 => out.extend(f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F64 => out.extend(v.to_le_bytes()),
            DType::F8E4M3FN | DType::F8E5M2 => {
                out.push(crate::ops::values::encode(crate::ops::values::V::F(v), d) as u8)
            }
            DType::I1 | DType::I8 | DType::U8 => out.push(v as i64 as u8),
            DType::I16 | DType::U16 => out.extend((v as i64 as u16).to_le_bytes()),
            DType::I32 | DType::U32 => out.extend((v as i64 as u32).to_le_bytes()),
            DType::I64 | DType::U64 => out.extend((v as i64).to_le_bytes()),
        }
    }
    out
}

/// Decodes `d`'s memory representation into f64 values.
pub fn decode(bytes: &[u8], d: DType) -> Vec<f64> {
    let size = d.size_bytes() as usize;
    bytes
        .chunks_exact(size)
        .map(|c| match d {
            DType::F16 => f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::BF16 => bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::F64 => f64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
            DType::F8E4M3FN | DType::F8E5M2 => crate::ops::values::decode(c[0] as u64, d).f(),
            DType::I8 => c[0] as i8 as f64,
            DType::I1 | DType::U8 => c[0] as f64,
            DType::I16 => i16::from_le_bytes([c[0], c[1]]) as f64,
            DType::U16 => u16::from_le_bytes([c[0], c[1]]) as f64,
            DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64,
            DType::U64 => u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64,
        })
        .collect()
}

/// Values exactly representable in `d`: what the device sees, so references start from them.
pub fn round_to(values: &[f64], d: DType) -> Vec<f64> {
    chunked(values, values.len() >= PARALLEL, |v| decode(&encode_serial(v, d), d))
}

/// `n` uniform values in `[-1, 1)`, rounded to `d` (long inputs drawn on every core, from
/// generators seeded by `rng`).
pub fn random(n: usize, d: DType, rng: &mut rand::rngs::StdRng) -> Vec<f64> {
    if n < PARALLEL {
        let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        return round_to(&v, d);
    }
    let seeds: Vec<u64> = (0..n.div_ceil(PARALLEL)).map(|_| rng.gen()).collect();
    let mut v = chunked(&seeds, true, |part| {
        part.iter()
            .flat_map(|&seed| {
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                (0..PARALLEL).map(move |_| r.gen_range(-1.0..1.0))
            })
            .collect()
    });
    v.truncate(n);
    round_to(&v, d)
}

/// The byte pattern outputs are filled with before a run: NaN for floats, so that an element the
/// kernel did not write fails the check.
pub fn poison(d: DType) -> Vec<u8> {
    if d.is_float() {
        encode(&[f64::NAN], d)
    } else {
        vec![0xA5; d.size_bytes() as usize]
    }
}

/// A deterministic per-case generator derived from the run's seed.
pub fn case_rng(seed: u64, case_index: usize) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed ^ (case_index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The channels of one FP8 scale block (DeepSeek-V3's 128).
pub const QUANT_BLOCK: usize = 128;

/// A row quantized as the library's FP8 kernels quantize it (`docs/SEMANTICS.md`,
/// "Quantization"), in f32 arithmetic: each block of [`QUANT_BLOCK`] values' scale, and the
/// row's E4M3FN values.
pub fn quantize_row(x: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (mut scales, mut q) = (Vec::new(), Vec::with_capacity(x.len()));
    for block in x.chunks(QUANT_BLOCK) {
        let amax = block.iter().fold(0.0f32, |m, &v| m.max((v as f32).abs()));
        let inv = if amax > 0.0 { 448.0f32 / amax } else { 0.0 };
        scales.push((amax / 448.0f32) as f64);
        let scaled: Vec<f64> = block.iter().map(|&v| ((v as f32) * inv) as f64).collect();
        q.extend(round_to(&scaled, DType::F8E4M3FN));
    }
    (scales, q)
}

/// A row as an FP8 GEMM reads it after [`quantize_row`]: each E4M3FN value times its block's
/// scale.
pub fn fake_quantized(x: &[f64]) -> Vec<f64> {
    let (scales, q) = quantize_row(x);
    q.iter().enumerate().map(|(i, v)| v * scales[i / QUANT_BLOCK]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let v = [0.5, -1.25, 3.0];
            assert_eq!(decode(&encode(&v, d), d), v);
        }
        assert!(decode(&poison(DType::BF16), DType::BF16)[0].is_nan());
        assert!(decode(&poison(DType::F16), DType::F16)[0].is_nan());
    }
}
