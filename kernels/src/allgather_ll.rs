//! Low-latency AllGather (the LL protocol): every 8-byte word a rank sends carries 4 bytes of
//! data and a 4-byte flag, the call's epoch, so that a receiver polls the data itself: no signal,
//! no fence, no second round trip. For messages up to about a megabyte, where the in-kernel push
//! ([`crate::allgather::AllGather`]) pays for its signal's fence and wait.
//!
//! Rank r's program `pid` packs its blocks of the chunk (4-byte words) as `flag << 32 | data`
//! and stores each word into slot r of every rank's `words` with a relaxed 8-byte atomic store
//! at system scope (single-copy atomic on NVLink and PCIe, as NCCL's LL relies on). It then
//! reads the same blocks of every rank's slot with `load_flagged` (each word polled until its
//! flag is the call's) and unpacks them into its local `out`. Programs exchange the same blocks
//! on every rank, so a program waits only on its namesakes of the other ranks.
//!
//! * **Flags.** The flag of call e is `((e - 1) mod (2^32 - 1)) + 1`: never 0, which memory
//!   starts as, and wrapping after 2^32 - 1 calls; the test is equality, since after the wrap
//!   an older call's flag may be the larger. [`LlBuffers::starting_at`] sets the first call's
//!   epoch, so that the wrap is tested.
//! * **Halves.** Call e writes half `e mod 2` of `words` (`crate::epoch`): a rank that races
//!   ahead to call e+1 writes the other half, and it reaches call e+2, the same half again,
//!   only after every rank sent its call e+1 words, which each sends after it finished reading
//!   call e's. A word of call e+2 replaces one of call e, whose flag differs.
//! * **Epochs** live on the device (`crate::epoch::Epoch`): a recorded call replays.
//!
//! Data moves in 4-byte words: a chunk of a 16-bit type must have an even number of elements
//! (a typed error otherwise).

use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{AtomicOp, Axis, BinaryOp, DType, LaunchAttrs, MemSemantic, Scope};
use trident_core::world::{RankCtx, StreamId};
use trident_core::{Function, KernelBuilder, VerifyError};

/// The flag of call `epoch` (numbered from 1): `((epoch - 1) mod (2^32 - 1)) + 1`, never 0.
pub fn flag_of(epoch: u64) -> u32 {
    ((epoch.wrapping_sub(1) % 0xffff_ffff) + 1) as u32
}

/// State of a low-latency AllGather of `chunk` elements per rank.
pub struct LlBuffers {
    /// Two halves of `[world][chunk words]` flagged words (u64, symmetric).
    pub words: Buffer,
    /// The kernel's epoch words (`crate::epoch`, symmetric).
    pub epochs: Buffer,
    /// `[world][chunk]` gathered elements (local): call e's until call e+1 is enqueued.
    pub out: Buffer,
    pub chunk: usize,
    pub dtype: DType,
    /// The epoch of the first call ([`LlBuffers::starting_at`]).
    pub first: u64,
    /// Calls enqueued from this host.
    pub calls: u64,
}

impl LlBuffers {
    /// Collective: the buffers of an AllGather of `chunk` elements of `dtype` per rank.
    pub fn new(ctx: &dyn RankCtx, dtype: DType, chunk: usize) -> Result<LlBuffers, BackendError> {
        Self::starting_at(ctx, dtype, chunk, 1)
    }

    /// Collective: as [`LlBuffers::new`], the first call being call `first` (>= 1) of the
    /// flag sequence ([`flag_of`]): `first = 2^32 - 2` wraps the flag on the third call.
    pub fn starting_at(ctx: &dyn RankCtx, dtype: DType, chunk: usize, first: u64) -> Result<LlBuffers, BackendError> {
        let bytes = chunk * dtype.size_bytes() as usize;
        if !bytes.is_multiple_of(4) {
            return Err(BackendError::Host(format!(
                "the low-latency AllGather moves 4-byte words: a chunk of {chunk} `{dtype}` elements is {bytes} bytes (make it a multiple of 4)"
            )));
        }
        if first == 0 {
            return Err(BackendError::Host("the low-latency AllGather's first call is epoch 1 or later, not 0".into()));
        }
        let w = ctx.world_size();
        let cw = bytes / 4;
        require_i32(2 * w * crate::epoch::half_elems(cw), "the flagged words")?;
        let words = ctx.symm_alloc(crate::epoch::halves_bytes(w * cw, 8), "allgather_ll_words")?;
        let epochs = crate::epoch::words(ctx, 1, "allgather_ll_epochs")?;
        let out = ctx.alloc(w * bytes.max(4), "allgather_ll_out")?;
        let mut bufs = LlBuffers { words, epochs, out, chunk, dtype, first, calls: 0 };
        bufs.set_epoch(ctx)?;
        Ok(bufs)
    }

    /// The epoch word: the last call's epoch, `first - 1` before any call.
    fn set_epoch(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        let mut w = [0u8; 16];
        w[..8].copy_from_slice(&(self.first - 1).to_le_bytes());
        ctx.write(&self.epochs, 0, &w)?;
        ctx.barrier()
    }

    /// 4-byte words per chunk.
    pub fn chunk_words(&self) -> usize {
        self.chunk * self.dtype.size_bytes() as usize / 4
    }

    /// Collective: the flagged words zeroed and the epoch back to `first - 1` on every rank
    /// (after a timed-out wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.calls = 0;
        crate::epoch::rearm(ctx, &[&self.words, &self.epochs])?;
        self.set_epoch(ctx)
    }
}

