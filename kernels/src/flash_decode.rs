//! Flash decoding: grouped-query attention of a few new query tokens per sequence against a
//! long KV cache, split along the cache over programs (split-KV) so that the whole GPU streams
//! it, then a combine of the splits' partial results by their log-sum-exp.
//!
//! Shapes: `q [B, Nq, Hq, D]`, `out [B, Nq, Hq, D]`, `lens [B]` (i32: each sequence's length,
//! its `Nq` new tokens included). The cache is contiguous, `k, v [B, S, Hkv, D]` (`S` the
//! capacity per sequence), or paged ([`FlashDecode::page`]): `k, v [pages, P, Hkv, D]` and a
//! block table `table [B, S / P]` (i32) naming the page of each sequence's `P` keys from `P j`
//! on, as serving engines keep them. Query head `h` reads KV head `h / (Hq / Hkv)`.
//!
//! Query token `i` of sequence `b` sits at position `lens[b] - Nq + i` and attends causally to
//! the keys `0 ..= lens[b] - Nq + i` with the scores `q . k / sqrt(D)`. A query that sees no
//! key (`lens[b] < Nq`) gets zeros.
//!
//! **Split** (grid `[B Hkv, splits]`): program `(b Hkv + h, s)` takes the `G = Hq / Hkv` query
//! heads of KV head `h` for all `Nq` tokens as one tile of `Nq G` rows (row `i G + g`, padded to
//! `block_m`) and the keys `s chunk .. (s + 1) chunk` in blocks of `block_n`: scores in f32,
//! online softmax (running maximum, sum and f32 accumulator; the probabilities rounded to the
//! element type for the product with V, as FlashAttention does), then writes its rows'
//! normalized partial output (`part [B Hkv, splits, block_m, D]` f32) and log-sum-exp
//! (`lse [B Hkv, splits, block_m]` f32, `-inf` where the split saw no key).
//!
//! **Direct** (one split): where the split count is 1 (short caches over many heads, which fill
//! the GPU without splitting), the split stage's programs normalize and write their rows'
//! output themselves and no combine runs: one launch, no partials.
//!
//! **Combine** (grid `[B Hkv, Nq G]`): each row's output is the splits' partial outputs weighed
//! by `exp(lse_s - max lse)`, over their sum. The kernel reads its partials through strides
//! ([`Partials`]), so that the same kernel combines one GPU's splits and the ranks' partials
//! of distributed flash decoding (`crate::flash_decode_dist`); its partial form
//! ([`DecodeStage::CombinePartial`]) writes a row's combined output in f32 with its
//! log-sum-exp instead of the output, for the exchange between ranks.
//!
//! **Key offset.** The split stage's `key_offset` is the position of the cache's first key
//! in the sequence (0 on one GPU): a rank holding keys `o .. o + S` of every sequence runs it
//! with `o`, the lengths and query positions staying the sequence's.

use crate::{require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{Artifact, BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, DType, InputPrecision, LaunchAttrs};
use trident_core::{Function, KernelBuilder, VerifyError};

/// A decoding problem's extents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeShape {
    pub batch: usize,
    /// New query tokens per sequence.
    pub q_len: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    /// Keys per sequence at most (`S`): the contiguous cache's capacity, or the block table's
    /// pages per sequence times the page size.
    pub cache_len: usize,
}

impl DecodeShape {
    /// Query heads per KV head (`G`).
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }

    /// Rows of a program's query tile (`Nq G`).
    pub fn rows(&self) -> usize {
        self.q_len * self.group()
    }
}

/// The two kernels of flash decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeStage {
    /// Each split's partial output and log-sum-exp.
    Split,
    /// The split stage where one split takes the whole cache: each program writes its rows'
    /// output directly, and no combine runs.
    Direct,
    /// The splits combined by their log-sum-exps into the output, `tile` partials at a time
    /// (a power of two, at least the partials per row: a program reads all of them at once).
    Combine { tile: u32 },
    /// The splits combined into an f32 partial output and its log-sum-exp per row (`[B Hkv,
    /// Nq G]` rows of `D`, then `[B Hkv, Nq G]` log-sum-exps): a rank's part of distributed
    /// flash decoding.
    CombinePartial { tile: u32 },
}

/// Where a combine reads its partials: partial `s` of row `r` of (sequence, KV head) `bh` is
/// `part`'s `D` f32 from element `bh part_bh + s part_s + r D` on, its log-sum-exp `lse`'s
/// element `bh lse_bh + s lse_s + r`.
#[derive(Clone, Debug)]
pub struct Partials {
    pub part: KernelArg,
    pub lse: KernelArg,
    /// Partials per row.
    pub count: usize,
    pub part_bh: usize,
    pub part_s: usize,
    pub lse_bh: usize,
    pub lse_s: usize,
}

/// One launch of flash decoding: its stage, grid and arguments.
pub type DecodeLaunch = (DecodeStage, [u32; 3], Vec<KernelArg>);

