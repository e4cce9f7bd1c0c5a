//! The tile IR.
//!
//! A [`Function`] is one kernel specialization: typed parameters, launch attributes, and a body
//! of ops over scalar and tile values with structured control flow. It is Triton's level of
//! abstraction: a value is a whole tile (`tile<64x32xbf16>`), not a thread's share of it.
//!
//! # Invariants (established by [`crate::verify`], relied upon by every backend)
//!
//! * Every value has exactly one definition: a kernel parameter, a block argument, or one result
//!   of one op. A value may be used only where its definition dominates the use: later in the
//!   same block, or inside a region nested there. A region's values are not visible after it;
//!   results flow out of a region through its block's `yields` only.
//! * Operands of elementwise ops have identical types: the IR has no implicit broadcasting (the
//!   [`crate::builder`] inserts `splat`/`broadcast` ops where a user mixes shapes).
//! * Tile dimensions are powers of two. Scalars have an empty shape.
//! * Region blocks: a `for` body takes `(iv, carried..)` and yields the next carried values; an
//!   `if` has a then- and an else-block, each yielding the op's results; a `while` has a
//!   condition block taking the carried values and yielding one `i1`, and a body block taking
//!   the carried values and yielding their next values. The function body yields nothing.
//!
//! # Evaluation
//!
//! What each op computes (wrapping integers, division by zero, shifts, NaN-ignoring `min` and
//! `max`, accurate elementary functions, saturating casts, atomics once per element, ..) is
//! written down once, in [`semantics`] (`docs/SEMANTICS.md`).
//!
//! Ops of a block execute in order. An op that reads or writes memory does so for every element
//! whose mask is true (all elements without a mask); masked-off lanes of a `load` produce
//! `other` (or an unspecified value when `other` is absent). Ops on a scalar pointer (a scalar
//! `atomic`, `notify`, `wait`) execute once per program, by one thread, and their result reaches
//! every thread through the program barrier (so a scalar acquire orders the whole program's later
//! accesses). A scalar atomic with release semantics orders only that one thread's earlier
//! accesses: to publish what every thread stored, put a `barrier` before it, or use `notify`,
//! which is barrier + release + signal write.

pub mod arena;
pub mod semantics;
pub mod types;

pub use arena::{Arena, Handle};
pub use trident_shmem_abi::{CallParam, CmpOp, CommScope, DeviceCall, Group, MemSemantic, Scope, SignalOp, Vendor};
pub use types::{DType, Elem, Type};

use serde::Serialize;

/// A value: the result of an op, a block argument or a kernel parameter.
pub type Value = Handle<ValueData>;
/// An op in a function's op arena.
pub type Op = Handle<OpData>;
/// A block (region body) in a function's block arena.
pub type Block = Handle<BlockData>;

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    Param(u32),
    BlockArg { block: Block, index: u32 },
    Result { op: Op, index: u32 },
}

#[derive(Clone, Debug)]
pub struct ValueData {
    pub ty: Type,
    pub def: ValueDef,
}

/// A sequence of ops with arguments and yielded values (see the module invariants).
#[derive(Clone, Debug, Default)]
pub struct BlockData {
    pub args: Vec<Value>,
    pub ops: Vec<Op>,
    pub yields: Vec<Value>,
}

/// A position in the text IR, kept on ops that were parsed so that errors can point at them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub line: u32,
    pub col: u32,
}

impl std::fmt::Display for Loc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

#[derive(Clone, Debug)]
pub struct OpData {
    pub kind: OpKind,
    pub results: Vec<Value>,
    pub loc: Option<Loc>,
}

/// A scalar constant.
#[derive(Clone, Copy, Debug, Serialize)]
pub enum Literal {
    Int(i64),
    Float(f64),
}

impl PartialEq for Literal {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Literal::Int(a), Literal::Int(b)) => a == b,
            (Literal::Float(a), Literal::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Literal {
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Int(i) => i as f64,
            Literal::Float(f) => f,
        }
    }
}

trident_shmem_abi::keyword_enum! {
    /// A grid axis.
    Axis { X = "x", Y = "y", Z = "z" }
}

impl Axis {
    pub fn index(self) -> usize {
        self as usize
    }
}

