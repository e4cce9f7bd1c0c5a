//! Expert parallelism's low-latency all-to-all (decode): dispatch sends each token to the
//! ranks holding its top-k experts, combine sends the experts' outputs back and sums them with
//! the routing weights on the token's rank.
//!
//! Shapes: `W` ranks, `E` experts in all, `E_local = E / W` on each rank (expert `e` lives on
//! rank `e / E_local` as local expert `e mod E_local`), top-`k` routing, hidden size `H`, at
//! most `T_max` tokens per rank per call.
//!
//! **Dispatch** takes `x [T, H]` and `topk [T, k]` (i32 expert ids, -1 = none) and leaves on
//! each rank `recv [E_local, W T_max, H]`: local expert `l`'s rows packed from row 0, source
//! rank by source rank, `recv_count [E_local]` of them (the grouped GEMM's masked layout reads
//! it as it is), `recv_src [E_local, W T_max]` (each row's source: `s T_max k + t k + j` for
//! token `t`'s `j`-th expert on rank `s`) and `layout [E_local, W, 2]` (where source `s`'s rows
//! of expert `l` start, and how many there are): what combine needs to send each row home.
//! * Send: for every (token, expert) pair, a slot in the (expert, this rank) slice of the
//!   destination's receive buffer `raw [E_local, W, T_max, H]` from a per-expert counter
//!   (atomic, so the order of a source's rows is the order the pairs took their slots), the
//!   row and its pair index written there. Once every program of the launch has sent (a
//!   counter of finished programs), each expert's count goes to its rank as a signal
//!   `epoch 2^32 + count`: "0 tokens" (`epoch 2^32`) differs from "nothing yet" (the last
//!   call's value, below it).
//! * Receive: for every (local expert, source rank), wait for the expert's W counts, and copy
//!   the source's rows to their packed place (after the rows of the sources before it).
//!
//! **Combine** takes the experts' outputs `y` in `recv`'s layout, and on each token's rank its
//! `topk` and `weights [T, k]` (f32), and returns `out [T, H]`: `sum_j weights[t, j] y(t, j)`
//! accumulated in f32 in the order j = 0..k, rounded once.
//! * Send: every (local expert, source) slice of `y` goes back to its source rank, each row
//!   into the slot of its pair in `comb [T_max k, H]` there, then a signal (the call's epoch)
//!   per (expert, destination), sent for empty slices too.
//! * Receive: each token waits for all E signals of the call, then sums its pairs' rows.
//!
//! Each of the four is one kernel; [`Part::Whole`] fuses send and receive into one launch
//! (cooperative: its programs wait for signals of other programs of the same launch), and the
//! halves can run as launches of their own so that the caller overlaps other work with the
//! transfer. Every buffer another rank writes comes in two halves by the call's parity, and
//! signals carry the call's epoch (`crate::epoch`). **The invariant**: a rank writes a half
//! for call e+2 only after every rank finished its part of call e. Dispatch and combine each
//! make every rank wait for a signal from every rank in every call (the W counts of each local
//! expert; the E combine signals), so rank r's call e+2 starts after every rank sent its part
//! of call e+1, which on that rank's stream follows its whole call e. Dispatch and combine
//! alternate: dispatch e, combine e, dispatch e+1, ... (their epochs count the same calls);
//! `recv` and `out` are valid until the next dispatch (or combine) on the stream.

use crate::{require_bytes, require_i32};
use trident_core::backend::{Artifact, BackendError, Buffer, KernelArg};
use trident_core::ir::{AtomicOp, Axis, BinaryOp, CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, Scope, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

/// Which half of an operation a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// Send, then receive, in one cooperative launch.
    Whole,
    /// Only the sends and their signals.
    Send,
    /// Only the waits and what follows them (after this rank's `Send` of the same call).
    Recv,
}

/// The operation a kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    Dispatch,
    Combine,
}

