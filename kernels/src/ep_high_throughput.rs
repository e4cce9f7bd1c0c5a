//! Expert parallelism's high-throughput all-to-all (prefill, thousands of tokens per rank):
//! each token goes once to each rank holding any of its experts (not once per expert), and the
//! receiver lays the rows out per local expert, contiguous, with the group ends the grouped
//! GEMM's contiguous layout (`torch._grouped_mm`'s `offs`) takes. Shapes as in
//! [`crate::ep_all_to_all`]: `W` ranks, `E` experts, `E_local` per rank, top-`k`, hidden `H`,
//! at most `T_max` tokens per rank.
//!
//! **Dispatch** takes `x [T, H]`, `topk [T, k]` (i32, -1 none) and `weights [T, k]` (f32).
//! * Send: for each token and each rank holding one of its experts, a slot in that rank's
//!   slice for this source (`raw [W, T_max, H]`), the row, the token's index and, per k-slot,
//!   the local expert there (or -1) and the weight. Each token's slot per rank is kept
//!   (`sent_slot [T_max, W]`) for combine. Once all programs sent, each rank's count goes to it
//!   as a signal `epoch 2^32 + count`.
//! * Receive, after the W counts: every received row counts itself into each of its local
//!   experts (atomics), the programs meet, and every row is copied to each of its experts'
//!   segment of `recv [W T_max min(k, E_local), H]`: expert l's rows are
//!   `offs[l - 1] .. offs[l]` (`offs [E_local]` i32, the segments' ends), in the order the rows
//!   took their places. `recv_src` gives each row's source (`s T_max k + t k + j`) and `pos`
//!   each (source, slot, k-slot)'s place for combine.
//!
//! **Combine** takes the experts' outputs `y` in `recv`'s order and returns `out [T, H]`:
//! * on the experts' rank, each received token's rows summed with their weights in f32, in k
//!   order, rounded to the element type, and sent home once (`comb [W, T_max, H]` at its slot
//!   there), then a signal per destination;
//! * on the token's rank, after the W signals, each token's partial sums added in f32 in rank
//!   order, rounded once more. So combine rounds twice (per rank, then the total), as
//!   DeepEP's, which also sends bf16 partials.
//!
//! With [`HighThroughputAllToAll::fp8`] dispatch sends each row quantized to E4M3FN with a
//! scale per 128 channels (`docs/SEMANTICS.md`, "Quantization"; the low-latency dispatch's),
//! and `recv` holds E4M3FN, `recv_scales [capacity, H / 128]` each row's scales: the grouped
//! GEMM's block scales of A. Combine stays in the element type.
//!
//! Reuse: halves by parity and epoch-tagged signals; every rank waits for every rank in each of
//! the two, which gives the invariant of [`crate::ep_all_to_all`] (a rank writes a half for
//! call e+2 only after every rank finished call e). Dispatch and combine alternate.

use crate::{require_bytes, require_i32};
use trident_core::backend::{Artifact, BackendError, Buffer};
use trident_core::ir::{AtomicOp, Axis, BinaryOp, CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, Scope, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

pub use crate::ep_all_to_all::{EpShape, Stage};
use crate::ep_all_to_all::{each_block, quantize_misfit, quantize_row, EPOCH_SHIFT, QUANT_BLOCK};


#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HighThroughputAllToAll {
    /// The tokens' and the experts' outputs' element type.
    pub dtype: DType,
    /// Elements of a row moved per step.
    pub block: u32,
    /// The grid asked for (persistent: what is resident of it runs).
    pub max_programs: u32,
    /// Dispatch sends E4M3FN with a scale per 128 channels (see the module's text).
    pub quantize: bool,
}