trident_shmem_abi::keyword_enum! {
    /// Elementwise one-operand ops.
    UnaryOp {
        Neg = "neg",
        /// Bitwise not on integers (logical not on `i1`).
        Not = "not",
        Abs = "abs",
        Exp = "exp",
        Exp2 = "exp2",
        Log = "log",
        Log2 = "log2",
        Sqrt = "sqrt",
        Rsqrt = "rsqrt",
        Sin = "sin",
        Cos = "cos",
        Tanh = "tanh",
        Floor = "floor",
        Ceil = "ceil",
        /// The error function.
        Erf = "erf",
        /// The logistic function `1 / (1 + exp(-x))`.
        Sigmoid = "sigmoid",
        /// `log(1 + x)`, accurate near 0.
        Log1p = "log1p",
        /// `exp(x) - 1`, accurate near 0.
        Expm1 = "expm1",
    }
}

impl UnaryOp {
    /// Ops defined on floating-point operands only.
    pub fn float_only(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs)
    }
}

trident_shmem_abi::keyword_enum! {
    /// Elementwise two-operand ops.
    BinaryOp {
        Add = "add",
        Sub = "sub",
        Mul = "mul",
        /// Integer division truncates toward zero (signedness from the type).
        Div = "div",
        Rem = "rem",
        Min = "min",
        Max = "max",
        And = "and",
        Or = "or",
        Xor = "xor",
        Shl = "shl",
        /// Arithmetic for signed, logical for unsigned integers.
        Shr = "shr",
        /// `lhs` to the power `rhs` (floats only; IEEE `pow`).
        Pow = "pow",
    }
}

impl BinaryOp {
    /// Ops defined on integers (and `i1`) only.
    pub fn int_only(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Shl | BinaryOp::Shr)
    }

    /// Ops defined on floats only.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Pow)
    }
}

trident_shmem_abi::keyword_enum! {
    /// Reductions along one axis.
    ReduceOp {
        Sum = "sum",
        Max = "max",
        Min = "min",
        /// Index (i32) of the first maximum along the axis.
        Argmax = "argmax",
        /// Index (i32) of the first minimum along the axis.
        Argmin = "argmin",
    }
}

trident_shmem_abi::keyword_enum! {
    /// How `dot` treats its inputs (f16/bf16 inputs always accumulate in f32).
    InputPrecision {
        /// f32 inputs used exactly.
        Ieee = "ieee",
        /// f32 inputs rounded to tf32 (10-bit mantissa): the GPU default for f32.
        Tf32 = "tf32",
        /// f32 inputs split into three bf16 products (near-f32 accuracy on bf16 tensor cores).
        Bf16x3 = "bf16x3",
    }
}

trident_shmem_abi::keyword_enum! {
    /// Read-modify-write atomic operations.
    AtomicOp {
        Add = "add",
        Max = "max",
        Min = "min",
        And = "and",
        Or = "or",
        Xor = "xor",
        Xchg = "xchg",
    }
}

