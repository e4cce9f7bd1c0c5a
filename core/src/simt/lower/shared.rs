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
    /// Every object allocated, in program order.
    pub(super) objects: Vec<SharedObject>,
    /// Bytes a program needs: the end of the highest object.
    pub(super) high: u32,
}

impl SharedAlloc {
    /// Where an object of `bytes` aligned to `align` would go now (the first gap).
    pub(super) fn place(&mut self, bytes: u32, align: u32) -> u32 {
        self.live.sort_unstable();
        let mut at = 0u32;
        for &(o, b) in &self.live {
            if at + bytes <= o {
                break;
            }
            at = (o + b).next_multiple_of(align).max(at);
        }
        at.next_multiple_of(align)
    }

    /// Places an object of `bytes` aligned to `align` (a power of two) in the first gap.
    pub(super) fn alloc(&mut self, name: &'static str, bytes: u32, align: u32) -> u32 {
        let at = self.place(bytes, align);
        self.live.push((at, bytes));
        self.high = self.high.max(at + bytes);
        self.objects.push(SharedObject { name, offset: at, bytes, align, swizzle: None });
        at
    }

    /// The object at `offset` is dead: its bytes may be reused.
    pub(super) fn free(&mut self, offset: u32) {
        if let Some(i) = self.live.iter().position(|(o, _)| *o == offset) {
            self.live.swap_remove(i);
        }
    }
}

impl Lowering<'_> {
    pub(super) fn shared_alloc(&mut self, name: &'static str, bytes: u32, align: u32) -> u32 {
        self.smem.alloc(name, bytes.max(1), align)
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
        let stages = a.alloc("stages", 3000, 128);
        let scratch = a.alloc("scratch", 8, 8);
        assert!(scratch >= stages + 3000, "{scratch}");
        a.free(stages);
        let relayout = a.alloc("relayout", 1024, 16);
        assert_eq!(relayout, 0, "the stages' bytes are reused");
        let big = a.alloc("big", 4096, 16);
        assert!(big >= scratch + 8 && big % 16 == 0, "{big}");
        assert_eq!(a.high, big + 4096);
        assert_eq!(a.objects.len(), 4);
    }
}
