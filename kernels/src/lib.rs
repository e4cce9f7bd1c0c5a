//! trident-kernels: the kernel library.
//!
//! Every kernel is a Rust function of its meta-parameters (element type, block sizes, warps,
//! stages) that builds one specialization in the tile IR, like Triton's `constexpr`s, plus host
//! orchestration that checks shapes, sizes the grid and launches it on any backend's device.
//! Kernels know nothing about backends beyond the `Backend`/`Device` traits.

pub mod gemm;
pub mod softmax;
pub mod splitk_gemm;
pub mod vector_add;

use trident_core::backend::{Artifact, Backend, BackendError, Buffer};
use trident_core::Function;

/// Ceiling division for grid sizes.
pub fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// A typed error unless `buffer` holds at least `bytes` bytes.
pub fn require_bytes(buffer: &Buffer, bytes: usize, role: &str) -> Result<(), BackendError> {
    if buffer.bytes < bytes {
        return Err(BackendError::Host(format!(
            "{role} buffer `{}` has {} bytes, the problem needs {bytes}",
            buffer.name, buffer.bytes
        )));
    }
    Ok(())
}

/// A typed error unless a problem dimension fits the kernels' `i32` index arithmetic.
pub fn require_i32(value: usize, what: &str) -> Result<i32, BackendError> {
    i32::try_from(value)
        .map_err(|_| BackendError::Host(format!("{what} = {value} does not fit i32 indexing")))
}

/// Builds and compiles a kernel specialization for a backend's default target.
pub fn compile(
    backend: &dyn Backend,
    func: Result<Function, trident_core::VerifyError>,
) -> Result<Artifact, BackendError> {
    backend.compile(&func?, None)
}
