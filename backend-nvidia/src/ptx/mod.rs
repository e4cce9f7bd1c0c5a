//! The PTX writer: SIMT IR to PTX text, one instruction at a time, each family of instructions
//! in its own file (`scalar`, `memory`, `matrix`, `sync`, `control`).
//!
//! Register classes: `%p` predicates, `%r` 32-bit (and narrower) integers, `%rd` 64-bit integers
//! and addresses, `%h` f16/bf16 storage, `%f` f32, `%fd` f64. f16/bf16 arithmetic converts to
//! f32, computes, and rounds back (`EXECUTION.md`); bf16 widens by a shift so that sm_80 needs
//! no `cvt.f32.bf16`.

use std::fmt::Write;
use trident_core::ir::{
    AtomicOp, Axis, BinaryOp, CallParam, CmpOp, DeviceCall, Literal, MemSemantic, Scope, SignalOp, UnaryOp, Vendor,
};
use trident_core::simt::{ApproxFn, Family, Inst, Kernel, Reg, SType, Special};
use trident_core::target::TargetDesc;

/// An instruction the writer cannot express for its types.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("PTX writer: {0}")]
pub struct EmitError(pub String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    P,
    R,
    Rd,
    H,
    F,
    Fd,
}

fn class(t: SType) -> Class {
    match t {
        SType::Pred => Class::P,
        SType::Int { bits: 64, .. } | SType::Ptr => Class::Rd,
        SType::Int { .. } => Class::R,
        SType::F16 | SType::BF16 => Class::H,
        SType::F32 => Class::F,
        SType::F64 => Class::Fd,
    }
}

fn prefix(c: Class) -> &'static str {
    match c {
        Class::P => "%p",
        Class::R => "%r",
        Class::Rd => "%rd",
        Class::H => "%h",
        Class::F => "%f",
        Class::Fd => "%fd",
    }
}

/// PTX type suffix for arithmetic on a type.
fn arith(t: SType) -> &'static str {
    match t {
        SType::Int { bits: 64, signed: true } => "s64",
        SType::Int { bits: 64, signed: false } | SType::Ptr => "u64",
        SType::Int { signed: true, .. } => "s32",
        SType::Int { signed: false, .. } => "u32",
        SType::F32 | SType::F16 | SType::BF16 => "f32",
        SType::F64 => "f64",
        SType::Pred => "pred",
    }
}

/// PTX type for memory accesses and parameters.
fn mem(t: SType) -> &'static str {
    match t {
        SType::Pred | SType::Int { bits: 8, signed: false } => "u8",
        SType::Int { bits: 8, signed: true } => "s8",
        SType::Int { bits: 16, signed: true } => "s16",
        SType::Int { bits: 16, signed: false } => "u16",
        SType::Int { bits: 32, signed: true } => "s32",
        SType::Int { bits: 32, signed: false } => "u32",
        SType::Int { signed: true, .. } => "s64",
        SType::Int { .. } | SType::Ptr => "u64",
        SType::F16 | SType::BF16 => "b16",
        SType::F32 => "f32",
        SType::F64 => "f64",
    }
}

/// A PTX register's name (`%rd12`): a class and a number, written when formatted (the writer
/// names thousands of registers; none needs a string of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Name {
    class: Class,
    index: u32,
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(prefix(self.class))?;
        std::fmt::Display::fmt(&self.index, f)
    }
}

struct Writer<'k> {
    k: &'k Kernel,
    target: &'static TargetDesc,
    names: Vec<Name>,
    counts: [u32; 6],
    body: String,
    labels: u32,
    /// Register holding the shared-memory window address of the program's scratch.
    smem: Option<Name>,
    /// Registers holding the generic addresses of the tensor-map parameters, by map.
    maps: Vec<Name>,
    /// After an `Inst::Specialized`: the consumer threads, the only ones left.
    consumers: Option<u32>,
    /// Inside a ping-pong region's consumers: the register holding the group's barrier id
    /// (2 + group) and the group's threads.
    group_barrier: Option<(Name, u32)>,
}

fn ci(c: Class) -> usize {
    c as usize
}

/// `w.line(format!(..))` without the intermediate string: one PTX statement written into the
/// body (the format arguments may read the writer: the body's borrow starts at the write).
macro_rules! line {
    ($w:expr, $($arg:tt)*) => {{
        $w.body.push_str("  ");
        let _ = $w.body.write_fmt(format_args!($($arg)*));
        $w.body.push_str(";\n");
    }};
}

