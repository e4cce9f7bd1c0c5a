//! The differential test: every op of the tile IR, alone, on every backend, against the host
//! reference of its meaning ([`semantics`]).
//!
//! Each case is one op on one element type (a cast on a pair), run in small kernels whose tiles
//! are smaller and larger than the program's threads, one- and two-dimensional, masked and not
//! ([`kernel::layouts`]). Inputs are the type's edge values (0, -0, subnormals, NaN, infinities,
//! MIN, MAX, powers of two, the domain ends of each function) shuffled among random ones from
//! the run's seed; outputs are poisoned first, and masked-off elements must keep the poison.
//! Floats are compared in ulps of their type against the correctly rounded reference (the
//! bounds of [`bound`], `docs/ACCURACY.md`), integers exactly. Whether a backend compiles each
//! case must agree with the committed support matrix (`docs/SUPPORT.md`, [`matrix`]).

pub mod kernel;
pub mod matrix;
pub mod run;
pub mod semantics;
pub mod values;

pub use values::float_edges;

use trident_core::ir::{AtomicOp, BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};

/// What a case computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Cmp(CmpOp),
    Select,
    /// Conversion to the given type.
    Cast(DType),
    Reduce(ReduceOp),
    /// An atomic on a distinct word per element.
    Atomic(AtomicOp),
    AtomicCas,
    /// Every element adds 1 to one counter: the old values are the tickets `0..n`.
    Ticket,
}

/// One op on one element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpCase {
    pub family: Family,
    pub dtype: DType,
    /// Compiled with `fast_math = true`.
    pub fast: bool,
}

/// Every element type of the IR.
pub const DTYPES: [DType; 15] = [
    DType::I1,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::F8E4M3FN,
    DType::F8E5M2,
];

impl OpCase {
    /// The op's name in reports and the support matrix (`exp`, `cmp.lt`, `cast.f32`, ..).
    pub fn op_name(&self) -> String {
        let base = match self.family {
            Family::Unary(op) => op.to_string(),
            Family::Binary(op) => op.to_string(),
            Family::Cmp(op) => format!("cmp.{op}"),
            Family::Select => "select".into(),
            Family::Cast(to) => format!("cast.{to}"),
            Family::Reduce(op) => format!("reduce.{op}"),
            Family::Atomic(op) => format!("atomic.{op}"),
            Family::AtomicCas => "atomic_cas".into(),
            Family::Ticket => "atomic.add.ticket".into(),
        };
        if self.fast {
            format!("{base}.fast")
        } else {
            base
        }
    }

    /// The element type of the result.
    pub fn result_dtype(&self) -> DType {
        match self.family {
            Family::Cmp(_) => DType::I1,
            Family::Cast(to) => to,
            Family::Reduce(ReduceOp::Argmax | ReduceOp::Argmin) => DType::I32,
            _ => self.dtype,
        }
    }
}

const FLOAT_UNARY: [UnaryOp; 17] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Exp2,
    UnaryOp::Expm1,
    UnaryOp::Log,
    UnaryOp::Log2,
    UnaryOp::Log1p,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Erf,
    UnaryOp::Floor,
    UnaryOp::Ceil,
];

