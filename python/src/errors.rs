//! The package's exceptions: one base class, and one per kind of failure, each carrying the
//! verifier's or the runtime's message (what and where).

use pyo3::create_exception;
use pyo3::prelude::*;
use trident_core::backend::BackendError;

create_exception!(_trident, TridentError, pyo3::exceptions::PyException, "Every error trident raises.");
create_exception!(
    _trident,
    ParseError,
    TridentError,
    "Malformed `.tile` text, or a kernel the verifier rejects (with the line and the op)."
);
create_exception!(
    _trident,
    ArgumentError,
    TridentError,
    "Arguments that do not fit the kernel's signature: count, element type, size, read-only."
);
create_exception!(
    _trident,
    BackendUnavailable,
    TridentError,
    "An unknown backend or target, or a backend whose driver or device is missing."
);
create_exception!(
    _trident,
    KernelError,
    TridentError,
    "A kernel that failed to compile or to run (a fault, a wait that timed out), named."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TridentError", py.get_type::<TridentError>())?;
    m.add("ParseError", py.get_type::<ParseError>())?;
    m.add("ArgumentError", py.get_type::<ArgumentError>())?;
    m.add("BackendUnavailable", py.get_type::<BackendUnavailable>())?;
    m.add("KernelError", py.get_type::<KernelError>())?;
    Ok(())
}

/// A runtime error as the Python exception of its kind.
pub fn backend(e: BackendError) -> PyErr {
    match &e {
        BackendError::UnknownBackend { .. } | BackendError::UnsupportedTarget { .. } => {
            BackendUnavailable::new_err(e.to_string())
        }
        BackendError::NoDevice { .. } => BackendUnavailable::new_err(e.to_string()),
        BackendError::Verify(_) => ParseError::new_err(e.to_string()),
        BackendError::Argument { .. } | BackendError::Buffer { .. } | BackendError::WrongBackend { .. } => {
            ArgumentError::new_err(e.to_string())
        }
        _ => KernelError::new_err(e.to_string()),
    }
}

pub fn argument(m: impl Into<String>) -> PyErr {
    ArgumentError::new_err(m.into())
}