mod control;
mod matrix;
mod memory;
mod scalar;
mod sync;

impl<'k> Writer<'k> {
    fn n(&self, r: Reg) -> Name {
        self.names[r.0 as usize]
    }

    fn temp(&mut self, c: Class) -> Name {
        let i = self.counts[ci(c)];
        self.counts[ci(c)] += 1;
        Name { class: c, index: i }
    }

    fn line(&mut self, s: String) {
        self.body.push_str("  ");
        self.body.push_str(&s);
        self.body.push_str(";\n");
    }

    /// An f32 register holding `r` (converting f16/bf16).
    fn widen(&mut self, r: Reg) -> String {
        match self.k.ty(r) {
            SType::F16 => {
                let f = self.temp(Class::F);
                line!(self, "cvt.f32.f16 {f}, {}", self.n(r));
                f.to_string()
            }
            SType::BF16 => {
                let (w, f) = (self.temp(Class::R), self.temp(Class::F));
                line!(self, "cvt.u32.u16 {w}, {}", self.n(r));
                line!(self, "shl.b32 {w}, {w}, 16");
                line!(self, "mov.b32 {f}, {w}");
                f.to_string()
            }
            _ => self.n(r).to_string(),
        }
    }

    /// Stores the f32 value `f` into `dst` (rounding to f16/bf16 when needed).
    fn narrow(&mut self, dst: Reg, f: &dyn std::fmt::Display) {
        let d = self.n(dst).to_string();
        match self.k.ty(dst) {
            SType::F16 => line!(self, "cvt.rn.f16.f32 {d}, {f}"),
            SType::BF16 => line!(self, "cvt.rn.bf16.f32 {d}, {f}"),
            _ => {
                if d != f.to_string() {
                    line!(self, "mov.f32 {d}, {f}")
                }
            }
        }
    }

    fn is_half(&self, r: Reg) -> bool {
        matches!(self.k.ty(r), SType::F16 | SType::BF16)
    }

    /// Writes `f(dst, srcs)` for f32/f64 registers. Half floats never reach arithmetic: the
    /// lowering converts them (`simt/mod.rs`'s contract), so the writer refuses them.
    fn float_op(&mut self, dst: Reg, srcs: &[Reg], op: impl Fn(&str, &[String]) -> String) -> Result<(), EmitError> {
        if self.is_half(dst) || srcs.iter().any(|s| self.is_half(*s)) {
            return Err(EmitError("half-float arithmetic in the SIMT IR (the lowering computes in f32)".into()));
        }
        let ws: Vec<String> = srcs.iter().map(|s| self.n(*s).to_string()).collect();
        let d = self.n(dst).to_string();
        let text = op(&d, &ws);
        self.line(text);
        Ok(())
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

    fn insts(&mut self, body: &[Inst]) -> Result<(), EmitError> {
        for i in body {
            self.inst(i)?;
        }
        Ok(())
    }

    fn label(&mut self) -> u32 {
        self.labels += 1;
        self.labels
    }

    fn mov(&mut self, dst: Reg, src: Reg) {
        if dst == src || self.n(dst) == self.n(src) {
            return;
        }
        let (d, s) = (self.n(dst).to_string(), self.n(src).to_string());
        let t = mov_type(self.k.ty(dst));
        line!(self, "mov.{t} {d}, {s}");
    }

    fn movs(&mut self, dsts: &[Reg], srcs: &[Reg]) {
        for (d, s) in dsts.iter().zip(srcs) {
            self.mov(*d, *s);
        }
    }

    /// `dsts = srcs` all at once (a source may be another destination); pairs that already
    /// share a register move nothing.
    fn parallel_movs(&mut self, dsts: &[Reg], srcs: &[Reg]) {
        let (dsts, srcs): (Vec<Reg>, Vec<Reg>) =
            dsts.iter().zip(srcs).filter(|(d, s)| self.n(**d) != self.n(**s)).map(|(d, s)| (*d, *s)).unzip();
        let temps: Vec<Name> = srcs
            .iter()
            .map(|s| {
                let c = class(self.k.ty(*s));
                let t = self.temp(c);
                let name = self.n(*s).to_string();
                let mt = mov_type(self.k.ty(*s));
                line!(self, "mov.{mt} {t}, {name}");
                t
            })
            .collect();
        for (d, t) in dsts.iter().zip(temps) {
            let (dn, mt) = (self.n(*d).to_string(), mov_type(self.k.ty(*d)));
            line!(self, "mov.{mt} {dn}, {t}");
        }
    }

    /// A 32-bit shared-window address for a byte offset register.
    fn shared_addr(&mut self, offset: Reg) -> Result<Name, EmitError> {
        let base = self.smem.ok_or_else(|| EmitError("shared access without shared memory".into()))?;
        let r = self.temp(Class::R);
        let o = self.n(offset).to_string();
        match class(self.k.ty(offset)) {
            Class::R => line!(self, "add.u32 {r}, {base}, {o}"),
            _ => {
                line!(self, "cvt.u32.u64 {r}, {o}");
                line!(self, "add.u32 {r}, {base}, {r}");
            }
        }
        Ok(r)
    }
}

fn sem_name(s: MemSemantic) -> &'static str {
    match s {
        MemSemantic::Relaxed => "relaxed",
        MemSemantic::Acquire => "acquire",
        MemSemantic::Release => "release",
        MemSemantic::AcqRel => "acq_rel",
    }
}

