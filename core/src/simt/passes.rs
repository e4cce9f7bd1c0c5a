//! Clean-up passes over the SIMT IR, run by [`super::lower`] after the lowering: common
//! subexpression elimination and dead-code elimination.
//!
//! The lowering emits index math per element slot and per op, and leaves values unused (the
//! scalar path of a vector group nobody reads, positions of a layout a later op replaced). The
//! PTX assembler would clean most of it, but every writer (and cpu-simt, and a reader of the
//! printed form) would pay for it first.
//!
//! The IR is in SSA form apart from loop-carried registers (a `Loop`'s or `While`'s `phis`, and
//! the `results` of regions), which are written by the region itself: both passes treat region
//! instructions as opaque, and only remove or merge *pure* instructions (no memory access, no
//! cross-lane or program-wide effect).

pub use super::inst::for_each_use;
use super::{ApproxFn, Inst, Kernel, Reg, SType, Special};
use crate::ir::{BinaryOp, CmpOp, Literal, UnaryOp};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hasher for small keys (registers, opcodes): the passes hash every
/// instruction, and SipHash's DoS resistance buys nothing here.
#[derive(Default)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u8(&mut self, x: u8) {
        self.write_u64(x as u64)
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64)
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
}

/// A hash map with a fast multiplicative hash of small keys (registers, values, their lists).
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// The values of one region of CSE, and whether it is a loop body (lookups stop there).
type Scope = (FastMap<(SType, Key), Reg>, bool);

/// Runs CSE then DCE.
pub fn clean(k: &mut Kernel) {
    cse(k);
    dce(k);
}

/// The register a pure instruction defines: merged by CSE when equal, dropped by DCE when
/// unused. Loads, atomics, shuffles (cross-lane), the clock and region results are not pure.
fn pure_def(i: &Inst) -> Option<Reg> {
    match i {
        Inst::Param { dst, .. }
        | Inst::Special { dst, .. }
        | Inst::Const { dst, .. }
        | Inst::Unary { dst, .. }
        | Inst::Binary { dst, .. }
        | Inst::Cmp { dst, .. }
        | Inst::Select { dst, .. }
        | Inst::Cast { dst, .. }
        | Inst::Bitcast { dst, .. }
        | Inst::Approx { dst, .. }
        | Inst::Fp8Convert { dst, .. }
        | Inst::AddrOffset { dst, .. }
        | Inst::IsAligned { dst, .. }
        | Inst::Fma { dst, .. }
        | Inst::Mov { dst, .. }
        | Inst::Pack { dst, .. } => Some(*dst),
        _ => None,
    }
}

/// What a pure instruction computes, without its destination: equal keys compute equal values
/// (the destination's type is part of the key: it decides what a constant or a conversion
/// means).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Key {
    Param(u32),
    Special(Special),
    Int(i64),
    Float(u64),
    Unary(UnaryOp, Reg),
    Binary(BinaryOp, Reg, Reg),
    Cmp(CmpOp, Reg, Reg),
    Select(Reg, Reg, Reg),
    Cast(Reg),
    Bitcast(Reg),
    Approx(ApproxFn, Reg),
    Fp8(crate::ir::DType, Reg),
    Addr(Reg, Reg, u32),
    Aligned(Reg, u32),
    Fma(Reg, Reg, Reg),
    Mov(Reg),
    Pack(Reg, Reg),
}

fn key(k: &Kernel, i: &Inst) -> Option<(SType, Key)> {
    let dst = pure_def(i)?;
    let key = match *i {
        Inst::Param { index, .. } => Key::Param(index),
        Inst::Special { which, .. } => Key::Special(which),
        Inst::Const { value: Literal::Int(v), .. } => Key::Int(v),
        Inst::Const { value: Literal::Float(x), .. } => Key::Float(x.to_bits()),
        Inst::Unary { op, src, .. } => Key::Unary(op, src),
        Inst::Binary { op, a, b, .. } => Key::Binary(op, a, b),
        Inst::Cmp { op, a, b, .. } => Key::Cmp(op, a, b),
        Inst::Select { cond, on_true, on_false, .. } => Key::Select(cond, on_true, on_false),
        Inst::Cast { src, .. } => Key::Cast(src),
        Inst::Bitcast { src, .. } => Key::Bitcast(src),
        Inst::Approx { func, src, .. } => Key::Approx(func, src),
        Inst::Fp8Convert { src, format, .. } => Key::Fp8(format, src),
        Inst::AddrOffset { base, offset, scale, .. } => Key::Addr(base, offset, scale),
        Inst::IsAligned { addr, bytes, .. } => Key::Aligned(addr, bytes),
        Inst::Fma { a, b, c, .. } => Key::Fma(a, b, c),
        Inst::Mov { src, .. } => Key::Mov(src),
        Inst::Pack { lo, hi, .. } => Key::Pack(lo, hi),
        _ => return None,
    };
    Some((k.ty(dst), key))
}

