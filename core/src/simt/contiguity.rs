//! Contiguity analysis (Triton's axis info, along the last dimension): for every integer and
//! pointer tile, how many consecutive elements of each aligned run along the last dimension hold
//! consecutive values (`contiguity`), and how many hold equal values (`constancy`). The lowering
//! turns loads and stores whose pointers are contiguous over a thread's vector into vector
//! accesses (alignment and masks are checked at run time, see `lower.rs`).
//!
//! Runs are aligned: `contiguity = c` means elements `[k c, (k + 1) c)` along the last dimension
//! are consecutive; both facts are powers of two. `divisibility` is the largest power of two
//! known to divide the first element of every run (bytes of the address for pointers), from the
//! kernel's declared parameter facts (`Param::divisibility`), constants, `arange` and the
//! arithmetic between them; the lowering drops the alignment test of a vector access it
//! proves. Loop-carried values take the meet of their initial value and every `next`, iterated
//! to a fixed point.

use crate::ir::*;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisInfo {
    pub contiguity: u32,
    pub constancy: u32,
    pub divisibility: u32,
}

/// The largest divisibility tracked (beyond it, facts add nothing).
const MAX_DIV: u32 = 1 << 16;

impl AxisInfo {
    const NONE: AxisInfo = AxisInfo { contiguity: 1, constancy: 1, divisibility: 1 };

    fn meet(self, o: AxisInfo) -> AxisInfo {
        AxisInfo {
            contiguity: self.contiguity.min(o.contiguity),
            constancy: self.constancy.min(o.constancy),
            divisibility: self.divisibility.min(o.divisibility),
        }
    }

    fn with_div(self, divisibility: u32) -> AxisInfo {
        AxisInfo { divisibility: divisibility.clamp(1, MAX_DIV), ..self }
    }
}

/// What `x`'s divisibility says about its elements at multiples of `c` (the runs of a result
/// with contiguity `c`): run starts of `x` when its runs are no longer than `c`; otherwise
/// positions inside its runs of consecutive values (a step of `step`: 1 for integers, the
/// element size for pointers), known only up to `c * step`.
fn at_runs(x: AxisInfo, c: u32, step: u32) -> u32 {
    if x.contiguity <= c {
        x.divisibility
    } else {
        x.divisibility.min(c.saturating_mul(step))
    }
}

/// Largest power of two dividing `x` (`cap` for 0).
fn pow2_divisor(x: i64, cap: u32) -> u32 {
    if x == 0 {
        cap
    } else {
        (1u64 << x.unsigned_abs().trailing_zeros().min(31)).min(cap as u64) as u32
    }
}

pub struct Contiguity<'f> {
    func: &'f Function,
    info: HashMap<Value, AxisInfo>,
}

