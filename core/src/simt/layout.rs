//! Blocked layouts: which thread of a program holds which elements of a tile.
//!
//! A [`Blocked`] layout of a tile (Triton's blocked encoding) is given per dimension by the
//! elements each thread holds contiguously (`size_per_thread`), the lanes of a warp
//! (`threads_per_warp`) and the warps of a program (`warps_per_program`) along it, and an
//! `order` (dimensions from fastest- to slowest-varying) that numbers lanes and warps. One
//! *program tile* covers `size_per_thread * threads_per_warp * warps_per_program` elements per
//! dimension; a larger tile repeats it (each thread then holds several repetitions), a smaller one
//! wraps (threads beyond the tile hold replicas).
//!
//! A thread's elements are its *slots*, numbered with the fastest dimension innermost, so the
//! `size_per_thread` elements contiguous along it are consecutive slots: a vector access. The
//! coordinate of slot `s` in thread `t` along dimension `d` is `position(t)[d] + offset(s)[d]`,
//! where the first part depends only on the thread and the second only on the slot; the SIMT
//! lowering computes the thread part once per kernel and adds constants.

use crate::target::MatrixAtom;

/// Widest contiguous run per thread (elements); 4 x 32-bit = one 16-byte access.
pub const MAX_VECTOR: u32 = 4;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Blocked {
    pub shape: Vec<u32>,
    pub size_per_thread: Vec<u32>,
    pub threads_per_warp: Vec<u32>,
    pub warps_per_program: Vec<u32>,
    /// Dimensions from fastest- to slowest-varying.
    pub order: Vec<usize>,
}

impl Blocked {
    /// The default layout of a tile of `shape` (powers of two) for `warps` warps of `warp_size`
    /// lanes: up to [`MAX_VECTOR`] contiguous elements per thread along the last dimension (fewer
    /// when the tile has fewer elements than that per thread), lanes
    /// then warps filling the dimensions from the fastest, and what is left over replicating along
    /// the slowest.
    pub fn default_for(shape: &[u32], warps: u32, warp_size: u32) -> Blocked {
        Blocked::with_vector(shape, warps, warp_size, MAX_VECTOR)
    }

