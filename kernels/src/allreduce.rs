//! AllReduce (sum): every rank ends with the elementwise sum of every rank's input, reduced in f32.
//!
//! * One-shot: each program copies its slices of the input into the symmetric `stage`, signals
//!   every rank (`ready[program][rank] = epoch`), waits for every rank's signal for its slices,
//!   then reads them from all W stages (`symm_at`) and sums. Reads W x the data; wins for small
//!   messages.
//! * Two-shot: rank r owns chunk r. Program i stages its slices of every chunk and signals each
//!   chunk's owner; the owner sums those slices of its chunk from all stages, pushes the sums
//!   into every rank's `out` and signals; everyone waits for every chunk's slices of program i.
//!   Moves 2 x the data.
//!
//! Program i's slices are blocks i, i + P, i + 2P, .. of `block` elements, with at most
//! `max_programs` programs P: every program of the waiting kernel can be resident (program i
//! of one rank waits for program i of the others; with a grid larger than the GPUs hold, that
//! would rest on the order in which the hardware starts programs).
//!
//! The sum runs over ranks 0..W in order on every rank, so all ranks get identical bits.
//!
//! Each program keeps its epoch on the device and call e uses half e mod 2 of `stage` and `out`
//! (`crate::epoch`): recorded once, a call replays.

use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, Scope, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    OneShot,
    TwoShot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllReduce {
    pub dtype: DType,
    /// Elements per program and loop step.
    pub block: u32,
    pub algorithm: Algorithm,
    /// The grid cap ([`AllReduce::programs`]).
    pub max_programs: u32,
}

/// Symmetric state of an AllReduce of `n` elements.
pub struct AllReduceBuffers {
    /// Two halves of `n` staged elements.
    pub stage: Buffer,
    /// Two halves of `n` results (symmetric: two-shot owners write into them).
    pub out: Buffer,
    pub ready: Buffer,
    pub done: Buffer,
    /// The kernel's epoch words (`crate::epoch`).
    pub epochs: Buffer,
    pub n: usize,
    /// Calls enqueued from this host (the number of the last call).
    pub calls: u64,
}

impl AllReduceBuffers {
    /// The sums of call `call` (numbered from 1): valid until call `call + 2` is enqueued.
    pub fn result(&self, call: u64) -> Buffer {
        crate::epoch::half_of(&self.out, call)
    }

    /// Collective: signals and epochs back to zero on every rank (after a timed-out wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.calls = 0;
        crate::epoch::rearm(ctx, &[&self.ready, &self.done, &self.epochs])
    }
}

impl AllReduce {
    /// The AllReduce for `n` elements of `dtype` in `ctx`'s world: one-shot or two-shot by the
    /// bytes and the crossover measured for this device, transport and world
    /// (`crate::allreduce_auto`).
    pub fn auto(ctx: &dyn RankCtx, dtype: DType, n: usize) -> AllReduce {
        let bytes = n * dtype.size_bytes() as usize;
        AllReduce::new(dtype, crate::allreduce_auto::AllReduceCrossover::for_world(ctx).algorithm(bytes))
    }

    pub fn new(dtype: DType, algorithm: Algorithm) -> AllReduce {
        AllReduce { dtype, block: 1024, algorithm, max_programs: crate::allgather::AllGather::MAX_PROGRAMS }
    }

    /// Elements each rank owns in the two-shot algorithm.
    pub fn chunk(&self, n: usize, world: usize) -> usize {
        match self.algorithm {
            Algorithm::OneShot => n,
            Algorithm::TwoShot => cdiv(n, world),
        }
    }

    /// Programs per rank: one per block of the chunk, at most `max_programs` (each then loops
    /// over its blocks).
    pub fn programs(&self, n: usize, world: usize) -> u32 {
        cdiv(self.chunk(n, world).max(1), self.block as usize).min(self.max_programs.max(1) as usize) as u32
    }

    /// Collective: the symmetric buffers for `n` elements.
    pub fn buffers(&self, ctx: &dyn RankCtx, n: usize) -> Result<AllReduceBuffers, BackendError> {
        let es = self.dtype.size_bytes() as usize;
        let signals = self.programs(n, ctx.world_size()) as usize * ctx.world_size() * 8;
        Ok(AllReduceBuffers {
            stage: ctx.symm_alloc(crate::epoch::halves_bytes(n, es), "allreduce_stage")?,
            out: ctx.symm_alloc(crate::epoch::halves_bytes(n, es), "allreduce_out")?,
            ready: ctx.symm_alloc(signals, "allreduce_ready")?,
            done: ctx.symm_alloc(signals, "allreduce_done")?,
            epochs: crate::epoch::words(ctx, 1, "allreduce_epochs")?,
            n,
            calls: 0,
        })
    }