/// One rank's buffers (symmetric ones allocated collectively).
pub struct HtBuffers {
    pub shape: EpShape,
    /// Two halves of `[W, T_max, H]`: rows from each source (symmetric).
    pub raw: Buffer,
    /// Two halves of `[W, T_max]` i32: each row's token index at its source (symmetric).
    pub raw_token: Buffer,
    /// Two halves of `[W, T_max, k]` i32 and f32: each row's local expert per k-slot (-1 where
    /// the expert is elsewhere) and its weight (symmetric).
    pub raw_experts: Buffer,
    pub raw_weights: Buffer,
    /// `[W]` u64 count signals, one per source (symmetric).
    pub counts: Buffer,
    /// Two halves of `[W, T_max, H]`: partial sums coming home (symmetric).
    pub comb: Buffer,
    /// `[W]` u64 combine signals (symmetric).
    pub comb_ready: Buffer,
    /// Local, zeroed: two halves of `[W]` send counters and of `[E_local]` expert counts and
    /// fills (i32), and four u64 finished-program counters.
    pub counters: Buffer,
    pub finished: Buffer,
    /// Local: `[T_max, W]` i32 each token's slot per rank (-1: not sent); `[W]` i32 rows
    /// received per source; `[W, T_max, k]` i32 each received (row, k-slot)'s place in `recv`
    /// (-1: none).
    pub sent_slot: Buffer,
    pub src_count: Buffer,
    pub pos: Buffer,
    /// With `quantize`, two halves of `[W, T_max, H / 128]` f32: each row's scales
    /// (symmetric).
    pub raw_scales: Buffer,
    /// Dispatch's results (local): `[capacity, H]`, `[E_local]` i32 ends, `[capacity]` i32.
    pub recv: Buffer,
    /// With `quantize`, `[capacity, H / 128]` f32: each received row's scales.
    pub recv_scales: Buffer,
    pub offs: Buffer,
    pub recv_src: Buffer,
    /// Combine's result `[T_max, H]` (local).
    pub out: Buffer,
    /// Epoch words of the two kernels.
    pub epochs: Buffer,
    pub calls: [u64; 2],
}

impl HtBuffers {
    /// Rows `recv` holds at most: every source's tokens, each once per local expert.
    pub fn capacity(&self, world: usize) -> usize {
        let s = self.shape;
        world * s.t_max * s.top_k.min(s.experts / world)
    }

    /// Collective: signals, counters and epochs back to zero on every rank.
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.calls = [0, 0];
        crate::epoch::rearm(ctx, &[&self.counts, &self.comb_ready, &self.counters, &self.finished, &self.epochs])
    }
}

impl HighThroughputAllToAll {
    pub fn new(dtype: DType) -> HighThroughputAllToAll {
        HighThroughputAllToAll { dtype, block: 1024, max_programs: crate::STREAMING_PROGRAMS, quantize: false }
    }

    /// Dispatch quantizes to E4M3FN with a scale per 128 channels (see `quantize`).
    pub fn fp8(self) -> HighThroughputAllToAll {
        HighThroughputAllToAll { quantize: true, ..self }
    }

    /// What dispatch sends and `recv` holds: E4M3FN with `quantize`, else the element type.
    pub fn payload(&self) -> DType {
        if self.quantize {
            DType::F8E4M3FN
        } else {
            self.dtype
        }
    }

