//! Executing structured control flow: loops, ifs, whiles, warp-specialized regions (producer
//! and consumer warps interleaved at their mbarrier waits), exit, source locations.

use super::*;

impl Exec<'_> {
    pub(super) fn control(&mut self, inst: &Inst) -> Result<(), Fault> {
        let lanes = self.lanes;
        match inst {
            Inst::Exit => self.exited = true,
            Inst::Origin { op, what, loc } => self.origin = Some((*op, what, *loc)),
            // The register split (`regs`) is the GPU's allocation; every lane here has all it
            // needs. The producer warpgroup's other warps run the producer's loop too, their
            // copies predicated off (on the GPU they leave at once).
            Inst::Specialized { consumer_warps, producer, consumer, pingpong, regs: _ } => {
                self.specialized(*consumer_warps, producer, consumer, pingpong.is_some())?;
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
    ///
    /// With `pingpong` the consumers are two groups, each with its own lanes and registers
    /// (sliced from the consumers'), and the groups run their loops' iterations in turn: one
    /// whole iteration (a tile) of group 0, then one of group 1, and so on. The producer fills
    /// the stages in the tiles' order, which is the order the groups take them, so this
    /// interleaving cannot deadlock where the GPU's would not. Afterwards the consumer lanes
    /// have the registers they had before the region.
    pub(super) fn specialized(
        &mut self,
        consumer_warps: u32,
        producer: &[Inst],
        consumer: &[Inst],
        pingpong: bool,
    ) -> Result<(), Fault> {
        let mut loops = Vec::new();
        for (side, body) in [producer, consumer].into_iter().enumerate() {
            let Some((Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results }, pre)) = body.split_last()
            else {
                return contract("a specialized side that does not end in a loop");
            };
            self.body(pre)?;
            self.copy_all(phis, inits)?;
            // A ping-pong group's bounds are uniform within the group (read below).
            let bounds = match pingpong && side == 1 {
                true => (0, 0, 1),
                false => (self.uniform(*lo)?, self.uniform(*hi)?, self.uniform(*step)?),
            };
            if bounds.2 <= 0 {
                return fault(format!("loop step {} is not positive", bounds.2));
            }
            loops.push((*iv, bounds, (*lo, *hi, *step), phis, body, nexts, results));
        }
        let n = (consumer_warps * self.k.warp_size) as usize;
        let mut consumer_regs = self.regs.clone();
        for v in consumer_regs.iter_mut().flatten() {
            truncate_lanes(v, n);
        }
        let (iv, (lo, hi, step), _, phis, body, nexts, _) = loops[0];
        let side = Side { iv, at: lo, hi, step, phis: phis.clone(), body: body.clone(), nexts: nexts.clone() };
        let regs = std::mem::replace(&mut self.regs, consumer_regs);
        let lanes = std::mem::replace(&mut self.lanes, n);
        self.producer = Some(Pump { side, regs, lanes });
        let (iv, (lo, hi, step), bound_regs, phis, body, nexts, results) = loops[1];
        if pingpong {
            return self.pingpong(n, iv, bound_regs, (phis, body, nexts));
        }
        let mut at = lo;
        while at < hi && !self.exited {
            self.set(iv, Data::I(vec![at; self.lanes]));
            self.body(body)?;
            self.copy_all(phis, nexts)?;
            at += step;
        }
        self.producer_done("consumers")?;
        self.copy_all(results, phis)
    }

    /// The consumers of a ping-pong region (see [`Exec::specialized`]): `n` lanes in two
    /// groups, each running the loop `iv`, bounds `bounds` (registers, uniform within a group)
    /// and `(phis, body, nexts)` on its own lanes and registers, a whole iteration at a time in
    /// turn; then the producer's rest, and the consumers' registers as they were before.
    fn pingpong(
        &mut self,
        n: usize,
        iv: Reg,
        (lo, hi, step): (Reg, Reg, Reg),
        (phis, body, nexts): (&[Reg], &[Inst], &[Reg]),
    ) -> Result<(), Fault> {
        let per = n / 2;
        let before = self.regs.clone();
        let mut groups = Vec::new();
        for g in 0..2 {
            let regs: Vec<Option<Val>> =
                before.iter().map(|v| v.as_ref().map(|v| slice_lanes(v, g * per..(g + 1) * per))).collect();
            groups.push((regs, 0i64, 0i64, 1i64));
        }
        let lanes = std::mem::replace(&mut self.lanes, per);
        let run = |me: &mut Self, groups: &mut Vec<(Vec<Option<Val>>, i64, i64, i64)>| -> Result<(), Fault> {
            for (g, group) in groups.iter_mut().enumerate() {
                std::mem::swap(&mut me.regs, &mut group.0);
                me.lane_base = g * per;
                let b = (me.uniform(lo), me.uniform(hi), me.uniform(step));
                std::mem::swap(&mut me.regs, &mut group.0);
                let (lo, hi, step) = (b.0?, b.1?, b.2?);
                if step <= 0 {
                    return fault(format!("loop step {step} is not positive"));
                }
                (group.1, group.2, group.3) = (lo, hi, step);
            }
            loop {
                let mut ran = false;
                for (g, group) in groups.iter_mut().enumerate() {
                    if group.1 >= group.2 || me.exited {
                        continue;
                    }
                    std::mem::swap(&mut me.regs, &mut group.0);
                    me.lane_base = g * per;
                    me.set(iv, Data::I(vec![group.1; per]));
                    let r = me.body(body).and_then(|_| me.copy_all(phis, nexts));
                    std::mem::swap(&mut me.regs, &mut group.0);
                    r?;
                    group.1 += group.3;
                    ran = true;
                }
                if !ran {
                    return Ok(());
                }
            }
        };
        let r = run(self, &mut groups);
        self.lane_base = 0;
        self.lanes = lanes;
        self.regs = before;
        r?;
        self.producer_done("consumer groups")
    }

    /// What the producer has left once the `consumers` finished: nothing, when every copy it
    /// made was consumed; else the deadlock, with where the producer waits.
    fn producer_done(&mut self, consumers: &str) -> Result<(), Fault> {
        self.pump()?;
        let left = self.producer.take().filter(|p| p.side.at < p.side.hi);
        if let Some(p) = left {
            return fault(format!(
                "warp-specialized loops deadlock: the {consumers} finished, the producer waits at iteration value {}",
                p.side.at
            ));
        }
        Ok(())
    }

    pub(super) fn copy_all(&mut self, dsts: &[Reg], srcs: &[Reg]) -> Result<(), Fault> {
        let vals: Vec<Val> = srcs.iter().map(|s| self.get(*s)).collect::<Result<_, _>>()?;
        for (d, v) in dsts.iter().zip(vals) {
            self.regs[d.0 as usize] = Some(v);
        }
        Ok(())
    }
}
