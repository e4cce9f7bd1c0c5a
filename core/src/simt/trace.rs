//! Trace expansion: every [`Inst::TraceEvent`] of a traced kernel as primitives (the buffer
//! format is `crate::trace`'s).
//!
//! One thread records each event: thread 0 in the program's uniform code and in the consumers
//! of a warp-specialized region (with consumer ping-pong, the first thread of each group), the
//! first producer thread in the producer. It reads the clock and its multiprocessor, reserves
//! a slot with an atomic add on the buffer's first word and, when the slot is below the
//! capacity (the second word), stores the event's three words; other threads only predicate
//! the instructions off, so nothing of the kernel's control flow changes.
//!
//! The program's start and end (both in its top-level code) are one reservation: the start
//! reserves two slots and reads the clock, the end reads the clock and stores both events. So
//! neither waits for its atomic's answer: the start's would hold the program's first barrier
//! (every warp) for an L2 round trip under contention, and the end's the multiprocessor's next
//! program (measured: GEMM-RS's 44 us programs 3-4% slower traced, session 53). A program that
//! leaves early (a wait's abort) stores neither: its two slots stay zero, which [`decode`]
//! skips (the buffer is cleared before each launch).
//!
//! [`decode`]: crate::trace::decode

use super::{count, Inst, Kernel, Reg, SType, Special, HIDDEN_PARAMS};
use crate::ir::{AtomicOp, Axis, BinaryOp, CmpOp, MemSemantic, Scope};
use crate::trace::{kind_word, EventKind, EVENT_WORDS, HEADER_WORDS};

const I32: SType = SType::Int { bits: 32, signed: true };
const U64: SType = SType::Int { bits: 64, signed: false };

/// Which threads run the instructions being expanded.
#[derive(Clone, Copy)]
enum Region {
    /// Every thread (thread 0 records), or the consumers without ping-pong.
    All,
    /// The producer of a warp-specialized region, from thread `first`.
    Producer { first: u32 },
    /// Consumer groups of `threads` threads each (ping-pong): each group's first records.
    Groups { threads: u32 },
}

/// Rewrites the kernel's trace events (a kernel without any is left as it is). The trace
/// buffer is the kernel's last own parameter (`crate::trace::instrument`).
pub fn expand(k: &mut Kernel) {
    if count(&k.body, &|i| matches!(i, Inst::TraceEvent { .. })) == 0 {
        return;
    }
    let index = (k.params.len() - HIDDEN_PARAMS.len() - 1) as u32;
    let mut x = Expander { k, buffer: Reg(0), start: None };
    x.buffer = x.reg(SType::Ptr);
    let body = std::mem::take(&mut x.k.body);
    let mut out = vec![Inst::Param { dst: x.buffer, index }];
    // The start and the end as one reservation where both are top-level code, start first.
    let at = |kind: EventKind| {
        body.iter().position(|i| matches!(i, Inst::TraceEvent { kind: k, arg: None, .. } if *k == kind))
    };
    let paired = matches!((at(EventKind::Start), at(EventKind::End)), (Some(s), Some(e)) if s < e);
    for inst in body {
        match inst {
            Inst::TraceEvent { kind: EventKind::Start, label, arg: None } if paired => {
                x.start = Some(x.reserve_pair(&mut out, kind_word(EventKind::Start, label)));
            }
            Inst::TraceEvent { kind: EventKind::End, label, arg: None } if paired => {
                let start = x.start.take().expect("the start comes first");
                x.store_pair(&mut out, start, kind_word(EventKind::End, label));
            }
            inst => out.extend(x.block(vec![inst], Region::All)),
        }
    }
    k.body = out;
}

struct Expander<'a> {
    k: &'a mut Kernel,
    buffer: Reg,
    /// The program's start, recorded at its end: the clock then, the first of the two slots
    /// reserved, the capacity, and the start's third word.
    start: Option<(Reg, Reg, Reg, u64)>,
}

