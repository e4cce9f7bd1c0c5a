//! The grouped GEMM of mixture-of-experts layers (`trident_kernels::grouped_gemm`): `C_e = A_e
//! B_e` with the experts' row counts on the device. Variants: A's layout (`contiguous`, rows
//! grouped by expert with cumulative ends; `masked`, `[E, t_max, K]` with counts) and B's
//! (`nk`: `[E, N, K]`; `kn`: `[E, K, N]`); `scaled`: the product times a scale per row and per
//! expert and column; a leading `e4m3`/`e5m2`: FP8 operands (scaled, C bf16, the case's type).
//! Shapes `[experts, n, k, rows, routing]`: `rows` the
//! tokens in all (contiguous) or each expert's capacity (masked); routing 0 spreads them at
//! random with an empty and a one-row expert, 1 gives everything to one expert.

use crate::host::{random, round_to};
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use rand::Rng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_kernels::grouped_gemm::{BLayout, GroupedGemm, Groups, Layout, Scales};
use trident_kernels::scaled_gemm::SCALE_BLOCK;
use trident_kernels::DeviceCtx;

struct GroupedGemmCase;

/// A variant's kernel: operand type (the case's, or FP8), layouts, scaling.
fn of(case: &Case) -> GroupedGemm {
    let v = case.variant;
    let dtype = match v.split('-').next() {
        Some("e4m3") => DType::F8E4M3FN,
        Some("e5m2") => DType::F8E5M2,
        _ => case.dtype,
    };
    let layout = if v.contains("masked") { Layout::Masked } else { Layout::Contiguous };
    let b = if v.split('-').any(|w| w == "kn") { BLayout::KN } else { BLayout::NK };
    let scales = if v.ends_with("block") {
        Scales::Block
    } else if dtype.is_fp8() || v.ends_with("scaled") {
        Scales::Row
    } else {
        Scales::None
    };
    GroupedGemm { scales, ..GroupedGemm::new(dtype, layout, b) }
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
            DType::BF16 => &[
                "contiguous-nk",
                "contiguous-kn",
                "masked-nk",
                "contiguous-nk-scaled",
                "e4m3-contiguous-nk",
                "e4m3-masked-nk",
                "e5m2-contiguous-kn",
                "e4m3-contiguous-nk-block",
                "e4m3-masked-nk-block",
            ],
            DType::F16 => &["contiguous-nk", "masked-kn"],
            _ => &[],
        }
    }

    fn input_types(&self, case: &Case, _inputs: usize) -> Vec<DType> {
        let op = of(case);
        let mut t = vec![op.dtype, op.dtype, DType::I32];
        if op.scales != Scales::None {
            t.extend([DType::F32, DType::F32]);
        }
        t
    }

    fn distributed(&self) -> bool {
        false
    }

    /// Empty and one-row experts, one expert with every row, K not a multiple of the K tile,
    /// N not a multiple of the N tile, one expert of one row; the last with K a multiple of 16,
    /// which the descriptor form (TMA, `wgmma`) takes for every type on sm_90a.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        [[5, 72, 40, 150, 0], [4, 64, 70, 100, 1], [1, 8, 16, 1, 0], [4, 136, 96, 200, 0]].map(|s| s.to_vec()).to_vec()
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let s = &case.shape;
        let (experts, n, k) = (s[0], s[1], s[2]);
        let op = of(case);
        let (layout, b_layout) = (op.layout, op.b_layout);
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
        // FP8 values over their whole range, with scales near 1/400; else scales near 1.
        let spread = if op.dtype.is_fp8() { 400.0 } else { 1.0 };
        let values = |len: usize, rng: &mut rand::rngs::StdRng| {
            let v: Vec<f64> = random(len, DType::F32, rng).iter().map(|x| x * spread).collect();
            round_to(&v, op.dtype)
        };
        let (a, b) = (values(a_rows * k, rng), values(experts * n * k, rng));
        let mut scales = |len: usize| -> Vec<f64> {
            round_to(&(0..len).map(|_| rng.gen_range(0.25..4.0) / spread).collect::<Vec<_>>(), DType::F32)
        };
        let (la, lb) = op.scale_lens(a_rows, experts, n, k);
        let (sa, sb) = (scales(la), scales(lb));
        let (blk, kb) = (SCALE_BLOCK as usize, k.div_ceil(SCALE_BLOCK as usize));
        // The scale of product term (row i, column j of expert e, K index kk).
        let scale_of = |i: usize, e: usize, j: usize, kk: usize| match op.scales {
            Scales::None => 1.0,
            Scales::Row => sa[i] * sb[e * n + j],
            Scales::Block => sa[i * kb + kk / blk] * sb[(e * n.div_ceil(blk) + j / blk) * kb + kk / blk],
        };
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
                    expected[i * n + j] = (0..k).map(|kk| a[i * k + kk] * b_at(e, kk, j) * scale_of(i, e, j, kk)).sum();
                }
            }
            start += r;
        }
        let mut inputs = vec![a, b, groups];
        if op.scales != Scales::None {
            inputs.extend([sa, sb]);
        }
        WorldData::single(inputs, expected, k)
    }

    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        let s = &case.shape;
        let (experts, n, k) = (s[0], s[1], s[2]);
        let op = of(case);
        let layout = op.layout;
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
        let op = GroupedGemm { scales: op.scales, ..GroupedGemm::for_target(op.dtype, layout, op.b_layout, l.gpu_target()) };
        let scales = (op.scales != Scales::None).then(|| (&ins[3], &ins[4]));
        op.run(l, (&ins[0], &ins[1], out, &ins[2]), scales, Groups { experts, n, k, rows })
    }
}

inventory::submit! { Registered(&GroupedGemmCase) }