/// The kernels' meta-parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashDecode {
    pub dtype: DType,
    pub head_dim: u32,
    /// Query rows per program (at least `Nq G`, a power of two, at least 16).
    pub block_m: u32,
    /// Keys per step.
    pub block_n: u32,
    pub warps: u32,
    /// Paged cache of this many keys a page (a multiple of `block_n`); `None`: contiguous.
    pub page: Option<u32>,
    /// Splits at most (the combine's tile; a power of two).
    pub max_splits: u32,
    /// `exp` through the hardware's approximation.
    pub fast_math: bool,
    /// Each step loads the next block's keys and values before it computes on the ones the
    /// last step loaded (software pipelining by one block, through registers).
    pub prefetch: bool,
    /// The split stage's programs come in whole multiples of this many where they can
    /// ([`FlashDecode::for_device`]: twice the programs resident on the device at once). 0:
    /// unknown, the splits aim at [`TARGET_PROGRAMS`]. Not part of the kernels' code.
    pub wave: u32,
    /// The split stage's K and V blocks moved 16 bytes a thread (`LaunchAttrs::wide_vectors`:
    /// eight 16-bit elements) rather than 8: half the load and shared-store instructions.
    pub wide: bool,
    /// Shared stages of K and V without prefetching (`LaunchAttrs::stages`): where the target
    /// copies by `cp.async` (sm_80, sm_90a) and this is 2 or more, the lowering copies each
    /// step's K and V blocks into a ring of this many stages, `stages - 1` steps ahead, and
    /// the `dot`s read them there (`core/src/simt/lower/staged.rs`); 1 keeps them in
    /// registers, staged per `dot`.
    pub stages: u32,
    /// The cache's element type: [`FlashDecode::dtype`], or an 8-bit float
    /// (`f8e4m3fn`, `f8e5m2`: [`FlashDecode::with_kv`]) whose keys and values stand for their
    /// per-tensor scales' multiples ([`KvScales`]), widened to `dtype` in registers after
    /// their loads (exactly: every 8-bit float is a 16-bit one).
    pub kv: DType,
    /// The combine is a programmatic dependent of the kernel before it (`LaunchAttrs::
    /// programmatic`: on sm_90+ its programs are scheduled while the split stage's last ones
    /// run, and wait for its end first), hiding its launch behind the split stage's tail.
    pub programmatic: bool,
}

/// The per-tensor dequantization scales of an 8-bit cache: a stored key `K` stands for
/// `k K`, a stored value `V` for `v V` (the `k_scale` and `v_scale` of serving engines'
/// FP8 caches). A cache of the queries' type takes only 1 and 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvScales {
    pub k: f32,
    pub v: f32,
}

impl Default for KvScales {
    fn default() -> KvScales {
        KvScales { k: 1.0, v: 1.0 }
    }
}

/// Programs the split stage aims for: enough for every multiprocessor of an H100 or H200 a few
/// times over, so that the cache streams at the memory's speed.
const TARGET_PROGRAMS: usize = 132 * 4;

impl FlashDecode {
    /// The specialization for `shape` (contiguous cache).
    pub fn for_shape(dtype: DType, shape: &DecodeShape) -> FlashDecode {
        let block_m = shape.rows().max(16).next_power_of_two() as u32;
        FlashDecode {
            dtype,
            head_dim: shape.head_dim as u32,
            block_m,
            // The fastest of `trident bench --only flash_decode`'s sweep at every shape of it
            // (keys per step 64/128/256 x 4/8 warps, the next block prefetched or not, tiles of
            // 16 rows; results/h100-session49/issue31c-c, lowering-ab, h100-session50/sweep).
            // Larger tiles (more than 16 query rows per KV head) take 32 keys a step and 4
            // warps: at 64 keys their score and output tiles spill registers on gfx90a and
            // gfx942 (the AMD atoms spread a thread's accumulator over more rows, each row's
            // factor held once).
            block_n: if block_m > 16 { 32 } else { 64 },
            warps: if block_m > 16 { 4 } else { 8 },
            page: None,
            max_splits: 64,
            // With 16-bit queries `exp` (and the log-sum-exp's `log`) go through the hardware's
            // approximation, as FlashAttention and Triton's `exp` do: within about |x| 2^-24
            // relative (the product by log2 e rounds; docs/DECISIONS.md), while the
            // probabilities are rounded to 8 or 11 bits before the product with V. 2-3% faster
            // on an H100 (results/h100-session56/a, h100-session57/b: `/fm`). f32 queries keep
            // the accurate functions (their bound is 1e-6).
            fast_math: dtype.size_bytes() < 4,
            // Prefetching costs a tile of K and one of V in registers (118 rather than 80 on
            // sm_90a at 16 x 64 and 8 warps: two programs per multiprocessor rather than
            // three) and is still 3-47% faster; larger tiles would spill.
            prefetch: block_m == 16,
            wave: 0,
            // 16-byte K and V loads: the fastest at every shape of the sweep with prefetching
            // (H100, results/h100-session52: 3-5% over 8-byte loads, 120 registers).
            wide: block_m == 16,
            // K and V in registers where not prefetched, until the staged forms (`stages` 2
            // or 3) are measured on a GPU (docs/DECISIONS.md, "Loads that feed only `dot`s go
            // to shared stages").
            stages: 1,
            kv: dtype,
            // On an H100 (results/h100-session60/4b8e6d1/flash-decode, same run) the combine
            // as a programmatic dependent took 0.192 / 0.109 / 0.194 ms against 0.195 / 0.111
            // / 0.196 without at 32 x 32/8 x 4K, 8 x 32/8 x 8K and 1 x 32/8 x 128K, and the
            // `pdl` conformance variant passed at world 1. Ignored where the target has no
            // programmatic launch (sm_80, AMD, the CPU backends).
            programmatic: true,
        }
    }

    /// This specialization over a cache of `kv` elements: the queries' type, or an 8-bit
    /// float, whose keys and values are widened after their loads: no shared stages (they
    /// take only loads that feed `dot`s as they are) and no prefetching (on sm_90a at 16 x 64
    /// and 8 warps 128 registers with it, 74 without; on an H100 neither wins overall: 0.197
    /// against 0.213 ms at 1 x 32/8 x 128K, 0.198 against 0.189 at 4 x 64/8 x 32K,
    /// results/h100-session56/c).
    pub fn with_kv(self, kv: DType) -> FlashDecode {
        if kv == self.dtype {
            return FlashDecode { kv, ..self };
        }
        FlashDecode { kv, stages: 1, prefetch: false, ..self }
    }

    /// Whether the cache holds 8-bit floats, with scales ([`KvScales`]).
    pub fn scaled_kv(&self) -> bool {
        self.kv != self.dtype
    }

    /// This specialization with its splits filling whole waves of the split stage's programs on
    /// `l`'s device, where the backend can tell how many are resident at once (compiling the
    /// split stage to ask); itself where it cannot, or where [`FlashDecode::wave`] is set.
    pub fn for_device(self, l: &DeviceCtx) -> Result<FlashDecode, BackendError> {
        if self.wave != 0 {
            return Ok(self);
        }
        let kernel = l.compile(self.key(DecodeStage::Split), || self.build_split())?;
        Ok(self.with_resident(l.resident_programs(&kernel)?))
    }

