//! The verifier: checks the invariants documented in [`crate::ir`]. Backends compile only
//! verified functions and rely on its success (types agree, values dominate their uses, shapes
//! are powers of two), so they contain no defensive type checks of their own.

use crate::ir::*;
use std::collections::HashSet;

/// Largest number of elements in one tile value.
pub const MAX_TILE_ELEMENTS: u64 = 1 << 24;

/// What is wrong with a function, naming the op and operand (boxed: errors stay one word).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.0.render())]
pub struct VerifyError(pub Box<VerifyErrorInfo>);

impl std::ops::Deref for VerifyError {
    type Target = VerifyErrorInfo;
    fn deref(&self) -> &VerifyErrorInfo {
        &self.0
    }
}

/// The details of a [`VerifyError`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyErrorInfo {
    /// Kernel name.
    pub kernel: String,
    /// Mnemonic of the offending op (`kernel` for errors in the signature).
    pub op: String,
    /// Index of the op in the function's op arena.
    pub op_index: Option<usize>,
    /// Position in the text IR when the function was parsed.
    pub loc: Option<Loc>,
    /// The operand at fault, by its role (`lhs`, `mask`, ..).
    pub operand: Option<String>,
    pub message: String,
}

impl VerifyErrorInfo {
    fn render(&self) -> String {
        let mut s = format!("kernel @{}: `{}`", self.kernel, self.op);
        if let Some(i) = self.op_index {
            s += &format!(" (op #{i}");
            if let Some(l) = self.loc {
                s += &format!(", line {}:{}", l.line, l.col);
            }
            s += ")";
        }
        if let Some(o) = &self.operand {
            s += &format!(", operand `{o}`");
        }
        s + ": " + &self.message
    }
}

/// Checks a function; on success backends may assume the module invariants.
pub fn verify(func: &Function) -> Result<(), VerifyError> {
    let mut v = Verifier { func, visible: HashSet::new(), op: None, used_blocks: HashSet::new() };
    v.signature()?;
    let body = func.body;
    v.used_blocks.insert(body);
    let b = v.block_data(body)?;
    if !b.args.is_empty() || !b.yields.is_empty() {
        return Err(v.error(None, "the kernel body takes no arguments and yields nothing"));
    }
    v.block(body)?;
    Ok(())
}

struct Verifier<'a> {
    func: &'a Function,
    visible: HashSet<Value>,
    op: Option<Op>,
    used_blocks: HashSet<Block>,
}

type VResult<T = ()> = Result<T, VerifyError>;

fn is_pow2(d: u32) -> bool {
    d != 0 && d & (d - 1) == 0
}

impl<'a> Verifier<'a> {
    fn error(&self, operand: Option<&str>, message: impl Into<String>) -> VerifyError {
        let (op, op_index, loc) = match self.op.and_then(|o| self.func.ops.get(o).map(|d| (o, d))) {
            Some((o, d)) => (d.kind.mnemonic().to_string(), Some(o.index()), d.loc),
            None => ("kernel".to_string(), None, None),
        };
        VerifyError(Box::new(VerifyErrorInfo {
            kernel: self.func.name.clone(),
            op,
            op_index,
            loc,
            operand: operand.map(str::to_string),
            message: message.into(),
        }))
    }

    fn fail<T>(&self, operand: &str, message: impl Into<String>) -> VResult<T> {
        Err(self.error(Some(operand), message))
    }

