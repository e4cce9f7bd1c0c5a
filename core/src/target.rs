//! GPU targets as data: what the shared lowering needs to know about a chip, asked as
//! questions of a [`TargetDesc`] instead of tests of its name.
//!
//! Backends register their targets with `inventory::submit!` (the NVIDIA backend `sm_80`,
//! `sm_90`, `sm_90a`; the AMD crate `gfx90a`, `gfx942`); [`lookup`] finds one by name, and an
//! unknown name is a typed error listing the known ones. The lowering (`simt::lower`) takes a
//! target: its wave size, shared-memory size, widest vector access, the matrix instructions it
//! has ([`MatrixAtom`], lane maps as data that `cpu-simt` executes), whether it has an
//! asynchronous global-to-shared copy, and so on.

use crate::ir::DType;

/// Who makes the chip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Vendor {
    Nvidia,
    Amd,
}

/// How many lanes execute one matrix instruction together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomScope {
    /// One warp of 32 lanes (`mma.sync`).
    Warp,
    /// Four warps of 32 lanes (`wgmma`).
    Warpgroup,
    /// One wave of 64 lanes (MFMA).
    Wave,
}

/// Where a matrix instruction reads its A and B operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperandSource {
    /// Per-lane registers, in the atom's fragment layout.
    Registers,
    /// Shared memory through a matrix descriptor (A may also come from registers).
    SharedDescriptor,
}

/// A field of a lane's index: `((lane >> shift) & (2^bits - 1)) * scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaneField {
    pub shift: u32,
    pub bits: u32,
    pub scale: u32,
}

const fn field(shift: u32, bits: u32, scale: u32) -> LaneField {
    LaneField { shift, bits, scale }
}

impl LaneField {
    pub fn eval(&self, lane: u32) -> u32 {
        ((lane >> self.shift) & ((1 << self.bits) - 1)) * self.scale
    }
}

/// Where element `i` of lane `lane`'s fragment sits in an operand tile: `(row, column)` =
/// the sums of the lane fields `row` and `col`, plus `elem(i)`. Every matrix instruction's
/// fragments are of this form, which lets the lowering compute a lane's part once and add
/// constants, and lets `cpu-simt` gather and scatter any atom's fragments.
#[derive(Clone, Copy, Debug)]
pub struct LaneMap {
    pub row: &'static [LaneField],
    pub col: &'static [LaneField],
    pub elem: fn(u32) -> (u32, u32),
}

impl LaneMap {
    pub fn eval(&self, lane: u32, i: u32) -> (u32, u32) {
        let (r, c) = (self.elem)(i);
        (r + self.row.iter().map(|f| f.eval(lane)).sum::<u32>(), c + self.col.iter().map(|f| f.eval(lane)).sum::<u32>())
    }
}

/// One matrix-multiply-accumulate instruction, as data: `D[m x n] = A[m x k] B[k x n] + C`,
/// computed by `lanes` lanes together, each holding `a_elems`, `b_elems` and `c_elems`
/// elements of A, B and C/D at the positions the lane maps give.
#[derive(Clone, Copy, Debug)]
pub struct MatrixAtom {
    /// The instruction's family and shape (`mma.sync.m16n8k16`, `mfma.32x32x8`).
    pub name: &'static str,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Operand types it multiplies (A and B alike).
    pub inputs: &'static [DType],
    /// Accumulator type.
    pub acc: DType,
    pub scope: AtomScope,
    pub lanes: u32,
    pub a_elems: u32,
    pub b_elems: u32,
    pub c_elems: u32,
    pub a: LaneMap,
    pub b: LaneMap,
    pub c: LaneMap,
    pub operands: OperandSource,
    /// Issued asynchronously (completes at a later wait), like `wgmma`.
    pub asynchronous: bool,
    /// The lowering may use it today (`wgmma` is described now and lowered with the Hopper
    /// GEMM).
    pub lowered: bool,
}

impl PartialEq for MatrixAtom {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for MatrixAtom {}
impl std::hash::Hash for MatrixAtom {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.name.hash(h)
    }
}

impl MatrixAtom {
    pub fn takes(&self, d: DType) -> bool {
        self.inputs.contains(&d)
    }
}

/// The asynchronous global-to-shared copies a target has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncCopy {
    /// `cp.async` with commit groups (sm_80 and later).
    CpAsyncGroups,
    /// Tensor-memory-accelerator bulk copies completing on an mbarrier (sm_90).
    Tma,
}

