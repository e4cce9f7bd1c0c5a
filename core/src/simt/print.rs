//! The printed SIMT form (`cargo xtask emit --stage simt`, cpu-simt's artifact text, the
//! snapshots): one instruction per line, registers as `%N` with their type where defined,
//! regions indented. For reading and diffing; there is no parser.

use super::{Inst, Kernel, Reg, SType, Special};
use std::fmt::{self, Write};

impl fmt::Display for SType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SType::Pred => f.write_str("pred"),
            SType::Int { bits, signed } => write!(f, "{}{bits}", if *signed { 'i' } else { 'u' }),
            SType::F16 => f.write_str("f16"),
            SType::BF16 => f.write_str("bf16"),
            SType::F32 => f.write_str("f32"),
            SType::F64 => f.write_str("f64"),
            SType::Ptr => f.write_str("ptr"),
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let params: Vec<String> = self.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        writeln!(f, "kernel {}({})", self.name, params.join(", "))?;
        writeln!(
            f,
            "  // {}{} warps x {} lanes, {} bytes of shared memory, {} registers",
            self.warps,
            if self.producer_warps > 0 { format!(" + {} producer", self.producer_warps) } else { String::new() },
            self.warp_size,
            self.shared_bytes,
            self.regs.len()
        )?;
        for o in &self.shared_objects {
            writeln!(
                f,
                "  // shared {} at {}, {} bytes, align {}{}",
                o.name,
                o.offset,
                o.bytes,
                o.align,
                o.swizzle.map(|s| format!(", swizzle {s}")).unwrap_or_default()
            )?;
        }
        for (i, m) in self.tensor_maps.iter().enumerate() {
            let s = |x: &super::tma::MapScalar| match x {
                super::tma::MapScalar::Param(p) => format!("%{}", self.params[*p as usize].0),
                super::tma::MapScalar::Const(c) => c.to_string(),
            };
            writeln!(
                f,
                "  // tensor map{i}: %{} {} [{}, {}] row stride {}, box {}x{}, swizzle {}",
                self.params[m.ptr as usize].0,
                m.dtype,
                s(&m.rows),
                s(&m.cols),
                s(&m.row_stride),
                m.box_rows,
                m.box_cols,
                m.swizzle
            )?;
        }
        let mut out = String::new();
        Printer { k: self, out: &mut out }.block(&self.body, 1);
        f.write_str(&out)
    }
}

struct Printer<'a> {
    k: &'a Kernel,
    out: &'a mut String,
}

fn list(rs: &[Reg]) -> String {
    rs.iter().map(|r| format!("%{}", r.0)).collect::<Vec<_>>().join(", ")
}

fn guard(p: Option<Reg>) -> String {
    p.map(|p| format!(" if %{}", p.0)).unwrap_or_default()
}

