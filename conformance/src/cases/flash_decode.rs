//! Flash decoding over a contiguous and a paged KV cache.

use crate::host::{random, round_to};
use crate::reference;
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use rand::seq::SliceRandom;
use rand::Rng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_kernels::flash_decode::{DecodeShape, FlashDecode, KvScales};
use trident_kernels::DeviceCtx;

struct FlashDecodeCase;

/// A case's shape: `[B, Nq, Hq, Hkv, D, S, page, first length]` (`flash_decode_dist`'s too,
/// `S` a shard's keys per sequence).
pub(crate) fn decode_shape(s: &[usize]) -> DecodeShape {
    DecodeShape { batch: s[0], q_len: s[1], heads_q: s[2], heads_kv: s[3], head_dim: s[4], cache_len: s[5] }
}

pub(crate) fn paged(case: &Case) -> bool {
    matches!(case.variant, "paged" | "paged-staged" | "kv-e5m2-paged")
}

/// The cache's element type of a case: an 8-bit float in the `kv-*` variants, else the
/// queries' type.
fn kv_type(case: &Case) -> DType {
    match case.variant {
        "kv-e4m3" => DType::F8E4M3FN,
        "kv-e5m2-paged" => DType::F8E5M2,
        _ => case.dtype,
    }
}

/// The dequantization scales of the 8-bit caches (`KvScales`): neither a power of two, so a
/// scale applied twice, to the wrong operand or not at all fails the check.
const SCALES: KvScales = KvScales { k: 0.37, v: 1.9 };

/// The scales a case runs with: [`SCALES`] for an 8-bit cache, 1 and 1 otherwise.
fn scales(case: &Case) -> KvScales {
    if kv_type(case) == case.dtype {
        KvScales::default()
    } else {
        SCALES
    }
}

/// Pages in a paged case's pool: every sequence's, and as many again unused.
pub(crate) fn pool_pages(s: &[usize]) -> usize {
    2 * s[0] * (s[5] / s[6])
}

/// A block table of shape `s`: each sequence's `S / P` pages drawn from a shuffled pool of
/// [`pool_pages`].
pub(crate) fn block_table(s: &[usize], rng: &mut rand::rngs::StdRng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..pool_pages(s)).collect();
    order.shuffle(rng);
    order.truncate(s[0] * (s[5] / s[6]));
    order
}

