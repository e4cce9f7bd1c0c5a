//! `trident nvshmem-shim` (`cargo xtask nvshmem-shim`): makes the NVSHMEM device shim from
//! NVSHMEM's device bitcode with the LLVM tools found here, and stores it where the runtime looks
//! (`<cache>/nvshmem-shim/<version>/<arch>.ptx`, or `--out`), to carry to a GPU machine
//! without LLVM (`trident_backend_nvidia::nvshmem_shim`).

use std::path::PathBuf;
use std::process::ExitCode;
use trident_backend_nvidia::nvshmem_shim;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// NVSHMEM's device bitcode (default: $TRIDENT_NVSHMEM_BC, else beside the host library
    /// trident finds).
    #[arg(long)]
    bc: Option<PathBuf>,
    /// PTX architecture of the GPUs it is for.
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// Write the shim here instead of the cache.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `trident nvshmem-shim`: the NVSHMEM device shim, as `a` says.
pub fn main(a: Args) -> ExitCode {
    let bc = a.bc.clone().or_else(|| {
        let host =
            trident_backend_nvidia::nvshmem::candidates(&|k| std::env::var(k).ok()).into_iter().find(|p| p.exists())?;
        nvshmem_shim::bitcode_beside(&host)
    });
    let Some(bc) = bc else {
        eprintln!("error: no NVSHMEM device bitcode: give --bc .../nvidia/nvshmem/lib/libnvshmem_device.bc (the nvidia-nvshmem-cu13 wheel has it)");
        return ExitCode::from(2);
    };
    let start = std::time::Instant::now();
    let shim = match nvshmem_shim::build(&bc, &nvshmem_shim::arch_of(&a.arch)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let written = match &a.out {
        Some(p) => std::fs::write(p, &shim.ptx).map(|_| p.clone()).map_err(|e| e.to_string()),
        None => nvshmem_shim::store(&shim, &nvshmem_shim::arch_of(&a.arch)).map_err(|e| e.to_string()),
    };
    match written {
        Ok(p) => {
            println!(
                "NVSHMEM {} device shim for {} from {}: {} bytes of PTX in {:.2} s -> {}",
                shim.version,
                a.arch,
                bc.display(),
                shim.ptx.len(),
                start.elapsed().as_secs_f64(),
                p.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: writing the shim: {e}");
            ExitCode::FAILURE
        }
    }
}
