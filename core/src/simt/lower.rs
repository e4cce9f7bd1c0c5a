//! Layout assignment and lowering of the tile IR to the SIMT IR.
//!
//! Layout (first slice): a 1-D tile of `N` elements is distributed blocked over the `T` threads
//! of a program, `ept = max(1, N / T)` elements per thread, `spt = min(ept, 4)` of them
//! contiguous (so that loads can become vector loads), the next group `T * spt` elements
//! further. When `N < T`, threads `t >= N` hold a copy of element `t mod N` (replication);
//! duplicated stores write equal values, which is benign. Scalars are one uniform register.

use super::{Inst, Kernel, Reg, SType, Special};
use crate::ir::*;
use std::collections::HashMap;

/// Why a function cannot be lowered (yet): the op and where it is.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LowerError {
    #[error("`{op}`{}: not supported by the SIMT lowering yet: {reason}", loc.map(|l| format!(" (line {}:{})", l.line, l.col)).unwrap_or_default())]
    Unsupported { op: String, loc: Option<Loc>, reason: String },
}

/// Target parameters of the lowering.
#[derive(Clone, Copy, Debug)]
pub struct LowerOptions {
    /// 32 on NVIDIA, 64 on AMD CDNA.
    pub warp_size: u32,
}

/// How a value's elements are held by each thread.
#[derive(Clone, Debug)]
struct Held {
    regs: Vec<Reg>,
}

struct Lowering<'f> {
    func: &'f Function,
    k: Kernel,
    vals: HashMap<Value, Held>,
    tid: Reg,
}

/// Lowers a verified function.
pub fn lower(func: &Function, opts: LowerOptions) -> Result<Kernel, LowerError> {
    let params = func
        .params
        .iter()
        .map(|p| {
            let t = func.ty(p.value);
            let st = match t.elem {
                Elem::Ptr(_) => SType::Ptr,
                Elem::Num(d) => SType::of(d),
                Elem::Token => SType::Int { bits: 64, signed: false },
            };
            (p.name.clone(), st)
        })
        .collect();
    let k = Kernel {
        name: func.name.clone(),
        params,
        regs: Vec::new(),
        body: Vec::new(),
        warps: func.attrs.warps,
        warp_size: opts.warp_size,
    };
    let mut l = Lowering { func, k, vals: HashMap::new(), tid: Reg(0) };
    l.tid = l.reg(SType::Int { bits: 32, signed: true });
    l.k.body.push(Inst::Special { dst: l.tid, which: Special::ThreadId });
    for (i, p) in func.params.iter().enumerate() {
        let st = l.k.params[i].1;
        let r = l.reg(st);
        l.k.body.push(Inst::Param { dst: r, index: i as u32 });
        l.vals.insert(p.value, Held { regs: vec![r] });
    }
    l.block(func.body)?;
    Ok(l.k)
}

fn stype(t: &Type) -> SType {
    match t.elem {
        Elem::Ptr(_) => SType::Ptr,
        Elem::Num(d) => SType::of(d),
        Elem::Token => SType::Int { bits: 64, signed: false },
    }
}