/// The problem's extents (the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EpShape {
    /// Tokens per rank per call, at most.
    pub t_max: usize,
    pub hidden: usize,
    /// Experts in all (a multiple of the world size).
    pub experts: usize,
    pub top_k: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LowLatencyAllToAll {
    /// The tokens' and the experts' outputs' element type (bf16 as served; any float works).
    pub dtype: DType,
    /// Elements of a row copied per step.
    pub block: u32,
    /// The grid asked for (a persistent launch: what is resident of it runs).
    pub max_programs: u32,
    /// Dispatch sends FP8: E4M3FN with one f32 scale per 128 channels (DeepSeek-V3's
    /// activations), quantized by the sender (`docs/SEMANTICS.md`, "Quantization"); `recv`
    /// then holds E4M3FN and `recv_scales` the scales, `[E_local W T_max, H / 128]` as the
    /// grouped GEMM's block scales of A. Combine stays in `dtype`.
    pub quantize: bool,
}

/// Channels per FP8 scale.
pub const QUANT_BLOCK: usize = 128;

/// One rank's buffers of the all-to-all (symmetric ones allocated collectively).
pub struct EpBuffers {
    pub shape: EpShape,
    /// Two halves of `[E_local, W, T_max, H]`: what sources sent (symmetric).
    pub raw: Buffer,
    /// Two halves of `[E_local, W, T_max]` i32: each raw row's pair index `t k + j` (symmetric).
    pub raw_src: Buffer,
    /// With `quantize`, two halves of `[E_local, W, T_max, H / 128]` f32 scales (symmetric).
    pub raw_scales: Buffer,
    /// `[E_local, W]` u64 count signals (symmetric).
    pub counts: Buffer,
    /// Two halves of `[T_max k, H]`: the experts' outputs sent home (symmetric).
    pub comb: Buffer,
    /// `[E]` u64 combine signals, one per expert (symmetric).
    pub comb_ready: Buffer,
    /// Two halves of `[E]` i32 slot counters and `[2]` u64 finished-program counters (local,
    /// zeroed).
    pub slots: Buffer,
    pub finished: Buffer,
    /// Dispatch's results (local).
    pub recv: Buffer,
    pub recv_src: Buffer,
    pub recv_count: Buffer,
    pub layout: Buffer,
    /// With `quantize`, `[E_local W T_max, H / 128]` f32: each received row's scales.
    pub recv_scales: Buffer,
    /// Combine's result `[T_max, H]` (local).
    pub out: Buffer,
    /// Epoch words of the six kernels (`crate::epoch`).
    pub epochs: Buffer,
    /// Calls of dispatch and of combine enqueued from this host.
    pub calls: [u64; 2],
}

impl EpBuffers {
    /// Collective: signals, counters and epochs back to zero on every rank.
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.calls = [0, 0];
        crate::epoch::rearm(ctx, &[&self.counts, &self.comb_ready, &self.slots, &self.finished, &self.epochs])
    }
}

/// The epoch words each kernel keeps: one per (stage, part).
fn epoch_index(stage: Stage, part: Part) -> usize {
    let s = match stage {
        Stage::Dispatch => 0,
        Stage::Combine => 3,
    };
    s + match part {
        Part::Whole => 0,
        Part::Send => 1,
        Part::Recv => 2,
    }
}

/// `2^32`: a count signal is `epoch 2^32 + count` (both forms, `crate::ep_high_throughput` too).
pub(crate) const EPOCH_SHIFT: u64 = 1 << 32;

impl EpShape {
    /// A typed error unless the shape splits over `world` ranks: the experts a positive
    /// multiple of it, top_k, hidden and t_max positive.
    pub fn check(&self, world: usize) -> Result<(), BackendError> {
        let s = self;
        if s.experts == 0 || !s.experts.is_multiple_of(world) || s.top_k == 0 || s.hidden == 0 || s.t_max == 0 {
            return Err(BackendError::Host(format!(
                "all-to-all of {s:?} in a world of {world}: the experts must be a positive multiple of the world size, \
                 and top_k, hidden and t_max positive"
            )));
        }
        Ok(())
    }

    /// The kernels' scalar arguments for a call of `tokens` tokens (at most `t_max`): tokens,
    /// t_max, hidden, experts, top_k.
    pub(crate) fn scalars(&self, tokens: usize) -> Result<[KernelArg; 5], BackendError> {
        if tokens > self.t_max {
            return Err(BackendError::Host(format!(
                "{tokens} tokens where the buffers hold at most t_max = {}",
                self.t_max
            )));
        }
        Ok([
            KernelArg::i32(require_i32(tokens, "tokens")?),
            KernelArg::i32(require_i32(self.t_max, "t_max")?),
            KernelArg::i32(require_i32(self.hidden, "hidden")?),
            KernelArg::i32(require_i32(self.experts, "experts")?),
            KernelArg::i32(require_i32(self.top_k, "top_k")?),
        ])
    }
}

