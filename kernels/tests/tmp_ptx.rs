use trident_core::ir::DType;
use trident_kernels::gemm::Gemm;
#[test]
fn dump() {
    let t = trident_core::target::lookup("sm_90a").unwrap();
    let g = Gemm {
        block_m: 128,
        block_n: 128,
        block_k: 64,
        warps: 4,
        stages: 4,
        descriptors: true,
        warp_specialize: true,
        persistent: true,
        pingpong: true,
        divisible: true,
        tma_store: true,
        ..Gemm::for_target(DType::BF16, Some(t))
    };
    let f = g.build().unwrap();
    let k = trident_core::simt::lower(&f, t).unwrap();
    std::fs::write("/tmp/pp.txt", k.to_string()).unwrap();
    let m = trident_backend_nvidia::NvidiaBackend::ptx(&f, t).unwrap();
    std::fs::write("/tmp/pp.ptx", &m.ptx).unwrap();
    println!("smem {} threads {}", m.shared_bytes, m.threads);
}