impl Lowering<'_> {
    fn reg(&mut self, t: SType) -> Reg {
        self.k.regs.push(t);
        Reg(self.k.regs.len() as u32 - 1)
    }

    fn threads(&self) -> u32 {
        self.k.threads()
    }

    /// Elements per thread and contiguous elements per thread of a tile shape.
    fn split(&self, shape: &[u32]) -> (u32, u32) {
        let n: u32 = shape.iter().product();
        let ept = (n / self.threads()).max(1);
        (ept, ept.min(4))
    }

    fn held(&self, v: Value) -> &Held {
        &self.vals[&v]
    }

    fn unsupported<T>(&self, op: Op, reason: &str) -> Result<T, LowerError> {
        let d = &self.func.ops[op];
        Err(LowerError::Unsupported { op: d.kind.mnemonic().to_string(), loc: d.loc, reason: reason.to_string() })
    }

    fn block(&mut self, b: Block) -> Result<(), LowerError> {
        for &op in &self.func.blocks[b].ops {
            self.op(op)?;
        }
        Ok(())
    }

    /// Applies `f` to every slot of the operands (scalars broadcast), producing registers of `rt`.
    fn map(&mut self, operands: &[Value], rt: SType, f: impl Fn(Reg, &[Reg]) -> Inst) -> Held {
        let slots = operands.iter().map(|v| self.held(*v).regs.len()).max().unwrap_or(1);
        let mut regs = Vec::with_capacity(slots);
        for s in 0..slots {
            let srcs: Vec<Reg> = operands
                .iter()
                .map(|v| {
                    let h = &self.held(*v).regs;
                    h[s.min(h.len() - 1)]
                })
                .collect();
            let dst = self.reg(rt);
            self.k.body.push(f(dst, &srcs));
            regs.push(dst);
        }
        Held { regs }
    }

    fn op(&mut self, op: Op) -> Result<(), LowerError> {
        let data = &self.func.ops[op];
        let rt = data.results.first().map(|r| self.func.ty(*r).clone());
        if let Some(t) = &rt {
            if t.shape.len() > 1 {
                return self.unsupported(op, "tiles of more than one dimension need 2-D layouts");
            }
        }
        let st = rt.as_ref().map(stype);
        let held =
            match &data.kind {
                OpKind::Const(lit) => {
                    let dst = self.reg(st.unwrap_or(SType::F32));
                    self.k.body.push(Inst::Const { dst, value: *lit });
                    Held { regs: vec![dst] }
                }
                OpKind::ProgramId(a) | OpKind::NumPrograms(a) => {
                    let dst = self.reg(SType::Int { bits: 32, signed: true });
                    let which = if matches!(data.kind, OpKind::ProgramId(_)) {
                        Special::ProgramId(*a)
                    } else {
                        Special::NumPrograms(*a)
                    };
                    self.k.body.push(Inst::Special { dst, which });
                    Held { regs: vec![dst] }
                }
                OpKind::Arange { start, end } => {
                    let n = (end - start) as u32;
                    let (ept, spt) = self.split(&[n]);
                    let i32t = SType::Int { bits: 32, signed: true };
                    let c = |l: &mut Self, v: i64| {
                        let r = l.reg(i32t);
                        l.k.body.push(Inst::Const { dst: r, value: Literal::Int(v) });
                        r
                    };
                    let spt_r = c(self, spt as i64);
                    let base = self.reg(i32t);
                    self.k.body.push(Inst::Binary { dst: base, op: BinaryOp::Mul, a: self.tid, b: spt_r });
                    let wrap = if n < self.threads() * spt { Some(c(self, n as i64 - 1)) } else { None };
                    let mut regs = Vec::new();
                    for j in 0..ept {
                        let off = c(self, ((j / spt) * self.threads() * spt + j % spt) as i64);
                        let mut e = self.reg(i32t);
                        self.k.body.push(Inst::Binary { dst: e, op: BinaryOp::Add, a: base, b: off });
                        if let Some(m) = wrap {
                            let w = self.reg(i32t);
                            self.k.body.push(Inst::Binary { dst: w, op: BinaryOp::And, a: e, b: m });
                            e = w;
                        }
                        if *start != 0 {
                            let s = c(self, *start);
                            let r = self.reg(i32t);
                            self.k.body.push(Inst::Binary { dst: r, op: BinaryOp::Add, a: e, b: s });
                            e = r;
                        }
                        regs.push(e);
                    }
                    Held { regs }
                }
                OpKind::Splat(x) => {
                    let n = rt.as_ref().map_or(1, |t| t.numel() as u32);
                    let (ept, _) = self.split(&[n]);
                    Held { regs: vec![self.held(*x).regs[0]; ept as usize] }
                }
                OpKind::Reshape(x) | OpKind::Broadcast(x)
                    if rt.as_ref().is_some_and(|t| t.shape == self.func.ty(*x).shape) =>
                {
                    self.held(*x).clone()
                }
                OpKind::Unary { op: u, x } => {
                    let u = *u;
                    self.map(&[*x], st.unwrap_or(SType::F32), |dst, s| Inst::Unary { dst, op: u, src: s[0] })
                }
                OpKind::Binary { op: b, lhs, rhs } => {
                    let b = *b;
                    self.map(&[*lhs, *rhs], st.unwrap_or(SType::F32), |dst, s| Inst::Binary {
                        dst,
                        op: b,
                        a: s[0],
                        b: s[1],
                    })
                }
                OpKind::Cmp { op: c, lhs, rhs } => {
                    let c = *c;
                    self.map(&[*lhs, *rhs], SType::Pred, |dst, s| Inst::Cmp { dst, op: c, a: s[0], b: s[1] })
                }
                OpKind::Select { cond, on_true, on_false } => {
                    self.map(&[*cond, *on_true, *on_false], st.unwrap_or(SType::F32), |dst, s| Inst::Select {
                        dst,
                        cond: s[0],
                        on_true: s[1],
                        on_false: s[2],
                    })
                }
                OpKind::Cast(x) => self.map(&[*x], st.unwrap_or(SType::F32), |dst, s| Inst::Cast { dst, src: s[0] }),
                OpKind::AddPtr { ptr, offset } => {
                    let scale = self.func.ty(*ptr).elem.pointee().map_or(1, |d| d.size_bytes());
                    self.map(&[*ptr, *offset], SType::Ptr, |dst, s| Inst::AddrOffset {
                        dst,
                        base: s[0],
                        offset: s[1],
                        scale,
                    })
                }
                OpKind::Load { ptr, mask, other } => {
                    let mut ops = vec![*ptr];
                    ops.extend(mask);
                    ops.extend(other);
                    let (has_mask, has_other) = (mask.is_some(), other.is_some());
                    self.map(&ops, st.unwrap_or(SType::F32), |dst, s| Inst::Load {
                        dst,
                        addr: s[0],
                        pred: has_mask.then(|| s[1]),
                        other: has_other.then(|| s[if has_mask { 2 } else { 1 }]),
                    })
                }
                OpKind::Store { ptr, value, mask } => {
                    let mut ops = vec![*ptr, *value];
                    ops.extend(mask);
                    let slots = ops.iter().map(|v| self.held(*v).regs.len()).max().unwrap_or(1);
                    for s in 0..slots {
                        let pick = |v: &Value| {
                            let h = &self.vals[v].regs;
                            h[s.min(h.len() - 1)]
                        };
                        let inst = Inst::Store { addr: pick(ptr), value: pick(value), pred: mask.as_ref().map(pick) };
                        self.k.body.push(inst);
                    }
                    return Ok(());
                }
                _ => return self.unsupported(
                    op,
                    "this op is lowered in a later slice (shared memory, shuffles, control flow, MMA, communication)",
                ),
            };
        if let Some(r) = data.results.first() {
            self.vals.insert(*r, held);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::KernelBuilder;

    #[test]
    fn vector_add_lowers_and_dot_is_reported() {
        let b = KernelBuilder::new("add", LaunchAttrs::default());
        let (x, out) = (b.arg_ptr("x", DType::F32), b.arg_ptr("out", DType::F32));
        let offs = b.program_id_x() * 256 + b.arange(0, 256);
        let v = b.load(x + offs, Some(offs.lt(1000)), None);
        b.store(out + offs, v * 2.0f32, Some(offs.lt(1000)));
        let f = b.finish().unwrap();
        let k = lower(&f, LowerOptions { warp_size: 32 }).unwrap();
        // 256 elements over 128 threads: two stores per thread.
        assert_eq!(k.body.iter().filter(|i| matches!(i, Inst::Store { .. })).count(), 2);
        let k64 = lower(&f, LowerOptions { warp_size: 64 }).unwrap();
        assert_eq!(k64.body.iter().filter(|i| matches!(i, Inst::Store { .. })).count(), 1);

        let b = KernelBuilder::new("mm", LaunchAttrs::default());
        let z = b.zeros(&[16, 16], DType::F32);
        let _ = b.dot(z, z, z, InputPrecision::Ieee);
        let e = lower(&b.finish().unwrap(), LowerOptions { warp_size: 32 }).unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
    }
}
