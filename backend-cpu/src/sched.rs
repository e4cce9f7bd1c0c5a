//! Cooperative scheduling of tasks on OS threads.
//!
//! Every rank's host function, every stream, and every program of a launch that has to park is a
//! task with its own OS thread, but exactly one task runs at a time: the running task holds the
//! baton and hands it on at its yield points (communication ops, host API calls, program
//! boundaries) to a runnable task chosen by a seeded generator. The interleaving is therefore a
//! function of the seed (replayable), not of the OS, and 8 ranks x many programs run on 2 cores.
//!
//! A waiting task parks with a readiness condition; the scheduler re-checks parked conditions at
//! every hand-over. When no task can run but some are parked, nothing can ever make progress:
//! that is a deadlock, detected exactly, and reported with every parked task's own description
//! (rank, launch, program, signal, expected, seen). Every task then unwinds with that error.
//!
//! A world may instead let device waits time out (`Sched::new_timing_out`), as a GPU's bounded
//! waits do after their bound: at such a point every parked task whose wait is bounded (kernel
//! waits, stream waits) resumes with a "timed out" error naming what it waited for, and the
//! others (host barriers, `synchronize`) go on waiting for what those tasks do next. The bound
//! is reached when nothing else can happen, which is when a GPU's bound would end the wait too.

use rand::{Rng, SeedableRng};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

pub type TaskId = usize;

/// Stack of a task thread: the interpreter recurses only per nested region.
const STACK_BYTES: usize = 1 << 20;

/// What a parked task waits for.
pub struct Blocker {
    /// True once the task can continue (evaluated under the scheduler lock; must not block).
    pub ready: Box<dyn Fn() -> bool + Send>,
    /// The diagnostic line if the wait can never complete (empty: not worth reporting, e.g. an
    /// idle stream).
    pub describe: Box<dyn Fn() -> String + Send>,
    /// The wait is a device's (kernel or stream wait), bounded on a GPU: in a timing-out world
    /// it ends with an error instead of a deadlock.
    pub bounded: bool,
}

enum Status {
    Runnable,
    Parked(Blocker),
    Done,
}

struct Slot {
    status: Status,
    cv: Arc<Condvar>,
    /// Set when the slot's bounded wait timed out: what it waited for.
    timed_out: Option<String>,
}

struct State {
    slots: Vec<Slot>,
    current: Option<TaskId>,
    rng: rand::rngs::StdRng,
    abort: Option<String>,
    switches: u64,
    /// Bounded waits time out instead of deadlocking the world.
    timeouts: bool,
}

/// The scheduler of one world run.
pub struct Sched {
    state: Mutex<State>,
    all_done: Condvar,
}

impl Sched {
    pub fn new(seed: u64) -> Arc<Sched> {
        Self::with(seed, false)
    }

    /// A scheduler whose bounded waits time out where the world would deadlock.
    pub fn new_timing_out(seed: u64) -> Arc<Sched> {
        Self::with(seed, true)
    }