/// `body(lanes, mask)` over a row of `hidden` elements, `block` at a time (both forms' row
/// copies).
pub(crate) fn each_block<'b>(b: &'b KernelBuilder, block: u32, hidden: Tile<'b>, body: &dyn Fn(Tile<'b>, Tile<'b>)) {
    let bs = block as i32;
    let lanes = b.arange(0, block as i64);
    b.for_range(0, (hidden + (bs - 1)) / bs, 1, &[], |blk, _| {
        let at = blk * bs + lanes;
        body(at, at.lt(hidden));
        vec![]
    });
}

impl LowLatencyAllToAll {
    pub fn new(dtype: DType) -> LowLatencyAllToAll {
        LowLatencyAllToAll { dtype, block: 1024, max_programs: 132, quantize: false }
    }

    /// Dispatch quantizes to E4M3FN with a scale per 128 channels (see `quantize`).
    pub fn fp8(self) -> LowLatencyAllToAll {
        LowLatencyAllToAll { quantize: true, ..self }
    }

    /// The element type dispatch sends and leaves in `recv`.
    pub fn payload(&self) -> DType {
        if self.quantize {
            DType::F8E4M3FN
        } else {
            self.dtype
        }
    }

    /// Collective: the buffers of `shape` on every rank of `ctx`'s world.
    pub fn buffers(&self, ctx: &dyn RankCtx, shape: EpShape) -> Result<EpBuffers, BackendError> {
        let w = ctx.world_size();
        shape.check(w)?;
        if let Some(m) = self.quantize.then(|| quantize_misfit(shape.hidden, self.block)).flatten() {
            return Err(BackendError::Host(m));
        }
        let (el, es, ps) = (shape.experts / w, self.dtype.size_bytes() as usize, self.payload().size_bytes() as usize);
        let rows = el * w * shape.t_max;
        let scales = if self.quantize { rows * shape.hidden / QUANT_BLOCK } else { 1 };
        require_i32(2 * crate::epoch::half_elems(rows * shape.hidden), "the receive buffer's elements")?;
        require_i32(2 * crate::epoch::half_elems(shape.t_max * shape.top_k * shape.hidden), "the combine buffer's elements")?;
        let zeroed = |bytes: usize, name: &str| crate::epoch::zeroed(ctx, bytes, name);
        Ok(EpBuffers {
            shape,
            raw: ctx.symm_alloc(crate::epoch::halves_bytes(rows * shape.hidden, ps), "ep_raw")?,
            raw_src: ctx.symm_alloc(crate::epoch::halves_bytes(rows, 4), "ep_raw_src")?,
            raw_scales: ctx.symm_alloc(crate::epoch::halves_bytes(scales, 4), "ep_raw_scales")?,
            counts: ctx.symm_alloc(8 * el * w, "ep_counts")?,
            comb: ctx.symm_alloc(crate::epoch::halves_bytes(shape.t_max * shape.top_k * shape.hidden, es), "ep_comb")?,
            comb_ready: ctx.symm_alloc(8 * shape.experts, "ep_comb_ready")?,
            slots: zeroed(8 * shape.experts, "ep_slots")?,
            finished: zeroed(16, "ep_finished")?,
            recv: ctx.alloc(rows * shape.hidden * ps, "ep_recv")?,
            recv_scales: ctx.alloc(scales * 4, "ep_recv_scales")?,
            recv_src: ctx.alloc(rows * 4, "ep_recv_src")?,
            recv_count: ctx.alloc(el * 4, "ep_recv_count")?,
            layout: ctx.alloc(el * w * 8, "ep_layout")?,
            out: ctx.alloc(shape.t_max * shape.hidden * es, "ep_out")?,
            epochs: crate::epoch::words(ctx, 6, "ep_epochs")?,
            calls: [0, 0],
        })
    }

