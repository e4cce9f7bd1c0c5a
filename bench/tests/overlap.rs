//! The overlap benchmark's host code (AG-GEMM against gather-then-GEMM) in the CPU world and on
//! cpu-simt's sm_90a lowering: both pipelines give checked results on every rank and are timed.

use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_bench::overlap::ag_gemm_vs_sequential;
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

/// Every registered benchmark, at its small shape, checks and times every variant in the CPU
/// world (interpreter at 1 and 3 ranks, cpu-simt's sm_90a lowering at 1 and 2; world 1 has
/// the MoE block's machinery parts): each variant has a time, at least one is the whole
/// operation, and the sampled error is within bf16's bound. The interpreter's worlds and the
/// lowering's are two tests, which the harness runs side by side.
#[test]
fn every_distributed_benchmark_case_checks_and_times_in_the_cpu_world() {
    every_distributed_benchmark_case(&[(1, None), (3, None)]);
}

#[test]
fn every_distributed_benchmark_case_checks_and_times_through_the_sm90a_lowering() {
    every_distributed_benchmark_case(&[(1, Some("sm_90a")), (2, Some("sm_90a"))]);
}

fn every_distributed_benchmark_case(worlds: &[(usize, Option<&'static str>)]) {
    use trident_conformance::dist_bench::{combine, run, DistCase};
    trident_conformance::link_backends();
    for &(world, simt) in worlds {
        for op in trident_conformance::registry::operations() {
            let Some(b) = op.benchmark() else { continue };
            let case = DistCase { name: op.name(), dtype: DType::BF16, dims: b.small_shape(world), world };
            let opts = WorldOptions { simt_target: simt, ..WorldOptions::new(world, rand::random()) };
            let (case2, seed) = (case.clone(), rand::random());
            let out = CpuWorld::run(opts, move |ctx| run(ctx, &case2, 2, seed))
                .unwrap_or_else(|e| panic!("{} {simt:?}: {e}", case.key()));
            let times = combine(&out.results);
            assert!(times.iter().any(|(name, _)| b.is_fused(name)), "{} {times:?}", case.key());
            assert!(times.iter().all(|(_, ms)| *ms > 0.0), "{} {times:?}", case.key());
            // What a variant is compared with ran in the same case.
            let compared: Vec<&str> = times.iter().filter_map(|(name, _)| b.compared_with(name)).collect();
            assert!(compared.iter().all(|o| times.iter().any(|(n, _)| n == o)), "{} {times:?}", case.key());
            if op.name() == "allgather" {
                // The low-latency form beside the push and the copy engine.
                assert!(times.iter().any(|(n, _)| n == "allgather/ll"), "{times:?}");
            }
            if op.name() == "gemm_ar" && case.dims[0].is_multiple_of(world) {
                // The two-shot form beside the one-shot where M splits over the ranks.
                assert!(times.iter().any(|(n, _)| n == "gemm_ar/two-shot"), "{times:?}");
            }
            if op.name() == "moe_block" {
                // The tensor-parallel block against its sequential form, its rows form
                // against it, the three FP8 blocks against the bf16 ones; at world 1 the
                // tensor-parallel block's grouped GEMMs against the plain ones too, the down
                // GEMM also in two column bands and in the rows form.
                assert_eq!(compared.len(), if world == 1 { 10 } else { 5 }, "{times:?}");
            }
            for r in &out.results {
                assert!(r.error <= 1e-2, "{} {simt:?}: error {}", case.key(), r.error);
            }
        }
    }
}

#[test]
fn ag_gemm_is_persistent_with_the_copy_engine_and_where_ranks_share_a_device() {
    use trident_kernels::ag_gemm::{AgGemm, GatherMode};
    trident_conformance::link_backends();
    for world in [1, 2] {
        let opts = WorldOptions { simt_target: Some("sm_90a"), ..WorldOptions::new(world, 1) };
        let out = CpuWorld::run(opts, |ctx| {
            let ce = AgGemm::for_world(ctx, DType::BF16, GatherMode::CopyEngine);
            let kernel = AgGemm::for_world(ctx, DType::BF16, GatherMode::Kernel);
            Ok((ctx.ranks_sharing_device(), ce.gemm.persistent, kernel.gemm.persistent))
        })
        .unwrap();
        // With the copy engine the GEMM is persistent wherever the target has TMA (at world 1
        // its own chunk is copied first, `AgGemm::enqueue`); with the in-kernel gather only
        // where ranks share a device, as the CPU world's do (one waiting program per tile and
        // rank may not fit the GPU: issue 24).
        assert!(out.results.iter().all(|r| *r == (world, true, world > 1)), "{world}: {:?}", out.results);
    }
}