/// How the bounded waits read a clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Clock {
    /// A global nanosecond timer (`%globaltimer`).
    GlobalTimerNs,
    /// A constant 100 MHz counter (`s_memrealtime`).
    RealTime100Mhz,
}

/// Everything the shared lowering asks about a GPU.
#[derive(Debug)]
pub struct TargetDesc {
    /// `sm_90a`, `gfx942`, ..
    pub name: &'static str,
    pub vendor: Vendor,
    /// The architecture in the vendor's words (`Hopper`, `CDNA3`).
    pub arch: &'static str,
    /// Lanes per warp (NVIDIA) or wave (AMD).
    pub warp_size: u32,
    /// Threads one program (block, workgroup) may have.
    pub max_threads: u32,
    /// Programs along x, and along y and z.
    pub max_programs: [u32; 2],
    /// Shared memory (LDS) one program may use, in bytes (dynamic shared memory opted in).
    pub shared_bytes: u32,
    /// Banks of shared memory and their width in bytes.
    pub shared_banks: u32,
    pub bank_bytes: u32,
    /// Widest single global or shared access of one lane, in bytes.
    pub vector_bytes: u32,
    /// The matrix instructions, preferred first.
    pub atoms: &'static [MatrixAtom],
    /// A warp-wide load of 8 x 8 matrices of 16-bit elements from shared memory (`ldmatrix`).
    pub matrix_load: bool,
    pub async_copies: &'static [AsyncCopy],
    pub clock: Clock,
    /// Conversions between 8-bit floats and f16/f32 in hardware ([`crate::simt::Inst::Fp8Convert`]:
    /// sm_89+'s `cvt.rn.f16x2.e4m3x2` and `cvt.rn.satfinite.e4m3x2.f32`, and their E5M2 forms);
    /// without them the lowering converts with integer and f32 instructions.
    pub fp8_convert: bool,
    /// f32 atomic adds of 2 or 4 consecutive elements in one instruction
    /// ([`crate::simt::Inst::VAtomic`]: sm_90's `red.global.add.v2.f32` and `.v4.f32`, PTX ISA
    /// 8.1); without them each element is its own atomic.
    pub vector_atomic_add: bool,
    /// Programmatic dependent launch (sm_90+: `griddepcontrol.wait` and the launch attribute
    /// that lets a kernel start before the one before it on its stream ends); without it
    /// `LaunchAttrs::programmatic` is ignored.
    pub programmatic_launch: bool,
    /// A barrier that also ORs a predicate over the program (`bar.red.or.pred`); without it
    /// `protocol::expand` builds the OR from shared memory and three barriers.
    pub barrier_reduce: bool,
    /// The target's names of the CTA, GPU and system scopes (`cta`/`gpu`/`sys`;
    /// `workgroup`/`agent`/system).
    pub scope_names: [&'static str; 3],
    /// The vendor ISA version the code declares (PTX `.version`), where the writer declares one.
    pub isa_version: Option<&'static str>,
    /// Architecture-specific features beyond the compute capability's (sm_90a: `wgmma`,
    /// `setmaxnreg`): code using them runs on that architecture only.
    pub arch_specific: bool,
    /// In the reference set: the support matrix's columns and the snapshot tests cover it
    /// (sm_90 is left out: its code is sm_90a's without `wgmma`, which `ptx-check` assembles).
    pub reference: bool,
}

inventory::collect!(TargetDesc);

impl TargetDesc {
    /// The preferred lowered matrix atom multiplying `d` into `acc`, if the target has one.
    pub fn atom_for(&self, d: DType, acc: DType) -> Option<&'static MatrixAtom> {
        self.atoms.iter().find(|a| a.lowered && a.takes(d) && a.acc == acc)
    }

    pub fn has_async_copy(&self, c: AsyncCopy) -> bool {
        self.async_copies.contains(&c)
    }

    /// Whether the lowering has a matrix atom reading its operands from shared-memory
    /// descriptors (`wgmma`, sm_90a).
    pub fn has_wgmma(&self) -> bool {
        self.atoms.iter().any(|a| a.lowered && a.operands == OperandSource::SharedDescriptor)
    }

    /// Whether the target has TMA copies and `wgmma`: what the descriptor forms of the
    /// library's GEMMs need to be fast.
    pub fn has_tma_wgmma(&self) -> bool {
        self.has_async_copy(AsyncCopy::Tma) && self.has_wgmma()
    }
}

