//! AG-GEMM: `C_r = A_full @ B_r` while `A_full` is being gathered.
//!
//! `A` is `[M, K]` sharded by rows (rank r holds rows `r*M/W ..`), `B_r` is `[K, N_r]`. The
//! gather (copy engine or the in-kernel push AllGather, on stream 1) fills the symmetric `A_full`
//! and marks each rank's rows with `ready[c]`; the GEMM (stream 0) maps program ids to output
//! tiles with a rank swizzle (tile rows of chunk r first, then r+1, ...), and before its K loop a
//! program waits for the signals of every chunk its rows touch and feeds the token to its loads.
//! The GEMM never waits on itself, so an independent launch is enough. Its programs keep their
//! own epoch words (`crate::epoch`): a chunk is there for call e once its signal reached e times
//! what each call adds to it. `A_full` is one buffer, not two halves: the GEMM reads it through
//! TMA descriptors, which the host encodes from the kernel argument, so the device cannot move
//! them to another half. Calls are therefore separated as `run` separates them (every rank's
//! streams synchronized and a host barrier; a replay likewise): the next call's gather must
//! not start before every rank's GEMM finished reading. Consumption credits (each GEMM telling
//! the gatherers it is done) would lift this; not done yet.

use crate::allgather::{AllGather, AllGatherCe, GatherBuffers};
use crate::gemm::Gemm;
use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{CmpOp, DType, LaunchAttrs, MemSemantic, Scope};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, VerifyError};

/// How `A_full` is gathered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GatherMode {
    CopyEngine,
    Kernel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AgGemm {
    pub gemm: Gemm,
    pub mode: GatherMode,
}

/// Symmetric state for `[m, k]` gathered A and an `[m, n]` product.
pub struct AgGemmBuffers {
    pub gather: GatherBuffers,
    /// The GEMM's epoch words (`crate::epoch`, symmetric).
    pub epochs: Buffer,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl AgGemmBuffers {
    /// Collective: signals and epochs back to zero on every rank (after a timed-out wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.gather.rearm(ctx)?;
        crate::epoch::rearm(ctx, &[&self.epochs])
    }
}

impl AgGemm {
    pub fn new(dtype: DType, mode: GatherMode) -> AgGemm {
        AgGemm { gemm: Gemm::new(dtype), mode }
    }

    /// The GEMM tiles of `target` (`Gemm::for_target`: `wgmma` on sm_90a, MFMA on gfx942), A,
    /// B and C through descriptors where the target has TMA (the wait's lowering orders the
    /// async proxy after its acquire, so TMA reads the gathered rows other ranks wrote). Each
    /// tile waits for its rows' chunks before its K loop. With the copy engine gathering, the
    /// GEMM is persistent where the target has TMA (a program per multiprocessor, or per
    /// multiprocessor and rank when ranks share a GPU), with a producer warp: the producer
    /// waits for a tile's chunks before the tile's first copies, while the consumers still
    /// run the tile before and its epilogue (they wait only for their stages); nothing it
    /// waits for needs a multiprocessor. With the in-kernel gather it is one program per tile
    /// here, and persistent only where ranks share a GPU ([`AgGemm::for_world`]).
    pub fn for_target(dtype: DType, mode: GatherMode, target: Option<&trident_core::target::TargetDesc>) -> AgGemm {
        let g = Gemm::for_target(dtype, target).single_tile();
        let persistent = mode == GatherMode::CopyEngine && g.descriptors;
        AgGemm { gemm: Gemm { persistent, warp_specialize: persistent, ..g }, mode }
    }

