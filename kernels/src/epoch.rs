//! Device-side epochs and parity buffers: how every collective of the library can be recorded
//! once and replayed (`trident_core::capture`, CUDA graphs).
//!
//! A collective's signals carry the number of the call (its epoch) and waits compare with `>=`,
//! so nothing is ever reset. That number lives on the device, not in a launch argument: each
//! collective kernel keeps two words in the operation's buffers (`epochs`, symmetric so they
//! start at zero on every rank): the epoch of its last call, and how many programs of the
//! current call have finished. Every program reads the first word when it starts and uses it
//! plus one; the last program to finish (the one whose increment of the second word completes
//! the grid: by then every program has read the first) stores the new epoch and clears the
//! count. The next launch of the kernel, later on the stream, reads the new value. A kernel that
//! waits on another kernel's signals keeps its own words and multiplies its epoch by what each
//! call adds to the signal. Launch arguments are then the same for every call: a recorded
//! launch sequence replays correctly.
//!
//! Every buffer another rank writes into or reads from comes in two halves, and call `e` uses
//! half `e mod 2` (its parity). The invariant that makes the reuse safe: **a rank starts writing
//! a half for call e+2 only after every rank has finished its part of call e.** It holds because
//! every collective makes each rank wait, within a call, for something every other rank does
//! at the start of that call (a signal it sends after its earlier work on the stream), and calls
//! on one rank run in stream order: when rank r's call e+1 is complete, every rank has started
//! call e+1, so each has completed call e, and whatever a rank enqueued on its stream between
//! calls e and e+1 (a consumer of call e's result) has run. A collective's result is therefore
//! valid until the rank's call e+2 is enqueued: consume it on the same stream before that.

use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::{AtomicOp, Axis, DType, MemSemantic, Scope};
use trident_core::world::RankCtx;
use trident_core::{KernelBuilder, Tile};

/// One program's view of the call's epoch.
pub struct Epoch<'b> {
    /// This call's epoch (u64): the last call's plus one.
    pub value: Tile<'b>,
    at: Tile<'b>,
}

impl<'b> Epoch<'b> {
    /// Reads the kernel's epoch words at `state` (a `!ptr<u64>` argument: the last call's
    /// epoch, then the count of finished programs).
    pub fn begin(b: &'b KernelBuilder, state: Tile<'b>) -> Epoch<'b> {
        let value = b.load(state, None, None) + 1u64;
        Epoch { value, at: state }
    }

    /// The call's parity (i32 0 or 1): which half of a double buffer it uses.
    pub fn parity(&self) -> Tile<'b> {
        (self.value % 2u64).cast(DType::I32)
    }

    /// `base` offset to this call's half of a double buffer of `half` elements per half, each
    /// half [`half_elems`] long (i32 arithmetic, as every index of the kernels, so that
    /// divisibility facts carry over to the half: TMA descriptors of it stay aligned; host code
    /// checks `2 half` fits i32).
    pub fn half(&self, base: Tile<'b>, half: Tile<'b>) -> Tile<'b> {
        let align = HALF_ALIGN as i32;
        base + self.parity() * (((half + (align - 1)) / align) * align)
    }

    /// `value * per_call`: the count a signal reaches by this call when each call adds
    /// `per_call` to it.
    pub fn times(&self, per_call: Tile<'b>) -> Tile<'b> {
        self.value * per_call.cast(DType::U64)
    }

    /// The end of the program's part: it counts itself finished, and the last program of the
    /// grid stores the new epoch and clears the count (after a program barrier, so that every
    /// thread of it has read the old epoch).
    pub fn end(self, b: &'b KernelBuilder) {
        b.barrier();
        let finished = self.at + 1;
        let programs = (b.num_programs(Axis::X) * b.num_programs(Axis::Y) * b.num_programs(Axis::Z)).cast(DType::U64);
        let before = b.atomic(AtomicOp::Add, finished, 1u64, None, MemSemantic::AcqRel, Scope::Gpu);
        b.if_then(before.eq(programs - 1u64), || {
            b.store(finished, 0u64, None);
            b.store(self.at, self.value, None);
        });
    }
}

/// Elements a half of a double buffer is padded to a multiple of, so that the second half
/// starts as aligned as the first: 64 elements are at least 128 bytes, more than any vector
/// access or the vendor library's puts and gets (8 bytes) need.
pub const HALF_ALIGN: usize = 64;

/// The elements of one half of a double buffer holding `elems` elements per call.
pub fn half_elems(elems: usize) -> usize {
    elems.div_ceil(HALF_ALIGN) * HALF_ALIGN
}

/// Bytes of a double buffer of `elems` elements per call, of `elem_bytes` each.
pub fn halves_bytes(elems: usize, elem_bytes: usize) -> usize {
    2 * half_elems(elems) * elem_bytes
}

