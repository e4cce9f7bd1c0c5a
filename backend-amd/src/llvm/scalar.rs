//! LLVM IR for register arithmetic: parameters, special registers, constants, unary and binary
//! operations, comparisons, selects, casts, approximations, address arithmetic, `fma`, moves.

use super::*;

impl Writer<'_> {
    pub(super) fn scalar(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::Param { dst, index } => {
                let a = format!("%arg{index}");
                if self.t(*dst) == SType::Pred {
                    self.def(*dst, format!("icmp ne i8 {a}, 0"));
                } else if matches!(self.t(*dst), SType::Int { bits: 8 | 16, .. }) {
                    let ext = if signed(self.t(*dst)) { "sext" } else { "zext" };
                    self.def(*dst, format!("{ext} {} {a} to i32", mem_ty(self.t(*dst))));
                } else {
                    self.alias(*dst, a);
                }
            }
            Inst::Special { dst, which } => {
                let v = match which {
                    Special::ThreadId => {
                        self.declare("declare i32 @llvm.amdgcn.workitem.id.x()");
                        self.call("i32", "llvm.amdgcn.workitem.id.x", &[])
                    }
                    Special::ProgramId(a) => {
                        let f = format!("llvm.amdgcn.workgroup.id.{a}");
                        self.declare(&format!("declare i32 @{f}()"));
                        self.call("i32", &f, &[])
                    }
                    Special::NumPrograms(a) => {
                        // Code object v5 hidden arguments: block counts x, y, z at offset 0.
                        self.declare("declare ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()");
                        let p = self.call("ptr addrspace(4)", "llvm.amdgcn.implicitarg.ptr", &[]);
                        let off = match a {
                            Axis::X => 0,
                            Axis::Y => 4,
                            Axis::Z => 8,
                        };
                        let q = self.fresh();
                        self.line(format!("{q} = getelementptr i8, ptr addrspace(4) {p}, i64 {off}"));
                        let v = self.fresh();
                        self.line(format!("{v} = load i32, ptr addrspace(4) {q}, align 4, !invariant.load !0"));
                        v
                    }
                    Special::SmId => {
                        // HW_ID (hardware register 4) bits 8..15: CU, SH and SE of the wave
                        // (`s_getreg_b32` with size 7 at offset 8: (7 - 1) << 11 | 8 << 6 | 4).
                        self.declare("declare i32 @llvm.amdgcn.s.getreg(i32 immarg)");
                        self.call("i32", "llvm.amdgcn.s.getreg", &["i32 12804".to_string()])
                    }
                };
                self.alias(*dst, v);
            }
            Inst::Const { dst, value } => {
                let t = self.t(*dst);
                let v = match (t, value) {
                    (SType::Pred, l) => (if l.as_f64() != 0.0 { "true" } else { "false" }).to_string(),
                    (t, l) if t.is_float() => float_lit(t, l.as_f64()),
                    (SType::Int { bits: 8, signed: true }, Literal::Int(i)) => (*i as i8).to_string(),
                    (SType::Int { bits: 8, signed: false }, Literal::Int(i)) => (*i as u8).to_string(),
                    (SType::Int { bits: 16, signed: true }, Literal::Int(i)) => (*i as i16).to_string(),
                    (SType::Int { bits: 16, signed: false }, Literal::Int(i)) => (*i as u16).to_string(),
                    (SType::Int { bits: 32, .. }, Literal::Int(i)) => (*i as i32).to_string(),
                    (SType::Ptr, Literal::Int(0)) => "null".into(),
                    (SType::Ptr, Literal::Int(i)) => format!("inttoptr (i64 {i} to ptr addrspace(1))"),
                    (_, Literal::Int(i)) => i.to_string(),
                    (_, Literal::Float(f)) => (*f as i64).to_string(),
                };
                self.alias(*dst, v);
            }
            Inst::Unary { dst, op, src } => self.unary(*dst, *op, *src)?,
            Inst::Binary { dst, op, a, b } => self.binary(*dst, *op, *a, *b)?,
            Inst::Cmp { dst, op, a, b } => {
                let t = self.t(*a);
                if matches!(t, SType::F16 | SType::BF16) {
                    return err("half-float comparison in the SIMT IR (the lowering computes in f32)");
                }
                let (x, y) = (self.n(*a), self.n(*b));
                let c = if t.is_float() {
                    match op {
                        CmpOp::Eq => "fcmp oeq",
                        CmpOp::Ne => "fcmp une",
                        CmpOp::Lt => "fcmp olt",
                        CmpOp::Le => "fcmp ole",
                        CmpOp::Gt => "fcmp ogt",
                        CmpOp::Ge => "fcmp oge",
                    }
                } else {
                    let s = signed(t);
                    match op {
                        CmpOp::Eq => "icmp eq",
                        CmpOp::Ne => "icmp ne",
                        CmpOp::Lt if s => "icmp slt",
                        CmpOp::Le if s => "icmp sle",
                        CmpOp::Gt if s => "icmp sgt",
                        CmpOp::Ge if s => "icmp sge",
                        CmpOp::Lt => "icmp ult",
                        CmpOp::Le => "icmp ule",
                        CmpOp::Gt => "icmp ugt",
                        CmpOp::Ge => "icmp uge",
                    }
                };
                let tt = if t == SType::Ptr { "ptr addrspace(1)" } else { ty(t) };
                self.def(*dst, format!("{c} {tt} {x}, {y}"));
            }
            Inst::Select { dst, cond, on_true, on_false } => {
                let t = ty(self.t(*dst));
                let (c, a, b) = (self.n(*cond), self.n(*on_true), self.n(*on_false));
                self.def(*dst, format!("select i1 {c}, {t} {a}, {t} {b}"));
            }
            Inst::Cast { dst, src } => self.cast(*dst, *src)?,
            Inst::Bitcast { dst, src } => {
                let (dt, st) = (self.t(*dst), self.t(*src));
                let s = self.n(*src);
                let e = match (dt, st) {
                    (SType::Ptr, _) => format!("inttoptr {} {s} to ptr addrspace(1)", ty(st)),
                    (_, SType::Ptr) => format!("ptrtoint ptr addrspace(1) {s} to {}", ty(dt)),
                    _ => format!("bitcast {} {s} to {}", ty(st), ty(dt)),
                };
                self.def(*dst, e);
            }
            Inst::Approx { dst, func, src } => {
                let s = self.n(*src);
                let (f, arg) = match func {
                    ApproxFn::Exp2 => ("llvm.amdgcn.exp2.f32", s),
                    ApproxFn::Log2 => ("llvm.amdgcn.log.f32", s),
                    ApproxFn::Rsqrt => ("llvm.amdgcn.rsq.f32", s),
                    ApproxFn::Rcp => ("llvm.amdgcn.rcp.f32", s),
                    // v_sin/v_cos take revolutions.
                    ApproxFn::Sin | ApproxFn::Cos => {
                        let r = self.fresh();
                        self.line(format!(
                            "{r} = fmul float {s}, {}",
                            float_lit(SType::F32, std::f64::consts::FRAC_1_PI / 2.0)
                        ));
                        (if *func == ApproxFn::Sin { "llvm.amdgcn.sin.f32" } else { "llvm.amdgcn.cos.f32" }, r)
                    }
                };
                self.declare(&format!("declare float @{f}(float)"));
                let v = self.call("float", f, &[format!("float {arg}")]);
                self.alias(*dst, v);
            }
            Inst::AddrOffset { dst, base, offset, scale } => {
                let ot = self.t(*offset);
                let o = self.n(*offset);
                let wide = if matches!(ot, SType::Int { bits: 64, .. }) {
                    o
                } else {
                    let w = self.fresh();
                    let ext = if signed(ot) { "sext" } else { "zext" };
                    self.line(format!("{w} = {ext} i32 {o} to i64"));
                    w
                };
                let m = self.fresh();
                self.line(format!("{m} = mul i64 {wide}, {scale}"));
                let b = self.n(*base);
                self.def(*dst, format!("getelementptr i8, ptr addrspace(1) {b}, i64 {m}"));
            }
            Inst::Fp8Convert { format, .. } => {
                return Err(EmitError(format!(
                    "no OCP `{format}` conversion instruction on AMD targets (the lowering converts with integer and f32 instructions)"
                )))
            }
            Inst::Fma { dst, a, b, c } => {
                let t = ty(self.t(*dst));
                self.declare(&format!("declare {t} @llvm.fma.{}({t}, {t}, {t})", llvm_suffix(self.t(*dst))));
                let (x, y, z) = (self.n(*a), self.n(*b), self.n(*c));
                let v = self.call(
                    t,
                    &format!("llvm.fma.{}", llvm_suffix(self.t(*dst))),
                    &[format!("{t} {x}"), format!("{t} {y}"), format!("{t} {z}")],
                );
                self.alias(*dst, v);
            }
            Inst::Mov { dst, src } => {
                let s = self.n(*src);
                self.alias(*dst, s);
            }
            Inst::Pack { dst, lo, hi } => {
                let bits = |w: &mut Writer, r: Reg| {
                    let v = w.n(r);
                    let i = w.fresh();
                    w.line(format!("{i} = bitcast {} {v} to i16", ty(w.t(r))));
                    let z = w.fresh();
                    w.line(format!("{z} = zext i16 {i} to i32"));
                    z
                };
                let (l, h) = (bits(self, *lo), bits(self, *hi));
                let s = self.fresh();
                self.line(format!("{s} = shl i32 {h}, 16"));
                self.def(*dst, format!("or i32 {l}, {s}"));
            }
            Inst::Clock { dst } => {
                // s_memrealtime counts at 100 MHz.
                self.declare("declare i64 @llvm.amdgcn.s.memrealtime()");
                let c = self.call("i64", "llvm.amdgcn.s.memrealtime", &[]);
                self.def(*dst, format!("mul i64 {c}, 10"));
            }
            _ => return Err(EmitError(format!("`{i:?}` is not a scalar instruction"))),
        }
        Ok(())
    }

    pub(super) fn unary(&mut self, dst: Reg, op: UnaryOp, src: Reg) -> Result<(), EmitError> {
        let t = self.t(dst);
        let s = self.n(src);
        let lt = ty(t);
        if matches!(t, SType::F16 | SType::BF16) {
            return err("half-float arithmetic in the SIMT IR (the lowering computes in f32)");
        }
        if t.is_float() {
            let sfx = llvm_suffix(t);
            let f = match op {
                UnaryOp::Neg => {
                    self.def(dst, format!("fneg {lt} {s}"));
                    return Ok(());
                }
                UnaryOp::Abs => "fabs",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Floor => "floor",
                UnaryOp::Ceil => "ceil",
                _ => return err(format!("`{op}` on {t:?} is not a SIMT primitive")),
            };
            self.declare(&format!("declare {lt} @llvm.{f}.{sfx}({lt})"));
            let v = self.call(lt, &format!("llvm.{f}.{sfx}"), &[format!("{lt} {s}")]);
            self.alias(dst, v);
            return Ok(());
        }
        match op {
            UnaryOp::Neg => self.def(dst, format!("sub {lt} 0, {s}")),
            UnaryOp::Not if t == SType::Pred => self.def(dst, format!("xor i1 {s}, true")),
            UnaryOp::Not => self.def(dst, format!("xor {lt} {s}, -1")),
            UnaryOp::Abs => {
                self.declare(&format!("declare {lt} @llvm.abs.{lt}({lt}, i1)"));
                let v = self.call(lt, &format!("llvm.abs.{lt}"), &[format!("{lt} {s}"), "i1 false".into()]);
                self.alias(dst, v);
            }
            _ => return err(format!("`{op}` on {t:?} is not a SIMT primitive")),
        }
        Ok(())
    }

    pub(super) fn binary(&mut self, dst: Reg, op: BinaryOp, a: Reg, b: Reg) -> Result<(), EmitError> {
        let t = self.t(dst);
        let (x, y) = (self.n(a), self.n(b));
        let lt = ty(t);
        if matches!(t, SType::F16 | SType::BF16) {
            return err("half-float arithmetic in the SIMT IR (the lowering computes in f32)");
        }
        if t.is_float() {
            let name = match op {
                BinaryOp::Add => "fadd",
                BinaryOp::Sub => "fsub",
                BinaryOp::Mul => "fmul",
                BinaryOp::Div => "fdiv",
                BinaryOp::Min | BinaryOp::Max => {
                    let f = if op == BinaryOp::Min { "minnum" } else { "maxnum" };
                    let sfx = llvm_suffix(t);
                    self.declare(&format!("declare {lt} @llvm.{f}.{sfx}({lt}, {lt})"));
                    let v = self.call(lt, &format!("llvm.{f}.{sfx}"), &[format!("{lt} {x}"), format!("{lt} {y}")]);
                    self.alias(dst, v);
                    return Ok(());
                }
                _ => return err(format!("`{op}` on floats is not a SIMT primitive (the lowering expands it)")),
            };
            self.def(dst, format!("{name} {lt} {x}, {y}"));
            return Ok(());
        }
        let s = signed(t);
        let name = match op {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div if s => "sdiv",
            BinaryOp::Div => "udiv",
            BinaryOp::Rem if s => "srem",
            BinaryOp::Rem => "urem",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::Shl => "shl",
            BinaryOp::Shr if s => "ashr",
            BinaryOp::Shr => "lshr",
            BinaryOp::Min | BinaryOp::Max => {
                let f = match (op, s) {
                    (BinaryOp::Min, true) => "smin",
                    (BinaryOp::Min, false) => "umin",
                    (_, true) => "smax",
                    _ => "umax",
                };
                self.declare(&format!("declare {lt} @llvm.{f}.{lt}({lt}, {lt})"));
                let v = self.call(lt, &format!("llvm.{f}.{lt}"), &[format!("{lt} {x}"), format!("{lt} {y}")]);
                self.alias(dst, v);
                return Ok(());
            }
            _ => return err(format!("`{op}` on {t:?} is not a SIMT primitive")),
        };
        if t == SType::Pred && !matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor) {
            return err(format!("`{op}` on i1"));
        }
        self.def(dst, format!("{name} {lt} {x}, {y}"));
        Ok(())
    }

    pub(super) fn cast(&mut self, dst: Reg, src: Reg) -> Result<(), EmitError> {
        let (dt, st) = (self.t(dst), self.t(src));
        let s = self.n(src);
        let (dl, sl) = (ty(dt), ty(st));
        if dt == st {
            self.alias(dst, s);
            return Ok(());
        }
        // Conversions through f32 (half floats compute there; integers and f64 reach half
        // floats through f32, as on every backend).
        let to_f32 = |w: &mut Writer, v: &str, from: SType| -> String {
            match from {
                SType::F32 => v.to_string(),
                SType::F16 | SType::BF16 => {
                    let x = w.fresh();
                    w.line(format!("{x} = fpext {} {v} to float", ty(from)));
                    x
                }
                SType::F64 => {
                    let x = w.fresh();
                    w.line(format!("{x} = fptrunc double {v} to float"));
                    x
                }
                SType::Pred => {
                    let x = w.fresh();
                    w.line(format!("{x} = uitofp i1 {v} to float"));
                    x
                }
                t => {
                    let x = w.fresh();
                    let c = if signed(t) { "sitofp" } else { "uitofp" };
                    w.line(format!("{x} = {c} {} {v} to float", ty(t)));
                    x
                }
            }
        };
        match (dt, st) {
            (SType::Pred, _) if st.is_float() => self.def(dst, format!("fcmp une {sl} {s}, {}", float_lit(st, 0.0))),
            (SType::Pred, _) => self.def(dst, format!("icmp ne {sl} {s}, 0")),
            (SType::F64, SType::Pred) => self.def(dst, format!("uitofp i1 {s} to double")),
            (SType::F64, _) if st.is_float() => {
                let f = to_f32(self, &s, st);
                self.def(dst, format!("fpext float {f} to double"));
            }
            (SType::F64, _) => {
                let c = if signed(st) { "sitofp" } else { "uitofp" };
                self.def(dst, format!("{c} {sl} {s} to double"));
            }
            (SType::F32, _) => {
                let f = to_f32(self, &s, st);
                self.alias(dst, f);
            }
            (SType::F16 | SType::BF16, _) => {
                let f = to_f32(self, &s, st);
                self.def(dst, format!("fptrunc float {f} to {dl}"));
            }
            (_, _) if st.is_float() => {
                // Truncation toward zero, saturating (NaN: the lowering selects 0).
                let (v, from) = if st == SType::F64 { (s, "double") } else { (to_f32(self, &s, st), "float") };
                let wide = if matches!(dt, SType::Int { bits: 64, .. }) { "i64" } else { "i32" };
                let (bits, sg) = match dt {
                    SType::Int { bits, signed } => (bits, signed),
                    _ => return err(format!("cast from {st:?} to {dt:?}")),
                };
                let it = format!("i{bits}");
                let f = if sg { "fptosi" } else { "fptoui" };
                let name = format!("llvm.{f}.sat.{it}.{}", if from == "double" { "f64" } else { "f32" });
                self.declare(&format!("declare {it} @{name}({from})"));
                let r = self.call(&it, &name, &[format!("{from} {v}")]);
                if bits < 32 {
                    let ext = if sg { "sext" } else { "zext" };
                    self.def(dst, format!("{ext} {it} {r} to {wide}"));
                } else {
                    self.alias(dst, r);
                }
            }
            (_, SType::Pred) => self.def(dst, format!("zext i1 {s} to {dl}")),
            (SType::Int { bits: db, signed: ds }, SType::Int { bits: sb, signed: ss }) => {
                let (dw, sw) = (if db == 64 { 64 } else { 32 }, if sb == 64 { 64 } else { 32 });
                if db < 32 {
                    // Truncate to the narrow type, then extend into the 32-bit register.
                    let x = self.fresh();
                    self.line(format!("{x} = trunc i{sw} {s} to i{db}"));
                    let ext = if ds { "sext" } else { "zext" };
                    self.def(dst, format!("{ext} i{db} {x} to i32"));
                } else if dw == sw {
                    self.alias(dst, s);
                } else if dw < sw {
                    self.def(dst, format!("trunc i{sw} {s} to i{dw}"));
                } else {
                    let ext = if ss { "sext" } else { "zext" };
                    self.def(dst, format!("{ext} i{sw} {s} to i{dw}"));
                }
            }
            _ => return err(format!("cast from {st:?} to {dt:?}")),
        }
        Ok(())
    }
}
