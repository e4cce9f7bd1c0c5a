//! The grouped GEMM against float64 on fresh random inputs, output poisoned first, on routings
//! with empty experts, one-row experts and one expert taking every row, K not a multiple of the
//! K tile and N not a multiple of the N tile, in both layouts of A and both of B; on the
//! interpreter and on the SIMT lowering for sm_90a, sm_80 and gfx942. Rows past a masked
//! expert's count must stay as they were.

mod ptxas;

use rand::{Rng, SeedableRng};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_backend_cpu::CpuBackend;
use trident_core::backend::{Backend, Device, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::grouped_gemm::{BLayout, Epilogue, GroupedGemm, Groups, Layout, Operands, Scales};
use trident_kernels::DeviceCtx;

/// `v` in `d` (bf16 or f16), rounded to nearest even, little-endian.
fn encode(v: &[f64], d: DType) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match d {
            DType::BF16 => half::bf16::from_f64(x).to_le_bytes(),
            _ => half::f16::from_f64(x).to_le_bytes(),
        })
        .collect()
}

fn decode(raw: &[u8], d: DType) -> Vec<f64> {
    raw.chunks_exact(2)
        .map(|c| match d {
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            _ => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
        })
        .collect()
}

/// `n` values in [-1, 1) that `d` holds exactly.
fn random(n: usize, d: DType, rng: &mut rand::rngs::StdRng) -> Vec<f64> {
    let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    decode(&encode(&v, d), d)
}

fn upload(dev: &dyn Device, name: &str, bytes: &[u8]) -> trident_core::backend::Buffer {
    let b = dev.alloc(bytes.len().max(4), name).unwrap();
    dev.write(&b, 0, bytes).unwrap();
    b
}

/// Row counts of `experts` experts: `pattern` 0 spreads `total` at random with empty and
/// one-row experts among them, 1 gives every row to one expert.
fn counts(experts: usize, total: usize, pattern: u32, rng: &mut rand::rngs::StdRng) -> Vec<usize> {
    let mut c = vec![0; experts];
    if pattern == 1 {
        c[experts / 2] = total;
        return c;
    }
    c[1 % experts] = 1;
    for _ in 0..total.saturating_sub(1) {
        // Expert 0 stays empty (when there are more than two).
        let e = rng.gen_range(if experts > 2 { 2 } else { 0 }..experts);
        c[e] += 1;
    }
    c
}

/// Launches on cpu-simt's `dev` lowered for sm_90a.
fn sm90a_ctx(dev: &dyn Device) -> DeviceCtx<'_> {
    let mut l = DeviceCtx::new(&SimtBackend, dev, LaunchOptions::default());
    l.target = Some("sm_90a".into());
    l
}

/// The SIMT program of `op`'s descriptor form (specialized for aligned operands) on sm_90a.
fn lowered_sm90a(op: GroupedGemm) -> String {
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    trident_core::simt::lower(&GroupedGemm { divisible: true, ..op }.build().unwrap(), sm90a).unwrap().to_string()
}

