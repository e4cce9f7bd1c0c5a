//! PTX for synchronization and communication: barriers, warp shuffles, atomics, fences,
//! signals, calls of NVSHMEM's device functions.

use super::*;

impl Writer<'_> {
    pub(super) fn sync(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::Shuffle { dst, src, lane_xor } => self.shuffle(*dst, *src, *lane_xor),
            Inst::Barrier => {
                let b = self.barrier();
                line!(self, "bar.sync {b}")
            }
            Inst::GroupOrder { id, arrive } => {
                let Some(threads) = self.consumers else {
                    return Err(EmitError("a ping-pong order barrier outside a specialized region".into()));
                };
                let (op, id) = (if *arrive { "bar.arrive" } else { "bar.sync" }, self.n(*id).to_string());
                line!(self, "{op} {id}, {threads}")
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
            Inst::VAtomic { op, addr, values, pred, sem, scope } => {
                let f32s = values.iter().all(|v| self.k.ty(*v) == SType::F32);
                if !self.target.vector_atomic_add || *op != AtomicOp::Add || !f32s || !matches!(values.len(), 2 | 4) {
                    return Err(EmitError(format!(
                        "a vector atomic `{op}` of {} values on {} (`red.add.v2/.v4.f32` needs sm_90)",
                        values.len(),
                        self.target.name
                    )));
                }
                let (sem, scope) = (sem_name(*sem), scope_name(*scope));
                let guard = pred.map(|p| format!("@{} ", self.n(p))).unwrap_or_default();
                let a = self.n(*addr).to_string();
                let vs: Vec<String> = values.iter().map(|v| self.n(*v).to_string()).collect();
                let n = values.len();
                line!(self, "{guard}red.{sem}.{scope}.global.add.v{n}.f32 [{a}], {{{}}}", vs.join(", "));
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
            Inst::SymmAt { .. } | Inst::WaitSignals { .. } | Inst::WaitFlag { .. } => {
                return Err(EmitError(
                    "a protocol instruction reached the writer (run simt::protocol::expand first)".into(),
                ))
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
            Inst::WarpAny { dst, pred } => {
                let (d, p) = (self.n(*dst).to_string(), self.n(*pred).to_string());
                line!(self, "vote.sync.any.pred {d}, {p}, 0xffffffff");
            }
            Inst::BarrierAny { dst, pred } => {
                let (d, p) = (self.n(*dst).to_string(), self.n(*pred).to_string());
                let b = self.barrier();
                line!(self, "bar.red.or.pred {d}, {b}, {p}");
            }
            Inst::Fence { scope } => line!(self, "fence.acq_rel.{}", scope_name(*scope)),
            Inst::GridDependencyWait => self.line("griddepcontrol.wait".into()),
            Inst::DeviceCall { call, args, pred } => self.device_call(*call, args, *pred),
            Inst::Signal { addr, value, op, pred } => {
                let (a, v, p) = (self.n(*addr).to_string(), self.n(*value).to_string(), self.n(*pred).to_string());
                match op {
                    SignalOp::Set => line!(self, "@{p} st.relaxed.sys.global.u64 [{a}], {v}"),
                    SignalOp::Add => line!(self, "@{p} red.relaxed.sys.global.add.u64 [{a}], {v}"),
                }
            }
            _ => return Err(EmitError(format!("`{i:?}` is not a sync instruction"))),
        }
        Ok(())
    }

    /// `shfl.sync.bfly` over the full warp; 64-bit values go as two halves, predicates and
    /// 16-bit values through a 32-bit register.
    pub(super) fn shuffle(&mut self, dst: Reg, src: Reg, xor: u32) {
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

    /// The operands naming the barrier every remaining thread meets: barrier 0 (all threads),
    /// or after a warp-specialized region barrier 1 with the consumers' count.
    /// Inside a ping-pong region, the group's own barrier (2 + group, its threads).
    pub(super) fn barrier(&self) -> String {
        if let Some((id, n)) = &self.group_barrier {
            return format!("{id}, {n}");
        }
        match self.consumers {
            Some(n) => format!("1, {n}"),
            None => "0".into(),
        }
    }

    /// A call of NVSHMEM's device function for `call` (the operands in order, the signal
    /// operation's number inserted), skipped by threads where `pred` is false.
    pub(super) fn device_call(&mut self, call: DeviceCall, args: &[Reg], pred: Option<Reg>) {
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
}
