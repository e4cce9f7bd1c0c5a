//! `C = A B`: the heuristic's schedule at every `dot` precision of f32, and for 16-bit types the
//! same tiles with a producer warp, persistent, and both, and 128 x 128 tiles on one warpgroup
//! (`-bands`: two `wgmma` row bands per warp on sm_90a).

use crate::host::random;
use crate::reference;
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::{DType, InputPrecision};
use trident_kernels::gemm::Gemm;
use trident_kernels::DeviceCtx;

struct GemmCase;

/// The 16-bit GEMM's cases: the heuristic's schedule, then the same tiles with a producer warp,
/// as a persistent loop, and as a persistent loop with a producer warp (sm_90a with TMA; the
/// same kernel as the first elsewhere), and 128 x 128 tiles on 4 warps with both (where the target
/// has `wgmma`: one warpgroup issuing one per 64-row band, `AccLayout::interleave_m`; elsewhere
/// the first case again), and the same tiles with consumer ping-pong (two groups of 4 consumer
/// warps taking tiles in turn, on TMA targets).
const GEMM_16BIT_VARIANTS: &[&str] =
    &["f32acc", "f32acc-ws", "f32acc-persistent", "f32acc-ws-persistent", "f32acc-bands", "f32acc-pingpong"];

impl Operation for GemmCase {
    fn name(&self) -> &'static str {
        "gemm"
    }

    /// f32: the `dot` precisions; 16-bit types: the schedules.
    fn variants(&self, dtype: DType) -> &'static [&'static str] {
        if dtype == DType::F32 {
            &["ieee", "tf32", "bf16x3"]
        } else {
            GEMM_16BIT_VARIANTS
        }
    }

    fn distributed(&self) -> bool {
        false
    }

    /// M, N, K: shapes off the tile; the last three divisible by 16 in N and K but not by the
    /// tile (the descriptor/TMA path on sm_90a, whose copies read the edges' zeros themselves;
    /// the last on its 128x256 tiles, two per persistent program on cpu-simt, whose TMA store
    /// beside a 4-stage ring goes out half a block at a time).
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        [
            [1, 1, 1],
            [64, 64, 64],
            [100, 70, 33],
            [129, 65, 257],
            [17, 300, 64],
            [256, 256, 256],
            [70, 144, 208],
            [130, 272, 96],
            [272, 512, 128],
        ]
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
        let precision = InputPrecision::parse(case.variant).unwrap_or(InputPrecision::Ieee);
        let mnk = (case.shape[0], case.shape[1], case.shape[2]);
        let g = Gemm::for_problem(case.dtype, l.gpu_target(), mnk.0).with_precision(precision);
        // The schedules the heuristic does not pick on its own, on targets where they exist
        // (elsewhere the attribute changes nothing and the case repeats the plain one).
        let g = match case.variant {
            "f32acc-ws" => Gemm { warp_specialize: true, ..g },
            "f32acc-persistent" => Gemm { persistent: true, ..g },
            "f32acc-ws-persistent" => Gemm { warp_specialize: true, persistent: true, ..g },
            "f32acc-bands" if l.gpu_target().is_some_and(|t| t.has_wgmma()) => Gemm {
                block_m: 128,
                block_n: 128,
                block_k: 64,
                warps: 4,
                stages: 4,
                warp_specialize: true,
                persistent: true,
                ..g
            },
            "f32acc-pingpong" if l.gpu_target().is_some_and(|t| t.has_tma_wgmma()) => g.with_pingpong(4),
            _ => g,
        };
        g.run(l, &ins[0], &ins[1], out, mnk)
    }
}

inventory::submit! { Registered(&GemmCase) }
