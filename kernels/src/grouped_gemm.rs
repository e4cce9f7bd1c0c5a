//! The grouped GEMM of mixture-of-experts layers: `C_e = A_e B_e` for experts `e`, with each
//! expert's row count known only on the device (it comes from routing), so one launch serves
//! any routing without a host synchronisation.
//!
//! Layouts of A (and C alike):
//! * [`Layout::Contiguous`]: rows grouped by expert, `groups[e]` the end of expert `e`'s rows
//!   (cumulative int32, PyTorch's `offs` of `torch._grouped_mm`): A `[T, K]`, C `[T, N]`;
//! * [`Layout::Masked`]: `[E, t_max, K]` with `groups[e]` expert `e`'s row count (the
//!   low-latency dispatch's output): C `[E, t_max, N]`, rows past the count untouched.
//!
//! B is `[E, N, K]` ([`BLayout::NK`], K contiguous, as the FP8 tensor cores read it and
//! `torch._grouped_mm` takes it transposed) or `[E, K, N]` ([`BLayout::KN`]).
//!
//! Operands bf16, f16 or FP8 (C bf16 then), accumulated in f32. With [`GroupedGemm::scales`]
//! the product is scaled in the epilogue by `scale_a` per row of A (`[rows]` f32: FP8's
//! row-wise scales, or a mixture-of-experts layer's routing weights) and `scale_b` per expert
//! and column (`[E, N]` f32), as `torch._scaled_grouped_mm`'s row-wise mode.
//!
//! The schedule: programs walk the (expert, tile) pairs with a stride of the grid: each program
//! goes through the experts once, reading their counts, and computes the tiles of each that are
//! its own (tile numbers `pid, pid + P, ...` over all experts' tiles in order). An empty
//! expert costs each program one load; the grid needs no bound from the host's view of the
//! counts (`LaunchAttrs::persistent`: the runtime runs as many programs as are resident).
//!
//! Two forms: the portable one (pointer loads with edge masks, the K loop on the target's
//! matrix atoms), and with [`GroupedGemm::descriptors`] (targets with TMA and `wgmma`) A and B
//! read through tensor descriptors over all experts at once (A `[rows, K]`, B `[E N, K]` or
//! `[E K, N]`): a tile's box may reach into the next expert's rows, which only make output rows
//! or columns that the masked store drops (or, for B `[E K, N]` past K, meet A's zeros past K),
//! so no per-expert tensor map is needed.
//!
//! The epilogue ([`Epilogue`]) can fuse what a mixture-of-experts layer does next: SwiGLU of
//! the fused gate/up projection (B's rows interleaved in blocks of [`SWIGLU_BLOCK`]: gate rows
//! `0..128`, up rows `0..128`, gate rows `128..256`, ...; C gets half of B's N columns,
//! `silu(gate) * up`), each row times its routing weight, and the result quantized for the
//! next FP8 GEMM ([`Epilogue::quantize`]: C in E4M3FN with a scale per row and 128 columns,
//! each tile one scale block wide). FP8 operands give bf16 (or f16, [`GroupedGemm::fp8_out`]).
//!
//! A's groups may be `chunks x experts` ([`Groups::chunks`], ordered by chunk, then expert;
//! group `g` multiplies B's expert `g % experts`): the rows an all-gather brings chunk by chunk.
//! With [`GroupedGemm::wait`] each tile waits for its chunk's signal (`ready[chunk] >= target`,
//! acquire, system scope) before its first load: the hook AG + grouped GEMM runs on.
//!
//! With [`GroupedGemm::chunk_ends`] (contiguous layout) each chunk's groups hold the chunk's own
//! ends, counted from its first row `chunk x t_max`: what each rank of a gather writes without
//! knowing the others' counts (the tensor-parallel MoE block, [`crate::moe_tp`]). With `wait`
//! too, a program waits for chunk c's signal before it reads c's ends, and walks the chunks from
//! its rank's own (already local) on.
//!
//! A tile reads A in boxes of `block_m` rows over all of A (one tensor map, encoded on the host
//! from the argument: TMA on sm_90a), so a group's last tile may read up to `block_m - 1` rows
//! past the group (dropped by the store's mask). With `wait` those rows must not be written while
//! the GEMM runs: a chunk's capacity `t_max` ends with at least [`GroupedGemm::block_m`] rows
//! no rank writes (the tensor-parallel MoE block leaves [`crate::moe_tp::CHUNK_PAD`]). A
//! descriptor per chunk would not need them, but its base is no longer a kernel argument, so
//! the lowering could not encode it on the host and fell back to loads by the threads: 10x
//! slower on the H100 (8e0c404, measured at d730fa2).
//!
//! [`Epilogue::reduce_scatter`] sends the product home instead of storing it: each row times its
//! weight, added (f32 atomics, system scope) into row `row_token[row]` of `acc` on the rank that
//! owns the chunk (rank = chunk), then `done` there grows by the tile's element count. The
//! top-k reduction and the reduce-scatter of the tensor-parallel MoE block in one epilogue.
//!
//! [`Epilogue::notify_owner`] (with [`GroupedGemm::chunk_ends`]) stores C's rows of chunk `c`
//! on rank `c`, shifted by `rank - c` chunks (so rank `c`'s C holds every rank's rows of its
//! chunk, rank by rank; at world 1 the plain GEMM's C), then `done` there grows by the tile's
//! element count: the tensor-parallel MoE block's [`crate::moe_tp::TpReduce::Rows`], whose
//! owner adds the rows itself once its count is whole. Plain stores (the bulk row copies
//! where C allows them) into the peer's memory, no atomics.

