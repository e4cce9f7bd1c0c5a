//! Reuse barriers that order nothing are dropped (run by [`super::lower`] before any other pass).
//!
//! Every op that stages data through shared memory writes its object, meets the program at a
//! barrier, then reads it (`super::lower::shared`). Its bytes may have belonged to an object
//! that other threads were still reading, so the lowering also puts a barrier before the writes:
//! a *reuse barrier*, emitted as [`Inst::SharedReuse`] with the new object's bytes. The lowering
//! marks where each object's accesses end ([`Inst::SharedFree`]). This pass walks the program in
//! order, keeping the bytes of the objects freed since the last barrier every thread passed: a
//! reuse barrier whose bytes meet none of them orders nothing (every access of those bytes is
//! already behind a barrier) and is dropped; the others become [`Inst::Barrier`]s. Online
//! softmax's step stages eight objects: where they take different bytes, each needs one barrier
//! (between its writes and its reads), not two.
//!
//! Control flow: a loop body starts from the bytes freed before the loop joined with those freed
//! at the end of its body (to a fixed point); the state after a loop is that join as well (it
//! may run no iteration), after an `if` the join of its branches. A `while` and a warp-specialized
//! region (whose barriers may count one group only) keep every reuse barrier and leave the state
//! unknown. The markers are gone when the pass returns.

use super::{Inst, Kernel};

/// The bytes freed since the last barrier: ranges `(offset, bytes)`, or unknown (every byte).
#[derive(Clone, Debug, PartialEq)]
enum Freed {
    Known(Vec<(u32, u32)>),
    Unknown,
}

impl Freed {
    fn join(&self, other: &Freed) -> Freed {
        match (self, other) {
            (Freed::Known(a), Freed::Known(b)) => {
                let mut all = a.clone();
                for r in b {
                    if !all.contains(r) {
                        all.push(*r);
                    }
                }
                all.sort_unstable();
                Freed::Known(all)
            }
            _ => Freed::Unknown,
        }
    }

    fn meets(&self, (offset, bytes): (u32, u32)) -> bool {
        match self {
            Freed::Known(ranges) => ranges.iter().any(|&r| overlap(r, (offset, bytes))),
            Freed::Unknown => true,
        }
    }

    fn add(&mut self, range: (u32, u32)) {
        if let Freed::Known(ranges) = self {
            if !ranges.contains(&range) {
                ranges.push(range);
                ranges.sort_unstable();
            }
        }
    }
}

/// Drops the reuse barriers that order nothing and every [`Inst::SharedFree`] marker.
pub fn elide(k: &mut Kernel) {
    let mut body = std::mem::take(&mut k.body);
    walk(&mut body, Freed::Known(Vec::new()), false, true);
    k.body = body;
}

/// The state after `body` from `state` at its start. With `rewrite`, `body` is rewritten by the
/// decisions taken (kept reuse barriers become barriers, the other markers go); without, it is
/// only read (the analysis of a loop body for its entry state). `grouped`: inside a
/// warp-specialized region, where every reuse barrier is kept.
fn walk(body: &mut Vec<Inst>, mut state: Freed, grouped: bool, rewrite: bool) -> Freed {
    for i in body.iter_mut() {
        match i {
            Inst::Barrier | Inst::BarrierAny { .. } => state = Freed::Known(Vec::new()),
            Inst::SharedFree { offset, bytes } => state.add((*offset, *bytes)),
            Inst::SharedReuse { offset, bytes } if grouped || state.meets((*offset, *bytes)) => {
                state = Freed::Known(Vec::new());
                if rewrite {
                    *i = Inst::Barrier;
                }
            }
            Inst::Loop { body: lb, .. } => {
                // The body's entry: what came before the loop joined with what an iteration
                // leaves, to a fixed point (unknown if none is reached).
                let mut entry = state.clone();
                let mut fixed = false;
                for _ in 0..8 {
                    let next = state.join(&walk(lb, entry.clone(), grouped, false));
                    if next == entry {
                        fixed = true;
                        break;
                    }
                    entry = next;
                }
                if !fixed {
                    entry = Freed::Unknown;
                }
                let end = walk(lb, entry, grouped, rewrite);
                state = state.join(&end);
            }
            Inst::If { then_body, else_body, .. } => {
                let a = walk(then_body, state.clone(), grouped, rewrite);
                let b = walk(else_body, state.clone(), grouped, rewrite);
                state = a.join(&b);
            }
            Inst::While { cond_body, body: wb, .. } => {
                walk(cond_body, Freed::Unknown, grouped, rewrite);
                walk(wb, Freed::Unknown, grouped, rewrite);
                state = Freed::Unknown;
            }
            Inst::Specialized { producer, consumer, .. } => {
                walk(producer, Freed::Unknown, true, rewrite);
                walk(consumer, Freed::Unknown, true, rewrite);
                state = Freed::Unknown;
            }
            _ => {}
        }
    }
    if rewrite {
        // Every reuse barrier left ordered nothing.
        body.retain(|i| !matches!(i, Inst::SharedFree { .. } | Inst::SharedReuse { .. }));
    }
    state
}

