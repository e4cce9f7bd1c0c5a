//! GEMM + AllReduce's split GEMM on sm_90a as the H100/H200 run it: with divisible arguments and
//! row tiles of 64 (M = 32 too: one row block under a tile of 64) A and B arrive by TMA and
//! multiply on `wgmma` also over a slice of K (the K loop from a slice's start, not 0), as the
//! unsplit GEMM does; without, through pointers.

use trident_core::backend;
use trident_core::ir::DType;
use trident_kernels::gemm::Gemm;
use trident_kernels::gemm_ar::GemmAr;

fn ptx(op: &GemmAr, block_m: u32) -> String {
    trident_conformance::link_backends();
    let nvidia = (backend::lookup("nvidia").expect("linked").create)();
    nvidia.compile(&op.build_gemm(block_m).expect("builds"), Some("sm_90a")).expect("compiles for sm_90a").text
}

#[test]
fn the_split_gemm_reads_by_tma_and_multiplies_on_wgmma() {
    let h = trident_core::target::lookup("sm_90a").ok();
    let op = GemmAr::new(DType::BF16).split_for(h, (128, 5120, 25600));
    assert!(op.splits > 1);
    let divisible = GemmAr { gemm: Gemm { divisible: true, ..op.gemm }, ..op };
    let text = ptx(&divisible, 64);
    assert!(text.contains("cp.async.bulk.tensor"), "no TMA copy in the split GEMM");
    assert!(text.contains("wgmma.mma_async"), "no wgmma in the split GEMM");
    let pointers = ptx(&op, 64);
    assert!(!pointers.contains("cp.async.bulk.tensor"));
    // M = 32: the tile of 64 rows the launch picks for it.
    let op = GemmAr::new(DType::BF16).split_for(h, (32, 5120, 25600));
    let divisible = GemmAr { gemm: Gemm { divisible: true, ..op.gemm }, ..op };
    assert!(ptx(&divisible, 64).contains("wgmma.mma_async"));
}
