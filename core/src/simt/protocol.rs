//! Protocol expansion: the communication instructions of the SIMT IR as primitives.
//!
//! The lowering emits two *protocol instructions*, [`Inst::SymmAt`] and [`Inst::WaitSignals`],
//! whose meaning spans the runtime (the heap-base table, the diagnostics record, the wait bound).
//! [`expand`] rewrites them, once and for every GPU, into instructions a writer translates one at
//! a time:
//!
//! * `symm_at(p, r)` = `p - heap_bases[rank] + heap_bases[r]`: two loads from the hidden
//!   `__heap_bases` table and address arithmetic.
//! * a bounded wait: every thread of the program loops while some thread still has a signal to
//!   wait for ([`Inst::BarrierAny`] keeps the loop uniform); a waiting thread reads its signal
//!   with acquire semantics at system scope, the diagnostics flag (another program aborted) and
//!   the clock; past the bound it claims the record with a compare-and-swap, fills it (rank,
//!   program, signal, expected, seen, comparison, the kernel's tag) and publishes the flag with a release store.
//!   After the loop thread 0 reads the flag and, if it is raised, every thread leaves the
//!   program ([`Inst::Exit`]).
//!
//! In the producer of a warp-specialized region ([`Inst::Specialized`]) the wait is the
//! producer warp's alone: its lanes poll (lane i signals i, i + 32, ...), a warp vote
//! ([`Inst::WarpAny`]) keeps the poll uniform within the warp, and the warp goes on after it
//! whatever ended it, a timeout or another program's abort included: the consumers wait on
//! mbarriers the producer's copies complete, so a producer that left would hang them. Its
//! copies then read whatever the rows hold; the launch ends and reports the record as any
//! timed-out wait does (the results are not to be used).
//!
//! The only target-specific part left is [`Inst::Clock`]. cpu-simt runs the protocol
//! instructions themselves in its worlds (its scheduler detects deadlocks exactly and replays
//! interleavings from a seed) and the expanded form in single-device launches, so CI executes
//! what the GPUs run, up to the clock.

use super::{count, diag, Hidden, Inst, Kernel, Reg, SType, SharedObject, Special};
use crate::ir::{BinaryOp, CmpOp, Literal, MemSemantic, Scope};

const I32: SType = SType::Int { bits: 32, signed: true };
const U64: SType = SType::Int { bits: 64, signed: false };

/// Rewrites every [`Inst::SymmAt`] and [`Inst::WaitSignals`] of `k` into primitives, and on
/// targets without a reducing barrier every [`Inst::BarrierAny`] into shared memory and
/// barriers.
pub fn expand(k: &mut Kernel) {
    let target = k.target;
    if has_protocol(&k.body) {
        expand_protocol(k);
    }
    if !target.barrier_reduce && count(&k.body, &|i| matches!(i, Inst::BarrierAny { .. })) > 0 {
        barrier_any_in_shared(k);
    }
}

/// `dst = OR(pred)` over the program as: barrier; thread 0 clears a shared word; barrier;
/// threads whose `pred` holds store 1 (the same value: no hazard); barrier; everyone reads it.
/// The word is its own shared object, after every other.
fn barrier_any_in_shared(k: &mut Kernel) {
    let at = k.shared_bytes.next_multiple_of(4);
    k.shared_bytes = at + 4;
    k.shared_objects.push(SharedObject { name: "protocol.barrier_any", offset: at, bytes: 4, align: 4, swizzle: None });
    fn walk(k: &mut Kernel, body: Vec<Inst>, at: u32) -> Vec<Inst> {
        let mut out = Vec::with_capacity(body.len());
        let reg = |k: &mut Kernel, t: SType| {
            k.regs.push(t);
            Reg(k.regs.len() as u32 - 1)
        };
        for mut inst in body {
            match inst {
                Inst::BarrierAny { dst, pred } => {
                    let u32t = SType::Int { bits: 32, signed: false };
                    let (off, zero, one, tid, z32, first, word) = (
                        reg(k, I32),
                        reg(k, u32t),
                        reg(k, u32t),
                        reg(k, I32),
                        reg(k, I32),
                        reg(k, SType::Pred),
                        reg(k, u32t),
                    );
                    out.extend([
                        Inst::Const { dst: off, value: Literal::Int(at as i64) },
                        Inst::Const { dst: zero, value: Literal::Int(0) },
                        Inst::Const { dst: one, value: Literal::Int(1) },
                        Inst::Const { dst: z32, value: Literal::Int(0) },
                        Inst::Special { dst: tid, which: Special::ThreadId },
                        Inst::Cmp { dst: first, op: CmpOp::Eq, a: tid, b: z32 },
                        Inst::Barrier,
                        Inst::SharedStore { offset: off, value: zero, pred: Some(first) },
                        Inst::Barrier,
                        Inst::SharedStore { offset: off, value: one, pred: Some(pred) },
                        Inst::Barrier,
                        Inst::SharedLoad { dst: word, offset: off },
                        Inst::Cmp { dst, op: CmpOp::Ne, a: word, b: zero },
                    ]);
                }
                _ => {
                    for b in inst.bodies_mut() {
                        *b = walk(k, std::mem::take(b), at);
                    }
                    out.push(inst);
                }
            }
        }
        out
    }
    let body = std::mem::take(&mut k.body);
    k.body = walk(k, body, at);
}