/// The half of a double buffer (`buffer` holds both, one after the other, as
/// [`halves_bytes`] sizes it) that call `call` (numbered from 1) uses.
pub fn half_of(buffer: &Buffer, call: u64) -> Buffer {
    let half = buffer.bytes / 2;
    Buffer { name: buffer.name.clone(), address: buffer.address + (call % 2) * half as u64, bytes: half }
}

/// Collective: the epoch words of `kernels` kernels (two u64 each: `Epoch::begin`'s `state`),
/// zeroed on every rank (symmetric).
pub fn words(ctx: &dyn RankCtx, kernels: usize, name: &str) -> Result<Buffer, BackendError> {
    ctx.symm_alloc(16 * kernels.max(1), name)
}

/// A local buffer of `bytes` bytes, zeroed (counters and scratch a collective's kernels count
/// in from zero).
pub fn zeroed(ctx: &dyn RankCtx, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
    let b = ctx.alloc(bytes, name)?;
    ctx.fill(&b, &[0])?;
    Ok(b)
}

/// Kernel `i`'s epoch words in `words`, as a launch argument.
pub fn state_arg(words: &Buffer, i: usize) -> trident_core::backend::KernelArg {
    words.arg_at(16 * i)
}

/// Collective: zeroes `buffers` (signals and epoch counters) and the world's `barrier_all`
/// words on every rank, after every rank's streams are idle: a world whose waits timed out
/// goes on from epoch 0, without restarting the process. An error of the streams (the timed-out
/// wait's diagnostic, if the caller has not synchronized since) is not this call's: it is
/// dropped.
pub fn rearm(ctx: &dyn RankCtx, buffers: &[&Buffer]) -> Result<(), BackendError> {
    let _ = ctx.synchronize();
    ctx.barrier()?;
    for b in buffers {
        ctx.fill(b, &[0])?;
    }
    ctx.rearm_barrier_all()?;
    ctx.barrier()
}

/// Copies the latest call's half of a double buffer into `dst`: the half of the call whose
/// epoch the kernel's epoch words hold (the last call completed on the stream), read on the
/// device, so that a recorded copy follows the halves on replay as the collective does. What
/// a caller that owns its output (a torch tensor) enqueues on the same stream right after the
/// collective; `half` is the elements per call (0 for a buffer of one half).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyLatest {
    pub dtype: DType,
    /// Elements per program.
    pub block: u32,
}

impl CopyLatest {
    pub fn new(dtype: DType) -> CopyLatest {
        CopyLatest { dtype, block: 1024 }
    }

    pub fn build(&self) -> Result<trident_core::Function, trident_core::VerifyError> {
        let b = KernelBuilder::new(
            &format!("copy_latest_{}_{}", self.dtype, self.block),
            trident_core::ir::LaunchAttrs::default(),
        );
        let (halves, state) = (b.arg_ptr("halves", self.dtype), b.arg_ptr("state", DType::U64));
        let dst = b.arg_ptr("dst", self.dtype);
        let (n, half) = (b.arg("n", DType::I32), b.arg("half", DType::I32));
        let last = b.load(state, None, None);
        let align = HALF_ALIGN as i32;
        let src = halves + (last % 2u64).cast(DType::I32) * (((half + (align - 1)) / align) * align);
        let offs = b.program_id_x() * self.block as i32 + b.arange(0, self.block as i64);
        let mask = offs.lt(n);
        let x = b.load(src + offs, Some(mask), None);
        b.store(dst + offs, x, Some(mask));
        b.finish()
    }

    /// Enqueues the copy of `n` elements from `halves` (of `half` elements per call, or 0) as the
    /// epoch words `state` say, into `dst`, on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        stream: trident_core::world::StreamId,
        halves: &Buffer,
        state: trident_core::backend::KernelArg,
        dst: &Buffer,
        n: usize,
        half: usize,
    ) -> Result<(), BackendError> {
        let es = self.dtype.size_bytes() as usize;
        crate::require_bytes(dst, n * es, "dst")?;
        let need = if half == 0 { n * es } else { halves_bytes(half, es) };
        crate::require_bytes(halves, need, "halves")?;
        if n == 0 {
            return Ok(());
        }
        let kernel = ctx.compile(&format!("{self:?}"), &|| self.build())?;
        let args = [
            halves.arg(),
            state,
            dst.arg(),
            trident_core::backend::KernelArg::i32(crate::require_i32(n, "n")?),
            trident_core::backend::KernelArg::i32(crate::require_i32(half, "half")?),
        ];
        ctx.launch(stream, &kernel, [crate::cdiv(n, self.block as usize) as u32, 1, 1], &args)
    }
}