    pub fn build(&self, stage: Stage, part: Part) -> Result<Function, VerifyError> {
        let fp8 = if self.quantize && stage == Stage::Dispatch { "_e4m3" } else { "" };
        let name = format!("ep_{stage:?}_{part:?}_{}{fp8}_{}", self.dtype, self.block).to_lowercase();
        // Programs wait for each other (the finished count, the whole kernel's own signals):
        // all of them resident, as many as fit.
        let attrs = LaunchAttrs { cooperative: true, persistent: true, ..LaunchAttrs::default() };
        let b = KernelBuilder::new(&name, attrs);
        match stage {
            Stage::Dispatch => self.emit_dispatch(&b, part),
            Stage::Combine => self.emit_combine(&b, part),
        }
        b.finish()
    }

    fn emit_dispatch<'b>(&self, b: &'b KernelBuilder, part: Part) {
        let (d, pd) = (self.dtype, self.payload());
        let (x, topk) = (b.arg_ptr("x", d), b.arg_ptr("topk", DType::I32));
        let (raw, raw_src, counts) =
            (b.arg_ptr("raw", pd), b.arg_ptr("raw_src", DType::I32), b.arg_ptr("counts", DType::U64));
        let (slots, finished) = (b.arg_ptr("slots", DType::I32), b.arg_ptr("finished", DType::U64));
        let (recv, recv_src) = (b.arg_ptr("recv", pd), b.arg_ptr("recv_src", DType::I32));
        let (recv_count, layout) = (b.arg_ptr("recv_count", DType::I32), b.arg_ptr("layout", DType::I32));
        let (raw_scales, recv_scales) = (b.arg_ptr("raw_scales", DType::F32), b.arg_ptr("recv_scales", DType::F32));
        let epochs = b.arg_ptr("epochs", DType::U64);
        let (tokens, t_max, hidden) = (b.arg("tokens", DType::I32), b.arg("t_max", DType::I32), b.arg("hidden", DType::I32));
        let (experts, k) = (b.arg("experts", DType::I32), b.arg("top_k", DType::I32));
        let (me, world, pid, programs) = (b.rank(), b.num_ranks(), b.program_id_x(), b.num_programs(Axis::X));
        let call = crate::epoch::Epoch::begin(b, epochs);
        let el = experts / world;
        let rows = el * world * t_max;
        let (raw, raw_src) = (call.half(raw, rows * hidden), call.half(raw_src, rows));
        let qb = QUANT_BLOCK as i32;
        let sb = hidden / qb;
        let raw_scales = call.half(raw_scales, if self.quantize { rows * sb } else { b.i32(1) });
        let base = call.value * EPOCH_SHIFT;
        // The slot counters come in two halves by parity: a call counts in its own and clears
        // the other (the last call's, read by then), so no program reads and clears one word
        // (its threads could clear it before the one that reads it has read it).
        let (slots, stale) = (slots + call.parity() * experts, slots + (call.parity().binary(BinaryOp::Xor, 1i32)) * experts);
        if part != Part::Recv {
            // Every (token, expert) pair: a slot at its expert's rank, the row and its pair index.
            b.for_range(pid, tokens * k, programs, &[], |i, _| {
                let e = b.load(topk + i, None, None);
                b.if_then(e.ge(0).binary(BinaryOp::And, e.lt(experts)), || {
                    let (dst, l) = (e / el, e % el);
                    let slot = b.atomic(AtomicOp::Add, slots + e, 1i32, None, MemSemantic::Relaxed, Scope::Gpu);
                    // A token listing an expert twice would take a second slot: never past the slice.
                    b.if_then(slot.lt(t_max), || {
                        let row = (l * world + me) * t_max + slot;
                        let (to, from) = (b.symm_at(raw, dst) + row * hidden, x + (i / k) * hidden);
                        if self.quantize {
                            let scales = b.symm_at(raw_scales, dst) + row * sb;
                            quantize_row(b, self.block, hidden, (from, to, scales));
                        } else {
                            each_block(b, self.block, hidden, &|at, m| b.store(to + at, b.load(from + at, Some(m), None), Some(m)));
                        }
                        b.store(b.symm_at(raw_src, dst) + row, i, None);
                    });
                });
                vec![]
            });
            // Every program of the launch has sent: then each expert's count goes out. The
            // barrier puts the program's stores before its release; the finished count grows by
            // the grid each call.
            b.barrier();
            b.atomic(AtomicOp::Add, finished, 1u64, None, MemSemantic::AcqRel, Scope::Sys);
            let all = call.times(programs);
            let tok = b.wait(finished, 1, CmpOp::Ge, all, Scope::Gpu, MemSemantic::Acquire);
            let slots = slots.consume_token(tok);
            b.for_range(pid, experts, programs, &[], |e, _| {
                let c = b.load(slots + e, None, None).min(t_max);
                b.store(stale + e, 0i32, None);
                let (dst, l) = (e / el, e % el);
                b.notify(counts + (l * world + me), dst, base + c.cast(DType::U64), SignalOp::Set, CommScope::IntraNode);
                vec![]
            });
        }
        if part != Part::Send {
            // Every (local expert, source): wait for the expert's W counts, then pack the source's
            // rows after those of the sources before it.
            b.for_range(pid, el * world, programs, &[], |it, _| {
                let (l, s) = (it / world, it % world);
                let tok = b.wait(counts + l * world, world, CmpOp::Ge, base, Scope::Sys, MemSemantic::Acquire);
                let (counts, raw, raw_src) = (counts.consume_token(tok), raw.consume_token(tok), raw_src.consume_token(tok));
                let count_of = |src: Tile<'b>| -> Tile<'b> {
                    b.load(counts + (l * world + src), None, None).binary(BinaryOp::And, EPOCH_SHIFT - 1).cast(DType::I32)
                };
                let zero = b.i32(0);
                let off = b.for_range(0, s, 1, &[zero], |src, acc| vec![acc[0] + count_of(src)])[0];
                let c = count_of(s);
                b.for_range(0, c, 1, &[], |r, _| {
                    let (from, to) = ((l * world + s) * t_max + r, l * (world * t_max) + off + r);
                    let (src_row, dst_row) = (raw + from * hidden, recv + to * hidden);
                    each_block(b, self.block, hidden, &|at, m| b.store(dst_row + at, b.load(src_row + at, Some(m), None), Some(m)));
                    if self.quantize {
                        let (src_s, dst_s) = (raw_scales.consume_token(tok) + from * sb, recv_scales + to * sb);
                        each_block(b, self.block, sb, &|at, m| b.store(dst_s + at, b.load(src_s + at, Some(m), None), Some(m)));
                    }
                    b.store(recv_src + to, s * (t_max * k) + b.load(raw_src + from, None, None), None);
                    vec![]
                });
                b.store(layout + it * 2, off, None);
                b.store(layout + (it * 2 + 1), c, None);
                b.if_then(s.eq(world - 1), || b.store(recv_count + l, off + c, None));
                vec![]
            });
        }
        call.end(b);
    }

    fn emit_combine(&self, b: &KernelBuilder, part: Part) {
        let d = self.dtype;
        let (y, topk, weights) = (b.arg_ptr("y", d), b.arg_ptr("topk", DType::I32), b.arg_ptr("weights", DType::F32));
        let (recv_src, layout) = (b.arg_ptr("recv_src", DType::I32), b.arg_ptr("layout", DType::I32));
        let (comb, comb_ready, out) = (b.arg_ptr("comb", d), b.arg_ptr("comb_ready", DType::U64), b.arg_ptr("out", d));
        let epochs = b.arg_ptr("epochs", DType::U64);
        let (tokens, t_max, hidden) = (b.arg("tokens", DType::I32), b.arg("t_max", DType::I32), b.arg("hidden", DType::I32));
        let (experts, k) = (b.arg("experts", DType::I32), b.arg("top_k", DType::I32));
        let (me, world, pid, programs) = (b.rank(), b.num_ranks(), b.program_id_x(), b.num_programs(Axis::X));
        let call = crate::epoch::Epoch::begin(b, epochs);
        let el = experts / world;
        let comb = call.half(comb, t_max * k * hidden);
        if part != Part::Recv {
            // Every (local expert, source) slice of `y` back to its source, into its pairs' slots.
            b.for_range(pid, el * world, programs, &[], |it, _| {
                let (l, s) = (it / world, it % world);
                let (off, c) = (b.load(layout + it * 2, None, None), b.load(layout + (it * 2 + 1), None, None));
                let home = b.symm_at(comb, s);
                b.for_range(0, c, 1, &[], |r, _| {
                    let row = l * (world * t_max) + off + r;
                    let pair = b.load(recv_src + row, None, None) % (t_max * k);
                    let (from, to) = (y + row * hidden, home + pair * hidden);
                    each_block(b, self.block, hidden, &|at, m| b.store(to + at, b.load(from + at, Some(m), None), Some(m)));
                    vec![]
                });
                b.notify(comb_ready + (me * el + l), s, call.value, SignalOp::Set, CommScope::IntraNode);
                vec![]
            });
        }
        if part != Part::Send {
            // Every token: once all E signals of the call are in, the weighted sum of its rows.
            let tok = b.wait(comb_ready, experts, CmpOp::Ge, call.value, Scope::Sys, MemSemantic::Acquire);
            let comb = comb.consume_token(tok);
            b.for_range(pid, tokens, programs, &[], |t, _| {
                each_block(b, self.block, hidden, &|at, m| {
                    let acc = b.zeros(&at.shape(), DType::F32);
                    let sum = b.for_range(0, k, 1, &[acc], |j, acc| {
                        let e = b.load(topk + (t * k + j), None, None);
                        let valid = e.ge(0).binary(BinaryOp::And, e.lt(experts));
                        let w = valid.select(b.load(weights + (t * k + j), None, None), 0.0f32);
                        let mask = m.binary(BinaryOp::And, valid);
                        let row = b.load_or(comb + ((t * k + j) * hidden + at), mask, 0.0).cast(DType::F32);
                        vec![acc[0] + w * row]
                    })[0];
                    b.store(out + (t * hidden + at), sum.cast(d), Some(m));
                });
                vec![]
            });
        }
        call.end(b);
    }

    /// A program per work item of the largest phase (pairs, (expert, source) slices, experts),
    /// at most `max_programs`; the persistent launch runs what is resident of it.
    fn grid(&self, bufs: &EpBuffers, tokens: usize, el: usize, w: usize) -> [u32; 3] {
        let s = bufs.shape;
        let work = (tokens * s.top_k).max(el * w).max(s.experts).max(1);
        [work.min(self.max_programs.max(1) as usize) as u32, 1, 1]
    }

    /// The kernel of `stage` and `part`, compiled once per world.
    fn kernel(&self, ctx: &dyn RankCtx, stage: Stage, part: Part) -> Result<Artifact, BackendError> {
        ctx.compile(&format!("{self:?} {stage:?} {part:?}"), &|| self.build(stage, part))
    }

    /// Enqueues dispatch (`part` of it) of `tokens` rows of `x` (`[tokens, H]`) routed by `topk`
    /// (`[tokens, k]` i32): results in `bufs.recv`, `recv_count`, `recv_src`, `layout`.
    pub fn dispatch(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut EpBuffers,
        x: &Buffer,
        topk: &Buffer,
        tokens: usize,
        part: Part,
    ) -> Result<(), BackendError> {
        let (s, es) = (bufs.shape, self.dtype.size_bytes() as usize);
        let (scalars, el) = (s.scalars(tokens)?, s.experts / ctx.world_size());
        require_bytes(x, tokens * s.hidden * es, "x")?;
        require_bytes(topk, tokens * s.top_k * 4, "topk")?;
        let kernel = self.kernel(ctx, Stage::Dispatch, part)?;
        // Combine's kernel too, so that the first combine does not compile after this launch.
        self.kernel(ctx, Stage::Combine, part)?;
        let mut args = vec![
            x.arg(),
            topk.arg(),
            bufs.raw.arg(),
            bufs.raw_src.arg(),
            bufs.counts.arg(),
            bufs.slots.arg(),
            bufs.finished.arg(),
            bufs.recv.arg(),
            bufs.recv_src.arg(),
            bufs.recv_count.arg(),
            bufs.layout.arg(),
            bufs.raw_scales.arg(),
            bufs.recv_scales.arg(),
            crate::epoch::state_arg(&bufs.epochs, epoch_index(Stage::Dispatch, part)),
        ];
        args.extend(scalars);
        ctx.launch(0, &kernel, self.grid(bufs, tokens, el, ctx.world_size()), &args)?;
        if part != Part::Send {
            bufs.calls[0] += 1;
        }
        Ok(())
    }

    /// Enqueues combine (`part` of it): the experts' outputs `y` (in `recv`'s layout) back to
    /// their tokens' ranks, summed there with `weights` (`[tokens, k]` f32) into `bufs.out`.
    #[allow(clippy::too_many_arguments)]
    pub fn combine(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut EpBuffers,
        y: &Buffer,
        topk: &Buffer,
        weights: &Buffer,
        tokens: usize,
        part: Part,
    ) -> Result<(), BackendError> {
        let (s, es) = (bufs.shape, self.dtype.size_bytes() as usize);
        let (scalars, el) = (s.scalars(tokens)?, s.experts / ctx.world_size());
        require_bytes(y, el * ctx.world_size() * s.t_max * s.hidden * es, "y")?;
        require_bytes(topk, tokens * s.top_k * 4, "topk")?;
        require_bytes(weights, tokens * s.top_k * 4, "weights")?;
        let kernel = self.kernel(ctx, Stage::Combine, part)?;
        let mut args = vec![
            y.arg(),
            topk.arg(),
            weights.arg(),
            bufs.recv_src.arg(),
            bufs.layout.arg(),
            bufs.comb.arg(),
            bufs.comb_ready.arg(),
            bufs.out.arg(),
            crate::epoch::state_arg(&bufs.epochs, epoch_index(Stage::Combine, part)),
        ];
        args.extend(scalars);
        ctx.launch(0, &kernel, self.grid(bufs, tokens, el, ctx.world_size()), &args)?;
        if part != Part::Send {
            bufs.calls[1] += 1;
        }
        Ok(())
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "ep_dispatch",
        operation: "ep_all_to_all",
        distributed: true,
        build: |d| LowLatencyAllToAll::new(d).build(Stage::Dispatch, Part::Whole),
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "ep_dispatch_e4m3",
        operation: "ep_all_to_all",
        distributed: true,
        build: |d| LowLatencyAllToAll::new(d).fp8().build(Stage::Dispatch, Part::Whole),
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "ep_combine",
        operation: "ep_all_to_all",
        distributed: true,
        build: |d| LowLatencyAllToAll::new(d).build(Stage::Combine, Part::Whole),
    }
}

