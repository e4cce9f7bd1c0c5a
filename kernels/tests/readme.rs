//! The kernels the README shows build and verify, as written there.

use trident_core::ir::{CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, Scope, SignalOp};
use trident_core::{KernelBuilder, VerifyError};

#[test]
fn the_readme_kernels_build_and_verify() -> Result<(), VerifyError> {
    // "A kernel".
    let b = KernelBuilder::new("vector_add", LaunchAttrs::default());
    let (x, y, out) = (b.arg_ptr("x", DType::F32), b.arg_ptr("y", DType::F32), b.arg_ptr("out", DType::F32));
    let n = b.arg("n", DType::I32);
    let offs = b.program_id_x() * 256 + b.arange(0, 256); // this program's 256 indices
    let mask = offs.lt(n);
    let sum = b.load(x + offs, Some(mask), None) + b.load(y + offs, Some(mask), None);
    b.store(out + offs, sum, Some(mask));
    let kernel = b.finish()?; // verified tile IR
    assert_eq!(kernel.name, "vector_add");

    // The distributed fragment, in a kernel around it.
    let b = KernelBuilder::new("shift", LaunchAttrs::default());
    let (src, out, ready) =
        (b.arg_ptr("src", DType::F32), b.arg_ptr("out", DType::F32), b.arg_ptr("ready", DType::U64));
    let (n, epoch) = (b.arg("n", DType::I32), b.arg("epoch", DType::U64));
    let offs = b.arange(0, 256);
    let mask = offs.lt(n);
    let x = b.load(src + offs, Some(mask), None);
    let from = (b.rank() + b.num_ranks() - 1) % b.num_ranks();
    // --- as in the README ---
    let peer = (b.rank() + 1) % b.num_ranks();
    b.store(b.symm_at(out, peer) + offs, x, Some(mask));
    b.notify(ready + b.rank(), peer, epoch, SignalOp::Set, CommScope::IntraNode);
    let token = b.wait(ready + from, 1, CmpOp::Ge, epoch, Scope::Sys, MemSemantic::Acquire);
    let got = b.load(out.consume_token(token) + offs, Some(mask), None);
    // ---
    b.store(out + offs, got, Some(mask));
    b.finish()?;
    Ok(())
}
