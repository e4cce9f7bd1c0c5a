//! Loads that feed only tensor-core `dot`s, in any `for` loop, copied asynchronously into a
//! ring of shared stages: attention's keys and values (flash decoding's split stage), where the
//! body is more than a K step (the online softmax between its two `dot`s), so the whole-loop
//! pipeline of `pipeline.rs` does not take it.
//!
//! Such a load's tile would otherwise go global -> registers -> shared memory (the `dot`'s
//! staging) -> fragments: registers held across the load's latency, a staging store and a
//! barrier per step. Here it goes global -> shared memory by `cp.async`, `stages - 1` steps
//! ahead, into the padded row-major layout the `dot` reads its fragments from, and the `dot`
//! reads the stage in place. Each step: wait for its own copies (`cp.async.wait_group`), meet
//! (every thread's copies landed, and every thread is done with the stage the next copies
//! overwrite: the one the step before read), issue the copies of step `j + stages - 1`, then
//! the body as it is written, its loads of those tiles lowering to nothing. Copies past the
//! loop's end are issued as zero-fills (`valid` false) and waited for after the loop, before
//! the ring's memory is anyone else's.

use super::pipeline::{Operand, Source, StageLayout};
use super::*;

/// Bytes of a 2-D tile of 16-bit elements staged row-major with rows padded by 16 bytes (8
/// elements), as `dot_mma` stages its operands and reads staged ones.
pub(super) fn padded_bytes(shape: &[u32]) -> u32 {
    shape[0] * (shape[1] + 8) * 2
}

/// The loads of a loop staged asynchronously ([`Lowering::staged_plan`]): one or two (the
/// stage layout has two places), their place in a stage, and the ring's depth.
pub(super) struct StagedLoads {
    operands: Vec<Operand>,
    layout: StageLayout,
    stage_bytes: u32,
    stages: u32,
    /// `dot` operands computed before the loop (attention's queries): staged once, before it,
    /// each at its byte offset after the ring, so that no step stages them again.
    invariants: Vec<(Value, u32)>,
    invariant_bytes: u32,
}