/// An unknown target name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown target `{name}`; known targets: {known}")]
pub struct UnknownTarget {
    pub name: String,
    pub known: String,
}

/// Every registered target (the one list of targets), by vendor and then name.
pub fn registered() -> Vec<&'static TargetDesc> {
    let mut v: Vec<_> = inventory::iter::<TargetDesc>.into_iter().collect();
    v.sort_by_key(|t| (t.vendor, t.name));
    v
}

/// The reference set (`TargetDesc::reference`) of `vendor`, or of every vendor.
pub fn reference_set(vendor: Option<Vendor>) -> Vec<&'static TargetDesc> {
    registered().into_iter().filter(|t| t.reference && vendor.is_none_or(|v| t.vendor == v)).collect()
}

/// The registered target called `name`.
pub fn lookup(name: &str) -> Result<&'static TargetDesc, UnknownTarget> {
    registered().into_iter().find(|t| t.name == name).ok_or_else(|| UnknownTarget {
        name: name.to_string(),
        known: registered().iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
    })
}

// --- the lane maps of the atoms the lowering knows ---

/// `mma.sync.aligned.m16n8k16` (row-major A, column-major B), with `g = lane / 4` and
/// `t = lane % 4` (PTX ISA, "Matrix fragments for mma.m16n8k16"): A element `i` (0..8) at row
/// `g + 8 (i / 2 % 2)`, column `2 t + i % 2 + 8 (i / 4)`; B element `i` (0..4) at row
/// `2 t + i % 2 + 8 (i / 2)`, column `g`; C/D element `i` at row `g + 8 (i / 2)`, column
/// `2 t + i % 2`.
pub mod mma_m16n8k16 {
    use super::*;
    const G: LaneField = field(2, 3, 1);
    const T2: LaneField = field(0, 2, 2);
    pub const A: LaneMap = LaneMap { row: &[G], col: &[T2], elem: |i| (8 * (i / 2 % 2), i % 2 + 8 * (i / 4)) };
    pub const B: LaneMap = LaneMap { row: &[T2], col: &[G], elem: |i| (i % 2 + 8 * (i / 2), 0) };
    pub const C: LaneMap = LaneMap { row: &[G], col: &[T2], elem: |i| (8 * (i / 2), i % 2) };
}

/// `v_mfma_f32_32x32x8{f16,bf16_1k}` (CDNA2/CDNA3; AMD's matrix instruction calculator): A
/// element `j` (0..4) at row `l % 32`, column `4 (l / 32) + j`; B element `j` at row
/// `4 (l / 32) + j`, column `l % 32`; D register `r` (0..16) at row `8 (r / 4) + 4 (l / 32) +
/// r % 4`, column `l % 32`.
pub mod mfma_32x32x8 {
    use super::*;
    const L32: LaneField = field(0, 5, 1);
    const H4: LaneField = field(5, 1, 4);
    pub const A: LaneMap = LaneMap { row: &[L32], col: &[H4], elem: |j| (0, j) };
    pub const B: LaneMap = LaneMap { row: &[H4], col: &[L32], elem: |j| (j, 0) };
    pub const C: LaneMap = LaneMap { row: &[H4], col: &[L32], elem: |r| (8 * (r / 4) + r % 4, 0) };
}

/// `v_mfma_f32_16x16x16{f16,bf16_1k}` (CDNA2/CDNA3): A element `j` (0..4) at row `l % 16`,
/// column `4 (l / 16) + j`; B element `j` at row `4 (l / 16) + j`, column `l % 16`; D register
/// `r` (0..4) at row `4 (l / 16) + r`, column `l % 16`.
pub mod mfma_16x16x16 {
    use super::*;
    const L16: LaneField = field(0, 4, 1);
    const Q4: LaneField = field(4, 2, 4);
    pub const A: LaneMap = LaneMap { row: &[L16], col: &[Q4], elem: |j| (0, j) };
    pub const B: LaneMap = LaneMap { row: &[Q4], col: &[L16], elem: |j| (j, 0) };
    pub const C: LaneMap = LaneMap { row: &[Q4], col: &[L16], elem: |r| (r, 0) };
}

