//! The parser of the text format. It never panics: malformed text gives a [`ParseError`] with
//! the line and column where parsing stopped. It checks syntax and names only; types are the
//! verifier's business (`crate::verify`), so parse, then verify.

use crate::ir::*;
use std::collections::HashMap;

/// Malformed text IR: what was wrong and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {col}: {message}")]
pub struct ParseError {
    pub line: u32,
    pub col: u32,
    pub message: String,
}

/// Deepest region nesting accepted (guards the recursive parser against hostile input).
const MAX_DEPTH: usize = 64;

/// Parses one kernel in the text format.
pub fn parse(text: &str) -> Result<Function, ParseError> {
    let mut p = Parser { src: text.as_bytes(), pos: 0, line: 1, col: 1, scopes: Vec::new(), func: None };
    let f = p.kernel()?;
    p.skip_ws();
    if p.pos < p.src.len() {
        return p.err("unexpected text after the kernel");
    }
    Ok(f)
}

struct Parser<'s> {
    src: &'s [u8],
    pos: usize,
    line: u32,
    col: u32,
    scopes: Vec<HashMap<String, Value>>,
    func: Option<Function>,
}

type PResult<T> = Result<T, ParseError>;

enum BlockEnd {
    /// The function body ends with `return }`.
    Return,
    /// A region ends with `[yield ..] }`.
    Yield,
}

