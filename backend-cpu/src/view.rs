//! A program's view of memory: what it has stored but not yet published, what it has acquired,
//! and its outstanding non-blocking transfers.
//!
//! In *immediate* mode (single-device launches, programs run one at a time) every access goes
//! straight to memory. In *delayed* mode (worlds) the view applies `EXECUTION.md`'s adversarial
//! rules:
//! * a plain store waits in the store buffer of the thread that owns the element (element `i`
//!   of a tile belongs to thread `i mod threads`; scalars to thread 0) until a release by that
//!   thread, a `barrier` followed by a release by any thread, `fence`/`quiet`, the end of the
//!   program, or a random earlier point;
//! * a load sees the program's own buffered stores, else the newest value published no later
//!   than the program's last acquire (or written by the program itself);
//! * puts and gets complete at `quiet`, `fence`, `barrier_all`, program end, or a random earlier
//!   point; a non-blocking put reads its source only then.

use crate::memory::{AccessError, Memory, Region, View, Writer};
use crate::race::{Races, VClock};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use trident_core::ir::SignalOp;

#[derive(Clone, Copy, Debug)]
struct Store {
    addr: u64,
    size: usize,
    bits: u64,
}

/// An outstanding put or get.
#[derive(Clone, Debug)]
pub struct Transfer {
    pub dst: u64,
    pub src: u64,
    pub bytes: usize,
    /// Source bytes read when the transfer was issued (blocking puts); `None`: read at delivery.
    pub data: Option<Vec<u8>>,
    /// Signal updated after the data is delivered: (address, op, value).
    pub signal: Option<(u64, SignalOp, u64)>,
}

pub struct ProgramView {
    pub writer: Writer,
    /// Publication time of the last acquire (or of the launch's start).
    pub acquired: u64,
    delayed: bool,
    threads: usize,
    per_thread: Vec<Vec<Store>>,
    /// Stores ordered by a `barrier`: published by the next release of any thread.
    shared: Vec<Store>,
    /// Newest buffered value per address (read-your-writes).
    own: HashMap<u64, (usize, u64)>,
    pending: Vec<Transfer>,
    rng: rand::rngs::StdRng,
    /// Probability that a yield point publishes part of what is buffered.
    chaos: f64,
    /// The race detector and this program's vector clock (`--race`).
    race: Option<RaceCtx>,
}

/// A program's part in race detection.
pub struct RaceCtx {
    pub races: Races,
    pub clock: VClock,
    /// The clock at the program's last release fence: a relaxed signal write after it
    /// releases what the fence ordered (the SIMT lowering's `fence; signal`).
    pub fenced: Option<VClock>,
    /// Sync words read by relaxed atomics since the last fence, which an acquire fence turns
    /// into acquires (`ld.relaxed; fence`).
    pub relaxed_reads: Vec<u64>,
    /// Names an address for reports.
    pub place: std::sync::Arc<dyn Fn(u64) -> String + Send + Sync>,
}

fn locate<'v>(view: &'v View<'_>, addr: u64, size: usize) -> Result<(&'v Region, usize), AccessError> {
    view.locate(addr, size)
}

impl ProgramView {
    /// Direct access, no buffering (single-device launches).
    pub fn immediate(writer: Writer) -> ProgramView {
        Self::new(writer, u64::MAX, false, 1, 0, 0.0)
    }

    /// Delayed visibility for a program of a world launch.
    pub fn delayed(writer: Writer, acquired: u64, threads: usize, seed: u64, chaos: f64) -> ProgramView {
        Self::new(writer, acquired, true, threads.max(1), seed, chaos)
    }

    fn new(writer: Writer, acquired: u64, delayed: bool, threads: usize, seed: u64, chaos: f64) -> ProgramView {
        ProgramView {
            writer,
            acquired,
            delayed,
            threads,
            per_thread: vec![Vec::new(); threads],
            shared: Vec::new(),
            own: HashMap::new(),
            pending: Vec::new(),
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            chaos,
            race: None,
        }
    }

    /// Turns on race detection for this program.
    pub fn with_race(mut self, race: RaceCtx) -> ProgramView {
        self.race = Some(race);
        self
    }

    /// The program's final vector clock (to join into its launch).
    pub fn take_clock(&mut self) -> Option<VClock> {
        self.race.take().map(|r| r.clock)
    }

    fn race_access(&self, addr: u64, size: usize, write: bool) -> Result<(), AccessError> {
        if let Some(r) = &self.race {
            for b in addr..addr + size as u64 {
                if let Some(report) = r.races.access(b, write, self.writer.task, &r.clock, &|| (r.place)(b)) {
                    return Err(AccessError(report));
                }
            }
        }
        Ok(())
    }

