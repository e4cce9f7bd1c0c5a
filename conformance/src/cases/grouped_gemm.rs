//! The grouped GEMM of mixture-of-experts layers (`trident_kernels::grouped_gemm`): `C_e = A_e
//! B_e` with the experts' row counts on the device. Variants: A's layout (`contiguous`, rows
//! grouped by expert with cumulative ends; `masked`, `[E, t_max, K]` with counts) and B's
//! (`nk`: `[E, N, K]`; `kn`: `[E, K, N]`); `scaled`: the product times a scale per row and per
//! expert and column; a leading `e4m3`/`e5m2`: FP8 operands (scaled, C bf16, the case's type);
//! `block`: DeepSeek-V3's block scales; `quantized`: C in E4M3FN with a scale per row and 128
//! columns (compared dequantized, against the reference quantized the same way); `swiglu`: SwiGLU of B's interleaved gate/up rows
//! (B's N is then `256 * ceil(n / 128)`, C's half of it); `weights`: each row times its routing
//! weight; `promoted`: each K step's FP8 product added in f32; `wait`: A's groups are 2 chunks x the experts, each tile waiting for its chunk's
//! signal (set before the launch: the hook's plumbing; its timeout is tested with the kernel);
//! `scheduled`: the tiles from a schedule made on the device by a kernel of its own (the form
//! `for_target` picks where there are TMA and `wgmma`, here on every target).
//! Shapes `[experts, n, k, rows, routing]`: `rows` the
//! tokens in all (contiguous) or each group's capacity (masked); routing 0 spreads them at
//! random with an empty and a one-row group, 1 gives everything to one group.

use crate::host::{random, round_to};
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use rand::Rng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_kernels::grouped_gemm::{
    swiglu_gate_row, BLayout, Epilogue, GroupedGemm, Groups, Layout, Operands, Scales, SWIGLU_BLOCK,
};
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
    let has = |w: &str| v.split('-').any(|x| x == w);
    let scales = if has("block") {
        Scales::Block
    } else if dtype.is_fp8() || has("scaled") {
        Scales::Row
    } else {
        Scales::None
    };
    let epilogue =
        Epilogue { swiglu: has("swiglu"), row_weights: has("weights"), quantize: has("quantized"), ..Epilogue::default() };
    GroupedGemm {
        scales,
        epilogue,
        wait: has("wait"),
        promote: has("promoted"),
        scheduled: has("scheduled"),
        ..GroupedGemm::new(dtype, layout, b)
    }
}

/// B's N of a case: its shape's, or with SwiGLU whole gate/up pairs covering it.
fn b_n(op: &GroupedGemm, n: usize) -> usize {
    let blk = SWIGLU_BLOCK as usize;
    if op.epilogue.swiglu {
        2 * blk * n.div_ceil(blk)
    } else {
        n
    }
}

/// A's groups are `chunks x experts`.
fn chunks(op: &GroupedGemm) -> usize {
    if op.wait {
        2
    } else {
        1
    }
}