impl Parser<'_> {
    fn err<T>(&self, message: impl Into<String>) -> PResult<T> {
        Err(ParseError { line: self.line, col: self.col, message: message.into() })
    }

    fn loc(&self) -> Loc {
        Loc { line: self.line, col: self.col }
    }

    fn f(&mut self) -> &mut Function {
        self.func.as_mut().expect("function is created before any op is parsed")
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn bump(&mut self) {
        if let Some(c) = self.peek() {
            self.pos += 1;
            if c == b'\n' {
                self.line += 1;
                self.col = 1;
            } else {
                self.col += 1;
            }
        }
    }

    fn skip_ws(&mut self) {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\r' | b'\n') => self.bump(),
                Some(b'/') if self.src.get(self.pos + 1) == Some(&b'/') => {
                    while !matches!(self.peek(), None | Some(b'\n')) {
                        self.bump();
                    }
                }
                _ => return,
            }
        }
    }

    /// Consumes `s` (after whitespace) if it is next.
    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        let b = s.as_bytes();
        if self.src.get(self.pos..self.pos + b.len()) == Some(b) {
            for _ in 0..b.len() {
                self.bump();
            }
            true
        } else {
            false
        }
    }

    fn expect(&mut self, s: &str) -> PResult<()> {
        if self.eat(s) {
            Ok(())
        } else {
            let found = self.found();
            self.err(format!("expected `{s}`, found {found}"))
        }
    }

    fn found(&mut self) -> String {
        self.skip_ws();
        match self.peek() {
            None => "end of input".to_string(),
            Some(_) => {
                let end = (self.pos + 12).min(self.src.len());
                let s = String::from_utf8_lossy(&self.src[self.pos..end]);
                format!("`{}`", s.split_whitespace().next().unwrap_or(""))
            }
        }
    }

    fn word_chars(&mut self) -> String {
        let start = self.pos;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_') {
            self.bump();
        }
        String::from_utf8_lossy(&self.src[start..self.pos]).into_owned()
    }

    fn ident(&mut self, what: &str) -> PResult<String> {
        self.skip_ws();
        match self.peek() {
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => Ok(self.word_chars()),
            _ => {
                let found = self.found();
                self.err(format!("expected {what}, found {found}"))
            }
        }
    }

    /// Consumes the keyword `w` if it is the next whole word.
    fn keyword(&mut self, w: &str) -> bool {
        self.skip_ws();
        let (pos, line, col) = (self.pos, self.line, self.col);
        if matches!(self.peek(), Some(c) if c.is_ascii_alphabetic() || c == b'_') && self.word_chars() == w {
            return true;
        }
        (self.pos, self.line, self.col) = (pos, line, col);
        false
    }

    fn expect_keyword(&mut self, w: &str) -> PResult<()> {
        if self.keyword(w) {
            Ok(())
        } else {
            let found = self.found();
            self.err(format!("expected `{w}`, found {found}"))
        }
    }

    /// `, kw` if present (for optional keyword operands).
    fn comma_keyword(&mut self, w: &str) -> bool {
        let (pos, line, col) = (self.pos, self.line, self.col);
        if self.eat(",") && self.keyword(w) {
            return true;
        }
        (self.pos, self.line, self.col) = (pos, line, col);
        false
    }

    fn word_of<T>(&mut self, what: &str, parse: fn(&str) -> Option<T>) -> PResult<T> {
        let w = self.ident(what)?;
        match parse(&w) {
            Some(t) => Ok(t),
            None => self.err(format!("`{w}` is not a {what}")),
        }
    }

    /// `kw <word>` naming an enum value.
    fn keyed<T>(&mut self, kw: &str, what: &str, parse: fn(&str) -> Option<T>) -> PResult<T> {
        self.expect(",")?;
        self.expect_keyword(kw)?;
        self.word_of(what, parse)
    }

    fn value_name(&mut self) -> PResult<String> {
        self.skip_ws();
        if self.peek() != Some(b'%') {
            let found = self.found();
            return self.err(format!("expected a value (`%name`), found {found}"));
        }
        self.bump();
        let name = self.word_chars();
        if name.is_empty() {
            return self.err("expected a value name after `%`");
        }
        Ok(name)
    }

    fn value(&mut self) -> PResult<Value> {
        let name = self.value_name()?;
        for scope in self.scopes.iter().rev() {
            if let Some(v) = scope.get(&name) {
                return Ok(*v);
            }
        }
        self.err(format!("use of undefined value `%{name}`"))
    }

    fn next_value(&mut self) -> PResult<Value> {
        self.expect(",")?;
        self.value()
    }

    fn bind(&mut self, name: String, v: Value) -> PResult<()> {
        if self.scopes.iter().any(|s| s.contains_key(&name)) {
            return self.err(format!("value `%{name}` is defined twice"));
        }
        match self.scopes.last_mut() {
            Some(s) => {
                s.insert(name, v);
                Ok(())
            }
            None => self.err("value defined outside the kernel"),
        }
    }

    fn number_text(&mut self) -> PResult<String> {
        self.skip_ws();
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.bump();
        }
        let mut prev = 0u8;
        while let Some(c) = self.peek() {
            let sign_after_exp = (c == b'-' || c == b'+') && (prev == b'e' || prev == b'E');
            if c.is_ascii_alphanumeric() || c == b'.' || sign_after_exp {
                prev = c;
                self.bump();
            } else {
                break;
            }
        }
        if self.pos == start {
            let found = self.found();
            return self.err(format!("expected a number, found {found}"));
        }
        Ok(String::from_utf8_lossy(&self.src[start..self.pos]).into_owned())
    }

    fn int(&mut self) -> PResult<i64> {
        let t = self.number_text()?;
        match t.parse::<i64>() {
            Ok(i) => Ok(i),
            Err(_) => self.err(format!("`{t}` is not an integer")),
        }
    }

    fn u32(&mut self) -> PResult<u32> {
        let t = self.number_text()?;
        match t.parse::<u32>() {
            Ok(i) => Ok(i),
            Err(_) => self.err(format!("`{t}` is not an unsigned 32-bit integer")),
        }
    }

    fn boolean(&mut self) -> PResult<bool> {
        match self.ident("`true` or `false`")?.as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => self.err(format!("`{other}` is not `true` or `false`")),
        }
    }

    /// `, [%a, %b]`: two values in brackets after a comma.
    fn pair(&mut self) -> PResult<[Value; 2]> {
        self.expect(",")?;
        self.expect("[")?;
        let a = self.value()?;
        let b = self.next_value()?;
        self.expect("]")?;
        Ok([a, b])
    }

    fn elem(&mut self) -> PResult<Elem> {
        self.skip_ws();
        if self.eat("!desc") {
            self.expect("<")?;
            let dtype = self.word_of("element type", DType::parse)?;
            self.expect(",")?;
            self.skip_ws();
            let mut block = [0u32; 2];
            for (i, b) in block.iter_mut().enumerate() {
                let start = self.pos;
                while matches!(self.peek(), Some(c) if c.is_ascii_digit()) {
                    self.bump();
                }
                let t = String::from_utf8_lossy(&self.src[start..self.pos]).into_owned();
                *b = match t.parse::<u32>() {
                    Ok(v) => v,
                    Err(_) => return self.err(format!("descriptor block dimension `{t}` is not a number")),
                };
                if i == 0 {
                    if self.peek() != Some(b'x') {
                        return self.err("expected `x` between the descriptor's block dimensions");
                    }
                    self.bump();
                }
            }
            self.expect(">")?;
            return Ok(Elem::Desc { dtype, block });
        }
        if self.eat("!ptr") {
            self.expect("<")?;
            let d = self.word_of("element type", DType::parse)?;
            self.expect(">")?;
            Ok(Elem::Ptr(d))
        } else if self.eat("!token") {
            Ok(Elem::Token)
        } else {
            Ok(Elem::Num(self.word_of("type", DType::parse)?))
        }
    }

    fn ty(&mut self) -> PResult<Type> {
        if self.keyword("tile") {
            if self.peek() != Some(b'<') {
                return self.err("expected `<` after `tile`");
            }
            self.bump();
            let mut shape = Vec::new();
            while matches!(self.peek(), Some(c) if c.is_ascii_digit()) {
                let start = self.pos;
                while matches!(self.peek(), Some(c) if c.is_ascii_digit()) {
                    self.bump();
                }
                let t = String::from_utf8_lossy(&self.src[start..self.pos]).into_owned();
                let Ok(d) = t.parse::<u32>() else {
                    return self.err(format!("tile dimension `{t}` is too large"));
                };
                shape.push(d);
                if self.peek() != Some(b'x') {
                    return self.err("expected `x` after a tile dimension");
                }
                self.bump();
            }
            if shape.is_empty() {
                return self.err("a tile type needs at least one dimension (`tile<64xf32>`)");
            }
            let elem = self.elem()?;
            if self.peek() != Some(b'>') {
                return self.err("expected `>` closing the tile type");
            }
            self.bump();
            Ok(Type { elem, shape })
        } else {
            Ok(Type::scalar(self.elem()?))
        }
    }

    fn result_type(&mut self) -> PResult<Type> {
        self.expect(":")?;
        self.ty()
    }

    fn kernel(&mut self) -> PResult<Function> {
        self.expect_keyword("kernel")?;
        self.expect("@")?;
        let name = self.word_chars();
        if name.is_empty() {
            return self.err("expected the kernel name after `@`");
        }
        self.expect("(")?;
        let mut params: Vec<(String, Type)> = Vec::new();
        let mut facts: Vec<Option<u32>> = Vec::new();
        if !self.eat(")") {
            loop {
                let n = self.value_name()?;
                if params.iter().any(|(p, _)| *p == n) {
                    return self.err(format!("parameter `%{n}` is declared twice"));
                }
                self.expect(":")?;
                let t = self.ty()?;
                // `{align = 16}` on a pointer, `{multiple_of = 16}` on an integer.
                let fact = if self.eat("{") {
                    let key = self.ident("`align` or `multiple_of`")?;
                    let int = t.elem.dtype().is_some_and(|d| d.is_int() && d != DType::I1);
                    if t.elem.pointee().is_none() && !int {
                        return self.err(format!(
                            "parameter `%{n}` of type {t}: divisibility facts are for pointers and integers"
                        ));
                    }
                    let want = if t.elem.pointee().is_some() { "align" } else { "multiple_of" };
                    if key != want {
                        return self.err(format!("parameter `%{n}` of type {t} takes `{want}`, not `{key}`"));
                    }
                    self.expect("=")?;
                    let v = self.u32()?;
                    if !v.is_power_of_two() {
                        return self.err(format!("`{key} = {v}` on `%{n}`: not a power of two"));
                    }
                    self.expect("}")?;
                    Some(v)
                } else {
                    None
                };
                params.push((n, t));
                facts.push(fact);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        let mut attrs = LaunchAttrs::default();
        if self.keyword("attributes") {
            self.expect("{")?;
            if !self.eat("}") {
                loop {
                    let key = self.ident("an attribute name")?;
                    self.expect("=")?;
                    match key.as_str() {
                        "warps" => attrs.warps = self.u32()?,
                        "stages" => attrs.stages = self.u32()?,
                        "cooperative" => attrs.cooperative = self.boolean()?,
                        "fast_math" => attrs.fast_math = self.boolean()?,
                        "warp_specialize" => attrs.warp_specialize = self.boolean()?,
                        "persistent" => attrs.persistent = self.boolean()?,
                        "inter_node" => attrs.inter_node = self.boolean()?,
                        "pingpong" => attrs.pingpong = self.boolean()?,
                        "signalled_before" => attrs.signalled_before = self.boolean()?,
                        "trace" => attrs.trace = self.boolean()?,
                        "wide_vectors" => attrs.wide_vectors = self.boolean()?,
                        "programmatic" => attrs.programmatic = self.boolean()?,
                        other => return self.err(format!("unknown attribute `{other}`")),
                    }
                    if self.eat("}") {
                        break;
                    }
                    self.expect(",")?;
                }
            }
        }
        self.expect("{")?;
        let refs: Vec<(&str, Type)> = params.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let mut func = Function::new(&name, &refs, attrs);
        for (p, f) in func.params.iter_mut().zip(facts) {
            p.divisibility = f;
        }
        let mut top = HashMap::new();
        for p in &func.params {
            top.insert(p.name.clone(), p.value);
        }
        self.scopes.push(top);
        let body = func.body;
        self.func = Some(func);
        self.block(body, BlockEnd::Return, 0)?;
        self.func.take().map_or_else(|| self.err("internal: kernel lost"), Ok)
    }

    /// Parses statements into `block` until its end.
    fn block(&mut self, block: Block, end: BlockEnd, depth: usize) -> PResult<()> {
        if depth > MAX_DEPTH {
            return self.err(format!("regions nested deeper than {MAX_DEPTH}"));
        }
        loop {
            self.skip_ws();
            match end {
                BlockEnd::Return if self.keyword("return") => return self.expect("}"),
                BlockEnd::Yield if self.eat("}") => return Ok(()),
                BlockEnd::Yield if self.keyword("yield") => {
                    let mut ys = vec![self.value()?];
                    while self.eat(",") {
                        ys.push(self.value()?);
                    }
                    self.f().blocks[block].yields = ys;
                    return self.expect("}");
                }
                _ => {}
            }
            if self.peek().is_none() {
                return self.err("unexpected end of input inside a block");
            }
            self.statement(block, depth)?;
        }
    }

    /// Parses a region `{ .. }` whose opening brace was consumed, binding `args` to `arg_names`.
    fn region(&mut self, arg_names: Vec<String>, arg_types: &[Type], depth: usize) -> PResult<Block> {
        let block = self.f().new_block(arg_types);
        let args = self.f().blocks[block].args.clone();
        self.scopes.push(HashMap::new());
        for (n, v) in arg_names.into_iter().zip(args) {
            self.bind(n, v)?;
        }
        let r = self.block(block, BlockEnd::Yield, depth + 1);
        self.scopes.pop();
        r.map(|_| block)
    }

    /// `(%a = %x, %b = %y)` bindings; returns names and initial values.
    fn bindings(&mut self) -> PResult<(Vec<String>, Vec<Value>)> {
        let (mut names, mut inits) = (Vec::new(), Vec::new());
        if self.eat(")") {
            return Ok((names, inits));
        }
        loop {
            names.push(self.value_name()?);
            self.expect("=")?;
            inits.push(self.value()?);
            if self.eat(")") {
                return Ok((names, inits));
            }
            self.expect(",")?;
        }
    }

    fn types_of(&mut self, vs: &[Value]) -> Vec<Type> {
        vs.iter().map(|v| self.f().ty(*v).clone()).collect()
    }

    fn statement(&mut self, block: Block, depth: usize) -> PResult<()> {
        let loc = self.loc();
        let mut names = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'%') {
            names.push(self.value_name()?);
            while self.eat(",") {
                names.push(self.value_name()?);
            }
            self.expect("=")?;
        }
        self.skip_ws();
        let op_loc = self.loc();
        let mnemonic = self.ident("an op name")?;
        let (kind, types) = self.op_body(&mnemonic, op_loc, depth)?;
        if names.len() != types.len() {
            return Err(ParseError {
                line: loc.line,
                col: loc.col,
                message: format!("`{mnemonic}` has {} result(s) but {} name(s) are given", types.len(), names.len()),
            });
        }
        let op = self.f().push_op(block, kind, &types, Some(op_loc));
        let results = self.f().ops[op].results.clone();
        for (n, v) in names.into_iter().zip(results) {
            self.bind(n, v)?;
        }
        Ok(())
    }

    /// Parses what follows the mnemonic; returns the op and its result types.
    fn op_body(&mut self, m: &str, at: Loc, depth: usize) -> PResult<(OpKind, Vec<Type>)> {
        if let Some(op) = UnaryOp::parse(m) {
            let x = self.value()?;
            return Ok((OpKind::Unary { op, x }, vec![self.result_type()?]));
        }
        if let Some(op) = BinaryOp::parse(m) {
            let lhs = self.value()?;
            let rhs = self.next_value()?;
            return Ok((OpKind::Binary { op, lhs, rhs }, vec![self.result_type()?]));
        }
        let kind = match m {
            "const" => {
                let t = self.number_text()?;
                let ty = self.result_type()?;
                let lit = match ty.dtype() {
                    Some(d) if d.is_float() => match t.as_str() {
                        "inf" => Literal::Float(f64::INFINITY),
                        "-inf" => Literal::Float(f64::NEG_INFINITY),
                        "nan" => Literal::Float(f64::NAN),
                        _ => match t.parse::<f64>() {
                            Ok(f) if f.is_finite() => Literal::Float(f),
                            _ => return self.err(format!("`{t}` is not a float literal")),
                        },
                    },
                    // u64 literals are written unsigned and stored as their bit pattern.
                    Some(DType::U64) => match t.parse::<u64>() {
                        Ok(u) => Literal::Int(u as i64),
                        Err(_) => return self.err(format!("`{t}` is not a u64 literal (0..=18446744073709551615)")),
                    },
                    Some(_) => match t.parse::<i64>() {
                        Ok(i) => Literal::Int(i),
                        Err(_) => return self.err(format!("`{t}` is not an integer literal that fits 64 bits")),
                    },
                    None => return self.err(format!("`const` needs a numeric type, found `{ty}`")),
                };
                return Ok((OpKind::Const(lit), vec![ty]));
            }
            "program_id" => OpKind::ProgramId(self.word_of("grid axis", Axis::parse)?),
            "num_programs" => OpKind::NumPrograms(self.word_of("grid axis", Axis::parse)?),
            "arange" => {
                let start = self.int()?;
                self.expect(",")?;
                OpKind::Arange { start, end: self.int()? }
            }
            "splat" => OpKind::Splat(self.value()?),
            "broadcast" => OpKind::Broadcast(self.value()?),
            "reshape" => OpKind::Reshape(self.value()?),
            "cast" => OpKind::Cast(self.value()?),
            "transpose" => {
                let x = self.value()?;
                self.expect(",")?;
                self.expect("[")?;
                let mut perm = Vec::new();
                if !self.eat("]") {
                    loop {
                        perm.push(self.u32()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                OpKind::Transpose { x, perm }
            }
            "cmp" => {
                let op = self.word_of("comparison", CmpOp::parse)?;
                let lhs = self.value()?;
                OpKind::Cmp { op, lhs, rhs: self.next_value()? }
            }
            "select" => {
                let cond = self.value()?;
                let on_true = self.next_value()?;
                OpKind::Select { cond, on_true, on_false: self.next_value()? }
            }
            "addptr" => {
                let ptr = self.value()?;
                OpKind::AddPtr { ptr, offset: self.next_value()? }
            }
            "reduce" => {
                let op = self.word_of("reduction", ReduceOp::parse)?;
                let x = self.value()?;
                self.expect(",")?;
                self.expect_keyword("axis")?;
                OpKind::Reduce { op, axis: self.u32()?, x }
            }
            "dot" => {
                let a = self.value()?;
                let b = self.next_value()?;
                let acc = self.next_value()?;
                let precision = self.keyed("precision", "input precision", InputPrecision::parse)?;
                OpKind::Dot { a, b, acc, precision }
            }
            "load" => {
                let ptr = self.value()?;
                let mask = if self.comma_keyword("mask") { Some(self.value()?) } else { None };
                let other = if self.comma_keyword("other") { Some(self.value()?) } else { None };
                OpKind::Load { ptr, mask, other }
            }
            "make_desc" => {
                let ptr = self.value()?;
                let shape = self.pair()?;
                let strides = self.pair()?;
                OpKind::MakeDesc { ptr, shape, strides }
            }
            "desc_load" => {
                let desc = self.value()?;
                OpKind::DescLoad { desc, offsets: self.pair()? }
            }
            "desc_store" => {
                let desc = self.value()?;
                let offsets = self.pair()?;
                let value = self.next_value()?;
                return Ok((OpKind::DescStore { desc, offsets, value }, vec![]));
            }
            "store" => {
                let ptr = self.value()?;
                let value = self.next_value()?;
                let mask = if self.comma_keyword("mask") { Some(self.value()?) } else { None };
                return Ok((OpKind::Store { ptr, value, mask }, vec![]));
            }
            "atomic" => {
                let op = self.word_of("atomic op", AtomicOp::parse)?;
                let ptr = self.value()?;
                let value = self.next_value()?;
                let mask = if self.comma_keyword("mask") { Some(self.value()?) } else { None };
                let sem = self.keyed("sem", "memory semantic", MemSemantic::parse)?;
                let scope = self.keyed("scope", "scope", Scope::parse)?;
                OpKind::Atomic { op, ptr, value, mask, sem, scope }
            }
            "load_flagged" => {
                let ptr = self.value()?;
                let flag = self.next_value()?;
                let mask = if self.comma_keyword("mask") { Some(self.value()?) } else { None };
                OpKind::LoadFlagged { ptr, flag, mask }
            }
            "atomic_cas" => {
                let ptr = self.value()?;
                let expected = self.next_value()?;
                let desired = self.next_value()?;
                let sem = self.keyed("sem", "memory semantic", MemSemantic::parse)?;
                let scope = self.keyed("scope", "scope", Scope::parse)?;
                OpKind::AtomicCas { ptr, expected, desired, sem, scope }
            }
            "for" => {
                let iv = self.value_name()?;
                self.expect("=")?;
                let lower = self.value()?;
                self.expect_keyword("to")?;
                let upper = self.value()?;
                self.expect_keyword("step")?;
                let step = self.value()?;
                let (mut names, init) = if self.keyword("iter_args") {
                    self.expect("(")?;
                    self.bindings()?
                } else {
                    (Vec::new(), Vec::new())
                };
                self.expect("{")?;
                let mut arg_types = vec![self.f().ty(lower).clone()];
                arg_types.extend(self.types_of(&init));
                names.insert(0, iv);
                let body = self.region(names, &arg_types, depth)?;
                let results = self.types_of(&init);
                return Ok((OpKind::For { lower, upper, step, init, body }, results));
            }
            "if" => {
                let cond = self.value()?;
                let mut results = Vec::new();
                if self.eat("->") {
                    self.expect("(")?;
                    if !self.eat(")") {
                        loop {
                            results.push(self.ty()?);
                            if self.eat(")") {
                                break;
                            }
                            self.expect(",")?;
                        }
                    }
                }
                self.expect("{")?;
                let then_block = self.region(Vec::new(), &[], depth)?;
                let else_block = if self.keyword("else") {
                    self.expect("{")?;
                    self.region(Vec::new(), &[], depth)?
                } else {
                    self.f().new_block(&[])
                };
                return Ok((OpKind::If { cond, then_block, else_block }, results));
            }
            "while" => {
                self.expect("(")?;
                let (names, init) = self.bindings()?;
                let tys = self.types_of(&init);
                self.expect("{")?;
                let cond = self.region(names, &tys, depth)?;
                self.expect_keyword("do")?;
                self.expect("(")?;
                let mut body_names = Vec::new();
                if !self.eat(")") {
                    loop {
                        body_names.push(self.value_name()?);
                        if self.eat(")") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                if body_names.len() != tys.len() {
                    return self.err(format!(
                        "`while` carries {} value(s) but its `do` block names {}",
                        tys.len(),
                        body_names.len()
                    ));
                }
                self.expect("{")?;
                let body = self.region(body_names, &tys, depth)?;
                return Ok((OpKind::While { init, cond, body }, tys));
            }
            "rank" => OpKind::Rank,
            "num_ranks" => OpKind::NumRanks,
            "symm_at" => {
                let ptr = self.value()?;
                OpKind::SymmAt { ptr, rank: self.next_value()? }
            }
            "notify" => {
                let sig = self.value()?;
                let rank = self.next_value()?;
                let value = self.next_value()?;
                let op = self.keyed("op", "signal op", SignalOp::parse)?;
                let scope = self.keyed("scope", "communication scope", CommScope::parse)?;
                return Ok((OpKind::Notify { sig, rank, value, op, scope }, vec![]));
            }
            "wait" => {
                let sigs = self.value()?;
                let count = self.next_value()?;
                let cmp = self.keyed("cmp", "comparison", CmpOp::parse)?;
                let value = self.next_value()?;
                let scope = self.keyed("scope", "scope", Scope::parse)?;
                let sem = self.keyed("sem", "memory semantic", MemSemantic::parse)?;
                OpKind::Wait { sigs, count, cmp, value, scope, sem }
            }
            "consume_token" => {
                let value = self.value()?;
                OpKind::ConsumeToken { value, token: self.next_value()? }
            }
            "put" | "get" => {
                let dst = self.value()?;
                let src = self.next_value()?;
                let bytes = self.next_value()?;
                let rank = self.next_value()?;
                let group = self.keyed("group", "group", Group::parse)?;
                let nbi = self.comma_keyword("nbi");
                let kind = if m == "put" {
                    OpKind::Put { dst, src, bytes, rank, group, nbi }
                } else {
                    OpKind::Get { dst, src, bytes, rank, group, nbi }
                };
                return Ok((kind, vec![]));
            }
            "put_signal" => {
                let dst = self.value()?;
                let src = self.next_value()?;
                let bytes = self.next_value()?;
                let sig = self.next_value()?;
                let sig_value = self.next_value()?;
                let sig_op = self.keyed("op", "signal op", SignalOp::parse)?;
                let rank = self.next_value()?;
                let group = self.keyed("group", "group", Group::parse)?;
                let nbi = self.comma_keyword("nbi");
                return Ok((OpKind::PutSignal { dst, src, bytes, sig, sig_value, sig_op, rank, group, nbi }, vec![]));
            }
            "signal_wait_until" => {
                let sig = self.value()?;
                let cmp = self.keyed("cmp", "comparison", CmpOp::parse)?;
                let value = self.next_value()?;
                OpKind::SignalWaitUntil { sig, cmp, value }
            }
            "fence" => return Ok((OpKind::Fence, vec![])),
            "barrier" => return Ok((OpKind::Barrier, vec![])),
            "quiet" => return Ok((OpKind::Quiet, vec![])),
            "barrier_all" => {
                self.expect_keyword("group")?;
                return Ok((OpKind::BarrierAll { group: self.word_of("group", Group::parse)? }, vec![]));
            }
            other => return Err(ParseError { line: at.line, col: at.col, message: format!("unknown op `{other}`") }),
        };
        Ok((kind, vec![self.result_type()?]))
    }
}