/// Launch attributes of a kernel specialization; part of what a compile cache keys on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct LaunchAttrs {
    /// Warps per program.
    pub warps: u32,
    /// Software-pipelining depth of K loops.
    pub stages: u32,
    /// All programs resident at once; programs may wait on each other (`EXECUTION.md`).
    pub cooperative: bool,
    /// Elementary functions may use the hardware's approximations (`exp`, `log`, `sin`, ..
    /// within the bounds of `docs/ACCURACY.md`) instead of the accurate definitions.
    pub fast_math: bool,
    /// A pipelined K loop copied by TMA gets its own producer warp (`Kernel::producer_warps`,
    /// one warp beyond `warps`) that issues the copies while the `warps` run the matrix
    /// instructions, handing stages back and forth on mbarriers (where the target has TMA and
    /// `wgmma`; ignored elsewhere).
    pub warp_specialize: bool,
    /// The kernel walks its tiles itself (`for t in range(program_id, tiles, num_programs)`):
    /// a launch may run fewer programs along x than its grid asks, as many as the device holds
    /// at once (one per multiprocessor and more where they fit; per rank when ranks share the
    /// device), and a pipelined K loop in the tile loop keeps its copies running across tiles.
    pub persistent: bool,
    /// Every communication op of the kernel at inter-node scope: puts, gets, signals, fences and
    /// `barrier_all` become calls of the vendor library's device functions (NVSHMEM), as a
    /// `notify` at `inter_node` scope always does. Worlds set it to force that path where
    /// every rank shares a node (`trident test --processes --inter-node`).
    pub inter_node: bool,
    /// Consumer ping-pong (with `warp_specialize` and `persistent`, where the target has TMA
    /// and `wgmma`): two groups of `warps` consumer warps take the program's tiles in turn,
    /// one group's epilogue running under the other's main loop (`Kernel::consumer_groups`;
    /// `docs/DECISIONS.md`, "Consumer ping-pong"). A kernel whose tile loop the lowering
    /// cannot run so is refused.
    pub pingpong: bool,
    /// Every signal the kernel waits for on its own device is set by work enqueued before it
    /// on the same stream (or by other devices): nothing that must run beside it on this
    /// device produces one. Where a rank has its device to itself, a persistent launch of it
    /// then keeps every multiprocessor instead of leaving an eighth free for a producer
    /// (`gpu_runtime::persistent_grid`). Host orchestration that sets it promises the order;
    /// ranks sharing a device still leave room for each other.
    pub signalled_before: bool,
    /// The kernel records a timeline of each program (`crate::trace`): its last parameter is
    /// the trace buffer (`ptr<u64>`, added by `trace::instrument`), and the lowering records
    /// the program's start and end, each wait begun and satisfied, each notify and each
    /// persistent tile's epilogue there. Off, nothing of it is emitted.
    pub trace: bool,
    /// Tiles whose values of floating-point type are all 16-bit (a bf16 block of keys) take 8
    /// contiguous elements a thread in their layout, 16-byte loads and stores, rather than 4
    /// (the default of every shape). Integer, boolean and pointer tiles of the same shape follow.
    pub wide_vectors: bool,
    /// Launched as a programmatic dependent of the kernel before it on its stream, where the
    /// target has programmatic dependent launch (sm_90+): its programs may be scheduled while
    /// that kernel's last ones still run, and each waits at its start until that kernel has
    /// ended and its writes are visible (`griddepcontrol.wait`), so what it observes is stream
    /// order. It hides the launch's latency behind the kernel before; elsewhere it is ignored.
    pub programmatic: bool,
}

impl Default for LaunchAttrs {
    fn default() -> Self {
        LaunchAttrs {
            warps: 4,
            stages: 2,
            cooperative: false,
            fast_math: false,
            warp_specialize: false,
            persistent: false,
            inter_node: false,
            pingpong: false,
            signalled_before: false,
            trace: false,
            wide_vectors: false,
            programmatic: false,
        }
    }
}