impl Expander<'_> {
    fn reg(&mut self, t: SType) -> Reg {
        self.k.new_reg(t)
    }

    fn konst(&mut self, out: &mut Vec<Inst>, t: SType, v: i64) -> Reg {
        self.k.push_const(out, t, v)
    }

    fn bin(&mut self, out: &mut Vec<Inst>, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        self.k.push_binary(out, op, a, b)
    }

    fn special(&mut self, out: &mut Vec<Inst>, which: Special) -> Reg {
        let dst = self.reg(I32);
        out.push(Inst::Special { dst, which });
        dst
    }

    fn block(&mut self, body: Vec<Inst>, region: Region) -> Vec<Inst> {
        let mut out = Vec::with_capacity(body.len());
        for mut inst in body {
            match inst {
                Inst::TraceEvent { kind, label, arg } => self.event(&mut out, region, kind_word(kind, label), arg),
                Inst::Specialized { consumer_warps, ref mut producer, ref mut consumer, .. } => {
                    let threads = consumer_warps * self.k.warp_size;
                    let p = self.block(std::mem::take(producer), Region::Producer { first: threads });
                    let groups = self.k.consumer_groups.max(1);
                    let inner = if groups > 1 { Region::Groups { threads: threads / groups } } else { Region::All };
                    let c = self.block(std::mem::take(consumer), inner);
                    if let Inst::Specialized { producer, consumer, .. } = &mut inst {
                        (*producer, *consumer) = (p, c);
                    }
                    out.push(inst);
                }
                _ => {
                    for b in inst.bodies_mut() {
                        *b = self.block(std::mem::take(b), region);
                    }
                    out.push(inst);
                }
            }
        }
        out
    }

    /// The thread of `region` that records: a predicate.
    fn leader(&mut self, out: &mut Vec<Inst>, region: Region) -> Reg {
        let tid = self.special(out, Special::ThreadId);
        let lead = self.reg(SType::Pred);
        match region {
            Region::All | Region::Producer { .. } => {
                let first = if let Region::Producer { first } = region { first } else { 0 };
                let f = self.konst(out, I32, first as i64);
                out.push(Inst::Cmp { dst: lead, op: CmpOp::Eq, a: tid, b: f });
            }
            Region::Groups { threads } => {
                // Groups are powers of two threads (ping-pong needs a power-of-two warp count).
                let (m, z) = (self.konst(out, I32, threads as i64 - 1), self.konst(out, I32, 0));
                let low = self.bin(out, BinaryOp::And, tid, m);
                out.push(Inst::Cmp { dst: lead, op: CmpOp::Eq, a: low, b: z });
            }
        }
        lead
    }

    fn event(&mut self, out: &mut Vec<Inst>, region: Region, word: u64, arg: Option<Reg>) {
        let lead = self.leader(out, region);
        let now = self.reg(U64);
        out.push(Inst::Clock { dst: now });
        let (slot, cap) = self.reserve(out, lead, 1);
        self.store(out, lead, (slot, cap), now, word, arg);
    }

    /// `n` slots reserved by the thread `lead` (an atomic add on the buffer's first word),
    /// and the buffer's capacity: the first slot and the capacity.
    fn reserve(&mut self, out: &mut Vec<Inst>, lead: Reg, n: i64) -> (Reg, Reg) {
        let (one, count) = (self.konst(out, U64, 1), self.konst(out, U64, n));
        let slot = self.reg(U64);
        out.push(Inst::Atomic {
            dst: slot,
            op: AtomicOp::Add,
            addr: self.buffer,
            value: count,
            pred: Some(lead),
            sem: MemSemantic::Relaxed,
            scope: Scope::Gpu,
        });
        let (cap_at, cap) = (self.reg(SType::Ptr), self.reg(U64));
        out.push(Inst::AddrOffset { dst: cap_at, base: self.buffer, offset: one, scale: 8 });
        out.push(Inst::Load { dst: cap, addr: cap_at, pred: Some(lead), other: None });
        (slot, cap)
    }

    /// The program's start ([`expand`]): the clock, two slots reserved; nothing stored.
    fn reserve_pair(&mut self, out: &mut Vec<Inst>, word: u64) -> (Reg, Reg, Reg, u64) {
        let lead = self.leader(out, Region::All);
        let now = self.reg(U64);
        out.push(Inst::Clock { dst: now });
        let (slot, cap) = self.reserve(out, lead, 2);
        (now, slot, cap, word)
    }

    /// The program's end: the clock, then the start's event and the end's in the two slots the
    /// start reserved.
    fn store_pair(&mut self, out: &mut Vec<Inst>, (then, slot, cap, start_word): (Reg, Reg, Reg, u64), word: u64) {
        let lead = self.leader(out, Region::All);
        let now = self.reg(U64);
        out.push(Inst::Clock { dst: now });
        self.store(out, lead, (slot, cap), then, start_word, None);
        let one = self.konst(out, U64, 1);
        let next = self.bin(out, BinaryOp::Add, slot, one);
        self.store(out, lead, (next, cap), now, word, None);
    }

    /// The event's three words at `slot` when it is below the capacity `cap`, by `lead`.
    fn store(
        &mut self,
        out: &mut Vec<Inst>,
        lead: Reg,
        (slot, cap): (Reg, Reg),
        now: Reg,
        word: u64,
        arg: Option<Reg>,
    ) {
        let one = self.konst(out, U64, 1);
        let fits = self.reg(SType::Pred);
        out.push(Inst::Cmp { dst: fits, op: CmpOp::Lt, a: slot, b: cap });
        let ok = self.bin(out, BinaryOp::And, lead, fits);
        // Words of the event: HEADER_WORDS + EVENT_WORDS * slot onwards.
        let (w, h) = (self.konst(out, U64, EVENT_WORDS as i64), self.konst(out, U64, HEADER_WORDS as i64));
        let scaled = self.bin(out, BinaryOp::Mul, slot, w);
        let first = self.bin(out, BinaryOp::Add, scaled, h);
        let at = self.reg(SType::Ptr);
        out.push(Inst::AddrOffset { dst: at, base: self.buffer, offset: first, scale: 8 });
        out.push(Inst::Store { addr: at, value: now, pred: Some(ok) });
        // The linear program id and the multiprocessor.
        let (px, py, pz) = (
            self.special(out, Special::ProgramId(Axis::X)),
            self.special(out, Special::ProgramId(Axis::Y)),
            self.special(out, Special::ProgramId(Axis::Z)),
        );
        let (nx, ny) =
            (self.special(out, Special::NumPrograms(Axis::X)), self.special(out, Special::NumPrograms(Axis::Y)));
        let nxy = self.bin(out, BinaryOp::Mul, nx, ny);
        let zy = self.bin(out, BinaryOp::Mul, pz, nxy);
        let yx = self.bin(out, BinaryOp::Mul, py, nx);
        let sum = self.bin(out, BinaryOp::Add, px, yx);
        let linear = self.bin(out, BinaryOp::Add, sum, zy);
        let program = self.k.push_u64(out, linear);
        let sm = self.special(out, Special::SmId);
        let sm = self.k.push_u64(out, sm);
        let k32 = self.konst(out, U64, 32);
        let sm_hi = self.bin(out, BinaryOp::Shl, sm, k32);
        let second = self.bin(out, BinaryOp::Or, program, sm_hi);
        let at1 = self.reg(SType::Ptr);
        out.push(Inst::AddrOffset { dst: at1, base: at, offset: one, scale: 8 });
        out.push(Inst::Store { addr: at1, value: second, pred: Some(ok) });
        let mut third = self.konst(out, U64, word as i64);
        if let Some(a) = arg {
            let a = self.k.push_u64(out, a);
            let hi = self.bin(out, BinaryOp::Shl, a, k32);
            third = self.bin(out, BinaryOp::Or, third, hi);
        }
        let two = self.konst(out, U64, 2);
        let at2 = self.reg(SType::Ptr);
        out.push(Inst::AddrOffset { dst: at2, base: at, offset: two, scale: 8 });
        out.push(Inst::Store { addr: at2, value: third, pred: Some(ok) });
    }
}
