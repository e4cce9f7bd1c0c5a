//! The builder API: kernels written in Rust that read like the math.
//!
//! A [`KernelBuilder`] owns the function under construction; a [`Tile`] is a handle to one of
//! its values (a tile or a scalar) and carries the builder, so that `a + b`, `x * 2.0`,
//! `ptr + offsets` or `acc.sum(1)` append ops. Mixed shapes broadcast like NumPy (scalars splat,
//! size-1 dimensions broadcast, lower ranks gain leading 1s); a Rust literal takes the element
//! type of the tile it meets. Loops and branches take closures for their bodies.
//!
//! The builder never panics on ill-typed kernels: it appends the op with its best-guess result
//! type, and [`KernelBuilder::finish`] runs the verifier, which names the offending op and operand.
//!
//! ```
//! use trident_core::builder::KernelBuilder;
//! use trident_core::ir::{DType, LaunchAttrs};
//!
//! // out[i] = x[i] * alpha + y[i], 256 elements per program.
//! let b = KernelBuilder::new("axpy", LaunchAttrs::default());
//! let (x, y, out) = (b.arg_ptr("x", DType::F32), b.arg_ptr("y", DType::F32), b.arg_ptr("out", DType::F32));
//! let (alpha, n) = (b.arg("alpha", DType::F32), b.arg("n", DType::I32));
//! let offs = b.program_id_x() * 256 + b.arange(0, 256);
//! let mask = offs.lt(n);
//! let v = b.load(x + offs, Some(mask), None) * alpha + b.load(y + offs, Some(mask), None);
//! b.store(out + offs, v, Some(mask));
//! let kernel = b.finish().unwrap();
//! assert!(trident_core::text::print(&kernel).contains("addptr"));
//! ```

use crate::ir::*;
use crate::verify::{verify, VerifyError};
use std::cell::RefCell;

/// Builds one kernel specialization.
pub struct KernelBuilder {
    state: RefCell<State>,
}

struct State {
    func: Function,
    /// The block ops are appended to; the last entry is innermost.
    cursor: Vec<Block>,
}

/// A value of the kernel under construction: a tile or a scalar.
#[derive(Clone, Copy)]
pub struct Tile<'b> {
    b: &'b KernelBuilder,
    v: Value,
}

impl std::fmt::Debug for Tile<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tile({:?}: {})", self.v, self.ty())
    }
}

/// Something that becomes a value where one is needed: a [`Tile`] or a Rust number (which
/// takes the element type the context asks for).
pub trait IntoTile<'b> {
    fn into_tile(self, b: &'b KernelBuilder, like: Option<Elem>) -> Tile<'b>;
}

impl<'b> IntoTile<'b> for Tile<'b> {
    fn into_tile(self, _: &'b KernelBuilder, _: Option<Elem>) -> Tile<'b> {
        self
    }
}

