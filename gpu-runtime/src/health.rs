//! Devices a world left unusable.
//!
//! When a stream stays busy past every bound (a kernel that never ends) or a driver call never
//! returns, the device cannot be trusted again in this process: freeing memory would wait for
//! the stuck work forever (`cuMemFree` waits for every stream: measured on the H200, issue 24),
//! and later work would queue behind it. The world marks the device here, leaves its memory
//! allocated, and every later world on it is refused at once with the first reason.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use trident_core::backend::BackendError;

/// Whether some device of this process was marked.
static ANY: AtomicBool = AtomicBool::new(false);

/// One device's state: usable, or why not.
#[derive(Default)]
pub struct DeviceHealth {
    wedged: Mutex<Option<String>>,
}

impl DeviceHealth {
    /// Marks the device unusable for the rest of the process (the first reason stays).
    pub fn wedge(&self, why: String) {
        self.wedged.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(why);
        ANY.store(true, Ordering::Relaxed);
    }

    pub fn is_wedged(&self) -> bool {
        self.wedged.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// `Err` naming `device` and why it is unusable, if it is.
    pub fn check(&self, device: &str) -> Result<(), BackendError> {
        match &*self.wedged.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Ok(()),
            Some(why) => Err(BackendError::NoDevice {
                backend: "gpu-runtime",
                reason: format!("{device} is unusable for the rest of this process: {why}"),
            }),
        }
    }
}

/// Ends the process with `code`. When a device of the process was marked unusable, without
/// running the exit handlers (the driver's would wait for the stuck work) after flushing what
/// was printed; otherwise as `std::process::exit`.
pub fn exit(code: i32) -> ! {
    exit_if_wedged(code);
    std::process::exit(code)
}

/// Ends the process with `code` at once (after flushing what was printed, without the exit
/// handlers) when a device of the process was marked unusable; returns otherwise.
pub fn exit_if_wedged(code: i32) {
    if ANY.load(Ordering::Relaxed) {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: `_exit` ends the process at once; nothing runs after it.
        unsafe { libc_exit(code) }
    }
}

extern "C" {
    #[link_name = "_exit"]
    fn libc_exit(code: i32) -> !;
}
