//! Snapshots of what the compiler makes of every catalogue kernel (bf16): the printed SIMT
//! program for each GPU target of the shared lowering (what a writer translates: lowered,
//! protocol expanded), the PTX for sm_80 and sm_90a, and the LLVM IR for gfx942 and gfx90a. A change to the lowering shows up here
//! as a reviewable diff; after an intended change, re-bless them all with
//! `INSTA_UPDATE=always cargo test -p trident test --test snapshots`.

use trident_core::ir::DType;

const SIMT_TARGETS: [&str; 4] = ["sm_80", "sm_90a", "gfx90a", "gfx942"];
const PTX_TARGETS: [trident_backend_nvidia::target::Target; 2] =
    [trident_backend_nvidia::target::Target::Sm80, trident_backend_nvidia::target::Target::Sm90a];

fn catalogue() -> Vec<(&'static str, trident_core::Function)> {
    trident_conformance::link_backends();
    trident_kernels::catalogue(DType::BF16)
        .into_iter()
        .map(|(name, f)| (name, f.unwrap_or_else(|e| panic!("catalogue kernel {name}: {e}"))))
        .collect()
}

#[test]
fn simt_of_every_catalogue_kernel_and_target() {
    for (name, f) in catalogue() {
        for target in SIMT_TARGETS {
            let t = trident_core::target::lookup(target).unwrap();
            let mut k = trident_core::simt::lower(&f, t).unwrap_or_else(|e| panic!("{name} on {target}: {e}"));
            trident_core::simt::protocol::expand(&mut k);
            insta::assert_snapshot!(format!("simt__{name}_bf16_{target}"), k.to_string());
        }
    }
}

#[test]
fn ptx_of_every_catalogue_kernel() {
    for (name, f) in catalogue() {
        for target in PTX_TARGETS {
            let m = trident_backend_nvidia::NvidiaBackend::ptx(&f, target)
                .unwrap_or_else(|e| panic!("{name} on {}: {e}", target.name()));
            insta::assert_snapshot!(format!("ptx__{name}_bf16_{}", target.name()), m.ptx);
        }
    }
}

#[test]
fn llvm_ir_of_every_catalogue_kernel() {
    for (name, f) in catalogue() {
        for target in [&trident_core::target::GFX942, &trident_core::target::GFX90A] {
            let (_, ir) = trident_backend_amd::AmdBackend::llvm_ir(&f, target)
                .unwrap_or_else(|e| panic!("{name} on {}: {e}", target.name));
            insta::assert_snapshot!(format!("llvm__{name}_bf16_{}", target.name), ir);
        }
    }
}
