//! Execution of the SIMT IR on the CPU: the lowered form of a kernel, run one program at a time
//! with every thread of the program in lock-step (each register is a vector over the threads), so
//! the layout and lowering that the GPU backends share are tested without a GPU.
//!
//! Registered as backend `cpu-simt` with the GPU targets (`sm_90a`, `sm_80`, `gfx942`, ..): the
//! lowering for that target, run at its warp or wave size.

use crate::interp::{elem_bits, DirectHooks, Fault, Hooks};
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
use trident_core::simt::{lower, protocol, Inst, Kernel, Reg, SType, Special};
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
    /// Inside an [`Inst::Specialized`] region's producer: a wait that cannot pass yet gives
    /// way to the consumers (`blocked` set) instead of faulting.
    yielding: bool,
    blocked: bool,
    /// Inside an [`Inst::Specialized`] region's consumers: the producer, run when a consumer
    /// wait cannot pass yet.
    producer: Option<Pump>,
    /// TMA stores issued since the last [`Inst::BulkCommit`], and the committed groups whose
    /// shared memory is not read yet, oldest first ([`Exec::complete_tma_stores`]).
    bulk_open: Vec<PendingTmaStore>,
    bulk_groups: std::collections::VecDeque<Vec<PendingTmaStore>>,
}

