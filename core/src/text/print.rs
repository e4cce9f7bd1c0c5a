//! The printer of the text format.

use crate::ir::{Block, DType, Function, Literal, Op, OpKind, Value};
use std::collections::HashMap;
use std::fmt::Write;

/// Prints a function in the canonical text format.
pub fn print(func: &Function) -> String {
    let mut p = Printer { func, names: HashMap::new(), next: 0, out: String::new() };
    for param in &func.params {
        p.names.insert(param.value, format!("%{}", param.name));
    }
    let params: Vec<String> = func
        .params
        .iter()
        .map(|param| {
            let fact = match param.divisibility {
                Some(d) if func.ty(param.value).elem.pointee().is_some() => format!(" {{align = {d}}}"),
                Some(d) => format!(" {{multiple_of = {d}}}"),
                None => String::new(),
            };
            format!("%{}: {}{fact}", param.name, func.ty(param.value))
        })
        .collect();
    let a = func.attrs;
    // `fast_math`, `warp_specialize`, `persistent`, `inter_node`, `pingpong`,
    // `signalled_before`, `trace`, `wide_vectors` and `programmatic` are printed only when set:
    // they are the exception, and kernels written before they existed keep their text.
    let fast = format!(
        "{}{}{}{}{}{}{}{}{}",
        if a.fast_math { ", fast_math = true" } else { "" },
        if a.warp_specialize { ", warp_specialize = true" } else { "" },
        if a.persistent { ", persistent = true" } else { "" },
        if a.inter_node { ", inter_node = true" } else { "" },
        if a.pingpong { ", pingpong = true" } else { "" },
        if a.signalled_before { ", signalled_before = true" } else { "" },
        if a.trace { ", trace = true" } else { "" },
        if a.wide_vectors { ", wide_vectors = true" } else { "" },
        if a.programmatic { ", programmatic = true" } else { "" }
    );
    let _ = writeln!(
        p.out,
        "kernel @{}({}) attributes {{warps = {}, stages = {}, cooperative = {}{fast}}} {{",
        func.name,
        params.join(", "),
        a.warps,
        a.stages,
        a.cooperative
    );
    p.block_body(func.body, 1);
    p.out.push_str("  return\n}\n");
    p.out
}

struct Printer<'a> {
    func: &'a Function,
    names: HashMap<Value, String>,
    next: u32,
    out: String,
}

