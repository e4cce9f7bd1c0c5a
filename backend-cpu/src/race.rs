//! The happens-before race detector of the CPU world (`--race`).
//!
//! Every task (program instance, stream, rank host) carries a vector clock. Happens-before edges:
//! host -> stream at enqueue, stream -> programs at launch start, programs -> stream at launch
//! end, stream -> host at `synchronize`, host <-> host at `barrier`, and release -> acquire
//! through signal words (`notify`, release atomics, `put_signal`, stream signal writes, matched
//! by acquiring waits, acquire atomics and stream waits). Plain loads and stores (and copies) are
//! checked per element address: two accesses to the same element, at least one a write, from
//! different tasks and unordered by these edges, are a race, reported with both accessors.
//! Atomics are synchronisation, not data, and are not checked against each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A vector clock: task -> number of releases seen from it.
#[derive(Clone, Debug, Default)]
pub struct VClock(HashMap<u64, u64>);

impl VClock {
    pub fn get(&self, task: u64) -> u64 {
        self.0.get(&task).copied().unwrap_or(0)
    }

    pub fn join(&mut self, other: &VClock) {
        for (&t, &c) in &other.0 {
            let e = self.0.entry(t).or_insert(0);
            *e = (*e).max(c);
        }
    }

    pub fn tick(&mut self, task: u64) {
        *self.0.entry(task).or_insert(0) += 1;
    }
}

#[derive(Clone, Copy, Debug)]
struct Access {
    task: u64,
    clock: u64,
}

#[derive(Default)]
struct Cell {
    write: Option<Access>,
    reads: Vec<Access>,
}

#[derive(Default)]
struct State {
    sync: HashMap<u64, VClock>,
    cells: HashMap<u64, Cell>,
    labels: HashMap<u64, String>,
    first: Option<String>,
}

/// Shared detector state of one world run.
#[derive(Clone, Default)]
pub struct Races {
    state: Arc<Mutex<State>>,
}

impl Races {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names a task for reports.
    pub fn label(&self, task: u64, label: String) {
        self.lock().labels.insert(task, label);
    }

    /// A release on the sync word `addr` by `task` with clock `vc` (which then ticks).
    pub fn release(&self, addr: u64, task: u64, vc: &mut VClock) {
        self.lock().sync.entry(addr).or_default().join(vc);
        vc.tick(task);
    }

    /// A relaxed write of the sync word `addr` after a release fence whose clock was `fenced`:
    /// what the fence ordered is published there (fence-release, then the write).
    pub fn publish(&self, addr: u64, fenced: &VClock) {
        self.lock().sync.entry(addr).or_default().join(fenced);
    }

    /// An acquire of the sync word `addr`.
    pub fn acquire(&self, addr: u64, vc: &mut VClock) {
        if let Some(s) = self.lock().sync.get(&addr) {
            vc.join(s);
        }
    }

    /// A plain access; returns the race report if it races with an earlier access.
    pub fn access(&self, addr: u64, write: bool, task: u64, vc: &VClock, place: &dyn Fn() -> String) -> Option<String> {
        let mut st = self.lock();
        let me = Access { task, clock: vc.get(task) };
        let ordered = |a: &Access| a.task == task || vc.get(a.task) >= a.clock;
        let cell = st.cells.entry(addr).or_default();
        let mut conflict = cell.write.filter(|w| !ordered(w)).map(|w| (w, "store"));
        if write && conflict.is_none() {
            conflict = cell.reads.iter().find(|r| !ordered(r)).map(|r| (*r, "load"));
        }
        if write {
            cell.write = Some(me);
            cell.reads.clear();
        } else {
            cell.reads.retain(|r| r.task != task);
            cell.reads.push(me);
        }
        let (other, kind) = conflict?;
        let name = |t: u64| st.labels.get(&t).cloned().unwrap_or_else(|| format!("task {t}"));
        let report = format!(
            "data race on {}: {} by {} and {} by {}, unordered by any release/acquire",
            place(),
            kind,
            name(other.task),
            if write { "store" } else { "load" },
            name(task)
        );
        st.first.get_or_insert(report.clone());
        Some(report)
    }

    /// The first race found, if any.
    pub fn first(&self) -> Option<String> {
        self.lock().first.clone()
    }
}
