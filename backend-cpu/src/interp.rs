//! The interpreter: runs one program of a launch, op by op, each op over whole tiles.
//!
//! Dispatch happens once per op; the element loops inside an op are tight loops over one
//! storage class. Memory goes through the program's [`ProgramView`] (immediate or delayed
//! visibility); scheduling, waiting and address translation go through [`Hooks`], which the
//! single-device launch and the world implement differently.

use crate::memory::Memory;
use crate::value::*;
use crate::view::{ProgramView, Transfer};
use trident_core::backend::KernelArg;
use trident_core::ir::*;
use trident_core::math::{self, native::Native};
use trident_core::trace::EventKind;

/// A failure inside a program, located at an op.
#[derive(Debug)]
pub struct Fault {
    pub op: Option<Op>,
    pub message: String,
}

impl Fault {
    /// The user-facing error: kernel, rank, program, op (with its text position) and message.
    pub fn into_error(self, func: &Function, program: [u32; 3], rank: u32) -> trident_core::backend::BackendError {
        let op = self.op.and_then(|o| func.ops.get(o).map(|d| (o, d)));
        trident_core::backend::BackendError::Execution {
            kernel: if rank == 0 { func.name.clone() } else { format!("{} on rank {rank}", func.name) },
            program,
            op: op.map(|(o, d)| format!("{} (op #{})", d.kind.mnemonic(), o.index())).unwrap_or_default(),
            loc: op.and_then(|(_, d)| d.loc),
            message: self.message,
        }
    }
}

pub type R<T> = Result<T, Fault>;

pub fn fault<T>(message: impl Into<String>) -> R<T> {
    Err(Fault { op: None, message: message.into() })
}

fn access<T>(r: Result<T, crate::memory::AccessError>) -> R<T> {
    r.or_else(|e| fault(e.0))
}

/// Where this program runs: its id, the grid, and its rank in the world.
#[derive(Clone, Copy, Debug)]
pub struct ProgramCtx {
    pub pid: [u32; 3],
    pub grid: [u32; 3],
    pub rank: u32,
    pub num_ranks: u32,
}

/// What a wait waits for, word by word (64-bit words).
#[derive(Clone, Copy, Debug)]
pub enum WordTest {
    /// A signal: `word <cmp> value`.
    Cmp(CmpOp, u64),
    /// A flagged word (`load_flagged`): its high 32 bits equal the flag.
    Flag(u32),
}

impl WordTest {
    pub fn holds(self, word: u64) -> bool {
        match self {
            WordTest::Cmp(cmp, value) => cmp.holds(word, value),
            WordTest::Flag(flag) => (word >> 32) as u32 == flag,
        }
    }

    /// What was expected and what `seen` is, for a diagnostic.
    pub fn describe(self, seen: u64) -> String {
        match self {
            WordTest::Cmp(cmp, value) => format!("expected {cmp} {value}, seen {seen}"),
            WordTest::Flag(flag) => format!("expected flag {flag}, seen flag {}", seen >> 32),
        }
    }
}

/// What the environment of a program provides beyond memory.
pub trait Hooks {
    /// A communication op is about to run: other tasks may run first, and buffered stores or
    /// transfers may be published early.
    fn yield_point(&self, view: &mut ProgramView) -> R<()>;
    /// Returns once every word at `addrs` (signals, or flagged words) satisfies `test`; a fault
    /// with the diagnostic when that can never happen.
    fn wait(&self, view: &ProgramView, addrs: &[u64], test: WordTest) -> R<()>;
    /// `symm_at`: the address of the symmetric object at `addr` on `rank`.
    fn translate(&self, addr: u64, rank: i64) -> R<u64>;
    /// `barrier_all`: every rank's program reaches this point.
    fn barrier_all(&self, view: &ProgramView) -> R<()>;
    /// A signal was written (tracing).
    fn signal_written(&self, _view: &ProgramView, _addr: u64, _value: u64) {}
    /// The program finished and published everything (race detection collects its clock).
    fn program_done(&self, _view: &mut ProgramView) {}
    /// The clock of timelines (`trident_core::trace`), in nanoseconds: the host's monotonic
    /// clock by default; a world's virtual time.
    fn clock_ns(&self) -> u64 {
        host_clock_ns()
    }
}

/// Nanoseconds of the host's monotonic clock since its first reading.
pub fn host_clock_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

/// The hooks of a single-device launch: one rank, programs run one after another, so a wait
/// that does not hold when it is reached can never complete.
pub struct DirectHooks<'a> {
    pub mem: &'a Memory,
}

impl Hooks for DirectHooks<'_> {
    fn yield_point(&self, _: &mut ProgramView) -> R<()> {
        Ok(())
    }

    fn wait(&self, _: &ProgramView, addrs: &[u64], test: WordTest) -> R<()> {
        let view = self.mem.view();
        for (i, &a) in addrs.iter().enumerate() {
            let (r, o) = access(view.locate(a, 8))?;
            let seen = r.load(o, 8);
            if !test.holds(seen) {
                let (what, state) = match test {
                    WordTest::Cmp(cmp, value) => ("signal", format!("is {seen}, waiting for {cmp} {value}")),
                    WordTest::Flag(flag) => {
                        ("flagged word", format!("has flag {}, waiting for flag {flag}", seen >> 32))
                    }
                };
                return fault(format!(
                    "wait can never complete: {what} {i} of {} at {a:#x} {state}, and no other program or rank can write it",
                    addrs.len()
                ));
            }
        }
        Ok(())
    }

    fn translate(&self, addr: u64, rank: i64) -> R<u64> {
        if rank != 0 {
            return fault(format!("rank {rank} is outside the world of 1 rank"));
        }
        Ok(addr)
    }

    fn barrier_all(&self, _: &ProgramView) -> R<()> {
        Ok(())
    }
}

pub struct Program<'a> {
    func: &'a Function,
    mem: &'a Memory,
    ctx: ProgramCtx,
    env: Vec<Option<Val>>,
    view: ProgramView,
    hooks: &'a dyn Hooks,
    /// A traced kernel's trace buffer and the labels of its waits and notifies.
    trace: Option<(u64, std::collections::HashMap<Op, u16>)>,
}

