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
//! * `dot` runs on the target's matrix atom where it has one (`dot.rs`: lane maps from
//!   `target.rs`, the accumulator kept in the atom's layout across the K loop, epilogues
//!   computed in it), else an FMA loop over shared-memory operands; a GEMM's K loop is
//!   software-pipelined with the target's async copies (`pipeline.rs`).
//! * `put`/`get`/`put_signal` copy through peer addresses (`symm_at`) with the whole program;
//!   `barrier_all` is a generation barrier on the runtime's `__barrier` words (`comm.rs`).
//!
//! Where things are: control flow and the op dispatch here; index math and rematerialization
//! in `index.rs`; global and shared memory in `memory.rs`; shared-memory objects in
//! `shared.rs`; communication in `comm.rs`; reductions in `reduce.rs`; `dot` and the
//! accumulator layout in `dot.rs`; pipelining in `pipeline.rs`; atomics in `atomic.rs`;
//! elementwise math in `elementwise.rs` and `arith.rs`. After the lowering `simt::passes`
//! cleans up (CSE, DCE); GPU writers then run `simt::protocol::expand`.
//!
//! Scalars are one uniform register, and `for`/`if`/`while` (whose conditions are scalars) are
//! uniform control flow.

mod arith;
mod atomic;
mod bulk_store;
mod comm;
mod dot;
mod elementwise;
mod fp8;
mod index;
mod memory;
mod persistent;
mod pipeline;
mod reduce;
mod shared;
mod staged;
mod support;
mod tma_store;

use super::contiguity::Contiguity;
use super::layout::{same_elements, AccLayout, Blocked};
use super::{Hidden, Inst, Kernel, Reg, RegSplit, SType, Special};
use crate::ir::*;
use crate::target::{AsyncCopy, TargetDesc};
use crate::trace::EventKind;
use std::collections::BTreeMap;
/// The lowering's maps key on registers and values: a fast hash (SipHash showed in profiles).
type HashMap<K, V> = super::passes::FastMap<K, V>;

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
        Elem::Token | Elem::Desc { .. } => U64,
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
    /// The warp within the thread's consumer group (the program's warp without ping-pong).
    warp: Reg,
    /// With consumer ping-pong, the thread's group (0 or 1; `Kernel::consumer_groups`).
    group: Option<Reg>,
    /// A ping-pong region was emitted (else `LaunchAttrs::pingpong` is refused).
    pingpong_used: bool,
    /// Lowering a ping-pong region's consumers: shared objects allocated now are one copy per
    /// group, by their first byte and one copy's bytes ([`Lowering::shared_offset`] adds
    /// `group x bytes`).
    group_objects: Option<HashMap<u32, u32>>,
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
    /// The ops that read each value.
    users: HashMap<Value, Vec<Op>>,
    /// Transposes read only K-major by `dot`s (`dot.rs`, `kmajor_operand`): the tile
    /// transposed, by the transpose's result, or `None`.
    kmajor: HashMap<Value, Option<Value>>,
    /// Row broadcasts not lowered where they stand (`deferrable`), by result: lowered on
    /// first need in the blocked layout.
    deferred: HashMap<Value, Op>,
    /// Loads of a staged loop's step (`staged.rs`) by value: the shared byte of their copy in
    /// the step's stage (they lower to nothing; their `dot`s read the stage).
    staged: HashMap<Value, Reg>,
    /// While a software-pipelined loop body is lowered: where its loop-invariant
    /// rematerializations go (`index.rs`, `eval`).
    hoist: Option<Hoist>,
    /// A TMA store's bulk copy may still read its shared staging copy (`tma_store` leaves the
    /// wait to the next store or the program's end).
    bulk_pending: bool,
    /// A traced kernel's label of each wait and notify op (`crate::trace::label_indices`).
    trace_labels: HashMap<Op, u16>,
}