macro_rules! literal_into_tile {
    ($($t:ty => $default:expr, $lit:expr;)*) => {$(
        impl<'b> IntoTile<'b> for $t {
            fn into_tile(self, b: &'b KernelBuilder, like: Option<Elem>) -> Tile<'b> {
                let d = match like {
                    Some(Elem::Num(d)) => d,
                    Some(Elem::Ptr(_)) => DType::I32,
                    _ => $default,
                };
                #[allow(clippy::redundant_closure_call)]
                b.constant(($lit)(self, d), d)
            }
        }
    )*};
}

fn int_or_float_i(i: i64, d: DType) -> Literal {
    if d.is_float() {
        Literal::Float(i as f64)
    } else {
        Literal::Int(i)
    }
}

fn int_or_float_f(f: f64, d: DType) -> Literal {
    if d.is_float() {
        Literal::Float(f)
    } else {
        Literal::Int(f as i64)
    }
}

literal_into_tile! {
    i32 => DType::I32, |x: i32, d| int_or_float_i(x as i64, d);
    i64 => DType::I64, |x: i64, d| int_or_float_i(x, d);
    u32 => DType::U32, |x: u32, d| int_or_float_i(x as i64, d);
    u64 => DType::U64, |x: u64, d| int_or_float_i(x as i64, d);
    f32 => DType::F32, |x: f32, d| int_or_float_f(x as f64, d);
    f64 => DType::F64, |x: f64, d| int_or_float_f(x, d);
}

impl KernelBuilder {
    pub fn new(name: &str, attrs: LaunchAttrs) -> KernelBuilder {
        let func = Function::new(name, &[], attrs);
        let body = func.body;
        KernelBuilder { state: RefCell::new(State { func, cursor: vec![body] }) }
    }

    /// Verifies and returns the kernel.
    pub fn finish(self) -> Result<Function, VerifyError> {
        let func = self.state.into_inner().func;
        verify(&func)?;
        Ok(func)
    }

    /// Returns the kernel without verifying it (for tests of the verifier itself).
    pub fn finish_unverified(self) -> Function {
        self.state.into_inner().func
    }

    fn tile(&self, v: Value) -> Tile<'_> {
        Tile { b: self, v }
    }

    fn ty_of(&self, v: Value) -> Type {
        self.state.borrow().func.ty(v).clone()
    }

    /// Appends an op at the cursor.
    fn push(&self, kind: OpKind, results: &[Type]) -> Vec<Value> {
        let mut s = self.state.borrow_mut();
        let block = *s.cursor.last().expect("the cursor always holds the body");
        let op = s.func.push_op(block, kind, results, None);
        s.func.ops[op].results.clone()
    }

    fn push1(&self, kind: OpKind, result: Type) -> Tile<'_> {
        let v = self.push(kind, &[result])[0];
        self.tile(v)
    }

    /// A scalar parameter (`i32` sizes, `f32` factors, ..).
    pub fn arg(&self, name: &str, d: DType) -> Tile<'_> {
        self.arg_typed(name, Type::num(d))
    }

    /// A pointer parameter (`!ptr<d>`).
    pub fn arg_ptr(&self, name: &str, d: DType) -> Tile<'_> {
        self.arg_typed(name, Type::ptr(d))
    }

    pub fn arg_typed(&self, name: &str, ty: Type) -> Tile<'_> {
        self.arg_with(name, ty, None)
    }

    /// A pointer parameter whose every argument is aligned to `bytes` (a power of two), checked
    /// at launch; the lowering drops the alignment tests of vector accesses it proves.
    pub fn arg_ptr_aligned(&self, name: &str, d: DType, bytes: u32) -> Tile<'_> {
        self.arg_with(name, Type::ptr(d), Some(bytes))
    }

    /// An integer parameter whose every argument is a multiple of `m` (a power of two), checked
    /// at launch.
    pub fn arg_multiple_of(&self, name: &str, d: DType, m: u32) -> Tile<'_> {
        self.arg_with(name, Type::num(d), Some(m))
    }

    fn arg_with(&self, name: &str, ty: Type, divisibility: Option<u32>) -> Tile<'_> {
        let mut s = self.state.borrow_mut();
        let index = s.func.params.len() as u32;
        let value = s.func.values.append(ValueData { ty, def: ValueDef::Param(index) });
        s.func.params.push(Param { name: name.to_string(), value, divisibility });
        drop(s);
        self.tile(value)
    }

    /// A scalar constant of type `d`.
    pub fn constant(&self, lit: Literal, d: DType) -> Tile<'_> {
        self.push1(OpKind::Const(lit), Type::num(d))
    }

    pub fn i32(&self, x: i32) -> Tile<'_> {
        self.constant(Literal::Int(x as i64), DType::I32)
    }

    pub fn u64(&self, x: u64) -> Tile<'_> {
        self.constant(Literal::Int(x as i64), DType::U64)
    }

    pub fn f32(&self, x: f32) -> Tile<'_> {
        self.constant(Literal::Float(x as f64), DType::F32)
    }

    /// A tile filled with `value`.
    pub fn full(&self, shape: &[u32], value: f64, d: DType) -> Tile<'_> {
        let s = self.constant(int_or_float_f(value, d), d);
        s.splat(shape)
    }

    pub fn zeros(&self, shape: &[u32], d: DType) -> Tile<'_> {
        self.full(shape, 0.0, d)
    }

    pub fn program_id(&self, axis: Axis) -> Tile<'_> {
        self.push1(OpKind::ProgramId(axis), Type::num(DType::I32))
    }

    pub fn program_id_x(&self) -> Tile<'_> {
        self.program_id(Axis::X)
    }

    pub fn num_programs(&self, axis: Axis) -> Tile<'_> {
        self.push1(OpKind::NumPrograms(axis), Type::num(DType::I32))
    }

    /// `[start, end)` as a 1-D `i32` tile.
    pub fn arange(&self, start: i64, end: i64) -> Tile<'_> {
        let n = end.saturating_sub(start).clamp(0, u32::MAX as i64) as u32;
        self.push1(OpKind::Arange { start, end }, Type::tile(Elem::Num(DType::I32), &[n]))
    }

    /// Loads through `ptr`; masked-off lanes give `other` (a tile or a Rust number).
    pub fn load<'b>(&'b self, ptr: Tile<'b>, mask: Option<Tile<'b>>, other: Option<Tile<'b>>) -> Tile<'b> {
        let pt = ptr.ty();
        let elem = pt.elem.pointee().map(Elem::Num).unwrap_or(Elem::Num(DType::F32));
        let rt = pt.with_elem(elem);
        let mask = mask.map(|m| m.broadcast_to(&rt.shape).v);
        let other = other.map(|o| o.broadcast_to(&rt.shape).v);
        self.push1(OpKind::Load { ptr: ptr.v, mask, other }, rt)
    }

    /// Loads with masked-off lanes set to the number `other`.
    pub fn load_or<'b>(&'b self, ptr: Tile<'b>, mask: Tile<'b>, other: impl IntoTile<'b>) -> Tile<'b> {
        let elem = ptr.ty().elem.pointee().map(Elem::Num);
        let o = other.into_tile(self, elem);
        self.load(ptr, Some(mask), Some(o))
    }

    pub fn store<'b>(&'b self, ptr: Tile<'b>, value: impl IntoTile<'b>, mask: Option<Tile<'b>>) {
        let pt = ptr.ty();
        let value = value.into_tile(self, pt.elem.pointee().map(Elem::Num)).broadcast_to(&pt.shape);
        let mask = mask.map(|m| m.broadcast_to(&pt.shape).v);
        self.push(OpKind::Store { ptr: ptr.v, value: value.v, mask }, &[]);
    }

    /// A 2-D tensor descriptor over the tensor at `ptr` with `shape` (rows, columns) and
    /// `strides` (elements), read and written in `block`s (`OpKind::MakeDesc`). Scalars may be
    /// i32 tiles or Rust numbers.
    pub fn make_desc<'b>(
        &'b self,
        ptr: Tile<'b>,
        shape: [impl IntoTile<'b>; 2],
        strides: [impl IntoTile<'b>; 2],
        block: [u32; 2],
    ) -> Tile<'b> {
        let d = ptr.ty().elem.pointee().unwrap_or(DType::F32);
        let i32t = Some(Elem::Num(DType::I32));
        let [r, c] = shape.map(|x| x.into_tile(self, i32t).v);
        let [s0, s1] = strides.map(|x| x.into_tile(self, i32t).v);
        self.push1(
            OpKind::MakeDesc { ptr: ptr.v, shape: [r, c], strides: [s0, s1] },
            Type::scalar(Elem::Desc { dtype: d, block }),
        )
    }

    /// The block of `desc` at `offsets` (row, column); 0 outside the tensor.
    pub fn desc_load<'b>(&'b self, desc: Tile<'b>, offsets: [impl IntoTile<'b>; 2]) -> Tile<'b> {
        let (d, block) = desc.ty().elem.desc().unwrap_or((DType::F32, [1, 1]));
        let [o0, o1] = offsets.map(|x| x.into_tile(self, Some(Elem::Num(DType::I32))).v);
        self.push1(OpKind::DescLoad { desc: desc.v, offsets: [o0, o1] }, Type::tile(Elem::Num(d), &block))
    }

    /// Writes the block `value` at `offsets`; elements outside the tensor are left alone.
    pub fn desc_store<'b>(&'b self, desc: Tile<'b>, offsets: [impl IntoTile<'b>; 2], value: Tile<'b>) {
        let [o0, o1] = offsets.map(|x| x.into_tile(self, Some(Elem::Num(DType::I32))).v);
        self.push(OpKind::DescStore { desc: desc.v, offsets: [o0, o1], value: value.v }, &[]);
    }

    /// Atomic read-modify-write; returns the old values.
    pub fn atomic<'b>(
        &'b self,
        op: AtomicOp,
        ptr: Tile<'b>,
        value: impl IntoTile<'b>,
        mask: Option<Tile<'b>>,
        sem: MemSemantic,
        scope: Scope,
    ) -> Tile<'b> {
        let pt = ptr.ty();
        let value = value.into_tile(self, pt.elem.pointee().map(Elem::Num)).broadcast_to(&pt.shape);
        let mask = mask.map(|m| m.broadcast_to(&pt.shape).v);
        let rt = value.ty();
        self.push1(OpKind::Atomic { op, ptr: ptr.v, value: value.v, mask, sem, scope }, rt)
    }

    /// The words at `ptr` (64-bit integers) once every unmasked one's flag, its high 32 bits,
    /// equals `flag` (an `i32` or `u32` scalar): the receiving side of the low-latency protocol.
    /// Masked-off elements are 0.
    pub fn load_flagged<'b>(&'b self, ptr: Tile<'b>, flag: impl IntoTile<'b>, mask: Option<Tile<'b>>) -> Tile<'b> {
        let pt = ptr.ty();
        let flag = flag.into_tile(self, Some(Elem::Num(DType::U32)));
        let mask = mask.map(|m| m.broadcast_to(&pt.shape).v);
        let d = pt.elem.pointee().unwrap_or(DType::U64);
        self.push1(OpKind::LoadFlagged { ptr: ptr.v, flag: flag.v, mask }, Type::tile(Elem::Num(d), &pt.shape))
    }

    pub fn atomic_cas<'b>(
        &'b self,
        ptr: Tile<'b>,
        expected: impl IntoTile<'b>,
        desired: impl IntoTile<'b>,
        sem: MemSemantic,
        scope: Scope,
    ) -> Tile<'b> {
        let like = ptr.ty().elem.pointee().map(Elem::Num);
        let (e, d) = (expected.into_tile(self, like), desired.into_tile(self, like));
        let rt = e.ty();
        self.push1(OpKind::AtomicCas { ptr: ptr.v, expected: e.v, desired: d.v, sem, scope }, rt)
    }

    /// `acc + a @ b`.
    pub fn dot<'b>(&'b self, a: Tile<'b>, b: Tile<'b>, acc: Tile<'b>, precision: InputPrecision) -> Tile<'b> {
        let rt = acc.ty();
        self.push1(OpKind::Dot { a: a.v, b: b.v, acc: acc.v, precision }, rt)
    }

    /// Runs `body` inside a new block with the given argument types; returns the block.
    fn region<'b>(&'b self, args: &[Type], body: impl FnOnce(&[Tile<'b>]) -> Vec<Tile<'b>>) -> Block {
        let block = self.state.borrow_mut().func.new_block(args);
        let arg_values = self.state.borrow().func.blocks[block].args.clone();
        self.state.borrow_mut().cursor.push(block);
        let tiles: Vec<Tile<'b>> = arg_values.into_iter().map(|v| self.tile(v)).collect();
        let yields = body(&tiles);
        let mut s = self.state.borrow_mut();
        s.cursor.pop();
        s.func.blocks[block].yields = yields.iter().map(|t| t.v).collect();
        block
    }

    /// `for iv in (lower..upper).step_by(step)` carrying `init`; `body(iv, carried)` returns
    /// the next carried values. Returns the final carried values.
    pub fn for_range<'b>(
        &'b self,
        lower: impl IntoTile<'b>,
        upper: impl IntoTile<'b>,
        step: impl IntoTile<'b>,
        init: &[Tile<'b>],
        body: impl FnOnce(Tile<'b>, &[Tile<'b>]) -> Vec<Tile<'b>>,
    ) -> Vec<Tile<'b>> {
        let lower = lower.into_tile(self, Some(Elem::Num(DType::I32)));
        let like = Some(lower.ty().elem);
        let (upper, step) = (upper.into_tile(self, like), step.into_tile(self, like));
        let mut args = vec![lower.ty()];
        args.extend(init.iter().map(|t| t.ty()));
        let block = self.region(&args, |a| body(a[0], &a[1..]));
        let carried: Vec<Type> = init.iter().map(|t| t.ty()).collect();
        let kind = OpKind::For {
            lower: lower.v,
            upper: upper.v,
            step: step.v,
            init: init.iter().map(|t| t.v).collect(),
            body: block,
        };
        self.push(kind, &carried).into_iter().map(|v| self.tile(v)).collect()
    }

    /// `if cond { then() } else { otherwise() }`; both closures return values of the same types,
    /// which become the op's results.
    pub fn if_else<'b>(
        &'b self,
        cond: Tile<'b>,
        then: impl FnOnce() -> Vec<Tile<'b>>,
        otherwise: impl FnOnce() -> Vec<Tile<'b>>,
    ) -> Vec<Tile<'b>> {
        let mut result_types = Vec::new();
        let then_block = self.region(&[], |_| {
            let ys = then();
            result_types = ys.iter().map(|t| t.ty()).collect();
            ys
        });
        let else_block = self.region(&[], |_| otherwise());
        let kind = OpKind::If { cond: cond.v, then_block, else_block };
        self.push(kind, &result_types).into_iter().map(|v| self.tile(v)).collect()
    }

    /// `if cond { then() }` without results.
    pub fn if_then<'b>(&'b self, cond: Tile<'b>, then: impl FnOnce()) {
        self.if_else(
            cond,
            || {
                then();
                Vec::new()
            },
            Vec::new,
        );
    }

    /// `while cond(carried) { carried = body(carried) }`; returns the final carried values.
    pub fn while_loop<'b>(
        &'b self,
        init: &[Tile<'b>],
        cond: impl FnOnce(&[Tile<'b>]) -> Tile<'b>,
        body: impl FnOnce(&[Tile<'b>]) -> Vec<Tile<'b>>,
    ) -> Vec<Tile<'b>> {
        let carried: Vec<Type> = init.iter().map(|t| t.ty()).collect();
        let cond_block = self.region(&carried, |a| vec![cond(a)]);
        let body_block = self.region(&carried, body);
        let kind = OpKind::While { init: init.iter().map(|t| t.v).collect(), cond: cond_block, body: body_block };
        self.push(kind, &carried).into_iter().map(|v| self.tile(v)).collect()
    }

    // --- distributed ops ---

    pub fn rank(&self) -> Tile<'_> {
        self.push1(OpKind::Rank, Type::num(DType::I32))
    }

    pub fn num_ranks(&self) -> Tile<'_> {
        self.push1(OpKind::NumRanks, Type::num(DType::I32))
    }

    /// The address of the symmetric object `ptr` on `rank`.
    pub fn symm_at<'b>(&'b self, ptr: Tile<'b>, rank: impl IntoTile<'b>) -> Tile<'b> {
        let rank = rank.into_tile(self, Some(Elem::Num(DType::I32)));
        let rt = ptr.ty();
        self.push1(OpKind::SymmAt { ptr: ptr.v, rank: rank.v }, rt)
    }

    pub fn notify<'b>(
        &'b self,
        sig: Tile<'b>,
        rank: impl IntoTile<'b>,
        value: impl IntoTile<'b>,
        op: SignalOp,
        scope: CommScope,
    ) {
        let rank = rank.into_tile(self, Some(Elem::Num(DType::I32)));
        let value = value.into_tile(self, Some(Elem::Num(DType::U64)));
        self.push(OpKind::Notify { sig: sig.v, rank: rank.v, value: value.v, op, scope }, &[]);
    }

    /// Waits until `count` signals from `sigs` satisfy `signal <cmp> value`; returns the token
    /// to pass to [`Tile::consume_token`].
    pub fn wait<'b>(
        &'b self,
        sigs: Tile<'b>,
        count: impl IntoTile<'b>,
        cmp: CmpOp,
        value: impl IntoTile<'b>,
        scope: Scope,
        sem: MemSemantic,
    ) -> Tile<'b> {
        let count = count.into_tile(self, Some(Elem::Num(DType::I32)));
        let value = value.into_tile(self, Some(Elem::Num(DType::U64)));
        self.push1(OpKind::Wait { sigs: sigs.v, count: count.v, cmp, value: value.v, scope, sem }, Type::token())
    }

    pub fn put<'b>(
        &'b self,
        dst: Tile<'b>,
        src: Tile<'b>,
        bytes: impl IntoTile<'b>,
        rank: impl IntoTile<'b>,
        group: Group,
        nbi: bool,
    ) {
        let bytes = bytes.into_tile(self, Some(Elem::Num(DType::I64)));
        let rank = rank.into_tile(self, Some(Elem::Num(DType::I32)));
        self.push(OpKind::Put { dst: dst.v, src: src.v, bytes: bytes.v, rank: rank.v, group, nbi }, &[]);
    }

    pub fn get<'b>(
        &'b self,
        dst: Tile<'b>,
        src: Tile<'b>,
        bytes: impl IntoTile<'b>,
        rank: impl IntoTile<'b>,
        group: Group,
        nbi: bool,
    ) {
        let bytes = bytes.into_tile(self, Some(Elem::Num(DType::I64)));
        let rank = rank.into_tile(self, Some(Elem::Num(DType::I32)));
        self.push(OpKind::Get { dst: dst.v, src: src.v, bytes: bytes.v, rank: rank.v, group, nbi }, &[]);
    }

    #[allow(clippy::too_many_arguments)]
    pub fn put_signal<'b>(
        &'b self,
        dst: Tile<'b>,
        src: Tile<'b>,
        bytes: impl IntoTile<'b>,
        sig: Tile<'b>,
        sig_value: impl IntoTile<'b>,
        sig_op: SignalOp,
        rank: impl IntoTile<'b>,
        group: Group,
        nbi: bool,
    ) {
        let bytes = bytes.into_tile(self, Some(Elem::Num(DType::I64)));
        let sig_value = sig_value.into_tile(self, Some(Elem::Num(DType::U64)));
        let rank = rank.into_tile(self, Some(Elem::Num(DType::I32)));
        let kind = OpKind::PutSignal {
            dst: dst.v,
            src: src.v,
            bytes: bytes.v,
            sig: sig.v,
            sig_value: sig_value.v,
            sig_op,
            rank: rank.v,
            group,
            nbi,
        };
        self.push(kind, &[]);
    }

    pub fn signal_wait_until<'b>(&'b self, sig: Tile<'b>, cmp: CmpOp, value: impl IntoTile<'b>) -> Tile<'b> {
        let value = value.into_tile(self, Some(Elem::Num(DType::U64)));
        self.push1(OpKind::SignalWaitUntil { sig: sig.v, cmp, value: value.v }, Type::num(DType::U64))
    }

    /// Program-wide barrier (`bar.sync`): orders every thread's earlier accesses before any
    /// thread's later ones, so that a following single-thread release publishes them all.
    pub fn barrier(&self) {
        self.push(OpKind::Barrier, &[]);
    }

    pub fn fence(&self) {
        self.push(OpKind::Fence, &[]);
    }

    pub fn quiet(&self) {
        self.push(OpKind::Quiet, &[]);
    }

    pub fn barrier_all(&self, group: Group) {
        self.push(OpKind::BarrierAll { group }, &[]);
    }
}

