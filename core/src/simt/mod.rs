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

pub mod barriers;
pub mod contiguity;
pub mod inst;
pub mod layout;
pub mod lower;
pub mod passes;
pub mod print;
pub mod protocol;
pub mod smem;
pub mod tma;
pub mod trace;

pub use inst::{for_each_use, Family, Inst, RegSplit};
pub use lower::{lower, LowerError};

use crate::ir::{Axis, DType};
pub use crate::math::ApproxFn;

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
            // Storage only: the lowering refuses FP8 values before it types any
            // (`lower::support`), so no SIMT instruction ever sees this.
            DType::F8E4M3FN | DType::F8E5M2 => SType::Int { bits: 8, signed: false },
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
    /// The multiprocessor the program runs on (`%smid`; AMD: the CU, SH and SE bits of the
    /// hardware id; cpu-simt: 0), for timelines (`crate::trace`).
    SmId,
}

// The launch ABI (hidden parameters, wait record) lives in `crate::abi`; the lowering and the
// protocol expansion name them through these re-exports.
pub use crate::abi::{diag, Hidden, BARRIER_WORDS, HIDDEN_PARAMS};

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
    /// Groups of `warps` consumer warps (2 with consumer ping-pong, `LaunchAttrs::pingpong`:
    /// the layouts spread a tile over one group's `warps`, and the groups take tiles in turn).
    pub consumer_groups: u32,
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
        (self.warps * self.consumer_groups + self.producer_warps) * self.warp_size
    }

    pub fn ty(&self, r: Reg) -> SType {
        self.regs[r.0 as usize]
    }

    /// A new register of type `t` (the passes that rewrite a lowered kernel add theirs so).
    pub fn new_reg(&mut self, t: SType) -> Reg {
        self.regs.push(t);
        Reg(self.regs.len() as u32 - 1)
    }

    /// `dst = v` (an integer constant of type `t`) appended to `out`.
    pub fn push_const(&mut self, out: &mut Vec<Inst>, t: SType, v: i64) -> Reg {
        let dst = self.new_reg(t);
        out.push(Inst::Const { dst, value: crate::ir::Literal::Int(v) });
        dst
    }

    /// `dst = a op b` (of `a`'s type) appended to `out`.
    pub fn push_binary(&mut self, out: &mut Vec<Inst>, op: crate::ir::BinaryOp, a: Reg, b: Reg) -> Reg {
        let dst = self.new_reg(self.ty(a));
        out.push(Inst::Binary { dst, op, a, b });
        dst
    }

    /// `r` as a u64 appended to `out`: itself if it is one, an address's bits, an integer
    /// converted.
    pub fn push_u64(&mut self, out: &mut Vec<Inst>, r: Reg) -> Reg {
        const U64: SType = SType::Int { bits: 64, signed: false };
        match self.ty(r) {
            U64 => r,
            SType::Ptr => {
                let dst = self.new_reg(U64);
                out.push(Inst::Bitcast { dst, src: r });
                dst
            }
            _ => {
                let dst = self.new_reg(U64);
                out.push(Inst::Cast { dst, src: r });
                dst
            }
        }
    }

    /// True when some program may spin on a signal or a flagged word (`WaitSignals` or
    /// `WaitFlag` anywhere in the body): such a kernel needs whatever it waits for to make
    /// progress while it occupies the GPU.
    pub fn waits(&self) -> bool {
        count(&self.body, &|i| matches!(i, Inst::WaitSignals { .. } | Inst::WaitFlag { .. })) > 0
    }

    /// The kernel waits for the one before it on its stream ([`Inst::GridDependencyWait`]: the
    /// lowering put one there for a `LaunchAttrs::programmatic` kernel on a target with
    /// programmatic dependent launch), so it is launched as its programmatic dependent.
    pub fn programmatic(&self) -> bool {
        count(&self.body, &|i| matches!(i, Inst::GridDependencyWait)) > 0
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
