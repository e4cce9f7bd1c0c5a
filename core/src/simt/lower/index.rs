//! Index math: layouts, thread positions, element coordinates, and values recomputed at
//! any coordinates (rematerialization).

use super::*;

impl Lowering<'_> {
    pub(super) fn layout(&mut self, shape: &[u32]) -> Blocked {
        let (w, ws) = (self.k.warps, self.k.warp_size);
        if let Some(l) = self.layouts.get(shape) {
            return l.clone();
        }
        let l = Blocked::with_vector(shape, w, ws, self.vector_of(shape));
        self.layouts.insert(shape.to_vec(), l.clone());
        l
    }

    /// Contiguous elements per thread of the layout of `shape` (one layout per shape in a
    /// function): [`crate::simt::layout::MAX_VECTOR`], or with `LaunchAttrs::wide_vectors` 8
    /// for a shape whose floating-point values are all 16-bit (a bf16 tile of keys: 16-byte
    /// loads and stores). Integer, boolean and pointer tiles (offsets, masks, addresses of the
    /// same shape) do not count: they are computed, not moved.
    fn vector_of(&self, shape: &[u32]) -> u32 {
        if !self.func.attrs.wide_vectors {
            return crate::simt::layout::MAX_VECTOR;
        }
        let widest = self
            .func
            .values
            .iter()
            .filter_map(|(_, v)| match v.ty.elem {
                Elem::Num(d) if d.is_float() && v.ty.shape == shape => Some(d.size_bytes()),
                _ => None,
            })
            .max();
        match widest {
            Some(2) => 8,
            _ => crate::simt::layout::MAX_VECTOR,
        }
    }

    /// Slots a value of this type has in each thread (1 for scalars).
    pub(super) fn slots(&mut self, t: &Type) -> u32 {
        if t.is_scalar() {
            1
        } else {
            self.layout(&t.shape).slots()
        }
    }

    /// Per-dimension thread positions in layout `l` (prologue).
    pub(super) fn position_in(&mut self, l: &Blocked) -> Vec<Reg> {
        if let Some(p) = self.positions.get(l) {
            return p.clone();
        }
        let shape = l.shape.clone();
        let saved = std::mem::take(&mut self.cur);
        let pos: Vec<Reg> = (0..l.rank())
            .map(|d| {
                let lane = self.field(self.lane, l.lane_stride(d), l.threads_per_warp[d]);
                let warp = self.field(self.warp, l.warp_stride(d), l.warps_per_program[d]);
                let t = match (warp, lane) {
                    (None, None) => self.iconst(0),
                    (Some(w), None) => self.bin_c(BinaryOp::Shl, w, log2(l.threads_per_warp[d])),
                    (None, Some(ln)) => ln,
                    (Some(w), Some(ln)) => {
                        let w = self.bin_c(BinaryOp::Shl, w, log2(l.threads_per_warp[d]));
                        self.bin(BinaryOp::Or, w, ln)
                    }
                };
                let p =
                    if l.size_per_thread[d] > 1 { self.bin_c(BinaryOp::Shl, t, log2(l.size_per_thread[d])) } else { t };
                if l.program_tile(d) > shape[d] {
                    self.bin_c(BinaryOp::And, p, shape[d] as i64 - 1)
                } else {
                    p
                }
            })
            .collect();
        let defs = std::mem::replace(&mut self.cur, saved);
        self.prologue.extend(defs);
        self.positions.insert(l.clone(), pos.clone());
        pos
    }

    /// `(x / stride) % count` for powers of two, or `None` when `count` is 1.
    pub(super) fn field(&mut self, x: Reg, stride: u32, count: u32) -> Option<Reg> {
        if count == 1 {
            return None;
        }
        let s = if stride > 1 { self.bin_c(BinaryOp::Shr, x, log2(stride)) } else { x };
        Some(self.bin_c(BinaryOp::And, s, count as i64 - 1))
    }

    /// The coordinates of slot `s` of the layout of `shape` (prologue, shared between slots).
    pub(super) fn slot_coords(&mut self, shape: &[u32], s: u32) -> Vec<Reg> {
        let l = self.layout(shape);
        self.slot_coords_in(&l, s)
    }

    /// The coordinates of slot `s` of layout `l` (prologue, shared between slots).
    pub(super) fn slot_coords_in(&mut self, l: &Blocked, s: u32) -> Vec<Reg> {
        let off = l.offset(s);
        let pos = self.position_in(l);
        (0..l.rank())
            .map(|d| {
                if off[d] == 0 {
                    return pos[d];
                }
                let key = (l.clone(), d, off[d]);
                if let Some(r) = self.coords.get(&key) {
                    return *r;
                }
                let c = self.iconst(off[d] as i64);
                let r = self.reg(I32);
                self.prologue.push(Inst::Binary { dst: r, op: BinaryOp::Add, a: pos[d], b: c });
                self.coords.insert(key, r);
                r
            })
            .collect()
    }

    pub(super) fn unflatten(&mut self, e: Reg, shape: &[u32]) -> Vec<Reg> {
        let mut out = Vec::with_capacity(shape.len());
        let mut stride: u32 = shape.iter().product();
        for &d in shape {
            stride /= d;
            if d == 1 {
                out.push(self.iconst(0));
                continue;
            }
            let s = if stride > 1 { self.bin_c(BinaryOp::Shr, e, log2(stride)) } else { e };
            out.push(self.bin_c(BinaryOp::And, s, d as i64 - 1));
        }
        out
    }

    pub(super) fn flatten(&mut self, coords: &[Reg], shape: &[u32]) -> Reg {
        let mut stride: u32 = shape.iter().product();
        let mut acc: Option<Reg> = None;
        for (c, &d) in coords.iter().zip(shape) {
            stride /= d;
            if d == 1 {
                continue;
            }
            let s = if stride > 1 { self.bin_c(BinaryOp::Shl, *c, log2(stride)) } else { *c };
            acc = Some(match acc {
                Some(a) => self.bin(BinaryOp::Add, a, s),
                None => s,
            });
        }
        acc.unwrap_or_else(|| self.iconst(0))
    }

    /// True when `v` is a tree of index arithmetic that can be recomputed at any coordinates.
    pub(super) fn rematerializable(&mut self, v: Value) -> bool {
        if self.func.ty(v).is_scalar() {
            return true;
        }
        if let Some(r) = self.remat.get(&v) {
            return *r;
        }
        let ok = match self.func.values[v].def {
            ValueDef::Result { op, .. } => match &self.func.ops[op].kind {
                k if is_index_math(k) => {
                    let operands: Vec<Value> = k.operands().into_iter().map(|(_, v)| v).collect();
                    operands.into_iter().all(|o| self.rematerializable(o))
                }
                _ => false,
            },
            _ => false,
        };
        self.remat.insert(v, ok);
        ok
    }

    /// The element of the rematerializable `v` at `coords` (registers, in `v`'s shape).
    pub(super) fn eval(&mut self, v: Value, coords: &[Reg]) -> Reg {
        let t = self.func.ty(v).clone();
        if t.is_scalar() {
            return self.scalar_value(v);
        }
        let key = (v, coords.to_vec());
        if let Some(mut h) = self.hoist.take() {
            if !h.variant.contains(&v) {
                // Loop-invariant: evaluated once before the loop (coordinates are prologue
                // registers, so the evaluation only reads what dominates the loop).
                let r = match h.memo.get(&key) {
                    Some(r) => *r,
                    None => {
                        let (cur, memo) = (std::mem::take(&mut self.cur), std::mem::take(&mut self.memo));
                        let r = self.eval(v, coords);
                        h.insts.extend(std::mem::replace(&mut self.cur, cur));
                        self.memo = memo;
                        h.memo.insert(key, r);
                        r
                    }
                };
                self.hoist = Some(h);
                return r;
            }
            self.hoist = Some(h);
        }
        if let Some(r) = self.memo.get(&key) {
            return *r;
        }
        let ValueDef::Result { op, .. } = self.func.values[v].def else { unreachable!("checked by rematerializable") };
        let r = match self.func.ops[op].kind.clone() {
            OpKind::Arange { start, .. } => {
                if start == 0 {
                    coords[0]
                } else {
                    self.bin_c(BinaryOp::Add, coords[0], start)
                }
            }
            OpKind::Splat(x) => self.scalar_value(x),
            k @ (OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Cmp { .. }
            | OpKind::Select { .. }
            | OpKind::Cast(_)
            | OpKind::AddPtr { .. }) => {
                let srcs: Vec<Reg> = k.operands().into_iter().map(|(_, x)| self.eval(x, coords)).collect();
                self.elementwise(&k, v, &srcs)
            }
            k @ (OpKind::Broadcast(_) | OpKind::Reshape(_) | OpKind::Transpose { .. }) => {
                let (x, c) = self.moved_from(&k, coords, &t.shape);
                self.eval(x, &c)
            }
            _ => unreachable!("checked by rematerializable"),
        };
        self.memo.insert(key, r);
        r
    }

    /// The element at `coords` of `v`, computed from loads and index math (a [`super::pipeline`]
    /// promotion's scale, in a loop body whose ops are not lowered): each load is issued at the
    /// coordinates' address (masked lanes read `other`, else 0), once per distinct address
    /// expression; the rest as [`Lowering::eval`] does.
    pub(super) fn eval_loaded(&mut self, v: Value, coords: &[Reg]) -> Reg {
        let t = self.func.ty(v).clone();
        let coords: Vec<Reg> = if t.is_scalar() { Vec::new() } else { coords.to_vec() };
        let ValueDef::Result { op, .. } = self.func.values[v].def else { return self.eval(v, &coords) };
        let kind = self.func.ops[op].kind.clone();
        let has_load = |me: &Self, x: Value| me.reads_memory(x);
        if !has_load(self, v) {
            return self.eval(v, &coords);
        }
        let key = (v, coords.clone());
        if let Some(r) = self.memo.get(&key) {
            return *r;
        }
        let r = match kind {
            OpKind::Load { ptr, mask, other } => {
                let st = stype(&t);
                let addr = self.eval_loaded(ptr, &coords);
                let pred = mask.map(|m| self.eval_loaded(m, &coords));
                let other = match (pred, other) {
                    (None, _) => None,
                    (Some(_), Some(o)) => Some(self.eval_loaded(o, &coords)),
                    (Some(_), None) => Some(self.konst(st, Literal::Int(0))),
                };
                let dst = self.reg(st);
                self.emit(Inst::Load { dst, addr, pred, other });
                dst
            }
            k @ (OpKind::Broadcast(_) | OpKind::Reshape(_) | OpKind::Transpose { .. }) => {
                let (x, c) = self.moved_from(&k, &coords, &t.shape);
                self.eval_loaded(x, &c)
            }
            OpKind::Splat(x) => self.eval_loaded(x, &[]),
            k @ (OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Cmp { .. }
            | OpKind::Select { .. }
            | OpKind::Cast(_)
            | OpKind::AddPtr { .. }) => {
                let srcs: Vec<Reg> = k.operands().into_iter().map(|(_, x)| self.eval_loaded(x, &coords)).collect();
                self.elementwise(&k, v, &srcs)
            }
            k => unreachable!("`{}` in a promotion's scale (checked by `promotion_of`)", k.mnemonic()),
        };
        self.memo.insert(key, r);
        r
    }

    /// The operand of a data-movement op (`kind`: broadcast, reshape, transpose; result shape
    /// `shape`) and its coordinates of the result's element at `coords`.
    fn moved_from(&mut self, kind: &OpKind, coords: &[Reg], shape: &[u32]) -> (Value, Vec<Reg>) {
        match kind {
            OpKind::Broadcast(x) => {
                let src = self.func.ty(*x).shape.clone();
                let c = coords.iter().zip(&src).map(|(&c, &d)| if d == 1 { self.iconst(0) } else { c }).collect();
                (*x, c)
            }
            OpKind::Reshape(x) => {
                let src = self.func.ty(*x).shape.clone();
                (*x, self.reshape_coords(coords, shape, &src))
            }
            OpKind::Transpose { x, perm } => (*x, permute_back(coords, perm)),
            k => unreachable!("`{}` moves no data", k.mnemonic()),
        }
    }

    /// Whether computing `v` reads memory (a `load` among the ops that make it).
    fn reads_memory(&self, v: Value) -> bool {
        let ValueDef::Result { op, .. } = self.func.values[v].def else { return false };
        let kind = &self.func.ops[op].kind;
        matches!(kind, OpKind::Load { .. }) || kind.operands().into_iter().any(|(_, x)| self.reads_memory(x))
    }

    /// A scalar's register: as lowered, or (for pure scalar ops not lowered at this point, as in
    /// a software-pipelined loop body) recomputed here.
    pub(super) fn scalar_value(&mut self, v: Value) -> Reg {
        if let Some(r) = self.vals.get(&v) {
            return r[0];
        }
        if let Some(r) = self.memo.get(&(v, Vec::new())) {
            return *r;
        }
        let ValueDef::Result { op, .. } = self.func.values[v].def else { return self.held(v)[0] };
        let st = stype(self.func.ty(v));
        let r = match self.func.ops[op].kind.clone() {
            OpKind::Const(value) => self.konst(st, value),
            OpKind::ProgramId(a) | OpKind::NumPrograms(a) => {
                let dst = self.reg(I32);
                let which = if matches!(self.func.ops[op].kind, OpKind::ProgramId(_)) {
                    Special::ProgramId(a)
                } else {
                    Special::NumPrograms(a)
                };
                self.emit(Inst::Special { dst, which });
                dst
            }
            k @ (OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Cmp { .. }
            | OpKind::Select { .. }
            | OpKind::Cast(_)
            | OpKind::AddPtr { .. }) => {
                let srcs: Vec<Reg> = k.operands().into_iter().map(|(_, x)| self.scalar_value(x)).collect();
                self.elementwise(&k, v, &srcs)
            }
            // A scalar read of a parameter the kernel never writes (a tile's record in a
            // schedule table): one load, masked lanes taking `other` (0 without one).
            OpKind::Load { ptr, mask, other } if self.read_only_scalar_load(op) => {
                let addr = self.scalar_value(ptr);
                let pred = mask.map(|m| self.scalar_value(m));
                let other =
                    other.map(|o| self.scalar_value(o)).or_else(|| pred.map(|_| self.konst(st, Literal::Int(0))));
                let dst = self.reg(st);
                self.emit(Inst::Load { dst, addr, pred, other });
                dst
            }
            // Kernel parameters the runtime adds (an AG-GEMM's rank swizzle).
            OpKind::Rank => return self.hidden[super::Hidden::Rank.position()],
            OpKind::NumRanks => return self.hidden[super::Hidden::NumRanks.position()],
            _ => return self.held(v)[0],
        };
        self.memo.insert((v, Vec::new()), r);
        r
    }

    /// Whether `op` is a load of one scalar through a pointer into a parameter that the kernel
    /// only ever reads (every use of a pointer derived from it is pointer arithmetic or a
    /// load): its value cannot change while the kernel runs, so it may be read again, earlier
    /// or by other threads, as index math is (a persistent tile loop's records). The lowering
    /// may evaluate such index math for tiles past the loop's end (a producer reading ahead):
    /// the kernel keeps those reads in bounds (clamped indices). As for every parameter fact,
    /// the parameters are taken not to alias (a buffer passed as this parameter and as one the
    /// kernel writes would break it, as it breaks Triton's and CUDA's `__restrict__`).
    pub(super) fn read_only_scalar_load(&self, op: Op) -> bool {
        let OpKind::Load { ptr, .. } = self.func.ops[op].kind else { return false };
        if !self.func.ty(ptr).is_scalar() {
            return false;
        }
        let Some(p) = self.func.root_param(ptr, false) else { return false };
        self.func.ops.iter().all(|(_, o)| match &o.kind {
            OpKind::AddPtr { .. } | OpKind::Load { .. } => true,
            k => k.operands().into_iter().all(|(_, v)| self.func.root_param(v, false) != Some(p)),
        })
    }

    /// Coordinates in `src` of the element at `coords` in `dst` (same elements, row-major).
    pub(super) fn reshape_coords(&mut self, coords: &[Reg], dst: &[u32], src: &[u32]) -> Vec<Reg> {
        let strip = |s: &[u32]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<u32>>();
        if strip(dst) == strip(src) {
            let mut kept = coords.iter().zip(dst).filter(|(_, &d)| d != 1).map(|(c, _)| *c);
            return src
                .iter()
                .map(|&d| if d == 1 { self.iconst(0) } else { kept.next().expect("same dims") })
                .collect();
        }
        let f = self.flatten(coords, dst);
        self.unflatten(f, src)
    }

    /// The slots of the rematerializable `v` in its own layout.
    pub(super) fn own_slots(&mut self, v: Value, shape: &[u32]) -> Vec<Reg> {
        let n = self.layout(shape).slots();
        (0..n)
            .map(|s| {
                let c = self.slot_coords(shape, s);
                self.eval(v, &c)
            })
            .collect()
    }
}