    /// This specialization for a device that holds `resident` split-stage programs at once
    /// (`None`: unknown). The splits fill whole pairs of waves: on an H100 one wave of 256
    /// programs of 4096 keys took 0.364 ms where two of 512 of 2048 took 0.216, and over every
    /// shape of the sweep pairs of waves came within 4% of the best split count measured
    /// (results/h100-session50/sweep-ncu).
    pub fn with_resident(self, resident: Option<u64>) -> FlashDecode {
        let wave = resident.map(|r| (2 * r).min(u32::MAX as u64) as u32).unwrap_or(0);
        FlashDecode { wave, ..self }
    }

    /// This specialization over a paged cache of `page` keys a page.
    pub fn paged(self, page: u32) -> FlashDecode {
        FlashDecode { page: Some(page), block_n: self.block_n.min(page), ..self }
    }

    /// The number of splits for `shape` and the keys each takes (a multiple of `block_n`).
    pub fn splits(&self, shape: &DecodeShape) -> (usize, usize) {
        let bn = self.block_n as usize;
        let blocks = shape.cache_len.div_ceil(bn).max(1);
        let heads = (shape.batch * shape.heads_kv).max(1);
        let at = |want: usize| {
            let chunk = blocks.div_ceil(want) * bn;
            (shape.cache_len.div_ceil(chunk).max(1), chunk)
        };
        let most = (self.max_splits as usize).min(blocks).max(1);
        if self.wave == 0 {
            return at(TARGET_PROGRAMS.div_ceil(heads).clamp(1, most));
        }
        // The split count whose programs fill their last wave best (the fewest splits of the
        // best): a program's time is about the same in every wave, so a last wave a third full
        // costs as much as a full one.
        let wave = self.wave as usize;
        let fill = |splits: usize| {
            let programs = heads * splits;
            programs as f64 / (programs.div_ceil(wave) * wave) as f64
        };
        (1..=most).map(at).fold(at(1), |b, c| if fill(c.0) > fill(b.0) + 1e-9 { c } else { b })
    }

    fn name(&self, stage: &str) -> String {
        let page = self.page.map(|p| format!("_paged{p}")).unwrap_or_default();
        let kv = if self.scaled_kv() { format!("_kv{}", self.kv) } else { String::new() };
        format!("flash_decode_{stage}_{}_d{}_{}x{}{page}{kv}", self.dtype, self.head_dim, self.block_m, self.block_n)
            .to_lowercase()
    }

    /// The split stage.
    pub fn build_split(&self) -> Result<Function, VerifyError> {
        self.build_attention(false)
    }

