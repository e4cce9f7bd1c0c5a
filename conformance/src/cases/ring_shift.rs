//! Ring shift: rank r ends with rank r-1's buffer, through one-sided puts (`put`) or gets
//! (`get`) of the SHMEM primitives.

use crate::distributed::download;
use crate::host::{encode, poison, random};
use crate::registry::{Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;
use trident_kernels::ring_shift::{RingShift, ShiftBuffers, ShiftMode};

struct RingShiftCase;

impl Operation for RingShiftCase {
    fn name(&self) -> &'static str {
        "ring_shift"
    }

    fn variants(&self, _dtype: trident_core::ir::DType) -> &'static [&'static str] {
        &["put", "get"]
    }

    fn distributed(&self) -> bool {
        true
    }

    /// Elements per rank.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![777], vec![4096]]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let w = case.world;
        let inputs: Vec<Vec<Vec<f64>>> = (0..w).map(|_| vec![random(case.shape[0], case.dtype, rng)]).collect();
        let expected = (0..w).map(|r| inputs[(r + w - 1) % w][0].clone()).collect();
        WorldData { expected, inputs, reduction_len: 1, slack: 0.0 }
    }

    /// A copy: exact.
    fn bound(&self, case: &Case, reduction_len: usize) -> f64 {
        crate::suite::bound(case.dtype, "exact", reduction_len)
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        inputs: &[Vec<f64>],
        _ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let mode = if case.variant == "put" { ShiftMode::Put } else { ShiftMode::Get };
        let op = RingShift::new(case.dtype, mode);
        let bufs = op.buffers(ctx, case.shape[0])?;
        ctx.write(&bufs.src, 0, &encode(&inputs[0], case.dtype))?;
        Ok(Box::new(ShiftRank { op, bufs, out_len }))
    }
}

/// A rank's ring shift: the operation and its buffers (its chunk in `src`).
struct ShiftRank {
    op: RingShift,
    bufs: ShiftBuffers,
    out_len: usize,
}

impl RankOp for ShiftRank {
    fn poison(&self, ctx: &dyn RankCtx, call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.bufs.result(call), &poison(self.op.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.op.enqueue(ctx, &mut self.bufs)
    }

    fn result(&self, ctx: &dyn RankCtx, call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.bufs.result(call), self.out_len, self.op.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&RingShiftCase) }