    /// Collective: the buffers of `shape` on every rank.
    pub fn buffers(&self, ctx: &dyn RankCtx, shape: EpShape) -> Result<HtBuffers, BackendError> {
        let w = ctx.world_size();
        shape.check(w)?;
        if let Some(message) = self.quantize.then(|| quantize_misfit(shape.hidden, self.block)).flatten() {
            return Err(BackendError::Problem { kernel: "ep_ht".into(), message });
        }
        let (el, es, k) = (shape.experts / w, self.dtype.size_bytes() as usize, shape.top_k);
        let ps = self.payload().size_bytes() as usize;
        let sb = if self.quantize { shape.hidden / QUANT_BLOCK } else { 0 };
        let rows = w * shape.t_max;
        let capacity = rows * k.min(el);
        require_i32(2 * crate::epoch::half_elems(rows * shape.hidden), "the receive buffer's elements")?;
        require_i32(capacity * shape.hidden, "the expert rows' elements")?;
        let zeroed = |bytes: usize, name: &str| crate::epoch::zeroed(ctx, bytes, name);
        let halves = |elems: usize, bytes: usize, name: &str| ctx.symm_alloc(crate::epoch::halves_bytes(elems, bytes), name);
        Ok(HtBuffers {
            shape,
            raw: halves(rows * shape.hidden, ps, "ep_ht_raw")?,
            raw_scales: halves((rows * sb).max(1), 4, "ep_ht_raw_scales")?,
            raw_token: halves(rows, 4, "ep_ht_raw_token")?,
            raw_experts: halves(rows * k, 4, "ep_ht_raw_experts")?,
            raw_weights: halves(rows * k, 4, "ep_ht_raw_weights")?,
            counts: ctx.symm_alloc(8 * w, "ep_ht_counts")?,
            comb: halves(rows * shape.hidden, es, "ep_ht_comb")?,
            comb_ready: ctx.symm_alloc(8 * w, "ep_ht_comb_ready")?,
            counters: zeroed(4 * (2 * w + 4 * el), "ep_ht_counters")?,
            finished: zeroed(32, "ep_ht_finished")?,
            sent_slot: ctx.alloc(4 * shape.t_max * w, "ep_ht_sent_slot")?,
            src_count: ctx.alloc(4 * w, "ep_ht_src_count")?,
            pos: ctx.alloc(4 * rows * k, "ep_ht_pos")?,
            recv: ctx.alloc(capacity * shape.hidden * ps, "ep_ht_recv")?,
            recv_scales: ctx.alloc((capacity * sb).max(1) * 4, "ep_ht_recv_scales")?,
            offs: ctx.alloc(4 * el, "ep_ht_offs")?,
            recv_src: ctx.alloc(4 * capacity, "ep_ht_recv_src")?,
            out: ctx.alloc(shape.t_max * shape.hidden * es, "ep_ht_out")?,
            epochs: crate::epoch::words(ctx, 2, "ep_ht_epochs")?,
            calls: [0, 0],
        })
    }

    pub fn build(&self, stage: Stage) -> Result<Function, VerifyError> {
        let fp8 = if self.quantize && stage == Stage::Dispatch { "_e4m3" } else { "" };
        let name = format!("ep_ht_{stage:?}_{}_{}{fp8}", self.dtype, self.block).to_lowercase();
        let attrs = LaunchAttrs { cooperative: true, persistent: true, ..LaunchAttrs::default() };
        let b = KernelBuilder::new(&name, attrs);
        match stage {
            Stage::Dispatch => self.emit_dispatch(&b),
            Stage::Combine => self.emit_combine(&b),
        }
        b.finish()
    }

    /// Every program counts itself finished in `counter` and waits for the whole grid (which
    /// adds the grid to it each call): the launch's programs meet. The barrier puts each
    /// program's stores before its release.
    fn meet<'b>(b: &'b KernelBuilder, counter: Tile<'b>, call: &crate::epoch::Epoch<'b>, programs: Tile<'b>) -> Tile<'b> {
        b.barrier();
        b.atomic(AtomicOp::Add, counter, 1u64, None, MemSemantic::AcqRel, Scope::Sys);
        b.wait(counter, 1, CmpOp::Ge, call.times(programs), Scope::Gpu, MemSemantic::Acquire)
    }