    /// The default layout with up to `vector` contiguous elements per thread (a power of two):
    /// copies that never live in registers (global to shared memory) take as many elements as
    /// the target's widest access holds, e.g. 8 bf16 for 16 bytes.
    pub fn with_vector(shape: &[u32], warps: u32, warp_size: u32, vector: u32) -> Blocked {
        let rank = shape.len();
        let order: Vec<usize> = (0..rank).rev().collect();
        let mut spt = vec![1; rank];
        let mut tpw = vec![1; rank];
        let mut wpp = vec![1; rank];
        if rank == 0 {
            return Blocked {
                shape: vec![],
                size_per_thread: spt,
                threads_per_warp: tpw,
                warps_per_program: wpp,
                order,
            };
        }
        // Wide enough for vector accesses, narrow enough that the program's threads are not
        // spent on replicas when the tile is small.
        let per_thread = (shape.iter().product::<u32>() / (warps * warp_size)).max(1);
        spt[rank - 1] = shape[rank - 1].min(per_thread).clamp(1, vector.max(1));
        let mut lanes = warp_size;
        for &d in &order {
            let t = lanes.min((shape[d] / spt[d]).max(1));
            tpw[d] = t;
            lanes /= t;
        }
        tpw[order[rank - 1]] *= lanes;
        let mut left = warps;
        for &d in &order {
            let w = left.min((shape[d] / (spt[d] * tpw[d])).max(1));
            wpp[d] = w;
            left /= w;
        }
        wpp[order[rank - 1]] *= left;
        Blocked { shape: shape.to_vec(), size_per_thread: spt, threads_per_warp: tpw, warps_per_program: wpp, order }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Elements one program tile covers along `d`.
    pub fn program_tile(&self, d: usize) -> u32 {
        self.size_per_thread[d] * self.threads_per_warp[d] * self.warps_per_program[d]
    }

    /// Repetitions of the program tile along `d` (1 when the tile wraps).
    pub fn reps(&self, d: usize) -> u32 {
        (self.shape[d] / self.program_tile(d)).max(1)
    }

    /// Elements a thread holds along `d`.
    pub fn per_thread(&self, d: usize) -> u32 {
        self.size_per_thread[d] * self.reps(d)
    }

    /// Slots (registers) per thread.
    pub fn slots(&self) -> u32 {
        (0..self.rank()).map(|d| self.per_thread(d)).product()
    }

    /// Elements contiguous in consecutive slots along the fastest dimension (a vector access).
    pub fn vector(&self) -> u32 {
        self.order.first().map_or(1, |&d| self.size_per_thread[d])
    }

    /// Per-dimension index of slot `s` in the thread's `[per_thread(d)]` grid (fastest innermost).
    fn slot_index(&self, mut s: u32) -> Vec<u32> {
        let mut idx = vec![0; self.rank()];
        for &d in &self.order {
            idx[d] = s % self.per_thread(d);
            s /= self.per_thread(d);
        }
        idx
    }

    /// The slot with per-dimension indices `idx`.
    pub fn slot_of(&self, idx: &[u32]) -> u32 {
        let mut s = 0;
        for &d in self.order.iter().rev() {
            s = s * self.per_thread(d) + idx[d];
        }
        s
    }

    /// The thread-independent part of slot `s`'s coordinates.
    pub fn offset(&self, s: u32) -> Vec<u32> {
        self.slot_index(s)
            .iter()
            .enumerate()
            .map(|(d, &i)| (i / self.size_per_thread[d]) * self.program_tile(d) + i % self.size_per_thread[d])
            .collect()
    }

    /// Per-dimension lane and warp indices of a thread.
    pub fn thread_coords(&self, thread: u32, warp_size: u32) -> (Vec<u32>, Vec<u32>) {
        let (mut lane, mut warp) = (thread % warp_size, thread / warp_size);
        let mut l = vec![0; self.rank()];
        let mut w = vec![0; self.rank()];
        for &d in &self.order {
            l[d] = lane % self.threads_per_warp[d];
            lane /= self.threads_per_warp[d];
            w[d] = warp % self.warps_per_program[d];
            warp /= self.warps_per_program[d];
        }
        (l, w)
    }

    /// The thread-dependent part of the coordinates: `(warp * threads_per_warp + lane) *
    /// size_per_thread`, wrapped into the tile.
    pub fn position(&self, thread: u32, warp_size: u32) -> Vec<u32> {
        let (l, w) = self.thread_coords(thread, warp_size);
        (0..self.rank())
            .map(|d| ((w[d] * self.threads_per_warp[d] + l[d]) * self.size_per_thread[d]) % self.shape[d])
            .collect()
    }

    /// Coordinates of slot `s` of `thread`.
    pub fn element(&self, thread: u32, s: u32, warp_size: u32) -> Vec<u32> {
        let p = self.position(thread, warp_size);
        self.offset(s).iter().zip(p).map(|(o, p)| o + p).collect()
    }

    /// Lane-index strides of dimension `d`: a butterfly over lane bits `stride * 2^i` for
    /// `2^i < threads_per_warp[d]` combines the lanes that differ only along `d`.
    pub fn lane_stride(&self, d: usize) -> u32 {
        self.order.iter().take_while(|&&e| e != d).map(|&e| self.threads_per_warp[e]).product()
    }

    /// Warp-index stride of dimension `d`.
    pub fn warp_stride(&self, d: usize) -> u32 {
        self.order.iter().take_while(|&&e| e != d).map(|&e| self.warps_per_program[e]).product()
    }
}

/// The accumulator layout of a `dot` on a matrix atom (`crate::target::MatrixAtom`): the
/// `[M, N]` tile is split over `warps_m x warps_n` warps (warp `w` takes block row `w % warps_m`
/// and block column `w / warps_m`), each warp's block into `atom.m x atom.n` instruction tiles,
/// and each instruction tile over the lanes by the atom's accumulator map. Slot
/// `((i * tiles_n) + j) * c_elems + r` is register `r` of instruction tile `(i, j)` of the warp.
///
/// With `interleave_m` a warp's instruction tiles along M are not one block: its tile `i` lies
/// at rows `(i * warps_m + w % warps_m) * atom.m`, so the warps together cover one band of
/// `warps_m * atom.m` rows per `i`. That is where `wgmma` puts them when a warpgroup issues one
/// instruction per 64-row band (a 128-row tile on one warpgroup, 256 rows on two).
///
/// An atom's map is a lane part plus a register part (`crate::target::LaneMap`), so a slot's
/// coordinates are, as for blocked layouts, a per-thread position plus constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AccLayout {
    pub atom: &'static MatrixAtom,
    pub m: u32,
    pub n: u32,
    pub warps_m: u32,
    pub warps_n: u32,
    pub interleave_m: bool,
}

