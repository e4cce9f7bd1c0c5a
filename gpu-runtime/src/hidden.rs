//! The hidden buffers of a single-device launch (`Device::launch`, one rank): a heap-base table
//! whose one entry is 0 (so `symm_at(p, 0)` is `p`), the wait-diagnostics record and the two
//! words of `barrier_all`. Made once per device, zeroed, and reset after a launch whose wait
//! timed out (a stopped launch may leave the record set and a barrier count mid-round).

use crate::diagnostics::{wait_error, Allocations};
use std::sync::Mutex;
use std::time::Duration;
use trident_core::abi::{diag, HiddenArgs, BARRIER_WORDS};
use trident_core::backend::{BackendError, Buffer, Device};

#[derive(Default)]
pub struct HiddenBuffers {
    /// Heap-base table, diagnostics record, `barrier_all` words.
    made: Mutex<Option<[Buffer; 3]>>,
    /// The kernels launched with these buffers, by `diag::kernel_tag`: a record checked long
    /// after the launch (launches from Python are checked when the application synchronizes)
    /// names the kernel that recorded it.
    kernels: Mutex<std::collections::HashMap<u64, String>>,
}

impl HiddenBuffers {
    /// The buffers' addresses, made (and zeroed) on first use.
    fn addresses(&self, dev: &dyn Device) -> Result<[u64; 3], BackendError> {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = made.as_ref() {
            return Ok(b.each_ref().map(|x| x.address));
        }
        let b = [
            dev.alloc(8, "__heap_bases")?,
            dev.alloc(8 * diag::WORDS, "__wait_diagnostics")?,
            dev.alloc(8 * BARRIER_WORDS, "__barrier_all")?,
        ];
        // Fresh allocations may hold old bytes: a stale flag would abort every wait.
        for x in &b {
            dev.write(x, 0, &vec![0u8; x.bytes])?;
        }
        let addresses = b.each_ref().map(|x| x.address);
        *made = Some(b);
        Ok(addresses)
    }

    /// The hidden parameters of a launch of one rank alone on `dev`.
    pub fn args(&self, dev: &dyn Device, wait_bound: Duration) -> Result<HiddenArgs, BackendError> {
        let [table, d, barrier] = self.addresses(dev)?;
        Ok(HiddenArgs { rank: 0, ranks: 1, heap_bases: table, diag: d, wait_bound, barrier })
    }

    /// Notes that `kernel` may be launched with these buffers (see `kernels`): its driver does
    /// it when it loads the kernel, once, not at every launch.
    pub fn note_kernel(&self, kernel: &str) {
        let tag = diag::kernel_tag(kernel);
        self.kernels.lock().unwrap_or_else(|e| e.into_inner()).entry(tag).or_insert_with(|| kernel.to_string());
    }

    /// After the launches completed: the error of a timed-out wait, if one was recorded (and the
    /// record and the barrier words are reset for the next launch).
    pub fn check(
        &self,
        dev: &dyn Device,
        kernel: &str,
        names: &Allocations,
        bound: Duration,
    ) -> Result<(), BackendError> {
        let Some([_, d, barrier]) = self.made.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return Ok(()) };
        let mut raw = vec![0u8; d.bytes];
        dev.read(&d, 0, &mut raw)?;
        let named = |tag| {
            let k = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
            k.get(&tag).cloned().unwrap_or_else(|| kernel.to_string())
        };
        let r = wait_error(&raw, bound, &named, &|a| names.describe_word(a));
        if r.is_err() {
            dev.write(&d, 0, &vec![0u8; d.bytes])?;
            dev.write(&barrier, 0, &[0u8; 16])?;
        }
        r
    }
}
