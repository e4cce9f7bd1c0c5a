//! Execution of the SIMT IR on the CPU: the lowered form of a kernel, run one program at a time
//! with every thread of the program in lock-step (each register is a vector over the threads), so
//! the layout and lowering that the GPU backends share are tested without a GPU. Each family of
//! instructions executes in its own file (`scalar`, `memory`, `matrix`, `sync`, `control`).
//!
//! Registered as backend `cpu-simt` with the GPU targets (`sm_90a`, `sm_80`, `gfx942`, ..): the
//! lowering for that target, run at its warp or wave size.

use crate::interp::{elem_bits, DirectHooks, Fault, Hooks, WordTest};
use crate::memory::Memory;
use crate::memory::Writer;
use crate::value::*;
use crate::view::ProgramView;
use std::sync::Arc;
use trident_core::abi::diag;
use trident_core::backend::{
    check_launch, Artifact, Backend, BackendDescriptor, BackendError, Buffer, Device, KernelArg, LaunchOptions,
};
use trident_core::ir::*;
use trident_core::simt::tma::MapValues;
use trident_core::simt::{lower, protocol, Family, Inst, Kernel, Reg, SType, Special};
use trident_core::{verify, Function};

pub const NAME: &str = "cpu-simt";

inventory::submit! {
    BackendDescriptor {
        name: NAME,
        description: "the SIMT lowering shared by the GPU backends, executed on the host for a GPU target",
        // Every GPU target of the shared lowering (`trident_core::target::registered`).
        targets: trident_core::backend::Targets::Gpu { vendor: None, default: "sm_90a" },
        create: || Box::new(SimtBackend),
    }
}

pub struct SimtBackend;

impl Backend for SimtBackend {
    fn descriptor(&self) -> &'static BackendDescriptor {
        trident_core::backend::lookup(NAME).expect("the cpu-simt backend registers itself in this crate")
    }

    fn compile(&self, func: &Function, target: Option<&str>) -> Result<Artifact, BackendError> {
        let target = self.descriptor().resolve_target(target)?;
        verify(func)?;
        let desc = trident_core::target::lookup(target).map_err(|e| BackendError::Compile {
            backend: NAME,
            kernel: func.name.clone(),
            message: format!("{e} (this binary links no crate that registers it)"),
        })?;
        let k = lower(func, desc).map_err(|e| BackendError::Compile {
            backend: NAME,
            kernel: func.name.clone(),
            message: e.to_string(),
        })?;
        let text = k.to_string();
        Ok(Artifact::new(func, NAME, target, text, Arc::new(k)))
    }

    fn open_device(&self, _index: usize) -> Result<Arc<dyn Device>, BackendError> {
        Ok(Arc::new(SimtDevice { inner: crate::CpuDevice::default() }))
    }
}

/// Host memory like the CPU device; launches run SIMT kernels.
pub struct SimtDevice {
    inner: crate::CpuDevice,
}

impl Device for SimtDevice {
    fn backend(&self) -> &'static str {
        NAME
    }
    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        self.inner.alloc(bytes, name)
    }
    fn free(&self, buffer: &Buffer) -> Result<(), BackendError> {
        self.inner.free(buffer)
    }
    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.inner.write(buffer, offset, data)
    }
    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.inner.read(buffer, offset, out)
    }

    fn launch(
        &self,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        opts: &LaunchOptions,
    ) -> Result<(), BackendError> {
        let k = kernel.payload_for::<Kernel>(NAME)?;
        check_launch(kernel, grid, args, crate::device::MAX_PROGRAMS)?;
        // A single-device launch runs what a GPU runs: the protocol instructions expanded
        // (`simt::protocol`), with the hidden parameters of a world of one rank.
        // (Only a kernel with protocol instructions is copied to expand them.)
        let expanded;
        let k = if protocol::has_protocol(&k.body) {
            let mut e = k.clone();
            protocol::expand(&mut e);
            expanded = e;
            &expanded
        } else {
            k
        };
        let table = self.inner.alloc(8, "__heap_bases")?;
        let record = self.inner.alloc(8 * diag::WORDS, "__wait_diagnostics")?;
        let barrier = self.inner.alloc(16, "__barrier")?;
        let result = (|| {
            self.inner.write(&table, 0, &[0; 8])?;
            self.inner.write(&record, 0, &[0; 8 * diag::WORDS])?;
            self.inner.write(&barrier, 0, &[0; 16])?;
            let mut all = args.to_vec();
            let hidden = trident_core::abi::HiddenArgs {
                rank: 0,
                ranks: 1,
                heap_bases: table.address,
                diag: record.address,
                wait_bound: opts.wait_bound,
                barrier: barrier.address,
            };
            all.extend(hidden.args());
            let grid = crate::device::launch_grid(kernel, grid);
            let order = crate::device::program_order(grid, opts.seed);
            let hooks = DirectHooks { mem: self.inner.memory() };
            order.into_iter().try_for_each(|pid| {
                let view = ProgramView::immediate(Writer::HOST);
                run_program(k, self.inner.memory(), pid, grid, &all, view, &hooks)
                    .map_err(|f| f.into_error(kernel.kernel.clone(), pid))
            })?;
            let mut raw = [0u8; 8 * diag::WORDS];
            self.inner.read(&record, 0, &mut raw)?;
            match diag::Record::decode(&raw) {
                None => Ok(()),
                Some(r) => {
                    let place = self.inner.memory().describe(r.signal);
                    Err(BackendError::Execution {
                        kernel: kernel.kernel.clone(),
                        program: r.program,
                        op: "wait".into(),
                        loc: None,
                        message: r.message(&place, opts.wait_bound),
                    })
                }
            }
        })();
        for b in [&table, &record, &barrier] {
            self.inner.free(b)?;
        }
        result
    }
}

