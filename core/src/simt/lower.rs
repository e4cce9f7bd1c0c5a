//! Layout assignment and lowering of the tile IR to the SIMT IR.
//!
//! Every tile value gets the default [`Blocked`] layout of its shape (`layout.rs`): elementwise ops
//! between tiles of one shape move no data, and a thread's slot coordinates are a per-thread
//! position (computed once, in the kernel's prologue) plus constants.
//!
//! * Layout changes (broadcast, reshape, transpose) *rematerialize* cheap values (trees of index
//!   arithmetic over `arange`, splats and scalars) at the coordinates the consumer's layout needs,
//!   so `rows[:, None] * stride + cols[None, :]` costs no data movement; reshapes between layouts
//!   that hold the same elements are free; anything else goes through shared memory.
//! * Loads and stores whose pointers are contiguous over a thread's vector (`contiguity.rs`)
//!   become vector accesses (`ld.global.v4`), taken at run time when the group's address is
//!   aligned and its mask is all true, with a scalar fallback for the rest (edges, odd strides).
//! * Reductions fold a thread's slots, then butterfly shuffles across the lanes along the axis,
//!   then shared memory across warps (which also delivers the result in its own layout).
//! * `dot` stages both operands in shared memory and runs an FMA loop over K, loading each
//!   distinct row of A and column of B once per step (tensor-core paths come later).
//! * `put`/`get`/`put_signal` copy through peer addresses (`symm_at`) with the whole program;
//!   `barrier_all` is a generation barrier on the runtime's `__barrier` words.
//!
//! Scalars are one uniform register, and `for`/`if`/`while` (whose conditions are scalars) are
//! uniform control flow.

mod arith;
mod atomic;
mod dot;
mod elementwise;
mod pipeline;
mod shared;
mod support;

use super::contiguity::Contiguity;
use super::layout::{same_elements, AccLayout, Blocked};
use super::{Hidden, Inst, Kernel, Reg, SType, Special};
use crate::ir::*;
use crate::target::{AsyncCopy, TargetDesc};
use std::collections::{BTreeMap, HashMap};

/// Why a function cannot be lowered (yet): the op and where it is.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LowerError {
    #[error("`{op}`{}: not supported by the SIMT lowering yet: {reason}", loc.map(|l| format!(" (line {}:{})", l.line, l.col)).unwrap_or_default())]
    Unsupported { op: String, loc: Option<Loc>, reason: String },
    #[error("kernel `{kernel}` needs {bytes} bytes of shared memory per program; {target} allows {limit} (smaller tiles, or fewer stages)")]
    SharedMemory { kernel: String, bytes: u32, limit: u32, target: &'static str },
    #[error(
        "kernel `{kernel}` has {threads} threads per program ({warps} warps of {warp_size}); {target} allows {limit}"
    )]
    Threads { kernel: String, threads: u32, warps: u32, warp_size: u32, limit: u32, target: &'static str },
}

const I32: SType = SType::Int { bits: 32, signed: true };
const U64: SType = SType::Int { bits: 64, signed: false };

/// Bytes a value of this type takes in shared memory.
pub fn shared_size(t: SType) -> u32 {
    match t {
        SType::Pred => 1,
        SType::Int { bits, .. } => (bits as u32 / 8).max(1),
        SType::F16 | SType::BF16 => 2,
        SType::F32 => 4,
        SType::F64 | SType::Ptr => 8,
    }
}

fn stype(t: &Type) -> SType {
    match t.elem {
        Elem::Ptr(_) => SType::Ptr,
        Elem::Num(d) => SType::of(d),
        Elem::Token => U64,
    }
}

fn log2(x: u32) -> i64 {
    x.trailing_zeros() as i64
}

struct Lowering<'f> {
    func: &'f Function,
    target: &'static TargetDesc,
    k: Kernel,
    cur: Vec<Inst>,
    /// Thread-invariant definitions (constants, slot coordinates), placed before the body.
    prologue: Vec<Inst>,
    vals: HashMap<Value, Vec<Reg>>,
    tid: Reg,
    lane: Reg,
    warp: Reg,
    smem: shared::SharedAlloc,
    /// Registers of the hidden parameters (`super::HIDDEN_PARAMS`).
    hidden: Vec<Reg>,
    consts: HashMap<i64, Reg>,
    layouts: HashMap<Vec<u32>, Blocked>,
    positions: HashMap<Blocked, Vec<Reg>>,
    coords: HashMap<(Blocked, usize, u32), Reg>,
    /// Rematerialized values at coordinates, valid in the region being lowered.
    memo: HashMap<(Value, Vec<Reg>), Reg>,
    remat: HashMap<Value, bool>,
    contiguity: Contiguity<'f>,
    /// Values held in a tensor-core accumulator layout instead of their shape's blocked one
    /// (`dot` results and the loop-carried accumulators feeding them).
    mma_held: HashMap<Value, (AccLayout, Vec<Reg>)>,
    mma_positions: HashMap<AccLayout, [Reg; 2]>,
    warp_origins: HashMap<AccLayout, [Reg; 2]>,
    /// Lane parts of lane maps, by the identity of the map's fields.
    lane_parts: HashMap<(usize, usize, usize, usize), [Reg; 2]>,
    /// Constants defined in the prologue, by (type, bits, is float).
    typed_consts: HashMap<(SType, u64, bool), Reg>,
    /// The value of every integer constant register.
    const_ints: HashMap<Reg, i64>,
    /// Values that some op or block uses (a result nobody reads needs no delivery).
    used: std::collections::HashSet<Value>,
}

