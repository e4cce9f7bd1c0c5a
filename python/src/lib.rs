//! `trident._trident`, the extension module behind the Python package `trident`: kernels from
//! `.tile` text compiled for a backend and launched on host buffers ([`kernel`]), and the
//! library's collectives on a world of ranks ([`world`]). The Python layer (`trident/`) checks
//! and converts arguments (NumPy dtypes, contiguity, read-only flags) and re-raises these
//! exceptions under the package's names.

use pyo3::prelude::*;

mod dlpack;
mod errors;
mod gpu_world;
mod kernel;
mod launch;
mod library;
mod world;

#[pymodule]
fn _trident(m: &Bound<'_, PyModule>) -> PyResult<()> {
    trident_backend_cpu::link();
    trident_backend_nvidia::link();
    trident_backend_amd::link();
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(kernel::compile, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::backends, m)?)?;
    m.add_class::<kernel::Kernel>()?;
    m.add_class::<launch::Launcher>()?;
    m.add_class::<launch::Launchers>()?;
    m.add_function(wrap_pyfunction!(launch::check_waits, m)?)?;
    m.add_function(wrap_pyfunction!(library::scaled_gemm, m)?)?;
    m.add_function(wrap_pyfunction!(library::grouped_gemm, m)?)?;
    m.add_function(wrap_pyfunction!(library::flash_decode, m)?)?;
    m.add_function(wrap_pyfunction!(library::flash_decode_work_bytes, m)?)?;
    m.add_class::<gpu_world::GpuWorld>()?;
    m.add_function(wrap_pyfunction!(gpu_world::serve_rendezvous, m)?)?;
    m.add_function(wrap_pyfunction!(world::all_gather, m)?)?;
    m.add_function(wrap_pyfunction!(world::all_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(world::reduce_scatter, m)?)?;
    m.add_function(wrap_pyfunction!(world::ep_round_trip, m)?)?;
    m.add_function(wrap_pyfunction!(world::ep_moe, m)?)?;
    m.add_function(wrap_pyfunction!(world::tp_moe, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
