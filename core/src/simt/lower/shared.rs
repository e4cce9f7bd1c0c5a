//! Shared memory as allocated objects: every op that stages data through shared memory asks
//! for a named object of some size and alignment, uses it, and frees it after its last access
//! (in program order). Offsets are assigned first-fit among the objects live at that point, so
//! objects whose lifetimes do not overlap reuse the same bytes (a layout conversion after a
//! GEMM takes the GEMM's stages) and objects that are live together (a scalar atomic's result
//! inside a pipelined K loop) never overlap. Reuse is safe because every user starts with a
//! reuse barrier (the last readers of the bytes' previous object are done); cpu-simt checks
//! that (`shared_race`). The kernel keeps the list ([`SharedObject`]) for the printed form and
//! for the size a launch reserves (the high-water mark).
//!
//! A reuse barrier is needed only where the bytes were accessed after the last barrier
//! (`crate::simt::barriers`, which drops the others). So an object prefers bytes that no object
//! freed since the last barrier had, where that costs no more shared memory than the kernel
//! already takes (or, in a loop body, up to [`APART_BUDGET`]): a loop of layout conversions
//! (online softmax's step) then meets once per conversion rather than twice.

use super::*;
use crate::simt::SharedObject;

/// Bytes of shared memory a program may grow to for objects that keep apart from those freed
/// since the last barrier, in a loop body (where their reuse barriers would run every
/// iteration): within the 48 KB a launch gets without opting in to more.
pub(super) const APART_BUDGET: u32 = 48 << 10;

/// The allocator of one lowering.
#[derive(Default)]
pub(super) struct SharedAlloc {
    /// Live objects: (offset, bytes).
    live: Vec<(u32, u32)>,
    /// Objects freed since the last barrier was emitted, (offset, bytes): where an object would
    /// rather not go (a guide only: `crate::simt::barriers` decides which barriers stay).
    recent: Vec<(u32, u32)>,
    /// For each loop body being lowered, outermost first: the bytes of every object allocated
    /// in it so far. An object that outlives its loop body's iteration (a TMA store's staging
    /// tile, whose bulk read the next iteration does not wait for) must not take them: the
    /// next iteration allocates those objects again, over it.
    loops: Vec<Vec<(u32, u32)>>,
    /// Every object allocated, in program order.
    pub(super) objects: Vec<SharedObject>,
    /// Bytes a program needs: the end of the highest object.
    pub(super) high: u32,
}

impl SharedAlloc {
    /// Where an object of `bytes` aligned to `align` would go now (the first gap), and with
    /// `pinned` (it stays live across the iterations of the loops around it) the first gap
    /// that also misses every object allocated in those loops' bodies.
    pub(super) fn place(&mut self, bytes: u32, align: u32, pinned: bool) -> u32 {
        self.place_missing(bytes, align, pinned, &[])
    }

    /// [`SharedAlloc::place`]'s first gap that also misses `avoid`.
    fn place_missing(&self, bytes: u32, align: u32, pinned: bool, avoid: &[(u32, u32)]) -> u32 {
        let mut taken = self.live.clone();
        taken.extend_from_slice(avoid);
        if pinned {
            taken.extend(self.loops.iter().flatten().copied());
        }
        taken.sort_unstable();
        let mut at = 0u32;
        for (o, b) in taken {
            if at.next_multiple_of(align) + bytes <= o {
                break;
            }
            at = (o + b).max(at);
        }
        at.next_multiple_of(align)
    }

    /// Places an object of `bytes` aligned to `align` (a power of two) in the first gap
    /// ([`SharedAlloc::place`]), or apart from the objects freed since the last barrier where
    /// that fits (see the module's documentation).
    pub(super) fn alloc(&mut self, name: &'static str, bytes: u32, align: u32, pinned: bool) -> u32 {
        let mut at = self.place(bytes, align, pinned);
        if self.recent.iter().any(|&r| crate::simt::barriers::overlap(r, (at, bytes))) {
            let apart = self.place_missing(bytes, align, pinned, &self.recent);
            let room = if self.loops.is_empty() { self.high } else { self.high.max(APART_BUDGET) };
            if apart + bytes <= room {
                at = apart;
            } else {
                // Its reuse barrier stays: nothing freed before it is recent any more.
                self.recent.clear();
            }
        }
        self.live.push((at, bytes));
        if let Some(body) = self.loops.last_mut() {
            body.push((at, bytes));
        }
        self.high = self.high.max(at + bytes);
        self.objects.push(SharedObject { name, offset: at, bytes, align, swizzle: None });
        at
    }

    /// A loop body's lowering begins.
    pub(super) fn enter_loop(&mut self) {
        self.loops.push(Vec::new());
    }

    /// A loop body's lowering ends: its objects count for the loops around it.
    pub(super) fn leave_loop(&mut self) {
        let body = self.loops.pop().unwrap_or_default();
        if let Some(outer) = self.loops.last_mut() {
            outer.extend(body);
        }
    }

    /// The object at `offset` is dead: its bytes may be reused. Its bytes, if it was live.
    pub(super) fn free(&mut self, offset: u32) -> Option<u32> {
        let i = self.live.iter().position(|(o, _)| *o == offset)?;
        let (o, bytes) = self.live.swap_remove(i);
        self.recent.push((o, bytes));
        Some(bytes)
    }

    /// A barrier was emitted: every object freed before it is behind it.
    pub(super) fn barrier(&mut self) {
        self.recent.clear();
    }

    /// The bytes of the live object at `offset`.
    fn bytes_at(&self, offset: u32) -> Option<u32> {
        self.live.iter().find(|(o, _)| *o == offset).map(|&(_, b)| b)
    }
}

