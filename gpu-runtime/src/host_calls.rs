//! Host calls into the driver that never return.
//!
//! Every bounded wait of the runtime (kernel waits on the device, stream waits under the
//! watchdog) assumes the host thread gets to check its clock. A driver call that blocks behind
//! stuck work (a free, a module load, a synchronous copy behind a blocked queue) would take the
//! rank's thread with it, and the world would hang without a word. So each rank's thread says
//! here what call it is in, since when and for how long it may take; whoever supervises the
//! rank (the world of threads' own thread, or a watchdog thread in a world of processes) looks
//! at the slots and ends the world with a diagnostic naming rank and call when one overruns.
//! Marking a call costs one uncontended lock and the call's description.

use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Call {
    what: String,
    since: Instant,
    limit: Duration,
}

/// The driver call each rank (by local index) is in, if any.
pub(crate) struct HostCalls {
    slots: Vec<Mutex<Option<Call>>>,
}

/// A call that overran its limit: the rank's local index and the diagnostic.
pub(crate) struct Overdue {
    pub local: usize,
    pub message: String,
}

impl HostCalls {
    pub(crate) fn new(ranks: usize) -> HostCalls {
        HostCalls { slots: (0..ranks).map(|_| Mutex::new(None)).collect() }
    }

    /// Runs `f` as rank `local`'s call `what`, which may take up to `limit`. Calls do not nest:
    /// an inner call keeps the outer one's mark.
    pub(crate) fn run<T>(
        &self,
        local: usize,
        what: impl FnOnce() -> String,
        limit: Duration,
        f: impl FnOnce() -> T,
    ) -> T {
        let slot = &self.slots[local];
        let outer = {
            let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
            if s.is_some() {
                true
            } else {
                *s = Some(Call { what: what(), since: Instant::now(), limit });
                false
            }
        };
        let r = f();
        if !outer {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        r
    }

    /// The first call that has run past its limit.
    pub(crate) fn overdue(&self) -> Option<Overdue> {
        self.slots.iter().enumerate().find_map(|(local, slot)| {
            let s = slot.lock().unwrap_or_else(|e| e.into_inner());
            let c = s.as_ref()?;
            let t = c.since.elapsed();
            (t > c.limit).then(|| Overdue {
                local,
                message: format!(
                    "{} has not returned after {t:.1?} (limit {:?}): the driver call is stuck behind work the device never finishes; the world was abandoned and the device is unusable for the rest of this process",
                    c.what, c.limit
                ),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::HostCalls;
    use std::time::Duration;

    #[test]
    fn a_call_past_its_limit_is_named_and_a_finished_one_is_forgotten() {
        let calls = HostCalls::new(2);
        calls.run(0, || "read of `x@rank0`".into(), Duration::ZERO, || ());
        assert!(calls.overdue().is_none(), "a finished call leaves no mark");
        let late = calls.run(
            1,
            || "free of `heap@rank1`".into(),
            Duration::from_millis(1),
            || {
                calls.run(
                    1,
                    || "inner".into(),
                    Duration::from_secs(100),
                    || {
                        std::thread::sleep(Duration::from_millis(5));
                        calls.overdue()
                    },
                )
            },
        );
        let late = late.expect("overdue while still inside the call");
        assert_eq!(late.local, 1);
        assert!(late.message.starts_with("free of `heap@rank1` has not returned after"), "{}", late.message);
        assert!(calls.overdue().is_none());
    }
}
