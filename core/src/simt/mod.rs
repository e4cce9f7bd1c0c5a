//! The SIMT IR: a tile program after layout assignment, as the program of one thread.
//!
//! Every tile value of the tile IR becomes, in each thread, the registers holding the elements
//! that thread owns under the value's blocked layout ([`layout::Blocked`]); scalars are one
//! uniform register. Instructions are typed scalar operations on virtual registers, global loads
//! and stores (scalar or vector, with an optional predicate), shared memory, barriers, warp
//! shuffles, atomics, structured control flow, and the communication instructions (peer
//! addresses, signals, bounded waits). Both GPU backends consume this IR: the PTX writer and the
//! AMDGCN writer are straight translations of it, so layout decisions are made once, here, and the
//! CPU backend executes it to test them without a GPU.
//!
//! Ops outside what [`lower`] handles are reported as [`LowerError::Unsupported`] naming the op,
//! so a backend never emits wrong code for them. MMA layouts, `cp.async`/TMA and warp
//! specialization replace the shared-memory `dot` where performance needs them.
//!
//! # What a writer implements
//!
//! The lowering expands everything whose meaning is not one instruction on every GPU (the
//! semantics of `docs/SEMANTICS.md`), so the instructions a writer translates are *primitives*
//! with one meaning, and `cpu-simt` faults where the lowering breaks this contract:
//!
//! * Integer `Binary`, `Unary` and `Cmp` act on 32- and 64-bit registers only (the lowering
//!   widens 8/16-bit integers and `i1` arithmetic) and wrap. `Div`/`Rem` get a nonzero divisor
//!   and never `MIN / -1`; shift amounts are below the width. (The IR's rules for division by
//!   zero and wide shifts are selects around these.)
//! * Float `Binary`, `Unary`, `Cmp` and `Fma` act on f32 and f64 registers only (f16/bf16 values
//!   are converted). `add`, `sub`, `mul`, `div`, `sqrt` and `fma` are correctly rounded with
//!   subnormals kept. `Min`/`Max` are IEEE minNum/maxNum: a NaN operand gives the other one,
//!   the sign of a zero result is unspecified (the lowering fixes it). The only float `Unary`
//!   ops are `neg`, `abs`, `sqrt`, `floor` and `ceil`; `exp`, `log`, .. arrive expanded
//!   (`crate::math`), or as [`Inst::Approx`] under fast math. Comparisons are ordered, but
//!   `ne`, which is true when an operand is NaN.
//! * `Cast`: integer to integer truncates, then sign- or zero-extends as the destination type
//!   says; float to a 32- or 64-bit integer truncates toward zero, saturating (a NaN gives
//!   any value: the lowering selects 0); to and
//!   between floats rounds to nearest even; to `i1` is `!= 0` (NaN gives 1); from `i1` is 1/0.
//!   `Bitcast` reinterprets bits of the same width.

pub mod contiguity;
pub mod layout;
pub mod lower;
pub mod passes;
pub mod print;
pub mod protocol;
pub mod smem;
pub mod tma;

pub use lower::{lower, LowerError};

use crate::ir::{AtomicOp, Axis, BinaryOp, CmpOp, DType, Literal, MemSemantic, Scope, SignalOp, UnaryOp};
pub use crate::math::ApproxFn;
use crate::target::MatrixAtom;

/// A per-thread scalar type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SType {
    Pred,
    Int {
        bits: u8,
        signed: bool,
    },
    F16,
    BF16,
    F32,
    F64,
    /// A global address.
    Ptr,
}

impl SType {
    pub fn of(d: DType) -> SType {
        match d {
            DType::I1 => SType::Pred,
            DType::I8 => SType::Int { bits: 8, signed: true },
            DType::I16 => SType::Int { bits: 16, signed: true },
            DType::I32 => SType::Int { bits: 32, signed: true },
            DType::I64 => SType::Int { bits: 64, signed: true },
            DType::U8 => SType::Int { bits: 8, signed: false },
            DType::U16 => SType::Int { bits: 16, signed: false },
            DType::U32 => SType::Int { bits: 32, signed: false },
            DType::U64 => SType::Int { bits: 64, signed: false },
            DType::F16 => SType::F16,
            DType::BF16 => SType::BF16,
            DType::F32 => SType::F32,
            DType::F64 => SType::F64,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, SType::F16 | SType::BF16 | SType::F32 | SType::F64)
    }
}

