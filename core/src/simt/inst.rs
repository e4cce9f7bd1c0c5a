//! The SIMT instruction ([`Inst`]), what each one reads ([`for_each_use`]) and the family
//! each belongs to ([`Family`]): the writers (PTX, LLVM IR for AMD, cpu-simt's executor) are
//! split by family, one file each, so that an instruction's translations sit side by side and
//! a new instruction must be placed in a family (the match of [`Inst::family`] is exhaustive).

use super::{Reg, SType, Special};
use crate::ir::{AtomicOp, BinaryOp, CmpOp, DType, Literal, MemSemantic, Scope, SignalOp, UnaryOp};
use crate::math::ApproxFn;
use crate::target::MatrixAtom;

/// One per-thread instruction. Operands are registers defined earlier.
#[derive(Clone, Debug, PartialEq)]
pub enum Inst {
    /// Kernel parameter `index`.
    Param {
        dst: Reg,
        index: u32,
    },
    Special {
        dst: Reg,
        which: Special,
    },
    Const {
        dst: Reg,
        value: Literal,
    },
    /// Elementwise math; f16/bf16 compute in f32 and round (the writer inserts conversions).
    Unary {
        dst: Reg,
        op: UnaryOp,
        src: Reg,
    },
    Binary {
        dst: Reg,
        op: BinaryOp,
        a: Reg,
        b: Reg,
    },
    Cmp {
        dst: Reg,
        op: CmpOp,
        a: Reg,
        b: Reg,
    },
    Select {
        dst: Reg,
        cond: Reg,
        on_true: Reg,
        on_false: Reg,
    },
    /// Conversion between the registers' types (see the module docs for its meaning).
    Cast {
        dst: Reg,
        src: Reg,
    },
    /// The same bits as another type of the same width (f32 <-> i32/u32, f64 <-> i64/u64).
    Bitcast {
        dst: Reg,
        src: Reg,
    },
    /// A hardware approximation of an f32 function (fast math only; `crate::math::ApproxFn`
    /// gives each one's documented error).
    Approx {
        dst: Reg,
        func: ApproxFn,
        src: Reg,
    },
    /// An 8-bit float conversion in hardware (targets with `TargetDesc::fp8_convert`, sm_89+):
    /// from `src`, the bits (`u8`) of a `format` value, to `dst` f16 (exact); or from `src` f32
    /// to `dst`, the `u8` bits of `format`'s value rounded to nearest even and saturated to the
    /// largest finite one, infinities included. A NaN gives a NaN code of the hardware's
    /// choosing (the lowering makes it 0x7F).
    Fp8Convert {
        dst: Reg,
        src: Reg,
        format: DType,
    },
    /// `dst = base + offset * scale` on addresses (`offset` is an integer register).
    AddrOffset {
        dst: Reg,
        base: Reg,
        offset: Reg,
        scale: u32,
    },
    /// Global load of `dst`'s type; lanes with a false `pred` keep `dst = other`.
    Load {
        dst: Reg,
        addr: Reg,
        pred: Option<Reg>,
        other: Option<Reg>,
    },
    Store {
        addr: Reg,
        value: Reg,
        pred: Option<Reg>,
    },
    /// Vector load of `dsts.len()` (2 or 4) consecutive elements of `dsts`' type from `addr`
    /// (aligned to the whole vector); lanes with a false `pred` keep `dsts = others` (or any value
    /// when `others` is empty).
    VLoad {
        dsts: Vec<Reg>,
        addr: Reg,
        pred: Option<Reg>,
        others: Vec<Reg>,
    },
    /// Vector store of `values` (2 or 4) to consecutive elements at `addr` (aligned).
    VStore {
        addr: Reg,
        values: Vec<Reg>,
        pred: Option<Reg>,
    },
    /// `dst = addr % bytes == 0` (`bytes` a power of two).
    IsAligned {
        dst: Reg,
        addr: Reg,
        bytes: u32,
    },
    /// Butterfly shuffle: `dst` gets `src` of lane `lane ^ lane_xor` of the same warp. Every lane
    /// of the warp executes it (uniform control flow).
    Shuffle {
        dst: Reg,
        src: Reg,
        lane_xor: u32,
    },
    /// `dst = a * b + c` (f32 or f64), one rounding.
    Fma {
        dst: Reg,
        a: Reg,
        b: Reg,
        c: Reg,
    },
    Mov {
        dst: Reg,
        src: Reg,
    },
    /// Store to the program's shared memory at a byte offset.
    SharedStore {
        offset: Reg,
        value: Reg,
        pred: Option<Reg>,
    },
    SharedLoad {
        dst: Reg,
        offset: Reg,
    },
    /// Vector load of `dsts` (2 or 4, one type) from consecutive shared-memory elements at
    /// `offset` (aligned to the whole vector).
    SharedVLoad {
        dsts: Vec<Reg>,
        offset: Reg,
    },
    /// Vector store of `values` (2 or 4, one type) to consecutive shared-memory elements at
    /// `offset` (aligned to the whole vector).
    SharedVStore {
        offset: Reg,
        values: Vec<Reg>,
    },
    /// Every thread of the program meets; shared-memory accesses before it are visible after it.
    Barrier,
    /// A barrier whose only purpose is to order the earlier accesses of shared bytes `offset ..
    /// offset + bytes` before the writes of the object that now takes them (a reuse barrier).
    /// Lowering bookkeeping: [`crate::simt::barriers::elide`] makes it a `Barrier` where an
    /// access of those bytes may not be behind one yet and drops it elsewhere; no writer sees it.
    SharedReuse {
        offset: u32,
        bytes: u32,
    },
    /// The object at shared bytes `offset .. offset + bytes` is not accessed after this point
    /// (lowering bookkeeping for [`crate::simt::barriers::elide`], which drops it).
    SharedFree {
        offset: u32,
        bytes: u32,
    },
    /// Global atomic read-modify-write of `value`'s type; `dst` gets the old value.
    Atomic {
        dst: Reg,
        op: AtomicOp,
        addr: Reg,
        value: Reg,
        pred: Option<Reg>,
        sem: MemSemantic,
        scope: Scope,
    },
    /// Global atomic reduction of `values` (2 or 4, f32, [`AtomicOp::Add`]) into consecutive
    /// elements at `addr` (aligned to the whole vector), old values not returned: one
    /// instruction where the target has it ([`crate::target::TargetDesc::vector_atomic_add`],
    /// sm_90's `red.global.add.v2/.v4.f32`). The lowering emits it only for an atomic whose
    /// result is unused.
    VAtomic {
        op: AtomicOp,
        addr: Reg,
        values: Vec<Reg>,
        pred: Option<Reg>,
        sem: MemSemantic,
        scope: Scope,
    },
    /// Global compare-and-swap: `dst` gets the old value; `desired` is stored where the old value
    /// equals `expected` (bitwise).
    AtomicCas {
        dst: Reg,
        addr: Reg,
        expected: Reg,
        desired: Reg,
        pred: Option<Reg>,
        sem: MemSemantic,
        scope: Scope,
    },
    /// Asynchronous copy of `bytes` (4, 8 or 16) from global `addr` to shared memory at
    /// `offset` (both aligned to `bytes`) where `pred` holds (`cp.async`); complete once a later
    /// `AsyncWait` lets its group through.
    AsyncCopy {
        offset: Reg,
        addr: Reg,
        bytes: u32,
        pred: Reg,
        /// Lanes where `pred` is false write `bytes` zeros instead of nothing (and read no
        /// global memory): a masked-off group of an operand tile.
        zero_fill: bool,
    },
    /// Closes the group of the thread's copies issued since the last commit.
    AsyncCommit,
    /// Waits until at most `pending` of the thread's committed groups are incomplete (shared
    /// memory written by the others is visible to other threads after a following `Barrier`).
    AsyncWait {
        pending: u32,
    },
    /// Warp-wide load of `dsts.len()` (1, 2 or 4) 8 x 8 matrices of 16-bit elements from shared
    /// memory, for targets with `TargetDesc::matrix_load` (`ldmatrix`). Lanes `8 j .. 8 j + 7`
    /// give (in `offset`, bytes) the rows of matrix `j`, 16 contiguous bytes each; lane `l`
    /// receives in `dsts[j]` (32 bits) row `l / 4`, columns `2 (l % 4)` and `+1` (low half
    /// first), or with `trans` column `l / 4`, rows `2 (l % 4)` and `+1`. Every lane of the
    /// warp executes it.
    MatrixLoad {
        dsts: Vec<Reg>,
        offset: Reg,
        trans: bool,
    },
    /// `d = a b + c` on one instruction tile of a matrix atom, by the atom's lanes together:
    /// `a` and `b` are the lane's fragment elements packed in pairs (element `2 p` in the low
    /// half of 32-bit register `p`), `c` and `d` its accumulator elements, all at the positions
    /// of the atom's lane maps; `ab` is the operands' element type. Every lane executes it.
    Matmul {
        atom: &'static MatrixAtom,
        d: Vec<Reg>,
        a: Vec<Reg>,
        b: Vec<Reg>,
        c: Vec<Reg>,
        ab: SType,
    },
    /// `dst` (u64) = the `wgmma` matrix descriptor of the operand tile at byte `offset` of
    /// shared memory, with leading- and stride-dimension byte offsets `lbo` and `sbo` and a
    /// swizzle of `swizzle` bytes (128, 64 or 32); the hardware's encoding
    /// ([`smem::Descriptor`]), shared addresses counted from the program's shared memory.
    MatrixDescriptor {
        dst: Reg,
        offset: Reg,
        lbo: u32,
        sbo: u32,
        swizzle: u32,
    },
    /// `d = a b + c` by a warpgroup (4 consecutive warps) on `wgmma.mma_async.m64nNkK`, where
    /// K is 32 bytes of `ab` (16 for f16/bf16, 32 for the 8-bit floats): A is 64 x K K-major
    /// and B K x `n` (N-major with `trans_b`, else K-major; FP8 is K-major only), both read from
    /// shared memory through the descriptors `a` and `b` ([`smem::element_address`]); `c` and
    /// `d` hold the lane's `n / 2` accumulator elements, warp `w` of the group rows `16 w ..` in
    /// the C layout of `mma.m16n8k16` for each 8 columns. Asynchronous: `d` may be read, and the
    /// operands' shared memory written, only after a `WgmmaWait` lets its group through. Every
    /// thread of the warpgroup executes it. With `scale_d` false (a uniform predicate) `c` is
    /// ignored: `d = a b`.
    Wgmma {
        d: Vec<Reg>,
        c: Vec<Reg>,
        a: Reg,
        b: Reg,
        n: u32,
        ab: DType,
        trans_b: bool,
        scale_d: Option<Reg>,
    },
    /// Orders the warpgroup's register accesses before the `Wgmma`s that follow
    /// (`wgmma.fence`).
    WgmmaFence,
    /// Closes the group of the warpgroup's `Wgmma`s issued since the last commit.
    WgmmaCommit,
    /// Waits until at most `pending` of the warpgroup's committed `Wgmma` groups are incomplete.
    WgmmaWait {
        pending: u32,
    },
    /// Makes the thread's earlier shared-memory writes (stores, completed `cp.async`) visible to
    /// the asynchronous proxy that `Wgmma` reads through (`fence.proxy.async.shared::cta`).
    FenceProxyAsync,
    /// Orders the thread's earlier global-memory accesses, and what an acquire before made
    /// visible to it, before its later asynchronous-proxy accesses of global memory (TMA copies):
    /// after a wait for data that other programs or ranks wrote (`fence.proxy.async.global`).
    FenceProxyAsyncGlobal,
    /// Waits until the kernel this one was launched as a programmatic dependent of has ended
    /// and its writes are visible; returns at once for a kernel launched otherwise
    /// (`griddepcontrol.wait`; `LaunchAttrs::programmatic`).
    GridDependencyWait,
    /// Threads with `pred` initialize the mbarrier (8 bytes) at shared byte `offset` for
    /// `count` arrivals per phase, in phase 0 (`mbarrier.init`).
    MbarrierInit {
        offset: Reg,
        count: u32,
        pred: Reg,
    },
    /// Makes initialized mbarriers visible to the asynchronous proxy (`fence.mbarrier_init`);
    /// a `Barrier` must follow before other threads use them.
    FenceMbarrierInit,
    /// Threads with `pred` end the mbarrier at `offset` (`mbarrier.inval`), so that its bytes may
    /// hold anything else.
    MbarrierInval {
        offset: Reg,
        pred: Reg,
    },
    /// Threads with `pred` arrive at the mbarrier at `offset` and announce `bytes` more of
    /// asynchronous transfer the current phase waits for (`mbarrier.arrive.expect_tx`). A phase
    /// completes when its arrivals are all in and its announced bytes have landed.
    MbarrierExpectTx {
        offset: Reg,
        bytes: u32,
        pred: Reg,
    },
    /// Threads with `pred` arrive at the mbarrier at `offset` (`mbarrier.arrive`).
    MbarrierArrive {
        offset: Reg,
        pred: Reg,
    },
    /// Warp specialization: warps `consumer_warps ..` (the producer) run `producer`, the others
    /// `consumer`. Each body is instructions without memory effects followed by one `Loop`, the
    /// two loops over the same iterations; the sides talk only through mbarriers (a side's waits
    /// come first in its loop body). Only consumer threads run what follows the region, and
    /// barriers after it count them only.
    ///
    /// With `pingpong` (the register holding each consumer thread's group, 0 or 1) the
    /// consumers are two groups of `consumer_warps / 2` warps that run `consumer` each on its
    /// own iterations (the loop's bounds and carried values differ by group); a barrier inside
    /// the region counts the thread's group only (`bar.sync 2 + group`), and one after it both.
    ///
    /// With `regs` the producer is a warpgroup (`Kernel::producer_warps` 4) whose first warp
    /// runs `producer` and whose others leave at once, and the registers are moved between the
    /// sides (`setmaxnreg`, sm_90a): the producer warpgroup keeps `regs.producer` per thread and
    /// each consumer warpgroup takes `regs.consumer`. Without it the producer is one warp and
    /// both sides have what the kernel was compiled with (168 for up to 384 threads).
    Specialized {
        consumer_warps: u32,
        producer: Vec<Inst>,
        consumer: Vec<Inst>,
        pingpong: Option<Reg>,
        regs: Option<RegSplit>,
    },
    /// Threads with `pred` copy the box of `Kernel::tensor_maps[map]` at shared byte `offset`
    /// (laid out as `TmaLoad` writes it) to the tensor at (`coords[0]`, `coords[1]`); elements
    /// outside the tensor are not written (`cp.async.bulk.tensor.2d` to global, a bulk group).
    /// The shared memory must be written and made visible to the asynchronous proxy
    /// (`FenceProxyAsync`, then a barrier) before, and not be reused until `BulkWait`.
    TmaStore {
        map: u32,
        offset: Reg,
        coords: [Reg; 2],
        pred: Reg,
    },
    /// Consumer ping-pong's order between the two groups' main loops (inside an
    /// [`Inst::Specialized`] region with `pingpong`): named barrier `id` counting both groups'
    /// threads; with `arrive` the group passes it without waiting (`bar.arrive`), else it waits
    /// there for the other group's arrival (`bar.sync`).
    GroupOrder {
        id: Reg,
        arrive: bool,
    },
    /// Threads with `pred` copy `bytes` (a multiple of 16) from shared byte `offset` to global
    /// address `addr`, both 16-byte aligned (`cp.async.bulk.global.shared::cta`, a bulk group):
    /// one row of a staged tile, where a tensor map cannot clip the rows. As for `TmaStore`, the
    /// shared memory must be written and made visible to the asynchronous proxy before, and not
    /// be reused until `BulkWait`.
    BulkStore {
        addr: Reg,
        offset: Reg,
        bytes: Reg,
        pred: Reg,
    },
    /// Closes the thread's bulk group of `TmaStore`s and `BulkStore`s
    /// (`cp.async.bulk.commit_group`).
    BulkCommit,
    /// Waits until all but the `pending` most recent of the thread's bulk groups have read
    /// their shared memory (`cp.async.bulk.wait_group.read pending`), or with `writes` have
    /// completed, their global writes made (`cp.async.bulk.wait_group pending`).
    BulkWait {
        pending: u32,
        writes: bool,
    },
    /// Waits until the phase of parity `parity` (0 or 1) of the mbarrier at `offset` has
    /// completed (`mbarrier.try_wait.parity` in a loop). Every thread executes it; the data the
    /// phase's copies brought is then visible to the thread and to the asynchronous proxy.
    MbarrierWait {
        offset: Reg,
        parity: Reg,
    },
    /// Threads with `pred` copy the box of `Kernel::tensor_maps[map]` whose first element is at
    /// (`coords[0]`, `coords[1]`) (row, column; either may lie outside the tensor, whose
    /// elements read 0) to shared byte `offset`, rows of the box one after the other swizzled
    /// as the map says; the copy's bytes complete on the mbarrier at `barrier`
    /// (`cp.async.bulk.tensor.2d`, asynchronous).
    TmaLoad {
        map: u32,
        offset: Reg,
        coords: [Reg; 2],
        barrier: Reg,
        pred: Reg,
    },
    /// `dst` (32 bits) = `lo` | `hi` << 16, two 16-bit values.
    Pack {
        dst: Reg,
        lo: Reg,
        hi: Reg,
    },
    /// `dst` (u64) = the target's clock in nanoseconds (`TargetDesc::clock`); only differences
    /// of two readings mean anything.
    Clock {
        dst: Reg,
    },
    /// One thread of the program (of its side of a warp-specialized region, of its consumer
    /// group) records an event of the timeline (`crate::trace`) with `label` and the argument
    /// `arg` (any integer or address; 0 without one). Only in kernels with
    /// `LaunchAttrs::trace`; [`super::trace::expand`] rewrites it into primitives at the end of
    /// the lowering, so no writer sees it.
    TraceEvent {
        kind: crate::trace::EventKind,
        label: u16,
        arg: Option<Reg>,
    },
    /// Atomic load of `dst`'s type (32 or 64 bits) with a memory semantic (relaxed or acquire)
    /// at a scope; lanes with a false `pred` get 0 and access nothing.
    AtomicLoad {
        dst: Reg,
        addr: Reg,
        pred: Option<Reg>,
        sem: MemSemantic,
        scope: Scope,
    },
    /// Atomic store of `value` (32 or 64 bits) with a memory semantic (relaxed or release) at a
    /// scope, where `pred` holds.
    AtomicStore {
        addr: Reg,
        value: Reg,
        pred: Option<Reg>,
        sem: MemSemantic,
        scope: Scope,
    },
    /// Every thread of the program meets (as [`Inst::Barrier`]); `dst` is true in every thread
    /// when `pred` is true in some thread.
    BarrierAny {
        dst: Reg,
        pred: Reg,
    },
    /// The threads of one warp vote (`vote.sync.any` over the whole warp): `dst` is true in
    /// each of them when `pred` is true in some. No other warp takes part; every thread of the
    /// warp reaches it together. The bounded wait of a warp-specialized region's producer
    /// (`protocol::expand`) keeps its poll uniform with it.
    WarpAny {
        dst: Reg,
        pred: Reg,
    },
    /// The program ends here (every thread reaches it together: uniform control flow).
    Exit,
    /// The instructions that follow, up to the next `Origin`, come from tile-IR op `op` (index in
    /// the function's op arena; `what` its mnemonic), written at `loc` in the text form when
    /// the kernel came from text. Writers turn it into line information (PTX `.loc`); cpu-simt
    /// names the op and its line in faults. It executes nothing.
    Origin {
        op: u32,
        what: &'static str,
        loc: Option<crate::ir::Loc>,
    },
    /// `phis = inits; for iv in lo..hi step step { body; phis = nexts }; results = phis`, with a
    /// uniform trip count (signed compare).
    Loop {
        iv: Reg,
        lo: Reg,
        hi: Reg,
        step: Reg,
        phis: Vec<Reg>,
        inits: Vec<Reg>,
        body: Vec<Inst>,
        nexts: Vec<Reg>,
        results: Vec<Reg>,
    },
    /// The address of the symmetric object at `ptr` on `rank` (`symm_at`). A protocol
    /// instruction: [`protocol::expand`] rewrites it into a rebase between two entries of the
    /// `__heap_bases` table for GPU writers; cpu-simt's worlds run it through their
    /// symmetric-heap map.
    SymmAt {
        dst: Reg,
        ptr: Reg,
        rank: Reg,
    },
    /// Memory fence at a scope (`fence.acq_rel.<scope>`).
    Fence {
        scope: Scope,
    },
    /// One thread (`pred`) updates a 64-bit signal with relaxed semantics at system scope.
    Signal {
        addr: Reg,
        value: Reg,
        op: SignalOp,
        pred: Reg,
    },
    /// Lanes `0..count` each spin (acquire, system scope) until the signal at `base + 8*lane`
    /// satisfies `signal <cmp> value`, or until `__wait_bound_ns` passed or another program
    /// aborted; a timed-out lane records the diagnostics record (rank, program, signal, expected,
    /// seen) once and raises the abort flag. Then all threads meet; if the flag is raised, the
    /// program returns. A protocol instruction: [`protocol::expand`] rewrites it into
    /// primitives for GPU writers (the clock read is the only target-specific part); cpu-simt's
    /// worlds run it on their scheduler, which detects deadlocks exactly.
    WaitSignals {
        base: Reg,
        count: Reg,
        cmp: CmpOp,
        value: Reg,
    },
    /// Each thread where `pred` holds (every thread without one) polls the 64-bit word at `addr`
    /// (relaxed, system scope) until its flag, the high 32 bits, equals `flag` (32 bits), or
    /// until `__wait_bound_ns` passed or another program aborted, with the diagnostics of
    /// [`Inst::WaitSignals`] (the word's address as the signal, the flag expected and seen);
    /// `dst` gets the word, 0 where `pred` is false. Then all threads meet; if the abort flag is
    /// raised, the program returns. A protocol instruction: [`protocol::expand`] rewrites it
    /// for GPU writers; cpu-simt's worlds run it on their scheduler.
    WaitFlag {
        dst: Reg,
        addr: Reg,
        pred: Option<Reg>,
        flag: Reg,
    },
    /// A device function of the vendor SHMEM library (the inter-node lowering), with
    /// `call.operands()` operands in order; only threads where `pred` holds call it (the
    /// `Block` forms: every thread of the program, together).
    DeviceCall {
        call: trident_shmem_abi::DeviceCall,
        args: Vec<Reg>,
        pred: Option<Reg>,
    },
    /// Uniform branch: `results` take the yields of the branch taken.
    If {
        cond: Reg,
        then_body: Vec<Inst>,
        then_yields: Vec<Reg>,
        else_body: Vec<Inst>,
        else_yields: Vec<Reg>,
        results: Vec<Reg>,
    },
    /// `phis = inits; loop { cond_body; if !cond break; body; phis = nexts }; results = phis`.
    While {
        phis: Vec<Reg>,
        inits: Vec<Reg>,
        cond_body: Vec<Inst>,
        cond: Reg,
        body: Vec<Inst>,
        nexts: Vec<Reg>,
        results: Vec<Reg>,
    },
}

