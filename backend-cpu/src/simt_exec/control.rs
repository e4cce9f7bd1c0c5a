//! Executing structured control flow: loops, ifs, whiles, warp-specialized regions (producer
//! and consumer warps interleaved at their mbarrier waits), exit, source locations.

use super::*;

impl Exec<'_> {
    pub(super) fn control(&mut self, inst: &Inst) -> Result<(), Fault> {
        let lanes = self.lanes;
        match inst {
            Inst::Exit => self.exited = true,
            Inst::Origin { op, what, loc } => self.origin = Some((*op, what, *loc)),
            Inst::Specialized { consumer_warps, producer, consumer } => {
                self.specialized(*consumer_warps, producer, consumer)?;
            }
            Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results } => {
                let (lo, hi, st) = (self.uniform(*lo)?, self.uniform(*hi)?, self.uniform(*step)?);
                if st <= 0 {
                    return fault(format!("loop step {st} is not positive"));
                }
                self.copy_all(phis, inits)?;
                let mut i = lo;
                while i < hi && !self.exited {
                    self.set(*iv, Data::I(vec![i; lanes]));
                    self.body(body)?;
                    if self.exited {
                        return Ok(());
                    }
                    self.copy_all(phis, nexts)?;
                    i += st;
                }
                self.copy_all(results, phis)?;
            }
            Inst::If { cond, then_body, then_yields, else_body, else_yields, results } => {
                if self.uniform(*cond)? != 0 {
                    self.body(then_body)?;
                    if self.exited {
                        return Ok(());
                    }
                    self.copy_all(results, then_yields)?;
                } else {
                    self.body(else_body)?;
                    if self.exited {
                        return Ok(());
                    }
                    self.copy_all(results, else_yields)?;
                }
            }
            Inst::While { phis, inits, cond_body, cond, body, nexts, results } => {
                self.copy_all(phis, inits)?;
                loop {
                    self.body(cond_body)?;
                    if self.exited {
                        return Ok(());
                    }
                    if self.uniform(*cond)? == 0 {
                        break;
                    }
                    self.body(body)?;
                    if self.exited {
                        return Ok(());
                    }
                    self.copy_all(phis, nexts)?;
                }
                self.copy_all(results, phis)?;
            }
            _ => return fault(format!("`{inst:?}` is not a control instruction")),
        }
        Ok(())
    }

    /// An [`Inst::Specialized`] region: the effect-free instructions before each side's loop,
    /// then the consumers' loop, run on the consumer lanes with their own register file (as on
    /// the GPU, where the producer warps never execute it). A consumer wait that cannot pass yet
    /// runs the producer's loop ([`Exec::pump`]) an iteration at a time until it blocks on an
    /// mbarrier of its own (its iteration then starts again later: the producer's waits come
    /// before its effects) or ends; a fault if neither side can go on. The consumers' loop may
    /// nest loops and branches (a persistent kernel's tile loop and epilogue). Afterwards only
    /// the consumer lanes are left.
    pub(super) fn specialized(
        &mut self,
        consumer_warps: u32,
        producer: &[Inst],
        consumer: &[Inst],
    ) -> Result<(), Fault> {
        let mut loops = Vec::new();
        for body in [producer, consumer] {
            let Some((Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results }, pre)) = body.split_last()
            else {
                return contract("a specialized side that does not end in a loop");
            };
            self.body(pre)?;
            let (lo, hi, step) = (self.uniform(*lo)?, self.uniform(*hi)?, self.uniform(*step)?);
            if step <= 0 {
                return fault(format!("loop step {step} is not positive"));
            }
            self.copy_all(phis, inits)?;
            loops.push((*iv, lo, hi, step, phis, body, nexts, results));
        }
        let n = (consumer_warps * self.k.warp_size) as usize;
        let mut consumer_regs = self.regs.clone();
        for v in consumer_regs.iter_mut().flatten() {
            truncate_lanes(v, n);
        }
        let (iv, lo, hi, step, phis, body, nexts, _) = loops[0];
        let side = Side { iv, at: lo, hi, step, phis: phis.clone(), body: body.clone(), nexts: nexts.clone() };
        let regs = std::mem::replace(&mut self.regs, consumer_regs);
        let lanes = std::mem::replace(&mut self.lanes, n);
        self.producer = Some(Pump { side, regs, lanes });
        let (iv, lo, hi, step, phis, body, nexts, results) = loops[1];
        let mut at = lo;
        while at < hi && !self.exited {
            self.set(iv, Data::I(vec![at; self.lanes]));
            self.body(body)?;
            self.copy_all(phis, nexts)?;
            at += step;
        }
        // What the producer has left (nothing, when every copy it made was consumed).
        self.pump()?;
        let left = self.producer.take().filter(|p| p.side.at < p.side.hi);
        if let Some(p) = left {
            return fault(format!(
                "warp-specialized loops deadlock: the consumers finished, the producer waits at iteration value {}",
                p.side.at
            ));
        }
        self.copy_all(results, phis)
    }

    pub(super) fn copy_all(&mut self, dsts: &[Reg], srcs: &[Reg]) -> Result<(), Fault> {
        let vals: Vec<Val> = srcs.iter().map(|s| self.get(*s)).collect::<Result<_, _>>()?;
        for (d, v) in dsts.iter().zip(vals) {
            self.regs[d.0 as usize] = Some(v);
        }
        Ok(())
    }
}
