//! PTX for global and shared memory: loads and stores (scalar, vector, predicated), alignment
//! tests, `cp.async`.

use super::*;

impl Writer<'_> {
    pub(super) fn memory(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::Load { dst, addr, pred, other } => {
                if let Some(o) = other {
                    self.mov(*dst, *o);
                }
                let a = self.n(*addr).to_string();
                self.load_line("global", *dst, &a, *pred);
            }
            Inst::VLoad { dsts, addr, pred, others } => {
                for (d, o) in dsts.iter().zip(others) {
                    self.mov(*d, *o);
                }
                let a = self.n(*addr).to_string();
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                // A predicated load keeps the others where it does not run: packed too.
                let (ty, names) = self.vector_operands(dsts, pred.is_some())?;
                line!(self, "{guard}ld.global.v{}.{ty} {{{}}}, [{a}]", names.len(), names.join(", "));
                self.unpack(dsts, &names);
            }
            Inst::VStore { addr, values, pred } => {
                let a = self.n(*addr).to_string();
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                let (ty, names) = self.vector_operands(values, true)?;
                line!(self, "{guard}st.global.v{}.{ty} [{a}], {{{}}}", names.len(), names.join(", "));
            }
            Inst::IsAligned { dst, addr, bytes } => {
                let (d, a) = (self.n(*dst).to_string(), self.n(*addr).to_string());
                let t = self.temp(Class::Rd);
                line!(self, "and.b64 {t}, {a}, {}", bytes - 1);
                line!(self, "setp.eq.u64 {d}, {t}, 0");
            }
            Inst::AsyncCopy { offset, addr, bytes, pred, zero_fill } => {
                let saddr = self.shared_addr(*offset)?;
                let (a, p) = (self.n(*addr).to_string(), self.n(*pred).to_string());
                let cache = if *bytes == 16 { "cg" } else { "ca" };
                if *zero_fill {
                    // A source size of 0 reads nothing and fills the destination with zeros.
                    let n = self.temp(Class::R);
                    line!(self, "selp.u32 {n}, {bytes}, 0, {p}");
                    line!(self, "cp.async.{cache}.shared.global [{saddr}], [{a}], {bytes}, {n}");
                } else {
                    line!(self, "@{p} cp.async.{cache}.shared.global [{saddr}], [{a}], {bytes}");
                }
            }
            Inst::AsyncCommit => self.line("cp.async.commit_group".into()),
            Inst::AsyncWait { pending } => line!(self, "cp.async.wait_group {pending}"),
            Inst::SharedVLoad { dsts, offset } => {
                let addr = self.shared_addr(*offset)?;
                let (ty, names) = self.vector_operands(dsts, false)?;
                line!(self, "ld.shared.v{}.{ty} {{{}}}, [{addr}]", names.len(), names.join(", "));
                self.unpack(dsts, &names);
            }
            Inst::SharedStore { offset, value, pred } => {
                let addr = self.shared_addr(*offset)?;
                self.store_line("shared", &addr, *value, *pred);
            }
            Inst::SharedVStore { offset, values } => {
                let addr = self.shared_addr(*offset)?;
                let (ty, names) = self.vector_operands(values, true)?;
                line!(self, "st.shared.v{}.{ty} [{addr}], {{{}}}", names.len(), names.join(", "));
            }
            Inst::SharedLoad { dst, offset } => {
                let addr = self.shared_addr(*offset)?;
                self.load_line("shared", *dst, &addr, None);
            }
            Inst::Store { addr, value, pred } => {
                let a = self.n(*addr).to_string();
                self.store_line("global", &a, *value, *pred);
            }
            _ => return Err(EmitError(format!("`{i:?}` is not a memory instruction"))),
        }
        Ok(())
    }

    /// The element type and operands of a vector access of `regs`: the registers themselves,
    /// or, for more than four elements (PTX vectors have at most four: eight 16-bit values
    /// are 16 bytes), 32-bit temporaries each holding two 16-bit values or four bytes, packed
    /// from the registers where `pack` (a store, or a predicated load keeping its others) and
    /// unpacked by [`Self::unpack`] after a load.
    fn vector_operands(&mut self, regs: &[Reg], pack: bool) -> Result<(&'static str, Vec<String>), EmitError> {
        let t = self.k.ty(regs[0]);
        if regs.len() <= 4 {
            return Ok((vec_type(t), regs.iter().map(|r| self.n(*r).to_string()).collect()));
        }
        let per_word = match (regs.len(), t) {
            (8, _) if class(t) == Class::H => 2,
            (8 | 16, SType::Int { bits: 8, .. }) => 4,
            _ => {
                return Err(EmitError(format!("a vector access of {} values of {t:?} (16 bytes at most)", regs.len())))
            }
        };
        let mut words = Vec::with_capacity(regs.len() / per_word);
        for group in regs.chunks(per_word) {
            let w = self.temp(Class::R).to_string();
            if pack {
                let r: Vec<String> = group.iter().map(|r| self.n(*r).to_string()).collect();
                if per_word == 2 {
                    line!(self, "mov.b32 {w}, {{{}, {}}}", r[0], r[1]);
                } else {
                    // Bytes 0 and 1 from the first two registers, 2 and 3 from the last two.
                    let (lo, hi) = (self.temp(Class::R), self.temp(Class::R));
                    line!(self, "prmt.b32 {lo}, {}, {}, 0x0040", r[0], r[1]);
                    line!(self, "prmt.b32 {hi}, {}, {}, 0x0040", r[2], r[3]);
                    line!(self, "prmt.b32 {w}, {lo}, {hi}, 0x5410");
                }
            }
            words.push(w);
        }
        Ok(("b32", words))
    }

    /// After a load into `words` ([`Self::vector_operands`]), the values into `regs`.
    fn unpack(&mut self, regs: &[Reg], words: &[String]) {
        if regs.len() <= 4 {
            return;
        }
        let t = self.k.ty(regs[0]);
        if let SType::Int { bits: 8, signed } = t {
            // Each byte extended into its register, as a scalar `ld.u8` / `ld.s8` does.
            let ext = if signed { "s32" } else { "u32" };
            for (group, w) in regs.chunks(4).zip(words) {
                for (i, r) in group.iter().enumerate() {
                    let r = self.n(*r).to_string();
                    line!(self, "bfe.{ext} {r}, {w}, {}, 8", 8 * i);
                }
            }
            return;
        }
        for (pair, w) in regs.chunks(2).zip(words) {
            let (lo, hi) = (self.n(pair[0]), self.n(pair[1]));
            line!(self, "mov.b32 {{{lo}, {hi}}}, {w}");
        }
    }

    /// `ld.<space>` of `dst`'s type from `addr` where `pred` holds; predicates travel as a byte
    /// (a guarded-off predicate load reads false).
    pub(super) fn load_line(&mut self, space: &str, dst: Reg, addr: &dyn std::fmt::Display, pred: Option<Reg>) {
        let t = self.k.ty(dst);
        let d = self.n(dst).to_string();
        let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
        if t == SType::Pred {
            // A guarded-off lane keeps what `dst` held (the load's `other`, moved in first).
            let r = self.temp(Class::R);
            match pred {
                Some(_) => line!(self, "selp.u32 {r}, 1, 0, {d}"),
                None => line!(self, "mov.b32 {r}, 0"),
            }
            line!(self, "{guard}ld.{space}.u8 {r}, [{addr}]");
            line!(self, "setp.ne.u32 {d}, {r}, 0");
        } else {
            line!(self, "{guard}ld.{space}.{} {d}, [{addr}]", mem(t));
        }
    }

    /// `st.<space>` of `value` at `addr` where `pred` holds; predicates travel as a byte.
    pub(super) fn store_line(&mut self, space: &str, addr: &dyn std::fmt::Display, value: Reg, pred: Option<Reg>) {
        let t = self.k.ty(value);
        let v = self.n(value).to_string();
        let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
        if t == SType::Pred {
            let r = self.temp(Class::R);
            line!(self, "selp.u32 {r}, 1, 0, {v}");
            line!(self, "{guard}st.{space}.u8 [{addr}], {r}");
        } else {
            line!(self, "{guard}st.{space}.{} [{addr}], {v}", mem(t));
        }
    }
}
