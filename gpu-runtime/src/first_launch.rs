//! First launches in a world of threads sharing a GPU: each kernel's first launch by the ranks
//! of one device waits, for a short bound, until every one of them is at its own first launch
//! of that kernel.
//!
//! Why: on the H100 and H200 (2026-12-05) the expert-parallel combine cases of the loopback
//! world timed out in their first call only, where a rank launched a kernel for the first time
//! (the test's experts, then combine) right behind its dispatch, which waits for every peer's
//! dispatch, while a slower peer had not launched its dispatch yet: that peer's dispatch never
//! ran ("seen 0"; a 10 s bound changed nothing). The second call, the same launches with no
//! first among them, passed every time, as did the same flow while a compile's host barrier
//! still stood between the dispatch and the first launches, and the variants with no first
//! launch behind a waiting kernel. So a first launch acts like a context synchronization (as
//! CUDA documents for a lazy module load) even with every function loaded eagerly. Meeting
//! first means every rank's earlier work is on its streams before any rank's first launch, so
//! whatever it waits for can finish. Host code that launches a kernel on some ranks only is
//! allowed: a rank waits at most the bound, then launches anyway.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a rank's first launch of a kernel waits for the other ranks of its device.
pub const FIRST_LAUNCH_MEET: Duration = Duration::from_millis(200);

/// Arrivals at each (device, kernel)'s first launch.
#[derive(Default)]
pub struct FirstLaunches {
    arrived: Mutex<HashMap<String, usize>>,
    cv: Condvar,
}

impl FirstLaunches {
    /// Counts this rank at `key`'s first launch and waits until `ranks` have arrived or
    /// `bound` has passed. Returns whether all arrived.
    pub fn meet(&self, key: &str, ranks: usize, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        let mut arrived = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        *arrived.entry(key.to_string()).or_insert(0) += 1;
        self.cv.notify_all();
        loop {
            if arrived.get(key).copied().unwrap_or(0) >= ranks {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            arrived = self.cv.wait_timeout(arrived, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FirstLaunches;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn ranks_meet_at_a_first_launch_and_a_missing_rank_costs_the_bound_only() {
        let f = Arc::new(FirstLaunches::default());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let f = f.clone();
                std::thread::spawn(move || f.meet("0/k", 4, Duration::from_secs(10)))
            })
            .collect();
        assert!(hs.into_iter().all(|h| h.join().unwrap()));
        // Three of four ranks launch `other`: each goes on after the bound.
        let t = Instant::now();
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let f = f.clone();
                std::thread::spawn(move || f.meet("0/other", 4, Duration::from_millis(50)))
            })
            .collect();
        assert!(hs.into_iter().all(|h| !h.join().unwrap()));
        assert!(t.elapsed() >= Duration::from_millis(50) && t.elapsed() < Duration::from_secs(5));
    }
}
