//! The LLVM IR writer for `amdgcn-amd-amdhsa` (code object v5): one SIMT instruction at a time,
//! each family of instructions in its own file (`scalar`, `memory`, `matrix`, `sync`, `control`).
//!
//! Every decision is the lowering's (`trident_core::simt`): this file only spells primitives in
//! LLVM IR. Registers become SSA values; the SIMT IR's loop-carried registers become `phi`
//! nodes of structured loops and branches; predicated memory accesses become conditional
//! blocks; narrow integers live extended in `i32` as in the PTX writer. Scopes follow AMDGPU's
//! sync scopes: program -> `workgroup`, GPU -> `agent`, system -> no scope (`SHMEM.md`).

use std::fmt::Write;
use trident_core::ir::{AtomicOp, Axis, BinaryOp, CmpOp, Literal, MemSemantic, Scope, SignalOp, UnaryOp};
use trident_core::simt::{ApproxFn, Family, Inst, Kernel, Reg, SType, Special};

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

mod control;
mod matrix;
mod memory;
mod scalar;
mod sync;

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
        match i.family() {
            Family::Scalar => self.scalar(i),
            Family::Memory => self.memory(i),
            Family::Matrix => self.matrix(i),
            Family::Sync => self.sync(i),
            Family::Control => self.control(i),
        }
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
