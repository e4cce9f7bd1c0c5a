//! Software-pipelined K loops: the operand loads of future K steps in flight while the matrix
//! atoms work on the current one, by the target's mechanism: `cp.async` groups where the target
//! has them (sm_80, sm_90), else register-staged prefetch (gfx90a, gfx942: the next step's
//! global loads issued into registers before this step's atoms, stored to the other of two
//! shared stages after them, one barrier per step), or TMA copies of tensor-descriptor blocks
//! completing on a ring of mbarriers, one per stage (sm_90a, with `wgmma`).

use super::*;

/// A software-pipelined K loop (`Lowering::pipeline_plan`): the accumulator layout, the number
/// of stages, and for A and B where the load reads and the value it makes.
pub(super) struct Pipeline {
    pub(super) layout: AccLayout,
    pub(super) stages: u32,
    pub(super) strategy: Strategy,
    /// The K step runs on `wgmma` from swizzled stages (sm_90a), not on register fragments.
    wgmma: bool,
    /// TMA copies issued by a producer warp of their own (`LaunchAttrs::warp_specialize`).
    pub(super) specialized: bool,
    pub(super) a: Operand,
    /// B's value is the transpose of `b.value` (`[N, K]`, K contiguous): staged K-major, as A
    /// is, which is how `wgmma` reads FP8 operands (TMA with `wgmma` only).
    b_kmajor: bool,
    b: Operand,
    /// The step adds a fresh `dot` times a scale to the carried value (TMA and `wgmma` only).
    pub(super) promotion: Option<Promotion>,
}

/// A K step of the form `acc + dot(a, b, 0) * scale` (DeepSeek-V3's block scaling: the tensor
/// cores' product of one K block promoted into the f32 accumulator with its scales), or
/// `acc + dot(a, b, 0)` (the promotion alone: FP8 `wgmma` accumulates with reduced precision,
/// so a long K adds its blocks in f32): `scale` is computed from loads in the body (the scales
/// of the block), evaluated at each accumulator element's coordinates once the step's `wgmma`s
/// are done.
#[derive(Clone, Copy)]
pub(super) struct Promotion {
    scale: Option<Value>,
}

/// One operand of a pipelined `dot`: the load's source and the loaded value.
#[derive(Clone, Copy)]
pub(super) struct Operand {
    pub(super) source: Source,
    pub(super) value: Value,
}

#[derive(Clone, Copy)]
pub(super) enum Source {
    /// `load(ptr, mask, 0)`: pointer and mask rematerializable at any step.
    Pointer { ptr: Value, mask: Value },
    /// `desc_load(desc, offsets)` copied by TMA: the first of `atoms` tensor maps' index (one
    /// box per swizzle atom along the contiguous dimension) and the block's offsets.
    Tensor { map: u32, atoms: u32, offsets: [Value; 2] },
}

impl Operand {
    fn pointer(&self) -> (Value, Value) {
        match self.source {
            Source::Pointer { ptr, mask } => (ptr, mask),
            Source::Tensor { .. } => unreachable!("TMA operands are copied by `tma_issue`"),
        }
    }
}

/// How the next K steps' operands travel while this one computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Strategy {
    /// `cp.async` into `stages` shared stages, a commit group per step.
    AsyncGroups,
    /// Global loads into registers one step ahead, two shared stages.
    Registers,
    /// TMA copies of descriptor blocks into `stages` swizzled stages, each completing on its
    /// own mbarrier; one thread issues them.
    Tma,
}

/// Where an element of a stage lives: rows padded by 16 bytes (fragments read by `ldmatrix` or
/// lane maps), or the swizzled layouts `wgmma` reads (A K-major in atoms of `m` rows x `sa`
/// bytes along K; B N-major in atoms of `kk` rows x `sb` bytes along N, or with `b_kmajor`
/// K-major as A, in atoms of `n` rows x `sb` bytes along K; `crate::simt::smem`), of elements
/// of type `elem`.
#[derive(Clone, Copy, Debug)]
pub(super) enum StageLayout {
    Padded { strides: [u32; 2], b_off: u32 },
    Swizzled { m: u32, n: u32, kk: u32, sa: u32, sb: u32, b_off: u32, b_kmajor: bool, elem: DType },
}

impl StageLayout {
    /// Row strides and B's offset of a padded stage (what `mma_steps` reads fragments by).
    fn padded(&self) -> ([u32; 2], u32) {
        match *self {
            StageLayout::Padded { strides, b_off } => (strides, b_off),
            StageLayout::Swizzled { .. } => unreachable!("register fragments are read from padded stages"),
        }
    }

    /// The byte offset [`Lowering::stage_offset_here`] computes, evaluated on the host: what
    /// compile-time checks of the emitted address math compare against.
    pub(super) fn offset_of(&self, which: usize, row: u32, col: u32, size: u32) -> u32 {
        match *self {
            StageLayout::Padded { strides, b_off } => {
                (row * strides[which] + col) * size + if which == 0 { 0 } else { b_off }
            }
            StageLayout::Swizzled { m, n, kk, sa, sb, b_off, b_kmajor, .. } => {
                let (width, atom_bytes, base) = match (which, b_kmajor) {
                    (0, _) => (sa, m * sa, 0),
                    (_, true) => (sb, n * sb, b_off),
                    _ => (sb, kk * sb, b_off),
                };
                let per = width / size;
                let logical = (col / per) * atom_bytes + row * width + (col % per) * size;
                let bits = ((logical >> 7) & (width / 16 - 1)) << 4;
                (logical ^ bits) + base
            }
        }
    }
}