    /// [`AgGemm::for_target`] for `ctx`'s world. With the copy engine gathering, persistent
    /// wherever the target has TMA: where the rank has its device to itself,
    /// [`AgGemm::enqueue`] copies its own chunk on the GEMM's stream first, so the kernel keeps
    /// every multiprocessor (the peers' chunks come from their devices' copy engines); at
    /// world 1 on the H100 it took 4.858 ms against 4.931 for one program per tile at
    /// 8192x28672x8192 and 1.303 against 1.355 at 8192x14336x4096
    /// (`results/h100-session54/e`). With the in-kernel gather, persistent only where ranks
    /// share the GPU, where one waiting program per tile could not be resident beside the
    /// other ranks' (launches of such grids are refused: 9 programs x 16 ranks of the
    /// 1152-row conformance shape on 132 multiprocessors, issue 24); there the persistent grid
    /// leaves an eighth of the multiprocessors to what it waits for (`persistent_grid`), where
    /// the in-kernel gather's programs run. `trident bench` times both copy-engine forms
    /// (`ag_gemm/ce`, `ag_gemm/ce-persistent`) where ranks have a GPU each.
    pub fn for_world(ctx: &dyn RankCtx, dtype: DType, mode: GatherMode) -> AgGemm {
        let op = Self::for_target(dtype, mode, ctx.gpu_target());
        let persistent =
            op.gemm.descriptors && (mode == GatherMode::CopyEngine || ctx.ranks_sharing_device() > 1);
        AgGemm { gemm: Gemm { persistent, warp_specialize: persistent, ..op.gemm }, ..op }
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "ag_gemm".into(), message }
    }

    /// Collective: buffers for an `m x k` A and an `m x n` product; `m` must split evenly over
    /// the ranks.
    pub fn buffers(&self, ctx: &dyn RankCtx, m: usize, n: usize, k: usize) -> Result<AgGemmBuffers, BackendError> {
        let w = ctx.world_size();
        if !m.is_multiple_of(w) {
            return Err(self.problem(format!("M = {m} rows cannot be sharded evenly over {w} ranks")));
        }
        let gather = GatherBuffers::single(ctx, self.gemm.dtype, (m / w) * k)?;
        let epochs = crate::epoch::words(ctx, 1, "ag_gemm_epochs")?;
        Ok(AgGemmBuffers { gather, epochs, m, n, k })
    }

    /// Output tiles (one program each, or fewer persistent programs).
    fn tiles(&self, m: usize, n: usize) -> usize {
        cdiv(m, self.gemm.block_m as usize) * cdiv(n, self.gemm.block_n as usize)
    }

    /// This operation with its GEMM specialized for its arguments (`Gemm::specialized`).
    pub fn specialized(&self, ptrs: [&Buffer; 3], n: usize, k: usize) -> AgGemm {
        AgGemm { gemm: self.gemm.specialized(ptrs, n, k), ..*self }
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        self.build_with(false)
    }

    /// Whether the kernel is the persistent form: asked for, with descriptors (TMA) and
    /// arguments they can read (`divisible`).
    fn persistent_form(&self) -> bool {
        let g = &self.gemm;
        g.persistent && g.divisible && g.descriptors
    }

    /// The kernel, `signalled_before` as [`AgGemm::enqueue`] launches the persistent
    /// copy-engine form where the rank has its device to itself (its own chunk copied before
    /// it on its stream, the others by other devices: it keeps every multiprocessor).
    fn build_with(&self, signalled_before: bool) -> Result<Function, VerifyError> {
        let g = &self.gemm;
        let (bm, bn) = (g.block_m, g.block_n);
        let persistent = self.persistent_form();
        let name =
            format!("ag_gemm_{}_{bm}x{bn}x{}{}", g.dtype, g.block_k, match (persistent, g.warp_specialize) {
                (true, true) => "_persistent_ws",
                (true, false) => "_persistent",
                _ => "",
            });
        let b = KernelBuilder::new(
            &name,
            LaunchAttrs {
                warps: g.warps,
                stages: g.stages,
                persistent,
                warp_specialize: persistent && g.warp_specialize,
                signalled_before: persistent && signalled_before,
                ..LaunchAttrs::default()
            },
        );
        // With `divisible`, the facts that let the copies be 16-byte vectors without alignment
        // tests (as `Gemm::run` specializes the plain GEMM).
        let ptr =
            |name: &str| if g.divisible { b.arg_ptr_aligned(name, g.dtype, 16) } else { b.arg_ptr(name, g.dtype) };
        let int =
            |name: &str| if g.divisible { b.arg_multiple_of(name, DType::I32, 16) } else { b.arg(name, DType::I32) };
        let (a_full, bp, c) = (ptr("a_full"), ptr("b"), ptr("c"));
        let (ready, epochs) = (b.arg_ptr("ready", DType::U64), b.arg_ptr("epochs", DType::U64));
        let (m, n, k) = (b.arg("m", DType::I32), int("n"), int("k"));
        let (rows_per_rank, per_call) = (b.arg("rows_per_rank", DType::I32), b.arg("per_call", DType::U64));
        let epoch = crate::epoch::Epoch::begin(&b, epochs);
        let target = epoch.times(per_call);

        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        let tiles_m = (m + (bm as i32 - 1)) / bm as i32;
        let tile = |pid: trident_core::Tile| {
            // Rank swizzle: start at the tile row holding this rank's first row (its own chunk,
            // already local), then walk on to the chunks of r+1, r+2, ...
            // Tiles in the grouped raster order ([`crate::gemm::grouped_tile`]), rotated by
            // the rank's first row of tiles.
            let (group_m, tile_n) = crate::gemm::grouped_tile(pid, tiles_m, tiles_n);
            let first = (b.rank() * rows_per_rank) / bm as i32;
            let tile_m = (group_m + first) % tiles_m;
            let row0 = tile_m * bm as i32;
            let last_row = (row0 + bm as i32).min(m) - 1;
            let (c_lo, c_hi) = (row0 / rows_per_rank, last_row / rows_per_rank);
            let tok = b.wait(ready + c_lo, c_hi - c_lo + 1, CmpOp::Ge, target, Scope::Sys, MemSemantic::Acquire);
            let a = a_full.consume_token(tok);

            let rows = (row0 + b.arange(0, bm as i64)).expand_dims(1);
            let col0 = tile_n * bn as i32;
            let cols = (col0 + b.arange(0, bn as i64)).expand_dims(0);
            let mask = rows.lt(m) & cols.lt(n);
            if g.divisible && g.descriptors {
                // A (after the wait: its descriptor carries the token), B and C through descriptors
                // (TMA copies and store on sm_90a).
                let one = b.constant(trident_core::ir::Literal::Int(1), DType::I32);
                let da = b.make_desc(a, [m, k], [k, one], [bm, g.block_k]);
                let db = b.make_desc(bp, [k, n], [n, one], [g.block_k, bn]);
                let out = g.desc_product(&b, (da, db), (row0, col0), k).cast(g.dtype);
                if g.tma_store {
                    b.desc_store(b.make_desc(c, [m, n], [n, one], [bm, bn]), [row0, col0], out);
                } else {
                    b.store(c + rows * n + cols, out, Some(mask));
                }
            } else {
                let acc = g.tile_product(&b, (a, k), (bp, n), rows, cols, (m, n, k));
                b.store(c + rows * n + cols, acc.cast(g.dtype), Some(mask));
            }
        };
        let pid = b.program_id_x();
        if persistent {
            let (tiles, programs) = (tiles_m * tiles_n, b.num_programs(trident_core::ir::Axis::X));
            b.for_range(pid, tiles, programs, &[], |t, _| {
                tile(t);
                Vec::new()
            });
        } else {
            tile(pid);
        }
        epoch.end(&b);
        b.finish()
    }

    /// `c = A_full @ b` where this rank holds `a_shard` (`m/W x k`), `b` is `k x n`, `c` is
    /// `m x n`; returns when every rank finished.
    pub fn run(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut AgGemmBuffers,
        a_shard: &Buffer,
        b: &Buffer,
        c: &Buffer,
    ) -> Result<(), BackendError> {
        self.enqueue(ctx, bufs, a_shard, b, c)?;
        ctx.synchronize()?;
        ctx.barrier()
    }

    /// Enqueues the next call: the gather on stream 1, the GEMM on stream 0 (with the in-kernel
    /// gather, kernel launches only: it can be recorded).
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut AgGemmBuffers,
        a_shard: &Buffer,
        b: &Buffer,
        c: &Buffer,
    ) -> Result<(), BackendError> {
        let (m, n, k, w) = (bufs.m, bufs.n, bufs.k, ctx.world_size());
        let es = self.gemm.dtype.size_bytes() as usize;
        require_bytes(a_shard, (m / w) * k * es, "a_shard")?;
        require_bytes(b, k * n * es, "b")?;
        require_bytes(c, m * n * es, "c")?;
        let (m32, n32, k32) = (require_i32(m, "m")?, require_i32(n, "n")?, require_i32(k, "k")?);
        // Compile (and, on GPUs, load) the GEMM before any gather kernel starts spinning.
        let spec = self.specialized([&bufs.gather.out, b, c], n, k);
        // The persistent copy-engine form on a device of the rank's own: its own chunk goes
        // first on the GEMM's stream, so the GEMM waits on its device only for work before it
        // (the peers' chunks are other devices' copies) and keeps every multiprocessor (a copy
        // within the device may run as a kernel: the loopback world leaves room for it).
        let own_first =
            self.mode == GatherMode::CopyEngine && spec.persistent_form() && ctx.ranks_sharing_device() == 1;
        let key = format!("{spec:?}{}", if own_first { " signalled_before" } else { "" });
        let kernel = ctx.compile(&key, &|| spec.build_with(own_first))?;
        let per_call = match self.mode {
            GatherMode::CopyEngine => {
                let streams = if own_first { (0, 1) } else { (1, 1) };
                AllGatherCe { dtype: self.gemm.dtype }.enqueue_on(ctx, streams, &mut bufs.gather, a_shard)?
            }
            GatherMode::Kernel => AllGather::new(self.gemm.dtype).enqueue(ctx, 1, &mut bufs.gather, a_shard)?,
        };
        if m > 0 && n > 0 {
            let grid = [self.tiles(m, n) as u32, 1, 1];
            let args = [
                bufs.gather.out.arg(),
                b.arg(),
                c.arg(),
                bufs.gather.ready.arg(),
                bufs.epochs.arg(),
                KernelArg::i32(m32),
                KernelArg::i32(n32),
                KernelArg::i32(k32),
                KernelArg::i32(require_i32(m / w, "rows_per_rank")?),
                KernelArg::u64(per_call),
            ];
            ctx.launch(0, &kernel, grid, &args)?;
        }
        Ok(())
    }
}