/// Shape that two shapes broadcast to (NumPy rules), or `None` when they are incompatible.
fn broadcast_shape(a: &[u32], b: &[u32]) -> Option<Vec<u32>> {
    let n = a.len().max(b.len());
    let pad = |s: &[u32]| -> Vec<u32> { std::iter::repeat_n(1, n - s.len()).chain(s.iter().copied()).collect() };
    let (a, b) = (pad(a), pad(b));
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| {
            if x == y || y == 1 {
                Some(x)
            } else if x == 1 {
                Some(y)
            } else {
                None
            }
        })
        .collect()
}

impl<'b> Tile<'b> {
    /// The IR value.
    pub fn value(self) -> Value {
        self.v
    }

    pub fn ty(self) -> Type {
        self.b.ty_of(self.v)
    }

    pub fn shape(self) -> Vec<u32> {
        self.ty().shape
    }

    pub fn elem(self) -> Elem {
        self.ty().elem
    }

    fn op1(self, kind: OpKind, rt: Type) -> Tile<'b> {
        self.b.push1(kind, rt)
    }

    /// Repeats a scalar into a tile.
    pub fn splat(self, shape: &[u32]) -> Tile<'b> {
        let rt = Type::tile(self.elem(), shape);
        self.op1(OpKind::Splat(self.v), rt)
    }

    /// Broadcasts to `shape` (splat for scalars, leading 1s added, size-1 dims expanded);
    /// returns `self` when the shape already matches.
    pub fn broadcast_to(self, shape: &[u32]) -> Tile<'b> {
        let ty = self.ty();
        if ty.shape == shape {
            return self;
        }
        if ty.is_scalar() {
            return self.splat(shape);
        }
        let mut t = self;
        if ty.shape.len() < shape.len() {
            let mut s = vec![1; shape.len() - ty.shape.len()];
            s.extend(&ty.shape);
            t = t.reshape(&s);
        }
        if t.shape() == shape {
            return t;
        }
        t.op1(OpKind::Broadcast(t.v), Type::tile(ty.elem, shape))
    }

    pub fn reshape(self, shape: &[u32]) -> Tile<'b> {
        let rt = Type::tile(self.elem(), shape);
        self.op1(OpKind::Reshape(self.v), rt)
    }

    /// Inserts a dimension of size 1 before `axis` (`x[:, None]` is `expand_dims(1)`).
    pub fn expand_dims(self, axis: usize) -> Tile<'b> {
        let mut s = self.shape();
        s.insert(axis.min(s.len()), 1);
        self.reshape(&s)
    }

    /// Permutes dimensions.
    pub fn permute(self, perm: &[u32]) -> Tile<'b> {
        let ty = self.ty();
        let shape = perm.iter().map(|p| ty.shape.get(*p as usize).copied().unwrap_or(0)).collect();
        self.op1(OpKind::Transpose { x: self.v, perm: perm.to_vec() }, Type { elem: ty.elem, shape })
    }

    /// Swaps the two dimensions of a 2-D tile.
    pub fn t(self) -> Tile<'b> {
        self.permute(&[1, 0])
    }

    /// Numeric conversion.
    pub fn cast(self, d: DType) -> Tile<'b> {
        let ty = self.ty();
        if ty.elem == Elem::Num(d) {
            return self;
        }
        self.op1(OpKind::Cast(self.v), ty.with_elem(Elem::Num(d)))
    }

    fn unary(self, op: UnaryOp) -> Tile<'b> {
        let rt = self.ty();
        self.op1(OpKind::Unary { op, x: self.v }, rt)
    }

    pub fn exp(self) -> Tile<'b> {
        self.unary(UnaryOp::Exp)
    }
    pub fn exp2(self) -> Tile<'b> {
        self.unary(UnaryOp::Exp2)
    }
    pub fn log(self) -> Tile<'b> {
        self.unary(UnaryOp::Log)
    }
    pub fn sqrt(self) -> Tile<'b> {
        self.unary(UnaryOp::Sqrt)
    }
    pub fn rsqrt(self) -> Tile<'b> {
        self.unary(UnaryOp::Rsqrt)
    }
    pub fn abs(self) -> Tile<'b> {
        self.unary(UnaryOp::Abs)
    }
    pub fn tanh(self) -> Tile<'b> {
        self.unary(UnaryOp::Tanh)
    }
    pub fn sigmoid(self) -> Tile<'b> {
        self.unary(UnaryOp::Sigmoid)
    }
    pub fn erf(self) -> Tile<'b> {
        self.unary(UnaryOp::Erf)
    }
    pub fn apply(self, op: UnaryOp) -> Tile<'b> {
        self.unary(op)
    }

    /// Brings `self` and `rhs` to a common shape; a Rust literal takes `self`'s element type.
    fn align(self, rhs: impl IntoTile<'b>) -> (Tile<'b>, Tile<'b>) {
        let lhs_elem = self.elem();
        let like = match lhs_elem {
            Elem::Ptr(_) => Elem::Num(DType::I32),
            e => e,
        };
        let rhs = rhs.into_tile(self.b, Some(like));
        let (ls, rs) = (self.shape(), rhs.shape());
        match broadcast_shape(&ls, &rs) {
            Some(s) => (self.broadcast_to(&s), rhs.broadcast_to(&s)),
            None => (self, rhs),
        }
    }

    /// Elementwise binary op with broadcasting.
    pub fn binary(self, op: BinaryOp, rhs: impl IntoTile<'b>) -> Tile<'b> {
        let (l, r) = self.align(rhs);
        let rt = l.ty();
        self.op1(OpKind::Binary { op, lhs: l.v, rhs: r.v }, rt)
    }

    /// Elementwise comparison with broadcasting.
    pub fn cmp(self, op: CmpOp, rhs: impl IntoTile<'b>) -> Tile<'b> {
        let (l, r) = self.align(rhs);
        let rt = l.ty().with_elem(Elem::Num(DType::I1));
        self.op1(OpKind::Cmp { op, lhs: l.v, rhs: r.v }, rt)
    }

    pub fn lt(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.cmp(CmpOp::Lt, rhs)
    }
    pub fn le(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.cmp(CmpOp::Le, rhs)
    }
    pub fn gt(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.cmp(CmpOp::Gt, rhs)
    }
    pub fn ge(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.cmp(CmpOp::Ge, rhs)
    }
    pub fn eq(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.cmp(CmpOp::Eq, rhs)
    }
    pub fn ne(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.cmp(CmpOp::Ne, rhs)
    }
    pub fn min(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.binary(BinaryOp::Min, rhs)
    }
    pub fn max(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.binary(BinaryOp::Max, rhs)
    }
    /// `self` to the power `rhs` (floats).
    pub fn pow(self, rhs: impl IntoTile<'b>) -> Tile<'b> {
        self.binary(BinaryOp::Pow, rhs)
    }

    /// `cond ? on_true : on_false` elementwise, with `self` as the condition.
    pub fn select(self, on_true: impl IntoTile<'b>, on_false: impl IntoTile<'b>) -> Tile<'b> {
        let t = on_true.into_tile(self.b, None);
        let (t, f) = t.align(on_false);
        let shape = broadcast_shape(&self.shape(), &t.shape()).unwrap_or_else(|| t.shape());
        let (c, t, f) = (self.broadcast_to(&shape), t.broadcast_to(&shape), f.broadcast_to(&shape));
        let rt = t.ty();
        self.op1(OpKind::Select { cond: c.v, on_true: t.v, on_false: f.v }, rt)
    }

    /// Reduction along `axis`.
    pub fn reduce(self, op: ReduceOp, axis: u32) -> Tile<'b> {
        let ty = self.ty();
        let mut shape = ty.shape.clone();
        if (axis as usize) < shape.len() {
            shape.remove(axis as usize);
        }
        let elem = match op {
            ReduceOp::Argmax | ReduceOp::Argmin => Elem::Num(DType::I32),
            _ => ty.elem,
        };
        self.op1(OpKind::Reduce { op, axis, x: self.v }, Type { elem, shape })
    }

    pub fn sum(self, axis: u32) -> Tile<'b> {
        self.reduce(ReduceOp::Sum, axis)
    }
    pub fn max_along(self, axis: u32) -> Tile<'b> {
        self.reduce(ReduceOp::Max, axis)
    }
    pub fn min_along(self, axis: u32) -> Tile<'b> {
        self.reduce(ReduceOp::Min, axis)
    }
    pub fn argmax(self, axis: u32) -> Tile<'b> {
        self.reduce(ReduceOp::Argmax, axis)
    }

    /// Orders this value after the wait that produced `token`.
    pub fn consume_token(self, token: Tile<'b>) -> Tile<'b> {
        let rt = self.ty();
        self.op1(OpKind::ConsumeToken { value: self.v, token: token.v }, rt)
    }
}