use crate::scaled_gemm::SCALE_BLOCK;
use crate::{cdiv, require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{
    AtomicOp, Axis, CmpOp, CommScope, DType, InputPrecision, LaunchAttrs, MemSemantic, ReduceOp, Scope, SignalOp,
};
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

/// Two tiles a kernel may have: the two scales.
type TilePair<'b> = Option<(Tile<'b>, Tile<'b>)>;

/// The kernel's arguments a tile reads.
#[derive(Clone, Copy)]
struct Kernel<'b> {
    b: &'b KernelBuilder,
    bp: Tile<'b>,
    c: Tile<'b>,
    scales: TilePair<'b>,
    weights: Option<Tile<'b>>,
    /// [`Epilogue::quantize`]'s scales of C.
    c_scales: Option<Tile<'b>>,
    /// [`Epilogue::reduce_scatter`]'s `row_token`, `acc` and `done`.
    scatter: Option<(Tile<'b>, Tile<'b>, Tile<'b>)>,
    /// [`Epilogue::notify_owner`]'s `done`.
    owner_done: Option<Tile<'b>>,
    /// Rows from one chunk's first to the next's (with `chunk_ends`; else the masked
    /// layout's capacity).
    t_max: Tile<'b>,
    a_rows: Tile<'b>,
    n: Tile<'b>,
    /// C's columns (N, or N/2 with SwiGLU).
    n_out: Tile<'b>,
    k: Tile<'b>,
    /// K steps of a tile, computed before the tile loop in the scheduled form (a persistent
    /// loop's K loop bounds must not be the tile's values); else by each tile, whose walk over
    /// the groups then holds one scalar less.
    k_blocks: Option<Tile<'b>>,
}

impl<'b> Kernel<'b> {
    /// A's descriptor over every group's rows (from `a`: A, or A after a wait).
    fn a_desc(&self, a: Tile<'b>, bm: u32, bk: u32) -> Tile<'b> {
        let one = self.b.constant(trident_core::ir::Literal::Int(1), DType::I32);
        self.b.make_desc(a, [self.a_rows, self.k], [self.k, one], [bm, bk])
    }
}

/// The walk's tiles of one group of `rows` rows: tile numbers `tile_base ..` (`ceil(rows / bm)
/// x tiles_n` of them), this program's from `next` on, `programs` apart; `body` gets each
/// one's (row tile, column tile). Returns the program's next tile number and the group's end.
fn group_tiles<'b>(
    b: &'b KernelBuilder,
    (next, tile_base): (Tile<'b>, Tile<'b>),
    (rows, bm, tiles_n, programs): (Tile<'b>, u32, Tile<'b>, Tile<'b>),
    body: &dyn Fn((Tile<'b>, Tile<'b>)),
) -> (Tile<'b>, Tile<'b>) {
    let end = tile_base + ((rows + (bm as i32 - 1)) / bm as i32) * tiles_n;
    let after = b.while_loop(
        &[next],
        |s| s[0].lt(end),
        |s| {
            let local = s[0] - tile_base;
            body((local / tiles_n, local % tiles_n));
            vec![s[0] + programs]
        },
    );
    (after[0], end)
}

/// The gate/up interleave of B's rows for [`Epilogue::swiglu`]: 128 gate rows, then the 128 up
/// rows of the same output columns. As wide as a DeepSeek-V3 scale block, so the block scales of
/// the separately quantized gate and up weights stay whole blocks after the interleave; a
/// 256-row tile of B (the descriptor form's) is one pair.
pub const SWIGLU_BLOCK: u32 = 128;

/// B's row (within its expert) holding the gate projection of SwiGLU output column `j`; the up
/// projection's is [`SWIGLU_BLOCK`] rows further (the interleave of [`Epilogue::swiglu`]).
pub fn swiglu_gate_row(j: usize) -> usize {
    let sw = SWIGLU_BLOCK as usize;
    (j / sw) * 2 * sw + j % sw
}

/// What the epilogue does to the f32 product, after the scales and before the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// `silu(gate) * up` of B's interleaved gate and up rows ([`SWIGLU_BLOCK`]); C gets N/2
    /// columns. Needs N a multiple of `2 * SWIGLU_BLOCK`.
    pub swiglu: bool,
    /// Each row times `weights[row]` (`[rows]` f32: the token's routing weight for the expert).
    pub row_weights: bool,
    /// The product added into the owner's `acc` at the row's token, then the owner's `done`
    /// grows by the tile's elements (see the module's text; [`Operands::scatter`]).
    pub reduce_scatter: bool,
    /// C stored, then `done` on the rank that owns the tile's chunk (rank = chunk) grows by
    /// the tile's elements ([`Operands::owner_done`]): a tile's rows announced to the rank that
    /// reads them, with no atomics on the data.
    pub notify_owner: bool,
    /// C in E4M3FN with one f32 scale per row and 128 of its columns ([`Operands::c_scales`],
    /// `[rows, ceil(n_out / 128)]`), quantized from the f32 result as `docs/SEMANTICS.md`
    /// ("Quantization") says: the next FP8 GEMM's A and its block scales (the MoE block's
    /// SwiGLU output before its down projection). Tiles of 128 output columns
    /// ([`GroupedGemm::fitted`]): each row's scale block is one tile's.
    pub quantize: bool,
}

/// The buffers of a grouped GEMM launch.
#[derive(Clone, Copy)]
pub struct Operands<'a> {
    pub a: &'a Buffer,
    pub b: &'a Buffer,
    pub c: &'a Buffer,
    /// `[chunks x experts]` int32: group ends (contiguous) or row counts (masked).
    pub groups: &'a Buffer,
    /// `scale_a` and `scale_b` ([`Scales`]).
    pub scales: Option<(&'a Buffer, &'a Buffer)>,
    /// `[rows]` f32 ([`Epilogue::row_weights`]).
    pub weights: Option<&'a Buffer>,
    /// `[chunks]` u64 signals and the value each tile waits for ([`GroupedGemm::wait`]).
    pub ready: Option<(&'a Buffer, u64)>,
    /// [`Epilogue::reduce_scatter`]'s `row_token` (`[rows]` i32: each row's token on the
    /// chunk's rank), `acc` (symmetric `[tokens, n_out]` f32) and `done` (symmetric u64).
    pub scatter: Option<(&'a Buffer, &'a Buffer, &'a Buffer)>,
    /// [`Epilogue::notify_owner`]'s `done` (symmetric u64).
    pub owner_done: Option<&'a Buffer>,
    /// The scratch of [`GroupedGemm::scheduled`] ([`GroupedGemm::schedule_bytes`]); `run`
    /// allocates one when it is absent.
    pub schedule: Option<&'a Buffer>,
    /// C's scales with [`Epilogue::quantize`] (`[rows, ceil(n_out / 128)]` f32).
    pub c_scales: Option<&'a Buffer>,
}

impl<'a> Operands<'a> {
    /// A, B, C and the groups, without scales, weights or signals.
    pub fn new(a: &'a Buffer, b: &'a Buffer, c: &'a Buffer, groups: &'a Buffer) -> Operands<'a> {
        Operands {
            a,
            b,
            c,
            groups,
            scales: None,
            weights: None,
            ready: None,
            scatter: None,
            owner_done: None,
            schedule: None,
            c_scales: None,
        }
    }
}

/// A launch's grid and arguments.
pub type Launch = ([u32; 3], Vec<KernelArg>);

/// How A's (and C's) rows are grouped by expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[T, K]`, `groups[e]` the end of expert `e`'s rows.
    Contiguous,
    /// `[E, t_max, K]`, `groups[e]` expert `e`'s row count.
    Masked,
}

/// The scales of a grouped GEMM's product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scales {
    None,
    /// `scale_a[row]` times `scale_b[e, col]` in the epilogue (`[rows]` and `[E, N]` f32).
    Row,
    /// DeepSeek-V3's: `scale_a[row, kb]` per row and 128 of K (`[rows, ceil(K/128)]`),
    /// `scale_b[e, nb, kb]` per expert and 128 x 128 block (`[E, ceil(N/128), ceil(K/128)]`),
    /// each K block's product promoted into f32 with its two scales.
    Block,
}

/// How each expert's B is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// `[E, N, K]`: K contiguous.
    NK,
    /// `[E, K, N]`: N contiguous.
    KN,
}

/// A grouped GEMM problem: experts, the extents of every expert's GEMM, and the rows of A.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Groups {
    /// B's experts.
    pub experts: usize,
    /// B's N (with SwiGLU, gate and up rows together: C has N/2 columns).
    pub n: usize,
    pub k: usize,
    /// Contiguous: A's rows (every group's together); masked: each group's capacity.
    pub rows: usize,
    /// A's groups are `chunks x experts` (1: one group per expert).
    pub chunks: usize,
}