#[allow(clippy::too_many_arguments)]
fn check(
    op: &GroupedGemm,
    l: &DeviceCtx,
    experts: usize,
    n: usize,
    k: usize,
    rows: &[usize],
    rng: &mut rand::rngs::StdRng,
) {
    let d = op.dtype;
    let dev = l.device;
    let t_max = rows.iter().copied().max().unwrap_or(0).max(1) + 3;
    let total: usize = rows.iter().sum();
    let a_rows = match op.layout {
        Layout::Contiguous => total,
        Layout::Masked => experts * t_max,
    };
    let a = random(a_rows * k, d, rng);
    let bv = random(experts * n * k, d, rng);
    let groups: Vec<i32> = match op.layout {
        Layout::Contiguous => rows
            .iter()
            .scan(0, |s, &r| {
                *s += r as i32;
                Some(*s)
            })
            .collect(),
        Layout::Masked => rows.iter().map(|&r| r as i32).collect(),
    };
    let (ab, bb) = (upload(dev, "a", &encode(&a, d)), upload(dev, "b", &encode(&bv, d)));
    let gb = upload(dev, "groups", &groups.iter().flat_map(|g| g.to_le_bytes()).collect::<Vec<u8>>());
    let es = d.size_bytes() as usize;
    // NaN in both types.
    let poisoned: Vec<u8> = [0xFFu8].iter().copied().cycle().take(a_rows * n * es).collect();
    let c = upload(dev, "c", &poisoned);
    let p = Groups::new(experts, n, k, if op.layout == Layout::Contiguous { total } else { t_max });
    op.run(l, Operands::new(&ab, &bb, &c, &gb), p).unwrap();
    let mut raw = vec![0u8; a_rows * n * es];
    dev.read(&c, 0, &mut raw).unwrap();
    let got = decode(&raw, d);
    let b_at = |e: usize, kk: usize, j: usize| match op.b_layout {
        BLayout::NK => bv[(e * n + j) * k + kk],
        BLayout::KN => bv[(e * k + kk) * n + j],
    };
    let mut start = 0;
    for (e, &r) in rows.iter().enumerate() {
        let first = if op.layout == Layout::Contiguous { start } else { e * t_max };
        for i in first..first + r {
            for j in 0..n {
                let terms: Vec<f64> = (0..k).map(|kk| a[i * k + kk] * b_at(e, kk, j)).collect();
                let want: f64 = terms.iter().sum();
                let mag: f64 = terms.iter().map(|t| t.abs()).sum();
                let g = got[i * n + j];
                let tol = want.abs() * 2f64.powi(-7) + mag * k as f64 * f32::EPSILON as f64;
                assert!(
                    (g - want).abs() <= tol,
                    "{op:?} on {:?}: expert {e} row {i} col {j}: got {g}, want {want} (rows {rows:?})",
                    l.target
                );
            }
        }
        if op.layout == Layout::Masked {
            let past = &raw[(first + r) * n * es..(e + 1) * t_max * n * es];
            assert!(past == &poisoned[..past.len()], "{op:?}: expert {e} wrote rows past its count {r}");
        }
        start += r;
    }
}

#[test]
fn grouped_gemms_match_float64() {
    trident_backend_cpu::link();
    let simt = SimtBackend;
    let runs: [(&dyn Backend, Option<&str>); 4] =
        [(&CpuBackend, None), (&simt, Some("sm_90a")), (&simt, Some("sm_80")), (&simt, Some("gfx942"))];
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    for (backend, target) in runs {
        let dev = backend.open_device(0).unwrap();
        let mut l = DeviceCtx::new(backend, dev.as_ref(), LaunchOptions::default());
        l.target = target.map(str::to_string);
        for (layout, b_layout, dtype) in [
            (Layout::Contiguous, BLayout::NK, DType::BF16),
            (Layout::Contiguous, BLayout::KN, DType::F16),
            (Layout::Masked, BLayout::NK, DType::BF16),
            (Layout::Masked, BLayout::KN, DType::BF16),
        ] {
            let op = GroupedGemm::new(dtype, layout, b_layout);
            // Each program walking the groups, and the tiles from a schedule made on the device.
            for op in [op, GroupedGemm { scheduled: true, ..op }] {
                for (experts, n, k, total, pattern) in [(5, 72, 40, 150, 0), (3, 64, 64, 130, 1), (1, 8, 16, 1, 0)] {
                    let rows = counts(experts, total, pattern, &mut rng);
                    check(&op, &l, experts, n, k, &rows, &mut rng);
                }
            }
        }
    }
}

/// The chunk walk in column bands (`band_tiles`): every group over one band of column tiles
/// before the next band, the last band narrower; the same products as without bands.
#[test]
fn the_chunk_walk_runs_in_column_bands() {
    trident_backend_cpu::link();
    let simt = SimtBackend;
    let runs: [(&dyn Backend, Option<&str>); 2] = [(&CpuBackend, None), (&simt, Some("sm_90a"))];
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    for (backend, target) in runs {
        let dev = backend.open_device(0).unwrap();
        let mut l = DeviceCtx::new(backend, dev.as_ref(), LaunchOptions::default());
        l.target = target.map(str::to_string);
        let base = GroupedGemm { chunk_ends: true, ..GroupedGemm::new(DType::BF16, Layout::Contiguous, BLayout::NK) };
        for band_tiles in [1, 3] {
            let op = GroupedGemm { band_tiles, ..base };
            // 200 columns: four tiles of 64, bands of 1 or of 3 and 1.
            for (experts, n, k, total, pattern) in [(5, 200, 40, 150, 0), (3, 64, 24, 70, 1)] {
                let rows = counts(experts, total, pattern, &mut rng);
                check(&op, &l, experts, n, k, &rows, &mut rng);
            }
        }
    }
}