    fn block_data(&self, b: Block) -> VResult<&'a BlockData> {
        self.func.blocks.get(b).ok_or_else(|| self.error(None, format!("refers to missing block {b:?}")))
    }

    fn ty(&self, v: Value) -> VResult<&'a Type> {
        self.func.values.get(v).map(|d| &d.ty).ok_or_else(|| self.error(None, format!("refers to missing value {v:?}")))
    }

    fn check_type(&self, what: &str, t: &Type) -> VResult {
        if t.elem == Elem::Token && !t.is_scalar() {
            return self.fail(what, "`!token` values are scalars");
        }
        if let Some(d) = t.shape.iter().find(|d| !is_pow2(**d)) {
            return self.fail(what, format!("tile dimension {d} of `{t}` is not a power of two"));
        }
        if t.numel() > MAX_TILE_ELEMENTS {
            return self.fail(what, format!("`{t}` has more than {MAX_TILE_ELEMENTS} elements"));
        }
        Ok(())
    }

    fn signature(&self) -> VResult {
        let f = self.func;
        if f.name.is_empty() || !f.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(self.error(None, format!("kernel name `{}` is not an identifier", f.name)));
        }
        let a = f.attrs;
        if !is_pow2(a.warps) || a.warps > 32 {
            return Err(self.error(None, format!("warps = {} is not a power of two in 1..=32", a.warps)));
        }
        if a.stages == 0 || a.stages > 8 {
            return Err(self.error(None, format!("stages = {} is not in 1..=8", a.stages)));
        }
        let mut names = HashSet::new();
        for p in &f.params {
            let t = self.ty(p.value)?;
            if !t.is_scalar() || t.elem == Elem::Token {
                return self.fail(&p.name, format!("kernel parameters are scalars or pointers, found `{t}`"));
            }
            if p.name.is_empty() || !p.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return self.fail(&p.name, "parameter name is not an identifier");
            }
            if !names.insert(p.name.as_str()) {
                return self.fail(&p.name, "parameter declared twice");
            }
            if let Some(d) = p.divisibility {
                let int = t.elem.dtype().is_some_and(|x| x.is_int() && x != DType::I1);
                if t.elem.pointee().is_none() && !int {
                    return self.fail(&p.name, format!("a divisibility fact on `{t}` (only pointers and integers)"));
                }
                if !is_pow2(d) {
                    return self.fail(&p.name, format!("divisibility {d} is not a power of two"));
                }
            }
        }
        Ok(())
    }

    fn define(&mut self, v: Value, what: &str) -> VResult {
        let t = self.ty(v)?.clone();
        self.check_type(what, &t)?;
        self.visible.insert(v);
        Ok(())
    }

    fn block(&mut self, b: Block) -> VResult {
        let data = self.block_data(b)?;
        for &op in &data.ops {
            self.op = Some(op);
            let Some(od) = self.func.ops.get(op) else {
                return Err(self.error(None, "refers to a missing op"));
            };
            self.check_operands_visible(&od.kind)?;
            self.check_op(&od.kind, &od.results)?;
            for r in od.results.clone() {
                self.define(r, "result")?;
            }
        }
        for y in &data.yields {
            if !self.is_visible(*y) {
                return self.fail("yield", format!("yields value {y:?} that is not defined before it"));
            }
        }
        Ok(())
    }

    fn is_visible(&self, v: Value) -> bool {
        match self.func.values.get(v).map(|d| d.def) {
            Some(ValueDef::Param(_)) => true,
            Some(_) => self.visible.contains(&v),
            None => false,
        }
    }

    fn check_operands_visible(&self, kind: &OpKind) -> VResult {
        for (role, v) in kind.operands() {
            if !self.is_visible(v) {
                return self.fail(role, "uses a value that is not defined before this op in an enclosing block");
            }
        }
        Ok(())
    }

    /// Verifies a region block with the given argument types and expected yield types.
    fn region(&mut self, b: Block, what: &str, args: &[Type], yields: &[Type]) -> VResult {
        if !self.used_blocks.insert(b) {
            return self.fail(what, "a block is the region of two ops");
        }
        let data = self.block_data(b)?;
        let arg_types: Vec<Type> = data.args.iter().map(|a| self.ty(*a).cloned()).collect::<VResult<_>>()?;
        if arg_types != args {
            return self.fail(what, format!("block arguments are ({}), expected ({})", list(&arg_types), list(args)));
        }
        let op = self.op;
        let saved = self.visible.clone();
        for a in &data.args {
            self.define(*a, what)?;
        }
        self.block(b)?;
        self.op = op;
        let ytypes: Vec<Type> = data.yields.iter().map(|v| self.ty(*v).cloned()).collect::<VResult<_>>()?;
        self.visible = saved;
        if ytypes != yields {
            return self.fail(what, format!("block yields ({}), expected ({})", list(&ytypes), list(yields)));
        }
        Ok(())
    }

    fn results_are(&self, results: &[Value], want: &[Type]) -> VResult {
        let got: Vec<Type> = results.iter().map(|r| self.ty(*r).cloned()).collect::<VResult<_>>()?;
        if got != want {
            return self.fail("result", format!("result types are ({}), expected ({})", list(&got), list(want)));
        }
        Ok(())
    }

    fn one_result(&self, results: &[Value]) -> VResult<&'a Type> {
        match results {
            [r] => self.ty(*r),
            _ => self.fail("result", format!("has {} results, expected 1", results.len())),
        }
    }

    fn num(&self, role: &str, v: Value) -> VResult<(DType, &'a Type)> {
        let t = self.ty(v)?;
        match t.elem {
            Elem::Num(d) => Ok((d, t)),
            _ => self.fail(role, format!("expected a number or numeric tile, found `{t}`")),
        }
    }

    fn scalar_of(&self, role: &str, v: Value, ok: impl Fn(&Elem) -> bool, want: &str) -> VResult<&'a Type> {
        let t = self.ty(v)?;
        if !t.is_scalar() || !ok(&t.elem) {
            return self.fail(role, format!("expected {want}, found `{t}`"));
        }
        Ok(t)
    }

    /// A descriptor operand: a `!desc` scalar made by `make_desc` itself (not a parameter nor a
    /// value carried through a loop or branch), so backends see its parts.
    fn desc_operand(&self, v: Value) -> VResult<(DType, [u32; 2])> {
        let t = self.scalar_of("desc", v, |e| e.desc().is_some(), "a `!desc<..>` scalar")?;
        let made = match self.func.values.get(v).map(|x| x.def) {
            Some(ValueDef::Result { op, .. }) => matches!(self.func.ops[op].kind, OpKind::MakeDesc { .. }),
            _ => false,
        };
        if !made {
            return self.fail("desc", "a descriptor must be the result of `make_desc` itself");
        }
        Ok(t.elem.desc().expect("checked"))
    }

    fn int_scalar(&self, role: &str, v: Value) -> VResult<&'a Type> {
        self.scalar_of(role, v, |e| matches!(e, Elem::Num(d) if d.is_int() && *d != DType::I1), "an integer scalar")
    }

    fn i32_scalar(&self, role: &str, v: Value) -> VResult {
        self.scalar_of(role, v, |e| *e == Elem::Num(DType::I32), "an i32 scalar").map(|_| ())
    }

    fn u64_scalar(&self, role: &str, v: Value) -> VResult {
        self.scalar_of(role, v, |e| *e == Elem::Num(DType::U64), "a u64 scalar").map(|_| ())
    }

    fn signal_ptr(&self, role: &str, v: Value) -> VResult {
        self.scalar_of(role, v, |e| *e == Elem::Ptr(DType::U64), "a `!ptr<u64>` signal pointer").map(|_| ())
    }

    fn ptr_scalar(&self, role: &str, v: Value) -> VResult {
        self.scalar_of(role, v, |e| matches!(e, Elem::Ptr(_)), "a scalar pointer").map(|_| ())
    }

    fn mask(&self, mask: Option<Value>, shape: &[u32]) -> VResult {
        if let Some(m) = mask {
            let t = self.ty(m)?;
            if t.elem != Elem::Num(DType::I1) || t.shape != shape {
                return self.fail("mask", format!("expected i1 of shape {shape:?}, found `{t}`"));
            }
        }
        Ok(())
    }

    /// `ptr` points to the element type of `value` and has its shape.
    fn ptr_matches(&self, ptr: Value, data: &Type, data_role: &str) -> VResult {
        let pt = self.ty(ptr)?;
        let Elem::Ptr(p) = pt.elem else {
            return self.fail("ptr", format!("expected a pointer, found `{pt}`"));
        };
        if data.elem != Elem::Num(p) || data.shape != pt.shape {
            return self.fail(data_role, format!("`{data}` does not match pointer `{pt}`"));
        }
        Ok(())
    }

    /// FP8 values are stored, loaded, converted and multiplied by `dot`, never computed on:
    /// no GPU has FP8 arithmetic outside its tensor cores.
    fn no_fp8_arithmetic(&self, op: &str, role: &'static str, d: DType, t: &Type) -> VResult {
        if d.is_fp8() {
            return self.fail(
                role,
                format!("`{op}` on `{t}`: FP8 values have no arithmetic; cast them to f16, bf16 or f32 first"),
            );
        }
        Ok(())
    }

    fn check_op(&mut self, kind: &OpKind, results: &[Value]) -> VResult {
        match kind {
            OpKind::Const(lit) => {
                let t = self.one_result(results)?;
                let ok = match (t.dtype(), lit) {
                    (Some(d), Literal::Float(_)) => d.is_float(),
                    (Some(d), Literal::Int(i)) => d.is_int() && (d != DType::I1 || *i == 0 || *i == 1),
                    (None, _) => false,
                };
                if !ok || !t.is_scalar() {
                    return self.fail("result", format!("literal {lit:?} cannot have type `{t}`"));
                }
                if let (Some(d), Some(why)) = (t.dtype(), t.dtype().and_then(|d| literal_range_error(*lit, d))) {
                    return self.fail("result", format!("literal {} does not fit `{d}`: {why}", literal_text(*lit, d)));
                }
            }
            OpKind::ProgramId(_) | OpKind::NumPrograms(_) | OpKind::Rank | OpKind::NumRanks => {
                self.results_are(results, &[Type::num(DType::I32)])?
            }
            OpKind::Arange { start, end } => {
                let n = end.checked_sub(*start).filter(|n| *n > 0 && *n <= MAX_TILE_ELEMENTS as i64);
                let Some(n) = n else {
                    return self.fail("range", format!("empty or huge range [{start}, {end})"));
                };
                if *start < i32::MIN as i64 || *end > i32::MAX as i64 + 1 {
                    return self.fail("range", "bounds do not fit i32");
                }
                self.results_are(results, &[Type::tile(Elem::Num(DType::I32), &[n as u32])])?;
            }
            OpKind::Splat(x) => {
                let (xt, rt) = (self.ty(*x)?, self.one_result(results)?);
                if !xt.is_scalar() || xt.elem == Elem::Token || rt.elem != xt.elem || rt.is_scalar() {
                    return self.fail("x", format!("cannot splat `{xt}` to `{rt}`"));
                }
            }
            OpKind::Broadcast(x) => {
                let (xt, rt) = (self.ty(*x)?, self.one_result(results)?);
                let ok = rt.elem == xt.elem
                    && xt.shape.len() == rt.shape.len()
                    && !xt.is_scalar()
                    && xt.shape.iter().zip(&rt.shape).all(|(a, b)| a == b || *a == 1);
                if !ok {
                    return self.fail("x", format!("cannot broadcast `{xt}` to `{rt}`"));
                }
            }
            OpKind::Reshape(x) => {
                let (xt, rt) = (self.ty(*x)?, self.one_result(results)?);
                if rt.elem != xt.elem || rt.numel() != xt.numel() || xt.elem == Elem::Token {
                    return self.fail("x", format!("cannot reshape `{xt}` to `{rt}`"));
                }
            }
            OpKind::Transpose { x, perm } => {
                let (xt, rt) = (self.ty(*x)?, self.one_result(results)?);
                let mut sorted = perm.clone();
                sorted.sort();
                if sorted != (0..xt.shape.len() as u32).collect::<Vec<_>>() {
                    return self.fail(
                        "perm",
                        format!("{perm:?} is not a permutation of the {} dims of `{xt}`", xt.shape.len()),
                    );
                }
                let want = Type { elem: xt.elem, shape: perm.iter().map(|p| xt.shape[*p as usize]).collect() };
                self.results_are(results, &[want])?;
                let _ = rt;
            }
            OpKind::Unary { op, x } => {
                let (d, xt) = self.num("x", *x)?;
                self.no_fp8_arithmetic(&op.to_string(), "x", d, xt)?;
                if op.float_only() && !d.is_float() {
                    return self.fail("x", format!("`{op}` needs a float operand, found `{xt}`"));
                }
                if *op == UnaryOp::Not && d.is_float() {
                    return self.fail("x", format!("`not` needs an integer operand, found `{xt}`"));
                }
                self.results_are(results, std::slice::from_ref(xt))?;
            }
            OpKind::Binary { op, lhs, rhs } => {
                let (d, lt) = self.num("lhs", *lhs)?;
                self.no_fp8_arithmetic(&op.to_string(), "lhs", d, lt)?;
                let rt = self.ty(*rhs)?;
                if lt != rt {
                    return self.fail("rhs", format!("type `{rt}` differs from lhs `{lt}`"));
                }
                if op.int_only() && d.is_float() {
                    return self.fail("lhs", format!("`{op}` needs integer operands, found `{lt}`"));
                }
                if op.float_only() && !d.is_float() {
                    return self.fail("lhs", format!("`{op}` needs float operands, found `{lt}`"));
                }
                self.results_are(results, std::slice::from_ref(lt))?;
            }
            OpKind::Cmp { lhs, rhs, .. } => {
                let (lt, rt) = (self.ty(*lhs)?, self.ty(*rhs)?);
                if let Some(d) = lt.dtype() {
                    self.no_fp8_arithmetic("cmp", "lhs", d, lt)?;
                }
                if lt != rt || lt.elem == Elem::Token {
                    return self.fail("rhs", format!("cannot compare `{lt}` with `{rt}`"));
                }
                self.results_are(results, &[lt.with_elem(Elem::Num(DType::I1))])?;
            }
            OpKind::Select { cond, on_true, on_false } => {
                let (ct, tt, ft) = (self.ty(*cond)?, self.ty(*on_true)?, self.ty(*on_false)?);
                if tt != ft {
                    return self.fail("on_false", format!("type `{ft}` differs from on_true `{tt}`"));
                }
                if ct.elem != Elem::Num(DType::I1) || ct.shape != tt.shape {
                    return self.fail("cond", format!("expected i1 of the shape of `{tt}`, found `{ct}`"));
                }
                self.results_are(results, std::slice::from_ref(tt))?;
            }
            OpKind::Cast(x) => {
                let (_, xt) = self.num("x", *x)?;
                let rt = self.one_result(results)?;
                if rt.shape != xt.shape || rt.dtype().is_none() {
                    return self.fail("result", format!("cannot cast `{xt}` to `{rt}`"));
                }
            }
            OpKind::AddPtr { ptr, offset } => {
                let (pt, ot) = (self.ty(*ptr)?, self.ty(*offset)?);
                if !matches!(pt.elem, Elem::Ptr(_)) {
                    return self.fail("ptr", format!("expected a pointer, found `{pt}`"));
                }
                let int_offset = matches!(ot.elem, Elem::Num(d) if d.is_int() && d != DType::I1);
                if !int_offset || ot.shape != pt.shape {
                    return self
                        .fail("offset", format!("expected integer offsets of shape {:?}, found `{ot}`", pt.shape));
                }
                self.results_are(results, std::slice::from_ref(pt))?;
            }
            OpKind::Reduce { op, axis, x } => {
                let (d, xt) = self.num("x", *x)?;
                self.no_fp8_arithmetic(&format!("reduce {op}"), "x", d, xt)?;
                if *axis as usize >= xt.shape.len() {
                    return self.fail("axis", format!("axis {axis} is out of range for `{xt}`"));
                }
                let mut shape = xt.shape.clone();
                shape.remove(*axis as usize);
                let elem = match op {
                    ReduceOp::Argmax | ReduceOp::Argmin => Elem::Num(DType::I32),
                    _ => xt.elem,
                };
                self.results_are(results, &[Type { elem, shape }])?;
            }
            OpKind::Dot { a, b, acc, precision } => {
                let (da, at) = self.num("a", *a)?;
                let (db, bt) = self.num("b", *b)?;
                let (dc, ct) = self.num("acc", *acc)?;
                let (&[m, k], &[k2, n], &[m2, n2]) = (at.shape.as_slice(), bt.shape.as_slice(), ct.shape.as_slice())
                else {
                    return self.fail("a", format!("expects 2-D tiles, found `{at}`, `{bt}`, `{ct}`"));
                };
                if da != db {
                    return self.fail("b", format!("element type of `{bt}` differs from a `{at}`"));
                }
                if k != k2 || m != m2 || n != n2 {
                    return self.fail("b", format!("shapes `{at}` x `{bt}` -> `{ct}` do not agree"));
                }
                let acc_ok = match da {
                    DType::F16 | DType::BF16 => matches!(dc, DType::F32 | DType::F16 | DType::BF16),
                    DType::F32 => dc == DType::F32,
                    DType::F64 => dc == DType::F64,
                    DType::I8 | DType::U8 => dc == DType::I32,
                    DType::F8E4M3FN | DType::F8E5M2 => dc == DType::F32,
                    _ => false,
                };
                if !acc_ok {
                    return self.fail("acc", format!("`{dc}` accumulator is not valid for `{da}` inputs"));
                }
                if *precision != InputPrecision::Ieee && da != DType::F32 {
                    return self.fail("a", format!("precision `{precision}` applies to f32 inputs only, found `{da}`"));
                }
                self.results_are(results, std::slice::from_ref(ct))?;
            }
            OpKind::Load { ptr, mask, other } => {
                let rt = self.one_result(results)?;
                self.ptr_matches(*ptr, rt, "result")?;
                self.mask(*mask, &rt.shape)?;
                if let Some(o) = other {
                    let ot = self.ty(*o)?;
                    if ot != rt {
                        return self.fail("other", format!("type `{ot}` differs from the loaded `{rt}`"));
                    }
                }
            }
            OpKind::Store { ptr, value, mask } => {
                let vt = self.ty(*value)?;
                self.ptr_matches(*ptr, vt, "value")?;
                self.mask(*mask, &vt.shape)?;
                self.results_are(results, &[])?;
            }
            OpKind::MakeDesc { ptr, shape, strides } => {
                let rt = self.one_result(results)?;
                let Some((d, block)) = rt.elem.desc().filter(|_| rt.is_scalar()) else {
                    return self.fail("result", format!("expected a `!desc<..>` scalar, found `{rt}`"));
                };
                let pt = self.scalar_of("ptr", *ptr, |e| e.pointee().is_some(), "a pointer scalar")?;
                if pt.elem != Elem::Ptr(d) {
                    return self.fail("ptr", format!("`{pt}` does not point to the descriptor's `{d}`"));
                }
                if block.iter().any(|b| *b == 0 || !b.is_power_of_two()) {
                    return self.fail("result", format!("block {}x{} is not powers of two", block[0], block[1]));
                }
                for (role, v) in
                    [("rows", shape[0]), ("cols", shape[1]), ("row_stride", strides[0]), ("col_stride", strides[1])]
                {
                    self.i32_scalar(role, v)?;
                }
            }
            OpKind::DescLoad { desc, offsets } => {
                let (d, block) = self.desc_operand(*desc)?;
                self.i32_scalar("row", offsets[0])?;
                self.i32_scalar("col", offsets[1])?;
                self.results_are(results, &[Type::tile(Elem::Num(d), &block)])?;
            }
            OpKind::DescStore { desc, offsets, value } => {
                let (d, block) = self.desc_operand(*desc)?;
                self.i32_scalar("row", offsets[0])?;
                self.i32_scalar("col", offsets[1])?;
                let (want, vt) = (Type::tile(Elem::Num(d), &block), self.ty(*value)?);
                if *vt != want {
                    return self.fail("value", format!("`{vt}` is not a block `{want}` of the descriptor"));
                }
                self.results_are(results, &[])?;
            }
            OpKind::Atomic { op, ptr, value, mask, .. } => {
                let (d, vt) = self.num("value", *value)?;
                self.ptr_matches(*ptr, vt, "value")?;
                self.mask(*mask, &vt.shape)?;
                let bitwise = matches!(op, AtomicOp::And | AtomicOp::Or | AtomicOp::Xor);
                if (bitwise && d.is_float()) || d == DType::I1 || d.bits() < 16 {
                    return self.fail("value", format!("atomic `{op}` is not defined on `{d}`"));
                }
                self.results_are(results, std::slice::from_ref(vt))?;
            }
            OpKind::AtomicCas { ptr, expected, desired, .. } => {
                let (d, et) = self.num("expected", *expected)?;
                let dt = self.ty(*desired)?;
                if dt != et {
                    return self.fail("desired", format!("type `{dt}` differs from expected `{et}`"));
                }
                if d.bits() < 16 {
                    return self.fail("expected", format!("compare-and-swap is not defined on `{d}`"));
                }
                self.ptr_matches(*ptr, et, "expected")?;
                self.results_are(results, std::slice::from_ref(et))?;
            }
            OpKind::For { lower, upper, step, init, body } => {
                let lt = self.int_scalar("lower", *lower)?.clone();
                for (role, v) in [("upper", upper), ("step", step)] {
                    if self.ty(*v)? != &lt {
                        return self.fail(role, format!("expected `{lt}` like lower"));
                    }
                }
                let carried: Vec<Type> = init.iter().map(|v| self.ty(*v).cloned()).collect::<VResult<_>>()?;
                let mut args = vec![lt];
                args.extend(carried.iter().cloned());
                self.region(*body, "body", &args, &carried)?;
                self.results_are(results, &carried)?;
            }
            OpKind::If { cond, then_block, else_block } => {
                self.scalar_of("cond", *cond, |e| *e == Elem::Num(DType::I1), "an i1 scalar")?;
                let rts: Vec<Type> = results.iter().map(|v| self.ty(*v).cloned()).collect::<VResult<_>>()?;
                self.region(*then_block, "then", &[], &rts)?;
                self.region(*else_block, "else", &[], &rts)?;
            }
            OpKind::While { init, cond, body } => {
                let carried: Vec<Type> = init.iter().map(|v| self.ty(*v).cloned()).collect::<VResult<_>>()?;
                self.region(*cond, "cond", &carried, &[Type::num(DType::I1)])?;
                self.region(*body, "body", &carried, &carried)?;
                self.results_are(results, &carried)?;
            }
            OpKind::SymmAt { ptr, rank } => {
                self.ptr_scalar("ptr", *ptr)?;
                self.i32_scalar("rank", *rank)?;
                let pt = self.ty(*ptr)?.clone();
                self.results_are(results, &[pt])?;
            }
            OpKind::Notify { sig, rank, value, .. } => {
                self.signal_ptr("sig", *sig)?;
                self.i32_scalar("rank", *rank)?;
                self.u64_scalar("value", *value)?;
                self.results_are(results, &[])?;
            }
            OpKind::Wait { sigs, count, value, sem, .. } => {
                self.signal_ptr("sigs", *sigs)?;
                self.i32_scalar("count", *count)?;
                self.u64_scalar("value", *value)?;
                if sem.releases() {
                    return self.fail("sem", format!("a wait reads; `{sem}` semantics need a write"));
                }
                self.results_are(results, &[Type::token()])?;
            }
            OpKind::ConsumeToken { value, token } => {
                self.scalar_of("token", *token, |e| *e == Elem::Token, "a `!token`")?;
                let vt = self.ty(*value)?.clone();
                self.results_are(results, &[vt])?;
            }
            OpKind::Put { dst, src, bytes, rank, .. } | OpKind::Get { dst, src, bytes, rank, .. } => {
                self.ptr_scalar("dst", *dst)?;
                self.ptr_scalar("src", *src)?;
                self.int_scalar("bytes", *bytes)?;
                self.i32_scalar("rank", *rank)?;
                self.results_are(results, &[])?;
            }
            OpKind::PutSignal { dst, src, bytes, sig, sig_value, rank, .. } => {
                self.ptr_scalar("dst", *dst)?;
                self.ptr_scalar("src", *src)?;
                self.int_scalar("bytes", *bytes)?;
                self.signal_ptr("sig", *sig)?;
                self.u64_scalar("sig_value", *sig_value)?;
                self.i32_scalar("rank", *rank)?;
                self.results_are(results, &[])?;
            }
            OpKind::LoadFlagged { ptr, flag, mask } => {
                let pt = self.ty(*ptr)?.clone();
                let d = match pt.elem.pointee() {
                    Some(d @ (DType::U64 | DType::I64)) => d,
                    _ => return self.fail("ptr", format!("expected pointers to 64-bit integer words, found `{pt}`")),
                };
                let ft = self.ty(*flag)?;
                if !ft.is_scalar() || !matches!(ft.dtype(), Some(DType::I32 | DType::U32)) {
                    return self.fail("flag", format!("expected an `i32` or `u32` scalar, found `{ft}`"));
                }
                self.mask(*mask, &pt.shape)?;
                self.results_are(results, &[Type::tile(Elem::Num(d), &pt.shape)])?;
            }
            OpKind::SignalWaitUntil { sig, value, .. } => {
                self.signal_ptr("sig", *sig)?;
                self.u64_scalar("value", *value)?;
                self.results_are(results, &[Type::num(DType::U64)])?;
            }
            OpKind::Fence | OpKind::Quiet | OpKind::Barrier | OpKind::BarrierAll { .. } => {
                self.results_are(results, &[])?
            }
        }
        Ok(())
    }
}