/// Whether shared byte ranges `(offset, bytes)` overlap.
pub(crate) fn overlap((o, b): (u32, u32), (p, c): (u32, u32)) -> bool {
    o < p + c && p < o + b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reuse(offset: u32, bytes: u32) -> Inst {
        Inst::SharedReuse { offset, bytes }
    }

    fn free(offset: u32, bytes: u32) -> Inst {
        Inst::SharedFree { offset, bytes }
    }

    fn barriers(body: &[Inst]) -> usize {
        body.iter().filter(|i| matches!(i, Inst::Barrier)).count()
    }

    /// Two objects in turn: the second's bytes were freed after the last barrier only where
    /// they overlap the first's.
    #[test]
    fn a_reuse_barrier_stays_only_over_bytes_freed_since_the_last_barrier() {
        let mut body = vec![reuse(0, 64), Inst::Barrier, free(0, 64), reuse(64, 64), Inst::Barrier, free(64, 64)];
        let end = walk(&mut body, Freed::Known(Vec::new()), false, true);
        assert_eq!(barriers(&body), 2, "{body:?}");
        assert_eq!(end, Freed::Known(vec![(64, 64)]));
        let mut body = vec![reuse(0, 64), Inst::Barrier, free(0, 64), reuse(32, 64), Inst::Barrier, free(32, 64)];
        walk(&mut body, Freed::Known(Vec::new()), false, true);
        // The first object's bytes were never used: only the second's reuse barrier stays.
        assert_eq!(barriers(&body), 3, "overlapping bytes keep their barrier: {body:?}");
        assert!(!body.iter().any(|i| matches!(i, Inst::SharedFree { .. } | Inst::SharedReuse { .. })));
    }

    /// A loop's first object meets what its body freed last in the iteration before.
    #[test]
    fn a_loop_body_starts_from_what_its_last_iteration_freed() {
        let loop_of = |body: Vec<Inst>| Inst::Loop {
            iv: super::super::Reg(0),
            lo: super::super::Reg(0),
            hi: super::super::Reg(0),
            step: super::super::Reg(0),
            phis: Vec::new(),
            inits: Vec::new(),
            body,
            nexts: Vec::new(),
            results: Vec::new(),
        };
        let object = |a: u32| vec![reuse(a, 64), Inst::Barrier, free(a, 64)];
        // One object an iteration: its bytes were freed at the end of the iteration before,
        // after the last barrier: its reuse barrier stays.
        let mut body = vec![loop_of(object(0))];
        walk(&mut body, Freed::Known(Vec::new()), false, true);
        let Inst::Loop { body: lb, .. } = &body[0] else { unreachable!() };
        assert_eq!(barriers(lb), 2, "{lb:?}");
        // Two objects apart: each is behind the other's barrier, one barrier per object.
        let mut body = vec![loop_of([object(0), object(64)].concat())];
        let end = walk(&mut body, Freed::Known(Vec::new()), false, true);
        let Inst::Loop { body: lb, .. } = &body[0] else { unreachable!() };
        assert_eq!(barriers(lb), 2, "{lb:?}");
        assert_eq!(end, Freed::Known(vec![(64, 64)]));
        let step = |a: u32, b: u32| [object(a), object(b)].concat();
        // Inside a warp-specialized region every reuse barrier stays.
        let mut body = step(0, 64);
        walk(&mut body, Freed::Known(Vec::new()), true, true);
        assert_eq!(barriers(&body), 4);
    }
}