/// Keeps the first `n` lanes of `v`.
fn truncate_lanes(v: &mut Val, n: usize) {
    let len = match &mut v.data {
        Data::F(x) => {
            x.truncate(n);
            x.len()
        }
        Data::D(x) => {
            x.truncate(n);
            x.len()
        }
        Data::I(x) => {
            x.truncate(n);
            x.len()
        }
        Data::P(x) => {
            x.truncate(n);
            x.len()
        }
        Data::Token => return,
    };
    v.ty = Type::tile(v.ty.elem, &[len as u32]);
}

/// The lanes `range` of `v` (a value with fewer lanes, as a launch-wide scalar, is kept).
fn slice_lanes(v: &Val, range: std::ops::Range<usize>) -> Val {
    let len = match &v.data {
        Data::F(x) => x.len(),
        Data::D(x) => x.len(),
        Data::I(x) => x.len(),
        Data::P(x) => x.len(),
        Data::Token => return v.clone(),
    };
    if len < range.end {
        return v.clone();
    }
    let idx: Vec<usize> = range.collect();
    Val { ty: Type::tile(v.ty.elem, &[idx.len() as u32]), data: v.data.gather(&idx) }
}

/// A tensor map the arguments cannot make, named by its tensor's parameter.
fn tensor_map_fault(k: &Kernel, m: &trident_core::simt::tma::TensorMap, e: String) -> SimtFault {
    let message =
        format!("the tensor map of %{} (TMA) cannot be made from the arguments: {e}", k.params[m.ptr as usize].0);
    SimtFault { message, op: "launch".into(), loc: None }
}

fn fault<T>(m: impl Into<String>) -> Result<T, Fault> {
    Err(Fault { op: None, message: m.into() })
}

/// The element type a SIMT register stores its lanes as.
fn dtype(t: SType) -> DType {
    match t {
        SType::Pred => DType::I1,
        SType::Int { bits: 8, signed: true } => DType::I8,
        SType::Int { bits: 16, signed: true } => DType::I16,
        SType::Int { bits: 32, signed: true } => DType::I32,
        SType::Int { bits: 64, signed: true } => DType::I64,
        SType::Int { bits: 8, .. } => DType::U8,
        SType::Int { bits: 16, .. } => DType::U16,
        SType::Int { bits: 32, .. } => DType::U32,
        SType::Int { .. } | SType::Ptr => DType::U64,
        SType::F16 => DType::F16,
        SType::BF16 => DType::BF16,
        SType::F32 => DType::F32,
        SType::F64 => DType::F64,
    }
}

fn val(t: SType, data: Data) -> Val {
    let elem = if t == SType::Ptr { Elem::Ptr(DType::U8) } else { Elem::Num(dtype(t)) };
    let n = match &data {
        Data::F(v) => v.len(),
        Data::D(v) => v.len(),
        Data::I(v) => v.len(),
        Data::P(v) => v.len(),
        Data::Token => 1,
    };
    Val { ty: Type::tile(elem, &[n as u32]), data }
}

