//! What the SIMT lowering refuses, before it starts: ops whose meaning on some element type it
//! does not expand yet. Each refusal is a typed error naming the op, its text position and the
//! reason; the support matrix (`docs/SUPPORT.md`) lists them.

use super::*;
use crate::math;

/// The first op of `func` the lowering cannot give its IR meaning.
pub(super) fn check(func: &Function) -> Result<(), LowerError> {
    let mut err = None;
    func.walk(|_, data| {
        if err.is_some() {
            return;
        }
        if let Some(reason) = refusal(func, &data.kind) {
            err = Some(LowerError::Unsupported { op: data.kind.mnemonic().into(), loc: data.loc, reason });
        }
    });
    err.map_or(Ok(()), Err)
}

fn dtype_of(func: &Function, v: Value) -> Option<DType> {
    func.ty(v).elem.dtype().or(func.ty(v).elem.pointee())
}

/// Why the lowering refuses `kind`, if it does.
pub fn refusal(func: &Function, kind: &OpKind) -> Option<String> {
    match *kind {
        OpKind::Unary { op, x } if dtype_of(func, x) == Some(DType::F64) && math::is_expanded(op) => {
            Some(format!("`{op}` on f64 is not expanded yet (f32, f16 and bf16 are)"))
        }
        OpKind::Binary { op: op @ (BinaryOp::Rem | BinaryOp::Pow), lhs, .. }
            if dtype_of(func, lhs) == Some(DType::F64) =>
        {
            Some(format!("`{op}` on f64 is not expanded yet (f32, f16 and bf16 are)"))
        }
        OpKind::Atomic { ptr, .. } | OpKind::AtomicCas { ptr, .. } => {
            let d = dtype_of(func, ptr)?;
            (d.bits() < 32).then(|| format!("no GPU target has {}-bit atomics on `{d}`", d.bits()))
        }
        _ => None,
    }
}