/// The descriptor form on sm_90a (cpu-simt): TMA boxes over every expert's rows and `wgmma`
/// (B `[E, N, K]` transposed into the `dot`, so K-major), checked to be what the lowering
/// made, then against float64 on the same routings; K not a multiple of 8 keeps the portable
/// form.
#[test]
fn the_descriptor_form_runs_tma_and_wgmma() {
    trident_backend_cpu::link();
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let dev = SimtBackend.open_device(0).unwrap();
    let l = sm90a_ctx(dev.as_ref());
    for (layout, b_layout) in
        [(Layout::Contiguous, BLayout::NK), (Layout::Masked, BLayout::NK), (Layout::Contiguous, BLayout::KN)]
    {
        let op = GroupedGemm::for_target(DType::BF16, layout, b_layout, Some(sm90a));
        let text = lowered_sm90a(op);
        assert!(text.contains("tma.load") && text.contains("wgmma.m64n256k16.bf16"), "{layout:?} {b_layout:?}");
        assert_eq!(text.contains(".trans_b"), b_layout == BLayout::KN, "{layout:?} {b_layout:?}");
        for (experts, n, k, total, pattern) in [(5, 136, 72, 300, 0), (3, 64, 200, 130, 1)] {
            let rows = counts(experts, total, pattern, &mut rng);
            check(&op, &l, experts, n, k, &rows, &mut rng);
        }
    }
    let op = GroupedGemm::for_target(DType::BF16, Layout::Contiguous, BLayout::NK, Some(sm90a));
    check(&op, &l, 3, 16, 12, &counts(3, 20, 0, &mut rng), &mut rng);
    // FP8 with scales (values checked by the conformance cases): FP8 `wgmma`, no conversion.
    let fp8 = GroupedGemm::for_target(DType::F8E4M3FN, Layout::Masked, BLayout::NK, Some(sm90a));
    let text = lowered_sm90a(fp8);
    assert!(fp8.scales == Scales::Row && text.contains("k32.f8e4m3fn a") && !text.contains("fp8.convert"));
    // Block scales: a promotion per K block on `wgmma` (no producer warp then).
    let block = GroupedGemm { scales: Scales::Block, ..fp8 };
    let text = lowered_sm90a(block);
    assert!(text.contains("k32.f8e4m3fn a") && text.contains("tma.load") && !text.contains("fp8.convert"));
    // Row scales with each K step added in f32: a promotion without scales, on `wgmma` too.
    let promoted = GroupedGemm { promote: true, divisible: true, ..fp8 };
    let text = lowered_sm90a(promoted);
    assert!(text.contains("k32.f8e4m3fn a") && text.contains("tma.load") && !text.contains("fp8.convert"));
}

