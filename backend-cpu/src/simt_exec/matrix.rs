//! Executing the matrix units and the asynchronous proxy: `ldmatrix`/`mma` and MFMA by their lane
//! maps, `wgmma` from shared-memory descriptors, mbarriers (phases, expected bytes), TMA loads
//! and stores, bulk groups.

use super::*;

impl Exec<'_> {
    pub(super) fn matrix(&mut self, inst: &Inst) -> Result<(), Fault> {
        let (k, lanes) = (self.k, self.lanes);
        match inst {
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
                // K is 32 bytes of the operands' type.
                let size = ab.size_bytes();
                let ks = 32 / size;
                let value = |bits: u64| match ab {
                    DType::BF16 => half::bf16::from_bits(bits as u16).to_f32() as f64,
                    DType::F16 => half::f16::from_bits(bits as u16).to_f32() as f64,
                    d => d.fp8().map_or(f64::NAN, |f| f.decode(bits as u8)),
                };
                if !matches!(ab, DType::BF16 | DType::F16 | DType::F8E4M3FN | DType::F8E5M2) || (size == 1 && *trans_b)
                {
                    return contract(format!("wgmma on `{ab}`{}", if *trans_b { " with B N-major" } else { "" }));
                }
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
                        "wgmma m64n{n}k{ks} on {lanes} threads with {} accumulator registers",
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
                    let kn = ks as usize;
                    let mut ma = vec![0f64; 64 * kn];
                    let mut mb = vec![0f64; kn * n];
                    for row in 0..64u32 {
                        for kk in 0..ks {
                            let Some(at) = element_address(&da, false, row, kk, size) else {
                                return contract("wgmma operand A without a swizzled layout");
                            };
                            ma[row as usize * kn + kk as usize] =
                                value(self.shared_get(first, at as usize, size as usize)?);
                        }
                    }
                    for kk in 0..ks {
                        for col in 0..n as u32 {
                            let Some(at) = element_address(&db, *trans_b, col, kk, size) else {
                                return contract("wgmma operand B without a swizzled layout");
                            };
                            mb[kk as usize * n + col as usize] =
                                value(self.shared_get(first, at as usize, size as usize)?);
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
                            let dot: f64 = (0..kn).map(|kk| ma[row * kn + kk] * mb[kk * n + col]).sum();
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
            Inst::BulkCommit => self.bulk.commit(),
            Inst::BulkWait { pending, .. } => {
                let done = self.bulk.wait(*pending);
                self.complete_bulk_stores(done)?;
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
                    self.bulk.issue(PendingBulkStore::Tensor {
                        lane: i,
                        map: m,
                        src,
                        row: r.ints()[i],
                        col: c.ints()[i],
                    });
                }
            }
            Inst::BulkStore { addr, offset, bytes, pred } => {
                let (a, o, n, p) = (self.get(*addr)?, self.get(*offset)?, self.get(*bytes)?, self.get(*pred)?);
                for i in (0..lanes).filter(|&i| p.ints()[i] != 0) {
                    let (src, dst, bytes) = (o.ints()[i] as usize, a.ptrs()[i], n.ints()[i]);
                    if !src.is_multiple_of(16) || !dst.is_multiple_of(16) || bytes < 0 || bytes % 16 != 0 {
                        return fault(format!(
                            "bulk store of {bytes} bytes from shared byte {src} to {dst:#x}: addresses must be \
                             16-byte aligned and the size a multiple of 16"
                        ));
                    }
                    // Read when its group is waited for, as a TMA store's box.
                    self.bulk.issue(PendingBulkStore::Linear { lane: i, src, dst, bytes: bytes as usize });
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
            _ => return fault(format!("`{inst:?}` is not a matrix instruction")),
        }
        Ok(())
    }

    /// Reads the shared memory of `stores` (TMA boxes, rows) and writes it to global memory.
    pub(super) fn complete_bulk_stores(&mut self, stores: Vec<PendingBulkStore>) -> Result<(), Fault> {
        let view = self.mem.view();
        for s in stores {
            match s {
                PendingBulkStore::Tensor { lane, map, src, row, col } => {
                    let es = map.elem_bytes as usize;
                    for (at, global) in map.box_elements(src, row, col) {
                        let Some(g) = global else { continue };
                        let x = self.shared_get(lane, at, es)?;
                        self.view.store(&view, g, es, x, lane).or_else(|e| fault(format!("TMA store: {}", e.0)))?;
                    }
                }
                PendingBulkStore::Linear { lane, src, dst, bytes } => {
                    for j in (0..bytes).step_by(8) {
                        let x = self.shared_get(lane, src + j, 8)?;
                        self.view
                            .store(&view, dst + j as u64, 8, x, lane)
                            .or_else(|e| fault(format!("bulk store: {}", e.0)))?;
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn mbarrier(&mut self, at: usize) -> Result<&mut Mbarrier, Fault> {
        match self.mbarriers.get_mut(&at) {
            Some(m) => Ok(m),
            None => fault(format!("no mbarrier initialized at shared byte {at}")),
        }
    }

    /// The shared offsets in `offset` of the lanes whose `pred` holds.
    pub(super) fn active_offsets(&self, offset: Reg, pred: Reg) -> Result<Vec<usize>, Fault> {
        let (o, p) = (self.get(offset)?, self.get(pred)?);
        Ok((0..self.lanes).filter(|&i| p.ints()[i] != 0).map(|i| o.ints()[i] as usize).collect())
    }
}