/// What is wrong, if anything, with quantizing rows of `hidden` channels copied `block` at a
/// time (both must be whole 128-channel scale blocks).
pub(crate) fn quantize_misfit(hidden: usize, block: u32) -> Option<String> {
    (!hidden.is_multiple_of(QUANT_BLOCK) || !(block as usize).is_multiple_of(QUANT_BLOCK)).then(|| {
        format!("an FP8 dispatch quantizes blocks of {QUANT_BLOCK} channels: hidden {hidden} and the copy block {block} must be multiples")
    })
}

/// One row of `hidden` channels from `from` quantized into `to` (E4M3FN) and its scales
/// (`hidden / 128` f32) into `scales`: per 128 channels `amax = max |x|`, the channels
/// times `448 / amax` (f32) rounded to E4M3FN, the scale `amax / 448` (0 and 0 where
/// `amax` is 0).
pub(crate) fn quantize_row<'b>(b: &'b KernelBuilder, block: u32, hidden: Tile<'b>, (from, to, scales): (Tile<'b>, Tile<'b>, Tile<'b>)) {
    let (qb, per) = (QUANT_BLOCK as u32, block / QUANT_BLOCK as u32);
    let bs = block as i32;
    let lanes = b.arange(0, block as i64);
    let blocks_at = b.arange(0, per as i64);
    b.for_range(0, (hidden + (bs - 1)) / bs, 1, &[], |blk, _| {
        let at = blk * bs + lanes;
        let m = at.lt(hidden);
        let x = b.load_or(from + at, m, 0.0).cast(DType::F32).reshape(&[per, qb]);
        let amax = x.abs().max_along(1);
        let some = amax.gt(0.0f32);
        let inv = some.select(b.full(&[per], 448.0, DType::F32) / amax, 0.0f32);
        let q = (x * inv.expand_dims(1).broadcast_to(&[per, qb])).cast(DType::F8E4M3FN).reshape(&[block]);
        b.store(to + at, q, Some(m));
        let s_at = blk * per as i32 + blocks_at;
        b.store(scales + s_at, amax / 448.0f32, Some(s_at.lt(hidden / QUANT_BLOCK as i32)));
        vec![]
    });
}