#[test]
fn the_benchmarks_tiles_match_float64() {
    trident_backend_cpu::link();
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let dev = SimtBackend.open_device(0).unwrap();
    let l = sm90a_ctx(dev.as_ref());
    let op = GroupedGemm::for_target(DType::BF16, Layout::Contiguous, BLayout::NK, Some(sm90a));
    assert_eq!((op.block_m, op.block_n, op.stages), (128, 256, 4));
    let narrow = GroupedGemm { block_n: 128, ..op };
    // The last: 128 rows on one warpgroup (two `wgmma` bands per warp).
    let bands = GroupedGemm { block_n: 128, warps: 4, block_k: 64, stages: 3, ..op };
    for v in [op, narrow, GroupedGemm { stages: 3, ..op }, GroupedGemm { block_m: 64, warps: 4, ..op }, bands] {
        check(&v, &l, 3, 264, 136, &counts(3, 150, 1, &mut rng), &mut rng);
    }
    assert!(lowered_sm90a(bands).matches("wgmma.m64n128k16").count() >= 8);
    let fp8 = GroupedGemm::for_target(DType::F8E4M3FN, Layout::Contiguous, BLayout::NK, Some(sm90a));
    assert_eq!((fp8.block_n, fp8.block_k, fp8.stages), (128, 128, 4));
    let wide = GroupedGemm { block_n: 256, stages: 3, ..fp8 };
    assert_eq!(wide.with_scales(Scales::Block, false).block_n, 128);
    assert_eq!(wide.with_scales(Scales::Row, true).block_n, 128);
    assert!(!wide.with_scales(Scales::Row, true).scheduled && wide.with_scales(Scales::Row, false).scheduled);
    let swiglu = fp8.with_epilogue(Epilogue { swiglu: true, ..Epilogue::default() });
    assert_eq!((swiglu.block_m, swiglu.block_n, swiglu.scheduled), (128, 256, false));
    assert_eq!(swiglu.with_scales(Scales::Block, false).block_m, 64);
    for v in [fp8, wide, GroupedGemm { block_k: 64, ..fp8 }] {
        let text = lowered_sm90a(v);
        assert!(text.contains("k32.f8e4m3fn a") && text.contains("tma.load"), "{v:?}");
    }
}

/// The scheduled descriptor form on sm_90a: the GEMM's tiles from the schedule kernel, walked
/// by a persistent loop that the lowering flattens with a producer warp (the next tile's copies
/// during this tile's epilogue); against float64 on cpu-simt with empty experts, one expert
/// taking every row, and more groups than one step of the schedule (128), in both layouts.
#[test]
fn the_scheduled_form_runs_with_a_producer_warp() {
    trident_backend_cpu::link();
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let dev = SimtBackend.open_device(0).unwrap();
    let l = sm90a_ctx(dev.as_ref());
    for layout in [Layout::Contiguous, Layout::Masked] {
        // bf16 walks the groups itself by default; FP8 takes the schedule.
        let op = GroupedGemm::for_target(DType::BF16, layout, BLayout::NK, Some(sm90a));
        assert!(!op.scheduled && GroupedGemm::for_target(DType::F8E4M3FN, layout, BLayout::NK, Some(sm90a)).scheduled);
        let op = GroupedGemm { scheduled: true, ..op };
        let text = lowered_sm90a(op);
        assert!(text.contains("specialized producer") && text.contains("wgmma.m64n256k16.bf16"), "{layout:?}");
        let small = GroupedGemm { block_m: 64, block_n: 64, warps: 4, stages: 3, ..op };
        for (experts, n, k, total, pattern) in [(5, 136, 72, 300, 0), (3, 64, 200, 130, 1), (4, 64, 64, 90, 2)] {
            let rows = counts(experts, total, pattern, &mut rng);
            check(&small, &l, experts, n, k, &rows, &mut rng);
        }
        check(&small, &l, 200, 16, 32, &counts(200, 150, 0, &mut rng), &mut rng);
        // Consumer ping-pong: two groups of 4 consumer warps take the 128 x 128 tiles in turn.
        let pingpong = GroupedGemm { block_m: 128, block_n: 128, warps: 4, stages: 4, pingpong: true, ..op };
        assert!(lowered_sm90a(pingpong).contains("two groups taking turns"));
        check(&pingpong, &l, 4, 264, 136, &counts(4, 700, 1, &mut rng), &mut rng);
        // No rows at all: the producer's look-ahead reads clamped records of an empty schedule.
        check(&small, &l, 3, 64, 64, &[0, 0, 0], &mut rng);
    }
}

/// The lowering reads a tile's records ahead only from parameters the kernel never writes: the
/// scheduled GEMM with one store into its schedule added is not flattened with a producer
/// warp (it keeps the per-tile loop), while the same text without the store is.
#[test]
fn records_are_read_ahead_only_from_read_only_parameters() {
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let op = GroupedGemm {
        divisible: true,
        scheduled: true,
        ..GroupedGemm::for_target(DType::BF16, Layout::Contiguous, BLayout::NK, Some(sm90a))
    };
    let text = trident_core::text::print(&op.build().unwrap());
    let lowered = |text: &str| {
        let f = trident_core::text::parse(text).unwrap();
        trident_core::verify(&f).unwrap();
        trident_core::simt::lower(&f, sm90a).unwrap().to_string()
    };
    assert!(lowered(&text).contains("specialized producer"));
    let written = text.replacen("\n  return\n}", "\n  store %schedule, %experts\n  return\n}", 1);
    assert_ne!(written, text);
    assert!(!lowered(&written).contains("specialized producer"));
}