impl Inst {
    /// The instruction lists nested in a region instruction (a loop's or while's bodies, an
    /// if's branches); empty for every other instruction.
    pub fn bodies(&self) -> Vec<&Vec<Inst>> {
        match self {
            Inst::Loop { body, .. } => vec![body],
            Inst::If { then_body, else_body, .. } => vec![then_body, else_body],
            Inst::While { cond_body, body, .. } => vec![cond_body, body],
            Inst::Specialized { producer, consumer, .. } => vec![producer, consumer],
            _ => Vec::new(),
        }
    }

    /// [`Inst::bodies`], to rewrite them.
    pub fn bodies_mut(&mut self) -> Vec<&mut Vec<Inst>> {
        match self {
            Inst::Loop { body, .. } => vec![body],
            Inst::If { then_body, else_body, .. } => vec![then_body, else_body],
            Inst::While { cond_body, body, .. } => vec![cond_body, body],
            Inst::Specialized { producer, consumer, .. } => vec![producer, consumer],
            _ => Vec::new(),
        }
    }
}

/// Registers per thread on each side of a warp-specialized region (`setmaxnreg`, sm_90a): the
/// producer warpgroup gives what it does not need (`producer`) to the consumer warpgroups
/// (`consumer`); both are multiples of 8 in 24..=256. Each of the four SM sub-partitions holds
/// 16,384 registers and a program's warps go to them round-robin, so with 8 consumer warps and
/// the producer warpgroup a sub-partition holds 2 consumer warps and 1 producer warp:
/// `2 x consumer + producer` registers per lane, at most 512.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegSplit {
    pub producer: u32,
    pub consumer: u32,
}