impl Operation for FlashDecodeCase {
    fn name(&self) -> &'static str {
        "flash_decode"
    }

    fn variants(&self, dtype: DType) -> &'static [&'static str] {
        // `narrow`: contiguous, K and V moved 8 bytes a thread (`FlashDecode::wide` off; the
        // default moves 16 at 16-row tiles of 16-bit types). `staged`, `staged3`: contiguous,
        // no prefetching, K and V in a ring of two or three shared stages where the target
        // copies by `cp.async` (`FlashDecode::stages`); `paged-staged`: paged, two stages (the
        // copies' addresses read the block table ahead). `kv-e4m3`: contiguous, `kv-e5m2-paged`:
        // paged, the cache in 8-bit floats with per-tensor scales (16-bit queries only). `pdl`:
        // contiguous, the combine a programmatic dependent of the split stage
        // (`FlashDecode::programmatic`: on sm_90+ it starts early and waits for the split's end).
        if dtype.size_bytes() == 2 {
            &["contiguous", "paged", "narrow", "staged", "staged3", "paged-staged", "kv-e4m3", "kv-e5m2-paged", "pdl"]
        } else {
            &["contiguous", "paged", "narrow", "staged", "staged3", "paged-staged", "pdl"]
        }
    }

    fn input_types(&self, case: &Case, inputs: usize) -> Vec<DType> {
        let kv = kv_type(case);
        let mut t = vec![case.dtype, kv, kv, DType::I32, DType::I32];
        t.truncate(inputs);
        t
    }

    fn distributed(&self) -> bool {
        false
    }

    /// Sequence lengths 1, 5 of which 4 new tokens (causality is most of the result), 17 (and
    /// the cache's whole 128), 1027 with 3 new tokens and 4099; query heads per KV head 1, 2,
    /// 4 and 16; head dimensions 64 and 128; pages of 16 to 256 keys.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![
            vec![1, 1, 1, 1, 64, 64, 16, 1],
            vec![1, 4, 4, 2, 64, 64, 16, 5],
            vec![2, 1, 8, 2, 64, 128, 32, 17],
            vec![1, 3, 16, 1, 128, 1088, 64, 1027],
            vec![1, 1, 2, 1, 64, 4352, 256, 4099],
        ]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let s = &case.shape;
        let (b, nq, hq, hkv, d, cap, page) = (s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
        let q = random(b * nq * hq * d, case.dtype, rng);
        let lens: Vec<usize> = (0..b).map(|i| if i == 0 { s[7] } else { rng.gen_range(nq..=cap) }).collect();
        let mut inputs = vec![q.clone()];
        let expected;
        // The cache as stored (in 8-bit floats: values up to 4, the scales' multiples of
        // which the reference attends to), and as it counts.
        let kv = kv_type(case);
        let cache = |n: usize, rng: &mut rand::rngs::StdRng| {
            let spread = if kv == case.dtype { 1.0 } else { 4.0 };
            round_to(&random(n, DType::F64, rng).iter().map(|x| x * spread).collect::<Vec<_>>(), kv)
        };
        let scaled = |x: &[f64], by: f32| x.iter().map(|e| e * by as f64).collect::<Vec<f64>>();
        let sc = scales(case);
        if paged(case) {
            // Each sequence's pages drawn from a shuffled pool twice its size.
            let (pages, per_seq) = (pool_pages(s), cap / page);
            let table = block_table(s, rng);
            let (k, v) = (cache(pages * page * hkv * d, rng), cache(pages * page * hkv * d, rng));
            let kv = |seq: usize, j: usize| ((table[seq * per_seq + j / page] * page + j % page) * hkv) * d;
            expected = reference::decode_attention(&q, (&scaled(&k, sc.k), &scaled(&v, sc.v)), &kv, &lens, (nq, hq, hkv, d));
            inputs.extend([k, v, lens.iter().map(|&x| x as f64).collect(), table.iter().map(|&x| x as f64).collect()]);
        } else {
            let (k, v) = (cache(b * cap * hkv * d, rng), cache(b * cap * hkv * d, rng));
            let kv = |seq: usize, j: usize| ((seq * cap + j) * hkv) * d;
            expected = reference::decode_attention(&q, (&scaled(&k, sc.k), &scaled(&v, sc.v)), &kv, &lens, (nq, hq, hkv, d));
            inputs.extend([k, v, lens.iter().map(|&x| x as f64).collect()]);
        }
        // An output row is a weighted mean of value rows, whose error does not grow with the
        // keys' number as a dot product's does: the bound of a product over the head dimension.
        WorldData::single(inputs, expected, d)
    }

    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        let s = &case.shape;
        let shape = decode_shape(s);
        let op = FlashDecode::for_shape(case.dtype, &shape);
        let op = if paged(case) { op.paged(s[6] as u32) } else { op };
        let op = op.with_kv(kv_type(case));
        let op = match case.variant {
            "narrow" => FlashDecode { wide: false, ..op },
            "staged" | "paged-staged" => FlashDecode { prefetch: false, stages: 2, ..op },
            "staged3" => FlashDecode { prefetch: false, stages: 3, ..op },
            "pdl" => FlashDecode { programmatic: true, ..op },
            _ => op,
        };
        let work = l.device.alloc(op.work_bytes(&shape).max(1), "flash_decode_work")?;
        let result = op.run(l, (&ins[0], &ins[1], &ins[2]), scales(case), &ins[3], ins.get(4), &work, out, &shape);
        l.device.free(&work)?;
        result
    }
}

inventory::submit! { Registered(&FlashDecodeCase) }