impl<'a> Program<'a> {
    /// Runs one program of `func` to completion; everything it buffered is published at the end.
    pub fn run(
        func: &'a Function,
        mem: &'a Memory,
        ctx: ProgramCtx,
        args: &[KernelArg],
        view: ProgramView,
        hooks: &'a dyn Hooks,
    ) -> R<()> {
        let mut p = Program { func, mem, ctx, env: vec![None; func.values.len()], view, hooks, trace: None };
        for (param, arg) in func.params.iter().zip(args) {
            let ty = func.ty(param.value).clone();
            let data = match *arg {
                KernelArg::Ptr(a) => Data::P(vec![a]),
                KernelArg::Scalar(lit, d) => literal(lit, d),
            };
            p.env[param.value.index()] = Some(Val { ty, data });
        }
        if func.attrs.trace {
            if let (Some(KernelArg::Ptr(buffer)), true) =
                (args.get(func.params.len() - 1), func.params.len() <= args.len())
            {
                p.trace = Some((*buffer, trident_core::trace::label_indices(func)));
            }
        }
        p.record(EventKind::Start, None)?;
        if let Err(f) = p.block(func.body) {
            // A program that stopped (a wait that timed out, as a GPU's ends its program) has
            // still finished when its launch has: what it stored is visible, and ordered before
            // whoever synchronizes with the launch. Only its fault is reported.
            let _ = p.view.finish(mem);
            p.hooks.program_done(&mut p.view);
            return Err(f);
        }
        p.record(EventKind::End, None)?;
        // The program's threads may retire at different times: others may run before its last
        // buffered stores and transfers become visible.
        p.hooks.yield_point(&mut p.view)?;
        access(p.view.finish(mem))?;
        p.hooks.program_done(&mut p.view);
        Ok(())
    }

    /// A timeline event of a traced kernel (`trident_core::trace`'s format), at the hooks'
    /// clock; with `signal` the wait's or notify's op, its signal value and address. Nothing
    /// for an untraced kernel.
    fn record(&mut self, kind: EventKind, signal: Option<(Op, Value, u64)>) -> R<()> {
        use trident_core::trace::{kind_word, EVENT_WORDS, HEADER_WORDS};
        let Some((buffer, labels)) = &self.trace else { return Ok(()) };
        let (label, arg) = match signal {
            Some((op, sig, addr)) => {
                let base = self
                    .func
                    .root_param(sig, false)
                    .and_then(|i| self.env[self.func.params[i as usize].value.index()].as_ref())
                    .and_then(|v| v.ptrs().first().copied());
                (labels.get(&op).copied().unwrap_or(0), base.map_or(0, |b| addr.wrapping_sub(b) / 8))
            }
            None => (0, 0),
        };
        let view = self.mem.view();
        let (region, at) = access(view.locate(*buffer, 16))?;
        let slot = region.rmw(at, 8, |n| n + 1);
        if slot >= region.load(at + 8, 8) {
            return Ok(());
        }
        let [x, y, z] = self.ctx.pid;
        let [nx, ny, _] = self.ctx.grid;
        let program = x as u64 + y as u64 * nx as u64 + z as u64 * nx as u64 * ny as u64;
        let words = [self.hooks.clock_ns(), program, kind_word(kind, label) | (arg & 0xffff_ffff) << 32];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        access(self.mem.write_bytes(buffer + 8 * (HEADER_WORDS + EVENT_WORDS * slot as usize) as u64, &bytes))
    }

    fn val(&self, v: Value) -> R<&Val> {
        match self.env.get(v.index()).and_then(|x| x.as_ref()) {
            Some(x) => Ok(x),
            None => fault(format!("value {v:?} read before it was computed (unverified IR?)")),
        }
    }

    fn set(&mut self, v: Value, val: Val) {
        self.env[v.index()] = Some(val);
    }

    fn block(&mut self, b: Block) -> R<()> {
        let func = self.func;
        for &op in &func.blocks[b].ops {
            self.exec(op).map_err(|mut f| {
                f.op.get_or_insert(op);
                f
            })?;
        }
        Ok(())
    }

    fn yields(&self, b: Block) -> R<Vec<Val>> {
        self.func.blocks[b].yields.iter().map(|v| self.val(*v).cloned()).collect()
    }

    fn bind_args(&mut self, b: Block, vals: Vec<Val>) {
        let func = self.func;
        for (a, v) in func.blocks[b].args.iter().zip(vals) {
            self.set(*a, v);
        }
    }

    /// Progress: a program that blocks in a wait lets its outstanding transfers complete first
    /// (hardware delivers them while the issuer spins), so a `put_signal` followed by a wait on
    /// a peer's reply cannot deadlock on its own undelivered signal. Plain stores stay buffered:
    /// only a release publishes them.
    fn deliver_before_blocking(&mut self) -> R<()> {
        self.view.quiet(self.mem).or_else(|e| fault(e.0))
    }

    /// The elements of the block of `desc` at `offsets`, row-major: the element type, each
    /// element's address, and whether it lies inside the tensor.
    fn desc_elements(&self, desc: Value, offsets: [Value; 2]) -> R<(DType, Vec<u64>, Vec<bool>)> {
        let ValueDef::Result { op, .. } = self.func.values[desc].def else { return fault("descriptor not made here") };
        let OpKind::MakeDesc { ptr, shape, strides } = self.func.ops[op].kind else {
            return fault("descriptor not made by make_desc");
        };
        let Some((d, block)) = self.func.ty(desc).elem.desc() else { return fault("not a descriptor") };
        let base = self.scalar_ptr(ptr)?;
        let sc = |v: Value| -> R<i64> { Ok(self.val(v)?.scalar_i64()) };
        let (dims, st, off) =
            ([sc(shape[0])?, sc(shape[1])?], [sc(strides[0])?, sc(strides[1])?], [sc(offsets[0])?, sc(offsets[1])?]);
        let size = d.size_bytes() as i128;
        let (mut ptrs, mut on) = (Vec::new(), Vec::new());
        for r in 0..block[0] as i64 {
            for c in 0..block[1] as i64 {
                let (i, j) = (off[0] + r, off[1] + c);
                let inside = (0..dims[0]).contains(&i) && (0..dims[1]).contains(&j);
                on.push(inside);
                ptrs.push(if inside {
                    (base as i128 + (i as i128 * st[0] as i128 + j as i128 * st[1] as i128) * size) as u64
                } else {
                    0
                });
            }
        }
        Ok((d, ptrs, on))
    }

    fn scalar_ptr(&self, v: Value) -> R<u64> {
        match self.val(v)?.ptrs().first() {
            Some(p) => Ok(*p),
            None => fault("expected a scalar pointer"),
        }
    }

    /// Writes a 64-bit signal on the newest value and publishes it at once.
    fn write_signal(&mut self, addr: u64, op: SignalOp, value: u64) -> R<()> {
        access(self.view.rmw(self.mem, addr, 8, |old| match op {
            SignalOp::Set => value,
            SignalOp::Add => old.wrapping_add(value),
        }))?;
        self.hooks.signal_written(&self.view, addr, value);
        Ok(())
    }

