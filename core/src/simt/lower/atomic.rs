//! Atomics on tiles act once per tile element, whatever the layout: a layout that wraps a
//! small tile over more threads than it has elements gives several threads a replica of the
//! same element, and only the *owner* (the replica whose unwrapped position lies inside the
//! tile) performs the read-modify-write. The others receive its old value through shared
//! memory when the result is used. Masked-off elements of the result are 0.

use super::*;

impl Lowering<'_> {
    /// A predicate true in the threads that own their elements of a tile of `shape`, or `None`
    /// when the layout has no replicas.
    fn owner(&mut self, shape: &[u32]) -> Option<Reg> {
        let l = self.layout(shape);
        let mut own: Option<Reg> = None;
        for (d, &extent) in shape.iter().enumerate() {
            if l.program_tile(d) <= extent {
                continue;
            }
            // The thread's position along d before wrapping: (warp part | lane part) * spt.
            let lane = self.field(self.lane, l.lane_stride(d), l.threads_per_warp[d]);
            let warp = self.field(self.warp, l.warp_stride(d), l.warps_per_program[d]);
            let t = match (warp, lane) {
                (None, None) => continue,
                (Some(w), None) => self.bin_c(BinaryOp::Shl, w, log2(l.threads_per_warp[d])),
                (None, Some(ln)) => ln,
                (Some(w), Some(ln)) => {
                    let w = self.bin_c(BinaryOp::Shl, w, log2(l.threads_per_warp[d]));
                    self.bin(BinaryOp::Or, w, ln)
                }
            };
            let p = self.bin_c(BinaryOp::Shl, t, log2(l.size_per_thread[d]));
            let lim = self.iconst(extent as i64);
            let inside = self.cmp_raw(CmpOp::Lt, p, lim);
            own = Some(match own {
                Some(o) => self.bin(BinaryOp::And, o, inside),
                None => inside,
            });
        }
        own
    }

    /// The elements of one thread an atomic of `op` with `sem` on f32 at `ptr` adds as one
    /// instruction ([`Inst::VAtomic`]): 4 or 2 where the target has vector atomic adds, the old
    /// values are unused (`result`) and the thread's slots are consecutive in memory as a vector
    /// store's would be; else 1.
    pub(super) fn vector_atomic_width(
        &mut self,
        result: Value,
        ptr: Value,
        (op, sem): (AtomicOp, MemSemantic),
        t: SType,
    ) -> u32 {
        if !self.vector_atomic_ok(result, (op, sem), t) {
            return 1;
        }
        match self.vector_width(ptr, t) {
            w if w >= 4 => 4,
            w if w >= 2 => 2,
            _ => 1,
        }
    }

    /// An atomic of `op` with `sem` on `t` may go as [`Inst::VAtomic`]s: the target has vector
    /// atomic adds, `op` is an f32 add without acquire semantics, and its old values (`result`)
    /// are unused.
    pub(super) fn vector_atomic_ok(&self, result: Value, (op, sem): (AtomicOp, MemSemantic), t: SType) -> bool {
        let relaxed = matches!(sem, MemSemantic::Relaxed | MemSemantic::Release);
        self.target.vector_atomic_add
            && !self.used.contains(&result)
            && op == AtomicOp::Add
            && t == SType::F32
            && relaxed
    }

    /// A tile's f32 atomic add of `values` at pointers `p` (one per slot, `mask` per slot), old
    /// values unused, `w` consecutive slots at a time ([`Lowering::vector_atomic_width`]): one
    /// [`Inst::VAtomic`] per group where its first address is aligned to the group and every
    /// element of it is unmasked, element atomics for the rest; only the owners of replicated
    /// elements add.
    pub(super) fn tile_vector_atomic(
        &mut self,
        (shape, ptr): (&[u32], Value),
        (p, values): (&[Reg], &[Reg]),
        mask: Option<&[Reg]>,
        w: u32,
        (op, sem, scope): (AtomicOp, MemSemantic, Scope),
    ) {
        let owner = self.owner(shape);
        let owned = |l: &mut Self, pred: Option<Reg>| match (pred, owner) {
            (None, o) => o,
            (Some(x), None) => Some(x),
            (Some(x), Some(o)) => Some(l.bin(BinaryOp::And, x, o)),
        };
        let pick = |h: &[Reg], s: usize| h[s.min(h.len() - 1)];
        for g in (0..p.len()).step_by(w as usize) {
            let group: Vec<usize> = (g..(g + w as usize).min(p.len())).collect();
            let masks: Option<Vec<Reg>> = mask.map(|m| group.iter().map(|&s| pick(m, s)).collect());
            let vs: Vec<Reg> = group.iter().map(|&s| pick(values, s)).collect();
            self.vector_group(
                (ptr, p[g], w * shared_size(SType::F32), group.len()),
                masks.as_deref(),
                &|l, ok| Inst::VAtomic { op, addr: p[g], values: vs.clone(), pred: owned(l, ok), sem, scope },
                &|l, i, fallback| {
                    let pred = owned(l, Some(fallback));
                    Inst::Atomic { dst: l.reg(SType::F32), op, addr: p[group[i]], value: vs[i], pred, sem, scope }
                },
            );
        }
    }

    /// A tile atomic of element type `t` at pointers `p` (one per slot): `make(dst, slot,
    /// pred)` is the instruction of one slot. Returns the old values, in the tile's layout.
    pub(super) fn tile_atomic(
        &mut self,
        result: Value,
        shape: &[u32],
        t: SType,
        p: &[Reg],
        mask: Option<&[Reg]>,
        make: &dyn Fn(Reg, usize, Option<Reg>) -> Inst,
    ) -> Vec<Reg> {
        let owner = self.owner(shape);
        let used = self.used.contains(&result);
        let mut olds = Vec::with_capacity(p.len());
        let mut preds = Vec::with_capacity(p.len());
        for s in 0..p.len() {
            let m = mask.map(|m| m[s.min(m.len() - 1)]);
            let pred = match (m, owner) {
                (None, None) => None,
                (Some(x), None) | (None, Some(x)) => Some(x),
                (Some(m), Some(o)) => Some(self.bin(BinaryOp::And, m, o)),
            };
            let dst = self.reg(t);
            self.emit(make(dst, s, pred));
            // Masked-off elements read 0 (the replicas' are replaced below).
            let old = match (m, used) {
                (Some(m), true) => {
                    let zero = self.konst(t, Literal::Int(0));
                    self.select_raw(m, dst, zero)
                }
                _ => dst,
            };
            olds.push(old);
            preds.push(pred);
        }
        let Some(owner) = owner.filter(|_| used) else { return olds };
        // Replicas take the owners' old values through shared memory.
        let size = shared_size(t);
        let n: u32 = shape.iter().product();
        let o = self.shared_alloc("atomic.replicas", n * size, 16);
        self.shared_reuse(o);
        let offs: Vec<Reg> = (0..olds.len() as u32)
            .map(|s| {
                let c = self.slot_coords(shape, s);
                let f = self.flatten(&c, shape);
                self.shared_offset(f, size, o)
            })
            .collect();
        for (off, old) in offs.iter().zip(&olds) {
            self.emit(Inst::SharedStore { offset: *off, value: *old, pred: Some(owner) });
        }
        self.emit(Inst::Barrier);
        let out = offs
            .iter()
            .map(|off| {
                let d = self.reg(t);
                self.emit(Inst::SharedLoad { dst: d, offset: *off });
                d
            })
            .collect();
        self.shared_free(o);
        out
    }

    /// Thread 0 runs `atomic` (predicated, and masked by the scalar `mask`); every thread gets
    /// its result through shared memory.
    pub(super) fn scalar_atomic(
        &mut self,
        make: impl Fn(Reg, Option<Reg>) -> Inst,
        t: SType,
        mask: Option<Reg>,
    ) -> Reg {
        let first = self.first_thread();
        let first = match mask {
            Some(m) => self.bin(BinaryOp::And, first, m),
            None => first,
        };
        let old = self.reg(t);
        self.emit(make(old, Some(first)));
        let o = self.shared_alloc("atomic.result", 8, 8);
        self.shared_reuse(o);
        let off = self.iconst(o as i64);
        self.emit(Inst::SharedStore { offset: off, value: old, pred: Some(first) });
        self.emit(Inst::Barrier);
        let r = self.reg(t);
        self.emit(Inst::SharedLoad { dst: r, offset: off });
        self.shared_free(o);
        r
    }
}
