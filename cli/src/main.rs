//! `trident`: the one command. Each subcommand's options are its module's (or its crate's)
//! `Args`; `trident SUBCOMMAND --help` lists them. Usage errors exit with code 2.

mod demo;
mod emit;
mod nvshmem_shim;
mod rendezvous_probe;
mod run;
mod run_world;
mod selftest;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "trident", version, about = "trident: distributed tile kernels for NVIDIA and AMD GPUs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Verifies, compiles and launches a `.tile` kernel on a backend, and writes the buffers it
    /// changed as .npy files.
    Run(run::Args),
    /// Compiles a library kernel or a .tile file and prints the backend's code.
    Emit(emit::Args),
    /// Runs every operation x dtype x shape (x world) against an f64 host reference.
    Test(trident_conformance::commands::test::Args),
    /// Times the kernels against a baseline measured in the same run, with the roofline.
    Bench(trident_bench::command::Args),
    /// The differential test: every op of the IR alone on every element type against the host
    /// reference, and the support matrix.
    Ops(trident_conformance::commands::ops::Args),
    /// The accuracy of the elementary functions over the f32 inputs.
    Math(trident_conformance::commands::math::Args),
    /// Runs PROGRAM once per rank of a world of N processes on this node, with the world's
    /// rendezvous.
    Launch(trident_launcher::command::Args),
    /// Runtime checks that need a GPU: planted hangs end with their diagnostics, refusals, events.
    Selftest,
    /// A GEMM through the whole path, then AG-GEMM on 4 CPU ranks with its chunks' arrival order.
    Demo,
    /// Makes the NVSHMEM device shim (LLVM 18+ and NVSHMEM's libnvshmem_device.bc needed).
    NvshmemShim(nvshmem_shim::Args),
    /// A rank that only meets the others at the rendezvous (checks a launched world).
    #[command(hide = true)]
    RendezvousProbe,
}

fn main() -> ExitCode {
    trident_conformance::link_backends();
    match Cli::parse().cmd {
        Cmd::Run(a) => run::main(a),
        Cmd::Emit(a) => emit::main(a),
        Cmd::Test(a) => trident_conformance::commands::test::main(a),
        Cmd::Bench(a) => trident_bench::command::main(a),
        Cmd::Ops(a) => trident_conformance::commands::ops::main(a),
        Cmd::Math(a) => trident_conformance::commands::math::main(a),
        Cmd::Launch(a) => trident_launcher::command::main(a),
        Cmd::Selftest => selftest::main(),
        Cmd::Demo => demo::main(),
        Cmd::NvshmemShim(a) => nvshmem_shim::main(a),
        Cmd::RendezvousProbe => rendezvous_probe::main(),
    }
}