/// What an op does. Operands are values of the same function.
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// A scalar constant of the result type.
    Const(Literal),
    /// This program's index along an axis (`i32`).
    ProgramId(Axis),
    /// Number of programs along an axis (`i32`).
    NumPrograms(Axis),
    /// `[start, end)` as a 1-D `i32` tile; `end - start` is the tile length.
    Arange {
        start: i64,
        end: i64,
    },
    /// A scalar repeated into a tile.
    Splat(Value),
    /// A tile expanded along its size-1 dimensions (same rank).
    Broadcast(Value),
    /// The same elements in row-major order under another shape (expand_dims is a reshape).
    Reshape(Value),
    /// Dimensions permuted: result dim `i` is operand dim `perm[i]`.
    Transpose {
        x: Value,
        perm: Vec<u32>,
    },
    Unary {
        op: UnaryOp,
        x: Value,
    },
    Binary {
        op: BinaryOp,
        lhs: Value,
        rhs: Value,
    },
    /// Elementwise comparison giving `i1`.
    Cmp {
        op: CmpOp,
        lhs: Value,
        rhs: Value,
    },
    Select {
        cond: Value,
        on_true: Value,
        on_false: Value,
    },
    /// Numeric conversion to the result's element type (round to nearest even; float to int
    /// truncates toward zero).
    Cast(Value),
    /// Pointer arithmetic: `ptr + offset` elements of the pointee type.
    AddPtr {
        ptr: Value,
        offset: Value,
    },
    /// Reduction along `axis`; the result drops that dimension (a 1-D tile reduces to a scalar).
    Reduce {
        op: ReduceOp,
        axis: u32,
        x: Value,
    },
    /// `acc + a @ b` for `a: [M, K]`, `b: [K, N]`, `acc: [M, N]`.
    Dot {
        a: Value,
        b: Value,
        acc: Value,
        precision: InputPrecision,
    },
    /// Loads through a pointer (tile); masked-off lanes give `other`.
    Load {
        ptr: Value,
        mask: Option<Value>,
        other: Option<Value>,
    },
    Store {
        ptr: Value,
        value: Value,
        mask: Option<Value>,
    },
    /// A 2-D tensor descriptor (like Triton's `make_tensor_descriptor`): the global tensor at
    /// `ptr` of `shape` (rows, columns) whose element (i, j) is at `ptr + i strides[0] + j
    /// strides[1]` (elements), read and written in blocks of the result's block shape. Its
    /// loads read 0 outside the tensor and its stores leave outside elements alone, so a kernel
    /// needs no edge masks. The result is used directly by `desc_load`/`desc_store` (never
    /// carried through a loop or branch), so a backend sees every descriptor's parts.
    MakeDesc {
        ptr: Value,
        shape: [Value; 2],
        strides: [Value; 2],
    },
    /// The block of `desc` whose first element is at (`offsets[0]`, `offsets[1]`); elements
    /// outside the tensor read 0.
    DescLoad {
        desc: Value,
        offsets: [Value; 2],
    },
    /// Writes `value` (a block of `desc`) at `offsets`; elements outside the tensor are not
    /// written.
    DescStore {
        desc: Value,
        offsets: [Value; 2],
        value: Value,
    },
    /// Read-modify-write; returns the old values.
    Atomic {
        op: AtomicOp,
        ptr: Value,
        value: Value,
        mask: Option<Value>,
        sem: MemSemantic,
        scope: Scope,
    },
    /// All threads of the program meet; their earlier memory accesses are ordered before any
    /// later access of any of them (`bar.sync`; a CTA-scope fence, not a release to others).
    Barrier,
    /// Compare-and-swap; returns the old values.
    AtomicCas {
        ptr: Value,
        expected: Value,
        desired: Value,
        sem: MemSemantic,
        scope: Scope,
    },
    /// `for iv in (lower..upper).step_by(step)` with loop-carried values.
    For {
        lower: Value,
        upper: Value,
        step: Value,
        init: Vec<Value>,
        body: Block,
    },
    If {
        cond: Value,
        then_block: Block,
        else_block: Block,
    },
    While {
        init: Vec<Value>,
        cond: Block,
        body: Block,
    },
    // --- distributed ops (`SHMEM.md`) ---
    /// This rank (`i32`).
    Rank,
    /// Number of ranks (`i32`).
    NumRanks,
    /// The address of the same symmetric object on `rank`.
    SymmAt {
        ptr: Value,
        rank: Value,
    },
    /// Program barrier, release fence at `scope`, then one thread updates the 64-bit signal.
    Notify {
        sig: Value,
        rank: Value,
        value: Value,
        op: SignalOp,
        scope: CommScope,
    },
    /// Spin until `count` consecutive signals from `sigs` satisfy `signal <cmp> value`.
    Wait {
        sigs: Value,
        count: Value,
        cmp: CmpOp,
        value: Value,
        scope: Scope,
        sem: MemSemantic,
    },
    /// Identity on `value` that orders it after the wait that produced `token`.
    ConsumeToken {
        value: Value,
        token: Value,
    },
    /// Copies `bytes` from local `src` to `dst` on `rank`.
    Put {
        dst: Value,
        src: Value,
        bytes: Value,
        rank: Value,
        group: Group,
        nbi: bool,
    },
    /// Copies `bytes` from `src` on `rank` to local `dst`.
    Get {
        dst: Value,
        src: Value,
        bytes: Value,
        rank: Value,
        group: Group,
        nbi: bool,
    },
    /// A put whose signal update on `rank` is delivered after the data.
    PutSignal {
        dst: Value,
        src: Value,
        bytes: Value,
        sig: Value,
        sig_value: Value,
        sig_op: SignalOp,
        rank: Value,
        group: Group,
        nbi: bool,
    },
    /// Loads a tile of 64-bit words once every unmasked word's flag (its high 32 bits) equals
    /// `flag` (the low-latency protocol: the data travels in the same word as its flag). Each
    /// word is polled with relaxed atomic loads at system scope, bounded by the wait bound like
    /// `wait`; masked-off elements give 0.
    LoadFlagged {
        ptr: Value,
        flag: Value,
        mask: Option<Value>,
    },
    /// Waits for one signal and returns its value (`u64`).
    SignalWaitUntil {
        sig: Value,
        cmp: CmpOp,
        value: Value,
    },
    /// Orders earlier puts before later puts to each rank.
    Fence,
    /// Completes every outstanding put of this program.
    Quiet,
    /// Every rank reaches this point with its earlier puts complete.
    BarrierAll {
        group: Group,
    },
}

