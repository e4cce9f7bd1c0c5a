//! LLVM IR for synchronization and communication: barriers, lane shuffles (`ds_bpermute`),
//! atomics, fences, signals.

use super::*;

impl Writer<'_> {
    pub(super) fn sync(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::Shuffle { dst, src, lane_xor } => self.shuffle(*dst, *src, *lane_xor)?,
            Inst::Barrier => self.barrier(),
            Inst::GroupOrder { .. } => return err("consumer ping-pong is Hopper's (sm_90a)"),
            Inst::VAtomic { .. } => return err("vector atomic adds are sm_90's (`vector_atomic_add` is off for AMD targets)"),
            Inst::WarpAny { .. } => {
                return err("a warp vote (the wait of a producer warp): warp-specialized regions are Hopper's (sm_90a)")
            }
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
            Inst::SymmAt { .. } | Inst::WaitSignals { .. } | Inst::WaitFlag { .. } => {
                return err("a protocol instruction reached the writer (run simt::protocol::expand first)")
            }
            Inst::Fence { scope: sc } => self.line(format!("fence{} acq_rel", scope(*sc))),
            Inst::GridDependencyWait => {
                return err("programmatic dependent launch is NVIDIA's (sm_90+); the AMD targets never lower it")
            }
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
            _ => return Err(EmitError(format!("`{i:?}` is not a sync instruction"))),
        }
        Ok(())
    }

    /// Butterfly shuffle across the wave through `ds_bpermute` (32-bit lanes).
    pub(super) fn shuffle(&mut self, dst: Reg, src: Reg, xor: u32) -> Result<(), EmitError> {
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

    /// Workgroup barrier with the LDS (and global) accesses before it visible after it.
    pub(super) fn barrier(&mut self) {
        self.declare("declare void @llvm.amdgcn.s.barrier()");
        self.line("fence syncscope(\"workgroup\") release");
        self.line("call void @llvm.amdgcn.s.barrier()");
        self.line("fence syncscope(\"workgroup\") acquire");
    }
}
