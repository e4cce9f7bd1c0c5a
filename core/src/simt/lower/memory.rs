//! Global and shared memory: vector accesses with their guards, staging through shared
//! memory, layout conversions.

use super::*;

impl Lowering<'_> {
    /// A shared-memory byte offset: `base + index * size`.
    pub(super) fn shared_offset(&mut self, index: Reg, size: u32, base: u32) -> Reg {
        let off = if size > 1 { self.bin_c(BinaryOp::Shl, index, log2(size)) } else { index };
        let off = if base > 0 { self.bin_c(BinaryOp::Add, off, base as i64) } else { off };
        // An object of a ping-pong region's consumers: the thread's group's copy.
        match self.group_offset(base) {
            Some(d) => self.bin(BinaryOp::Add, off, d),
            None => off,
        }
    }

    /// Writes a tile's elements into shared memory at `base` (row-major).
    pub(super) fn stage_in_shared(&mut self, regs: &[Reg], shape: &[u32], base: u32) {
        let size = shared_size(self.k.ty(regs[0]));
        for (s, &r) in regs.iter().enumerate() {
            let c = self.slot_coords(shape, s as u32);
            let f = self.flatten(&c, shape);
            let off = self.shared_offset(f, size, base);
            self.emit(Inst::SharedStore { offset: off, value: r, pred: None });
        }
    }

    pub(super) fn shared_load(&mut self, t: SType, index: Reg, base: u32) -> Reg {
        let off = self.shared_offset(index, shared_size(t), base);
        let d = self.reg(t);
        self.emit(Inst::SharedLoad { dst: d, offset: off });
        d
    }

    /// Re-distributes `src` (shape `src_shape`) into the layout of `dst_shape`: the element at
    /// coordinates `c` is the source element at `map(c)`.
    pub(super) fn relayout(
        &mut self,
        src: &[Reg],
        src_shape: &[u32],
        dst_shape: &[u32],
        map: &dyn Fn(&mut Self, &[Reg]) -> Vec<Reg>,
    ) -> Vec<Reg> {
        let t = self.k.ty(src[0]);
        let n: u32 = src_shape.iter().product();
        let o = self.shared_alloc("relayout", n * shared_size(t), 16);
        self.shared_reuse(o);
        self.stage_in_shared(src, src_shape, o);
        self.emit(Inst::Barrier);
        let slots = self.layout(dst_shape).slots();
        let out = (0..slots)
            .map(|s| {
                let c = self.slot_coords(dst_shape, s);
                let sc = map(self, &c);
                let f = self.flatten(&sc, src_shape);
                self.shared_load(t, f, o)
            })
            .collect();
        self.shared_free(o);
        out
    }

    /// The vector width (elements) of accesses through `ptr` of 16-bit elements or wider, or 1
    /// (what the whole-loop pipeline's stages and vector atomics take).
    pub(super) fn vector_width(&mut self, ptr: Value, t: SType) -> u32 {
        if shared_size(t) < 2 {
            return 1;
        }
        self.contiguous_run(ptr, t, 2)
    }

    /// The vector width of a global load or store through `ptr`: [`Lowering::vector_width`],
    /// and for elements of a byte (FP8, 8-bit integers) on NVIDIA targets groups of whole
    /// 32-bit words (4, 8 or 16), never fewer. On AMD bytes move one at a time, as LLVM's
    /// load-store vectorizer combines them where it pays (grouped in the IR, the block-scaled
    /// SwiGLU grouped GEMM spilled four VGPRs on gfx90a).
    fn access_width(&mut self, ptr: Value, t: SType) -> u32 {
        if shared_size(t) == 1 && self.target.vendor == crate::target::Vendor::Nvidia {
            return self.contiguous_run(ptr, t, 4);
        }
        self.vector_width(ptr, t)
    }

    /// The elements of pointer tile `ptr` a thread reaches contiguously (its layout's vector
    /// along the fastest dimension, as far as the pointer is contiguous, 16 bytes at most)
    /// where that is `least` or more, else 1.
    fn contiguous_run(&mut self, ptr: Value, t: SType, least: u32) -> u32 {
        let pt = self.func.ty(ptr).clone();
        if pt.is_scalar() || matches!(t, SType::Pred) {
            return 1;
        }
        let l = self.layout(&pt.shape);
        let last = pt.shape.len() - 1;
        if l.order[0] != last {
            return 1;
        }
        let w = l.vector().min(self.contiguity.get(ptr).contiguity).min(16 / shared_size(t));
        if w >= least {
            w
        } else {
            1
        }
    }

    /// The one predicate of a masked vector access of `bytes` (an element group of pointer tile
    /// `ptr`, `masks` its elements' masks) when the facts prove the group aligned and the mask
    /// `mask` equal over it (e.g. a row mask broadcast along the row): the first element's
    /// mask, the whole group in or out, no scalar path. `None` otherwise.
    pub(super) fn uniform_guard(
        &self,
        ptr: Value,
        mask: Option<Value>,
        bytes: u32,
        masks: Option<&[Reg]>,
    ) -> Option<Reg> {
        let (mask, ms) = (mask?, masks?);
        let n = ms.len() as u32;
        (n > 1 && self.contiguity.get(ptr).divisibility >= bytes && self.contiguity.get(mask).constancy >= n)
            .then_some(ms[0])
    }

    /// The guard of a vector access of `bytes` at `addr` (an element group of pointer tile
    /// `ptr`): its masks, and the alignment test unless the pointer's divisibility facts prove
    /// it; `None` when nothing needs testing (no scalar fallback then).
    pub(super) fn vector_guard(&mut self, ptr: Value, addr: Reg, bytes: u32, masks: Option<&[Reg]>) -> Option<Reg> {
        if self.contiguity.get(ptr).divisibility < bytes {
            return Some(self.group_ok(addr, bytes, masks));
        }
        let ms = masks?;
        Some(ms[1..].iter().fold(ms[0], |acc, &m| self.bin(BinaryOp::And, acc, m)))
    }

    /// A group of `n` consecutive elements of pointer tile `ptr` from `addr` on, `bytes` in all,
    /// as one instruction (`vector(guard)`), guarded as [`Lowering::vector_guard`] says, and
    /// element `i`'s own instruction (`element(i, pred)`) where the guard fails: a vector store,
    /// or a vector atomic, with its element fallback.
    pub(super) fn vector_group(
        &mut self,
        (ptr, addr, bytes, n): (Value, Reg, u32, usize),
        masks: Option<&[Reg]>,
        vector: &dyn Fn(&mut Self, Option<Reg>) -> Inst,
        element: &dyn Fn(&mut Self, usize, Reg) -> Inst,
    ) {
        let ok = self.vector_guard(ptr, addr, bytes, masks);
        let inst = vector(self, ok);
        self.emit(inst);
        let Some(ok) = ok else { return };
        let not_ok = self.not(ok);
        for i in 0..n {
            let pred = self.fallback(not_ok, masks.map(|ms| ms[i]));
            let inst = element(self, i, pred);
            self.emit(inst);
        }
    }

    /// `ok` for a vector group: its first address is aligned to the group and every mask is set.
    pub(super) fn group_ok(&mut self, addr: Reg, bytes: u32, masks: Option<&[Reg]>) -> Reg {
        let ok = self.reg(SType::Pred);
        self.emit(Inst::IsAligned { dst: ok, addr, bytes });
        masks.into_iter().flatten().fold(ok, |acc, &m| self.bin(BinaryOp::And, acc, m))
    }

    pub(super) fn not(&mut self, p: Reg) -> Reg {
        let not = self.reg(SType::Pred);
        self.emit(Inst::Unary { dst: not, op: UnaryOp::Not, src: p });
        not
    }

    /// `not_ok & mask`: the lanes of a group that take the scalar path.
    pub(super) fn fallback(&mut self, not: Reg, mask: Option<Reg>) -> Reg {
        match mask {
            Some(m) => self.bin(BinaryOp::And, not, m),
            None => not,
        }
    }

    pub(super) fn load(&mut self, ptr: Value, mask: Option<Value>, other: Option<Value>, st: SType) -> Vec<Reg> {
        let w = self.access_width(ptr, st);
        let p = self.held(ptr);
        let m = mask.map(|m| self.held(m));
        let o = other.map(|o| self.held(o));
        let pick = |h: &Vec<Reg>, s: usize| h[s.min(h.len() - 1)];
        let mut out = Vec::with_capacity(p.len());
        for g in (0..p.len()).step_by(w as usize) {
            let group: Vec<usize> = (g..(g + w as usize).min(p.len())).collect();
            if w == 1 {
                let dst = self.reg(st);
                let s = group[0];
                self.emit(Inst::Load {
                    dst,
                    addr: p[s],
                    pred: m.as_ref().map(|m| pick(m, s)),
                    other: o.as_ref().map(|o| pick(o, s)),
                });
                out.push(dst);
                continue;
            }
            let masks: Option<Vec<Reg>> = m.as_ref().map(|m| group.iter().map(|&s| pick(m, s)).collect());
            if let Some(ok) = self.uniform_guard(ptr, mask, w * shared_size(st), masks.as_deref()) {
                // Aligned, and wholly in or out of the mask: one access, no scalar path.
                let vec_dsts: Vec<Reg> = group.iter().map(|_| self.reg(st)).collect();
                let others = o.as_ref().map(|o| group.iter().map(|&s| pick(o, s)).collect()).unwrap_or_default();
                self.emit(Inst::VLoad { dsts: vec_dsts.clone(), addr: p[g], pred: Some(ok), others });
                out.extend(vec_dsts);
                continue;
            }
            let Some(ok) = self.vector_guard(ptr, p[g], w * shared_size(st), masks.as_deref()) else {
                let vec_dsts: Vec<Reg> = group.iter().map(|_| self.reg(st)).collect();
                self.emit(Inst::VLoad { dsts: vec_dsts.clone(), addr: p[g], pred: None, others: Vec::new() });
                out.extend(vec_dsts);
                continue;
            };
            let vec_dsts: Vec<Reg> = group.iter().map(|_| self.reg(st)).collect();
            let others: Vec<Reg> = o.as_ref().map(|o| group.iter().map(|&s| pick(o, s)).collect()).unwrap_or_default();
            self.emit(Inst::VLoad { dsts: vec_dsts.clone(), addr: p[g], pred: Some(ok), others });
            let not_ok = self.not(ok);
            for (i, &s) in group.iter().enumerate() {
                let pred = self.fallback(not_ok, masks.as_ref().map(|ms| ms[i]));
                let dst = self.reg(st);
                self.emit(Inst::Load { dst, addr: p[s], pred: Some(pred), other: Some(vec_dsts[i]) });
                out.push(dst);
            }
        }
        out
    }

    pub(super) fn store(&mut self, ptr: Value, value: Value, mask: Option<Value>) {
        if let Some((l, regs)) = self.mma_held.get(&value).cloned() {
            if self.rematerializable(ptr) && mask.is_none_or(|m| self.rematerializable(m)) {
                return self.store_from_mma(ptr, mask, l, &regs);
            }
        }
        let t = stype(self.func.ty(value));
        let (p, v) = (self.held(ptr), self.held(value));
        let m = mask.map(|m| self.held(m));
        let w = self.access_width(ptr, t);
        let pick = |h: &Vec<Reg>, s: usize| h[s.min(h.len() - 1)];
        let n = p.len().max(v.len());
        for g in (0..n).step_by(w as usize) {
            let group: Vec<usize> = (g..(g + w as usize).min(n)).collect();
            if w == 1 {
                let s = group[0];
                self.emit(Inst::Store { addr: pick(&p, s), value: pick(&v, s), pred: m.as_ref().map(|m| pick(m, s)) });
                continue;
            }
            let masks: Option<Vec<Reg>> = m.as_ref().map(|m| group.iter().map(|&s| pick(m, s)).collect());
            let values: Vec<Reg> = group.iter().map(|&s| pick(&v, s)).collect();
            if let Some(ok) = self.uniform_guard(ptr, mask, w * shared_size(t), masks.as_deref()) {
                self.emit(Inst::VStore { addr: p[g], values, pred: Some(ok) });
                continue;
            }
            self.vector_group(
                (ptr, p[g], w * shared_size(t), group.len()),
                masks.as_deref(),
                &|_, pred| Inst::VStore { addr: p[g], values: values.clone(), pred },
                &|_, i, pred| Inst::Store { addr: p[group[i]], value: values[i], pred: Some(pred) },
            );
        }
    }

    /// A `desc_load` (`value` None: returns the block's registers, 0 outside the tensor) or
    /// `desc_store` of `value` at `offsets` through the descriptor made by `desc`'s `make_desc`:
    /// element by element, each inside the tensor or masked off, with 64-bit offsets. (sm_90a
    /// will read whole blocks with TMA; this is the form every target runs.)
    pub(super) fn desc_access(
        &mut self,
        desc: Value,
        offsets: [Value; 2],
        value: Option<Value>,
        st: SType,
    ) -> Vec<Reg> {
        let ValueDef::Result { op, .. } = self.func.values[desc].def else { unreachable!("checked by the verifier") };
        let OpKind::MakeDesc { ptr, shape, strides } = self.func.ops[op].kind else { unreachable!("verified") };
        let (_, block) = self.func.ty(desc).elem.desc().expect("verified");
        let i64t = SType::Int { bits: 64, signed: true };
        let base = self.held(ptr)[0];
        let dims = [self.held(shape[0])[0], self.held(shape[1])[0]];
        let stride = [self.held(strides[0])[0], self.held(strides[1])[0]];
        let off = [self.held(offsets[0])[0], self.held(offsets[1])[0]];
        let (stride0, stride1) = (self.cast(stride[0], i64t), self.cast(stride[1], i64t));
        // A stored tile held in an accumulator layout is stored from it (no conversion).
        let mma = value.and_then(|v| self.mma_held.get(&v).cloned());
        let vals = match &mma {
            Some((_, regs)) => Some(regs.clone()),
            None => value.map(|v| self.held(v)),
        };
        let zero = self.iconst(0);
        let size = shared_size(match value {
            Some(v) => stype(self.func.ty(v)),
            None => st,
        });
        let slots = match &mma {
            Some((l, _)) => l.slots(),
            None => self.layout(&block).slots(),
        };
        let mut out = Vec::new();
        for s in 0..slots {
            let c = match &mma {
                Some((l, _)) => self.mma_coords(*l, s).to_vec(),
                None => self.slot_coords(&block, s),
            };
            let mut inside = None;
            let mut at = Vec::new();
            for d in 0..2 {
                let x = self.bin(BinaryOp::Add, off[d], c[d]);
                let lo = self.reg(SType::Pred);
                self.emit(Inst::Cmp { dst: lo, op: CmpOp::Ge, a: x, b: zero });
                let hi = self.reg(SType::Pred);
                self.emit(Inst::Cmp { dst: hi, op: CmpOp::Lt, a: x, b: dims[d] });
                let both = self.bin(BinaryOp::And, lo, hi);
                inside = Some(match inside {
                    Some(p) => self.bin(BinaryOp::And, p, both),
                    None => both,
                });
                at.push(self.cast(x, i64t));
            }
            let e0 = self.bin(BinaryOp::Mul, at[0], stride0);
            let e1 = self.bin(BinaryOp::Mul, at[1], stride1);
            let e = self.bin(BinaryOp::Add, e0, e1);
            let addr = self.reg(SType::Ptr);
            self.emit(Inst::AddrOffset { dst: addr, base, offset: e, scale: size });
            match &vals {
                Some(v) => self.emit(Inst::Store { addr, value: v[s as usize], pred: inside }),
                None => {
                    let z = self.konst(st, Literal::Int(0));
                    let dst = self.reg(st);
                    self.emit(Inst::Load { dst, addr, pred: inside, other: Some(z) });
                    out.push(dst);
                }
            }
        }
        out
    }
}
