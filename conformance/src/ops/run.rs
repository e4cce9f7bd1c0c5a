//! Runs a case on a backend's device and checks every element against [`super::semantics`].

use super::kernel::{build, input_types, layouts, Layout};
use super::values::{decode, encode, from_bytes, inputs, shuffle, to_bytes, V};
use super::{bound, fast_domain, semantics, Bound, Family, OpCase};
use crate::host::case_rng;
use crate::reference::ulps;
use rand::Rng;
use serde::Serialize;
use std::sync::Arc;
use trident_core::backend::{Backend, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::ir::{AtomicOp, BinaryOp, DType, ReduceOp, UnaryOp};

/// What became of a case on one backend.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Status {
    Pass,
    Fail,
    /// The backend does not compile it (the reason it gave).
    Refused,
}

/// One case's record.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub op: String,
    pub dtype: String,
    pub backend: String,
    pub target: String,
    pub status: Status,
    /// The largest distance, in ulps of the result type, of a float result from the correctly
    /// rounded reference (0 for exact ops and integers).
    pub max_ulp: u64,
    /// Elements compared.
    pub checked: usize,
    /// Why it failed or was refused.
    pub message: String,
}

/// A backend, a target and (when running, not only compiling) its device.
pub struct Runner<'a> {
    pub backend: &'a dyn Backend,
    pub target: Option<&'a str>,
    pub device: Option<Arc<dyn Device>>,
    pub seed: u64,
}

/// A failed check of one element, with what is needed to reproduce it.
struct Mismatch(String);

impl Runner<'_> {
    /// Compiles the case in every layout: `Err(reason)` when the backend refuses it.
    pub fn compile(&self, c: &OpCase) -> Result<(), String> {
        for lay in layouts(c.family) {
            let f = build(c, &lay).map_err(|e| format!("the test built an invalid kernel: {e}"))?;
            self.backend.compile(&f, self.target).map_err(|e| refusal_text(&e))?;
        }
        Ok(())
    }

    /// Runs the case (index `index` in the run's order) in every layout.
    pub fn run(&self, c: &OpCase, index: usize) -> Outcome {
        let desc = self.backend.descriptor();
        let mut out = Outcome {
            op: c.op_name(),
            dtype: c.dtype.to_string(),
            backend: desc.name.to_string(),
            target: self.target.unwrap_or(desc.target_names()[0]).to_string(),
            status: Status::Pass,
            max_ulp: 0,
            checked: 0,
            message: String::new(),
        };
        for (li, lay) in layouts(c.family).into_iter().enumerate() {
            let func = match build(c, &lay) {
                Ok(f) => f,
                Err(e) => return out.fail(format!("the test built an invalid kernel: {e}")),
            };
            let art = match self.backend.compile(&func, self.target) {
                Ok(a) => a,
                Err(e @ BackendError::Compile { .. }) => {
                    out.status = Status::Refused;
                    out.message = refusal_text(&e);
                    return out;
                }
                Err(e) => return out.fail(e.to_string()),
            };
            let Some(dev) = &self.device else { continue };
            let mut rng = case_rng(self.seed, index * 16 + li);
            match self.run_layout(dev.as_ref(), &art, c, &lay, &mut rng) {
                Ok((n, u)) => {
                    out.checked += n;
                    out.max_ulp = out.max_ulp.max(u);
                }
                Err(Mismatch(m)) => return out.fail(format!("layout {}: {m}", lay.text())),
            }
        }
        out
    }

    fn run_layout(
        &self,
        dev: &dyn Device,
        art: &trident_core::backend::Artifact,
        c: &OpCase,
        lay: &Layout,
        rng: &mut rand::rngs::StdRng,
    ) -> Result<(usize, u64), Mismatch> {
        let total = lay.total();
        let rd = c.result_dtype();
        let data = case_inputs(c, lay, rng);
        let mut bufs: Vec<Buffer> = Vec::new();
        let mut args = Vec::new();
        let err = |e: BackendError| Mismatch(e.to_string());
        let alloc = |bits: &[u64], d: DType, name: &str, bufs: &mut Vec<Buffer>| -> Result<KernelArg, Mismatch> {
            let bytes = to_bytes(bits, d);
            let b = dev.alloc(bytes.len().max(8), name).map_err(err)?;
            dev.write(&b, 0, &bytes).map_err(err)?;
            let a = b.arg();
            bufs.push(b);
            Ok(a)
        };
        let atomic = matches!(c.family, Family::Atomic(_) | Family::AtomicCas | Family::Ticket);
        if atomic {
            args.push(alloc(&data.mem, c.dtype, "mem", &mut bufs)?);
        }
        for (i, (x, t)) in data.xs.iter().zip(&data.types).enumerate() {
            args.push(alloc(x, *t, &format!("x{i}"), &mut bufs)?);
        }
        let out_len = out_len(c, lay);
        let poison = poison_bits(rd);
        args.push(alloc(&vec![poison; out_len], rd, "out", &mut bufs)?);
        let out_buf = bufs.len() - 1;
        if !matches!(c.family, Family::Reduce(_)) {
            args.push(KernelArg::i32(lay.valid as i32));
        }
        let opts = LaunchOptions { seed: self.seed, ..LaunchOptions::default() };
        let launched = dev.launch(art, [lay.programs, 1, 1], &args, &opts);
        let read = |b: &Buffer, d: DType, n: usize| -> Result<Vec<u64>, Mismatch> {
            let mut bytes = vec![0u8; n * d.size_bytes() as usize];
            dev.read(b, 0, &mut bytes).map_err(|e| Mismatch(e.to_string()))?;
            Ok(from_bytes(&bytes, d))
        };
        let result = launched.map_err(err).and_then(|_| {
            let got = read(&bufs[out_buf], rd, out_len)?;
            let mem = if atomic { read(&bufs[0], c.dtype, data.mem.len())? } else { Vec::new() };
            check(c, lay, &data, &got, &mem, total)
        });
        for b in &bufs {
            let _ = dev.free(b);
        }
        result
    }
}