/// The schedule kernel on the interpreter and on cpu-simt (sm_90a): each group's first row
/// tile, the tiles in all, and each row tile's group, with empty groups first, between and
/// last, in both layouts.
#[test]
fn the_schedule_lists_each_row_tiles_group() {
    trident_backend_cpu::link();
    let dev = SimtBackend.open_device(0).unwrap();
    let l = sm90a_ctx(dev.as_ref());
    let groups_bytes = |v: &[i32]| v.iter().flat_map(|g| g.to_le_bytes()).collect::<Vec<u8>>();
    let cpu_dev = CpuBackend.open_device(0).unwrap();
    let cpu = DeviceCtx::new(&CpuBackend, cpu_dev.as_ref(), LaunchOptions::default());
    for (l, dev, (layout, groups, t_max)) in
        [&cpu, &l].into_iter().zip([cpu_dev.as_ref(), dev.as_ref()]).flat_map(|(l, d)| {
            [
                (Layout::Masked, vec![3, 0, 64, 65, 0, 200], 200),
                (Layout::Contiguous, vec![0, 130, 130, 131, 400, 400], 400),
            ]
            .into_iter()
            .map(move |c| (l, d, c))
        })
    {
        let op = GroupedGemm { scheduled: true, ..GroupedGemm::new(DType::BF16, layout, BLayout::NK) };
        let gb = upload(dev, "groups", &groups_bytes(&groups));
        let p = Groups::new(groups.len(), 64, 64, t_max);
        let scratch = upload(dev, "schedule", &vec![0xAB; op.schedule_bytes(p)]);
        let (a, c) = (upload(dev, "a", &[0; 16]), upload(dev, "c", &[0; 16]));
        let ops = Operands { schedule: Some(&scratch), ..Operands::new(&a, &a, &c, &gb) };
        let (grid, args) = op.schedule_plan(ops, p).unwrap().unwrap();
        let kernel = l.compile(format!("schedule {layout:?}"), || op.build_schedule()).unwrap();
        l.launch(&kernel, grid, &args).unwrap();
        let mut raw = vec![0u8; op.schedule_bytes(p)];
        dev.read(&scratch, 0, &mut raw).unwrap();
        let words: Vec<i32> = raw.chunks(4).map(|w| i32::from_le_bytes(w.try_into().unwrap())).collect();
        let bm = op.block_m as i32;
        let mut want_group = Vec::new();
        for (g, &count) in groups.iter().enumerate() {
            let rows = match layout {
                Layout::Contiguous => count - if g == 0 { 0 } else { groups[g - 1] },
                Layout::Masked => count,
            };
            assert_eq!(words[g], want_group.len() as i32, "{layout:?}: group {g}'s first tile");
            want_group.extend(std::iter::repeat_n(g as i32, ((rows + bm - 1) / bm) as usize));
        }
        assert_eq!(words[groups.len()], want_group.len() as i32, "{layout:?}: tiles in all");
        let table = &words[groups.len() + 1..groups.len() + 1 + want_group.len()];
        assert_eq!(table, &want_group[..], "{layout:?}: each tile's group");
    }
}

#[test]
fn a_grouped_gemm_refuses_bad_problems() {
    trident_backend_cpu::link();
    let dev = CpuBackend.open_device(0).unwrap();
    let l = DeviceCtx::new(&CpuBackend, dev.as_ref(), LaunchOptions::default());
    let buf = dev.alloc(64, "small").unwrap();
    let p = Groups::new(2, 8, 8, 8);
    let op = GroupedGemm::new(DType::F32, Layout::Contiguous, BLayout::NK);
    let e = op.run(&l, Operands::new(&buf, &buf, &buf, &buf), p).unwrap_err();
    assert!(e.to_string().contains("bf16, f16 or an FP8 type"), "{e}");
    let op = GroupedGemm::new(DType::BF16, Layout::Masked, BLayout::NK);
    let e = op.run(&l, Operands::new(&buf, &buf, &buf, &buf), p).unwrap_err();
    assert!(e.to_string().contains("has 64 bytes"), "{e}");
    let op = GroupedGemm::new(DType::F8E4M3FN, Layout::Contiguous, BLayout::NK);
    let e = op.run(&l, Operands::new(&buf, &buf, &buf, &buf), p).unwrap_err();
    assert!(e.to_string().contains("scale_a and scale_b are needed"), "{e}");
}

