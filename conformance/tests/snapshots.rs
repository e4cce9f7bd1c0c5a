//! Snapshots of what the compiler makes of every catalogue kernel (bf16), for the reference set
//! of targets (`trident_core::target::reference_set`: sm_80, sm_90a, gfx90a, gfx942): the
//! printed SIMT program (what a writer translates: lowered, protocol expanded), the PTX of the
//! NVIDIA targets and the LLVM IR of the AMD ones. A change to the lowering shows up here
//! as a reviewable diff; after an intended change, re-bless them all with
//! `INSTA_UPDATE=always cargo test -p trident-conformance --test snapshots`.

use trident_core::ir::DType;
use trident_core::target::{reference_set, Vendor};

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
        for t in reference_set(None) {
            let target = t.name;
            let mut k = trident_core::simt::lower(&f, t).unwrap_or_else(|e| panic!("{name} on {target}: {e}"));
            trident_core::simt::protocol::expand(&mut k);
            insta::assert_snapshot!(format!("simt__{name}_bf16_{target}"), k.to_string());
        }
    }
}

#[test]
fn ptx_of_every_catalogue_kernel() {
    for (name, f) in catalogue() {
        for target in reference_set(Some(Vendor::Nvidia)) {
            let m = trident_backend_nvidia::NvidiaBackend::ptx(&f, target)
                .unwrap_or_else(|e| panic!("{name} on {}: {e}", target.name));
            insta::assert_snapshot!(format!("ptx__{name}_bf16_{}", target.name), m.ptx);
        }
    }
}

#[test]
fn llvm_ir_of_every_catalogue_kernel() {
    for (name, f) in catalogue() {
        for target in reference_set(Some(Vendor::Amd)) {
            let (_, ir) = trident_backend_amd::AmdBackend::llvm_ir(&f, target)
                .unwrap_or_else(|e| panic!("{name} on {}: {e}", target.name));
            insta::assert_snapshot!(format!("llvm__{name}_bf16_{}", target.name), ir);
        }
    }
}
