//! Persistent tile loops (`LaunchAttrs::persistent`) whose K loop is TMA-pipelined: the two
//! loops become one loop over (tile, K step) pairs, so the copies of the next tile's first steps
//! run while this tile's last steps compute and its epilogue stores. The tile loop must be
//! `for t in range(..)` carrying nothing, with only index math (and scalar loads of read-only
//! parameters) before its K loop (whose bounds
//! are constants or do not depend on the tile and whose accumulator starts at zero); what
//! follows the K loop (the epilogue) runs once per tile, after the tile's last step. With a
//! producer warp (`LaunchAttrs::warp_specialize`) only the producer walks the flat loop; the
//! consumers keep the tile loop around the K loop ([`Lowering::flattened_specialized`]).

use super::pipeline::{Pipeline, ProducerRings, StageLayout, Strategy};
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
        // Index math before the K loop, with scalar loads of parameters the kernel only reads
        // (a tile's record in a schedule table: the producer reads it ahead of the consumers),
        // and the tile's waits (an AG-GEMM's chunk signals), which the flat loop runs before
        // the tile's first copies: with a producer warp, the producer alone.
        if !ops[..pos].iter().all(|&o| {
            let k = &self.func.ops[o].kind;
            effect_free(k)
                || matches!(k, OpKind::Rank | OpKind::NumRanks | OpKind::ConsumeToken { .. } | OpKind::Wait { .. })
                || self.read_only_scalar_load(o)
        }) {
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
        if plan.strategy != Strategy::Tma || plan.specialized || plan.promotion.is_some() {
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

    /// The counters and per-tile values both flat loops share (see [`Flat`]).
    fn flat(&mut self, op: Op, p: &Persistent) -> Flat {
        let OpKind::For { lower: lt, upper: ut, step: st, body: outer, .. } = self.func.ops[op].kind.clone() else {
            unreachable!()
        };
        let OpKind::For { lower: lk, upper: uk, step: sk, body: inner_body, .. } = self.func.ops[p.inner].kind.clone()
        else {
            unreachable!()
        };
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
        // Copy offsets that do not depend on the K step are computed once per tile and carried
        // (the raster order's divisions); the others at every step.
        let offsets = Self::tensor_offsets(&p.plan);
        let per_tile: Vec<usize> = (0..4).filter(|&i| !self.depends_on(offsets[i], k_arg)).collect();
        Flat { outer, tile_arg, k_arg, lo_t, st_t, lo_k, st_k, kn1, has_k, tiles: tn, total, last_k, per_tile, offsets }
    }

    fn flat_tile_iv(&mut self, f: &Flat, t: Reg) -> Reg {
        let ti = self.bin(BinaryOp::Mul, t, f.st_t);
        self.bin(BinaryOp::Add, f.lo_t, ti)
    }

    /// The per-tile copy offsets of tile number `t`.
    fn flat_tile_offsets(&mut self, f: &Flat, t: Reg) -> Vec<Reg> {
        let ti = self.flat_tile_iv(f, t);
        let lo_k = f.lo_k;
        self.with_bound(&[(f.tile_arg, ti), (f.k_arg, lo_k)], |me| {
            f.per_tile.iter().map(|&i| me.scalar_value(f.offsets[i])).collect()
        })
    }

    /// The copies of flat step `g` (tile number `t`, K step `kk`, the per-tile offsets `known`)
    /// by the threads with `who`, into slot `g % stages` of `ring` (its stage and its "full"
    /// mbarrier).
    #[allow(clippy::too_many_arguments)]
    fn flat_issue(
        &mut self,
        f: &Flat,
        plan: &Pipeline,
        g: Reg,
        (t, kk): (Reg, Reg),
        known: &[Reg],
        who: Reg,
        ring: Ring,
    ) {
        let valid = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: valid, op: CmpOp::Lt, a: g, b: f.total });
        let pred = self.bin(BinaryOp::And, valid, who);
        let ti = self.flat_tile_iv(f, t);
        let ki = self.bin(BinaryOp::Mul, kk, f.st_k);
        let ki = self.bin(BinaryOp::Add, f.lo_k, ki);
        let mut given = [None; 4];
        for (j, &i) in f.per_tile.iter().enumerate() {
            given[i] = Some(known[j]);
        }
        let s = plan.stages;
        let (base, bar) =
            (self.ring_slot(g, s, ring.stages_at, ring.stage_bytes), self.ring_slot(g, s, ring.full_at, 8));
        self.tma_issue_bound(plan, &[(f.tile_arg, ti), (f.k_arg, ki)], given, pred, base, bar, ring.layout);
    }

    /// Counters one flat step on: K step `kk` wraps to 0 at the tile's end, where the tile
    /// number `t` (when given) moves on and the carried offsets `known` are recomputed.
    /// Returns the next K step, tile number and offsets.
    fn flat_advance(&mut self, f: &Flat, kk: Reg, t: Option<Reg>, known: &[Reg]) -> (Reg, Option<Reg>, Vec<Reg>) {
        let zero = self.iconst(0);
        let x1 = self.bin_c(BinaryOp::Add, kk, 1);
        let wrap = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: wrap, op: CmpOp::Eq, a: x1, b: f.kn1 });
        let kk1 = self.reg(I32);
        self.emit(Inst::Select { dst: kk1, cond: wrap, on_true: zero, on_false: x1 });
        let Some(t) = t else { return (kk1, None, Vec::new()) };
        let t1 = self.reg(I32);
        let t_plus = self.bin_c(BinaryOp::Add, t, 1);
        self.emit(Inst::Select { dst: t1, cond: wrap, on_true: t_plus, on_false: t });
        let known1: Vec<Reg> = known.iter().map(|_| self.reg(I32)).collect();
        if !known.is_empty() {
            let outside = std::mem::take(&mut self.cur);
            let fresh = self.flat_tile_offsets(f, t1);
            let then_body = std::mem::replace(&mut self.cur, outside);
            self.emit(Inst::If {
                cond: wrap,
                then_body,
                then_yields: fresh,
                else_body: Vec::new(),
                else_yields: known.to_vec(),
                results: known1.clone(),
            });
        }
        (kk1, Some(t1), known1)
    }

    /// The tile's last step (K step `kk` of flat step `g`): `first` (every group done, stage
    /// handed back), then the epilogue ([`Lowering::tile_epilogue`]), in an `if`.
    fn flat_epilogue(
        &mut self,
        f: &Flat,
        p: &Persistent,
        (g, kk): (Reg, Reg),
        acc: &[Reg],
        first: impl FnOnce(&mut Self),
    ) -> Result<(), LowerError> {
        let last = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: last, op: CmpOp::Eq, a: kk, b: f.last_k });
        self.uniform_if(last, |me| {
            first(me);
            let t = me.bin(BinaryOp::Div, g, f.kn1);
            me.tile_epilogue(f, p, t, acc)
        })
    }

    /// `if cond { body }` with `cond` uniform: what `body` emits goes in the branch, and the
    /// values it memoized stay there.
    fn uniform_if(
        &mut self,
        cond: Reg,
        body: impl FnOnce(&mut Self) -> Result<(), LowerError>,
    ) -> Result<(), LowerError> {
        let memo = self.memo.clone();
        let outside = std::mem::take(&mut self.cur);
        let done = body(self);
        let then_body = std::mem::replace(&mut self.cur, outside);
        self.memo = memo;
        done?;
        self.emit(Inst::If {
            cond,
            then_body,
            then_yields: Vec::new(),
            else_body: Vec::new(),
            else_yields: Vec::new(),
            results: Vec::new(),
        });
        Ok(())
    }

    /// The epilogue of tile number `t`: the tile loop's ops but the K loop, with the products
    /// `acc` (zeros for an empty K loop) in place of its result and the tile variable bound.
    fn tile_epilogue(&mut self, f: &Flat, p: &Persistent, t: Reg, acc: &[Reg]) -> Result<(), LowerError> {
        self.trace(crate::trace::EventKind::Epilogue, 0, Some(t));
        let saved_tile = self.tile_ops_before(f, p, t, false)?;
        self.tile_ops_after(f, p, acc, saved_tile)
    }

    /// Where the tile loop waits before its K loop (an AG-GEMM's chunk signals): at the flat
    /// step that issues a tile's first copies (K step `kk` 0 of tile number `t`), the tile's
    /// index math and waits, in a uniform `if` (the copies that follow then read what the wait
    /// acquired: the wait's lowering orders the async proxy after it). Nothing without waits.
    /// With a producer warp the producer runs it (its wait is the warp's: `protocol`), and the
    /// consumers wait for nothing but their stages: what the producer acquired reaches them
    /// through the stage's mbarrier (its arrival releases, their wait acquires).
    fn flat_waits(&mut self, f: &Flat, p: &Persistent, g: Reg, (t, kk): (Reg, Reg)) -> Result<(), LowerError> {
        let waits = self.func.blocks[f.outer]
            .ops
            .iter()
            .take_while(|&&o| o != p.inner)
            .any(|&o| matches!(self.func.ops[o].kind, OpKind::Wait { .. }));
        if !waits {
            return Ok(());
        }
        // Only for a step of the program's (past its last tile there is nothing to wait for).
        let zero = self.iconst(0);
        let (starts, valid) = (self.reg(SType::Pred), self.reg(SType::Pred));
        self.emit(Inst::Cmp { dst: starts, op: CmpOp::Eq, a: kk, b: zero });
        self.emit(Inst::Cmp { dst: valid, op: CmpOp::Lt, a: g, b: f.total });
        let first = self.bin(BinaryOp::And, starts, valid);
        self.uniform_if(first, |me| {
            let saved_tile = me.tile_ops_before(f, p, t, true)?;
            me.forget_tile(f, saved_tile);
            Ok(())
        })
    }

    /// The tile variable's earlier binding back, and the tile's values gone (they live in the
    /// region that computed them).
    fn forget_tile(&mut self, f: &Flat, saved_tile: Option<Vec<Reg>>) {
        match saved_tile {
            Some(r) => self.vals.insert(f.tile_arg, r),
            None => self.vals.remove(&f.tile_arg),
        };
        for &o in &self.func.blocks[f.outer].ops {
            for r in &self.func.ops[o].results {
                self.vals.remove(r);
                self.mma_held.remove(r);
            }
        }
    }

    /// The tile loop's ops before the K loop (index math) with the tile variable bound to tile
    /// number `t`; returns the variable's earlier binding, for [`Lowering::tile_ops_after`].
    /// Its waits run only with `waits` ([`Lowering::flat_waits`] runs them before the tile's
    /// first copies); otherwise their tokens are plain values.
    fn tile_ops_before(
        &mut self,
        f: &Flat,
        p: &Persistent,
        t: Reg,
        waits: bool,
    ) -> Result<Option<Vec<Reg>>, LowerError> {
        let ti = self.flat_tile_iv(f, t);
        let saved_tile = self.vals.insert(f.tile_arg, vec![ti]);
        let ops = self.func.blocks[f.outer].ops.clone();
        for &o in ops.iter().take_while(|&&o| o != p.inner) {
            if !waits && matches!(self.func.ops[o].kind, OpKind::Wait { .. }) {
                let token = self.reg(SType::Int { bits: 64, signed: false });
                self.emit(Inst::Const { dst: token, value: Literal::Int(0) });
                let r = self.func.ops[o].results[0];
                self.vals.insert(r, vec![token]);
                continue;
            }
            self.op(o)?;
        }
        Ok(saved_tile)
    }

    /// The tile loop's ops after the K loop, with the products `acc` (zeros for an empty K loop)
    /// in place of its result; then the tile's values and the tile variable's binding go.
    fn tile_ops_after(
        &mut self,
        f: &Flat,
        p: &Persistent,
        acc: &[Reg],
        saved_tile: Option<Vec<Reg>>,
    ) -> Result<(), LowerError> {
        // Zeros for an empty K loop. With a producer warp, in a uniform branch (the trip count is
        // the program's; a select per register would cost every tile an instruction per
        // accumulator register). In the flat loop without one the epilogue is already a branch,
        // and ptxas spilled the nested branch's 128 results there: a select per register.
        let fz = self.konst(SType::F32, Literal::Float(0.0));
        let products: Vec<Reg> = acc.iter().map(|_| self.reg(SType::F32)).collect();
        if self.func.attrs.warp_specialize {
            self.emit(Inst::If {
                cond: f.has_k,
                then_body: Vec::new(),
                then_yields: acc.to_vec(),
                else_body: Vec::new(),
                else_yields: vec![fz; acc.len()],
                results: products.clone(),
            });
        } else {
            for (&dst, &x) in products.iter().zip(acc) {
                self.emit(Inst::Select { dst, cond: f.has_k, on_true: x, on_false: fz });
            }
        }
        let result = self.func.ops[p.inner].results[0];
        self.mma_held.insert(result, (p.plan.layout, products));
        let ops = self.func.blocks[f.outer].ops.clone();
        for &o in ops.iter().skip_while(|&&o| o != p.inner).skip(1) {
            self.op(o)?;
        }
        // The tile's values live in the epilogue's region only.
        self.forget_tile(f, saved_tile);
        Ok(())
    }

    /// The flat loop (see the module): step g is K step `g % kn` of the program's tile
    /// `g / kn` (`kn` the K loop's trip count, at least 1). The refill order is
    /// `pipelined_for`'s TMA one with the tile and K loop variables of step g + dist bound; a
    /// tile's first step ignores the accumulator (`wgmma`'s scale-d), its last waits for every
    /// group and runs the epilogue (the tile's ops after the K loop, and the index math before
    /// it, at that tile). With `LaunchAttrs::warp_specialize`, [`Lowering::flattened_specialized`].
    pub(super) fn flattened_for(&mut self, op: Op, p: Persistent) -> Result<(), LowerError> {
        if self.func.attrs.warp_specialize {
            return self.flattened_specialized(op, p);
        }
        let f = self.flat(op, &p);
        let plan = &p.plan;
        let (l, s) = (plan.layout, plan.stages);
        let zero = self.iconst(0);
        let one = self.iconst(1);
        let (sl, stage_bytes, align) = self.stage_layout(plan);
        let stages_at = self.shared_alloc("pipeline.stages", s * stage_bytes, align);
        self.emit(Inst::Barrier);
        let bars_at = self.shared_alloc("pipeline.mbarriers", 8 * s, 8);
        let leader = self.init_mbarriers(&[(bars_at, 1)], s);
        let ring = Ring { stages_at, stage_bytes, full_at: bars_at, layout: sl };
        let single = s >= 4;
        let dist = if single { s - 2 } else { s - 1 };
        // The first `dist` steps, and where the step `dist` ahead of step 0 is.
        for i in 0..dist {
            let g = self.iconst(i as i64);
            let t = self.bin(BinaryOp::Div, g, f.kn1);
            let kk = self.bin(BinaryOp::Rem, g, f.kn1);
            let known = self.flat_tile_offsets(&f, t);
            self.flat_waits(&f, &p, g, (t, kk))?;
            self.flat_issue(&f, plan, g, (t, kk), &known, leader, ring);
        }
        let ahead0 = self.iconst(dist as i64);
        let t_next0 = self.bin(BinaryOp::Div, ahead0, f.kn1);
        let kk_next0 = self.bin(BinaryOp::Rem, ahead0, f.kn1);
        let known0 = self.flat_tile_offsets(&f, t_next0);

        // Phis: the accumulator, this step's K step, the tile and K step `dist` ahead, and the
        // per-tile offsets of that tile.
        let g = self.reg(I32);
        let phis: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        let (kk_cur, kk_next, t_next) = (self.reg(I32), self.reg(I32), self.reg(I32));
        let known: Vec<Reg> = f.per_tile.iter().map(|_| self.reg(I32)).collect();
        let saved = std::mem::take(&mut self.cur);
        let memo = self.memo.clone();
        // (A lowering error ends the whole lowering: no scope to close then.)
        self.smem.enter_loop();
        let ahead = self.bin_c(BinaryOp::Add, g, dist as i64);
        if single {
            self.emit(Inst::WgmmaWait { pending: 1 });
            self.emit(Inst::Barrier);
        }
        let parity = self.ring_parity(g, s);
        let (base, bar) = (self.ring_slot(g, s, stages_at, stage_bytes), self.ring_slot(g, s, bars_at, 8));
        self.emit(Inst::MbarrierWait { offset: bar, parity });
        let accumulate = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: accumulate, op: CmpOp::Ne, a: kk_cur, b: zero });
        let acc = self.wgmma_steps(l, sl, base, phis.clone(), if single { None } else { Some(1) }, Some(accumulate));
        // The copies `dist` steps ahead go after this step's group (as in `pipelined_for`).
        if !single {
            self.emit(Inst::Barrier);
        }
        self.flat_waits(&f, &p, ahead, (t_next, kk_next))?;
        self.flat_issue(&f, plan, ahead, (t_next, kk_next), &known, leader, ring);
        // The tile's last step: every group done, then the epilogue at this tile.
        self.flat_epilogue(&f, &p, (g, kk_cur), &acc, |me| me.emit(Inst::WgmmaWait { pending: 0 }))?;
        let (kk_cur1, _, _) = self.flat_advance(&f, kk_cur, None, &[]);
        let (kk_next1, t_next1, known1) = self.flat_advance(&f, kk_next, Some(t_next), &known);
        self.smem.leave_loop();
        let body = std::mem::replace(&mut self.cur, saved);
        self.memo = memo;
        let fz = self.konst(SType::F32, Literal::Float(0.0));
        let mut all_phis = phis;
        let mut inits: Vec<Reg> = (0..l.slots()).map(|_| fz).collect();
        let mut nexts = acc;
        all_phis.extend([kk_cur, kk_next, t_next]);
        inits.extend([zero, kk_next0, t_next0]);
        nexts.extend([kk_cur1, kk_next1, t_next1.expect("the tile moves on")]);
        all_phis.extend(known.iter().copied());
        inits.extend(known0);
        nexts.extend(known1);
        let results: Vec<Reg> = all_phis.iter().map(|&r| self.reg(self.k.ty(r))).collect();
        self.emit(Inst::Loop { iv: g, lo: zero, hi: f.total, step: one, phis: all_phis, inits, body, nexts, results });
        self.emit(Inst::WgmmaWait { pending: 0 });
        self.end_mbarriers(&[bars_at], s, leader);
        self.shared_free(stages_at);
        Ok(())
    }

    /// Ping-pong's order between the groups' main loops around the one of the program's tile
    /// `ct` (of `tiles`; group c takes c, c + 2, ...): before it (`after` false) the group
    /// waits for the other group's main loop of tile `ct - 1`, if there is one; after it the
    /// group lets the other's main loop of tile `ct + 1` go, if there is one. Named barriers
    /// 4 + group ("group's main loop done"), counting both groups' threads. Nothing without
    /// ping-pong.
    fn group_order(&mut self, ct: Reg, tiles: Reg, after: bool) {
        let Some(group) = self.group else { return };
        let four = self.iconst(4);
        let (cond, id) = match after {
            false => {
                let zero = self.iconst(0);
                let other = self.bin_c(BinaryOp::Xor, group, 1);
                let cond = self.reg(SType::Pred);
                self.emit(Inst::Cmp { dst: cond, op: CmpOp::Gt, a: ct, b: zero });
                (cond, self.bin(BinaryOp::Add, other, four))
            }
            true => {
                let next = self.bin_c(BinaryOp::Add, ct, 1);
                let cond = self.reg(SType::Pred);
                self.emit(Inst::Cmp { dst: cond, op: CmpOp::Lt, a: next, b: tiles });
                (cond, self.bin(BinaryOp::Add, group, four))
            }
        };
        self.emit(Inst::If {
            cond,
            then_body: vec![Inst::GroupOrder { id, arrive: after }],
            then_yields: Vec::new(),
            else_body: Vec::new(),
            else_yields: Vec::new(),
            results: Vec::new(),
        });
    }

    /// The flat loop with a producer warp (`LaunchAttrs::warp_specialize`), as
    /// `specialized_for` splits a K loop: the producer walks every (tile, K step) of the
    /// program, waiting for a stage's "empty" mbarrier and copying into it; the consumers walk
    /// the same steps, waiting for "full", issuing the step's `wgmma` group and, once the group
    /// before completed, handing that step's stage back (one arrival per warp). A tile's last
    /// step waits for every group, hands its stage back and runs the epilogue while the producer
    /// already fills the stages of the next tile. The epilogue's barriers are the consumers'
    /// own.
    fn flattened_specialized(&mut self, op: Op, p: Persistent) -> Result<(), LowerError> {
        let f = self.flat(op, &p);
        let plan = &p.plan;
        let (l, s) = (plan.layout, plan.stages);
        let (zero, one) = (self.iconst(0), self.iconst(1));
        let (sl, stage_bytes, align) = self.stage_layout(plan);
        let stages_at = self.shared_alloc("pipeline.stages", s * stage_bytes, align);
        let ProducerRings { full_at, empty_at, leader, producer_lane, releaser } = self.producer_rings(s);
        let ring = Ring { stages_at, stage_bytes, full_at, layout: sl };
        let t0 = zero;
        let known0 = self.flat_tile_offsets(&f, t0);
        let saved = std::mem::take(&mut self.cur);
        let memo = self.memo.clone();
        self.smem.enter_loop();

        // The producer: wait until step g's stage is free, announce and copy; then move on.
        let (pg, pkk, pt) = (self.reg(I32), self.reg(I32), self.reg(I32));
        let known: Vec<Reg> = f.per_tile.iter().map(|_| self.reg(I32)).collect();
        let parity = self.ring_parity(pg, s);
        let parity = self.bin_c(BinaryOp::Xor, parity, 1);
        let empty = self.ring_slot(pg, s, empty_at, 8);
        self.emit(Inst::MbarrierWait { offset: empty, parity });
        // (After the stage's wait: cpu-simt runs a producer's iteration again from its start
        // when that wait blocks, and the waits' trace events would be recorded twice.)
        self.flat_waits(&f, &p, pg, (pt, pkk))?;
        self.flat_issue(&f, plan, pg, (pt, pkk), &known, producer_lane, ring);
        let (pkk1, pt1, known1) = self.flat_advance(&f, pkk, Some(pt), &known);
        let producer_body = std::mem::take(&mut self.cur);
        self.memo = memo.clone();
        let mut phis = vec![pkk, pt];
        phis.extend(known.iter().copied());
        let mut inits = vec![zero, t0];
        inits.extend(known0);
        let mut nexts = vec![pkk1, pt1.expect("the tile moves on")];
        nexts.extend(known1);
        let results = phis.iter().map(|&r| self.reg(self.k.ty(r))).collect();
        let producer = vec![Inst::Loop {
            iv: pg,
            lo: zero,
            hi: f.total,
            step: one,
            phis,
            inits,
            body: producer_body,
            nexts,
            results,
        }];

        // The consumers: a tile loop whose K loop waits for step g's data, issues its group and
        // hands the step before back (within the tile); after it every group is done, the last
        // stage goes back and the epilogue runs, while the producer fills the next tile's stages.
        // (Nested loops, not the flat loop: a `wgmma` wait in an `if` makes ptxas serialize every
        // `wgmma` of the kernel, C7518.)
        let (ct, tile_g) = (self.reg(I32), self.reg(I32));
        // With ping-pong, the consumers' shared objects are one copy per group; only those
        // reached through `shared_offset` (layout conversions) and the TMA store's staging
        // (its own) are known to take their group's copy, so any other is refused.
        let objects_before = self.smem.objects.len();
        if self.group.is_some() {
            self.group_objects = Some(HashMap::default());
        }
        // The tile's index math first (off the path from the last group to the stores).
        let saved_tile = self.tile_ops_before(&f, &p, ct, false)?;
        let (ckk, cg) = (self.reg(I32), self.reg(I32));
        let acc_phis: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        let k_saved = std::mem::take(&mut self.cur);
        let k_memo = self.memo.clone();
        let parity = self.ring_parity(cg, s);
        let (full, base) = (self.ring_slot(cg, s, full_at, 8), self.ring_slot(cg, s, stages_at, stage_bytes));
        self.emit(Inst::MbarrierWait { offset: full, parity });
        let accumulate = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: accumulate, op: CmpOp::Ne, a: ckk, b: zero });
        let acc = self.wgmma_steps(l, sl, base, acc_phis.clone(), Some(1), Some(accumulate));
        let before = self.bin_c(BinaryOp::Add, cg, s as i64 - 1);
        let released = self.ring_slot(before, s, empty_at, 8);
        let pred = self.bin(BinaryOp::And, accumulate, releaser);
        self.emit(Inst::MbarrierArrive { offset: released, pred });
        let cg1 = self.bin_c(BinaryOp::Add, cg, 1);
        let k_body = std::mem::replace(&mut self.cur, k_saved);
        self.memo = k_memo;
        let fz = self.konst(SType::F32, Literal::Float(0.0));
        let mut phis = acc_phis;
        phis.push(cg);
        let mut inits: Vec<Reg> = (0..l.slots()).map(|_| fz).collect();
        inits.push(tile_g);
        let mut nexts = acc;
        nexts.push(cg1);
        let results: Vec<Reg> = phis.iter().map(|&r| self.reg(self.k.ty(r))).collect();
        // With ping-pong the groups' main loops take turns (CUTLASS's order barrier): a group
        // starts waiting on the ring only after the other group's main loop of the tile before
        // has passed all its waits. Without it a group waits on a stage a whole tile ahead of
        // the producer, and an mbarrier's parity wait passes on an older phase of the same
        // parity (a wrong result, or a launch failure, at K = 4096 on an H100).
        self.group_order(ct, f.tiles, false);
        self.emit(Inst::Loop {
            iv: ckk,
            lo: zero,
            hi: f.kn1,
            step: one,
            phis,
            inits,
            body: k_body,
            nexts,
            results: results.clone(),
        });
        let (acc_r, g_end) = (&results[..l.slots() as usize], results[l.slots() as usize]);
        self.group_order(ct, f.tiles, true);
        self.emit(Inst::WgmmaWait { pending: 0 });
        let last = self.bin_c(BinaryOp::Sub, g_end, 1);
        let mine = self.ring_slot(last, s, empty_at, 8);
        self.emit(Inst::MbarrierArrive { offset: mine, pred: releaser });
        self.tile_ops_after(&f, &p, acc_r, saved_tile)?;
        if self.group_objects.take().is_some() {
            let known = ["relayout", "tma.store", "bulk.store"];
            if let Some(o) = self.smem.objects[objects_before..].iter().find(|o| !known.contains(&o.name)) {
                return Err(LowerError::Unsupported {
                    op: "kernel".into(),
                    loc: None,
                    reason: format!(
                        "consumer ping-pong: the tile's epilogue uses shared memory (`{}`) that is not one copy per group yet",
                        o.name
                    ),
                });
            }
        }
        // With ping-pong, group c takes the program's tiles c, c + 2, ..: its first ring step
        // is tile c's, and after a tile it skips the other group's steps.
        let g_next = match self.group {
            Some(_) => self.bin(BinaryOp::Add, g_end, f.kn1),
            None => g_end,
        };
        self.smem.leave_loop();
        let outer_body = std::mem::replace(&mut self.cur, saved);
        self.memo = memo;
        let (lo, step, first_g) = match self.group {
            Some(c) => (c, self.iconst(2), self.bin(BinaryOp::Mul, c, f.kn1)),
            None => (zero, one, zero),
        };
        let g_r = self.reg(I32);
        let consumer_loop = Inst::Loop {
            iv: ct,
            lo,
            hi: f.tiles,
            step,
            phis: vec![tile_g],
            inits: vec![first_g],
            body: outer_body,
            nexts: vec![g_next],
            results: vec![g_r],
        };
        self.pingpong_used |= self.group.is_some();
        let consumer_warps = self.k.warps * self.k.consumer_groups;
        let regs = self.reg_split();
        self.emit(Inst::Specialized {
            consumer_warps,
            producer,
            consumer: vec![consumer_loop],
            pingpong: self.group,
            regs,
        });
        // Only the consumers from here on: every group done (each tile's last step waited),
        // then the mbarriers end.
        self.end_mbarriers(&[full_at, empty_at], s, leader);
        self.shared_free(stages_at);
        Ok(())
    }
}

/// What both flat loops share: the tile loop's body and variables, the K loop's variable, the
/// tile and K step counters' bounds, and which copy offsets are per tile.
struct Flat {
    outer: Block,
    tile_arg: Value,
    k_arg: Value,
    lo_t: Reg,
    st_t: Reg,
    lo_k: Reg,
    st_k: Reg,
    /// K steps per tile, at least 1.
    kn1: Reg,
    /// Whether the K loop has any step (else the products are zeros).
    has_k: Reg,
    /// The program's tiles.
    tiles: Reg,
    /// Flat steps of the program: tiles x `kn1`.
    total: Reg,
    last_k: Reg,
    /// Which of the copy offsets ([`Lowering::tensor_offsets`]) do not depend on the K step.
    per_tile: Vec<usize>,
    offsets: [Value; 4],
}

/// Where a TMA ring lives: its stages, their "full" mbarriers, and the stage layout.
#[derive(Clone, Copy)]
struct Ring {
    stages_at: u32,
    stage_bytes: u32,
    full_at: u32,
    layout: StageLayout,
}
