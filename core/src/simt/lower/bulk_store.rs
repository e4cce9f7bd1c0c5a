//! `desc_store` of an accumulator tile through a descriptor that has no tensor map (its base
//! or extents computed in the kernel, as a grouped GEMM's per-expert C) as bulk row copies
//! (sm_90): every thread writes its elements into a shared copy of the block with padded rows,
//! the copy is made visible to the asynchronous proxy, and each row inside the tensor goes out
//! as one `cp.async.bulk.global.shared::cta` of its columns inside the tensor. The rows past
//! the descriptor's extent (the next expert's) are simply not copied, which a TMA store of a
//! tensor map made on the host cannot do; like a TMA store the copies are asynchronous, so the
//! epilogue ends at its shared stores instead of at its global ones.
//!
//! Rows of the staging copy are `cols x 2 + 16` bytes apart: a warp's 32-bit stores in the
//! accumulator layout (8 rows x 4 threads) then fall in 32 different banks, and each row
//! starts 16-byte aligned, as the bulk copy needs.

use super::tma_store::StoreSlot;
use super::*;

impl Lowering<'_> {
    /// Lowers `desc_store(desc, offsets, value)` as bulk row copies when the target has them,
    /// the value is held in an accumulator layout of 16-bit elements in whole 64-column atoms,
    /// and the descriptor's facts make every row's copy 16-byte aligned and a multiple of 16
    /// bytes (base 16-byte aligned, row stride, column extent and column offset multiples of
    /// 8 elements, unit column stride); returns whether it did.
    pub(super) fn bulk_row_store(&mut self, desc: Value, offsets: [Value; 2], value: Value) -> bool {
        let Some((l, regs)) = self.stageable_tile(value) else { return false };
        let ValueDef::Result { op, .. } = self.func.values[desc].def else { return false };
        let OpKind::MakeDesc { ptr, shape, strides } = self.func.ops[op].kind else { return false };
        let unit = matches!(self.func.constant(strides[1]), Some(Literal::Int(1)));
        let size = 2u64;
        let div = |me: &Self, v: Value| me.contiguity.get(v).divisibility as u64;
        let aligned = div(self, ptr) >= 16
            && div(self, strides[0]) * size >= 16
            && div(self, shape[1]) * size >= 16
            && div(self, offsets[1]) * size >= 16;
        if !unit || !aligned {
            return false;
        }
        // The staging copy: the whole block, or (when that does not fit beside what is live,
        // as a persistent kernel's stage ring) a part of its 64-column atoms at a time, in
        // two buffers used in turn (a round's shared stores then overlap the bulk reads of the
        // round before) or one.
        let atoms = l.n / 64;
        let groups = self.group_copies();
        let pitch = |per: u32| per * 128 + 16;
        let fits = |me: &mut Self, per: u32, buffers: u32| {
            let bytes = groups * buffers * l.m * pitch(per);
            me.smem.place(bytes, 128, true) + bytes <= me.target.shared_bytes
        };
        // Whole; else two buffers of the largest part that fits; else one (a round then waits
        // for the bulk read of the round before). A round takes the accumulator slots of its
        // columns: static only when the warps do not split the columns.
        let parts: Vec<u32> = match l.warps_n {
            1 => std::iter::successors(Some(atoms / 2), |p| Some(p / 2)).take_while(|&p| p >= 1).collect(),
            _ => Vec::new(),
        };
        let candidates =
            std::iter::once((atoms, 1)).chain(parts.iter().map(|&p| (p, 2))).chain(parts.iter().map(|&p| (p, 1)));
        let choice = candidates.into_iter().find(|&(per, buffers)| fits(self, per, buffers));
        let Some((per, buffers)) = choice else { return false };
        let row_bytes = pitch(per);
        let buffer_bytes = l.m * row_bytes;
        let at = self.shared_alloc_pinned("bulk.store", buffers * buffer_bytes, 128);
        let in_group = |me: &mut Self, off: Reg| match me.group_offset(at) {
            Some(b) => me.bin(BinaryOp::Add, off, b),
            None => off,
        };
        let slots = Self::store_slots(l, regs.len(), atoms, per, buffers, at, buffer_bytes);
        // Every slot's offset is the thread's (its position's) plus a constant: the layout's
        // elements are its position plus the slot's offset.
        let p = self.mma_coords(l, 0);
        let o0 = l.offset(0);
        let r_off = self.bin_c(BinaryOp::Mul, p[0], row_bytes as i64);
        let c_off = self.bin_c(BinaryOp::Mul, p[1], size as i64);
        let base = self.bin(BinaryOp::Add, r_off, c_off);
        let base = in_group(self, base);
        let delta = |s: &StoreSlot| {
            let o = l.offset(s.slot as u32);
            (o[0] as i64 - o0[0] as i64) * row_bytes as i64
                + (o[1] as i64 - o0[1] as i64 - s.lo as i64) * size as i64
                + s.buffer as i64
        };

        // The rows a thread copies: `local`, `local + threads`, ...
        let threads = l.warps_m * l.warps_n * self.target.warp_size;
        let local = self.group_thread();
        let i64t = SType::Int { bits: 64, signed: true };
        let dst_base = self.held(ptr)[0];
        let (rows, cols) = (self.held(shape[0])[0], self.held(shape[1])[0]);
        let stride = self.held(strides[0])[0];
        let stride = self.cast(stride, i64t);
        let (row0, col0) = (self.held(offsets[0])[0], self.held(offsets[1])[0]);
        let zero = self.iconst(0);
        for round in 0..atoms / per {
            self.stage_round(&regs, &slots, (round, buffers - 1), &mut |me, _, s| {
                me.bin_c(BinaryOp::Add, base, delta(s))
            });
            // This round's columns inside the tensor: their bytes (0 past its edge).
            let col = self.bin_c(BinaryOp::Add, col0, (round * per * 64) as i64);
            let left = self.bin(BinaryOp::Sub, cols, col);
            let width = self.bin_c(BinaryOp::Min, left, (per * 64) as i64);
            let bytes = self.bin_c(BinaryOp::Mul, width, size as i64);
            let some = self.reg(SType::Pred);
            self.emit(Inst::Cmp { dst: some, op: CmpOp::Gt, a: left, b: zero });
            let col64 = self.cast(col, i64t);
            let buffer = at + (round % buffers) * buffer_bytes;
            for j in 0..l.m.div_ceil(threads) {
                let i = if j == 0 { local } else { self.bin_c(BinaryOp::Add, local, (j * threads) as i64) };
                let row = self.bin(BinaryOp::Add, row0, i);
                let mut pred = some;
                for (op, a, b) in [(CmpOp::Ge, row, zero), (CmpOp::Lt, row, rows)] {
                    let c = self.reg(SType::Pred);
                    self.emit(Inst::Cmp { dst: c, op, a, b });
                    pred = self.bin(BinaryOp::And, pred, c);
                }
                if threads * (j + 1) > l.m {
                    let m = self.iconst(l.m as i64);
                    let c = self.reg(SType::Pred);
                    self.emit(Inst::Cmp { dst: c, op: CmpOp::Lt, a: i, b: m });
                    pred = self.bin(BinaryOp::And, pred, c);
                }
                let row64 = self.cast(row, i64t);
                let e = self.bin(BinaryOp::Mul, row64, stride);
                let e = self.bin(BinaryOp::Add, e, col64);
                let addr = self.reg(SType::Ptr);
                self.emit(Inst::AddrOffset { dst: addr, base: dst_base, offset: e, scale: size as u32 });
                let src = self.bin_c(BinaryOp::Mul, i, row_bytes as i64);
                let src = self.bin_c(BinaryOp::Add, src, buffer as i64);
                let src = in_group(self, src);
                self.emit(Inst::BulkStore { addr, offset: src, bytes, pred });
            }
            self.emit(Inst::BulkCommit);
        }
        self.bulk_pending = true;
        true
    }
}
