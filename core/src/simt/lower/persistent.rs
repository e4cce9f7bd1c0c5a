//! Persistent tile loops (`LaunchAttrs::persistent`) whose K loop is TMA-pipelined: the two
//! loops become one loop over (tile, K step) pairs, so the copies of the next tile's first steps
//! run while this tile's last steps compute and its epilogue stores. The tile loop must be
//! `for t in range(..)` carrying nothing, with only index math before its K loop (whose bounds are
//! constants or do not depend on the tile and whose accumulator starts at zero); what follows the K loop (the
//! epilogue) runs once per tile, after the tile's last step.

use super::pipeline::{Pipeline, StageLayout, Strategy};
use super::*;

/// A tile loop flattened with its K loop `inner`, pipelined by `plan`.
pub(super) struct Persistent {
    inner: Op,
    plan: Pipeline,
}

impl Lowering<'_> {
    pub(super) fn persistent_plan(&mut self, op: Op) -> Option<Persistent> {
        if !self.func.attrs.persistent {
            return None;
        }
        let OpKind::For { init, body, .. } = &self.func.ops[op].kind else { return None };
        if !init.is_empty() {
            return None;
        }
        let body = *body;
        let ops = self.func.blocks[body].ops.clone();
        let pos = ops.iter().position(|&o| matches!(self.func.ops[o].kind, OpKind::For { .. }))?;
        let inner = ops[pos];
        let pure = |k: &OpKind| {
            is_index_math(k)
                || matches!(
                    k,
                    OpKind::Const(_)
                        | OpKind::ProgramId(_)
                        | OpKind::NumPrograms(_)
                        | OpKind::MakeDesc { .. }
                        | OpKind::Splat(_)
                )
        };
        if !ops[..pos].iter().all(|&o| pure(&self.func.ops[o].kind)) {
            return None;
        }
        // Nothing after the K loop may loop again (its epilogue runs inside the flat loop).
        if ops[pos + 1..].iter().any(|&o| !self.func.ops[o].kind.blocks().is_empty()) {
            return None;
        }
        let OpKind::For { lower, upper, step, init: acc0, .. } = self.func.ops[inner].kind.clone() else {
            unreachable!()
        };
        if acc0.len() != 1 || !self.is_zero(acc0[0]) {
            return None;
        }
        let outside = |v: Value| match self.func.values[v].def {
            ValueDef::Result { op: d, .. } => !ops.contains(&d) || matches!(self.func.ops[d].kind, OpKind::Const(_)),
            ValueDef::BlockArg { block, .. } => block != body,
            ValueDef::Param(_) => true,
        };
        if ![lower, upper, step].into_iter().all(outside) {
            return None;
        }
        let plan = self.pipeline_plan(inner)?;
        if plan.strategy != Strategy::Tma || plan.specialized {
            return None;
        }
        Some(Persistent { inner, plan })
    }

    /// The flat loop (see the module): step g is K step `g % kn` of the program's tile
    /// `g / kn` (`kn` the K loop's trip count, at least 1). The refill order is
    /// `pipelined_for`'s TMA one with the tile and K loop variables of step g + dist bound; a
    /// tile's first step ignores the accumulator (`wgmma`'s scale-d), its last waits for every
    /// group and runs the epilogue (the tile's ops after the K loop, and the index math before
    /// it, at that tile).
    pub(super) fn flattened_for(&mut self, op: Op, p: Persistent) -> Result<(), LowerError> {
        let OpKind::For { lower: lt, upper: ut, step: st, body: outer, .. } = self.func.ops[op].kind.clone() else {
            unreachable!()
        };
        let OpKind::For { lower: lk, upper: uk, step: sk, body: inner_body, .. } = self.func.ops[p.inner].kind.clone()
        else {
            unreachable!()
        };
        let plan = p.plan;
        let (l, s) = (plan.layout, plan.stages);
        let ab = stype(self.func.ty(plan.a.value));
        let (tile_arg, k_arg) = (self.func.blocks[outer].args[0], self.func.blocks[inner_body].args[0]);
        let (lo_t, hi_t, st_t) = (self.held(lt)[0], self.held(ut)[0], self.held(st)[0]);
        let (lo_k, hi_k, st_k) = (self.scalar_value(lk), self.scalar_value(uk), self.scalar_value(sk));
        let zero = self.iconst(0);
        // Trip counts: ceil((hi - lo) / step), at least 0.
        let trips = |me: &mut Self, lo: Reg, hi: Reg, step: Reg| {
            let span = me.bin(BinaryOp::Sub, hi, lo);
            let span = me.bin(BinaryOp::Add, span, step);
            let span = me.bin_c(BinaryOp::Sub, span, 1);
            let n = me.bin(BinaryOp::Div, span, step);
            me.bin(BinaryOp::Max, n, zero)
        };
        let kn = trips(self, lo_k, hi_k, st_k);
        let tn = trips(self, lo_t, hi_t, st_t);
        // An empty K loop still takes one step per tile (its products are then dropped).
        let one = self.iconst(1);
        let kn1 = self.bin(BinaryOp::Max, kn, one);
        let has_k = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: has_k, op: CmpOp::Gt, a: kn, b: zero });
        let total = self.bin(BinaryOp::Mul, tn, kn1);
        let last_k = self.bin_c(BinaryOp::Sub, kn1, 1);

        let (sl, stage_bytes, align) = self.stage_layout(&plan);
        let stages_at = self.shared_alloc("pipeline.stages", s * stage_bytes, align);
        self.emit(Inst::Barrier);
        let bars_at = self.shared_alloc("pipeline.mbarriers", 8 * s, 8);
        let leader = self.first_thread();
        for i in 0..s {
            let offset = self.iconst((bars_at + 8 * i) as i64);
            self.emit(Inst::MbarrierInit { offset, count: 1, pred: leader });
        }
        self.emit(Inst::FenceMbarrierInit);
        self.emit(Inst::Barrier);
        let single = s >= 4;
        let dist = if single { s - 2 } else { s - 1 };
        let slot = |me: &mut Self, g: Reg, at: u32, bytes: u32| {
            let r = me.bin_c(BinaryOp::Rem, g, s as i64);
            let r = me.bin_c(BinaryOp::Mul, r, bytes as i64);
            me.bin_c(BinaryOp::Add, r, at as i64)
        };
        // The tile and K loop variables of step g.
        let at_step = |me: &mut Self, g: Reg| {
            let t = me.bin(BinaryOp::Div, g, kn1);
            let kk = me.bin(BinaryOp::Rem, g, kn1);
            let ti = me.bin(BinaryOp::Mul, t, st_t);
            let ti = me.bin(BinaryOp::Add, lo_t, ti);
            let ki = me.bin(BinaryOp::Mul, kk, st_k);
            let ki = me.bin(BinaryOp::Add, lo_k, ki);
            (ti, ki, kk)
        };
        let issue = |me: &mut Self, g: Reg, sl: StageLayout| {
            let valid = me.reg(SType::Pred);
            me.emit(Inst::Cmp { dst: valid, op: CmpOp::Lt, a: g, b: total });
            let pred = me.bin(BinaryOp::And, valid, leader);
            let (ti, ki, _) = at_step(me, g);
            let (base, bar) = (slot(me, g, stages_at, stage_bytes), slot(me, g, bars_at, 8));
            me.tma_issue_bound(&plan, &[(tile_arg, ti), (k_arg, ki)], pred, base, bar, sl);
        };
        for i in 0..dist {
            let g = self.iconst(i as i64);
            issue(self, g, sl);
        }

        let g = self.reg(I32);
        let phis: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        let saved = std::mem::take(&mut self.cur);
        let memo = self.memo.clone();
        if single {
            self.emit(Inst::WgmmaWait { pending: 1 });
            self.emit(Inst::Barrier);
            let ahead = self.bin_c(BinaryOp::Add, g, dist as i64);
            issue(self, ahead, sl);
        }
        let phase = self.bin_c(BinaryOp::Div, g, s as i64);
        let parity = self.bin_c(BinaryOp::And, phase, 1);
        let (base, bar) = (slot(self, g, stages_at, stage_bytes), slot(self, g, bars_at, 8));
        self.emit(Inst::MbarrierWait { offset: bar, parity });
        let (ti, _, kk) = at_step(self, g);
        let accumulate = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: accumulate, op: CmpOp::Ne, a: kk, b: zero });
        let acc =
            self.wgmma_steps(l, ab, sl, base, phis.clone(), if single { None } else { Some(1) }, Some(accumulate));
        if !single {
            self.emit(Inst::Barrier);
            let ahead = self.bin_c(BinaryOp::Add, g, dist as i64);
            issue(self, ahead, sl);
        }
        // The tile's last step: every group done, then the epilogue at this tile.
        let last = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: last, op: CmpOp::Eq, a: kk, b: last_k });
        let body_memo = self.memo.clone();
        let before_epilogue = std::mem::take(&mut self.cur);
        self.emit(Inst::WgmmaWait { pending: 0 });
        let fz = self.konst(SType::F32, Literal::Float(0.0));
        let products: Vec<Reg> = acc
            .iter()
            .map(|&x| {
                let dst = self.reg(SType::F32);
                self.emit(Inst::Select { dst, cond: has_k, on_true: x, on_false: fz });
                dst
            })
            .collect();
        let saved_tile = self.vals.insert(tile_arg, vec![ti]);
        let result = self.func.ops[p.inner].results[0];
        self.mma_held.insert(result, (l, products));
        for &o in &self.func.blocks[outer].ops.clone() {
            if o != p.inner {
                self.op(o)?;
            }
        }
        match saved_tile {
            Some(r) => self.vals.insert(tile_arg, r),
            None => self.vals.remove(&tile_arg),
        };
        let then_body = std::mem::replace(&mut self.cur, before_epilogue);
        self.memo = body_memo;
        self.emit(Inst::If {
            cond: last,
            then_body,
            then_yields: Vec::new(),
            else_body: Vec::new(),
            else_yields: Vec::new(),
            results: Vec::new(),
        });
        let body = std::mem::replace(&mut self.cur, saved);
        self.memo = memo;
        let acc0: Vec<Reg> = (0..l.slots()).map(|_| fz).collect();
        let results: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        self.emit(Inst::Loop { iv: g, lo: zero, hi: total, step: one, phis, inits: acc0, body, nexts: acc, results });
        self.emit(Inst::WgmmaWait { pending: 0 });
        self.emit(Inst::Barrier);
        for i in 0..s {
            let offset = self.iconst((bars_at + 8 * i) as i64);
            self.emit(Inst::MbarrierInval { offset, pred: leader });
        }
        self.emit(Inst::Barrier);
        self.shared_free(bars_at);
        self.shared_free(stages_at);
        Ok(())
    }
}