fn expand_protocol(k: &mut Kernel) {
    let hidden: Vec<(Hidden, u32)> = Hidden::ALL.iter().map(|h| (*h, h.index_among(k.params.len()))).collect();
    let body = std::mem::take(&mut k.body);
    let mut constants = Vec::new();
    collect_constants(&body, &mut constants);
    let mut x = Expander { k, hidden, params: Vec::new(), constants, producer: false };
    let mut out = x.block(body);
    // The hidden parameters the expansions read, loaded once at the top.
    let mut head = std::mem::take(&mut x.params);
    head.append(&mut out);
    k.body = head;
}

/// Every register `body` sets to an integer constant (a `Const`, its only definition).
fn collect_constants(body: &[Inst], out: &mut Vec<(Reg, i64)>) {
    for i in body {
        match i {
            Inst::Const { dst, value: Literal::Int(v) } => out.push((*dst, *v)),
            _ => i.bodies().into_iter().for_each(|b| collect_constants(b, out)),
        }
    }
}

/// True when `k` still holds a protocol instruction (a writer refuses such a kernel).
pub fn has_protocol(body: &[Inst]) -> bool {
    count(body, &|i| matches!(i, Inst::SymmAt { .. } | Inst::WaitSignals { .. } | Inst::WaitFlag { .. })) > 0
}

/// What a bounded poll waits for.
#[derive(Clone, Copy)]
enum Until {
    /// A signal: `word <cmp> want`, read with acquire semantics.
    Signal { cmp: CmpOp, want: Reg },
    /// A flagged word: its high 32 bits equal `flag` (u64), read relaxed.
    Flag { flag: Reg },
}

struct Expander<'a> {
    k: &'a mut Kernel,
    hidden: Vec<(Hidden, u32)>,
    /// `Param` instructions of the hidden parameters used so far.
    params: Vec<Inst>,
    /// The kernel's integer constants (a wait's count known to fit the threads needs no loop).
    constants: Vec<(Reg, i64)>,
    /// Expanding a warp-specialized region's producer: its waits are the producer warp's.
    producer: bool,
}

