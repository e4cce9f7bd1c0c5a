//! `desc_store` of a tile held in an accumulator layout as a TMA store (sm_90a): every thread
//! writes its elements into a swizzled shared copy of the block (atoms of the block's rows x
//! 128 bytes, as `TmaLoad` lays a box out), the copy is made visible to the asynchronous proxy,
//! and one thread stores it box by box with `cp.async.bulk.tensor`, which clips at the tensor's
//! edges. Replaces a GEMM epilogue's per-element masked stores (and their index math) by shared
//! stores and one bulk copy per 64 columns.

use super::pipeline::StageLayout;
use super::*;

impl Lowering<'_> {
    /// Lowers `desc_store(desc, offsets, value)` as a TMA store when the target has TMA, the
    /// value is held in an accumulator layout of 16-bit elements whose rows are whole 128-byte
    /// atoms, the descriptor has a tensor map, and the staging copy fits in shared memory;
    /// returns whether it did.
    pub(super) fn tma_store(&mut self, desc: Value, offsets: [Value; 2], value: Value) -> bool {
        let Some((l, regs)) = self.stageable_tile(value) else { return false };
        // The staging copy: the whole block, or (when that does not fit beside what is live,
        // as a persistent kernel's stage ring) a part of its 64-column atoms at a time, stored
        // round by round. A round takes the accumulator slots of its columns, which is static
        // when the warps do not split the columns.
        let atom_bytes = l.m * 128;
        let atoms = l.n / 64;
        // With consumer ping-pong each group has its own staging copy.
        let groups = self.group_copies();
        let fits = |me: &mut Self, k: u32| {
            me.smem.place(groups * k * atom_bytes, 1024, true) + groups * k * atom_bytes <= me.target.shared_bytes
        };
        let mut per = atoms;
        while per > 1 && (!fits(self, per) || !atoms.is_multiple_of(per)) && l.warps_n == 1 {
            per /= 2;
        }
        if !fits(self, per) || !atoms.is_multiple_of(per) {
            return false;
        }
        let Some(map) = self.tensor_map(desc, l.m, 64, 128) else { return false };
        let (row0, col0) = (self.held(offsets[0])[0], self.held(offsets[1])[0]);
        // Stored in rounds, the staging copy is two buffers of half a round each, used in
        // turn: a round's shared stores then overlap the previous round's bulk read (each
        // round waits only for the read of the round before that).
        let (per, buffers) = if per < atoms && per >= 2 { (per / 2, 2) } else { (per, 1) };
        let buffer_bytes = per * atom_bytes;
        // The staging copy stays allocated to the program's end: the last rounds' bulk reads are
        // waited for by the next store (this one again, in a loop) or at the end, so the
        // epilogue does not wait for them and nothing else may take the bytes meanwhile.
        let at = self.shared_alloc_pinned("tma.store", buffers * buffer_bytes, 1024);
        // The thread's group's copy (whole 1024-byte swizzle atoms apart, so the swizzle is the
        // same).
        let in_group = |me: &mut Self, off: Reg| match me.group_offset(at) {
            Some(b) => me.bin(BinaryOp::Add, off, b),
            None => off,
        };
        let sl = StageLayout::Swizzled {
            m: l.m,
            n: l.n,
            kk: 64,
            sa: 128,
            sb: 128,
            b_off: 0,
            b_kmajor: false,
            elem: DType::BF16,
        };
        let leader = self.group_first_thread();
        let slots = Self::store_slots(l, regs.len(), atoms, per, buffers, at, buffer_bytes);
        let deltas = self.class_deltas(l, sl, &slots);
        // Each class's offset once. With a producer warp, in the prologue (the coordinates are
        // the thread's, the same for every tile of a persistent loop, and the consumers have the
        // registers to keep them); otherwise here, as the flat persistent loop of a kernel
        // without one keeps its ring's state live too (it spilled with them in the prologue).
        let mut class_base: HashMap<usize, Reg> = HashMap::default();
        if let Some(d) = &deltas {
            let hoist = self.func.attrs.warp_specialize;
            let saved = if hoist { std::mem::take(&mut self.cur) } else { Vec::new() };
            for (i, &(c, _)) in d.iter().enumerate() {
                if c == i {
                    let off = self.swizzled_offset(l, sl, slots[i]);
                    let off = in_group(self, off);
                    class_base.insert(c, off);
                }
            }
            if hoist {
                let defs = std::mem::replace(&mut self.cur, saved);
                self.prologue.extend(defs);
            }
        }
        for round in 0..atoms / per {
            self.stage_round(&regs, &slots, (round, buffers - 1), &mut |me, i, slot| match &deltas {
                // The offset of the store's class plus a constant.
                Some(d) if d[i].1 == 0 => class_base[&d[i].0],
                Some(d) => me.bin_c(BinaryOp::Add, class_base[&d[i].0], d[i].1),
                None => {
                    let off = me.swizzled_offset(l, sl, *slot);
                    in_group(me, off)
                }
            });
            let buffer = at + (round % buffers) * buffer_bytes;
            for atom in 0..per {
                let col = self.bin_c(BinaryOp::Add, col0, ((round * per + atom) * 64) as i64);
                let offset = self.iconst((buffer + atom * atom_bytes) as i64);
                let offset = in_group(self, offset);
                self.emit(Inst::TmaStore { map, offset, coords: [row0, col], pred: leader });
            }
            self.emit(Inst::BulkCommit);
        }
        self.bulk_pending = true;
        true
    }

    /// `value`'s accumulator layout and registers where the target has bulk copies (TMA) and
    /// the value is a tile a bulk store can stage: 16-bit elements, whole 64-column atoms, at
    /// most 256 rows.
    pub(super) fn stageable_tile(&self, value: Value) -> Option<(AccLayout, Vec<Reg>)> {
        if !self.target.has_async_copy(AsyncCopy::Tma) {
            return None;
        }
        let (l, regs) = self.mma_held.get(&value).cloned()?;
        let t = stype(self.func.ty(value));
        (matches!(t, SType::BF16 | SType::F16) && l.n.is_multiple_of(64) && l.m <= 256).then_some((l, regs))
    }

    /// One round of a bulk store's staging (a TMA store's or the row copies'): waits until all
    /// but `pending` of the thread's bulk groups have read their shared memory, and every thread
    /// is past that (the round's buffer is free), writes the round's accumulator `slots` at
    /// `offset(index, slot)` (a neighbouring pair as one 32-bit store), and makes them visible
    /// to the asynchronous proxy for the copies that follow.
    pub(super) fn stage_round(
        &mut self,
        regs: &[Reg],
        slots: &[StoreSlot],
        (round, pending): (u32, u32),
        offset: &mut dyn FnMut(&mut Self, usize, &StoreSlot) -> Reg,
    ) {
        self.emit(Inst::BulkWait { pending, writes: false });
        self.emit(Inst::Barrier);
        for (i, slot) in slots.iter().enumerate().filter(|(_, s)| s.round == round) {
            let off = offset(self, i, slot);
            let value = if slot.pair {
                let d = self.reg(SType::Int { bits: 32, signed: true });
                self.emit(Inst::Pack { dst: d, lo: regs[slot.slot], hi: regs[slot.slot + 1] });
                d
            } else {
                regs[slot.slot]
            };
            self.emit(Inst::SharedStore { offset: off, value, pred: None });
        }
        self.emit(Inst::FenceProxyAsync);
        self.emit(Inst::Barrier);
    }

    /// The shared byte offset of store `st`'s element in its round's buffer.
    fn swizzled_offset(&mut self, l: AccLayout, sl: StageLayout, st: StoreSlot) -> Reg {
        let [row, col] = self.mma_coords(l, st.slot as u32);
        let col = if st.lo > 0 { self.bin_c(BinaryOp::Sub, col, st.lo as i64) } else { col };
        let off = self.stage_offset_here(sl, 0, row, col, 2);
        self.bin_c(BinaryOp::Add, off, st.buffer as i64)
    }

    /// The shared stores of a TMA store, in order, `per` atoms a round. A thread's two
    /// neighbouring columns (as the accumulator layouts pair them, from an even column) go out
    /// as one 32-bit store: they share a 16-byte chunk, which the swizzle moves whole.
    pub(super) fn store_slots(
        l: AccLayout,
        n: usize,
        atoms: u32,
        per: u32,
        buffers: u32,
        at: u32,
        buffer_bytes: u32,
    ) -> Vec<StoreSlot> {
        let mut out = Vec::new();
        let mut s = 0;
        while s < n {
            let o = l.offset(s as u32);
            let pair = s + 1 < n && l.offset(s as u32 + 1) == [o[0], o[1] + 1];
            let round = o[1] / (per * 64);
            if round < atoms / per {
                let buffer = at + (round % buffers) * buffer_bytes;
                out.push(StoreSlot { slot: s, pair, round, lo: round * per * 64, buffer });
            }
            s += if pair { 2 } else { 1 };
        }
        out
    }

    /// Classes of the stores whose swizzled offsets differ by a constant for every thread: the
    /// 128-byte swizzle XORs a row's 16-byte chunk index with `row % 8`, so stores with the same
    /// row offset modulo 8 and the same chunk within their atom move together. Returns each
    /// store's (class, offset minus its class's first store's offset), checked at compile time
    /// for every thread of the layout; `None` where that does not hold (the offsets are then
    /// computed store by store). Each class's offset is computed once, each store adds a constant.
    fn class_deltas(&self, l: AccLayout, sl: StageLayout, slots: &[StoreSlot]) -> Option<Vec<(usize, i64)>> {
        let threads = l.warps_m * l.warps_n * self.target.warp_size;
        let at = |t: u32, st: StoreSlot| {
            let e = l.element(t, st.slot as u32, self.target.warp_size);
            (sl.offset_of(0, e[0], e[1] - st.lo, 2) + st.buffer) as i64
        };
        let mut first: HashMap<(u32, u32), usize> = HashMap::default();
        let mut out = Vec::with_capacity(slots.len());
        for (i, &st) in slots.iter().enumerate() {
            let o = l.offset(st.slot as u32);
            let key = (o[0] % 8, ((o[1] - st.lo) % 64) / 8);
            let c = *first.entry(key).or_insert(i);
            let d = at(0, st) - at(0, slots[c]);
            if (1..threads).any(|t| at(t, st) - at(t, slots[c]) != d) {
                return None;
            }
            out.push((c, d));
        }
        Some(out)
    }
}

/// One shared store of a TMA store's staging: accumulator slot `slot` (and the next, when
/// `pair`), in round `round`, whose first column is `lo`, into the buffer at shared byte
/// `buffer`.
#[derive(Clone, Copy, Debug)]
pub(super) struct StoreSlot {
    pub(super) slot: usize,
    pub(super) pair: bool,
    pub(super) round: u32,
    pub(super) lo: u32,
    pub(super) buffer: u32,
}
