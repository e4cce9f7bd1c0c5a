//! PTX for the matrix units and the asynchronous proxy: `ldmatrix`/`mma`, `wgmma` and its
//! descriptors, mbarriers, TMA loads and stores, bulk groups, proxy fences.

use super::*;
use trident_core::ir::DType;

impl Writer<'_> {
    pub(super) fn matrix(&mut self, i: &Inst) -> Result<(), EmitError> {
        match i {
            Inst::MatrixLoad { dsts, offset, trans } => {
                let addr = self.shared_addr(*offset)?;
                let names: Vec<String> = dsts.iter().map(|d| self.n(*d).to_string()).collect();
                let t = if *trans { ".trans" } else { "" };
                line!(
                    self,
                    "ldmatrix.sync.aligned.m8n8.x{}{t}.shared.b16 {{{}}}, [{addr}]",
                    dsts.len(),
                    names.join(", ")
                );
            }
            Inst::Matmul { atom, d, a, b, c, ab } => {
                if atom.name != trident_core::target::MMA_SYNC_M16N8K16.name {
                    return Err(EmitError(format!(
                        "matrix atom `{}` is not emitted for {}",
                        atom.name, self.target.name
                    )));
                }
                let t = if *ab == SType::BF16 { "bf16" } else { "f16" };
                let list = |w: &Self, rs: &[Reg]| rs.iter().map(|r| w.n(*r).to_string()).collect::<Vec<_>>().join(", ");
                let (dd, aa, bb, cc) = (list(self, d), list(self, a), list(self, b), list(self, c));
                line!(self, "mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{dd}}}, {{{aa}}}, {{{bb}}}, {{{cc}}}");
            }
            Inst::MatrixDescriptor { dst, offset, lbo, sbo, swizzle } => {
                let addr = self.shared_addr(*offset)?;
                let (d, t) = (self.n(*dst).to_string(), self.temp(Class::Rd));
                let fixed = trident_core::simt::smem::Descriptor::fixed_bits(*lbo, *sbo, *swizzle);
                line!(self, "cvt.u64.u32 {t}, {addr}");
                line!(self, "shr.u64 {t}, {t}, 4");
                line!(self, "and.b64 {t}, {t}, 16383");
                line!(self, "or.b64 {d}, {t}, {fixed:#x}");
            }
            Inst::Wgmma { d, c, a, b, n, ab, trans_b, scale_d } => {
                if !self.target.arch_specific {
                    return Err(EmitError(format!("wgmma needs sm_90a, not {}", self.target.name)));
                }
                // The instruction accumulates in place: the accumulator moves into `d` first
                // (nothing to move in a chain, see `alias_accumulators`), and moved registers
                // need a fence before the instruction reads them.
                let moved = d.iter().zip(c).any(|(x, y)| self.n(*x) != self.n(*y));
                self.movs(d, c);
                if moved {
                    self.line("wgmma.fence.sync.aligned".into());
                }
                let (t, k) = match ab {
                    DType::BF16 => ("bf16", 16),
                    DType::F16 => ("f16", 16),
                    DType::F8E4M3FN => ("e4m3", 32),
                    DType::F8E5M2 => ("e5m2", 32),
                    _ => return Err(EmitError(format!("wgmma on `{ab}`"))),
                };
                if k == 32 && *trans_b {
                    return Err(EmitError(format!("wgmma on `{ab}` reads B K-major only")));
                }
                // The 8-bit forms take no transpose operands.
                let trans = if k == 32 { String::new() } else { format!(", 0, {}", *trans_b as u32) };
                let p = match scale_d {
                    Some(p) => self.n(*p).to_string(),
                    None => {
                        let (p, one) = (self.temp(Class::P), self.temp(Class::R));
                        line!(self, "mov.b32 {one}, 1");
                        line!(self, "setp.ne.b32 {p}, {one}, 0");
                        p.to_string()
                    }
                };
                let dd = d.iter().map(|r| self.n(*r).to_string()).collect::<Vec<_>>().join(", ");
                let (da, db) = (self.n(*a).to_string(), self.n(*b).to_string());
                line!(
                    self,
                    "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t} {{{dd}}}, {da}, {db}, {p}, 1, 1{trans}"
                );
            }
            Inst::WgmmaFence => self.line("wgmma.fence.sync.aligned".into()),
            Inst::WgmmaCommit => self.line("wgmma.commit_group.sync.aligned".into()),
            Inst::WgmmaWait { pending } => line!(self, "wgmma.wait_group.sync.aligned {pending}"),
            Inst::FenceProxyAsync => self.line("fence.proxy.async.shared::cta".into()),
            Inst::FenceProxyAsyncGlobal => self.line("fence.proxy.async.global".into()),
            Inst::MbarrierInit { offset, count, pred } => {
                let (addr, p) = (self.shared_addr(*offset)?, self.n(*pred).to_string());
                line!(self, "@{p} mbarrier.init.shared::cta.b64 [{addr}], {count}");
            }
            Inst::FenceMbarrierInit => self.line("fence.mbarrier_init.release.cluster".into()),
            Inst::TmaStore { map, offset, coords, pred } => {
                let src = self.shared_addr(*offset)?;
                let m =
                    self.maps.get(*map as usize).cloned().ok_or_else(|| EmitError(format!("no tensor map {map}")))?;
                let (row, col, p) =
                    (self.n(coords[0]).to_string(), self.n(coords[1]).to_string(), self.n(*pred).to_string());
                line!(
                    self,
                    "@{p} cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [{m}, {{{col}, {row}}}], [{src}]"
                );
            }
            Inst::BulkStore { addr, offset, bytes, pred } => {
                let src = self.shared_addr(*offset)?;
                let (dst, n, p) = (self.n(*addr).to_string(), self.n(*bytes).to_string(), self.n(*pred).to_string());
                line!(self, "@{p} cp.async.bulk.global.shared::cta.bulk_group [{dst}], [{src}], {n}");
            }
            Inst::BulkCommit => self.line("cp.async.bulk.commit_group".into()),
            Inst::BulkWait { pending, writes: false } => line!(self, "cp.async.bulk.wait_group.read {pending}"),
            Inst::BulkWait { pending, writes: true } => line!(self, "cp.async.bulk.wait_group {pending}"),
            Inst::MbarrierArrive { offset, pred } => {
                let (addr, p) = (self.shared_addr(*offset)?, self.n(*pred).to_string());
                line!(self, "@{p} mbarrier.arrive.shared::cta.b64 _, [{addr}]");
            }
            Inst::MbarrierInval { offset, pred } => {
                let (addr, p) = (self.shared_addr(*offset)?, self.n(*pred).to_string());
                line!(self, "@{p} mbarrier.inval.shared::cta.b64 [{addr}]");
            }
            Inst::MbarrierExpectTx { offset, bytes, pred } => {
                let (addr, p) = (self.shared_addr(*offset)?, self.n(*pred).to_string());
                line!(self, "@{p} mbarrier.arrive.expect_tx.shared::cta.b64 _, [{addr}], {bytes}");
            }
            Inst::MbarrierWait { offset, parity } => {
                let (addr, par) = (self.shared_addr(*offset)?, self.n(*parity).to_string());
                let (l, done) = (self.label(), self.temp(Class::P));
                self.body.push_str(&format!("$L{l}_wait:\n"));
                line!(self, "mbarrier.try_wait.parity.shared::cta.b64 {done}, [{addr}], {par}");
                line!(self, "@!{done} bra $L{l}_wait");
            }
            Inst::TmaLoad { map, offset, coords, barrier, pred } => {
                let (dst, bar) = (self.shared_addr(*offset)?, self.shared_addr(*barrier)?);
                let m =
                    self.maps.get(*map as usize).cloned().ok_or_else(|| EmitError(format!("no tensor map {map}")))?;
                let (row, col, p) =
                    (self.n(coords[0]).to_string(), self.n(coords[1]).to_string(), self.n(*pred).to_string());
                line!(self,
                    "@{p} cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{dst}], [{m}, {{{col}, {row}}}], [{bar}]"
                );
            }
            _ => return Err(EmitError(format!("`{i:?}` is not a matrix instruction"))),
        }
        Ok(())
    }
}