    fn with(seed: u64, timeouts: bool) -> Arc<Sched> {
        Arc::new(Sched {
            state: Mutex::new(State {
                slots: Vec::new(),
                current: None,
                rng: rand::rngs::StdRng::seed_from_u64(seed),
                abort: None,
                switches: 0,
                timeouts,
            }),
            all_done: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a runnable task running `f` on its own thread once it first gets the baton.
    pub fn spawn(self: &Arc<Self>, name: String, f: impl FnOnce(TaskId) + Send + 'static) -> Result<TaskId, String> {
        let id = {
            let mut st = self.lock();
            st.slots.push(Slot { status: Status::Runnable, cv: Arc::new(Condvar::new()), timed_out: None });
            st.slots.len() - 1
        };
        let me = self.clone();
        let thread_name = name.clone();
        let spawned = std::thread::Builder::new().name(thread_name).stack_size(STACK_BYTES).spawn(move || {
            let st = me.lock();
            drop(me.wait_turn(st, id));
            // A panicking task must still hand the baton on, or every other task would hang.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(id))).is_err() {
                me.lock().abort.get_or_insert_with(|| format!("internal error: task `{name}` panicked"));
            }
            me.exit(id);
        });
        if let Err(e) = spawned {
            self.lock().slots[id].status = Status::Done;
            return Err(format!("cannot start a task thread: {e}"));
        }
        Ok(id)
    }

    fn wait_turn<'a>(&'a self, mut st: MutexGuard<'a, State>, id: TaskId) -> MutexGuard<'a, State> {
        let cv = st.slots[id].cv.clone();
        while st.current != Some(id) {
            st = cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st
    }

    /// Hands the baton to a runnable task (possibly the caller). Caller must hold the lock.
    fn pass(&self, st: &mut State) {
        st.switches += 1;
        for s in st.slots.iter_mut() {
            if let Status::Parked(b) = &s.status {
                if (b.ready)() {
                    s.status = Status::Runnable;
                }
            }
        }
        let mut runnable: Vec<TaskId> =
            st.slots.iter().enumerate().filter(|(_, s)| matches!(s.status, Status::Runnable)).map(|(i, _)| i).collect();
        if runnable.is_empty() {
            let parked: Vec<String> = st
                .slots
                .iter()
                .filter_map(|s| match &s.status {
                    Status::Parked(b) => Some((b.describe)()),
                    _ => None,
                })
                .filter(|d| !d.is_empty())
                .collect();
            if parked.is_empty() {
                st.current = None;
                self.all_done.notify_all();
                return;
            }
            // Nothing runnable, and nothing can ever change a parked condition: the bounded waits
            // time out if the world lets them, else it is a deadlock.
            if st.timeouts && st.slots.iter().any(|s| matches!(&s.status, Status::Parked(b) if b.bounded)) {
                for s in st.slots.iter_mut() {
                    if let Status::Parked(b) = &s.status {
                        if b.bounded {
                            s.timed_out = Some((b.describe)());
                            s.status = Status::Runnable;
                        }
                    }
                }
            } else {
                let report = format!(
                    "deadlock: no rank, program or copy can make progress; waiting:\n  {}",
                    parked.join("\n  ")
                );
                st.abort.get_or_insert(report);
                for s in st.slots.iter_mut() {
                    if matches!(s.status, Status::Parked(_)) {
                        s.status = Status::Runnable;
                    }
                }
            }
            runnable = st
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s.status, Status::Runnable))
                .map(|(i, _)| i)
                .collect();
        }
        let pick = runnable[st.rng.gen_range(0..runnable.len())];
        st.current = Some(pick);
        st.slots[pick].cv.notify_one();
    }

    /// A scheduling point: another task may run before the caller continues.
    pub fn yield_now(&self, id: TaskId) -> Result<(), String> {
        let mut st = self.lock();
        if let Some(a) = &st.abort {
            return Err(a.clone());
        }
        self.pass(&mut st);
        let st = self.wait_turn(st, id);
        match &st.abort {
            Some(a) => Err(a.clone()),
            None => Ok(()),
        }
    }

    /// Parks the caller until `blocker` is ready; `Err(report)` when the world deadlocked, or
    /// when the bounded wait timed out (`Err` starting "timed out: ").
    pub fn park(&self, id: TaskId, blocker: Blocker) -> Result<(), String> {
        let mut st = self.lock();
        if let Some(a) = &st.abort {
            return Err(a.clone());
        }
        st.slots[id].status = Status::Parked(blocker);
        self.pass(&mut st);
        let mut st = self.wait_turn(st, id);
        if let Some(a) = &st.abort {
            return Err(a.clone());
        }
        match st.slots[id].timed_out.take() {
            Some(what) => Err(format!("timed out: {what} (the world could make no other progress)")),
            None => Ok(()),
        }
    }

    fn exit(&self, id: TaskId) {
        let mut st = self.lock();
        st.slots[id].status = Status::Done;
        if st.current == Some(id) {
            self.pass(&mut st);
        }
    }

    /// Starts the run (from a thread that is not a task) and waits until every task is done.
    /// Returns the deadlock report if there was one, and the number of hand-overs.
    pub fn run_to_completion(&self) -> (Option<String>, u64) {
        let mut st = self.lock();
        self.pass(&mut st);
        while st.slots.iter().any(|s| !matches!(s.status, Status::Done)) {
            st = self.all_done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        (st.abort.clone(), st.switches)
    }

    /// Hand-overs of the baton so far: the world's virtual time.
    pub fn switches(&self) -> u64 {
        self.lock().switches
    }

    /// The report of a deadlock, once one happened.
    pub fn aborted(&self) -> Option<String> {
        self.lock().abort.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn one_task_at_a_time_in_a_seeded_order() {
        let run = |seed| {
            let s = Sched::new(seed);
            let log = Arc::new(Mutex::new(Vec::new()));
            for t in 0..4 {
                let (s2, log) = (s.clone(), log.clone());
                s.spawn(format!("t{t}"), move |id| {
                    for step in 0..3 {
                        log.lock().unwrap().push((t, step));
                        s2.yield_now(id).unwrap();
                    }
                })
                .unwrap();
            }
            assert_eq!(s.run_to_completion().0, None);
            let v = log.lock().unwrap().clone();
            v
        };
        let (a, b, c) = (run(1), run(1), run(2));
        assert_eq!(a.len(), 12);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn parked_tasks_wake_and_deadlocks_are_reported() {
        let s = Sched::new(7);
        let flag = Arc::new(AtomicU64::new(0));
        let (s1, f1) = (s.clone(), flag.clone());
        s.spawn("waiter".into(), move |id| {
            let f = f1.clone();
            s1.park(
                id,
                Blocker {
                    ready: Box::new(move || f.load(Ordering::SeqCst) == 1),
                    describe: Box::new(|| "flag".into()),
                    bounded: false,
                },
            )
            .unwrap();
            // Nobody sets 2: deadlock.
            let f = f1.clone();
            let e = s1
                .park(
                    id,
                    Blocker {
                        ready: Box::new(move || f.load(Ordering::SeqCst) == 2),
                        describe: Box::new(|| "flag == 2".into()),
                        bounded: false,
                    },
                )
                .unwrap_err();
            assert!(e.contains("flag == 2"));
        })
        .unwrap();
        let (s2, f2) = (s.clone(), flag.clone());
        s.spawn("setter".into(), move |id| {
            s2.yield_now(id).unwrap();
            f2.store(1, Ordering::SeqCst);
        })
        .unwrap();
        let (abort, _) = s.run_to_completion();
        assert!(abort.unwrap().contains("deadlock"));
    }
}
