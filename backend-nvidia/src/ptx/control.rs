//! PTX for structured control flow: loops, ifs, whiles, warp-specialized regions, exit,
//! source locations.

use super::*;

impl Writer<'_> {
    pub(super) fn control(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::Specialized { consumer_warps, producer, consumer, pingpong, regs } => {
                // The producer warps run their side and leave; barriers from here on are the
                // consumers' own (barrier 1 with their count), the producers having exited.
                let threads = consumer_warps * self.k.warp_size;
                let (l, t, p) = (self.label(), self.temp(Class::R), self.temp(Class::P));
                line!(self, "mov.u32 {t}, %tid.x");
                line!(self, "setp.lt.u32 {p}, {t}, {threads}");
                // Whole warps go one way: uniform within each warp.
                line!(self, "@{p} bra.uni $L{l}_consumer");
                if let Some(r) = regs {
                    // The whole producer warpgroup gives its registers back (`setmaxnreg` is
                    // warpgroup-wide), then all but its first warp leave.
                    let q = self.temp(Class::P);
                    line!(self, "setmaxnreg.dec.sync.aligned.u32 {}", r.producer);
                    line!(self, "setp.ge.u32 {q}, {t}, {}", threads + self.k.warp_size);
                    line!(self, "@{q} bra.uni $EXIT");
                }
                self.insts(producer)?;
                self.line("bra.uni $EXIT".into());
                self.body.push_str(&format!("$L{l}_consumer:\n"));
                if let Some(r) = regs {
                    line!(self, "setmaxnreg.inc.sync.aligned.u32 {}", r.consumer);
                }
                // Barriers in the consumers' side (a persistent loop's epilogue) are theirs too;
                // with ping-pong, each group's own.
                self.consumers = Some(threads);
                if let Some(g) = pingpong {
                    let id = self.temp(Class::R);
                    let g = self.n(*g).to_string();
                    line!(self, "add.u32 {id}, {g}, 2");
                    self.group_barrier = Some((id, threads / 2));
                }
                self.insts(consumer)?;
                self.group_barrier = None;
            }
            Inst::Exit => self.line("bra.uni $EXIT".into()),
            // Line information: compute-sanitizer and debuggers report the tile-IR line.
            Inst::Origin { loc: Some(l), .. } => self.body.push_str(&format!("  .loc 1 {} {}\n", l.line, l.col)),
            Inst::Origin { loc: None, .. } => {}
            Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results } => {
                let l = self.label();
                self.movs(phis, inits);
                self.mov(*iv, *lo);
                let t = arith(self.k.ty(*iv));
                let p = self.temp(Class::P);
                let (ivn, hin, stn) = (self.n(*iv).to_string(), self.n(*hi).to_string(), self.n(*step).to_string());
                self.body.push_str(&format!("$L{l}_head:\n"));
                line!(self, "setp.ge.{t} {p}, {ivn}, {hin}");
                // The bounds are uniform (as `If`'s condition).
                line!(self, "@{p} bra.uni $L{l}_end");
                self.insts(body)?;
                self.parallel_movs(phis, nexts);
                line!(self, "add.{t} {ivn}, {ivn}, {stn}");
                line!(self, "bra.uni $L{l}_head");
                self.body.push_str(&format!("$L{l}_end:\n"));
                self.movs(results, phis);
            }
            Inst::If { cond, then_body, then_yields, else_body, else_yields, results } => {
                let l = self.label();
                let c = self.n(*cond).to_string();
                // `If` is uniform (the SIMT IR's contract): `bra.uni` tells ptxas, which
                // otherwise treats a `wgmma` wait inside as divergent and serializes every
                // `wgmma` of the kernel (C7518).
                line!(self, "@!{c} bra.uni $L{l}_else");
                self.insts(then_body)?;
                self.movs(results, then_yields);
                line!(self, "bra.uni $L{l}_end");
                self.body.push_str(&format!("$L{l}_else:\n"));
                self.insts(else_body)?;
                self.movs(results, else_yields);
                self.body.push_str(&format!("$L{l}_end:\n"));
            }
            Inst::While { phis, inits, cond_body, cond, body, nexts, results } => {
                let l = self.label();
                self.movs(phis, inits);
                self.body.push_str(&format!("$L{l}_head:\n"));
                self.insts(cond_body)?;
                let c = self.n(*cond).to_string();
                line!(self, "@!{c} bra $L{l}_end");
                self.insts(body)?;
                self.parallel_movs(phis, nexts);
                line!(self, "bra.uni $L{l}_head");
                self.body.push_str(&format!("$L{l}_end:\n"));
                self.movs(results, phis);
            }
            _ => return Err(EmitError(format!("`{i:?}` is not a control instruction"))),
        }
        Ok(())
    }
}