/// Lowers a verified function for a target.
pub fn lower(func: &Function, target: &'static TargetDesc) -> Result<Kernel, LowerError> {
    support::check(func)?;
    let threads = func.attrs.warps * target.warp_size;
    if threads > target.max_threads {
        return Err(LowerError::Threads {
            kernel: func.name.clone(),
            threads,
            warps: func.attrs.warps,
            warp_size: target.warp_size,
            limit: target.max_threads,
            target: target.name,
        });
    }
    let mut params: Vec<(String, SType)> =
        func.params.iter().map(|p| (p.name.clone(), stype(func.ty(p.value)))).collect();
    params.extend(super::HIDDEN_PARAMS.iter().map(|(n, t)| (n.to_string(), *t)));
    let k = Kernel {
        name: func.name.clone(),
        params,
        regs: Vec::new(),
        body: Vec::new(),
        warps: func.attrs.warps,
        warp_size: target.warp_size,
        shared_bytes: 0,
        shared_objects: Vec::new(),
    };
    let mut l = Lowering {
        func,
        target,
        k,
        cur: Vec::new(),
        prologue: Vec::new(),
        vals: HashMap::new(),
        tid: Reg(0),
        lane: Reg(0),
        warp: Reg(0),
        smem: shared::SharedAlloc::default(),
        hidden: Vec::new(),
        consts: HashMap::new(),
        layouts: HashMap::new(),
        positions: HashMap::new(),
        coords: HashMap::new(),
        memo: HashMap::new(),
        remat: HashMap::new(),
        contiguity: Contiguity::analyse(func),
        mma_held: HashMap::new(),
        mma_positions: HashMap::new(),
        warp_origins: HashMap::new(),
        lane_parts: HashMap::new(),
        typed_consts: HashMap::new(),
        const_ints: HashMap::new(),
        used: used_values(func),
    };
    let mut head = Vec::new();
    l.tid = l.reg(I32);
    head.push(Inst::Special { dst: l.tid, which: Special::ThreadId });
    for (i, p) in func.params.iter().enumerate() {
        let r = l.reg(l.k.params[i].1);
        head.push(Inst::Param { dst: r, index: i as u32 });
        l.vals.insert(p.value, vec![r]);
    }
    for i in func.params.len()..l.k.params.len() {
        let r = l.reg(l.k.params[i].1);
        head.push(Inst::Param { dst: r, index: i as u32 });
        l.hidden.push(r);
    }
    let ws = target.warp_size as i64;
    let (mask, shift) = (l.iconst(ws - 1), l.iconst(log2(target.warp_size)));
    l.lane = l.reg(I32);
    l.warp = l.reg(I32);
    l.prologue.push(Inst::Binary { dst: l.lane, op: BinaryOp::And, a: l.tid, b: mask });
    l.prologue.push(Inst::Binary { dst: l.warp, op: BinaryOp::Shr, a: l.tid, b: shift });
    l.block(func.body)?;
    head.append(&mut l.prologue);
    head.append(&mut l.cur);
    l.k.body = head;
    super::passes::clean(&mut l.k);
    l.k.shared_bytes = l.smem.high;
    l.k.shared_objects = std::mem::take(&mut l.smem.objects);
    if l.k.shared_bytes > target.shared_bytes {
        return Err(LowerError::SharedMemory {
            kernel: func.name.clone(),
            bytes: l.k.shared_bytes,
            limit: target.shared_bytes,
            target: target.name,
        });
    }
    Ok(l.k)
}