    /// `sum over ranks p of load(symm_at(stage, p) + idx)` in f32.
    fn sum_over_ranks<'b>(&self, b: &'b KernelBuilder, stage: Tile<'b>, idx: Tile<'b>, mask: Tile<'b>) -> Tile<'b> {
        let acc = b.zeros(&idx.shape(), DType::F32);
        b.for_range(0, b.num_ranks(), 1, &[acc], |p, c| {
            vec![c[0] + b.load_or(b.symm_at(stage, p) + idx, mask, 0.0).cast(DType::F32)]
        })[0]
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let name = format!("allreduce_{:?}_{}_{}", self.algorithm, self.dtype, self.block).to_lowercase();
        let b = KernelBuilder::new(&name, LaunchAttrs::default());
        let (input, stages, outs) =
            (b.arg_ptr("input", self.dtype), b.arg_ptr("stage", self.dtype), b.arg_ptr("out", self.dtype));
        let (ready, done) = (b.arg_ptr("ready", DType::U64), b.arg_ptr("done", DType::U64));
        let epochs = b.arg_ptr("epochs", DType::U64);
        let (n, chunk) = (b.arg("n", DType::I32), b.arg("chunk", DType::I32));
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
        let call = crate::epoch::Epoch::begin(&b, epochs);
        let (stage, out, epoch) = (call.half(stages, n), call.half(outs, n), call.value);
        let (bs, programs) = (self.block as i32, b.num_programs(Axis::X));
        let lanes = b.arange(0, self.block as i64);
        let my_signals = ready + pid * world;
        // This program's blocks: pid, pid + programs, .. below the blocks of the input and of a
        // chunk.
        let (blocks_n, blocks_chunk) = ((n + (bs - 1)) / bs, (chunk + (bs - 1)) / bs);
        match self.algorithm {
            Algorithm::OneShot => {
                b.for_range(pid, blocks_n, programs, &[], |blk, _| {
                    let lane = blk * bs + lanes;
                    let mask = lane.lt(n);
                    b.store(stage + lane, b.load(input + lane, Some(mask), None), Some(mask));
                    vec![]
                });
                b.for_range(0, world, 1, &[], |p, _| {
                    b.notify(ready + (pid * world + me), p, epoch, SignalOp::Set, CommScope::IntraNode);
                    vec![]
                });
                let tok = b.wait(my_signals, world, CmpOp::Ge, epoch, Scope::Sys, MemSemantic::Acquire);
                let staged = stage.consume_token(tok);
                b.for_range(pid, blocks_n, programs, &[], |blk, _| {
                    let lane = blk * bs + lanes;
                    let mask = lane.lt(n);
                    let sum = self.sum_over_ranks(&b, staged, lane, mask);
                    b.store(out + lane, sum.cast(self.dtype), Some(mask));
                    vec![]
                });
            }
            Algorithm::TwoShot => {
                // Stage this program's slices of every chunk and tell the chunk's owner.
                b.for_range(0, world, 1, &[], |c, _| {
                    b.for_range(pid, blocks_chunk, programs, &[], |blk, _| {
                        let lane = blk * bs + lanes;
                        let idx = c * chunk + lane;
                        let m = lane.lt(chunk) & idx.lt(n);
                        b.store(stage + idx, b.load(input + idx, Some(m), None), Some(m));
                        vec![]
                    });
                    b.notify(ready + (pid * world + me), c, epoch, SignalOp::Set, CommScope::IntraNode);
                    vec![]
                });
                // Reduce this program's slices of my chunk and push them to every rank.
                let tok = b.wait(my_signals, world, CmpOp::Ge, epoch, Scope::Sys, MemSemantic::Acquire);
                let staged = stage.consume_token(tok);
                b.for_range(pid, blocks_chunk, programs, &[], |blk, _| {
                    let lane = blk * bs + lanes;
                    let idx = me * chunk + lane;
                    let m = lane.lt(chunk) & idx.lt(n);
                    let sum = self.sum_over_ranks(&b, staged, idx, m).cast(self.dtype);
                    b.for_range(0, world, 1, &[], |p, _| {
                        b.store(b.symm_at(out, p) + idx, sum, Some(m));
                        vec![]
                    });
                    vec![]
                });
                b.for_range(0, world, 1, &[], |p, _| {
                    b.notify(done + (pid * world + me), p, epoch, SignalOp::Set, CommScope::IntraNode);
                    vec![]
                });
                b.wait(done + pid * world, world, CmpOp::Ge, epoch, Scope::Sys, MemSemantic::Acquire);
            }
        }
        call.end(&b);
        b.finish()
    }

    /// Sums `input` (n elements) over all ranks into `bufs.result(bufs.calls)`; returns when
    /// every rank finished.
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut AllReduceBuffers, input: &Buffer) -> Result<(), BackendError> {
        self.enqueue(ctx, bufs, input)?;
        ctx.synchronize()?;
        ctx.barrier()
    }

    /// Enqueues the next call (one kernel launch: it can be recorded).
    pub fn enqueue(&self, ctx: &dyn RankCtx, bufs: &mut AllReduceBuffers, input: &Buffer) -> Result<(), BackendError> {
        require_bytes(input, bufs.n * self.dtype.size_bytes() as usize, "input")?;
        let w = ctx.world_size();
        let (n, chunk) = (require_i32(bufs.n, "n")?, require_i32(self.chunk(bufs.n, w), "chunk")?);
        let kernel = ctx.compile(&format!("{self:?}"), &|| self.build())?;
        let args = [
            input.arg(),
            bufs.stage.arg(),
            bufs.out.arg(),
            bufs.ready.arg(),
            bufs.done.arg(),
            bufs.epochs.arg(),
            KernelArg::i32(n),
            KernelArg::i32(chunk),
        ];
        ctx.launch(0, &kernel, [self.programs(bufs.n, w), 1, 1], &args)?;
        bufs.calls += 1;
        Ok(())
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "allreduce_oneshot",
        operation: "allreduce",
        distributed: true,
        build: |d| AllReduce::new(d, Algorithm::OneShot).build(),
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "allreduce_twoshot",
        operation: "allreduce",
        distributed: true,
        build: |d| AllReduce::new(d, Algorithm::TwoShot).build(),
    }
}
