//! LLVM IR for the matrix units: MFMA; Hopper's `wgmma`, TMA and mbarriers are refused.

use super::*;

impl Writer<'_> {
    pub(super) fn matrix(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::MatrixLoad { .. } => {
                return err("`ldmatrix` is NVIDIA's; the lowering reads MFMA fragments by lane maps")
            }
            Inst::MatrixDescriptor { .. }
            | Inst::Wgmma { .. }
            | Inst::WgmmaFence
            | Inst::WgmmaCommit
            | Inst::WgmmaWait { .. }
            | Inst::FenceProxyAsync
            | Inst::FenceProxyAsyncGlobal
            | Inst::MbarrierInit { .. }
            | Inst::FenceMbarrierInit
            | Inst::MbarrierInval { .. }
            | Inst::MbarrierExpectTx { .. }
            | Inst::MbarrierWait { .. }
            | Inst::TmaLoad { .. }
            | Inst::MbarrierArrive { .. }
            | Inst::TmaStore { .. }
            | Inst::BulkStore { .. }
            | Inst::BulkCommit
            | Inst::BulkWait { .. } => return err("`wgmma`, TMA, mbarriers and their fences are Hopper's (sm_90a)"),
            Inst::Matmul { atom, d, a, b, c, ab } => self.mfma(atom.name, d, a, b, c, *ab)?,
            _ => return Err(EmitError(format!("`{i:?}` is not a matrix instruction"))),
        }
        Ok(())
    }

    /// One MFMA: A and B arrive as packed pairs (two `i32` per lane), C/D as `f32` registers.
    pub(super) fn mfma(
        &mut self,
        atom: &str,
        d: &[Reg],
        a: &[Reg],
        b: &[Reg],
        c: &[Reg],
        ab: SType,
    ) -> Result<(), EmitError> {
        let (shape, half) = match (atom, ab) {
            ("mfma.32x32x8", SType::BF16) => ("32x32x8bf16.1k", "i16"),
            ("mfma.16x16x16", SType::BF16) => ("16x16x16bf16.1k", "i16"),
            ("mfma.32x32x8", SType::F16) => ("32x32x8f16", "half"),
            ("mfma.16x16x16", SType::F16) => ("16x16x16f16", "half"),
            _ => return err(format!("matrix atom `{atom}` on {ab:?} is not an AMD instruction")),
        };
        let nc = c.len();
        let f = format!("llvm.amdgcn.mfma.f32.{shape}");
        let op_t = format!("<4 x {half}>");
        let acc_t = format!("<{nc} x float>");
        self.declare(&format!("declare {acc_t} @{f}({op_t}, {op_t}, {acc_t}, i32, i32, i32)"));
        let operand = |w: &mut Writer, regs: &[Reg]| {
            let mut acc = "poison".to_string();
            for (j, r) in regs.iter().enumerate() {
                let v = w.n(*r);
                let x = w.fresh();
                w.line(format!("{x} = insertelement <2 x i32> {acc}, i32 {v}, i32 {j}"));
                acc = x;
            }
            let x = w.fresh();
            w.line(format!("{x} = bitcast <2 x i32> {acc} to {op_t}"));
            x
        };
        let (va, vb) = (operand(self, a), operand(self, b));
        let mut acc = "poison".to_string();
        for (j, r) in c.iter().enumerate() {
            let v = self.n(*r);
            let x = self.fresh();
            self.line(format!("{x} = insertelement {acc_t} {acc}, float {v}, i32 {j}"));
            acc = x;
        }
        let out = self.call(
            &acc_t,
            &f,
            &[
                format!("{op_t} {va}"),
                format!("{op_t} {vb}"),
                format!("{acc_t} {acc}"),
                "i32 0".into(),
                "i32 0".into(),
                "i32 0".into(),
            ],
        );
        for (j, r) in d.iter().enumerate() {
            self.def(*r, format!("extractelement {acc_t} {out}, i32 {j}"));
        }
        Ok(())
    }
}
