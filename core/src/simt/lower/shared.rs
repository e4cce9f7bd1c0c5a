//! Shared memory as allocated objects: every op that stages data through shared memory asks
//! for a named object of some size and alignment, uses it, and frees it after its last access
//! (in program order). Offsets are assigned first-fit among the objects live at that point, so
//! objects whose lifetimes do not overlap reuse the same bytes (a layout conversion after a
//! GEMM takes the GEMM's stages) and objects that are live together (a scalar atomic's result
//! inside a pipelined K loop) never overlap. Reuse is safe because every user starts with a
//! barrier (the last readers of the bytes' previous object are done); cpu-simt checks that
//! (`shared_race`). The kernel keeps the list ([`SharedObject`]) for the printed form and for
//! the size a launch reserves (the high-water mark).

use super::*;
use crate::simt::SharedObject;

/// The allocator of one lowering.
#[derive(Default)]
pub(super) struct SharedAlloc {
    /// Live objects: (offset, bytes).
    live: Vec<(u32, u32)>,
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
        let mut taken = self.live.clone();
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
    /// ([`SharedAlloc::place`]).
    pub(super) fn alloc(&mut self, name: &'static str, bytes: u32, align: u32, pinned: bool) -> u32 {
        let at = self.place(bytes, align, pinned);
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

    /// The object at `offset` is dead: its bytes may be reused.
    pub(super) fn free(&mut self, offset: u32) {
        if let Some(i) = self.live.iter().position(|(o, _)| *o == offset) {
            self.live.swap_remove(i);
        }
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

    pub(super) fn shared_free(&mut self, offset: u32) {
        self.smem.free(offset)
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
        a.enter_loop();
        let ring = a.alloc("ring", 4096, 1024, false);
        assert_eq!(ring, 0);
        a.free(ring);
        let plain = a.alloc("relayout", 1024, 16, false);
        assert_eq!(plain, 0, "an object of one iteration reuses the ring's bytes");
        a.free(plain);
        let staging = a.alloc("staging", 1024, 1024, true);
        assert_eq!(staging, 4096, "past the ring");
        a.leave_loop();
        let after = a.alloc("after", 1024, 16, true);
        assert_eq!(after, 0, "no loop is open");
    }
}
