//! Distributed flash decoding: every sequence's KV cache is sharded over the ranks along the
//! sequence, rank r holding keys `r S .. (r + 1) S` (`S` the shard's capacity), and every rank
//! ends with the whole attention output.
//!
//! Each rank runs, on one stream:
//! 1. flash decoding's split stage on its shard (`crate::flash_decode`, the key offset `r S`:
//!    lengths and query positions are the sequence's, so causality and per-sequence lengths
//!    hold across shards; a shard past a sequence's end has no key and its splits log-sum-exp
//!    `-inf`);
//! 2. the combine of its splits into its partial: an f32 output row and its log-sum-exp per
//!    query row (`[B Hkv, Nq G]` rows of `D + 1` words, small: 16 KB for one sequence of 32
//!    query heads of 128);
//! 3. the low-latency AllGather (`crate::allgather_ll`) of the partials: flags inside the
//!    data, one kernel, no fence;
//! 4. the combine of the ranks' partials by their log-sum-exps into the output.
//!
//! Every rank combines: the AllGather hands every rank every partial anyway, and the last
//! combine reads `W (D + 1)` words per row, so a combine at one rank only would save nothing
//! without a gather to one rank, which the LL protocol gains little from.

use crate::allgather_ll::{AllGatherLl, LlBuffers};
use crate::flash_decode::{DecodeLaunch, DecodeShape, DecodeStage, FlashDecode, KvScales, Partials};
use crate::require_i32;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::{RankCtx, StreamId};

/// Distributed flash decoding: the one-GPU kernels and the AllGather of the partials.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DistFlashDecode {
    pub local: FlashDecode,
    pub gather: AllGatherLl,
}

/// A rank's buffers for a shard of `shape` (its `cache_len` the shard's capacity).
pub struct DistDecodeBuffers {
    /// The split stage's partials (local).
    pub work: Buffer,
    /// This rank's partial, the AllGather's source (local).
    pub block: Buffer,
    /// Every rank's partial, in rank order (local).
    pub gathered: Buffer,
    pub ll: LlBuffers,
    pub shape: DecodeShape,
}

impl DistDecodeBuffers {
    /// Collective: after a timed-out wait, the AllGather's flags and epoch back to the start.
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.ll.rearm(ctx)
    }
}

impl DistFlashDecode {
    /// The specialization for a shard of `shape` (contiguous cache).
    pub fn for_shape(dtype: DType, shard: &DecodeShape) -> DistFlashDecode {
        // The distributed combines wait for their peers' partials too: programmatic launch
        // stays off there until a GPU has timed it (it was measured for one GPU only).
        let local = FlashDecode { programmatic: false, ..FlashDecode::for_shape(dtype, shard) };
        DistFlashDecode { local, gather: AllGatherLl::default() }
    }

    /// This specialization over paged shards of `page` keys a page.
    pub fn paged(self, page: u32) -> DistFlashDecode {
        DistFlashDecode { local: self.local.paged(page), ..self }
    }

    /// Collective: a rank's buffers for shards of `shard`.
    pub fn buffers(&self, ctx: &dyn RankCtx, shard: &DecodeShape) -> Result<DistDecodeBuffers, BackendError> {
        self.check_world(ctx, shard)?;
        let block_bytes = self.local.partial_block_bytes(shard);
        let work = ctx.alloc(self.local.work_bytes(shard).max(4), "flash_decode_dist_work")?;
        let block = ctx.alloc(block_bytes.max(4), "flash_decode_dist_partial")?;
        let gathered = ctx.alloc((ctx.world_size() * block_bytes).max(4), "flash_decode_dist_partials")?;
        let ll = LlBuffers::new(ctx, DType::F32, block_bytes / 4)?;
        Ok(DistDecodeBuffers { work, block, gathered, ll, shape: *shard })
    }

    /// A typed error unless the world's shards of `shard` can be addressed and combined.
    fn check_world(&self, ctx: &dyn RankCtx, shard: &DecodeShape) -> Result<(), BackendError> {
        let w = ctx.world_size();
        if w > self.local.max_splits as usize {
            return Err(BackendError::Host(format!(
                "distributed flash decoding: {w} ranks' partials for a combine of {}",
                self.local.max_splits
            )));
        }
        require_i32(w * shard.cache_len, "the keys of every shard").map(|_| ())
    }

