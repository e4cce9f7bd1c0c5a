//! ReduceScatter (sum): every rank's input holds W chunks of `chunk` elements, and rank r ends
//! with chunk r summed over every rank: `out_r = sum_p input_p[r]`.
//!
//! * Ring: W-1 steps around the ring r -> r+1. At step 0 rank r sends its own slice of chunk
//!   r-1 to its successor's receive slot 0; at step s it waits for its predecessor's slot s-1
//!   (a partial sum of chunk r-1-s), adds its own slice of that chunk and sends the sum to slot
//!   s of its successor; after the last step rank r holds the others' sum of chunk r and adds
//!   its own. Every rank sends (W-1)/W of its input once; partial sums travel in the element
//!   type (as NCCL's ring does), each hop adding in f32.
//! * One-shot: program i copies its slices of every chunk into the symmetric `stage` and
//!   signals each chunk's owner; the owner waits for every rank's signal of program i, then
//!   reads its chunk's slices from all W stages (`symm_at`) and sums them in f32, over ranks 0..W
//!   in order. It reads (W-1)/W of every peer's input in one step: fewer hops, for small inputs.
//!
//! Program i's slices are blocks i, i + P, i + 2P, .. of `block` elements of a chunk, with at
//! most `max_programs` programs P (each then loops over its blocks), so that every waiting
//! program can be resident. Signals carry the call's epoch, compared with `>=`: nothing is
//! reset. Each program keeps its epoch on the device and call e uses half e mod 2 of the slots
//! or stage (`crate::epoch`: a rank writes a half for call e+2 only after every rank finished
//! call e; in the ring, rank r's call e+1 ends with the partial its successor started, so the
//! successor began call e+1): recorded once, a call replays.

use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, Scope, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterAlgorithm {
    Ring,
    OneShot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReduceScatter {
    pub dtype: DType,
    pub algorithm: ScatterAlgorithm,
    /// Elements per program and loop step.
    pub block: u32,
    /// The grid cap ([`ReduceScatter::programs`]).
    pub max_programs: u32,
}

/// Symmetric state of a ReduceScatter of `chunk` elements per rank.
pub struct ScatterBuffers {
    /// Two halves of: ring, the W-1 receive slots (`[W-1][chunk]`); one-shot, the stage
    /// (`[W][chunk]`).
    pub data: Buffer,
    /// This rank's result (`chunk` elements; only its own kernel writes it).
    pub out: Buffer,
    /// Ring: `[W-1][P]` step signals; one-shot: `[P][W]` staged signals.
    pub ready: Buffer,
    /// The kernel's epoch words (`crate::epoch`).
    pub epochs: Buffer,
    pub chunk: usize,
    /// Calls enqueued from this host.
    pub calls: u64,
}

impl ScatterBuffers {
    /// Collective: signals and epochs back to zero on every rank (after a timed-out wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.calls = 0;
        crate::epoch::rearm(ctx, &[&self.ready, &self.epochs])
    }
}

impl ReduceScatter {
    pub fn new(dtype: DType, algorithm: ScatterAlgorithm) -> ReduceScatter {
        ReduceScatter { dtype, algorithm, block: 1024, max_programs: crate::allgather::AllGather::MAX_PROGRAMS }
    }

    /// Programs per rank: one per block of a chunk, at most `max_programs`.
    pub fn programs(&self, chunk: usize) -> u32 {
        cdiv(chunk.max(1), self.block as usize).min(self.max_programs.max(1) as usize) as u32
    }

    /// Collective: the symmetric buffers for `chunk` elements per rank (inputs of `W chunk`).
    pub fn buffers(&self, ctx: &dyn RankCtx, chunk: usize) -> Result<ScatterBuffers, BackendError> {
        let (w, es) = (ctx.world_size(), self.dtype.size_bytes() as usize);
        let p = self.programs(chunk) as usize;
        let (slots, signals) = match self.algorithm {
            ScatterAlgorithm::Ring => (w.saturating_sub(1).max(1), w.saturating_sub(1).max(1) * p),
            ScatterAlgorithm::OneShot => (w, p * w),
        };
        Ok(ScatterBuffers {
            data: ctx.symm_alloc(crate::epoch::halves_bytes(slots * chunk, es), "reduce_scatter_data")?,
            out: ctx.alloc(chunk * es, "reduce_scatter_out")?,
            ready: ctx.symm_alloc(signals * 8, "reduce_scatter_ready")?,
            epochs: crate::epoch::words(ctx, 1, "reduce_scatter_epochs")?,
            chunk,
            calls: 0,
        })
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let name = format!("reduce_scatter_{:?}_{}_{}", self.algorithm, self.dtype, self.block).to_lowercase();
        let b = KernelBuilder::new(&name, LaunchAttrs::default());
        self.emit(&b);
        b.finish()
    }

