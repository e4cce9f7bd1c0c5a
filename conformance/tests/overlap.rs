//! The overlap benchmark's host code (AG-GEMM against gather-then-GEMM) in the CPU world and on
//! cpu-simt's sm_90a lowering: both pipelines give checked results on every rank and are timed.

use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_conformance::overlap::ag_gemm_vs_sequential;
use trident_core::ir::DType;

#[test]
fn ag_gemm_and_the_sequential_pipeline_agree_and_are_timed() {
    trident_conformance::link_backends();
    for (ranks, simt) in [(2, None), (4, None), (2, Some("sm_90a"))] {
        let opts = WorldOptions { simt_target: simt, ..WorldOptions::new(ranks, rand::random()) };
        let seed = rand::random();
        let out = CpuWorld::run(opts, move |ctx| ag_gemm_vs_sequential(ctx, DType::BF16, (128, 96, 64), 2, seed))
            .unwrap_or_else(|e| panic!("{ranks} ranks, {simt:?}: {e}"));
        for t in out.results {
            assert!(t.error <= 1e-2, "{ranks} ranks, {simt:?}: error {}", t.error);
            assert!(t.overlapped_ms > 0.0 && t.sequential_ms > 0.0, "{t:?}");
        }
    }
}
