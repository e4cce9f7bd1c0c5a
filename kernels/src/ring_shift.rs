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
//! Signals carry an epoch (the host's call count), so nothing is ever reset.

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
    /// The previous rank's chunk, after the call (symmetric).
    pub out: Buffer,
    /// One u64 arrival signal per program (symmetric).
    pub arrived: Buffer,
    pub chunk: usize,
    pub epoch: u64,
}

impl RingShift {
    pub fn new(dtype: DType, mode: ShiftMode) -> RingShift {
        RingShift { dtype, mode, block: 1024 }
    }

    /// Collective: allocates the symmetric buffers on every rank.
    pub fn buffers(&self, ctx: &dyn RankCtx, chunk: usize) -> Result<ShiftBuffers, BackendError> {
        let bytes = chunk * self.dtype.size_bytes() as usize;
        Ok(ShiftBuffers {
            src: ctx.symm_alloc(bytes, "shift_src")?,
            out: ctx.symm_alloc(bytes, "shift_out")?,
            arrived: ctx.symm_alloc(8 * self.programs(chunk) as usize, "shift_arrived")?,
            chunk,
            epoch: 0,
        })
    }

    pub fn programs(&self, chunk: usize) -> u32 {
        cdiv(chunk.max(1), self.block as usize) as u32
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let cooperative = self.mode == ShiftMode::Get;
        let name = format!("ring_shift_{:?}_{}_{}", self.mode, self.dtype, self.block).to_lowercase();
        let b = KernelBuilder::new(&name, LaunchAttrs { cooperative, ..LaunchAttrs::default() });
        let (src, out) = (b.arg_ptr("src", self.dtype), b.arg_ptr("out", self.dtype));
        let arrived = b.arg_ptr("arrived", DType::U64);
        let (chunk, epoch) = (b.arg("chunk", DType::I32), b.arg("epoch", DType::U64));
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
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
        b.finish()
    }

    /// Shifts every rank's `bufs.src` into the next rank's `bufs.out`; returns when this rank's
    /// `out` holds the previous rank's chunk.
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut ShiftBuffers) -> Result<(), BackendError> {
        require_bytes(&bufs.src, bufs.chunk * self.dtype.size_bytes() as usize, "src")?;
        let chunk = require_i32(bufs.chunk, "chunk")?;
        bufs.epoch += 1;
        let kernel = ctx.compile(&format!("{self:?}"), &|| self.build())?;
        let programs = self.programs(bufs.chunk);
        let args =
            [bufs.src.arg(), bufs.out.arg(), bufs.arrived.arg(), KernelArg::i32(chunk), KernelArg::u64(bufs.epoch)];
        ctx.launch(0, &kernel, [programs, 1, 1], &args)?;
        ctx.synchronize()?;
        ctx.barrier()
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