impl Lowering<'_> {
    /// The byte offset within a stage of element (`row`, `col`) of operand `which` (0: A, 1: B)
    /// of 16-bit elements (`size` bytes each) in layout `sl`. The coordinates are prologue
    /// registers, so the offset is computed once, in the prologue.
    fn stage_offset(&mut self, sl: StageLayout, which: usize, row: Reg, col: Reg, size: u32) -> Reg {
        let saved = std::mem::take(&mut self.cur);
        let r = self.stage_offset_here(sl, which, row, col, size);
        let defs = std::mem::replace(&mut self.cur, saved);
        self.prologue.extend(defs);
        r
    }

    pub(super) fn stage_offset_here(&mut self, sl: StageLayout, which: usize, row: Reg, col: Reg, size: u32) -> Reg {
        match sl {
            StageLayout::Padded { strides, b_off } => {
                let r = self.bin_c(BinaryOp::Mul, row, strides[which] as i64);
                let e = self.bin(BinaryOp::Add, r, col);
                self.shared_offset(e, size, if which == 0 { 0 } else { b_off })
            }
            StageLayout::Swizzled { m, n, kk, sa, sb, b_off, b_kmajor, .. } => {
                // A: atom `k / (sa / size)` of m x sa bytes, row `row`; B: atom `n / (sb / size)`
                // of kk x sb bytes, row `k` (K-major B: as A, with n rows). Then the swizzle of
                // the address within its atom.
                let (major, minor, width, atom_bytes, base) = match (which, b_kmajor) {
                    (0, _) => (row, col, sa, m * sa, 0),
                    (_, true) => (row, col, sb, n * sb, b_off),
                    _ => (row, col, sb, kk * sb, b_off),
                };
                let per = width / size;
                let atom = self.bin_c(BinaryOp::Shr, minor, log2(per));
                let inner = self.bin_c(BinaryOp::And, minor, per as i64 - 1);
                let a_off = self.bin_c(BinaryOp::Mul, atom, atom_bytes as i64);
                let r_off = self.bin_c(BinaryOp::Mul, major, width as i64);
                let i_off = self.bin_c(BinaryOp::Shl, inner, log2(size));
                let logical = self.bin(BinaryOp::Add, a_off, r_off);
                let logical = self.bin(BinaryOp::Add, logical, i_off);
                let bits = self.bin_c(BinaryOp::Shr, logical, 7);
                let bits = self.bin_c(BinaryOp::And, bits, (width / 16) as i64 - 1);
                let bits = self.bin_c(BinaryOp::Shl, bits, 4);
                let phys = self.bin(BinaryOp::Xor, logical, bits);
                if base > 0 {
                    self.bin_c(BinaryOp::Add, phys, base as i64)
                } else {
                    phys
                }
            }
        }
    }

    /// The K loop of a GEMM, software-pipelined: a `for` whose only carried value is the
    /// accumulator of a tensor-core `dot` whose operands are loads used nowhere else (masked-off
    /// elements 0, pointers and masks rematerializable), with nothing else in the body that
    /// touches memory, in a kernel of `stages >= 2`. Or, with TMA and `wgmma`, a [`Promotion`]:
    /// the carried value plus a fresh `dot` times a scale, whose loads are the only other
    /// memory accesses of the body.
    pub(super) fn pipeline_plan(&mut self, op: Op) -> Option<Pipeline> {
        let stages = self.func.attrs.stages;
        let OpKind::For { init, body, .. } = &self.func.ops[op].kind else { return None };
        let body = *body;
        if stages < 2 || init.len() != 1 {
            return None;
        }
        let count_uses =
            |v: Value| self.func.ops.iter().flat_map(|(_, d)| d.kind.operands()).filter(|(_, u)| *u == v).count();
        let next = self.func.blocks[body].yields[0];
        let (layout, dot, promotion, promotion_ops) = match self.promotion_of(body, next, &count_uses) {
            Some((dot, scale, ops, outside)) => {
                // What the scale reads from outside the body is recomputed at each element's
                // coordinates (`eval_loaded`).
                if !outside.into_iter().all(|v| self.rematerializable(v)) {
                    return None;
                }
                (self.dot_mma_layout(dot)?, dot, Some(Promotion { scale }), ops)
            }
            None => {
                let layout = self.carried_mma(body, 0)?;
                let ValueDef::Result { op: dot, .. } = self.func.values[next].def else { return None };
                (layout, dot, None, Vec::new())
            }
        };
        let OpKind::Dot { a, b, .. } = self.func.ops[dot].kind else { return None };
        // B as the transpose of a `[N, K]` block (used only there): staged K-major.
        let mut transpose = None;
        let mut b = b;
        if let ValueDef::Result { op: t, .. } = self.func.values[b].def {
            if let OpKind::Transpose { x, ref perm } = self.func.ops[t].kind {
                let yielded = self.func.blocks.iter().any(|(_, bl)| bl.yields.contains(&b));
                if perm[..] != [1, 0] || count_uses(b) != 1 || yielded || !self.func.blocks[body].ops.contains(&t) {
                    return None;
                }
                transpose = Some(t);
                b = x;
            }
        }
        let b_kmajor = transpose.is_some();
        let fp8 = self.func.ty(a).elem.dtype().is_some_and(|d| d.is_fp8());
        let mut loads = Vec::new();
        for v in [a, b] {
            let ValueDef::Result { op: ld, .. } = self.func.values[v].def else { return None };
            let uses = count_uses(v);
            let yielded = self.func.blocks.iter().any(|(_, bl)| bl.yields.contains(&v));
            if uses != 1 || yielded || !self.func.blocks[body].ops.contains(&ld) {
                return None;
            }
            match self.func.ops[ld].kind {
                OpKind::Load { ptr, mask, other } => {
                    if other.is_some_and(|o| !self.is_zero(o)) || mask.is_none_or(|m| !self.rematerializable(m)) {
                        return None;
                    }
                    if !self.rematerializable(ptr) || self.vector_width(ptr, stype(self.func.ty(v))) < 2 {
                        return None;
                    }
                    loads.push((
                        ld,
                        None,
                        Operand { source: Source::Pointer { ptr, mask: mask.expect("checked") }, value: v },
                    ));
                }
                OpKind::DescLoad { desc, offsets } => loads.push((
                    ld,
                    Some(desc),
                    Operand {
                        // The maps are made below, once the tile is known to run on `wgmma`.
                        source: Source::Tensor { map: 0, atoms: 0, offsets },
                        value: v,
                    },
                )),
                _ => return None,
            }
        }
        let pure = self.func.blocks[body].ops.iter().all(|&o| {
            o == dot
                || Some(o) == transpose
                || promotion_ops.contains(&o)
                || loads.iter().any(|l| l.0 == o)
                || is_index_math(&self.func.ops[o].kind)
                || matches!(self.func.ops[o].kind, OpKind::Const(_) | OpKind::ProgramId(_) | OpKind::NumPrograms(_))
        });
        if !pure {
            return None;
        }
        let tensors = loads.iter().filter(|l| l.1.is_some()).count();
        let strategy = if tensors == 2 && self.target.has_async_copy(AsyncCopy::Tma) {
            Strategy::Tma
        } else if tensors > 0 {
            // Descriptor blocks without TMA are read by `desc_access` in the loop.
            return None;
        } else if self.target.has_async_copy(AsyncCopy::CpAsyncGroups) {
            Strategy::AsyncGroups
        } else if self.target.async_copies.is_empty() {
            Strategy::Registers
        } else {
            return None;
        };
        let stages = if strategy == Strategy::Registers { 2 } else { stages };
        let kk = self.func.ty(loads[0].2.value).shape[1];
        let size = self.func.ty(loads[0].2.value).elem.dtype()?.size_bytes();
        let wgmma = strategy != Strategy::Registers && self.wgmma_fits(layout, kk, size, b_kmajor);
        if strategy == Strategy::Tma && !wgmma {
            return None;
        }
        // A K-major B is staged only by TMA for `wgmma`, and FP8 operands are read only by
        // `wgmma` (the atoms' register fragments are 16-bit: a `dot` outside this pipeline
        // converts FP8 in registers, `dot_mma`); a promotion is lowered on `wgmma` alone.
        if (b_kmajor || fp8 || promotion.is_some()) && strategy != Strategy::Tma {
            return None;
        }
        let layout = match wgmma {
            true if self.wgmma_split_n(layout, b_kmajor) => {
                AccLayout { warps_m: 4, warps_n: self.k.warps / 4, interleave_m: true, ..layout }
            }
            true => AccLayout { warps_m: self.k.warps, warps_n: 1, interleave_m: true, ..layout },
            false => layout,
        };
        let (mut a, mut b) = (loads[0].2, loads[1].2);
        if strategy == Strategy::Tma {
            let before = self.k.tensor_maps.len();
            // A's boxes: all of its rows, one swizzle row of K each; B's: all of K, one swizzle
            // row of N each, or K-major as A's (the stage layout of `pipelined_for`).
            let (sa, sb) = swizzle_widths(layout, kk, size, b_kmajor);
            let b_box = if b_kmajor { (layout.n, kk, sb) } else { (kk, layout.n, sb) };
            for (operand, desc, (rows, cols, width)) in
                [(&mut a, loads[0].1, (layout.m, kk, sa)), (&mut b, loads[1].1, b_box)]
            {
                let Source::Tensor { offsets, .. } = operand.source else { return None };
                let Some(map) = self.tensor_map(desc.expect("a tensor operand"), rows, width / size, width) else {
                    self.k.tensor_maps.truncate(before);
                    return None;
                };
                operand.source = Source::Tensor { map, atoms: cols / (width / size), offsets };
            }
        }
        // Warp specialization: the loop must be in the kernel's top block with nothing before it
        // that touches memory (the producer warp runs all of that, and leaves after its loop).
        let top = &self.func.blocks[self.func.body].ops;
        let specialized = strategy == Strategy::Tma
            && promotion.is_none()
            && self.func.attrs.warp_specialize
            && top
                .iter()
                .position(|&o| o == op)
                .is_some_and(|i| top[..i].iter().all(|&o| effect_free(&self.func.ops[o].kind)));
        Some(Pipeline { layout, stages, strategy, wgmma, specialized, a, b_kmajor, b, promotion })
    }

    /// When the body's next value `next` is `carried + dot(a, b, 0) * scale` (either order of
    /// either operation) or `carried + dot(a, b, 0)`: the `dot`, the scale and the ops that make
    /// the promotion (the add, the multiply and the scale's ops in the body: index math and
    /// loads only), and the values the scale reads from outside the body.
    #[allow(clippy::type_complexity)]
    fn promotion_of(
        &self,
        body: Block,
        next: Value,
        count_uses: &dyn Fn(Value) -> usize,
    ) -> Option<(Op, Option<Value>, Vec<Op>, Vec<Value>)> {
        let carried = self.func.blocks[body].args[1];
        let def = |v: Value| match self.func.values[v].def {
            ValueDef::Result { op, .. } => Some(op),
            _ => None,
        };
        let add = def(next)?;
        let OpKind::Binary { op: BinaryOp::Add, lhs: x, rhs: y } = self.func.ops[add].kind else { return None };
        let product = if x == carried {
            y
        } else if y == carried {
            x
        } else {
            return None;
        };
        let is_fresh_dot = |v: Value| {
            def(v).is_some_and(|o| matches!(self.func.ops[o].kind, OpKind::Dot { acc, .. } if self.is_zero(acc)))
        };
        if is_fresh_dot(product) {
            return (count_uses(product) == 1).then(|| (def(product).expect("a dot"), None, vec![add], Vec::new()));
        }
        let mul = def(product)?;
        let OpKind::Binary { op: BinaryOp::Mul, lhs: p, rhs: q } = self.func.ops[mul].kind else { return None };
        let (part, scale) = if is_fresh_dot(p) {
            (p, q)
        } else if is_fresh_dot(q) {
            (q, p)
        } else {
            return None;
        };
        if count_uses(part) != 1 || count_uses(product) != 1 || self.func.ty(scale).shape != self.func.ty(part).shape {
            return None;
        }
        let mut ops = vec![add, mul];
        let mut outside = Vec::new();
        let mut stack = vec![scale];
        while let Some(v) = stack.pop() {
            if v == carried {
                return None;
            }
            let Some(o) = def(v).filter(|o| self.func.blocks[body].ops.contains(o)) else {
                outside.push(v);
                continue;
            };
            if ops.contains(&o) {
                continue;
            }
            let kind = &self.func.ops[o].kind;
            if !(is_index_math(kind) || matches!(kind, OpKind::Load { .. } | OpKind::Const(_))) {
                return None;
            }
            stack.extend(kind.operands().into_iter().map(|(_, v)| v));
            ops.push(o);
        }
        Some((def(part)?, Some(scale), ops, outside))
    }

    /// The tensor map of `desc`'s `make_desc` read in boxes of `rows x cols` swizzled at `swizzle`
    /// bytes (an index into the kernel's maps, shared by equal requests), when TMA can read it:
    /// the tensor a kernel parameter, its extents and row stride parameters or constants, its
    /// columns contiguous (a constant stride of 1) and its elements 16-bit or FP8.
    pub(super) fn tensor_map(&mut self, desc: Value, rows: u32, cols: u32, swizzle: u32) -> Option<u32> {
        use crate::simt::tma::{MapScalar, TensorMap};
        let ValueDef::Result { op, .. } = self.func.values[desc].def else { return None };
        let OpKind::MakeDesc { ptr, shape, strides } = self.func.ops[op].kind else { return None };
        // The pointer may carry a wait's token (`consume_token`): the copies come after the wait
        // in program order, and the wait's lowering orders the async proxy after it.
        let mut ptr = ptr;
        while let ValueDef::Result { op, .. } = self.func.values[ptr].def {
            let OpKind::ConsumeToken { value, .. } = self.func.ops[op].kind else { break };
            ptr = value;
        }
        let ValueDef::Param(p) = self.func.values[ptr].def else { return None };
        let (dtype, _) = self.func.ty(desc).elem.desc()?;
        if !(dtype.size_bytes() == 2 || dtype.is_fp8()) || rows > 256 {
            return None;
        }
        let scalar = |v: Value| match self.func.values[v].def {
            ValueDef::Param(i) => Some(MapScalar::Param(i)),
            ValueDef::Result { op, .. } => match self.func.ops[op].kind {
                OpKind::Const(Literal::Int(c)) => Some(MapScalar::Const(c)),
                _ => None,
            },
            ValueDef::BlockArg { .. } => None,
        };
        if scalar(strides[1])? != MapScalar::Const(1) {
            return None;
        }
        let map = TensorMap {
            ptr: p,
            dtype,
            rows: scalar(shape[0])?,
            cols: scalar(shape[1])?,
            row_stride: scalar(strides[0])?,
            box_rows: rows,
            box_cols: cols,
            swizzle,
        };
        let maps = &mut self.k.tensor_maps;
        Some(match maps.iter().position(|m| *m == map) {
            Some(i) => i as u32,
            None => {
                maps.push(map);
                maps.len() as u32 - 1
            }
        })
    }

    /// Whether the K step of a pipelined `dot` with accumulator layout `l`, K tile `kk` and
    /// elements of `size` bytes runs on the target's `wgmma`: each warpgroup takes 64 rows of
    /// each band of `16 warps` rows, one or two bands (`m = 16 warps` or `32 warps`: a 128-row
    /// tile on one warpgroup, 256 on two, as CUTLASS's cooperative kernels), `n` a multiple of
    /// 8 up to 256 with at most 128 accumulator registers per thread, K a multiple of the
    /// instruction's (32 bytes), and K and N tiles whose rows fill a swizzle width (32, 64 or
    /// 128 bytes, or whole 128-byte atoms). Or a 64-row tile split along N over the
    /// warpgroups ([`Self::wgmma_split_n`]).
    fn wgmma_fits(&self, l: AccLayout, kk: u32, size: u32, b_kmajor: bool) -> bool {
        let has = self.target.has_wgmma();
        let rows_fit = |elems: u32| matches!(elems * size, 32 | 64 | 128) || (elems * size).is_multiple_of(128);
        let band = 16 * self.k.warps;
        let (m_ok, n_each) = match self.wgmma_split_n(l, b_kmajor) {
            true => (true, l.n / (self.k.warps / 4)),
            false => (l.m == band || (l.m == 2 * band && l.n <= 128), l.n),
        };
        has && l.atom.name == crate::target::MMA_SYNC_M16N8K16.name
            && self.k.warps.is_multiple_of(4)
            && m_ok
            && n_each.is_multiple_of(8)
            && n_each <= 256
            && (kk * size).is_multiple_of(32)
            && rows_fit(kk)
            && rows_fit(l.n)
    }

    /// Whether a `wgmma` tile splits along N over the warpgroups instead of along M: a 64-row
    /// tile on two warpgroups, each taking its half of the columns (of a K-major B, whose rows
    /// of N are whole swizzle rows). A block-scaled FP8 tile of 64 x 256 holds two f32
    /// accumulators (the promotion's); on one warpgroup that is 256 registers a thread (it
    /// spilled: 1100 bytes, ptxas 13.0), split it is 128.
    pub(super) fn wgmma_split_n(&self, l: AccLayout, b_kmajor: bool) -> bool {
        b_kmajor && self.k.warps == 8 && l.m == 64 && l.n.is_multiple_of(16)
    }

    /// Calls `each` on the element groups of one operand's copy, in a layout of up to
    /// `widest` elements per thread (as far as the pointer's contiguity allows), with the
    /// group width, its coordinates, first address and masks (the step's validity folded in).
    #[allow(clippy::type_complexity)]
    fn for_copy_groups(
        &mut self,
        (ptr, mask): (Value, Value),
        shape: &[u32],
        widest: u32,
        valid: Reg,
        each: &mut dyn FnMut(&mut Self, u32, Vec<Vec<Reg>>, Reg, Vec<Reg>),
    ) {
        let cl = Blocked::with_vector(shape, self.k.warps, self.k.warp_size, widest);
        let w = cl.vector().min(self.contiguity.get(ptr).contiguity).min(widest).max(1);
        for g in (0..cl.slots()).step_by(w as usize) {
            let coords: Vec<Vec<Reg>> = (g..g + w).map(|s| self.slot_coords_in(&cl, s)).collect();
            let p0 = self.eval(ptr, &coords[0]);
            let masks: Vec<Reg> = coords
                .iter()
                .map(|c| {
                    let m = self.eval(mask, c);
                    self.bin(BinaryOp::And, m, valid)
                })
                .collect();
            each(self, w, coords, p0, masks);
        }
    }

    /// Issues the copies of one K step's operands (the loop variable bound to `iv`) into the
    /// stage at byte `base` (a register): vector groups as `cp.async` when aligned and wholly
    /// inside the masks and the loop, element by element (0 where masked) otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn issue_stage(
        &mut self,
        plan: &Pipeline,
        iv_arg: Value,
        iv: Reg,
        valid: Reg,
        base: Reg,
        sl: StageLayout,
    ) {
        self.with_bound(&[(iv_arg, iv)], |me| me.issue_stage_here(plan, valid, base, sl))
    }

    fn issue_stage_here(&mut self, plan: &Pipeline, valid: Reg, base: Reg, sl: StageLayout) {
        self.issue_operands(&[plan.a, plan.b], valid, base, sl);
    }

    /// Issues the copies of `operands` (operand `i` at its place `i` of the stage layout `sl`:
    /// 0 as A, 1 as B) into the stage at byte `base` (a register), lanes outside `valid` or
    /// the masks zero-filled; the loop variable is bound by the caller.
    pub(super) fn issue_operands(&mut self, operands: &[Operand], valid: Reg, base: Reg, sl: StageLayout) {
        for (which, &operand) in operands.iter().enumerate() {
            let ((ptr, mask), v) = (operand.pointer(), operand.value);
            let shape = self.func.ty(v).shape.clone();
            let t = stype(self.func.ty(v));
            let size = shared_size(t);
            // The copy's own layout: as many elements per thread as the widest access holds
            // (16 bytes: 8 bf16), as far as the pointer's contiguity allows.
            let widest = self.target.vector_bytes / size;
            // Groups the facts prove aligned and wholly in or out of the masks copy or zero-fill
            // as one `cp.async`, with no scalar path.
            let facts = (self.contiguity.get(ptr).divisibility, self.contiguity.get(mask).constancy);
            self.for_copy_groups((ptr, mask), &shape, widest, valid, &mut |me, w, coords, p0, masks| {
                // A group never straddles a 16-byte chunk, which the swizzle moves whole.
                let off = me.stage_offset(sl, which, coords[0][0], coords[0][1], size);
                let off = me.bin(BinaryOp::Add, off, base);
                if w > 1 && facts.0 >= w * size && facts.1 >= w {
                    me.emit(Inst::AsyncCopy {
                        offset: off,
                        addr: p0,
                        bytes: w * size,
                        pred: masks[0],
                        zero_fill: true,
                    });
                    return;
                }
                let ok = me.vector_guard(ptr, p0, w * size, Some(&masks)).expect("masked");
                me.emit(Inst::AsyncCopy { offset: off, addr: p0, bytes: w * size, pred: ok, zero_fill: false });
                let not_ok = me.not(ok);
                for (i, c) in coords.iter().enumerate() {
                    let p = me.eval(ptr, c);
                    let pred = me.bin(BinaryOp::And, not_ok, masks[i]);
                    let zero = me.reg(t);
                    me.emit(Inst::Const { dst: zero, value: Literal::Int(0) });
                    let x = me.reg(t);
                    me.emit(Inst::Load { dst: x, addr: p, pred: Some(pred), other: Some(zero) });
                    let oi = me.stage_offset(sl, which, c[0], c[1], size);
                    let oi = me.bin(BinaryOp::Add, oi, base);
                    me.emit(Inst::SharedStore { offset: oi, value: x, pred: Some(not_ok) });
                }
            });
        }
    }

    /// Register staging: loads one K step's operands (the loop variable bound to `iv`, lanes
    /// outside `valid` or the masks read 0) into registers, as vector groups where aligned and
    /// unmasked; returns each group's offset in the stage and its registers.
    fn fetch_step(
        &mut self,
        plan: &Pipeline,
        iv_arg: Value,
        iv: Reg,
        valid: Reg,
        sl: StageLayout,
    ) -> Vec<(Reg, Vec<Reg>)> {
        self.with_bound(&[(iv_arg, iv)], |me| me.fetch_step_here(plan, valid, sl))
    }

    fn fetch_step_here(&mut self, plan: &Pipeline, valid: Reg, sl: StageLayout) -> Vec<(Reg, Vec<Reg>)> {
        let mut out = Vec::new();
        for (which, operand) in [plan.a, plan.b].into_iter().enumerate() {
            let ((ptr, mask), v) = (operand.pointer(), operand.value);
            let shape = self.func.ty(v).shape.clone();
            let t = stype(self.func.ty(v));
            let size = shared_size(t);
            // Shared vector stores take up to 4 elements.
            let widest = (self.target.vector_bytes / size).min(4);
            self.for_copy_groups((ptr, mask), &shape, widest, valid, &mut |me, w, coords, p0, masks| {
                let zeros: Vec<Reg> = (0..w)
                    .map(|_| {
                        let z = me.reg(t);
                        me.emit(Inst::Const { dst: z, value: Literal::Int(0) });
                        z
                    })
                    .collect();
                let vals: Vec<Reg> = if w == 1 {
                    let x = me.reg(t);
                    me.emit(Inst::Load { dst: x, addr: p0, pred: Some(masks[0]), other: Some(zeros[0]) });
                    vec![x]
                } else {
                    let ok = me.vector_guard(ptr, p0, w * size, Some(&masks)).expect("masked");
                    let dsts: Vec<Reg> = (0..w).map(|_| me.reg(t)).collect();
                    me.emit(Inst::VLoad { dsts: dsts.clone(), addr: p0, pred: Some(ok), others: zeros });
                    let not_ok = me.not(ok);
                    coords
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            let p = me.eval(ptr, c);
                            let pred = me.bin(BinaryOp::And, not_ok, masks[i]);
                            let x = me.reg(t);
                            me.emit(Inst::Load { dst: x, addr: p, pred: Some(pred), other: Some(dsts[i]) });
                            x
                        })
                        .collect()
                };
                let off = me.stage_offset_here(sl, which, coords[0][0], coords[0][1], size);
                out.push((off, vals));
            });
        }
        out
    }

    /// Register staging: stores fetched groups into the stage at byte `base` (a register).
    fn commit_step(&mut self, fetched: &[(Reg, Vec<Reg>)], base: Reg) {
        for (off, vals) in fetched {
            let at = self.bin(BinaryOp::Add, *off, base);
            if vals.len() == 1 {
                self.emit(Inst::SharedStore { offset: at, value: vals[0], pred: None });
            } else {
                self.emit(Inst::SharedVStore { offset: at, values: vals.clone() });
            }
        }
    }

    /// The pipelined K loop (see `pipeline_plan`): `stages - 1` steps are in flight while one
    /// computes. Before the loop the first `stages - 1` steps' copies are issued; each iteration
    /// waits for its own step, meets the program (so the stage the next copies overwrite has
    /// been read by everyone), issues the copies of step `i + stages - 1`, and runs `ldmatrix` +
    /// `mma` on its stage.
    pub(super) fn pipelined_for(&mut self, op: Op, plan: Pipeline) {
        let OpKind::For { lower, upper, step, init, body } = self.func.ops[op].kind.clone() else { unreachable!() };
        let l = plan.layout;
        let s = plan.stages;
        let (lo, hi, stp) = (self.held(lower)[0], self.held(upper)[0], self.held(step)[0]);
        let at = self.func.ty(plan.a.value).clone();
        let ab = stype(&at);
        let kk = at.shape[1];
        let (sl, stage_bytes, align) = self.stage_layout(&plan);
        let stages_at = self.shared_alloc("pipeline.stages", s * stage_bytes, align);
        if plan.specialized {
            return self.specialized_for(op, &plan, sl, stages_at, stage_bytes);
        }
        let iv_arg = self.func.blocks[body].args[0];
        let acc_arg = self.func.blocks[body].args[1];
        let acc0 = self.held_mma(init[0], l);
        // Prologue: steps 0 .. stages - 2, after a barrier: the stages overlap whatever shared
        // memory earlier ops used, which other threads may still be reading.
        self.emit(Inst::Barrier);
        let registers = plan.strategy == Strategy::Registers;
        let tma = plan.strategy == Strategy::Tma;
        // With `wgmma` and 4 or more stages, one barrier per step suffices: copies run `s - 2`
        // steps ahead and refill the stage the group before last read (see below).
        let single = plan.wgmma && s >= 4;
        let dist = if single { s - 2 } else { s - 1 };
        // TMA: one mbarrier per stage, one arrival (the issuing thread's) per phase; the phase
        // of step j is j / s, so its parity is (j / s) & 1.
        let (bars_at, leader) = if tma {
            let at = self.shared_alloc("pipeline.mbarriers", 8 * s, 8);
            (at, self.init_mbarriers(&[(at, 1)], s))
        } else {
            (0, Reg(0))
        };
        for st in 0..dist {
            let k = self.bin_c(BinaryOp::Mul, stp, st as i64);
            let iv = self.bin(BinaryOp::Add, lo, k);
            let valid = self.reg(SType::Pred);
            self.emit(Inst::Cmp { dst: valid, op: CmpOp::Lt, a: iv, b: hi });
            let base = self.iconst((stages_at + st * stage_bytes) as i64);
            if tma {
                let pred = self.bin(BinaryOp::And, valid, leader);
                let bar = self.iconst((bars_at + 8 * st) as i64);
                self.tma_issue(&plan, iv_arg, iv, pred, base, bar, sl);
            } else if registers {
                let fetched = self.fetch_step(&plan, iv_arg, iv, valid, sl);
                self.commit_step(&fetched, base);
            } else {
                self.issue_stage(&plan, iv_arg, iv, valid, base, sl);
                self.emit(Inst::AsyncCommit);
            }
        }
        if registers {
            self.emit(Inst::Barrier);
        }
        // A promotion's fresh partial: a false `scale_d`, and zeros as the ignored input.
        let (zeros, fresh) = if plan.promotion.is_some() {
            let zero_f = self.konst(SType::F32, Literal::Float(0.0));
            let zero_i = self.iconst(0);
            (vec![zero_f; l.slots() as usize], self.cmp_raw(CmpOp::Ne, zero_i, zero_i))
        } else {
            (Vec::new(), Reg(0))
        };
        // The loop: phis are the accumulator and the step counter j.
        let iv = self.reg(I32);
        let j = self.reg(I32);
        let phis: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        let saved = std::mem::take(&mut self.cur);
        let memo = self.memo.clone();
        self.hoist =
            Some(super::Hoist { variant: self.loop_variant(body), insts: Vec::new(), memo: HashMap::default() });
        self.vals.insert(iv_arg, vec![iv]);
        self.mma_held.insert(acc_arg, (l, phis.clone()));
        if tma {
            // The stage a refill overwrites was read by a group every warpgroup has waited for
            // (as below); the data of this step is awaited on its mbarrier after the refill.
            if single {
                self.emit(Inst::WgmmaWait { pending: 1 });
                self.emit(Inst::Barrier);
            }
        } else if !registers {
            self.emit(Inst::AsyncWait { pending: dist - 1 });
            if plan.wgmma {
                // `wgmma` reads the stage through the async proxy.
                self.emit(Inst::FenceProxyAsync);
            }
            if single {
                // The group before last is done in this warpgroup (the last one, j - 1, keeps
                // the tensor cores busy through the barrier and the copies).
                self.emit(Inst::WgmmaWait { pending: 1 });
            }
            self.emit(Inst::Barrier);
        }
        let ahead = self.bin_c(BinaryOp::Mul, stp, dist as i64);
        let next_iv = self.bin(BinaryOp::Add, iv, ahead);
        let valid = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: valid, op: CmpOp::Lt, a: next_iv, b: hi });
        let stage_of = |me: &mut Self, x: Reg| me.ring_slot(x, s, stages_at, stage_bytes);
        let jn = self.bin_c(BinaryOp::Add, j, dist as i64);
        let next_base = stage_of(self, jn);
        let bar_of = |me: &mut Self, x: Reg| me.ring_slot(x, s, bars_at, 8);
        let nexts_acc = if tma {
            let base = stage_of(self, j);
            let pred = self.bin(BinaryOp::And, valid, leader);
            let (next_bar, bar) = (bar_of(self, jn), bar_of(self, j));
            let parity = self.ring_parity(j, s);
            if let Some(p) = plan.promotion {
                // A fresh partial of this K block (the first `wgmma` ignores its input), done
                // before the copies are issued; then it is added into the accumulator with its
                // scale, which the copies' flight covers. The refill's stage was read by a
                // group every warpgroup has waited for (each waits for all of its groups).
                self.emit(Inst::MbarrierWait { offset: bar, parity });
                let part = self.wgmma_steps(l, sl, base, zeros.clone(), Some(0), Some(fresh));
                if !single {
                    self.emit(Inst::Barrier);
                }
                self.tma_issue(&plan, iv_arg, next_iv, pred, next_base, next_bar, sl);
                self.promote(l, p, &part, &phis)
            } else if single {
                // This step's group is issued first, so the tensor cores go on from group
                // j - 1 to it without waiting for the copies' issue; then step j + s - 2
                // refills stage (j - 2) % s, which group j - 2 read: every warpgroup waited
                // for it before the barrier above.
                self.emit(Inst::MbarrierWait { offset: bar, parity });
                let acc = self.wgmma_steps(l, sl, base, phis.clone(), None, None);
                self.tma_issue(&plan, iv_arg, next_iv, pred, next_base, next_bar, sl);
                acc
            } else {
                // This step's group stays in flight while step j + s - 1 refills the stage the
                // previous group read, once every warpgroup has waited for that group.
                self.emit(Inst::MbarrierWait { offset: bar, parity });
                let acc = self.wgmma_steps(l, sl, base, phis.clone(), Some(1), None);
                self.emit(Inst::Barrier);
                self.tma_issue(&plan, iv_arg, next_iv, pred, next_base, next_bar, sl);
                acc
            }
        } else if registers {
            // Next step's loads in flight during this step's atoms; stored to the other stage
            // (read one step ago, before the last barrier), then everyone meets.
            let fetched = self.fetch_step(&plan, iv_arg, next_iv, valid, sl);
            let base = stage_of(self, j);
            let (strides, b_off) = sl.padded();
            let acc = self.mma_steps(l, ab, kk, strides, b_off, (base, None), phis.clone(), false);
            self.commit_step(&fetched, next_base);
            self.emit(Inst::Barrier);
            acc
        } else {
            let base = stage_of(self, j);
            if single {
                // Step j + s - 2 refills stage (j - 2) % s, which group j - 2 read: every
                // warpgroup waited for it before the barrier above.
                self.issue_stage(&plan, iv_arg, next_iv, valid, next_base, sl);
                self.emit(Inst::AsyncCommit);
                self.wgmma_steps(l, sl, base, phis.clone(), None, None)
            } else if plan.wgmma {
                // This step's wgmmas are issued first and stay in flight (one group) while the
                // program refills the stage the previous step's group read: once every
                // warpgroup has waited for that group, the barrier lets the copies in.
                let acc = self.wgmma_steps(l, sl, base, phis.clone(), Some(1), None);
                self.emit(Inst::Barrier);
                self.issue_stage(&plan, iv_arg, next_iv, valid, next_base, sl);
                self.emit(Inst::AsyncCommit);
                acc
            } else {
                self.issue_stage(&plan, iv_arg, next_iv, valid, next_base, sl);
                self.emit(Inst::AsyncCommit);
                let (strides, b_off) = sl.padded();
                self.mma_steps(l, ab, kk, strides, b_off, (base, None), phis.clone(), false)
            }
        };
        let j1 = self.bin_c(BinaryOp::Add, j, 1);
        let body_insts = std::mem::replace(&mut self.cur, saved);
        self.memo = memo;
        // The preheader: what the body's copies need that no iteration changes.
        let hoisted = self.hoist.take().map(|h| h.insts).unwrap_or_default();
        self.cur.extend(hoisted);
        let results: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        let (jr, zero) = (self.reg(I32), self.iconst(0));
        let mut all_phis = phis;
        all_phis.push(j);
        let mut inits = acc0;
        inits.push(zero);
        let mut nexts = nexts_acc;
        nexts.push(j1);
        let mut all_results = results.clone();
        all_results.push(jr);
        self.emit(Inst::Loop {
            iv,
            lo,
            hi,
            step: stp,
            phis: all_phis,
            inits,
            body: body_insts,
            nexts,
            results: all_results,
        });
        if plan.wgmma {
            self.emit(Inst::WgmmaWait { pending: 0 });
        }
        if tma {
            // No copy is in flight (steps past the loop issue none): the mbarriers end before
            // their bytes are anyone else's.
            self.end_mbarriers(&[bars_at], s, leader);
        } else if !registers {
            self.emit(Inst::AsyncWait { pending: 0 });
            self.emit(Inst::Barrier);
        }
        self.shared_free(stages_at);
        let r = self.func.ops[op].results[0];
        self.mma_held.insert(r, (l, results));
    }

    /// `acc + part * scale` slot by slot in the accumulator layout `l`, the scale evaluated at
    /// each slot's coordinates from its loads ([`Lowering::eval_loaded`]), as one FMA each
    /// (`acc + part` without a scale).
    fn promote(&mut self, l: AccLayout, p: Promotion, part: &[Reg], acc: &[Reg]) -> Vec<Reg> {
        let Some(scale) = p.scale else {
            return part.iter().zip(acc).map(|(&x, &a)| self.bin(BinaryOp::Add, a, x)).collect();
        };
        // Coordinates in the prologue (what `eval` hoists out of the loop reads them), one
        // register per distinct row and column, so that a scale read per row is loaded once
        // per row (`eval_loaded` remembers by register).
        let pos = self.mma_position(l);
        let mut at: HashMap<(usize, u32), Reg> = HashMap::default();
        (0..l.slots())
            .map(|s| {
                let o = l.offset(s);
                let c: Vec<Reg> = (0..2)
                    .map(|d| {
                        *at.entry((d, o[d])).or_insert_with(|| {
                            if o[d] == 0 {
                                return pos[d];
                            }
                            let saved = std::mem::take(&mut self.cur);
                            let r = self.bin_c(BinaryOp::Add, pos[d], o[d] as i64);
                            let defs = std::mem::replace(&mut self.cur, saved);
                            self.prologue.extend(defs);
                            r
                        })
                    })
                    .collect();
                let sc = self.eval_loaded(scale, &c);
                let sc = self.convert(sc, SType::F32);
                let d = self.reg(SType::F32);
                self.emit(Inst::Fma { dst: d, a: part[s as usize], b: sc, c: acc[s as usize] });
                d
            })
            .collect()
    }

    /// `f` with the values of `binds` (loop variables) bound to registers and a fresh memo of
    /// evaluations; the bindings and the memo are restored after.
    pub(super) fn with_bound<T>(&mut self, binds: &[(Value, Reg)], f: impl FnOnce(&mut Self) -> T) -> T {
        let saved: Vec<_> = binds.iter().map(|&(v, r)| (v, self.vals.insert(v, vec![r]))).collect();
        let memo = std::mem::take(&mut self.memo);
        let out = f(self);
        self.memo = memo;
        for (v, old) in saved.into_iter().rev() {
            match old {
                Some(r) => self.vals.insert(v, r),
                None => self.vals.remove(&v),
            };
        }
        out
    }

    /// Slot `step % slots` of a ring of `bytes`-byte slots at shared byte `at` (`step` counts
    /// from 0, so a power-of-two ring takes a mask, not a division).
    pub(super) fn ring_slot(&mut self, step: Reg, slots: u32, at: u32, bytes: u32) -> Reg {
        let r = if slots.is_power_of_two() {
            self.bin_c(BinaryOp::And, step, slots as i64 - 1)
        } else {
            self.bin_c(BinaryOp::Rem, step, slots as i64)
        };
        let r = self.bin_c(BinaryOp::Mul, r, bytes as i64);
        if at == 0 {
            r
        } else {
            self.bin_c(BinaryOp::Add, r, at as i64)
        }
    }

    /// The parity of the phase step `step` (from 0) of a ring of `slots` mbarriers waits for:
    /// `(step / slots) & 1`, by a shift where `slots` is a power of two.
    pub(super) fn ring_parity(&mut self, step: Reg, slots: u32) -> Reg {
        let phase = if slots.is_power_of_two() {
            self.bin_c(BinaryOp::Shr, step, log2(slots))
        } else {
            self.bin_c(BinaryOp::Div, step, slots as i64)
        };
        self.bin_c(BinaryOp::And, phase, 1)
    }

    /// Thread 0 initializes `stages` mbarriers of each ring (its shared byte and arrival count),
    /// then everyone meets; returns the thread-0 predicate.
    pub(super) fn init_mbarriers(&mut self, rings: &[(u32, u32)], stages: u32) -> Reg {
        let leader = self.first_thread();
        for st in 0..stages {
            for &(at, count) in rings {
                let offset = self.iconst((at + 8 * st) as i64);
                self.emit(Inst::MbarrierInit { offset, count, pred: leader });
            }
        }
        self.emit(Inst::FenceMbarrierInit);
        self.emit(Inst::Barrier);
        leader
    }

    /// Everyone meets (no copy in flight), thread 0 (`leader`) ends the `stages` mbarriers of
    /// each ring at `rings`, everyone meets again, and the rings' shared memory is free.
    pub(super) fn end_mbarriers(&mut self, rings: &[u32], stages: u32, leader: Reg) {
        self.emit(Inst::Barrier);
        for st in 0..stages {
            for &at in rings {
                let offset = self.iconst((at + 8 * st) as i64);
                self.emit(Inst::MbarrierInval { offset, pred: leader });
            }
        }
        self.emit(Inst::Barrier);
        for &at in rings.iter().rev() {
            self.shared_free(at);
        }
    }

    /// A stage's layout, its size and its alignment (bytes) for `plan`: swizzled for `wgmma`
    /// (both operands and every stage on a 1024-byte boundary, where swizzle patterns repeat),
    /// rows padded by 16 bytes for register fragments.
    pub(super) fn stage_layout(&self, plan: &Pipeline) -> (StageLayout, u32, u32) {
        let l = plan.layout;
        let kk = self.func.ty(plan.a.value).shape[1];
        if plan.wgmma {
            let elem = self.func.ty(plan.a.value).elem.dtype().expect("a scalar tile");
            let size = elem.size_bytes();
            let (sa, sb) = swizzle_widths(l, kk, size, plan.b_kmajor);
            let (a_bytes, b_bytes) = (l.m * kk * size, kk * l.n * size);
            let sl =
                StageLayout::Swizzled { m: l.m, n: l.n, kk, sa, sb, b_off: a_bytes, b_kmajor: plan.b_kmajor, elem };
            (sl, (a_bytes + b_bytes).next_multiple_of(1024), 1024)
        } else {
            let strides = [kk + 8, l.n + 8];
            let b_off = (l.m * strides[0] * 2).next_multiple_of(16);
            (StageLayout::Padded { strides, b_off }, (b_off + kk * strides[1] * 2).next_multiple_of(128), 128)
        }
    }

    /// How a warp-specialized region moves registers between its sides: with consumer
    /// ping-pong, each group is one warpgroup holding a whole 128 x 128 f32 accumulator (128
    /// registers per thread) beside its epilogue while the other group's main loop runs, which
    /// the 168 registers every thread gets at 288 or 384 threads do not hold without spills
    /// (FP8: 8 bytes dense, 584 grouped, ptxas 13.0). So the producer is a warpgroup that keeps
    /// 40 registers per thread and the consumers take 232 (2 x 232 + 40 = 504 of a
    /// sub-partition's 512 per lane; CUTLASS's warp-specialized kernels split the same way).
    /// Without ping-pong the consumers fit in 168 and the producer stays one warp.
    pub(super) fn reg_split(&self) -> Option<RegSplit> {
        self.group.map(|_| RegSplit { producer: 40, consumer: 232 })
    }

    /// The mbarrier rings and thread roles of a region with a producer warp (one beyond the
    /// kernel's `warps`), after a barrier (the stages overlap what earlier ops used): `s` "full"
    /// mbarriers (one arrival, the copy's bytes) and `s` "empty" ones, with one arrival per
    /// consumer warp (its lane 0, after the warp's wait for the group: `wgmma.wait_group` is
    /// warp-synchronous; an arrival per thread made 256 shared-memory updates a step).
    pub(super) fn producer_rings(&mut self, s: u32) -> ProducerRings {
        let consumers = self.k.warps * self.k.consumer_groups * self.k.warp_size;
        self.k.producer_warps = if self.reg_split().is_some() { 4 } else { 1 };
        self.emit(Inst::Barrier);
        let (full_at, empty_at) =
            (self.shared_alloc("pipeline.full", 8 * s, 8), self.shared_alloc("pipeline.empty", 8 * s, 8));
        let leader = self.init_mbarriers(&[(full_at, 1), (empty_at, self.k.warps)], s);
        let (producer_lane, consumer, lane0) = (self.reg(SType::Pred), self.reg(SType::Pred), self.reg(SType::Pred));
        let (first_producer, zero) = (self.iconst(consumers as i64), self.iconst(0));
        self.emit(Inst::Cmp { dst: producer_lane, op: CmpOp::Eq, a: self.tid, b: first_producer });
        self.emit(Inst::Cmp { dst: consumer, op: CmpOp::Lt, a: self.tid, b: first_producer });
        self.emit(Inst::Cmp { dst: lane0, op: CmpOp::Eq, a: self.lane, b: zero });
        let releaser = self.bin(BinaryOp::And, consumer, lane0);
        ProducerRings { full_at, empty_at, leader, producer_lane, releaser }
    }

    /// The pipelined K loop with a producer warp (`Pipeline::specialized`): warp `warps` (one
    /// beyond the layouts' warps) issues every step's TMA copies as soon as the stage is free,
    /// the `warps` consumers wait for a stage's data, run its `wgmma`s and, once the group of the
    /// step before has completed (one group stays in flight), hand that step's stage back. Each
    /// stage has a "full" mbarrier (one arrival, the copy's bytes) and an "empty" one (an
    /// arrival per consumer warp); step j uses phase j / s of both, and the producer's first
    /// round passes the empty barriers at once (waiting for the parity before the first phase).
    /// No barrier of the whole program in the loop.
    fn specialized_for(&mut self, op: Op, plan: &Pipeline, sl: StageLayout, stages_at: u32, stage_bytes: u32) {
        let OpKind::For { lower, upper, step, init, body } = self.func.ops[op].kind.clone() else { unreachable!() };
        let (l, s) = (plan.layout, plan.stages);
        let (lo, hi, stp) = (self.held(lower)[0], self.held(upper)[0], self.held(step)[0]);
        let iv_arg = self.func.blocks[body].args[0];
        let acc_arg = self.func.blocks[body].args[1];
        let acc0 = self.held_mma(init[0], l);
        let ProducerRings { full_at, empty_at, leader, producer_lane, releaser } = self.producer_rings(s);
        let zero = self.iconst(0);
        let slot = |me: &mut Self, x: Reg, at: u32, bytes: u32| me.ring_slot(x, s, at, bytes);
        let saved = std::mem::take(&mut self.cur);
        let memo = self.memo.clone();
        // The producer: wait until step j's stage is free, announce and copy.
        let (piv, pj) = (self.reg(I32), self.reg(I32));
        let parity = self.ring_parity(pj, s);
        let parity = self.bin_c(BinaryOp::Xor, parity, 1);
        let empty = slot(self, pj, empty_at, 8);
        self.emit(Inst::MbarrierWait { offset: empty, parity });
        let (full, base) = (slot(self, pj, full_at, 8), slot(self, pj, stages_at, stage_bytes));
        self.tma_issue(plan, iv_arg, piv, producer_lane, base, full, sl);
        let pj1 = self.bin_c(BinaryOp::Add, pj, 1);
        let producer_body = std::mem::take(&mut self.cur);
        self.memo = memo.clone();
        let pr = self.reg(I32);
        let producer = vec![Inst::Loop {
            iv: piv,
            lo,
            hi,
            step: stp,
            phis: vec![pj],
            inits: vec![zero],
            body: producer_body,
            nexts: vec![pj1],
            results: vec![pr],
        }];
        // The consumers: wait for step j's data, issue its group, and once the group before it
        // completed hand that step's stage back.
        let (civ, cj) = (self.reg(I32), self.reg(I32));
        let phis: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        self.vals.insert(iv_arg, vec![civ]);
        self.mma_held.insert(acc_arg, (l, phis.clone()));
        let parity = self.ring_parity(cj, s);
        let (full, base) = (slot(self, cj, full_at, 8), slot(self, cj, stages_at, stage_bytes));
        self.emit(Inst::MbarrierWait { offset: full, parity });
        let acc = self.wgmma_steps(l, sl, base, phis.clone(), Some(1), None);
        let before = self.bin_c(BinaryOp::Add, cj, s as i64 - 1);
        let released = slot(self, before, empty_at, 8);
        let not_first = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: not_first, op: CmpOp::Gt, a: cj, b: zero });
        let pred = self.bin(BinaryOp::And, not_first, releaser);
        self.emit(Inst::MbarrierArrive { offset: released, pred });
        let cj1 = self.bin_c(BinaryOp::Add, cj, 1);
        let consumer_body = std::mem::replace(&mut self.cur, saved);
        self.memo = memo;
        let results: Vec<Reg> = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
        let jr = self.reg(I32);
        let (mut all_phis, mut inits, mut nexts, mut all_results) = (phis, acc0, acc, results.clone());
        all_phis.push(cj);
        inits.push(zero);
        nexts.push(cj1);
        all_results.push(jr);
        let consumer_loop = Inst::Loop {
            iv: civ,
            lo,
            hi,
            step: stp,
            phis: all_phis,
            inits,
            body: consumer_body,
            nexts,
            results: all_results,
        };
        self.emit(Inst::Specialized {
            consumer_warps: self.k.warps,
            producer,
            consumer: vec![consumer_loop],
            pingpong: None,
            regs: self.reg_split(),
        });
        // Only the consumers from here on: every group done, then the mbarriers end.
        self.emit(Inst::WgmmaWait { pending: 0 });
        self.end_mbarriers(&[full_at, empty_at], s, leader);
        self.shared_free(stages_at);
        let r = self.func.ops[op].results[0];
        self.mma_held.insert(r, (l, results));
    }

    /// TMA: the thread(s) with `pred` announce one K step's bytes on the mbarrier at `bar` and
    /// copy its boxes (the loop variable bound to `iv`) into the stage at byte `base`: A's
    /// swizzle atoms along K, then B's along N, where `pipelined_for` lays them out.
    #[allow(clippy::too_many_arguments)]
    fn tma_issue(&mut self, plan: &Pipeline, iv_arg: Value, iv: Reg, pred: Reg, base: Reg, bar: Reg, sl: StageLayout) {
        self.tma_issue_bound(plan, &[(iv_arg, iv)], [None; 4], pred, base, bar, sl)
    }

    /// The block offsets of a TMA plan's copies: A's row and column, B's row and column.
    pub(super) fn tensor_offsets(plan: &Pipeline) -> [Value; 4] {
        let of = |o: &Operand| match o.source {
            Source::Tensor { offsets, .. } => offsets,
            Source::Pointer { .. } => unreachable!("TMA operands"),
        };
        let (a, b) = (of(&plan.a), of(&plan.b));
        [a[0], a[1], b[0], b[1]]
    }

    /// [`Lowering::tma_issue`] with the values in `binds` (loop variables) bound to registers,
    /// and the offsets of [`Lowering::tensor_offsets`] that `given` has already computed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tma_issue_bound(
        &mut self,
        plan: &Pipeline,
        binds: &[(Value, Reg)],
        given: [Option<Reg>; 4],
        pred: Reg,
        base: Reg,
        bar: Reg,
        sl: StageLayout,
    ) {
        let StageLayout::Swizzled { m, n, kk, sa, sb, b_off, b_kmajor, elem } = sl else {
            unreachable!("TMA fills swizzled stages")
        };
        let size = elem.size_bytes();
        let bytes = (m * kk + kk * n) * size;
        self.emit(Inst::MbarrierExpectTx { offset: bar, bytes, pred });
        let b_atom = if b_kmajor { n * sb } else { kk * sb };
        self.with_bound(binds, |me| {
            for (i, (operand, atom_bytes, start, width)) in
                [(plan.a, m * sa, 0, sa), (plan.b, b_atom, b_off, sb)].into_iter().enumerate()
            {
                let Source::Tensor { map, atoms, offsets } = operand.source else { unreachable!("TMA operands") };
                let row = given[2 * i].unwrap_or_else(|| me.scalar_value(offsets[0]));
                let col = given[2 * i + 1].unwrap_or_else(|| me.scalar_value(offsets[1]));
                for atom in 0..atoms {
                    let c = if atom == 0 { col } else { me.bin_c(BinaryOp::Add, col, (atom * width / size) as i64) };
                    let offset = me.bin_c(BinaryOp::Add, base, (start + atom * atom_bytes) as i64);
                    me.emit(Inst::TmaLoad { map, offset, coords: [row, c], barrier: bar, pred });
                }
            }
        })
    }

    /// One K tile on `wgmma` from the swizzled stage at byte `base` (a register): per 32 bytes
    /// of K (16 elements of 16 bits, 32 of FP8), each warpgroup's descriptors of its 64 rows of
    /// A and of B, one `m64nNk16` (`k32` for FP8); then the group is committed and (with
    /// `pending`) the warpgroup waits until at most that many groups are in flight. The
    /// accumulators returned may be read only after a wait for every group.
    pub(super) fn wgmma_steps(
        &mut self,
        l: AccLayout,
        sl: StageLayout,
        base: Reg,
        mut acc: Vec<Reg>,
        pending: Option<u32>,
        accumulate: Option<Reg>,
    ) -> Vec<Reg> {
        let StageLayout::Swizzled { m, n, kk, sa, sb, b_off, b_kmajor, elem } = sl else {
            unreachable!("wgmma reads swizzled stages")
        };
        let size = elem.size_bytes();
        // Warpgroup `g` takes rows `64 (g % groups_m)` of each band and, split along N
        // ([`Self::wgmma_split_n`]), columns `n_each (g / groups_m)` of a K-major B.
        let (groups_m, n_each) = (l.warps_m / 4, l.n / l.warps_n);
        assert!(l.warps_n == 1 || b_kmajor, "a wgmma tile splits along N only over a K-major B");
        let saved = std::mem::take(&mut self.cur);
        let group = self.bin_c(BinaryOp::Shr, self.warp, 2);
        let (group_m, group_n) = match l.warps_n {
            1 => (group, None),
            _ => (
                self.bin_c(BinaryOp::And, group, groups_m as i64 - 1),
                Some(self.bin_c(BinaryOp::Shr, group, groups_m.trailing_zeros() as i64)),
            ),
        };
        let group_rows = self.bin_c(BinaryOp::Mul, group_m, (64 * sa) as i64);
        let group_cols = group_n.map(|g| self.bin_c(BinaryOp::Mul, g, (n_each * sb) as i64));
        let defs = std::mem::replace(&mut self.cur, saved);
        self.prologue.extend(defs);
        let a_base = self.bin(BinaryOp::Add, base, group_rows);
        let b_base = match group_cols {
            Some(cols) => self.bin(BinaryOp::Add, base, cols),
            None => base,
        };
        // One instruction per band of `16 warps_m` rows ([`AccLayout::interleave_m`]): band `i`
        // holds the accumulator slots `i * n_each / 2 ..`, its A rows start `i * 16 warps_m`
        // rows on.
        let (band, per) = (16 * l.warps_m, (n_each / 2) as usize);
        let bands = l.m / band;
        self.emit(Inst::WgmmaFence);
        let u64t = SType::Int { bits: 64, signed: false };
        for k0 in (0..kk).step_by((32 / size) as usize) {
            // K-major: the instruction's 32 bytes of K lie in one swizzle row of the atom that
            // holds them.
            let kb = k0 * size;
            let a_at: Vec<Reg> = (0..bands)
                .map(|i| self.bin_c(BinaryOp::Add, a_base, ((kb / sa) * m * sa + kb % sa + i * band * sa) as i64))
                .collect();
            let (b_at, b_lbo) =
                if b_kmajor { (b_off + (kb / sb) * n * sb + kb % sb, 16) } else { (b_off + k0 * sb, kk * sb) };
            let b_at = self.bin_c(BinaryOp::Add, b_base, b_at as i64);
            let da: Vec<Reg> = a_at.iter().map(|_| self.reg(u64t)).collect();
            let db = self.reg(u64t);
            for (&dst, &offset) in da.iter().zip(&a_at) {
                self.emit(Inst::MatrixDescriptor { dst, offset, lbo: 16, sbo: 8 * sa, swizzle: sa });
            }
            self.emit(Inst::MatrixDescriptor { dst: db, offset: b_at, lbo: b_lbo, sbo: 8 * sb, swizzle: sb });
            let scale_d = if k0 == 0 { accumulate } else { None };
            let trans_b = !b_kmajor;
            let mut next = Vec::with_capacity(acc.len());
            for (i, &a) in da.iter().enumerate() {
                let d: Vec<Reg> = (0..per).map(|_| self.reg(SType::F32)).collect();
                let c = acc[i * per..(i + 1) * per].to_vec();
                self.emit(Inst::Wgmma { d: d.clone(), c, a, b: db, n: n_each, ab: elem, trans_b, scale_d });
                next.extend(d);
            }
            acc = next;
        }
        self.emit(Inst::WgmmaCommit);
        if let Some(pending) = pending {
            self.emit(Inst::WgmmaWait { pending });
        }
        acc
    }

    /// The values of loop body `body` that depend on its block arguments (the induction
    /// variable and the carried values), transitively.
    pub(super) fn loop_variant(&self, body: Block) -> std::collections::HashSet<Value> {
        let mut variant: std::collections::HashSet<Value> = self.func.blocks[body].args.iter().copied().collect();
        for &o in &self.func.blocks[body].ops {
            let data = &self.func.ops[o];
            if data.kind.operands().into_iter().any(|(_, x)| variant.contains(&x)) {
                variant.extend(data.results.iter().copied());
            }
        }
        variant
    }
}

/// What [`Lowering::producer_rings`] sets up: the rings' shared bytes, thread 0's predicate
/// (which ends them), the producer warp's issuing lane, and each consumer warp's lane 0.
pub(super) struct ProducerRings {
    pub(super) full_at: u32,
    pub(super) empty_at: u32,
    pub(super) leader: Reg,
    pub(super) producer_lane: Reg,
    pub(super) releaser: Reg,
}

/// The swizzle widths (bytes) of A's and B's stage rows: K-major A (and B with `b_kmajor`) rows
/// hold `kk` elements of `size` bytes, N-major B rows `n` of them; 128 bytes at most.
fn swizzle_widths(l: AccLayout, kk: u32, size: u32, b_kmajor: bool) -> (u32, u32) {
    let sa = (kk * size).min(128);
    (sa, if b_kmajor { sa } else { (l.n * size).min(128) })
}