impl Lowering<'_> {
    /// Inside a ping-pong region's consumers, one copy per group (see `group_objects`;
    /// [`Lowering::group_offset`] finds the thread's).
    pub(super) fn shared_alloc(&mut self, name: &'static str, bytes: u32, align: u32) -> u32 {
        self.alloc_copies(name, bytes, align, false)
    }

    /// An object that stays live to the program's end, across the iterations of the loops
    /// being lowered (see [`SharedAlloc::loops`]); one copy per group as `shared_alloc`'s.
    pub(super) fn shared_alloc_pinned(&mut self, name: &'static str, bytes: u32, align: u32) -> u32 {
        self.alloc_copies(name, bytes, align, true)
    }

    /// How many copies an object allocated now has: the consumer groups inside a ping-pong
    /// region's consumers, else one.
    pub(super) fn group_copies(&self) -> u32 {
        if self.group_objects.is_some() {
            self.k.consumer_groups
        } else {
            1
        }
    }

    fn alloc_copies(&mut self, name: &'static str, bytes: u32, align: u32, pinned: bool) -> u32 {
        // Copies whole alignments apart (one copy: its own bytes, as before ping-pong).
        let copies = self.group_copies();
        let one = if copies > 1 { bytes.max(1).next_multiple_of(align) } else { bytes.max(1) };
        let at = self.smem.alloc(name, one * copies, align, pinned);
        if let Some(objects) = self.group_objects.as_mut() {
            objects.insert(at, one);
        }
        at
    }

    /// The thread's group's copy of the object at `base` (see `group_objects`): `group x` one
    /// copy's bytes, computed where it is used (kept live from the prologue instead, it made
    /// the FP8 ping-pong GEMM spill), or `None` for an object of one copy.
    pub(super) fn group_offset(&mut self, base: u32) -> Option<Reg> {
        let bytes = *self.group_objects.as_ref()?.get(&base)?;
        let g = self.group?;
        Some(self.bin_c(BinaryOp::Mul, g, bytes as i64))
    }

    /// The object at `offset` is not accessed after this point ([`Inst::SharedFree`]).
    pub(super) fn shared_free(&mut self, offset: u32) {
        if let Some(bytes) = self.smem.free(offset) {
            self.emit(Inst::SharedFree { offset, bytes });
        }
    }

    /// The reuse barrier before the first writes of the live object at `offset`
    /// ([`Inst::SharedReuse`]: a barrier unless every earlier access of its bytes is already
    /// behind one).
    pub(super) fn shared_reuse(&mut self, offset: u32) {
        match self.smem.bytes_at(offset) {
            Some(bytes) => self.emit(Inst::SharedReuse { offset, bytes }),
            None => self.emit(Inst::Barrier),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SharedAlloc;

    #[test]
    fn objects_live_together_do_not_overlap_and_dead_ones_are_reused() {
        let mut a = SharedAlloc::default();
        let stages = a.alloc("stages", 3000, 128, false);
        let scratch = a.alloc("scratch", 8, 8, false);
        assert!(scratch >= stages + 3000, "{scratch}");
        a.free(stages);
        let relayout = a.alloc("relayout", 1024, 16, false);
        assert_eq!(relayout, 0, "the stages' bytes are reused");
        let big = a.alloc("big", 4096, 16, false);
        assert!(big >= scratch + 8 && big % 16 == 0, "{big}");
        assert_eq!(a.high, big + 4096);
        assert_eq!(a.objects.len(), 4);
    }

    /// A persistent loop's K-loop ring is freed at each tile's end; the TMA store's staging
    /// tile, live to the program's end, may not take its bytes (the next tile's copies land
    /// there while the last store's bulk read may still be running), but may take the bytes of
    /// objects from before the loop.
    #[test]
    fn objects_live_across_iterations_miss_the_loops_objects() {
        let mut a = SharedAlloc::default();
        let before = a.alloc("before", 2048, 16, false);
        a.free(before);
        a.barrier();
        a.enter_loop();
        let ring = a.alloc("ring", 4096, 1024, false);
        assert_eq!(ring, 0);
        a.free(ring);
        a.barrier();
        let plain = a.alloc("relayout", 1024, 16, false);
        assert_eq!(plain, 0, "an object of one iteration reuses the ring's bytes");
        a.free(plain);
        let staging = a.alloc("staging", 1024, 1024, true);
        assert_eq!(staging, 4096, "past the ring");
        a.leave_loop();
        a.barrier();
        let after = a.alloc("after", 1024, 16, true);
        assert_eq!(after, 0, "no loop is open");
    }

    /// An object keeps apart from those freed since the last barrier where the program's
    /// shared memory does not grow for it (in a loop body: up to `APART_BUDGET`), else it
    /// takes their bytes.
    #[test]
    fn objects_keep_apart_from_bytes_freed_since_the_last_barrier_where_it_costs_nothing() {
        let mut a = SharedAlloc::default();
        let big = a.alloc("big", 4096, 16, false);
        a.free(big);
        a.barrier();
        let first = a.alloc("first", 1024, 16, false);
        assert_eq!(first, 0, "behind a barrier: first fit");
        a.free(first);
        let second = a.alloc("second", 1024, 16, false);
        assert_eq!(second, 1024, "apart, within the 4096 bytes already taken");
        a.free(second);
        let third = a.alloc("third", 8192, 16, false);
        assert_eq!(third, 0, "apart would grow the program's bytes outside a loop");
        a.free(third);
        a.enter_loop();
        let fourth = a.alloc("fourth", 8192, 16, false);
        assert_eq!(fourth, 8192, "in a loop body, apart up to the budget");
        a.free(fourth);
        let fifth = a.alloc("fifth", 40 << 10, 16, false);
        assert_eq!(fifth, 0, "past the budget: first fit");
        a.leave_loop();
    }
}