fn scope_name(s: Scope) -> &'static str {
    match s {
        Scope::Cta => "cta",
        Scope::Gpu => "gpu",
        Scope::Sys => "sys",
    }
}

/// Element type of a vector access (bit types: any register of the size).
/// 16-bit integers live extended in 32-bit registers: their loads say how (`s16` sign-, `u16`
/// zero-extends); a `b16` load would leave a negative value's upper bits clear.
fn vec_type(t: SType) -> &'static str {
    match t {
        SType::F16 | SType::BF16 => "b16",
        SType::Int { bits: 8, signed: true } => "s8",
        SType::Int { bits: 8, signed: false } => "u8",
        SType::Int { bits: 16, signed: true } => "s16",
        SType::Int { bits: 16, signed: false } => "u16",
        SType::F32 => "f32",
        SType::F64 => "f64",
        SType::Int { bits: 64, .. } | SType::Ptr => "b64",
        _ => "b32",
    }
}

fn mov_type(t: SType) -> &'static str {
    match class(t) {
        Class::P => "pred",
        Class::R => "b32",
        Class::Rd => "b64",
        Class::H => "b16",
        Class::F => "f32",
        Class::Fd => "f64",
    }
}

fn axis(a: Axis) -> &'static str {
    match a {
        Axis::X => "x",
        Axis::Y => "y",
        Axis::Z => "z",
    }
}

fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

fn bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// Writes the PTX module for one kernel.
/// The PTX parameter type of a device function's C parameter.
fn call_param(p: CallParam) -> &'static str {
    match p {
        CallParam::Ptr | CallParam::U64 => "b64",
        CallParam::I32 => "b32",
    }
}