    /// The split stage (`direct`: of one split, writing the output).
    fn build_attention(&self, direct: bool) -> Result<Function, VerifyError> {
        let attrs = LaunchAttrs {
            warps: self.warps,
            fast_math: self.fast_math,
            wide_vectors: self.wide,
            stages: self.stages,
            ..LaunchAttrs::default()
        };
        let b = KernelBuilder::new(&self.name(if direct { "direct" } else { "split" }), attrs);
        let d = self.dtype;
        // Rows of `D` elements start 16-byte aligned (`run` checks the buffers): vector loads.
        let ptr = |name: &str, t: DType| b.arg_ptr_aligned(name, t, 16);
        let (q, k, v) = (ptr("q", d), ptr("k", self.kv), ptr("v", self.kv));
        let lens = b.arg_ptr("lens", DType::I32);
        let table = self.page.map(|_| b.arg_ptr("table", DType::I32));
        // The partials (`part`, `lse`), or (`direct`) the output.
        let outs = if direct {
            (b.arg_ptr("out", d), None)
        } else {
            (b.arg_ptr("part", DType::F32), Some(b.arg_ptr("lse", DType::F32)))
        };
        let (q_len, heads_kv, group) = (b.arg("q_len", DType::I32), b.arg("heads_kv", DType::I32), b.arg("group", DType::I32));
        let (cache_len, chunk, scale) = (b.arg("cache_len", DType::I32), b.arg("chunk", DType::I32), b.arg("scale", DType::F32));
        let key_offset = b.arg("key_offset", DType::I32);
        // An 8-bit cache's value scale (its key scale is in `scale`: `k_scale / sqrt(D)`).
        let v_scale = self.scaled_kv().then(|| b.arg("v_scale", DType::F32));
        let (bm, bn, hd) = (self.block_m, self.block_n, self.head_dim);
        let (bh, s) = (b.program_id_x(), b.program_id(Axis::Y));
        let splits = b.num_programs(Axis::Y);
        let (batch, h) = (bh / heads_kv, bh % heads_kv);
        let len = b.load(lens + batch, None, None);
        let heads_q = heads_kv * group;
        // Rows `i G + g`: token i, query head `h G + g`.
        let r = b.arange(0, bm as i64);
        let (tok, head) = (r / group, h * group + r % group);
        let row_ok = r.lt(q_len * group);
        let pos = len - q_len + tok;
        let dd = b.arange(0, hd as i64);
        let q_rows = (batch * q_len + tok) * heads_q + head;
        let qt = b.load_or(q + (q_rows * hd as i32).expand_dims(1) + dd.expand_dims(0), row_ok.expand_dims(1), 0.0);
        // This cache's keys of the sequence: its first `len - key_offset`.
        let (start, end) = (s * chunk, (s * chunk + chunk).min(len - key_offset).min(cache_len));
        let m0 = b.full(&[bm], f64::NEG_INFINITY, DType::F32);
        let (l0, acc0) = (b.zeros(&[bm], DType::F32), b.zeros(&[bm, hd], DType::F32));
        let jn = b.arange(0, bn as i64);
        // The keys of the block from `j0` on, which of them the split has, and where their rows
        // start: `(b S + j) Hkv + h` in a contiguous cache; in a paged one, the block's page (a
        // block never crosses a page; the table is read only for a block with keys) and the
        // keys' slots in it. K's and V's rows as stored: the head dimension contiguous.
        macro_rules! keys {
            ($j0:expr) => {{
                let keys = jn + $j0;
                (keys, keys.lt(end))
            }};
        }
        macro_rules! rows {
            ($j0:expr, $keys:expr) => {{
                let (j0, keys) = ($j0, $keys);
                let key_rows = match (table, self.page) {
                    (Some(table), Some(p)) => {
                        let pages_per_seq = cache_len / p as i32;
                        let page = b.load_or(table + (batch * pages_per_seq + j0 / p as i32), j0.lt(end), 0);
                        (page * p as i32 + keys % p as i32) * heads_kv + h
                    }
                    _ => (batch * cache_len + keys) * heads_kv + h,
                };
                (key_rows * hd as i32).expand_dims(1) + dd.expand_dims(0)
            }};
        }
        macro_rules! block {
            ($j0:expr) => {{
                let j0 = $j0;
                let (keys, ok) = keys!(j0);
                (keys, ok, rows!(j0, keys))
            }};
        }
        // A block of the cache in the queries' type (an 8-bit one widened, exactly).
        macro_rules! widen {
            ($t:expr) => {{
                let t = $t;
                if self.scaled_kv() {
                    t.cast(d)
                } else {
                    t
                }
            }};
        }
        // One step of the online softmax over the block `keys` (`ok`: those the split has) with
        // its keys `kb` and values `vb` (an expression, evaluated after the scores).
        macro_rules! step {
            ($m:expr, $l:expr, $acc:expr, ($keys:expr, $ok:expr), $kb:expr, $vb:expr) => {{
                let (m, l, acc, keys, key_ok) = ($m, $l, $acc, $keys, $ok);
                let scores = b.dot(qt, widen!($kb).t(), b.zeros(&[bm, bn], DType::F32), InputPrecision::Ieee) * scale;
                let seen = (keys + key_offset).expand_dims(0).le(pos.expand_dims(1)) & key_ok.expand_dims(0);
                let scores = seen.select(scores, f64::NEG_INFINITY);
                let m_new = m.max(scores.max_along(1));
                // A row that has seen no key yet keeps -inf: its terms are exp(-inf) = 0.
                let m_use = m_new.eq(f64::NEG_INFINITY).select(0.0f32, m_new);
                let alpha = (m - m_use).exp();
                let p = (scores - m_use.expand_dims(1)).exp();
                let l = l * alpha + p.sum(1);
                let acc = b.dot(p.cast(d), widen!($vb), acc * alpha.expand_dims(1), InputPrecision::Ieee);
                vec![m_new, l, acc]
            }};
        }
        macro_rules! load {
            ($at:expr, $ok:expr) => {
                b.load_or($at, $ok.expand_dims(1), 0.0)
            };
        }
        let out = if self.prefetch {
            // The next block's K and V loaded at the top of each step, carried into the next:
            // one block's loads are in flight while the step computes on the last one's.
            let (_, ok, at) = block!(start);
            let (k0, v0) = (load!(k + at, ok), load!(v + at, ok));
            b.for_range(start, end, bn as i32, &[m0, l0, acc0, k0, v0], |j0, c| {
                let (_, ok, at) = block!(j0 + bn as i32);
                let next = [load!(k + at, ok), load!(v + at, ok)];
                // This step's keys only: its rows (and in a paged cache its page) were read
                // by the last step's prefetch.
                let (keys, key_ok) = keys!(j0);
                let mut carried = step!(c[0], c[1], c[2], (keys, key_ok), c[3], c[4]);
                carried.extend(next);
                carried
            })
        } else {
            b.for_range(start, end, bn as i32, &[m0, l0, acc0], |j0, c| {
                let (keys, ok, at) = block!(j0);
                step!(c[0], c[1], c[2], (keys, ok), load!(k + at, ok), load!(v + at, ok))
            })
        };
        let (m, l, acc) = (out[0], out[1], out[2]);
        let some = l.gt(0.0f32);
        let acc = match v_scale {
            Some(v_scale) => acc * v_scale,
            None => acc,
        };
        let o = some.expand_dims(1).select(acc / l.max(f32::MIN_POSITIVE).expand_dims(1), 0.0f32);
        match outs {
            (part, Some(lse)) => {
                let at = bh * splits + s;
                b.store(part + ((at * bm as i32 + r) * hd as i32).expand_dims(1) + dd.expand_dims(0), o, None);
                b.store(lse + (at * bm as i32 + r), some.select(m + l.max(f32::MIN_POSITIVE).log(), f64::NEG_INFINITY), None);
            }
            // The query rows the tile has (not its padding), as the combine writes them.
            (out, None) => {
                let at = (q_rows * hd as i32).expand_dims(1) + dd.expand_dims(0);
                b.store(out + at, o.cast(d), Some(row_ok.expand_dims(1)));
            }
        }
        b.finish()
    }

    /// The combine stage for as many partials per row as the splits at most: into the output,
    /// or (`partial`) into f32 rows and log-sum-exps.
    pub fn build_combine(&self, partial: bool) -> Result<Function, VerifyError> {
        self.build_combine_of(partial, self.max_splits)
    }