/// Every case, in a stable order; `fast` adds the fast-math forms of the f32 functions.
pub fn cases(fast: bool) -> Vec<OpCase> {
    let mut v = Vec::new();
    let mut push = |family, dtype| v.push(OpCase { family, dtype, fast: false });
    for d in DTYPES {
        if d.is_fp8() {
            // FP8 has no arithmetic (the verifier refuses it): moved and converted only.
            push(Family::Select, d);
            DTYPES.iter().for_each(|&to| push(Family::Cast(to), d));
            continue;
        }
        if d.is_float() {
            FLOAT_UNARY.iter().for_each(|&op| push(Family::Unary(op), d));
        } else {
            [UnaryOp::Neg, UnaryOp::Not, UnaryOp::Abs].iter().for_each(|&op| push(Family::Unary(op), d));
        }
        for op in BinaryOp::ALL.iter().copied() {
            let ok = if d.is_float() { !op.int_only() } else { !op.float_only() };
            if ok {
                push(Family::Binary(op), d);
            }
        }
        CmpOp::ALL.iter().for_each(|&op| push(Family::Cmp(op), d));
        push(Family::Select, d);
        DTYPES.iter().for_each(|&to| push(Family::Cast(to), d));
        ReduceOp::ALL.iter().for_each(|&op| push(Family::Reduce(op), d));
        if d.bits() >= 16 {
            for op in AtomicOp::ALL.iter().copied() {
                let bitwise = matches!(op, AtomicOp::And | AtomicOp::Or | AtomicOp::Xor);
                if !(bitwise && d.is_float()) {
                    push(Family::Atomic(op), d);
                }
            }
            push(Family::AtomicCas, d);
        }
        if matches!(d, DType::I32 | DType::U32 | DType::I64 | DType::U64 | DType::F32) {
            push(Family::Ticket, d);
        }
    }
    if fast {
        for op in FLOAT_UNARY.iter().copied().filter(|o| trident_core::math::is_expanded(*o)) {
            v.push(OpCase { family: Family::Unary(op), dtype: DType::F32, fast: true });
        }
    }
    v
}

/// How close a float result must be to the correctly rounded reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// At most this many ulps of the result type (0: exact, sign of zero included).
    Ulps(u64),
    /// `|y - r| <= abs + rel |r|` (fast math, on the documented input domain).
    Tol { abs: f64, rel: f64 },
}

/// The bound of a float-valued case (`docs/ACCURACY.md`).
pub fn bound(c: &OpCase) -> Bound {
    let d = c.result_dtype();
    let elementary = match c.family {
        Family::Unary(op) => trident_core::math::is_expanded(op),
        Family::Binary(op) => op == BinaryOp::Pow,
        _ => false,
    };
    if c.fast {
        let Family::Unary(op) = c.family else { return Bound::Ulps(0) };
        return fast_bound(op);
    }
    if !elementary {
        return Bound::Ulps(0);
    }
    match d {
        // f32 results of f16/bf16 inputs, rounded once more.
        DType::F16 | DType::BF16 => Bound::Ulps(1),
        // The CPU backend's f64 functions are the host libm's, compared with f64 references
        // accurate to about 1e-15 (the series of `reference::erf` loses up to 13 ulp).
        DType::F64 => Bound::Ulps(16),
        _ => Bound::Ulps(2),
    }
}

/// The fast-math bounds, on the domain [`fast_domain`] gives (`docs/ACCURACY.md`).
pub fn fast_bound(op: UnaryOp) -> Bound {
    let e = 2f64.powi(-21);
    match op {
        // ex2.approx: 2 ulp relative, plus the rounding of x log2(e) times |x| <= 64.
        UnaryOp::Exp | UnaryOp::Sigmoid => Bound::Tol { abs: 0.0, rel: 2f64.powi(-16) },
        UnaryOp::Exp2 => Bound::Tol { abs: 0.0, rel: e },
        UnaryOp::Log | UnaryOp::Log2 => Bound::Tol { abs: e, rel: e },
        UnaryOp::Sin | UnaryOp::Cos => Bound::Tol { abs: e, rel: 0.0 },
        UnaryOp::Tanh => Bound::Tol { abs: 2f64.powi(-20), rel: e },
        UnaryOp::Rsqrt => Bound::Tol { abs: 0.0, rel: e },
        // Accurate definitions under fast math too.
        _ => Bound::Ulps(2),
    }
}

/// The inputs fast math is specified on: finite, and where the approximations are meant to be
/// used (`|x| <= 64` for `exp`, `[2^-64, 2^64]` for logarithms, `|x| <= pi` for `sin`/`cos`).
pub fn fast_domain(op: UnaryOp, x: f64) -> bool {
    match op {
        UnaryOp::Exp | UnaryOp::Exp2 | UnaryOp::Sigmoid | UnaryOp::Tanh => x.abs() <= 64.0,
        UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Rsqrt => (2f64.powi(-64)..=2f64.powi(64)).contains(&x),
        UnaryOp::Sin | UnaryOp::Cos => x.abs() <= std::f64::consts::PI,
        _ => x.is_finite(),
    }
}