/// The low-latency AllGather kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllGatherLl {
    /// 4-byte words per program and loop step.
    pub block: u32,
    /// The grid cap: every program of a waiting kernel must be resident, with up to 8 ranks
    /// on one GPU ([`crate::allgather::AllGather::MAX_PROGRAMS`]).
    pub max_programs: u32,
}

impl Default for AllGatherLl {
    fn default() -> AllGatherLl {
        AllGatherLl { block: 512, max_programs: crate::allgather::AllGather::MAX_PROGRAMS }
    }
}

impl AllGatherLl {
    /// Programs per rank for a chunk of `words` 4-byte words.
    pub fn programs(&self, words: usize) -> u32 {
        cdiv(words.max(1), self.block as usize).min(self.max_programs.max(1) as usize) as u32
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let b = KernelBuilder::new(&format!("allgather_ll_{}", self.block), LaunchAttrs::default());
        let (src, out) = (b.arg_ptr("src", DType::U32), b.arg_ptr("out", DType::U32));
        let (halves, epochs) = (b.arg_ptr("words", DType::U64), b.arg_ptr("epochs", DType::U64));
        let (cw, half) = (b.arg("chunk_words", DType::I32), b.arg("half", DType::I32));
        let (me, world, pid, programs) = (b.rank(), b.num_ranks(), b.program_id_x(), b.num_programs(Axis::X));
        let epoch = crate::epoch::Epoch::begin(&b, epochs);
        let words = epoch.half(halves, half);
        let flag = (epoch.value - 1u64) % 0xffff_ffffu64 + 1u64;
        let high = flag.binary(BinaryOp::Shl, 32u64);
        let blocks = (cw + (self.block as i32 - 1)) / self.block as i32;
        let lanes = b.arange(0, self.block as i64);
        // Send: this rank's blocks of the chunk into slot `me` of every rank.
        b.for_range(pid, blocks, programs, &[], |blk, _| {
            let offs = blk * self.block as i32 + lanes;
            let mask = offs.lt(cw);
            let data = b.load(src + offs, Some(mask), None);
            let packed = high.binary(BinaryOp::Or, data.cast(DType::U64));
            let slot = me * cw + offs;
            b.for_range(0, world, 1, &[], |p, _| {
                let at = b.symm_at(words, p) + slot;
                b.atomic(AtomicOp::Xchg, at, packed, Some(mask), MemSemantic::Relaxed, Scope::Sys);
                vec![]
            });
            vec![]
        });
        // Receive: the same blocks of every rank's slot, each word once its flag is this call's.
        let flag32 = flag.cast(DType::U32);
        b.for_range(0, world, 1, &[], |p, _| {
            b.for_range(pid, blocks, programs, &[], |blk, _| {
                let offs = blk * self.block as i32 + lanes;
                let mask = offs.lt(cw);
                let got = b.load_flagged(words + (p * cw + offs), flag32, Some(mask));
                b.store(out + (p * cw + offs), got.cast(DType::U32), Some(mask));
                vec![]
            });
            vec![]
        });
        epoch.end(&b);
        b.finish()
    }

    /// Enqueues the next call's gather of `src` (this rank's chunk) into `bufs.out` on `stream`
    /// (one kernel launch: it can be recorded).
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &mut LlBuffers,
        src: &Buffer,
    ) -> Result<(), BackendError> {
        let out = bufs.out.clone();
        self.enqueue_into(ctx, stream, bufs, src, &out)
    }

    /// As [`AllGatherLl::enqueue`], gathering into `out` (`[world][chunk]` elements, local: a
    /// caller's tensor) instead of `bufs.out`.
    pub fn enqueue_into(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &mut LlBuffers,
        src: &Buffer,
        out: &Buffer,
    ) -> Result<(), BackendError> {
        let cw = bufs.chunk_words();
        require_bytes(src, cw * 4, "src")?;
        let w = ctx.world_size();
        require_bytes(out, w * cw * 4, "out")?;
        let kernel = ctx.compile(&format!("{self:?}"), &|| self.build())?;
        let args = [
            src.arg(),
            out.arg(),
            bufs.words.arg(),
            bufs.epochs.arg(),
            KernelArg::i32(require_i32(cw, "chunk words")?),
            KernelArg::i32(require_i32(w * cw, "the flagged words of a call")?),
        ];
        ctx.launch(stream, &kernel, [self.programs(cw), 1, 1], &args)?;
        bufs.calls += 1;
        Ok(())
    }

    /// Gathers every rank's `src` into `bufs.out`; returns when this rank has every chunk and
    /// every rank finished the call.
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut LlBuffers, src: &Buffer) -> Result<(), BackendError> {
        self.enqueue(ctx, 0, bufs, src)?;
        ctx.synchronize()?;
        ctx.barrier()
    }
}

// The kernel moves 4-byte words whatever the element type.
inventory::submit! {
    crate::Catalogued { name: "allgather_ll", operation: "allgather_ll", distributed: true, build: |_| AllGatherLl::default().build() }
}

#[cfg(test)]
mod tests {
    use super::flag_of;

    #[test]
    fn flags_skip_zero_and_wrap() {
        assert_eq!(flag_of(1), 1);
        assert_eq!(flag_of(0xffff_ffff), 0xffff_ffff);
        assert_eq!(flag_of(0x1_0000_0000), 1);
        assert_eq!(flag_of(0x1_0000_0001), 2);
        assert!((1..100_000u64).all(|e| flag_of(e) != 0 && flag_of(e) != flag_of(e + 2)));
    }
}