impl AccLayout {
    /// The split of `warps` warps over an `m x n` output, if the tile fits whole instruction
    /// tiles: of the splits that do, the one with the fewest fragment elements loaded per
    /// instruction (`a_elems tiles_m + b_elems tiles_n` for `tiles_m x tiles_n` of them), more
    /// warps along M on ties.
    pub fn new(atom: &'static MatrixAtom, m: u32, n: u32, warps: u32) -> Option<AccLayout> {
        let mut best: Option<(u64, AccLayout)> = None;
        let mut wm = 1;
        while wm <= warps {
            let wn = warps / wm;
            if m.is_multiple_of(atom.m * wm) && n.is_multiple_of(atom.n * wn) {
                let l = AccLayout { atom, m, n, warps_m: wm, warps_n: wn, interleave_m: false };
                let (ti, tj) = l.tiles();
                // Loads per instruction, scaled to stay an integer.
                let cost = (atom.a_elems as u64 * ti as u64 + atom.b_elems as u64 * tj as u64) * 1_000_000
                    / (ti as u64 * tj as u64);
                if best.is_none_or(|(c, _)| cost <= c) {
                    best = Some((cost, l));
                }
            }
            wm *= 2;
        }
        best.map(|(_, l)| l)
    }

    /// Instruction tiles per warp along M and N.
    pub fn tiles(&self) -> (u32, u32) {
        (self.m / self.warps_m / self.atom.m, self.n / self.warps_n / self.atom.n)
    }

    pub fn slots(&self) -> u32 {
        let (ti, tj) = self.tiles();
        ti * tj * self.atom.c_elems
    }

    /// The first row of a warp's instruction tile `i` relative to its origin
    /// ([`AccLayout::warp_row`]).
    pub fn tile_row(&self, i: u32) -> u32 {
        i * self.atom.m * if self.interleave_m { self.warps_m } else { 1 }
    }

    /// The first row of block row `wm`'s first instruction tile.
    pub fn warp_row(&self, wm: u32) -> u32 {
        wm * if self.interleave_m { self.atom.m } else { self.m / self.warps_m }
    }

    /// The thread-independent part of slot `s`'s (row, column).
    pub fn offset(&self, s: u32) -> [u32; 2] {
        let (_, tj) = self.tiles();
        let (tile, r) = (s / self.atom.c_elems, s % self.atom.c_elems);
        let (i, j) = (tile / tj, tile % tj);
        let (rr, cr) = (self.atom.c.elem)(r);
        [self.tile_row(i) + rr, j * self.atom.n + cr]
    }

    /// The thread-dependent part: the warp's block origin plus the lane's part of the map.
    pub fn position(&self, thread: u32, warp_size: u32) -> [u32; 2] {
        let (lane, warp) = (thread % warp_size, thread / warp_size);
        let (wm, wn) = (warp % self.warps_m, warp / self.warps_m);
        let (r, c) = self.atom.c.eval(lane % self.atom.lanes, 0);
        let (r0, c0) = (self.atom.c.elem)(0);
        [self.warp_row(wm) + r - r0, wn * (self.n / self.warps_n) + c - c0]
    }

    pub fn element(&self, thread: u32, s: u32, warp_size: u32) -> [u32; 2] {
        let (p, o) = (self.position(thread, warp_size), self.offset(s));
        [p[0] + o[0], p[1] + o[1]]
    }

    /// Whether slots `2 p` and `2 p + 1` hold neighbouring columns of one row (a pair the
    /// epilogue can store as one vector).
    pub fn column_pairs(&self) -> bool {
        (0..self.atom.c_elems / 2).all(|p| {
            let (a, b) = ((self.atom.c.elem)(2 * p), (self.atom.c.elem)(2 * p + 1));
            a.0 == b.0 && b.1 == a.1 + 1
        })
    }
}

/// Row-major index of `coords` in `shape`.
pub fn row_major(coords: &[u32], shape: &[u32]) -> u64 {
    coords.iter().zip(shape).fold(0u64, |acc, (&c, &d)| acc * d as u64 + c as u64)
}

