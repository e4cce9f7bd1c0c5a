//! The tensor-parallel MoE block: every rank holds a shard of every expert (the intermediate
//! size `F` split over the ranks, `F_l = F / W` each) and its own tokens; the block gathers the
//! tokens, runs each expert's shard on all of them, and reduces the shards' partial outputs home
//! with the top-k weights. Three kernels and two grouped GEMMs on one stream per call:
//!
//! 1. **route + gather** (one persistent launch, its programs meeting between phases): the
//!    rank's `(token, k-slot)` pairs counted per expert, each pair given a row of the rank's
//!    chunk in expert order (`cap = T_max k` rows per chunk, then [`CHUNK_PAD`] rows nobody
//!    writes; within an expert in the order the pairs took their places), and written to every
//!    rank (`rows [W (cap + pad), H]`, with each row's
//!    token `row_token` and routing weight `row_weight`), and the chunk's group ends (`ends [W,
//!    E]`, counted from the chunk's first row) before them; then `ready[rank]` is set to 1 on
//!    every rank;
//! 2. **AG + grouped GEMM** gate/up with SwiGLU ([`GroupedGemm::chunk_ends`] with `wait`): a
//!    program waits for chunk c's signal before it reads c's ends, and walks the chunks from
//!    its rank's own (already there) on, so the gather of the other chunks overlaps the GEMM:
//!    `act [W (cap + pad), F_l]`;
//! 3. **grouped GEMM + top-k reduction + reduce-scatter** down, in one of two forms
//!    ([`TpReduce`]): with [`TpReduce::Atomics`] ([`Epilogue::reduce_scatter`]) each row of
//!    chunk c times its weight is added (f32 atomics) into the token's row of `acc` on rank c;
//!    with [`TpReduce::Rows`] ([`Epilogue::notify_owner`]) it is stored, in the element type,
//!    into rank c's `parts` at (this rank, its row of the chunk). Either way rank c's `done`
//!    grows by each tile's elements;
//! 4. **finish** on the owner: once `done` reached `W x` its own chunk's rows `x H`, the
//!    result in the element type into `out [T, H]` (`acc` rounded, then cleared; or each
//!    token's `k` rows of every shard's `parts` added in f32 in a fixed order, found through
//!    `pair_row`, which the route wrote), `done` and this rank's `ready` signals reset for the
//!    next call; then `consumed[rank]` is set to the call's epoch on every rank.
//!
//! Reuse. The gathered buffers are single (the gate/up GEMM reads the rows through one tensor
//! map, which the host encodes from the argument: the device could not pick a half of a double
//! buffer). A rank's route of call e+1 first waits until every rank's `consumed` says it
//! finished call e (its finish runs after both GEMMs read the chunks), so it never writes a
//! chunk a peer still reads; the `ready` signals, reset by each rank's finish before it says so,
//! are set again only after that. `acc` (or `parts`) and `done` of rank c take call e+1's
//! writes only from tiles of chunk c, which wait for rank c's route of call e+1 (the down GEMM
//! after the gate/up GEMM that waited), enqueued after its finish of call e.
//!
//! Replay. No launch argument depends on the call: the route and the finish keep their epochs
//! on the device ([`crate::epoch`]; the route's meets and its scratch halves, the finish's
//! `consumed` value come from them), and the GEMMs wait for `ready >= 1`. A recorded call
//! replays (`trident_core::capture`, CUDA graphs).
//!
//! FP8 ([`TpMoeBlock::fp8`]): the route quantizes each row it gathers to E4M3FN with a scale
//! per 128 channels (`row_scales`, beside the rows), both grouped GEMMs are block-scaled FP8
//! (each rank's shards E4M3FN with a scale per 128 x 128 block), and the gate/up GEMM's
//! epilogue quantizes the SwiGLU output the same way (`act` and `act_scales`), as the
//! expert-parallel FP8 block does ([`crate::moe_block`]).
//!
//! Rounding: `act` is stored in the element type (as the plain MoE does), each shard's down
//! product is added in f32 per element (in no fixed order with the atomics; with `Rows`
//! each weighted row rounded to the element type first, as a plain grouped GEMM's C and a
//! reduce-scatter in the element type round it, then added in token slot, then rank order:
//! the same bits every call), and `out` rounded once. Peers are reached by loads, stores and
//! atomics on their memory (`symm_at`): one node, as tensor parallelism runs.

use crate::ep_all_to_all::{each_block, EpShape};
use crate::epoch::{state_arg, Epoch};
use crate::ep_all_to_all::{quantize_row, QUANT_BLOCK};
use crate::grouped_gemm::{BLayout, Epilogue, GroupedGemm, Groups, Layout, Operands, Scales};
use crate::moe_block::Experts;
use crate::{require_bytes, require_i32};
use crate::moe_block::{check_block, prepare};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{AtomicOp, Axis, CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, ReduceOp, Scope, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, VerifyError};

/// Rows after each chunk's capacity that no rank writes: the grouped GEMM reads A in boxes of
/// `block_m` rows over the whole gathered buffer (one tensor map, TMA), so a chunk's last tile
/// reads past the chunk; those rows must not be the next chunk's while a peer writes them. The
/// largest TMA box has 256 rows.
pub const CHUNK_PAD: usize = 256;

