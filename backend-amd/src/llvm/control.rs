//! LLVM IR for structured control flow: loops and whiles as `phi`s of structured blocks, ifs,
//! exit, source locations.

use super::*;

impl Writer<'_> {
    pub(super) fn control(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::Specialized { .. } => return err("`wgmma`, TMA, mbarriers and their fences are Hopper's (sm_90a)"),
            Inst::Exit => {
                self.line("ret void");
                let dead = self.label("after_exit");
                self.start(&dead);
            }
            Inst::Origin { .. } => {}
            Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results } => {
                let (head, bl, exit) = (self.label("loop"), self.label("body"), self.label("exit"));
                let from = self.block.clone();
                self.line(format!("br label %{head}"));
                self.start(&head);
                let it = ty(self.t(*iv));
                let ivn = format!("%r{}", iv.0);
                let next_iv = format!("%r{}_next", iv.0);
                // Phi names are fixed now; their latch values are known after the body.
                let mark = self.out.len();
                let phi_names = self.carried(phis);
                self.names[iv.0 as usize] = ivn.clone();
                let (lo_n, hi_n, st_n) = (self.n(*lo), self.n(*hi), self.n(*step));
                let inits_n: Vec<String> = inits.iter().map(|r| self.n(*r)).collect();
                let c = self.fresh();
                self.line(format!("{c} = icmp slt {it} {ivn}, {hi_n}"));
                self.line(format!("br i1 {c}, label %{bl}, label %{exit}"));
                self.start(&bl);
                self.insts(body)?;
                let nexts_n: Vec<String> = nexts.iter().map(|r| self.n(*r)).collect();
                self.line(format!("{next_iv} = add {it} {ivn}, {st_n}"));
                let latch = self.block.clone();
                self.line(format!("br label %{head}"));
                let iv_phi = format!("  {ivn} = phi {it} [ {lo_n}, %{from} ], [ {next_iv}, %{latch} ]\n");
                let edges = Edges { mark, from: &from, latch: &latch, inits: &inits_n, nexts: &nexts_n };
                self.close_loop(iv_phi, phis, &phi_names, edges, &exit, results);
            }
            Inst::If { cond, then_body, then_yields, else_body, else_yields, results } => {
                let (th, el, join) = (self.label("then"), self.label("else"), self.label("endif"));
                let c = self.n(*cond);
                self.line(format!("br i1 {c}, label %{th}, label %{el}"));
                self.start(&th);
                self.insts(then_body)?;
                let ty_n: Vec<String> = then_yields.iter().map(|r| self.n(*r)).collect();
                let th_end = self.block.clone();
                self.line(format!("br label %{join}"));
                self.start(&el);
                self.insts(else_body)?;
                let ey_n: Vec<String> = else_yields.iter().map(|r| self.n(*r)).collect();
                let el_end = self.block.clone();
                self.line(format!("br label %{join}"));
                self.start(&join);
                for ((r, a), b) in results.iter().zip(ty_n).zip(ey_n) {
                    let t = ty(self.t(*r));
                    self.def(*r, format!("phi {t} [ {a}, %{th_end} ], [ {b}, %{el_end} ]"));
                }
            }
            Inst::While { phis, inits, cond_body, cond, body, nexts, results } => {
                let (head, bl, exit) = (self.label("while"), self.label("wbody"), self.label("wexit"));
                let from = self.block.clone();
                let inits_n: Vec<String> = inits.iter().map(|r| self.n(*r)).collect();
                self.line(format!("br label %{head}"));
                self.start(&head);
                let mark = self.out.len();
                let phi_names = self.carried(phis);
                self.insts(cond_body)?;
                let c = self.n(*cond);
                self.line(format!("br i1 {c}, label %{bl}, label %{exit}"));
                self.start(&bl);
                self.insts(body)?;
                let nexts_n: Vec<String> = nexts.iter().map(|r| self.n(*r)).collect();
                let latch = self.block.clone();
                self.line(format!("br label %{head}"));
                let edges = Edges { mark, from: &from, latch: &latch, inits: &inits_n, nexts: &nexts_n };
                self.close_loop(String::new(), phis, &phi_names, edges, &exit, results);
            }
            _ => return Err(EmitError(format!("`{i:?}` is not a control instruction"))),
        }
        Ok(())
    }

    /// Names the loop-carried registers after their `phi` nodes (written by `close_loop` once
    /// the latch is known).
    pub(super) fn carried(&mut self, phis: &[Reg]) -> Vec<String> {
        phis.iter()
            .map(|p| {
                let name = format!("%r{}", p.0);
                self.names[p.0 as usize] = name.clone();
                name
            })
            .collect()
    }

    /// Writes a loop header's `phi` nodes (after `first`, the induction variable's, if any) at
    /// `edges.mark`, opens the exit block, and names the loop's results after the phis.
    pub(super) fn close_loop(
        &mut self,
        first: String,
        phis: &[Reg],
        names: &[String],
        edges: Edges,
        exit: &str,
        results: &[Reg],
    ) {
        let mut text = first;
        for ((p, name), (i, n)) in phis.iter().zip(names).zip(edges.inits.iter().zip(edges.nexts)) {
            let t = ty(self.t(*p));
            let _ = writeln!(text, "  {name} = phi {t} [ {i}, %{} ], [ {n}, %{} ]", edges.from, edges.latch);
        }
        self.out.insert_str(edges.mark, &text);
        self.start(exit);
        for (r, name) in results.iter().zip(names) {
            self.names[r.0 as usize] = name.clone();
        }
    }
}