impl Expander<'_> {
    fn reg(&mut self, t: SType) -> Reg {
        self.k.new_reg(t)
    }

    fn hidden(&mut self, h: Hidden) -> Reg {
        let index = self.hidden.iter().find(|(x, _)| *x == h).map(|(_, i)| *i).unwrap_or(0);
        let found = self.params.iter().find_map(|i| match i {
            Inst::Param { dst, index: j } if *j == index => Some(*dst),
            _ => None,
        });
        found.unwrap_or_else(|| {
            let dst = self.reg(self.k.params[index as usize].1);
            self.params.push(Inst::Param { dst, index });
            dst
        })
    }

    fn block(&mut self, body: Vec<Inst>) -> Vec<Inst> {
        let mut out = Vec::with_capacity(body.len());
        for mut inst in body {
            match inst {
                Inst::SymmAt { dst, ptr, rank } => self.symm_at(&mut out, dst, ptr, rank),
                Inst::WaitSignals { base, count, cmp, value } => self.wait(&mut out, base, count, cmp, value),
                Inst::WaitFlag { dst, addr, pred, flag } => self.wait_flag(&mut out, dst, addr, pred, flag),
                Inst::Specialized { ref mut producer, ref mut consumer, .. } => {
                    self.producer = true;
                    *producer = self.block(std::mem::take(producer));
                    self.producer = false;
                    *consumer = self.block(std::mem::take(consumer));
                    out.push(inst);
                }
                _ => {
                    for b in inst.bodies_mut() {
                        *b = self.block(std::mem::take(b));
                    }
                    out.push(inst);
                }
            }
        }
        out
    }

    /// The waiting thread's index among the threads that wait together, and how many they
    /// are: the program's, or the producer warp's lanes.
    fn waiter(&mut self, out: &mut Vec<Inst>) -> (Reg, u32) {
        let tid = self.reg(I32);
        out.push(Inst::Special { dst: tid, which: Special::ThreadId });
        if !self.producer {
            return (tid, self.k.threads());
        }
        let size = self.k.warp_size;
        let w = self.konst(out, I32, size as i64);
        (self.bin(out, BinaryOp::Rem, tid, w), size)
    }

    fn konst(&mut self, out: &mut Vec<Inst>, t: SType, v: i64) -> Reg {
        self.k.push_const(out, t, v)
    }

    fn bin(&mut self, out: &mut Vec<Inst>, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        self.k.push_binary(out, op, a, b)
    }

    fn cmp(&mut self, out: &mut Vec<Inst>, op: CmpOp, a: Reg, b: Reg) -> Reg {
        let dst = self.reg(SType::Pred);
        out.push(Inst::Cmp { dst, op, a, b });
        dst
    }

    fn widen_u64(&mut self, out: &mut Vec<Inst>, r: Reg) -> Reg {
        self.k.push_u64(out, r)
    }

    /// `dst = ptr - heap_bases[__rank] + heap_bases[rank]`.
    fn symm_at(&mut self, out: &mut Vec<Inst>, dst: Reg, ptr: Reg, rank: Reg) {
        let (table, me) = (self.hidden(Hidden::HeapBases), self.hidden(Hidden::Rank));
        let mut base_of = |x: &mut Self, r: Reg| {
            let a = x.reg(SType::Ptr);
            out.push(Inst::AddrOffset { dst: a, base: table, offset: r, scale: 8 });
            let v = x.reg(U64);
            out.push(Inst::Load { dst: v, addr: a, pred: None, other: None });
            v
        };
        let from = base_of(self, me);
        let to = base_of(self, rank);
        let delta = self.bin(out, BinaryOp::Sub, to, from);
        out.push(Inst::AddrOffset { dst, base: ptr, offset: delta, scale: 1 });
    }

    /// The bounded wait of [`Inst::WaitSignals`] (see the module docs).
    fn wait(&mut self, out: &mut Vec<Inst>, base: Reg, count: Reg, cmp: CmpOp, value: Reg) {
        // The hidden parameters the poll reads, first (registers numbered as they always were).
        let _ = (self.hidden(Hidden::Diag), self.hidden(Hidden::WaitBoundNs));
        let (tid, threads) = self.waiter(out);
        let count = if self.k.ty(count) == I32 {
            count
        } else {
            let c = self.reg(I32);
            out.push(Inst::Cast { dst: c, src: count });
            c
        };
        // Thread i waits for signals i, i + threads, ...: one pass of the bounded wait below
        // per `threads` signals (a count above the waiting threads waits for all of them).
        let (first_signal, zero_i, step) =
            (self.reg(I32), self.konst(out, I32, 0), self.konst(out, I32, threads as i64));
        let outer = std::mem::take(out);
        let signal = self.bin(out, BinaryOp::Add, first_signal, tid);
        let mine = self.cmp(out, CmpOp::Lt, signal, count);
        let addr = self.reg(SType::Ptr);
        out.push(Inst::AddrOffset { dst: addr, base, offset: signal, scale: 8 });
        let want = self.widen_u64(out, value);
        self.poll(out, tid, addr, mine, Until::Signal { cmp, want }, None);
        let pass = std::mem::replace(out, outer);
        // A count known to fit the threads (a single signal, as most waits) takes one pass
        // without the loop: its registers stay as before (gfx90a's waiting GEMMs spilled
        // scalar registers with the loop around every wait).
        let known = self.constants.iter().find(|(r, _)| *r == count).map(|(_, v)| *v);
        if known.is_some_and(|c| c <= threads as i64) {
            out.push(Inst::Binary { dst: first_signal, op: BinaryOp::Add, a: zero_i, b: zero_i });
            out.extend(pass);
            return;
        }
        out.push(Inst::Loop {
            iv: first_signal,
            lo: zero_i,
            hi: count,
            step,
            phis: Vec::new(),
            inits: Vec::new(),
            body: pass,
            nexts: Vec::new(),
            results: Vec::new(),
        });
    }

    /// The bounded poll of one word per thread (see the module docs): threads where `mine`
    /// holds read the word at `addr` until it satisfies `until`, the bound passes or another
    /// program aborts; then the program stops if the abort flag is raised (a producer warp
    /// goes on: see the module docs). `word`, when given,
    /// receives the word each thread read last (0 where `mine` was false).
    /// `tid` is the thread's index.
    fn poll(&mut self, out: &mut Vec<Inst>, tid: Reg, addr: Reg, mine: Reg, until: Until, word: Option<Reg>) {
        let (dg, bound) = (self.hidden(Hidden::Diag), self.hidden(Hidden::WaitBoundNs));
        let zero = self.konst(out, U64, 0);
        let t0 = self.reg(U64);
        out.push(Inst::Clock { dst: t0 });

        // while any(pending) { ... }
        let pending = self.reg(SType::Pred);
        let mut cond_body = Vec::new();
        let any = self.reg(SType::Pred);
        cond_body.push(match self.producer {
            false => Inst::BarrierAny { dst: any, pred: pending },
            true => Inst::WarpAny { dst: any, pred: pending },
        });
        let mut b = Vec::new();
        let seen = self.reg(U64);
        let sem = match until {
            Until::Signal { .. } => MemSemantic::Acquire,
            Until::Flag { .. } => MemSemantic::Relaxed,
        };
        b.push(Inst::AtomicLoad { dst: seen, addr, pred: Some(pending), sem, scope: Scope::Sys });
        // What the record reports: the signal, or the word's flag.
        let (ok, expected, shown, code) = match until {
            Until::Signal { cmp, want } => (self.cmp(&mut b, cmp, seen, want), want, seen, diag::cmp_code(cmp)),
            Until::Flag { flag } => {
                let hi = self.reg(U64);
                let k32 = self.konst(&mut b, U64, 32);
                b.push(Inst::Binary { dst: hi, op: BinaryOp::Shr, a: seen, b: k32 });
                (self.cmp(&mut b, CmpOp::Eq, hi, flag), flag, hi, diag::CMP_FLAG)
            }
        };
        let flag = self.reg(U64);
        b.push(Inst::AtomicLoad {
            dst: flag,
            addr: dg,
            pred: Some(pending),
            sem: MemSemantic::Relaxed,
            scope: Scope::Gpu,
        });
        let aborted = self.cmp(&mut b, CmpOp::Ne, flag, zero);
        let now = self.reg(U64);
        b.push(Inst::Clock { dst: now });
        let elapsed = self.bin(&mut b, BinaryOp::Sub, now, t0);
        let late = self.cmp(&mut b, CmpOp::Ge, elapsed, bound);
        let done = self.bin(&mut b, BinaryOp::Or, ok, aborted);
        let yes = self.konst(&mut b, SType::Pred, 1);
        let not_done = self.bin(&mut b, BinaryOp::Xor, done, yes);
        let still = self.bin(&mut b, BinaryOp::And, pending, not_done);
        let timed_out = self.bin(&mut b, BinaryOp::And, still, late);
        // The first timed-out thread anywhere claims the record (0 -> 2), fills it, then sets
        // the flag to 1 with a release store.
        let (two, one) = (self.konst(&mut b, U64, 2), self.konst(&mut b, U64, 1));
        let old = self.reg(U64);
        b.push(Inst::AtomicCas {
            dst: old,
            addr: dg,
            expected: zero,
            desired: two,
            pred: Some(timed_out),
            sem: MemSemantic::Relaxed,
            scope: Scope::Gpu,
        });
        let claimed = self.cmp(&mut b, CmpOp::Eq, old, zero);
        let won = self.bin(&mut b, BinaryOp::And, timed_out, claimed);
        let rank = self.hidden(Hidden::Rank);
        let mut fields = vec![(diag::RANK, self.widen_u64(&mut b, rank))];
        for (word, axis) in [
            (diag::PROGRAM_X, crate::ir::Axis::X),
            (diag::PROGRAM_Y, crate::ir::Axis::Y),
            (diag::PROGRAM_Z, crate::ir::Axis::Z),
        ] {
            let p = self.reg(I32);
            b.push(Inst::Special { dst: p, which: Special::ProgramId(axis) });
            fields.push((word, self.widen_u64(&mut b, p)));
        }
        fields.push((diag::SIGNAL, self.widen_u64(&mut b, addr)));
        fields.push((diag::EXPECTED, expected));
        fields.push((diag::SEEN, shown));
        fields.push((diag::CMP, self.konst(&mut b, U64, code as i64)));
        let tag = diag::kernel_tag(&self.k.name) as i64;
        fields.push((diag::KERNEL, self.konst(&mut b, U64, tag)));
        for (word, v) in fields {
            let at = self.word(&mut b, dg, word);
            b.push(Inst::Store { addr: at, value: v, pred: Some(won) });
        }
        b.push(Inst::AtomicStore {
            addr: dg,
            value: one,
            pred: Some(won),
            sem: MemSemantic::Release,
            scope: Scope::Gpu,
        });
        let stop = self.bin(&mut b, BinaryOp::Or, done, late);
        let not_stop = self.bin(&mut b, BinaryOp::Xor, stop, yes);
        let next = self.bin(&mut b, BinaryOp::And, pending, not_stop);
        let mut phis = vec![pending];
        let mut inits = vec![mine];
        let mut nexts = vec![next];
        let mut results = vec![self.reg(SType::Pred)];
        // The word read last by a thread that was still waiting (0 where it never waited).
        if let Some(dst) = word {
            let (carried, latest) = (self.reg(U64), self.reg(U64));
            b.push(Inst::Select { dst: latest, cond: pending, on_true: seen, on_false: carried });
            phis.push(carried);
            inits.push(zero);
            nexts.push(latest);
            results.push(dst);
        }
        out.push(Inst::While { phis, inits, cond_body, cond: any, body: b, nexts, results });
        // A producer warp goes on (see the module docs).
        if self.producer {
            return;
        }

        // Thread 0 decides for everyone whether the program stops here.
        let zero32 = self.konst(out, I32, 0);
        let first = self.cmp(out, CmpOp::Eq, tid, zero32);
        let flag = self.reg(U64);
        out.push(Inst::AtomicLoad {
            dst: flag,
            addr: dg,
            pred: Some(first),
            sem: MemSemantic::Relaxed,
            scope: Scope::Gpu,
        });
        let raised = self.cmp(out, CmpOp::Ne, flag, zero);
        let stop = self.reg(SType::Pred);
        out.push(Inst::BarrierAny { dst: stop, pred: raised });
        out.push(Inst::If {
            cond: stop,
            then_body: vec![Inst::Exit],
            then_yields: Vec::new(),
            else_body: Vec::new(),
            else_yields: Vec::new(),
            results: Vec::new(),
        });
    }

    /// A flagged word ([`Inst::WaitFlag`]): the bounded poll until its high 32 bits equal the
    /// flag (zero-extended), relaxed; `dst` gets the word.
    fn wait_flag(&mut self, out: &mut Vec<Inst>, dst: Reg, addr: Reg, pred: Option<Reg>, flag: Reg) {
        let (tid, _) = self.waiter(out);
        let mine = match pred {
            Some(p) => p,
            None => self.konst(out, SType::Pred, 1),
        };
        let flag = match self.k.ty(flag) {
            SType::Int { bits: 32, signed: true } => {
                let u = self.reg(SType::Int { bits: 32, signed: false });
                out.push(Inst::Cast { dst: u, src: flag });
                u
            }
            _ => flag,
        };
        let flag = self.widen_u64(out, flag);
        let word = self.reg(U64);
        self.poll(out, tid, addr, mine, Until::Flag { flag }, Some(word));
        // An `i64` result: the same bits (integer casts wrap).
        out.push(if self.k.ty(dst) == U64 { Inst::Mov { dst, src: word } } else { Inst::Cast { dst, src: word } });
    }

    fn word(&mut self, out: &mut Vec<Inst>, record: Reg, word: usize) -> Reg {
        let i = self.konst(out, I32, word as i64);
        let at = self.reg(SType::Ptr);
        out.push(Inst::AddrOffset { dst: at, base: record, offset: i, scale: 8 });
        at
    }
}
