//! Executing global and shared memory instructions: loads and stores (scalar, vector,
//! predicated), alignment tests, `cp.async` (complete at once: the commit and wait are no-ops).

use super::*;

impl Exec<'_> {
    pub(super) fn memory(&mut self, inst: &Inst) -> Result<(), Fault> {
        let (k, lanes) = (self.k, self.lanes);
        match inst {
            Inst::Load { dst, addr, pred, other } => {
                let d = dtype(k.ty(*dst));
                let size = d.size_bytes() as usize;
                let a = self.get(*addr)?;
                let p = pred.map(|p| self.get(p)).transpose()?;
                let o = other.map(|o| self.get(o)).transpose()?;
                let view = self.mem.view();
                let mut out = empty_for(Elem::Num(d), lanes);
                for (i, &addr) in a.ptrs().iter().enumerate() {
                    let on = p.as_ref().is_none_or(|p| p.ints()[i] != 0);
                    let e = if on {
                        from_bits(d, self.view.load(&view, addr, size).or_else(|e| fault(format!("load: {}", e.0)))?)
                    } else {
                        masked_off(d, o.as_ref().map(|o| &o.data), i)
                    };
                    push(&mut out, e)?;
                }
                self.set(*dst, out);
            }
            Inst::Store { addr, value, pred } => {
                let d = dtype(k.ty(*value));
                let size = d.size_bytes() as usize;
                let (a, v) = (self.get(*addr)?, self.get(*value)?);
                let p = pred.map(|p| self.get(p)).transpose()?;
                let view = self.mem.view();
                for (i, &addr) in a.ptrs().iter().enumerate() {
                    if p.as_ref().is_some_and(|p| p.ints()[i] == 0) {
                        continue;
                    }
                    self.view
                        .store(&view, addr, size, elem_bits(&v.data, i, d), i)
                        .or_else(|e| fault(format!("store: {}", e.0)))?;
                }
            }
            Inst::VLoad { dsts, addr, pred, others } => {
                let d = dtype(k.ty(dsts[0]));
                let size = d.size_bytes() as usize;
                let a = self.get(*addr)?;
                let p = pred.map(|p| self.get(p)).transpose()?;
                let others: Vec<Val> = others.iter().map(|o| self.get(*o)).collect::<Result<_, _>>()?;
                let view = self.mem.view();
                let mut outs: Vec<Data> = dsts.iter().map(|_| empty_for(Elem::Num(d), lanes)).collect();
                for (i, &base) in a.ptrs().iter().enumerate() {
                    let on = p.as_ref().is_none_or(|p| p.ints()[i] != 0);
                    if on && base % (size * dsts.len()) as u64 != 0 {
                        return fault(format!("vector load at {base:#x} not aligned to {} bytes", size * dsts.len()));
                    }
                    for (j, out) in outs.iter_mut().enumerate() {
                        let e = if on {
                            let at = base + (j * size) as u64;
                            from_bits(d, self.view.load(&view, at, size).or_else(|e| fault(format!("load: {}", e.0)))?)
                        } else {
                            masked_off(d, others.get(j).map(|o| &o.data), i)
                        };
                        push(out, e)?;
                    }
                }
                for (dst, out) in dsts.iter().zip(outs) {
                    self.set(*dst, out);
                }
            }
            Inst::VStore { addr, values, pred } => {
                let d = dtype(k.ty(values[0]));
                let size = d.size_bytes() as usize;
                let a = self.get(*addr)?;
                let vs: Vec<Val> = values.iter().map(|v| self.get(*v)).collect::<Result<_, _>>()?;
                let p = pred.map(|p| self.get(p)).transpose()?;
                let view = self.mem.view();
                for (i, &base) in a.ptrs().iter().enumerate() {
                    if p.as_ref().is_some_and(|p| p.ints()[i] == 0) {
                        continue;
                    }
                    if base % (size * vs.len()) as u64 != 0 {
                        return fault(format!("vector store at {base:#x} not aligned to {} bytes", size * vs.len()));
                    }
                    for (j, v) in vs.iter().enumerate() {
                        let at = base + (j * size) as u64;
                        self.view
                            .store(&view, at, size, elem_bits(&v.data, i, d), i)
                            .or_else(|e| fault(format!("store: {}", e.0)))?;
                    }
                }
            }
            Inst::IsAligned { dst, addr, bytes } => {
                let a = self.get(*addr)?;
                let v = a.ptrs().iter().map(|&p| (p % *bytes as u64 == 0) as i64).collect();
                self.set(*dst, Data::I(v));
            }
            Inst::SharedStore { offset, value, pred } => {
                let d = dtype(k.ty(*value));
                let size = trident_core::simt::lower::shared_size(k.ty(*value)) as usize;
                let (o, v) = (self.get(*offset)?, self.get(*value)?);
                let p = pred.map(|p| self.get(p)).transpose()?;
                for i in 0..lanes {
                    if p.as_ref().is_some_and(|p| p.ints()[i] == 0) {
                        continue;
                    }
                    self.shared_put(i, o.ints()[i] as usize, size, elem_bits(&v.data, i, d))?;
                }
            }
            Inst::SharedVStore { offset, values } => {
                let d = dtype(k.ty(values[0]));
                let size = trident_core::simt::lower::shared_size(k.ty(values[0])) as usize;
                let o = self.get(*offset)?;
                let vs: Vec<Val> = values.iter().map(|v| self.get(*v)).collect::<Result<_, _>>()?;
                for i in 0..lanes {
                    let base = o.ints()[i] as usize;
                    if !base.is_multiple_of(size * vs.len()) {
                        return fault(format!(
                            "shared vector store at {base} not aligned to {} bytes",
                            size * vs.len()
                        ));
                    }
                    for (j, v) in vs.iter().enumerate() {
                        self.shared_put(i, base + j * size, size, elem_bits(&v.data, i, d))?;
                    }
                }
            }
            Inst::SharedLoad { dst, offset } => {
                let d = dtype(k.ty(*dst));
                let size = trident_core::simt::lower::shared_size(k.ty(*dst)) as usize;
                let o = self.get(*offset)?;
                let mut out = empty_for(Elem::Num(d), lanes);
                for i in 0..lanes {
                    push(&mut out, from_bits(d, self.shared_get(i, o.ints()[i] as usize, size)?))?;
                }
                self.set(*dst, out);
            }
            // Lanes run in lock-step; the view orders every thread's stores before later releases.
            // A copy reads its source when issued and lands in shared memory when a wait
            // completes its group (`Exec::complete_copies`): until then its bytes hold poison
            // (0xff: NaN in every float type), so a read before the wait reads garbage and the
            // race detector sees the write both at the issue and at the wait.
            Inst::AsyncCopy { offset, addr, bytes, pred, zero_fill } => {
                let (o, a, p) = (self.get(*offset)?, self.get(*addr)?, self.get(*pred)?);
                let view = self.mem.view();
                let n = *bytes as usize;
                for i in 0..lanes {
                    let dst = o.ints()[i] as usize;
                    let data = if p.ints()[i] == 0 {
                        if !*zero_fill {
                            continue;
                        }
                        if !dst.is_multiple_of(n) {
                            return fault(format!("cp.async zero fill of {bytes} bytes at shared {dst} not aligned"));
                        }
                        vec![0u8; n]
                    } else {
                        let src = a.ptrs()[i];
                        if src % n as u64 != 0 || !dst.is_multiple_of(n) {
                            return fault(format!(
                                "cp.async of {bytes} bytes from {src:#x} to shared {dst} not aligned"
                            ));
                        }
                        let mut data = Vec::with_capacity(n);
                        for b in (0..n).step_by(2) {
                            let x = self
                                .view
                                .load(&view, src + b as u64, 2)
                                .or_else(|e| fault(format!("cp.async: {}", e.0)))?;
                            data.extend_from_slice(&(x as u16).to_le_bytes());
                        }
                        data
                    };
                    for b in (0..n).step_by(2) {
                        self.shared_put(i, dst + b, 2, 0xffff)?;
                    }
                    self.copies.issue(super::PendingCopy { thread: self.lane_base + i, dst, data });
                }
            }
            Inst::AsyncCommit => self.copies.commit(),
            Inst::AsyncWait { pending } => {
                let done = self.copies.wait(*pending);
                self.complete_copies(done)?;
            }
            Inst::SharedVLoad { dsts, offset } => {
                let d = dtype(k.ty(dsts[0]));
                let size = trident_core::simt::lower::shared_size(k.ty(dsts[0])) as usize;
                let o = self.get(*offset)?;
                let mut outs: Vec<Data> = dsts.iter().map(|_| empty_for(Elem::Num(d), lanes)).collect();
                for i in 0..lanes {
                    let base = o.ints()[i] as usize;
                    if !base.is_multiple_of(size * dsts.len()) {
                        return fault(format!(
                            "shared vector load at {base} not aligned to {} bytes",
                            size * dsts.len()
                        ));
                    }
                    for (j, out) in outs.iter_mut().enumerate() {
                        push(out, from_bits(d, self.shared_get(i, base + j * size, size)?))?;
                    }
                }
                for (dst, out) in dsts.iter().zip(outs) {
                    self.set(*dst, out);
                }
            }
            _ => return fault(format!("`{inst:?}` is not a memory instruction")),
        }
        Ok(())
    }

    /// Lands `copies` (a completed `cp.async` group, or what is left at the program's end) in
    /// shared memory, each written by the thread that issued it.
    pub(super) fn complete_copies(&mut self, copies: Vec<super::PendingCopy>) -> Result<(), Fault> {
        for c in copies {
            if self.shared.get(c.dst..c.dst + c.data.len()).is_none() {
                return fault(format!(
                    "cp.async of {} bytes to shared {} out of {} bytes",
                    c.data.len(),
                    c.dst,
                    self.k.shared_bytes
                ));
            }
            for (i, b) in c.data.iter().enumerate() {
                let same = self.shared[c.dst + i] == *b;
                self.hazards.write(c.thread, c.dst + i, same)?;
                self.shared[c.dst + i] = *b;
            }
        }
        Ok(())
    }

    /// The low `size` bytes of `bits` into shared memory at byte `off`, written by `lane`.
    pub(super) fn shared_put(&mut self, lane: usize, off: usize, size: usize, bits: u64) -> Result<(), Fault> {
        let total = self.k.shared_bytes;
        if self.shared.get(off..off + size).is_none() {
            return fault(format!("shared store of {size} bytes at {off} out of {total} bytes"));
        }
        let bytes = bits.to_le_bytes();
        for (i, b) in bytes[..size].iter().enumerate() {
            let same = self.shared[off + i] == *b;
            self.hazards.write(self.lane_base + lane, off + i, same)?;
            self.shared[off + i] = *b;
        }
        Ok(())
    }
}