    fn exec(&mut self, op: Op) -> R<()> {
        let func = self.func;
        let data = &func.ops[op];
        let rty = |i: usize| func.ty(data.results[i]).clone();
        let result = match &data.kind {
            OpKind::For { lower, upper, step, init, body } => {
                return self.run_for(data, *lower, *upper, *step, init, *body)
            }
            OpKind::If { cond, then_block, else_block } => {
                let c = self.val(*cond)?.scalar_i64() != 0;
                let b = if c { *then_block } else { *else_block };
                self.block(b)?;
                let ys = self.yields(b)?;
                for (r, y) in data.results.iter().zip(ys) {
                    self.set(*r, y);
                }
                return Ok(());
            }
            OpKind::While { init, cond, body } => {
                let mut carried: Vec<Val> = init.iter().map(|v| self.val(*v).cloned()).collect::<R<_>>()?;
                loop {
                    self.bind_args(*cond, carried.clone());
                    self.block(*cond)?;
                    let go = self.yields(*cond)?.first().map(|c| c.scalar_i64() != 0).unwrap_or(false);
                    if !go {
                        break;
                    }
                    self.bind_args(*body, carried);
                    self.block(*body)?;
                    carried = self.yields(*body)?;
                }
                for (r, y) in data.results.iter().zip(carried) {
                    self.set(*r, y);
                }
                return Ok(());
            }
            OpKind::Store { ptr, value, mask } => return self.store(*ptr, *value, *mask),
            OpKind::DescStore { desc, offsets, value } => {
                let (d, ptrs, on) = self.desc_elements(*desc, *offsets)?;
                return self.store_elements(d, &ptrs, *value, &|i| on[i]);
            }
            OpKind::Barrier => {
                self.view.barrier();
                return Ok(());
            }
            OpKind::Notify { sig, rank, value, op: sop, .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let r = self.val(*rank)?.scalar_i64();
                let local = self.scalar_ptr(*sig)?;
                let addr = self.hooks.translate(local, r)?;
                let v = self.val(*value)?.scalar_i64() as u64;
                // Program barrier, release, then one thread writes the signal (the event
                // stamped before the write: every wait it satisfies ends after it).
                access(self.view.release_all(self.mem))?;
                self.view.race_release(addr);
                self.record(EventKind::Notify, Some((op, *sig, local)))?;
                return self.write_signal(addr, *sop, v);
            }
            OpKind::Put { dst, src, bytes, rank, nbi, .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let t = self.transfer_to(*dst, *src, *bytes, *rank, *nbi, None)?;
                return access(self.view.transfer(self.mem, t));
            }
            OpKind::PutSignal { dst, src, bytes, sig, sig_value, sig_op, rank, nbi, .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let r = self.val(*rank)?.scalar_i64();
                let sig_addr = self.hooks.translate(self.scalar_ptr(*sig)?, r)?;
                let sv = self.val(*sig_value)?.scalar_i64() as u64;
                let t = self.transfer_to(*dst, *src, *bytes, *rank, *nbi, Some((sig_addr, *sig_op, sv)))?;
                access(self.view.transfer(self.mem, t))?;
                self.hooks.signal_written(&self.view, sig_addr, sv);
                return Ok(());
            }
            OpKind::Get { dst, src, bytes, rank, nbi, .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let n = self.byte_count(*bytes)?;
                let r = self.val(*rank)?.scalar_i64();
                let src = self.hooks.translate(self.scalar_ptr(*src)?, r)?;
                let t = Transfer { dst: self.scalar_ptr(*dst)?, src, bytes: n, data: None, signal: None };
                access(self.view.transfer(self.mem, t))?;
                if !*nbi {
                    // A blocking get has completed when it returns.
                    access(self.view.quiet(self.mem))?;
                }
                return Ok(());
            }
            OpKind::Fence => {
                self.hooks.yield_point(&mut self.view)?;
                access(self.view.release_all(self.mem))?;
                return access(self.view.quiet(self.mem));
            }
            OpKind::Quiet => {
                self.hooks.yield_point(&mut self.view)?;
                return access(self.view.quiet(self.mem));
            }
            OpKind::BarrierAll { .. } => {
                self.hooks.yield_point(&mut self.view)?;
                access(self.view.release_all(self.mem))?;
                access(self.view.quiet(self.mem))?;
                self.hooks.barrier_all(&self.view)?;
                self.view.acquire(self.mem);
                return Ok(());
            }
            OpKind::Wait { sigs, count, cmp, value, sem, .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let base = self.scalar_ptr(*sigs)?;
                let n = self.val(*count)?.scalar_i64();
                if !(0..=1 << 20).contains(&n) {
                    return fault(format!("wait on {n} signals"));
                }
                let addrs: Vec<u64> = (0..n as u64).map(|i| base.wrapping_add(8 * i)).collect();
                let want = self.val(*value)?.scalar_i64() as u64;
                self.record(EventKind::WaitBegin, Some((op, *sigs, base)))?;
                self.deliver_before_blocking()?;
                self.hooks.wait(&self.view, &addrs, WordTest::Cmp(*cmp, want))?;
                self.record(EventKind::WaitEnd, Some((op, *sigs, base)))?;
                if sem.acquires() {
                    self.view.acquire(self.mem);
                    for a in &addrs {
                        self.view.race_acquire(*a);
                    }
                }
                Val { ty: Type::token(), data: Data::Token }
            }
            OpKind::SignalWaitUntil { sig, cmp, value } => {
                self.hooks.yield_point(&mut self.view)?;
                let addr = self.scalar_ptr(*sig)?;
                let want = self.val(*value)?.scalar_i64() as u64;
                self.record(EventKind::WaitBegin, Some((op, *sig, addr)))?;
                self.deliver_before_blocking()?;
                self.hooks.wait(&self.view, &[addr], WordTest::Cmp(*cmp, want))?;
                self.record(EventKind::WaitEnd, Some((op, *sig, addr)))?;
                self.view.acquire(self.mem);
                self.view.race_acquire(addr);
                let seen = access(self.view.rmw(self.mem, addr, 8, |old| old))?;
                Val { ty: rty(0), data: Data::I(vec![seen as i64]) }
            }
            OpKind::LoadFlagged { ptr, flag, mask } => {
                self.hooks.yield_point(&mut self.view)?;
                let pv = self.val(*ptr)?;
                let d = pv.ty.elem.pointee().unwrap_or(DType::U64);
                let ptrs = pv.ptrs().to_vec();
                let mask = self.mask(*mask)?.map(|m| m.to_vec());
                let on = |i: usize| mask.as_ref().is_none_or(|m| m[i] != 0);
                let flag = self.val(*flag)?.scalar_i64() as u32;
                let addrs: Vec<u64> = ptrs.iter().enumerate().filter(|(i, _)| on(*i)).map(|(_, p)| *p).collect();
                self.deliver_before_blocking()?;
                self.hooks.wait(&self.view, &addrs, WordTest::Flag(flag))?;
                // Relaxed atomic reads of the words themselves: nothing else is acquired.
                let mut words = Vec::with_capacity(ptrs.len());
                for (i, &p) in ptrs.iter().enumerate() {
                    words.push(if on(i) { access(self.view.rmw(self.mem, p, 8, |cur| cur))? } else { 0 });
                }
                Val { ty: rty(0), data: bits_to_data(d, &words) }
            }
            OpKind::Atomic { op, ptr, value, mask, sem, .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let data = self.atomic(*op, *ptr, *value, *mask, *sem)?;
                Val { ty: rty(0), data }
            }
            OpKind::AtomicCas { ptr, expected, desired, sem, .. } => {
                self.hooks.yield_point(&mut self.view)?;
                let data = self.cas(*ptr, *expected, *desired, *sem)?;
                Val { ty: rty(0), data }
            }
            kind => self.pure(kind, rty(0))?,
        };
        if let Some(r) = data.results.first() {
            self.set(*r, result);
        }
        Ok(())
    }

