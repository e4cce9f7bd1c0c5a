//! The PTX writer: SIMT IR to PTX text, one instruction at a time.
//!
//! Register classes: `%p` predicates, `%r` 32-bit (and narrower) integers, `%rd` 64-bit integers
//! and addresses, `%h` f16/bf16 storage, `%f` f32, `%fd` f64. f16/bf16 arithmetic converts to
//! f32, computes, and rounds back (`EXECUTION.md`); bf16 widens by a shift so that sm_80 needs
//! no `cvt.f32.bf16`.

use std::fmt::Write;
use trident_core::ir::{
    AtomicOp, Axis, BinaryOp, CallParam, CmpOp, DeviceCall, Literal, MemSemantic, Scope, SignalOp, UnaryOp, Vendor,
};
use trident_core::simt::{ApproxFn, Inst, Kernel, Reg, SType, Special};
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
            Inst::Load { dst, addr, pred, other } => {
                if let Some(o) = other {
                    self.mov(*dst, *o);
                }
                let a = self.n(*addr).to_string();
                self.load_line("global", *dst, &a, *pred);
            }
            Inst::VLoad { dsts, addr, pred, others } => {
                let t = self.k.ty(dsts[0]);
                for (d, o) in dsts.iter().zip(others) {
                    self.mov(*d, *o);
                }
                let names: Vec<String> = dsts.iter().map(|d| self.n(*d).to_string()).collect();
                let a = self.n(*addr).to_string();
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                line!(self, "{guard}ld.global.v{}.{} {{{}}}, [{a}]", dsts.len(), vec_type(t), names.join(", "));
            }
            Inst::VStore { addr, values, pred } => {
                let t = self.k.ty(values[0]);
                let names: Vec<String> = values.iter().map(|v| self.n(*v).to_string()).collect();
                let a = self.n(*addr).to_string();
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                line!(self, "{guard}st.global.v{}.{} [{a}], {{{}}}", values.len(), vec_type(t), names.join(", "));
            }
            Inst::IsAligned { dst, addr, bytes } => {
                let (d, a) = (self.n(*dst).to_string(), self.n(*addr).to_string());
                let t = self.temp(Class::Rd);
                line!(self, "and.b64 {t}, {a}, {}", bytes - 1);
                line!(self, "setp.eq.u64 {d}, {t}, 0");
            }
            Inst::Shuffle { dst, src, lane_xor } => self.shuffle(*dst, *src, *lane_xor),
            Inst::AsyncCopy { offset, addr, bytes, pred, zero_fill } => {
                let saddr = self.shared_addr(*offset)?;
                let (a, p) = (self.n(*addr).to_string(), self.n(*pred).to_string());
                let cache = if *bytes == 16 { "cg" } else { "ca" };
                if *zero_fill {
                    // A source size of 0 reads nothing and fills the destination with zeros.
                    let n = self.temp(Class::R);
                    line!(self, "selp.u32 {n}, {bytes}, 0, {p}");
                    line!(self, "cp.async.{cache}.shared.global [{saddr}], [{a}], {bytes}, {n}");
                } else {
                    line!(self, "@{p} cp.async.{cache}.shared.global [{saddr}], [{a}], {bytes}");
                }
            }
            Inst::AsyncCommit => self.line("cp.async.commit_group".into()),
            Inst::AsyncWait { pending } => line!(self, "cp.async.wait_group {pending}"),
            Inst::MatrixLoad { dsts, offset, trans } => {
                let addr = self.shared_addr(*offset)?;
                let names: Vec<String> = dsts.iter().map(|d| self.n(*d).to_string()).collect();
                let t = if *trans { ".trans" } else { "" };
                line!(
                    self,
                    "ldmatrix.sync.aligned.m8n8.x{}{t}.shared.b16 {{{}}}, [{addr}]",
                    dsts.len(),
                    names.join(", ")
                );
            }
            Inst::Matmul { atom, d, a, b, c, ab } => {
                if atom.name != trident_core::target::MMA_SYNC_M16N8K16.name {
                    return Err(EmitError(format!(
                        "matrix atom `{}` is not emitted for {}",
                        atom.name, self.target.name
                    )));
                }
                let t = if *ab == SType::BF16 { "bf16" } else { "f16" };
                let list = |w: &Self, rs: &[Reg]| rs.iter().map(|r| w.n(*r).to_string()).collect::<Vec<_>>().join(", ");
                let (dd, aa, bb, cc) = (list(self, d), list(self, a), list(self, b), list(self, c));
                line!(self, "mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{dd}}}, {{{aa}}}, {{{bb}}}, {{{cc}}}");
            }
            Inst::MatrixDescriptor { dst, offset, lbo, sbo, swizzle } => {
                let addr = self.shared_addr(*offset)?;
                let (d, t) = (self.n(*dst).to_string(), self.temp(Class::Rd));
                let fixed = trident_core::simt::smem::Descriptor::fixed_bits(*lbo, *sbo, *swizzle);
                line!(self, "cvt.u64.u32 {t}, {addr}");
                line!(self, "shr.u64 {t}, {t}, 4");
                line!(self, "and.b64 {t}, {t}, 16383");
                line!(self, "or.b64 {d}, {t}, {fixed:#x}");
            }
            Inst::Wgmma { d, c, a, b, n, ab, trans_b, scale_d } => {
                if !self.target.arch_specific {
                    return Err(EmitError(format!("wgmma needs sm_90a, not {}", self.target.name)));
                }
                // The instruction accumulates in place: the accumulator moves into `d` first
                // (nothing to move in a chain, see `alias_accumulators`), and moved registers
                // need a fence before the instruction reads them.
                let moved = d.iter().zip(c).any(|(x, y)| self.n(*x) != self.n(*y));
                self.movs(d, c);
                if moved {
                    self.line("wgmma.fence.sync.aligned".into());
                }
                let t = if *ab == SType::BF16 { "bf16" } else { "f16" };
                let p = match scale_d {
                    Some(p) => self.n(*p).to_string(),
                    None => {
                        let (p, one) = (self.temp(Class::P), self.temp(Class::R));
                        line!(self, "mov.b32 {one}, 1");
                        line!(self, "setp.ne.b32 {p}, {one}, 0");
                        p.to_string()
                    }
                };
                let dd = d.iter().map(|r| self.n(*r).to_string()).collect::<Vec<_>>().join(", ");
                let (da, db) = (self.n(*a).to_string(), self.n(*b).to_string());
                line!(
                    self,
                    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{dd}}}, {da}, {db}, {p}, 1, 1, 0, {}",
                    *trans_b as u32
                );
            }
            Inst::WgmmaFence => self.line("wgmma.fence.sync.aligned".into()),
            Inst::WgmmaCommit => self.line("wgmma.commit_group.sync.aligned".into()),
            Inst::WgmmaWait { pending } => line!(self, "wgmma.wait_group.sync.aligned {pending}"),
            Inst::FenceProxyAsync => self.line("fence.proxy.async.shared::cta".into()),
            Inst::FenceProxyAsyncGlobal => self.line("fence.proxy.async.global".into()),
            Inst::MbarrierInit { offset, count, pred } => {
                let (addr, p) = (self.shared_addr(*offset)?, self.n(*pred).to_string());
                line!(self, "@{p} mbarrier.init.shared::cta.b64 [{addr}], {count}");
            }
            Inst::FenceMbarrierInit => self.line("fence.mbarrier_init.release.cluster".into()),
            Inst::TmaStore { map, offset, coords, pred } => {
                let src = self.shared_addr(*offset)?;
                let m =
                    self.maps.get(*map as usize).cloned().ok_or_else(|| EmitError(format!("no tensor map {map}")))?;
                let (row, col, p) =
                    (self.n(coords[0]).to_string(), self.n(coords[1]).to_string(), self.n(*pred).to_string());
                line!(
                    self,
                    "@{p} cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [{m}, {{{col}, {row}}}], [{src}]"
                );
            }
            Inst::BulkCommit => self.line("cp.async.bulk.commit_group".into()),
            Inst::BulkWait { pending } => self.line(format!("cp.async.bulk.wait_group.read {pending}")),
            Inst::MbarrierArrive { offset, pred } => {
                let (addr, p) = (self.shared_addr(*offset)?, self.n(*pred).to_string());
                line!(self, "@{p} mbarrier.arrive.shared::cta.b64 _, [{addr}]");
            }
            Inst::Specialized { consumer_warps, producer, consumer } => {
                // The producer warps run their side and leave; barriers from here on are the
                // consumers' own (barrier 1 with their count), the producers having exited.
                let threads = consumer_warps * self.k.warp_size;
                let (l, t, p) = (self.label(), self.temp(Class::R), self.temp(Class::P));
                line!(self, "mov.u32 {t}, %tid.x");
                line!(self, "setp.lt.u32 {p}, {t}, {threads}");
                // Whole warps go one way: uniform within each warp.
                line!(self, "@{p} bra.uni $L{l}_consumer");
                self.insts(producer)?;
                self.line("bra.uni $EXIT".into());
                self.body.push_str(&format!("$L{l}_consumer:\n"));
                // Barriers in the consumers' side (a persistent loop's epilogue) are theirs too.
                self.consumers = Some(threads);
                self.insts(consumer)?;
            }
            Inst::MbarrierInval { offset, pred } => {
                let (addr, p) = (self.shared_addr(*offset)?, self.n(*pred).to_string());
                line!(self, "@{p} mbarrier.inval.shared::cta.b64 [{addr}]");
            }
            Inst::MbarrierExpectTx { offset, bytes, pred } => {
                let (addr, p) = (self.shared_addr(*offset)?, self.n(*pred).to_string());
                line!(self, "@{p} mbarrier.arrive.expect_tx.shared::cta.b64 _, [{addr}], {bytes}");
            }
            Inst::MbarrierWait { offset, parity } => {
                let (addr, par) = (self.shared_addr(*offset)?, self.n(*parity).to_string());
                let (l, done) = (self.label(), self.temp(Class::P));
                self.body.push_str(&format!("$L{l}_wait:\n"));
                line!(self, "mbarrier.try_wait.parity.shared::cta.b64 {done}, [{addr}], {par}");
                line!(self, "@!{done} bra $L{l}_wait");
            }
            Inst::TmaLoad { map, offset, coords, barrier, pred } => {
                let (dst, bar) = (self.shared_addr(*offset)?, self.shared_addr(*barrier)?);
                let m =
                    self.maps.get(*map as usize).cloned().ok_or_else(|| EmitError(format!("no tensor map {map}")))?;
                let (row, col, p) =
                    (self.n(coords[0]).to_string(), self.n(coords[1]).to_string(), self.n(*pred).to_string());
                line!(self,
                    "@{p} cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{dst}], [{m}, {{{col}, {row}}}], [{bar}]"
                );
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
            Inst::SharedVLoad { dsts, offset } => {
                let t = self.k.ty(dsts[0]);
                let addr = self.shared_addr(*offset)?;
                let names: Vec<String> = dsts.iter().map(|d| self.n(*d).to_string()).collect();
                line!(self, "ld.shared.v{}.{} {{{}}}, [{addr}]", dsts.len(), vec_type(t), names.join(", "));
            }
            Inst::Fma { dst, a, b, c } => {
                let sfx = if self.k.ty(*dst) == SType::F64 { "f64" } else { "f32" };
                let (d, x, y, z) =
                    (self.n(*dst).to_string(), self.n(*a).to_string(), self.n(*b).to_string(), self.n(*c).to_string());
                line!(self, "fma.rn.{sfx} {d}, {x}, {y}, {z}");
            }
            Inst::Mov { dst, src } => self.mov(*dst, *src),
            Inst::SharedStore { offset, value, pred } => {
                let addr = self.shared_addr(*offset)?;
                self.store_line("shared", &addr, *value, *pred);
            }
            Inst::SharedVStore { offset, values } => {
                let t = self.k.ty(values[0]);
                let addr = self.shared_addr(*offset)?;
                let names: Vec<String> = values.iter().map(|v| self.n(*v).to_string()).collect();
                line!(self, "st.shared.v{}.{} [{addr}], {{{}}}", values.len(), vec_type(t), names.join(", "));
            }
            Inst::SharedLoad { dst, offset } => {
                let addr = self.shared_addr(*offset)?;
                self.load_line("shared", *dst, &addr, None);
            }
            Inst::Barrier => {
                let b = self.barrier();
                line!(self, "bar.sync {b}")
            }
            Inst::Atomic { dst, op, addr, value, pred, sem, scope } => {
                let t = self.k.ty(*value);
                let ty = match (op, t) {
                    (AtomicOp::Add, SType::F32) => "f32",
                    (AtomicOp::Add, SType::F64) => "f64",
                    (AtomicOp::Xchg, SType::F32) => "b32",
                    (AtomicOp::Xchg, SType::F64) => "b64",
                    (_, SType::F32 | SType::F64 | SType::F16 | SType::BF16 | SType::Pred) => {
                        return Err(EmitError(format!("PTX has no atomic `{op}` on {t:?}")))
                    }
                    (AtomicOp::And | AtomicOp::Or | AtomicOp::Xor | AtomicOp::Xchg, _) => {
                        if class(t) == Class::Rd {
                            "b64"
                        } else {
                            "b32"
                        }
                    }
                    (AtomicOp::Add, _) => {
                        if class(t) == Class::Rd {
                            "u64"
                        } else {
                            "u32"
                        }
                    }
                    (_, _) => arith(t),
                };
                let name = match op {
                    AtomicOp::Xchg => "exch".to_string(),
                    o => o.as_str().to_string(),
                };
                let (sem, scope) = (sem_name(*sem), scope_name(*scope));
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                let (d, a, v) = (self.n(*dst).to_string(), self.n(*addr).to_string(), self.n(*value).to_string());
                line!(self, "{guard}atom.{sem}.{scope}.global.{name}.{ty} {d}, [{a}], {v}");
            }
            Inst::AtomicCas { dst, addr, expected, desired, pred, sem, scope } => {
                let ty = match class(self.k.ty(*desired)) {
                    Class::R | Class::F => "b32",
                    Class::Rd | Class::Fd => "b64",
                    _ => return Err(EmitError(format!("atomic_cas on {:?} (not emitted yet)", self.k.ty(*desired)))),
                };
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                let (d, a) = (self.n(*dst).to_string(), self.n(*addr).to_string());
                let (e, n) = (self.n(*expected).to_string(), self.n(*desired).to_string());
                let (sem, scope) = (sem_name(*sem), scope_name(*scope));
                line!(self, "{guard}atom.{sem}.{scope}.global.cas.{ty} {d}, [{a}], {e}, {n}");
            }
            Inst::SymmAt { .. } | Inst::WaitSignals { .. } => {
                return Err(EmitError(
                    "a protocol instruction reached the writer (run simt::protocol::expand first)".into(),
                ))
            }
            Inst::Clock { dst } => {
                let d = self.n(*dst).to_string();
                line!(self, "mov.u64 {d}, %globaltimer");
            }
            Inst::AtomicLoad { dst, addr, pred, sem, scope } => {
                let (d, a) = (self.n(*dst).to_string(), self.n(*addr).to_string());
                let ty = mem(self.k.ty(*dst));
                let order = match sem {
                    MemSemantic::Relaxed => "relaxed",
                    MemSemantic::Acquire => "acquire",
                    other => return Err(EmitError(format!("atomic load with {other} semantics"))),
                };
                let guard = match pred {
                    Some(p) => {
                        line!(self, "mov.{} {d}, 0", mov_type(self.k.ty(*dst)));
                        format!("@{} ", self.n(*p))
                    }
                    None => String::new(),
                };
                line!(self, "{guard}ld.{order}.{}.global.{ty} {d}, [{a}]", scope_name(*scope));
            }
            Inst::AtomicStore { addr, value, pred, sem, scope } => {
                let (a, v) = (self.n(*addr).to_string(), self.n(*value).to_string());
                let ty = mem(self.k.ty(*value));
                let order = match sem {
                    MemSemantic::Relaxed => "relaxed",
                    MemSemantic::Release => "release",
                    other => return Err(EmitError(format!("atomic store with {other} semantics"))),
                };
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                line!(self, "{guard}st.{order}.{}.global.{ty} [{a}], {v}", scope_name(*scope));
            }
            Inst::BarrierAny { dst, pred } => {
                let (d, p) = (self.n(*dst).to_string(), self.n(*pred).to_string());
                let b = self.barrier();
                line!(self, "bar.red.or.pred {d}, {b}, {p}");
            }
            Inst::Exit => self.line("bra.uni $EXIT".into()),
            // Line information: compute-sanitizer and debuggers report the tile-IR line.
            Inst::Origin { loc: Some(l), .. } => self.body.push_str(&format!("  .loc 1 {} {}\n", l.line, l.col)),
            Inst::Origin { loc: None, .. } => {}
            Inst::Fence { scope } => line!(self, "fence.acq_rel.{}", scope_name(*scope)),
            Inst::DeviceCall { call, args, pred } => self.device_call(*call, args, *pred),
            Inst::Signal { addr, value, op, pred } => {
                let (a, v, p) = (self.n(*addr).to_string(), self.n(*value).to_string(), self.n(*pred).to_string());
                match op {
                    SignalOp::Set => line!(self, "@{p} st.relaxed.sys.global.u64 [{a}], {v}"),
                    SignalOp::Add => line!(self, "@{p} red.relaxed.sys.global.add.u64 [{a}], {v}"),
                }
            }
            Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results } => {
                let l = self.label();
                self.movs(phis, inits);
                self.mov(*iv, *lo);
                let t = arith(self.k.ty(*iv));
                let p = self.temp(Class::P);
                let (ivn, hin, stn) = (self.n(*iv).to_string(), self.n(*hi).to_string(), self.n(*step).to_string());
                self.body.push_str(&format!("$L{l}_head:\n"));
                line!(self, "setp.ge.{t} {p}, {ivn}, {hin}");
                // The bounds are uniform (as `If`'s condition).
                line!(self, "@{p} bra.uni $L{l}_end");
                self.insts(body)?;
                self.parallel_movs(phis, nexts);
                line!(self, "add.{t} {ivn}, {ivn}, {stn}");
                line!(self, "bra.uni $L{l}_head");
                self.body.push_str(&format!("$L{l}_end:\n"));
                self.movs(results, phis);
            }
            Inst::If { cond, then_body, then_yields, else_body, else_yields, results } => {
                let l = self.label();
                let c = self.n(*cond).to_string();
                // `If` is uniform (the SIMT IR's contract): `bra.uni` tells ptxas, which
                // otherwise treats a `wgmma` wait inside as divergent and serializes every
                // `wgmma` of the kernel (C7518).
                line!(self, "@!{c} bra.uni $L{l}_else");
                self.insts(then_body)?;
                self.movs(results, then_yields);
                line!(self, "bra.uni $L{l}_end");
                self.body.push_str(&format!("$L{l}_else:\n"));
                self.insts(else_body)?;
                self.movs(results, else_yields);
                self.body.push_str(&format!("$L{l}_end:\n"));
            }
            Inst::While { phis, inits, cond_body, cond, body, nexts, results } => {
                let l = self.label();
                self.movs(phis, inits);
                self.body.push_str(&format!("$L{l}_head:\n"));
                self.insts(cond_body)?;
                let c = self.n(*cond).to_string();
                line!(self, "@!{c} bra $L{l}_end");
                self.insts(body)?;
                self.parallel_movs(phis, nexts);
                line!(self, "bra.uni $L{l}_head");
                self.body.push_str(&format!("$L{l}_end:\n"));
                self.movs(results, phis);
            }
            Inst::Store { addr, value, pred } => {
                let a = self.n(*addr).to_string();
                self.store_line("global", &a, *value, *pred);
            }
        }
        Ok(())
    }

    /// `shfl.sync.bfly` over the full warp; 64-bit values go as two halves, predicates and
    /// 16-bit values through a 32-bit register.
    fn shuffle(&mut self, dst: Reg, src: Reg, xor: u32) {
        let (d, s) = (self.n(dst).to_string(), self.n(src).to_string());
        let shfl = |w: &mut Self, out: &dyn std::fmt::Display, inp: &dyn std::fmt::Display| {
            line!(w, "shfl.sync.bfly.b32 {out}, {inp}, {xor}, 31, -1");
        };
        match class(self.k.ty(src)) {
            Class::R | Class::F => shfl(self, &d, &s),
            Class::Rd | Class::Fd => {
                let (lo, hi) = (self.temp(Class::R), self.temp(Class::R));
                line!(self, "mov.b64 {{{lo}, {hi}}}, {s}");
                shfl(self, &lo, &lo);
                shfl(self, &hi, &hi);
                line!(self, "mov.b64 {d}, {{{lo}, {hi}}}");
            }
            Class::H => {
                let w = self.temp(Class::R);
                line!(self, "cvt.u32.u16 {w}, {s}");
                shfl(self, &w, &w);
                line!(self, "cvt.u16.u32 {d}, {w}");
            }
            Class::P => {
                let w = self.temp(Class::R);
                line!(self, "selp.u32 {w}, 1, 0, {s}");
                shfl(self, &w, &w);
                line!(self, "setp.ne.u32 {d}, {w}, 0");
            }
        }
    }

    /// `ld.<space>` of `dst`'s type from `addr` where `pred` holds; predicates travel as a byte
    /// (a guarded-off predicate load reads false).
    fn load_line(&mut self, space: &str, dst: Reg, addr: &dyn std::fmt::Display, pred: Option<Reg>) {
        let t = self.k.ty(dst);
        let d = self.n(dst).to_string();
        let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
        if t == SType::Pred {
            // A guarded-off lane keeps what `dst` held (the load's `other`, moved in first).
            let r = self.temp(Class::R);
            match pred {
                Some(_) => line!(self, "selp.u32 {r}, 1, 0, {d}"),
                None => line!(self, "mov.b32 {r}, 0"),
            }
            line!(self, "{guard}ld.{space}.u8 {r}, [{addr}]");
            line!(self, "setp.ne.u32 {d}, {r}, 0");
        } else {
            line!(self, "{guard}ld.{space}.{} {d}, [{addr}]", mem(t));
        }
    }

    /// `st.<space>` of `value` at `addr` where `pred` holds; predicates travel as a byte.
    fn store_line(&mut self, space: &str, addr: &dyn std::fmt::Display, value: Reg, pred: Option<Reg>) {
        let t = self.k.ty(value);
        let v = self.n(value).to_string();
        let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
        if t == SType::Pred {
            let r = self.temp(Class::R);
            line!(self, "selp.u32 {r}, 1, 0, {v}");
            line!(self, "{guard}st.{space}.u8 [{addr}], {r}");
        } else {
            line!(self, "{guard}st.{space}.{} [{addr}], {v}", mem(t));
        }
    }

    fn insts(&mut self, body: &[Inst]) -> Result<(), EmitError> {
        for i in body {
            self.inst(i)?;
        }
        Ok(())
    }

    /// The operands naming the barrier every remaining thread meets: barrier 0 (all threads),
    /// or after a warp-specialized region barrier 1 with the consumers' count.
    fn barrier(&self) -> String {
        match self.consumers {
            Some(n) => format!("1, {n}"),
            None => "0".into(),
        }
    }

    /// A call of NVSHMEM's device function for `call` (the operands in order, the signal
    /// operation's number inserted), skipped by threads where `pred` is false.
    fn device_call(&mut self, call: DeviceCall, args: &[Reg], pred: Option<Reg>) {
        let l = self.label();
        if let Some(p) = pred {
            let p = self.n(p).to_string();
            line!(self, "@!{p} bra $L{l}_skip");
        }
        self.body.push_str("  {\n");
        let mut operands = args.iter();
        let mut names = Vec::new();
        for (i, param) in call.params().iter().enumerate() {
            let ty = call_param(*param);
            self.body.push_str(&format!("  .param .{ty} c{i};\n"));
            let value = match call.op_position() {
                Some((at, op)) if at == i => Vendor::Nvshmem.signal_op(op).to_string(),
                _ => operands.next().map(|r| self.n(*r).to_string()).unwrap_or_default(),
            };
            line!(self, "st.param.{ty} [c{i}], {value}");
            names.push(format!("c{i}"));
        }
        let f = Vendor::Nvshmem.function(call);
        if names.is_empty() {
            line!(self, "call {f}, ()");
        } else {
            line!(self, "call {f}, ({})", names.join(", "));
        }
        self.body.push_str("  }\n");
        if pred.is_some() {
            self.body.push_str(&format!("$L{l}_skip:\n"));
        }
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

    fn unary(&mut self, dst: Reg, op: UnaryOp, src: Reg) -> Result<(), EmitError> {
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

    fn binary(&mut self, dst: Reg, op: BinaryOp, a: Reg, b: Reg) -> Result<(), EmitError> {
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

    fn cast(&mut self, dst: Reg, src: Reg) -> Result<(), EmitError> {
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
            trident_core::simt::passes::for_each_use(i, &mut |r| uses[r.0 as usize] += 1);
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