    /// The combine stage reading `tile` partials per row at once (a power of two): warps enough
    /// for about 16 of its `[tile, D]` f32 a thread, at most the split stage's. Few partials
    /// (two splits of a short cache, a few ranks' partials) take one or two warps instead of
    /// a `[max_splits, D]` tile over eight.
    fn build_combine_of(&self, partial: bool, tile: u32) -> Result<Function, VerifyError> {
        let warps = (tile * self.head_dim / 512).clamp(1, self.warps.max(1));
        let attrs =
            LaunchAttrs { warps, fast_math: self.fast_math, programmatic: self.programmatic, ..LaunchAttrs::default() };
        let b = KernelBuilder::new(&self.name(if partial { "combine_partial" } else { "combine" }), attrs);
        let (part, lse) = (b.arg_ptr("part", DType::F32), b.arg_ptr("lse", DType::F32));
        let out = b.arg_ptr("out", if partial { DType::F32 } else { self.dtype });
        let out_lse = partial.then(|| b.arg_ptr("out_lse", DType::F32));
        let (q_len, heads_kv, group) = (b.arg("q_len", DType::I32), b.arg("heads_kv", DType::I32), b.arg("group", DType::I32));
        let splits = b.arg("splits", DType::I32);
        let (part_bh, part_s) = (b.arg("part_bh", DType::I32), b.arg("part_s", DType::I32));
        let (lse_bh, lse_s) = (b.arg("lse_bh", DType::I32), b.arg("lse_s", DType::I32));
        let (hd, ns) = (self.head_dim, tile);
        let (bh, r) = (b.program_id_x(), b.program_id(Axis::Y));
        let (batch, h) = (bh / heads_kv, bh % heads_kv);
        let sv = b.arange(0, ns as i64);
        let s_ok = sv.lt(splits);
        let lses = b.load_or(lse + (bh * lse_bh + sv * lse_s + r), s_ok, f64::NEG_INFINITY);
        let m = lses.max_along(0);
        let m_use = m.eq(f64::NEG_INFINITY).select(0.0f32, m);
        let w = (lses - m_use).exp();
        let dd = b.arange(0, hd as i64);
        let rows = bh * part_bh + sv * part_s + r * hd as i32;
        let parts = b.load_or(part + rows.expand_dims(1) + dd.expand_dims(0), s_ok.expand_dims(1), 0.0);
        let total = w.sum(0);
        let o = (parts * w.expand_dims(1)).sum(0);
        let some = total.gt(0.0f32);
        let o = some.select(o / total.max(f32::MIN_POSITIVE), 0.0f32);
        match out_lse {
            Some(out_lse) => {
                let at = bh * (q_len * group) + r;
                b.store(out + at * hd as i32 + dd, o, None);
                b.store(out_lse + at, some.select(m_use + total.max(f32::MIN_POSITIVE).log(), f64::NEG_INFINITY), None);
            }
            None => {
                let (tok, head) = (r / group, h * group + r % group);
                let heads_q = heads_kv * group;
                b.store(out + ((batch * q_len + tok) * heads_q + head) * hd as i32 + dd, o.cast(self.dtype), None);
            }
        }
        b.finish()
    }