/// `wgmma.mma_async.m64nNk16` with operands from shared-memory descriptors (sm_90a): D over the
/// 128 lanes of a warpgroup, for N = 8 (each further 8 columns repeat it 4 registers on): warp
/// `w = lane / 32` takes rows `16 w ..`, within it as `mma.m16n8k16`'s C.
pub mod wgmma_m64n8k16 {
    use super::*;
    pub const C: LaneMap =
        LaneMap { row: &[field(5, 2, 16), field(2, 3, 1)], col: &[field(0, 2, 2)], elem: |i| (8 * (i / 2), i % 2) };
    /// Operands come from shared memory: no per-lane elements.
    pub const NONE: LaneMap = LaneMap { row: &[], col: &[], elem: |_| (0, 0) };
}

/// The half-precision inputs every lowered atom takes.
pub const HALF_INPUTS: &[DType] = &[DType::F16, DType::BF16];

/// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`: every NVIDIA target from sm_80.
pub const MMA_SYNC_M16N8K16: MatrixAtom = MatrixAtom {
    name: "mma.sync.m16n8k16",
    m: 16,
    n: 8,
    k: 16,
    inputs: HALF_INPUTS,
    acc: DType::F32,
    scope: AtomScope::Warp,
    lanes: 32,
    a_elems: 8,
    b_elems: 4,
    c_elems: 4,
    a: mma_m16n8k16::A,
    b: mma_m16n8k16::B,
    c: mma_m16n8k16::C,
    operands: OperandSource::Registers,
    asynchronous: false,
    lowered: true,
};

/// `wgmma.mma_async.sp.m64nNk16` for sm_90a, described (lowered with the Hopper GEMM).
pub const WGMMA_M64N8K16: MatrixAtom = MatrixAtom {
    name: "wgmma.m64nNk16",
    m: 64,
    n: 8,
    k: 16,
    inputs: HALF_INPUTS,
    acc: DType::F32,
    scope: AtomScope::Warpgroup,
    lanes: 128,
    a_elems: 0,
    b_elems: 0,
    c_elems: 4,
    a: wgmma_m64n8k16::NONE,
    b: wgmma_m64n8k16::NONE,
    c: wgmma_m64n8k16::C,
    operands: OperandSource::SharedDescriptor,
    asynchronous: true,
    lowered: true,
};

/// `v_mfma_f32_32x32x8f16` / `v_mfma_f32_32x32x8bf16_1k` (gfx90a, gfx942).
pub const MFMA_32X32X8: MatrixAtom = MatrixAtom {
    name: "mfma.32x32x8",
    m: 32,
    n: 32,
    k: 8,
    inputs: HALF_INPUTS,
    acc: DType::F32,
    scope: AtomScope::Wave,
    lanes: 64,
    a_elems: 4,
    b_elems: 4,
    c_elems: 16,
    a: mfma_32x32x8::A,
    b: mfma_32x32x8::B,
    c: mfma_32x32x8::C,
    operands: OperandSource::Registers,
    asynchronous: false,
    lowered: true,
};

/// `v_mfma_f32_16x16x16f16` / `v_mfma_f32_16x16x16bf16_1k` (gfx90a, gfx942).
pub const MFMA_16X16X16: MatrixAtom = MatrixAtom {
    name: "mfma.16x16x16",
    m: 16,
    n: 16,
    k: 16,
    inputs: HALF_INPUTS,
    acc: DType::F32,
    scope: AtomScope::Wave,
    lanes: 64,
    a_elems: 4,
    b_elems: 4,
    c_elems: 4,
    a: mfma_16x16x16::A,
    b: mfma_16x16x16::B,
    c: mfma_16x16x16::C,
    operands: OperandSource::Registers,
    asynchronous: false,
    lowered: true,
};

// --- the targets (registered by their vendors' backend crates) ---

const NVIDIA_SCOPES: [&str; 3] = ["cta", "gpu", "sys"];
const AMD_SCOPES: [&str; 3] = ["workgroup", "agent", "system"];

/// NVIDIA A100 (Ampere): `mma.sync`, `ldmatrix`, `cp.async`; 163 KiB of shared memory per block.
pub const SM_80: TargetDesc = TargetDesc {
    name: "sm_80",
    vendor: Vendor::Nvidia,
    arch: "Ampere",
    warp_size: 32,
    max_threads: 1024,
    max_programs: [i32::MAX as u32, 65535],
    shared_bytes: 163 << 10,
    shared_banks: 32,
    bank_bytes: 4,
    vector_bytes: 16,
    atoms: &[MMA_SYNC_M16N8K16],
    matrix_load: true,
    async_copies: &[AsyncCopy::CpAsyncGroups],
    clock: Clock::GlobalTimerNs,
    fp8_convert: false,
    vector_atomic_add: false,
    programmatic_launch: false,
    barrier_reduce: true,
    scope_names: NVIDIA_SCOPES,
    isa_version: Some(PTX_ISA),
    arch_specific: false,
    reference: true,
};

