//! Layout assignment and lowering of the tile IR to the SIMT IR.
//!
//! Layout (current slice): every tile of `N` elements uses the *flat blocked* layout: its
//! row-major element index is distributed over the `T` threads of a program, `ept = max(1, N/T)`
//! elements per thread, `spt = min(ept, 4)` of them contiguous (future vector accesses), the next
//! group `T * spt` further on. When `N < T`, thread `t` holds element `t mod N` (replicas store
//! equal values, which is benign). Since every tile of a shape has the same layout, elementwise
//! ops and row-major reshapes need no data movement; broadcasts, transposes, reductions and `dot`
//! exchange elements through shared memory, bracketed by barriers. Scalars are one uniform
//! register, and `for`/`if`/`while` (whose conditions are scalars) are uniform control flow.

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

const I32: SType = SType::Int { bits: 32, signed: true };

/// Bytes a value of this type takes in shared memory.
pub fn shared_size(t: SType) -> u32 {
    match t {
        SType::Pred => 1,
        SType::Int { bits, .. } => (bits as u32 / 8).max(1),
        SType::F16 | SType::BF16 => 2,
        SType::F32 => 4,
        SType::F64 | SType::Ptr => 8,
    }
}

fn stype(t: &Type) -> SType {
    match t.elem {
        Elem::Ptr(_) => SType::Ptr,
        Elem::Num(d) => SType::of(d),
        Elem::Token => SType::Int { bits: 64, signed: false },
    }
}

fn log2(x: u32) -> i64 {
    x.trailing_zeros() as i64
}

struct Lowering<'f> {
    func: &'f Function,
    k: Kernel,
    cur: Vec<Inst>,
    vals: HashMap<Value, Vec<Reg>>,
    tid: Reg,
    shared: u32,
    /// Registers of the hidden parameters (`super::HIDDEN_PARAMS`).
    hidden: Vec<Reg>,
}

/// Lowers a verified function.
pub fn lower(func: &Function, opts: LowerOptions) -> Result<Kernel, LowerError> {
    let mut params: Vec<(String, SType)> =
        func.params.iter().map(|p| (p.name.clone(), stype(func.ty(p.value)))).collect();
    params.extend(super::HIDDEN_PARAMS.iter().map(|(n, t)| (n.to_string(), *t)));
    let k = Kernel {
        name: func.name.clone(),
        params,
        regs: Vec::new(),
        body: Vec::new(),
        warps: func.attrs.warps,
        warp_size: opts.warp_size,
        shared_bytes: 0,
    };
    let mut l = Lowering { func, k, cur: Vec::new(), vals: HashMap::new(), tid: Reg(0), shared: 0, hidden: Vec::new() };
    l.tid = l.reg(I32);
    l.emit(Inst::Special { dst: l.tid, which: Special::ThreadId });
    for (i, p) in func.params.iter().enumerate() {
        let r = l.reg(l.k.params[i].1);
        l.emit(Inst::Param { dst: r, index: i as u32 });
        l.vals.insert(p.value, vec![r]);
    }
    for i in func.params.len()..l.k.params.len() {
        let r = l.reg(l.k.params[i].1);
        l.emit(Inst::Param { dst: r, index: i as u32 });
        l.hidden.push(r);
    }
    l.block(func.body)?;
    l.k.body = std::mem::take(&mut l.cur);
    l.k.shared_bytes = l.shared;
    Ok(l.k)
}