    fn byte_count(&self, bytes: Value) -> R<usize> {
        let n = self.val(bytes)?.scalar_i64();
        if n < 0 {
            return fault(format!("negative byte count {n}"));
        }
        Ok(n as usize)
    }

    /// A put from local `src` to `dst` on `rank`; a blocking put reads its source now.
    fn transfer_to(
        &mut self,
        dst: Value,
        src: Value,
        bytes: Value,
        rank: Value,
        nbi: bool,
        signal: Option<(u64, SignalOp, u64)>,
    ) -> R<Transfer> {
        let n = self.byte_count(bytes)?;
        let r = self.val(rank)?.scalar_i64();
        let dst = self.hooks.translate(self.scalar_ptr(dst)?, r)?;
        let src = self.scalar_ptr(src)?;
        let data = if nbi {
            None
        } else {
            access(self.view.release_all(self.mem))?;
            let mut d = vec![0u8; n];
            access(self.mem.read_bytes(src, &mut d))?;
            Some(d)
        };
        Ok(Transfer { dst, src, bytes: n, data, signal })
    }

    fn run_for(
        &mut self,
        data: &OpData,
        lower: Value,
        upper: Value,
        step: Value,
        init: &[Value],
        body: Block,
    ) -> R<()> {
        let ity = self.val(lower)?.ty.clone();
        let d = ity.dtype().unwrap_or(DType::I32);
        let (lo, hi, st) = (self.val(lower)?.scalar_i64(), self.val(upper)?.scalar_i64(), self.val(step)?.scalar_i64());
        if st <= 0 {
            return fault(format!("`for` step must be positive, got {st}"));
        }
        let less = |a: i64, b: i64| if d == DType::U64 { (a as u64) < (b as u64) } else { a < b };
        let mut carried: Vec<Val> = init.iter().map(|v| self.val(*v).cloned()).collect::<R<_>>()?;
        let mut iv = lo;
        while less(iv, hi) {
            let mut args = vec![Val { ty: ity.clone(), data: Data::I(vec![iv]) }];
            args.extend(carried);
            self.bind_args(body, args);
            self.block(body)?;
            carried = self.yields(body)?;
            let next = norm_i(d, iv.wrapping_add(st));
            if !less(iv, next) {
                break; // the induction variable would wrap
            }
            iv = next;
        }
        for (r, y) in data.results.iter().zip(carried) {
            self.set(*r, y);
        }
        Ok(())
    }

    fn mask(&self, mask: Option<Value>) -> R<Option<&[i64]>> {
        Ok(match mask {
            Some(m) => Some(self.val(m)?.ints()),
            None => None,
        })
    }

    fn store(&mut self, ptr: Value, value: Value, mask: Option<Value>) -> R<()> {
        let pv = self.val(ptr)?;
        let d = pv.ty.elem.pointee().unwrap_or(DType::I8);
        let ptrs = pv.ptrs().to_vec();
        let mask = self.mask(mask)?.map(|m| m.to_vec());
        self.store_elements(d, &ptrs, value, &|i| mask.as_ref().is_none_or(|m| m[i] != 0))
    }

    /// Stores element `i` of `value` (of type `d`) at `ptrs[i]` where `on(i)`.
    fn store_elements(&mut self, d: DType, ptrs: &[u64], value: Value, on: &dyn Fn(usize) -> bool) -> R<()> {
        let size = d.size_bytes() as usize;
        let val = self.val(value)?;
        let bits: Vec<u64> = match &val.data {
            Data::F(v) => v.iter().map(|x| f32_bits(d, *x)).collect(),
            Data::D(v) => v.iter().map(|x| x.to_bits()).collect(),
            Data::I(v) => v.iter().map(|x| *x as u64 & size_mask(size)).collect(),
            _ => return fault("stored value is not numeric"),
        };
        let mem = self.mem;
        let view = mem.view();
        for i in (0..ptrs.len()).filter(|i| on(*i)) {
            access(self.view.store(&view, ptrs[i], size, bits[i], i))?;
        }
        Ok(())
    }

    /// Ops without side effects on control flow: compute the single result.
    fn pure(&self, kind: &OpKind, rt: Type) -> R<Val> {
        let data = match kind {
            OpKind::Const(lit) => literal(*lit, rt.dtype().unwrap_or(DType::I32)),
            OpKind::ProgramId(a) => Data::I(vec![self.ctx.pid[a.index()] as i64]),
            OpKind::NumPrograms(a) => Data::I(vec![self.ctx.grid[a.index()] as i64]),
            OpKind::Rank => Data::I(vec![self.ctx.rank as i64]),
            OpKind::NumRanks => Data::I(vec![self.ctx.num_ranks as i64]),
            OpKind::Arange { start, end } => Data::I((*start..*end).collect()),
            OpKind::Splat(x) => self.val(*x)?.data.splat(rt.numel() as usize),
            OpKind::Reshape(x) | OpKind::ConsumeToken { value: x, .. } => self.val(*x)?.data.clone(),
            OpKind::Broadcast(x) => {
                let xv = self.val(*x)?;
                let st = strides(&xv.ty.shape);
                let s: Vec<usize> = xv.ty.shape.iter().zip(&st).map(|(&d, &s)| if d == 1 { 0 } else { s }).collect();
                xv.data.gather(&strided_indices(&rt.shape, &s))
            }
            OpKind::Transpose { x, perm } => {
                let xv = self.val(*x)?;
                let st = strides(&xv.ty.shape);
                let s: Vec<usize> = perm.iter().map(|p| st[*p as usize]).collect();
                xv.data.gather(&strided_indices(&rt.shape, &s))
            }
            OpKind::Unary { op, x } => unary(*op, self.val(*x)?)?,
            OpKind::Binary { op, lhs, rhs } => binary(*op, self.val(*lhs)?, self.val(*rhs)?)?,
            OpKind::Cmp { op, lhs, rhs } => compare(*op, self.val(*lhs)?, self.val(*rhs)?),
            OpKind::Select { cond, on_true, on_false } => {
                let c = self.val(*cond)?.ints();
                let (t, f) = (&self.val(*on_true)?.data, &self.val(*on_false)?.data);
                let n = c.len();
                let idx: Vec<usize> = c.iter().enumerate().map(|(i, &ci)| if ci != 0 { i } else { i + n }).collect();
                concat(t, f).gather(&idx)
            }
            OpKind::Cast(x) => cast(self.val(*x)?, rt.dtype().unwrap_or(DType::F32)),
            OpKind::AddPtr { ptr, offset } => {
                let pv = self.val(*ptr)?;
                let size = pv.ty.elem.pointee().map_or(1, |d| d.size_bytes()) as i64;
                let offs = self.val(*offset)?;
                let od = offs.ty.dtype().unwrap_or(DType::I32);
                Data::P(
                    pv.ptrs()
                        .iter()
                        .zip(offs.ints())
                        .map(|(&p, &o)| {
                            let o = if od == DType::U64 { o as u64 as i128 } else { o as i128 };
                            (p as i128 + o * size as i128) as u64
                        })
                        .collect(),
                )
            }
            OpKind::Reduce { op, axis, x } => reduce(*op, *axis as usize, self.val(*x)?),
            OpKind::Dot { a, b, acc, precision } => dot(self.val(*a)?, self.val(*b)?, self.val(*acc)?, *precision),
            OpKind::Load { ptr, mask, other } => self.load(*ptr, *mask, *other)?,
            OpKind::MakeDesc { .. } => Data::Token,
            OpKind::DescLoad { desc, offsets } => {
                let (d, ptrs, on) = self.desc_elements(*desc, *offsets)?;
                // Outside the tensor: 0, and no memory is read.
                self.load_elements(d, &ptrs, &|i| on[i], &|_| from_bits(d, 0))?
            }
            OpKind::SymmAt { ptr, rank } => {
                let r = self.val(*rank)?.scalar_i64();
                Data::P(vec![self.hooks.translate(self.scalar_ptr(*ptr)?, r)?])
            }
            other => return fault(format!("`{}` is not a value op", other.mnemonic())),
        };
        Ok(Val { ty: rt, data })
    }

