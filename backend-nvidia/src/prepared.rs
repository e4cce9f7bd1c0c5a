//! A kernel made ready for many launches by one rank alone on its device (the launches from
//! Python, `kernel[grid](*args)`): the loaded function, its block size and shared memory, the
//! hidden parameters' slots and the parameters' alignment facts are looked up once, so a
//! launch is the alignment checks, making the context current if it is not, and one
//! `cuLaunchKernel`.
//!
//! Only kernels a plain `cuLaunchKernel` serves are prepared: not cooperative, not persistent
//! (whose grid depends on occupancy), not programmatic dependents (`cuLaunchKernelEx`), without
//! tensor maps (encoded from each launch's arguments) and without NVSHMEM device calls. The others go through
//! [`CudaDevice::enqueue_on`], whose checks and costs they need.

use crate::runtime::{arg_slot, CudaDevice};
use crate::PtxModule;
use cudarc::driver::{result, sys};
use std::ffi::c_void;
use std::sync::Arc;
use trident_core::abi::HIDDEN_PARAMS;
use trident_core::backend::{Artifact, BackendError, LaunchOptions};

/// The most parameters (the kernel's own and the hidden ones) a prepared launch passes.
pub const MAX_SLOTS: usize = 64;

/// See the module.
pub struct PreparedLaunch {
    dev: Arc<CudaDevice>,
    function: sys::CUfunction,
    threads: u32,
    shared_bytes: u32,
    /// The hidden parameters' 8-byte slots, after the kernel's own.
    hidden: Vec<u64>,
    /// (parameter index, bytes) of each parameter declared divisible.
    divisible: Vec<(usize, u32)>,
    params: usize,
    kernel: String,
}

// SAFETY: the function belongs to a module loaded in `dev`'s context, which `launch` makes
// current on the calling thread first; nothing else here is tied to a thread.
unsafe impl Send for PreparedLaunch {}
// SAFETY: as above; a launch only reads this.
unsafe impl Sync for PreparedLaunch {}

impl PreparedLaunch {
    /// `kernel` prepared for launches on `dev`, or `None` if it needs more than a plain
    /// `cuLaunchKernel` (see the module). Loads its module if it is not loaded yet.
    pub fn new(
        dev: &Arc<CudaDevice>,
        kernel: &Artifact,
        opts: &LaunchOptions,
    ) -> Result<Option<PreparedLaunch>, BackendError> {
        let module = kernel.payload_for::<PtxModule>(crate::NAME)?;
        if kernel.attrs.cooperative
            || kernel.attrs.persistent
            || module.programmatic
            || !module.tensor_maps.is_empty()
            || !module.device_calls.is_empty()
            || kernel.params.len() + HIDDEN_PARAMS.len() > MAX_SLOTS
        {
            return Ok(None);
        }
        dev.current()?;
        let function = dev.function(kernel, module)?;
        let hidden = dev.single_rank_hidden(opts)?.args().iter().map(arg_slot).collect();
        let divisible = kernel.divisibility.iter().enumerate().filter_map(|(i, d)| d.map(|d| (i, d.max(1)))).collect();
        Ok(Some(PreparedLaunch {
            dev: dev.clone(),
            function,
            threads: module.threads,
            shared_bytes: module.shared_bytes,
            hidden,
            divisible,
            params: kernel.params.len(),
            kernel: kernel.kernel.clone(),
        }))
    }

    /// Enqueues a launch of `grid` on `stream` with the kernel's own parameters as 8-byte
    /// slots (`slots[i]` is parameter `i`, as [`arg_slot`] makes it), checked against the
    /// parameters' declared alignment; returns at once.
    pub fn launch(&self, stream: u64, grid: [u32; 3], slots: &[u64]) -> Result<(), BackendError> {
        let bad = |message: String| BackendError::Launch { kernel: self.kernel.clone(), message };
        if slots.len() != self.params {
            return Err(bad(format!("{} arguments given, the kernel takes {}", slots.len(), self.params)));
        }
        if grid.contains(&0) {
            return Err(bad(format!("grid {grid:?} has an empty axis")));
        }
        for &(i, d) in &self.divisible {
            if !slots[i].is_multiple_of(d as u64) {
                return Err(bad(format!(
                    "argument {i} ({:#x}) is not a multiple of {d}, as the kernel declares",
                    slots[i]
                )));
            }
        }
        let mut all = [0u64; MAX_SLOTS];
        let n = slots.len() + self.hidden.len();
        all[..slots.len()].copy_from_slice(slots);
        all[slots.len()..n].copy_from_slice(&self.hidden);
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_SLOTS];
        for (p, s) in params.iter_mut().zip(all.iter_mut()).take(n) {
            *p = s as *mut u64 as *mut c_void;
        }
        // The context is the thread's already after the first launch (a TLS read, not a set).
        if result::ctx::get_current().ok().flatten() != Some(self.dev.context()) {
            self.dev.current()?;
        }
        // SAFETY: `function` is a function of a module loaded in this context; `params` holds one
        // live 8-byte slot per kernel parameter (each at most 8 bytes wide), which the driver
        // copies before the call returns.
        unsafe {
            result::launch_kernel(
                self.function,
                (grid[0], grid[1], grid[2]),
                (self.threads, 1, 1),
                self.shared_bytes,
                stream as sys::CUstream,
                &mut params[..n],
            )
        }
        .map_err(|e| bad(format!("cuLaunchKernel: {e:?}")))
    }
}