impl Groups {
    /// One group of A per expert.
    pub fn new(experts: usize, n: usize, k: usize, rows: usize) -> Groups {
        Groups { experts, n, k, rows, chunks: 1 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupedGemm {
    /// A and B: bf16, f16 (C the same) or FP8 (C bf16); f32 accumulation.
    pub dtype: DType,
    /// The product's scales (see the module's text); FP8 operands need some.
    pub scales: Scales,
    pub layout: Layout,
    pub b_layout: BLayout,
    pub block_m: u32,
    pub block_n: u32,
    pub block_k: u32,
    pub warps: u32,
    pub stages: u32,
    /// The descriptor form where [`GroupedGemm::specialized`] allows it.
    pub descriptors: bool,
    /// Set by [`GroupedGemm::specialized`]: A and B 16-byte aligned and their rows whole
    /// 16-byte chunks (what a tensor map needs).
    pub divisible: bool,
    pub epilogue: Epilogue,
    /// Each tile waits for its chunk's signal before its first load.
    pub wait: bool,
    /// Contiguous layout: each chunk's groups are its own ends, from row `chunk x t_max` on
    /// (see the module's text). Not with `scheduled`.
    pub chunk_ends: bool,
    /// FP8 with row scales: each K step's product made in a fresh accumulator and added in f32
    /// (`torch._scaled_grouped_mm` without `use_fast_accum`), rather than the whole K
    /// accumulated in the tensor cores, whose FP8 accumulation keeps about 14 bits.
    pub promote: bool,
    /// The tiles walked by a plain persistent loop over a schedule made on the device
    /// ([`crate::grouped_schedule`]; a second, one-program launch before the GEMM), rather than
    /// by each program walking the groups: the loop the lowering pipelines across tiles (the
    /// next tile's copies during this tile's epilogue, with a producer warp where there are
    /// TMA and `wgmma` and no wait). Needs a scratch buffer ([`Operands::schedule`]).
    pub scheduled: bool,
    /// C's element type for FP8 operands: bf16 (`torch._scaled_grouped_mm`'s) or f16.
    pub fp8_out: DType,
    /// Consumer ping-pong in the scheduled descriptor form (`LaunchAttrs::pingpong`): two
    /// groups of `warps` consumer warps take the tiles in turn (128 x 128 on 4 warps).
    pub pingpong: bool,
    /// With `chunk_ends`: the walk takes C's columns in bands of this many column tiles, every
    /// chunk's groups over one band before the next band (0: one band, the whole width). For
    /// the reduce-scatter epilogue, whose f32 accumulator is larger than L2 at prefill shapes:
    /// a token's k rows, in k experts' tiles, then add into the same band of its accumulator
    /// row while it is still in L2, at the price of reading A once per band.
    pub band_tiles: u32,
    /// With `wait`: every chunk's signal is set by work enqueued before the GEMM on its stream
    /// or by other devices (`LaunchAttrs::signalled_before`): where a rank has the GPU to
    /// itself, the persistent grid takes every multiprocessor.
    pub signalled_before: bool,
    /// C written through a descriptor of the group's rows (`desc_store`: bulk row copies on
    /// sm_90a, asynchronous like a TMA store, the rows past the group not written) instead of
    /// masked stores from the accumulator. On by default; [`GroupedGemm::specialized`] keeps
    /// it for the descriptor form only where C is 16-byte aligned and its rows whole 16-byte
    /// chunks, and the epilogue stores 16-bit C (not `reduce_scatter` or `quantize`). Off, the
    /// benchmark's comparison.
    pub bulk_store: bool,
}


impl GroupedGemm {
    pub fn new(dtype: DType, layout: Layout, b_layout: BLayout) -> GroupedGemm {
        GroupedGemm {
            dtype,
            scales: if dtype.is_fp8() { Scales::Row } else { Scales::None },
            layout,
            b_layout,
            block_m: 64,
            block_n: 64,
            block_k: 32,
            warps: 4,
            stages: 2,
            descriptors: false,
            divisible: false,
            epilogue: Epilogue::default(),
            wait: false,
            chunk_ends: false,
            promote: false,
            scheduled: false,
            pingpong: false,
            fp8_out: DType::BF16,
            band_tiles: 0,
            signalled_before: false,
            bulk_store: true,
        }
    }

    /// This GEMM with `epilogue`, its tiles fitted to it ([`GroupedGemm::fitted`]).
    pub fn with_epilogue(self, epilogue: Epilogue) -> GroupedGemm {
        GroupedGemm { epilogue, ..self }.fitted()
    }

    /// This GEMM with `scales` and `promote`, its tiles fitted to them ([`GroupedGemm::fitted`]).
    pub fn with_scales(self, scales: Scales, promote: bool) -> GroupedGemm {
        GroupedGemm { scales, promote, ..self }.fitted()
    }

    /// The descriptor form's tiles fitted to the epilogue and scales: SwiGLU takes 256-column
    /// tiles of B (one gate/up pair: 128 output columns); a promotion (block scales, or
    /// `promote`) holds a second accumulator, so its tiles are half as big: 64 rows on one
    /// warpgroup with SwiGLU, else at most 128 columns (which block scales need anyway: a
    /// tile's columns within one 128-column scale block).
    ///
    /// [`Epilogue::quantize`] takes tiles of exactly one scale block of output columns (128; in
    /// both forms).
    pub fn fitted(self) -> GroupedGemm {
        let quantized = |g: GroupedGemm| match g.epilogue.quantize {
            true => GroupedGemm { block_n: if g.epilogue.swiglu { 2 * SCALE_BLOCK } else { SCALE_BLOCK }, ..g },
            false => g,
        };
        if !self.descriptors {
            // The portable form's quantizing SwiGLU tile holds two f32 accumulators of 256
            // columns (the block scales' promotion): on 64 rows the AMD targets' code objects
            // spill (230 VGPRs, gfx90a; 32 rows on 4 warps still need 420), so 32 rows on 8
            // warps.
            let g = quantized(self);
            // The chunk walk of a waiting GEMM holds more: 16 rows there (32 spilled 10 VGPRs on
            // 8 warps, 37 on 16).
            let narrow = g.epilogue.quantize && g.epilogue.swiglu;
            let rows = if g.chunk_ends || g.wait { 16 } else { 32 };
            let warps = if g.chunk_ends || g.wait { 4 } else { 8 };
            return GroupedGemm { block_m: if narrow { rows } else { g.block_m }, warps: if narrow { warps } else { g.warps }, ..g };
        }
        let second = self.scales == Scales::Block || self.promote;
        // A promotion keeps its K loop apart from the tile loop, and SwiGLU's epilogue needs
        // shared memory beside the stage ring: neither runs flattened, so neither is scheduled.
        let scheduled = self.scheduled && !second && !self.epilogue.swiglu;
        let fitted = GroupedGemm { scheduled, ..self };
        quantized(match (self.epilogue.swiglu, second) {
            (true, true) => GroupedGemm { block_m: 64, block_n: 2 * SWIGLU_BLOCK, warps: 8, ..fitted },
            (true, false) => GroupedGemm { block_n: 2 * SWIGLU_BLOCK, ..fitted },
            (false, true) => GroupedGemm { block_n: self.block_n.min(SCALE_BLOCK), ..fitted },
            (false, false) => fitted,
        })
    }

    /// The meta-parameters for `target`: where the target has TMA and `wgmma` (sm_90a), the
    /// descriptor form on two warpgroups' 128 x 256 tiles, K steps of 64 over 4 stages (FP8:
    /// scheduled, 128 x 128 tiles, K steps of 128 bytes, 4 stages); the portable form
    /// elsewhere. On an H100 (`results/h100-issue28/0551a34`) the 128 x 256 tiles of the
    /// SwiGLU cases ran the DeepSeek-V3 gate/up prefill at 0.93x `torch._grouped_mm` where
    /// 128 x 128 ran the same main loop at 0.70x. The FP8 row-scaled form on 128 x 256 tiles
    /// with a producer warp spills (528 bytes, ptxas 13.0; 168 registers for 288 threads), so
    /// FP8 starts from the dense FP8 GEMM's tile at 4096^3 and the benchmark sweeps 128 x 256.
    /// A promotion's second accumulator halves the tiles ([`GroupedGemm::fitted`]).
    ///
    /// bf16 walks the groups itself (not `scheduled`): on an H100 (`results/h100-issue28/c0bce89`)
    /// that form was the fastest or within 3% of it at every bf16 case of the benchmark, and the
    /// scheduled form on the same 128 x 256 x 64 / 4-stage tiles took 3.63 against 3.04 ms at
    /// DeepSeek-V3's gate/up prefill. FP8 keeps the schedule, which was 12-20% ahead at prefill.
    pub fn for_target(
        dtype: DType,
        layout: Layout,
        b_layout: BLayout,
        target: Option<&trident_core::target::TargetDesc>,
    ) -> GroupedGemm {
        let base = GroupedGemm::new(dtype, layout, b_layout);
        let fast = target.is_some_and(|t| t.has_tma_wgmma());
        match fast {
            true => {
                let fp8 = dtype.is_fp8();
                let (block_n, block_k) = if fp8 { (128, 128) } else { (256, 64) };
                GroupedGemm { block_m: 128, block_n, block_k, warps: 8, stages: 4, descriptors: true, scheduled: fp8, ..base }
            }
            false => base,
        }
    }

    /// This GEMM specialized for its operands: the descriptor form (where chosen) when A and B
    /// are 16-byte aligned and their rows (K, or N for B `[E, K, N]`) whole 16-byte chunks;
    /// else the portable form at its own meta-parameters. The descriptor form stores C by
    /// rows ([`GroupedGemm::bulk_store`]) where C is 16-byte aligned and its rows whole 16-byte
    /// chunks.
    pub fn specialized(self, a: &Buffer, b: &Buffer, c: &Buffer, n: usize, k: usize) -> GroupedGemm {
        let es = self.dtype.size_bytes() as usize;
        let b_row = if self.b_layout == BLayout::NK { k } else { n };
        // FP8 `wgmma` reads B K-major only.
        let fits = !(self.dtype.is_fp8() && self.b_layout == BLayout::KN)
            && a.address.is_multiple_of(16)
            && b.address.is_multiple_of(16)
            && (k * es).is_multiple_of(16)
            && (b_row * es).is_multiple_of(16)
            && k > 0;
        let rows_store = self.bulk_store
            && self.descriptors
            && self.out_type().size_bytes() == 2
            && !self.epilogue.reduce_scatter
            && !self.epilogue.quantize
            && c.address.is_multiple_of(16)
            && n.is_multiple_of(self.bulk_store_n() as usize);
        match (self.descriptors, fits) {
            (_, true) => GroupedGemm { divisible: true, bulk_store: rows_store, ..self },
            (true, false) => GroupedGemm {
                scales: self.scales,
                epilogue: self.epilogue,
                wait: self.wait,
                chunk_ends: self.chunk_ends,
                promote: self.promote,
                scheduled: self.scheduled,
                fp8_out: self.fp8_out,
                ..GroupedGemm::new(self.dtype, self.layout, self.b_layout)
            }
            .fitted(),
            (false, false) => self,
        }
    }

    /// The bulk store's fact on N (declared by the kernel, checked by `specialized`): C's rows
    /// whole 16-byte chunks, C having N / 2 columns with SwiGLU.
    fn bulk_store_n(&self) -> u32 {
        16 / self.out_type().size_bytes() * if self.epilogue.swiglu { 2 } else { 1 }
    }

    /// C goes out through descriptors of the groups' rows: the bulk store kept, in the
    /// descriptor form.
    fn stores_rows(&self) -> bool {
        self.bulk_store && self.descriptor_form()
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "grouped_gemm".into(), message }
    }

    /// The descriptor form: chosen, specialized, and (with SwiGLU) on tiles of one gate/up pair.
    fn descriptor_form(&self) -> bool {
        self.descriptors && self.divisible && (!self.epilogue.swiglu || self.block_n == 2 * SWIGLU_BLOCK)
    }

    /// C's columns for B's N: halved by SwiGLU.
    pub fn out_cols(&self, n: usize) -> usize {
        if self.epilogue.swiglu {
            n / 2
        } else {
            n
        }
    }

    /// The K step: one scale block in the block-scaled form.
    fn k_step(&self) -> u32 {
        if self.scales == Scales::Block {
            SCALE_BLOCK
        } else {
            self.block_k
        }
    }

    /// The output columns of a tile: B's rows of a tile, halved by SwiGLU.
    fn out_block_n(&self) -> u32 {
        if self.epilogue.swiglu {
            self.block_n / 2
        } else {
            self.block_n
        }
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let (bm, bk) = (self.block_m, self.k_step());
        let desc = self.descriptor_form();
        let Epilogue { swiglu, row_weights, reduce_scatter, notify_owner, quantize } = self.epilogue;
        // The scheduled descriptor form runs its copies from a producer warp (with the wait
        // hook, the producer waits for a tile's chunk before its first copies).
        let warp_specialize = self.scheduled && desc;
        let pingpong = self.pingpong && warp_specialize;
        let name = format!(
            "grouped_gemm_{}_{:?}_{:?}_{bm}x{}x{bk}{}{}{}{}{}{}{}{}{}{}{}",
            self.dtype,
            self.layout,
            self.b_layout,
            self.block_n,
            match self.scales {
                Scales::None => "",
                Scales::Row => "_row_scaled",
                Scales::Block => "_block_scaled",
            },
            if swiglu { "_swiglu" } else { "" },
            if row_weights { "_weighted" } else { "" },
            if reduce_scatter { "_scatter" } else { "" },
            if notify_owner { "_notify" } else { "" },
            if quantize { "_quantized" } else { "" },
            if self.wait { "_waiting" } else { "" },
            if self.chunk_ends { "_chunk_ends" } else { "" },
            if self.promote && self.scales != Scales::Block { "_promoted" } else { "" },
            if desc { "_desc" } else { "" },
            if self.scheduled { "_scheduled" } else { "" }
        )
        .to_lowercase()
            + if pingpong { "_pingpong" } else { "" }
            + if self.stores_rows() { "_rows" } else { "" }
            + if self.dtype.is_fp8() && self.fp8_out == DType::F16 { "_to_f16" } else { "" }
            + &match self.band_tiles {
                0 => String::new(),
                t => format!("_band{t}"),
            };
        let attrs = LaunchAttrs {
            warps: self.warps,
            stages: self.stages,
            persistent: true,
            warp_specialize,
            pingpong,
            signalled_before: self.wait && self.signalled_before,
            ..LaunchAttrs::default()
        };
        let b = KernelBuilder::new(&name, attrs);
        // With `divisible`, the facts that let the portable form's copies be 16-byte vectors
        // (`cp.async` stages) without alignment tests: A and B 16-byte aligned, their rows
        // whole 16-byte chunks.
        let ptr = |name: &str| match self.divisible {
            true => b.arg_ptr_aligned(name, self.dtype, 16),
            false => b.arg_ptr(name, self.dtype),
        };
        let per_chunk = 16 / self.dtype.size_bytes();
        let (a, bp) = (ptr("a"), ptr("b"));
        let c = match self.stores_rows() {
            true => b.arg_ptr_aligned("c", self.out_type(), 16),
            false => b.arg_ptr("c", self.out_type()),
        };
        let groups = b.arg_ptr("groups", DType::I32);
        let schedule = self.scheduled.then(|| b.arg_ptr("schedule", DType::I32));
        let scales =
            (self.scales != Scales::None).then(|| (b.arg_ptr("scale_a", DType::F32), b.arg_ptr("scale_b", DType::F32)));
        let weights = row_weights.then(|| b.arg_ptr("weights", DType::F32));
        let c_scales = quantize.then(|| b.arg_ptr("c_scales", DType::F32));
        let scatter = reduce_scatter.then(|| {
            (b.arg_ptr("row_token", DType::I32), b.arg_ptr("acc", DType::F32), b.arg_ptr("done", DType::U64))
        });
        let owner_done = notify_owner.then(|| b.arg_ptr("done", DType::U64));
        let ready = self.wait.then(|| b.arg_ptr("ready", DType::U64));
        let experts = b.arg("experts", DType::I32);
        let chunks = b.arg("chunks", DType::I32);
        let whole = |name: &str, row: bool| match self.divisible && row {
            true => b.arg_multiple_of(name, DType::I32, per_chunk),
            false => b.arg(name, DType::I32),
        };
        // N's facts: whole 16-byte chunks of B's rows (B `[E, K, N]`), of C's rows for the
        // bulk store (twice that with SwiGLU, whose C has N / 2 columns).
        let b_rows_n = if self.divisible && self.b_layout == BLayout::KN { per_chunk } else { 1 };
        let n_chunk = if self.stores_rows() { b_rows_n.max(self.bulk_store_n()) } else { b_rows_n };
        let n = match n_chunk {
            1 => b.arg("n", DType::I32),
            m => b.arg_multiple_of("n", DType::I32, m),
        };
        let k = whole("k", true);
        let t_max = b.arg("t_max", DType::I32);
        // A's rows and B's (`E N` or `E K`) in all: the descriptors' extents.
        let (a_rows, b_rows) = (b.arg("a_rows", DType::I32), b.arg("b_rows", DType::I32));
        let target = self.wait.then(|| b.arg("target", DType::U64));
        let n_out = if swiglu { n / 2 } else { n };
        let k_blocks = self.scheduled.then(|| (k + (bk as i32 - 1)) / bk as i32);
        let k_ =
            Kernel { b: &b, bp, c, scales, weights, c_scales, scatter, owner_done, t_max, a_rows, n, n_out, k, k_blocks };
        let db = desc.then(|| {
            let one = b.constant(trident_core::ir::Literal::Int(1), DType::I32);
            match self.b_layout {
                BLayout::NK => b.make_desc(bp, [b_rows, k], [k, one], [self.block_n, bk]),
                BLayout::KN => b.make_desc(bp, [b_rows, n], [n, one], [bk, self.block_n]),
            }
        });
        // Without a wait, A's descriptor is made once; with one, each tile makes it from A
        // after its wait (the descriptor carries the wait's token).
        let da = (desc && !self.wait).then(|| k_.a_desc(a, bm, bk));

        let (pid, programs) = (b.program_id_x(), b.num_programs(Axis::X));
        let tiles_n = (n_out + (self.out_block_n() as i32 - 1)) / self.out_block_n() as i32;
        // The tile of (group `g`, row tile `tm`, column tile `tn`): its wait, then the tile.
        let run_tile = |g: Tile, (first, rows): (Tile, Tile), (tm, tn): (Tile, Tile)| {
            let (e, chunk) = (g % experts, g / experts);
            let (a_t, da_t) = match (ready, target) {
                (Some(ready), Some(target)) => {
                    let tok = b.wait(ready + chunk, 1, CmpOp::Ge, target, Scope::Sys, MemSemantic::Acquire);
                    let a_t = a.consume_token(tok);
                    (a_t, desc.then(|| k_.a_desc(a_t, bm, bk)))
                }
                _ => (a, da),
            };
            self.tile(&k_, a_t, da_t.zip(db), (e, chunk), (first, rows), (tm, tn));
        };
        if self.chunk_ends {
            self.walk_chunks(&k_, (a, da, db), (groups, ready.zip(target)), (experts, chunks, t_max), tiles_n);
            return b.finish();
        }
        if let Some(schedule) = schedule {
            // Tiles numbered row tile by row tile in the schedule's order (see
            // `grouped_schedule`), each reading its group from the schedule.
            let groups_n = experts * chunks;
            let count = b.load(schedule + groups_n, None, None);
            let total = count * tiles_n;
            b.for_range(pid, total, programs, &[], |t, _| {
                let (mt, tn) = (t / tiles_n, t % tiles_n);
                // The lowering may read a tile's records ahead, past the program's last tile:
                // clamped, every read stays inside the schedule and the groups.
                let record = mt.min(count - 1).max(0);
                let g = b.load(schedule + (groups_n + 1) + record, None, None).min(groups_n - 1).max(0);
                let tm = mt - b.load(schedule + g, None, None);
                // `groups[g]`: the group's end (contiguous) or its row count (masked).
                let entry = b.load(groups + g, None, None);
                let (first, rows) = match self.layout {
                    Layout::Contiguous => {
                        let first = b.load_or(groups + (g - 1), g.gt(0), 0);
                        (first, entry - first)
                    }
                    Layout::Masked => (g * t_max, entry.min(t_max)),
                };
                run_tile(g, (first, rows), (tm, tn));
                Vec::new()
            });
            return b.finish();
        }
        let zero = b.constant(trident_core::ir::Literal::Int(0), DType::I32);
        // Carried over the groups: this program's next tile number, where the group's rows
        // start (contiguous), and the number of the group's first tile.
        b.for_range(0, experts * chunks, 1, &[pid, zero, zero], |g, st| {
            let (next, start, tile_base) = (st[0], st[1], st[2]);
            let count = b.load(groups + g, None, None);
            let (first, rows) = match self.layout {
                Layout::Contiguous => (start, count - start),
                Layout::Masked => (g * t_max, count),
            };
            let (after, end) = group_tiles(&b, (next, tile_base), (rows, bm, tiles_n, programs), &|tile| {
                run_tile(g, (first, rows), tile);
            });
            let start = match self.layout {
                Layout::Contiguous => count,
                Layout::Masked => start,
            };
            vec![after, start, end]
        });
        b.finish()
    }

    /// The walk of [`GroupedGemm::chunk_ends`]: chunk by chunk (from this rank's own with a
    /// wait: each chunk's signal before its ends are read), each chunk's groups from its first
    /// row `chunk x t_max`; tile numbers run on over the chunks as in the plain walk.
    #[allow(clippy::type_complexity)]
    fn walk_chunks<'b>(
        &self,
        kn: &Kernel<'b>,
        (a, da, db): (Tile<'b>, Option<Tile<'b>>, Option<Tile<'b>>),
        (groups, ready): (Tile<'b>, Option<(Tile<'b>, Tile<'b>)>),
        (experts, chunks, t_max): (Tile<'b>, Tile<'b>, Tile<'b>),
        tiles_n: Tile<'b>,
    ) {
        let b = kn.b;
        let (pid, programs) = (b.program_id_x(), b.num_programs(Axis::X));
        let zero = b.constant(trident_core::ir::Literal::Int(0), DType::I32);
        // Every chunk over the `tiles_n` column tiles from `first_tn` on (the whole width
        // without bands), from the program's next tile number and the first tile's number
        // `st`; returns them after the walk.
        let banded = self.band_tiles != 0;
        let walk = |st: &[Tile<'b>], (tiles_n, first_tn): (Tile<'b>, Tile<'b>)| {
            b.for_range(0, chunks, 1, st, |ci, st| {
                let (chunk, groups, a, da) = match ready {
                    Some((ready, target)) => {
                        let chunk = (ci + b.rank()) % chunks;
                        let tok = b.wait(ready + chunk, 1, CmpOp::Ge, target, Scope::Sys, MemSemantic::Acquire);
                        let a = a.consume_token(tok);
                        let da = db.is_some().then(|| kn.a_desc(a, self.block_m, self.k_step()));
                        (chunk, groups.consume_token(tok), a, da)
                    }
                    None => (ci, groups, a, da),
                };
                let base = chunk * t_max;
                let after = b.for_range(0, experts, 1, &[st[0], zero, st[1]], |e, s| {
                    let (next, start, tile_base) = (s[0], s[1], s[2]);
                    let end = b.load(groups + (chunk * experts + e), None, None);
                    let rows = end - start;
                    let (after, last) =
                        group_tiles(b, (next, tile_base), (rows, self.block_m, tiles_n, programs), &|(tm, tn)| {
                            let tn = if banded { first_tn + tn } else { tn };
                            self.tile(kn, a, da.zip(db), (e, chunk), (base + start, rows), (tm, tn));
                        });
                    vec![after, end, last]
                });
                vec![after[0], after[2]]
            })
        };
        if !banded {
            walk(&[pid, zero], (tiles_n, zero));
            return;
        }
        // Column bands, each walked over every chunk; tile numbers run on over the bands.
        let band = tiles_n.min(self.band_tiles as i32).max(1);
        let bands = (tiles_n + (band - 1)) / band;
        b.for_range(0, bands, 1, &[pid, zero], |bi, st| {
            let first = bi * band;
            walk(st, (band.min(tiles_n - first), first))
        });
    }

    /// Output tile (`tm`, `tn`) of group `first ..` (`rows` of them) on B's expert `e` (of A's
    /// chunk `chunk`), A read from `a` (or `descs`).
    fn tile<'b>(
        &self,
        kn: &Kernel<'b>,
        a: Tile<'b>,
        descs: TilePair<'b>,
        (e, chunk): (Tile<'b>, Tile<'b>),
        (first, rows): (Tile<'b>, Tile<'b>),
        (tm, tn): (Tile<'b>, Tile<'b>),
    ) {
        let Kernel { b, bp, c, scales, weights, c_scales, scatter, owner_done, t_max, n, n_out, k, k_blocks, .. } = *kn;
        let (bm, bn, bk) = (self.block_m, self.block_n, self.k_step());
        let swiglu = self.epilogue.swiglu;
        let local = tm * bm as i32 + b.arange(0, bm as i64);
        let rows_ok = local.lt(rows).expand_dims(1);
        let rm = (first + local).expand_dims(1);
        // B's rows (N) this tile reads, and whether they are inside B: with SwiGLU, the gate
        // rows of output columns `j` then their up rows, in B's interleaved order.
        let h = self.out_block_n();
        let (b_cols, b_ok) = if swiglu {
            let cc = b.arange(0, bn as i64);
            let j = tn * h as i32 + cc % h as i32;
            let sw = SWIGLU_BLOCK as i32;
            let row = (j / sw) * (2 * sw) + (cc / h as i32) * sw + j % sw;
            (row.expand_dims(0), j.lt(n_out).expand_dims(0))
        } else {
            let row = (tn * bn as i32 + b.arange(0, bn as i64)).expand_dims(0);
            (row, row.lt(n))
        };
        let b_e = bp + e * n * k;
        let acc = b.zeros(&[bm, bn], DType::F32);
        let k_blocks = k_blocks.unwrap_or_else(|| (k + (bk as i32 - 1)) / bk as i32);
        let block = self.scales == Scales::Block;
        // A's and B's tiles of `width` K values from `k0` (the descriptor form's boxes are one
        // K step wide).
        let load = |k0: Tile<'b>, width: u32| match descs {
            // Boxes over every expert's rows; what reaches past this expert's is dropped by the
            // store's mask (or meets A's zeros past K). With SwiGLU the box is one gate/up pair.
            Some((da, db)) => (
                b.desc_load(da, [first + tm * bm as i32, k0]),
                match self.b_layout {
                    BLayout::NK => b.desc_load(db, [e * n + tn * bn as i32, k0]).t(),
                    BLayout::KN => b.desc_load(db, [e * k + k0, tn * bn as i32]),
                },
            ),
            None => {
                let kk = k0 + b.arange(0, width as i64);
                let (kr, kc) = (kk.expand_dims(1), kk.expand_dims(0));
                let in_b = kr.lt(k) & b_ok;
                let tb = match self.b_layout {
                    BLayout::NK => b.load_or(b_e + b_cols * k + kr, in_b, 0.0),
                    BLayout::KN => b.load_or(b_e + kr * n + b_cols, in_b, 0.0),
                };
                (b.load_or(a + rm * k + kc, rows_ok & kc.lt(k), 0.0), tb)
            }
        };
        // The portable form's block-scaled tiles of 256 columns (a quantizing SwiGLU tile) take
        // each 128-wide K block in steps of `block_k`: a whole block of B, converted to 16 bits
        // for the matrix atoms, would be the 64 KB of shared memory an AMD target gives.
        let sub = if block && descs.is_none() && bn > SCALE_BLOCK { self.block_k.min(bk) } else { bk };
        let done = b.for_range(0, k_blocks, 1, &[acc], |kb, carried| {
            let k0 = kb * bk as i32;
            match (block, scales) {
                // Each K block's product promoted with its scales: A's per row and block, B's
                // per expert and 128 x 128 block (per column: a SwiGLU tile spans two blocks).
                (true, Some((sa, sb))) => {
                    let zero = b.zeros(&[bm, bn], DType::F32);
                    let part = match sub < bk {
                        true => {
                            let steps = (bk / sub) as i32;
                            b.for_range(0, steps, 1, &[zero], |s, c| {
                                let (ta, tb) = load(k0 + s * sub as i32, sub);
                                vec![b.dot(ta, tb, c[0], InputPrecision::Ieee)]
                            })[0]
                        }
                        false => {
                            let (ta, tb) = load(k0, bk);
                            b.dot(ta, tb, zero, InputPrecision::Ieee)
                        }
                    };
                    let s_a = b.load_or(sa + rm * k_blocks + kb, rows_ok, 0.0);
                    let n_blocks = (n + (SCALE_BLOCK as i32 - 1)) / SCALE_BLOCK as i32;
                    let s_b = if swiglu {
                        b.load_or(sb + (e * n_blocks + b_cols / SCALE_BLOCK as i32) * k_blocks + kb, b_ok, 0.0)
                    } else {
                        let col_block = (tn * bn as i32) / SCALE_BLOCK as i32;
                        b.load(sb + (e * n_blocks + col_block) * k_blocks + kb, None, None)
                    };
                    vec![carried[0] + part * (s_a * s_b)]
                }
                // Each K step's product added in f32 (a promotion without scales).
                _ if self.promote => {
                    let (ta, tb) = load(k0, bk);
                    vec![carried[0] + b.dot(ta, tb, b.zeros(&[bm, bn], DType::F32), InputPrecision::Ieee)]
                }
                _ => {
                    let (ta, tb) = load(k0, bk);
                    vec![b.dot(ta, tb, carried[0], InputPrecision::Ieee)]
                }
            }
        });
        let mut out = match (block, scales) {
            (false, Some((sa, sb))) => {
                let s_a = b.load_or(sa + rm, rows_ok, 0.0);
                let s_b = b.load_or(sb + e * n + b_cols, b_ok, 0.0);
                done[0] * s_a * s_b
            }
            _ => done[0],
        };
        if swiglu {
            // [bm, (gate | up), h]: the halves apart by a select and a sum over the pair.
            let pair = out.reshape(&[bm, 2, h]);
            let which = b.arange(0, 2).reshape(&[1, 2, 1]);
            let gate = which.eq(0).select(pair, 0.0).reduce(ReduceOp::Sum, 1);
            let up = which.eq(1).select(pair, 0.0).reduce(ReduceOp::Sum, 1);
            out = gate * gate.sigmoid() * up;
        }
        if let Some(w) = weights {
            out = out * b.load_or(w + rm, rows_ok, 0.0);
        }
        let cols = (tn * h as i32 + b.arange(0, h as i64)).expand_dims(0);
        let inside = rows_ok & cols.lt(n_out);
        // `notify_owner`: the chunk's rows go to its rank, after the rows of the ranks before
        // this one.
        let c = match owner_done {
            Some(_) => b.symm_at(c, chunk) + (b.rank() - chunk) * t_max * n_out,
            None => c,
        };
        match scatter {
            // Into the owner's accumulator at each row's token (counted below).
            Some((row_token, acc, _)) => {
                let token = b.load_or(row_token + rm, rows_ok, 0i32);
                let dst = b.symm_at(acc, chunk) + token * n_out + cols;
                b.atomic(AtomicOp::Add, dst, out, Some(inside), MemSemantic::Relaxed, Scope::Sys);
            }
            None => match c_scales {
                // Each row's 128 columns quantized as the FP8 dispatch quantizes (the columns
                // past C's, which may be the next expert's products, left out of the maximum).
                Some(c_scales) => {
                    let v = cols.lt(n_out).select(out, 0.0f32);
                    let amax = v.abs().max_along(1);
                    let inv = amax.gt(0.0f32).select(b.full(&[bm], 448.0, DType::F32) / amax, 0.0f32);
                    let q = v * inv.expand_dims(1).broadcast_to(&[bm, h]);
                    b.store(c + rm * n_out + cols, q.cast(DType::F8E4M3FN), Some(inside));
                    let blocks = (n_out + (SCALE_BLOCK as i32 - 1)) / SCALE_BLOCK as i32;
                    b.store(c_scales + rm * blocks + tn, (amax / 448.0f32).expand_dims(1), Some(rows_ok));
                }
                // The group's rows as a tensor: rows past it are not written.
                None if self.stores_rows() => {
                    let one = b.constant(trident_core::ir::Literal::Int(1), DType::I32);
                    let dc = b.make_desc(c + first * n_out, [rows, n_out], [n_out, one], [bm, h]);
                    b.desc_store(dc, [tm * bm as i32, tn * h as i32], out.cast(self.out_type()));
                }
                None => b.store(c + rm * n_out + cols, out.cast(self.out_type()), Some(inside)),
            },
        }
        // `reduce_scatter` and `notify_owner`: the owner counts the tile's elements (the
        // notify's program barrier and release order the atomics or the stores, bulk ones
        // waited for first).
        if let Some(done) = scatter.map(|(_, _, done)| done).or(owner_done) {
            let rows_in = (rows - tm * bm as i32).min(bm as i32);
            let cols_in = (n_out - tn * h as i32).min(h as i32);
            b.notify(done, chunk, (rows_in * cols_in).cast(DType::U64), SignalOp::Add, CommScope::IntraNode);
        }
    }

    /// The elements of `scale_a` and `scale_b` for `a_rows` rows of A and `experts` experts of
    /// `n x k`.
    pub fn scale_lens(&self, a_rows: usize, experts: usize, n: usize, k: usize) -> (usize, usize) {
        let (blk, kb) = (SCALE_BLOCK as usize, k.div_ceil(SCALE_BLOCK as usize));
        match self.scales {
            Scales::None => (0, 0),
            Scales::Row => (a_rows, experts * n),
            Scales::Block => (a_rows * kb, experts * n.div_ceil(blk) * kb),
        }
    }

    /// C's element type: E4M3FN with [`Epilogue::quantize`], else `fp8_out` for FP8 operands,
    /// else the operands'.
    pub fn out_type(&self) -> DType {
        if self.epilogue.quantize {
            DType::F8E4M3FN
        } else if self.dtype.is_fp8() {
            self.fp8_out
        } else {
            self.dtype
        }
    }

    /// The launch's grid and arguments, checked against the buffers (`None`: nothing to do).
    /// The grid covers the most tiles any routing can make (contiguous: every row in one
    /// group's tiles, plus a partial tile per group; masked: every group full); the runtime
    /// runs as many of them as are resident.
    pub fn plan(&self, ops: Operands<'_>, p: Groups) -> Result<Option<Launch>, BackendError> {
        if !(matches!(self.dtype, DType::BF16 | DType::F16) || self.dtype.is_fp8()) {
            return Err(self.problem(format!("operands of `{}`: bf16, f16 or an FP8 type", self.dtype)));
        }
        if !matches!(self.fp8_out, DType::BF16 | DType::F16) {
            return Err(self.problem(format!("C of FP8 operands in `{}`: bf16 or f16", self.fp8_out)));
        }
        if ops.scales.is_some() != (self.scales != Scales::None) {
            return Err(self.problem(match self.scales {
                Scales::None => "scales given to a grouped GEMM without them (`scales`)".into(),
                _ => "scale_a and scale_b are needed".into(),
            }));
        }
        if ops.weights.is_some() != self.epilogue.row_weights {
            return Err(self.problem("row weights: given exactly when the epilogue has `row_weights`".into()));
        }
        if ops.ready.is_some() != self.wait {
            return Err(self.problem("ready signals: given exactly when the GEMM waits (`wait`)".into()));
        }
        if ops.scatter.is_some() != self.epilogue.reduce_scatter {
            return Err(self.problem("row tokens, accumulator and done signal: given exactly with `reduce_scatter`".into()));
        }
        if ops.owner_done.is_some() != self.epilogue.notify_owner {
            return Err(self.problem("the owners' done signal: given exactly with `notify_owner`".into()));
        }
        if self.epilogue.notify_owner
            && (self.epilogue.reduce_scatter || self.epilogue.quantize || !self.chunk_ends)
        {
            return Err(self.problem(
                "`notify_owner`: `chunk_ends` (contiguous), C stored (not `reduce_scatter` or `quantize`)".into(),
            ));
        }
        if ops.c_scales.is_some() != self.epilogue.quantize {
            return Err(self.problem("C's scales: given exactly when the epilogue has `quantize`".into()));
        }
        if self.epilogue.quantize && (self.epilogue.reduce_scatter || self.out_block_n() != SCALE_BLOCK) {
            return Err(self.problem(format!(
                "`quantize`: C stored (not `reduce_scatter`), tiles of {SCALE_BLOCK} output columns (block_n = {})",
                self.block_n
            )));
        }
        if self.epilogue.reduce_scatter && (self.epilogue.swiglu || self.layout != Layout::Contiguous) {
            return Err(self.problem("`reduce_scatter`: contiguous layout, no SwiGLU".into()));
        }
        if self.chunk_ends && (self.layout != Layout::Contiguous || self.scheduled || !p.rows.is_multiple_of(p.chunks.max(1))) {
            return Err(self.problem(format!(
                "`chunk_ends`: contiguous layout, not scheduled, {} rows whole chunks of {}",
                p.rows, p.chunks
            )));
        }
        if self.scales == Scales::Block && !SCALE_BLOCK.is_multiple_of(self.out_block_n()) {
            return Err(self.problem(format!("block_n = {} does not divide {SCALE_BLOCK}", self.block_n)));
        }
        let Groups { experts, n, k, rows, chunks } = p;
        let pair = 2 * SWIGLU_BLOCK as usize;
        if self.epilogue.swiglu && !n.is_multiple_of(pair) {
            return Err(self.problem(format!(
                "SwiGLU: N = {n} is not whole gate/up pairs of {SWIGLU_BLOCK} rows each (a multiple of {pair})"
            )));
        }
        if self.epilogue.swiglu && !(self.block_n.is_multiple_of(2) && SWIGLU_BLOCK.is_multiple_of(self.block_n / 2)) {
            return Err(self.problem(format!("SwiGLU: block_n = {} is not 2 x a divisor of {SWIGLU_BLOCK}", self.block_n)));
        }
        let es = self.dtype.size_bytes() as usize;
        let out_es = self.out_type().size_bytes() as usize;
        let n_out = self.out_cols(n);
        let groups = experts * chunks;
        let a_rows = match self.layout {
            Layout::Contiguous => rows,
            Layout::Masked => groups * rows,
        };
        require_bytes(ops.a, a_rows * k * es, "a")?;
        require_bytes(ops.b, experts * n * k * es, "b")?;
        // With `reduce_scatter` the product goes to `acc` (C is not written).
        if !self.epilogue.reduce_scatter {
            require_bytes(ops.c, a_rows * n_out * out_es, "c")?;
        }
        require_bytes(ops.groups, groups * 4, "groups")?;
        if let Some((sa, sb)) = ops.scales {
            let (la, lb) = self.scale_lens(a_rows, experts, n, k);
            require_bytes(sa, la * 4, "scale_a")?;
            require_bytes(sb, lb * 4, "scale_b")?;
        }
        if let Some(w) = ops.weights {
            require_bytes(w, a_rows * 4, "weights")?;
        }
        if let Some(s) = ops.c_scales {
            require_bytes(s, a_rows * n_out.div_ceil(SCALE_BLOCK as usize) * 4, "c_scales")?;
        }
        if let Some((ready, _)) = ops.ready {
            require_bytes(ready, chunks * 8, "ready")?;
        }
        // Every element offset is computed in i32.
        require_i32(a_rows * k.max(n), "rows x max(n, k)")?;
        require_i32(experts * n * k, "experts x n x k")?;
        if self.scheduled && groups > crate::grouped_schedule::MAX_GROUPS {
            return Err(self.problem(format!(
                "{groups} groups: the scheduled form takes at most {}",
                crate::grouped_schedule::MAX_GROUPS
            )));
        }
        match (self.scheduled, ops.schedule) {
            (true, Some(s)) => require_bytes(s, self.schedule_bytes(p), "schedule")?,
            (true, None) => return Err(self.problem("the scheduled form needs its scratch (`schedule`)".into())),
            (false, _) => {}
        }
        if groups == 0 || n == 0 || a_rows == 0 {
            return Ok(None);
        }
        let (bm, bn) = (self.block_m as usize, self.out_block_n() as usize);
        let tiles = match self.layout {
            Layout::Contiguous => (cdiv(rows, bm) + groups) * cdiv(n_out, bn),
            Layout::Masked => groups * cdiv(rows, bm) * cdiv(n_out, bn),
        };
        let mut args = vec![ops.a.arg(), ops.b.arg(), ops.c.arg(), ops.groups.arg()];
        args.extend(ops.schedule.filter(|_| self.scheduled).map(Buffer::arg));
        if let Some((sa, sb)) = ops.scales {
            args.extend([sa.arg(), sb.arg()]);
        }
        args.extend(ops.weights.map(Buffer::arg));
        args.extend(ops.c_scales.map(Buffer::arg));
        if let Some((row_token, acc, done)) = ops.scatter {
            require_bytes(row_token, a_rows * 4, "row_token")?;
            require_bytes(done, 8, "done")?;
            args.extend([row_token.arg(), acc.arg(), done.arg()]);
        }
        if let Some(done) = ops.owner_done {
            require_bytes(done, 8, "done")?;
            args.push(done.arg());
        }
        args.extend(ops.ready.map(|(r, _)| r.arg()));
        args.extend([
            KernelArg::i32(require_i32(experts, "experts")?),
            KernelArg::i32(require_i32(chunks, "chunks")?),
            KernelArg::i32(require_i32(n, "n")?),
            KernelArg::i32(require_i32(k, "k")?),
            // The masked layout's capacity per group, or each chunk's rows with `chunk_ends`.
            KernelArg::i32(require_i32(if self.chunk_ends { rows / chunks } else { rows }, "t_max")?),
            KernelArg::i32(require_i32(a_rows, "a_rows")?),
            KernelArg::i32(require_i32(experts * if self.b_layout == BLayout::NK { n } else { k }, "b_rows")?),
        ]);
        args.extend(ops.ready.map(|(_, target)| KernelArg::u64(target)));
        Ok(Some(([require_i32(tiles, "tiles")? as u32, 1, 1], args)))
    }

    /// The bytes of [`Operands::schedule`] for problem `p` ([`GroupedGemm::scheduled`]).
    pub fn schedule_bytes(&self, p: Groups) -> usize {
        use crate::grouped_schedule::{capacity, schedule_words};
        let groups = p.experts * p.chunks;
        4 * schedule_words(groups, capacity(self.layout, groups, p.rows, self.block_m as usize))
    }

    /// The schedule kernel's launch ([`crate::grouped_schedule`]), to run before
    /// [`GroupedGemm::plan`]'s on the same stream: one program; `None` with nothing to do.
    pub fn schedule_plan(&self, ops: Operands<'_>, p: Groups) -> Result<Option<Launch>, BackendError> {
        let Some(s) = ops.schedule.filter(|_| self.scheduled) else {
            return Err(self.problem("the scheduled form needs its scratch (`schedule`)".into()));
        };
        require_bytes(s, self.schedule_bytes(p), "schedule")?;
        let groups = p.experts * p.chunks;
        if groups == 0 {
            return Ok(None);
        }
        let cap = crate::grouped_schedule::capacity(self.layout, groups, p.rows, self.block_m as usize);
        let args = vec![
            ops.groups.arg(),
            s.arg(),
            KernelArg::i32(require_i32(groups, "groups")?),
            KernelArg::i32(require_i32(p.rows, "t_max")?),
            KernelArg::i32(require_i32(cap, "capacity")?),
        ];
        Ok(Some(([1, 1, 1], args)))
    }

    /// The schedule kernel of this GEMM's row tiles.
    pub fn build_schedule(&self) -> Result<Function, VerifyError> {
        crate::grouped_schedule::build(self.layout, self.block_m)
    }

    /// The kernel-cache key of [`GroupedGemm::build_schedule`] (what it depends on).
    pub fn schedule_key(&self) -> String {
        format!("grouped_gemm schedule {:?} {}", self.layout, self.block_m)
    }

    /// [`GroupedGemm::plan`] (after [`GroupedGemm::schedule_plan`] when scheduled), launched on
    /// `l`'s device; a scheduled GEMM without a scratch buffer gets one for the call.
    pub fn run(&self, l: &DeviceCtx, ops: Operands<'_>, p: Groups) -> Result<(), BackendError> {
        let op = self.specialized(ops.a, ops.b, ops.c, p.n, p.k);
        if op.scheduled && ops.schedule.is_none() {
            let scratch = l.device.alloc(op.schedule_bytes(p).max(4), "grouped_gemm.schedule")?;
            let done = op.run(l, Operands { schedule: Some(&scratch), ..ops }, p);
            l.device.free(&scratch)?;
            return done;
        }
        if op.scheduled {
            if let Some((grid, args)) = op.schedule_plan(ops, p)? {
                let kernel = l.compile(op.schedule_key(), || op.build_schedule())?;
                l.launch(&kernel, grid, &args)?;
            }
        }
        let Some((grid, args)) = op.plan(ops, p)? else { return Ok(()) };
        let kernel = l.compile(format!("{op:?}"), || op.build())?;
        l.launch(&kernel, grid, &args)
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "grouped_gemm",
        operation: "grouped_gemm",
        distributed: false,
        build: |d| GroupedGemm::new(d, Layout::Contiguous, BLayout::NK).build(),
    }
}

// The descriptor form on one warpgroup's 64 x 64 tiles (every target's shared memory holds
// them): TMA boxes over all experts and `wgmma` on sm_90a.
inventory::submit! {
    crate::Catalogued {
        name: "grouped_gemm_desc",
        operation: "grouped_gemm",
        distributed: false,
        build: |d| {
            let base = GroupedGemm::new(d, Layout::Contiguous, BLayout::NK);
            GroupedGemm { block_k: 64, descriptors: true, divisible: true, ..base }.build()
        },
    }
}