    /// Attention of `q` against the cache `k`, `v` (with `scales` where it holds 8-bit floats;
    /// and the block table `table` where paged) into `out`, through the scratch `work`
    /// ([`FlashDecode::work_bytes`]).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        l: &DeviceCtx,
        (q, k, v): (&Buffer, &Buffer, &Buffer),
        scales: KvScales,
        lens: &Buffer,
        table: Option<&Buffer>,
        work: &Buffer,
        out: &Buffer,
        shape: &DecodeShape,
    ) -> Result<(), BackendError> {
        for (_, kernel, grid, args) in self.launches(l, (q, k, v), scales, (lens, table), (work, out), shape)? {
            l.launch(&kernel, grid, &args)?;
        }
        Ok(())
    }

    /// What [`FlashDecode::run`] launches, in order: each stage's kernel compiled for `l`'s
    /// device (its splits filling that device's waves), grid and arguments.
    #[allow(clippy::type_complexity)]
    pub fn launches(
        &self,
        l: &DeviceCtx,
        qkv: (&Buffer, &Buffer, &Buffer),
        scales: KvScales,
        (lens, table): (&Buffer, Option<&Buffer>),
        (work, out): (&Buffer, &Buffer),
        shape: &DecodeShape,
    ) -> Result<Vec<(DecodeStage, Artifact, [u32; 3], Vec<KernelArg>)>, BackendError> {
        let op = self.for_device(l)?;
        let plan = op.plan(qkv, scales, lens, table, work, out, shape)?;
        plan.into_iter().map(|(stage, grid, args)| Ok((stage, l.compile(op.key(stage), || op.build(stage))?, grid, args))).collect()
    }

    /// The cache key of a stage's specialization.
    pub fn key(&self, stage: DecodeStage) -> String {
        format!("{:?} {stage:?}", FlashDecode { wave: 0, ..*self })
    }

    /// A stage's kernel.
    pub fn build(&self, stage: DecodeStage) -> Result<Function, VerifyError> {
        match stage {
            DecodeStage::Split => self.build_split(),
            DecodeStage::Direct => self.build_attention(true),
            DecodeStage::Combine { tile } => self.build_combine_of(false, tile),
            DecodeStage::CombinePartial { tile } => self.build_combine_of(true, tile),
        }
    }

    /// The launches of [`FlashDecode::run`] in order, each its stage, grid and arguments, after
    /// checking the problem and the buffers (none for an empty batch): what a caller with a
    /// stream of its own enqueues (the torch op).
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &self,
        (q, k, v): (&Buffer, &Buffer, &Buffer),
        scales: KvScales,
        lens: &Buffer,
        table: Option<&Buffer>,
        work: &Buffer,
        out: &Buffer,
        shape: &DecodeShape,
    ) -> Result<Vec<DecodeLaunch>, BackendError> {
        let es = self.dtype.size_bytes() as usize;
        require_bytes(out, shape.batch * shape.rows() * shape.heads_kv * shape.head_dim * es, "out")?;
        let Some(split) = self.attention_launch((q, k, v), scales, (lens, table), (work, Some(out)), shape, 0)? else {
            return Ok(Vec::new());
        };
        if split.0 == DecodeStage::Direct {
            // One split takes the whole cache: its programs write the output, no combine.
            return Ok(vec![split]);
        }
        let combine = self.combine_launch(&self.split_partials(work, shape), out, false, shape)?;
        Ok(vec![split, combine])
    }

    /// The split stage's launch over a cache whose first key is the sequence's `key_offset`
    /// (0 on one GPU), its partials into `work` ([`FlashDecode::split_partials`]), after
    /// checking the problem and the buffers; `None` for an empty batch.
    #[allow(clippy::too_many_arguments)]
    pub fn split_launch(
        &self,
        qkv: (&Buffer, &Buffer, &Buffer),
        scales: KvScales,
        lens: &Buffer,
        table: Option<&Buffer>,
        work: &Buffer,
        shape: &DecodeShape,
        key_offset: usize,
    ) -> Result<Option<DecodeLaunch>, BackendError> {
        self.attention_launch(qkv, scales, (lens, table), (work, None), shape, key_offset)
    }

    /// The split stage's launch ([`FlashDecode::split_launch`]), or, given `out` and where one
    /// split takes the whole cache, the direct stage's, writing `out` ([`DecodeStage::Direct`]).
    fn attention_launch(
        &self,
        (q, k, v): (&Buffer, &Buffer, &Buffer),
        scales: KvScales,
        (lens, table): (&Buffer, Option<&Buffer>),
        (work, out): (&Buffer, Option<&Buffer>),
        shape: &DecodeShape,
        key_offset: usize,
    ) -> Result<Option<DecodeLaunch>, BackendError> {
        self.check(shape, table.is_some())?;
        if !self.scaled_kv() && scales != KvScales::default() {
            return Err(BackendError::Host(format!(
                "flash decoding: scales {scales:?} for a {} cache (only an 8-bit one is scaled)",
                self.kv
            )));
        }
        let es = self.dtype.size_bytes() as usize;
        let kv_es = self.kv.size_bytes() as usize;
        let (rows, g) = (shape.rows(), shape.group());
        require_bytes(q, shape.batch * rows * shape.heads_kv * shape.head_dim * es, "q")?;
        require_bytes(lens, shape.batch * 4, "lens")?;
        let kv_bytes = match (self.page, table) {
            (Some(_), Some(t)) => {
                require_bytes(t, shape.batch * shape.cache_len / self.page.unwrap_or(1) as usize * 4, "table")?;
                0
            }
            _ => shape.batch * shape.cache_len * shape.heads_kv * shape.head_dim * kv_es,
        };
        require_bytes(k, kv_bytes, "k")?;
        require_bytes(v, kv_bytes, "v")?;
        require_bytes(work, self.work_bytes(shape), "work")?;
        if shape.batch == 0 || rows == 0 {
            return Ok(None);
        }
        let (splits, chunk) = self.splits(shape);
        let int = |x: usize, what: &str| require_i32(x, what).map(KernelArg::i32);
        let scale = scales.k / (shape.head_dim as f32).sqrt();
        let mut args = vec![q.arg(), k.arg(), v.arg(), lens.arg()];
        args.extend(table.map(|t| t.arg()));
        let direct = out.filter(|_| splits == 1);
        match direct {
            Some(out) => args.push(out.arg()),
            None => args.extend([work.arg(), work.arg_at(self.part_bytes(shape))]),
        }
        args.extend([int(shape.q_len, "q_len")?, int(shape.heads_kv, "heads_kv")?, int(g, "group")?]);
        args.extend([int(shape.cache_len, "cache_len")?, int(chunk, "chunk")?, KernelArg::f32(scale)]);
        args.push(int(key_offset, "the cache's first key")?);
        if self.scaled_kv() {
            args.push(KernelArg::f32(scales.v));
        }
        let heads = require_i32(shape.batch * shape.heads_kv, "batch x KV heads")? as u32;
        let stage = if direct.is_some() { DecodeStage::Direct } else { DecodeStage::Split };
        Ok(Some((stage, [heads, splits as u32, 1], args)))
    }

    /// The split stage's partials in `work`: `[B Hkv, splits, block_m]` rows.
    pub fn split_partials(&self, work: &Buffer, shape: &DecodeShape) -> Partials {
        let (splits, bm, hd) = (self.splits(shape).0, self.block_m as usize, self.head_dim as usize);
        Partials {
            part: work.arg(),
            lse: work.arg_at(self.part_bytes(shape)),
            count: splits,
            part_bh: splits * bm * hd,
            part_s: bm * hd,
            lse_bh: splits * bm,
            lse_s: bm,
        }
    }

    /// Bytes of a combine's partial form ([`DecodeStage::CombinePartial`]): `[B Hkv, Nq G]`
    /// rows of `D` f32, then as many log-sum-exps.
    pub fn partial_block_bytes(&self, shape: &DecodeShape) -> usize {
        shape.batch * shape.heads_kv * shape.rows() * (shape.head_dim + 1) * 4
    }

    /// A combine's launch of `from` into `out`: the output (`[B, Nq, Hq, D]`) or, `partial`,
    /// an f32 block ([`FlashDecode::partial_block_bytes`]).
    pub fn combine_launch(&self, from: &Partials, out: &Buffer, partial: bool, shape: &DecodeShape) -> Result<DecodeLaunch, BackendError> {
        if from.count > self.max_splits as usize {
            return Err(BackendError::Host(format!(
                "flash decoding: {} partials per row for a combine of {}",
                from.count, self.max_splits
            )));
        }
        let (rows, g) = (shape.rows(), shape.group());
        // The smallest tile that holds every partial (kernels for 2, 4, ... max_splits).
        let tile = (from.count.max(2).next_power_of_two() as u32).min(self.max_splits);
        let int = |x: usize, what: &str| require_i32(x, what).map(KernelArg::i32);
        let mut args = vec![from.part, from.lse, out.arg()];
        let stage = if partial {
            require_bytes(out, self.partial_block_bytes(shape), "the partial output")?;
            args.push(out.arg_at(shape.batch * shape.heads_kv * rows * shape.head_dim * 4));
            DecodeStage::CombinePartial { tile }
        } else {
            require_bytes(out, shape.batch * rows * shape.heads_kv * shape.head_dim * self.dtype.size_bytes() as usize, "out")?;
            DecodeStage::Combine { tile }
        };
        args.extend([int(shape.q_len, "q_len")?, int(shape.heads_kv, "heads_kv")?, int(g, "group")?, int(from.count, "partials")?]);
        args.extend([int(from.part_bh, "part_bh")?, int(from.part_s, "part_s")?, int(from.lse_bh, "lse_bh")?, int(from.lse_s, "lse_s")?]);
        let heads = require_i32(shape.batch * shape.heads_kv, "batch x KV heads")? as u32;
        Ok((stage, [heads, rows as u32, 1], args))
    }

    /// Rows of the splits' partial results: a tile's for every (sequence, KV head, split).
    fn part_rows(&self, shape: &DecodeShape) -> usize {
        shape.batch * shape.heads_kv * self.splits(shape).0 * self.block_m as usize
    }

    /// Bytes of the partial outputs (`part`, f32), after which the log-sum-exps start.
    fn part_bytes(&self, shape: &DecodeShape) -> usize {
        self.part_rows(shape) * self.head_dim as usize * 4
    }

    /// Scratch bytes of [`FlashDecode::run`]: the splits' partial outputs and log-sum-exps, for
    /// as many splits as the cache's blocks or the combine allow, whatever the device's wave.
    pub fn work_bytes(&self, shape: &DecodeShape) -> usize {
        let blocks = shape.cache_len.div_ceil(self.block_n as usize).max(1);
        let splits = blocks.min(self.max_splits as usize).max(self.splits(shape).0);
        shape.batch * shape.heads_kv * splits * self.block_m as usize * (self.head_dim as usize + 1) * 4
    }

    /// A typed error unless this specialization serves `shape`.
    pub fn check(&self, shape: &DecodeShape, paged: bool) -> Result<(), BackendError> {
        let problem = |m: String| Err(BackendError::Host(format!("flash decoding: {m}")));
        if shape.heads_kv == 0 || !shape.heads_q.is_multiple_of(shape.heads_kv) {
            return problem(format!("{} query heads do not group over {} KV heads", shape.heads_q, shape.heads_kv));
        }
        if self.kv != self.dtype && !(self.kv.is_fp8() && self.dtype.size_bytes() == 2) {
            return problem(format!(
                "a {} cache for {} queries: the queries' type, or an 8-bit float cache for 16-bit queries",
                self.kv, self.dtype
            ));
        }
        if shape.head_dim != self.head_dim as usize {
            return problem(format!("head dimension {} for a kernel of {}", shape.head_dim, self.head_dim));
        }
        if shape.rows() > self.block_m as usize {
            return problem(format!("{} query rows (tokens x group) for a tile of {}", shape.rows(), self.block_m));
        }
        if self.splits(shape).0 > self.max_splits as usize {
            return problem(format!("{} splits for a combine of {}", self.splits(shape).0, self.max_splits));
        }
        match (self.page, paged) {
            (Some(p), true) if p == 0 || !p.is_multiple_of(self.block_n) || !shape.cache_len.is_multiple_of(p as usize) => problem(format!(
                "pages of {p} keys: a multiple of the {}-key block, dividing the {} keys per sequence",
                self.block_n, shape.cache_len
            )),
            (Some(_), false) => problem("a paged kernel needs its block table".into()),
            (None, true) => problem("a block table given to the contiguous kernel".into()),
            _ => Ok(()),
        }
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "flash_decode_split",
        operation: "flash_decode",
        distributed: false,
        build: |d| FlashDecode::for_shape(d, &DecodeShape { batch: 1, q_len: 1, heads_q: 8, heads_kv: 1, head_dim: 128, cache_len: 4096 }).build_split(),
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "flash_decode_split_narrow",
        operation: "flash_decode",
        distributed: false,
        build: |d| {
            let shape = DecodeShape { batch: 1, q_len: 1, heads_q: 8, heads_kv: 1, head_dim: 128, cache_len: 4096 };
            FlashDecode { wide: false, ..FlashDecode::for_shape(d, &shape) }.build_split()
        },
    }
}