impl<'f> Contiguity<'f> {
    pub fn analyse(func: &'f Function) -> Contiguity<'f> {
        let mut c = Contiguity { func, info: HashMap::new() };
        for p in &func.params {
            // Without a fact a pointer is aligned to its element (the runtimes check it).
            let natural = func.ty(p.value).elem.pointee().map_or(1, |d| d.size_bytes());
            let d = p.divisibility.unwrap_or(natural).max(natural);
            c.info.insert(p.value, AxisInfo::NONE.with_div(d));
        }
        c.block(func.body);
        c
    }

    /// Facts about `v` along its last dimension (scalars are constant).
    pub fn get(&self, v: Value) -> AxisInfo {
        let t = self.func.ty(v);
        let known = self.info.get(&v).copied().unwrap_or(AxisInfo::NONE);
        if t.is_scalar() {
            return AxisInfo { contiguity: 1, constancy: u32::MAX, divisibility: known.divisibility };
        }
        known
    }

    fn last(&self, v: Value) -> u32 {
        self.func.ty(v).shape.last().copied().unwrap_or(1)
    }

    fn block(&mut self, b: Block) {
        for &op in &self.func.blocks[b].ops.clone() {
            self.op(op);
        }
    }

    /// Analyses a loop body until its carried values' facts stop shrinking.
    fn fixpoint(&mut self, args: &[Value], init: &[Value], body: Block) {
        for (a, i) in args.iter().zip(init) {
            let f = self.get(*i);
            self.info.insert(*a, f);
        }
        for _ in 0..8 {
            self.block(body);
            let nexts = self.func.blocks[body].yields.clone();
            let mut changed = false;
            for (a, n) in args.iter().zip(&nexts) {
                let m = self.get(*a).meet(self.get(*n));
                if m != self.get(*a) {
                    self.info.insert(*a, m);
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
        for a in args {
            self.info.insert(*a, AxisInfo::NONE);
        }
        self.block(body);
    }

    fn op(&mut self, op: Op) {
        let d = &self.func.ops[op];
        let g = |v: Value| self.get(v);
        let result = d.results.first().copied();
        let info = match &d.kind {
            OpKind::Const(Literal::Int(i)) => AxisInfo::NONE.with_div(pow2_divisor(*i, MAX_DIV)),
            OpKind::Arange { start, end } => {
                let n = (end - start) as u32;
                let c = pow2_divisor(*start, n);
                AxisInfo { contiguity: c, constancy: 1, divisibility: c.clamp(1, MAX_DIV) }
            }
            OpKind::Splat(x) => {
                let r = result.expect("splat has a result");
                AxisInfo { contiguity: 1, constancy: self.last(r), divisibility: g(*x).divisibility }
            }
            OpKind::Broadcast(x) => {
                let r = result.expect("broadcast has a result");
                if self.last(*x) == 1 && self.last(r) > 1 {
                    AxisInfo { contiguity: 1, constancy: self.last(r), divisibility: g(*x).divisibility }
                } else {
                    g(*x)
                }
            }
            OpKind::Reshape(x) | OpKind::ConsumeToken { value: x, .. } => {
                let r = result.expect("reshape has a result");
                if self.last(*x) == self.last(r) {
                    g(*x)
                } else if self.last(r) == 1 {
                    // A new last dimension of 1 (`x[:, None]`): runs of one element, each
                    // keeping what is known of every element of `x` (a row index times a
                    // row length stays a multiple of it).
                    AxisInfo::NONE.with_div(at_runs(g(*x), 1, 1))
                } else {
                    AxisInfo::NONE
                }
            }
            OpKind::Binary { op: b, lhs, rhs } => {
                let (a, c) = (g(*lhs), g(*rhs));
                let constancy = a.constancy.min(c.constancy);
                let contiguity = match b {
                    BinaryOp::Add => a.contiguity.min(c.constancy).max(a.constancy.min(c.contiguity)),
                    BinaryOp::Sub => a.contiguity.min(c.constancy),
                    _ => 1,
                };
                let contiguity = contiguity.max(1);
                let divisibility = match b {
                    BinaryOp::Add | BinaryOp::Sub => at_runs(a, contiguity, 1).min(at_runs(c, contiguity, 1)),
                    // Every element: inside a run of consecutive values only 1 is known.
                    BinaryOp::Mul => (at_runs(a, 1, 1) as u64 * at_runs(c, 1, 1) as u64).min(MAX_DIV as u64) as u32,
                    // A multiple of d divided exactly by a constant power of two c dividing d
                    // (`n / 2` of an even extent) is a multiple of d / c.
                    BinaryOp::Div => match self.func.constant(*rhs) {
                        Some(Literal::Int(k))
                            if k > 0 && (k as u64).is_power_of_two() && at_runs(a, 1, 1) as i64 % k == 0 =>
                        {
                            at_runs(a, 1, 1) / k as u32
                        }
                        _ => 1,
                    },
                    _ => 1,
                };
                AxisInfo { contiguity, constancy, divisibility: 1 }.with_div(divisibility)
            }
            OpKind::AddPtr { ptr, offset } => {
                let (a, c) = (g(*ptr), g(*offset));
                let size = self.func.ty(*ptr).elem.pointee().map_or(1, |d| d.size_bytes());
                let contiguity = a.contiguity.min(c.constancy).max(a.constancy.min(c.contiguity)).max(1);
                let off = (at_runs(c, contiguity, 1) as u64 * size as u64).min(MAX_DIV as u64) as u32;
                AxisInfo { contiguity, constancy: a.constancy.min(c.constancy), divisibility: 1 }
                    .with_div(at_runs(a, contiguity, size).min(off))
            }
            // A peer's copy is the pointer moved by the distance between two heaps (with a
            // rank per element, by a distance per element): what is known of the pointer
            // stays known along runs of equal ranks, its alignment up to the heaps' own
            // (`world::SYMMETRIC_ALIGN`: every world starts a symmetric buffer there on every rank).
            OpKind::SymmAt { ptr, rank } => {
                let (a, r) = (g(*ptr), g(*rank));
                AxisInfo {
                    contiguity: a.contiguity.min(r.constancy).max(1),
                    constancy: a.constancy.min(r.constancy),
                    divisibility: 1,
                }
                .with_div(a.divisibility.min(crate::world::SYMMETRIC_ALIGN as u32))
            }
            OpKind::Cast(x) => {
                let r = result.expect("cast has a result");
                let int = |v: Value| self.func.ty(v).elem.dtype().is_some_and(|d| d.is_int());
                if int(r) && int(*x) {
                    g(*x)
                } else {
                    AxisInfo { constancy: g(*x).constancy, ..AxisInfo::NONE }
                }
            }
            OpKind::Unary { x, .. } => AxisInfo { constancy: g(*x).constancy, ..AxisInfo::NONE },
            OpKind::Cmp { op: cmp, lhs, rhs } => {
                let (a, c) = (g(*lhs), g(*rhs));
                // `x < y` and `x >= y` (and their mirrors) with `x` in aligned runs of `d`
                // consecutive values starting at multiples of `d`, and `y` a multiple of `d`
                // constant over the run: `y` cannot fall inside a run, so the run compares alike
                // (the K mask of a GEMM over K divisible by its tile).
                let run = |x: AxisInfo, y: AxisInfo| {
                    let d = x.contiguity.min(x.divisibility).min(y.divisibility);
                    if y.constancy >= d {
                        d
                    } else {
                        1
                    }
                };
                let aligned = match cmp {
                    CmpOp::Lt | CmpOp::Ge => run(a, c),
                    CmpOp::Gt | CmpOp::Le => run(c, a),
                    _ => 1,
                };
                AxisInfo { constancy: a.constancy.min(c.constancy).max(aligned), ..AxisInfo::NONE }
            }
            OpKind::Select { cond, on_true, on_false } => AxisInfo {
                constancy: g(*cond).constancy.min(g(*on_true).constancy).min(g(*on_false).constancy),
                ..AxisInfo::NONE
            },
            OpKind::For { init, body, lower, step, .. } => {
                // The induction variable: lower + i * step.
                let iv = self.func.blocks[*body].args[0];
                let d = g(*lower).divisibility.min(g(*step).divisibility);
                self.info.insert(iv, AxisInfo::NONE.with_div(d));
                let args = self.func.blocks[*body].args[1..].to_vec();
                self.fixpoint(&args, &init.clone(), *body);
                let facts: Vec<AxisInfo> = args.iter().map(|a| self.get(*a)).collect();
                for (r, f) in self.func.ops[op].results.iter().zip(facts) {
                    self.info.insert(*r, f);
                }
                return;
            }
            OpKind::While { init, cond, body } => {
                let (init, cond, body) = (init.clone(), *cond, *body);
                let args = self.func.blocks[body].args.clone();
                let cargs = self.func.blocks[cond].args.clone();
                // Conservative: the condition block sees the carried values too.
                for a in &cargs {
                    self.info.insert(*a, AxisInfo::NONE);
                }
                self.block(cond);
                self.fixpoint(&args, &init, body);
                for r in &self.func.ops[op].results {
                    self.info.insert(*r, AxisInfo::NONE);
                }
                return;
            }
            OpKind::If { then_block, else_block, .. } => {
                let (t, e) = (*then_block, *else_block);
                self.block(t);
                self.block(e);
                let ty = self.func.blocks[t].yields.clone();
                let ey = self.func.blocks[e].yields.clone();
                for ((r, a), b) in self.func.ops[op].results.iter().zip(ty).zip(ey) {
                    let f = self.get(a).meet(self.get(b));
                    self.info.insert(*r, f);
                }
                return;
            }
            _ => AxisInfo::NONE,
        };
        if let Some(r) = result {
            self.info.insert(r, info);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::KernelBuilder;

    #[test]
    fn pointer_tiles_of_a_gemm_are_contiguous_along_k() {
        let b = KernelBuilder::new("t", LaunchAttrs::default());
        let (a, sa) = (b.arg_ptr("a", DType::F32), b.arg("sa", DType::I32));
        let rows = (b.program_id_x() * 64 + b.arange(0, 64)).expand_dims(1);
        let rk = b.arange(0, 32);
        let p = a + rows * sa + rk.expand_dims(0);
        let strided = a + rk.expand_dims(0) * sa;
        let out = b.for_range(0, 128, 32, &[p], |_, c: &[crate::builder::Tile]| vec![c[0] + 32i32]);
        let (pv, sv, ov) = (p.value(), strided.value(), out[0].value());
        let f = b.finish().unwrap();
        let c = Contiguity::analyse(&f);
        assert_eq!(c.get(pv).contiguity, 32);
        assert_eq!(c.get(sv).contiguity, 1);
        assert_eq!(c.get(ov).contiguity, 32);
    }

    /// Divisibility is claimed only where it holds for the first element of every run.
    #[test]
    fn divisibility_follows_the_declared_facts_soundly() {
        let b = KernelBuilder::new("t", LaunchAttrs::default());
        let x = b.arg_ptr_aligned("x", DType::F32, 16);
        let plain = b.arg_ptr("y", DType::F32);
        let k = b.arg_multiple_of("k", DType::I32, 16);
        let i = b.arange(0, 64);
        let rows = b.arange(0, 8).expand_dims(1);
        let cases = [
            (x + i, 16, 64),                                         // aligned base, unit stride
            (x + i * 2i32, 8, 1),                                    // every element: 8-byte steps
            (x + i + 1i32, 4, 64),                                   // runs start off by one element
            (plain + i, 4, 64),                                      // no fact: the element size
            (x + rows * k + b.arange(0, 32).expand_dims(0), 16, 32), // row starts k*4*r bytes
            // A row index times a constant row length, then `[:, None]`: every row start a
            // multiple of 64 elements; the row index alone, then `[:, None]`: nothing known.
            (x + (b.arange(0, 8) * 64i32).expand_dims(1) + b.arange(0, 32).expand_dims(0), 16, 32),
            (x + b.arange(0, 8).expand_dims(1) + b.arange(0, 32).expand_dims(0), 4, 32),
            // `k / 2` of a multiple of 16 is a multiple of 8; `k / 3` is not known to be
            // anything, nor `k / 32`.
            (k / 2i32, 8, 1),
            (k / 3i32, 1, 1),
            (k / 32i32, 1, 1),
        ];
        let vals: Vec<(Value, u32, u32)> = cases.iter().map(|(t, d, c)| (t.value(), *d, *c)).collect();
        let f = b.finish().unwrap();
        let c = Contiguity::analyse(&f);
        for (n, (v, div, contig)) in vals.into_iter().enumerate() {
            assert_eq!((c.get(v).divisibility, c.get(v).contiguity), (div, contig), "case {n}");
        }
    }
}