impl Printer<'_> {
    /// `%N:type`
    fn def(&self, r: Reg) -> String {
        format!("%{}:{}", r.0, self.k.ty(r))
    }

    fn defs(&self, rs: &[Reg]) -> String {
        rs.iter().map(|r| self.def(*r)).collect::<Vec<_>>().join(", ")
    }

    fn line(&mut self, depth: usize, s: String) {
        let _ = writeln!(self.out, "{:width$}{s}", "", width = 2 * depth);
    }

    fn block(&mut self, body: &[Inst], depth: usize) {
        for i in body {
            self.inst(i, depth);
        }
    }

    fn inst(&mut self, i: &Inst, d: usize) {
        let r = |x: &Reg| format!("%{}", x.0);
        let s = match i {
            Inst::Param { dst, index } => {
                format!("{} = param {index} ({})", self.def(*dst), self.k.params[*index as usize].0)
            }
            Inst::Special { dst, which } => {
                let w = match which {
                    Special::ThreadId => "thread_id".to_string(),
                    Special::ProgramId(a) => format!("program_id.{a}"),
                    Special::NumPrograms(a) => format!("num_programs.{a}"),
                    Special::SmId => "sm_id".to_string(),
                };
                format!("{} = {w}", self.def(*dst))
            }
            Inst::Const { dst, value } => match value {
                crate::ir::Literal::Int(i) => format!("{} = const {i}", self.def(*dst)),
                crate::ir::Literal::Float(x) => format!("{} = const {x:?}", self.def(*dst)),
            },
            Inst::Unary { dst, op, src } => format!("{} = {op} {}", self.def(*dst), r(src)),
            Inst::Binary { dst, op, a, b } => format!("{} = {op} {}, {}", self.def(*dst), r(a), r(b)),
            Inst::Cmp { dst, op, a, b } => format!("{} = cmp.{op} {}, {}", self.def(*dst), r(a), r(b)),
            Inst::Select { dst, cond, on_true, on_false } => {
                format!("{} = select {}, {}, {}", self.def(*dst), r(cond), r(on_true), r(on_false))
            }
            Inst::Cast { dst, src } => format!("{} = cast {}", self.def(*dst), r(src)),
            Inst::Bitcast { dst, src } => format!("{} = bitcast {}", self.def(*dst), r(src)),
            Inst::Approx { dst, func, src } => format!("{} = approx.{func:?} {}", self.def(*dst), r(src)),
            Inst::Fp8Convert { dst, src, format } => format!("{} = fp8.convert.{format} {}", self.def(*dst), r(src)),
            Inst::AddrOffset { dst, base, offset, scale } => {
                format!("{} = addr {} + {} * {scale}", self.def(*dst), r(base), r(offset))
            }
            Inst::Load { dst, addr, pred, other } => format!(
                "{} = load [{}]{}{}",
                self.def(*dst),
                r(addr),
                guard(*pred),
                other.map(|o| format!(" else %{}", o.0)).unwrap_or_default()
            ),
            Inst::Store { addr, value, pred } => format!("store [{}], {}{}", r(addr), r(value), guard(*pred)),
            Inst::VLoad { dsts, addr, pred, others } => format!(
                "{} = vload [{}]{}{}",
                self.defs(dsts),
                r(addr),
                guard(*pred),
                if others.is_empty() { String::new() } else { format!(" else {}", list(others)) }
            ),
            Inst::VStore { addr, values, pred } => format!("vstore [{}], {}{}", r(addr), list(values), guard(*pred)),
            Inst::IsAligned { dst, addr, bytes } => format!("{} = aligned {} to {bytes}", self.def(*dst), r(addr)),
            Inst::Shuffle { dst, src, lane_xor } => format!("{} = shuffle.xor {}, {lane_xor}", self.def(*dst), r(src)),
            Inst::Fma { dst, a, b, c } => format!("{} = fma {}, {}, {}", self.def(*dst), r(a), r(b), r(c)),
            Inst::Mov { dst, src } => format!("{} = mov {}", self.def(*dst), r(src)),
            Inst::SharedStore { offset, value, pred } => {
                format!("shared.store [{}], {}{}", r(offset), r(value), guard(*pred))
            }
            Inst::SharedLoad { dst, offset } => format!("{} = shared.load [{}]", self.def(*dst), r(offset)),
            Inst::SharedVLoad { dsts, offset } => format!("{} = shared.vload [{}]", self.defs(dsts), r(offset)),
            Inst::SharedVStore { offset, values } => format!("shared.vstore [{}], {}", r(offset), list(values)),
            Inst::Barrier => "barrier".to_string(),
            Inst::SharedReuse { offset, bytes } => format!("barrier.reuse {offset}+{bytes}"),
            Inst::SharedFree { offset, bytes } => format!("shared.free {offset}+{bytes}"),
            Inst::GroupOrder { id, arrive } => {
                format!("group_order.{} {}", if *arrive { "arrive" } else { "wait" }, r(id))
            }
            Inst::BarrierAny { dst, pred } => format!("{} = barrier.any {}", self.def(*dst), r(pred)),
            Inst::WarpAny { dst, pred } => format!("{} = warp.any {}", self.def(*dst), r(pred)),
            Inst::Atomic { dst, op, addr, value, pred, sem, scope } => {
                format!("{} = atomic.{op}.{sem}.{scope} [{}], {}{}", self.def(*dst), r(addr), r(value), guard(*pred))
            }
            Inst::VAtomic { op, addr, values, pred, sem, scope } => {
                format!("atomic.{op}.{sem}.{scope} [{}], {}{}", r(addr), list(values), guard(*pred))
            }
            Inst::AtomicCas { dst, addr, expected, desired, pred, sem, scope } => format!(
                "{} = atomic.cas.{sem}.{scope} [{}], {}, {}{}",
                self.def(*dst),
                r(addr),
                r(expected),
                r(desired),
                guard(*pred)
            ),
            Inst::AtomicLoad { dst, addr, pred, sem, scope } => {
                format!("{} = atomic.load.{sem}.{scope} [{}]{}", self.def(*dst), r(addr), guard(*pred))
            }
            Inst::AtomicStore { addr, value, pred, sem, scope } => {
                format!("atomic.store.{sem}.{scope} [{}], {}{}", r(addr), r(value), guard(*pred))
            }
            Inst::AsyncCopy { offset, addr, bytes, pred, zero_fill } => format!(
                "async.copy {bytes} bytes [{}] -> shared [{}]{}{}",
                r(addr),
                r(offset),
                guard(Some(*pred)),
                if *zero_fill { " else zeros" } else { "" }
            ),
            Inst::AsyncCommit => "async.commit".to_string(),
            Inst::AsyncWait { pending } => format!("async.wait {pending}"),
            Inst::MatrixLoad { dsts, offset, trans } => {
                format!("{} = matrix.load{} [{}]", self.defs(dsts), if *trans { ".trans" } else { "" }, r(offset))
            }
            Inst::Matmul { atom, d, a, b, c, ab } => {
                format!("{} = matmul.{}.{ab} a [{}] b [{}] c [{}]", self.defs(d), atom.name, list(a), list(b), list(c))
            }
            Inst::MatrixDescriptor { dst, offset, lbo, sbo, swizzle } => format!(
                "{} = matrix.descriptor shared [{}] lbo {lbo} sbo {sbo} swizzle {swizzle}",
                self.def(*dst),
                r(offset)
            ),
            Inst::Wgmma { d, c, a, b, n, ab, trans_b, scale_d } => format!(
                "{} = wgmma.m64n{n}k{}.{ab}{} a [{}] b [{}] c [{}]{}",
                self.defs(d),
                32 / ab.size_bytes(),
                if *trans_b { ".trans_b" } else { "" },
                r(a),
                r(b),
                list(c),
                scale_d.map(|p| format!(" if {} else 0", r(&p))).unwrap_or_default()
            ),
            Inst::WgmmaFence => "wgmma.fence".to_string(),
            Inst::WgmmaCommit => "wgmma.commit".to_string(),
            Inst::WgmmaWait { pending } => format!("wgmma.wait {pending}"),
            Inst::FenceProxyAsync => "fence.proxy.async".to_string(),
            Inst::FenceProxyAsyncGlobal => "fence.proxy.async.global".to_string(),
            Inst::GridDependencyWait => "griddepcontrol.wait".to_string(),
            Inst::MbarrierInit { offset, count, pred } => {
                format!("mbarrier.init shared [{}], count {count} if {}", r(offset), r(pred))
            }
            Inst::FenceMbarrierInit => "fence.mbarrier_init".to_string(),
            Inst::TmaStore { map, offset, coords, pred } => format!(
                "tma.store map{map} [{}, {}] <- shared [{}] if {}",
                r(&coords[0]),
                r(&coords[1]),
                r(offset),
                r(pred)
            ),
            Inst::BulkStore { addr, offset, bytes, pred } => {
                format!("bulk.store [{}] <- shared [{}], {} bytes if {}", r(addr), r(offset), r(bytes), r(pred))
            }
            Inst::BulkCommit => "bulk.commit".to_string(),
            Inst::BulkWait { pending, writes: false } => format!("bulk.wait.read {pending}"),
            Inst::BulkWait { pending, writes: true } => format!("bulk.wait {pending}"),
            Inst::MbarrierArrive { offset, pred } => format!("mbarrier.arrive shared [{}] if {}", r(offset), r(pred)),
            Inst::MbarrierInval { offset, pred } => format!("mbarrier.inval shared [{}] if {}", r(offset), r(pred)),
            Inst::MbarrierExpectTx { offset, bytes, pred } => {
                format!("mbarrier.arrive.expect_tx shared [{}], {bytes} if {}", r(offset), r(pred))
            }
            Inst::MbarrierWait { offset, parity } => {
                format!("mbarrier.wait shared [{}], parity {}", r(offset), r(parity))
            }
            Inst::TmaLoad { map, offset, coords, barrier, pred } => format!(
                "tma.load shared [{}] <- map{map} [{}, {}], mbarrier [{}] if {}",
                r(offset),
                r(&coords[0]),
                r(&coords[1]),
                r(barrier),
                r(pred)
            ),
            Inst::Pack { dst, lo, hi } => format!("{} = pack {}, {}", self.def(*dst), r(lo), r(hi)),
            Inst::Clock { dst } => format!("{} = clock", self.def(*dst)),
            Inst::TraceEvent { kind, label, arg } => match arg {
                Some(a) => format!("trace {} label {label} arg {}", kind.name(), r(a)),
                None => format!("trace {} label {label}", kind.name()),
            },
            Inst::Exit => "exit".to_string(),
            Inst::SymmAt { dst, ptr, rank } => format!("{} = symm_at {}, rank {}", self.def(*dst), r(ptr), r(rank)),
            Inst::Fence { scope } => format!("fence.{scope}"),
            Inst::DeviceCall { call, args, pred } => format!(
                "call {call:?}({}){}",
                args.iter().map(r).collect::<Vec<_>>().join(", "),
                pred.as_ref().map(|p| format!(" if {}", r(p))).unwrap_or_default()
            ),
            Inst::Signal { addr, value, op, pred } => format!("signal.{op} [{}], {} if {}", r(addr), r(value), r(pred)),
            Inst::WaitSignals { base, count, cmp, value } => {
                format!("wait_signals [{}] x {} until {cmp} {}", r(base), r(count), r(value))
            }
            Inst::WaitFlag { dst, addr, pred, flag } => {
                format!("{} = wait_flag [{}] until hi == {}{}", self.def(*dst), r(addr), r(flag), guard(*pred))
            }
            Inst::Origin { op, what, loc } => {
                format!("// op #{op} {what}{}", loc.map(|l| format!(" at {l}")).unwrap_or_default())
            }
            Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results } => {
                self.line(
                    d,
                    format!(
                        "loop {} in {}..{} step {} carry [{}] = [{}] {{",
                        self.def(*iv),
                        r(lo),
                        r(hi),
                        r(step),
                        self.defs(phis),
                        list(inits)
                    ),
                );
                self.block(body, d + 1);
                format!("}} next [{}] -> [{}]", list(nexts), self.defs(results))
            }
            Inst::If { cond, then_body, then_yields, else_body, else_yields, results } => {
                self.line(d, format!("if {} {{", r(cond)));
                self.block(then_body, d + 1);
                if !then_yields.is_empty() {
                    self.line(d + 1, format!("yield {}", list(then_yields)));
                }
                if !else_body.is_empty() || !else_yields.is_empty() {
                    self.line(d, "} else {".to_string());
                    self.block(else_body, d + 1);
                    if !else_yields.is_empty() {
                        self.line(d + 1, format!("yield {}", list(else_yields)));
                    }
                }
                if results.is_empty() {
                    "}".to_string()
                } else {
                    format!("}} -> [{}]", self.defs(results))
                }
            }
            Inst::Specialized { consumer_warps, producer, consumer, pingpong, regs } => {
                let split = match regs {
                    Some(r) => format!(", setmaxnreg {} / {}", r.producer, r.consumer),
                    None => String::new(),
                };
                self.line(d, format!("specialized producer (warps {consumer_warps}..{split}) {{"));
                self.block(producer, d + 1);
                match pingpong {
                    None => self.line(d, format!("}} consumer (warps 0..{consumer_warps}) {{")),
                    Some(g) => self.line(
                        d,
                        format!("}} consumer (warps 0..{consumer_warps}, two groups taking turns, group {}) {{", r(g)),
                    ),
                }
                self.block(consumer, d + 1);
                "}".to_string()
            }
            Inst::While { phis, inits, cond_body, cond, body, nexts, results } => {
                self.line(d, format!("while carry [{}] = [{}] {{", self.defs(phis), list(inits)));
                self.block(cond_body, d + 1);
                self.line(d, format!("}} test {} do {{", r(cond)));
                self.block(body, d + 1);
                format!("}} next [{}] -> [{}]", list(nexts), self.defs(results))
            }
        };
        self.line(d, s);
    }
}