/// The value every chunk's signal holds, and the one the tiles wait for.
const READY: u64 = 7;

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
                "contiguous-nk-swiglu",
                "masked-kn-weights",
                "contiguous-nk-wait",
                "e4m3-contiguous-nk-swiglu-weights",
                "e4m3-masked-nk-block-swiglu",
                "e4m3-masked-nk-block-swiglu-quantized",
                "contiguous-nk-quantized",
                "e4m3-contiguous-nk-promoted",
                "contiguous-kn-scheduled",
                "e4m3-masked-nk-scheduled",
                "contiguous-nk-scheduled-wait",
            ],
            DType::F16 => &["contiguous-nk", "masked-kn", "masked-kn-swiglu-wait"],
            _ => &[],
        }
    }

    fn input_types(&self, case: &Case, _inputs: usize) -> Vec<DType> {
        let op = of(case);
        let mut t = vec![op.dtype, op.dtype, DType::I32];
        if op.scales != Scales::None {
            t.extend([DType::F32, DType::F32]);
        }
        if op.epilogue.row_weights {
            t.push(DType::F32);
        }
        if op.wait {
            t.push(DType::U64);
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
        let op = of(case);
        let (experts, n, k) = (s[0], b_n(&op, s[1]), s[2]);
        let groups_n = experts * chunks(&op);
        let (layout, b_layout) = (op.layout, op.b_layout);
        let mut group_shape = s.clone();
        group_shape[0] = groups_n;
        let rows = routed(layout, &group_shape, rng);
        let (a_rows, groups): (usize, Vec<f64>) = match layout {
            Layout::Contiguous => {
                let ends = rows.iter().scan(0, |t, &r| {
                    *t += r;
                    Some(*t as f64)
                });
                (rows.iter().sum(), ends.collect())
            }
            Layout::Masked => (groups_n * s[3], rows.iter().map(|&r| r as f64).collect()),
        };
        // FP8 values over their whole range, with scales near 1/400; else scales near 1.
        let spread = if op.dtype.is_fp8() { 400.0 } else { 1.0 };
        let values = |len: usize, rng: &mut rand::rngs::StdRng| {
            let v: Vec<f64> = random(len, DType::F32, rng).iter().map(|x| x * spread).collect();
            round_to(&v, op.dtype)
        };
        let (a, b) = (values(a_rows * k, rng), values(experts * n * k, rng));
        let mut positive = |len: usize, over: f64| -> Vec<f64> {
            round_to(&(0..len).map(|_| rng.gen_range(0.25..4.0) / over).collect::<Vec<_>>(), DType::F32)
        };
        let (la, lb) = op.scale_lens(a_rows, experts, n, k);
        let (sa, sb) = (positive(la, spread), positive(lb, spread));
        let weights = positive(if op.epilogue.row_weights { a_rows } else { 0 }, 4.0);
        let (blk, kb) = (SCALE_BLOCK as usize, k.div_ceil(SCALE_BLOCK as usize));
        // The scale of product term (row i, B's row j of expert e, K index kk).
        let scale_of = |i: usize, e: usize, j: usize, kk: usize| match op.scales {
            Scales::None => 1.0,
            Scales::Row => sa[i] * sb[e * n + j],
            Scales::Block => sa[i * kb + kk / blk] * sb[(e * n.div_ceil(blk) + j / blk) * kb + kk / blk],
        };
        let b_at = |e: usize, kk: usize, j: usize| match b_layout {
            BLayout::NK => b[(e * n + j) * k + kk],
            BLayout::KN => b[(e * k + kk) * n + j],
        };
        let product = |i: usize, e: usize, j: usize| -> f64 {
            (0..k).map(|kk| a[i * k + kk] * b_at(e, kk, j) * scale_of(i, e, j, kk)).sum()
        };
        // Output columns: B's rows, or with SwiGLU silu(gate) * up of each interleaved pair.
        let n_out = op.out_cols(n);
        let output = |i: usize, e: usize, j: usize| -> f64 {
            let y = if op.epilogue.swiglu {
                let gate_row = swiglu_gate_row(j);
                let (g, u) = (product(i, e, gate_row), product(i, e, gate_row + SWIGLU_BLOCK as usize));
                g / (1.0 + (-g).exp()) * u
            } else {
                product(i, e, j)
            };
            if op.epilogue.row_weights {
                y * weights[i]
            } else {
                y
            }
        };
        // Rows past a masked group's count: zeros (`run_device` clears them; the kernel
        // leaves them alone).
        let mut expected = vec![0.0; a_rows * n_out];
        let mut start = 0;
        for (g, &r) in rows.iter().enumerate() {
            let first = if layout == Layout::Contiguous { start } else { g * s[3] };
            for i in first..first + r {
                let row: Vec<f64> = (0..n_out).map(|j| output(i, g % experts, j)).collect();
                // Quantized: each row's values as the next FP8 GEMM would read them.
                let row = if op.epilogue.quantize { crate::host::fake_quantized(&row) } else { row };
                expected[i * n_out..(i + 1) * n_out].copy_from_slice(&row);
            }
            start += r;
        }
        let mut inputs = vec![a, b, groups];
        if op.scales != Scales::None {
            inputs.extend([sa, sb]);
        }
        if op.epilogue.row_weights {
            inputs.push(weights);
        }
        if op.wait {
            inputs.push(vec![READY as f64; chunks(&op)]);
        }
        WorldData::single(inputs, expected, k)
    }

    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        let s = &case.shape;
        let case_op = of(case);
        let (experts, n, k) = (s[0], b_n(&case_op, s[1]), s[2]);
        let (layout, chunks) = (case_op.layout, chunks(&case_op));
        let groups_n = experts * chunks;
        let n_out = case_op.out_cols(n);
        let mut raw = vec![0u8; groups_n * 4];
        l.device.read(&ins[2], 0, &mut raw)?;
        let groups: Vec<usize> = raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
        let es = case.dtype.size_bytes() as usize;
        let rows = match layout {
            Layout::Contiguous => groups.last().copied().unwrap_or(0),
            Layout::Masked => {
                // Clear what the kernel must not write (the rest stays poisoned).
                for (g, &count) in groups.iter().enumerate() {
                    let (from, to) = ((g * s[3] + count) * n_out * es, (g + 1) * s[3] * n_out * es);
                    l.device.write(out, from, &vec![0u8; to - from])?;
                }
                s[3]
            }
        };
        let op = GroupedGemm::for_target(case_op.dtype, layout, case_op.b_layout, l.gpu_target());
        let op = GroupedGemm { wait: case_op.wait, scheduled: op.scheduled || case_op.scheduled, ..op }
            .with_scales(case_op.scales, case_op.promote)
            .with_epilogue(case_op.epilogue);
        // The inputs after A, B and the groups, in order.
        let mut rest = ins[3..].iter();
        let scales = (op.scales != Scales::None).then(|| (rest.next(), rest.next()));
        let scales = scales.and_then(|(a, b)| a.zip(b));
        let weights = if op.epilogue.row_weights { rest.next() } else { None };
        let ready = if op.wait { rest.next().map(|r| (r, READY)) } else { None };
        let p = Groups { chunks, ..Groups::new(experts, n, k, rows) };
        if op.epilogue.quantize {
            return run_quantized(l, (op, Operands { scales, weights, ready, ..Operands::new(&ins[0], &ins[1], out, &ins[2]) }), p, (&groups, case.dtype));
        }
        let ops = Operands { scales, weights, ready, ..Operands::new(&ins[0], &ins[1], out, &ins[2]) };
        op.run(l, ops, p)
    }
}

