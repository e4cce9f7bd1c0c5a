//! Distributed flash decoding: every sequence's KV cache sharded along the sequence over the
//! ranks, contiguous or paged; every rank ends with the whole attention output.

use crate::dist_bench::{read_entry, upload_with, value, DistCase, Timer};
use crate::distributed::{download, upload};
use crate::host::{poison, random};
use crate::reference;
use super::flash_decode::{block_table, decode_shape, paged, pool_pages};
use crate::registry::{faster, Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use rand::{Rng, SeedableRng};
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::flash_decode::DecodeShape;
use trident_kernels::flash_decode_dist::{DistDecodeBuffers, DistFlashDecode};

struct FlashDecodeDistCase;

impl Operation for FlashDecodeDistCase {
    fn name(&self) -> &'static str {
        "flash_decode_dist"
    }

    fn variants(&self, _dtype: DType) -> &'static [&'static str] {
        &["contiguous", "paged"]
    }

    fn distributed(&self) -> bool {
        true
    }

    /// First lengths: 1 and 5 (4 new tokens; the other ranks' shards hold no key), a sequence
    /// ending at a shard's end, every shard full, and one ending 5 keys into the last shard;
    /// query heads per KV head 1 to 16, head dimensions 64 and 128, pages of 16 to 64 keys (shards
    /// of 64 and 128 keys: the CPU world runs every world to 8).
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        vec![
            vec![1, 1, 1, 1, 64, 64, 16, 1],
            vec![1, 4, 4, 2, 64, 64, 16, 5],
            vec![1, 2, 4, 1, 64, 64, 16, 64 * world.saturating_sub(1).max(1)],
            vec![2, 1, 8, 2, 64, 64, 32, 64 * world],
            vec![1, 1, 16, 1, 128, 128, 64, 128 * world - 5],
        ]
    }

    /// Every rank's inputs: the queries, its shard of the cache (and its block table), the
    /// lengths; every rank's output: the attention over the whole sequence.
    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (s, w) = (&case.shape, case.world);
        let (b, nq, hq, hkv, d, shard, page) = (s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
        let q = random(b * nq * hq * d, case.dtype, rng);
        let lens: Vec<usize> = (0..b).map(|i| if i == 0 { s[7] } else { rng.gen_range(nq..=w * shard) }).collect();
        let lens_f: Vec<f64> = lens.iter().map(|&x| x as f64).collect();
        let per_seq = shard / page;
        // Each rank's keys in its own region of one array: a pool of pages with its block table
        // (drawn from the shuffled pool), or its contiguous `[B, S]` keys.
        let region = if paged(case) { pool_pages(s) * page } else { b * shard } * hkv * d;
        let tables: Vec<Vec<usize>> = (0..w).map(|_| block_table(s, rng)).collect();
        let (k, v) = (random(w * region, case.dtype, rng), random(w * region, case.dtype, rng));
        let kv = |seq: usize, j: usize| {
            let (r, jl) = (j / shard, j % shard);
            let slot = if paged(case) { tables[r][seq * per_seq + jl / page] * page + jl % page } else { seq * shard + jl };
            r * region + slot * hkv * d
        };
        let expected = reference::decode_attention(&q, (&k, &v), &kv, &lens, (nq, hq, hkv, d));
        let inputs = (0..w)
            .map(|r| {
                let mut ins = vec![q.clone(), k[r * region..][..region].to_vec(), v[r * region..][..region].to_vec(), lens_f.clone()];
                if paged(case) {
                    ins.push(tables[r].iter().map(|&x| x as f64).collect());
                }
                ins
            })
            .collect();
        // As one GPU's: a weighted mean of value rows.
        WorldData { inputs, expected: vec![expected; w], reduction_len: d, slack: 0.0 }
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let s = &case.shape;
        let shape = decode_shape(s);
        let op = DistFlashDecode::for_shape(case.dtype, &shape);
        let op = if paged(case) { op.paged(s[6] as u32) } else { op };
        let bufs = op.buffers(ctx, &shape)?;
        // The lengths and block table as the kernels read them: i32.
        let lens = upload(ctx, "lens", &inputs[3], DType::I32)?;
        let table = inputs.get(4).map(|t| upload(ctx, "block_table", t, DType::I32)).transpose()?;
        let out = ctx.alloc(out_len * case.dtype.size_bytes() as usize, "out")?;
        let qkv = [ins[0].clone(), ins[1].clone(), ins[2].clone()];
        Ok(Box::new(DecodeRank { op, bufs, qkv, lens, table, out, out_len, dtype: case.dtype }))
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// The benchmark's variants: the whole operation (one stream, no host synchronisation), the
/// same steps one after the other (each synchronised and met by every rank before the next),
/// and its two parts: the rank's decoding of its shard, and the AllGather of the partials.
const FUSED: &str = "flash_decode_dist";
const SEQUENTIAL: &str = "flash_decode_dist/sequential";
const LOCAL: &str = "flash_decode_dist/local";
const GATHER: &str = "flash_decode_dist/gather";

/// Distributed flash decoding of one new token per sequence (dims `B Hq Hkv D L`: `L` keys per
/// sequence over all ranks, `L / W` each), every sequence full.
impl Benchmark for FlashDecodeDistCase {
    /// One sequence of 128K and of 1M keys (the paper's case), and a batch of 8 of 32K; 32
    /// query heads over 8 KV heads of 128.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![1, 32, 8, 128, 131072], vec![1, 32, 8, 128, 1 << 20], vec![8, 32, 8, 128, 32768]]
    }

    fn small_shape(&self, world: usize) -> Vec<usize> {
        vec![2, 4, 2, 64, 64 * world]
    }

    /// The AllGather's flagged words (its own symmetric buffers).
    fn heap_bytes(&self, case: &DistCase) -> usize {
        let (b, hq, d) = (case.dims[0], case.dims[1], case.dims[3]);
        trident_kernels::epoch::halves_bytes(case.world * b * hq * (d + 1), 8) + (1 << 20)
    }

    /// An AllGather's bus bytes of the partials (f32 rows and log-sum-exps): `(W - 1) / W` of
    /// the gathered.
    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let (b, hq, d, w) = (case.dims[0], case.dims[1], case.dims[3], case.world as f64);
        (b * hq * (d + 1) * 4) as f64 * (w - 1.0)
    }

    fn is_fused(&self, variant: &str) -> bool {
        variant == FUSED
    }

    fn compared_with(&self, variant: &str) -> Option<&'static str> {
        (variant == FUSED).then_some(SEQUENTIAL)
    }

    /// The shard's decoding (trident's, or the baseline's attention with its log-sum-exp) and
    /// the partials' AllGather (trident's LL, or NCCL's).
    fn parts(
        &self,
        time_of: &dyn Fn(&str) -> Option<f64>,
        cublas: Option<f64>,
        nccl: Option<f64>,
        _link_floor: f64,
    ) -> (Option<f64>, Option<f64>) {
        (faster(time_of(LOCAL), cublas), faster(time_of(GATHER), nccl))
    }

    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
        let ctx = t.ctx;
        let (d, w, r) = (case.dtype, case.world, ctx.rank());
        let (b, hq, hkv, hd, len) = (case.dims[0], case.dims[1], case.dims[2], case.dims[3], case.dims[4]);
        if !len.is_multiple_of(w) || hkv == 0 || !hq.is_multiple_of(hkv) {
            return Err(crate::dist_bench::shard_error(case, "the keys (or the query heads over the KV heads)"));
        }
        let shard = DecodeShape { batch: b, q_len: 1, heads_q: hq, heads_kv: hkv, head_dim: hd, cache_len: len / w };
        let (q_tag, k_tag, v_tag) = (900, 901, 902);
        let q = upload_with(ctx, b * hq * hd, d, "q", &|i| value(seed, q_tag, i, d))?;
        // Rank r's shard of `[B, L, Hkv, D]`: its keys `r L / W ..`, each value the global one's.
        let global = |i: usize| {
            let (row, x) = (i / (hkv * hd), i % (hkv * hd));
            let (seq, j) = (row / shard.cache_len, row % shard.cache_len);
            (seq * len + r * shard.cache_len + j) * hkv * hd + x
        };
        let n = b * shard.cache_len * hkv * hd;
        let k = upload_with(ctx, n, d, "k_shard", &|i| value(seed, k_tag, global(i), d))?;
        let v = upload_with(ctx, n, d, "v_shard", &|i| value(seed, v_tag, global(i), d))?;
        let lens = upload_with(ctx, b, DType::I32, "lens", &|_| len as f64)?;
        let out = ctx.alloc(b * hq * hd * d.size_bytes() as usize, "out")?;
        let op = DistFlashDecode::for_shape(d, &shard);
        let mut bufs = op.buffers(ctx, &shard)?;
        let qkv = (&q, &k, &v);
        // A few sampled output rows against the f64 attention over every key.
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xfd ^ r as u64);
        let check = |t: &mut Timer, rng: &mut rand::rngs::StdRng| -> Result<(), BackendError> {
            let samples = if len > (1 << 18) { 1 } else { 3 };
            for _ in 0..samples {
                let (seq, h) = (rng.gen_range(0..b), rng.gen_range(0..hq));
                let kv_head = h / (hq / hkv);
                let qv: Vec<f64> = (0..hd).map(|x| value(seed, q_tag, (seq * hq + h) * hd + x, d)).collect();
                let at = |j: usize, x: usize| ((seq * len + j) * hkv + kv_head) * hd + x;
                let scale = 1.0 / (hd as f64).sqrt();
                let scores: Vec<f64> =
                    (0..len).map(|j| scale * (0..hd).map(|x| qv[x] * value(seed, k_tag, at(j, x), d)).sum::<f64>()).collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let total: f64 = weights.iter().sum();
                let mut worst = 0.0f64;
                for x in 0..hd {
                    let want: f64 = weights.iter().enumerate().map(|(j, p)| p * value(seed, v_tag, at(j, x), d)).sum::<f64>() / total;
                    let got = read_entry(ctx, &out, (seq * hq + h) * hd + x, d)?;
                    // Values in [-1, 1): an absolute error, against the weighted mean's scale.
                    worst = worst.max(if (got - want).is_nan() { f64::INFINITY } else { (got - want).abs() });
                }
                t.error(worst);
            }
            Ok(())
        };
        ctx.fill(&out, &poison(d))?;
        op.run(ctx, &mut bufs, qkv, &lens, None, &out)?;
        check(t, &mut rng)?;
        t.time(FUSED, &mut || op.run(ctx, &mut bufs, qkv, &lens, None, &out))?;
        let sequential = |bufs: &mut DistDecodeBuffers| -> Result<(), BackendError> {
            let step = |r: Result<(), BackendError>| -> Result<(), BackendError> {
                r?;
                ctx.synchronize()?;
                ctx.barrier()
            };
            step(op.enqueue_local(ctx, 0, bufs, qkv, &lens, None).map(|_| ()))?;
            step(op.enqueue_gather(ctx, 0, bufs))?;
            step(op.enqueue_combine(ctx, 0, bufs, &out))
        };
        ctx.fill(&out, &poison(d))?;
        sequential(&mut bufs)?;
        check(t, &mut rng)?;
        t.time(SEQUENTIAL, &mut || sequential(&mut bufs))?;
        t.time(LOCAL, &mut || {
            op.enqueue_local(ctx, 0, &mut bufs, qkv, &lens, None)?;
            ctx.synchronize()
        })?;
        t.time(GATHER, &mut || {
            op.enqueue_gather(ctx, 0, &mut bufs)?;
            ctx.synchronize()?;
            ctx.barrier()
        })?;
        Ok(())
    }
}

/// A rank's distributed flash decoding: the operation, its buffers, inputs and output.
struct DecodeRank {
    op: DistFlashDecode,
    bufs: DistDecodeBuffers,
    qkv: [Buffer; 3],
    lens: Buffer,
    table: Option<Buffer>,
    out: Buffer,
    out_len: usize,
    dtype: DType,
}

impl RankOp for DecodeRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.out, &poison(self.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        let [q, k, v] = &self.qkv;
        self.op.enqueue(ctx, 0, &mut self.bufs, (q, k, v), &self.lens, self.table.as_ref(), &self.out)
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.out, self.out_len, self.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&FlashDecodeDistCase) }