    fn load(&self, ptr: Value, mask: Option<Value>, other: Option<Value>) -> R<Data> {
        let pv = self.val(ptr)?;
        let d = pv.ty.elem.pointee().unwrap_or(DType::I8);
        let ptrs = pv.ptrs();
        let mask = self.mask(mask)?;
        let other = match other {
            Some(o) => Some(&self.val(o)?.data),
            None => None,
        };
        // Masked-off lanes without `other` are unspecified; give NaN / a recognisable pattern so
        // that a kernel relying on them fails its check instead of passing by luck.
        self.load_elements(d, ptrs, &|i| mask.is_none_or(|m| m[i] != 0), &|i| masked_off(d, other, i))
    }

    /// Element `i` of type `d` read at `ptrs[i]` where `on(i)`, else `off(i)` (nothing read).
    fn load_elements(&self, d: DType, ptrs: &[u64], on: &dyn Fn(usize) -> bool, off: &dyn Fn(usize) -> Elt) -> R<Data> {
        let size = d.size_bytes() as usize;
        let view = self.mem.view();
        let mut out = empty_for(Elem::Num(d), ptrs.len());
        for (i, &p) in ptrs.iter().enumerate() {
            let e = if on(i) { from_bits(d, access(self.view.load(&view, p, size))?) } else { off(i) };
            match (&mut out, e) {
                (Data::F(v), Elt::F(x)) => v.push(x),
                (Data::D(v), Elt::D(x)) => v.push(x),
                (Data::I(v), Elt::I(x)) => v.push(x),
                _ => return fault("loaded element does not match the pointee type"),
            }
        }
        Ok(out)
    }

    /// Release side of an atomic: a scalar atomic is one thread's, a tile atomic every thread's.
    fn atomic_release(&mut self, sem: MemSemantic, scalar: bool) -> R<()> {
        if sem.releases() {
            if scalar {
                access(self.view.release_thread(self.mem, 0))?;
            } else {
                access(self.view.release_all(self.mem))?;
            }
        }
        Ok(())
    }

    fn atomic(&mut self, op: AtomicOp, ptr: Value, value: Value, mask: Option<Value>, sem: MemSemantic) -> R<Data> {
        let pv = self.val(ptr)?;
        let d = pv.ty.elem.pointee().unwrap_or(DType::I32);
        let size = d.size_bytes() as usize;
        let scalar = pv.ty.is_scalar();
        let ptrs = pv.ptrs().to_vec();
        let mask = self.mask(mask)?.map(|m| m.to_vec());
        let operands: Vec<u64> = {
            let val = self.val(value)?;
            (0..ptrs.len()).map(|i| elem_bits(&val.data, i, d)).collect()
        };
        self.atomic_release(sem, scalar)?;
        let mut old = Vec::with_capacity(ptrs.len());
        for (i, &p) in ptrs.iter().enumerate() {
            if mask.as_ref().is_some_and(|m| m[i] == 0) {
                old.push(0u64);
                continue;
            }
            let operand = operands[i];
            if sem.releases() {
                self.view.race_release(p);
            }
            old.push(access(self.view.rmw(self.mem, p, size, |cur| atomic_apply(op, d, cur, operand)))?);
        }
        if sem.acquires() {
            self.view.acquire(self.mem);
            for (i, &p) in ptrs.iter().enumerate() {
                if mask.as_ref().is_none_or(|m| m[i] != 0) {
                    self.view.race_acquire(p);
                }
            }
        }
        Ok(bits_to_data(d, &old))
    }

    fn cas(&mut self, ptr: Value, expected: Value, desired: Value, sem: MemSemantic) -> R<Data> {
        let pv = self.val(ptr)?;
        let d = pv.ty.elem.pointee().unwrap_or(DType::I32);
        let size = d.size_bytes() as usize;
        let scalar = pv.ty.is_scalar();
        let ptrs = pv.ptrs().to_vec();
        let pairs: Vec<(u64, u64)> = {
            let (e, n) = (self.val(expected)?, self.val(desired)?);
            (0..ptrs.len()).map(|i| (elem_bits(&e.data, i, d), elem_bits(&n.data, i, d))).collect()
        };
        self.atomic_release(sem, scalar)?;
        let mut old = Vec::with_capacity(ptrs.len());
        for (&p, &(eb, nb)) in ptrs.iter().zip(&pairs) {
            if sem.releases() {
                self.view.race_release(p);
            }
            old.push(access(self.view.rmw(self.mem, p, size, |cur| if cur == eb { nb } else { cur }))?);
        }
        if sem.acquires() {
            self.view.acquire(self.mem);
            for &p in &ptrs {
                self.view.race_acquire(p);
            }
        }
        Ok(bits_to_data(d, &old))
    }
}

/// Storage bits of element `i` of `data` as type `d`.
pub(crate) fn elem_bits(data: &Data, i: usize, d: DType) -> u64 {
    let size = d.size_bytes() as usize;
    match data {
        Data::F(v) => f32_bits(d, v[i]),
        Data::D(v) => v[i].to_bits(),
        Data::I(v) => v[i] as u64 & size_mask(size),
        Data::P(v) => v[i],
        Data::Token => 0,
    }
}