/// A GEMM with [`Epilogue::quantize`] into poisoned E4M3FN values and scales of its own, then C
/// dequantized on the host into `ops.c` (as `dtype`). A masked group's rows past its count must
/// still be poison (else NaN goes to `c`); they become zeros there, as the reference has them.
fn run_quantized(
    l: &DeviceCtx,
    (op, ops): (GroupedGemm, Operands<'_>),
    p: Groups,
    (groups, dtype): (&[usize], DType),
) -> Result<(), BackendError> {
    let n_out = op.out_cols(p.n);
    let a_rows = match op.layout {
        Layout::Contiguous => p.rows,
        Layout::Masked => p.experts * p.chunks * p.rows,
    };
    let blocks = n_out.div_ceil(SCALE_BLOCK as usize);
    let q = l.device.alloc((a_rows * n_out).max(1), "grouped_gemm.q")?;
    let sc = l.device.alloc((a_rows * blocks * 4).max(4), "grouped_gemm.q_scales")?;
    l.device.fill(&q, &[0xFF])?;
    l.device.fill(&sc, &[0xFF])?;
    op.run(l, Operands { c: &q, c_scales: Some(&sc), ..ops }, p)?;
    let mut raw_q = vec![0u8; a_rows * n_out];
    let mut raw_s = vec![0u8; a_rows * blocks * 4];
    l.device.read(&q, 0, &mut raw_q)?;
    l.device.read(&sc, 0, &mut raw_s)?;
    l.device.free(&q)?;
    l.device.free(&sc)?;
    let (values, scales) = (crate::host::decode(&raw_q, DType::F8E4M3FN), crate::host::decode(&raw_s, DType::F32));
    let written = |i: usize| match op.layout {
        Layout::Contiguous => true,
        Layout::Masked => i % p.rows < groups[i / p.rows],
    };
    let out: Vec<f64> = (0..a_rows * n_out)
        .map(|at| {
            let (i, j) = (at / n_out, at % n_out);
            match written(i) {
                true => values[at] * scales[i * blocks + j / SCALE_BLOCK as usize],
                false if raw_q[at] == 0xFF => 0.0,
                false => f64::NAN,
            }
        })
        .collect();
    l.device.write(ops.c, 0, &crate::host::encode(&out, dtype))
}

inventory::submit! { Registered(&GroupedGemmCase) }