impl Lowering<'_> {
    fn reg(&mut self, t: SType) -> Reg {
        self.k.regs.push(t);
        Reg(self.k.regs.len() as u32 - 1)
    }

    fn emit(&mut self, i: Inst) {
        self.cur.push(i);
    }

    fn threads(&self) -> u32 {
        self.k.threads()
    }

    /// Elements per thread and contiguous elements per thread for `n` elements.
    fn split(&self, n: u32) -> (u32, u32) {
        let ept = (n / self.threads()).max(1);
        (ept, ept.min(4))
    }

    fn iconst(&mut self, v: i64) -> Reg {
        let r = self.reg(I32);
        self.emit(Inst::Const { dst: r, value: Literal::Int(v) });
        r
    }

    fn bin(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        let t = self.k.ty(a);
        let r = self.reg(t);
        self.emit(Inst::Binary { dst: r, op, a, b });
        r
    }

    fn bin_c(&mut self, op: BinaryOp, a: Reg, c: i64) -> Reg {
        let b = self.iconst(c);
        self.bin(op, a, b)
    }

    fn cast(&mut self, r: Reg, t: SType) -> Reg {
        if self.k.ty(r) == t {
            return r;
        }
        let d = self.reg(t);
        self.emit(Inst::Cast { dst: d, src: r });
        d
    }

    /// The row-major index of the element in slot `j` of a tile of `n` elements.
    fn flat_index(&mut self, n: u32, j: u32) -> Reg {
        let (_, spt) = self.split(n);
        let base = self.bin_c(BinaryOp::Mul, self.tid, spt as i64);
        let mut e = self.bin_c(BinaryOp::Add, base, ((j / spt) * self.threads() * spt + j % spt) as i64);
        if n < self.threads() * spt {
            e = self.bin_c(BinaryOp::And, e, n as i64 - 1);
        }
        e
    }

    fn coords(&mut self, e: Reg, shape: &[u32]) -> Vec<Reg> {
        let mut out = Vec::with_capacity(shape.len());
        let mut stride: u32 = shape.iter().product();
        for &d in shape {
            stride /= d;
            let s = self.bin_c(BinaryOp::Shr, e, log2(stride));
            out.push(self.bin_c(BinaryOp::And, s, d as i64 - 1));
        }
        out
    }

    fn flatten(&mut self, coords: &[Reg], shape: &[u32]) -> Reg {
        let mut stride: u32 = shape.iter().product();
        let mut acc = self.iconst(0);
        for (c, &d) in coords.iter().zip(shape) {
            stride /= d;
            let s = self.bin_c(BinaryOp::Shl, *c, log2(stride));
            acc = self.bin(BinaryOp::Add, acc, s);
        }
        acc
    }

    /// Writes a tile's elements into shared memory at `base` (row-major), one slot at a time.
    fn stage_in_shared(&mut self, regs: &[Reg], n: u32, base: u32) {
        let size = shared_size(self.k.ty(regs[0]));
        self.shared = self.shared.max(base + n * size);
        for (j, &r) in regs.iter().enumerate() {
            let e = self.flat_index(n, j as u32);
            let off = self.bin_c(BinaryOp::Mul, e, size as i64);
            let off = self.bin_c(BinaryOp::Add, off, base as i64);
            self.emit(Inst::SharedStore { offset: off, value: r, pred: None });
        }
    }

    fn shared_load(&mut self, t: SType, flat: Reg, base: u32) -> Reg {
        let off = self.bin_c(BinaryOp::Mul, flat, shared_size(t) as i64);
        let off = self.bin_c(BinaryOp::Add, off, base as i64);
        let d = self.reg(t);
        self.emit(Inst::SharedLoad { dst: d, offset: off });
        d
    }

    /// Re-distributes `src` (shape `src_shape`) into a tile of `dst_shape` whose element at
    /// coordinates `c` is the source element at `map(c)`.
    fn relayout(
        &mut self,
        src: &[Reg],
        src_shape: &[u32],
        dst_shape: &[u32],
        map: &dyn Fn(&mut Self, &[Reg]) -> Vec<Reg>,
    ) -> Vec<Reg> {
        let t = self.k.ty(src[0]);
        let n_src: u32 = src_shape.iter().product();
        let n_dst: u32 = dst_shape.iter().product();
        self.emit(Inst::Barrier);
        self.stage_in_shared(src, n_src, 0);
        self.emit(Inst::Barrier);
        let (ept, _) = self.split(n_dst);
        (0..ept)
            .map(|j| {
                let e = self.flat_index(n_dst, j);
                let c = self.coords(e, dst_shape);
                let sc = map(self, &c);
                let f = self.flatten(&sc, src_shape);
                self.shared_load(t, f, 0)
            })
            .collect()
    }

    fn unsupported<T>(&self, op: Op, reason: &str) -> Result<T, LowerError> {
        let d = &self.func.ops[op];
        Err(LowerError::Unsupported { op: d.kind.mnemonic().to_string(), loc: d.loc, reason: reason.to_string() })
    }

    fn held(&self, v: Value) -> Vec<Reg> {
        self.vals[&v].clone()
    }

    fn block(&mut self, b: Block) -> Result<(), LowerError> {
        for &op in &self.func.blocks[b].ops {
            self.op(op)?;
        }
        Ok(())
    }

    /// Lowers a region into a fresh instruction list; returns it and the yielded registers.
    fn region(&mut self, b: Block) -> Result<(Vec<Inst>, Vec<Reg>), LowerError> {
        let saved = std::mem::take(&mut self.cur);
        let r = self.block(b);
        let body = std::mem::replace(&mut self.cur, saved);
        r?;
        let yields = self.func.blocks[b].yields.iter().flat_map(|v| self.held(*v)).collect();
        Ok((body, yields))
    }

    /// Fresh registers for the slots of values of the given types.
    fn slots_of(&mut self, types: &[Type]) -> Vec<Vec<Reg>> {
        types
            .iter()
            .map(|t| {
                let n = if t.is_scalar() { 1 } else { self.split(t.numel() as u32).0 };
                (0..n).map(|_| self.reg(stype(t))).collect()
            })
            .collect()
    }

    /// Applies `f` slot by slot (scalar operands broadcast).
    fn map(&mut self, operands: &[Value], rt: SType, f: impl Fn(Reg, &[Reg]) -> Inst) -> Vec<Reg> {
        let held: Vec<Vec<Reg>> = operands.iter().map(|v| self.held(*v)).collect();
        let slots = held.iter().map(|h| h.len()).max().unwrap_or(1);
        (0..slots)
            .map(|s| {
                let srcs: Vec<Reg> = held.iter().map(|h| h[s.min(h.len() - 1)]).collect();
                let dst = self.reg(rt);
                self.emit(f(dst, &srcs));
                dst
            })
            .collect()
    }

    /// Thread 0 runs `atomic` (predicated); every thread gets its result through shared memory.
    fn scalar_atomic(&mut self, make: impl Fn(Reg, Option<Reg>) -> Inst, t: SType) -> Reg {
        let zero = self.iconst(0);
        let first = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: first, op: CmpOp::Eq, a: self.tid, b: zero });
        let old = self.reg(t);
        self.emit(make(old, Some(first)));
        self.emit(Inst::Barrier);
        self.shared = self.shared.max(8);
        let off = self.iconst(0);
        self.emit(Inst::SharedStore { offset: off, value: old, pred: Some(first) });
        self.emit(Inst::Barrier);
        let r = self.reg(t);
        self.emit(Inst::SharedLoad { dst: r, offset: off });
        r
    }

    fn op(&mut self, op: Op) -> Result<(), LowerError> {
        let data = &self.func.ops[op];
        let rt = data.results.first().map(|r| self.func.ty(*r).clone());
        let st = rt.as_ref().map(stype).unwrap_or(SType::F32);
        let shape = rt.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
        let regs: Vec<Reg> = match &data.kind {
            OpKind::Const(lit) => {
                let dst = self.reg(st);
                self.emit(Inst::Const { dst, value: *lit });
                vec![dst]
            }
            OpKind::ProgramId(a) | OpKind::NumPrograms(a) => {
                let dst = self.reg(I32);
                let which = if matches!(data.kind, OpKind::ProgramId(_)) {
                    Special::ProgramId(*a)
                } else {
                    Special::NumPrograms(*a)
                };
                self.emit(Inst::Special { dst, which });
                vec![dst]
            }
            OpKind::Arange { start, end } => {
                let n = (end - start) as u32;
                let (ept, _) = self.split(n);
                (0..ept)
                    .map(|j| {
                        let e = self.flat_index(n, j);
                        if *start != 0 {
                            self.bin_c(BinaryOp::Add, e, *start)
                        } else {
                            e
                        }
                    })
                    .collect()
            }
            OpKind::Splat(x) => {
                let n = shape.iter().product::<u32>();
                vec![self.held(*x)[0]; self.split(n).0 as usize]
            }
            OpKind::Reshape(x) | OpKind::ConsumeToken { value: x, .. } => self.held(*x),
            OpKind::Broadcast(x) => {
                let src_shape = self.func.ty(*x).shape.clone();
                let src = self.held(*x);
                let ss = src_shape.clone();
                self.relayout(&src, &src_shape, &shape, &|l, c| {
                    c.iter().zip(&ss).map(|(&r, &d)| if d == 1 { l.iconst(0) } else { r }).collect()
                })
            }
            OpKind::Transpose { x, perm } => {
                let src_shape = self.func.ty(*x).shape.clone();
                let src = self.held(*x);
                let perm = perm.clone();
                self.relayout(&src, &src_shape, &shape, &|_, c| {
                    let mut s = vec![c[0]; c.len()];
                    for (i, p) in perm.iter().enumerate() {
                        s[*p as usize] = c[i];
                    }
                    s
                })
            }
            OpKind::Unary { op: u, x } => {
                let u = *u;
                self.map(&[*x], st, |dst, s| Inst::Unary { dst, op: u, src: s[0] })
            }
            OpKind::Binary { op: b, lhs, rhs } => {
                let b = *b;
                self.map(&[*lhs, *rhs], st, |dst, s| Inst::Binary { dst, op: b, a: s[0], b: s[1] })
            }
            OpKind::Cmp { op: c, lhs, rhs } => {
                let c = *c;
                self.map(&[*lhs, *rhs], SType::Pred, |dst, s| Inst::Cmp { dst, op: c, a: s[0], b: s[1] })
            }
            OpKind::Select { cond, on_true, on_false } => self.map(&[*cond, *on_true, *on_false], st, |dst, s| {
                Inst::Select { dst, cond: s[0], on_true: s[1], on_false: s[2] }
            }),
            OpKind::Cast(x) => self.map(&[*x], st, |dst, s| Inst::Cast { dst, src: s[0] }),
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
                let (m, o) = (mask.is_some(), other.is_some());
                self.map(&ops, st, |dst, s| Inst::Load {
                    dst,
                    addr: s[0],
                    pred: m.then(|| s[1]),
                    other: o.then(|| s[if m { 2 } else { 1 }]),
                })
            }
            OpKind::Store { ptr, value, mask } => {
                let (p, v) = (self.held(*ptr), self.held(*value));
                let m = mask.map(|m| self.held(m));
                for s in 0..p.len().max(v.len()) {
                    let pick = |h: &Vec<Reg>| h[s.min(h.len() - 1)];
                    self.emit(Inst::Store { addr: pick(&p), value: pick(&v), pred: m.as_ref().map(pick) });
                }
                Vec::new()
            }
            OpKind::Atomic { op: aop, ptr, value, mask, sem, scope } => {
                let (aop, sem, scope) = (*aop, *sem, *scope);
                let (p, v) = (self.held(*ptr), self.held(*value));
                if self.func.ty(*ptr).is_scalar() {
                    let m = mask.map(|m| self.held(m)[0]);
                    let (p0, v0) = (p[0], v[0]);
                    let pm = m;
                    let r = self.scalar_atomic(
                        |dst, first| Inst::Atomic { dst, op: aop, addr: p0, value: v0, pred: first, sem, scope },
                        st,
                    );
                    if pm.is_some() {
                        return self.unsupported(op, "masked scalar atomics");
                    }
                    vec![r]
                } else {
                    let mut ops = vec![*ptr, *value];
                    ops.extend(mask);
                    let has_mask = mask.is_some();
                    self.map(&ops, st, |dst, s| Inst::Atomic {
                        dst,
                        op: aop,
                        addr: s[0],
                        value: s[1],
                        pred: has_mask.then(|| s[2]),
                        sem,
                        scope,
                    })
                }
            }
            OpKind::Barrier => {
                self.emit(Inst::Barrier);
                Vec::new()
            }
            OpKind::Reduce { op: rop, axis, x } => self.reduce(*rop, *axis as usize, *x, &shape, st),
            OpKind::Dot { a, b, acc, .. } => self.dot(*a, *b, *acc, st),
            OpKind::For { lower, upper, step, init, body } => {
                let (lo, hi, stp) = (self.held(*lower)[0], self.held(*upper)[0], self.held(*step)[0]);
                let types: Vec<Type> = init.iter().map(|v| self.func.ty(*v).clone()).collect();
                let phis = self.slots_of(&types);
                let inits: Vec<Reg> = init.iter().flat_map(|v| self.held(*v)).collect();
                let args = self.func.blocks[*body].args.clone();
                let iv = self.reg(stype(self.func.ty(args[0])));
                self.vals.insert(args[0], vec![iv]);
                for (a, p) in args[1..].iter().zip(&phis) {
                    self.vals.insert(*a, p.clone());
                }
                let (body_insts, nexts) = self.region(*body)?;
                let results = self.slots_of(&types);
                let flat = |v: &Vec<Vec<Reg>>| v.iter().flatten().copied().collect::<Vec<Reg>>();
                self.emit(Inst::Loop {
                    iv,
                    lo,
                    hi,
                    step: stp,
                    phis: flat(&phis),
                    inits,
                    body: body_insts,
                    nexts,
                    results: flat(&results),
                });
                self.bind_results(op, results);
                return Ok(());
            }
            OpKind::If { cond, then_block, else_block } => {
                let c = self.held(*cond)[0];
                let (then_body, then_yields) = self.region(*then_block)?;
                let (else_body, else_yields) = self.region(*else_block)?;
                let types: Vec<Type> = data.results.iter().map(|r| self.func.ty(*r).clone()).collect();
                let results = self.slots_of(&types);
                let flat: Vec<Reg> = results.iter().flatten().copied().collect();
                self.emit(Inst::If { cond: c, then_body, then_yields, else_body, else_yields, results: flat });
                self.bind_results(op, results);
                return Ok(());
            }
            OpKind::While { init, cond, body } => {
                let types: Vec<Type> = init.iter().map(|v| self.func.ty(*v).clone()).collect();
                let phis = self.slots_of(&types);
                let inits: Vec<Reg> = init.iter().flat_map(|v| self.held(*v)).collect();
                for b in [*cond, *body] {
                    let args = self.func.blocks[b].args.clone();
                    for (a, p) in args.iter().zip(&phis) {
                        self.vals.insert(*a, p.clone());
                    }
                }
                let (cond_body, cy) = self.region(*cond)?;
                let (body_insts, nexts) = self.region(*body)?;
                let results = self.slots_of(&types);
                let flat = |v: &Vec<Vec<Reg>>| v.iter().flatten().copied().collect::<Vec<Reg>>();
                self.emit(Inst::While {
                    phis: flat(&phis),
                    inits,
                    cond_body,
                    cond: cy[0],
                    body: body_insts,
                    nexts,
                    results: flat(&results),
                });
                self.bind_results(op, results);
                return Ok(());
            }
            OpKind::Rank => vec![self.hidden[0]],
            OpKind::NumRanks => vec![self.hidden[1]],
            OpKind::SymmAt { ptr, rank } => {
                let (p, r) = (self.held(*ptr)[0], self.held(*rank)[0]);
                vec![self.symm_at(p, r)]
            }
            OpKind::Notify { sig, rank, value, op: sop, .. } => {
                let (s0, r, v) = (self.held(*sig)[0], self.held(*rank)[0], self.held(*value)[0]);
                let target = self.symm_at(s0, r);
                // Program barrier, release fence, then one thread writes the signal.
                self.emit(Inst::Barrier);
                self.emit(Inst::Fence { scope: Scope::Sys });
                let first = self.first_thread();
                self.emit(Inst::Signal { addr: target, value: v, op: *sop, pred: first });
                Vec::new()
            }
            OpKind::Wait { sigs, count, cmp, value, .. } => {
                let (b, c, v) = (self.held(*sigs)[0], self.held(*count)[0], self.held(*value)[0]);
                self.shared = self.shared.max(8);
                self.emit(Inst::WaitSignals { base: b, count: c, cmp: *cmp, value: v });
                let t = self.reg(SType::Int { bits: 64, signed: false });
                self.emit(Inst::Const { dst: t, value: Literal::Int(0) });
                vec![t]
            }
            OpKind::SignalWaitUntil { sig, cmp, value } => {
                let (b, v) = (self.held(*sig)[0], self.held(*value)[0]);
                let one = self.iconst(1);
                self.shared = self.shared.max(8);
                self.emit(Inst::WaitSignals { base: b, count: one, cmp: *cmp, value: v });
                let seen = self.reg(SType::Int { bits: 64, signed: false });
                self.emit(Inst::Load { dst: seen, addr: b, pred: None, other: None });
                vec![seen]
            }
            OpKind::Fence | OpKind::Quiet => {
                // No transfer is ever outstanding in lowered code (puts and gets are not lowered).
                self.emit(Inst::Fence { scope: Scope::Sys });
                Vec::new()
            }
            _ => {
                return self
                    .unsupported(op, "puts, gets and barrier_all are lowered in the next slice (loopback world)")
            }
        };
        if let Some(r) = data.results.first() {
            self.vals.insert(*r, regs);
        }
        Ok(())
    }

    fn first_thread(&mut self) -> Reg {
        let zero = self.iconst(0);
        let first = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: first, op: CmpOp::Eq, a: self.tid, b: zero });
        first
    }

    fn symm_at(&mut self, ptr: Reg, rank: Reg) -> Reg {
        let d = self.reg(SType::Ptr);
        self.emit(Inst::SymmAt { dst: d, ptr, rank });
        d
    }

    fn bind_results(&mut self, op: Op, results: Vec<Vec<Reg>>) {
        let rs = self.func.ops[op].results.clone();
        for (r, regs) in rs.into_iter().zip(results) {
            self.vals.insert(r, regs);
        }
    }

    /// Reduction through shared memory: each thread folds the axis for the results it owns.
    fn reduce(&mut self, rop: ReduceOp, axis: usize, x: Value, rshape: &[u32], rt: SType) -> Vec<Reg> {
        let xt = self.func.ty(x).clone();
        let et = stype(&xt);
        let src = self.held(x);
        let n_src = xt.numel() as u32;
        let len = xt.shape[axis];
        self.emit(Inst::Barrier);
        self.stage_in_shared(&src, n_src, 0);
        self.emit(Inst::Barrier);
        let n_res: u32 = rshape.iter().product();
        let slots = if rshape.is_empty() { 1 } else { self.split(n_res).0 };
        // f16/bf16 sums accumulate in f32 (rounded once at the end).
        let acc_t = if matches!(et, SType::F16 | SType::BF16) { SType::F32 } else { et };
        let arg = matches!(rop, ReduceOp::Argmax | ReduceOp::Argmin);
        let mut out = Vec::new();
        for j in 0..slots {
            let rc = if rshape.is_empty() {
                Vec::new()
            } else {
                {
                    let e = self.flat_index(n_res, j);
                    self.coords(e, rshape)
                }
            };
            let at = |l: &mut Self, k: Reg| {
                let mut c = rc.clone();
                c.insert(axis, k);
                let f = l.flatten(&c, &xt.shape);
                let v = l.shared_load(et, f, 0);
                l.cast(v, acc_t)
            };
            let zero = self.iconst(0);
            let first = at(self, zero);
            let (lo, hi, one) = (self.iconst(1), self.iconst(len as i64), self.iconst(1));
            let iv = self.reg(I32);
            let (pv, pi) = (self.reg(acc_t), self.reg(I32));
            let saved = std::mem::take(&mut self.cur);
            let v = at(self, iv);
            let (nv, ni) = match rop {
                ReduceOp::Sum => (self.bin(BinaryOp::Add, pv, v), pi),
                ReduceOp::Max | ReduceOp::Min | ReduceOp::Argmax | ReduceOp::Argmin => {
                    let better = self.reg(SType::Pred);
                    let c = if matches!(rop, ReduceOp::Max | ReduceOp::Argmax) { CmpOp::Gt } else { CmpOp::Lt };
                    self.emit(Inst::Cmp { dst: better, op: c, a: v, b: pv });
                    let nv = self.reg(acc_t);
                    self.emit(Inst::Select { dst: nv, cond: better, on_true: v, on_false: pv });
                    let ni = self.reg(I32);
                    self.emit(Inst::Select { dst: ni, cond: better, on_true: iv, on_false: pi });
                    (nv, ni)
                }
            };
            let body = std::mem::replace(&mut self.cur, saved);
            let (rv, ri) = (self.reg(acc_t), self.reg(I32));
            self.emit(Inst::Loop {
                iv,
                lo,
                hi,
                step: one,
                phis: vec![pv, pi],
                inits: vec![first, zero],
                body,
                nexts: vec![nv, ni],
                results: vec![rv, ri],
            });
            out.push(if arg { ri } else { self.cast(rv, rt) });
        }
        out
    }

    /// `acc + a @ b` through shared memory: every thread runs an FMA loop over K for the output
    /// elements it owns.
    fn dot(&mut self, a: Value, b: Value, acc: Value, rt: SType) -> Vec<Reg> {
        let (at, bt) = (self.func.ty(a).clone(), self.func.ty(b).clone());
        let (m, kk, n) = (at.shape[0], at.shape[1], bt.shape[1]);
        let (ea, eb) = (stype(&at), stype(&bt));
        let (ar, br, cr) = (self.held(a), self.held(b), self.held(acc));
        let a_bytes = m * kk * shared_size(ea);
        self.emit(Inst::Barrier);
        self.stage_in_shared(&ar, m * kk, 0);
        self.stage_in_shared(&br, kk * n, a_bytes);
        self.emit(Inst::Barrier);
        let ft = match rt {
            SType::F64 => SType::F64,
            SType::Int { .. } => I32,
            _ => SType::F32,
        };
        let slots = self.split(m * n).0;
        // Row and column of each output slot, computed once outside the K loop.
        let mut rows_cols = Vec::new();
        for j in 0..slots {
            let e = self.flat_index(m * n, j);
            let c = self.coords(e, &[m, n]);
            let row_base = self.bin_c(BinaryOp::Shl, c[0], log2(kk));
            rows_cols.push((row_base, c[1]));
        }
        let inits: Vec<Reg> = cr.iter().map(|r| self.cast(*r, ft)).collect();
        let phis: Vec<Reg> = (0..slots).map(|_| self.reg(ft)).collect();
        let iv = self.reg(I32);
        let saved = std::mem::take(&mut self.cur);
        let mut nexts = Vec::new();
        for (j, (row_base, col)) in rows_cols.iter().enumerate() {
            let fa = self.bin(BinaryOp::Add, *row_base, iv);
            let va = self.shared_load(ea, fa, 0);
            let kb = self.bin_c(BinaryOp::Shl, iv, log2(n));
            let fb = self.bin(BinaryOp::Add, kb, *col);
            let vb = self.shared_load(eb, fb, a_bytes);
            let (xa, xb) = (self.cast(va, ft), self.cast(vb, ft));
            let d = self.reg(ft);
            if ft == I32 {
                let p = self.bin(BinaryOp::Mul, xa, xb);
                self.emit(Inst::Binary { dst: d, op: BinaryOp::Add, a: p, b: phis[j] });
            } else {
                self.emit(Inst::Fma { dst: d, a: xa, b: xb, c: phis[j] });
            }
            nexts.push(d);
        }
        let body = std::mem::replace(&mut self.cur, saved);
        let (lo, hi, one) = (self.iconst(0), self.iconst(kk as i64), self.iconst(1));
        let results: Vec<Reg> = (0..slots).map(|_| self.reg(ft)).collect();
        self.emit(Inst::Loop { iv, lo, hi, step: one, phis, inits, body, nexts, results: results.clone() });
        results.into_iter().map(|r| self.cast(r, rt)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::KernelBuilder;

    #[test]
    fn vector_add_lowers_and_communication_is_reported() {
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

        let b = KernelBuilder::new("who", LaunchAttrs::default());
        let out = b.arg_ptr("out", DType::I32);
        b.put(out, out, 4i64, 0, Group::Block, false);
        let e = lower(&b.finish().unwrap(), LowerOptions { warp_size: 32 }).unwrap_err();
        assert!(e.to_string().contains("`put`"), "{e}");
    }
}
