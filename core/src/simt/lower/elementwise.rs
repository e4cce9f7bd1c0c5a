//! Elementwise ops with the meaning `docs/SEMANTICS.md` gives them, as SIMT primitives (see the
//! contract in `simt/mod.rs`): narrow integers and `i1` computed in 32 bits and wrapped back,
//! division by zero and `MIN / -1` defined, shifts by the width or more defined, NaN-ignoring
//! float `min`/`max` with `-0 < +0`, f16/bf16 computed in f32 and rounded, and the elementary
//! functions expanded from `crate::math` (or their fast-math forms).

use super::*;
use crate::math;

impl Lowering<'_> {
    /// One element of an elementwise op (unary, binary, compare, select, cast, pointer offset):
    /// `srcs` are its operands' registers in `OpKind::operands` order, `result` the value it
    /// defines (compares give predicates, pointer offsets addresses); returns the result
    /// register.
    pub(super) fn elementwise(&mut self, kind: &OpKind, result: Value, srcs: &[Reg]) -> Reg {
        let rt = stype(self.func.ty(result));
        match *kind {
            OpKind::Unary { op, .. } => self.unary_value(op, srcs[0]),
            OpKind::Binary { op, .. } => self.binary_value(op, srcs[0], srcs[1]),
            OpKind::Cmp { op, .. } => self.compare(op, srcs[0], srcs[1]),
            OpKind::Select { .. } => self.select_raw(srcs[0], srcs[1], srcs[2]),
            OpKind::Cast(x) => {
                let (from, to) = (self.func.ty(x).elem.dtype(), self.func.ty(result).elem.dtype());
                match (from, to) {
                    (Some(f), Some(t)) if f.is_fp8() || t.is_fp8() => self.fp8_convert(srcs[0], f, t),
                    _ => self.convert(srcs[0], rt),
                }
            }
            OpKind::AddPtr { ptr, .. } => {
                let dst = self.reg(SType::Ptr);
                let scale = self.func.ty(ptr).elem.pointee().map_or(1, |d| d.size_bytes());
                self.emit(Inst::AddrOffset { dst, base: srcs[0], offset: srcs[1], scale });
                dst
            }
            _ => unreachable!("not an elementwise op: {}", kind.mnemonic()),
        }
    }

    /// `r` in the register type its arithmetic is done in (narrow integers and `i1` widen).
    pub(super) fn widen_int(&mut self, r: Reg) -> Reg {
        let t = self.k.ty(r);
        let w = arith_type(t);
        if w == t {
            r
        } else {
            self.cast(r, w)
        }
    }

    /// A value computed in `arith_type(t)` brought back to `t`, wrapping.
    pub(super) fn narrow_int(&mut self, r: Reg, t: SType) -> Reg {
        if self.k.ty(r) == t {
            return r;
        }
        if t == SType::Pred {
            let one = self.konst(self.k.ty(r), Literal::Int(1));
            let low = self.bin(BinaryOp::And, r, one);
            let zero = self.konst(self.k.ty(r), Literal::Int(0));
            return self.cmp_raw(CmpOp::Ne, low, zero);
        }
        self.cast(r, t)
    }

    /// Numeric conversion: `Cast`, except float to 8/16-bit integers, which saturate to the
    /// narrow range through i32.
    pub(super) fn convert(&mut self, r: Reg, to: SType) -> Reg {
        let from = self.k.ty(r);
        if from == to {
            return r;
        }
        if let (true, SType::Int { bits: b @ (8 | 16), signed }) = (from.is_float(), to) {
            let (lo, hi) = if signed { (-(1i64 << (b - 1)), (1i64 << (b - 1)) - 1) } else { (0, (1i64 << b) - 1) };
            let w = self.convert(r, I32);
            let (lo, hi) = (self.iconst(lo), self.iconst(hi));
            let w = self.bin(BinaryOp::Max, w, lo);
            let w = self.bin(BinaryOp::Min, w, hi);
            return self.cast(w, to);
        }
        if matches!(from, SType::F16 | SType::BF16) && matches!(to, SType::Int { .. }) {
            let f = self.cast(r, SType::F32);
            return self.convert(f, to);
        }
        if from.is_float() && matches!(to, SType::Int { .. }) {
            // The hardware's NaN result differs by width (PTX gives MIN for 64-bit
            // destinations): NaN converts to 0 by a select.
            let c = self.cast(r, to);
            let nan = self.cmp_raw(CmpOp::Ne, r, r);
            let zero = self.konst(to, Literal::Int(0));
            return self.select_raw(nan, zero, c);
        }
        self.cast(r, to)
    }

    pub(super) fn unary_value(&mut self, op: UnaryOp, x: Reg) -> Reg {
        let t = self.k.ty(x);
        if matches!(t, SType::F16 | SType::BF16) {
            let xf = self.cast(x, SType::F32);
            let r = self.unary_value(op, xf);
            return self.cast(r, t);
        }
        if t == SType::F32 && math::is_expanded(op) {
            if self.func.attrs.fast_math {
                if let Some(r) = math::fast_unary(self, op, x) {
                    return r;
                }
            }
            return math::unary(self, op, x).expect("an expanded op");
        }
        match (t, op) {
            // 1-bit arithmetic: -x = |x| = x.
            (SType::Pred, UnaryOp::Neg | UnaryOp::Abs) => x,
            (SType::Int { bits: 8 | 16, .. }, _) => {
                let w = self.widen_int(x);
                let r = self.unary_value(op, w);
                self.narrow_int(r, t)
            }
            _ => {
                let d = self.reg(t);
                self.emit(Inst::Unary { dst: d, op, src: x });
                d
            }
        }
    }

    fn binary_value(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        let t = self.k.ty(a);
        if matches!(t, SType::F16 | SType::BF16) {
            let (af, bf) = (self.cast(a, SType::F32), self.cast(b, SType::F32));
            let r = self.binary_value(op, af, bf);
            return self.cast(r, t);
        }
        if t.is_float() {
            return match op {
                BinaryOp::Min | BinaryOp::Max => self.min_max(op, a, b),
                BinaryOp::Rem => math::fmod(self, a, b),
                BinaryOp::Pow => math::pow(self, a, b),
                _ => self.bin(op, a, b),
            };
        }
        if t == SType::Pred && matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor) {
            return self.bin(op, a, b);
        }
        let w = arith_type(t);
        if w != t {
            let (aw, bw) = (self.widen_int(a), self.widen_int(b));
            let r = self.binary_value(op, aw, bw);
            return self.narrow_int(r, t);
        }
        match op {
            BinaryOp::Div | BinaryOp::Rem => self.division(op, a, b),
            BinaryOp::Shl | BinaryOp::Shr => self.shift(op, a, b),
            _ => self.bin(op, a, b),
        }
    }

    /// The constant an integer register holds, if the lowering knows it.
    fn known(&self, r: Reg) -> Option<i64> {
        self.const_ints.get(&r).copied()
    }

    /// Integer division and remainder as RISC-V defines them: `x / 0` is all ones, `x % 0 = x`,
    /// `MIN / -1 = MIN`, `MIN % -1 = 0`; the hardware divides by a divisor made safe.
    fn division(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        let t = self.k.ty(a);
        let SType::Int { bits, signed } = t else { unreachable!("integer division on {t:?}") };
        if self.known(b).is_some_and(|c| c != 0 && c != -1) {
            return self.bin(op, a, b);
        }
        let (zero, one) = (self.konst(t, Literal::Int(0)), self.konst(t, Literal::Int(1)));
        let is0 = self.cmp_raw(CmpOp::Eq, b, zero);
        let mut bad = is0;
        if signed {
            let min = self.konst(t, Literal::Int(if bits == 64 { i64::MIN } else { i32::MIN as i64 }));
            let m1 = self.konst(t, Literal::Int(-1));
            let amin = self.cmp_raw(CmpOp::Eq, a, min);
            let bm1 = self.cmp_raw(CmpOp::Eq, b, m1);
            let ovf = self.bin(BinaryOp::And, amin, bm1);
            bad = self.bin(BinaryOp::Or, is0, ovf);
        }
        let safe = self.select_raw(bad, one, b);
        let q = self.bin(op, a, safe);
        let by_zero = match op {
            BinaryOp::Div => self.konst(t, Literal::Int(-1)),
            _ => a,
        };
        self.select_raw(is0, by_zero, q)
    }

    /// Shifts: amounts (read as unsigned) at or above the width give 0, or the sign for an
    /// arithmetic right shift; the hardware shifts by an amount below the width.
    fn shift(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        let t = self.k.ty(a);
        let SType::Int { bits, signed } = t else { unreachable!("shift on {t:?}") };
        let w = bits as i64;
        if self.known(b).is_some_and(|c| (0..w).contains(&c)) {
            return self.bin(op, a, b);
        }
        let ut = SType::Int { bits, signed: false };
        let ub = self.cast(b, ut);
        let wk = self.konst(ut, Literal::Int(w));
        let big = self.cmp_raw(CmpOp::Ge, ub, wk);
        let mask = self.konst(t, Literal::Int(w - 1));
        if op == BinaryOp::Shr && signed {
            let amt = self.select_raw(big, mask, b);
            return self.bin(op, a, amt);
        }
        let amt = self.bin(BinaryOp::And, b, mask);
        let r = self.bin(op, a, amt);
        let zero = self.konst(t, Literal::Int(0));
        self.select_raw(big, zero, r)
    }

    /// IEEE minimumNumber / maximumNumber: a NaN operand gives the other, `-0 < +0`. The
    /// hardware's minNum leaves the sign of equal zeros open: equal operands give the OR (min)
    /// or AND (max) of their bits.
    pub(super) fn min_max(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        let t = self.k.ty(a);
        let it = if t == SType::F64 { U64 } else { SType::Int { bits: 32, signed: false } };
        let raw = self.bin(op, a, b);
        let eq = self.cmp_raw(CmpOp::Eq, a, b);
        let (ia, ib) = (self.bitcast(a, it), self.bitcast(b, it));
        let comb = self.bin(if op == BinaryOp::Min { BinaryOp::Or } else { BinaryOp::And }, ia, ib);
        let comb = self.bitcast(comb, t);
        self.select_raw(eq, comb, raw)
    }

    /// Comparisons: f16/bf16 in f32, narrow integers widened, ordered comparisons of `i1`
    /// as unsigned integers.
    fn compare(&mut self, op: CmpOp, a: Reg, b: Reg) -> Reg {
        let t = self.k.ty(a);
        let (a, b) = match t {
            SType::F16 | SType::BF16 => (self.cast(a, SType::F32), self.cast(b, SType::F32)),
            SType::Pred if matches!(op, CmpOp::Eq | CmpOp::Ne) => (a, b),
            _ => (self.widen_int(a), self.widen_int(b)),
        };
        self.cmp_raw(op, a, b)
    }
}

/// The register type integer arithmetic on `t` is done in: 32 bits for 8/16-bit integers (of
/// the same signedness) and for `i1` (unsigned); `t` itself otherwise.
pub(super) fn arith_type(t: SType) -> SType {
    match t {
        SType::Int { bits: 8 | 16, signed } => SType::Int { bits: 32, signed },
        SType::Pred => SType::Int { bits: 32, signed: false },
        t => t,
    }
}
