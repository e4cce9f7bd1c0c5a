//! The meaning of each op on exact values (`docs/SEMANTICS.md`), computed on the host in f64
//! and i128, independently of every backend: the differential test's reference.

use super::values::{int_range, wrap, V};
use crate::reference::unary_f64;
use trident_core::ir::{AtomicOp, BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};

/// IEEE minimumNumber (`max`: maximumNumber) with `-0 < +0`.
pub fn min_num(max: bool, a: f64, b: f64) -> f64 {
    if a.is_nan() {
        return b;
    }
    if b.is_nan() {
        return a;
    }
    if a == b {
        // Equal: only the sign of a zero can differ.
        let (na, nb) = (a.is_sign_negative(), b.is_sign_negative());
        let neg = if max { na && nb } else { na || nb };
        return if neg { -a.abs() } else { a.abs() };
    }
    if (a < b) != max {
        a
    } else {
        b
    }
}

pub fn unary(op: UnaryOp, d: DType, x: V) -> V {
    if d.is_float() {
        return V::F(unary_f64(op, x.f()));
    }
    let x = x.i();
    V::I(wrap(
        match op {
            UnaryOp::Neg => -x,
            UnaryOp::Not => !x,
            UnaryOp::Abs => x.abs(),
            _ => 0,
        },
        d,
    ))
}

pub fn binary(op: BinaryOp, d: DType, x: V, y: V) -> V {
    if d.is_float() {
        let (a, b) = (x.f(), y.f());
        return V::F(match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Rem => a % b,
            BinaryOp::Min => min_num(false, a, b),
            BinaryOp::Max => min_num(true, a, b),
            BinaryOp::Pow => a.powf(b),
            _ => f64::NAN,
        });
    }
    let (a, b) = (x.i(), y.i());
    let bits = d.bits() as i128;
    // A shift amount is read as an unsigned integer of the type.
    let amount = wrap(b, d).rem_euclid(1i128 << bits.min(127));
    V::I(wrap(
        match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div if b == 0 => -1,
            BinaryOp::Rem if b == 0 => a,
            BinaryOp::Div => a / b,
            BinaryOp::Rem => a % b,
            BinaryOp::Min => a.min(b),
            BinaryOp::Max => a.max(b),
            BinaryOp::And => a & b,
            BinaryOp::Or => a | b,
            BinaryOp::Xor => a ^ b,
            BinaryOp::Shl if amount >= bits => 0,
            BinaryOp::Shl => a << amount,
            BinaryOp::Shr if amount >= bits => {
                if a < 0 {
                    -1
                } else {
                    0
                }
            }
            BinaryOp::Shr => a >> amount,
            BinaryOp::Pow => 0,
        },
        d,
    ))
}

pub fn compare(op: CmpOp, d: DType, x: V, y: V) -> bool {
    if d.is_float() {
        op.holds(x.f(), y.f())
    } else {
        op.holds(x.i(), y.i())
    }
}

/// Conversion of `x` (a `from`) to `to`: floats are returned exact (the check rounds them),
/// float to integer truncates toward zero and saturates (NaN gives 0), to `i1` is `!= 0`.
pub fn cast(from: DType, to: DType, x: V) -> V {
    if from == to {
        return x;
    }
    if to.is_fp8() {
        // Rounded by the check; saturated here, infinities included (`docs/SEMANTICS.md`).
        let max = if to == DType::F8E4M3FN { 448.0 } else { 57344.0 };
        let f = match x {
            V::F(f) => f,
            V::I(i) => i as f64,
        };
        return V::F(if f.is_nan() { f } else { f.clamp(-max, max) });
    }
    if to == DType::I1 {
        return V::I(match x {
            V::F(f) => (f != 0.0) as i128,
            V::I(i) => (i != 0) as i128,
        });
    }
    match (from.is_float(), to.is_float()) {
        // Integers and f64 reach f16/bf16 through f32 (two roundings for the widest values).
        (_, true) if matches!(to, DType::F16 | DType::BF16) => V::F(match x {
            V::F(f) => f as f32 as f64,
            V::I(i) => i as f32 as f64,
        }),
        (_, true) => V::F(match x {
            V::F(f) => f,
            V::I(i) => i as f64,
        }),
        (true, false) => {
            let f = x.f();
            let (lo, hi) = int_range(to);
            V::I(if f.is_nan() {
                0
            } else if f <= lo as f64 {
                lo
            } else if f >= hi as f64 {
                hi
            } else {
                f.trunc() as i128
            })
        }
        (false, false) => V::I(wrap(x.i(), to)),
    }
}

/// A reduction's value, or for `argmax`/`argmin` the index: the first of the best elements,
/// NaN never the best unless every element is NaN.
pub fn reduce(op: ReduceOp, d: DType, xs: &[V]) -> V {
    let arg = matches!(op, ReduceOp::Argmax | ReduceOp::Argmin);
    let max = matches!(op, ReduceOp::Max | ReduceOp::Argmax);
    if d.is_float() {
        let v: Vec<f64> = xs.iter().map(|x| x.f()).collect();
        if op == ReduceOp::Sum {
            return V::F(v.iter().sum());
        }
        if !arg {
            return V::F(v.iter().skip(1).fold(v[0], |a, &b| min_num(max, a, b)));
        }
        let mut best = 0;
        for (i, &e) in v.iter().enumerate().skip(1) {
            let b = v[best];
            if (if max { e > b } else { e < b }) || (b.is_nan() && !e.is_nan()) {
                best = i;
            }
        }
        return V::I(best as i128);
    }
    let v: Vec<i128> = xs.iter().map(|x| x.i()).collect();
    match op {
        ReduceOp::Sum => V::I(wrap(v.iter().sum(), d)),
        ReduceOp::Max => V::I(*v.iter().max().unwrap_or(&0)),
        ReduceOp::Min => V::I(*v.iter().min().unwrap_or(&0)),
        _ => {
            let mut best = 0;
            for (i, &e) in v.iter().enumerate().skip(1) {
                if if max { e > v[best] } else { e < v[best] } {
                    best = i;
                }
            }
            V::I(best as i128)
        }
    }
}

/// The new value of a word after an atomic `op` with operand `x` (floats exact; the check
/// rounds them).
pub fn atomic(op: AtomicOp, d: DType, cur: V, x: V) -> V {
    if d.is_float() {
        let (a, b) = (cur.f(), x.f());
        return V::F(match op {
            AtomicOp::Add => a + b,
            AtomicOp::Max => min_num(true, a, b),
            AtomicOp::Min => min_num(false, a, b),
            _ => b,
        });
    }
    let (a, b) = (cur.i(), x.i());
    V::I(wrap(
        match op {
            AtomicOp::Add => a + b,
            AtomicOp::Max => a.max(b),
            AtomicOp::Min => a.min(b),
            AtomicOp::And => a & b,
            AtomicOp::Or => a | b,
            AtomicOp::Xor => a ^ b,
            AtomicOp::Xchg => b,
        },
        d,
    ))
}