    /// Release on the sync word `addr` (signal writes, release atomics).
    pub fn race_release(&mut self, addr: u64) {
        let task = self.writer.task;
        if let Some(r) = &mut self.race {
            r.races.release(addr, task, &mut r.clock);
        }
    }

    /// A fence with acquire and release semantics (`fence.acq_rel`): the words read relaxed
    /// since the last fence are acquired, and the clock is kept for later relaxed writes.
    pub fn race_fence(&mut self) {
        let task = self.writer.task;
        if let Some(r) = &mut self.race {
            for a in std::mem::take(&mut r.relaxed_reads) {
                r.races.acquire(a, &mut r.clock);
            }
            r.fenced = Some(r.clock.clone());
            r.clock.tick(task);
        }
    }

    /// A relaxed write of the sync word `addr` (a signal): releases what the last fence ordered.
    pub fn race_relaxed_write(&mut self, addr: u64) {
        if let Some(r) = &mut self.race {
            if let Some(f) = &r.fenced {
                r.races.publish(addr, f);
            }
        }
    }

    /// A relaxed read of the sync word `addr` (acquired at the next fence).
    pub fn race_relaxed_read(&mut self, addr: u64) {
        if let Some(r) = &mut self.race {
            r.relaxed_reads.push(addr);
        }
    }