/// Registers written more than once (loop-carried registers): never merged or renamed.
fn multiply_defined(k: &Kernel) -> Vec<bool> {
    fn walk(body: &[Inst], n: &mut [u32]) {
        for i in body {
            let mut defs: Vec<Reg> = pure_def(i).into_iter().collect();
            match i {
                Inst::Loop { iv, phis, results, body, .. } => {
                    defs.push(*iv);
                    defs.extend(phis.iter().chain(results));
                    walk(body, n);
                }
                Inst::While { phis, results, cond_body, body, .. } => {
                    defs.extend(phis.iter().chain(results));
                    walk(cond_body, n);
                    walk(body, n);
                }
                Inst::If { results, then_body, else_body, .. } => {
                    defs.extend(results);
                    walk(then_body, n);
                    walk(else_body, n);
                }
                Inst::Specialized { producer, consumer, .. } => {
                    walk(producer, n);
                    walk(consumer, n);
                }
                _ => {}
            }
            for d in defs {
                n[d.0 as usize] += 1;
            }
        }
    }
    let mut n = vec![0u32; k.regs.len()];
    walk(&k.body, &mut n);
    n.into_iter().map(|c| c > 1).collect()
}

/// Common-subexpression elimination over structured regions: a pure instruction equal to one
/// that an enclosing or earlier instruction of the same region computed is dropped and its
/// register renamed.
pub fn cse(k: &mut Kernel) {
    let multi = multiply_defined(k);
    let mut rename: Vec<Option<Reg>> = vec![None; k.regs.len()];
    let mut scopes: Vec<Scope> = vec![(FastMap::default(), false)];
    let mut body = std::mem::take(&mut k.body);
    cse_block(k, &multi, &mut body, &mut scopes, &mut rename);
    k.body = body;
}

fn cse_block(k: &Kernel, multi: &[bool], body: &mut Vec<Inst>, scopes: &mut Vec<Scope>, rename: &mut [Option<Reg>]) {
    let mut out = Vec::with_capacity(body.len());
    for mut i in body.drain(..) {
        for_each_use(&mut i, &mut |r| {
            if let Some(n) = rename[r.0 as usize] {
                *r = n;
            }
        });
        // A loop body does not reuse values computed before the loop: they would stay live
        // across it (register pressure; the PTX assembler rematerializes cheap values itself).
        let is_loop = matches!(i, Inst::Loop { .. } | Inst::While { .. });
        let nested = i.bodies_mut();
        if !nested.is_empty() {
            for b in nested {
                scopes.push((FastMap::default(), is_loop));
                cse_block(k, multi, b, scopes, rename);
                scopes.pop();
            }
            // Region instructions read `nexts`/yields defined in their bodies: rename again.
            for_each_use(&mut i, &mut |r| {
                if let Some(n) = rename[r.0 as usize] {
                    *r = n;
                }
            });
        }
        if let (Some(dst), Some(key)) = (pure_def(&i), key(k, &i)) {
            let mut reads_multi = false;
            for_each_use(&mut i, &mut |r| reads_multi |= multi[r.0 as usize]);
            if !multi[dst.0 as usize] && !reads_multi {
                let mut found = None;
                for (scope, loop_body) in scopes.iter().rev() {
                    if let Some(&r) = scope.get(&key) {
                        found = Some(r);
                        break;
                    }
                    if *loop_body {
                        break;
                    }
                }
                if let Some(prev) = found {
                    rename[dst.0 as usize] = Some(prev);
                    continue;
                }
                scopes.last_mut().expect("a scope").0.insert(key, dst);
            }
        }
        out.push(i);
    }
    *body = out;
}

/// Dead-code elimination: a pure instruction is kept only when its register is read by a kept
/// instruction (liveness from the impure ones, in one walk and one sweep).
pub fn dce(k: &mut Kernel) {
    let n = k.regs.len();
    // The operands of each pure definition (flat: `operands[range[d]]`); the registers impure
    // instructions read are the roots.
    let mut operands: Vec<Reg> = Vec::new();
    let mut range: Vec<(u32, u32)> = vec![(0, 0); n];
    let mut live = vec![false; n];
    let mut work: Vec<Reg> = Vec::new();
    struct Scan<'a> {
        operands: &'a mut Vec<Reg>,
        range: &'a mut [(u32, u32)],
        live: &'a mut [bool],
        work: &'a mut Vec<Reg>,
    }
    fn scan(body: &mut [Inst], s: &mut Scan) {
        for i in body.iter_mut() {
            match pure_def(i) {
                Some(d) => {
                    let start = s.operands.len() as u32;
                    for_each_use(i, &mut |r| s.operands.push(*r));
                    s.range[d.0 as usize] = (start, s.operands.len() as u32);
                }
                None => for_each_use(i, &mut |r| {
                    if !s.live[r.0 as usize] {
                        s.live[r.0 as usize] = true;
                        s.work.push(*r);
                    }
                }),
            }
            for b in i.bodies_mut() {
                scan(b, s);
            }
        }
    }
    scan(&mut k.body, &mut Scan { operands: &mut operands, range: &mut range, live: &mut live, work: &mut work });
    while let Some(r) = work.pop() {
        let (a, b) = range[r.0 as usize];
        for &o in &operands[a as usize..b as usize] {
            if !live[o.0 as usize] {
                live[o.0 as usize] = true;
                work.push(o);
            }
        }
    }
    fn sweep(body: &mut Vec<Inst>, live: &[bool]) {
        body.retain(|i| pure_def(i).is_none_or(|d| live[d.0 as usize]));
        for i in body.iter_mut() {
            for b in i.bodies_mut() {
                sweep(b, live);
            }
        }
    }
    sweep(&mut k.body, &live);
}