impl Outcome {
    fn fail(mut self, m: String) -> Outcome {
        self.status = Status::Fail;
        self.message = m;
        self
    }
}

/// The reason in a backend's refusal, without the kernel's generated name.
fn refusal_text(e: &BackendError) -> String {
    match e {
        BackendError::Compile { message, .. } => {
            // "`op` (line ..): not supported by the SIMT lowering yet: REASON" -> REASON.
            message.rsplit(": ").next().unwrap_or(message).trim().to_string()
        }
        e => e.to_string(),
    }
}

/// A case's inputs: one vector of bits per input, and the words atomics start from.
pub struct Inputs {
    pub types: Vec<DType>,
    pub xs: Vec<Vec<u64>>,
    pub mem: Vec<u64>,
}

fn case_inputs(c: &OpCase, lay: &Layout, rng: &mut rand::rngs::StdRng) -> Inputs {
    let total = lay.total();
    let d = c.dtype;
    let types = match c.family {
        Family::Reduce(_) => vec![d],
        _ => input_types(c),
    };
    let mut xs: Vec<Vec<u64>> = types
        .iter()
        .map(|&t| {
            let mut v = inputs(t, total, rng);
            shuffle(&mut v, rng);
            v
        })
        .collect();
    match c.family {
        // Shift amounts: most below twice the width, so that both sides of the width show.
        Family::Binary(BinaryOp::Shl | BinaryOp::Shr) => {
            for b in xs[1].iter_mut() {
                if rng.gen_bool(0.7) {
                    *b = encode(V::I(rng.gen_range(0..2 * d.bits() as i128)), d);
                }
            }
        }
        // Exponents: often small integers and halves, where the sign rules live.
        Family::Binary(BinaryOp::Pow) => {
            for b in xs[1].iter_mut() {
                if rng.gen_bool(0.4) {
                    *b = encode(V::F(rng.gen_range(-20..=20) as f64 * 0.5), d);
                }
            }
        }
        // Sums of floats: values that do not overflow (summation order is the backend's).
        Family::Reduce(ReduceOp::Sum) if d.is_float() => {
            for b in xs[0].iter_mut() {
                *b = encode(V::F(rng.gen_range(-8.0..8.0)), d);
            }
        }
        // Max/min and arg reductions: many ties.
        Family::Reduce(_) => {
            for b in xs[0].iter_mut() {
                if rng.gen_bool(0.5) {
                    *b = encode(V::I(rng.gen_range(-3..4)), d);
                    if d.is_float() {
                        *b = encode(V::F(rng.gen_range(-3..4) as f64), d);
                    }
                }
            }
        }
        Family::Unary(op) if c.fast => {
            for b in xs[0].iter_mut() {
                if !fast_domain(op, decode(*b, d).f()) {
                    let x = match op {
                        UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Rsqrt => 2f64.powf(rng.gen_range(-60.0..60.0)),
                        UnaryOp::Sin | UnaryOp::Cos => rng.gen_range(-std::f64::consts::PI..std::f64::consts::PI),
                        _ => rng.gen_range(-60.0..60.0),
                    };
                    *b = encode(V::F(x), d);
                }
            }
        }
        // Compare-and-swap: half the expected values match.
        Family::AtomicCas => {}
        _ => {}
    }
    let mem = match c.family {
        Family::Ticket => vec![encode(if d.is_float() { V::F(0.0) } else { V::I(rng.gen_range(0..1000)) }, d)],
        Family::Atomic(_) | Family::AtomicCas => {
            let mut m = inputs(d, total, rng);
            shuffle(&mut m, rng);
            if c.family == Family::AtomicCas {
                for (i, e) in xs[0].iter_mut().enumerate() {
                    if rng.gen_bool(0.5) {
                        *e = m[i];
                    }
                }
            }
            m
        }
        _ => Vec::new(),
    };
    Inputs { types, xs, mem }
}