/// The family of an instruction: how the writers split their translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Register arithmetic: parameters, special registers, constants, unary, binary, compare,
    /// select, casts, approximations, address arithmetic, packing, `fma`, moves, the clock.
    Scalar,
    /// Global and shared memory: loads and stores (scalar and vector), alignment tests,
    /// `cp.async`.
    Memory,
    /// Matrix units and the asynchronous proxy: `mma`/`ldmatrix`, `wgmma`, descriptors,
    /// mbarriers, TMA loads and stores, bulk groups, proxy fences.
    Matrix,
    /// Synchronization and communication: barriers, warp shuffles, atomics, fences, signals,
    /// peer addresses, bounded waits, calls of the vendor library.
    Sync,
    /// Structured control flow and markers: loops, ifs, whiles, warp-specialized regions,
    /// exit, source locations.
    Control,
}

impl Inst {
    /// The instruction's [`Family`].
    pub fn family(&self) -> Family {
        match self {
            Inst::Param { .. }
            | Inst::Special { .. }
            | Inst::Const { .. }
            | Inst::Unary { .. }
            | Inst::Binary { .. }
            | Inst::Cmp { .. }
            | Inst::Select { .. }
            | Inst::Cast { .. }
            | Inst::Bitcast { .. }
            | Inst::Approx { .. }
            | Inst::Fp8Convert { .. }
            | Inst::AddrOffset { .. }
            | Inst::Pack { .. }
            | Inst::Fma { .. }
            | Inst::Mov { .. }
            | Inst::Clock { .. }
            | Inst::TraceEvent { .. } => Family::Scalar,
            Inst::Load { .. }
            | Inst::Store { .. }
            | Inst::VLoad { .. }
            | Inst::VStore { .. }
            | Inst::IsAligned { .. }
            | Inst::SharedStore { .. }
            | Inst::SharedLoad { .. }
            | Inst::SharedVLoad { .. }
            | Inst::SharedVStore { .. }
            | Inst::AsyncCopy { .. }
            | Inst::AsyncCommit
            | Inst::AsyncWait { .. } => Family::Memory,
            Inst::MatrixLoad { .. }
            | Inst::Matmul { .. }
            | Inst::MatrixDescriptor { .. }
            | Inst::Wgmma { .. }
            | Inst::WgmmaFence
            | Inst::WgmmaCommit
            | Inst::WgmmaWait { .. }
            | Inst::FenceProxyAsync
            | Inst::FenceProxyAsyncGlobal
            | Inst::MbarrierInit { .. }
            | Inst::FenceMbarrierInit
            | Inst::MbarrierInval { .. }
            | Inst::MbarrierExpectTx { .. }
            | Inst::MbarrierArrive { .. }
            | Inst::MbarrierWait { .. }
            | Inst::TmaStore { .. }
            | Inst::BulkStore { .. }
            | Inst::TmaLoad { .. }
            | Inst::BulkCommit
            | Inst::BulkWait { .. } => Family::Matrix,
            Inst::Shuffle { .. }
            | Inst::Barrier
            | Inst::SharedReuse { .. }
            | Inst::SharedFree { .. }
            | Inst::BarrierAny { .. }
            | Inst::WarpAny { .. }
            | Inst::GroupOrder { .. }
            | Inst::Atomic { .. }
            | Inst::VAtomic { .. }
            | Inst::AtomicCas { .. }
            | Inst::AtomicLoad { .. }
            | Inst::AtomicStore { .. }
            | Inst::SymmAt { .. }
            | Inst::Fence { .. }
            | Inst::Signal { .. }
            | Inst::WaitSignals { .. }
            | Inst::WaitFlag { .. }
            | Inst::GridDependencyWait
            | Inst::DeviceCall { .. } => Family::Sync,
            Inst::Specialized { .. }
            | Inst::Exit
            | Inst::Origin { .. }
            | Inst::Loop { .. }
            | Inst::If { .. }
            | Inst::While { .. } => Family::Control,
        }
    }
}