/// One program's state: a lane vector per register and the shared memory.
struct Exec<'a> {
    k: &'a Kernel,
    mem: &'a Memory,
    view: ProgramView,
    hooks: &'a dyn Hooks,
    pid: [u32; 3],
    grid: [u32; 3],
    args: &'a [KernelArg],
    lanes: usize,
    regs: Vec<Option<Val>>,
    shared: Vec<u8>,
    /// The program reached [`Inst::Exit`].
    exited: bool,
    hazards: crate::shared_race::SharedHazards,
    /// The tile-IR op whose instructions run (the last [`Inst::Origin`]).
    origin: Option<(u32, &'static str, Option<Loc>)>,
    /// The program's mbarriers, by shared byte offset.
    mbarriers: std::collections::HashMap<usize, Mbarrier>,
    /// The kernel's tensor maps evaluated against the launch's arguments.
    maps: Vec<MapValues>,
    /// The program's thread number of lane 0 of the registers (a ping-pong group's first
    /// thread while it runs), for the shared-memory race detector.
    lane_base: usize,
    /// Inside an [`Inst::Specialized`] region's producer: a wait that cannot pass yet gives
    /// way to the consumers (`blocked` set) instead of faulting.
    yielding: bool,
    blocked: bool,
    /// Inside an [`Inst::Specialized`] region's consumers: the producer, run when a consumer
    /// wait cannot pass yet.
    producer: Option<Pump>,
    /// TMA stores and bulk row stores in flight, committed by [`Inst::BulkCommit`]; their
    /// shared memory is read when a wait completes their group ([`Exec::complete_bulk_stores`]).
    bulk: CommitGroups<PendingBulkStore>,
    /// `cp.async` copies in flight, committed by [`Inst::AsyncCommit`]; they land when a wait
    /// completes their group ([`Exec::complete_copies`]).
    copies: CommitGroups<PendingCopy>,
}

/// Asynchronous operations issued, committed in groups and completed by waits oldest group
/// first: TMA stores' bulk groups and `cp.async` groups.
struct CommitGroups<T> {
    open: Vec<T>,
    committed: std::collections::VecDeque<Vec<T>>,
}

impl<T> Default for CommitGroups<T> {
    fn default() -> Self {
        CommitGroups { open: Vec::new(), committed: Default::default() }
    }
}

impl<T> CommitGroups<T> {
    fn issue(&mut self, op: T) {
        self.open.push(op);
    }

    /// Closes the group of the operations issued since the last commit.
    fn commit(&mut self) {
        let group = std::mem::take(&mut self.open);
        self.committed.push_back(group);
    }

    /// What a wait that leaves `pending` groups in flight completes, oldest first.
    fn wait(&mut self, pending: u32) -> Vec<T> {
        let done = self.committed.len().saturating_sub(pending as usize);
        self.committed.drain(..done).flatten().collect()
    }

    /// Everything in flight, committed or not (the program's end), oldest first.
    fn drain(&mut self) -> Vec<T> {
        let mut all: Vec<T> = self.committed.drain(..).flatten().collect();
        all.append(&mut self.open);
        all
    }
}

/// A `cp.async` copy in flight: the bytes it read when issued, where they land, and the thread
/// that issued it (the race detector's writer).
struct PendingCopy {
    thread: usize,
    dst: usize,
    data: Vec<u8>,
}

/// A bulk store whose shared memory is read when its bulk group completes: a TMA store's box,
/// or `bytes` from `src` to global address `dst` (a row of a staged tile).
#[derive(Clone, Copy)]
enum PendingBulkStore {
    Tensor { lane: usize, map: MapValues, src: usize, row: i64, col: i64 },
    Linear { lane: usize, src: usize, dst: u64, bytes: usize },
}

/// An mbarrier's state: `pending` of `count` arrivals and `tx` bytes still due in phase `phase`.
#[derive(Clone, Copy, Debug)]
struct Mbarrier {
    count: u32,
    pending: u32,
    tx: i64,
    phase: u64,
}

impl Mbarrier {
    /// The current phase completes once every arrival is in and every announced byte landed.
    fn settle(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.phase += 1;
            self.pending = self.count;
        }
    }
}

/// A fault of one program, placed at the tile-IR op whose instructions were running
/// ([`Inst::Origin`]).
#[derive(Debug)]
pub struct SimtFault {
    pub message: String,
    /// `mnemonic (op #N)`, or `simt` before the first op.
    pub op: String,
    pub loc: Option<Loc>,
}

impl SimtFault {
    pub fn into_error(self, kernel: String, program: [u32; 3]) -> BackendError {
        BackendError::Execution { kernel, program, op: self.op, loc: self.loc, message: self.message }
    }
}