/// Elements the kernel's `out` holds.
fn out_len(c: &OpCase, lay: &Layout) -> usize {
    match c.family {
        Family::Reduce(_) => {
            let mut s = lay.tile.clone();
            s.remove(lay.axis as usize);
            s.iter().product::<u32>() as usize * lay.programs as usize
        }
        _ => lay.total(),
    }
}

/// What outputs are filled with first: NaN for floats, 0xA5.. for integers.
pub fn poison_bits(d: DType) -> u64 {
    if d.is_float() {
        encode(V::F(f64::NAN), d)
    } else {
        0xA5A5_A5A5_A5A5_A5A5 & mask_of(d)
    }
}

fn mask_of(d: DType) -> u64 {
    let bits = (d.size_bytes() * 8) as u64;
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// The significand precision of a float type.
fn precision(d: DType) -> i32 {
    match d {
        DType::F16 => 11,
        DType::BF16 => 8,
        DType::F32 => 24,
        DType::F8E4M3FN => 4,
        DType::F8E5M2 => 3,
        _ => 53,
    }
}

/// Compares a float result with the exact `r` under `b`; returns its distance in ulps.
fn float_check(y_bits: u64, r: f64, d: DType, b: Bound) -> Result<u64, String> {
    let y = decode(y_bits, d).f();
    let cr = decode(encode(V::F(r), d), d).f();
    let u = ulps(y, r, d);
    let ok = match b {
        // An FP8 NaN result is the one code SEMANTICS.md gives (0x7F), not any NaN.
        Bound::Ulps(0) => encode(V::F(r), d) == y_bits || (y.is_nan() && r.is_nan() && !d.is_fp8()),
        Bound::Ulps(k) => u <= k && (y.is_infinite() == cr.is_infinite()),
        Bound::Tol { abs, rel } => (y.is_nan() && r.is_nan()) || (y - r).abs() <= abs + rel * r.abs() || y == r,
    };
    if ok {
        Ok(u)
    } else {
        Err(format!(
            "got {y:e} ({y_bits:#x}), want {cr:e} ({} ulp; bound {b:?})",
            if u == u64::MAX { -1 } else { u as i64 }
        ))
    }
}

/// Equal bits, or both NaN (FP8 values, bytes that moves keep, only with equal bits).
fn same_bits(a: u64, b: u64, d: DType) -> bool {
    a == b || (d.is_float() && !d.is_fp8() && decode(a, d).f().is_nan() && decode(b, d).f().is_nan())
}

fn show(bits: u64, d: DType) -> String {
    match decode(bits, d) {
        V::F(f) => format!("{f:e}"),
        V::I(i) => i.to_string(),
    }
}

/// Checks every output element; returns (elements compared, largest ulp distance).
fn check(
    c: &OpCase,
    lay: &Layout,
    data: &Inputs,
    got: &[u64],
    mem: &[u64],
    total: usize,
) -> Result<(usize, u64), Mismatch> {
    let rd = c.result_dtype();
    let d = c.dtype;
    let b = bound(c);
    let poison = poison_bits(rd);
    let mut worst = 0u64;
    let mut checked = 0;
    let inside = |i: usize| !lay.masked || i < lay.valid;
    let elem = |v: V, bits: u64| -> Result<u64, String> {
        match v {
            V::F(r) => float_check(bits, r, rd, b),
            V::I(i) => {
                let want = encode(V::I(i), rd);
                if want == bits {
                    Ok(0)
                } else {
                    Err(format!("got {}, want {}", show(bits, rd), show(want, rd)))
                }
            }
        }
    };
    match c.family {
        Family::Reduce(op) => {
            let (tile, axis) = (&lay.tile, lay.axis as usize);
            let numel = lay.numel();
            let len = tile[axis] as usize;
            let inner: usize = tile[axis + 1..].iter().product::<u32>() as usize;
            let outer: usize = tile[..axis].iter().product::<u32>() as usize;
            let per = outer * inner;
            for p in 0..lay.programs as usize {
                for o in 0..outer {
                    for i in 0..inner {
                        let xs: Vec<V> =
                            (0..len).map(|k| decode(data.xs[0][p * numel + (o * len + k) * inner + i], d)).collect();
                        let r = semantics::reduce(op, d, &xs);
                        let bits = got[p * per + o * inner + i];
                        let res = match (op, r) {
                            (ReduceOp::Sum, V::F(r)) => {
                                // Summation order is the backend's: n u sum|x| (f32 accumulators
                                // for f16/bf16), plus the final rounding.
                                let acc = if d == DType::F64 { 53 } else { 24 };
                                let mag: f64 = xs.iter().map(|x| x.f().abs()).sum();
                                let tol = len as f64 * 2f64.powi(-acc) * mag + r.abs() * 2f64.powi(1 - precision(d));
                                float_check(bits, r, d, Bound::Tol { abs: tol, rel: 0.0 }).map(|_| 0)
                            }
                            _ => elem(r, bits),
                        };
                        match res {
                            Ok(u) => worst = worst.max(u),
                            Err(m) => {
                                let shown: Vec<String> = xs.iter().take(8).map(|x| format!("{:?}", x)).collect();
                                return Err(Mismatch(format!(
                                    "program {p}, result element {}: {m}; inputs along axis {axis} start {}",
                                    o * inner + i,
                                    shown.join(", ")
                                )));
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        Family::Ticket => {
            let n = (0..total).filter(|&i| inside(i)).count() as i128;
            let c0 = decode(data.mem[0], d);
            let start = c0.i();
            let want_final = if d.is_float() { V::F(n as f64) } else { V::I(start + n) };
            let fin = mem[0];
            if encode(want_final, d) != fin {
                return Err(Mismatch(format!(
                    "the counter ends at {}, want {} ({n} elements, each adding 1 once)",
                    show(fin, d),
                    show(encode(want_final, d), d)
                )));
            }
            let mut tickets: Vec<i128> = Vec::new();
            for (i, &g) in got.iter().enumerate().take(total) {
                if inside(i) {
                    tickets.push(decode(g, d).i() - start);
                } else if g != poison {
                    return Err(Mismatch(format!("masked-off element {i} was written")));
                }
            }
            tickets.sort();
            if tickets != (0..n).collect::<Vec<_>>() {
                return Err(Mismatch(format!(
                    "the old values are not the tickets 0..{n}: {:?}..",
                    &tickets[..8.min(tickets.len())]
                )));
            }
            checked += tickets.len();
        }
        _ => {
            for i in 0..total {
                let x: Vec<V> = data.xs.iter().zip(&data.types).map(|(v, t)| decode(v[i], *t)).collect();
                if !inside(i) {
                    if got[i] != poison {
                        return Err(Mismatch(format!("masked-off element {i} was written ({})", show(got[i], rd))));
                    }
                    if matches!(c.family, Family::Atomic(_)) && mem[i] != data.mem[i] {
                        return Err(Mismatch(format!("masked-off element {i}'s word was updated")));
                    }
                    continue;
                }
                if c.fast {
                    if let Family::Unary(op) = c.family {
                        if !fast_domain(op, x[0].f()) {
                            continue;
                        }
                    }
                }
                let check_one = |want: V, bits: u64| elem(want, bits);
                let res = match c.family {
                    Family::Unary(op) => check_one(semantics::unary(op, d, x[0]), got[i]),
                    Family::Binary(op) => check_one(semantics::binary(op, d, x[0], x[1]), got[i]),
                    Family::Cmp(op) => check_one(V::I(semantics::compare(op, d, x[0], x[1]) as i128), got[i]),
                    Family::Select => check_one(if x[0].i() != 0 { x[1] } else { x[2] }, got[i]),
                    Family::Cast(to) => check_one(semantics::cast(d, to, x[0]), got[i]),
                    Family::Atomic(op) => {
                        let cur = decode(data.mem[i], d);
                        let want = semantics::atomic(op, d, cur, x[0]);
                        let w = encode(want, d);
                        let same_nan = d.is_float() && decode(w, d).f().is_nan() && decode(mem[i], d).f().is_nan();
                        // f32 atomic add may flush subnormal operands and results to a zero of
                        // their sign (`docs/SEMANTICS.md`; the H200's `atom.add.f32` does).
                        let flushed = d == DType::F32 && op == AtomicOp::Add && {
                            let ftz = |v: V| match v {
                                V::F(x) if x != 0.0 && x.abs() < f32::MIN_POSITIVE as f64 => V::F(0.0f64.copysign(x)),
                                v => v,
                            };
                            mem[i] == encode(ftz(semantics::atomic(op, d, ftz(cur), ftz(x[0]))), d)
                        };
                        if !same_bits(got[i], data.mem[i], d) {
                            Err(format!("returned {}, the word held {}", show(got[i], d), show(data.mem[i], d)))
                        } else if mem[i] != w && !same_nan && !flushed {
                            Err(format!("the word became {}, want {}", show(mem[i], d), show(w, d)))
                        } else {
                            Ok(0)
                        }
                    }
                    Family::AtomicCas => {
                        let w = if data.mem[i] == data.xs[0][i] { data.xs[1][i] } else { data.mem[i] };
                        if !same_bits(got[i], data.mem[i], d) {
                            Err(format!("returned {}, the word held {}", show(got[i], d), show(data.mem[i], d)))
                        } else if !same_bits(mem[i], w, d) {
                            Err(format!("the word became {}, want {}", show(mem[i], d), show(w, d)))
                        } else {
                            Ok(0)
                        }
                    }
                    _ => Ok(0),
                };
                match res {
                    Ok(u) => worst = worst.max(u),
                    Err(m) => {
                        let shown: Vec<String> =
                            data.xs.iter().zip(&data.types).map(|(v, t)| format!("{} {t}", show(v[i], *t))).collect();
                        return Err(Mismatch(format!("element {i}, inputs ({}): {m}", shown.join(", "))));
                    }
                }
                checked += 1;
            }
        }
    }
    Ok((checked, worst))
}
