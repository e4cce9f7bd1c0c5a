//! Reductions: within a thread, across lanes by shuffles, across warps through shared
//! memory.

use super::*;

impl Lowering<'_> {
    /// Combines two partial reductions `(value, index)`; `b` covers later coordinates on ties.
    /// Float `max`/`min` ignore NaN (minimumNumber, `-0 < +0`); `argmax`/`argmin` treat NaN as
    /// worse than any number (and two NaNs as a tie), so they return the first NaN only when
    /// every element is NaN. Both rules are symmetric, so every lane of a butterfly agrees.
    pub(super) fn combine(&mut self, rop: ReduceOp, a: (Reg, Reg), b: (Reg, Reg)) -> (Reg, Reg) {
        let t = self.k.ty(a.0);
        match rop {
            ReduceOp::Sum => (self.bin(BinaryOp::Add, a.0, b.0), a.1),
            ReduceOp::Max | ReduceOp::Min if t.is_float() => {
                let op = if rop == ReduceOp::Max { BinaryOp::Max } else { BinaryOp::Min };
                (self.min_max(op, a.0, b.0), a.1)
            }
            _ => {
                let c = if matches!(rop, ReduceOp::Max | ReduceOp::Argmax) { CmpOp::Gt } else { CmpOp::Lt };
                let mut better = self.cmp_raw(c, b.0, a.0);
                let arg = matches!(rop, ReduceOp::Argmax | ReduceOp::Argmin);
                if arg {
                    let mut tie = self.cmp_raw(CmpOp::Eq, b.0, a.0);
                    if t.is_float() {
                        let (an, bn) = (self.cmp_raw(CmpOp::Ne, a.0, a.0), self.cmp_raw(CmpOp::Ne, b.0, b.0));
                        let b_num = self.not(bn);
                        let over_nan = self.bin(BinaryOp::And, an, b_num);
                        better = self.bin(BinaryOp::Or, better, over_nan);
                        let both = self.bin(BinaryOp::And, an, bn);
                        tie = self.bin(BinaryOp::Or, tie, both);
                    }
                    let earlier = self.cmp_raw(CmpOp::Lt, b.1, a.1);
                    let tie = self.bin(BinaryOp::And, tie, earlier);
                    better = self.bin(BinaryOp::Or, better, tie);
                }
                let v = self.select_raw(better, b.0, a.0);
                if !arg {
                    return (v, a.1);
                }
                (v, self.select_raw(better, b.1, a.1))
            }
        }
    }

    /// Reduction along `axis`: each thread folds its slots, butterfly shuffles combine the lanes
    /// along the axis, and shared memory combines the warps along it while delivering the result
    /// in the result's layout.
    pub(super) fn reduce(&mut self, rop: ReduceOp, axis: usize, x: Value, rshape: &[u32], rt: SType) -> Vec<Reg> {
        let xt = self.func.ty(x).clone();
        let shape = xt.shape.clone();
        let l = self.layout(&shape);
        let et = stype(&xt);
        // f16/bf16 accumulate in f32 (rounded once at the end), narrow integers and i1 in 32
        // bits (wrapped at the end).
        let acc_t = match et {
            SType::F16 | SType::BF16 => SType::F32,
            t => elementwise::arith_type(t),
        };
        let arg = matches!(rop, ReduceOp::Argmax | ReduceOp::Argmin);
        let src = self.held(x);
        // 1. Within the thread, in increasing coordinate along the axis.
        let mut parts: BTreeMap<Vec<u32>, ((Reg, Reg), u32)> = BTreeMap::new();
        for (s, &r) in src.iter().enumerate() {
            let mut idx = l.offset(s as u32);
            idx[axis] = 0;
            let c = self.slot_coords(&shape, s as u32);
            let v = (self.cast(r, acc_t), c[axis]);
            let next = match parts.remove(&idx) {
                Some((p, first)) => (self.combine(rop, p, v), first),
                None => (v, s as u32),
            };
            parts.insert(idx, next);
        }
        // 2. Across the lanes along the axis that hold distinct elements.
        let spt = l.size_per_thread[axis];
        let lanes = l.threads_per_warp[axis].min((shape[axis] / spt).max(1));
        let stride = l.lane_stride(axis);
        let mut parts: Vec<((Reg, Reg), u32)> = parts.into_values().collect();
        for (p, _) in parts.iter_mut() {
            let mut bit = 1;
            while bit < lanes {
                let xor = stride * bit;
                let (v2, i2) = (self.reg(acc_t), self.reg(I32));
                self.emit(Inst::Shuffle { dst: v2, src: p.0, lane_xor: xor });
                if arg {
                    self.emit(Inst::Shuffle { dst: i2, src: p.1, lane_xor: xor });
                }
                // `combine` is symmetric (ties go to the lower index), so every lane agrees.
                *p = self.combine(rop, *p, (v2, i2));
                bit *= 2;
            }
        }
        // 3. Across warps, through shared memory, into the result's layout.
        let warps = l.warps_per_program[axis].min((shape[axis] / (spt * l.threads_per_warp[axis])).max(1));
        let n_res: u32 = rshape.iter().product();
        let wstride = l.warp_stride(axis);
        if warps == 1 && rshape.is_empty() {
            let (v, i) = parts[0].0;
            return vec![if arg { self.cast(i, rt) } else { self.narrow_int(v, rt) }];
        }
        let vsize = shared_size(acc_t).max(4);
        let ibase = (l.warps_per_program[axis] * n_res * vsize).next_multiple_of(16);
        let total = ibase + if arg { l.warps_per_program[axis] * n_res * 4 } else { 0 };
        let o = self.shared_alloc("reduce.partials", total, 16);
        let ibase = o + ibase;
        // This thread's warp index along the axis.
        let w = self.bin_c(BinaryOp::Shr, self.warp, log2(wstride));
        let w = self.bin_c(BinaryOp::And, w, l.warps_per_program[axis] as i64 - 1);
        let wrow = self.bin_c(BinaryOp::Mul, w, n_res as i64);
        self.shared_reuse(o);
        for ((v, i), s) in &parts {
            let mut c = self.slot_coords(&shape, *s);
            c.remove(axis);
            let f = self.flatten(&c, rshape);
            let f = self.bin(BinaryOp::Add, f, wrow);
            let off = self.shared_offset(f, vsize, o);
            self.emit(Inst::SharedStore { offset: off, value: *v, pred: None });
            if arg {
                let off = self.shared_offset(f, 4, ibase);
                self.emit(Inst::SharedStore { offset: off, value: *i, pred: None });
            }
        }
        self.emit(Inst::Barrier);
        let slots = if rshape.is_empty() { 1 } else { self.layout(rshape).slots() };
        let mut out = Vec::with_capacity(slots as usize);
        for s in 0..slots {
            let f = if rshape.is_empty() {
                self.iconst(0)
            } else {
                let c = self.slot_coords(rshape, s);
                self.flatten(&c, rshape)
            };
            let mut acc: Option<(Reg, Reg)> = None;
            for wi in 0..warps {
                let e = self.bin_c(BinaryOp::Add, f, (wi * n_res) as i64);
                let v = self.shared_load(acc_t, e, o);
                let i = if arg { self.shared_load(I32, e, ibase) } else { v };
                acc = Some(match acc {
                    Some(a) => self.combine(rop, a, (v, i)),
                    None => (v, i),
                });
            }
            let (v, i) = acc.expect("at least one warp");
            out.push(if arg { self.cast(i, rt) } else { self.narrow_int(v, rt) });
        }
        self.shared_free(o);
        out
    }
}