impl Lowering<'_> {
    /// The loads of `for` loop `op` to stage asynchronously, where the target copies by
    /// `cp.async` groups and the kernel asks for two stages or more: each a 2-D tile of 16-bit
    /// floats loaded in the loop's body (not nested deeper), with a rematerializable pointer
    /// and mask, nothing or zero where masked, vectors along rows, and read only as a
    /// tensor-core `dot`'s operand (directly, or through a transpose that `dot`s read K-major).
    pub(super) fn staged_plan(&mut self, op: Op) -> Option<StagedLoads> {
        let stages = self.func.attrs.stages;
        let OpKind::For { body, .. } = &self.func.ops[op].kind else { return None };
        let body = *body;
        if stages < 2 || !self.target.has_async_copy(AsyncCopy::CpAsyncGroups) {
            return None;
        }
        let mut operands = Vec::new();
        for o in self.func.blocks[body].ops.clone() {
            if operands.len() == 2 {
                break;
            }
            let OpKind::Load { ptr, mask: Some(mask), other } = self.func.ops[o].kind else { continue };
            let v = self.func.ops[o].results[0];
            let t = self.func.ty(v).clone();
            if t.shape.len() != 2 || !matches!(t.elem.dtype(), Some(DType::F16 | DType::BF16)) {
                continue;
            }
            if other.is_some_and(|x| !self.is_zero(x)) || !self.rematerializable(ptr) || !self.rematerializable(mask) {
                continue;
            }
            if !self.evaluable_ahead(ptr, body) || !self.evaluable_ahead(mask, body) {
                continue;
            }
            if self.contiguity.get(ptr).contiguity < 2 || self.func.blocks.iter().any(|(_, b)| b.yields.contains(&v)) {
                continue;
            }
            if self.read_only_by_dots(v, body) {
                operands.push(Operand { source: Source::Pointer { ptr, mask }, value: v });
            }
        }
        if operands.is_empty() {
            return None;
        }
        // Rows padded by 16 bytes, as `dot_mma` stages its operands (`stage_padded`).
        let place = |me: &Self, i: usize| {
            let shape = &me.func.ty(operands[i].value).shape;
            (shape[1] + 8, padded_bytes(shape))
        };
        let (s0, b0) = place(self, 0);
        let (s1, b1) = if operands.len() == 2 { place(self, 1) } else { (8, 0) };
        let b_off = b0.next_multiple_of(128);
        let layout = StageLayout::Padded { strides: [s0, s1], b_off };
        let mut invariants = Vec::new();
        let mut invariant_bytes = 0;
        for v in self.invariant_dot_operands(body) {
            let shape = &self.func.ty(v).shape;
            invariants.push((v, invariant_bytes));
            invariant_bytes += padded_bytes(shape).next_multiple_of(128);
        }
        Some(StagedLoads {
            operands,
            layout,
            stage_bytes: (b_off + b1).next_multiple_of(128),
            stages,
            invariants,
            invariant_bytes,
        })
    }

    /// The 2-D 16-bit tiles computed before the loop `body` belongs to that the body's
    /// tensor-core `dot`s read as their A operand (attention's queries).
    fn invariant_dot_operands(&mut self, body: Block) -> Vec<Value> {
        let mut out = Vec::new();
        for o in self.func.blocks[body].ops.clone() {
            let OpKind::Dot { a, .. } = self.func.ops[o].kind else { continue };
            if out.contains(&a) || self.dot_mma_layout(o).is_none() {
                continue;
            }
            let t = self.func.ty(a).clone();
            if t.shape.len() != 2 || !matches!(t.elem.dtype(), Some(DType::F16 | DType::BF16)) {
                continue;
            }
            // Held in registers before the loop (a tile the lowering only rematerializes has
            // nothing to stage). Every `dot` of the loop that reads it, in any role, may read the
            // staged copy: it is the tile row-major with rows of `cols + 8`, as `dot_mma` stages.
            let outside = match self.func.values[a].def {
                ValueDef::Result { op, .. } => {
                    !self.func.blocks[body].ops.contains(&op)
                        && (self.vals.contains_key(&a) || self.mma_held.contains_key(&a))
                }
                _ => false,
            };
            if outside {
                out.push(a);
            }
        }
        out
    }

    /// Whether `v` can be evaluated for a later step at the top of `body`, before the body's
    /// ops: what it reads in the body is the loop variable, index math and scalar loads of
    /// read-only parameters (a paged cache's block table), never a carried value (its next
    /// step's value is not known yet) or anything else the body computes.
    fn evaluable_ahead(&self, v: Value, body: Block) -> bool {
        match self.func.values[v].def {
            ValueDef::BlockArg { block, index } => block != body || index == 0,
            ValueDef::Result { op, .. } => {
                if !self.func.blocks[body].ops.contains(&op) {
                    return true;
                }
                let kind = &self.func.ops[op].kind;
                let pure = is_index_math(kind)
                    || matches!(kind, OpKind::Const(_) | OpKind::ProgramId(_) | OpKind::NumPrograms(_))
                    || self.read_only_scalar_load(op);
                pure && kind.operands().into_iter().all(|(_, x)| self.evaluable_ahead(x, body))
            }
            _ => true,
        }
    }

    /// Whether `v` (in `body`) is read only as one operand of tensor-core `dot`s of `body`: A
    /// or B of one `dot`, or transposed for `dot`s that read it K-major.
    fn read_only_by_dots(&mut self, v: Value, body: Block) -> bool {
        let users = self.users.get(&v).cloned().unwrap_or_default();
        let [u] = users.as_slice() else { return false };
        if !self.func.blocks[body].ops.contains(u) {
            return false;
        }
        match self.func.ops[*u].kind.clone() {
            OpKind::Dot { a, b, acc, .. } => (a == v) != (b == v) && acc != v && self.dot_mma_layout(*u).is_some(),
            OpKind::Transpose { .. } => {
                let t = self.func.ops[*u].results[0];
                self.kmajor_operand(t) == Some(v)
            }
            _ => false,
        }
    }

    /// Before a staged loop: everyone meets (the ring overlaps what earlier ops used), then
    /// the copies of steps `0 .. stages - 1`, a group each. Returns the ring's shared byte.
    pub(super) fn staged_prologue(&mut self, plan: &StagedLoads, iv_arg: Value, (lo, hi, stp): (Reg, Reg, Reg)) -> u32 {
        let ring = plan.stages * plan.stage_bytes;
        let at = self.shared_alloc("staged.ring", ring + plan.invariant_bytes, 128);
        self.emit(Inst::Barrier);
        for &(v, off) in &plan.invariants {
            let shape = self.func.ty(v).shape.clone();
            let regs = self.held(v);
            self.stage_padded(&regs, &shape, at + ring + off);
        }
        for st in 0..plan.stages - 1 {
            let k = self.bin_c(BinaryOp::Mul, stp, st as i64);
            let iv = self.bin(BinaryOp::Add, lo, k);
            let valid = self.reg(SType::Pred);
            self.emit(Inst::Cmp { dst: valid, op: CmpOp::Lt, a: iv, b: hi });
            let base = self.iconst((at + st * plan.stage_bytes) as i64);
            self.with_bound(&[(iv_arg, iv)], |me| me.issue_operands(&plan.operands, valid, base, plan.layout));
            self.emit(Inst::AsyncCommit);
        }
        at
    }

    /// The top of a staged loop's body (step `j`, loop variable `iv`): wait for this step's
    /// group, meet, issue step `j + stages - 1`'s copies into the stage step `j - 1` read, and
    /// bind each staged load to its place in this step's stage; returns `j + 1`. Loop-invariant
    /// address math of the copies goes to `hoisted` (before the loop).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn staged_step(
        &mut self,
        plan: &StagedLoads,
        at: u32,
        (iv_arg, iv, j): (Value, Reg, Reg),
        (hi, stp): (Reg, Reg),
        body: Block,
        hoisted: &mut Vec<Inst>,
    ) -> Reg {
        let s = plan.stages;
        self.emit(Inst::AsyncWait { pending: s - 2 });
        self.emit(Inst::Barrier);
        let ahead = self.bin_c(BinaryOp::Mul, stp, (s - 1) as i64);
        let next_iv = self.bin(BinaryOp::Add, iv, ahead);
        let valid = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: valid, op: CmpOp::Lt, a: next_iv, b: hi });
        let jn = self.bin_c(BinaryOp::Add, j, (s - 1) as i64);
        let next_base = self.ring_slot(jn, s, at, plan.stage_bytes);
        self.hoist =
            Some(super::Hoist { variant: self.loop_variant(body), insts: Vec::new(), memo: HashMap::default() });
        self.with_bound(&[(iv_arg, next_iv)], |me| me.issue_operands(&plan.operands, valid, next_base, plan.layout));
        hoisted.extend(self.hoist.take().map(|h| h.insts).unwrap_or_default());
        self.emit(Inst::AsyncCommit);
        let base = self.ring_slot(j, s, at, plan.stage_bytes);
        let StageLayout::Padded { b_off, .. } = plan.layout else { unreachable!("staged loads are padded") };
        for (i, o) in plan.operands.iter().enumerate() {
            let addr = if i == 0 { base } else { self.bin_c(BinaryOp::Add, base, b_off as i64) };
            self.staged.insert(o.value, addr);
        }
        // Staged before the loop; the barrier above ordered those stores before any read.
        for &(v, off) in &plan.invariants {
            let addr = self.iconst((at + s * plan.stage_bytes + off) as i64);
            self.staged.insert(v, addr);
        }
        self.bin_c(BinaryOp::Add, j, 1)
    }

    /// After a staged loop: no copy in flight, everyone met, the ring free, the loads unbound.
    pub(super) fn staged_epilogue(&mut self, plan: &StagedLoads, at: u32) {
        self.emit(Inst::AsyncWait { pending: 0 });
        self.emit(Inst::Barrier);
        self.shared_free(at);
        for o in &plan.operands {
            self.staged.remove(&o.value);
        }
        for (v, _) in &plan.invariants {
            self.staged.remove(v);
        }
    }

    /// The shared byte (a register) where this step's copy of the staged load `v` sits, if it
    /// is one: rows of `cols + 8` elements.
    pub(super) fn staged_at(&self, v: Value) -> Option<Reg> {
        self.staged.get(&v).copied()
    }
}
