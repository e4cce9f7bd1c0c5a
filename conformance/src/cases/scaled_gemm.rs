//! FP8 GEMMs with scales (`trident_kernels::scaled_gemm`): C bf16 = (A * sa) @ (B * sb)^T, A and
//! B FP8 and K-major, the scales f32. Its cases are the bf16 ones (the output type); the
//! variant names the FP8 format and the scaling (`-promoted`, `-split`: split-K, `-256`: 256 x 128
//! tiles, two `wgmma` row bands per warpgroup where the target has `wgmma`, else `for_target`'s;
//! `-pingpong`: consumer ping-pong there; `-wide`: `ScaledGemm::for_problem`'s tiles for many
//! rows, 128 x 256 over 4 stages, where the target has TMA and `wgmma`). The reference sums each 128 of K in f64 and
//! applies that block's scales, as the kernel's definition says.

use crate::host::{random, round_to};
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use rand::Rng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_kernels::scaled_gemm::{ScaledGemm, Scaling, SCALE_BLOCK};
use trident_kernels::DeviceCtx;

struct ScaledGemmCase;

/// The format and scaling of a variant.
fn of(variant: &str) -> (DType, Scaling) {
    let dtype = if variant.starts_with("e5m2") { DType::F8E5M2 } else { DType::F8E4M3FN };
    let scaling = match variant.split('-').nth(1) {
        Some("block") => Scaling::Block,
        Some("row") => Scaling::Row,
        _ => Scaling::Tensor,
    };
    (dtype, scaling)
}

impl Operation for ScaledGemmCase {
    fn name(&self) -> &'static str {
        "scaled_gemm"
    }

    /// Only at bf16, its output type.
    fn variants(&self, dtype: DType) -> &'static [&'static str] {
        if dtype == DType::BF16 {
            &["e4m3-block", "e4m3-row", "e5m2-tensor", "e5m2-block", "e4m3-row-promoted", "e4m3-row-split", "e5m2-tensor-split", "e4m3-row-256", "e5m2-row-pingpong", "e4m3-row-wide"]
        } else {
            &[]
        }
    }

    fn input_types(&self, case: &Case, _inputs: usize) -> Vec<DType> {
        let (d, _) = of(case.variant);
        vec![d, d, DType::F32, DType::F32]
    }

    fn distributed(&self) -> bool {
        false
    }

    /// M, N, K: M = 1, K not a multiple of 128, N not a multiple of the tile nor of B's scale
    /// blocks; the last two have K a multiple of 16, which the descriptor form (sm_90a, tensor
    /// and row scaling) takes, with M and N beyond one of its tiles in the last.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        [[1, 200, 300], [33, 64, 129], [64, 130, 128], [130, 136, 272]].map(|s| s.to_vec()).to_vec()
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (m, n, k) = (case.shape[0], case.shape[1], case.shape[2]);
        let (d, scaling) = of(case.variant);
        // FP8 values over their whole range (both formats reach 448), and scales near 1.
        let spread = |v: Vec<f64>| round_to(&v.iter().map(|x| x * 400.0).collect::<Vec<_>>(), d);
        let (a, b) = (spread(random(m * k, DType::F32, rng)), spread(random(n * k, DType::F32, rng)));
        let op = ScaledGemm::new(d, scaling);
        let (la, lb) = op.scale_lens(m, n, k);
        let mut scales = |len: usize| round_to(&(0..len).map(|_| rng.gen_range(0.25..4.0) / 400.0).collect::<Vec<_>>(), DType::F32);
        let (sa, sb) = (scales(la), scales(lb));
        let (blk, kb) = (SCALE_BLOCK as usize, k.div_ceil(SCALE_BLOCK as usize));
        let mut expected = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0.0;
                for q in 0..kb {
                    let part: f64 = (q * blk..((q + 1) * blk).min(k)).map(|kk| a[i * k + kk] * b[j * k + kk]).sum();
                    sum += part
                        * match scaling {
                            Scaling::Tensor => sa[0] * sb[0],
                            Scaling::Row => sa[i] * sb[j],
                            Scaling::Block => sa[i * kb + q] * sb[(j / blk) * kb + q],
                        };
                }
                expected.push(sum);
            }
        }
        WorldData::single(vec![a, b, sa, sb], expected, k)
    }

    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        let (d, scaling) = of(case.variant);
        let mnk = (case.shape[0], case.shape[1], case.shape[2]);
        // `-promoted`: each K block's product added in f32 (`ScaledGemm::promote`); `-split`:
        // split-K over 3 programs per tile, twice on one workspace (the second call checks that
        // the first left it clean).
        let op = ScaledGemm { promote: case.variant.ends_with("-promoted"), ..ScaledGemm::for_target(d, scaling, l.gpu_target()) };
        let bands = case.variant.ends_with("-256") && l.gpu_target().is_some_and(|t| t.has_wgmma());
        let op = match bands {
            true => ScaledGemm { block_m: 256, block_n: 128, warps: 8, stages: 3, ..op },
            false => op,
        };
        // `-wide`: what `for_problem` picks for many rows (128 x 256 tiles over 4 stages).
        let wide = case.variant.ends_with("-wide") && l.gpu_target().is_some_and(|t| t.has_tma_wgmma());
        let op = if wide { ScaledGemm::for_problem(d, scaling, l.gpu_target(), usize::MAX, false) } else { op };
        // `-pingpong`: two groups of 4 consumer warps taking 128 x 128 tiles in turn.
        let pingpong = case.variant.ends_with("-pingpong") && l.gpu_target().is_some_and(|t| t.has_tma_wgmma());
        let op = if pingpong { op.with_pingpong() } else { op };
        if case.variant.ends_with("-split") {
            let op = ScaledGemm { splits: 3, ..op }.specialized(&ins[0], &ins[1], out, mnk.1, mnk.2);
            let ws = op.workspace(l.device, mnk.0, mnk.1)?;
            op.run_with(l, &ins[0], &ins[1], out, (&ins[2], &ins[3]), Some(&ws), mnk)?;
            l.device.fill(out, &crate::host::poison(DType::BF16))?;
            return op.run_with(l, &ins[0], &ins[1], out, (&ins[2], &ins[3]), Some(&ws), mnk);
        }
        op.run(l, &ins[0], &ins[1], out, &ins[2], &ins[3], mnk)
    }
}

inventory::submit! { Registered(&ScaledGemmCase) }
