//! The kernels of the differential test: one op in a small kernel, for each layout.

use super::{Family, OpCase};
use trident_core::ir::{DType, LaunchAttrs, Literal, MemSemantic, Scope};
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

/// The tile a case's kernel works on, and how it is launched.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub tile: Vec<u32>,
    pub warps: u32,
    pub programs: u32,
    /// Elements `0..valid` of the flattened input are inside the problem; the rest is masked.
    pub valid: usize,
    /// Whether the kernel passes a mask (the unmasked form takes the vector paths).
    pub masked: bool,
    /// For reductions, the axis.
    pub axis: u32,
}

impl Layout {
    pub fn numel(&self) -> usize {
        self.tile.iter().product::<u32>() as usize
    }

    pub fn total(&self) -> usize {
        self.numel() * self.programs as usize
    }

    pub fn text(&self) -> String {
        let t: Vec<String> = self.tile.iter().map(|d| d.to_string()).collect();
        let axis = if self.tile.len() > 1 { format!("a{}", self.axis) } else { String::new() };
        format!("{}{axis}w{}p{}", t.join("x"), self.warps, self.programs)
    }
}

fn l(tile: &[u32], warps: u32, programs: u32, valid: usize, masked: bool, axis: u32) -> Layout {
    Layout { tile: tile.to_vec(), warps, programs, valid, masked, axis }
}

/// The layouts a case runs in: tiles smaller than the program's threads (each element held by
/// several threads), larger ones, one warp, two dimensions, masked tails.
pub fn layouts(f: Family) -> Vec<Layout> {
    match f {
        Family::Reduce(_) => vec![
            l(&[64], 4, 2, 128, false, 0),
            l(&[16, 32], 4, 2, 1024, false, 0),
            l(&[16, 32], 4, 2, 1024, false, 1),
            l(&[4, 8], 4, 2, 64, false, 1),
            l(&[2, 256], 2, 1, 512, false, 1),
        ],
        Family::AtomicCas => vec![l(&[32], 4, 2, 64, false, 0), l(&[128], 4, 2, 256, false, 0)],
        Family::Ticket => {
            vec![l(&[32], 4, 2, 50, true, 0), l(&[1024], 4, 1, 1000, true, 0), l(&[8, 8], 2, 2, 128, false, 0)]
        }
        Family::Atomic(_) => {
            vec![l(&[32], 4, 3, 90, true, 0), l(&[256], 4, 2, 512, false, 0), l(&[8, 16], 2, 2, 200, true, 0)]
        }
        _ => vec![
            l(&[32], 4, 3, 90, true, 0),
            l(&[256], 4, 2, 512, false, 0),
            l(&[16, 64], 4, 2, 1800, true, 0),
            l(&[64], 1, 4, 250, true, 0),
        ],
    }
}

/// `program_id * numel + (the row-major index of each element of the tile)`.
fn offsets<'b>(b: &'b KernelBuilder, tile: &[u32]) -> Tile<'b> {
    let numel: u32 = tile.iter().product();
    let base = b.program_id_x() * numel as i32;
    match tile {
        [n] => base + b.arange(0, *n as i64),
        [r, c] => {
            let rows = b.arange(0, *r as i64).expand_dims(1) * *c as i32;
            let cols = b.arange(0, *c as i64).expand_dims(0);
            base + (rows + cols)
        }
        _ => base,
    }
}

fn zero<'b>(b: &'b KernelBuilder, d: DType) -> Tile<'b> {
    b.constant(if d.is_float() { Literal::Float(0.0) } else { Literal::Int(0) }, d)
}

