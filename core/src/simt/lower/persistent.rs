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
        if !ops[..pos].iter().all(|&o| effect_free(&self.func.ops[o].kind)) {
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

    /// Whether the value of `v` depends on block argument `arg` (through the ops defining it).
    fn depends_on(&self, v: Value, arg: Value) -> bool {
        if v == arg {
            return true;
        }
        match self.func.values[v].def {
            ValueDef::Result { op, .. } => {
                self.func.ops[op].kind.operands().into_iter().any(|(_, x)| self.depends_on(x, arg))
            }
            _ => false,
        }
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
        let leader = self.init_mbarriers(&[(bars_at, 1)], s);
        let single = s >= 4;
        let dist = if single { s - 2 } else { s - 1 };
        let slot = |me: &mut Self, g: Reg, at: u32, bytes: u32| me.ring_slot(g, s, at, bytes);
        let tile_iv = |me: &mut Self, t: Reg| {
            let ti = me.bin(BinaryOp::Mul, t, st_t);
            me.bin(BinaryOp::Add, lo_t, ti)
        };
        let k_iv = |me: &mut Self, kk: Reg| {
            let ki = me.bin(BinaryOp::Mul, kk, st_k);
            me.bin(BinaryOp::Add, lo_k, ki)
        };
        // Copy offsets that do not depend on the K step are computed once per tile and carried
        // (the raster order's divisions); the others at every step.
        let offsets = Self::tensor_offsets(&plan);
        let per_tile: Vec<usize> = (0..4).filter(|&i| !self.depends_on(offsets[i], k_arg)).collect();
        let tile_offsets = |me: &mut Self, t: Reg| -> Vec<Reg> {
            let ti = tile_iv(me, t);
            me.with_bound(&[(tile_arg, ti), (k_arg, lo_k)], |me| {
                per_tile.iter().map(|&i| me.scalar_value(offsets[i])).collect()
            })
        };
        // Copies of step `g` (tile `t`, K step `kk`), with the per-tile offsets `known`.
        let issue = |me: &mut Self, g: Reg, t: Reg, kk: Reg, known: &[Reg], sl: StageLayout| {
            let valid = me.reg(SType::Pred);
            me.emit(Inst::Cmp { dst: valid, op: CmpOp::Lt, a: g, b: total });
            let pred = me.bin(BinaryOp::And, valid, leader);
            let (ti, ki) = (tile_iv(me, t), k_iv(me, kk));
            let mut given = [None; 4];
            for (j, &i) in per_tile.iter().enumerate() {
                given[i] = Some(known[j]);
            }
            let (base, bar) = (slot(me, g, stages_at, stage_bytes), slot(me, g, bars_at, 8));
            me.tma_issue_bound(&plan, &[(tile_arg, ti), (k_arg, ki)], given, pred, base, bar, sl);
        };
        // The first `dist` steps, and where the step `dist` ahead of step 0 is.
        for i in 0..dist {
            let g = self.iconst(i as i64);
            let t = self.bin(BinaryOp::Div, g, kn1);
            let kk = self.bin(BinaryOp::Rem, g, kn1);
            let known = tile_offsets(self, t);
            issue(self, g, t, kk, &known, sl);
        }
        let ahead0 = self.iconst(dist as i64);
        let t_next0 = self.bin(BinaryOp::Div, ahead0, kn1);
        let kk_next0 = self.bin(BinaryOp::Rem, ahead0, kn1);
        let known0 = tile_offsets(self, t_next0);

        // Phis: the accumulator, this step's K step, the tile and K step `dist` ahead, and the
        // per-tile offsets of that tile.
        let g = self.reg(I32);
        let phis: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        let (kk_cur, kk_next, t_next) = (self.reg(I32), self.reg(I32), self.reg(I32));
        let known: Vec<Reg> = per_tile.iter().map(|_| self.reg(I32)).collect();
        let saved = std::mem::take(&mut self.cur);
        let memo = self.memo.clone();
        let ahead = self.bin_c(BinaryOp::Add, g, dist as i64);
        if single {
            self.emit(Inst::WgmmaWait { pending: 1 });
            self.emit(Inst::Barrier);
        }
        let parity = self.ring_parity(g, s);
        let (base, bar) = (slot(self, g, stages_at, stage_bytes), slot(self, g, bars_at, 8));
        self.emit(Inst::MbarrierWait { offset: bar, parity });
        let accumulate = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: accumulate, op: CmpOp::Ne, a: kk_cur, b: zero });
        let acc =
            self.wgmma_steps(l, ab, sl, base, phis.clone(), if single { None } else { Some(1) }, Some(accumulate));
        // The copies `dist` steps ahead go after this step's group (as in `pipelined_for`).
        if !single {
            self.emit(Inst::Barrier);
        }
        issue(self, ahead, t_next, kk_next, &known, sl);
        // The tile's last step: every group done, then the epilogue at this tile.
        let last = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: last, op: CmpOp::Eq, a: kk_cur, b: last_k });
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
        let t = self.bin(BinaryOp::Div, g, kn1);
        let ti = tile_iv(self, t);
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
        // The tile's values live in the epilogue's region only.
        for &o in &self.func.blocks[outer].ops {
            for r in &self.func.ops[o].results {
                self.vals.remove(r);
                self.mma_held.remove(r);
            }
        }
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
        // The counters move on one step; a tile change recomputes the carried offsets.
        let wrap = |me: &mut Self, x: Reg| {
            let x1 = me.bin_c(BinaryOp::Add, x, 1);
            let w = me.reg(SType::Pred);
            me.emit(Inst::Cmp { dst: w, op: CmpOp::Eq, a: x1, b: kn1 });
            let dst = me.reg(I32);
            me.emit(Inst::Select { dst, cond: w, on_true: zero, on_false: x1 });
            (dst, w)
        };
        let (kk_cur1, _) = wrap(self, kk_cur);
        let (kk_next1, new_tile) = wrap(self, kk_next);
        let t_next1 = self.reg(I32);
        let t_plus = self.bin_c(BinaryOp::Add, t_next, 1);
        self.emit(Inst::Select { dst: t_next1, cond: new_tile, on_true: t_plus, on_false: t_next });
        let known1: Vec<Reg> = known.iter().map(|_| self.reg(I32)).collect();
        if !known.is_empty() {
            let outside = std::mem::take(&mut self.cur);
            let fresh = tile_offsets(self, t_next1);
            let then_body = std::mem::replace(&mut self.cur, outside);
            self.emit(Inst::If {
                cond: new_tile,
                then_body,
                then_yields: fresh,
                else_body: Vec::new(),
                else_yields: known.clone(),
                results: known1.clone(),
            });
        }
        let body = std::mem::replace(&mut self.cur, saved);
        self.memo = memo;
        let mut all_phis = phis;
        let mut inits: Vec<Reg> = (0..l.slots()).map(|_| fz).collect();
        let mut nexts = acc;
        all_phis.extend([kk_cur, kk_next, t_next]);
        inits.extend([zero, kk_next0, t_next0]);
        nexts.extend([kk_cur1, kk_next1, t_next1]);
        all_phis.extend(known.iter().copied());
        inits.extend(known0);
        nexts.extend(known1);
        let results: Vec<Reg> = all_phis.iter().map(|&r| self.reg(self.k.ty(r))).collect();
        self.emit(Inst::Loop { iv: g, lo: zero, hi: total, step: one, phis: all_phis, inits, body, nexts, results });
        self.emit(Inst::WgmmaWait { pending: 0 });
        self.end_mbarriers(&[bars_at], s, leader);
        self.shared_free(stages_at);
        Ok(())
    }
}
