//! The LLVM IR writer for `amdgcn-amd-amdhsa` (code object v5): one SIMT instruction at a time.
//!
//! Every decision is the lowering's (`trident_core::simt`): this file only spells primitives in
//! LLVM IR. Registers become SSA values; the SIMT IR's loop-carried registers become `phi`
//! nodes of structured loops and branches; predicated memory accesses become conditional
//! blocks; narrow integers live extended in `i32` as in the PTX writer. Scopes follow AMDGPU's
//! sync scopes: program -> `workgroup`, GPU -> `agent`, system -> no scope (`SHMEM.md`).

use std::fmt::Write;
use trident_core::ir::{AtomicOp, Axis, BinaryOp, CmpOp, Literal, MemSemantic, Scope, SignalOp, UnaryOp};
use trident_core::simt::{ApproxFn, Inst, Kernel, Reg, SType, Special};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EmitError(pub String);

fn err<T>(m: impl Into<String>) -> Result<T, EmitError> {
    Err(EmitError(m.into()))
}

/// The LLVM type a register of `t` lives in.
fn ty(t: SType) -> &'static str {
    match t {
        SType::Pred => "i1",
        SType::Int { bits: 64, .. } => "i64",
        SType::Int { .. } => "i32",
        SType::F16 => "half",
        SType::BF16 => "bfloat",
        SType::F32 => "float",
        SType::F64 => "double",
        SType::Ptr => "ptr addrspace(1)",
    }
}

/// The type of `t` in memory (narrow integers and predicates are stored narrow).
fn mem_ty(t: SType) -> &'static str {
    match t {
        SType::Pred | SType::Int { bits: 8, .. } => "i8",
        SType::Int { bits: 16, .. } => "i16",
        _ => ty(t),
    }
}

fn size(t: SType) -> u32 {
    match t {
        SType::Pred | SType::Int { bits: 8, .. } => 1,
        SType::Int { bits: 16, .. } | SType::F16 | SType::BF16 => 2,
        SType::Int { bits: 64, .. } | SType::F64 | SType::Ptr => 8,
        _ => 4,
    }
}

fn signed(t: SType) -> bool {
    matches!(t, SType::Int { signed: true, .. })
}

fn scope(s: Scope) -> &'static str {
    match s {
        Scope::Cta => " syncscope(\"workgroup\")",
        Scope::Gpu => " syncscope(\"agent\")",
        Scope::Sys => "",
    }
}

fn order(s: MemSemantic) -> &'static str {
    match s {
        MemSemantic::Relaxed => "monotonic",
        MemSemantic::Acquire => "acquire",
        MemSemantic::Release => "release",
        MemSemantic::AcqRel => "acq_rel",
    }
}

/// An LLVM float literal: the double-precision bits of the (exactly representable) value, or
/// the raw bits for half and bfloat.
fn float_lit(t: SType, x: f64) -> String {
    match t {
        SType::F64 => format!("0x{:016X}", x.to_bits()),
        SType::F32 => format!("0x{:016X}", ((x as f32) as f64).to_bits()),
        SType::F16 => format!("0xH{:04X}", half::f16::from_f32(x as f32).to_bits()),
        _ => format!("0xR{:04X}", half::bf16::from_f32(x as f32).to_bits()),
    }
}

/// Where a loop's `phi` nodes go and their two incoming edges.
struct Edges<'a> {
    /// Offset in the output of the header's first instruction.
    mark: usize,
    from: &'a str,
    latch: &'a str,
    inits: &'a [String],
    nexts: &'a [String],
}

struct Writer<'k> {
    k: &'k Kernel,
    names: Vec<String>,
    out: String,
    tmp: u32,
    labels: u32,
    /// The label of the block being written.
    block: String,
    declares: std::collections::BTreeSet<String>,
}