/// True when every thread's slots hold the same row-major elements under both layouts (a reshape
/// between them moves no data).
pub fn same_elements(a: &Blocked, b: &Blocked, threads: u32, warp_size: u32) -> bool {
    a.slots() == b.slots()
        && (0..threads).all(|t| {
            (0..a.slots()).all(|s| {
                row_major(&a.element(t, s, warp_size), &a.shape) == row_major(&b.element(t, s, warp_size), &b.shape)
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Every element of the tile is held, each by the same number of threads.
    fn check_cover(l: &Blocked, warps: u32, ws: u32) {
        let n: u32 = l.shape.iter().product();
        let mut seen: HashMap<u64, u32> = HashMap::new();
        for t in 0..warps * ws {
            for s in 0..l.slots() {
                let e = l.element(t, s, ws);
                assert!(e.iter().zip(&l.shape).all(|(c, d)| c < d), "{l:?}: thread {t} slot {s} -> {e:?}");
                *seen.entry(row_major(&e, &l.shape)).or_default() += 1;
            }
        }
        assert_eq!(seen.len() as u32, n, "{l:?} misses elements");
        let copies: Vec<u32> = seen.values().copied().collect();
        assert!(copies.iter().all(|&c| c == copies[0]), "{l:?}: uneven replication");
    }

    #[test]
    fn default_layouts_cover_every_element() {
        for ws in [32, 64] {
            for warps in [1, 4, 8] {
                for shape in [
                    vec![1],
                    vec![8],
                    vec![256],
                    vec![4096],
                    vec![64, 64],
                    vec![128, 32],
                    vec![1, 64],
                    vec![64, 1],
                    vec![2, 2],
                    vec![16, 256],
                    vec![4, 4, 8],
                ] {
                    check_cover(&Blocked::default_for(&shape, warps, ws), warps, ws);
                }
            }
        }
    }

    #[test]
    fn gemm_tile_layout() {
        let l = Blocked::default_for(&[64, 64], 4, 32);
        assert_eq!(l.size_per_thread, [1, 4]);
        assert_eq!(l.threads_per_warp, [2, 16]);
        assert_eq!(l.warps_per_program, [4, 1]);
        assert_eq!(l.slots(), 32);
        assert_eq!(l.vector(), 4);
        // Consecutive slots are consecutive columns.
        assert_eq!(l.element(0, 0, 32), [0, 0]);
        assert_eq!(l.element(0, 3, 32), [0, 3]);
        assert_eq!(l.element(1, 0, 32), [0, 4]);
        assert_eq!(l.element(16, 0, 32), [1, 0]);
        assert_eq!(l.element(32, 0, 32), [2, 0]);
        assert_eq!(l.lane_stride(1), 1);
        assert_eq!(l.lane_stride(0), 16);
    }

    /// `wgmma`'s placement: on one warpgroup a 128-row tile is two 64-row bands, warp `w`
    /// holding rows `16 w .. 16 w + 16` of each; the slots of band `i` are one instruction's
    /// registers, in order.
    #[test]
    fn interleaved_rows_are_wgmma_bands() {
        let mma = &crate::target::MMA_SYNC_M16N8K16;
        let l = AccLayout { atom: mma, m: 128, n: 64, warps_m: 4, warps_n: 1, interleave_m: true };
        let per_band = l.slots() / 2;
        for t in 0..128 {
            for s in 0..l.slots() {
                let e = l.element(t, s, 32);
                let band = s / per_band;
                assert_eq!(e[0] / 64, band, "thread {t} slot {s}");
                assert_eq!((e[0] % 64) / 16, t / 32, "thread {t} slot {s}");
            }
        }
    }

    #[test]
    fn accumulator_layouts_cover_every_element_once() {
        use crate::target::{MFMA_16X16X16, MFMA_32X32X8, MMA_SYNC_M16N8K16};
        for (atom, ws) in [(&MMA_SYNC_M16N8K16, 32), (&MFMA_32X32X8, 64), (&MFMA_16X16X16, 64)] {
            for (m, n, warps) in [(64, 64, 4), (32, 32, 4), (128, 64, 8), (32, 32, 1), (64, 128, 8)] {
                let Some(l) = AccLayout::new(atom, m, n, warps) else { continue };
                for l in [l, AccLayout { interleave_m: true, ..l }] {
                    let mut seen = std::collections::HashSet::new();
                    for t in 0..warps * ws {
                        for s in 0..l.slots() {
                            let e = l.element(t, s, ws);
                            assert!(e[0] < m && e[1] < n);
                            assert!(seen.insert(e), "{l:?}: {e:?} twice");
                        }
                    }
                    assert_eq!(seen.len() as u32, m * n, "{l:?}");
                }
            }
        }
        let mma = &MMA_SYNC_M16N8K16;
        assert_eq!(
            AccLayout::new(mma, 64, 64, 4),
            Some(AccLayout { atom: mma, m: 64, n: 64, warps_m: 2, warps_n: 2, interleave_m: false })
        );
        assert_eq!(
            AccLayout::new(mma, 128, 128, 8),
            Some(AccLayout { atom: mma, m: 128, n: 128, warps_m: 4, warps_n: 2, interleave_m: false })
        );
        assert!(AccLayout::new(mma, 8, 8, 4).is_none());
        assert!(AccLayout::new(mma, 64, 64, 4).unwrap().column_pairs());
        assert!(!AccLayout::new(&MFMA_32X32X8, 64, 64, 4).unwrap().column_pairs());
    }

    #[test]
    fn reshape_equivalence() {
        let a = Blocked::default_for(&[256], 4, 32);
        let b = Blocked::default_for(&[1, 256], 4, 32);
        assert!(same_elements(&a, &b, 128, 32));
        let c = Blocked::default_for(&[256, 1], 4, 32);
        assert!(!same_elements(&a, &c, 128, 32));
    }
}