fn bits_to_data(d: DType, bits: &[u64]) -> Data {
    let mut out = empty_for(Elem::Num(d), bits.len());
    for &b in bits {
        match (&mut out, from_bits(d, b)) {
            (Data::F(v), Elt::F(x)) => v.push(x),
            (Data::D(v), Elt::D(x)) => v.push(x),
            (Data::I(v), Elt::I(x)) => v.push(x),
            _ => {}
        }
    }
    out
}

/// New storage bits of an atomic read-modify-write.
pub(crate) fn atomic_apply(op: AtomicOp, d: DType, cur: u64, operand: u64) -> u64 {
    let size = d.size_bytes() as usize;
    let m = size_mask(size);
    if op == AtomicOp::Xchg {
        return operand;
    }
    if d.is_float() {
        let (a, b) = match (from_bits(d, cur), from_bits(d, operand)) {
            (Elt::F(a), Elt::F(b)) => (a as f64, b as f64),
            (Elt::D(a), Elt::D(b)) => (a, b),
            _ => return cur,
        };
        let r = match op {
            AtomicOp::Add => a + b,
            AtomicOp::Max => min_num_f64(BinaryOp::Max, a, b),
            AtomicOp::Min => min_num_f64(BinaryOp::Min, a, b),
            _ => a,
        };
        return if d == DType::F64 {
            if op == AtomicOp::Add {
                (f64::from_bits(cur) + f64::from_bits(operand)).to_bits()
            } else {
                r.to_bits()
            }
        } else {
            // f32 addition in f32, as the hardware does.
            let r = if op == AtomicOp::Add { (a as f32 + b as f32) as f64 } else { r };
            f32_bits(d, r as f32)
        };
    }
    let (a, b) = match (from_bits(d, cur), from_bits(d, operand)) {
        (Elt::I(a), Elt::I(b)) => (a, b),
        _ => return cur,
    };
    let unsigned = !d.is_signed_int();
    let r = match op {
        AtomicOp::Add => a.wrapping_add(b),
        AtomicOp::Max if unsigned => ((a as u64).max(b as u64)) as i64,
        AtomicOp::Min if unsigned => ((a as u64).min(b as u64)) as i64,
        AtomicOp::Max => a.max(b),
        AtomicOp::Min => a.min(b),
        AtomicOp::And => a & b,
        AtomicOp::Or => a | b,
        AtomicOp::Xor => a ^ b,
        AtomicOp::Xchg => b,
    };
    r as u64 & m
}

