//! `C = A B` with K split over programs that sum through a workspace.

use crate::host::{poison, random};
use crate::reference;
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_kernels::splitk_gemm::{SplitKGemm, SplitReduction};
use trident_kernels::DeviceCtx;

struct SplitKGemmCase;

impl Operation for SplitKGemmCase {
    fn name(&self) -> &'static str {
        "splitk_gemm"
    }

    /// `-`: the partial tiles added by atomics; `slots`: each split's in its own slot, summed
    /// by the last split; `slots-ws`: that with a producer warp where the target has TMA.
    fn variants(&self, _dtype: DType) -> &'static [&'static str] {
        &["-", "slots", "slots-ws"]
    }

    fn distributed(&self) -> bool {
        false
    }

    /// M, N, K, splits.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        [[1, 1, 1, 2], [64, 64, 256, 4], [50, 70, 300, 3], [33, 33, 1000, 8], [130, 136, 520, 3]]
            .map(|s| s.to_vec())
            .to_vec()
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (m, n, k) = (case.shape[0], case.shape[1], case.shape[2]);
        let (a, b) = (random(m * k, case.dtype, rng), random(k * n, case.dtype, rng));
        let expected = reference::gemm(&a, &b, m, n, k);
        WorldData::single(vec![a, b], expected, k)
    }

    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        let (m, n, k, splits) = (case.shape[0], case.shape[1], case.shape[2], case.shape[3]);
        // The target's form: on sm_90a the descriptor form (TMA and `wgmma`) where the operands
        // allow it (`run` falls back to pointer loads at the same tiles otherwise).
        let reduction = if case.variant.starts_with("slots") { SplitReduction::Slots } else { SplitReduction::Atomic };
        let warp_specialize = case.variant == "slots-ws";
        let base = SplitKGemm::for_target(case.dtype, splits as u32, l.gpu_target());
        let g = SplitKGemm { reduction, warp_specialize, ..base };
        let ws = g.workspace(l.device, m, n)?;
        // Twice: the second call checks that the kernel left its workspace (or counters) clean.
        g.run(l, &ins[0], &ins[1], out, &ws, (m, n, k))?;
        l.device.fill(out, &poison(case.dtype))?;
        g.run(l, &ins[0], &ins[1], out, &ws, (m, n, k))
    }
}

inventory::submit! { Registered(&SplitKGemmCase) }
