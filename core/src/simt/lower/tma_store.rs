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
        let bytes = l.m * l.n * 2;
        if self.smem.place(bytes, 1024) + bytes > self.target.shared_bytes {
            return false;
        }
        let Some(map) = self.tensor_map(desc, l.m, 64, 128) else { return false };
        let (row0, col0) = (self.held(offsets[0])[0], self.held(offsets[1])[0]);
        // Whoever read these bytes before is done.
        self.emit(Inst::Barrier);
        let at = self.shared_alloc("tma.store", bytes, 1024);
        let base = self.iconst(at as i64);
        let sl = StageLayout::Swizzled { m: l.m, kk: 64, sa: 128, sb: 128, b_off: 0 };
        for (s, &r) in regs.iter().enumerate() {
            let [row, col] = self.mma_coords(l, s as u32);
            let off = self.stage_offset_here(sl, 0, row, col, 2);
            let off = self.bin(BinaryOp::Add, off, base);
            self.emit(Inst::SharedStore { offset: off, value: r, pred: None });
        }
        self.emit(Inst::FenceProxyAsync);
        self.emit(Inst::Barrier);
        let leader = self.first_thread();
        for atom in 0..l.n / 64 {
            let col = self.bin_c(BinaryOp::Add, col0, (atom * 64) as i64);
            let offset = self.iconst((at + atom * l.m * 128) as i64);
            self.emit(Inst::TmaStore { map, offset, coords: [row0, col], pred: leader });
        }
        self.emit(Inst::BulkCommit);
        self.emit(Inst::BulkWait);
        self.emit(Inst::Barrier);
        self.shared_free(at);
        true
    }
}