/// Row-major strides of a shape.
fn strides(shape: &[u32]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

/// For every coordinate of `shape` in row-major order, `sum(coord[i] * strides[i])`.
fn strided_indices(shape: &[u32], strides: &[usize]) -> Vec<usize> {
    let n: usize = shape.iter().map(|&d| d as usize).product();
    let mut out = Vec::with_capacity(n);
    let mut coord = vec![0u32; shape.len()];
    let mut idx = 0usize;
    for _ in 0..n {
        out.push(idx);
        for d in (0..shape.len()).rev() {
            coord[d] += 1;
            idx += strides[d];
            if coord[d] < shape[d] {
                break;
            }
            idx -= strides[d] * coord[d] as usize;
            coord[d] = 0;
        }
    }
    out
}

pub(crate) fn concat(a: &Data, b: &Data) -> Data {
    match (a, b) {
        (Data::F(x), Data::F(y)) => Data::F([x.as_slice(), y].concat()),
        (Data::D(x), Data::D(y)) => Data::D([x.as_slice(), y].concat()),
        (Data::I(x), Data::I(y)) => Data::I([x.as_slice(), y].concat()),
        (Data::P(x), Data::P(y)) => Data::P([x.as_slice(), y].concat()),
        _ => a.clone(),
    }
}

pub(crate) fn unary(op: UnaryOp, x: &Val) -> R<Data> {
    let d = x.ty.dtype().unwrap_or(DType::F32);
    Ok(match &x.data {
        Data::F(v) => {
            // f32 (and f16/bf16, computed in f32): core's definitions, bit for bit what the GPU
            // backends compute.
            let f: fn(f32) -> f32 = match op {
                UnaryOp::Neg => |a| -a,
                UnaryOp::Abs => f32::abs,
                UnaryOp::Sqrt => f32::sqrt,
                UnaryOp::Floor => f32::floor,
                UnaryOp::Ceil => f32::ceil,
                UnaryOp::Not => return fault("`not` on a float"),
                _ => |_| f32::NAN,
            };
            let mut out: Vec<f32> = if math::is_expanded(op) {
                v.iter().map(|&a| math::unary(&mut Native, op, a).unwrap_or(f32::NAN)).collect()
            } else {
                v.iter().map(|&a| f(a)).collect()
            };
            round_all(d, &mut out);
            Data::F(out)
        }
        Data::D(v) => {
            let f: fn(f64) -> f64 = match op {
                UnaryOp::Neg => |a| -a,
                UnaryOp::Abs => f64::abs,
                UnaryOp::Exp => f64::exp,
                UnaryOp::Exp2 => f64::exp2,
                UnaryOp::Expm1 => f64::exp_m1,
                UnaryOp::Log => f64::ln,
                UnaryOp::Log2 => f64::log2,
                UnaryOp::Log1p => f64::ln_1p,
                UnaryOp::Sqrt => f64::sqrt,
                UnaryOp::Rsqrt => |a| 1.0 / a.sqrt(),
                UnaryOp::Sin => f64::sin,
                UnaryOp::Cos => f64::cos,
                UnaryOp::Tanh => f64::tanh,
                UnaryOp::Erf => libm::erf,
                UnaryOp::Sigmoid => |a| if a < 0.0 { a.exp() / (1.0 + a.exp()) } else { 1.0 / (1.0 + (-a).exp()) },
                UnaryOp::Floor => f64::floor,
                UnaryOp::Ceil => f64::ceil,
                UnaryOp::Not => return fault("`not` on a float"),
            };
            Data::D(v.iter().map(|&a| f(a)).collect())
        }
        Data::I(v) => {
            let out = match op {
                UnaryOp::Neg => v.iter().map(|&a| norm_i(d, a.wrapping_neg())).collect(),
                UnaryOp::Not => v.iter().map(|&a| norm_i(d, !a)).collect(),
                UnaryOp::Abs if d.is_signed_int() => v.iter().map(|&a| norm_i(d, a.wrapping_abs())).collect(),
                UnaryOp::Abs => v.clone(),
                _ => return fault(format!("`{op}` on an integer")),
            };
            Data::I(out)
        }
        _ => return fault(format!("`{op}` on a non-numeric value")),
    })
}

macro_rules! min_num {
    ($name:ident, $t:ty) => {
        /// IEEE minimumNumber (`Max`: maximumNumber): a NaN operand gives the other, and of
        /// two equal operands `-0 < +0` (the OR or AND of their bits).
        pub fn $name(op: BinaryOp, a: $t, b: $t) -> $t {
            let min = op == BinaryOp::Min;
            if a.is_nan() {
                b
            } else if b.is_nan() {
                a
            } else if a == b {
                <$t>::from_bits(if min { a.to_bits() | b.to_bits() } else { a.to_bits() & b.to_bits() })
            } else if (a < b) == min {
                a
            } else {
                b
            }
        }
    };
}
min_num!(min_num_f32, f32);
min_num!(min_num_f64, f64);

pub(crate) fn binary(op: BinaryOp, l: &Val, r: &Val) -> R<Data> {
    let d = l.ty.dtype().unwrap_or(DType::F32);
    Ok(match (&l.data, &r.data) {
        (Data::F(a), Data::F(b)) => {
            let f: fn(f32, f32) -> f32 = match op {
                BinaryOp::Add => |x, y| x + y,
                BinaryOp::Sub => |x, y| x - y,
                BinaryOp::Mul => |x, y| x * y,
                BinaryOp::Div => |x, y| x / y,
                // Rust's `%` is the exact fmod (what core's definition computes, bit for bit).
                BinaryOp::Rem => |x, y| x % y,
                BinaryOp::Pow => |x, y| math::pow(&mut Native, x, y),
                BinaryOp::Min => |x, y| min_num_f32(BinaryOp::Min, x, y),
                BinaryOp::Max => |x, y| min_num_f32(BinaryOp::Max, x, y),
                _ => return fault(format!("`{op}` on floats")),
            };
            let mut out: Vec<f32> = a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
            round_all(d, &mut out);
            Data::F(out)
        }
        (Data::D(a), Data::D(b)) => {
            let f: fn(f64, f64) -> f64 = match op {
                BinaryOp::Add => |x, y| x + y,
                BinaryOp::Sub => |x, y| x - y,
                BinaryOp::Mul => |x, y| x * y,
                BinaryOp::Div => |x, y| x / y,
                BinaryOp::Rem => |x, y| x % y,
                BinaryOp::Pow => f64::powf,
                BinaryOp::Min => |x, y| min_num_f64(BinaryOp::Min, x, y),
                BinaryOp::Max => |x, y| min_num_f64(BinaryOp::Max, x, y),
                _ => return fault(format!("`{op}` on floats")),
            };
            Data::D(a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect())
        }
        (Data::I(a), Data::I(b)) => {
            let mut out = Vec::with_capacity(a.len());
            for (&x, &y) in a.iter().zip(b) {
                out.push(norm_i(d, int_binary(op, d, x, y)?));
            }
            Data::I(out)
        }
        _ => return fault(format!("`{op}` on mismatched operands")),
    })
}

fn int_binary(op: BinaryOp, d: DType, x: i64, y: i64) -> R<i64> {
    let bits = d.bits() as i64;
    let unsigned = !d.is_signed_int();
    Ok(match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        // Division by zero as RISC-V defines it: all ones, and the dividend for the remainder.
        BinaryOp::Div if y == 0 => -1,
        BinaryOp::Rem if y == 0 => x,
        BinaryOp::Div if unsigned => ((x as u64) / (y as u64)) as i64,
        BinaryOp::Rem if unsigned => ((x as u64) % (y as u64)) as i64,
        BinaryOp::Div => x.wrapping_div(y),
        BinaryOp::Rem => x.wrapping_rem(y),
        BinaryOp::Min if unsigned => (x as u64).min(y as u64) as i64,
        BinaryOp::Max if unsigned => (x as u64).max(y as u64) as i64,
        BinaryOp::Min => x.min(y),
        BinaryOp::Max => x.max(y),
        BinaryOp::And => x & y,
        BinaryOp::Or => x | y,
        BinaryOp::Xor => x ^ y,
        // Shifts by the width or more give 0 (or the sign for arithmetic right shifts), as PTX.
        BinaryOp::Shl => {
            if (y as u64) >= bits as u64 {
                0
            } else {
                x.wrapping_shl(y as u32)
            }
        }
        BinaryOp::Shr if unsigned => {
            let ux = (x as u64) & size_mask(d.size_bytes() as usize);
            if (y as u64) >= bits as u64 {
                0
            } else {
                (ux >> y) as i64
            }
        }
        BinaryOp::Shr => x >> (y as u64).min(63),
        BinaryOp::Pow => return fault("`pow` on integers"),
    })
}

pub(crate) fn compare(op: CmpOp, l: &Val, r: &Val) -> Data {
    let d = l.ty.dtype();
    let unsigned = d.is_some_and(|d| !d.is_signed_int() && d.is_int()) || d.is_none();
    let out: Vec<i64> = match (&l.data, &r.data) {
        (Data::F(a), Data::F(b)) => a.iter().zip(b).map(|(&x, &y)| op.holds(x, y) as i64).collect(),
        (Data::D(a), Data::D(b)) => a.iter().zip(b).map(|(&x, &y)| op.holds(x, y) as i64).collect(),
        (Data::I(a), Data::I(b)) if unsigned => {
            a.iter().zip(b).map(|(&x, &y)| op.holds(x as u64, y as u64) as i64).collect()
        }
        (Data::I(a), Data::I(b)) => a.iter().zip(b).map(|(&x, &y)| op.holds(x, y) as i64).collect(),
        (Data::P(a), Data::P(b)) => a.iter().zip(b).map(|(&x, &y)| op.holds(x, y) as i64).collect(),
        _ => Vec::new(),
    };
    Data::I(out)
}

pub(crate) fn cast(x: &Val, to: DType) -> Data {
    let from = x.ty.dtype().unwrap_or(DType::F32);
    if from == to {
        // The identity (an E5M2 infinity stays one).
        return x.data.clone();
    }
    let as_f64: Vec<f64> = match &x.data {
        Data::F(v) => v.iter().map(|&a| a as f64).collect(),
        Data::D(v) => v.clone(),
        Data::I(v) if to.is_int() => {
            return Data::I(v.iter().map(|&a| if to == DType::I1 { (a != 0) as i64 } else { norm_i(to, a) }).collect())
        }
        // Integers round once, straight to f64 or to f32 (f16/bf16 then round from that).
        Data::I(v) if to == DType::F64 => return Data::D(v.iter().map(|&a| int_to_f64(from, a)).collect()),
        Data::I(v) => {
            let f = |a: i64| if from == DType::U64 { a as u64 as f32 } else { a as f32 };
            return Data::F(v.iter().map(|&a| round_f(to, f(a))).collect());
        }
        _ => Vec::new(),
    };
    match to {
        DType::F64 => Data::D(as_f64),
        t if t.is_fp8() => Data::F(as_f64.iter().map(|&a| round_f64(t, a) as f32).collect()),
        t if t.is_float() => Data::F(as_f64.iter().map(|&a| round_f(t, a as f32)).collect()),
        t => Data::I(as_f64.iter().map(|&a| f64_to_int(t, a)).collect()),
    }
}

