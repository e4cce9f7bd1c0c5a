//! The host barrier of a world of threads: a rank that fails breaks it, so that the others get
//! an error instead of waiting forever for a rank that will not come.

use std::sync::{Condvar, Mutex};
use trident_core::backend::BackendError;

pub struct HostBarrier {
    n: usize,
    /// Arrived ranks, generation, and why the barrier was abandoned.
    state: Mutex<(usize, u64, Option<String>)>,
    cv: Condvar,
}

impl HostBarrier {
    pub fn new(n: usize) -> HostBarrier {
        HostBarrier { n, state: Mutex::new((0, 0, None)), cv: Condvar::new() }
    }

    /// Returns once all `n` ranks arrived, or an error once some rank abandoned the barrier.
    pub fn wait(&self, rank: usize) -> Result<(), BackendError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &st.2 {
            return Err(BackendError::Host(format!("rank {rank}: barrier abandoned: {why}")));
        }
        let generation = st.1;
        st.0 += 1;
        if st.0 == self.n {
            st.0 = 0;
            st.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while st.1 == generation {
            if let Some(why) = &st.2 {
                return Err(BackendError::Host(format!("rank {rank}: barrier abandoned: {why}")));
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    /// Why the barrier was abandoned (the first rank's failure), if it was.
    pub fn why(&self) -> Option<String> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).2.clone()
    }

    /// Breaks the barrier for good: every waiting and later `wait` fails with `why`.
    pub fn abandon(&self, why: String) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.2.get_or_insert(why);
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::HostBarrier;
    use std::sync::Arc;

    #[test]
    fn barrier_releases_all_ranks_and_a_failing_rank_breaks_it() {
        let b = Arc::new(HostBarrier::new(3));
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let b = b.clone();
                std::thread::spawn(move || b.wait(r).is_ok())
            })
            .collect();
        assert!(hs.into_iter().all(|h| h.join().unwrap()));
        // Two ranks wait, the third fails instead of arriving: both get an error, no hang.
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let b = b.clone();
                std::thread::spawn(move || b.wait(r).unwrap_err().to_string())
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(50));
        b.abandon("rank 2 failed: test".into());
        for h in hs {
            assert!(h.join().unwrap().contains("rank 2 failed"));
        }
    }
}