impl Printer<'_> {
    /// Names values in text order: an op's results, then its block arguments, then its regions.
    fn define(&mut self, v: Value) -> String {
        let name = format!("%{}", self.next);
        self.next += 1;
        self.names.insert(v, name.clone());
        name
    }

    fn name(&self, v: Value) -> String {
        // Only broken IR uses a value before its definition; print it recognisably, never panic.
        self.names.get(&v).cloned().unwrap_or_else(|| format!("%undefined_{}", v.index()))
    }

    fn list(&self, vs: &[Value]) -> String {
        vs.iter().map(|v| self.name(*v)).collect::<Vec<_>>().join(", ")
    }

    fn indent(&mut self, depth: usize) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
    }

    fn block_body(&mut self, block: Block, depth: usize) {
        let b = &self.func.blocks[block];
        for &op in &b.ops {
            self.op(op, depth);
        }
        if !b.yields.is_empty() {
            self.indent(depth);
            let _ = writeln!(self.out, "yield {}", self.list(&b.yields));
        }
    }

    /// Prints a region's contents and its closing brace (the caller printed the opening line).
    fn region(&mut self, block: Block, depth: usize) {
        self.block_body(block, depth + 1);
        self.indent(depth);
        self.out.push('}');
    }

    fn binds(&mut self, args: &[Value], inits: &[Value]) -> String {
        let inits: Vec<String> = inits.iter().map(|v| self.name(*v)).collect();
        let mut parts = Vec::new();
        for (a, i) in args.iter().zip(inits) {
            parts.push(format!("{} = {i}", self.define(*a)));
        }
        parts.join(", ")
    }

    fn op(&mut self, op: Op, depth: usize) {
        let func = self.func;
        let data = &func.ops[op];
        self.indent(depth);
        // Operand names are taken before results are defined (an op never uses its results).
        let head = match (&data.kind, data.results.first().and_then(|r| func.ty(*r).dtype())) {
            // u64 literals are stored as their bit pattern and written unsigned.
            (OpKind::Const(Literal::Int(i)), Some(DType::U64)) => format!("const {}", *i as u64),
            (kind, _) => self.head(kind),
        };
        if !data.results.is_empty() {
            let names: Vec<String> = data.results.iter().map(|r| self.define(*r)).collect();
            let _ = write!(self.out, "{} = ", names.join(", "));
        }
        match &data.kind {
            OpKind::For { lower, upper, step, init, body } => {
                let args = &func.blocks[*body].args;
                let iv = args.first().map(|a| self.define(*a)).unwrap_or_default();
                let (l, u, s) = (self.name(*lower), self.name(*upper), self.name(*step));
                let _ = write!(self.out, "for {iv} = {l} to {u} step {s}");
                if !init.is_empty() {
                    let binds = self.binds(args.get(1..).unwrap_or(&[]), init);
                    let _ = write!(self.out, " iter_args({binds})");
                }
                self.out.push_str(" {\n");
                self.region(*body, depth);
            }
            OpKind::If { cond, then_block, else_block } => {
                let _ = write!(self.out, "if {}", self.name(*cond));
                if !data.results.is_empty() {
                    let tys: Vec<String> = data.results.iter().map(|r| func.ty(*r).to_string()).collect();
                    let _ = write!(self.out, " -> ({})", tys.join(", "));
                }
                self.out.push_str(" {\n");
                self.region(*then_block, depth);
                let e = &func.blocks[*else_block];
                if !e.ops.is_empty() || !e.yields.is_empty() {
                    self.out.push_str(" else {\n");
                    self.region(*else_block, depth);
                }
            }
            OpKind::While { init, cond, body } => {
                let binds = self.binds(&func.blocks[*cond].args, init);
                let _ = writeln!(self.out, "while ({binds}) {{");
                self.region(*cond, depth);
                let args: Vec<String> = func.blocks[*body].args.iter().map(|a| self.define(*a)).collect();
                let _ = writeln!(self.out, " do ({}) {{", args.join(", "));
                self.region(*body, depth);
            }
            _ => {
                self.out.push_str(&head);
                if data.results.len() == 1 {
                    let _ = write!(self.out, " : {}", func.ty(data.results[0]));
                }
            }
        }
        self.out.push('\n');
    }

    /// The text of a region-free op after `=`, without its result type.
    fn head(&self, kind: &OpKind) -> String {
        let n = |v: &Value| self.name(*v);
        let nbi = |b: bool| if b { ", nbi" } else { "" };
        let masked = |s: &mut String, m: &Option<Value>| {
            if let Some(m) = m {
                let _ = write!(s, ", mask {}", n(m));
            }
        };
        match kind {
            OpKind::Const(Literal::Int(i)) => format!("const {i}"),
            OpKind::Const(Literal::Float(f)) => format!("const {}", float_text(*f)),
            OpKind::ProgramId(a) | OpKind::NumPrograms(a) => format!("{} {a}", kind.mnemonic()),
            OpKind::Arange { start, end } => format!("arange {start}, {end}"),
            OpKind::Splat(x) | OpKind::Broadcast(x) | OpKind::Reshape(x) | OpKind::Cast(x) => {
                format!("{} {}", kind.mnemonic(), n(x))
            }
            OpKind::Transpose { x, perm } => {
                let p: Vec<String> = perm.iter().map(|d| d.to_string()).collect();
                format!("transpose {}, [{}]", n(x), p.join(", "))
            }
            OpKind::Unary { op, x } => format!("{op} {}", n(x)),
            OpKind::Binary { op, lhs, rhs } => format!("{op} {}, {}", n(lhs), n(rhs)),
            OpKind::Cmp { op, lhs, rhs } => format!("cmp {op} {}, {}", n(lhs), n(rhs)),
            OpKind::Select { cond, on_true, on_false } => {
                format!("select {}, {}, {}", n(cond), n(on_true), n(on_false))
            }
            OpKind::AddPtr { ptr, offset } => format!("addptr {}, {}", n(ptr), n(offset)),
            OpKind::Reduce { op, axis, x } => format!("reduce {op} {}, axis {axis}", n(x)),
            OpKind::Dot { a, b, acc, precision } => {
                format!("dot {}, {}, {}, precision {precision}", n(a), n(b), n(acc))
            }
            OpKind::Load { ptr, mask, other } => {
                let mut s = format!("load {}", n(ptr));
                masked(&mut s, mask);
                if let Some(o) = other {
                    let _ = write!(s, ", other {}", n(o));
                }
                s
            }
            OpKind::Store { ptr, value, mask } => {
                let mut s = format!("store {}, {}", n(ptr), n(value));
                masked(&mut s, mask);
                s
            }
            OpKind::MakeDesc { ptr, shape, strides } => format!(
                "make_desc {}, [{}, {}], [{}, {}]",
                n(ptr),
                n(&shape[0]),
                n(&shape[1]),
                n(&strides[0]),
                n(&strides[1])
            ),
            OpKind::DescLoad { desc, offsets } => {
                format!("desc_load {}, [{}, {}]", n(desc), n(&offsets[0]), n(&offsets[1]))
            }
            OpKind::DescStore { desc, offsets, value } => {
                format!("desc_store {}, [{}, {}], {}", n(desc), n(&offsets[0]), n(&offsets[1]), n(value))
            }
            OpKind::Atomic { op, ptr, value, mask, sem, scope } => {
                let mut s = format!("atomic {op} {}, {}", n(ptr), n(value));
                masked(&mut s, mask);
                let _ = write!(s, ", sem {sem}, scope {scope}");
                s
            }
            OpKind::LoadFlagged { ptr, flag, mask } => {
                let mut s = format!("load_flagged {}, {}", n(ptr), n(flag));
                masked(&mut s, mask);
                s
            }
            OpKind::AtomicCas { ptr, expected, desired, sem, scope } => {
                format!("atomic_cas {}, {}, {}, sem {sem}, scope {scope}", n(ptr), n(expected), n(desired))
            }
            OpKind::For { .. } | OpKind::If { .. } | OpKind::While { .. } => String::new(),
            OpKind::Rank | OpKind::NumRanks | OpKind::Fence | OpKind::Quiet | OpKind::Barrier => {
                kind.mnemonic().to_string()
            }
            OpKind::SymmAt { ptr, rank } => format!("symm_at {}, {}", n(ptr), n(rank)),
            OpKind::Notify { sig, rank, value, op, scope } => {
                format!("notify {}, {}, {}, op {op}, scope {scope}", n(sig), n(rank), n(value))
            }
            OpKind::Wait { sigs, count, cmp, value, scope, sem } => {
                format!("wait {}, {}, cmp {cmp}, {}, scope {scope}, sem {sem}", n(sigs), n(count), n(value))
            }
            OpKind::ConsumeToken { value, token } => {
                format!("consume_token {}, {}", n(value), n(token))
            }
            OpKind::Put { dst, src, bytes, rank, group, nbi: b }
            | OpKind::Get { dst, src, bytes, rank, group, nbi: b } => {
                format!(
                    "{} {}, {}, {}, {}, group {group}{}",
                    kind.mnemonic(),
                    n(dst),
                    n(src),
                    n(bytes),
                    n(rank),
                    nbi(*b)
                )
            }
            OpKind::PutSignal { dst, src, bytes, sig, sig_value, sig_op, rank, group, nbi: b } => format!(
                "put_signal {}, {}, {}, {}, {}, op {sig_op}, {}, group {group}{}",
                n(dst),
                n(src),
                n(bytes),
                n(sig),
                n(sig_value),
                n(rank),
                nbi(*b)
            ),
            OpKind::SignalWaitUntil { sig, cmp, value } => {
                format!("signal_wait_until {}, cmp {cmp}, {}", n(sig), n(value))
            }
            OpKind::BarrierAll { group } => format!("barrier_all group {group}"),
        }
    }
}

/// Float literals print in Rust's shortest round-trip form, always recognisable as floats.
pub(crate) fn float_text(f: f64) -> String {
    if f.is_nan() {
        "nan".to_string()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{f:?}")
    }
}