    /// The kernel's body into `b` (a function of its own so that the tiles' lifetime has a name).
    fn emit<'b>(&self, b: &'b KernelBuilder) {
        let (input, halves, out) =
            (b.arg_ptr("input", self.dtype), b.arg_ptr("data", self.dtype), b.arg_ptr("out", self.dtype));
        let (ready, epochs) = (b.arg_ptr("ready", DType::U64), b.arg_ptr("epochs", DType::U64));
        let chunk = b.arg("chunk", DType::I32);
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
        let call = crate::epoch::Epoch::begin(b, epochs);
        let slots = match self.algorithm {
            ScatterAlgorithm::Ring => (world - 1).max(1),
            ScatterAlgorithm::OneShot => world,
        };
        let (data, epoch) = (call.half(halves, slots * chunk), call.value);
        let programs = b.num_programs(Axis::X);
        let bs = self.block as i32;
        let lanes = b.arange(0, self.block as i64);
        let blocks = (chunk + (bs - 1)) / bs;
        // `body(lane, mask)` over this program's blocks of a chunk.
        let each_block = |body: &dyn Fn(Tile<'b>, Tile<'b>)| {
            b.for_range(pid, blocks, programs, &[], |blk, _| {
                let lane = blk * bs + lanes;
                body(lane, lane.lt(chunk));
                vec![]
            });
        };
        let f32_at = |p: Tile<'b>, m: Tile<'b>| -> Tile<'b> { b.load_or(p, m, 0.0).cast(DType::F32) };
        match self.algorithm {
            ScatterAlgorithm::Ring => {
                let next = (me + 1) % world;
                // The chunk a rank sends at step s: r-1-s (mod W).
                let sent = |s: Tile<'b>| -> Tile<'b> { (me - s - 1 + world * 2) % world };
                b.if_then(world.gt(1), || {
                    let c = sent(b.constant(trident_core::ir::Literal::Int(0), DType::I32));
                    each_block(&|lane, m| {
                        b.store(b.symm_at(data, next) + lane, b.load(input + (c * chunk + lane), Some(m), None), Some(m));
                    });
                    b.notify(ready + pid, next, epoch, SignalOp::Set, CommScope::IntraNode);
                });
                b.for_range(1, world - 1, 1, &[], |s, _| {
                    let tok = b.wait(ready + ((s - 1) * programs + pid), 1, CmpOp::Ge, epoch, Scope::Sys, MemSemantic::Acquire);
                    let received = data.consume_token(tok);
                    let c = sent(s);
                    each_block(&|lane, m| {
                        let sum = f32_at(input + (c * chunk + lane), m) + f32_at(received + ((s - 1) * chunk + lane), m);
                        b.store(b.symm_at(data, next) + (s * chunk + lane), sum.cast(self.dtype), Some(m));
                    });
                    b.notify(ready + (s * programs + pid), next, epoch, SignalOp::Set, CommScope::IntraNode);
                    vec![]
                });
                b.if_else(
                    world.gt(1),
                    || {
                        let last = world - 2;
                        let tok = b.wait(ready + (last * programs + pid), 1, CmpOp::Ge, epoch, Scope::Sys, MemSemantic::Acquire);
                        let received = data.consume_token(tok);
                        each_block(&|lane, m| {
                            let sum = f32_at(input + (me * chunk + lane), m) + f32_at(received + (last * chunk + lane), m);
                            b.store(out + lane, sum.cast(self.dtype), Some(m));
                        });
                        vec![]
                    },
                    || {
                        each_block(&|lane, m| b.store(out + lane, b.load(input + lane, Some(m), None), Some(m)));
                        vec![]
                    },
                );
            }
            ScatterAlgorithm::OneShot => {
                // Stage this program's slices of every chunk and tell the chunk's owner.
                b.for_range(0, world, 1, &[], |c, _| {
                    each_block(&|lane, m| {
                        let idx = c * chunk + lane;
                        b.store(data + idx, b.load(input + idx, Some(m), None), Some(m));
                    });
                    b.notify(ready + (pid * world + me), c, epoch, SignalOp::Set, CommScope::IntraNode);
                    vec![]
                });
                let tok = b.wait(ready + pid * world, world, CmpOp::Ge, epoch, Scope::Sys, MemSemantic::Acquire);
                let staged = data.consume_token(tok);
                each_block(&|lane, m| {
                    let idx = me * chunk + lane;
                    let acc = b.zeros(&idx.shape(), DType::F32);
                    let sum = b.for_range(0, world, 1, &[acc], |p, c| vec![c[0] + f32_at(b.symm_at(staged, p) + idx, m)])[0];
                    b.store(out + lane, sum.cast(self.dtype), Some(m));
                });
            }
        }
        call.end(b);
    }

    /// Sums `input` (W chunks of `bufs.chunk` elements) over all ranks; rank r's chunk r of the
    /// sum lands in `bufs.out`. Returns when every rank finished.
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut ScatterBuffers, input: &Buffer) -> Result<(), BackendError> {
        self.enqueue(ctx, bufs, input)?;
        ctx.synchronize()?;
        ctx.barrier()
    }

    /// Enqueues the next call (one kernel launch: it can be recorded).
    pub fn enqueue(&self, ctx: &dyn RankCtx, bufs: &mut ScatterBuffers, input: &Buffer) -> Result<(), BackendError> {
        let w = ctx.world_size();
        require_bytes(input, w * bufs.chunk * self.dtype.size_bytes() as usize, "input")?;
        let chunk = require_i32(bufs.chunk, "chunk")?;
        require_i32(2 * w * bufs.chunk, "the buffers' elements")?;
        let kernel = ctx.compile(&format!("{self:?}"), &|| self.build())?;
        let args =
            [input.arg(), bufs.data.arg(), bufs.out.arg(), bufs.ready.arg(), bufs.epochs.arg(), KernelArg::i32(chunk)];
        ctx.launch(0, &kernel, [self.programs(bufs.chunk), 1, 1], &args)?;
        bufs.calls += 1;
        Ok(())
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "reduce_scatter_ring",
        operation: "reduce_scatter",
        distributed: true,
        build: |d| ReduceScatter::new(d, ScatterAlgorithm::Ring).build(),
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "reduce_scatter_oneshot",
        operation: "reduce_scatter",
        distributed: true,
        build: |d| ReduceScatter::new(d, ScatterAlgorithm::OneShot).build(),
    }
}