/// The wait hook: tiles of a chunk whose signal is set run; a chunk whose signal never comes
/// ends the launch with a diagnostic naming the kernel and the signal, on the interpreter and
/// on the SIMT lowering; the descriptor form makes A's descriptor after the wait.
#[test]
fn a_tile_waits_for_its_chunk() {
    trident_backend_cpu::link();
    let simt = SimtBackend;
    let runs: [(&dyn Backend, Option<&str>); 2] = [(&CpuBackend, None), (&simt, Some("sm_90a"))];
    for (backend, target) in runs {
        let dev = backend.open_device(0).unwrap();
        let mut l = DeviceCtx::new(backend, dev.as_ref(), LaunchOptions::default());
        l.opts.wait_bound = std::time::Duration::from_millis(200);
        l.target = target.map(str::to_string);
        let op = GroupedGemm { wait: true, ..GroupedGemm::new(DType::BF16, Layout::Contiguous, BLayout::NK) };
        let (experts, n, k) = (2, 16, 16);
        let zeros = |name: &str, bytes: usize| upload(dev.as_ref(), name, &vec![0u8; bytes]);
        let (a, b, c) = (zeros("a", 8 * k * 2), zeros("b", experts * n * k * 2), zeros("c", 8 * n * 2));
        // Chunk 0: experts 0 and 1 have rows 0..2 and 2..4; chunk 1: 4..6 and 6..8.
        let groups =
            upload(dev.as_ref(), "groups", &[2i32, 4, 6, 8].iter().flat_map(|g| g.to_le_bytes()).collect::<Vec<u8>>());
        let ready = upload(dev.as_ref(), "ready", &[5u64, 0].iter().flat_map(|g| g.to_le_bytes()).collect::<Vec<u8>>());
        let p = Groups { chunks: 2, ..Groups::new(experts, n, k, 8) };
        let ops = Operands { ready: Some((&ready, 5)), ..Operands::new(&a, &b, &c, &groups) };
        let e = op.run(&l, ops, p).unwrap_err().to_string();
        assert!(e.contains("grouped_gemm_bf16") && e.contains("wait") && e.contains("ge 5"), "{target:?}: {e}");
        // Both chunks ready: it runs.
        dev.write(&ready, 0, &[5u64, 6].iter().flat_map(|g| g.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        op.run(&l, ops, p).unwrap();
    }
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let op = GroupedGemm {
        wait: true,
        divisible: true,
        ..GroupedGemm::for_target(DType::BF16, Layout::Masked, BLayout::NK, Some(sm90a))
    };
    let text = trident_core::simt::lower(&op.build().unwrap(), sm90a).unwrap().to_string();
    assert!(text.contains("tma.load") && text.contains("wgmma"), "the waiting descriptor form");
}

/// The SwiGLU epilogue's descriptor form: a tile of B is one gate/up pair (256 rows) on TMA and
/// `wgmma`: bf16 with N = 256 on each warpgroup; block-scaled FP8 (two f32 accumulators) on a
/// 64-row tile split along N, each of two warpgroups N = 128 (values: the conformance cases).
#[test]
fn swiglu_runs_on_tma_and_wgmma() {
    use trident_kernels::grouped_gemm::Epilogue;
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let epilogue = Epilogue { swiglu: true, row_weights: true, ..Epilogue::default() };
    for (dtype, scales, n) in [(DType::BF16, Scales::None, 256), (DType::F8E4M3FN, Scales::Block, 128)] {
        let op = GroupedGemm { scales, ..GroupedGemm::for_target(dtype, Layout::Contiguous, BLayout::NK, Some(sm90a)) }
            .with_epilogue(epilogue);
        let text = lowered_sm90a(op);
        assert!(text.contains("tma.load") && text.contains(&format!("wgmma.m64n{n}k")), "{dtype} {scales:?}");
    }
}

/// The portable form specialized for aligned operands (`divisible`: rows of whole 16-byte
/// chunks) copies its operands by `cp.async` on sm_80: B `[E, K, N]` through the whole-loop
/// pipeline (`pipeline.rs`), B `[E, N, K]` (read K-major) through the loop's staged loads
/// (`staged.rs`, since session 55; before, K-major B went through registers).
#[test]
fn the_divisible_portable_form_is_pipelined() {
    let sm80 = trident_core::target::lookup("sm_80").unwrap();
    let lowered = |b_layout| {
        let op = GroupedGemm { divisible: true, ..GroupedGemm::new(DType::BF16, Layout::Contiguous, b_layout) };
        trident_core::simt::lower(&op.build().unwrap(), sm80).unwrap().to_string()
    };
    let (kn, nk) = (lowered(BLayout::KN), lowered(BLayout::NK));
    assert!(kn.contains("async.copy") && kn.contains("pipeline.stages"), "the whole-loop pipeline");
    assert!(nk.contains("async.copy") && nk.contains("staged.ring"), "the staged K-major B");
}

/// Both operands through tensor maps encoded on the host (TMA) in every descriptor form the MoE
/// blocks launch on sm_90a, the waiting chunk walk of the tensor-parallel block included: at
/// 8e0c404 that walk made A's descriptor from a pointer computed in the kernel, the lowering
/// could not encode it and read A with the threads (10x slower on an H100, every result right).
#[test]
fn every_moe_form_reads_both_operands_through_host_encoded_tensor_maps() {
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let base = |layout| GroupedGemm {
        divisible: true,
        ..GroupedGemm::for_target(DType::BF16, layout, BLayout::NK, Some(sm90a))
    };
    let swiglu = Epilogue { swiglu: true, ..Epilogue::default() };
    let chunked = GroupedGemm { chunk_ends: true, scheduled: false, ..base(Layout::Contiguous) };
    let forms = [
        ("plain gate/up", base(Layout::Contiguous).with_epilogue(swiglu)),
        ("masked gate/up", base(Layout::Masked).with_epilogue(swiglu)),
        ("waiting masked", GroupedGemm { wait: true, ..base(Layout::Masked) }),
        ("AG + grouped GEMM (chunk walk, waits)", GroupedGemm { wait: true, ..chunked }.with_epilogue(swiglu)),
        (
            "grouped GEMM + reduce-scatter",
            chunked.with_epilogue(Epilogue { row_weights: true, reduce_scatter: true, ..Epilogue::default() }),
        ),
        (
            "grouped GEMM + rows to their owner",
            chunked.with_epilogue(Epilogue { row_weights: true, notify_owner: true, ..Epilogue::default() }),
        ),
    ];
    for (what, op) in forms {
        let k = trident_core::simt::lower(&op.build().unwrap(), sm90a).unwrap();
        let maps: Vec<_> = k.tensor_maps.iter().map(|m| m.ptr).collect();
        assert!(maps.contains(&0) && maps.contains(&1), "{what}: tensor maps of parameters {maps:?}");
    }
}

/// The tensor-parallel block's down GEMM in the rows form (`notify_owner`) stores each chunk's
/// rows into its owner's memory by bulk row copies, as the plain GEMM stores C: the peer's
/// pointer (`symm_at`) keeps C's 16-byte alignment (`world::SYMMETRIC_ALIGN`); without that
/// fact the store would be the masked element-wise one. Then it announces each tile.
#[test]
fn rows_to_their_owner_go_out_by_bulk_row_copies() {
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let base = GroupedGemm::for_target(DType::BF16, Layout::Contiguous, BLayout::NK, Some(sm90a));
    let chunked = GroupedGemm { chunk_ends: true, scheduled: false, ..base };
    let op = chunked.with_epilogue(Epilogue { row_weights: true, notify_owner: true, ..Epilogue::default() });
    let f = GroupedGemm { divisible: true, ..op }.build().unwrap();
    assert!(f.name.ends_with("_notify_chunk_ends_desc_rows"), "{}", f.name);
    let text = lowered_sm90a(op);
    assert!(text.contains("bulk.store") && !text.contains("tma.store"), "C by bulk row copies");
    assert!(!text.contains("atom.add.f32") && !text.contains("red.add.f32"), "no atomics on the data");
}

/// C goes out by bulk row copies on sm_90a (`bulk.store`: a group's last tile writes only the
/// group's rows, asynchronously), in the plain walk, the scheduled form and ping-pong, and
/// matches float64 (rows past a masked expert's count untouched) as the masked stores it
/// replaces do; an output whose rows are not whole 16-byte chunks keeps the masked stores.
#[test]
fn c_goes_out_by_bulk_row_copies() {
    trident_backend_cpu::link();
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let dev = SimtBackend.open_device(0).unwrap();
    let l = sm90a_ctx(dev.as_ref());
    for layout in [Layout::Contiguous, Layout::Masked] {
        let op = GroupedGemm::for_target(DType::BF16, layout, BLayout::NK, Some(sm90a));
        assert!(op.bulk_store);
        let scheduled = GroupedGemm { scheduled: true, ..op };
        let pingpong = GroupedGemm { block_n: 128, warps: 4, stages: 4, pingpong: true, ..scheduled };
        let masked = GroupedGemm { bulk_store: false, ..op };
        for v in [op, GroupedGemm { stages: 3, ..op }, scheduled, pingpong] {
            let text = lowered_sm90a(v);
            assert!(text.contains("bulk.store") && !text.contains("tma.store"), "{v:?}");
            check(&v, &l, 4, 264, 136, &counts(4, 300, 1, &mut rng), &mut rng);
        }
        assert!(!lowered_sm90a(masked).contains("bulk.store"));
        check(&masked, &l, 4, 264, 136, &counts(4, 300, 1, &mut rng), &mut rng);
        // FP8 operands store bf16 C the same way.
        let fp8 = GroupedGemm::for_target(DType::F8E4M3FN, layout, BLayout::NK, Some(sm90a));
        assert!(lowered_sm90a(fp8).contains("bulk.store"));
    }
    // N = 12: rows of 24 bytes. `specialized` keeps the masked stores.
    let op = GroupedGemm::for_target(DType::BF16, Layout::Contiguous, BLayout::NK, Some(sm90a));
    let buf = |bytes: usize| dev.alloc(bytes, "x").unwrap();
    let (a, b, c) = (buf(64), buf(64), buf(64));
    assert!(!op.specialized(&a, &b, &c, 12, 16).bulk_store && op.specialized(&a, &b, &c, 16, 16).bulk_store);
    check(&op, &l, 3, 12, 16, &counts(3, 40, 0, &mut rng), &mut rng);
}

/// The benchmark's bf16 and FP8 forms with bulk row stores assemble for sm_90a without spills
/// (with `PTXAS` set, as CI sets it; skipped with a message otherwise).
#[test]
fn the_bulk_stored_forms_assemble_without_spills() {
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let bf16 = GroupedGemm::for_target(DType::BF16, Layout::Contiguous, BLayout::NK, Some(sm90a));
    let fp8 = GroupedGemm::for_target(DType::F8E4M3FN, Layout::Contiguous, BLayout::NK, Some(sm90a));
    let forms = [
        bf16,
        GroupedGemm { stages: 3, ..bf16 },
        GroupedGemm { scheduled: true, ..bf16 },
        GroupedGemm { layout: Layout::Masked, ..bf16 },
        fp8,
        GroupedGemm { block_n: 256, stages: 3, ..fp8 },
    ];
    for v in forms {
        let f = GroupedGemm { divisible: true, ..v }.build().unwrap();
        let m = trident_backend_nvidia::NvidiaBackend::ptx(&f, sm90a).unwrap();
        assert!(m.ptx.contains("cp.async.bulk.global.shared::cta.bulk_group"), "{v:?}");
        ptxas::assemble_clean("the_bulk_stored_forms_assemble_without_spills", &format!("{v:?}"), &m.ptx);
    }
}