impl OpKind {
    /// The op's spelling in the text IR.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            OpKind::Const(_) => "const",
            OpKind::ProgramId(_) => "program_id",
            OpKind::NumPrograms(_) => "num_programs",
            OpKind::Arange { .. } => "arange",
            OpKind::Splat(_) => "splat",
            OpKind::Broadcast(_) => "broadcast",
            OpKind::Reshape(_) => "reshape",
            OpKind::Transpose { .. } => "transpose",
            OpKind::Unary { op, .. } => op.as_str(),
            OpKind::Binary { op, .. } => op.as_str(),
            OpKind::Cmp { .. } => "cmp",
            OpKind::Select { .. } => "select",
            OpKind::Cast(_) => "cast",
            OpKind::AddPtr { .. } => "addptr",
            OpKind::Reduce { .. } => "reduce",
            OpKind::Dot { .. } => "dot",
            OpKind::Load { .. } => "load",
            OpKind::Store { .. } => "store",
            OpKind::MakeDesc { .. } => "make_desc",
            OpKind::DescLoad { .. } => "desc_load",
            OpKind::DescStore { .. } => "desc_store",
            OpKind::Atomic { .. } => "atomic",
            OpKind::AtomicCas { .. } => "atomic_cas",
            OpKind::Barrier => "barrier",
            OpKind::For { .. } => "for",
            OpKind::If { .. } => "if",
            OpKind::While { .. } => "while",
            OpKind::Rank => "rank",
            OpKind::NumRanks => "num_ranks",
            OpKind::SymmAt { .. } => "symm_at",
            OpKind::Notify { .. } => "notify",
            OpKind::Wait { .. } => "wait",
            OpKind::ConsumeToken { .. } => "consume_token",
            OpKind::Put { .. } => "put",
            OpKind::Get { .. } => "get",
            OpKind::PutSignal { .. } => "put_signal",
            OpKind::SignalWaitUntil { .. } => "signal_wait_until",
            OpKind::LoadFlagged { .. } => "load_flagged",
            OpKind::Fence => "fence",
            OpKind::Quiet => "quiet",
            OpKind::BarrierAll { .. } => "barrier_all",
        }
    }

    /// Value operands in a fixed order, with the name each has in error messages.
    pub fn operands(&self) -> Vec<(&'static str, Value)> {
        let mut v: Vec<(&'static str, Value)> = Vec::new();
        match self {
            OpKind::Const(_)
            | OpKind::ProgramId(_)
            | OpKind::NumPrograms(_)
            | OpKind::Arange { .. }
            | OpKind::Rank
            | OpKind::NumRanks
            | OpKind::Fence
            | OpKind::Quiet
            | OpKind::Barrier
            | OpKind::BarrierAll { .. } => {}
            OpKind::Splat(x) | OpKind::Broadcast(x) | OpKind::Reshape(x) | OpKind::Cast(x) => v.push(("x", *x)),
            OpKind::Transpose { x, .. } | OpKind::Unary { x, .. } | OpKind::Reduce { x, .. } => v.push(("x", *x)),
            OpKind::Binary { lhs, rhs, .. } | OpKind::Cmp { lhs, rhs, .. } => v.extend([("lhs", *lhs), ("rhs", *rhs)]),
            OpKind::Select { cond, on_true, on_false } => {
                v.extend([("cond", *cond), ("on_true", *on_true), ("on_false", *on_false)])
            }
            OpKind::AddPtr { ptr, offset } => v.extend([("ptr", *ptr), ("offset", *offset)]),
            OpKind::Dot { a, b, acc, .. } => v.extend([("a", *a), ("b", *b), ("acc", *acc)]),
            OpKind::Load { ptr, mask, other } => {
                v.push(("ptr", *ptr));
                v.extend(mask.map(|m| ("mask", m)));
                v.extend(other.map(|o| ("other", o)));
            }
            OpKind::Store { ptr, value, mask } => {
                v.extend([("ptr", *ptr), ("value", *value)]);
                v.extend(mask.map(|m| ("mask", m)));
            }
            OpKind::MakeDesc { ptr, shape, strides } => v.extend([
                ("ptr", *ptr),
                ("rows", shape[0]),
                ("cols", shape[1]),
                ("row_stride", strides[0]),
                ("col_stride", strides[1]),
            ]),
            OpKind::DescLoad { desc, offsets } => v.extend([("desc", *desc), ("row", offsets[0]), ("col", offsets[1])]),
            OpKind::DescStore { desc, offsets, value } => {
                v.extend([("desc", *desc), ("row", offsets[0]), ("col", offsets[1]), ("value", *value)])
            }
            OpKind::Atomic { ptr, value, mask, .. } => {
                v.extend([("ptr", *ptr), ("value", *value)]);
                v.extend(mask.map(|m| ("mask", m)));
            }
            OpKind::AtomicCas { ptr, expected, desired, .. } => {
                v.extend([("ptr", *ptr), ("expected", *expected), ("desired", *desired)])
            }
            OpKind::For { lower, upper, step, init, .. } => {
                v.extend([("lower", *lower), ("upper", *upper), ("step", *step)]);
                v.extend(init.iter().map(|x| ("init", *x)));
            }
            OpKind::If { cond, .. } => v.push(("cond", *cond)),
            OpKind::While { init, .. } => v.extend(init.iter().map(|x| ("init", *x))),
            OpKind::SymmAt { ptr, rank } => v.extend([("ptr", *ptr), ("rank", *rank)]),
            OpKind::Notify { sig, rank, value, .. } => v.extend([("sig", *sig), ("rank", *rank), ("value", *value)]),
            OpKind::Wait { sigs, count, value, .. } => {
                v.extend([("sigs", *sigs), ("count", *count), ("value", *value)])
            }
            OpKind::ConsumeToken { value, token } => v.extend([("value", *value), ("token", *token)]),
            OpKind::Put { dst, src, bytes, rank, .. } | OpKind::Get { dst, src, bytes, rank, .. } => {
                v.extend([("dst", *dst), ("src", *src), ("bytes", *bytes), ("rank", *rank)])
            }
            OpKind::PutSignal { dst, src, bytes, sig, sig_value, rank, .. } => v.extend([
                ("dst", *dst),
                ("src", *src),
                ("bytes", *bytes),
                ("sig", *sig),
                ("sig_value", *sig_value),
                ("rank", *rank),
            ]),
            OpKind::SignalWaitUntil { sig, value, .. } => v.extend([("sig", *sig), ("value", *value)]),
            OpKind::LoadFlagged { ptr, flag, mask } => {
                v.extend([("ptr", *ptr), ("flag", *flag)]);
                v.extend(mask.map(|m| ("mask", m)));
            }
        }
        v
    }

    /// Region blocks owned by this op.
    pub fn blocks(&self) -> Vec<Block> {
        match self {
            OpKind::For { body, .. } => vec![*body],
            OpKind::If { then_block, else_block, .. } => vec![*then_block, *else_block],
            OpKind::While { cond, body, .. } => vec![*cond, *body],
            _ => Vec::new(),
        }
    }

    /// Whether the op is one of the distributed ops of `SHMEM.md`.
    pub fn is_distributed(&self) -> bool {
        matches!(
            self,
            OpKind::Rank
                | OpKind::NumRanks
                | OpKind::SymmAt { .. }
                | OpKind::Notify { .. }
                | OpKind::Wait { .. }
                | OpKind::ConsumeToken { .. }
                | OpKind::Put { .. }
                | OpKind::Get { .. }
                | OpKind::PutSignal { .. }
                | OpKind::SignalWaitUntil { .. }
                | OpKind::LoadFlagged { .. }
                | OpKind::Fence
                | OpKind::Quiet
                | OpKind::BarrierAll { .. }
        )
    }
}

