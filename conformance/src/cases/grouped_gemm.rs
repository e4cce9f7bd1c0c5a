//! The grouped GEMM of mixture-of-experts layers (`trident_kernels::grouped_gemm`): `C_e = A_e
//! B_e` with the experts' row counts on the device. Variants: A's layout (`contiguous`, rows
//! grouped by expert with cumulative ends; `masked`, `[E, t_max, K]` with counts) and B's
//! (`nk`: `[E, N, K]`; `kn`: `[E, K, N]`). Shapes `[experts, n, k, rows, routing]`: `rows` the
//! tokens in all (contiguous) or each expert's capacity (masked); routing 0 spreads them at
//! random with an empty and a one-row expert, 1 gives everything to one expert.

use crate::host::random;
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use rand::Rng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_kernels::grouped_gemm::{BLayout, GroupedGemm, Groups, Layout};
use trident_kernels::DeviceCtx;

struct GroupedGemmCase;

fn of(variant: &str) -> (Layout, BLayout) {
    let layout = if variant.starts_with("masked") { Layout::Masked } else { Layout::Contiguous };
    let b = if variant.ends_with("kn") { BLayout::KN } else { BLayout::NK };
    (layout, b)
}

/// Each expert's rows: what the case's routing gives.
fn routed(layout: Layout, shape: &[usize], rng: &mut rand::rngs::StdRng) -> Vec<usize> {
    let (experts, rows, routing) = (shape[0], shape[3], shape[4]);
    let mut c = vec![0; experts];
    let busy = experts / 2;
    match (layout, routing) {
        (Layout::Contiguous, 1) | (Layout::Masked, 1) => c[busy] = rows,
        (Layout::Contiguous, _) => {
            c[1 % experts] = 1;
            for _ in 1..rows {
                c[rng.gen_range((2.min(experts - 1))..experts)] += 1;
            }
        }
        (Layout::Masked, _) => {
            for (e, x) in c.iter_mut().enumerate() {
                *x = match e {
                    0 => 0,
                    1 => 1,
                    _ => rng.gen_range(0..=rows),
                };
            }
        }
    }
    c
}

impl Operation for GroupedGemmCase {
    fn name(&self) -> &'static str {
        "grouped_gemm"
    }

    fn variants(&self, dtype: DType) -> &'static [&'static str] {
        match dtype {
            DType::BF16 => &["contiguous-nk", "contiguous-kn", "masked-nk"],
            DType::F16 => &["contiguous-nk", "masked-kn"],
            _ => &[],
        }
    }

    fn input_types(&self, case: &Case, _inputs: usize) -> Vec<DType> {
        vec![case.dtype, case.dtype, DType::I32]
    }

    fn distributed(&self) -> bool {
        false
    }

    /// Empty and one-row experts, one expert with every row, K not a multiple of the K tile,
    /// N not a multiple of the N tile, one expert of one row.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        [[5, 72, 40, 150, 0], [4, 64, 70, 100, 1], [1, 8, 16, 1, 0]].map(|s| s.to_vec()).to_vec()
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let s = &case.shape;
        let (experts, n, k) = (s[0], s[1], s[2]);
        let (layout, b_layout) = of(case.variant);
        let rows = routed(layout, s, rng);
        let (a_rows, groups): (usize, Vec<f64>) = match layout {
            Layout::Contiguous => {
                let ends = rows.iter().scan(0, |t, &r| {
                    *t += r;
                    Some(*t as f64)
                });
                (rows.iter().sum(), ends.collect())
            }
            Layout::Masked => (experts * s[3], rows.iter().map(|&r| r as f64).collect()),
        };
        let (a, b) = (random(a_rows * k, case.dtype, rng), random(experts * n * k, case.dtype, rng));
        let b_at = |e: usize, kk: usize, j: usize| match b_layout {
            BLayout::NK => b[(e * n + j) * k + kk],
            BLayout::KN => b[(e * k + kk) * n + j],
        };
        // Rows past a masked expert's count: zeros (`run_device` clears them; the kernel
        // leaves them alone).
        let mut expected = vec![0.0; a_rows * n];
        let mut start = 0;
        for (e, &r) in rows.iter().enumerate() {
            let first = if layout == Layout::Contiguous { start } else { e * s[3] };
            for i in first..first + r {
                for j in 0..n {
                    expected[i * n + j] = (0..k).map(|kk| a[i * k + kk] * b_at(e, kk, j)).sum();
                }
            }
            start += r;
        }
        WorldData::single(vec![a, b, groups], expected, k)
    }

    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        let s = &case.shape;
        let (experts, n, k) = (s[0], s[1], s[2]);
        let (layout, b_layout) = of(case.variant);
        let mut raw = vec![0u8; experts * 4];
        l.device.read(&ins[2], 0, &mut raw)?;
        let groups: Vec<usize> = raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
        let es = case.dtype.size_bytes() as usize;
        let rows = match layout {
            Layout::Contiguous => groups.last().copied().unwrap_or(0),
            Layout::Masked => {
                // Clear what the kernel must not write (the rest stays poisoned).
                for (e, &count) in groups.iter().enumerate() {
                    let (from, to) = ((e * s[3] + count) * n * es, (e + 1) * s[3] * n * es);
                    l.device.write(out, from, &vec![0u8; to - from])?;
                }
                s[3]
            }
        };
        let op = GroupedGemm::for_target(case.dtype, layout, b_layout, l.gpu_target());
        op.run(l, (&ins[0], &ins[1], out, &ins[2]), Groups { experts, n, k, rows })
    }
}

inventory::submit! { Registered(&GroupedGemmCase) }