/// Accumulators (bytes) above which the down GEMM walks column bands by default: half the
/// 50 MB L2 of an H100 or H200, so that a band's rows stay in L2 between a token's additions.
pub const BAND_ABOVE: usize = 24 << 20;

/// The route's (token, k-slot) pairs per program: its grid is the chunk's capacity over this (at
/// most `max_programs`): DeepSeek-V3's decode (128 tokens, top-8) on 64 programs, prefill on
/// what is resident of 2048; every program takes part in three meets, so few of them where
/// there is little to do.
const PAIRS_PER_PROGRAM: usize = 16;

/// How the down GEMM's weighted rows reach their token's rank and are added there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TpReduce {
    /// Added into the owner's f32 accumulator by the epilogue (system-scope atomics into
    /// peer memory), rounded by the finish.
    #[default]
    Atomics,
    /// Stored by the epilogue into the owner's `parts` (the element type, plain stores: the
    /// bulk row copies where C allows them), each token's rows added by the finish. No atomics
    /// on the data and a fixed order of the sums; `parts` holds every rank's rows of the
    /// owner's chunk (`W (cap + pad) x H` elements a rank, where `acc` is `T_max x H` f32),
    /// and the finish reads `W k` rows a token.
    Rows,
}

/// The block's meta-parameters: the element type (bf16 or f16), each rank's shard of the
/// experts' intermediate size `F_l` (a multiple of [`crate::grouped_gemm::SWIGLU_BLOCK`]), the elements of a row
/// copied per step and the route and finish grids (persistent: what is resident of them runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TpMoeBlock {
    pub dtype: DType,
    pub ffn_shard: usize,
    pub block: u32,
    pub max_programs: u32,
    /// FP8 (see the module's text): hidden size a multiple of 128.
    pub fp8: bool,
    /// The down GEMM's column bands (`GroupedGemm::band_tiles`; `Some(0)`: none): its additions
    /// into the accumulator kept to a band of columns at a time. `None` picks by the
    /// accumulator's size ([`TpMoeBlock::band_for`]).
    pub down_band: Option<u32>,
    /// How the down GEMM's rows are reduced and sent home ([`TpReduce`]).
    pub reduce: TpReduce,
}

/// A rank's buffers of the block (symmetric ones allocated collectively).
pub struct TpMoeBuffers {
    /// Tokens per rank at most (`t_max`), hidden size, experts in all, top-k.
    pub shape: EpShape,
    /// `[W (cap + pad), H]`: every rank's chunk of rows in expert order (symmetric).
    pub rows: Buffer,
    /// `[W, E]` i32: each chunk's group ends, from the chunk's first row.
    pub ends: Buffer,
    /// `[W (cap + pad)]` i32 and f32: each row's token (on the chunk's rank) and weight.
    pub row_token: Buffer,
    pub row_weight: Buffer,
    /// `[W]` u64: chunk c's rows are here once `ready[c]` is 1 (reset by this rank's finish;
    /// symmetric).
    pub ready: Buffer,
    /// `[W]` u64: rank d finished call e once `consumed[d] >= e` (symmetric).
    pub consumed: Buffer,
    /// The route's and the finish's epoch words ([`crate::epoch`]; symmetric).
    pub epochs: Buffer,
    /// `[T_max, H]` f32: this rank's tokens' sums of every shard's weighted rows (symmetric;
    /// [`TpReduce::Atomics`], 4 bytes with `Rows`).
    pub acc: Buffer,
    /// [`TpReduce::Rows`]: `[W (cap + pad), H]` in the element type, every rank's weighted
    /// rows of this rank's chunk, rank by rank (symmetric).
    pub parts: Option<Buffer>,
    /// [`TpReduce::Rows`]: `[T_max k]` i32, each of this rank's (token, k-slot) pairs' row in
    /// its chunk, -1 for a pair routed nowhere (local).
    pub pair_row: Option<Buffer>,
    /// u64: the elements added into `acc` this call (symmetric).
    pub done: Buffer,
    /// Local, zeroed: two halves of `[E]` counts and `[E]` fill cursors (i32), `[E]` starts.
    pub scratch: Buffer,
    /// Local, zeroed: the route's meets (programs arrived, over every call) and the finish's
    /// finished programs (u64).
    pub finished: Buffer,
    /// FP8: `[W (cap + pad), H / 128]` f32, each gathered row's scales (symmetric).
    pub row_scales: Option<Buffer>,
    /// `[W (cap + pad), F_l]`: the SwiGLU output of every gathered row (local).
    pub act: Buffer,
    /// FP8: `[W (cap + pad), F_l / 128]` f32, `act`'s scales (local).
    pub act_scales: Option<Buffer>,
    /// `[T_max, H]`: the block's result of the last call (local).
    pub out: Buffer,
    /// Calls enqueued from the host (recorded calls replayed are not counted).
    pub calls: u64,
}

impl TpMoeBuffers {
    /// Rows of each rank's chunk: `T_max k`.
    pub fn cap(&self) -> usize {
        self.shape.t_max * self.shape.top_k
    }

    /// Rows from one chunk's first to the next's: the capacity and [`CHUNK_PAD`].
    pub fn chunk_rows(&self) -> usize {
        self.cap() + CHUNK_PAD
    }

