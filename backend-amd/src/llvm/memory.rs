//! LLVM IR for global and shared (LDS) memory: loads and stores (scalar, vector, predicated),
//! alignment tests; asynchronous copies are refused (the targets have none the lowering uses).

use super::*;

impl Writer<'_> {
    pub(super) fn memory(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::Load { dst, addr, pred, other } => {
                let t = self.t(*dst);
                let a = self.n(*addr);
                let other = other.map(|o| self.n(o)).unwrap_or_else(|| self.zero(t));
                self.guarded(*pred, Some((*dst, other)), |w| {
                    let v = w.fresh();
                    w.line(format!("{v} = load {}, ptr addrspace(1) {a}, align {}", mem_ty(t), size(t)));
                    Ok(Some(w.widen_loaded(t, v)))
                })?;
            }
            Inst::Store { addr, value, pred } => {
                let t = self.t(*value);
                let (a, v) = (self.n(*addr), self.n(*value));
                self.guarded(*pred, None, |w| {
                    let v = w.narrow_stored(t, v);
                    w.line(format!("store {} {v}, ptr addrspace(1) {a}, align {}", mem_ty(t), size(t)));
                    Ok(None)
                })?;
            }
            Inst::VLoad { dsts, addr, pred, others } => self.vload(dsts, *addr, *pred, others, 1)?,
            Inst::VStore { addr, values, pred } => self.vstore(*addr, values, *pred, 1)?,
            Inst::SharedVLoad { dsts, offset } => self.vload(dsts, *offset, None, &[], 3)?,
            Inst::SharedVStore { offset, values } => self.vstore(*offset, values, None, 3)?,
            Inst::IsAligned { dst, addr, bytes } => {
                let a = self.n(*addr);
                let i = self.fresh();
                self.line(format!("{i} = ptrtoint ptr addrspace(1) {a} to i64"));
                let m = self.fresh();
                self.line(format!("{m} = and i64 {i}, {}", bytes - 1));
                self.def(*dst, format!("icmp eq i64 {m}, 0"));
            }
            Inst::SharedStore { offset, value, pred } => {
                let t = self.t(*value);
                let (o, v) = (self.n(*offset), self.n(*value));
                self.guarded(*pred, None, |w| {
                    let p = w.gep("@lds", 3, &o, "i32");
                    let v = w.narrow_stored(t, v);
                    w.line(format!("store {} {v}, ptr addrspace(3) {p}, align {}", mem_ty(t), size(t)));
                    Ok(None)
                })?;
            }
            Inst::SharedLoad { dst, offset } => {
                let t = self.t(*dst);
                let o = self.n(*offset);
                let p = self.gep("@lds", 3, &o, "i32");
                let v = self.fresh();
                self.line(format!("{v} = load {}, ptr addrspace(3) {p}, align {}", mem_ty(t), size(t)));
                let v = self.widen_loaded(t, v);
                self.alias(*dst, v);
            }
            Inst::AsyncCopy { .. } | Inst::AsyncCommit | Inst::AsyncWait { .. } => {
                return err("asynchronous copies: gfx90a/gfx942 have none the lowering uses")
            }
            _ => return Err(EmitError(format!("`{i:?}` is not a memory instruction"))),
        }
        Ok(())
    }

    pub(super) fn vload(
        &mut self,
        dsts: &[Reg],
        addr: Reg,
        pred: Option<Reg>,
        others: &[Reg],
        space: u32,
    ) -> Result<(), EmitError> {
        let t = self.t(dsts[0]);
        let n = dsts.len();
        let a = self.n(addr);
        let vt = format!("<{n} x {}>", mem_ty(t));
        let align = size(t) * n as u32;
        // Loaded as a vector, split into registers; masked-off lanes take `others`.
        let (then, join, from) = (self.label("vthen"), self.label("vjoin"), self.block.clone());
        if let Some(p) = pred {
            let pn = self.n(p);
            self.line(format!("br i1 {pn}, label %{then}, label %{join}"));
            self.start(&then);
        }
        let p = if space == 3 { self.gep("@lds", 3, &a, "i32") } else { a };
        let v = self.fresh();
        self.line(format!("{v} = load {vt}, ptr addrspace({space}) {p}, align {align}"));
        let mut parts = Vec::new();
        for j in 0..n {
            let e = self.fresh();
            self.line(format!("{e} = extractelement {vt} {v}, i32 {j}"));
            parts.push(self.widen_loaded(t, e));
        }
        if pred.is_some() {
            let then_end = self.block.clone();
            self.line(format!("br label %{join}"));
            self.start(&join);
            for (j, d) in dsts.iter().enumerate() {
                let other = others.get(j).map(|o| self.n(*o)).unwrap_or_else(|| self.zero(t));
                let tt = ty(t);
                self.def(*d, format!("phi {tt} [ {}, %{then_end} ], [ {other}, %{from} ]", parts[j]));
            }
        } else {
            for (d, v) in dsts.iter().zip(parts) {
                self.alias(*d, v);
            }
        }
        Ok(())
    }

    pub(super) fn vstore(&mut self, addr: Reg, values: &[Reg], pred: Option<Reg>, space: u32) -> Result<(), EmitError> {
        let t = self.t(values[0]);
        let n = values.len();
        let a = self.n(addr);
        let vt = format!("<{n} x {}>", mem_ty(t));
        let align = size(t) * n as u32;
        let vals: Vec<String> = values.iter().map(|v| self.n(*v)).collect();
        self.guarded(pred, None, |w| {
            let mut acc = "poison".to_string();
            for (j, v) in vals.iter().enumerate() {
                let v = w.narrow_stored(t, v.clone());
                let x = w.fresh();
                w.line(format!("{x} = insertelement {vt} {acc}, {} {v}, i32 {j}", mem_ty(t)));
                acc = x;
            }
            let p = if space == 3 { w.gep("@lds", 3, &a, "i32") } else { a };
            w.line(format!("store {vt} {acc}, ptr addrspace({space}) {p}, align {align}"));
            Ok(None)
        })
    }
}
