//! `crate::math`'s function definitions emitted as SIMT instructions: the [`Arith`] evaluator
//! of the lowering (every value a register; constants hoisted into the prologue, once each).

use super::*;
use crate::math::{ApproxFn, Arith};

const F32: SType = SType::F32;
const F64: SType = SType::F64;
const U32: SType = SType::Int { bits: 32, signed: false };
const I64: SType = SType::Int { bits: 64, signed: true };

impl Lowering<'_> {
    /// A constant of type `t`, defined once in the prologue.
    pub(super) fn konst(&mut self, t: SType, value: Literal) -> Reg {
        let bits = match value {
            Literal::Int(i) => i as u64,
            Literal::Float(f) => f.to_bits(),
        };
        let key = (t, bits, matches!(value, Literal::Float(_)));
        if let Some(r) = self.typed_consts.get(&key) {
            return *r;
        }
        let r = self.reg(t);
        self.prologue.push(Inst::Const { dst: r, value });
        if let Literal::Int(i) = value {
            self.const_ints.insert(r, i);
        }
        self.typed_consts.insert(key, r);
        r
    }

    pub(super) fn bitcast(&mut self, r: Reg, t: SType) -> Reg {
        let d = self.reg(t);
        self.emit(Inst::Bitcast { dst: d, src: r });
        d
    }

    fn unary_raw(&mut self, op: UnaryOp, a: Reg) -> Reg {
        let d = self.reg(self.k.ty(a));
        self.emit(Inst::Unary { dst: d, op, src: a });
        d
    }

    pub(super) fn cmp_raw(&mut self, op: CmpOp, a: Reg, b: Reg) -> Reg {
        let d = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: d, op, a, b });
        d
    }

    pub(super) fn select_raw(&mut self, c: Reg, a: Reg, b: Reg) -> Reg {
        let d = self.reg(self.k.ty(a));
        self.emit(Inst::Select { dst: d, cond: c, on_true: a, on_false: b });
        d
    }

    fn fma_raw(&mut self, a: Reg, b: Reg, c: Reg) -> Reg {
        let d = self.reg(self.k.ty(a));
        self.emit(Inst::Fma { dst: d, a, b, c });
        d
    }
}

impl Arith for Lowering<'_> {
    type F = Reg;
    type D = Reg;
    type I = Reg;
    type L = Reg;
    type B = Reg;

    fn f(&mut self, c: f32) -> Reg {
        self.konst(F32, Literal::Float(c as f64))
    }
    fn add(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Add, a, b)
    }
    fn sub(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Sub, a, b)
    }
    fn mul(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Mul, a, b)
    }
    fn div(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Div, a, b)
    }
    fn fma(&mut self, a: Reg, b: Reg, c: Reg) -> Reg {
        self.fma_raw(a, b, c)
    }
    fn sqrt(&mut self, a: Reg) -> Reg {
        self.unary_raw(UnaryOp::Sqrt, a)
    }
    fn floor(&mut self, a: Reg) -> Reg {
        self.unary_raw(UnaryOp::Floor, a)
    }
    fn abs(&mut self, a: Reg) -> Reg {
        self.unary_raw(UnaryOp::Abs, a)
    }
    fn neg(&mut self, a: Reg) -> Reg {
        self.unary_raw(UnaryOp::Neg, a)
    }
    fn fmin(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Min, a, b)
    }
    fn fmax(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Max, a, b)
    }
    fn cmp(&mut self, op: CmpOp, a: Reg, b: Reg) -> Reg {
        self.cmp_raw(op, a, b)
    }
    fn sel(&mut self, c: Reg, a: Reg, b: Reg) -> Reg {
        self.select_raw(c, a, b)
    }
    fn bits(&mut self, a: Reg) -> Reg {
        self.bitcast(a, I32)
    }
    fn of_bits(&mut self, a: Reg) -> Reg {
        self.bitcast(a, F32)
    }
    fn f2i(&mut self, a: Reg) -> Reg {
        self.cast(a, I32)
    }
    fn i2f(&mut self, a: Reg) -> Reg {
        self.cast(a, F32)
    }
    fn l2f(&mut self, a: Reg) -> Reg {
        self.cast(a, F32)
    }
    fn l2f_signed(&mut self, a: Reg) -> Reg {
        let s = self.cast(a, I64);
        self.cast(s, F32)
    }
    fn f2l_signed(&mut self, a: Reg) -> Reg {
        let s = self.cast(a, I64);
        self.cast(s, U64)
    }

    fn d(&mut self, c: f64) -> Reg {
        self.konst(F64, Literal::Float(c))
    }
    fn dadd(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Add, a, b)
    }
    fn dsub(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Sub, a, b)
    }
    fn dmul(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Mul, a, b)
    }
    fn ddiv(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Div, a, b)
    }
    fn dfma(&mut self, a: Reg, b: Reg, c: Reg) -> Reg {
        self.fma_raw(a, b, c)
    }
    fn dcmp(&mut self, op: CmpOp, a: Reg, b: Reg) -> Reg {
        self.cmp_raw(op, a, b)
    }
    fn dsel(&mut self, c: Reg, a: Reg, b: Reg) -> Reg {
        self.select_raw(c, a, b)
    }
    fn dbits(&mut self, a: Reg) -> Reg {
        self.bitcast(a, U64)
    }
    fn dof_bits(&mut self, a: Reg) -> Reg {
        self.bitcast(a, F64)
    }
    fn f2d(&mut self, a: Reg) -> Reg {
        self.cast(a, F64)
    }
    fn d2f(&mut self, a: Reg) -> Reg {
        self.cast(a, F32)
    }
    fn d2i(&mut self, a: Reg) -> Reg {
        self.cast(a, I32)
    }

    fn i(&mut self, c: i32) -> Reg {
        self.konst(I32, Literal::Int(c as i64))
    }
    fn ibin(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        self.bin(op, a, b)
    }
    fn icmp(&mut self, op: CmpOp, a: Reg, b: Reg) -> Reg {
        self.cmp_raw(op, a, b)
    }
    fn isel(&mut self, c: Reg, a: Reg, b: Reg) -> Reg {
        self.select_raw(c, a, b)
    }
    fn i2l(&mut self, a: Reg) -> Reg {
        let u = self.cast(a, U32);
        self.cast(u, U64)
    }
    fn l2i(&mut self, a: Reg) -> Reg {
        self.cast(a, I32)
    }

    fn l(&mut self, c: u64) -> Reg {
        self.konst(U64, Literal::Int(c as i64))
    }
    fn lbin(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        self.bin(op, a, b)
    }
    fn lcmp(&mut self, op: CmpOp, a: Reg, b: Reg) -> Reg {
        self.cmp_raw(op, a, b)
    }
    fn lsel(&mut self, c: Reg, a: Reg, b: Reg) -> Reg {
        self.select_raw(c, a, b)
    }

    fn and(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::And, a, b)
    }
    fn or(&mut self, a: Reg, b: Reg) -> Reg {
        self.bin(BinaryOp::Or, a, b)
    }
    fn not(&mut self, a: Reg) -> Reg {
        Lowering::not(self, a)
    }

    fn approx(&mut self, f: ApproxFn, a: Reg) -> Reg {
        let d = self.reg(F32);
        self.emit(Inst::Approx { dst: d, func: f, src: a });
        d
    }
}