inventory::submit! {
    crate::Catalogued { name: "ag_gemm", operation: "ag_gemm", distributed: true, build: |d| AgGemm::new(d, GatherMode::CopyEngine).build() }
}

inventory::submit! {
    crate::GemmBased { name: "ag_gemm", build: |gemm| AgGemm { gemm, mode: GatherMode::CopyEngine }.build() }
}

/// A grid of one program that passes `barrier_all`: once it ends on a rank's stream, every
/// rank's stream reached it. What separates two AG-GEMM calls without the host
/// ([`AgGemm::enqueue_separated`]).
pub fn device_barrier() -> Result<Function, VerifyError> {
    let b = KernelBuilder::new("device_barrier", LaunchAttrs::default());
    b.barrier_all(trident_core::ir::Group::Block);
    b.finish()
}

impl AgGemm {
    /// [`AgGemm::enqueue`] for calls back to back without the host between them (a replayed
    /// graph, ops called from PyTorch): a device barrier on the gather's stream first, so that
    /// no rank's gather overwrites `A_full` before every rank is past its previous call. The
    /// caller orders stream 1 after the previous call's GEMM on stream 0 (the Python package's
    /// ops order both streams after the application's stream, and it after both).
    pub fn enqueue_separated(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut AgGemmBuffers,
        a_shard: &Buffer,
        b: &Buffer,
        c: &Buffer,
    ) -> Result<(), BackendError> {
        let barrier = ctx.compile("device_barrier", &device_barrier)?;
        ctx.launch(1, &barrier, [1, 1, 1], &[])?;
        self.enqueue(ctx, bufs, a_shard, b, c)
    }
}
