//! Executing register arithmetic: parameters, special registers, constants, unary and binary
//! operations, comparisons, selects, casts, approximations, address arithmetic, `fma`, moves.

use super::*;

impl Exec<'_> {
    pub(super) fn scalar(&mut self, inst: &Inst) -> Result<(), Fault> {
        let (k, lanes) = (self.k, self.lanes);
        match inst {
            Inst::Param { dst, index } => {
                let d = match self.args[*index as usize] {
                    KernelArg::Ptr(p) => Data::P(vec![p; lanes]),
                    KernelArg::Scalar(lit, dt) => literal(lit, dt).splat(lanes),
                };
                self.set(*dst, d);
            }
            Inst::Special { dst, which } => {
                let v: Vec<i64> = match which {
                    Special::ThreadId => (0..lanes as i64).collect(),
                    Special::ProgramId(a) => vec![self.pid[a.index()] as i64; lanes],
                    Special::NumPrograms(a) => vec![self.grid[a.index()] as i64; lanes],
                    // One multiprocessor: timelines place programs by their times alone.
                    Special::SmId => vec![0; lanes],
                };
                self.set(*dst, Data::I(v));
            }
            Inst::Const { dst, value } => {
                let t = k.ty(*dst);
                let d = if t == SType::Ptr { Data::P(vec![0; lanes]) } else { literal(*value, dtype(t)).splat(lanes) };
                self.set(*dst, d);
            }
            Inst::Unary { dst, op, src } => {
                let t = k.ty(*src);
                let primitive = match t {
                    SType::F32 | SType::F64 => {
                        matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Floor | UnaryOp::Ceil)
                    }
                    SType::Pred => *op == UnaryOp::Not,
                    SType::Int { bits: 32 | 64, .. } => matches!(op, UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs),
                    _ => false,
                };
                if !primitive {
                    return contract(format!("`{op}` on {t:?} is not a SIMT primitive"));
                }
                let d = crate::interp::unary(*op, &self.get(*src)?)?;
                self.set(*dst, d);
            }
            Inst::Binary { dst, op, a, b } => {
                let (x, y) = (self.get(*a)?, self.get(*b)?);
                let d = self.binary_primitive(k.ty(*a), *op, &x, &y)?;
                self.set(*dst, d);
            }
            Inst::Cmp { dst, op, a, b } => {
                let t = k.ty(*a);
                if matches!(t, SType::F16 | SType::BF16 | SType::Int { bits: 8 | 16, .. })
                    || (t == SType::Pred && !matches!(op, CmpOp::Eq | CmpOp::Ne))
                {
                    return contract(format!("`{op}` comparison on {t:?} is not a SIMT primitive"));
                }
                let d = crate::interp::compare(*op, &self.get(*a)?, &self.get(*b)?);
                self.set(*dst, d);
            }
            Inst::Bitcast { dst, src } => {
                let v = self.get(*src)?;
                let d = match (&v.data, k.ty(*dst)) {
                    (Data::F(x), SType::Int { bits: 32, signed }) => Data::I(
                        x.iter().map(|f| if signed { f.to_bits() as i32 as i64 } else { f.to_bits() as i64 }).collect(),
                    ),
                    (Data::D(x), SType::Int { bits: 64, .. }) => {
                        Data::I(x.iter().map(|f| f.to_bits() as i64).collect())
                    }
                    (Data::I(x), SType::F32) => Data::F(x.iter().map(|&i| f32::from_bits(i as u32)).collect()),
                    (Data::I(x), SType::F64) => Data::D(x.iter().map(|&i| f64::from_bits(i as u64)).collect()),
                    (Data::P(x), SType::Int { bits: 64, .. }) => Data::I(x.iter().map(|&p| p as i64).collect()),
                    (Data::I(x), SType::Ptr) => Data::I(x.clone()),
                    _ => return contract(format!("bitcast from {:?} to {:?}", k.ty(*src), k.ty(*dst))),
                };
                self.set(*dst, d);
            }
            Inst::Approx { dst, func, src } => {
                let Data::F(x) = self.get(*src)?.data else { return contract("approximation of a non-f32 register") };
                let f = *func;
                self.set(*dst, Data::F(x.iter().map(|&a| trident_core::math::native::approx_f32(f, a)).collect()));
            }
            Inst::Select { dst, cond, on_true, on_false } => {
                let (c, t, f) = (self.get(*cond)?, self.get(*on_true)?, self.get(*on_false)?);
                let idx: Vec<usize> =
                    c.ints().iter().enumerate().map(|(i, &ci)| if ci != 0 { i } else { i + lanes }).collect();
                self.set(*dst, crate::interp::concat(&t.data, &f.data).gather(&idx));
            }
            Inst::Cast { dst, src } => {
                let x = self.get(*src)?;
                let to = dtype(k.ty(*dst));
                let mut d = crate::interp::cast(&x, to);
                // A NaN converted to a (32/64-bit) integer is the hardware's business: give
                // MIN, as PTX does for 64-bit results, so that a missing NaN select shows.
                if let (SType::Int { bits, signed }, Data::I(v)) = (k.ty(*dst), &mut d) {
                    let nan: Vec<bool> = match &x.data {
                        Data::F(f) => f.iter().map(|a| a.is_nan()).collect(),
                        Data::D(f) => f.iter().map(|a| a.is_nan()).collect(),
                        _ => Vec::new(),
                    };
                    for (o, n) in v.iter_mut().zip(nan) {
                        if n {
                            *o = if signed { i64::MIN >> (64 - bits) } else { 1i64 << (bits - 1) };
                        }
                    }
                }
                self.set(*dst, d);
            }
            Inst::Mov { dst, src } => self.copy_all(&[*dst], &[*src])?,
            Inst::Fp8Convert { dst, src, format } => {
                let Some(f) = format.fp8() else { return contract(format!("FP8 conversion of `{format}`")) };
                let d = match (&self.get(*src)?.data, k.ty(*dst)) {
                    (Data::I(codes), SType::F16) => Data::F(codes.iter().map(|&c| f.decode(c as u8) as f32).collect()),
                    // The hardware's NaN code may be any NaN: 0xFF here, so that a missing
                    // canonicalisation shows.
                    (Data::F(x), SType::Int { bits: 8, .. }) => {
                        Data::I(x.iter().map(|&a| if a.is_nan() { 0xFF } else { f.encode(a as f64) as i64 }).collect())
                    }
                    _ => return contract(format!("FP8 conversion from {:?} to {:?}", k.ty(*src), k.ty(*dst))),
                };
                self.set(*dst, d);
            }
            Inst::Fma { dst, a, b, c } => {
                let d = match (&self.get(*a)?.data, &self.get(*b)?.data, &self.get(*c)?.data) {
                    (Data::F(x), Data::F(y), Data::F(z)) => {
                        Data::F((0..lanes).map(|i| x[i].mul_add(y[i], z[i])).collect())
                    }
                    (Data::D(x), Data::D(y), Data::D(z)) => {
                        Data::D((0..lanes).map(|i| x[i].mul_add(y[i], z[i])).collect())
                    }
                    _ => return fault("fma on non-float registers"),
                };
                self.set(*dst, d);
            }
            Inst::AddrOffset { dst, base, offset, scale } => {
                let (b, o) = (self.get(*base)?, self.get(*offset)?);
                let unsigned = matches!(k.ty(*offset), SType::Int { bits: 64, signed: false });
                let v = b
                    .ptrs()
                    .iter()
                    .zip(o.ints())
                    .map(|(&p, &off)| {
                        let off = if unsigned { off as u64 as i128 } else { off as i128 };
                        (p as i128 + off * *scale as i128) as u64
                    })
                    .collect();
                self.set(*dst, Data::P(v));
            }
            Inst::Clock { dst } => {
                let ns = self.hooks.clock_ns();
                self.set(*dst, Data::I(vec![ns as i64; lanes]));
            }
            Inst::Pack { dst, lo, hi } => {
                let (l, h) = (self.get(*lo)?, self.get(*hi)?);
                let bits = |v: &Val, i: usize| elem_bits(&v.data, i, dtype(k.ty(*lo))) & 0xffff;
                let v = (0..lanes).map(|i| (bits(&l, i) | bits(&h, i) << 16) as u32 as i32 as i64).collect();
                self.set(*dst, Data::I(v));
            }
            _ => return fault(format!("`{inst:?}` is not a scalar instruction")),
        }
        Ok(())
    }
}