/// The kernel of a case in a layout. Parameters: the inputs (`x0`, `x1`, ..), `out`, and `n`
/// (elements inside the problem); atomics take `mem` (the words they update) first.
pub fn build(c: &OpCase, lay: &Layout) -> Result<Function, VerifyError> {
    let attrs = LaunchAttrs { warps: lay.warps, fast_math: c.fast, ..LaunchAttrs::default() };
    let name = format!("op_{}_{}", c.op_name().replace('.', "_"), c.dtype);
    let b = KernelBuilder::new(&name, attrs);
    let d = c.dtype;
    match c.family {
        Family::Reduce(op) => {
            let (x, out) = (b.arg_ptr("x0", d), b.arg_ptr("out", c.result_dtype()));
            let offs = offsets(&b, &lay.tile);
            let v = b.load(x + offs, None, None);
            let r = v.reduce(op, lay.axis);
            let rshape = r.shape();
            let pid = b.program_id_x();
            match rshape.as_slice() {
                [] => b.store(out + pid, r, None),
                [n] => b.store(out + (pid * *n as i32 + b.arange(0, *n as i64)), r, None),
                _ => {}
            }
        }
        Family::Atomic(_) | Family::AtomicCas | Family::Ticket => {
            let mem = b.arg_ptr("mem", d);
            let ins: Vec<Tile> = (0..inputs(c)).map(|i| b.arg_ptr(&format!("x{i}"), d)).collect();
            let out = b.arg_ptr("out", d);
            let n = b.arg("n", DType::I32);
            let offs = offsets(&b, &lay.tile);
            let mask = lay.masked.then(|| offs.lt(n));
            let bref = &b;
            let load = move |p| match mask {
                Some(m) => bref.load(p + offs, Some(m), Some(zero(bref, d))),
                None => bref.load(p + offs, None, None),
            };
            let (sem, scope) = (MemSemantic::Relaxed, Scope::Gpu);
            let old = match c.family {
                Family::Atomic(op) => b.atomic(op, mem + offs, load(ins[0]), mask, sem, scope),
                Family::AtomicCas => b.atomic_cas(mem + offs, load(ins[0]), load(ins[1]), sem, scope),
                _ => {
                    let one = b.constant(if d.is_float() { Literal::Float(1.0) } else { Literal::Int(1) }, d);
                    let counter = (mem + b.i32(0)).splat(&lay.tile);
                    b.atomic(trident_core::ir::AtomicOp::Add, counter, one, mask, sem, scope)
                }
            };
            b.store(out + offs, old, mask);
        }
        _ => {
            let ins: Vec<Tile> =
                input_types(c).iter().enumerate().map(|(i, t)| b.arg_ptr(&format!("x{i}"), *t)).collect();
            let out = b.arg_ptr("out", c.result_dtype());
            let n = b.arg("n", DType::I32);
            let offs = offsets(&b, &lay.tile);
            let mask = lay.masked.then(|| offs.lt(n));
            let xs: Vec<Tile> = ins
                .iter()
                .zip(input_types(c))
                .map(|(p, t)| match mask {
                    // Masked-off lanes compute on 0 (a division by zero that must not fault).
                    Some(m) => b.load(*p + offs, Some(m), Some(zero(&b, t))),
                    None => b.load(*p + offs, None, None),
                })
                .collect();
            let r = match c.family {
                Family::Unary(op) => xs[0].apply(op),
                Family::Binary(op) => xs[0].binary(op, xs[1]),
                Family::Cmp(op) => xs[0].cmp(op, xs[1]),
                Family::Select => xs[0].select(xs[1], xs[2]),
                Family::Cast(to) => xs[0].cast(to),
                _ => xs[0],
            };
            b.store(out + offs, r, mask);
        }
    }
    b.finish()
}

/// Input types of an elementwise case, in parameter order.
pub fn input_types(c: &OpCase) -> Vec<DType> {
    match c.family {
        Family::Binary(_) | Family::Cmp(_) => vec![c.dtype; 2],
        Family::Select => vec![DType::I1, c.dtype, c.dtype],
        Family::Atomic(_) => vec![c.dtype],
        Family::AtomicCas => vec![c.dtype; 2],
        Family::Ticket => vec![],
        _ => vec![c.dtype],
    }
}

/// How many `x` inputs an atomic case takes.
fn inputs(c: &OpCase) -> usize {
    input_types(c).len()
}