// The split stage over an f8e4m3fn cache: bf16 queries whatever the catalogue's type.
inventory::submit! {
    crate::Catalogued {
        name: "flash_decode_split_kv8",
        operation: "flash_decode",
        distributed: false,
        build: |_| {
            let shape = DecodeShape { batch: 1, q_len: 1, heads_q: 8, heads_kv: 1, head_dim: 128, cache_len: 4096 };
            FlashDecode::for_shape(DType::BF16, &shape).with_kv(DType::F8E4M3FN).build_split()
        },
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "flash_decode_combine",
        operation: "flash_decode",
        distributed: false,
        build: |d| FlashDecode::for_shape(d, &DecodeShape { batch: 1, q_len: 1, heads_q: 8, heads_kv: 1, head_dim: 128, cache_len: 4096 }).build_combine(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> DecodeShape {
        DecodeShape { batch: 2, q_len: 2, heads_q: 8, heads_kv: 2, head_dim: 64, cache_len: 1024 }
    }

    /// Shapes a specialization cannot serve are typed errors that say what does not fit.
    #[test]
    fn misfits_are_refused_with_what_does_not_fit() {
        let op = FlashDecode::for_shape(DType::BF16, &shape());
        assert!(op.check(&shape(), false).is_ok());
        let err = |s: DecodeShape, paged: bool, op: FlashDecode| op.check(&s, paged).unwrap_err().to_string();
        assert!(err(DecodeShape { heads_q: 7, ..shape() }, false, op).contains("7 query heads do not group over 2"));
        assert!(err(DecodeShape { head_dim: 128, ..shape() }, false, op).contains("head dimension 128"));
        assert!(err(DecodeShape { q_len: 9, ..shape() }, false, op).contains("36 query rows"));
        assert!(err(shape(), true, op).contains("block table given to the contiguous kernel"));
        assert!(err(shape(), false, op.paged(16)).contains("needs its block table"));
        assert!(err(shape(), true, op.paged(48)).contains("pages of 48 keys"));
        assert!(op.paged(64).check(&shape(), true).is_ok());
        // 8-bit caches serve 16-bit queries only.
        assert!(op.with_kv(DType::F8E4M3FN).check(&shape(), false).is_ok());
        let f32_op = FlashDecode::for_shape(DType::F32, &shape()).with_kv(DType::F8E5M2);
        assert!(err(shape(), false, f32_op).contains("a f8e5m2 cache for f32 queries"));
        assert!(err(shape(), false, op.with_kv(DType::F16)).contains("a f16 cache for bf16 queries"));
    }

    /// One split over the whole cache is one launch whose arguments are the split stage's with
    /// the output in place of the partials; more splits are the split stage and the combine.
    #[test]
    fn one_split_writes_the_output_directly() {
        let buf = |name: &str, address: u64| Buffer { name: name.into(), address, bytes: 1 << 30 };
        let (q, k, v, lens, work, out) = (buf("q", 1), buf("k", 2), buf("v", 3), buf("lens", 4), buf("work", 5), buf("out", 6));
        let table = buf("table", 7);
        for paged in [false, true] {
            let short = DecodeShape { cache_len: 64, ..shape() };
            let op = FlashDecode::for_shape(DType::BF16, &short);
            let op = if paged { op.paged(64) } else { op };
            let t = paged.then_some(&table);
            let plan = op.plan((&q, &k, &v), KvScales::default(), &lens, t, &work, &out, &short).unwrap();
            assert_eq!(plan.len(), 1);
            let (stage, grid, args) = &plan[0];
            assert_eq!((*stage, grid[1]), (DecodeStage::Direct, 1));
            let split = op.split_launch((&q, &k, &v), KvScales::default(), &lens, t, &work, &short, 0).unwrap().unwrap();
            assert_eq!(args.len(), split.2.len() - 1);
            let at = if paged { 5 } else { 4 };
            assert_eq!(format!("{:?}", args[at]), format!("{:?}", out.arg()));
            assert_eq!(format!("{:?}", &args[at + 1..]), format!("{:?}", &split.2[at + 2..]));
            let built = op.build(DecodeStage::Direct).unwrap();
            assert_eq!(built.params.iter().filter(|p| p.name == "out").count(), 1);
            assert_eq!(built.params.len(), args.len());
        }
        let long = DecodeShape { cache_len: 8192, ..shape() };
        let op = FlashDecode::for_shape(DType::BF16, &long);
        let plan = op.plan((&q, &k, &v), KvScales::default(), &lens, None, &work, &out, &long).unwrap();
        // The combine's tile: the smallest power of two that holds the splits.
        let splits = op.splits(&long).0;
        let tile = splits.next_power_of_two() as u32;
        assert!(splits > 1 && tile < 2 * splits as u32);
        assert_eq!(plan.iter().map(|p| p.0).collect::<Vec<_>>(), [DecodeStage::Split, DecodeStage::Combine { tile }]);
        // Its warps: about 16 f32 of its `[tile, D]` a thread, one warp at least, and the
        // `[max_splits, D]` catalogue form over the split stage's 8.
        let warps = |stage| op.build(stage).unwrap().attrs.warps;
        assert_eq!(warps(DecodeStage::Combine { tile: 2 }), 1);
        assert_eq!(warps(DecodeStage::CombinePartial { tile: 1024 / op.head_dim }), 2);
        assert_eq!(op.build_combine(false).unwrap().attrs.warps, 8);
    }

    /// An 8-bit cache keeps its loads in registers (no shared stages, no prefetch), names its kernels
    /// apart, and takes its value scale as an argument (its key scale is in `scale`).
    #[test]
    fn eight_bit_caches() {
        let op = FlashDecode { stages: 2, ..FlashDecode::for_shape(DType::BF16, &shape()) };
        let kv8 = op.with_kv(DType::F8E4M3FN);
        assert_eq!((kv8.stages, op.with_kv(DType::BF16).stages), (1, 2));
        assert!(!kv8.prefetch && op.with_kv(DType::BF16).prefetch == op.prefetch);
        assert!(kv8.scaled_kv() && !op.scaled_kv());
        assert!(kv8.build_split().unwrap().name.ends_with("_kvf8e4m3fn"));
        let split = kv8.build_split().unwrap();
        assert!(split.params.iter().any(|p| p.name == "v_scale"));
        assert!(!op.build_split().unwrap().params.iter().any(|p| p.name == "v_scale"));
    }

    /// The splits cover the cache in whole blocks, enough of them to fill the GPU where the
    /// cache is long, one where it is short.
    #[test]
    fn splits_cover_the_cache() {
        let op = FlashDecode::for_shape(DType::BF16, &shape());
        for (len, heads) in [(64, 1), (1024, 2), (4099, 1), (131072, 8), (131072, 64)] {
            let s = DecodeShape { cache_len: len, heads_kv: heads, heads_q: heads, batch: 1, ..shape() };
            let (splits, chunk) = op.splits(&s);
            assert_eq!(chunk % op.block_n as usize, 0);
            assert!(splits * chunk >= len && (splits - 1) * chunk < len, "{len}: {splits} x {chunk}");
            assert!(splits <= op.max_splits as usize);
        }
        let long = DecodeShape { cache_len: 131072, heads_kv: 8, heads_q: 64, batch: 1, ..shape() };
        assert_eq!(op.splits(&long).0 * 8, 512);
    }

    /// With the device's wave known, the splits fill whole waves: one wave of 264 programs
    /// over 8 heads is 33 splits; 512 heads take the split count whose waves are fullest; the
    /// scratch bound holds whatever the wave.
    #[test]
    fn splits_fill_whole_waves() {
        let op = FlashDecode { wave: 264, ..FlashDecode::for_shape(DType::BF16, &shape()) };
        let long = DecodeShape { cache_len: 131072, heads_kv: 8, heads_q: 32, batch: 1, ..shape() };
        assert_eq!(op.splits(&long).0, 33);
        let many = DecodeShape { batch: 64, cache_len: 1024, ..long };
        let (splits, _) = op.splits(&many);
        let programs = 512 * splits;
        let waves = programs.div_ceil(264);
        for s in 1..=16usize {
            let p = 512 * s;
            assert!(p as f64 / (p.div_ceil(264) * 264) as f64 <= programs as f64 / (waves * 264) as f64 + 1e-9);
        }
        assert_eq!(op.with_resident(Some(132)).wave, 264);
        assert_eq!(op.with_resident(None).wave, 0);
        for wave in [0, 1, 132, 264, 396, 100_000] {
            let o = FlashDecode { wave, ..op };
            for s in [long, many] {
                assert!(o.splits(&s).0 <= op.max_splits as usize);
                assert!(FlashDecode { wave: 0, ..op }.work_bytes(&s) >= o.part_bytes(&s) + o.part_rows(&s) * 4);
            }
        }
    }
}
