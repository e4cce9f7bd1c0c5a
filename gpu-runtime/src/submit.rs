//! One host thread at a time submits work to a device that ranks of a world of threads share.
//!
//! Why: in the loopback world of 4 ranks on an H100 (driver 580.159.04, 2026-12-07), the
//! low-latency AllGather's `wrap` case (each rank launching ten waiting kernels back to back on
//! its stream, the four ranks' host threads at the same instant) failed in 11 of 60 runs of
//! its 12 cases: a rank's first or second gather never wrote a word of its chunk to rank 0
//! ("seen flag 0") within the wait's bound, 2 s or 10 s alike. With every launch call under
//! one lock it failed in 0 of 30 runs, and in 0 of 42 where a log line per launch (stderr's
//! lock) staggered the threads (`results/h100-session55/`). So concurrent submissions from
//! threads of one context can leave a launched kernel unrun while the kernels it should
//! release spin; why is the driver's, not known here. A submission (launch, copy, stream
//! write or wait) takes microseconds, so the lock costs the loopback world nothing measurable;
//! worlds with a device per rank (the peer world, one context each) and worlds of processes
//! do not take it. `TRIDENT_CONCURRENT_SUBMITS=1` turns it off, to repeat the experiment.

use std::sync::{Mutex, MutexGuard, OnceLock};

static CONCURRENT: OnceLock<bool> = OnceLock::new();

/// Whether `TRIDENT_CONCURRENT_SUBMITS=1` turned the lock off.
pub fn concurrent() -> bool {
    crate::env_switch(&CONCURRENT, "TRIDENT_CONCURRENT_SUBMITS")
}

/// The submission lock of one device.
#[derive(Default)]
pub struct SubmitLock(Mutex<()>);

impl SubmitLock {
    /// Holds the device's lock for one submission where `shared` (ranks of this world of
    /// threads share the device) and the lock is on; `None` otherwise.
    pub fn hold(&self, shared: bool) -> Option<MutexGuard<'_, ()>> {
        (shared && !concurrent()).then(|| self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::SubmitLock;

    #[test]
    fn the_lock_is_held_only_where_ranks_share_the_device() {
        let l = SubmitLock::default();
        assert!(l.hold(false).is_none());
        let g = l.hold(true);
        assert!(g.is_some());
        assert!(l.0.try_lock().is_err(), "held while the guard lives");
        drop(g);
        assert!(l.0.try_lock().is_ok());
    }
}