impl Writer<'_> {
    fn n(&self, r: Reg) -> String {
        self.names[r.0 as usize].clone()
    }

    fn t(&self, r: Reg) -> SType {
        self.k.ty(r)
    }

    fn fresh(&mut self) -> String {
        self.tmp += 1;
        format!("%t{}", self.tmp)
    }

    fn label(&mut self, what: &str) -> String {
        self.labels += 1;
        format!("{what}{}", self.labels)
    }

    fn line(&mut self, s: impl AsRef<str>) {
        self.out.push_str("  ");
        self.out.push_str(s.as_ref());
        self.out.push('\n');
    }

    fn start(&mut self, label: &str) {
        let _ = writeln!(self.out, "{label}:");
        self.block = label.to_string();
    }

    /// Defines `dst` as the value of `expr` (an instruction producing a value).
    fn def(&mut self, dst: Reg, expr: String) {
        let name = format!("%r{}", dst.0);
        self.line(format!("{name} = {expr}"));
        self.names[dst.0 as usize] = name;
    }

    fn declare(&mut self, d: &str) {
        self.declares.insert(d.to_string());
    }

    fn call(&mut self, ret: &str, f: &str, args: &[String]) -> String {
        let t = self.fresh();
        self.line(format!("{t} = call {ret} @{f}({})", args.join(", ")));
        t
    }

    /// Runs `body` in a block taken only where `pred` holds (when there is one); `dst` (if
    /// any) gets the value `body` returns there and `other` elsewhere.
    fn guarded(
        &mut self,
        pred: Option<Reg>,
        out: Option<(Reg, String)>,
        body: impl FnOnce(&mut Self) -> Result<Option<String>, EmitError>,
    ) -> Result<(), EmitError> {
        let Some(p) = pred else {
            let v = body(self)?;
            if let (Some((dst, _)), Some(v)) = (out, v) {
                self.alias(dst, v);
            }
            return Ok(());
        };
        let (then, join) = (self.label("then"), self.label("join"));
        let from = self.block.clone();
        let pn = self.n(p);
        self.line(format!("br i1 {pn}, label %{then}, label %{join}"));
        self.start(&then);
        let v = body(self)?;
        let then_end = self.block.clone();
        self.line(format!("br label %{join}"));
        self.start(&join);
        if let (Some((dst, other)), Some(v)) = (out, v) {
            let t = ty(self.t(dst));
            self.def(dst, format!("phi {t} [ {v}, %{then_end} ], [ {other}, %{from} ]"));
        }
        Ok(())
    }

    /// `dst` names the value `v` (no instruction).
    fn alias(&mut self, dst: Reg, v: String) {
        self.names[dst.0 as usize] = v;
    }

    fn gep(&mut self, base: &str, space: u32, off: &str, off_ty: &str) -> String {
        let t = self.fresh();
        self.line(format!("{t} = getelementptr i8, ptr addrspace({space}) {base}, {off_ty} {off}"));
        t
    }

    /// A value loaded as `mem_ty(t)` converted to its register type.
    fn widen_loaded(&mut self, t: SType, v: String) -> String {
        match t {
            SType::Pred => {
                let x = self.fresh();
                self.line(format!("{x} = icmp ne i8 {v}, 0"));
                x
            }
            SType::Int { bits: 8 | 16, signed } => {
                let x = self.fresh();
                let ext = if signed { "sext" } else { "zext" };
                self.line(format!("{x} = {ext} {} {v} to i32", mem_ty(t)));
                x
            }
            _ => v,
        }
    }

    /// A register value converted to its memory type.
    fn narrow_stored(&mut self, t: SType, v: String) -> String {
        match t {
            SType::Pred => {
                let x = self.fresh();
                self.line(format!("{x} = zext i1 {v} to i8"));
                x
            }
            SType::Int { bits: 8 | 16, .. } => {
                let x = self.fresh();
                self.line(format!("{x} = trunc i32 {v} to {}", mem_ty(t)));
                x
            }
            _ => v,
        }
    }

    fn zero(&self, t: SType) -> String {
        match t {
            SType::Pred => "false".into(),
            SType::Ptr => "null".into(),
            t if t.is_float() => float_lit(t, 0.0),
            _ => "0".into(),
        }
    }

    fn insts(&mut self, body: &[Inst]) -> Result<(), EmitError> {
        for i in body {
            self.inst(i)?;
        }
        Ok(())
    }

    fn lane_id(&mut self) -> String {
        self.declare("declare i32 @llvm.amdgcn.mbcnt.lo(i32, i32)");
        self.declare("declare i32 @llvm.amdgcn.mbcnt.hi(i32, i32)");
        let lo = self.call("i32", "llvm.amdgcn.mbcnt.lo", &["i32 -1".into(), "i32 0".into()]);
        self.call("i32", "llvm.amdgcn.mbcnt.hi", &["i32 -1".into(), format!("i32 {lo}")])
    }

    fn inst(&mut self, i: &Inst) -> Result<(), EmitError> {
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
            Inst::Shuffle { dst, src, lane_xor } => self.shuffle(*dst, *src, *lane_xor)?,
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
            Inst::Barrier => self.barrier(),
            Inst::BarrierAny { .. } => {
                return err("BarrierAny reached the AMD writer (protocol::expand builds it from LDS for this target)")
            }
            Inst::Atomic { dst, op, addr, value, pred, sem, scope: sc } => {
                let t = self.t(*value);
                let (a, v) = (self.n(*addr), self.n(*value));
                let f = t.is_float();
                let name = match (op, f, signed(t)) {
                    (AtomicOp::Add, true, _) => "fadd",
                    (AtomicOp::Add, false, _) => "add",
                    (AtomicOp::Max, true, _) => "fmax",
                    (AtomicOp::Min, true, _) => "fmin",
                    (AtomicOp::Max, false, true) => "max",
                    (AtomicOp::Min, false, true) => "min",
                    (AtomicOp::Max, false, false) => "umax",
                    (AtomicOp::Min, false, false) => "umin",
                    (AtomicOp::And, ..) => "and",
                    (AtomicOp::Or, ..) => "or",
                    (AtomicOp::Xor, ..) => "xor",
                    (AtomicOp::Xchg, ..) => "xchg",
                };
                if size(t) < 4 {
                    return err(format!("{}-byte atomics (the support matrix refuses them)", size(t)));
                }
                let (s, o) = (scope(*sc), order(*sem));
                let zero = self.zero(t);
                self.guarded(*pred, Some((*dst, zero)), |w| {
                    let r = w.fresh();
                    w.line(format!(
                        "{r} = atomicrmw {name} ptr addrspace(1) {a}, {} {v}{s} {o}, align {}",
                        ty(t),
                        size(t)
                    ));
                    Ok(Some(r))
                })?;
            }
            Inst::AtomicCas { dst, addr, expected, desired, pred, sem, scope: sc } => {
                let t = self.t(*desired);
                let it = if size(t) == 8 { "i64" } else { "i32" };
                let (a, e, d) = (self.n(*addr), self.n(*expected), self.n(*desired));
                let (s, o) = (scope(*sc), order(*sem));
                let fail = if sem.acquires() { "acquire" } else { "monotonic" };
                let zero = self.zero(t);
                self.guarded(*pred, Some((*dst, zero)), |w| {
                    let as_int = |w: &mut Writer, v: &str| {
                        if t.is_float() {
                            let x = w.fresh();
                            w.line(format!("{x} = bitcast {} {v} to {it}", ty(t)));
                            x
                        } else {
                            v.to_string()
                        }
                    };
                    let (ei, di) = (as_int(w, &e), as_int(w, &d));
                    let pair = w.fresh();
                    w.line(format!(
                        "{pair} = cmpxchg ptr addrspace(1) {a}, {it} {ei}, {it} {di}{s} {o} {fail}, align {}",
                        size(t)
                    ));
                    let old = w.fresh();
                    w.line(format!("{old} = extractvalue {{ {it}, i1 }} {pair}, 0"));
                    if t.is_float() {
                        let f = w.fresh();
                        w.line(format!("{f} = bitcast {it} {old} to {}", ty(t)));
                        Ok(Some(f))
                    } else {
                        Ok(Some(old))
                    }
                })?;
            }
            Inst::AtomicLoad { dst, addr, pred, sem, scope: sc } => {
                let t = self.t(*dst);
                let a = self.n(*addr);
                let (s, o) = (scope(*sc), order(*sem));
                let zero = self.zero(t);
                self.guarded(*pred, Some((*dst, zero)), |w| {
                    let v = w.fresh();
                    w.line(format!("{v} = load atomic {}, ptr addrspace(1) {a}{s} {o}, align {}", ty(t), size(t)));
                    Ok(Some(v))
                })?;
            }
            Inst::AtomicStore { addr, value, pred, sem, scope: sc } => {
                let t = self.t(*value);
                let (a, v) = (self.n(*addr), self.n(*value));
                let (s, o) = (scope(*sc), order(*sem));
                self.guarded(*pred, None, |w| {
                    w.line(format!("store atomic {} {v}, ptr addrspace(1) {a}{s} {o}, align {}", ty(t), size(t)));
                    Ok(None)
                })?;
            }
            Inst::AsyncCopy { .. } | Inst::AsyncCommit | Inst::AsyncWait { .. } => {
                return err("asynchronous copies: gfx90a/gfx942 have none the lowering uses")
            }
            Inst::MatrixLoad { .. } => {
                return err("`ldmatrix` is NVIDIA's; the lowering reads MFMA fragments by lane maps")
            }
            Inst::MatrixDescriptor { .. }
            | Inst::Wgmma { .. }
            | Inst::WgmmaFence
            | Inst::WgmmaCommit
            | Inst::WgmmaWait { .. }
            | Inst::FenceProxyAsync
            | Inst::FenceProxyAsyncGlobal
            | Inst::MbarrierInit { .. }
            | Inst::FenceMbarrierInit
            | Inst::MbarrierInval { .. }
            | Inst::MbarrierExpectTx { .. }
            | Inst::MbarrierWait { .. }
            | Inst::TmaLoad { .. }
            | Inst::MbarrierArrive { .. }
            | Inst::TmaStore { .. }
            | Inst::BulkCommit
            | Inst::BulkWait { .. }
            | Inst::Specialized { .. } => return err("`wgmma`, TMA, mbarriers and their fences are Hopper's (sm_90a)"),
            Inst::Matmul { atom, d, a, b, c, ab } => self.mfma(atom.name, d, a, b, c, *ab)?,
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
            Inst::Exit => {
                self.line("ret void");
                let dead = self.label("after_exit");
                self.start(&dead);
            }
            Inst::Origin { .. } => {}
            Inst::SymmAt { .. } | Inst::WaitSignals { .. } => {
                return err("a protocol instruction reached the writer (run simt::protocol::expand first)")
            }
            Inst::Fence { scope: sc } => self.line(format!("fence{} acq_rel", scope(*sc))),
            Inst::DeviceCall { call, .. } => {
                return err(format!(
                    "{call:?} at inter-node scope needs ROCSHMEM's device functions, which the AMD backend does not link yet"
                ))
            }
            Inst::Signal { addr, value, op, pred } => {
                let (a, v) = (self.n(*addr), self.n(*value));
                let op = *op;
                self.guarded(Some(*pred), None, |w| {
                    match op {
                        SignalOp::Set => {
                            w.line(format!("store atomic i64 {v}, ptr addrspace(1) {a} monotonic, align 8"))
                        }
                        SignalOp::Add => {
                            let r = w.fresh();
                            w.line(format!("{r} = atomicrmw add ptr addrspace(1) {a}, i64 {v} monotonic, align 8"));
                        }
                    }
                    Ok(None)
                })?;
            }
            Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results } => {
                let (head, bl, exit) = (self.label("loop"), self.label("body"), self.label("exit"));
                let from = self.block.clone();
                self.line(format!("br label %{head}"));
                self.start(&head);
                let it = ty(self.t(*iv));
                let ivn = format!("%r{}", iv.0);
                let next_iv = format!("%r{}_next", iv.0);
                // Phi names are fixed now; their latch values are known after the body.
                let mark = self.out.len();
                let phi_names = self.carried(phis);
                self.names[iv.0 as usize] = ivn.clone();
                let (lo_n, hi_n, st_n) = (self.n(*lo), self.n(*hi), self.n(*step));
                let inits_n: Vec<String> = inits.iter().map(|r| self.n(*r)).collect();
                let c = self.fresh();
                self.line(format!("{c} = icmp slt {it} {ivn}, {hi_n}"));
                self.line(format!("br i1 {c}, label %{bl}, label %{exit}"));
                self.start(&bl);
                self.insts(body)?;
                let nexts_n: Vec<String> = nexts.iter().map(|r| self.n(*r)).collect();
                self.line(format!("{next_iv} = add {it} {ivn}, {st_n}"));
                let latch = self.block.clone();
                self.line(format!("br label %{head}"));
                let iv_phi = format!("  {ivn} = phi {it} [ {lo_n}, %{from} ], [ {next_iv}, %{latch} ]\n");
                let edges = Edges { mark, from: &from, latch: &latch, inits: &inits_n, nexts: &nexts_n };
                self.close_loop(iv_phi, phis, &phi_names, edges, &exit, results);
            }
            Inst::If { cond, then_body, then_yields, else_body, else_yields, results } => {
                let (th, el, join) = (self.label("then"), self.label("else"), self.label("endif"));
                let c = self.n(*cond);
                self.line(format!("br i1 {c}, label %{th}, label %{el}"));
                self.start(&th);
                self.insts(then_body)?;
                let ty_n: Vec<String> = then_yields.iter().map(|r| self.n(*r)).collect();
                let th_end = self.block.clone();
                self.line(format!("br label %{join}"));
                self.start(&el);
                self.insts(else_body)?;
                let ey_n: Vec<String> = else_yields.iter().map(|r| self.n(*r)).collect();
                let el_end = self.block.clone();
                self.line(format!("br label %{join}"));
                self.start(&join);
                for ((r, a), b) in results.iter().zip(ty_n).zip(ey_n) {
                    let t = ty(self.t(*r));
                    self.def(*r, format!("phi {t} [ {a}, %{th_end} ], [ {b}, %{el_end} ]"));
                }
            }
            Inst::While { phis, inits, cond_body, cond, body, nexts, results } => {
                let (head, bl, exit) = (self.label("while"), self.label("wbody"), self.label("wexit"));
                let from = self.block.clone();
                let inits_n: Vec<String> = inits.iter().map(|r| self.n(*r)).collect();
                self.line(format!("br label %{head}"));
                self.start(&head);
                let mark = self.out.len();
                let phi_names = self.carried(phis);
                self.insts(cond_body)?;
                let c = self.n(*cond);
                self.line(format!("br i1 {c}, label %{bl}, label %{exit}"));
                self.start(&bl);
                self.insts(body)?;
                let nexts_n: Vec<String> = nexts.iter().map(|r| self.n(*r)).collect();
                let latch = self.block.clone();
                self.line(format!("br label %{head}"));
                let edges = Edges { mark, from: &from, latch: &latch, inits: &inits_n, nexts: &nexts_n };
                self.close_loop(String::new(), phis, &phi_names, edges, &exit, results);
            }
        }
        Ok(())
    }

    /// Names the loop-carried registers after their `phi` nodes (written by `close_loop` once
    /// the latch is known).
    fn carried(&mut self, phis: &[Reg]) -> Vec<String> {
        phis.iter()
            .map(|p| {
                let name = format!("%r{}", p.0);
                self.names[p.0 as usize] = name.clone();
                name
            })
            .collect()
    }

    /// Writes a loop header's `phi` nodes (after `first`, the induction variable's, if any) at
    /// `edges.mark`, opens the exit block, and names the loop's results after the phis.
    fn close_loop(&mut self, first: String, phis: &[Reg], names: &[String], edges: Edges, exit: &str, results: &[Reg]) {
        let mut text = first;
        for ((p, name), (i, n)) in phis.iter().zip(names).zip(edges.inits.iter().zip(edges.nexts)) {
            let t = ty(self.t(*p));
            let _ = writeln!(text, "  {name} = phi {t} [ {i}, %{} ], [ {n}, %{} ]", edges.from, edges.latch);
        }
        self.out.insert_str(edges.mark, &text);
        self.start(exit);
        for (r, name) in results.iter().zip(names) {
            self.names[r.0 as usize] = name.clone();
        }
    }

    /// Workgroup barrier with the LDS (and global) accesses before it visible after it.
    fn barrier(&mut self) {
        self.declare("declare void @llvm.amdgcn.s.barrier()");
        self.line("fence syncscope(\"workgroup\") release");
        self.line("call void @llvm.amdgcn.s.barrier()");
        self.line("fence syncscope(\"workgroup\") acquire");
    }

    fn vload(
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

    fn vstore(&mut self, addr: Reg, values: &[Reg], pred: Option<Reg>, space: u32) -> Result<(), EmitError> {
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

    /// Butterfly shuffle across the wave through `ds_bpermute` (32-bit lanes).
    fn shuffle(&mut self, dst: Reg, src: Reg, xor: u32) -> Result<(), EmitError> {
        self.declare("declare i32 @llvm.amdgcn.ds.bpermute(i32, i32)");
        let t = self.t(src);
        let lane = self.lane_id();
        let other = self.fresh();
        self.line(format!("{other} = xor i32 {lane}, {xor}"));
        let addr = self.fresh();
        self.line(format!("{addr} = shl i32 {other}, 2"));
        let s = self.n(src);
        let perm = |w: &mut Writer, v: &str| {
            w.call("i32", "llvm.amdgcn.ds.bpermute", &[format!("i32 {addr}"), format!("i32 {v}")])
        };
        let v = match t {
            SType::Int { bits: 64, .. } | SType::F64 | SType::Ptr => {
                let i = self.fresh();
                match t {
                    SType::Ptr => self.line(format!("{i} = ptrtoint ptr addrspace(1) {s} to i64")),
                    SType::F64 => self.line(format!("{i} = bitcast double {s} to i64")),
                    _ => self.line(format!("{i} = add i64 {s}, 0")),
                }
                let (lo, hi) = (self.fresh(), self.fresh());
                self.line(format!("{lo} = trunc i64 {i} to i32"));
                let sh = self.fresh();
                self.line(format!("{sh} = lshr i64 {i}, 32"));
                self.line(format!("{hi} = trunc i64 {sh} to i32"));
                let (l2, h2) = (perm(self, &lo), perm(self, &hi));
                let (lz, hz) = (self.fresh(), self.fresh());
                self.line(format!("{lz} = zext i32 {l2} to i64"));
                self.line(format!("{hz} = zext i32 {h2} to i64"));
                let hs = self.fresh();
                self.line(format!("{hs} = shl i64 {hz}, 32"));
                let r = self.fresh();
                self.line(format!("{r} = or i64 {lz}, {hs}"));
                match t {
                    SType::Ptr => {
                        let p = self.fresh();
                        self.line(format!("{p} = inttoptr i64 {r} to ptr addrspace(1)"));
                        p
                    }
                    SType::F64 => {
                        let p = self.fresh();
                        self.line(format!("{p} = bitcast i64 {r} to double"));
                        p
                    }
                    _ => r,
                }
            }
            SType::F32 => {
                let i = self.fresh();
                self.line(format!("{i} = bitcast float {s} to i32"));
                let r = perm(self, &i);
                let f = self.fresh();
                self.line(format!("{f} = bitcast i32 {r} to float"));
                f
            }
            SType::Pred => {
                let i = self.fresh();
                self.line(format!("{i} = zext i1 {s} to i32"));
                let r = perm(self, &i);
                let f = self.fresh();
                self.line(format!("{f} = icmp ne i32 {r}, 0"));
                f
            }
            SType::F16 | SType::BF16 => {
                let (i, z) = (self.fresh(), self.fresh());
                self.line(format!("{i} = bitcast {} {s} to i16", ty(t)));
                self.line(format!("{z} = zext i16 {i} to i32"));
                let r = perm(self, &z);
                let (tr, f) = (self.fresh(), self.fresh());
                self.line(format!("{tr} = trunc i32 {r} to i16"));
                self.line(format!("{f} = bitcast i16 {tr} to {}", ty(t)));
                f
            }
            SType::Int { .. } => perm(self, &s),
        };
        self.alias(dst, v);
        Ok(())
    }

    /// One MFMA: A and B arrive as packed pairs (two `i32` per lane), C/D as `f32` registers.
    fn mfma(&mut self, atom: &str, d: &[Reg], a: &[Reg], b: &[Reg], c: &[Reg], ab: SType) -> Result<(), EmitError> {
        let (shape, half) = match (atom, ab) {
            ("mfma.32x32x8", SType::BF16) => ("32x32x8bf16.1k", "i16"),
            ("mfma.16x16x16", SType::BF16) => ("16x16x16bf16.1k", "i16"),
            ("mfma.32x32x8", SType::F16) => ("32x32x8f16", "half"),
            ("mfma.16x16x16", SType::F16) => ("16x16x16f16", "half"),
            _ => return err(format!("matrix atom `{atom}` on {ab:?} is not an AMD instruction")),
        };
        let nc = c.len();
        let f = format!("llvm.amdgcn.mfma.f32.{shape}");
        let op_t = format!("<4 x {half}>");
        let acc_t = format!("<{nc} x float>");
        self.declare(&format!("declare {acc_t} @{f}({op_t}, {op_t}, {acc_t}, i32, i32, i32)"));
        let operand = |w: &mut Writer, regs: &[Reg]| {
            let mut acc = "poison".to_string();
            for (j, r) in regs.iter().enumerate() {
                let v = w.n(*r);
                let x = w.fresh();
                w.line(format!("{x} = insertelement <2 x i32> {acc}, i32 {v}, i32 {j}"));
                acc = x;
            }
            let x = w.fresh();
            w.line(format!("{x} = bitcast <2 x i32> {acc} to {op_t}"));
            x
        };
        let (va, vb) = (operand(self, a), operand(self, b));
        let mut acc = "poison".to_string();
        for (j, r) in c.iter().enumerate() {
            let v = self.n(*r);
            let x = self.fresh();
            self.line(format!("{x} = insertelement {acc_t} {acc}, float {v}, i32 {j}"));
            acc = x;
        }
        let out = self.call(
            &acc_t,
            &f,
            &[
                format!("{op_t} {va}"),
                format!("{op_t} {vb}"),
                format!("{acc_t} {acc}"),
                "i32 0".into(),
                "i32 0".into(),
                "i32 0".into(),
            ],
        );
        for (j, r) in d.iter().enumerate() {
            self.def(*r, format!("extractelement {acc_t} {out}, i32 {j}"));
        }
        Ok(())
    }

    fn unary(&mut self, dst: Reg, op: UnaryOp, src: Reg) -> Result<(), EmitError> {
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

    fn binary(&mut self, dst: Reg, op: BinaryOp, a: Reg, b: Reg) -> Result<(), EmitError> {
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

    fn cast(&mut self, dst: Reg, src: Reg) -> Result<(), EmitError> {
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

fn llvm_suffix(t: SType) -> &'static str {
    match t {
        SType::F64 => "f64",
        SType::F16 => "f16",
        SType::BF16 => "bf16",
        _ => "f32",
    }
}

/// Writes the LLVM IR module of one kernel for `cpu` (`gfx942`, `gfx90a`).
pub fn write_llvm(k: &Kernel, cpu: &str) -> Result<String, EmitError> {
    let mut w = Writer {
        k,
        names: vec![String::new(); k.regs.len()],
        out: String::new(),
        tmp: 0,
        labels: 0,
        block: "entry".into(),
        declares: Default::default(),
    };
    w.start("entry");
    w.insts(&k.body)?;
    w.line("ret void");
    let params: Vec<String> = k
        .params
        .iter()
        .enumerate()
        .map(|(i, (_, t))| {
            let pt = match t {
                SType::Pred => "i8",
                SType::Int { bits: 8, .. } => "i8",
                SType::Int { bits: 16, .. } => "i16",
                t => ty(*t),
            };
            let attrs = if *t == SType::Ptr { " noundef" } else { "" };
            format!("{pt}{attrs} %arg{i}")
        })
        .collect();
    let mut m = String::new();
    let _ = writeln!(m, "; Generated by trident from kernel `{}` for {cpu}.", k.name);
    let _ = writeln!(m, "target triple = \"amdgcn-amd-amdhsa\"\n");
    if k.shared_bytes > 0 {
        let _ = writeln!(m, "@lds = internal addrspace(3) global [{} x i8] undef, align 16\n", k.shared_bytes);
    }
    for d in &w.declares {
        let _ = writeln!(m, "{d}");
    }
    let _ = writeln!(m, "\ndefine amdgpu_kernel void @{}({}) #0 {{", k.name, params.join(", "));
    m.push_str(&w.out);
    m.push_str("}\n\n");
    let _ = writeln!(
        m,
        "attributes #0 = {{ \"amdgpu-flat-work-group-size\"=\"1,{t}\" \"target-cpu\"=\"{cpu}\" \"denormal-fp-math-f32\"=\"ieee,ieee\" \"uniform-work-group-size\"=\"true\" }}\n",
        t = k.threads()
    );
    let _ = writeln!(m, "!0 = !{{}}");
    let _ = writeln!(m, "!llvm.module.flags = !{{!1}}");
    let _ = writeln!(m, "!1 = !{{i32 1, !\"amdhsa_code_object_version\", i32 500}}");
    Ok(m)
}