/// Calls `f` on every register `i` reads (not those of nested bodies).
pub fn for_each_use(i: &mut Inst, f: &mut dyn FnMut(&mut Reg)) {
    let opt = |r: &mut Option<Reg>, f: &mut dyn FnMut(&mut Reg)| {
        if let Some(r) = r {
            f(r)
        }
    };
    match i {
        Inst::Param { .. }
        | Inst::Special { .. }
        | Inst::Const { .. }
        | Inst::Barrier
        | Inst::SharedReuse { .. }
        | Inst::SharedFree { .. }
        | Inst::AsyncCommit
        | Inst::AsyncWait { .. }
        | Inst::WgmmaFence
        | Inst::WgmmaCommit
        | Inst::WgmmaWait { .. }
        | Inst::FenceProxyAsync
        | Inst::FenceProxyAsyncGlobal
        | Inst::GridDependencyWait
        | Inst::FenceMbarrierInit
        | Inst::BulkCommit
        | Inst::BulkWait { .. }
        | Inst::Specialized { pingpong: None, .. }
        | Inst::Clock { .. }
        | Inst::Exit
        | Inst::Origin { .. }
        | Inst::Fence { .. } => {}
        Inst::Specialized { pingpong: Some(g), .. } => f(g),
        Inst::TraceEvent { arg, .. } => opt(arg, f),
        Inst::Unary { src, .. }
        | Inst::Cast { src, .. }
        | Inst::Bitcast { src, .. }
        | Inst::Approx { src, .. }
        | Inst::Fp8Convert { src, .. } => f(src),
        Inst::Mov { src, .. } | Inst::Shuffle { src, .. } => f(src),
        Inst::Binary { a, b, .. } | Inst::Cmp { a, b, .. } => {
            f(a);
            f(b)
        }
        Inst::Select { cond, on_true, on_false, .. } => {
            f(cond);
            f(on_true);
            f(on_false)
        }
        Inst::AddrOffset { base, offset, .. } => {
            f(base);
            f(offset)
        }
        Inst::Load { addr, pred, other, .. } => {
            f(addr);
            opt(pred, f);
            opt(other, f)
        }
        Inst::Store { addr, value, pred } => {
            f(addr);
            f(value);
            opt(pred, f)
        }
        Inst::VLoad { addr, pred, others, .. } => {
            f(addr);
            opt(pred, f);
            for r in others.iter_mut() {
                f(r)
            }
        }
        Inst::VStore { addr, values, pred } => {
            f(addr);
            for r in values.iter_mut() {
                f(r)
            }
            opt(pred, f)
        }
        Inst::IsAligned { addr, .. } => f(addr),
        Inst::Fma { a, b, c, .. } => {
            f(a);
            f(b);
            f(c)
        }
        Inst::SharedStore { offset, value, pred } => {
            f(offset);
            f(value);
            opt(pred, f)
        }
        Inst::SharedLoad { offset, .. } | Inst::SharedVLoad { offset, .. } | Inst::MatrixLoad { offset, .. } => {
            f(offset)
        }
        Inst::SharedVStore { offset, values } => {
            f(offset);
            for r in values.iter_mut() {
                f(r)
            }
        }
        Inst::BarrierAny { pred, .. } | Inst::WarpAny { pred, .. } => f(pred),
        Inst::GroupOrder { id, .. } => f(id),
        Inst::Atomic { addr, value, pred, .. } => {
            f(addr);
            f(value);
            opt(pred, f)
        }
        Inst::VAtomic { addr, values, pred, .. } => {
            f(addr);
            for r in values.iter_mut() {
                f(r)
            }
            opt(pred, f)
        }
        Inst::AtomicCas { addr, expected, desired, pred, .. } => {
            f(addr);
            f(expected);
            f(desired);
            opt(pred, f)
        }
        Inst::AtomicLoad { addr, pred, .. } => {
            f(addr);
            opt(pred, f)
        }
        Inst::AtomicStore { addr, value, pred, .. } => {
            f(addr);
            f(value);
            opt(pred, f)
        }
        Inst::AsyncCopy { offset, addr, pred, .. } => {
            f(offset);
            f(addr);
            f(pred)
        }
        Inst::Matmul { a, b, c, .. } => {
            for r in a.iter_mut().chain(b.iter_mut()).chain(c.iter_mut()) {
                f(r)
            }
        }
        Inst::Pack { lo, hi, .. } => {
            f(lo);
            f(hi)
        }
        Inst::MatrixDescriptor { offset, .. } => f(offset),
        Inst::MbarrierInit { offset, pred, .. }
        | Inst::MbarrierInval { offset, pred }
        | Inst::MbarrierArrive { offset, pred }
        | Inst::MbarrierExpectTx { offset, pred, .. } => {
            f(offset);
            f(pred)
        }
        Inst::TmaStore { offset, coords, pred, .. } => {
            f(offset);
            f(&mut coords[0]);
            f(&mut coords[1]);
            f(pred)
        }
        Inst::BulkStore { addr, offset, bytes, pred } => {
            f(addr);
            f(offset);
            f(bytes);
            f(pred)
        }
        Inst::MbarrierWait { offset, parity } => {
            f(offset);
            f(parity)
        }
        Inst::TmaLoad { offset, coords, barrier, pred, .. } => {
            f(offset);
            f(&mut coords[0]);
            f(&mut coords[1]);
            f(barrier);
            f(pred)
        }
        Inst::Wgmma { c, a, b, scale_d, .. } => {
            for r in c.iter_mut() {
                f(r)
            }
            f(a);
            f(b);
            opt(scale_d, f)
        }
        Inst::SymmAt { ptr, rank, .. } => {
            f(ptr);
            f(rank)
        }
        Inst::Signal { addr, value, pred, .. } => {
            f(addr);
            f(value);
            f(pred)
        }
        Inst::WaitSignals { base, count, value, .. } => {
            f(base);
            f(count);
            f(value)
        }
        Inst::WaitFlag { addr, pred, flag, .. } => {
            f(addr);
            opt(pred, f);
            f(flag)
        }
        Inst::DeviceCall { args, pred, .. } => {
            for r in args.iter_mut() {
                f(r)
            }
            opt(pred, f)
        }
        Inst::Loop { lo, hi, step, inits, nexts, .. } => {
            f(lo);
            f(hi);
            f(step);
            for r in inits.iter_mut().chain(nexts.iter_mut()) {
                f(r)
            }
        }
        Inst::If { cond, then_yields, else_yields, .. } => {
            f(cond);
            for r in then_yields.iter_mut().chain(else_yields.iter_mut()) {
                f(r)
            }
        }
        Inst::While { inits, cond, nexts, .. } => {
            f(cond);
            for r in inits.iter_mut().chain(nexts.iter_mut()) {
                f(r)
            }
        }
    }
}
