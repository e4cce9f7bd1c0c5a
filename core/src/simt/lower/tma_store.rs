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
        if !self.target.has_async_copy(AsyncCopy::Tma) {
            return false;
        }
        let Some((l, regs)) = self.mma_held.get(&value).cloned() else { return false };
        let t = stype(self.func.ty(value));
        if !matches!(t, SType::BF16 | SType::F16) || !l.n.is_multiple_of(64) || l.m > 256 {
            return false;
        }
        // The staging copy: the whole block, or (when that does not fit beside what is live,
        // as a persistent kernel's stage ring) a part of its 64-column atoms at a time, stored
        // round by round. A round takes the accumulator slots of its columns, which is static
        // when the warps do not split the columns.
        let atom_bytes = l.m * 128;
        let atoms = l.n / 64;
        let fits =
            |me: &mut Self, k: u32| me.smem.place(k * atom_bytes, 1024) + k * atom_bytes <= me.target.shared_bytes;
        let mut per = atoms;
        while per > 1 && (!fits(self, per) || !atoms.is_multiple_of(per)) && l.warps_n == 1 {
            per /= 2;
        }
        if !fits(self, per) || !atoms.is_multiple_of(per) {
            return false;
        }
        let Some(map) = self.tensor_map(desc, l.m, 64, 128) else { return false };
        let (row0, col0) = (self.held(offsets[0])[0], self.held(offsets[1])[0]);
        // The staging copy stays allocated to the program's end: the last round's bulk read is
        // waited for by the next store (this one again, in a loop) or at the end, so the
        // epilogue does not wait for it and nothing else may take the bytes meanwhile.
        let at = self.shared_alloc("tma.store", per * atom_bytes, 1024);
        self.emit(Inst::BulkWait);
        let base = self.iconst(at as i64);
        let sl = StageLayout::Swizzled { m: l.m, kk: 64, sa: 128, sb: 128, b_off: 0 };
        let leader = self.first_thread();
        for round in 0..atoms / per {
            let (lo, hi) = (round * per * 64, (round + 1) * per * 64);
            // Whoever read these bytes before (an earlier op, the last round's bulk copy) is done.
            self.emit(Inst::Barrier);
            let mut s = 0;
            while s < regs.len() {
                let o = l.offset(s as u32);
                // A thread's two neighbouring columns (as the accumulator layouts pair them, from
                // an even column) go out as one 32-bit store: they share a 16-byte chunk, which
                // the swizzle moves whole.
                let pair = s + 1 < regs.len() && l.offset(s as u32 + 1) == [o[0], o[1] + 1];
                let step = if pair { 2 } else { 1 };
                if per < atoms && !(lo..hi).contains(&o[1]) {
                    s += step;
                    continue;
                }
                let [row, col] = self.mma_coords(l, s as u32);
                let col = if lo > 0 { self.bin_c(BinaryOp::Sub, col, lo as i64) } else { col };
                let off = self.stage_offset_here(sl, 0, row, col, 2);
                let off = self.bin(BinaryOp::Add, off, base);
                let value = if pair {
                    let d = self.reg(SType::Int { bits: 32, signed: true });
                    self.emit(Inst::Pack { dst: d, lo: regs[s], hi: regs[s + 1] });
                    d
                } else {
                    regs[s]
                };
                self.emit(Inst::SharedStore { offset: off, value, pred: None });
                s += step;
            }
            self.emit(Inst::FenceProxyAsync);
            self.emit(Inst::Barrier);
            for atom in 0..per {
                let col = self.bin_c(BinaryOp::Add, col0, (lo + atom * 64) as i64);
                let offset = self.iconst((at + atom * atom_bytes) as i64);
                self.emit(Inst::TmaStore { map, offset, coords: [row0, col], pred: leader });
            }
            self.emit(Inst::BulkCommit);
            if round + 1 < atoms / per {
                self.emit(Inst::BulkWait);
            }
        }
        self.bulk_pending = true;
        true
    }
}