pub fn write_ptx(k: &Kernel, target: &'static TargetDesc) -> Result<String, EmitError> {
    let mut w = Writer {
        k,
        target,
        names: Vec::with_capacity(k.regs.len()),
        counts: [0; 6],
        // About 40 bytes of PTX per SIMT register: one allocation instead of a dozen regrowths.
        body: String::with_capacity(40 * k.regs.len() + 4096),
        labels: 0,
        smem: None,
        maps: Vec::new(),
        consumers: None,
        group_barrier: None,
    };
    for &t in &k.regs {
        let c = class(t);
        let name = w.temp(c);
        w.names.push(name);
    }
    alias_accumulators(k, &mut w.names);
    if k.shared_bytes > 0 {
        let base = w.temp(Class::R);
        line!(w, "mov.u32 {base}, trident_smem");
        w.smem = Some(base);
    }
    let first_map = k.params.len();
    for i in 0..k.tensor_maps.len() {
        // A tensor map is read in place, by its generic address in the parameter space.
        let r = w.temp(Class::Rd);
        line!(w, "mov.b64 {r}, p{}", first_map + i);
        line!(w, "cvta.param.u64 {r}, {r}");
        w.maps.push(r);
    }
    w.insts(&k.body)?;
    let mut out = String::with_capacity(w.body.len() + 64 * (k.params.len() + 16) + 32 * k.regs.len());
    let _ = writeln!(out, "// Generated by trident from kernel `{}`.", k.name);
    let Some(isa) = target.isa_version else {
        return Err(EmitError(format!("target {} has no PTX ISA version: not an NVIDIA target", target.name)));
    };
    let _ = writeln!(out, ".version {isa}");
    let _ = writeln!(out, ".target {}", target.name);
    let _ = writeln!(out, ".address_size 64\n");
    if w.body.contains("\n  .loc 1 ") || w.body.starts_with("  .loc 1 ") {
        let _ = writeln!(out, ".file 1 \"{}.tile\"\n", k.name);
    }
    if k.shared_bytes > 0 {
        // 1024-byte aligned: swizzled `wgmma` operand layouts repeat at 1024-byte boundaries.
        let _ = writeln!(out, ".extern .shared .align 1024 .b8 trident_smem[];\n");
    }
    // NVSHMEM's device functions the inter-node lowering calls: defined by the shim the
    // runtime links in (`nvshmem_shim`).
    for call in k.device_calls() {
        let params: Vec<String> =
            call.params().iter().enumerate().map(|(i, p)| format!(".param .{} a{i}", call_param(*p))).collect();
        let _ = writeln!(out, ".extern .func {}({});", Vendor::Nvshmem.function(call), params.join(", "));
    }
    let n = k.params.len() + k.tensor_maps.len();
    let mut params: Vec<String> = k
        .params
        .iter()
        .enumerate()
        .map(|(i, (name, t))| {
            let ty = if *t == SType::Pred { "u8" } else { mem(*t) };
            format!("  .param .{ty} p{i}{} // %{name}", if i + 1 < n { "," } else { "" })
        })
        .collect();
    for (j, m) in k.tensor_maps.iter().enumerate() {
        let i = k.params.len() + j;
        let of = &k.params[m.ptr as usize].0;
        params.push(format!(
            "  .param .align 64 .b8 p{i}[128]{} // tensor map of %{of}",
            if i + 1 < n { "," } else { "" }
        ));
    }
    let _ = writeln!(out, ".visible .entry {}(\n{}\n) .maxntid {}, 1, 1\n{{", k.name, params.join("\n"), k.threads());
    for (c, n) in [
        (Class::P, "pred"),
        (Class::R, "b32"),
        (Class::Rd, "b64"),
        (Class::H, "b16"),
        (Class::F, "f32"),
        (Class::Fd, "f64"),
    ] {
        let count = w.counts[ci(c)];
        if count > 0 {
            let _ = writeln!(out, "  .reg .{n} {}<{count}>;", prefix(c));
        }
    }
    if k.shared_bytes > 0 {
        // Dynamic shared memory: the launch gives the size (beyond 48 KiB after an opt-in).
        let _ = writeln!(out, "  // {} bytes of dynamic shared memory", k.shared_bytes);
    }
    out.push('\n');
    out.push_str(&w.body);
    out.push_str("$EXIT:\n  ret;\n}\n");
    Ok(out)
}

/// Gives each `Wgmma`'s accumulator outputs the PTX registers of its inputs where nothing else
/// reads an input, so a chain of `wgmma`s (and the loop that carries it) accumulates in place:
/// moving accumulators between two `wgmma`s makes ptxas serialize them.
fn alias_accumulators(k: &Kernel, names: &mut [Name]) {
    fn count(body: &mut [Inst], uses: &mut [u32]) {
        for i in body.iter_mut() {
            trident_core::simt::for_each_use(i, &mut |r| uses[r.0 as usize] += 1);
            for b in i.bodies_mut() {
                count(b, uses);
            }
        }
    }
    fn walk(body: &[Inst], uses: &[u32], names: &mut [Name]) {
        for i in body {
            if let Inst::Wgmma { d, c, .. } = i {
                for (x, y) in d.iter().zip(c) {
                    if uses[y.0 as usize] == 1 {
                        names[x.0 as usize] = names[y.0 as usize];
                    }
                }
            }
            for b in i.bodies() {
                walk(b, uses, names);
            }
            // A loop that carries a chain in place leaves it in place: its results take the
            // phis' registers (dead after the loop), so no move reads an accumulator that a
            // `wgmma` may still be writing when the loop exits.
            if let Inst::Loop { phis, nexts, results, .. } = i {
                for ((p, n), r) in phis.iter().zip(nexts).zip(results) {
                    if names[p.0 as usize] == names[n.0 as usize] {
                        names[r.0 as usize] = names[p.0 as usize];
                    }
                }
            }
        }
    }
    if !has_wgmma(&k.body) {
        return;
    }
    let mut uses = vec![0u32; k.regs.len()];
    count(&mut k.body.clone(), &mut uses);
    walk(&k.body, &uses, names);
}

fn has_wgmma(body: &[Inst]) -> bool {
    body.iter().any(|i| matches!(i, Inst::Wgmma { .. }) || i.bodies().into_iter().any(|b| has_wgmma(b)))
}