/// Reductions. Float `max`/`min` ignore NaN (minimumNumber, `-0 < +0`); `argmax`/`argmin`
/// skip NaN unless every element is NaN (then the first); ties go to the first index.
fn reduce(op: ReduceOp, axis: usize, x: &Val) -> Data {
    let shape = &x.ty.shape;
    let outer: usize = shape[..axis].iter().map(|&d| d as usize).product();
    let len = shape[axis] as usize;
    let inner: usize = shape[axis + 1..].iter().map(|&d| d as usize).product();
    let d = x.ty.dtype().unwrap_or(DType::F32);
    let at = |o: usize, k: usize, i: usize| (o * len + k) * inner + i;
    let arg = matches!(op, ReduceOp::Argmax | ReduceOp::Argmin);
    // `$fold(best, e)` folds a sum or a max/min; `$better(e, best)` decides an arg reduction.
    macro_rules! fold {
        ($v:expr, $fold:expr, $better:expr, $wrap:expr) => {{
            let mut vals = Vec::with_capacity(outer * inner);
            let mut idxs = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for i in 0..inner {
                    let mut best = $v[at(o, 0, i)];
                    let mut bi = 0usize;
                    for k in 1..len {
                        let e = $v[at(o, k, i)];
                        if !arg {
                            best = $fold(best, e);
                        } else if $better(e, best) {
                            best = e;
                            bi = k;
                        }
                    }
                    vals.push(best);
                    idxs.push(bi as i64);
                }
            }
            if arg {
                Data::I(idxs)
            } else {
                $wrap(vals)
            }
        }};
    }
    let max = matches!(op, ReduceOp::Max | ReduceOp::Argmax);
    let pick = if max { BinaryOp::Max } else { BinaryOp::Min };
    match &x.data {
        Data::F(v) => fold!(
            v,
            |b: f32, e: f32| if op == ReduceOp::Sum { b + e } else { min_num_f32(pick, b, e) },
            |e: f32, b: f32| (if max { e > b } else { e < b }) || (b.is_nan() && !e.is_nan()),
            |mut vals: Vec<f32>| {
                round_all(d, &mut vals);
                Data::F(vals)
            }
        ),
        Data::D(v) => fold!(
            v,
            |b: f64, e: f64| if op == ReduceOp::Sum { b + e } else { min_num_f64(pick, b, e) },
            |e: f64, b: f64| (if max { e > b } else { e < b }) || (b.is_nan() && !e.is_nan()),
            Data::D
        ),
        Data::I(v) => {
            let unsigned = !d.is_signed_int();
            let better = |e: i64, b: i64| match (max, unsigned) {
                (true, true) => (e as u64) > (b as u64),
                (false, true) => (e as u64) < (b as u64),
                (true, false) => e > b,
                (false, false) => e < b,
            };
            fold!(
                v,
                |b: i64, e: i64| if op == ReduceOp::Sum {
                    norm_i(d, b.wrapping_add(e))
                } else if better(e, b) {
                    e
                } else {
                    b
                },
                better,
                Data::I
            )
        }
        other => other.clone(),
    }
}

/// Rounds an f32 to tf32 (10 explicit mantissa bits), nearest-even.
fn to_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let b = x.to_bits();
    let r = b + 0xFFF + ((b >> 13) & 1);
    f32::from_bits(r & !0x1FFF)
}

fn dot(a: &Val, b: &Val, acc: &Val, precision: InputPrecision) -> Data {
    let (m, k) = (a.ty.shape[0] as usize, a.ty.shape[1] as usize);
    let n = b.ty.shape[1] as usize;
    match (&a.data, &b.data, &acc.data) {
        (Data::F(av), Data::F(bv), Data::F(cv)) => {
            let mut c = cv.clone();
            let mut mm = |av: &[f32], bv: &[f32]| {
                for i in 0..m {
                    let row = &mut c[i * n..(i + 1) * n];
                    for kk in 0..k {
                        let x = av[i * k + kk];
                        let brow = &bv[kk * n..(kk + 1) * n];
                        for (cj, bj) in row.iter_mut().zip(brow) {
                            *cj += x * bj;
                        }
                    }
                }
            };
            match precision {
                InputPrecision::Ieee => mm(av, bv),
                InputPrecision::Tf32 => {
                    let (a2, b2): (Vec<f32>, Vec<f32>) =
                        (av.iter().map(|&x| to_tf32(x)).collect(), bv.iter().map(|&x| to_tf32(x)).collect());
                    mm(&a2, &b2)
                }
                InputPrecision::Bf16x3 => {
                    let split = |v: &[f32]| -> (Vec<f32>, Vec<f32>) {
                        let hi: Vec<f32> = v.iter().map(|&x| round_f(DType::BF16, x)).collect();
                        let lo = v.iter().zip(&hi).map(|(&x, &h)| round_f(DType::BF16, x - h)).collect();
                        (hi, lo)
                    };
                    let ((ah, al), (bh, bl)) = (split(av), split(bv));
                    mm(&al, &bh);
                    mm(&ah, &bl);
                    mm(&ah, &bh);
                }
            }
            round_all(acc.ty.dtype().unwrap_or(DType::F32), &mut c);
            Data::F(c)
        }
        (Data::D(av), Data::D(bv), Data::D(cv)) => {
            let mut c = cv.clone();
            for i in 0..m {
                for kk in 0..k {
                    let x = av[i * k + kk];
                    for j in 0..n {
                        c[i * n + j] += x * bv[kk * n + j];
                    }
                }
            }
            Data::D(c)
        }
        (Data::I(av), Data::I(bv), Data::I(cv)) => {
            let mut c = cv.clone();
            for i in 0..m {
                for kk in 0..k {
                    let x = av[i * k + kk];
                    for j in 0..n {
                        c[i * n + j] = norm_i(DType::I32, c[i * n + j].wrapping_add(x.wrapping_mul(bv[kk * n + j])));
                    }
                }
            }
            Data::I(c)
        }
        _ => acc.data.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_index_walks() {
        // transpose of a 2x3 row-major tile: out shape 3x2, strides (1, 3)
        assert_eq!(strided_indices(&[3, 2], &[1, 3]), vec![0, 3, 1, 4, 2, 5]);
        // broadcast [1,3] -> [2,3]
        assert_eq!(strided_indices(&[2, 3], &[0, 1]), vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn tf32_rounding() {
        assert_eq!(to_tf32(1.0), 1.0);
        let x = 1.0 + f32::EPSILON; // below tf32 resolution
        assert_eq!(to_tf32(x), 1.0);
        assert_eq!(to_tf32(1.0 + 1.0 / 1024.0), 1.0 + 1.0 / 1024.0);
    }
}