/// A TMA store whose shared-memory box is read when its bulk group completes.
#[derive(Clone, Copy)]
struct PendingTmaStore {
    lane: usize,
    map: MapValues,
    src: usize,
    row: i64,
    col: i64,
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

/// Nanoseconds of a monotonic clock ([`Inst::Clock`]).
fn clock_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
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
        yielding: false,
        blocked: false,
        producer: None,
        bulk_open: Vec::new(),
        bulk_groups: Default::default(),
    };
    let run = |e: &mut Exec| -> Result<(), Fault> {
        if let Err(f) = e.body(&k.body) {
            // As the interpreter: a stopped program's effects are ordered before its launch's end.
            let _ = e.view.finish(mem);
            e.hooks.program_done(&mut e.view);
            return Err(f);
        }
        // Bulk stores not waited for still complete before the program ends.
        let mut left: Vec<PendingTmaStore> = e.bulk_groups.drain(..).flatten().collect();
        left.append(&mut e.bulk_open);
        e.complete_tma_stores(left)?;
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

    /// An [`Inst::Specialized`] region: the effect-free instructions before each side's loop,
    /// then the consumers' loop, run on the consumer lanes with their own register file (as on
    /// the GPU, where the producer warps never execute it). A consumer wait that cannot pass yet
    /// runs the producer's loop ([`Exec::pump`]) an iteration at a time until it blocks on an
    /// mbarrier of its own (its iteration then starts again later: the producer's waits come
    /// before its effects) or ends; a fault if neither side can go on. The consumers' loop may
    /// nest loops and branches (a persistent kernel's tile loop and epilogue). Afterwards only
    /// the consumer lanes are left.
    fn specialized(&mut self, consumer_warps: u32, producer: &[Inst], consumer: &[Inst]) -> Result<(), Fault> {
        let mut loops = Vec::new();
        for body in [producer, consumer] {
            let Some((Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results }, pre)) = body.split_last()
            else {
                return contract("a specialized side that does not end in a loop");
            };
            self.body(pre)?;
            let (lo, hi, step) = (self.uniform(*lo)?, self.uniform(*hi)?, self.uniform(*step)?);
            if step <= 0 {
                return fault(format!("loop step {step} is not positive"));
            }
            self.copy_all(phis, inits)?;
            loops.push((*iv, lo, hi, step, phis, body, nexts, results));
        }
        let n = (consumer_warps * self.k.warp_size) as usize;
        let mut consumer_regs = self.regs.clone();
        for v in consumer_regs.iter_mut().flatten() {
            truncate_lanes(v, n);
        }
        let (iv, lo, hi, step, phis, body, nexts, _) = loops[0];
        let side = Side { iv, at: lo, hi, step, phis: phis.clone(), body: body.clone(), nexts: nexts.clone() };
        let regs = std::mem::replace(&mut self.regs, consumer_regs);
        let lanes = std::mem::replace(&mut self.lanes, n);
        self.producer = Some(Pump { side, regs, lanes });
        let (iv, lo, hi, step, phis, body, nexts, results) = loops[1];
        let mut at = lo;
        while at < hi && !self.exited {
            self.set(iv, Data::I(vec![at; self.lanes]));
            self.body(body)?;
            self.copy_all(phis, nexts)?;
            at += step;
        }
        // What the producer has left (nothing, when every copy it made was consumed).
        self.pump()?;
        let left = self.producer.take().filter(|p| p.side.at < p.side.hi);
        if let Some(p) = left {
            return fault(format!(
                "warp-specialized loops deadlock: the consumers finished, the producer waits at iteration value {}",
                p.side.at
            ));
        }
        self.copy_all(results, phis)
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

    /// Reads the boxes of `stores` from shared memory and writes them to global memory.
    fn complete_tma_stores(&mut self, stores: Vec<PendingTmaStore>) -> Result<(), Fault> {
        let view = self.mem.view();
        for s in stores {
            let es = s.map.elem_bytes as usize;
            for (at, global) in s.map.box_elements(s.src, s.row, s.col) {
                let Some(g) = global else { continue };
                let x = self.shared_get(s.lane, at, es)?;
                self.view.store(&view, g, es, x, s.lane).or_else(|e| fault(format!("TMA store: {}", e.0)))?;
            }
        }
        Ok(())
    }

    /// The shared offsets in `offset` of the lanes whose `pred` holds.
    fn active_offsets(&self, offset: Reg, pred: Reg) -> Result<Vec<usize>, Fault> {
        let (o, p) = (self.get(offset)?, self.get(pred)?);
        Ok((0..self.lanes).filter(|&i| p.ints()[i] != 0).map(|i| o.ints()[i] as usize).collect())
    }

    fn mbarrier(&mut self, at: usize) -> Result<&mut Mbarrier, Fault> {
        match self.mbarriers.get_mut(&at) {
            Some(m) => Ok(m),
            None => fault(format!("no mbarrier initialized at shared byte {at}")),
        }
    }

    /// The vendor library's device function, as the library defines it: a `Block` transfer
    /// once per program (every thread calls it with the same operands; lane 0's are used), the
    /// signal update by every calling thread, fence and quiet as this program's release of its
    /// stores (what the library's P2P path does) followed by an acquire.
    fn device_call(&mut self, call: DeviceCall, args: &[Reg], pred: Option<Reg>, lanes: usize) -> Result<(), Fault> {
        let vals: Vec<Val> = args.iter().map(|r| self.get(*r)).collect::<Result<_, _>>()?;
        let on: Vec<bool> = match pred {
            Some(p) => self.get(p)?.ints().iter().map(|&x| x != 0).collect(),
            None => vec![true; lanes],
        };
        let Some(first) = on.iter().position(|&b| b) else { return Ok(()) };
        let name = Vendor::Nvshmem.function(call);
        let int = |i: usize, lane: usize| vals[i].ints()[lane];
        let ptr = |i: usize, lane: usize| vals[i].ptrs()[lane];
        match call {
            DeviceCall::PutBlock { .. } | DeviceCall::GetBlock { .. } | DeviceCall::PutSignalBlock { .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let is_put = !matches!(call, DeviceCall::GetBlock { .. });
                let (dst, src, bytes) = (ptr(0, first), ptr(1, first), int(2, first));
                let pe = int(vals.len() - 1, first);
                let (to, from) =
                    if is_put { (self.hooks.translate(dst, pe)?, src) } else { (dst, self.hooks.translate(src, pe)?) };
                let view = self.mem.view();
                let mut done = 0u64;
                while done < bytes.max(0) as u64 {
                    let n = if bytes as u64 - done >= 8 { 8 } else { 1 };
                    let bits = self.view.load(&view, from + done, n).or_else(|e| fault(format!("{name}: {}", e.0)))?;
                    self.view.store(&view, to + done, n, bits, first).or_else(|e| fault(format!("{name}: {}", e.0)))?;
                    done += n as u64;
                }
                if let DeviceCall::PutSignalBlock { op, .. } = call {
                    // The signal is delivered after the data.
                    self.view.release_all(self.mem).or_else(|e| fault(e.0))?;
                    let sig = self.hooks.translate(ptr(3, first), pe)?;
                    self.view.race_release(sig);
                    self.signal_update(sig, int(4, first) as u64, op, name)?;
                }
            }
            DeviceCall::SignalOp { op } => {
                self.hooks.yield_point(&mut self.view)?;
                for lane in (0..lanes).filter(|&l| on[l]) {
                    let sig = self.hooks.translate(ptr(0, lane), int(2, lane))?;
                    self.signal_update(sig, int(1, lane) as u64, op, name)?;
                }
            }
            DeviceCall::Fence | DeviceCall::Quiet => {
                self.view.release_all(self.mem).or_else(|e| fault(e.0))?;
                self.view.acquire(self.mem);
                self.view.race_fence();
            }
        }
        Ok(())
    }

    /// A 64-bit signal update (relaxed, system scope), reported to the world's scheduler;
    /// `call`, when not empty, names the library call that made it in a fault.
    fn signal_update(&mut self, addr: u64, x: u64, op: SignalOp, call: &str) -> Result<(), Fault> {
        let f = |old: u64| match op {
            SignalOp::Set => x,
            SignalOp::Add => old.wrapping_add(x),
        };
        self.view.rmw(self.mem, addr, 8, f).or_else(|e| match call {
            "" => fault(format!("signal: {}", e.0)),
            _ => fault(format!("{call}: signal: {}", e.0)),
        })?;
        self.view.race_relaxed_write(addr);
        self.hooks.signal_written(&self.view, addr, x);
        Ok(())
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

    fn copy_all(&mut self, dsts: &[Reg], srcs: &[Reg]) -> Result<(), Fault> {
        let vals: Vec<Val> = srcs.iter().map(|s| self.get(*s)).collect::<Result<_, _>>()?;
        for (d, v) in dsts.iter().zip(vals) {
            self.regs[d.0 as usize] = Some(v);
        }
        Ok(())
    }

    /// The low `size` bytes of `bits` into shared memory at byte `off`, written by `lane`.
    fn shared_put(&mut self, lane: usize, off: usize, size: usize, bits: u64) -> Result<(), Fault> {
        let total = self.k.shared_bytes;
        if self.shared.get(off..off + size).is_none() {
            return fault(format!("shared store of {size} bytes at {off} out of {total} bytes"));
        }
        let bytes = bits.to_le_bytes();
        for (i, b) in bytes[..size].iter().enumerate() {
            let same = self.shared[off + i] == *b;
            self.hazards.write(lane, off + i, same)?;
            self.shared[off + i] = *b;
        }
        Ok(())
    }

    /// `size` bytes of shared memory at byte `off`, zero-extended, read by `lane`.
    fn shared_get(&mut self, lane: usize, off: usize, size: usize) -> Result<u64, Fault> {
        let Some(slot) = self.shared.get(off..off + size) else {
            return fault(format!("shared load of {size} bytes at {off} out of {} bytes", self.k.shared_bytes));
        };
        let mut b = [0u8; 8];
        b[..size].copy_from_slice(slot);
        for i in 0..size {
            self.hazards.read(lane, off + i)?;
        }
        Ok(u64::from_le_bytes(b))
    }

    /// Read-modify-write of each active lane's word at `addr` (`f(lane, current)` is the new
    /// value), releasing before and acquiring after as `sem` says; `dst` gets the old values.
    /// `writes` is false for an atomic load (a relaxed load publishes nothing at the next
    /// signal; a relaxed store acquires nothing at the next fence).
    #[allow(clippy::too_many_arguments)]
    fn atomic_lanes(
        &mut self,
        dst: Option<Reg>,
        addr: Reg,
        pred: Option<Reg>,
        sem: MemSemantic,
        d: DType,
        (what, writes): (&str, bool),
        f: &dyn Fn(usize, u64) -> u64,
    ) -> Result<(), Fault> {
        self.hooks.yield_point(&mut self.view)?;
        let lanes = self.lanes;
        let size = d.size_bytes() as usize;
        let a = self.get(addr)?;
        let p = pred.map(|p| self.get(p)).transpose()?;
        let active: Vec<usize> = (0..lanes).filter(|i| p.as_ref().is_none_or(|p| p.ints()[*i] != 0)).collect();
        if sem.releases() {
            // Each active thread releases what it (and any barrier before) ordered.
            if active.len() == lanes {
                self.view.release_all(self.mem).or_else(|e| fault(e.0))?;
            } else {
                for &t in &active {
                    self.view.release_thread(self.mem, t).or_else(|e| fault(e.0))?;
                }
            }
        }
        for &i in &active {
            let at = a.ptrs()[i];
            if sem.releases() {
                self.view.race_release(at);
            } else {
                // Relaxed: ordered by the fences around it (fence; write / read; fence).
                if writes {
                    self.view.race_relaxed_write(at);
                }
                if dst.is_some() {
                    self.view.race_relaxed_read(at);
                }
            }
        }
        let mut old = vec![0u64; lanes];
        for &i in &active {
            old[i] = self
                .view
                .rmw(self.mem, a.ptrs()[i], size, |cur| f(i, cur))
                .or_else(|e| fault(format!("{what}: {}", e.0)))?;
        }
        if sem.acquires() {
            self.view.acquire(self.mem);
            for &i in &active {
                self.view.race_acquire(a.ptrs()[i]);
            }
        }
        if let Some(dst) = dst {
            let mut out = empty_for(Elem::Num(d), lanes);
            for b in old {
                push(&mut out, from_bits(d, b))?;
            }
            self.set(dst, out);
        }
        Ok(())
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
        let (k, lanes) = (self.k, self.lanes);
        match inst {
            Inst::Param { dst, index } => {
                let d = match self.args[*index as usize] {
                    KernelArg::Ptr(p) => Data::P(vec![p; lanes]),
                    KernelArg::Scalar(lit, dt) => literal(lit, dt).splat(lanes),
                };
                self.set(*dst, d);
            }
            Inst::Special { dst, which } => {
                let v: Vec<i64> = match which {
                    Special::ThreadId => (0..lanes as i64).collect(),
                    Special::ProgramId(a) => vec![self.pid[a.index()] as i64; lanes],
                    Special::NumPrograms(a) => vec![self.grid[a.index()] as i64; lanes],
                };
                self.set(*dst, Data::I(v));
            }
            Inst::Const { dst, value } => {
                let t = k.ty(*dst);
                let d = if t == SType::Ptr { Data::P(vec![0; lanes]) } else { literal(*value, dtype(t)).splat(lanes) };
                self.set(*dst, d);
            }
            Inst::Unary { dst, op, src } => {
                let t = k.ty(*src);
                let primitive = match t {
                    SType::F32 | SType::F64 => {
                        matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Floor | UnaryOp::Ceil)
                    }
                    SType::Pred => *op == UnaryOp::Not,
                    SType::Int { bits: 32 | 64, .. } => matches!(op, UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs),
                    _ => false,
                };
                if !primitive {
                    return contract(format!("`{op}` on {t:?} is not a SIMT primitive"));
                }
                let d = crate::interp::unary(*op, &self.get(*src)?)?;
                self.set(*dst, d);
            }
            Inst::Binary { dst, op, a, b } => {
                let (x, y) = (self.get(*a)?, self.get(*b)?);
                let d = self.binary_primitive(k.ty(*a), *op, &x, &y)?;
                self.set(*dst, d);
            }
            Inst::Cmp { dst, op, a, b } => {
                let t = k.ty(*a);
                if matches!(t, SType::F16 | SType::BF16 | SType::Int { bits: 8 | 16, .. })
                    || (t == SType::Pred && !matches!(op, CmpOp::Eq | CmpOp::Ne))
                {
                    return contract(format!("`{op}` comparison on {t:?} is not a SIMT primitive"));
                }
                let d = crate::interp::compare(*op, &self.get(*a)?, &self.get(*b)?);
                self.set(*dst, d);
            }
            Inst::Bitcast { dst, src } => {
                let v = self.get(*src)?;
                let d = match (&v.data, k.ty(*dst)) {
                    (Data::F(x), SType::Int { bits: 32, signed }) => Data::I(
                        x.iter().map(|f| if signed { f.to_bits() as i32 as i64 } else { f.to_bits() as i64 }).collect(),
                    ),
                    (Data::D(x), SType::Int { bits: 64, .. }) => {
                        Data::I(x.iter().map(|f| f.to_bits() as i64).collect())
                    }
                    (Data::I(x), SType::F32) => Data::F(x.iter().map(|&i| f32::from_bits(i as u32)).collect()),
                    (Data::I(x), SType::F64) => Data::D(x.iter().map(|&i| f64::from_bits(i as u64)).collect()),
                    (Data::P(x), SType::Int { bits: 64, .. }) => Data::I(x.iter().map(|&p| p as i64).collect()),
                    (Data::I(x), SType::Ptr) => Data::I(x.clone()),
                    _ => return contract(format!("bitcast from {:?} to {:?}", k.ty(*src), k.ty(*dst))),
                };
                self.set(*dst, d);
            }
            Inst::Approx { dst, func, src } => {
                let Data::F(x) = self.get(*src)?.data else { return contract("approximation of a non-f32 register") };
                let f = *func;
                self.set(*dst, Data::F(x.iter().map(|&a| trident_core::math::native::approx_f32(f, a)).collect()));
            }
            Inst::Select { dst, cond, on_true, on_false } => {
                let (c, t, f) = (self.get(*cond)?, self.get(*on_true)?, self.get(*on_false)?);
                let idx: Vec<usize> =
                    c.ints().iter().enumerate().map(|(i, &ci)| if ci != 0 { i } else { i + lanes }).collect();
                self.set(*dst, crate::interp::concat(&t.data, &f.data).gather(&idx));
            }
            Inst::Cast { dst, src } => {
                let x = self.get(*src)?;
                let to = dtype(k.ty(*dst));
                let mut d = crate::interp::cast(&x, to);
                // A NaN converted to a (32/64-bit) integer is the hardware's business: give
                // MIN, as PTX does for 64-bit results, so that a missing NaN select shows.
                if let (SType::Int { bits, signed }, Data::I(v)) = (k.ty(*dst), &mut d) {
                    let nan: Vec<bool> = match &x.data {
                        Data::F(f) => f.iter().map(|a| a.is_nan()).collect(),
                        Data::D(f) => f.iter().map(|a| a.is_nan()).collect(),
                        _ => Vec::new(),
                    };
                    for (o, n) in v.iter_mut().zip(nan) {
                        if n {
                            *o = if signed { i64::MIN >> (64 - bits) } else { 1i64 << (bits - 1) };
                        }
                    }
                }
                self.set(*dst, d);
            }
            Inst::Mov { dst, src } => self.copy_all(&[*dst], &[*src])?,
            Inst::Fma { dst, a, b, c } => {
                let d = match (&self.get(*a)?.data, &self.get(*b)?.data, &self.get(*c)?.data) {
                    (Data::F(x), Data::F(y), Data::F(z)) => {
                        Data::F((0..lanes).map(|i| x[i].mul_add(y[i], z[i])).collect())
                    }
                    (Data::D(x), Data::D(y), Data::D(z)) => {
                        Data::D((0..lanes).map(|i| x[i].mul_add(y[i], z[i])).collect())
                    }
                    _ => return fault("fma on non-float registers"),
                };
                self.set(*dst, d);
            }
            Inst::AddrOffset { dst, base, offset, scale } => {
                let (b, o) = (self.get(*base)?, self.get(*offset)?);
                let unsigned = matches!(k.ty(*offset), SType::Int { bits: 64, signed: false });
                let v = b
                    .ptrs()
                    .iter()
                    .zip(o.ints())
                    .map(|(&p, &off)| {
                        let off = if unsigned { off as u64 as i128 } else { off as i128 };
                        (p as i128 + off * *scale as i128) as u64
                    })
                    .collect();
                self.set(*dst, Data::P(v));
            }
            Inst::Load { dst, addr, pred, other } => {
                let d = dtype(k.ty(*dst));
                let size = d.size_bytes() as usize;
                let a = self.get(*addr)?;
                let p = pred.map(|p| self.get(p)).transpose()?;
                let o = other.map(|o| self.get(o)).transpose()?;
                let view = self.mem.view();
                let mut out = empty_for(Elem::Num(d), lanes);
                for (i, &addr) in a.ptrs().iter().enumerate() {
                    let on = p.as_ref().is_none_or(|p| p.ints()[i] != 0);
                    let e = if on {
                        from_bits(d, self.view.load(&view, addr, size).or_else(|e| fault(format!("load: {}", e.0)))?)
                    } else {
                        masked_off(d, o.as_ref().map(|o| &o.data), i)
                    };
                    push(&mut out, e)?;
                }
                self.set(*dst, out);
            }
            Inst::Store { addr, value, pred } => {
                let d = dtype(k.ty(*value));
                let size = d.size_bytes() as usize;
                let (a, v) = (self.get(*addr)?, self.get(*value)?);
                let p = pred.map(|p| self.get(p)).transpose()?;
                let view = self.mem.view();
                for (i, &addr) in a.ptrs().iter().enumerate() {
                    if p.as_ref().is_some_and(|p| p.ints()[i] == 0) {
                        continue;
                    }
                    self.view
                        .store(&view, addr, size, elem_bits(&v.data, i, d), i)
                        .or_else(|e| fault(format!("store: {}", e.0)))?;
                }
            }
            Inst::VLoad { dsts, addr, pred, others } => {
                let d = dtype(k.ty(dsts[0]));
                let size = d.size_bytes() as usize;
                let a = self.get(*addr)?;
                let p = pred.map(|p| self.get(p)).transpose()?;
                let others: Vec<Val> = others.iter().map(|o| self.get(*o)).collect::<Result<_, _>>()?;
                let view = self.mem.view();
                let mut outs: Vec<Data> = dsts.iter().map(|_| empty_for(Elem::Num(d), lanes)).collect();
                for (i, &base) in a.ptrs().iter().enumerate() {
                    let on = p.as_ref().is_none_or(|p| p.ints()[i] != 0);
                    if on && base % (size * dsts.len()) as u64 != 0 {
                        return fault(format!("vector load at {base:#x} not aligned to {} bytes", size * dsts.len()));
                    }
                    for (j, out) in outs.iter_mut().enumerate() {
                        let e = if on {
                            let at = base + (j * size) as u64;
                            from_bits(d, self.view.load(&view, at, size).or_else(|e| fault(format!("load: {}", e.0)))?)
                        } else {
                            masked_off(d, others.get(j).map(|o| &o.data), i)
                        };
                        push(out, e)?;
                    }
                }
                for (dst, out) in dsts.iter().zip(outs) {
                    self.set(*dst, out);
                }
            }
            Inst::VStore { addr, values, pred } => {
                let d = dtype(k.ty(values[0]));
                let size = d.size_bytes() as usize;
                let a = self.get(*addr)?;
                let vs: Vec<Val> = values.iter().map(|v| self.get(*v)).collect::<Result<_, _>>()?;
                let p = pred.map(|p| self.get(p)).transpose()?;
                let view = self.mem.view();
                for (i, &base) in a.ptrs().iter().enumerate() {
                    if p.as_ref().is_some_and(|p| p.ints()[i] == 0) {
                        continue;
                    }
                    if base % (size * vs.len()) as u64 != 0 {
                        return fault(format!("vector store at {base:#x} not aligned to {} bytes", size * vs.len()));
                    }
                    for (j, v) in vs.iter().enumerate() {
                        let at = base + (j * size) as u64;
                        self.view
                            .store(&view, at, size, elem_bits(&v.data, i, d), i)
                            .or_else(|e| fault(format!("store: {}", e.0)))?;
                    }
                }
            }
            Inst::IsAligned { dst, addr, bytes } => {
                let a = self.get(*addr)?;
                let v = a.ptrs().iter().map(|&p| (p % *bytes as u64 == 0) as i64).collect();
                self.set(*dst, Data::I(v));
            }
            Inst::Shuffle { dst, src, lane_xor } => {
                let v = self.get(*src)?;
                let ws = k.warp_size as usize;
                let idx: Vec<usize> = (0..lanes).map(|i| (i / ws) * ws + ((i % ws) ^ *lane_xor as usize)).collect();
                self.set(*dst, v.data.gather(&idx));
            }
            Inst::SharedStore { offset, value, pred } => {
                let d = dtype(k.ty(*value));
                let size = trident_core::simt::lower::shared_size(k.ty(*value)) as usize;
                let (o, v) = (self.get(*offset)?, self.get(*value)?);
                let p = pred.map(|p| self.get(p)).transpose()?;
                for i in 0..lanes {
                    if p.as_ref().is_some_and(|p| p.ints()[i] == 0) {
                        continue;
                    }
                    self.shared_put(i, o.ints()[i] as usize, size, elem_bits(&v.data, i, d))?;
                }
            }
            Inst::SharedVStore { offset, values } => {
                let d = dtype(k.ty(values[0]));
                let size = trident_core::simt::lower::shared_size(k.ty(values[0])) as usize;
                let o = self.get(*offset)?;
                let vs: Vec<Val> = values.iter().map(|v| self.get(*v)).collect::<Result<_, _>>()?;
                for i in 0..lanes {
                    let base = o.ints()[i] as usize;
                    if !base.is_multiple_of(size * vs.len()) {
                        return fault(format!(
                            "shared vector store at {base} not aligned to {} bytes",
                            size * vs.len()
                        ));
                    }
                    for (j, v) in vs.iter().enumerate() {
                        self.shared_put(i, base + j * size, size, elem_bits(&v.data, i, d))?;
                    }
                }
            }
            Inst::SharedLoad { dst, offset } => {
                let d = dtype(k.ty(*dst));
                let size = trident_core::simt::lower::shared_size(k.ty(*dst)) as usize;
                let o = self.get(*offset)?;
                let mut out = empty_for(Elem::Num(d), lanes);
                for i in 0..lanes {
                    push(&mut out, from_bits(d, self.shared_get(i, o.ints()[i] as usize, size)?))?;
                }
                self.set(*dst, out);
            }
            // Lanes run in lock-step; the view orders every thread's stores before later releases.
            Inst::Barrier => {
                self.view.barrier();
                self.hazards.barrier();
            }
            Inst::BarrierAny { dst, pred } => {
                self.view.barrier();
                self.hazards.barrier();
                let any = self.get(*pred)?.ints().iter().any(|x| *x != 0);
                self.set(*dst, Data::I(vec![any as i64; lanes]));
            }
            Inst::Exit => self.exited = true,
            Inst::Origin { op, what, loc } => self.origin = Some((*op, what, *loc)),
            Inst::Clock { dst } => {
                let ns = clock_ns();
                self.set(*dst, Data::I(vec![ns as i64; lanes]));
            }
            Inst::AtomicLoad { dst, addr, pred, sem, .. } => {
                if sem.releases() {
                    return contract(format!("atomic load with {sem} semantics"));
                }
                let d = dtype(k.ty(*dst));
                self.atomic_lanes(Some(*dst), *addr, *pred, *sem, d, ("atomic load", false), &|_, cur| cur)?;
            }
            Inst::AtomicStore { addr, value, pred, sem, .. } => {
                if sem.acquires() {
                    return contract(format!("atomic store with {sem} semantics"));
                }
                let d = dtype(k.ty(*value));
                let v = self.get(*value)?;
                self.atomic_lanes(None, *addr, *pred, *sem, d, ("atomic store", true), &|i, _| {
                    elem_bits(&v.data, i, d)
                })?;
            }
            Inst::Atomic { dst, op, addr, value, pred, sem, .. } => {
                let d = dtype(k.ty(*value));
                let v = self.get(*value)?;
                let f = |i: usize, cur: u64| crate::interp::atomic_apply(*op, d, cur, elem_bits(&v.data, i, d));
                self.atomic_lanes(Some(*dst), *addr, *pred, *sem, d, ("atomic", true), &f)?;
            }
            Inst::AtomicCas { dst, addr, expected, desired, pred, sem, .. } => {
                let d = dtype(k.ty(*desired));
                let (e, n) = (self.get(*expected)?, self.get(*desired)?);
                let f = |i: usize, cur: u64| {
                    if cur == elem_bits(&e.data, i, d) {
                        elem_bits(&n.data, i, d)
                    } else {
                        cur
                    }
                };
                self.atomic_lanes(Some(*dst), *addr, *pred, *sem, d, ("cas", true), &f)?;
            }
            // Copies complete at once here (the GPU's asynchrony is covered by the waits and
            // barriers the lowering places; the GPU conformance run checks them).
            Inst::AsyncCopy { offset, addr, bytes, pred, zero_fill } => {
                let (o, a, p) = (self.get(*offset)?, self.get(*addr)?, self.get(*pred)?);
                let view = self.mem.view();
                for i in 0..lanes {
                    if p.ints()[i] == 0 {
                        if *zero_fill {
                            let dst = o.ints()[i] as usize;
                            if !dst.is_multiple_of(*bytes as usize) {
                                return fault(format!(
                                    "cp.async zero fill of {bytes} bytes at shared {dst} not aligned"
                                ));
                            }
                            for b in (0..*bytes as usize).step_by(2) {
                                self.shared_put(i, dst + b, 2, 0)?;
                            }
                        }
                        continue;
                    }
                    let (src, dst) = (a.ptrs()[i], o.ints()[i] as usize);
                    if src % *bytes as u64 != 0 || dst % *bytes as usize != 0 {
                        return fault(format!("cp.async of {bytes} bytes from {src:#x} to shared {dst} not aligned"));
                    }
                    for b in (0..*bytes as usize).step_by(2) {
                        let x = self
                            .view
                            .load(&view, src + b as u64, 2)
                            .or_else(|e| fault(format!("cp.async: {}", e.0)))?;
                        self.shared_put(i, dst + b, 2, x)?;
                    }
                }
            }
            Inst::AsyncCommit | Inst::AsyncWait { .. } => {}
            Inst::MatrixLoad { dsts, offset, trans } => {
                let o = self.get(*offset)?;
                let mut out = vec![vec![0i64; lanes]; dsts.len()];
                for w in 0..lanes / 32 {
                    for (j, out_j) in out.iter_mut().enumerate() {
                        // Row r of matrix j starts at lane 8 j + r's offset.
                        let row = |r: usize| o.ints()[w * 32 + 8 * j + r] as usize;
                        for l in 0..32 {
                            let (g, t) = (l / 4, l % 4);
                            let (a0, a1) = if *trans {
                                (row(2 * t) + 2 * g, row(2 * t + 1) + 2 * g)
                            } else {
                                (row(g) + 4 * t, row(g) + 4 * t + 2)
                            };
                            let (e0, e1) = (self.shared_get(w * 32 + l, a0, 2)?, self.shared_get(w * 32 + l, a1, 2)?);
                            out_j[w * 32 + l] = (e0 | e1 << 16) as u32 as i32 as i64;
                        }
                    }
                }
                for (dst, v) in dsts.iter().zip(out) {
                    self.set(*dst, Data::I(v));
                }
            }
            Inst::Matmul { atom, d, a, b, c, ab } => {
                let atom = *atom;
                let half = |bits: u64| match ab {
                    SType::BF16 => half::bf16::from_bits(bits as u16).to_f32() as f64,
                    _ => half::f16::from_bits(bits as u16).to_f32() as f64,
                };
                let av: Vec<Val> = a.iter().map(|r| self.get(*r)).collect::<Result<_, _>>()?;
                let bv: Vec<Val> = b.iter().map(|r| self.get(*r)).collect::<Result<_, _>>()?;
                let cv: Vec<Val> = c.iter().map(|r| self.get(*r)).collect::<Result<_, _>>()?;
                let n_lanes = atom.lanes as usize;
                if lanes % n_lanes != 0 || av.len() * 2 != atom.a_elems as usize || cv.len() != atom.c_elems as usize {
                    return contract(format!(
                        "{} on {lanes} threads with {} A and {} C registers",
                        atom.name,
                        av.len(),
                        cv.len()
                    ));
                }
                let (m, n, kk) = (atom.m as usize, atom.n as usize, atom.k as usize);
                let mut dv = vec![vec![0f32; lanes]; cv.len()];
                // Each group of the atom's lanes computes one instruction tile: gather A, B and C
                // from the lanes' fragments by the atom's maps, multiply, scatter D.
                for g in 0..lanes / n_lanes {
                    let (mut ma, mut mb, mut mc) = (vec![0f64; m * kk], vec![0f64; kk * n], vec![0f64; m * n]);
                    for l in 0..n_lanes {
                        let i = g * n_lanes + l;
                        for (p, reg) in av.iter().enumerate() {
                            let bits = reg.ints()[i] as u64;
                            for h in 0..2 {
                                let (r, col) = atom.a.eval(l as u32, (2 * p + h) as u32);
                                ma[r as usize * kk + col as usize] = half(bits >> (16 * h) & 0xffff);
                            }
                        }
                        for (p, reg) in bv.iter().enumerate() {
                            let bits = reg.ints()[i] as u64;
                            for h in 0..2 {
                                let (r, col) = atom.b.eval(l as u32, (2 * p + h) as u32);
                                mb[r as usize * n + col as usize] = half(bits >> (16 * h) & 0xffff);
                            }
                        }
                        for (e, reg) in cv.iter().enumerate() {
                            let Data::F(x) = &reg.data else { return contract("a matmul accumulator that is not f32") };
                            let (r, col) = atom.c.eval(l as u32, e as u32);
                            mc[r as usize * n + col as usize] = x[i] as f64;
                        }
                    }
                    for l in 0..n_lanes {
                        for (e, out) in dv.iter_mut().enumerate() {
                            let (r, col) = atom.c.eval(l as u32, e as u32);
                            let (r, col) = (r as usize, col as usize);
                            let dot: f64 = (0..kk).map(|k| ma[r * kk + k] * mb[k * n + col]).sum();
                            out[g * n_lanes + l] = (dot + mc[r * n + col]) as f32;
                        }
                    }
                }
                for (r, out) in d.iter().zip(dv) {
                    self.set(*r, Data::F(out));
                }
            }
            Inst::MatrixDescriptor { dst, offset, lbo, sbo, swizzle } => {
                use trident_core::simt::smem::Descriptor;
                let o = self.get(*offset)?;
                let v = (0..lanes)
                    .map(|i| {
                        let d = Descriptor { start: o.ints()[i] as u32, lbo: *lbo, sbo: *sbo, swizzle: *swizzle };
                        d.encode() as i64
                    })
                    .collect();
                self.set(*dst, Data::I(v));
            }
            // Executed at issue (the asynchrony is the waits' business, checked on the GPU).
            Inst::Wgmma { d, c, a, b, n, ab, trans_b, scale_d } => {
                use trident_core::simt::smem::{element_address, Descriptor};
                let half = |bits: u64| match ab {
                    SType::BF16 => half::bf16::from_bits(bits as u16).to_f32() as f64,
                    _ => half::f16::from_bits(bits as u16).to_f32() as f64,
                };
                let n = *n as usize;
                let (av, bv) = (self.get(*a)?, self.get(*b)?);
                let cv: Vec<Val> = c.iter().map(|r| self.get(*r)).collect::<Result<_, _>>()?;
                let accumulate = match scale_d {
                    Some(p) => self.uniform(*p)? != 0,
                    None => true,
                };
                // (Producer warps beyond `k.warps` take no part.)
                let lanes = (k.warps * k.warp_size) as usize;
                if !lanes.is_multiple_of(128)
                    || cv.len() != n / 2
                    || d.len() != n / 2
                    || !n.is_multiple_of(8)
                    || n > 256
                {
                    return contract(format!(
                        "wgmma m64n{n}k16 on {lanes} threads with {} accumulator registers",
                        cv.len()
                    ));
                }
                let mut dv = vec![vec![0f32; self.lanes]; n / 2];
                for g in 0..lanes / 128 {
                    let first = 128 * g;
                    let (da, db) = (av.ints()[first] as u64, bv.ints()[first] as u64);
                    if (first..first + 128).any(|t| av.ints()[t] as u64 != da || bv.ints()[t] as u64 != db) {
                        return contract("wgmma descriptors differ across the warpgroup");
                    }
                    let (da, db) = (Descriptor::decode(da), Descriptor::decode(db));
                    let mut ma = vec![0f64; 64 * 16];
                    let mut mb = vec![0f64; 16 * n];
                    for row in 0..64u32 {
                        for kk in 0..16u32 {
                            let Some(at) = element_address(&da, false, row, kk) else {
                                return contract("wgmma operand A without a swizzled layout");
                            };
                            ma[(row * 16 + kk) as usize] = half(self.shared_get(first, at as usize, 2)?);
                        }
                    }
                    for kk in 0..16u32 {
                        for col in 0..n as u32 {
                            let Some(at) = element_address(&db, *trans_b, col, kk) else {
                                return contract("wgmma operand B without a swizzled layout");
                            };
                            mb[kk as usize * n + col as usize] = half(self.shared_get(first, at as usize, 2)?);
                        }
                    }
                    for t in first..first + 128 {
                        let (w, l) = ((t - first) / 32, t % 32);
                        let (gr, t4) = (l / 4, l % 4);
                        for (e, out) in dv.iter_mut().enumerate() {
                            let (j, r) = (e / 4, e % 4);
                            let row = 16 * w + gr + 8 * (r / 2);
                            let col = 8 * j + 2 * t4 + r % 2;
                            let Data::F(x) = &cv[e].data else {
                                return contract("a wgmma accumulator that is not f32");
                            };
                            let dot: f64 = (0..16).map(|kk| ma[row * 16 + kk] * mb[kk * n + col]).sum();
                            out[t] = if accumulate { (dot + x[t] as f64) as f32 } else { dot as f32 };
                        }
                    }
                }
                for (r, out) in d.iter().zip(dv) {
                    self.set(*r, Data::F(out));
                }
            }
            Inst::WgmmaFence
            | Inst::WgmmaCommit
            | Inst::WgmmaWait { .. }
            | Inst::FenceProxyAsync
            | Inst::FenceProxyAsyncGlobal
            | Inst::FenceMbarrierInit => {}
            Inst::MbarrierInit { offset, count, pred } => {
                for at in self.active_offsets(*offset, *pred)? {
                    self.mbarriers.insert(at, Mbarrier { count: *count, pending: *count, tx: 0, phase: 0 });
                }
            }
            Inst::MbarrierInval { offset, pred } => {
                for at in self.active_offsets(*offset, *pred)? {
                    self.mbarriers.remove(&at);
                }
            }
            Inst::MbarrierExpectTx { offset, bytes, pred } => {
                for at in self.active_offsets(*offset, *pred)? {
                    let m = self.mbarrier(at)?;
                    if m.pending == 0 {
                        return contract(format!("more arrivals at the mbarrier at shared byte {at} than its count"));
                    }
                    m.pending -= 1;
                    m.tx += *bytes as i64;
                    m.settle();
                }
            }
            // Copies complete at once here, so a wait either passes or never would.
            Inst::MbarrierWait { offset, parity } => {
                let (o, p) = (self.get(*offset)?, self.get(*parity)?);
                for i in 0..lanes {
                    let (at, want) = (o.ints()[i] as usize, p.ints()[i] as u64 & 1);
                    let mut m = *self.mbarrier(at)?;
                    if m.phase & 1 == want && self.yielding {
                        self.blocked = true;
                        return fault("blocked on an mbarrier (the other side runs)");
                    }
                    // A consumer waits: the producer runs until it blocks too.
                    while m.phase & 1 == want && self.pump()? {
                        m = *self.mbarrier(at)?;
                    }
                    if m.phase & 1 == want {
                        return fault(format!(
                            "thread {i} waits for phase parity {want} of the mbarrier at shared byte {at}, which never completes: \
                             phase {} has {} of {} arrivals and {} bytes outstanding (a copy not issued, or announced \
                             with the wrong size)",
                            m.phase, m.pending, m.count, m.tx
                        ));
                    }
                }
                // The wait orders what the phase's arrivals and copies did before it, for the
                // race detector as a barrier would.
                self.hazards.barrier();
            }
            Inst::BulkCommit => {
                let group = std::mem::take(&mut self.bulk_open);
                self.bulk_groups.push_back(group);
            }
            Inst::BulkWait { pending } => {
                while self.bulk_groups.len() > *pending as usize {
                    let group = self.bulk_groups.pop_front().unwrap_or_default();
                    self.complete_tma_stores(group)?;
                }
            }
            Inst::TmaStore { map, offset, coords, pred } => {
                let (o, r, c, p) = (self.get(*offset)?, self.get(coords[0])?, self.get(coords[1])?, self.get(*pred)?);
                let Some(m) = self.maps.get(*map as usize).copied() else {
                    return contract(format!("TMA store through tensor map {map}, which the kernel does not have"));
                };
                for i in (0..lanes).filter(|&i| p.ints()[i] != 0) {
                    let src = o.ints()[i] as usize;
                    if !src.is_multiple_of(m.shared_align()) {
                        return fault(format!(
                            "TMA store from shared byte {src}, not {}-byte aligned",
                            m.shared_align()
                        ));
                    }
                    // Read when its group is waited for (or at the program's end): the latest
                    // the GPU may read it, so shared memory reused too early shows up as wrong
                    // values in global memory.
                    self.bulk_open.push(PendingTmaStore { lane: i, map: m, src, row: r.ints()[i], col: c.ints()[i] });
                }
            }
            Inst::MbarrierArrive { offset, pred } => {
                for at in self.active_offsets(*offset, *pred)? {
                    let m = self.mbarrier(at)?;
                    if m.pending == 0 {
                        return contract(format!("more arrivals at the mbarrier at shared byte {at} than its count"));
                    }
                    m.pending -= 1;
                    m.settle();
                }
            }
            Inst::Specialized { consumer_warps, producer, consumer } => {
                self.specialized(*consumer_warps, producer, consumer)?;
            }
            Inst::TmaLoad { map, offset, coords, barrier, pred } => {
                let (o, r, c, b, p) = (
                    self.get(*offset)?,
                    self.get(coords[0])?,
                    self.get(coords[1])?,
                    self.get(*barrier)?,
                    self.get(*pred)?,
                );
                let Some(m) = self.maps.get(*map as usize).copied() else {
                    return contract(format!("TMA copy through tensor map {map}, which the kernel does not have"));
                };
                let view = self.mem.view();
                for i in (0..lanes).filter(|&i| p.ints()[i] != 0) {
                    let dst = o.ints()[i] as usize;
                    if !dst.is_multiple_of(m.shared_align()) {
                        return fault(format!("TMA copy to shared byte {dst}, not {}-byte aligned", m.shared_align()));
                    }
                    let es = m.elem_bytes as usize;
                    for (at, global) in m.box_elements(dst, r.ints()[i], c.ints()[i]) {
                        let x = match global {
                            Some(g) => self.view.load(&view, g, es).or_else(|e| fault(format!("TMA copy: {}", e.0)))?,
                            None => 0,
                        };
                        if self.shared.get(at..at + es).is_none() {
                            return fault(format!("TMA copy to shared bytes {at}.. out of {}", self.shared.len()));
                        }
                        for j in 0..es {
                            self.hazards.async_write(at + j)?;
                            self.shared[at + j] = (x >> (8 * j)) as u8;
                        }
                    }
                    let m_at = b.ints()[i] as usize;
                    let bar = self.mbarrier(m_at)?;
                    bar.tx -= m.box_bytes() as i64;
                    bar.settle();
                }
            }
            Inst::Pack { dst, lo, hi } => {
                let (l, h) = (self.get(*lo)?, self.get(*hi)?);
                let bits = |v: &Val, i: usize| elem_bits(&v.data, i, dtype(k.ty(*lo))) & 0xffff;
                let v = (0..lanes).map(|i| (bits(&l, i) | bits(&h, i) << 16) as u32 as i32 as i64).collect();
                self.set(*dst, Data::I(v));
            }
            Inst::SharedVLoad { dsts, offset } => {
                let d = dtype(k.ty(dsts[0]));
                let size = trident_core::simt::lower::shared_size(k.ty(dsts[0])) as usize;
                let o = self.get(*offset)?;
                let mut outs: Vec<Data> = dsts.iter().map(|_| empty_for(Elem::Num(d), lanes)).collect();
                for i in 0..lanes {
                    let base = o.ints()[i] as usize;
                    if !base.is_multiple_of(size * dsts.len()) {
                        return fault(format!(
                            "shared vector load at {base} not aligned to {} bytes",
                            size * dsts.len()
                        ));
                    }
                    for (j, out) in outs.iter_mut().enumerate() {
                        push(out, from_bits(d, self.shared_get(i, base + j * size, size)?))?;
                    }
                }
                for (dst, out) in dsts.iter().zip(outs) {
                    self.set(*dst, out);
                }
            }
            Inst::SymmAt { dst, ptr, rank } => {
                let (p, r) = (self.get(*ptr)?, self.get(*rank)?);
                let v = (0..lanes).map(|i| self.hooks.translate(p.ptrs()[i], r.ints()[i])).collect::<Result<_, _>>()?;
                self.set(*dst, Data::P(v));
            }
            // Every thread runs `fence.acq_rel`: releases what it stored, acquires what others did.
            Inst::Fence { .. } => {
                self.view.release_all(self.mem).or_else(|e| fault(e.0))?;
                self.view.acquire(self.mem);
                self.view.race_fence();
            }
            Inst::Signal { addr, value, op, pred } => {
                self.hooks.yield_point(&mut self.view)?;
                let (a, v, p) = (self.get(*addr)?, self.get(*value)?, self.get(*pred)?);
                for i in (0..lanes).filter(|&i| p.ints()[i] != 0) {
                    self.signal_update(a.ptrs()[i], v.ints()[i] as u64, *op, "")?;
                }
            }
            Inst::DeviceCall { call, args, pred } => self.device_call(*call, args, *pred, lanes)?,
            Inst::WaitSignals { base, count, cmp, value } => {
                self.hooks.yield_point(&mut self.view)?;
                let (b, c, v) = (self.get(*base)?, self.uniform(*count)?, self.get(*value)?);
                let want = v.ints()[0] as u64;
                let addrs: Vec<u64> = (0..c.max(0) as u64).map(|i| b.ptrs()[0].wrapping_add(8 * i)).collect();
                self.hooks.wait(&self.view, &addrs, *cmp, want)?;
                self.view.acquire(self.mem);
                for &a in &addrs {
                    self.view.race_acquire(a);
                }
            }
            Inst::Loop { iv, lo, hi, step, phis, inits, body, nexts, results } => {
                let (lo, hi, st) = (self.uniform(*lo)?, self.uniform(*hi)?, self.uniform(*step)?);
                if st <= 0 {
                    return fault(format!("loop step {st} is not positive"));
                }
                self.copy_all(phis, inits)?;
                let mut i = lo;
                while i < hi && !self.exited {
                    self.set(*iv, Data::I(vec![i; lanes]));
                    self.body(body)?;
                    if self.exited {
                        return Ok(());
                    }
                    self.copy_all(phis, nexts)?;
                    i += st;
                }
                self.copy_all(results, phis)?;
            }
            Inst::If { cond, then_body, then_yields, else_body, else_yields, results } => {
                if self.uniform(*cond)? != 0 {
                    self.body(then_body)?;
                    if self.exited {
                        return Ok(());
                    }
                    self.copy_all(results, then_yields)?;
                } else {
                    self.body(else_body)?;
                    if self.exited {
                        return Ok(());
                    }
                    self.copy_all(results, else_yields)?;
                }
            }
            Inst::While { phis, inits, cond_body, cond, body, nexts, results } => {
                self.copy_all(phis, inits)?;
                loop {
                    self.body(cond_body)?;
                    if self.exited {
                        return Ok(());
                    }
                    if self.uniform(*cond)? == 0 {
                        break;
                    }
                    self.body(body)?;
                    if self.exited {
                        return Ok(());
                    }
                    self.copy_all(phis, nexts)?;
                }
                self.copy_all(results, phis)?;
            }
        }
        Ok(())
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