    /// Acquire of the sync word `addr` (completed waits, acquire atomics).
    pub fn race_acquire(&mut self, addr: u64) {
        if let Some(r) = &mut self.race {
            r.races.acquire(addr, &mut r.clock);
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn is_delayed(&self) -> bool {
        self.delayed
    }

    /// Reads an element.
    pub fn load(&self, view: &View<'_>, addr: u64, size: usize) -> Result<u64, AccessError> {
        let (r, o) = locate(view, addr, size)?;
        self.race_access(addr, size, false)?;
        if !self.delayed {
            return Ok(r.load(o, size));
        }
        if let Some(&(s, bits)) = self.own.get(&addr) {
            if s == size {
                return Ok(bits);
            }
        }
        Ok(r.load_visible(o, size, self.acquired, self.writer.task))
    }

    /// Stores an element on behalf of `thread` (bounds are checked now, visibility comes later).
    pub fn store(
        &mut self,
        view: &View<'_>,
        addr: u64,
        size: usize,
        bits: u64,
        thread: usize,
    ) -> Result<(), AccessError> {
        let (r, o) = locate(view, addr, size)?;
        self.race_access(addr, size, true)?;
        if !self.delayed {
            r.store(o, size, bits);
            return Ok(());
        }
        self.per_thread[thread % self.threads].push(Store { addr, size, bits });
        self.own.insert(addr, (size, bits));
        Ok(())
    }

    /// Atomic read-modify-write on the newest value; the program's buffered stores are published
    /// first (early publication is always allowed), and the result is published at once.
    pub fn rmw(&mut self, mem: &Memory, addr: u64, size: usize, f: impl Fn(u64) -> u64) -> Result<u64, AccessError> {
        if self.delayed && self.own.contains_key(&addr) {
            self.release_all(mem)?;
        }
        let view = mem.view();
        let (r, o) = locate(&view, addr, size)?;
        if !self.delayed {
            return Ok(r.rmw(o, size, f));
        }
        Ok(r.rmw_publish(o, size, f, mem.tick(), self.writer, mem.recording()))
    }

    fn publish(&self, mem: &Memory, stores: &[Store]) -> Result<(), AccessError> {
        if stores.is_empty() {
            return Ok(());
        }
        let time = mem.tick();
        let record = mem.recording();
        let view = mem.view();
        for s in stores {
            let (r, o) = locate(&view, s.addr, s.size)?;
            r.publish(o, s.size, s.bits, time, self.writer, record);
        }
        Ok(())
    }

    fn reindex(&mut self) {
        self.own.clear();
        for s in self.shared.iter().chain(self.per_thread.iter().flatten()) {
            self.own.insert(s.addr, (s.size, s.bits));
        }
    }

    /// `barrier`: every thread's buffered stores become ordered before any later release.
    pub fn barrier(&mut self) {
        for t in 0..self.threads {
            let v = std::mem::take(&mut self.per_thread[t]);
            self.shared.extend(v);
        }
    }

    /// A release by one thread: publishes what that thread (and any barrier before) ordered.
    pub fn release_thread(&mut self, mem: &Memory, thread: usize) -> Result<(), AccessError> {
        if !self.delayed {
            return Ok(());
        }
        let mut batch = std::mem::take(&mut self.shared);
        batch.append(&mut self.per_thread[thread % self.threads]);
        self.publish(mem, &batch)?;
        self.reindex();
        Ok(())
    }

    /// A release by every thread (or barrier + release): publishes every buffered store.
    pub fn release_all(&mut self, mem: &Memory) -> Result<(), AccessError> {
        if !self.delayed {
            return Ok(());
        }
        self.barrier();
        self.release_thread(mem, 0)
    }

    /// An acquire: everything published so far becomes visible to the program.
    pub fn acquire(&mut self, mem: &Memory) {
        if self.delayed {
            self.acquired = mem.now();
        }
    }

    /// Issues a put/get; delivered now in immediate mode, later in delayed mode.
    pub fn transfer(&mut self, mem: &Memory, t: Transfer) -> Result<(), AccessError> {
        {
            let view = mem.view();
            for (addr, what) in [(t.src, "source"), (t.dst, "destination")] {
                if t.bytes > 0 {
                    locate(&view, addr, 1).map_err(|e| AccessError(format!("{what}: {}", e.0)))?;
                    locate(&view, addr + t.bytes as u64 - 1, 1).map_err(|e| AccessError(format!("{what}: {}", e.0)))?;
                }
            }
        }
        if !self.delayed {
            return self.deliver(mem, t);
        }
        // The program's own earlier stores to the source must reach the transfer.
        self.release_all(mem)?;
        self.pending.push(t);
        Ok(())
    }

    fn deliver(&mut self, mem: &Memory, t: Transfer) -> Result<(), AccessError> {
        if t.data.is_none() {
            self.race_access(t.src, t.bytes, false)?;
        }
        self.race_access(t.dst, t.bytes, true)?;
        if let Some((sig, _, _)) = t.signal {
            self.race_release(sig);
        }
        let data = match t.data {
            Some(d) => d,
            None => {
                let mut d = vec![0u8; t.bytes];
                mem.read_bytes(t.src, &mut d)?;
                d
            }
        };
        if self.delayed {
            mem.publish_bytes(t.dst, &data, self.writer)?;
        } else {
            mem.write_bytes(t.dst, &data)?;
        }
        if let Some((sig, op, value)) = t.signal {
            let view = mem.view();
            let (r, o) = locate(&view, sig, 8)?;
            let f = move |old: u64| match op {
                SignalOp::Set => value,
                SignalOp::Add => old.wrapping_add(value),
            };
            if self.delayed {
                r.rmw_publish(o, 8, f, mem.tick(), self.writer, mem.recording());
            } else {
                r.rmw(o, 8, f);
            }
        }
        Ok(())
    }

    /// `quiet` (and `fence`, `barrier_all`, program end): completes every outstanding transfer.
    pub fn quiet(&mut self, mem: &Memory) -> Result<(), AccessError> {
        for t in std::mem::take(&mut self.pending) {
            self.deliver(mem, t)?;
        }
        Ok(())
    }

    /// End of the program: everything buffered becomes visible.
    pub fn finish(&mut self, mem: &Memory) -> Result<(), AccessError> {
        self.release_all(mem)?;
        self.quiet(mem)
    }

    /// At a yield point, maybe publish part of what is buffered (seeded): one thread's stores,
    /// the barrier-ordered stores, or one outstanding transfer.
    pub fn perturb(&mut self, mem: &Memory) -> Result<(), AccessError> {
        if !self.delayed || self.chaos <= 0.0 || !self.rng.gen_bool(self.chaos.min(1.0)) {
            return Ok(());
        }
        match self.rng.gen_range(0..3) {
            0 if !self.pending.is_empty() => {
                let i = self.rng.gen_range(0..self.pending.len());
                let t = self.pending.remove(i);
                self.deliver(mem, t)
            }
            1 if !self.shared.is_empty() => {
                let batch = std::mem::take(&mut self.shared);
                self.publish(mem, &batch)?;
                self.reindex();
                Ok(())
            }
            _ => {
                let t = self.rng.gen_range(0..self.threads);
                // Publish part of one thread's stores: visibility order between addresses is free.
                let n = self.per_thread[t].len();
                if n == 0 {
                    return Ok(());
                }
                let k = self.rng.gen_range(1..=n);
                let batch: Vec<Store> = self.per_thread[t].drain(..k).collect();
                self.publish(mem, &batch)?;
                self.reindex();
                Ok(())
            }
        }
    }
}
