//! `dot`: on the target's matrix atom where it has one (the accumulator then lives in the
//! atom's layout, `AccLayout`, and elementwise epilogues compute in it), else an FMA loop over
//! shared-memory operands.

use super::*;

impl Lowering<'_> {
    /// `acc + a @ b` through shared memory: every thread runs an FMA loop over K for the output
    /// elements it owns, loading each distinct row of A and column of B once per step.
    pub(super) fn dot(&mut self, a: Value, b: Value, acc: Value, rt: SType) -> Vec<Reg> {
        let (at, bt) = (self.func.ty(a).clone(), self.func.ty(b).clone());
        let (m, kk, n) = (at.shape[0], at.shape[1], bt.shape[1]);
        let (ea, eb) = (stype(&at), stype(&bt));
        // FP8 operands (on a target without a matrix atom for this tile) are staged as their
        // bits and decoded to f32 where they are read.
        let fp8 = at.elem.dtype().and_then(|d| d.fp8());
        let (ar, br, cr) = (self.held(a), self.held(b), self.held(acc));
        let a_bytes = (m * kk * shared_size(ea)).next_multiple_of(16);
        let o = self.shared_alloc("dot.operands", a_bytes + kk * n * shared_size(eb), 16);
        let a_bytes = o + a_bytes;
        self.shared_reuse(o);
        self.stage_in_shared(&ar, &at.shape, o);
        self.stage_in_shared(&br, &bt.shape, a_bytes);
        self.emit(Inst::Barrier);
        let ft = match rt {
            SType::F64 => SType::F64,
            SType::Int { .. } => I32,
            _ => SType::F32,
        };
        let out_shape = [m, n];
        let slots = self.layout(&out_shape).slots();
        let rows_cols: Vec<(Reg, Reg)> = (0..slots)
            .map(|s| {
                let c = self.slot_coords(&out_shape, s);
                (c[0], c[1])
            })
            .collect();
        let row_base: HashMap<Reg, Reg> = rows_cols
            .iter()
            .map(|(r, _)| *r)
            .collect::<std::collections::BTreeSet<Reg>>()
            .into_iter()
            .map(|r| (r, self.bin_c(BinaryOp::Shl, r, log2(kk))))
            .collect();
        let inits: Vec<Reg> = cr.iter().map(|r| self.cast(*r, ft)).collect();
        let phis: Vec<Reg> = (0..slots).map(|_| self.reg(ft)).collect();
        let iv = self.reg(I32);
        let saved = std::mem::take(&mut self.cur);
        let kb = self.bin_c(BinaryOp::Shl, iv, log2(n));
        let mut a_vals: HashMap<Reg, Reg> = HashMap::default();
        let mut b_vals: HashMap<Reg, Reg> = HashMap::default();
        let mut nexts = Vec::new();
        for (j, (row, col)) in rows_cols.iter().enumerate() {
            let xa = match a_vals.get(row) {
                Some(v) => *v,
                None => {
                    let fa = self.bin(BinaryOp::Add, row_base[row], iv);
                    let va = self.shared_load(ea, fa, o);
                    let v = match fp8 {
                        Some(f) => self.fp8_decode(va, f),
                        None => self.cast(va, ft),
                    };
                    a_vals.insert(*row, v);
                    v
                }
            };
            let xb = match b_vals.get(col) {
                Some(v) => *v,
                None => {
                    let fb = self.bin(BinaryOp::Add, kb, *col);
                    let vb = self.shared_load(eb, fb, a_bytes);
                    let v = match fp8 {
                        Some(f) => self.fp8_decode(vb, f),
                        None => self.cast(vb, ft),
                    };
                    b_vals.insert(*col, v);
                    v
                }
            };
            let d = self.reg(ft);
            if ft == I32 {
                let p = self.bin(BinaryOp::Mul, xa, xb);
                self.emit(Inst::Binary { dst: d, op: BinaryOp::Add, a: p, b: phis[j] });
            } else {
                self.emit(Inst::Fma { dst: d, a: xa, b: xb, c: phis[j] });
            }
            nexts.push(d);
        }
        let body = std::mem::replace(&mut self.cur, saved);
        let (lo, hi, one) = (self.iconst(0), self.iconst(kk as i64), self.iconst(1));
        let results: Vec<Reg> = (0..slots).map(|_| self.reg(ft)).collect();
        self.emit(Inst::Loop { iv, lo, hi, step: one, phis, inits, body, nexts, results: results.clone() });
        self.shared_free(o);
        results.into_iter().map(|r| self.cast(r, rt)).collect()
    }

    /// The accumulator layout an elementwise op can be computed in without moving data: some
    /// tile operand is held in it and every other one is a scalar, held in it too,
    /// rematerializable at its coordinates, or read again there ([`Lowering::reloadable`]:
    /// an epilogue's row and column scales, read per accumulator element rather than the
    /// accumulator converted through shared memory to their layout).
    pub(super) fn mma_elementwise(&mut self, op: Op) -> Option<AccLayout> {
        let data = &self.func.ops[op];
        if !matches!(
            data.kind,
            OpKind::Unary { .. } | OpKind::Binary { .. } | OpKind::Cmp { .. } | OpKind::Select { .. } | OpKind::Cast(_)
        ) {
            return None;
        }
        let operands: Vec<Value> = data.kind.operands().into_iter().map(|(_, v)| v).collect();
        let l = operands.iter().find_map(|v| self.mma_held.get(v).map(|(l, _)| *l))?;
        let fits = operands.iter().all(|v| {
            self.mma_held.get(v).is_some_and(|(hl, _)| *hl == l)
                || self.reloadable(*v, op)
                || self.row_broadcast(*v, l).is_some()
        });
        fits.then_some(l)
    }

    /// `y` where `v` is an accumulator-shaped tile broadcast along its rows from `y` (`[M, 1]`,
    /// a value per row: online softmax's running maximum, its rescaling factor). Such an
    /// operand of an elementwise op in the accumulator layout is read per row from shared
    /// memory (`M` values) instead of converting the accumulator (`M N`).
    pub(super) fn row_broadcast(&self, v: Value, l: AccLayout) -> Option<Value> {
        let ValueDef::Result { op, .. } = self.func.values[v].def else { return None };
        let OpKind::Broadcast(y) = &self.func.ops[op].kind else { return None };
        let fits = self.func.ty(v).shape.as_slice() == [l.m, l.n] && self.func.ty(*y).shape.as_slice() == [l.m, 1];
        fits.then_some(*y)
    }

    /// `v` is rematerializable, or can be read again from memory at op `at`'s coordinates:
    /// index math over loads with rematerializable pointers and masks (moved by broadcasts and
    /// reshapes), each load in `at`'s block with nothing between it and `at` that writes
    /// memory or synchronizes, so the second read sees what the first did.
    pub(super) fn reloadable(&mut self, v: Value, at: Op) -> bool {
        if self.rematerializable(v) {
            return true;
        }
        let ValueDef::Result { op, .. } = self.func.values[v].def else { return false };
        match self.func.ops[op].kind.clone() {
            OpKind::Load { ptr, mask, other } => {
                let parts_ok = self.rematerializable(ptr)
                    && mask.is_none_or(|m| self.rematerializable(m))
                    && other.is_none_or(|o| self.rematerializable(o));
                parts_ok && self.nothing_writes_between(op, at)
            }
            OpKind::Broadcast(x) | OpKind::Reshape(x) | OpKind::Transpose { x, .. } => self.reloadable(x, at),
            k if is_index_math(&k) => k.operands().into_iter().all(|(_, x)| self.reloadable(x, at)),
            _ => false,
        }
    }

    /// `from` and `to` are in one block, `from` first, and no op between them writes memory,
    /// synchronizes or holds a region (which might).
    fn nothing_writes_between(&self, from: Op, to: Op) -> bool {
        let Some(ops) = self.func.blocks.iter().map(|(_, b)| &b.ops).find(|ops| ops.contains(&to)) else {
            return false;
        };
        let (Some(i), Some(j)) = (ops.iter().position(|&o| o == from), ops.iter().position(|&o| o == to)) else {
            return false;
        };
        i < j
            && ops[i + 1..j].iter().all(|&o| {
                let k = &self.func.ops[o].kind;
                // Pure ops (the elementary functions and `pow` among them, a peer's address),
                // and reads.
                effect_free(k)
                    || matches!(
                        k,
                        OpKind::Unary { .. }
                            | OpKind::Binary { .. }
                            | OpKind::SymmAt { .. }
                            | OpKind::Load { .. }
                            | OpKind::DescLoad { .. }
                            | OpKind::Dot { .. }
                            | OpKind::Reduce { .. }
                    )
            })
    }

    /// Computes an elementwise op slot by slot in the accumulator layout `l`.
    pub(super) fn elementwise_in_mma(&mut self, op: Op, l: AccLayout) {
        let data = &self.func.ops[op];
        let kind = data.kind.clone();
        let result = data.results[0];
        let operands: Vec<Value> = kind.operands().into_iter().map(|(_, v)| v).collect();
        // Row broadcasts (not held in the layout, not reloadable): their `[M, 1]` sources
        // staged in shared memory once, read at each slot's row.
        let mut rows: HashMap<Value, u32> = HashMap::default();
        for &v in &operands {
            if self.mma_held.contains_key(&v) || rows.contains_key(&v) || self.reloadable(v, op) {
                continue;
            }
            let Some(y) = self.row_broadcast(v, l) else { continue };
            let src = self.held(y);
            let size = shared_size(self.k.ty(src[0]));
            let o = self.shared_alloc("acc.rows", l.m * size, 16);
            self.shared_reuse(o);
            self.stage_in_shared(&src, &[l.m, 1], o);
            self.emit(Inst::Barrier);
            rows.insert(v, o);
        }
        let mut at_row: HashMap<(Value, Reg), Reg> = HashMap::default();
        let mut out = Vec::with_capacity(l.slots() as usize);
        for slot in 0..l.slots() {
            let c = self.mma_coords(l, slot);
            let srcs: Vec<Reg> = operands
                .iter()
                .map(|v| match (self.mma_held.get(v), rows.get(v)) {
                    (Some((_, regs)), _) => regs[slot as usize],
                    (None, Some(&o)) => *at_row.entry((*v, c[0])).or_insert_with(|| {
                        let t = stype(self.func.ty(*v));
                        self.shared_load(t, c[0], o)
                    }),
                    (None, None) => self.eval_loaded(*v, &c),
                })
                .collect();
            let dst = self.elementwise(&kind, result, &srcs);
            out.push(dst);
        }
        for o in rows.into_values() {
            self.shared_free(o);
        }
        self.mma_held.insert(result, (l, out));
    }

    /// Stores a tile held in the accumulator layout where it is, with the (rematerialized)
    /// pointers and mask at its coordinates: column pairs as 2-wide vector stores when aligned
    /// and both unmasked, scalar stores otherwise. No conversion through shared memory.
    pub(super) fn store_from_mma(&mut self, ptr: Value, mask: Option<Value>, l: AccLayout, regs: &[Reg]) {
        let t = self.k.ty(regs[0]);
        let size = shared_size(t);
        let pair = l.column_pairs() && self.contiguity.get(ptr).contiguity >= 2 && (2..=8).contains(&size);
        for g in (0..l.slots()).step_by(2) {
            let (c0, c1) = (self.mma_coords(l, g), self.mma_coords(l, g + 1));
            let (p0, p1) = (self.eval(ptr, &c0), self.eval(ptr, &c1));
            let masks = mask.map(|m| [self.eval(m, &c0), self.eval(m, &c1)]);
            let (v0, v1) = (regs[g as usize], regs[g as usize + 1]);
            if !pair {
                self.emit(Inst::Store { addr: p0, value: v0, pred: masks.map(|m| m[0]) });
                self.emit(Inst::Store { addr: p1, value: v1, pred: masks.map(|m| m[1]) });
                continue;
            }
            let (ps, vs) = ([p0, p1], [v0, v1]);
            self.vector_group(
                (ptr, p0, 2 * size, 2),
                masks.as_ref().map(|m| &m[..]),
                &|_, pred| Inst::VStore { addr: p0, values: vs.to_vec(), pred },
                &|_, i, pred| Inst::Store { addr: ps[i], value: vs[i], pred: Some(pred) },
            );
        }
    }

    /// An atomic `op` of accumulator `regs` (layout `l`) into memory at `ptr` (masked), each
    /// element by the thread that holds it (an accumulator layout holds each element once);
    /// the old values in the same layout, masked-off ones 0 when the result is used.
    pub(super) fn atomic_from_mma(
        &mut self,
        result: Value,
        (op, sem, scope): (AtomicOp, MemSemantic, Scope),
        ptr: Value,
        mask: Option<Value>,
        l: AccLayout,
        regs: &[Reg],
    ) -> Vec<Reg> {
        let used = self.used.contains(&result);
        let t = self.k.ty(regs[0]);
        let pairs =
            l.column_pairs() && self.vector_atomic_ok(result, (op, sem), t) && self.contiguity.get(ptr).contiguity >= 2;
        if pairs {
            self.atomic_pairs_from_mma((op, sem, scope), ptr, mask, l, regs);
            return Vec::new();
        }
        let mut olds = Vec::with_capacity(regs.len());
        for (s, &value) in regs.iter().enumerate() {
            let c = self.mma_coords(l, s as u32);
            let addr = self.eval_loaded(ptr, &c);
            let pred = mask.map(|m| self.eval_loaded(m, &c));
            let t = self.k.ty(value);
            let dst = self.reg(t);
            self.emit(Inst::Atomic { dst, op, addr, value, pred, sem, scope });
            olds.push(match (pred, used) {
                (Some(m), true) => {
                    let zero = self.konst(t, Literal::Int(0));
                    self.select_raw(m, dst, zero)
                }
                _ => dst,
            });
        }
        olds
    }

    /// [`Lowering::atomic_from_mma`] of f32 adds whose old values are unused, each column pair
    /// of the accumulator layout as one 2-wide [`Inst::VAtomic`] where aligned and unmasked,
    /// element atomics otherwise (as [`Lowering::store_from_mma`] stores pairs).
    fn atomic_pairs_from_mma(
        &mut self,
        (op, sem, scope): (AtomicOp, MemSemantic, Scope),
        ptr: Value,
        mask: Option<Value>,
        l: AccLayout,
        regs: &[Reg],
    ) {
        for g in (0..l.slots()).step_by(2) {
            let (c0, c1) = (self.mma_coords(l, g), self.mma_coords(l, g + 1));
            let (p0, p1) = (self.eval_loaded(ptr, &c0), self.eval_loaded(ptr, &c1));
            let masks = mask.map(|m| [self.eval_loaded(m, &c0), self.eval_loaded(m, &c1)]);
            let (ps, vs) = ([p0, p1], [regs[g as usize], regs[g as usize + 1]]);
            self.vector_group(
                (ptr, p0, 8, 2),
                masks.as_ref().map(|m| &m[..]),
                &|_, pred| Inst::VAtomic { op, addr: p0, values: vs.to_vec(), pred, sem, scope },
                &|l, i, pred| Inst::Atomic {
                    dst: l.reg(SType::F32),
                    op,
                    addr: ps[i],
                    value: vs[i],
                    pred: Some(pred),
                    sem,
                    scope,
                },
            );
        }
    }

    /// True when `v` is the constant 0 (a scalar or a splat of one).
    pub(super) fn is_zero(&self, v: Value) -> bool {
        self.func.constant(v).is_some_and(|l| l.as_f64() == 0.0)
    }

    /// The matrix atom over one K tile staged at byte `base` (a register) with row strides
    /// `strides` (elements) and B at `b_off`; returns the new accumulator registers. Fragments
    /// come from `ldmatrix` where the target has it and the atom is `mma.sync.m16n8k16`, else
    /// from shared loads at the atom's lane maps (pairs packed into 32-bit registers).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mma_steps(
        &mut self,
        l: AccLayout,
        ab: SType,
        kk: u32,
        strides: [u32; 2],
        b_off: u32,
        (base, b_base): (Reg, Option<Reg>),
        mut acc: Vec<Reg>,
        b_kmajor: bool,
    ) -> Vec<Reg> {
        // B at `b_base` (its stage elsewhere, `b_off` then 0) or at `base + b_off`.
        let (b_off, b_base) = match b_base {
            Some(r) => (0, r),
            None => (b_off, base),
        };
        let atom = l.atom;
        let (ti, tj) = l.tiles();
        let ce = atom.c_elems as usize;
        let ldmatrix = self.ldmatrix(l);
        debug_assert!(ldmatrix || !b_kmajor, "B stored K-major is read by `ldmatrix` only");
        let (a_lane, b_lane) =
            if ldmatrix { self.ldmatrix_lanes(l, strides, b_kmajor) } else { (self.iconst(0), self.iconst(0)) };
        for k0 in (0..kk).step_by(atom.k as usize) {
            let (a_frags, b_frags) = if ldmatrix {
                self.ldmatrix_fragments(l, strides, b_off, (base, b_base), k0, (a_lane, b_lane), b_kmajor)
            } else {
                let w = self.warp_origin(l);
                let k = self.iconst(k0 as i64);
                let a: Vec<Vec<Reg>> = (0..ti)
                    .map(|i| {
                        let row = self.bin_c(BinaryOp::Add, w[0], l.tile_row(i) as i64);
                        self.fragment(atom.a, atom.a_elems, ab, [row, k], strides[0], 0, base)
                    })
                    .collect();
                let b: Vec<Vec<Reg>> = (0..tj)
                    .map(|j| {
                        let col = self.bin_c(BinaryOp::Add, w[1], (j * atom.n) as i64);
                        self.fragment(atom.b, atom.b_elems, ab, [k, col], strides[1], b_off, b_base)
                    })
                    .collect();
                (a, b)
            };
            for i in 0..ti {
                for jt in 0..tj {
                    let at = ((i * tj + jt) as usize) * ce;
                    let d: Vec<Reg> = (0..ce).map(|_| self.reg(SType::F32)).collect();
                    self.emit(Inst::Matmul {
                        atom,
                        d: d.clone(),
                        a: a_frags[i as usize].clone(),
                        b: b_frags[jt as usize].clone(),
                        c: acc[at..at + ce].to_vec(),
                        ab,
                    });
                    acc.splice(at..at + ce, d);
                }
            }
        }
        acc
    }

    /// The warp's block origin in the output: `(row, column)` registers (prologue, once).
    fn warp_origin(&mut self, l: AccLayout) -> [Reg; 2] {
        if let Some(w) = self.warp_origins.get(&l) {
            return *w;
        }
        let saved = std::mem::take(&mut self.cur);
        let wm = self.bin_c(BinaryOp::And, self.warp, l.warps_m as i64 - 1);
        let wn = self.bin_c(BinaryOp::Shr, self.warp, log2(l.warps_m));
        let row0 = self.bin_c(BinaryOp::Mul, wm, l.warp_row(1) as i64);
        let col0 = self.bin_c(BinaryOp::Mul, wn, (l.n / l.warps_n) as i64);
        let defs = std::mem::replace(&mut self.cur, saved);
        self.prologue.extend(defs);
        self.warp_origins.insert(l, [row0, col0]);
        [row0, col0]
    }

    /// The lane's part of a lane map: `(row, column)` registers (prologue, once per map).
    fn lane_part(&mut self, map: crate::target::LaneMap) -> [Reg; 2] {
        let key = (map.row.as_ptr() as usize, map.row.len(), map.col.as_ptr() as usize, map.col.len());
        if let Some(p) = self.lane_parts.get(&key) {
            return *p;
        }
        let saved = std::mem::take(&mut self.cur);
        let mut out = [self.iconst(0), self.iconst(0)];
        for (d, fields) in [map.row, map.col].into_iter().enumerate() {
            for f in fields {
                let x = self.field(self.lane, 1 << f.shift, 1 << f.bits).unwrap_or(self.lane);
                let x = if f.scale > 1 { self.bin_c(BinaryOp::Mul, x, f.scale as i64) } else { x };
                out[d] = self.bin(BinaryOp::Add, out[d], x);
            }
        }
        let defs = std::mem::replace(&mut self.cur, saved);
        self.prologue.extend(defs);
        self.lane_parts.insert(key, out);
        out
    }

    /// One operand fragment of a lane: `elems` 16-bit elements at `map` from a row-major tile of
    /// `stride` elements per row at byte `off` + `base`, the instruction tile's origin being
    /// `origin` (row, column registers). Pairs of elements adjacent in memory load as one 32-bit
    /// word (aligned: the maps pair even columns and strides are even); others are loaded and
    /// packed.
    #[allow(clippy::too_many_arguments)]
    fn fragment(
        &mut self,
        map: crate::target::LaneMap,
        elems: u32,
        ab: SType,
        origin: [Reg; 2],
        stride: u32,
        off: u32,
        base: Reg,
    ) -> Vec<Reg> {
        let lp = self.lane_part(map);
        let row = self.bin(BinaryOp::Add, origin[0], lp[0]);
        let col = self.bin(BinaryOp::Add, origin[1], lp[1]);
        let rs = self.bin_c(BinaryOp::Mul, row, stride as i64);
        let e0 = self.bin(BinaryOp::Add, rs, col);
        let elem_off = |me: &mut Self, i: u32| {
            let (r, c) = (map.elem)(i);
            let e = me.bin_c(BinaryOp::Add, e0, (r * stride + c) as i64);
            let o = me.shared_offset(e, 2, off);
            me.bin(BinaryOp::Add, o, base)
        };
        (0..elems / 2)
            .map(|p| {
                let (a, b) = ((map.elem)(2 * p), (map.elem)(2 * p + 1));
                let o = elem_off(self, 2 * p);
                let d = self.reg(I32);
                if a.0 == b.0 && b.1 == a.1 + 1 {
                    self.emit(Inst::SharedLoad { dst: d, offset: o });
                } else {
                    let (lo, hi) = (self.reg(ab), self.reg(ab));
                    self.emit(Inst::SharedLoad { dst: lo, offset: o });
                    let o1 = elem_off(self, 2 * p + 1);
                    self.emit(Inst::SharedLoad { dst: hi, offset: o1 });
                    self.emit(Inst::Pack { dst: d, lo, hi });
                }
                d
            })
            .collect()
    }

    /// Whether the fragments of `l`'s atom come from `ldmatrix` on this target.
    pub(super) fn ldmatrix(&self, l: AccLayout) -> bool {
        self.target.matrix_load && l.atom.name == crate::target::MMA_SYNC_M16N8K16.name
    }

    /// Per-lane row offsets of `ldmatrix` for A (`x4`) and B (`x4.trans`; `x4` where B is
    /// stored K-major, `[N, K]`) (elements).
    fn ldmatrix_lanes(&mut self, l: AccLayout, strides: [u32; 2], b_kmajor: bool) -> (Reg, Reg) {
        let (a_stride, b_stride) = (strides[0], strides[1]);
        let p = self.mma_position(l);
        let lo = self.bin_c(BinaryOp::And, self.lane, 7);
        let mid = self.bin_c(BinaryOp::Shr, self.lane, 3);
        let mid = self.bin_c(BinaryOp::And, mid, 1);
        let mid = self.bin_c(BinaryOp::Shl, mid, 3);
        let r16 = self.bin(BinaryOp::Add, lo, mid);
        let hi = self.bin_c(BinaryOp::Shr, self.lane, 4);
        let c16 = self.bin_c(BinaryOp::Shl, hi, 3);
        let lp = self.lane_part(l.atom.c);
        let row0 = self.bin(BinaryOp::Sub, p[0], lp[0]);
        let col0 = self.bin(BinaryOp::Sub, p[1], lp[1]);
        let a_row = self.bin(BinaryOp::Add, row0, r16);
        let a_lane = self.bin_c(BinaryOp::Mul, a_row, a_stride as i64);
        let a_lane = self.bin(BinaryOp::Add, a_lane, c16);
        if b_kmajor {
            // Matrix `q = lane / 8` of an `x4`: columns `8 (q / 2) ..` of the pair of
            // instruction tiles, K `8 (q % 2) ..`; the lane gives its row (a column of B).
            let b_col = self.bin(BinaryOp::Add, col0, c16);
            let n = self.bin(BinaryOp::Add, b_col, lo);
            let b_lane = self.bin_c(BinaryOp::Mul, n, b_stride as i64);
            let b_lane = self.bin(BinaryOp::Add, b_lane, mid);
            return (a_lane, b_lane);
        }
        let b_lane = self.bin_c(BinaryOp::Mul, r16, b_stride as i64);
        let b_col = self.bin(BinaryOp::Add, col0, c16);
        let b_lane = self.bin(BinaryOp::Add, b_lane, b_col);
        (a_lane, b_lane)
    }

    /// The A and B fragments of one K step of `mma.sync.m16n8k16` through `ldmatrix`.
    #[allow(clippy::too_many_arguments)]
    fn ldmatrix_fragments(
        &mut self,
        l: AccLayout,
        strides: [u32; 2],
        b_off: u32,
        (base, b_base): (Reg, Reg),
        k0: u32,
        (a_lane, b_lane): (Reg, Reg),
        b_kmajor: bool,
    ) -> (Vec<Vec<Reg>>, Vec<Vec<Reg>>) {
        let (ti, tj) = l.tiles();
        let an = l.atom.n;
        let a_frags: Vec<Vec<Reg>> = (0..ti)
            .map(|i| {
                let e = self.bin_c(BinaryOp::Add, a_lane, (l.tile_row(i) * strides[0] + k0) as i64);
                let off = self.shared_offset(e, 2, 0);
                let off = self.bin(BinaryOp::Add, off, base);
                let dsts: Vec<Reg> = (0..4).map(|_| self.reg(I32)).collect();
                self.emit(Inst::MatrixLoad { dsts: dsts.clone(), offset: off, trans: false });
                dsts
            })
            .collect();
        let mut b_frags: Vec<Vec<Reg>> = Vec::new();
        for jj in (0..tj).step_by(2) {
            let two = jj + 1 < tj;
            let at = if b_kmajor { jj * an * strides[1] + k0 } else { k0 * strides[1] + jj * an };
            let e = self.bin_c(BinaryOp::Add, b_lane, at as i64);
            let off = self.shared_offset(e, 2, b_off);
            let off = self.bin(BinaryOp::Add, off, b_base);
            let dsts: Vec<Reg> = (0..if two { 4 } else { 2 }).map(|_| self.reg(I32)).collect();
            self.emit(Inst::MatrixLoad { dsts: dsts.clone(), offset: off, trans: !b_kmajor });
            b_frags.push(dsts[..2].to_vec());
            if two {
                b_frags.push(dsts[2..].to_vec());
            }
        }
        (a_frags, b_frags)
    }

    /// `x` where `v` is the transpose of a 2-D tile `x` of 16-bit floats read only as the B
    /// operand of `dot`s on `mma.sync` through `ldmatrix` (`dot(q, k.t())`): those stage `x`
    /// as it is held (`[N, K]` row-major) and read it K-major, and the transpose itself lowers
    /// to nothing. `None` for any other value.
    pub(super) fn kmajor_operand(&mut self, v: Value) -> Option<Value> {
        if let Some(r) = self.kmajor.get(&v) {
            return *r;
        }
        let r = self.find_kmajor_operand(v);
        self.kmajor.insert(v, r);
        r
    }

    fn find_kmajor_operand(&mut self, v: Value) -> Option<Value> {
        let ValueDef::Result { op, .. } = self.func.values[v].def else { return None };
        let OpKind::Transpose { x, perm } = &self.func.ops[op].kind else { return None };
        let (x, ty) = (*x, self.func.ty(*x));
        if perm.as_slice() != [1, 0] || !matches!(ty.elem.dtype(), Some(DType::F16 | DType::BF16)) {
            return None;
        }
        if self.rematerializable(v) || self.func.blocks.iter().any(|(_, b)| b.yields.contains(&v)) {
            return None;
        }
        let users = self.users.get(&v).cloned().unwrap_or_default();
        let all_b = !users.is_empty()
            && users.into_iter().all(|u| match &self.func.ops[u].kind {
                OpKind::Dot { a, b, acc, .. } if *b == v && *a != v && *acc != v => {
                    self.dot_mma_layout(u).is_some_and(|l| self.ldmatrix(l))
                }
                _ => false,
            });
        all_b.then_some(x)
    }

    /// The accumulator layout of a `dot` on the target's matrix atom, when there is one: f16/bf16
    /// operands of one type, an f32 accumulator, an atom of the target's warp with operands in
    /// registers, K a multiple of the atom's, and whole instruction tiles per warp.
    pub(super) fn dot_mma_layout(&self, op: Op) -> Option<AccLayout> {
        let OpKind::Dot { a, b, acc, .. } = &self.func.ops[op].kind else { return None };
        let (at, bt, ct) = (self.func.ty(*a), self.func.ty(*b), self.func.ty(*acc));
        let (ea, eb, ec) = (at.elem.dtype()?, bt.elem.dtype()?, ct.elem.dtype()?);
        let input = mma_input(ea, eb)?;
        if ec != DType::F32 {
            return None;
        }
        let atom = self.target.atoms.iter().find(|x| {
            x.lowered
                && x.takes(input)
                && x.acc == DType::F32
                && x.lanes == self.k.warp_size
                && x.operands == crate::target::OperandSource::Registers
                && at.shape[1].is_multiple_of(x.k)
                && AccLayout::new(x, ct.shape[0], ct.shape[1], self.k.warps).is_some()
        })?;
        AccLayout::new(atom, ct.shape[0], ct.shape[1], self.k.warps)
    }

    /// The accumulator layout of carried value `i` of a `for` body: its next value is a
    /// tensor-core `dot` accumulating into the carried value itself.
    pub(super) fn carried_mma(&self, body: Block, i: usize) -> Option<AccLayout> {
        let arg = self.func.blocks[body].args[i + 1];
        let next = *self.func.blocks[body].yields.get(i)?;
        let ValueDef::Result { op, .. } = self.func.values[next].def else { return None };
        match &self.func.ops[op].kind {
            OpKind::Dot { acc, .. } if *acc == arg => self.dot_mma_layout(op),
            // The accumulator rescaled per row before the product (online softmax's
            // `acc * alpha[:, None]`): computed in the layout too (`row_broadcast`).
            OpKind::Dot { acc, .. } => {
                let l = self.dot_mma_layout(op)?;
                let ValueDef::Result { op: e, .. } = self.func.values[*acc].def else { return None };
                let kind = &self.func.ops[e].kind;
                let operands: Vec<Value> = kind.operands().into_iter().map(|(_, v)| v).collect();
                let rescaled = matches!(kind, OpKind::Binary { .. })
                    && operands.contains(&arg)
                    && operands.iter().all(|&v| v == arg || self.row_broadcast(v, l).is_some());
                rescaled.then_some(l)
            }
            _ => None,
        }
    }

    /// Per-thread (row, column) position of an accumulator layout (prologue): the warp's block
    /// origin plus the lane's part of the atom's accumulator map.
    pub(super) fn mma_position(&mut self, l: AccLayout) -> [Reg; 2] {
        if let Some(p) = self.mma_positions.get(&l) {
            return *p;
        }
        let w = self.warp_origin(l);
        let saved = std::mem::take(&mut self.cur);
        let lp = self.lane_part(l.atom.c);
        let p = [self.bin(BinaryOp::Add, w[0], lp[0]), self.bin(BinaryOp::Add, w[1], lp[1])];
        let defs = std::mem::replace(&mut self.cur, saved);
        self.prologue.extend(defs);
        self.mma_positions.insert(l, p);
        p
    }

    pub(super) fn mma_coords(&mut self, l: AccLayout, s: u32) -> [Reg; 2] {
        let p = self.mma_position(l);
        let o = l.offset(s);
        let mut c = [p[0], p[1]];
        for d in 0..2 {
            if o[d] > 0 {
                c[d] = self.bin_c(BinaryOp::Add, p[d], o[d] as i64);
            }
        }
        c
    }

    /// An accumulator-layout tile in the blocked layout of its shape, through shared memory.
    pub(super) fn mma_to_blocked(&mut self, l: AccLayout, regs: &[Reg]) -> Vec<Reg> {
        let shape = [l.m, l.n];
        // The accumulator's f32, or what an elementwise op computed from it in the layout (a
        // cast to the operand type of the next product).
        let t = self.k.ty(regs[0]);
        let size = shared_size(t);
        let o = self.shared_alloc("acc.relayout", l.m * l.n * size, 16);
        self.shared_reuse(o);
        for (s, &r) in regs.iter().enumerate() {
            let c = self.mma_coords(l, s as u32);
            let f = self.flatten(&c, &shape);
            let off = self.shared_offset(f, size, o);
            self.emit(Inst::SharedStore { offset: off, value: r, pred: None });
        }
        self.emit(Inst::Barrier);
        let slots = self.layout(&shape).slots();
        let out = (0..slots)
            .map(|s| {
                let c = self.slot_coords(&shape, s);
                let f = self.flatten(&c, &shape);
                self.shared_load(t, f, o)
            })
            .collect();
        self.shared_free(o);
        out
    }

    /// `v` in the accumulator layout `l` (f32): as held, a splat copied into every register, or
    /// converted from its blocked layout through shared memory.
    pub(super) fn held_mma(&mut self, v: Value, l: AccLayout) -> Vec<Reg> {
        if let Some((hl, regs)) = self.mma_held.get(&v) {
            if *hl == l {
                return regs.clone();
            }
        }
        if let ValueDef::Result { op, .. } = self.func.values[v].def {
            if let OpKind::Splat(x) = self.func.ops[op].kind {
                let r = self.held(x)[0];
                let r = self.cast(r, SType::F32);
                return vec![r; l.slots() as usize];
            }
        }
        let shape = [l.m, l.n];
        let src = self.held(v);
        let src: Vec<Reg> = src.into_iter().map(|r| self.cast(r, SType::F32)).collect();
        let o = self.shared_alloc("acc.from_blocked", l.m * l.n * 4, 16);
        self.shared_reuse(o);
        self.stage_in_shared(&src, &shape, o);
        self.emit(Inst::Barrier);
        let out = (0..l.slots())
            .map(|s| {
                let c = self.mma_coords(l, s);
                let f = self.flatten(&c, &shape);
                self.shared_load(SType::F32, f, o)
            })
            .collect();
        self.shared_free(o);
        out
    }

    /// Stages a tile row-major in shared memory at `base` with rows padded by 16 bytes (so the
    /// 8 rows an `ldmatrix` reads fall in distinct banks); returns the row stride in elements.
    pub(super) fn stage_padded(&mut self, regs: &[Reg], shape: &[u32], base: u32) -> u32 {
        let size = shared_size(self.k.ty(regs[0]));
        let stride = shape[1] + 16 / size;
        // A thread's contiguous elements go as one vector store (rows start 16-byte aligned).
        let vec = self.layout(shape).vector().min(16 / size).max(1) as usize;
        for g in (0..regs.len()).step_by(vec) {
            let c = self.slot_coords(shape, g as u32);
            let row = self.bin_c(BinaryOp::Mul, c[0], stride as i64);
            let e = self.bin(BinaryOp::Add, row, c[1]);
            let off = self.shared_offset(e, size, base);
            let values = regs[g..(g + vec).min(regs.len())].to_vec();
            if values.len() > 1 {
                self.emit(Inst::SharedVStore { offset: off, values });
            } else {
                self.emit(Inst::SharedStore { offset: off, value: values[0], pred: None });
            }
        }
        stride
    }

    /// Stages a tile held in the accumulator layout `l` row-major at `base` with rows of
    /// `stride` elements (as [`Lowering::stage_padded`] does from the blocked layout): each
    /// thread stores its slots where they are, adjacent column pairs as one vector store.
    fn stage_padded_from_mma(&mut self, l: AccLayout, regs: &[Reg], base: u32, stride: u32) -> u32 {
        let size = shared_size(self.k.ty(regs[0]));
        let pairs = l.column_pairs();
        let step = if pairs { 2 } else { 1 };
        for g in (0..l.slots()).step_by(step) {
            let c = self.mma_coords(l, g);
            let row = self.bin_c(BinaryOp::Mul, c[0], stride as i64);
            let e = self.bin(BinaryOp::Add, row, c[1]);
            let off = self.shared_offset(e, size, base);
            if pairs {
                let values = vec![regs[g as usize], regs[g as usize + 1]];
                self.emit(Inst::SharedVStore { offset: off, values });
            } else {
                self.emit(Inst::SharedStore { offset: off, value: regs[g as usize], pred: None });
            }
        }
        stride
    }

    /// `acc + a @ b` on tensor cores: A (`[M, K]`) and B (`[K, N]`) are staged row-major in
    /// shared memory (rows padded), then `mma_steps` runs the K tile.
    pub(super) fn dot_mma(&mut self, a: Value, b: Value, acc: Value, l: AccLayout) -> Vec<Reg> {
        let (at, bt) = (self.func.ty(a).clone(), self.func.ty(b).clone());
        let (ea, eb) = (at.elem.dtype().expect("a scalar tile"), bt.elem.dtype().expect("a scalar tile"));
        let input = mma_input(ea, eb).expect("checked by `dot_mma_layout`");
        let ab = SType::of(input);
        let kk = at.shape[1];
        // B the transpose of a tile held row-major (`[N, K]`, as attention's keys are): staged
        // as it is held and read by `ldmatrix` without `.trans`, never transposed in registers.
        let kmajor = self.kmajor_operand(b);
        let (b_src, b_shape) = match kmajor {
            Some(x) => (x, self.func.ty(x).shape.clone()),
            None => (b, bt.shape.clone()),
        };
        // An A computed in an accumulator layout (attention's probabilities, cast to the
        // operand type) is staged from there: no conversion to the blocked layout first.
        let a_mma = match (self.vals.contains_key(&a), self.mma_held.get(&a)) {
            (false, Some((la, regs))) if ea.fp8().is_none() && [la.m, la.n] == [at.shape[0], at.shape[1]] => {
                Some((*la, regs.clone()))
            }
            _ => None,
        };
        // Operands a staged loop copied into its step's stage (`staged.rs`) are read there.
        let (a_staged, b_staged) = (self.staged_at(a), self.staged_at(b_src));
        let mut ar = match (&a_mma, a_staged) {
            (None, None) => self.held(a),
            _ => Vec::new(),
        };
        let mut br = match b_staged {
            Some(_) => Vec::new(),
            None => self.held(b_src),
        };
        // FP8 operands go to the atom as f16: every FP8 value is exact in f16, and so is the
        // product of two in the atom's f32 accumulator.
        for (regs, e) in [(&mut ar, ea), (&mut br, eb)] {
            if let Some(f) = e.fp8() {
                for r in regs.iter_mut() {
                    *r = self.fp8_to_half(*r, f);
                }
            }
        }
        let c = self.held_mma(acc, l);
        // Rows padded by 16 bytes (see `stage_padded`).
        let (a_stride, b_stride) = (kk + 8, b_shape[1] + 8);
        let a_bytes = if a_staged.is_some() { 0 } else { (l.m * a_stride * 2).next_multiple_of(16) };
        let b_bytes = if b_staged.is_some() { 0 } else { super::staged::padded_bytes(&b_shape) };
        if let (Some(sa), Some(_)) = (a_staged, b_staged) {
            return self.mma_steps(l, ab, kk, [a_stride, b_stride], 0, (sa, b_staged), c, kmajor.is_some());
        }
        let o = self.shared_alloc("dot.operands", a_bytes + b_bytes, 128);
        self.shared_reuse(o);
        let sa = match (&a_mma, a_staged) {
            (_, Some(_)) => a_stride,
            (Some((la, regs)), None) => self.stage_padded_from_mma(*la, regs, o, a_stride),
            (None, None) => self.stage_padded(&ar, &at.shape, o),
        };
        let sb = match b_staged {
            Some(_) => b_stride,
            None => self.stage_padded(&br, &b_shape, o + a_bytes),
        };
        debug_assert_eq!((sa, sb), (a_stride, b_stride));
        self.emit(Inst::Barrier);
        let here = self.iconst(o as i64);
        let base = a_staged.unwrap_or(here);
        // B at `base + a_bytes` where both are staged here, else at its own base.
        let b_base = b_staged.or(a_staged.map(|_| here));
        let out = self.mma_steps(l, ab, kk, [a_stride, b_stride], a_bytes, (base, b_base), c, kmajor.is_some());
        self.shared_free(o);
        out
    }
}

/// The element type a matrix atom multiplies for `dot` operands of types `a` and `b`: f16 or
/// bf16 as they are, and 8-bit floats converted up to f16, which holds every FP8 value exactly
/// (`docs/DECISIONS.md`, "FP8 on the f16 atoms"). The verifier makes A and B of one type.
pub(super) fn mma_input(a: DType, b: DType) -> Option<DType> {
    match (a, b) {
        (DType::F16, DType::F16) | (DType::BF16, DType::BF16) => Some(a),
        _ if a == b && a.is_fp8() => Some(DType::F16),
        _ => None,
    }
}
