//! Ring shift: every rank ends with the previous rank's chunk, `out = src of rank (r - 1) mod W`,
//! the point-to-point step of ring collectives, moved by the one-sided SHMEM transfers.
//!
//! * [`ShiftMode::Put`]: program p puts its slice of the chunk into `out` on rank r+1 with
//!   `put_signal`, setting `arrived[p]` there to the call's epoch once the data is delivered, then
//!   waits until its own `arrived[p]` reached the epoch (slice p from rank r-1). A program only
//!   waits for the same program id of another rank (or itself, in a world of one): an
//!   independent launch.
//! * [`ShiftMode::Get`]: a cooperative launch; every program meets every other program of every
//!   rank at `barrier_all` (so each rank's `src` is final) and then gets its slice of rank r-1's
//!   `src` into its own `out`, then meets them again (so no rank overwrites `src` while a peer
//!   still reads it).
//!
//! Signals carry the call's epoch, so nothing is ever reset. Each program keeps its epoch on the
//! device and call e writes half e mod 2 of `out` (`crate::epoch`): recorded once, a call
//! replays.

use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{CmpOp, DType, Group, LaunchAttrs, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, VerifyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShiftMode {
    Put,
    Get,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingShift {
    pub dtype: DType,
    pub mode: ShiftMode,
    /// Elements per program.
    pub block: u32,
}

/// Symmetric state of a ring shift of `chunk` elements.
pub struct ShiftBuffers {
    /// This rank's chunk (symmetric: a `get` reads it from a peer).
    pub src: Buffer,
    /// Two halves of the previous rank's chunk: call e fills half e mod 2 (symmetric).
    pub out: Buffer,
    /// One u64 arrival signal per program (symmetric).
    pub arrived: Buffer,
    /// The kernel's epoch words (`crate::epoch`).
    pub epochs: Buffer,
    pub chunk: usize,
    /// Calls enqueued from this host.
    pub calls: u64,
}

impl ShiftBuffers {
    /// The previous rank's chunk as call `call` (numbered from 1) left it: valid until call
    /// `call + 2` is enqueued.
    pub fn result(&self, call: u64) -> Buffer {
        crate::epoch::half_of(&self.out, call)
    }

    /// Collective: signals and epochs back to zero on every rank (after a timed-out wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.calls = 0;
        crate::epoch::rearm(ctx, &[&self.arrived, &self.epochs])
    }
}

impl RingShift {
    pub fn new(dtype: DType, mode: ShiftMode) -> RingShift {
        RingShift { dtype, mode, block: 1024 }
    }

    /// Collective: allocates the symmetric buffers on every rank.
    pub fn buffers(&self, ctx: &dyn RankCtx, chunk: usize) -> Result<ShiftBuffers, BackendError> {
        let bytes = chunk * self.dtype.size_bytes() as usize;
        let programs = self.programs(chunk) as usize;
        Ok(ShiftBuffers {
            src: ctx.symm_alloc(bytes, "shift_src")?,
            out: ctx.symm_alloc(crate::epoch::halves_bytes(chunk, self.dtype.size_bytes() as usize), "shift_out")?,
            arrived: ctx.symm_alloc(8 * programs, "shift_arrived")?,
            epochs: crate::epoch::words(ctx, 1, "shift_epochs")?,
            chunk,
            calls: 0,
        })
    }

    pub fn programs(&self, chunk: usize) -> u32 {
        cdiv(chunk.max(1), self.block as usize) as u32
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let cooperative = self.mode == ShiftMode::Get;
        let name = format!("ring_shift_{:?}_{}_{}", self.mode, self.dtype, self.block).to_lowercase();
        let b = KernelBuilder::new(&name, LaunchAttrs { cooperative, ..LaunchAttrs::default() });
        let (src, halves) = (b.arg_ptr("src", self.dtype), b.arg_ptr("out", self.dtype));
        let (arrived, epochs) = (b.arg_ptr("arrived", DType::U64), b.arg_ptr("epochs", DType::U64));
        let chunk = b.arg("chunk", DType::I32);
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
        let call = crate::epoch::Epoch::begin(&b, epochs);
        let (out, epoch) = (call.half(halves, chunk), call.value);
        let start = pid * self.block as i32;
        // Elements of this program's slice: min(block, chunk - start).
        let count = (chunk - start).min(self.block as i32);
        let bytes = count.cast(DType::I64) * self.dtype.size_bytes() as i64;
        match self.mode {
            ShiftMode::Put => {
                let next = (me + 1) % world;
                let sig = arrived + pid;
                b.put_signal(out + start, src + start, bytes, sig, epoch, SignalOp::Set, next, Group::Block, false);
                b.signal_wait_until(sig, CmpOp::Ge, epoch);
            }
            ShiftMode::Get => {
                let prev = (me + world - 1) % world;
                b.barrier_all(Group::Block);
                b.get(out + start, src + start, bytes, prev, Group::Block, false);
                b.barrier_all(Group::Block);
            }
        }
        call.end(&b);
        b.finish()
    }

    /// Shifts every rank's `bufs.src` into the next rank's `bufs.result(bufs.calls)`; returns
    /// when every rank finished.
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut ShiftBuffers) -> Result<(), BackendError> {
        self.enqueue(ctx, bufs)?;
        ctx.synchronize()?;
        ctx.barrier()
    }

    /// Enqueues the next call (one kernel launch: it can be recorded).
    pub fn enqueue(&self, ctx: &dyn RankCtx, bufs: &mut ShiftBuffers) -> Result<(), BackendError> {
        require_bytes(&bufs.src, bufs.chunk * self.dtype.size_bytes() as usize, "src")?;
        let chunk = require_i32(bufs.chunk, "chunk")?;
        require_i32(2 * bufs.chunk, "the buffers' elements")?;
        let kernel = ctx.compile(&format!("{self:?}"), &|| self.build())?;
        let programs = self.programs(bufs.chunk);
        let args =
            [bufs.src.arg(), bufs.out.arg(), bufs.arrived.arg(), bufs.epochs.arg(), KernelArg::i32(chunk)];
        ctx.launch(0, &kernel, [programs, 1, 1], &args)?;
        bufs.calls += 1;
        Ok(())
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "ring_shift_put",
        operation: "ring_shift",
        distributed: true,
        build: |d| RingShift::new(d, ShiftMode::Put).build(),
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "ring_shift_get",
        operation: "ring_shift",
        distributed: true,
        build: |d| RingShift::new(d, ShiftMode::Get).build(),
    }
}
