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
                let t = self.k.ty(dsts[0]);
                for (d, o) in dsts.iter().zip(others) {
                    self.mov(*d, *o);
                }
                let names: Vec<String> = dsts.iter().map(|d| self.n(*d).to_string()).collect();
                let a = self.n(*addr).to_string();
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                line!(self, "{guard}ld.global.v{}.{} {{{}}}, [{a}]", dsts.len(), vec_type(t), names.join(", "));
            }
            Inst::VStore { addr, values, pred } => {
                let t = self.k.ty(values[0]);
                let names: Vec<String> = values.iter().map(|v| self.n(*v).to_string()).collect();
                let a = self.n(*addr).to_string();
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                line!(self, "{guard}st.global.v{}.{} [{a}], {{{}}}", values.len(), vec_type(t), names.join(", "));
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
                let t = self.k.ty(dsts[0]);
                let addr = self.shared_addr(*offset)?;
                let names: Vec<String> = dsts.iter().map(|d| self.n(*d).to_string()).collect();
                line!(self, "ld.shared.v{}.{} {{{}}}, [{addr}]", dsts.len(), vec_type(t), names.join(", "));
            }
            Inst::SharedStore { offset, value, pred } => {
                let addr = self.shared_addr(*offset)?;
                self.store_line("shared", &addr, *value, *pred);
            }
            Inst::SharedVStore { offset, values } => {
                let t = self.k.ty(values[0]);
                let addr = self.shared_addr(*offset)?;
                let names: Vec<String> = values.iter().map(|v| self.n(*v).to_string()).collect();
                line!(self, "st.shared.v{}.{} [{addr}], {{{}}}", values.len(), vec_type(t), names.join(", "));
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