    /// Collective: the signals, counters and accumulators back to zero on every rank, and the
    /// epoch with them (after a timed-out wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        let signals = [&self.ready, &self.consumed, &self.epochs, &self.acc, &self.done, &self.scratch, &self.finished];
        crate::epoch::rearm(ctx, &signals)?;
        self.calls = 0;
        Ok(())
    }
}

/// How [`TpMoeBlock::enqueue_as`] runs a call's four stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpSteps {
    /// On one stream, the kernels' signals ordering the ranks: the block.
    Overlapped,
    /// Each stage once the one before finished on every rank (the host synchronizes and meets
    /// the ranks in between): the same work without overlap, for comparison.
    Sequential,
}

/// One of the block's grouped GEMMs ([`TpMoeBlock::enqueue_gemm`]).
#[derive(Clone, Copy, Debug)]
pub enum TpGemm<'a> {
    /// Gate/up with SwiGLU into `act`, waiting for each chunk's signal (the block's).
    AgGateUp,
    /// The plain grouped GEMM of the same rows and experts into `act`: no chunks, no waits.
    GateUp,
    /// Down with the routing weights and the reduce-scatter epilogue (the block's): adds into
    /// `acc` and `done` again, so [`TpMoeBuffers::rearm`] before the block's next call.
    DownReduceScatter,
    /// The plain grouped GEMM down with the routing weights, each row stored into this buffer
    /// (`[W (cap + pad), H]`, the element type).
    Down(&'a Buffer),
}

impl TpMoeBlock {
    pub fn new(dtype: DType, ffn_shard: usize) -> TpMoeBlock {
        TpMoeBlock {
            dtype,
            ffn_shard,
            block: 1024,
            max_programs: crate::STREAMING_PROGRAMS,
            fp8: false,
            down_band: None,
            reduce: TpReduce::Atomics,
        }
    }

    /// This block with the down GEMM's rows reduced as `reduce` says.
    pub fn reduced_by(self, reduce: TpReduce) -> TpMoeBlock {
        TpMoeBlock { reduce, ..self }
    }

    fn rows_form(&self) -> bool {
        self.reduce == TpReduce::Rows
    }

    /// This block with FP8 rows and shards (see the module's text).
    pub fn fp8(self) -> TpMoeBlock {
        TpMoeBlock { fp8: true, ..self }
    }

