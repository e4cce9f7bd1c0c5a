//! Names for device addresses, and the error a timed-out wait leaves behind.
//!
//! A wait that times out inside a kernel records (rank, program, signal address, expected, seen)
//! in its rank's diagnostics buffer (`trident_core::abi::diag`); the host reads the record after
//! the kernel and turns it into an error that names the signal buffer and index, using the names
//! of the live allocations a device keeps here.

use std::sync::Mutex;
use std::time::Duration;
use trident_core::abi::diag;
use trident_core::backend::{BackendError, Buffer};

/// The live allocations of one device: (address, bytes, name).
#[derive(Default)]
pub struct Allocations {
    live: Mutex<Vec<(u64, usize, String)>>,
}

impl Allocations {
    pub fn insert(&self, buffer: &Buffer) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).push((buffer.address, buffer.bytes, buffer.name.clone()));
    }

    pub fn remove(&self, address: u64) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).retain(|(a, _, _)| *a != address);
    }

    /// Forgets every name inside `[address, address + bytes)` (a heap freed with its buffers).
    pub fn remove_within(&self, address: u64, bytes: usize) {
        let end = address + bytes as u64;
        self.live.lock().unwrap_or_else(|e| e.into_inner()).retain(|(a, _, _)| *a < address || *a >= end);
    }

    /// "`name`[i]" for the 8-byte word at `address` (the innermost allocation holding it; a
    /// rank's symmetric heap holds its buffers), else the address in hex.
    pub fn describe_word(&self, address: u64) -> String {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(a, n, _)| address >= *a && address < a + *n as u64)
            .min_by_key(|(_, n, _)| *n)
            .map(|(a, _, name)| format!("`{name}`[{}]", (address - a) / 8))
            .unwrap_or_else(|| format!("{address:#x}"))
    }
}

/// `Ok` when `raw` (a diagnostics buffer's words) holds no record, else the error naming rank,
/// program, signal, expected and seen: the kernel by `kernel` (from the record's tag, a
/// `diag::kernel_tag`) and the signal by `place` (from its address).
pub fn wait_error(
    raw: &[u8],
    bound: Duration,
    kernel: &dyn Fn(u64) -> String,
    place: &dyn Fn(u64) -> String,
) -> Result<(), BackendError> {
    let Some(r) = diag::Record::decode(raw) else { return Ok(()) };
    Err(BackendError::Execution {
        kernel: kernel(r.kernel),
        program: r.program,
        op: "wait".into(),
        loc: None,
        message: r.message(&place(r.signal), bound),
    })
}