/// NVIDIA H100/H200 (Hopper) without the architecture-specific features: 227 KiB of shared
/// memory per block, TMA.
pub const SM_90: TargetDesc = TargetDesc {
    name: "sm_90",
    arch: "Hopper",
    shared_bytes: 227 << 10,
    async_copies: &[AsyncCopy::CpAsyncGroups, AsyncCopy::Tma],
    fp8_convert: true,
    vector_atomic_add: true,
    programmatic_launch: true,
    isa_version: Some(PTX_ISA_SM_90),
    reference: false,
    ..SM_80
};

/// Hopper with `wgmma` and `setmaxnreg` (`sm_90a`).
pub const SM_90A: TargetDesc = TargetDesc {
    name: "sm_90a",
    atoms: &[MMA_SYNC_M16N8K16, WGMMA_M64N8K16],
    arch_specific: true,
    reference: true,
    ..SM_90
};

/// AMD MI250X (CDNA2): wave 64, 64 KiB of LDS, MFMA 32x32x8 and 16x16x16 (bf16 in the `_1k`
/// forms); no asynchronous global-to-LDS copy the lowering uses.
pub const GFX90A: TargetDesc = TargetDesc {
    name: "gfx90a",
    vendor: Vendor::Amd,
    arch: "CDNA2",
    warp_size: 64,
    max_threads: 1024,
    max_programs: [i32::MAX as u32, 65535],
    shared_bytes: 64 << 10,
    shared_banks: 32,
    bank_bytes: 4,
    vector_bytes: 16,
    atoms: &[MFMA_32X32X8, MFMA_16X16X16],
    matrix_load: false,
    async_copies: &[],
    clock: Clock::RealTime100Mhz,
    // gfx942's `v_cvt_pk_f32_fp8` and kin convert the FNUZ formats, not OCP's.
    fp8_convert: false,
    vector_atomic_add: false,
    programmatic_launch: false,
    barrier_reduce: false,
    scope_names: AMD_SCOPES,
    isa_version: None,
    arch_specific: false,
    reference: true,
};

/// AMD MI300X/MI325X (CDNA3): as CDNA2 for what the lowering asks.
pub const GFX942: TargetDesc = TargetDesc { name: "gfx942", arch: "CDNA3", ..GFX90A };

/// PTX ISA version the NVIDIA targets declare: 8.0 is the first with `sm_90a` and is accepted
/// by CUDA 12.0+ drivers (the test machine's CUDA 13.0 driver JIT accepts up to 9.0).
const PTX_ISA: &str = "8.0";

/// PTX ISA version the Hopper targets declare: 8.1 for `red` with vector types
/// ([`TargetDesc::vector_atomic_add`]); CUDA 12.1+ drivers.
const PTX_ISA_SM_90: &str = "8.1";

// The registry: adding a target is its description above and its line here.
inventory::submit! { SM_80 }
inventory::submit! { SM_90 }
inventory::submit! { SM_90A }
inventory::submit! { GFX90A }
inventory::submit! { GFX942 }

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Every lane map covers its tile exactly once over the atom's lanes.
    #[test]
    fn lane_maps_cover_their_tiles() {
        for atom in [MMA_SYNC_M16N8K16, MFMA_32X32X8, MFMA_16X16X16] {
            for (what, map, rows, cols, per) in [
                ("A", atom.a, atom.m, atom.k, atom.a_elems),
                ("B", atom.b, atom.k, atom.n, atom.b_elems),
                ("C", atom.c, atom.m, atom.n, atom.c_elems),
            ] {
                let mut seen = HashSet::new();
                for l in 0..atom.lanes {
                    for i in 0..per {
                        let (r, c) = map.eval(l, i);
                        assert!(r < rows && c < cols, "{} {what}: lane {l} element {i} -> ({r}, {c})", atom.name);
                        assert!(seen.insert((r, c)), "{} {what}: ({r}, {c}) twice", atom.name);
                    }
                }
                assert_eq!(seen.len() as u32, rows * cols, "{} {what}", atom.name);
            }
        }
        let mut seen = HashSet::new();
        for l in 0..128 {
            for i in 0..4 {
                assert!(seen.insert(wgmma_m64n8k16::C.eval(l, i)));
            }
        }
        assert_eq!(seen.len(), 64 * 8);
    }
}
