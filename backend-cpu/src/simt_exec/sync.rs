//! Executing synchronization and communication: barriers, warp shuffles, atomics, fences,
//! signals, peer addresses, bounded waits, NVSHMEM's device functions as the library defines them.

use super::*;

impl Exec<'_> {
    pub(super) fn sync(&mut self, inst: &Inst) -> Result<(), Fault> {
        let (k, lanes) = (self.k, self.lanes);
        match inst {
            Inst::Shuffle { dst, src, lane_xor } => {
                let v = self.get(*src)?;
                let ws = k.warp_size as usize;
                let idx: Vec<usize> = (0..lanes).map(|i| (i / ws) * ws + ((i % ws) ^ *lane_xor as usize)).collect();
                self.set(*dst, v.data.gather(&idx));
            }
            Inst::Barrier => {
                self.view.barrier();
                self.hazards.barrier();
            }
            // Ping-pong's groups run here a whole tile each in turn, group 0 first: every
            // group's main loop already follows the other's main loop of the tile before, which
            // is all the order barrier asks.
            Inst::GroupOrder { .. } => {}
            // The lanes running here vote: a producer's (its warps all run the producer's loop
            // here; on the GPU only its first does, and the others' words are its own).
            Inst::WarpAny { dst, pred } => {
                let any = self.get(*pred)?.ints().iter().any(|x| *x != 0);
                self.set(*dst, Data::I(vec![any as i64; lanes]));
            }
            Inst::BarrierAny { dst, pred } => {
                self.view.barrier();
                self.hazards.barrier();
                let any = self.get(*pred)?.ints().iter().any(|x| *x != 0);
                self.set(*dst, Data::I(vec![any as i64; lanes]));
            }
            Inst::AtomicLoad { dst, addr, pred, sem, .. } => {
                if sem.releases() {
                    return contract(format!("atomic load with {sem} semantics"));
                }
                let d = dtype(k.ty(*dst));
                self.atomic_lanes(Some(*dst), (*addr, 0), *pred, *sem, d, ("atomic load", false), &|_, cur| cur)?;
            }
            Inst::AtomicStore { addr, value, pred, sem, .. } => {
                if sem.acquires() {
                    return contract(format!("atomic store with {sem} semantics"));
                }
                let d = dtype(k.ty(*value));
                let v = self.get(*value)?;
                self.atomic_lanes(None, (*addr, 0), *pred, *sem, d, ("atomic store", true), &|i, _| {
                    elem_bits(&v.data, i, d)
                })?;
            }
            Inst::Atomic { dst, op, addr, value, pred, sem, .. } => {
                let d = dtype(k.ty(*value));
                let v = self.get(*value)?;
                let f = |i: usize, cur: u64| crate::interp::atomic_apply(*op, d, cur, elem_bits(&v.data, i, d));
                self.atomic_lanes(Some(*dst), (*addr, 0), *pred, *sem, d, ("atomic", true), &f)?;
            }
            Inst::VAtomic { op, addr, values, pred, sem, .. } => {
                let d = dtype(k.ty(values[0]));
                let size = d.size_bytes() as u64;
                let p = pred.map(|p| self.get(p)).transpose()?;
                let whole = size * values.len() as u64;
                for (i, &at) in self.get(*addr)?.ptrs().iter().enumerate() {
                    if p.as_ref().is_none_or(|p| p.ints()[i] != 0) && at % whole != 0 {
                        return fault(format!("vector atomic at {at:#x} not aligned to {whole} bytes"));
                    }
                }
                for (j, v) in values.iter().enumerate() {
                    let v = self.get(*v)?;
                    let f = |i: usize, cur: u64| crate::interp::atomic_apply(*op, d, cur, elem_bits(&v.data, i, d));
                    self.atomic_lanes(None, (*addr, j as u64 * size), *pred, *sem, d, ("vector atomic", true), &f)?;
                }
            }
            Inst::AtomicCas { dst, addr, expected, desired, pred, sem, .. } => {
                let d = dtype(k.ty(*desired));
                let (e, n) = (self.get(*expected)?, self.get(*desired)?);
                let f = |i: usize, cur: u64| {
                    if cur == elem_bits(&e.data, i, d) {
                        elem_bits(&n.data, i, d)
                    } else {
                        cur
                    }
                };
                self.atomic_lanes(Some(*dst), (*addr, 0), *pred, *sem, d, ("cas", true), &f)?;
            }
            // Copies complete at once here (the GPU's asynchrony is covered by the waits and
            // barriers the lowering places; the GPU conformance run checks them).
            Inst::SymmAt { dst, ptr, rank } => {
                let (p, r) = (self.get(*ptr)?, self.get(*rank)?);
                let v = (0..lanes).map(|i| self.hooks.translate(p.ptrs()[i], r.ints()[i])).collect::<Result<_, _>>()?;
                self.set(*dst, Data::P(v));
            }
            // Launches run one after the other here: the kernel before has ended.
            Inst::GridDependencyWait => {}
            // Every thread runs `fence.acq_rel`: releases what it stored, acquires what others did.
            Inst::Fence { .. } => {
                self.view.release_all(self.mem).or_else(|e| fault(e.0))?;
                self.view.acquire(self.mem);
                self.view.race_fence();
            }
            Inst::Signal { addr, value, op, pred } => {
                self.hooks.yield_point(&mut self.view)?;
                let (a, v, p) = (self.get(*addr)?, self.get(*value)?, self.get(*pred)?);
                for i in (0..lanes).filter(|&i| p.ints()[i] != 0) {
                    self.signal_update(a.ptrs()[i], v.ints()[i] as u64, *op, "")?;
                }
            }
            Inst::DeviceCall { call, args, pred } => self.device_call(*call, args, *pred, lanes)?,
            Inst::WaitSignals { base, count, cmp, value } => {
                self.hooks.yield_point(&mut self.view)?;
                let (b, c, v) = (self.get(*base)?, self.uniform(*count)?, self.get(*value)?);
                let want = v.ints()[0] as u64;
                let addrs: Vec<u64> = (0..c.max(0) as u64).map(|i| b.ptrs()[0].wrapping_add(8 * i)).collect();
                self.hooks.wait(&self.view, &addrs, WordTest::Cmp(*cmp, want))?;
                self.view.acquire(self.mem);
                for &a in &addrs {
                    self.view.race_acquire(a);
                }
            }
            // The scheduler's wait on every active lane's word, then each word read as a relaxed
            // atomic load (the data is in the word with its flag: nothing else is acquired).
            Inst::WaitFlag { dst, addr, pred, flag } => {
                self.hooks.yield_point(&mut self.view)?;
                let (a, f) = (self.get(*addr)?, self.get(*flag)?);
                let p = pred.map(|p| self.get(p)).transpose()?;
                let active: Vec<usize> = (0..lanes).filter(|i| p.as_ref().is_none_or(|p| p.ints()[*i] != 0)).collect();
                let addrs: Vec<u64> = active.iter().map(|&i| a.ptrs()[i]).collect();
                if let Some(&first) = active.first() {
                    self.hooks.wait(&self.view, &addrs, WordTest::Flag(f.ints()[first] as u32))?;
                }
                let d = dtype(k.ty(*dst));
                self.atomic_lanes(
                    Some(*dst),
                    (*addr, 0),
                    *pred,
                    MemSemantic::Relaxed,
                    d,
                    ("load_flagged", false),
                    &|_, cur| cur,
                )?;
            }
            _ => return fault(format!("`{inst:?}` is not a sync instruction")),
        }
        Ok(())
    }

    /// The vendor library's device function, as the library defines it: a `Block` transfer
    /// once per program (every thread calls it with the same operands; lane 0's are used), the
    /// signal update by every calling thread, fence and quiet as this program's release of its
    /// stores (what the library's P2P path does) followed by an acquire.
    pub(super) fn device_call(
        &mut self,
        call: DeviceCall,
        args: &[Reg],
        pred: Option<Reg>,
        lanes: usize,
    ) -> Result<(), Fault> {
        let vals: Vec<Val> = args.iter().map(|r| self.get(*r)).collect::<Result<_, _>>()?;
        let on: Vec<bool> = match pred {
            Some(p) => self.get(p)?.ints().iter().map(|&x| x != 0).collect(),
            None => vec![true; lanes],
        };
        let Some(first) = on.iter().position(|&b| b) else { return Ok(()) };
        let name = Vendor::Nvshmem.function(call);
        let int = |i: usize, lane: usize| vals[i].ints()[lane];
        let ptr = |i: usize, lane: usize| vals[i].ptrs()[lane];
        match call {
            DeviceCall::PutBlock { .. } | DeviceCall::GetBlock { .. } | DeviceCall::PutSignalBlock { .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let is_put = !matches!(call, DeviceCall::GetBlock { .. });
                let (dst, src, bytes) = (ptr(0, first), ptr(1, first), int(2, first));
                let pe = int(vals.len() - 1, first);
                let (to, from) =
                    if is_put { (self.hooks.translate(dst, pe)?, src) } else { (dst, self.hooks.translate(src, pe)?) };
                let view = self.mem.view();
                let mut done = 0u64;
                while done < bytes.max(0) as u64 {
                    let n = if bytes as u64 - done >= 8 { 8 } else { 1 };
                    let bits = self.view.load(&view, from + done, n).or_else(|e| fault(format!("{name}: {}", e.0)))?;
                    self.view.store(&view, to + done, n, bits, first).or_else(|e| fault(format!("{name}: {}", e.0)))?;
                    done += n as u64;
                }
                if let DeviceCall::PutSignalBlock { op, .. } = call {
                    // The signal is delivered after the data.
                    self.view.release_all(self.mem).or_else(|e| fault(e.0))?;
                    let sig = self.hooks.translate(ptr(3, first), pe)?;
                    self.view.race_release(sig);
                    self.signal_update(sig, int(4, first) as u64, op, name)?;
                }
            }
            DeviceCall::SignalOp { op } => {
                self.hooks.yield_point(&mut self.view)?;
                for lane in (0..lanes).filter(|&l| on[l]) {
                    let sig = self.hooks.translate(ptr(0, lane), int(2, lane))?;
                    self.signal_update(sig, int(1, lane) as u64, op, name)?;
                }
            }
            DeviceCall::Fence | DeviceCall::Quiet => {
                self.view.release_all(self.mem).or_else(|e| fault(e.0))?;
                self.view.acquire(self.mem);
                self.view.race_fence();
            }
        }
        Ok(())
    }

    /// A 64-bit signal update (relaxed, system scope), reported to the world's scheduler;
    /// `call`, when not empty, names the library call that made it in a fault.
    pub(super) fn signal_update(&mut self, addr: u64, x: u64, op: SignalOp, call: &str) -> Result<(), Fault> {
        let f = |old: u64| match op {
            SignalOp::Set => x,
            SignalOp::Add => old.wrapping_add(x),
        };
        self.view.rmw(self.mem, addr, 8, f).or_else(|e| match call {
            "" => fault(format!("signal: {}", e.0)),
            _ => fault(format!("{call}: signal: {}", e.0)),
        })?;
        self.view.race_relaxed_write(addr);
        self.hooks.signal_written(&self.view, addr, x);
        Ok(())
    }

    /// Read-modify-write of each active lane's word at `addr` (`f(lane, current)` is the new
    /// value), releasing before and acquiring after as `sem` says; `dst` gets the old values.
    /// `writes` is false for an atomic load (a relaxed load publishes nothing at the next
    /// signal; a relaxed store acquires nothing at the next fence).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic_lanes(
        &mut self,
        dst: Option<Reg>,
        (addr, offset): (Reg, u64),
        pred: Option<Reg>,
        sem: MemSemantic,
        d: DType,
        (what, writes): (&str, bool),
        f: &dyn Fn(usize, u64) -> u64,
    ) -> Result<(), Fault> {
        self.hooks.yield_point(&mut self.view)?;
        let lanes = self.lanes;
        let size = d.size_bytes() as usize;
        let ptrs: Vec<u64> = self.get(addr)?.ptrs().iter().map(|p| p + offset).collect();
        let p = pred.map(|p| self.get(p)).transpose()?;
        let active: Vec<usize> = (0..lanes).filter(|i| p.as_ref().is_none_or(|p| p.ints()[*i] != 0)).collect();
        if sem.releases() {
            // Each active thread releases what it (and any barrier before) ordered.
            if active.len() == lanes {
                self.view.release_all(self.mem).or_else(|e| fault(e.0))?;
            } else {
                for &t in &active {
                    self.view.release_thread(self.mem, t).or_else(|e| fault(e.0))?;
                }
            }
        }
        for &i in &active {
            let at = ptrs[i];
            if sem.releases() {
                self.view.race_release(at);
            } else {
                // Relaxed: ordered by the fences around it (fence; write / read; fence).
                if writes {
                    self.view.race_relaxed_write(at);
                }
                if dst.is_some() {
                    self.view.race_relaxed_read(at);
                }
            }
        }
        let mut old = vec![0u64; lanes];
        for &i in &active {
            old[i] = self
                .view
                .rmw(self.mem, ptrs[i], size, |cur| f(i, cur))
                .or_else(|e| fault(format!("{what}: {}", e.0)))?;
        }
        if sem.acquires() {
            self.view.acquire(self.mem);
            for &i in &active {
                self.view.race_acquire(ptrs[i]);
            }
        }
        if let Some(dst) = dst {
            let mut out = empty_for(Elem::Num(d), lanes);
            for b in old {
                push(&mut out, from_bits(d, b))?;
            }
            self.set(dst, out);
        }
        Ok(())
    }
}