/// Loop-invariant code motion for rematerialized values: inside a pipelined K loop, a value that
/// does not depend on the loop's block arguments is evaluated once, before the loop (the
/// address and mask parts that only depend on the program and the thread).
struct Hoist {
    /// Values of the loop body that depend on its block arguments.
    variant: std::collections::HashSet<Value>,
    /// Instructions for the loop's preheader.
    insts: Vec<Inst>,
    /// Hoisted evaluations, by value and coordinates.
    memo: HashMap<(Value, Vec<Reg>), Reg>,
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
        target,
        warps: func.attrs.warps,
        producer_warps: 0,
        consumer_groups: 1,
        warp_size: target.warp_size,
        shared_bytes: 0,
        shared_objects: Vec::new(),
        tensor_maps: Vec::new(),
    };
    let mut l = Lowering {
        func,
        target,
        k,
        cur: Vec::new(),
        prologue: Vec::new(),
        vals: HashMap::default(),
        tid: Reg(0),
        lane: Reg(0),
        warp: Reg(0),
        group: None,
        pingpong_used: false,
        group_objects: None,
        smem: shared::SharedAlloc::default(),
        hidden: Vec::new(),
        consts: HashMap::default(),
        layouts: HashMap::default(),
        positions: HashMap::default(),
        coords: HashMap::default(),
        memo: HashMap::default(),
        remat: HashMap::default(),
        contiguity: Contiguity::analyse(func),
        mma_held: HashMap::default(),
        mma_positions: HashMap::default(),
        warp_origins: HashMap::default(),
        lane_parts: HashMap::default(),
        typed_consts: HashMap::default(),
        const_ints: HashMap::default(),
        hoist: None,
        used: used_values(func),
        users: users_of(func),
        kmajor: HashMap::default(),
        deferred: HashMap::default(),
        staged: HashMap::default(),
        bulk_pending: false,
        trace_labels: if func.attrs.trace {
            crate::trace::label_indices(func).into_iter().collect()
        } else {
            HashMap::default()
        },
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
    // A programmatic dependent waits for the kernel before it before anything else.
    if func.attrs.programmatic && target.programmatic_launch {
        l.prologue.push(Inst::GridDependencyWait);
    }
    let ws = target.warp_size as i64;
    let (mask, shift) = (l.iconst(ws - 1), l.iconst(log2(target.warp_size)));
    l.lane = l.reg(I32);
    l.warp = l.reg(I32);
    l.prologue.push(Inst::Binary { dst: l.lane, op: BinaryOp::And, a: l.tid, b: mask });
    // Consumer ping-pong: two groups of `warps` warps, the layouts' warp numbers the group's.
    let pingpong = func.attrs.pingpong
        && func.attrs.warp_specialize
        && func.attrs.persistent
        && target.has_tma_wgmma()
        && func.attrs.warps.is_power_of_two();
    if pingpong {
        l.k.consumer_groups = 2;
        let all = l.reg(I32);
        l.prologue.push(Inst::Binary { dst: all, op: BinaryOp::Shr, a: l.tid, b: shift });
        let (wmask, gshift) =
            (l.iconst(func.attrs.warps as i64 - 1), l.iconst(log2(func.attrs.warps * target.warp_size)));
        l.prologue.push(Inst::Binary { dst: l.warp, op: BinaryOp::And, a: all, b: wmask });
        let group = l.reg(I32);
        l.prologue.push(Inst::Binary { dst: group, op: BinaryOp::Shr, a: l.tid, b: gshift });
        l.group = Some(group);
    } else {
        l.prologue.push(Inst::Binary { dst: l.warp, op: BinaryOp::Shr, a: l.tid, b: shift });
    }
    l.trace(EventKind::Start, 0, None);
    l.block(func.body)?;
    l.trace(EventKind::End, 0, None);
    if l.group.is_some() && !l.pingpong_used {
        return Err(LowerError::Unsupported {
            op: "kernel".into(),
            loc: None,
            reason:
                "consumer ping-pong (`pingpong`) needs a persistent tile loop whose K loop runs on TMA and `wgmma` \
                     with a producer warp; this kernel's does not"
                    .into(),
        });
    }
    if l.bulk_pending {
        // The last TMA store's reads of shared memory end before the program does.
        l.emit(Inst::BulkWait { pending: 0, writes: false });
    }
    head.append(&mut l.prologue);
    head.append(&mut l.cur);
    l.k.body = head;
    super::barriers::elide(&mut l.k);
    super::passes::clean(&mut l.k);
    super::trace::expand(&mut l.k);
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
        if matches!(i, Inst::Barrier | Inst::BarrierAny { .. }) {
            self.smem.barrier();
        }
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

    /// A timeline event (`crate::trace`) here, in a traced kernel; nothing otherwise.
    fn trace(&mut self, kind: EventKind, label: u16, arg: Option<Reg>) {
        if self.func.attrs.trace {
            self.emit(Inst::TraceEvent { kind, label, arg });
        }
    }

    /// The event of the wait or notify `op` on the signal `sig` (at address `addr`): its label,
    /// and as argument the signal's index from its parameter where it comes from one without
    /// `symm_at` (a chunk's number, a tile's counter).
    fn trace_signal(&mut self, op: Op, kind: EventKind, sig: Value, addr: Reg) {
        if !self.func.attrs.trace {
            return;
        }
        let label = self.trace_labels.get(&op).copied().unwrap_or(0);
        let base = self
            .func
            .root_param(sig, false)
            .and_then(|p| self.vals.get(&self.func.params[p as usize].value))
            .map(|r| r[0]);
        let arg = base.filter(|_| self.k.ty(addr) == SType::Ptr).map(|base| {
            let (a, b) = (self.reg(U64), self.reg(U64));
            self.emit(Inst::Bitcast { dst: a, src: addr });
            self.emit(Inst::Bitcast { dst: b, src: base });
            let bytes = self.bin(BinaryOp::Sub, a, b);
            let three = self.reg(U64);
            self.emit(Inst::Const { dst: three, value: Literal::Int(3) });
            self.bin(BinaryOp::Shr, bytes, three)
        });
        self.emit(Inst::TraceEvent { kind, label, arg });
    }

    /// The threads layouts spread over (a producer warp of warp specialization is not one).
    fn threads(&self) -> u32 {
        self.k.warps * self.k.warp_size
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

    /// `v`'s registers in its shape's blocked layout (a tensor-core accumulator is converted
    /// through shared memory, at this point of the program).
    fn held(&mut self, v: Value) -> Vec<Reg> {
        if let Some(r) = self.vals.get(&v) {
            return r.clone();
        }
        if let Some(op) = self.deferred.remove(&v) {
            // A row broadcast an op of its block needs in the blocked layout after all: lowered
            // here, later in the same block than it stood.
            self.lower_op(op).expect("a broadcast lowers without error");
            return self.vals[&v].clone();
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
        self.region_with(b, mma, &mut |_| Vec::new())
    }

    /// [`Lowering::region`] with `prelude` lowered first; the registers it returns are yielded
    /// after the block's.
    fn region_with(
        &mut self,
        b: Block,
        mma: &[Option<AccLayout>],
        prelude: &mut dyn FnMut(&mut Self) -> Vec<Reg>,
    ) -> Result<(Vec<Inst>, Vec<Reg>), LowerError> {
        let saved = std::mem::take(&mut self.cur);
        let memo = self.memo.clone();
        let extra = prelude(self);
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
            out.extend(extra);
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

    fn op(&mut self, op: Op) -> Result<(), LowerError> {
        if self.deferrable(op) {
            self.deferred.insert(self.func.ops[op].results[0], op);
            return Ok(());
        }
        self.lower_op(op)
    }

    /// A `for` loop: its carried values as phis (an accumulator only fed to a tensor-core `dot`
    /// stays in the accumulator layout), its body lowered once. With `staged`, the loads that
    /// feed only `dot`s are copied asynchronously into a ring of shared stages, `stages - 1`
    /// steps ahead (`staged.rs`).
    fn lower_for(&mut self, op: Op, staged: Option<staged::StagedLoads>) -> Result<(), LowerError> {
        let OpKind::For { lower, upper, step, init, body } = &self.func.ops[op].kind.clone() else {
            unreachable!("lower_for lowers `for` ops")
        };
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
        // A staged loop's ring and its copies of the first steps; its step counter `j`.
        let ring = staged.as_ref().map(|p| (self.staged_prologue(p, args[0], (lo, hi, stp)), self.reg(I32)));
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
        let mut hoisted = Vec::new();
        self.smem.enter_loop();
        let lowered = match (&staged, ring) {
            (Some(plan), Some((at, j))) => self.region_with(*body, &mma, &mut |me| {
                vec![me.staged_step(plan, at, (args[0], iv, j), (hi, stp), *body, &mut hoisted)]
            }),
            _ => self.region(*body, &mma),
        };
        self.smem.leave_loop();
        let (body_insts, nexts) = lowered?;
        let results: Vec<Vec<Reg>> = phis.iter().map(|p| p.iter().map(|r| self.reg(self.k.ty(*r))).collect()).collect();
        let flat = |v: &Vec<Vec<Reg>>| v.iter().flatten().copied().collect::<Vec<Reg>>();
        // The staged loop's step counter rides after the carried values.
        let (mut all_phis, mut all_results) = (flat(&phis), flat(&results));
        if let Some((_, j)) = ring {
            all_phis.push(j);
            inits.push(self.iconst(0));
            all_results.push(self.reg(I32));
        }
        self.cur.extend(hoisted);
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
        if let (Some(plan), Some((at, _))) = (&staged, ring) {
            self.staged_epilogue(plan, at);
        }
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
        Ok(())
    }

    /// A row broadcast (`[M, 1]` to `[M, N]`) that only elementwise ops of its block read: those
    /// computed in an accumulator layout read its rows from shared memory
    /// (`dot.rs`, `elementwise_in_mma`), so it is lowered only where one needs it blocked.
    fn deferrable(&mut self, op: Op) -> bool {
        let data = &self.func.ops[op];
        let OpKind::Broadcast(y) = data.kind else { return false };
        let v = data.results[0];
        let (vs, ys) = (&self.func.ty(v).shape, &self.func.ty(y).shape);
        if vs.len() != 2 || ys.as_slice() != [vs[0], 1] || self.rematerializable(v) {
            return false;
        }
        let Some(block) = self.func.blocks.iter().find(|(_, b)| b.ops.contains(&op)).map(|(_, b)| b) else {
            return false;
        };
        if block.yields.contains(&v) {
            return false;
        }
        let users = self.users.get(&v).map_or(&[][..], |u| u.as_slice());
        !users.is_empty()
            && users.iter().all(|o| {
                block.ops.contains(o)
                    && matches!(
                        self.func.ops[*o].kind,
                        OpKind::Unary { .. }
                            | OpKind::Binary { .. }
                            | OpKind::Cmp { .. }
                            | OpKind::Select { .. }
                            | OpKind::Cast(_)
                    )
            })
    }

    fn lower_op(&mut self, op: Op) -> Result<(), LowerError> {
        self.origin(op);
        if matches!(self.func.ops[op].kind, OpKind::Load { .. })
            && self.staged.contains_key(&self.func.ops[op].results[0])
        {
            // Copied into the step's stage at the top of the body (`staged.rs`).
            return Ok(());
        }
        if let Some(l) = self.mma_elementwise(op) {
            self.elementwise_in_mma(op, l);
            return Ok(());
        }
        if let Some(p) = self.persistent_plan(op) {
            return self.flattened_for(op, p);
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
                if self.kmajor_operand(v).is_some() {
                    // Its `dot`s read the tile itself.
                    Vec::new()
                } else if self.rematerializable(v) {
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
                let result = data.results[0];
                let held: Vec<Vec<Reg>> = k.operands().into_iter().map(|(_, v)| self.held(v)).collect();
                let slots = held.iter().map(|h| h.len()).max().unwrap_or(1);
                (0..slots)
                    .map(|s| {
                        // Scalar operands broadcast.
                        let srcs: Vec<Reg> = held.iter().map(|h| h[s.min(h.len() - 1)]).collect();
                        self.elementwise(&k, result, &srcs)
                    })
                    .collect()
            }
            OpKind::Load { ptr, mask, other } => self.load(*ptr, *mask, *other, st),
            // A descriptor is its parts: `desc_load`/`desc_store` read them from `make_desc`.
            OpKind::MakeDesc { .. } => Vec::new(),
            OpKind::DescLoad { desc, offsets } => self.desc_access(*desc, *offsets, None, st),
            OpKind::DescStore { desc, offsets, value } => {
                if !self.tma_store(*desc, *offsets, *value) && !self.bulk_row_store(*desc, *offsets, *value) {
                    self.desc_access(*desc, *offsets, Some(*value), st);
                }
                Vec::new()
            }
            OpKind::Store { ptr, value, mask } => {
                self.store(*ptr, *value, *mask);
                Vec::new()
            }
            OpKind::Atomic { op: aop, ptr, value, mask, sem, scope } => {
                let (aop, sem, scope) = (*aop, *sem, *scope);
                // A tensor-core accumulator added into memory (a split-K GEMM's partial tile,
                // the reduce-scatter epilogue's weighted rows): each thread's elements where
                // they are, the pointer evaluated (or its loads read again) at their coordinates.
                if let Some((l, regs)) = self.mma_held.get(value).cloned() {
                    if self.reloadable(*ptr, op) && mask.is_none_or(|m| self.reloadable(m, op)) {
                        let olds = self.atomic_from_mma(data.results[0], (aop, sem, scope), *ptr, *mask, l, &regs);
                        self.mma_held.insert(data.results[0], (l, olds));
                        return Ok(());
                    }
                }
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
                    let w = self.vector_atomic_width(data.results[0], *ptr, (aop, sem), st);
                    if w > 1 {
                        self.tile_vector_atomic((&shape, *ptr), (&p, &v), m.as_deref(), w, (aop, sem, scope));
                        return Ok(());
                    }
                    // An exchange whose old values are unused is an atomic store (`st.relaxed.sys`
                    // where the sender of the low-latency protocol writes a flagged word).
                    let store = aop == AtomicOp::Xchg
                        && !self.used.contains(&data.results[0])
                        && matches!(sem, MemSemantic::Relaxed | MemSemantic::Release)
                        && matches!(shared_size(st), 4 | 8);
                    self.tile_atomic(data.results[0], &shape, st, &p, m.as_deref(), &|dst, s, pred| match store {
                        true => Inst::AtomicStore { addr: p[s], value: v[s], pred, sem, scope },
                        false => Inst::Atomic { dst, op: aop, addr: p[s], value: v[s], pred, sem, scope },
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
            OpKind::For { .. } => {
                let staged = self.staged_plan(op);
                return self.lower_for(op, staged);
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
                self.smem.enter_loop();
                let lowered = self.region(*cond, &[]).and_then(|c| Ok((c, self.region(*body, &[])?)));
                self.smem.leave_loop();
                let ((cond_body, cy), (body_insts, nexts)) = lowered?;
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
            OpKind::Notify { sig, rank, value, op: sop, scope } => {
                let (s0, r, v) = (self.held(*sig)[0], self.held(*rank)[0], self.held(*value)[0]);
                // Stamped before the signal is written, so that on one clock every wait it
                // satisfies ends after it.
                self.trace_signal(op, EventKind::Notify, *sig, s0);
                if self.inter_node(Some(*scope)) {
                    self.notify_inter_node(s0, r, v, *sop);
                } else {
                    let target = self.symm_at(s0, r);
                    self.release_then_signal(target, v, *sop);
                }
                Vec::new()
            }
            OpKind::Wait { sigs, count, cmp, value, .. } => {
                let (b, c, v) = (self.held(*sigs)[0], self.held(*count)[0], self.held(*value)[0]);
                self.trace_signal(op, EventKind::WaitBegin, *sigs, b);
                self.emit(Inst::WaitSignals { base: b, count: c, cmp: *cmp, value: v });
                // What the wait acquired is read by TMA too (an AG-GEMM's gathered rows): the
                // async proxy is ordered after it.
                if self.target.has_async_copy(AsyncCopy::Tma) {
                    self.emit(Inst::FenceProxyAsyncGlobal);
                }
                self.trace_signal(op, EventKind::WaitEnd, *sigs, b);
                let t = self.reg(U64);
                self.emit(Inst::Const { dst: t, value: Literal::Int(0) });
                vec![t]
            }
            // Every thread polls its own slots (replicas of a wrapped layout poll the same word:
            // loads, no effect); each slot is one bounded wait of the protocol expansion.
            OpKind::LoadFlagged { ptr, flag, mask } => {
                let (p, f) = (self.held(*ptr), self.held(*flag)[0]);
                let m = mask.map(|m| self.held(m));
                let mut out = Vec::with_capacity(p.len());
                for (s, &addr) in p.iter().enumerate() {
                    let dst = self.reg(st);
                    let pred = m.as_ref().map(|m| m[s.min(m.len() - 1)]);
                    self.emit(Inst::WaitFlag { dst, addr, pred, flag: f });
                    out.push(dst);
                }
                out
            }
            OpKind::SignalWaitUntil { sig, cmp, value } => {
                let (b, v) = (self.held(*sig)[0], self.held(*value)[0]);
                let one = self.iconst(1);
                self.trace_signal(op, EventKind::WaitBegin, *sig, b);
                self.emit(Inst::WaitSignals { base: b, count: one, cmp: *cmp, value: v });
                self.trace_signal(op, EventKind::WaitEnd, *sig, b);
                let seen = self.reg(U64);
                self.emit(Inst::Load { dst: seen, addr: b, pred: None, other: None });
                vec![seen]
            }
            OpKind::Fence | OpKind::Quiet if self.inter_node(None) => {
                let call = if matches!(data.kind, OpKind::Fence) { DeviceCall::Fence } else { DeviceCall::Quiet };
                self.emit(Inst::Barrier);
                self.device_call(call, &[], None);
                self.emit(Inst::Barrier);
                Vec::new()
            }
            OpKind::Fence | OpKind::Quiet => {
                // Transfers are stores by the program's threads: the barrier gathers them, each
                // thread's fence orders its own.
                self.emit(Inst::Barrier);
                self.emit(Inst::Fence { scope: Scope::Sys });
                Vec::new()
            }
            OpKind::Put { dst, src, bytes, rank, nbi, .. } | OpKind::Get { dst, src, bytes, rank, nbi, .. }
                if self.inter_node(None) =>
            {
                let call = match data.kind {
                    OpKind::Put { .. } => DeviceCall::PutBlock { nbi: *nbi },
                    _ => DeviceCall::GetBlock { nbi: *nbi },
                };
                self.transfer_inter_node(call, &[*dst, *src, *bytes, *rank]);
                Vec::new()
            }
            OpKind::Put { dst, src, bytes, rank, .. } | OpKind::Get { dst, src, bytes, rank, .. } => {
                let is_put = matches!(data.kind, OpKind::Put { .. });
                self.transfer(is_put, *dst, *src, *bytes, *rank);
                Vec::new()
            }
            OpKind::PutSignal { dst, src, bytes, sig, sig_value, sig_op, rank, nbi, .. } if self.inter_node(None) => {
                let call = DeviceCall::PutSignalBlock { nbi: *nbi, op: *sig_op };
                self.transfer_inter_node(call, &[*dst, *src, *bytes, *sig, *sig_value, *rank]);
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
                if self.inter_node(None) {
                    // Puts through the library complete before the (load/store) count.
                    self.quiet_all();
                }
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

    fn bind_results(&mut self, op: Op, results: Vec<Vec<Reg>>) {
        let rs = self.func.ops[op].results.clone();
        for (r, regs) in rs.into_iter().zip(results) {
            self.vals.insert(r, regs);
        }
    }
}

/// The ops that read each value (an op once per operand it reads it as).
fn users_of(func: &Function) -> HashMap<Value, Vec<Op>> {
    let mut users: HashMap<Value, Vec<Op>> = HashMap::default();
    for (o, d) in func.ops.iter() {
        for (_, v) in d.kind.operands() {
            users.entry(v).or_default().push(o);
        }
    }
    users
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
/// Ops that touch no memory and no other thread: index math, constants, program ids, tensor
/// descriptors (what may come before a warp-specialized or persistent K loop).
fn effect_free(k: &OpKind) -> bool {
    is_index_math(k)
        || matches!(
            k,
            OpKind::Const(_)
                | OpKind::ProgramId(_)
                | OpKind::NumPrograms(_)
                | OpKind::MakeDesc { .. }
                | OpKind::Splat(_)
        )
}

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
        let b = KernelBuilder::new("mm", LaunchAttrs { stages: 3, ..LaunchAttrs::default() });
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
        let f = b.finish().unwrap();
        let k = lower(&f, &crate::target::SM_90A).unwrap();
        let commits = |body: &[Inst]| body.iter().filter(|i| matches!(i, Inst::AsyncCommit)).count();
        assert_eq!(commits(&k.body), 2, "two steps issued before the loop");
        let Some(Inst::Loop { body, .. }) = k.body.iter().find(|i| matches!(i, Inst::Loop { .. })) else { panic!() };
        assert_eq!(commits(body), 1);
        assert!(matches!(body[0], Inst::AsyncWait { pending: 1 }));
        assert!(body.iter().any(|i| matches!(i, Inst::AsyncCopy { .. })));
        // sm_90a: the step is two wgmma m64n64k16 from swizzled stages (made visible to the
        // async proxy), one group left in flight; the loop's exit waits for it.
        assert_eq!(body.iter().filter(|i| matches!(i, Inst::Wgmma { n: 64, trans_b: true, .. })).count(), 2);
        assert!(body.iter().any(|i| matches!(i, Inst::FenceProxyAsync)));
        assert!(body.iter().any(|i| matches!(i, Inst::WgmmaWait { pending: 1 })));
        assert!(!body.iter().any(|i| matches!(i, Inst::Matmul { .. } | Inst::MatrixLoad { .. })));
        assert!(k.body.iter().any(|i| matches!(i, Inst::WgmmaWait { pending: 0 })));
        assert!(!body.iter().any(|i| matches!(i, Inst::VLoad { .. })), "operands do not pass through registers");
        // sm_80: mma.sync on ldmatrix fragments.
        let k80 = lower(&f, &crate::target::SM_80).unwrap();
        let Some(Inst::Loop { body: b80, .. }) = k80.body.iter().find(|i| matches!(i, Inst::Loop { .. })) else {
            panic!()
        };
        assert!(
            b80.iter().any(|i| matches!(i, Inst::Matmul { .. }))
                && !b80.iter().any(|i| matches!(i, Inst::Wgmma { .. }))
        );
        // gfx942 has no asynchronous copies: the next step's operands are loaded into registers
        // before this step's MFMAs and stored to the other stage after them, one barrier a step.
        let k = lower(&f, &crate::target::GFX942).unwrap();
        let Some(Inst::Loop { body, .. }) = k.body.iter().find(|i| matches!(i, Inst::Loop { .. })) else { panic!() };
        let at = |p: &dyn Fn(&Inst) -> bool| body.iter().position(p).expect("present");
        assert!(!body.iter().any(|i| matches!(i, Inst::AsyncCopy { .. } | Inst::AsyncWait { .. })));
        assert_eq!(body.iter().filter(|i| matches!(i, Inst::Barrier)).count(), 1);
        let (load, mfma) = (at(&|i| matches!(i, Inst::VLoad { .. })), at(&|i| matches!(i, Inst::Matmul { .. })));
        let store = body.iter().rposition(|i| matches!(i, Inst::SharedVStore { .. })).expect("stores");
        assert!(load < mfma && mfma < store, "load {load}, mfma {mfma}, store {store}");
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

    /// A tensor-core accumulator added into rows picked by a loaded index (the MoE
    /// reduce-scatter epilogue's shape) stays in its layout: no conversion through shared
    /// memory, the indices read again at each element's row, column pairs as 2-wide vector
    /// atomics on sm_90a (element atomics on sm_80).
    #[test]
    fn accumulators_add_into_gathered_rows_where_they_are() {
        let b = KernelBuilder::new("scatter", LaunchAttrs::default());
        let (x, y) = (b.arg_ptr("x", DType::BF16), b.arg_ptr("y", DType::BF16));
        let (rows, acc) = (b.arg_ptr("rows", DType::I32), b.arg_ptr("acc", DType::F32));
        let (i, k) = (b.arange(0, 64), b.arange(0, 32));
        let xa = b.load(x + i.expand_dims(1) * 32i32 + k.expand_dims(0), None, None);
        let ya = b.load(y + k.expand_dims(1) * 64i32 + i.expand_dims(0), None, None);
        let out = b.dot(xa, ya, b.zeros(&[64, 64], DType::F32), InputPrecision::Ieee);
        let row = b.load(rows + i, None, None);
        let at = acc + row.expand_dims(1) * 64i32 + i.expand_dims(0);
        b.atomic(AtomicOp::Add, at, out, None, MemSemantic::Relaxed, Scope::Sys);
        let f = b.finish().unwrap();
        use crate::simt::count;
        let pairs = |i: &Inst| matches!(i, Inst::VAtomic { values, .. } if values.len() == 2);
        let k = lower(&f, &crate::target::SM_90A).unwrap();
        assert!(count(&k.body, &pairs) > 0);
        let f32_to_shared = |i: &Inst| matches!(i, Inst::SharedStore { value, .. } if k.ty(*value) == SType::F32);
        assert_eq!(count(&k.body, &f32_to_shared), 0);
        let k = lower(&f, &crate::target::SM_80).unwrap();
        assert_eq!(count(&k.body, &pairs), 0);
        assert!(count(&k.body, &|i| matches!(i, Inst::Atomic { .. })) > 0);
    }

    #[test]
    fn unused_f32_atomic_adds_go_as_vectors_where_the_target_has_them() {
        // 1024 f32 adds over 128 threads, 8 consecutive each: two `red.v4` a thread on sm_90a,
        // each with its element fallback (alignment unknown); element atomics elsewhere or when
        // the old values are used.
        let build = |use_old: bool| {
            let b = KernelBuilder::new("acc", LaunchAttrs::default());
            let (x, acc) = (b.arg_ptr("x", DType::F32), b.arg_ptr("acc", DType::F32));
            let offs = b.arange(0, 1024);
            let m = offs.lt(1000);
            let old = b.atomic(
                AtomicOp::Add,
                acc + offs,
                b.load(x + offs, Some(m), None),
                Some(m),
                MemSemantic::Relaxed,
                Scope::Gpu,
            );
            if use_old {
                b.store(x + offs, old, Some(m));
            }
            b.finish().unwrap()
        };
        let count = |k: &Kernel, f: &dyn Fn(&Inst) -> bool| k.body.iter().filter(|i| f(i)).count();
        let vector = |i: &Inst| matches!(i, Inst::VAtomic { values, pred: Some(_), .. } if values.len() == 4);
        let element = |i: &Inst| matches!(i, Inst::Atomic { .. });
        let k = lower(&build(false), &crate::target::SM_90A).unwrap();
        assert_eq!((count(&k, &vector), count(&k, &element)), (2, 8));
        for (f, t) in [(build(true), &crate::target::SM_90A), (build(false), &crate::target::SM_80)] {
            let k = lower(&f, t).unwrap();
            assert_eq!((count(&k, &vector), count(&k, &element)), (0, 8), "{}", t.name);
        }
    }

    /// A product tile stored through a descriptor made in the kernel (base computed) goes
    /// out by bulk row copies on sm_90a, and a notify after it waits for their writes (the
    /// asynchronous proxy's) before its release; sm_80 stores element by element and has
    /// nothing to wait for.
    #[test]
    fn a_notify_after_bulk_row_stores_waits_for_their_writes() {
        let b = KernelBuilder::new("rows", LaunchAttrs::default());
        let (x, y) = (b.arg_ptr("x", DType::BF16), b.arg_ptr("y", DType::BF16));
        let c = b.arg_ptr_aligned("c", DType::BF16, 16);
        let sig = b.arg_ptr("sig", DType::U64);
        let (rows, n) = (b.arg("rows", DType::I32), b.arg_multiple_of("n", DType::I32, 8));
        let i = b.arange(0, 64);
        let k = b.arange(0, 32);
        let xa = b.load(x + i.expand_dims(1) * 32i32 + k.expand_dims(0), None, None);
        let ya = b.load(y + k.expand_dims(1) * 64i32 + i.expand_dims(0), None, None);
        let out = b.dot(xa, ya, b.zeros(&[64, 64], DType::F32), InputPrecision::Ieee);
        let one = b.constant(Literal::Int(1), DType::I32);
        // Based past the parameter (a group's rows): no tensor map made on the host fits it.
        let d = b.make_desc(c + rows * n, [rows, n], [n, one], [64, 64]);
        b.desc_store(d, [0i32, 0i32], out.cast(DType::BF16));
        b.notify(sig, 0i32, 1u64, SignalOp::Set, CommScope::IntraNode);
        let f = b.finish().unwrap();
        fn flatten(body: &[Inst], out: &mut Vec<Inst>) {
            for i in body {
                out.push(i.clone());
                for b in i.bodies() {
                    flatten(b, out);
                }
            }
        }
        let flat = |k: &Kernel| {
            let mut v = Vec::new();
            flatten(&k.body, &mut v);
            v
        };
        let body = flat(&lower(&f, &crate::target::SM_90A).unwrap());
        let at = |p: &dyn Fn(&Inst) -> bool| body.iter().position(p);
        let store = at(&|i| matches!(i, Inst::BulkStore { .. })).expect("bulk row copies");
        let done = at(&|i| matches!(i, Inst::BulkWait { pending: 0, writes: true })).expect("a wait for the writes");
        let signal = at(&|i| matches!(i, Inst::Signal { .. })).unwrap();
        assert!(store < done && done < signal, "{store} {done} {signal}");
        let body = flat(&lower(&f, &crate::target::SM_80).unwrap());
        assert!(!body.iter().any(|i| matches!(i, Inst::BulkStore { .. } | Inst::BulkWait { .. })));
    }
}