macro_rules! binary_operator {
    ($($trait:ident $method:ident => $op:ident;)*) => {$(
        impl<'b, R: IntoTile<'b>> std::ops::$trait<R> for Tile<'b> {
            type Output = Tile<'b>;
            fn $method(self, rhs: R) -> Tile<'b> {
                self.binary(BinaryOp::$op, rhs)
            }
        }
    )*};
}

binary_operator! {
    Sub sub => Sub;
    Mul mul => Mul;
    Div div => Div;
    Rem rem => Rem;
    BitAnd bitand => And;
    BitOr bitor => Or;
    BitXor bitxor => Xor;
    Shl shl => Shl;
    Shr shr => Shr;
}

/// `+` is pointer arithmetic (`addptr`) when the left side is a pointer, addition otherwise.
impl<'b, R: IntoTile<'b>> std::ops::Add<R> for Tile<'b> {
    type Output = Tile<'b>;
    fn add(self, rhs: R) -> Tile<'b> {
        if let Elem::Ptr(_) = self.elem() {
            let (p, o) = self.align(rhs);
            let rt = p.ty();
            return self.op1(OpKind::AddPtr { ptr: p.v, offset: o.v }, rt);
        }
        self.binary(BinaryOp::Add, rhs)
    }
}

impl<'b> std::ops::Neg for Tile<'b> {
    type Output = Tile<'b>;
    fn neg(self) -> Tile<'b> {
        self.unary(UnaryOp::Neg)
    }
}

impl<'b> std::ops::Not for Tile<'b> {
    type Output = Tile<'b>;
    fn not(self) -> Tile<'b> {
        self.unary(UnaryOp::Not)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rules() {
        assert_eq!(broadcast_shape(&[64, 1], &[1, 32]), Some(vec![64, 32]));
        assert_eq!(broadcast_shape(&[], &[8]), Some(vec![8]));
        assert_eq!(broadcast_shape(&[32], &[64, 32]), Some(vec![64, 32]));
        assert_eq!(broadcast_shape(&[3], &[4]), None);
    }

    #[test]
    fn ill_typed_kernel_is_a_verify_error_not_a_panic() {
        let b = KernelBuilder::new("bad", LaunchAttrs::default());
        let x = b.arange(0, 64).cast(DType::F32);
        let y = b.arange(0, 64);
        let _ = x + y; // f32 + i32: no implicit promotion
        let err = b.finish().unwrap_err();
        assert_eq!(err.op, "add");
        assert_eq!(err.operand.as_deref(), Some("rhs"));
    }
}