    /// Enqueues attention of `q` (every rank's the same) against this rank's shard `k`, `v`
    /// (`table` its block table where paged) into `out` (every rank's the whole output) on
    /// `stream`: kernel launches only, so it can be recorded; `lens` are the sequences'
    /// lengths (over all shards). The three steps, which the benchmark also times apart.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &mut DistDecodeBuffers,
        qkv: (&Buffer, &Buffer, &Buffer),
        lens: &Buffer,
        table: Option<&Buffer>,
        out: &Buffer,
    ) -> Result<(), BackendError> {
        if !self.enqueue_local(ctx, stream, bufs, qkv, lens, table)? {
            return Ok(());
        }
        self.enqueue_gather(ctx, stream, bufs)?;
        self.enqueue_combine(ctx, stream, bufs, out)
    }

    /// The first step: this rank's partial (the split stage on its shard and the combine of its
    /// splits) into `bufs.block`. `false` for an empty batch, which has nothing to do.
    pub fn enqueue_local(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &mut DistDecodeBuffers,
        (q, k, v): (&Buffer, &Buffer, &Buffer),
        lens: &Buffer,
        table: Option<&Buffer>,
    ) -> Result<bool, BackendError> {
        let shape = bufs.shape;
        self.check_world(ctx, &shape)?;
        let op = &self.for_rank(ctx)?;
        let first_key = ctx.rank() * shape.cache_len;
        let Some(split) = op.split_launch((q, k, v), KvScales::default(), lens, table, &bufs.work, &shape, first_key)? else {
            return Ok(false);
        };
        let local = op.combine_launch(&op.split_partials(&bufs.work, &shape), &bufs.block, true, &shape)?;
        self.launch(ctx, stream, split)?;
        self.launch(ctx, stream, local)?;
        Ok(true)
    }

    /// The local stage as this rank runs it: with its splits filling whole waves of the programs
    /// the rank can count on (`RankCtx::resident_programs`: its device's over the ranks sharing
    /// it), as `FlashDecode::for_device` does on one GPU; the fixed target where the world cannot
    /// tell (the CPU world) or the wave was set.
    pub fn for_rank(&self, ctx: &dyn RankCtx) -> Result<FlashDecode, BackendError> {
        let op = self.local;
        if op.wave != 0 {
            return Ok(op);
        }
        let kernel = ctx.compile(&op.key(DecodeStage::Split), &|| op.build_split())?;
        Ok(op.with_resident(ctx.resident_programs(&kernel)?))
    }

    /// Compiles (on first use) and enqueues one of flash decoding's launches.
    fn launch(&self, ctx: &dyn RankCtx, stream: StreamId, (stage, grid, args): DecodeLaunch) -> Result<(), BackendError> {
        let op = &self.local;
        let kernel = ctx.compile(&op.key(stage), &|| op.build(stage))?;
        ctx.launch(stream, &kernel, grid, &args)
    }

    /// The second step: the low-latency AllGather of the ranks' partials into `bufs.gathered`.
    pub fn enqueue_gather(&self, ctx: &dyn RankCtx, stream: StreamId, bufs: &mut DistDecodeBuffers) -> Result<(), BackendError> {
        self.gather.enqueue_into(ctx, stream, &mut bufs.ll, &bufs.block, &bufs.gathered)
    }

    /// The last step: the ranks' partials in `bufs.gathered` combined into `out`.
    pub fn enqueue_combine(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &DistDecodeBuffers,
        out: &Buffer,
    ) -> Result<(), BackendError> {
        let (shape, op) = (bufs.shape, &self.local);
        let block = op.partial_block_bytes(&shape) / 4;
        let rows = shape.batch * shape.heads_kv * shape.rows();
        let ranks = Partials {
            part: bufs.gathered.arg(),
            lse: bufs.gathered.arg_at(rows * shape.head_dim * 4),
            count: ctx.world_size(),
            part_bh: shape.rows() * shape.head_dim,
            part_s: block,
            lse_bh: shape.rows(),
            lse_s: block,
        };
        self.launch(ctx, stream, op.combine_launch(&ranks, out, false, &shape)?)
    }

    /// As [`DistFlashDecode::enqueue`] on stream 0; returns when this rank's output is complete
    /// and every rank finished.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut DistDecodeBuffers,
        qkv: (&Buffer, &Buffer, &Buffer),
        lens: &Buffer,
        table: Option<&Buffer>,
        out: &Buffer,
    ) -> Result<(), BackendError> {
        self.enqueue(ctx, 0, bufs, qkv, lens, table, out)?;
        ctx.synchronize()?;
        ctx.barrier()
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "flash_decode_combine_partial",
        operation: "flash_decode_dist",
        distributed: true,
        build: |d| DistFlashDecode::for_shape(d, &DecodeShape { batch: 1, q_len: 1, heads_q: 8, heads_kv: 1, head_dim: 128, cache_len: 4096 }).local.build_combine(true),
    }
}