/// Why `lit` is not a value of type `d` (`None` when it is). Integers must lie in the type's
/// range (a `u64` literal is its bit pattern, so every one fits); a finite float literal must
/// stay finite when rounded to the type (`inf` and `nan` are written as such).
pub fn literal_range_error(lit: Literal, d: DType) -> Option<String> {
    match lit {
        Literal::Int(i) => {
            let (lo, hi): (i128, i128) = match d {
                DType::I1 => (0, 1),
                DType::I8 => (i8::MIN as i128, i8::MAX as i128),
                DType::I16 => (i16::MIN as i128, i16::MAX as i128),
                DType::I32 => (i32::MIN as i128, i32::MAX as i128),
                DType::U8 => (0, u8::MAX as i128),
                DType::U16 => (0, u16::MAX as i128),
                DType::U32 => (0, u32::MAX as i128),
                _ => return None,
            };
            let v = i as i128;
            (v < lo || v > hi).then(|| format!("`{d}` holds {lo}..={hi}"))
        }
        Literal::Float(f) if f.is_finite() => {
            let rounds_to_inf = match d {
                DType::F16 => half::f16::from_f64(f).is_infinite(),
                DType::BF16 => half::bf16::from_f64(f).is_infinite(),
                DType::F32 => (f as f32).is_infinite(),
                _ => false,
            };
            rounds_to_inf.then(|| format!("it rounds to infinity in `{d}` (write `inf` for infinity)"))
        }
        Literal::Float(_) => None,
    }
}

/// A literal as the text format writes it for type `d` (`u64` unsigned).
pub fn literal_text(lit: Literal, d: DType) -> String {
    match lit {
        Literal::Int(i) if d == DType::U64 => (i as u64).to_string(),
        Literal::Int(i) => i.to_string(),
        Literal::Float(f) => f.to_string(),
    }
}

fn list(ts: &[Type]) -> String {
    ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}
