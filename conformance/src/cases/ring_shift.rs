//! Ring shift: rank r ends with rank r-1's buffer, through one-sided puts (`put`) or gets
//! (`get`) of the SHMEM primitives.

use crate::distributed::download;
use crate::host::{encode, poison, random};
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;
use trident_kernels::ring_shift::{RingShift, ShiftMode};

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
        WorldData { expected, inputs, reduction_len: 1 }
    }

    /// A copy: exact.
    fn bound(&self, case: &Case, reduction_len: usize) -> f64 {
        crate::suite::bound(case.dtype, "exact", reduction_len)
    }

    fn run_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        inputs: &[Vec<f64>],
        _ins: &[Buffer],
        out_len: usize,
    ) -> Result<Vec<f64>, BackendError> {
        let d = case.dtype;
        let mode = if case.variant == "put" { ShiftMode::Put } else { ShiftMode::Get };
        let op = RingShift::new(d, mode);
        let mut bufs = op.buffers(ctx, case.shape[0])?;
        ctx.write(&bufs.src, 0, &encode(&inputs[0], d))?;
        ctx.fill(&bufs.out, &poison(d))?;
        ctx.barrier()?;
        op.run(ctx, &mut bufs)?;
        download(ctx, &bufs.out, out_len, d)
    }
}

inventory::submit! { Registered(&RingShiftCase) }