/// A kernel parameter.
#[derive(Clone, Debug)]
pub struct Param {
    /// Identifier used by the text format (`%a_ptr`) and by hosts binding arguments by name.
    pub name: String,
    pub value: Value,
    /// A fact the kernel declares about every argument it is launched with (like Triton's
    /// divisibility hints), checked at launch: for a pointer, its address is a multiple of this
    /// many bytes; for an integer, its value is a multiple of this. A power of two; `None`: no
    /// fact (pointers are then only known aligned to their element).
    pub divisibility: Option<u32>,
}

/// One kernel specialization.
#[derive(Clone, Debug)]
pub struct Function {
    pub name: String,
    pub params: Vec<Param>,
    pub attrs: LaunchAttrs,
    pub values: Arena<ValueData>,
    pub ops: Arena<OpData>,
    pub blocks: Arena<BlockData>,
    /// The top-level block; it has no arguments and yields nothing.
    pub body: Block,
}

impl Function {
    /// An empty function with the given parameter types.
    pub fn new(name: &str, params: &[(&str, Type)], attrs: LaunchAttrs) -> Function {
        let mut values = Arena::new();
        let params = params
            .iter()
            .enumerate()
            .map(|(i, (n, t))| Param {
                name: n.to_string(),
                value: values.append(ValueData { ty: t.clone(), def: ValueDef::Param(i as u32) }),
                divisibility: None,
            })
            .collect();
        let mut blocks = Arena::new();
        let body = blocks.append(BlockData::default());
        Function { name: name.to_string(), params, attrs, values, ops: Arena::new(), blocks, body }
    }