impl Lowering<'_> {
    fn reg(&mut self, t: SType) -> Reg {
        self.k.regs.push(t);
        Reg(self.k.regs.len() as u32 - 1)
    }

    fn emit(&mut self, i: Inst) {
        self.cur.push(i);
    }

    /// Marks where the instructions of `op` begin ([`Inst::Origin`]); a marker followed by
    /// nothing is replaced.
    fn origin(&mut self, op: Op) {
        let d = &self.func.ops[op];
        let mark = Inst::Origin { op: op.index() as u32, what: d.kind.mnemonic(), loc: d.loc };
        match self.cur.last_mut() {
            Some(last @ Inst::Origin { .. }) => *last = mark,
            _ => self.cur.push(mark),
        }
    }

    fn threads(&self) -> u32 {
        self.k.threads()
    }

    /// An i32 constant (defined once, in the prologue).
    fn iconst(&mut self, v: i64) -> Reg {
        if let Some(r) = self.consts.get(&v) {
            return *r;
        }
        let r = self.reg(I32);
        self.prologue.push(Inst::Const { dst: r, value: Literal::Int(v) });
        self.consts.insert(v, r);
        self.const_ints.insert(r, v);
        r
    }

    fn bin(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        let t = self.k.ty(a);
        let r = self.reg(t);
        self.emit(Inst::Binary { dst: r, op, a, b });
        r
    }

    fn bin_c(&mut self, op: BinaryOp, a: Reg, c: i64) -> Reg {
        let b = self.iconst(c);
        self.bin(op, a, b)
    }

    fn cast(&mut self, r: Reg, t: SType) -> Reg {
        if self.k.ty(r) == t {
            return r;
        }
        let d = self.reg(t);
        self.emit(Inst::Cast { dst: d, src: r });
        d
    }

    fn layout(&mut self, shape: &[u32]) -> Blocked {
        let (w, ws) = (self.k.warps, self.k.warp_size);
        self.layouts.entry(shape.to_vec()).or_insert_with(|| Blocked::default_for(shape, w, ws)).clone()
    }

    /// Slots a value of this type has in each thread (1 for scalars).
    fn slots(&mut self, t: &Type) -> u32 {
        if t.is_scalar() {
            1
        } else {
            self.layout(&t.shape).slots()
        }
    }

    /// Per-dimension thread positions in layout `l` (prologue).
    fn position_in(&mut self, l: &Blocked) -> Vec<Reg> {
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
    fn field(&mut self, x: Reg, stride: u32, count: u32) -> Option<Reg> {
        if count == 1 {
            return None;
        }
        let s = if stride > 1 { self.bin_c(BinaryOp::Shr, x, log2(stride)) } else { x };
        Some(self.bin_c(BinaryOp::And, s, count as i64 - 1))
    }

    /// The coordinates of slot `s` of the layout of `shape` (prologue, shared between slots).
    fn slot_coords(&mut self, shape: &[u32], s: u32) -> Vec<Reg> {
        let l = self.layout(shape);
        self.slot_coords_in(&l, s)
    }

    /// The coordinates of slot `s` of layout `l` (prologue, shared between slots).
    fn slot_coords_in(&mut self, l: &Blocked, s: u32) -> Vec<Reg> {
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

    fn unflatten(&mut self, e: Reg, shape: &[u32]) -> Vec<Reg> {
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

    fn flatten(&mut self, coords: &[Reg], shape: &[u32]) -> Reg {
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

    /// A shared-memory byte offset: `base + index * size`.
    fn shared_offset(&mut self, index: Reg, size: u32, base: u32) -> Reg {
        let off = if size > 1 { self.bin_c(BinaryOp::Shl, index, log2(size)) } else { index };
        if base > 0 {
            self.bin_c(BinaryOp::Add, off, base as i64)
        } else {
            off
        }
    }

    /// Writes a tile's elements into shared memory at `base` (row-major).
    fn stage_in_shared(&mut self, regs: &[Reg], shape: &[u32], base: u32) {
        let size = shared_size(self.k.ty(regs[0]));
        for (s, &r) in regs.iter().enumerate() {
            let c = self.slot_coords(shape, s as u32);
            let f = self.flatten(&c, shape);
            let off = self.shared_offset(f, size, base);
            self.emit(Inst::SharedStore { offset: off, value: r, pred: None });
        }
    }

    fn shared_load(&mut self, t: SType, index: Reg, base: u32) -> Reg {
        let off = self.shared_offset(index, shared_size(t), base);
        let d = self.reg(t);
        self.emit(Inst::SharedLoad { dst: d, offset: off });
        d
    }

    /// Re-distributes `src` (shape `src_shape`) into the layout of `dst_shape`: the element at
    /// coordinates `c` is the source element at `map(c)`.
    fn relayout(
        &mut self,
        src: &[Reg],
        src_shape: &[u32],
        dst_shape: &[u32],
        map: &dyn Fn(&mut Self, &[Reg]) -> Vec<Reg>,
    ) -> Vec<Reg> {
        let t = self.k.ty(src[0]);
        let n: u32 = src_shape.iter().product();
        let o = self.shared_alloc("relayout", n * shared_size(t), 16);
        self.emit(Inst::Barrier);
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

    /// `v`'s registers in its shape's blocked layout (a tensor-core accumulator is converted
    /// through shared memory, at this point of the program).
    fn held(&mut self, v: Value) -> Vec<Reg> {
        if let Some(r) = self.vals.get(&v) {
            return r.clone();
        }
        let (l, regs) = self.mma_held[&v].clone();
        self.mma_to_blocked(l, &regs)
    }

    fn block(&mut self, b: Block) -> Result<(), LowerError> {
        for &op in &self.func.blocks[b].ops {
            self.op(op)?;
        }
        Ok(())
    }

    /// Lowers a region into a fresh instruction list; returns it and the yielded registers
    /// (yield `i` in the accumulator layout `mma[i]` where given, else blocked).
    fn region(&mut self, b: Block, mma: &[Option<AccLayout>]) -> Result<(Vec<Inst>, Vec<Reg>), LowerError> {
        let saved = std::mem::take(&mut self.cur);
        let memo = self.memo.clone();
        let r = self.block(b);
        let yields = if r.is_ok() {
            let ys = self.func.blocks[b].yields.clone();
            let mut out = Vec::new();
            for (i, v) in ys.into_iter().enumerate() {
                match mma.get(i).copied().flatten() {
                    Some(l) => out.extend(self.held_mma(v, l)),
                    None => out.extend(self.held(v)),
                }
            }
            out
        } else {
            Vec::new()
        };
        let body = std::mem::replace(&mut self.cur, saved);
        self.memo = memo;
        r?;
        Ok((body, yields))
    }

    /// Fresh registers for the slots of values of the given types.
    fn slots_of(&mut self, types: &[Type]) -> Vec<Vec<Reg>> {
        types
            .iter()
            .map(|t| {
                let n = self.slots(t);
                (0..n).map(|_| self.reg(stype(t))).collect()
            })
            .collect()
    }

    /// True when `v` is a tree of index arithmetic that can be recomputed at any coordinates.
    fn rematerializable(&mut self, v: Value) -> bool {
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
    fn eval(&mut self, v: Value, coords: &[Reg]) -> Reg {
        let t = self.func.ty(v).clone();
        if t.is_scalar() {
            return self.scalar_value(v);
        }
        let key = (v, coords.to_vec());
        if let Some(r) = self.memo.get(&key) {
            return *r;
        }
        let ValueDef::Result { op, .. } = self.func.values[v].def else { unreachable!("checked by rematerializable") };
        let st = stype(&t);
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
                self.elementwise(&k, st, &srcs)
            }
            OpKind::Broadcast(x) => {
                let src = self.func.ty(x).shape.clone();
                let c: Vec<Reg> =
                    coords.iter().zip(&src).map(|(&c, &d)| if d == 1 { self.iconst(0) } else { c }).collect();
                self.eval(x, &c)
            }
            OpKind::Reshape(x) => {
                let src = self.func.ty(x).shape.clone();
                let c = self.reshape_coords(coords, &t.shape, &src);
                self.eval(x, &c)
            }
            OpKind::Transpose { x, perm } => {
                let c = permute_back(coords, &perm);
                self.eval(x, &c)
            }
            _ => unreachable!("checked by rematerializable"),
        };
        self.memo.insert(key, r);
        r
    }

    /// A scalar's register: as lowered, or (for pure scalar ops not lowered at this point, as in
    /// a software-pipelined loop body) recomputed here.
    fn scalar_value(&mut self, v: Value) -> Reg {
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
            | OpKind::Cast(_)) => {
                let srcs: Vec<Reg> = k.operands().into_iter().map(|(_, x)| self.scalar_value(x)).collect();
                self.elementwise(&k, st, &srcs)
            }
            _ => return self.held(v)[0],
        };
        self.memo.insert((v, Vec::new()), r);
        r
    }

    /// Coordinates in `src` of the element at `coords` in `dst` (same elements, row-major).
    fn reshape_coords(&mut self, coords: &[Reg], dst: &[u32], src: &[u32]) -> Vec<Reg> {
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

    /// Thread 0 runs `atomic` (predicated, and masked by the scalar `mask`); every thread gets
    /// its result through shared memory.
    fn scalar_atomic(&mut self, make: impl Fn(Reg, Option<Reg>) -> Inst, t: SType, mask: Option<Reg>) -> Reg {
        let first = self.first_thread();
        let first = match mask {
            Some(m) => self.bin(BinaryOp::And, first, m),
            None => first,
        };
        let old = self.reg(t);
        self.emit(make(old, Some(first)));
        self.emit(Inst::Barrier);
        let o = self.shared_alloc("atomic.result", 8, 8);
        let off = self.iconst(o as i64);
        self.emit(Inst::SharedStore { offset: off, value: old, pred: Some(first) });
        self.emit(Inst::Barrier);
        let r = self.reg(t);
        self.emit(Inst::SharedLoad { dst: r, offset: off });
        self.shared_free(o);
        r
    }

    fn op(&mut self, op: Op) -> Result<(), LowerError> {
        self.origin(op);
        if let Some(l) = self.mma_elementwise(op) {
            self.elementwise_in_mma(op, l);
            return Ok(());
        }
        if let Some(plan) = self.pipeline_plan(op) {
            self.pipelined_for(op, plan);
            return Ok(());
        }
        let data = &self.func.ops[op];
        let rt = data.results.first().map(|r| self.func.ty(*r).clone());
        let st = rt.as_ref().map(stype).unwrap_or(SType::F32);
        let shape = rt.as_ref().map(|t| t.shape.clone()).unwrap_or_default();
        let regs: Vec<Reg> = match &data.kind {
            OpKind::Const(lit) => vec![self.konst(st, *lit)],
            OpKind::ProgramId(a) | OpKind::NumPrograms(a) => {
                let dst = self.reg(I32);
                let which = if matches!(data.kind, OpKind::ProgramId(_)) {
                    Special::ProgramId(*a)
                } else {
                    Special::NumPrograms(*a)
                };
                self.emit(Inst::Special { dst, which });
                vec![dst]
            }
            OpKind::Arange { .. } => {
                let v = data.results[0];
                self.own_slots(v, &shape)
            }
            OpKind::Splat(x) => {
                let n = self.layout(&shape).slots();
                vec![self.held(*x)[0]; n as usize]
            }
            OpKind::ConsumeToken { value: x, .. } => self.held(*x),
            OpKind::Reshape(x) | OpKind::Broadcast(x) | OpKind::Transpose { x, .. } => {
                let v = data.results[0];
                let src_shape = self.func.ty(*x).shape.clone();
                if self.rematerializable(v) {
                    self.own_slots(v, &shape)
                } else {
                    let src = self.held(*x);
                    match data.kind.clone() {
                        OpKind::Reshape(_) => {
                            let (a, b) = (self.layout(&src_shape), self.layout(&shape));
                            if same_elements(&a, &b, self.threads(), self.k.warp_size) {
                                src
                            } else {
                                let (ds, ss) = (shape.clone(), src_shape.clone());
                                self.relayout(&src, &src_shape, &shape, &|l, c| l.reshape_coords(c, &ds, &ss))
                            }
                        }
                        OpKind::Broadcast(_) => {
                            let ss = src_shape.clone();
                            self.relayout(&src, &src_shape, &shape, &|l, c| {
                                c.iter().zip(&ss).map(|(&r, &d)| if d == 1 { l.iconst(0) } else { r }).collect()
                            })
                        }
                        OpKind::Transpose { perm, .. } => {
                            self.relayout(&src, &src_shape, &shape, &|_, c| permute_back(c, &perm))
                        }
                        _ => unreachable!(),
                    }
                }
            }
            k @ (OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Cmp { .. }
            | OpKind::Select { .. }
            | OpKind::Cast(_)
            | OpKind::AddPtr { .. }) => {
                let k = k.clone();
                let held: Vec<Vec<Reg>> = k.operands().into_iter().map(|(_, v)| self.held(v)).collect();
                let slots = held.iter().map(|h| h.len()).max().unwrap_or(1);
                (0..slots)
                    .map(|s| {
                        // Scalar operands broadcast.
                        let srcs: Vec<Reg> = held.iter().map(|h| h[s.min(h.len() - 1)]).collect();
                        self.elementwise(&k, st, &srcs)
                    })
                    .collect()
            }
            OpKind::Load { ptr, mask, other } => self.load(*ptr, *mask, *other, st),
            OpKind::Store { ptr, value, mask } => {
                self.store(*ptr, *value, *mask);
                Vec::new()
            }
            OpKind::Atomic { op: aop, ptr, value, mask, sem, scope } => {
                let (aop, sem, scope) = (*aop, *sem, *scope);
                let (p, v) = (self.held(*ptr), self.held(*value));
                if self.func.ty(*ptr).is_scalar() {
                    let (p0, v0) = (p[0], v[0]);
                    let m = mask.map(|m| self.held(m)[0]);
                    let r = self.scalar_atomic(
                        |dst, first| Inst::Atomic { dst, op: aop, addr: p0, value: v0, pred: first, sem, scope },
                        st,
                        m,
                    );
                    vec![r]
                } else {
                    let m = mask.map(|m| self.held(m));
                    self.tile_atomic(data.results[0], &shape, st, &p, m.as_deref(), &|dst, s, pred| Inst::Atomic {
                        dst,
                        op: aop,
                        addr: p[s],
                        value: v[s],
                        pred,
                        sem,
                        scope,
                    })
                }
            }
            OpKind::Barrier => {
                self.emit(Inst::Barrier);
                Vec::new()
            }
            OpKind::Reduce { op: rop, axis, x } => self.reduce(*rop, *axis as usize, *x, &shape, st),
            OpKind::Dot { a, b, acc, .. } => match self.dot_mma_layout(op) {
                Some(l) => {
                    let regs = self.dot_mma(*a, *b, *acc, l);
                    self.mma_held.insert(data.results[0], (l, regs));
                    return Ok(());
                }
                None => self.dot(*a, *b, *acc, st),
            },
            OpKind::For { lower, upper, step, init, body } => {
                let (lo, hi, stp) = (self.held(*lower)[0], self.held(*upper)[0], self.held(*step)[0]);
                let types: Vec<Type> = init.iter().map(|v| self.func.ty(*v).clone()).collect();
                let args = self.func.blocks[*body].args.clone();
                // A carried accumulator that the body only feeds to a tensor-core `dot` stays in
                // the accumulator layout across iterations.
                let mma: Vec<Option<AccLayout>> = (0..init.len()).map(|i| self.carried_mma(*body, i)).collect();
                let mut phis = self.slots_of(&types);
                let mut inits = Vec::new();
                for (i, v) in init.iter().enumerate() {
                    match mma[i] {
                        Some(l) => {
                            phis[i] = (0..l.slots()).map(|_| self.reg(SType::F32)).collect();
                            inits.extend(self.held_mma(*v, l));
                        }
                        None => inits.extend(self.held(*v)),
                    }
                }
                let iv = self.reg(stype(self.func.ty(args[0])));
                self.vals.insert(args[0], vec![iv]);
                for (i, (a, p)) in args[1..].iter().zip(&phis).enumerate() {
                    match mma[i] {
                        Some(l) => {
                            self.mma_held.insert(*a, (l, p.clone()));
                        }
                        None => {
                            self.vals.insert(*a, p.clone());
                        }
                    }
                }
                let (body_insts, nexts) = self.region(*body, &mma)?;
                let results: Vec<Vec<Reg>> =
                    phis.iter().map(|p| p.iter().map(|r| self.reg(self.k.ty(*r))).collect()).collect();
                let flat = |v: &Vec<Vec<Reg>>| v.iter().flatten().copied().collect::<Vec<Reg>>();
                self.emit(Inst::Loop {
                    iv,
                    lo,
                    hi,
                    step: stp,
                    phis: flat(&phis),
                    inits,
                    body: body_insts,
                    nexts,
                    results: flat(&results),
                });
                let rs = self.func.ops[op].results.clone();
                for (i, (r, regs)) in rs.into_iter().zip(results).enumerate() {
                    match mma[i] {
                        Some(l) => {
                            self.mma_held.insert(r, (l, regs));
                        }
                        None => {
                            self.vals.insert(r, regs);
                        }
                    }
                }
                return Ok(());
            }
            OpKind::If { cond, then_block, else_block } => {
                let c = self.held(*cond)[0];
                let (then_body, then_yields) = self.region(*then_block, &[])?;
                let (else_body, else_yields) = self.region(*else_block, &[])?;
                let types: Vec<Type> = data.results.iter().map(|r| self.func.ty(*r).clone()).collect();
                let results = self.slots_of(&types);
                let flat: Vec<Reg> = results.iter().flatten().copied().collect();
                self.emit(Inst::If { cond: c, then_body, then_yields, else_body, else_yields, results: flat });
                self.bind_results(op, results);
                return Ok(());
            }
            OpKind::While { init, cond, body } => {
                let types: Vec<Type> = init.iter().map(|v| self.func.ty(*v).clone()).collect();
                let phis = self.slots_of(&types);
                let inits: Vec<Reg> = init.iter().flat_map(|v| self.held(*v)).collect();
                for b in [*cond, *body] {
                    let args = self.func.blocks[b].args.clone();
                    for (a, p) in args.iter().zip(&phis) {
                        self.vals.insert(*a, p.clone());
                    }
                }
                let (cond_body, cy) = self.region(*cond, &[])?;
                let (body_insts, nexts) = self.region(*body, &[])?;
                let results = self.slots_of(&types);
                let flat = |v: &Vec<Vec<Reg>>| v.iter().flatten().copied().collect::<Vec<Reg>>();
                self.emit(Inst::While {
                    phis: flat(&phis),
                    inits,
                    cond_body,
                    cond: cy[0],
                    body: body_insts,
                    nexts,
                    results: flat(&results),
                });
                self.bind_results(op, results);
                return Ok(());
            }
            OpKind::Rank => vec![self.hidden[Hidden::Rank.position()]],
            OpKind::NumRanks => vec![self.hidden[Hidden::NumRanks.position()]],
            OpKind::SymmAt { ptr, rank } => {
                let (p, r) = (self.held(*ptr)[0], self.held(*rank)[0]);
                vec![self.symm_at(p, r)]
            }
            OpKind::Notify { sig, rank, value, op: sop, .. } => {
                let (s0, r, v) = (self.held(*sig)[0], self.held(*rank)[0], self.held(*value)[0]);
                let target = self.symm_at(s0, r);
                self.release_then_signal(target, v, *sop);
                Vec::new()
            }
            OpKind::Wait { sigs, count, cmp, value, .. } => {
                let (b, c, v) = (self.held(*sigs)[0], self.held(*count)[0], self.held(*value)[0]);
                self.emit(Inst::WaitSignals { base: b, count: c, cmp: *cmp, value: v });
                let t = self.reg(U64);
                self.emit(Inst::Const { dst: t, value: Literal::Int(0) });
                vec![t]
            }
            OpKind::SignalWaitUntil { sig, cmp, value } => {
                let (b, v) = (self.held(*sig)[0], self.held(*value)[0]);
                let one = self.iconst(1);
                self.emit(Inst::WaitSignals { base: b, count: one, cmp: *cmp, value: v });
                let seen = self.reg(U64);
                self.emit(Inst::Load { dst: seen, addr: b, pred: None, other: None });
                vec![seen]
            }
            OpKind::Fence | OpKind::Quiet => {
                // Transfers are stores by the program's threads: the barrier gathers them, each
                // thread's fence orders its own.
                self.emit(Inst::Barrier);
                self.emit(Inst::Fence { scope: Scope::Sys });
                Vec::new()
            }
            OpKind::Put { dst, src, bytes, rank, .. } | OpKind::Get { dst, src, bytes, rank, .. } => {
                let is_put = matches!(data.kind, OpKind::Put { .. });
                self.transfer(is_put, *dst, *src, *bytes, *rank);
                Vec::new()
            }
            OpKind::PutSignal { dst, src, bytes, sig, sig_value, sig_op, rank, .. } => {
                self.transfer(true, *dst, *src, *bytes, *rank);
                let (s0, r, v) = (self.held(*sig)[0], self.held(*rank)[0], self.held(*sig_value)[0]);
                let target = self.symm_at(s0, r);
                self.release_then_signal(target, v, *sig_op);
                Vec::new()
            }
            OpKind::BarrierAll { .. } => {
                self.barrier_all();
                Vec::new()
            }
            OpKind::AtomicCas { ptr, expected, desired, sem, scope } => {
                let (sem, scope) = (*sem, *scope);
                let (p, e, d) = (self.held(*ptr), self.held(*expected), self.held(*desired));
                if self.func.ty(*ptr).is_scalar() {
                    let (p0, e0, d0) = (p[0], e[0], d[0]);
                    let r = self.scalar_atomic(
                        |dst, first| Inst::AtomicCas {
                            dst,
                            addr: p0,
                            expected: e0,
                            desired: d0,
                            pred: first,
                            sem,
                            scope,
                        },
                        st,
                        None,
                    );
                    vec![r]
                } else {
                    self.tile_atomic(data.results[0], &shape, st, &p, None, &|dst, s, pred| Inst::AtomicCas {
                        dst,
                        addr: p[s],
                        expected: e[s],
                        desired: d[s],
                        pred,
                        sem,
                        scope,
                    })
                }
            }
        };
        if let Some(r) = data.results.first() {
            self.vals.insert(*r, regs);
        }
        Ok(())
    }

    /// The slots of the rematerializable `v` in its own layout.
    fn own_slots(&mut self, v: Value, shape: &[u32]) -> Vec<Reg> {
        let n = self.layout(shape).slots();
        (0..n)
            .map(|s| {
                let c = self.slot_coords(shape, s);
                self.eval(v, &c)
            })
            .collect()
    }

    fn first_thread(&mut self) -> Reg {
        let zero = self.iconst(0);
        let first = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: first, op: CmpOp::Eq, a: self.tid, b: zero });
        first
    }

    fn symm_at(&mut self, ptr: Reg, rank: Reg) -> Reg {
        let d = self.reg(SType::Ptr);
        self.emit(Inst::SymmAt { dst: d, ptr, rank });
        d
    }

    /// Program barrier, release fence, then one thread updates the signal at `target`.
    fn release_then_signal(&mut self, target: Reg, value: Reg, op: SignalOp) {
        self.emit(Inst::Barrier);
        self.emit(Inst::Fence { scope: Scope::Sys });
        let first = self.first_thread();
        self.emit(Inst::Signal { addr: target, value, op, pred: first });
    }

    fn bind_results(&mut self, op: Op, results: Vec<Vec<Reg>>) {
        let rs = self.func.ops[op].results.clone();
        for (r, regs) in rs.into_iter().zip(results) {
            self.vals.insert(r, regs);
        }
    }

    /// The vector width (elements) of accesses through `ptr`, or 1.
    fn vector_width(&mut self, ptr: Value, t: SType) -> u32 {
        let pt = self.func.ty(ptr).clone();
        if pt.is_scalar() || matches!(t, SType::Pred) || shared_size(t) < 2 {
            return 1;
        }
        let l = self.layout(&pt.shape);
        let last = pt.shape.len() - 1;
        if l.order[0] != last {
            return 1;
        }
        let w = l.vector().min(self.contiguity.get(ptr).contiguity).min(16 / shared_size(t));
        if w >= 2 {
            w
        } else {
            1
        }
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

    /// `ok` for a vector group: its first address is aligned to the group and every mask is set.
    fn group_ok(&mut self, addr: Reg, bytes: u32, masks: Option<&[Reg]>) -> Reg {
        let ok = self.reg(SType::Pred);
        self.emit(Inst::IsAligned { dst: ok, addr, bytes });
        masks.into_iter().flatten().fold(ok, |acc, &m| self.bin(BinaryOp::And, acc, m))
    }

    fn not(&mut self, p: Reg) -> Reg {
        let not = self.reg(SType::Pred);
        self.emit(Inst::Unary { dst: not, op: UnaryOp::Not, src: p });
        not
    }

    /// `not_ok & mask`: the lanes of a group that take the scalar path.
    fn fallback(&mut self, not: Reg, mask: Option<Reg>) -> Reg {
        match mask {
            Some(m) => self.bin(BinaryOp::And, not, m),
            None => not,
        }
    }

    fn load(&mut self, ptr: Value, mask: Option<Value>, other: Option<Value>, st: SType) -> Vec<Reg> {
        let w = self.vector_width(ptr, st);
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

    fn store(&mut self, ptr: Value, value: Value, mask: Option<Value>) {
        if let Some((l, regs)) = self.mma_held.get(&value).cloned() {
            if self.rematerializable(ptr) && mask.is_none_or(|m| self.rematerializable(m)) {
                return self.store_from_mma(ptr, mask, l, &regs);
            }
        }
        let t = stype(self.func.ty(value));
        let (p, v) = (self.held(ptr), self.held(value));
        let m = mask.map(|m| self.held(m));
        let w = self.vector_width(ptr, t);
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
            let Some(ok) = self.vector_guard(ptr, p[g], w * shared_size(t), masks.as_deref()) else {
                self.emit(Inst::VStore { addr: p[g], values, pred: None });
                continue;
            };
            self.emit(Inst::VStore { addr: p[g], values, pred: Some(ok) });
            let not_ok = self.not(ok);
            for (i, &s) in group.iter().enumerate() {
                let pred = self.fallback(not_ok, masks.as_ref().map(|ms| ms[i]));
                self.emit(Inst::Store { addr: p[s], value: pick(&v, s), pred: Some(pred) });
            }
        }
    }

    /// `put` (local `src` to `dst` on `rank`) or `get` (`src` on `rank` to local `dst`) of
    /// `bytes` bytes, by every thread of the program: elements of the pointee's size, then a byte
    /// tail. A barrier before (the source may be other threads' stores) and after (the
    /// destination may be read by other threads).
    fn transfer(&mut self, is_put: bool, dst: Value, src: Value, bytes: Value, rank: Value) {
        let size = self.func.ty(dst).elem.pointee().map_or(1, |d| d.size_bytes());
        let (d0, s0, r) = (self.held(dst)[0], self.held(src)[0], self.held(rank)[0]);
        let (to, from) = if is_put { (self.symm_at(d0, r), s0) } else { (d0, self.symm_at(s0, r)) };
        let b0 = self.held(bytes)[0];
        let n_bytes = self.cast(b0, I32);
        self.emit(Inst::Barrier);
        let elems = self.bin_c(BinaryOp::Shr, n_bytes, log2(size));
        let word = SType::Int { bits: (8 * size) as u8, signed: false };
        self.copy_loop(to, from, elems, size, word);
        if size > 1 {
            let tail = self.bin_c(BinaryOp::And, n_bytes, size as i64 - 1);
            let done = self.bin_c(BinaryOp::Shl, elems, log2(size));
            let byte = SType::Int { bits: 8, signed: false };
            let (to_t, from_t) = (self.reg(SType::Ptr), self.reg(SType::Ptr));
            self.emit(Inst::AddrOffset { dst: to_t, base: to, offset: done, scale: 1 });
            self.emit(Inst::AddrOffset { dst: from_t, base: from, offset: done, scale: 1 });
            self.copy_loop(to_t, from_t, tail, 1, byte);
        }
        self.emit(Inst::Barrier);
    }

    /// `to[i] = from[i]` for `i < n`, spread over the program's threads.
    fn copy_loop(&mut self, to: Reg, from: Reg, n: Reg, size: u32, t: SType) {
        let (lo, step) = (self.iconst(0), self.iconst(self.threads() as i64));
        let iv = self.reg(I32);
        let saved = std::mem::take(&mut self.cur);
        let i = self.bin(BinaryOp::Add, iv, self.tid);
        let inside = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: inside, op: CmpOp::Lt, a: i, b: n });
        let (src, dst) = (self.reg(SType::Ptr), self.reg(SType::Ptr));
        self.emit(Inst::AddrOffset { dst: src, base: from, offset: i, scale: size });
        self.emit(Inst::AddrOffset { dst, base: to, offset: i, scale: size });
        let v = self.reg(t);
        self.emit(Inst::Load { dst: v, addr: src, pred: Some(inside), other: None });
        self.emit(Inst::Store { addr: dst, value: v, pred: Some(inside) });
        let body = std::mem::replace(&mut self.cur, saved);
        self.emit(Inst::Loop {
            iv,
            lo,
            hi: n,
            step,
            phis: vec![],
            inits: vec![],
            body,
            nexts: vec![],
            results: vec![],
        });
    }

    /// Every program of every rank arrives (its transfers complete) before any leaves: thread 0
    /// reads the generation, counts itself in on rank 0's `__barrier` words, and the last arriver
    /// resets the count and bumps the generation; the others wait (bounded) for the bump.
    fn barrier_all(&mut self) {
        self.emit(Inst::Barrier);
        self.emit(Inst::Fence { scope: Scope::Sys });
        let words = self.hidden[Hidden::Barrier.position()];
        let nranks = self.hidden[Hidden::NumRanks.position()];
        let mut want = nranks;
        for a in [Axis::X, Axis::Y, Axis::Z] {
            let n = self.reg(I32);
            self.emit(Inst::Special { dst: n, which: Special::NumPrograms(a) });
            want = self.bin(BinaryOp::Mul, want, n);
        }
        let last_old = self.bin_c(BinaryOp::Sub, want, 1);
        let last_old = self.cast(last_old, U64);
        let first = self.first_thread();
        let one = self.iconst(1);
        let gen_addr = self.reg(SType::Ptr);
        self.emit(Inst::AddrOffset { dst: gen_addr, base: words, offset: one, scale: 8 });
        let gen = self.reg(U64);
        let zero = self.zero_u64();
        self.emit(Inst::Atomic {
            dst: gen,
            op: AtomicOp::Add,
            addr: gen_addr,
            value: zero,
            pred: Some(first),
            sem: MemSemantic::Acquire,
            scope: Scope::Sys,
        });
        let old = self.reg(U64);
        let one64 = self.cast(one, U64);
        self.emit(Inst::Atomic {
            dst: old,
            op: AtomicOp::Add,
            addr: words,
            value: one64,
            pred: Some(first),
            sem: MemSemantic::AcqRel,
            scope: Scope::Sys,
        });
        let is_last = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: is_last, op: CmpOp::Eq, a: old, b: last_old });
        let last = self.bin(BinaryOp::And, is_last, first);
        let ignored = (self.reg(U64), self.reg(U64));
        self.emit(Inst::Atomic {
            dst: ignored.0,
            op: AtomicOp::Xchg,
            addr: words,
            value: zero,
            pred: Some(last),
            sem: MemSemantic::Relaxed,
            scope: Scope::Sys,
        });
        self.emit(Inst::Atomic {
            dst: ignored.1,
            op: AtomicOp::Add,
            addr: gen_addr,
            value: one64,
            pred: Some(last),
            sem: MemSemantic::Release,
            scope: Scope::Sys,
        });
        self.emit(Inst::WaitSignals { base: gen_addr, count: one, cmp: CmpOp::Ne, value: gen });
    }

    fn zero_u64(&mut self) -> Reg {
        let z = self.reg(U64);
        self.emit(Inst::Const { dst: z, value: Literal::Int(0) });
        z
    }

    /// Combines two partial reductions `(value, index)`; `b` covers later coordinates on ties.
    /// Float `max`/`min` ignore NaN (minimumNumber, `-0 < +0`); `argmax`/`argmin` treat NaN as
    /// worse than any number (and two NaNs as a tie), so they return the first NaN only when
    /// every element is NaN. Both rules are symmetric, so every lane of a butterfly agrees.
    fn combine(&mut self, rop: ReduceOp, a: (Reg, Reg), b: (Reg, Reg)) -> (Reg, Reg) {
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
    fn reduce(&mut self, rop: ReduceOp, axis: usize, x: Value, rshape: &[u32], rt: SType) -> Vec<Reg> {
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
        self.emit(Inst::Barrier);
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

/// Every value some op reads or some block yields.
fn used_values(func: &Function) -> std::collections::HashSet<Value> {
    let mut used = std::collections::HashSet::new();
    for (_, d) in func.ops.iter() {
        used.extend(d.kind.operands().into_iter().map(|(_, v)| v));
    }
    for (_, b) in func.blocks.iter() {
        used.extend(b.yields.iter().copied());
    }
    used
}

/// Pure tile ops of index arithmetic and layout: what can be recomputed at any coordinates
/// when its operands can (`Lowering::rematerializable`). Elementary functions and `pow` are
/// not: they expand to long sequences.
fn is_index_math(k: &OpKind) -> bool {
    if let OpKind::Unary { op, .. } = k {
        if crate::math::is_expanded(*op) {
            return false;
        }
    }
    if matches!(k, OpKind::Binary { op: BinaryOp::Pow, .. }) {
        return false;
    }
    matches!(
        k,
        OpKind::Arange { .. }
            | OpKind::Splat(_)
            | OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Cmp { .. }
            | OpKind::Select { .. }
            | OpKind::Cast(_)
            | OpKind::AddPtr { .. }
            | OpKind::Broadcast(_)
            | OpKind::Reshape(_)
            | OpKind::Transpose { .. }
    )
}

/// Source coordinates of a transpose's result coordinates (`result[i] = source[perm[i]]`).
fn permute_back(c: &[Reg], perm: &[u32]) -> Vec<Reg> {
    let mut s = vec![c[0]; c.len()];
    for (i, p) in perm.iter().enumerate() {
        s[*p as usize] = c[i];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::KernelBuilder;

    /// An f16/bf16 `dot` with an f32 accumulator runs on tensor cores, its loop-carried
    /// accumulator staying in the MMA layout (no shared-memory round trip inside the K loop);
    /// f32 inputs keep the FMA loop; wave-64 targets use their MFMA atoms instead of `mma.sync`.
    #[test]
    fn half_dots_use_tensor_cores() {
        let build = |d: DType| {
            let b = KernelBuilder::new("mm", LaunchAttrs::default());
            let (x, y, c) = (b.arg_ptr("x", d), b.arg_ptr("y", d), b.arg_ptr("c", DType::F32));
            let i = b.arange(0, 64);
            let k = b.arange(0, 32);
            let xa = b.load(x + i.expand_dims(1) * 32i32 + k.expand_dims(0), None, None);
            let ya = b.load(y + k.expand_dims(1) * 64i32 + i.expand_dims(0), None, None);
            let out = b.for_range(0, 4, 1, &[b.zeros(&[64, 64], DType::F32)], |_, acc: &[crate::builder::Tile]| {
                vec![b.dot(xa, ya, acc[0], InputPrecision::Ieee)]
            });
            b.store(c + i.expand_dims(1) * 64i32 + i.expand_dims(0), out[0], None);
            b.finish().unwrap()
        };
        use crate::simt::count;
        let k = lower(&build(DType::BF16), &crate::target::SM_90A).unwrap();
        assert_eq!(count(&k.body, &|i| matches!(i, Inst::Matmul { .. })), 16);
        let Some(Inst::Loop { body, .. }) = k.body.iter().find(|i| matches!(i, Inst::Loop { .. })) else { panic!() };
        // Inside the loop: staging of A and B only (two barriers), no accumulator conversion.
        assert_eq!(body.iter().filter(|i| matches!(i, Inst::Barrier)).count(), 2);
        let k = lower(&build(DType::F32), &crate::target::SM_90A).unwrap();
        assert_eq!(count(&k.body, &|i| matches!(i, Inst::Matmul { .. })), 0);
        // On gfx942 the same dot is MFMA: 64 x 64 over 4 waves, one 32 x 32 tile each, and
        // K = 32 in four steps of 8.
        let k = lower(&build(DType::BF16), &crate::target::GFX942).unwrap();
        assert_eq!(count(&k.body, &|i| matches!(i, Inst::Matmul { atom, .. } if atom.name == "mfma.32x32x8")), 4);
    }

    /// A K loop that loads both operands of a tensor-core `dot` is pipelined: `stages - 1`
    /// steps of `cp.async` before the loop, one step issued per iteration, a wait leaving
    /// `stages - 2` groups in flight.
    #[test]
    fn gemm_k_loops_are_pipelined() {
        let b = KernelBuilder::new("mm", LaunchAttrs { warps: 4, stages: 3, cooperative: false, fast_math: false });
        let (x, y, c) = (b.arg_ptr("x", DType::BF16), b.arg_ptr("y", DType::BF16), b.arg_ptr("c", DType::F32));
        let k = b.arg("k", DType::I32);
        let (i, kr) = (b.arange(0, 64), b.arange(0, 32));
        let out = b.for_range(0, k, 32, &[b.zeros(&[64, 64], DType::F32)], |k0, acc: &[crate::builder::Tile]| {
            let kk = kr + k0;
            let xa = b.load_or(x + i.expand_dims(1) * k + kk.expand_dims(0), kk.expand_dims(0).lt(k), 0.0);
            let ya = b.load_or(y + kk.expand_dims(1) * 64i32 + i.expand_dims(0), kk.expand_dims(1).lt(k), 0.0);
            vec![b.dot(xa, ya, acc[0], InputPrecision::Ieee)]
        });
        b.store(c + i.expand_dims(1) * 64i32 + i.expand_dims(0), out[0], None);
        let k = lower(&b.finish().unwrap(), &crate::target::SM_90A).unwrap();
        let commits = |body: &[Inst]| body.iter().filter(|i| matches!(i, Inst::AsyncCommit)).count();
        assert_eq!(commits(&k.body), 2, "two steps issued before the loop");
        let Some(Inst::Loop { body, .. }) = k.body.iter().find(|i| matches!(i, Inst::Loop { .. })) else { panic!() };
        assert_eq!(commits(body), 1);
        assert!(matches!(body[0], Inst::AsyncWait { pending: 1 }));
        assert!(body.iter().any(|i| matches!(i, Inst::AsyncCopy { .. })));
        assert!(body.iter().any(|i| matches!(i, Inst::Matmul { .. })));
        assert!(!body.iter().any(|i| matches!(i, Inst::VLoad { .. })), "operands do not pass through registers");
    }

    #[test]
    fn vector_add_lowers_and_communication_is_reported() {
        let b = KernelBuilder::new("add", LaunchAttrs::default());
        let (x, out) = (b.arg_ptr("x", DType::F32), b.arg_ptr("out", DType::F32));
        let offs = b.program_id_x() * 256 + b.arange(0, 256);
        let v = b.load(x + offs, Some(offs.lt(1000)), None);
        b.store(out + offs, v * 2.0f32, Some(offs.lt(1000)));
        let f = b.finish().unwrap();
        let k = lower(&f, &crate::target::SM_90A).unwrap();
        // 256 elements over 128 threads: one vector group of two per thread (plus the scalar
        // fallback for a misaligned or partly masked group).
        let count = |k: &Kernel, f: fn(&Inst) -> bool| k.body.iter().filter(|i| f(i)).count();
        assert_eq!(count(&k, |i| matches!(i, Inst::VStore { values, .. } if values.len() == 2)), 1);
        assert_eq!(count(&k, |i| matches!(i, Inst::Store { .. })), 2);
        assert_eq!(count(&k, |i| matches!(i, Inst::VLoad { .. })), 1);
        let k64 = lower(&f, &crate::target::GFX942).unwrap();
        assert_eq!(count(&k64, |i| matches!(i, Inst::Store { .. })), 1);
        assert_eq!(count(&k64, |i| matches!(i, Inst::VStore { .. })), 0);

        // A scalar compare-and-swap runs in one thread and is shared through shared memory.
        let b = KernelBuilder::new("cas", LaunchAttrs::default());
        let out = b.arg_ptr("out", DType::I32);
        b.atomic_cas(out, 0i32, 1i32, MemSemantic::AcqRel, Scope::Gpu);
        let k = lower(&b.finish().unwrap(), &crate::target::SM_90A).unwrap();
        assert_eq!(count(&k, |i| matches!(i, Inst::AtomicCas { pred: Some(_), .. })), 1);
    }
}