/// A virtual register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg(pub u32);

/// Hardware-provided values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Special {
    /// Thread index in the program (`%tid.x`).
    ThreadId,
    /// Program id along an axis (`%ctaid`).
    ProgramId(Axis),
    /// Programs along an axis (`%nctaid`).
    NumPrograms(Axis),
}

// The launch ABI (hidden parameters, wait record) lives in `crate::abi`; the lowering and the
// protocol expansion name them through these re-exports.
pub use crate::abi::{diag, Hidden, BARRIER_WORDS, HIDDEN_PARAMS};

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
    /// `d = a b + c` by a warpgroup (4 consecutive warps) on `wgmma.mma_async.m64nNk16`: A is
    /// 64 x 16 K-major and B 16 x `n` (N-major with `trans_b`, else K-major), both read from
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
        ab: SType,
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
    Specialized {
        consumer_warps: u32,
        producer: Vec<Inst>,
        consumer: Vec<Inst>,
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
    /// Closes the thread's bulk group of `TmaStore`s (`cp.async.bulk.commit_group`).
    BulkCommit,
    /// Waits until all but the `pending` most recent of the thread's bulk groups have read
    /// their shared memory (`cp.async.bulk.wait_group.read pending`).
    BulkWait {
        pending: u32,
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

/// A named object in a program's shared memory (LDS), placed by the lowering's allocator
/// (`lower/shared.rs`); objects whose lifetimes overlap never share bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedObject {
    pub name: &'static str,
    /// Byte offset in the program's shared memory.
    pub offset: u32,
    pub bytes: u32,
    pub align: u32,
    /// Swizzle of the rows (`Some(128)`: the 128-byte pattern of TMA and wgmma operands);
    /// `None`: plain (rows padded instead where bank conflicts matter).
    pub swizzle: Option<u32>,
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

/// How many instructions of `body`, nested bodies included, satisfy `f` (tests and tools
/// inspecting a lowering).
pub fn count(body: &[Inst], f: &dyn Fn(&Inst) -> bool) -> usize {
    body.iter().map(|i| f(i) as usize + i.bodies().into_iter().map(|b| count(b, f)).sum::<usize>()).sum()
}

/// A kernel as the program of one thread.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub name: String,
    /// Parameter names and types, in launch order.
    pub params: Vec<(String, SType)>,
    /// Type of every register.
    pub regs: Vec<SType>,
    pub body: Vec<Inst>,
    /// The target the kernel was lowered for.
    pub target: &'static crate::target::TargetDesc,
    /// Threads per program = (warps + producer_warps) x warp size; layouts spread tiles over
    /// `warps`.
    pub warps: u32,
    /// Warps beyond `warps` that only run the producer side of an [`Inst::Specialized`].
    pub producer_warps: u32,
    pub warp_size: u32,
    /// Bytes of shared memory a program uses.
    pub shared_bytes: u32,
    /// The shared-memory objects, in program order of their allocation.
    pub shared_objects: Vec<SharedObject>,
    /// The tensor maps `TmaLoad`s read through (by index), passed after every other parameter
    /// (`tma`).
    pub tensor_maps: Vec<tma::TensorMap>,
}

impl Kernel {
    pub fn threads(&self) -> u32 {
        (self.warps + self.producer_warps) * self.warp_size
    }

    pub fn ty(&self, r: Reg) -> SType {
        self.regs[r.0 as usize]
    }

    /// True when some program may spin on a signal (`WaitSignals` anywhere in the body): such a
    /// kernel needs whatever it waits for to make progress while it occupies the GPU.
    pub fn waits(&self) -> bool {
        count(&self.body, &|i| matches!(i, Inst::WaitSignals { .. })) > 0
    }

    /// The vendor library's device functions the kernel calls (empty unless some communication
    /// is at inter-node scope): a module that calls them must be linked with the library's
    /// device code and registered with it before it runs.
    pub fn device_calls(&self) -> Vec<trident_shmem_abi::DeviceCall> {
        fn walk(body: &[Inst], out: &mut Vec<trident_shmem_abi::DeviceCall>) {
            for i in body {
                if let Inst::DeviceCall { call, .. } = i {
                    if !out.contains(call) {
                        out.push(*call);
                    }
                }
                for b in i.bodies() {
                    walk(b, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.body, &mut out);
        out
    }
}