    fn emit_dispatch<'b>(&self, b: &'b KernelBuilder) {
        let (d, pd) = (self.dtype, self.payload());
        let (x, topk, weights) = (b.arg_ptr("x", d), b.arg_ptr("topk", DType::I32), b.arg_ptr("weights", DType::F32));
        let (raw, raw_token) = (b.arg_ptr("raw", pd), b.arg_ptr("raw_token", DType::I32));
        let (raw_experts, raw_weights) = (b.arg_ptr("raw_experts", DType::I32), b.arg_ptr("raw_weights", DType::F32));
        let counts = b.arg_ptr("counts", DType::U64);
        let (counters, finished) = (b.arg_ptr("counters", DType::I32), b.arg_ptr("finished", DType::U64));
        let (sent_slot, src_count, pos) =
            (b.arg_ptr("sent_slot", DType::I32), b.arg_ptr("src_count", DType::I32), b.arg_ptr("pos", DType::I32));
        let (recv, offs, recv_src) = (b.arg_ptr("recv", pd), b.arg_ptr("offs", DType::I32), b.arg_ptr("recv_src", DType::I32));
        let scale_ptrs = self.quantize.then(|| (b.arg_ptr("raw_scales", DType::F32), b.arg_ptr("recv_scales", DType::F32)));
        let epochs = b.arg_ptr("epochs", DType::U64);
        let (tokens, t_max, hidden) = (b.arg("tokens", DType::I32), b.arg("t_max", DType::I32), b.arg("hidden", DType::I32));
        let (experts, k) = (b.arg("experts", DType::I32), b.arg("top_k", DType::I32));
        let (me, world, pid, programs) = (b.rank(), b.num_ranks(), b.program_id_x(), b.num_programs(Axis::X));
        let call = crate::epoch::Epoch::begin(b, epochs);
        let el = experts / world;
        let rows = world * t_max;
        let raw = call.half(raw, rows * hidden);
        let (raw_token, raw_experts, raw_weights) =
            (call.half(raw_token, rows), call.half(raw_experts, rows * k), call.half(raw_weights, rows * k));
        // With `quantize`, the scales' halves and the scales per row (`hidden / 128`).
        let scale_ptrs = scale_ptrs.map(|(raw_s, recv_s)| {
            let sb = hidden / QUANT_BLOCK as i32;
            (call.half(raw_s, rows * sb), recv_s, sb)
        });
        let base = call.value * EPOCH_SHIFT;
        // Counters in parity halves: a call counts in its own and clears the other's (the
        // last call's, read by then), so no program reads and clears one word.
        let (par, other) = (call.parity(), call.parity().binary(BinaryOp::Xor, 1i32));
        let per_half = world + el * 2;
        let half = |h: Tile<'b>| counters + h * per_half;
        let (send, send_stale) = (half(par), half(other));
        let (ecount, fill) = (send + world, send + world + el);
        let (ecount_stale, fill_stale) = (send_stale + world, send_stale + world + el);
        let local = |e: Tile<'b>, r: Tile<'b>| e.ge(0).binary(BinaryOp::And, e.lt(experts)).binary(BinaryOp::And, (e / el).eq(r));
        // Send: each token once to each rank holding one of its experts.
        b.for_range(pid, tokens, programs, &[], |t, _| {
            b.for_range(0, world, 1, &[], |r, _| {
                let zero = b.i32(0);
                let hits = b.for_range(0, k, 1, &[zero], |j, n| {
                    let e = b.load(topk + (t * k + j), None, None);
                    vec![n[0] + local(e, r).cast(DType::I32)]
                })[0];
                b.if_else(
                    hits.gt(0),
                    || {
                        let slot = b.atomic(AtomicOp::Add, send + r, 1i32, None, MemSemantic::Relaxed, Scope::Gpu);
                        let row = me * t_max + slot;
                        let to = b.symm_at(raw, r) + row * hidden;
                        let from = x + t * hidden;
                        match scale_ptrs {
                            Some((raw_s, _, sb)) => quantize_row(b, self.block, hidden, (from, to, b.symm_at(raw_s, r) + row * sb)),
                            None => each_block(b, self.block, hidden, &|at, m| b.store(to + at, b.load(from + at, Some(m), None), Some(m))),
                        }
                        b.store(b.symm_at(raw_token, r) + row, t, None);
                        b.for_range(0, k, 1, &[], |j, _| {
                            let e = b.load(topk + (t * k + j), None, None);
                            let l = local(e, r).select(e % el, -1i32);
                            b.store(b.symm_at(raw_experts, r) + (row * k + j), l, None);
                            b.store(b.symm_at(raw_weights, r) + (row * k + j), b.load(weights + (t * k + j), None, None), None);
                            vec![]
                        });
                        b.store(sent_slot + (t * world + r), slot, None);
                        vec![]
                    },
                    || {
                        b.store(sent_slot + (t * world + r), -1i32, None);
                        vec![]
                    },
                );
                vec![]
            });
            vec![]
        });
        let tok = Self::meet(b, finished, &call, programs);
        let send = send.consume_token(tok);
        b.for_range(pid, world, programs, &[], |r, _| {
            let c = b.load(send + r, None, None);
            b.store(send_stale + r, 0i32, None);
            b.notify(counts + me, r, base + c.cast(DType::U64), SignalOp::Set, CommScope::IntraNode);
            vec![]
        });
        b.for_range(pid, el, programs, &[], |l, _| {
            b.store(ecount_stale + l, 0i32, None);
            b.store(fill_stale + l, 0i32, None);
            vec![]
        });
        // Receive, first pass: every received row counts itself into its local experts.
        let tok = b.wait(counts, world, CmpOp::Ge, base, Scope::Sys, MemSemantic::Acquire);
        let (counts, raw, raw_token) = (counts.consume_token(tok), raw.consume_token(tok), raw_token.consume_token(tok));
        let raw_experts = raw_experts.consume_token(tok);
        let scale_ptrs = scale_ptrs.map(|(raw_s, recv_s, sb)| (raw_s.consume_token(tok), recv_s, sb));
        let count_of = |s: Tile<'b>| -> Tile<'b> {
            b.load(counts + s, None, None).binary(BinaryOp::And, EPOCH_SHIFT - 1).cast(DType::I32)
        };
        b.for_range(0, world, 1, &[], |s, _| {
            b.for_range(pid, count_of(s), programs, &[], |r, _| {
                b.for_range(0, k, 1, &[], |j, _| {
                    let l = b.load(raw_experts + ((s * t_max + r) * k + j), None, None);
                    b.if_then(l.ge(0), || {
                        b.atomic(AtomicOp::Add, ecount + l, 1i32, None, MemSemantic::Relaxed, Scope::Gpu);
                    });
                    vec![]
                });
                vec![]
            });
            vec![]
        });
        let tok = Self::meet(b, finished + 1, &call, programs);
        let ecount = ecount.consume_token(tok);
        // The segments' ends, and each source's row count for combine.
        b.if_then(pid.eq(0), || {
            let zero = b.i32(0);
            b.for_range(0, el, 1, &[zero], |l, end| {
                let end = end[0] + b.load(ecount + l, None, None);
                b.store(offs + l, end, None);
                vec![end]
            });
            b.for_range(0, world, 1, &[], |s, _| {
                b.store(src_count + s, count_of(s), None);
                vec![]
            });
        });
        // Second pass: every (row, local expert) to its place in the expert's segment.
        b.for_range(0, world, 1, &[], |s, _| {
            b.for_range(pid, count_of(s), programs, &[], |r, _| {
                let row = s * t_max + r;
                let t = b.load(raw_token + row, None, None);
                b.for_range(0, k, 1, &[], |j, _| {
                    let l = b.load(raw_experts + (row * k + j), None, None);
                    b.if_else(
                        l.ge(0),
                        || {
                            let zero = b.i32(0);
                            let start = b.for_range(0, l, 1, &[zero], |q, acc| vec![acc[0] + b.load(ecount + q, None, None)])[0];
                            let at = start + b.atomic(AtomicOp::Add, fill + l, 1i32, None, MemSemantic::Relaxed, Scope::Gpu);
                            let (from, to) = (raw + row * hidden, recv + at * hidden);
                            each_block(b, self.block, hidden, &|c, m| b.store(to + c, b.load(from + c, Some(m), None), Some(m)));
                            if let Some((raw_s, recv_s, sb)) = scale_ptrs {
                                let (from, to) = (raw_s + row * sb, recv_s + at * sb);
                                each_block(b, self.block, sb, &|c, m| b.store(to + c, b.load(from + c, Some(m), None), Some(m)));
                            }
                            b.store(recv_src + at, s * (t_max * k) + t * k + j, None);
                            b.store(pos + (row * k + j), at, None);
                            vec![]
                        },
                        || {
                            b.store(pos + (row * k + j), -1i32, None);
                            vec![]
                        },
                    );
                    vec![]
                });
                vec![]
            });
            vec![]
        });
        call.end(b);
    }

    fn emit_combine(&self, b: &KernelBuilder) {
        let d = self.dtype;
        let y = b.arg_ptr("y", d);
        let (raw_weights, sent_slot) = (b.arg_ptr("raw_weights", DType::F32), b.arg_ptr("sent_slot", DType::I32));
        let (src_count, pos) = (b.arg_ptr("src_count", DType::I32), b.arg_ptr("pos", DType::I32));
        let (comb, comb_ready, out) = (b.arg_ptr("comb", d), b.arg_ptr("comb_ready", DType::U64), b.arg_ptr("out", d));
        let (finished, epochs) = (b.arg_ptr("finished", DType::U64), b.arg_ptr("epochs", DType::U64));
        let (tokens, t_max, hidden) = (b.arg("tokens", DType::I32), b.arg("t_max", DType::I32), b.arg("hidden", DType::I32));
        // `experts` is the dispatch's scalar too (the same five arguments); combine has no use
        // for it.
        let (_, k) = (b.arg("experts", DType::I32), b.arg("top_k", DType::I32));
        let (me, world, pid, programs) = (b.rank(), b.num_ranks(), b.program_id_x(), b.num_programs(Axis::X));
        let call = crate::epoch::Epoch::begin(b, epochs);
        let rows = world * t_max;
        let comb = call.half(comb, rows * hidden);
        // The dispatch's weights: the half of the dispatch of the same call (they alternate).
        let raw_weights = call.half(raw_weights, rows * k);
        // Each received token's rows, weighted, summed and sent home once.
        b.for_range(0, world, 1, &[], |s, _| {
            let home = b.symm_at(comb, s);
            b.for_range(pid, b.load(src_count + s, None, None), programs, &[], |r, _| {
                let row = s * t_max + r;
                each_block(b, self.block, hidden, &|at, m| {
                    let acc = b.zeros(&at.shape(), DType::F32);
                    let sum = b.for_range(0, k, 1, &[acc], |j, acc| {
                        let p = b.load(pos + (row * k + j), None, None);
                        let valid = p.ge(0);
                        let w = valid.select(b.load(raw_weights + (row * k + j), None, None), 0.0f32);
                        let v = b.load_or(y + (p.max(0) * hidden + at), m.binary(BinaryOp::And, valid), 0.0).cast(DType::F32);
                        vec![acc[0] + w * v]
                    })[0];
                    b.store(home + ((me * t_max + r) * hidden + at), sum.cast(d), Some(m));
                });
                vec![]
            });
            vec![]
        });
        Self::meet(b, finished + 2, &call, programs);
        b.for_range(pid, world, programs, &[], |r, _| {
            b.notify(comb_ready + me, r, call.value, SignalOp::Set, CommScope::IntraNode);
            vec![]
        });
        // Each token: its partial sums from every rank, in rank order.
        let tok = b.wait(comb_ready, world, CmpOp::Ge, call.value, Scope::Sys, MemSemantic::Acquire);
        let comb = comb.consume_token(tok);
        b.for_range(pid, tokens, programs, &[], |t, _| {
            each_block(b, self.block, hidden, &|at, m| {
                let acc = b.zeros(&at.shape(), DType::F32);
                let sum = b.for_range(0, world, 1, &[acc], |r, acc| {
                    let slot = b.load(sent_slot + (t * world + r), None, None);
                    let valid = slot.ge(0);
                    let v = b
                        .load_or(comb + ((r * t_max + slot.max(0)) * hidden + at), m.binary(BinaryOp::And, valid), 0.0)
                        .cast(DType::F32);
                    vec![acc[0] + v]
                })[0];
                b.store(out + (t * hidden + at), sum.cast(d), Some(m));
            });
            vec![]
        });
        call.end(b);
    }

    fn grid(&self, tokens: usize, w: usize) -> [u32; 3] {
        [(tokens.max(w).max(1)).min(self.max_programs.max(1) as usize) as u32, 1, 1]
    }

    /// The kernel of `stage`, compiled once per world.
    fn kernel(&self, ctx: &dyn RankCtx, stage: Stage) -> Result<Artifact, BackendError> {
        ctx.compile(&format!("{self:?} {stage:?}"), &|| self.build(stage))
    }

    /// Enqueues dispatch of `tokens` rows of `x` routed by `topk` with `weights`: results in
    /// `bufs.recv` (`offs` ends per local expert), `recv_src`.
    pub fn dispatch(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut HtBuffers,
        x: &Buffer,
        topk: &Buffer,
        weights: &Buffer,
        tokens: usize,
    ) -> Result<(), BackendError> {
        let (s, es) = (bufs.shape, self.dtype.size_bytes() as usize);
        let scalars = bufs.shape.scalars(tokens)?;
        require_bytes(x, tokens * s.hidden * es, "x")?;
        require_bytes(topk, tokens * s.top_k * 4, "topk")?;
        require_bytes(weights, tokens * s.top_k * 4, "weights")?;
        let kernel = self.kernel(ctx, Stage::Dispatch)?;
        // Combine's kernel too, so that the first combine does not compile after this launch.
        self.kernel(ctx, Stage::Combine)?;
        let mut args = vec![
            x.arg(),
            topk.arg(),
            weights.arg(),
            bufs.raw.arg(),
            bufs.raw_token.arg(),
            bufs.raw_experts.arg(),
            bufs.raw_weights.arg(),
            bufs.counts.arg(),
            bufs.counters.arg(),
            bufs.finished.arg(),
            bufs.sent_slot.arg(),
            bufs.src_count.arg(),
            bufs.pos.arg(),
            bufs.recv.arg(),
            bufs.offs.arg(),
            bufs.recv_src.arg(),
        ];
        if self.quantize {
            args.extend([bufs.raw_scales.arg(), bufs.recv_scales.arg()]);
        }
        args.push(crate::epoch::state_arg(&bufs.epochs, 0));
        args.extend(scalars);
        ctx.launch(0, &kernel, self.grid(tokens, ctx.world_size()), &args)?;
        bufs.calls[0] += 1;
        Ok(())
    }

    /// Enqueues combine: the experts' outputs `y` (`[capacity, H]` in `recv`'s order) summed
    /// per token with the dispatch's weights, into `bufs.out` on the tokens' ranks.
    pub fn combine(&self, ctx: &dyn RankCtx, bufs: &mut HtBuffers, y: &Buffer, tokens: usize) -> Result<(), BackendError> {
        let (s, es) = (bufs.shape, self.dtype.size_bytes() as usize);
        let scalars = bufs.shape.scalars(tokens)?;
        require_bytes(y, bufs.capacity(ctx.world_size()) * s.hidden * es, "y")?;
        let kernel = self.kernel(ctx, Stage::Combine)?;
        let mut args = vec![
            y.arg(),
            bufs.raw_weights.arg(),
            bufs.sent_slot.arg(),
            bufs.src_count.arg(),
            bufs.pos.arg(),
            bufs.comb.arg(),
            bufs.comb_ready.arg(),
            bufs.out.arg(),
            bufs.finished.arg(),
            crate::epoch::state_arg(&bufs.epochs, 1),
        ];
        args.extend(scalars);
        ctx.launch(0, &kernel, self.grid(tokens, ctx.world_size()), &args)?;
        bufs.calls[1] += 1;
        Ok(())
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "ep_ht_dispatch",
        operation: "ep_all_to_all",
        distributed: true,
        build: |d| HighThroughputAllToAll::new(d).build(Stage::Dispatch),
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "ep_ht_combine",
        operation: "ep_all_to_all",
        distributed: true,
        build: |d| HighThroughputAllToAll::new(d).build(Stage::Combine),
    }
}
