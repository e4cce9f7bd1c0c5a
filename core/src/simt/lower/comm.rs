//! Communication: `symm_at`, signals, puts and gets, `barrier_all`.
//!
//! Intra-node scope (the default): loads, stores and atomics through the peers' heap addresses
//! (`symm_at`). Inter-node scope (a `notify` at `inter_node`, or every op of a kernel with
//! `LaunchAttrs::inter_node`): calls of the vendor library's device functions
//! ([`Inst::DeviceCall`]), which reach peers on other nodes. Waits are on local memory either
//! way and stay the bounded protocol wait, `barrier_all`'s included.

use super::*;

impl Lowering<'_> {
    /// Whether communication lowers to the vendor library's device functions.
    pub(super) fn inter_node(&self, scope: Option<CommScope>) -> bool {
        self.func.attrs.inter_node || scope == Some(CommScope::InterNode)
    }

    /// `call` by the threads where `pred` holds, each operand converted to the C parameter's
    /// type (the signal operation's number is the writer's).
    pub(super) fn device_call(&mut self, call: DeviceCall, operands: &[Reg], pred: Option<Reg>) {
        let op_at = call.op_position().map(|(at, _)| at);
        let params = call.params().iter().enumerate().filter(|(i, _)| Some(*i) != op_at).map(|(_, p)| *p);
        let args: Vec<Reg> = operands
            .iter()
            .zip(params)
            .map(|(&r, p)| match p {
                CallParam::Ptr => r,
                CallParam::U64 => self.cast(r, U64),
                CallParam::I32 => self.cast(r, I32),
            })
            .collect();
        self.emit(Inst::DeviceCall { call, args, pred });
    }

    /// Completes every put of the program through the library: all threads call `quiet` (a
    /// block put is issued by all of them), then meet.
    pub(super) fn quiet_all(&mut self) {
        self.emit(Inst::Barrier);
        self.device_call(DeviceCall::Quiet, &[], None);
        self.emit(Inst::Barrier);
    }

    /// `notify` through the library: the program's puts complete, its stores are released,
    /// then one thread updates the signal on `rank`.
    pub(super) fn notify_inter_node(&mut self, sig: Reg, rank: Reg, value: Reg, op: SignalOp) {
        self.bulk_writes_done();
        self.quiet_all();
        self.emit(Inst::Fence { scope: Scope::Sys });
        let first = self.first_thread();
        self.device_call(DeviceCall::SignalOp { op }, &[sig, value, rank], Some(first));
    }

    /// `put`/`get`/`put_signal` through the library's block functions, every thread calling
    /// with the same operands; barriers before (the source may be other threads' stores) and
    /// after (the destination may be read by other threads).
    pub(super) fn transfer_inter_node(&mut self, call: DeviceCall, operands: &[Value]) {
        let regs: Vec<Reg> = operands.iter().map(|v| self.held(*v)[0]).collect();
        self.bulk_writes_done();
        self.emit(Inst::Barrier);
        self.device_call(call, &regs, None);
        self.emit(Inst::Barrier);
    }

    /// The first thread of the thread's consumer group (of the program without ping-pong).
    pub(super) fn group_first_thread(&mut self) -> Reg {
        if self.group.is_none() {
            return self.first_thread();
        }
        let local = self.group_thread();
        let zero = self.iconst(0);
        let first = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: first, op: CmpOp::Eq, a: local, b: zero });
        first
    }

    /// The thread's index in its consumer group (in the program without ping-pong).
    pub(super) fn group_thread(&mut self) -> Reg {
        match self.group {
            Some(_) => self.bin_c(BinaryOp::And, self.tid, (self.k.warps * self.k.warp_size) as i64 - 1),
            None => self.tid,
        }
    }

    pub(super) fn first_thread(&mut self) -> Reg {
        let zero = self.iconst(0);
        let first = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: first, op: CmpOp::Eq, a: self.tid, b: zero });
        first
    }

    pub(super) fn symm_at(&mut self, ptr: Reg, rank: Reg) -> Reg {
        let d = self.reg(SType::Ptr);
        self.emit(Inst::SymmAt { dst: d, ptr, rank });
        d
    }

    /// Program barrier, release fence, then one thread updates the signal at `target`.
    pub(super) fn release_then_signal(&mut self, target: Reg, value: Reg, op: SignalOp) {
        self.bulk_writes_done();
        self.emit(Inst::Barrier);
        self.emit(Inst::Fence { scope: Scope::Sys });
        let first = self.first_thread();
        self.emit(Inst::Signal { addr: target, value, op, pred: first });
    }

    /// Before a release that publishes memory: the bulk stores (TMA or row copies) this program
    /// issued have made their global writes, and the asynchronous proxy's writes are ordered
    /// before the generic proxy's release that follows. Nothing where none was issued.
    pub(super) fn bulk_writes_done(&mut self) {
        if self.bulk_pending {
            self.emit(Inst::BulkWait { pending: 0, writes: true });
            self.emit(Inst::FenceProxyAsyncGlobal);
        }
    }

    /// `put` (local `src` to `dst` on `rank`) or `get` (`src` on `rank` to local `dst`) of
    /// `bytes` bytes, by every thread of the program: elements of the pointee's size, then a byte
    /// tail. A barrier before (the source may be other threads' stores) and after (the
    /// destination may be read by other threads).
    pub(super) fn transfer(&mut self, is_put: bool, dst: Value, src: Value, bytes: Value, rank: Value) {
        let size = self.func.ty(dst).elem.pointee().map_or(1, |d| d.size_bytes());
        let (d0, s0, r) = (self.held(dst)[0], self.held(src)[0], self.held(rank)[0]);
        let (to, from) = if is_put { (self.symm_at(d0, r), s0) } else { (d0, self.symm_at(s0, r)) };
        let b0 = self.held(bytes)[0];
        let n_bytes = self.cast(b0, I32);
        self.bulk_writes_done();
        self.emit(Inst::Barrier);
        let elems = self.bin_c(BinaryOp::Shr, n_bytes, log2(size));
        let word = SType::Int { bits: (8 * size) as u8, signed: false };
        self.copy_loop(to, from, elems, size, word);
        if size > 1 {
            let tail = self.bin_c(BinaryOp::And, n_bytes, size as i64 - 1);
            let done = self.bin_c(BinaryOp::Shl, elems, log2(size));
            let byte = SType::Int { bits: 8, signed: false };
            let (to_t, from_t) = (self.reg(SType::Ptr), self.reg(SType::Ptr));
            self.emit(Inst::AddrOffset { dst: to_t, base: to, offset: done, scale: 1 });
            self.emit(Inst::AddrOffset { dst: from_t, base: from, offset: done, scale: 1 });
            self.copy_loop(to_t, from_t, tail, 1, byte);
        }
        self.emit(Inst::Barrier);
    }

    /// `to[i] = from[i]` for `i < n`, spread over the program's threads.
    pub(super) fn copy_loop(&mut self, to: Reg, from: Reg, n: Reg, size: u32, t: SType) {
        self.over_threads(n, &mut |l, i, inside| {
            let (src, dst) = (l.reg(SType::Ptr), l.reg(SType::Ptr));
            l.emit(Inst::AddrOffset { dst: src, base: from, offset: i, scale: size });
            l.emit(Inst::AddrOffset { dst, base: to, offset: i, scale: size });
            let v = l.reg(t);
            l.emit(Inst::Load { dst: v, addr: src, pred: Some(inside), other: None });
            l.emit(Inst::Store { addr: dst, value: v, pred: Some(inside) });
        });
    }

    /// `body(i, i < n)` for `i = thread, thread + threads, ..` while some thread has `i < n`: a
    /// loop every thread runs the same number of times.
    fn over_threads(&mut self, n: Reg, body: &mut dyn FnMut(&mut Self, Reg, Reg)) {
        let (lo, step) = (self.iconst(0), self.iconst(self.threads() as i64));
        let iv = self.reg(I32);
        let saved = std::mem::take(&mut self.cur);
        let i = self.bin(BinaryOp::Add, iv, self.tid);
        let inside = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: inside, op: CmpOp::Lt, a: i, b: n });
        body(self, i, inside);
        let body = std::mem::replace(&mut self.cur, saved);
        self.emit(Inst::Loop {
            iv,
            lo,
            hi: n,
            step,
            phis: vec![],
            inits: vec![],
            body,
            nexts: vec![],
            results: vec![],
        });
    }

    /// Every program of every rank arrives (its transfers complete) before any leaves: thread 0
    /// reads the generation, counts itself in on rank 0's `barrier_all` words (this rank's,
    /// rebased with `symm_at`), and the last arriver resets the count and bumps the generation;
    /// the others wait (bounded) for the bump. At inter-node scope the count is per rank and
    /// the ranks meet through the library ([`Lowering::barrier_all_inter_node`]).
    pub(super) fn barrier_all(&mut self) {
        if self.inter_node(None) {
            return self.barrier_all_inter_node();
        }
        self.emit(Inst::Barrier);
        self.emit(Inst::Fence { scope: Scope::Sys });
        let own = self.hidden[Hidden::Barrier.position()];
        let zero_rank = self.iconst(0);
        let words = self.symm_at(own, zero_rank);
        let nranks = self.hidden[Hidden::NumRanks.position()];
        let want = self.programs_times(nranks);
        let (gen, gen_addr, last) = self.count_in(words, want);
        self.release_count(words, gen_addr, last);
        let one = self.iconst(1);
        self.emit(Inst::WaitSignals { base: gen_addr, count: one, cmp: CmpOp::Ne, value: gen });
    }

    /// `barrier_all` across nodes: the program's puts complete through the library; thread 0 of
    /// each program counts itself in on this rank's words; the rank's last program adds 1 to
    /// the arrival word of every rank through the library and waits (bounded) until its own
    /// arrival word reaches `(generation + 1) x ranks` (generations advance in step on every
    /// rank), then resets the count and bumps the generation; the rank's other programs wait
    /// (bounded) for the bump.
    pub(super) fn barrier_all_inter_node(&mut self) {
        self.quiet_all();
        self.emit(Inst::Fence { scope: Scope::Sys });
        let words = self.hidden[Hidden::Barrier.position()];
        let nranks = self.hidden[Hidden::NumRanks.position()];
        let one = self.iconst(1);
        let want = self.programs_times(one);
        let (gen, gen_addr, last) = self.count_in(words, want);
        // `last` holds on thread 0 of the rank's last program: made uniform over the program.
        let last_prog = self.reg(SType::Pred);
        self.emit(Inst::BarrierAny { dst: last_prog, pred: last });
        let two = self.iconst(2);
        let arrivals = self.reg(SType::Ptr);
        self.emit(Inst::AddrOffset { dst: arrivals, base: words, offset: two, scale: 8 });
        // Thread t signals ranks t, t + threads, ..
        let one64 = self.cast(one, U64);
        self.over_threads(nranks, &mut |l, pe, inside| {
            let on = l.bin(BinaryOp::And, inside, last_prog);
            l.device_call(DeviceCall::SignalOp { op: SignalOp::Add }, &[arrivals, one64, pe], Some(on));
        });
        // The last program waits for every rank's arrival of this generation.
        let next_gen = self.bin(BinaryOp::Add, gen, one64);
        let n64 = self.cast(nranks, U64);
        let expected = self.bin(BinaryOp::Mul, next_gen, n64);
        let zero = self.iconst(0);
        let count = self.reg(I32);
        self.emit(Inst::Select { dst: count, cond: last_prog, on_true: one, on_false: zero });
        self.emit(Inst::WaitSignals { base: arrivals, count, cmp: CmpOp::Ge, value: expected });
        self.release_count(words, gen_addr, last);
        self.emit(Inst::WaitSignals { base: gen_addr, count: one, cmp: CmpOp::Ne, value: gen });
    }

    /// `n` times the programs of the launch.
    fn programs_times(&mut self, n: Reg) -> Reg {
        let mut want = n;
        for a in [Axis::X, Axis::Y, Axis::Z] {
            let p = self.reg(I32);
            self.emit(Inst::Special { dst: p, which: Special::NumPrograms(a) });
            want = self.bin(BinaryOp::Mul, want, p);
        }
        want
    }

    /// Thread 0 reads the generation at `words[1]` and counts itself in at `words[0]`; returns
    /// (the generation it read, the generation's address, whether it arrived last of `want`).
    fn count_in(&mut self, words: Reg, want: Reg) -> (Reg, Reg, Reg) {
        let last_old = self.bin_c(BinaryOp::Sub, want, 1);
        let last_old = self.cast(last_old, U64);
        let first = self.first_thread();
        let one = self.iconst(1);
        let gen_addr = self.reg(SType::Ptr);
        self.emit(Inst::AddrOffset { dst: gen_addr, base: words, offset: one, scale: 8 });
        let gen = self.reg(U64);
        let zero = self.zero_u64();
        self.emit(Inst::Atomic {
            dst: gen,
            op: AtomicOp::Add,
            addr: gen_addr,
            value: zero,
            pred: Some(first),
            sem: MemSemantic::Acquire,
            scope: Scope::Sys,
        });
        let old = self.reg(U64);
        let one64 = self.cast(one, U64);
        self.emit(Inst::Atomic {
            dst: old,
            op: AtomicOp::Add,
            addr: words,
            value: one64,
            pred: Some(first),
            sem: MemSemantic::AcqRel,
            scope: Scope::Sys,
        });
        let is_last = self.reg(SType::Pred);
        self.emit(Inst::Cmp { dst: is_last, op: CmpOp::Eq, a: old, b: last_old });
        let last = self.bin(BinaryOp::And, is_last, first);
        (gen, gen_addr, last)
    }

    /// The last arriver (`last`) resets the count at `words[0]` and bumps the generation.
    fn release_count(&mut self, words: Reg, gen_addr: Reg, last: Reg) {
        let zero = self.zero_u64();
        let one = self.iconst(1);
        let one64 = self.cast(one, U64);
        let ignored = (self.reg(U64), self.reg(U64));
        self.emit(Inst::Atomic {
            dst: ignored.0,
            op: AtomicOp::Xchg,
            addr: words,
            value: zero,
            pred: Some(last),
            sem: MemSemantic::Relaxed,
            scope: Scope::Sys,
        });
        self.emit(Inst::Atomic {
            dst: ignored.1,
            op: AtomicOp::Add,
            addr: gen_addr,
            value: one64,
            pred: Some(last),
            sem: MemSemantic::Release,
            scope: Scope::Sys,
        });
    }

    pub(super) fn zero_u64(&mut self) -> Reg {
        let z = self.reg(U64);
        self.emit(Inst::Const { dst: z, value: Literal::Int(0) });
        z
    }
}
