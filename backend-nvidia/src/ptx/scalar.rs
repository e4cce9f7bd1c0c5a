//! PTX for register arithmetic: parameters, special registers, constants, unary and binary
//! operations, comparisons, selects, casts, approximations, address arithmetic, `fma`, moves.

use super::*;

impl Writer<'_> {
    pub(super) fn scalar(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::Param { dst, index } => {
                let t = self.k.params[*index as usize].1;
                let d = self.n(*dst).to_string();
                match t {
                    SType::Pred => {
                        let r = self.temp(Class::R);
                        line!(self, "ld.param.u8 {r}, [p{index}]");
                        line!(self, "setp.ne.u32 {d}, {r}, 0");
                    }
                    _ => line!(self, "ld.param.{} {d}, [p{index}]", mem(t)),
                }
            }
            Inst::Special { dst, which } => {
                let sreg = match which {
                    Special::ThreadId => "%tid.x".to_string(),
                    Special::ProgramId(a) => format!("%ctaid.{}", axis(*a)),
                    Special::NumPrograms(a) => format!("%nctaid.{}", axis(*a)),
                    Special::SmId => "%smid".to_string(),
                };
                let d = self.n(*dst).to_string();
                line!(self, "mov.u32 {d}, {sreg}");
            }
            Inst::Const { dst, value } => {
                let d = self.n(*dst).to_string();
                let t = self.k.ty(*dst);
                let v = match (t, value) {
                    (SType::F32, l) => format!("0f{:08X}", (l.as_f64() as f32).to_bits()),
                    (SType::F64, l) => format!("0d{:016X}", l.as_f64().to_bits()),
                    (SType::F16, l) => format!("0x{:04X}", f16_bits(l.as_f64() as f32)),
                    (SType::BF16, l) => format!("0x{:04X}", bf16_bits(l.as_f64() as f32)),
                    // Narrow integers live sign- or zero-extended in 32-bit registers.
                    (SType::Int { bits: 8, signed: true }, Literal::Int(i)) => (*i as i8).to_string(),
                    (SType::Int { bits: 8, signed: false }, Literal::Int(i)) => (*i as u8).to_string(),
                    (SType::Int { bits: 16, signed: true }, Literal::Int(i)) => (*i as i16).to_string(),
                    (SType::Int { bits: 16, signed: false }, Literal::Int(i)) => (*i as u16).to_string(),
                    (_, Literal::Int(i)) => i.to_string(),
                    (_, Literal::Float(f)) => (*f as i64).to_string(),
                };
                match t {
                    SType::Pred => line!(self, "setp.ne.u32 {d}, {}, 0", if v == "0" { 0 } else { 1 }),
                    SType::F16 | SType::BF16 => line!(self, "mov.b16 {d}, {v}"),
                    SType::F32 => line!(self, "mov.f32 {d}, {v}"),
                    SType::F64 => line!(self, "mov.f64 {d}, {v}"),
                    _ if class(t) == Class::Rd => line!(self, "mov.b64 {d}, {v}"),
                    _ => line!(self, "mov.b32 {d}, {v}"),
                }
            }
            Inst::Unary { dst, op, src } => self.unary(*dst, *op, *src)?,
            Inst::Binary { dst, op, a, b } => self.binary(*dst, *op, *a, *b)?,
            Inst::Cmp { dst, op, a, b } => {
                let t = self.k.ty(*a);
                let d = self.n(*dst).to_string();
                if self.is_half(*a) {
                    return Err(EmitError(
                        "half-float comparison in the SIMT IR (the lowering computes in f32)".into(),
                    ));
                }
                let (x, y): (String, String) = (self.n(*a).to_string(), self.n(*b).to_string());
                let c = match (op, t.is_float()) {
                    (CmpOp::Ne, true) => "neu",
                    (o, _) => o.as_str(),
                };
                if t == SType::Pred {
                    let r = self.temp(Class::P);
                    match op {
                        CmpOp::Eq => {
                            line!(self, "xor.pred {r}, {x}, {y}");
                            line!(self, "not.pred {d}, {r}");
                        }
                        CmpOp::Ne => line!(self, "xor.pred {d}, {x}, {y}"),
                        _ => return Err(EmitError("ordered comparison of i1 values".into())),
                    }
                } else {
                    line!(self, "setp.{c}.{} {d}, {x}, {y}", arith(t));
                }
            }
            Inst::Select { dst, cond, on_true, on_false } => {
                let t = self.k.ty(*dst);
                let (d, c, a, b) = (self.n(*dst), self.n(*cond), self.n(*on_true), self.n(*on_false));
                let (d, c, a, b) = (d.to_string(), c.to_string(), a.to_string(), b.to_string());
                let suffix = match class(t) {
                    Class::H => "b16",
                    Class::R => "b32",
                    Class::Rd => "b64",
                    Class::F => "f32",
                    Class::Fd => "f64",
                    Class::P => {
                        let (t1, t2) = (self.temp(Class::P), self.temp(Class::P));
                        line!(self, "and.pred {t1}, {c}, {a}");
                        line!(self, "not.pred {t2}, {c}");
                        line!(self, "and.pred {t2}, {t2}, {b}");
                        line!(self, "or.pred {d}, {t1}, {t2}");
                        return Ok(());
                    }
                };
                if suffix == "b16" {
                    // selp has no 16-bit form: select through 32-bit registers.
                    let (x, y, z) = (self.temp(Class::R), self.temp(Class::R), self.temp(Class::R));
                    line!(self, "cvt.u32.u16 {x}, {a}");
                    line!(self, "cvt.u32.u16 {y}, {b}");
                    line!(self, "selp.b32 {z}, {x}, {y}, {c}");
                    line!(self, "cvt.u16.u32 {d}, {z}");
                } else {
                    line!(self, "selp.{suffix} {d}, {a}, {b}, {c}");
                }
            }
            Inst::Cast { dst, src } => self.cast(*dst, *src)?,
            Inst::Bitcast { dst, src } => {
                let (d, x) = (self.n(*dst).to_string(), self.n(*src).to_string());
                let w = if matches!(class(self.k.ty(*dst)), Class::Rd | Class::Fd) { 64 } else { 32 };
                line!(self, "mov.b{w} {d}, {x}");
            }
            Inst::Approx { dst, func, src } => {
                let (d, x) = (self.n(*dst).to_string(), self.n(*src).to_string());
                let name = match func {
                    ApproxFn::Exp2 => "ex2",
                    ApproxFn::Log2 => "lg2",
                    ApproxFn::Sin => "sin",
                    ApproxFn::Cos => "cos",
                    ApproxFn::Rsqrt => "rsqrt",
                    ApproxFn::Rcp => "rcp",
                };
                line!(self, "{name}.approx.f32 {d}, {x}");
            }
            Inst::AddrOffset { dst, base, offset, scale } => {
                let (d, b) = (self.n(*dst).to_string(), self.n(*base).to_string());
                let t = self.temp(Class::Rd);
                match self.k.ty(*offset) {
                    SType::Int { bits: 64, .. } => {
                        let o = self.n(*offset).to_string();
                        line!(self, "mul.lo.s64 {t}, {o}, {scale}");
                    }
                    SType::Int { signed, .. } => {
                        let o = self.n(*offset).to_string();
                        line!(self, "mul.wide.{} {t}, {o}, {scale}", if signed { "s32" } else { "u32" });
                    }
                    other => return Err(EmitError(format!("address offset of type {other:?}"))),
                }
                line!(self, "add.s64 {d}, {b}, {t}");
            }
            Inst::Pack { dst, lo, hi } => {
                let (d, l, h) = (self.n(*dst).to_string(), self.n(*lo).to_string(), self.n(*hi).to_string());
                // 16-bit integers live in 32-bit registers: take their low halves.
                let half = |w: &mut Self, r: Reg, name: String| {
                    if class(w.k.ty(r)) == Class::H {
                        name
                    } else {
                        let h = w.temp(Class::H);
                        line!(w, "cvt.u16.u32 {h}, {name}");
                        h.to_string()
                    }
                };
                let (l, h) = (half(self, *lo, l), half(self, *hi, h));
                line!(self, "mov.b32 {d}, {{{l}, {h}}}");
            }
            Inst::Fp8Convert { dst, src, format } => {
                let pair = match format {
                    trident_core::ir::DType::F8E4M3FN => "e4m3x2",
                    trident_core::ir::DType::F8E5M2 => "e5m2x2",
                    _ => return Err(EmitError(format!("FP8 conversion of `{format}`"))),
                };
                if !self.target.fp8_convert {
                    return Err(EmitError(format!("`cvt ... {pair}` needs sm_89 or later, not {}", self.target.name)));
                }
                let (d, x) = (self.n(*dst).to_string(), self.n(*src).to_string());
                let h = self.temp(Class::H);
                match (self.k.ty(*src), self.k.ty(*dst)) {
                    // The byte is the low element of a pair; the high one is converted and dropped.
                    (SType::Int { bits: 8, .. }, SType::F16) => {
                        let r = self.temp(Class::R);
                        line!(self, "cvt.u16.u32 {h}, {x}");
                        line!(self, "cvt.rn.f16x2.{pair} {r}, {h}");
                        line!(self, "cvt.u16.u32 {d}, {r}");
                    }
                    // `a` (the pair's high element) and `b` (its low one) both `x`.
                    (SType::F32, SType::Int { bits: 8, .. }) => {
                        line!(self, "cvt.rn.satfinite.{pair}.f32 {h}, {x}, {x}");
                        line!(self, "cvt.u32.u16 {d}, {h}");
                        line!(self, "and.b32 {d}, {d}, 255");
                    }
                    (s, t) => return Err(EmitError(format!("FP8 conversion from {s:?} to {t:?}"))),
                }
            }
            Inst::Fma { dst, a, b, c } => {
                let sfx = if self.k.ty(*dst) == SType::F64 { "f64" } else { "f32" };
                let (d, x, y, z) =
                    (self.n(*dst).to_string(), self.n(*a).to_string(), self.n(*b).to_string(), self.n(*c).to_string());
                line!(self, "fma.rn.{sfx} {d}, {x}, {y}, {z}");
            }
            Inst::Mov { dst, src } => self.mov(*dst, *src),
            Inst::Clock { dst } => {
                let d = self.n(*dst).to_string();
                line!(self, "mov.u64 {d}, %globaltimer");
            }
            _ => return Err(EmitError(format!("`{i:?}` is not a scalar instruction"))),
        }
        Ok(())
    }

    pub(super) fn unary(&mut self, dst: Reg, op: UnaryOp, src: Reg) -> Result<(), EmitError> {
        let t = self.k.ty(dst);
        if !t.is_float() {
            let (d, s) = (self.n(dst).to_string(), self.n(src).to_string());
            let text = match (op, t) {
                (UnaryOp::Not, SType::Pred) => format!("not.pred {d}, {s}"),
                (UnaryOp::Not, _) => format!("not.b{} {d}, {s}", if class(t) == Class::Rd { 64 } else { 32 }),
                (UnaryOp::Neg, _) => format!("neg.{} {d}, {s}", arith(t).replace('u', "s")),
                (UnaryOp::Abs, SType::Int { signed: true, .. }) => format!("abs.{} {d}, {s}", arith(t)),
                (UnaryOp::Abs, _) => format!("mov.b{} {d}, {s}", if class(t) == Class::Rd { 64 } else { 32 }),
                _ => return Err(EmitError(format!("`{op}` on {t:?}"))),
            };
            self.line(text);
            return Ok(());
        }
        let sfx = if t == SType::F64 { "f64" } else { "f32" };
        let text = match op {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sqrt => "sqrt.rn",
            UnaryOp::Floor => "cvt.rmi",
            UnaryOp::Ceil => "cvt.rpi",
            // The lowering expands the elementary functions (`trident_core::math`).
            _ => return Err(EmitError(format!("`{op}` on {t:?} is not a SIMT primitive"))),
        };
        self.float_op(dst, &[src], |d, s| {
            let s = &s[0];
            match op {
                UnaryOp::Floor | UnaryOp::Ceil => format!("{text}.{sfx}.{sfx} {d}, {s}"),
                _ => format!("{text}.{sfx} {d}, {s}"),
            }
        })
    }

    pub(super) fn binary(&mut self, dst: Reg, op: BinaryOp, a: Reg, b: Reg) -> Result<(), EmitError> {
        let t = self.k.ty(dst);
        if t.is_float() {
            let sfx = if t == SType::F64 { "f64" } else { "f32" };
            let name = match op {
                BinaryOp::Add => "add.rn",
                BinaryOp::Sub => "sub.rn",
                BinaryOp::Mul => "mul.rn",
                BinaryOp::Div => "div.rn",
                BinaryOp::Min => "min",
                BinaryOp::Max => "max",
                _ => {
                    return Err(EmitError(format!(
                        "`{op}` on floats is not a SIMT primitive (the lowering expands it)"
                    )))
                }
            };
            return self.float_op(dst, &[a, b], |d, s| format!("{name}.{sfx} {d}, {}, {}", s[0], s[1]));
        }
        let (d, x, y) = (self.n(dst).to_string(), self.n(a).to_string(), self.n(b).to_string());
        if t == SType::Pred {
            let name = match op {
                BinaryOp::And | BinaryOp::Mul | BinaryOp::Min => "and",
                BinaryOp::Or | BinaryOp::Max => "or",
                BinaryOp::Xor | BinaryOp::Add | BinaryOp::Sub => "xor",
                _ => return Err(EmitError(format!("`{op}` on i1"))),
            };
            line!(self, "{name}.pred {d}, {x}, {y}");
            return Ok(());
        }
        if let SType::Int { bits: 8 | 16, .. } = t {
            return Err(EmitError(format!("`{op}` on {t:?} is not a SIMT primitive (the lowering widens it)")));
        }
        let ar = arith(t);
        let bits = if class(t) == Class::Rd { 64 } else { 32 };
        // Shift amounts are 32-bit registers in PTX; 64-bit shifts take the low word.
        let y = if matches!(op, BinaryOp::Shl | BinaryOp::Shr) && bits == 64 {
            let s = self.temp(Class::R);
            line!(self, "cvt.u32.u64 {s}, {y}");
            s.to_string()
        } else {
            y
        };
        let text = match op {
            BinaryOp::Add => format!("add.{ar} {d}, {x}, {y}"),
            BinaryOp::Sub => format!("sub.{ar} {d}, {x}, {y}"),
            BinaryOp::Mul => format!("mul.lo.{ar} {d}, {x}, {y}"),
            BinaryOp::Div => format!("div.{ar} {d}, {x}, {y}"),
            BinaryOp::Rem => format!("rem.{ar} {d}, {x}, {y}"),
            BinaryOp::Min => format!("min.{ar} {d}, {x}, {y}"),
            BinaryOp::Max => format!("max.{ar} {d}, {x}, {y}"),
            BinaryOp::And => format!("and.b{bits} {d}, {x}, {y}"),
            BinaryOp::Or => format!("or.b{bits} {d}, {x}, {y}"),
            BinaryOp::Xor => format!("xor.b{bits} {d}, {x}, {y}"),
            BinaryOp::Shl => format!("shl.b{bits} {d}, {x}, {y}"),
            BinaryOp::Shr => format!("shr.{ar} {d}, {x}, {y}"),
            BinaryOp::Pow => return Err(EmitError("`pow` on integers".into())),
        };
        self.line(text);
        Ok(())
    }

    pub(super) fn cast(&mut self, dst: Reg, src: Reg) -> Result<(), EmitError> {
        let (dt, st) = (self.k.ty(dst), self.k.ty(src));
        let (d, s) = (self.n(dst).to_string(), self.n(src).to_string());
        match (dt, st) {
            (a, b) if a == b => line!(self, "mov.{} {d}, {s}", mov_type(a)),
            (SType::Pred, SType::F64) => line!(self, "setp.neu.f64 {d}, {s}, 0d0000000000000000"),
            (SType::Pred, _) if st.is_float() => {
                let w = self.widen(src);
                line!(self, "setp.neu.f32 {d}, {w}, 0f00000000");
            }
            (SType::Pred, _) => line!(self, "setp.ne.{} {d}, {s}, 0", arith(st)),
            (SType::F64, SType::Pred) => {
                line!(self, "selp.f64 {d}, 0d3FF0000000000000, 0d0000000000000000, {s}")
            }
            (_, SType::Pred) => {
                if dt.is_float() {
                    let f = self.temp(Class::F);
                    line!(self, "selp.f32 {f}, 0f3F800000, 0f00000000, {s}");
                    self.narrow(dst, &f);
                } else {
                    line!(self, "selp.{} {d}, 1, 0, {s}", arith(dt));
                }
            }
            (SType::F64, _) if st.is_float() => {
                let w = self.widen(src);
                line!(self, "cvt.f64.f32 {d}, {w}");
            }
            (_, SType::F64) if dt.is_float() => {
                let f = self.temp(Class::F);
                line!(self, "cvt.rn.f32.f64 {f}, {s}");
                self.narrow(dst, &f);
            }
            (_, _) if dt.is_float() && st.is_float() => {
                let w = self.widen(src);
                self.narrow(dst, &w);
            }
            (_, _) if dt.is_float() => {
                if dt == SType::F64 {
                    line!(self, "cvt.rn.f64.{} {d}, {s}", arith(st));
                } else {
                    let f = self.temp(Class::F);
                    line!(self, "cvt.rn.f32.{} {f}, {s}", arith(st));
                    self.narrow(dst, &f);
                }
            }
            (_, _) if st.is_float() => {
                let w = if st == SType::F64 { s.clone() } else { self.widen(src) };
                let from = if st == SType::F64 { "f64" } else { "f32" };
                line!(self, "cvt.rzi.{}.{from} {d}, {w}", arith(dt));
            }
            _ => {
                // Integer to integer: truncate to the destination, then sign- or zero-extend as
                // it says. Registers are 32 or 64 bits; narrow values live extended in 32 bits.
                let (dc, sc) = (class(dt), class(st));
                if let SType::Int { bits: b @ (8 | 16), signed } = dt {
                    let c = if signed { "s" } else { "u" };
                    let src32 = if sc == Class::Rd {
                        let t = self.temp(Class::R);
                        line!(self, "cvt.u32.u64 {t}, {s}");
                        t.to_string()
                    } else {
                        s.clone()
                    };
                    line!(self, "cvt.{c}{b}.u32 {d}, {src32}");
                    // The destination register holds the narrow value extended to 32 bits.
                    line!(self, "cvt.{c}32.{c}{b} {d}, {d}");
                } else if dc == sc {
                    line!(self, "mov.b{} {d}, {s}", if dc == Class::Rd { 64 } else { 32 });
                } else {
                    line!(self, "cvt.{}.{} {d}, {s}", arith(dt), arith(st));
                }
            }
        }
        Ok(())
    }
}