    pub fn ty(&self, v: Value) -> &Type {
        &self.values[v].ty
    }

    /// `v`'s value when it is a constant: a scalar `const`, or a splat of one.
    pub fn constant(&self, v: Value) -> Option<Literal> {
        let ValueDef::Result { op, .. } = self.values[v].def else { return None };
        match &self.ops[op].kind {
            OpKind::Const(l) => Some(*l),
            OpKind::Splat(x) => self.constant(*x),
            _ => None,
        }
    }

    /// Appends a new block with arguments of the given types.
    pub fn new_block(&mut self, arg_types: &[Type]) -> Block {
        let block = self.blocks.append(BlockData::default());
        let args = arg_types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                self.values.append(ValueData { ty: t.clone(), def: ValueDef::BlockArg { block, index: i as u32 } })
            })
            .collect();
        self.blocks[block].args = args;
        block
    }

    /// Appends an op to the end of `block`, creating result values of the given types.
    pub fn push_op(&mut self, block: Block, kind: OpKind, result_types: &[Type], loc: Option<Loc>) -> Op {
        let op = self.ops.append(OpData { kind, results: Vec::new(), loc });
        let results = result_types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                self.values.append(ValueData { ty: t.clone(), def: ValueDef::Result { op, index: i as u32 } })
            })
            .collect();
        self.ops[op].results = results;
        self.blocks[block].ops.push(op);
        op
    }

    /// The parameter a pointer value is derived from by pointer arithmetic (through tokens,
    /// splats and broadcasts, and with `through_symm_at` through `symm_at` too), if any.
    pub fn root_param(&self, mut v: Value, through_symm_at: bool) -> Option<u32> {
        loop {
            match self.values[v].def {
                ValueDef::Param(i) => return Some(i),
                ValueDef::Result { op, .. } => match self.ops[op].kind {
                    OpKind::AddPtr { ptr, .. } => v = ptr,
                    OpKind::SymmAt { ptr, .. } if through_symm_at => v = ptr,
                    OpKind::ConsumeToken { value, .. } => v = value,
                    OpKind::Splat(x) | OpKind::Broadcast(x) => v = x,
                    _ => return None,
                },
                ValueDef::BlockArg { .. } => return None,
            }
        }
    }

    /// The parameter with the given name.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }

    /// Visits every op reachable from the body in program order (regions depth-first).
    pub fn walk(&self, mut f: impl FnMut(Op, &OpData)) {
        fn rec(func: &Function, block: Block, f: &mut impl FnMut(Op, &OpData)) {
            let Some(b) = func.blocks.get(block) else {
                return;
            };
            for &op in &b.ops {
                let Some(data) = func.ops.get(op) else {
                    continue;
                };
                f(op, data);
                for blk in data.kind.blocks() {
                    rec(func, blk, f);
                }
            }
        }
        rec(self, self.body, &mut f)
    }
}