    /// What the route gathers and the GEMMs read: E4M3FN in an FP8 block.
    fn payload(&self) -> DType {
        if self.fp8 {
            DType::F8E4M3FN
        } else {
            self.dtype
        }
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "moe_tp".into(), message }
    }

    /// Collective: this rank's buffers for calls of `shape` (`experts` in all, each on every
    /// rank).
    pub fn buffers(&self, ctx: &dyn RankCtx, shape: EpShape) -> Result<TpMoeBuffers, BackendError> {
        check_block(self.dtype, ("intermediate shard", self.ffn_shard)).map_err(|m| self.problem(m))?;
        let EpShape { t_max, hidden, experts, top_k } = shape;
        if experts == 0 || top_k == 0 || hidden == 0 || t_max == 0 {
            return Err(self.problem(format!(
                "shape {t_max} tokens x {hidden} hidden, top-{top_k} of {experts} experts: every extent positive"
            )));
        }
        if self.fp8 && (!hidden.is_multiple_of(QUANT_BLOCK) || !(self.block as usize).is_multiple_of(QUANT_BLOCK)) {
            return Err(self.problem(format!(
                "FP8 rows are quantized in blocks of {QUANT_BLOCK} channels: hidden {hidden} and the copy block {} must be multiples",
                self.block
            )));
        }
        let w = ctx.world_size();
        let (rows, es) = (w * (t_max * top_k + CHUNK_PAD), self.dtype.size_bytes() as usize);
        let ps = self.payload().size_bytes() as usize;
        let blocks = |n: usize| n / QUANT_BLOCK;
        require_i32(rows * hidden, "the gathered rows' elements")?;
        require_i32(rows * self.ffn_shard.max(hidden), "rows x max(F_l, H)")?;
        let zeroed = |bytes: usize, name: &str| crate::epoch::zeroed(ctx, bytes, name);
        Ok(TpMoeBuffers {
            shape,
            rows: ctx.symm_alloc(rows * hidden * ps, "moe_tp_rows")?,
            row_scales: match self.fp8 {
                true => Some(ctx.symm_alloc(rows * blocks(hidden) * 4, "moe_tp_row_scales")?),
                false => None,
            },
            ends: ctx.symm_alloc(w * experts * 4, "moe_tp_ends")?,
            row_token: ctx.symm_alloc(rows * 4, "moe_tp_row_token")?,
            row_weight: ctx.symm_alloc(rows * 4, "moe_tp_row_weight")?,
            ready: ctx.symm_alloc(8 * w, "moe_tp_ready")?,
            consumed: ctx.symm_alloc(8 * w, "moe_tp_consumed")?,
            epochs: crate::epoch::words(ctx, 2, "moe_tp_epochs")?,
            acc: ctx.symm_alloc(if self.rows_form() { 4 } else { 4 * t_max * hidden }, "moe_tp_acc")?,
            parts: match self.rows_form() {
                true => Some(ctx.symm_alloc(rows * hidden * es, "moe_tp_parts")?),
                false => None,
            },
            pair_row: match self.rows_form() {
                true => Some(ctx.alloc(4 * t_max * top_k, "moe_tp_pair_row")?),
                false => None,
            },
            done: ctx.symm_alloc(8, "moe_tp_done")?,
            scratch: zeroed(4 * 5 * experts, "moe_tp_scratch")?,
            finished: zeroed(16, "moe_tp_finished")?,
            act: ctx.alloc(rows * self.ffn_shard * ps, "moe_tp_act")?,
            act_scales: match self.fp8 {
                true => Some(ctx.alloc(rows * blocks(self.ffn_shard) * 4, "moe_tp_act_scales")?),
                false => None,
            },
            out: ctx.alloc(t_max * hidden * es, "moe_tp_out")?,
            calls: 0,
        })
    }

    /// The route + gather kernel (see the module's text).
    pub fn build_route(&self) -> Result<Function, VerifyError> {
        let fp8 = if self.fp8 { "_e4m3" } else { "" };
        let rows_form = if self.rows_form() { "_rows" } else { "" };
        let name = format!("moe_tp_route_{}_{}{fp8}{rows_form}", self.dtype, self.block);
        // Programs meet (the finished count): all of them resident, as many as fit.
        let attrs = LaunchAttrs { cooperative: true, persistent: true, ..LaunchAttrs::default() };
        let b = KernelBuilder::new(&name, attrs);
        let d = self.dtype;
        let (x, topk, weights) = (b.arg_ptr("x", d), b.arg_ptr("topk", DType::I32), b.arg_ptr("weights", DType::F32));
        let (rows, ends) = (b.arg_ptr("rows", self.payload()), b.arg_ptr("ends", DType::I32));
        let row_scales = self.fp8.then(|| b.arg_ptr("row_scales", DType::F32));
        let (row_token, row_weight) = (b.arg_ptr("row_token", DType::I32), b.arg_ptr("row_weight", DType::F32));
        let (ready, consumed) = (b.arg_ptr("ready", DType::U64), b.arg_ptr("consumed", DType::U64));
        let (scratch, state) = (b.arg_ptr("scratch", DType::I32), b.arg_ptr("state", DType::U64));
        let finished = b.arg_ptr("finished", DType::U64);
        let pair_row = self.rows_form().then(|| b.arg_ptr("pair_row", DType::I32));
        let (tokens, hidden) = (b.arg("tokens", DType::I32), b.arg("hidden", DType::I32));
        let (experts, k, stride) = (b.arg("experts", DType::I32), b.arg("top_k", DType::I32), b.arg("chunk_rows", DType::I32));
        let (me, world, pid, programs) = (b.rank(), b.num_ranks(), b.program_id_x(), b.num_programs(Axis::X));
        let ep = Epoch::begin(&b, state);
        let epoch = ep.value;
        // This call's counts and cursors, the last call's (cleared here for the next), starts:
        // the scratch's halves by the call's parity.
        let (now, last) = (ep.parity(), b.i32(1) - ep.parity());
        let (counts, stale, starts) = (scratch + now * 2 * experts, scratch + last * 2 * experts, scratch + experts * 4);
        let cursor = counts + experts;
        let pairs = tokens * k;
        // 0. Every rank finished the last call (its finish read nothing of ours since): the
        // chunks and signals it holds may be written again. Before this program's first meet,
        // so before any program writes to a peer.
        b.for_range(0, world, 1, &[], |d, _| {
            b.wait(consumed + d, 1, CmpOp::Ge, epoch - 1u64, Scope::Sys, MemSemantic::Acquire);
            vec![]
        });
        // Every program's part done before any goes on: the count grows by the grid per meet,
        // three meets per call.
        let meet = |nth: u64| {
            b.barrier();
            b.atomic(AtomicOp::Add, finished, 1u64, None, MemSemantic::AcqRel, Scope::Sys);
            let all = ((epoch - 1u64) * 3u64 + nth) * programs.cast(DType::U64);
            b.wait(finished, 1, CmpOp::Ge, all, Scope::Gpu, MemSemantic::Acquire)
        };
        // 1. Count the pairs per expert; clear the last call's counts and cursors (and every
        // pair's row, set in 3 for the pairs routed somewhere).
        b.for_range(pid, experts * 2, programs, &[], |i, _| {
            b.store(stale + i, 0i32, None);
            vec![]
        });
        b.for_range(pid, pairs, programs, &[], |i, _| {
            let e = b.load(topk + i, None, None);
            b.if_then(e.ge(0) & e.lt(experts), || {
                b.atomic(AtomicOp::Add, counts + e, 1i32, None, MemSemantic::Relaxed, Scope::Gpu);
            });
            if let Some(pr) = pair_row {
                b.store(pr + i, -1i32, None);
            }
            vec![]
        });
        let tok = meet(1);
        // 2. Program 0: the ends (an inclusive sum over the experts, 128 at a time) to every
        // rank's `ends[me]`, the starts here.
        let counts = counts.consume_token(tok);
        b.if_then(pid.eq(0), || {
            const SPAN: i64 = 128;
            let lanes = b.arange(0, SPAN);
            let upto = lanes.expand_dims(0).le(lanes.expand_dims(1));
            let zero = b.i32(0);
            b.for_range(0, (experts + (SPAN as i32 - 1)) / SPAN as i32, 1, &[zero], |blk, carried| {
                let at = blk * SPAN as i32 + lanes;
                let m = at.lt(experts);
                let c = b.load_or(counts + at, m, 0i32);
                let inclusive = upto.select(c.expand_dims(0).broadcast_to(&[SPAN as u32, SPAN as u32]), 0i32);
                let end = carried[0] + inclusive.reduce(ReduceOp::Sum, 1);
                b.store(starts + at, end - c, Some(m));
                b.for_range(0, world, 1, &[], |dst, _| {
                    b.store(b.symm_at(ends, dst) + (me * experts + at), end, Some(m));
                    vec![]
                });
                vec![carried[0] + c.sum(0)]
            });
        });
        let tok = meet(2);
        // 3. Every pair's row: its place in the chunk, then the row, its token and weight to
        // every rank.
        let (starts, cursor) = (starts.consume_token(tok), cursor.consume_token(tok));
        b.for_range(pid, pairs, programs, &[], |i, _| {
            let e = b.load(topk + i, None, None);
            b.if_then(e.ge(0) & e.lt(experts), || {
                let slot = b.atomic(AtomicOp::Add, cursor + e, 1i32, None, MemSemantic::Relaxed, Scope::Gpu);
                let in_chunk = b.load(starts + e, None, None) + slot;
                if let Some(pr) = pair_row {
                    b.store(pr + i, in_chunk, None);
                }
                let row = me * stride + in_chunk;
                let (t, wt) = (i / k, b.load(weights + i, None, None));
                let from = x + t * hidden;
                b.for_range(0, world, 1, &[], |dst, _| {
                    let to = b.symm_at(rows, dst) + row * hidden;
                    match row_scales {
                        Some(sc) => {
                            let sb = hidden / QUANT_BLOCK as i32;
                            quantize_row(&b, self.block, hidden, (from, to, b.symm_at(sc, dst) + row * sb));
                        }
                        None => {
                            each_block(&b, self.block, hidden, &|at, m| b.store(to + at, b.load(from + at, Some(m), None), Some(m)))
                        }
                    }
                    b.store(b.symm_at(row_token, dst) + row, t, None);
                    b.store(b.symm_at(row_weight, dst) + row, wt, None);
                    vec![]
                });
            });
            vec![]
        });
        meet(3);
        // 4. The chunk is everywhere: its signal to every rank.
        b.for_range(pid, world, programs, &[], |dst, _| {
            b.notify(ready + me, dst, 1u64, SignalOp::Set, CommScope::IntraNode);
            vec![]
        });
        ep.end(&b);
        b.finish()
    }

    /// The finish kernel (see the module's text).
    pub fn build_finish(&self) -> Result<Function, VerifyError> {
        let rows_form = if self.rows_form() { "_rows" } else { "" };
        let name = format!("moe_tp_finish_{}_{}{rows_form}", self.dtype, self.block);
        let attrs = LaunchAttrs { persistent: true, ..LaunchAttrs::default() };
        let b = KernelBuilder::new(&name, attrs);
        let sums = match self.rows_form() {
            true => b.arg_ptr("parts", self.dtype),
            false => b.arg_ptr("acc", DType::F32),
        };
        let (done, out) = (b.arg_ptr("done", DType::U64), b.arg_ptr("out", self.dtype));
        let pair_row = self.rows_form().then(|| b.arg_ptr("pair_row", DType::I32));
        let (ends, finished) = (b.arg_ptr("ends", DType::I32), b.arg_ptr("finished", DType::U64));
        let (ready, consumed, state) =
            (b.arg_ptr("ready", DType::U64), b.arg_ptr("consumed", DType::U64), b.arg_ptr("state", DType::U64));
        let (tokens, hidden, experts) = (b.arg("tokens", DType::I32), b.arg("hidden", DType::I32), b.arg("experts", DType::I32));
        let rows_args = pair_row.map(|p| (p, b.arg("top_k", DType::I32), b.arg("chunk_rows", DType::I32)));
        let (me, world, pid, programs) = (b.rank(), b.num_ranks(), b.program_id_x(), b.num_programs(Axis::X));
        let ep = Epoch::begin(&b, state);
        // Every shard's rows of this rank's chunk, each `hidden` elements.
        let own = b.load(ends + (me * experts + experts - 1), None, None).cast(DType::U64);
        let want = own * hidden.cast(DType::U64) * world.cast(DType::U64);
        let tok = b.wait(done, 1, CmpOp::Ge, want, Scope::Sys, MemSemantic::Acquire);
        let sums = sums.consume_token(tok);
        let bs = self.block as i32;
        match rows_args {
            // Each token's `k` rows of every rank's shard, a block of columns at a time: the
            // token's slots in order, each over the ranks in order.
            Some((pair_row, k, stride)) => {
                let blocks = (hidden + (bs - 1)) / bs;
                b.for_range(pid, tokens * blocks, programs, &[], |blk, _| {
                    let (t, cb) = (blk / blocks, blk % blocks);
                    let cols = cb * bs + b.arange(0, self.block as i64);
                    let m = cols.lt(hidden);
                    let zero = b.zeros(&[self.block], DType::F32);
                    let sum = b.for_range(0, k, 1, &[zero], |j, acc| {
                        let row = b.load(pair_row + (t * k + j), None, None);
                        let on = m & row.ge(0);
                        b.for_range(0, world, 1, &[acc[0]], |r, acc| {
                            let at = sums + ((r * stride + row) * hidden + cols);
                            vec![acc[0] + b.load_or(at, on, 0.0).cast(DType::F32)]
                        })
                    });
                    b.store(out + (t * hidden + cols), sum[0].cast(self.dtype), Some(m));
                    vec![]
                });
            }
            None => {
                let total = tokens * hidden;
                b.for_range(pid, (total + (bs - 1)) / bs, programs, &[], |blk, _| {
                    let at = blk * bs + b.arange(0, self.block as i64);
                    let m = at.lt(total);
                    b.store(out + at, b.load(sums + at, Some(m), None).cast(self.dtype), Some(m));
                    b.store(sums + at, 0.0f32, Some(m));
                    vec![]
                });
            }
        }
        // The last program (every one past its wait) resets `done` and the chunks' signals for
        // the next call, and the count of finished programs; then this rank has finished the
        // call: `consumed` says so on every rank (after the resets: the notify releases them).
        b.barrier();
        let before = b.atomic(AtomicOp::Add, finished, 1u64, None, MemSemantic::AcqRel, Scope::Gpu);
        b.if_then(before.eq(programs.cast(DType::U64) - 1u64), || {
            b.store(finished, 0u64, None);
            b.store(done, 0u64, None);
            b.for_range(0, world, 1, &[], |c, _| {
                b.store(ready + c, 0u64, None);
                vec![]
            });
            b.for_range(0, world, 1, &[], |d, _| {
                b.notify(consumed + me, d, ep.value, SignalOp::Set, CommScope::IntraNode);
                vec![]
            });
        });
        ep.end(&b);
        b.finish()
    }

    /// The down GEMM's column bands for `shape` when none is set: 4 column tiles where the f32
    /// accumulator (`[T_max, H]`) is larger than [`BAND_ABOVE`], none below. Measured on an
    /// H100 (a581f9b, `results/h100-session47`): against the unbanded walk, bands of 4 took
    /// the reduce-scatter GEMM from 0.79x to 0.88x of the plain down GEMM at DeepSeek-V3's
    /// prefill (112 MiB accumulator) and from 0.91x to 0.95x at Mixtral's (64 MiB); at
    /// Qwen3's (16 MiB, inside L2) they cost 2%, and at decode sizes they change nothing.
    pub fn band_for(shape: EpShape) -> u32 {
        if shape.t_max * shape.hidden * 4 > BAND_ABOVE {
            4
        } else {
            0
        }
    }

    /// The two grouped GEMMs for this rank's target: gate/up with SwiGLU waiting for the
    /// chunks, and down with the reduce-scatter epilogue.
    fn gemms(&self, ctx: &dyn RankCtx, shape: EpShape) -> (GroupedGemm, GroupedGemm) {
        let base = GroupedGemm::for_target(self.payload(), Layout::Contiguous, BLayout::NK, ctx.gpu_target());
        let base = GroupedGemm { scheduled: false, chunk_ends: true, fp8_out: self.dtype, ..base };
        let base = if self.fp8 { base.with_scales(Scales::Block, false) } else { base };
        let up_epilogue = Epilogue { swiglu: true, quantize: self.fp8, ..Epilogue::default() };
        // The chunks' signals come from the route, enqueued before on the same stream, or from
        // peers: the waiting GEMM need not leave multiprocessors free on a GPU of its own.
        let up = GroupedGemm { wait: true, signalled_before: true, ..base }.with_epilogue(up_epilogue);
        let rows = self.rows_form();
        let down = base.with_epilogue(Epilogue { row_weights: true, reduce_scatter: !rows, notify_owner: rows, ..Epilogue::default() });
        // Bands keep the accumulator's rows in L2 between a token's additions: atomics only.
        let band = if rows { 0 } else { self.down_band.unwrap_or_else(|| Self::band_for(shape)) };
        (up, GroupedGemm { band_tiles: band, ..down })
    }

    /// Enqueues the block for `tokens` rows of `x` (`[tokens, H]`) routed by `topk` (`[tokens,
    /// k]` i32, -1 none) with `weights` (`[tokens, k]` f32), through this rank's shards `w1`
    /// (`[E, 2 F_l, H]`, gate/up interleaved) and `w2` (`[E, H, F_l]`; FP8 with their block
    /// scales in an FP8 block, [`Experts::fp8`]): the result in `bufs.out` (`[tokens, H]`),
    /// valid until the next call is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue<'a>(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut TpMoeBuffers,
        x: &Buffer,
        topk: &Buffer,
        weights: &Buffer,
        experts_w: impl Into<Experts<'a>>,
        tokens: usize,
    ) -> Result<(), BackendError> {
        self.enqueue_as(ctx, bufs, (x, topk, weights), experts_w, tokens, TpSteps::Overlapped)
    }

    /// [`TpMoeBlock::enqueue`] with its stages run as `steps` says.
    pub fn enqueue_as<'a>(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut TpMoeBuffers,
        (x, topk, weights): (&Buffer, &Buffer, &Buffer),
        experts_w: impl Into<Experts<'a>>,
        tokens: usize,
        steps: TpSteps,
    ) -> Result<(), BackendError> {
        let ws = experts_w.into();
        let EpShape { t_max, hidden: h, experts, top_k: k } = bufs.shape;
        let es = self.dtype.size_bytes() as usize;
        if tokens > t_max {
            return Err(self.problem(format!("{tokens} tokens: the buffers hold at most {t_max}")));
        }
        require_bytes(x, tokens * h * es, "x")?;
        require_bytes(topk, tokens * k * 4, "topk")?;
        require_bytes(weights, tokens * k * 4, "weights")?;
        self.require_weights(bufs, ws)?;
        let cap = bufs.cap();
        // Every kernel compiled before the first launch (the world's compiles are collective).
        let route = ctx.compile(&format!("{self:?} route"), &|| self.build_route())?;
        let finish = ctx.compile(&format!("{self:?} finish"), &|| self.build_finish())?;
        let gate_up = self.gemm(ctx, bufs, ws, TpGemm::AgGateUp)?;
        let reduce = self.gemm(ctx, bufs, ws, TpGemm::DownReduceScatter)?;

        let i32_arg = |v: usize, what: &str| require_i32(v, what).map(KernelArg::i32);
        let mut route_args = vec![x.arg(), topk.arg(), weights.arg(), bufs.rows.arg(), bufs.ends.arg()];
        route_args.extend(bufs.row_scales.as_ref().map(Buffer::arg));
        route_args.extend([
            bufs.row_token.arg(),
            bufs.row_weight.arg(),
            bufs.ready.arg(),
            bufs.consumed.arg(),
            bufs.scratch.arg(),
            state_arg(&bufs.epochs, 0),
            bufs.finished.arg(),
        ]);
        route_args.extend(bufs.pair_row.as_ref().map(Buffer::arg));
        route_args.extend([
            i32_arg(tokens, "tokens")?,
            i32_arg(h, "hidden")?,
            i32_arg(experts, "experts")?,
            i32_arg(k, "top_k")?,
            i32_arg(bufs.chunk_rows(), "chunk rows")?,
        ]);
        // Sequential: every rank's stage finished before any rank's next one starts.
        let step = || match steps {
            TpSteps::Overlapped => Ok(()),
            TpSteps::Sequential => ctx.synchronize().and_then(|()| ctx.barrier()),
        };
        // The route's grid depends on the buffers only: its meets count the grid every call.
        ctx.launch(0, &route, [self.grid(cap.div_ceil(PAIRS_PER_PROGRAM)), 1, 1], &route_args)?;
        for (kernel, (grid, args)) in [&gate_up, &reduce].into_iter().flatten() {
            step()?;
            ctx.launch(0, kernel, *grid, args)?;
        }
        let mut finish_args = vec![bufs.parts.as_ref().unwrap_or(&bufs.acc).arg(), bufs.done.arg(), bufs.out.arg()];
        finish_args.extend(bufs.pair_row.as_ref().map(Buffer::arg));
        finish_args.extend([
            bufs.ends.arg(),
            bufs.finished.arg_at(8),
            bufs.ready.arg(),
            bufs.consumed.arg(),
            state_arg(&bufs.epochs, 1),
            i32_arg(tokens, "tokens")?,
            i32_arg(h, "hidden")?,
            i32_arg(experts, "experts")?,
        ]);
        if self.rows_form() {
            finish_args.extend([i32_arg(k, "top_k")?, i32_arg(bufs.chunk_rows(), "chunk rows")?]);
        }
        step()?;
        ctx.launch(0, &finish, [self.grid(tokens * h / self.block as usize), 1, 1], &finish_args)?;
        bufs.calls += 1;
        Ok(())
    }

    /// Enqueues one of the last call's grouped GEMMs again, alone: the overlap machinery
    /// measured against the plain grouped GEMM of the same rows (the benchmark's parts). For the
    /// waiting form this rank's chunk signals are set first from the host (the last call's
    /// finish reset them; call it with the stream idle), so its waits pass at once. The plain
    /// forms read one chunk's ends as the plain contiguous layout's: world 1 only.
    pub fn enqueue_gemm<'a>(
        &self,
        ctx: &dyn RankCtx,
        bufs: &TpMoeBuffers,
        experts_w: impl Into<Experts<'a>>,
        which: TpGemm<'_>,
    ) -> Result<(), BackendError> {
        let experts_w = experts_w.into();
        if bufs.calls == 0 {
            return Err(self.problem("a grouped GEMM of the last call: no call was enqueued yet".into()));
        }
        let plain = matches!(which, TpGemm::GateUp | TpGemm::Down(_));
        if plain && ctx.world_size() != 1 {
            return Err(self.problem(format!(
                "the plain grouped GEMM of the block's rows: world 1 only (each of the {} chunks counts its ends from its own first row)",
                ctx.world_size()
            )));
        }
        self.require_weights(bufs, experts_w)?;
        if matches!(which, TpGemm::AgGateUp) {
            let set: Vec<u8> = (0..ctx.world_size()).flat_map(|_| 1u64.to_le_bytes()).collect();
            ctx.write(&bufs.ready, 0, &set)?;
        }
        if let Some((kernel, (grid, args))) = self.gemm(ctx, bufs, experts_w, which)? {
            ctx.launch(0, &kernel, grid, &args)?;
        }
        Ok(())
    }

    fn require_weights(&self, bufs: &TpMoeBuffers, ws: Experts<'_>) -> Result<(), BackendError> {
        let (experts, h, f, es) = (bufs.shape.experts, bufs.shape.hidden, self.ffn_shard, self.payload().size_bytes() as usize);
        require_bytes(ws.w1, experts * 2 * f * h * es, "w1")?;
        require_bytes(ws.w2, experts * h * f * es, "w2")?;
        match (self.fp8, ws.scales, &bufs.row_scales) {
            (true, Some(_), Some(_)) | (false, None, None) => Ok(()),
            (true, None, _) => Err(self.problem("FP8 shards need their block scales (`Experts::fp8`)".into())),
            (false, Some(_), _) => Err(self.problem("scales given to shards of the block's element type".into())),
            (true, Some(_), None) | (false, None, Some(_)) => Err(self.problem("buffers made by a block of the other type".into())),
        }?;
        // The launches take `parts` and `pair_row` where the buffers have them, the kernels
        // where the block's form says: the two must agree.
        match bufs.parts.is_some() == self.rows_form() {
            true => Ok(()),
            false => Err(self.problem(format!("buffers made by a block of the other reduction (this block's: {:?})", self.reduce))),
        }
    }

    /// One of the block's grouped GEMMs, specialized, compiled and planned.
    fn gemm(
        &self,
        ctx: &dyn RankCtx,
        bufs: &TpMoeBuffers,
        Experts { w1, w2, scales }: Experts<'_>,
        which: TpGemm<'_>,
    ) -> Result<crate::moe_block::Prepared, BackendError> {
        let EpShape { hidden: h, experts, .. } = bufs.shape;
        let (w, f) = (ctx.world_size(), self.ffn_shard);
        let rows = w * bufs.chunk_rows();
        let (g_rows, g_ends, g_token, g_weight) = (&bufs.rows, &bufs.ends, &bufs.row_token, &bufs.row_weight);
        let (up, down) = self.gemms(ctx, bufs.shape);
        if up.block_m as usize > CHUNK_PAD {
            return Err(self.problem(format!("gate/up tiles of {} rows: at most the chunks' padding, {CHUNK_PAD}", up.block_m)));
        }
        let plain = |g: GroupedGemm| GroupedGemm { chunk_ends: false, wait: false, ..g };
        let up_groups = Groups { chunks: w, ..Groups::new(experts, 2 * f, h, rows) };
        let down_groups = Groups { chunks: w, ..Groups::new(experts, h, f, rows) };
        let mut up_ops = Operands::new(g_rows, w1, &bufs.act, g_ends);
        let mut down_ops = Operands::new(&bufs.act, w2, &bufs.out, g_ends);
        // FP8: the gathered rows' and `act`'s scales as A's, the shards' as B's.
        if let (Some((s1, s2)), Some(rs), Some(acs)) = (scales, &bufs.row_scales, &bufs.act_scales) {
            (up_ops.scales, up_ops.c_scales, down_ops.scales) = (Some((rs, s1)), Some(acs), Some((acs, s2)));
        }
        let weighted = |c| Operands { weights: Some(g_weight), c, ..down_ops };
        match which {
            TpGemm::AgGateUp => prepare(ctx, (up, Operands { ready: Some((&bufs.ready, 1)), ..up_ops }, up_groups)),
            TpGemm::GateUp => prepare(ctx, (plain(up), up_ops, up_groups)),
            TpGemm::DownReduceScatter => {
                let ops = match &bufs.parts {
                    Some(parts) => Operands { owner_done: Some(&bufs.done), ..weighted(parts) },
                    None => Operands { scatter: Some((g_token, &bufs.acc, &bufs.done)), ..weighted(&bufs.out) },
                };
                prepare(ctx, (down, ops, down_groups))
            }
            TpGemm::Down(c) => {
                require_bytes(c, rows * h * self.dtype.size_bytes() as usize, "c")?;
                let op = plain(down).with_epilogue(Epilogue { row_weights: true, ..Epilogue::default() });
                prepare(ctx, (op, weighted(c), down_groups))
            }
        }
    }

    /// A persistent grid for `work` items: at least one program (every program takes part in
    /// the meets and the signals), at most `max_programs`.
    fn grid(&self, work: usize) -> u32 {
        work.clamp(1, self.max_programs.max(1) as usize) as u32
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    /// Bands where the f32 accumulator outgrows L2 (DeepSeek-V3's and Mixtral's prefill), none
    /// where it fits (Qwen3-30B-A3B's prefill, every decode shape); none set by default.
    #[test]
    fn bands_follow_the_accumulator_size() {
        let shape = |t_max, hidden| EpShape { t_max, hidden, experts: 8, top_k: 2 };
        assert_eq!(TpMoeBlock::band_for(shape(4096, 7168)), 4);
        assert_eq!(TpMoeBlock::band_for(shape(4096, 4096)), 4);
        assert_eq!(TpMoeBlock::band_for(shape(2048, 2048)), 0);
        assert_eq!(TpMoeBlock::band_for(shape(128, 7168)), 0);
        let block = TpMoeBlock::new(DType::BF16, 256);
        assert_eq!(block.down_band, None);
    }
}