/// Runs every thread of one program, lanes in lock-step, with memory seen through `view` and
/// communication through `hooks` (a single-device launch or a world).
#[allow(clippy::too_many_arguments)]
pub fn run_program(
    k: &Kernel,
    mem: &Memory,
    pid: [u32; 3],
    grid: [u32; 3],
    args: &[KernelArg],
    view: ProgramView,
    hooks: &dyn Hooks,
) -> Result<(), SimtFault> {
    let lanes = k.threads() as usize;
    let shared = vec![0; k.shared_bytes as usize];
    let maps = k
        .tensor_maps
        .iter()
        .map(|m| m.evaluate(args).map_err(|e| tensor_map_fault(k, m, e)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut e = Exec {
        k,
        mem,
        view,
        hooks,
        pid,
        grid,
        args,
        lanes,
        regs: vec![None; k.regs.len()],
        shared,
        exited: false,
        hazards: crate::shared_race::SharedHazards::new(k.shared_bytes as usize),
        origin: None,
        mbarriers: Default::default(),
        maps,
        lane_base: 0,
        yielding: false,
        blocked: false,
        producer: None,
        bulk: Default::default(),
        copies: Default::default(),
    };
    let run = |e: &mut Exec| -> Result<(), Fault> {
        if let Err(f) = e.body(&k.body) {
            // As the interpreter: a stopped program's effects are ordered before its launch's end.
            let _ = e.view.finish(mem);
            e.hooks.program_done(&mut e.view);
            return Err(f);
        }
        // Copies and bulk stores not waited for still complete before the program ends.
        let copies = e.copies.drain();
        e.complete_copies(copies)?;
        let stores = e.bulk.drain();
        e.complete_bulk_stores(stores)?;
        e.hooks.yield_point(&mut e.view)?;
        e.view.finish(mem).or_else(|x| fault(x.0))?;
        e.hooks.program_done(&mut e.view);
        Ok(())
    };
    run(&mut e).map_err(|f| {
        let (op, loc) = match e.origin {
            Some((op, what, loc)) => (format!("{what} (op #{op})"), loc),
            None => ("simt".to_string(), None),
        };
        SimtFault { message: f.message, op, loc }
    })
}

mod control;
mod matrix;
mod memory;
mod scalar;
mod sync;

impl Exec<'_> {
    fn get(&self, r: Reg) -> Result<Val, Fault> {
        self.regs[r.0 as usize]
            .clone()
            .ok_or_else(|| Fault { op: None, message: format!("register {r:?} read before written") })
    }

    fn set(&mut self, r: Reg, data: Data) {
        let data = match (self.k.ty(r), data) {
            (SType::Ptr, Data::I(v)) => Data::P(v.into_iter().map(|x| x as u64).collect()),
            (_, d) => d,
        };
        self.regs[r.0 as usize] = Some(val(self.k.ty(r), data));
    }

    /// Runs the producer's loop (see [`Exec::specialized`]) on its own lanes and registers
    /// until it blocks or ends; returns whether it made progress.
    fn pump(&mut self) -> Result<bool, Fault> {
        let Some(mut p) = self.producer.take() else { return Ok(false) };
        std::mem::swap(&mut self.regs, &mut p.regs);
        std::mem::swap(&mut self.lanes, &mut p.lanes);
        let mut progressed = false;
        let mut r = Ok(());
        while p.side.at < p.side.hi {
            self.set(p.side.iv, Data::I(vec![p.side.at; self.lanes]));
            self.yielding = true;
            let ran = self.body(&p.side.body);
            self.yielding = false;
            if std::mem::take(&mut self.blocked) {
                break;
            }
            if let Err(e) = ran.and_then(|_| self.copy_all(&p.side.phis, &p.side.nexts)) {
                r = Err(e);
                break;
            }
            p.side.at += p.side.step;
            progressed = true;
        }
        std::mem::swap(&mut self.regs, &mut p.regs);
        std::mem::swap(&mut self.lanes, &mut p.lanes);
        self.producer = Some(p);
        r.map(|_| progressed)
    }

    /// The value of `r`, which every lane must hold alike: `If` conditions, loop bounds and
    /// the like, which the writers branch on as uniform (`bra.uni` in PTX). A register whose
    /// lanes differ is a contract fault, so the suites run here check that claim.
    fn uniform(&self, r: Reg) -> Result<i64, Fault> {
        let v = self.get(r)?;
        if let Data::I(x) = &v.data {
            if let Some(i) = x.iter().position(|&y| y != x[0]) {
                return contract(format!(
                    "a uniform value (register {}) differs across lanes: lane 0 has {}, lane {i} has {}",
                    r.0, x[0], x[i]
                ));
            }
        }
        Ok(v.scalar_i64())
    }

    /// `size` bytes of shared memory at byte `off`, zero-extended, read by `lane`.
    fn shared_get(&mut self, lane: usize, off: usize, size: usize) -> Result<u64, Fault> {
        let Some(slot) = self.shared.get(off..off + size) else {
            return fault(format!("shared load of {size} bytes at {off} out of {} bytes", self.k.shared_bytes));
        };
        let mut b = [0u8; 8];
        b[..size].copy_from_slice(slot);
        for i in 0..size {
            self.hazards.read(self.lane_base + lane, off + i)?;
        }
        Ok(u64::from_le_bytes(b))
    }

    fn body(&mut self, body: &[Inst]) -> Result<(), Fault> {
        for inst in body {
            if self.exited {
                break;
            }
            self.inst(inst)?;
        }
        Ok(())
    }

    fn inst(&mut self, inst: &Inst) -> Result<(), Fault> {
        match inst.family() {
            Family::Scalar => self.scalar(inst),
            Family::Memory => self.memory(inst),
            Family::Matrix => self.matrix(inst),
            Family::Sync => self.sync(inst),
            Family::Control => self.control(inst),
        }
    }
}

/// A SIMT instruction the lowering should never have produced (`simt/mod.rs`'s contract).
fn contract<T>(m: impl Into<String>) -> Result<T, Fault> {
    fault(format!("SIMT contract broken by the lowering: {}", m.into()))
}

impl Exec<'_> {
    /// `Binary` as the writers implement it: integer arithmetic on 32/64-bit registers with a
    /// safe divisor and shift amount, float arithmetic on f32/f64, and `min`/`max` leaving the
    /// sign of equal zeros to the lowering (here the wrong one, so a missing fix shows).
    fn binary_primitive(&self, t: SType, op: BinaryOp, x: &Val, y: &Val) -> Result<Data, Fault> {
        match t {
            SType::Int { bits: 8 | 16, .. } | SType::F16 | SType::BF16 => {
                return contract(format!("`{op}` on {t:?} (the lowering widens it)"));
            }
            SType::Pred if !matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor) => {
                return contract(format!("`{op}` on i1 (the lowering widens it)"));
            }
            SType::F32 | SType::F64 if matches!(op, BinaryOp::Rem | BinaryOp::Pow) => {
                return contract(format!("`{op}` on {t:?} (the lowering expands it)"));
            }
            SType::Int { bits, signed } => {
                let (a, b) = (x.ints(), y.ints());
                for (&p, &q) in a.iter().zip(b) {
                    if matches!(op, BinaryOp::Div | BinaryOp::Rem) {
                        let min = if bits == 64 { i64::MIN } else { i32::MIN as i64 };
                        if q == 0 || (signed && q == -1 && p == min) {
                            return contract(format!("`{op}` of {p} by {q}"));
                        }
                    }
                    if matches!(op, BinaryOp::Shl | BinaryOp::Shr) && !(0..bits as i64).contains(&q) {
                        let q = if signed { q } else { q & ((1i128 << bits) - 1) as i64 };
                        return contract(format!("shift by {q} on a {bits}-bit register"));
                    }
                }
            }
            _ => {}
        }
        let d = crate::interp::binary(op, x, y)?;
        Ok(match (d, op) {
            (Data::F(mut v), BinaryOp::Min | BinaryOp::Max) => {
                for (o, (a, b)) in v.iter_mut().zip(x.floats().iter().zip(y.floats())) {
                    if *a == 0.0 && *b == 0.0 {
                        *o = if op == BinaryOp::Min { 0.0 } else { -0.0 };
                    }
                }
                Data::F(v)
            }
            (d, _) => d,
        })
    }
}

fn push(out: &mut Data, e: Elt) -> Result<(), Fault> {
    match (out, e) {
        (Data::F(v), Elt::F(x)) => v.push(x),
        (Data::D(v), Elt::D(x)) => v.push(x),
        (Data::I(v), Elt::I(x)) => v.push(x),
        _ => return fault("element does not match the register type"),
    }
    Ok(())
}

/// Keeps this backend's registration linked (see [`crate::link`]).
#[inline(never)]
pub fn link() {
    std::hint::black_box(NAME);
}

/// The producer's loop of a warp-specialized region and where it is (its instructions owned:
/// it runs from inside the consumers' waits).
struct Side {
    iv: Reg,
    at: i64,
    hi: i64,
    step: i64,
    phis: Vec<Reg>,
    body: Vec<Inst>,
    nexts: Vec<Reg>,
}

/// The producer of the running warp-specialized region: its loop, registers and lane count.
struct Pump {
    side: Side,
    regs: Vec<Option<Val>>,
    lanes: usize,
}
