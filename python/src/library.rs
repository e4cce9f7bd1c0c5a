//! The library's single-device kernels as Python ops on torch CUDA tensors: compiled once per
//! specialization and target, launched on the caller's stream without waiting (as
//! `kernel[grid]` is, `crate::launch`). Today: the scaled FP8 GEMM, the grouped GEMM and flash
//! decoding.

use crate::errors;
use pyo3::prelude::*;
use std::sync::OnceLock;
use trident_core::backend::{Artifact, BackendError, Buffer, Device};
use trident_core::ir::DType;
use trident_core::world::KernelCache;
use trident_kernels::flash_decode::{DecodeShape, DecodeStage, FlashDecode, KvScales};
use trident_kernels::grouped_gemm::{BLayout, Epilogue, GroupedGemm, Groups, Layout, Operands, Scales};
use trident_kernels::scaled_gemm::{ScaledGemm, Scaling};

/// The artifact of `key` for `target`, built by `build` and compiled through the disk cache on
/// first use.
fn compiled(
    key: &str,
    target: &str,
    build: impl Fn() -> Result<trident_core::Function, trident_core::VerifyError>,
) -> Result<Artifact, BackendError> {
    static COMPILED: OnceLock<KernelCache> = OnceLock::new();
    let nvidia = trident_backend_nvidia::NvidiaBackend;
    COMPILED.get_or_init(Default::default).get_or_make(trident_backend_nvidia::NAME, Some(target), key, &|| {
        Ok(nvidia.compile_cached(&build()?, Some(target))?.0)
    })
}

/// The nvidia target of a device: `sm_90a` on Hopper (its own features), else its arch.
fn target_of(arch: &str) -> String {
    if arch == "sm_90" {
        "sm_90a".into()
    } else {
        arch.to_string()
    }
}

/// `c` (bf16 `[m, n]`) = (a * scale_a) @ (b * scale_b)^T with `a` `[m, k]` and `b` `[n, k]` in
/// `dtype` (`f8e4m3fn`, `f8e5m2`), the scales f32 as `scaling` (`tensor`, `row`, `block`)
/// wants them; all by address on CUDA device `device`, enqueued on `stream`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn scaled_gemm(
    py: Python<'_>,
    a: u64,
    b: u64,
    c: u64,
    scale_a: u64,
    scale_b: u64,
    mnk: (usize, usize, usize),
    dtype_name: &str,
    scaling: &str,
    fast_accum: bool,
    device: i64,
    stream: u64,
) -> PyResult<()> {
    let dtype = DType::parse(dtype_name).filter(|d| d.is_fp8()).ok_or_else(|| {
        errors::argument(format!("scaled_gemm: operands of `{dtype_name}`: f8e4m3fn or f8e5m2 are needed"))
    })?;
    let scaling = match scaling {
        "tensor" => Scaling::Tensor,
        "row" => Scaling::Row,
        "block" => Scaling::Block,
        other => return Err(errors::argument(format!("scaled_gemm: scaling `{other}`: tensor, row or block"))),
    };
    let dev = crate::launch::gpu(device)?;
    let target = target_of(dev.arch());
    let (m, n, k) = mnk;
    let buf = |name: &str, address: u64, bytes: usize| Buffer { name: name.into(), address, bytes };
    let (a, b) = (buf("a", a, m * k), buf("b", b, n * k));
    // The descriptor form (TMA and FP8 `wgmma`) on sm_90a where the operands allow it.
    // Each 128 of K added in f32 unless the caller asks for the tensor cores' accumulation.
    let op = ScaledGemm::for_problem(dtype, scaling, trident_core::target::lookup(&target).ok(), m, !fast_accum);
    let c = buf("c", c, m * n * 2);
    let op = op.specialized(&a, &b, &c, n, k);
    let (la, lb) = op.scale_lens(m, n, k);
    let plan = op
        .plan(&a, &b, &c, &buf("scale_a", scale_a, la * 4), &buf("scale_b", scale_b, lb * 4), mnk)
        .map_err(errors::backend)?;
    let Some((grid, args)) = plan else { return Ok(()) };
    let art = py.detach(|| compiled(&format!("{op:?}"), &target, || op.build())).map_err(errors::backend)?;
    dev.enqueue_on(stream, &art, grid, &args, crate::launch::launch_options()).map_err(errors::backend)
}

/// The grouped GEMM (`trident_kernels::grouped_gemm`): `c` = per expert `a_e @ b_e` with `a`
/// `contiguous` (`[rows, k]`, `groups` the int32 ends of the experts' rows) or `masked` (`[e,
/// rows, k]`, `groups` the counts), `b` `[e, n, k]` (`nk`) or `[e, k, n]` (`kn`), all of
/// `dtype` (`bf16`, `f16`, or FP8 with `c` bf16); with `scales` (addresses of f32 `[rows]` and
/// `[e, n]`) the product scaled per row and per expert and column; `epilogue`: SwiGLU of `b`'s
/// interleaved gate/up rows (`c` gets `n / 2` columns) and the address of f32 `[rows]` routing
/// weights; by address on CUDA device `device`, enqueued on `stream`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm(
    py: Python<'_>,
    pointers: (u64, u64, u64, u64),
    schedule: (u64, usize),
    scales: Option<(u64, u64)>,
    epilogue: (bool, Option<u64>),
    extents: (usize, usize, usize, usize),
    dtype_name: &str,
    layout: &str,
    b_layout: &str,
    device: i64,
    stream: u64,
) -> PyResult<()> {
    let ((a, b, c, groups), (experts, n, k, rows)) = (pointers, extents);
    let dtype = DType::parse(dtype_name)
        .filter(|d| matches!(d, DType::BF16 | DType::F16) || d.is_fp8())
        .ok_or_else(|| errors::argument(format!("grouped_gemm: operands of `{dtype_name}`: bf16, f16 or FP8")))?;
    let layout = match layout {
        "contiguous" => Layout::Contiguous,
        "masked" => Layout::Masked,
        other => return Err(errors::argument(format!("grouped_gemm: layout `{other}`: contiguous or masked"))),
    };
    let b_layout = match b_layout {
        "nk" => BLayout::NK,
        "kn" => BLayout::KN,
        other => return Err(errors::argument(format!("grouped_gemm: B layout `{other}`: nk or kn"))),
    };
    let es = dtype.size_bytes() as usize;
    let out_es = if dtype.is_fp8() { 2 } else { es };
    let a_rows = if layout == Layout::Contiguous { rows } else { experts * rows };
    let buf = |name: &str, address: u64, bytes: usize| Buffer { name: name.into(), address, bytes };
    let (a, b) = (buf("a", a, a_rows * k * es), buf("b", b, experts * n * k * es));
    let (swiglu, weights) = epilogue;
    let n_out = if swiglu { n / 2 } else { n };
    let (c, groups) = (buf("c", c, a_rows * n_out * out_es), buf("groups", groups, experts * 4));
    let weights = weights.map(|w| buf("weights", w, a_rows * 4));
    let scales = scales.map(|(sa, sb)| (buf("scale_a", sa, a_rows * 4), buf("scale_b", sb, experts * n * 4)));
    let dev = crate::launch::gpu(device)?;
    let target = target_of(dev.arch());
    // The descriptor form (TMA and `wgmma`) on sm_90a where the operands allow it.
    let op = GroupedGemm::for_target(dtype, layout, b_layout, trident_core::target::lookup(&target).ok());
    let epilogue = Epilogue { swiglu, row_weights: weights.is_some(), ..Epilogue::default() };
    let op = op
        .with_scales(if scales.is_some() { Scales::Row } else { Scales::None }, false)
        .with_epilogue(epilogue)
        .specialized(&a, &b, &c, n, k);
    let scales = scales.as_ref().map(|(x, y)| (x, y));
    let schedule = buf("schedule", schedule.0, schedule.1);
    let ops =
        Operands { scales, weights: weights.as_ref(), schedule: Some(&schedule), ..Operands::new(&a, &b, &c, &groups) };
    let p = Groups::new(experts, n, k, rows);
    // The scheduled form: the schedule kernel first, on the same stream.
    if op.scheduled {
        if let Some((grid, args)) = op.schedule_plan(ops, p).map_err(errors::backend)? {
            let art =
                py.detach(|| compiled(&op.schedule_key(), &target, || op.build_schedule())).map_err(errors::backend)?;
            dev.enqueue_on(stream, &art, grid, &args, crate::launch::launch_options()).map_err(errors::backend)?;
        }
    }
    let plan = op.plan(ops, p).map_err(errors::backend)?;
    let Some((grid, args)) = plan else { return Ok(()) };
    let art = py.detach(|| compiled(&format!("{op:?}"), &target, || op.build())).map_err(errors::backend)?;
    dev.enqueue_on(stream, &art, grid, &args, crate::launch::launch_options()).map_err(errors::backend)
}

/// The flash decoding problem of the torch op: `(batch, q_len, heads_q, heads_kv, head_dim,
/// cache_len)` and the page size of a paged cache.
fn decode_op(
    dtype_name: &str,
    extents: (usize, usize, usize, usize, usize, usize),
    page: Option<u32>,
) -> PyResult<(FlashDecode, DecodeShape)> {
    let dtype = DType::parse(dtype_name)
        .filter(|d| matches!(d, DType::BF16 | DType::F16))
        .ok_or_else(|| errors::argument(format!("flash_decode: `{dtype_name}` tensors: bf16 or f16")))?;
    let (batch, q_len, heads_q, heads_kv, head_dim, cache_len) = extents;
    let shape = DecodeShape { batch, q_len, heads_q, heads_kv, head_dim, cache_len };
    let op = FlashDecode::for_shape(dtype, &shape);
    let op = match page {
        Some(p) => op.paged(p),
        None => op,
    };
    op.check(&shape, page.is_some()).map_err(|e| errors::argument(e.to_string()))?;
    Ok((op, shape))
}

/// Bytes of scratch the flash decoding op needs for this problem (`flash_decode`'s `work`).
#[pyfunction]
pub fn flash_decode_work_bytes(
    dtype_name: &str,
    extents: (usize, usize, usize, usize, usize, usize),
    page: Option<u32>,
) -> PyResult<usize> {
    let (op, shape) = decode_op(dtype_name, extents, page)?;
    Ok(op.work_bytes(&shape))
}

/// Flash decoding (`trident_kernels::flash_decode`): `out` = attention of `q` against the
/// cache `k`, `v` (`kv_bytes` each, of `kv_name` elements: the queries' type, or an 8-bit
/// float standing for its multiples by `scales` (key, value); contiguous, or paged with the
/// block table `table` and `page` keys a page), `lens` the sequences' lengths, through the
/// scratch `work`; by address on CUDA device `device`, enqueued on `stream`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn flash_decode(
    py: Python<'_>,
    pointers: (u64, u64, u64, u64, Option<u64>, u64, u64),
    kv_bytes: usize,
    extents: (usize, usize, usize, usize, usize, usize),
    page: Option<u32>,
    dtype_name: &str,
    kv_name: &str,
    scales: (f32, f32),
    device: i64,
    stream: u64,
) -> PyResult<()> {
    let (op, shape) = decode_op(dtype_name, extents, page)?;
    let kv = DType::parse(kv_name)
        .filter(|t| *t == op.dtype || t.is_fp8())
        .ok_or_else(|| errors::argument(format!("flash_decode: a `{kv_name}` cache for {} queries", op.dtype)))?;
    let op = op.with_kv(kv);
    let scales = KvScales { k: scales.0, v: scales.1 };
    if !op.scaled_kv() && scales != KvScales::default() {
        return Err(errors::argument("flash_decode: k_scale and v_scale are for an 8-bit cache"));
    }
    let (q, k, v, lens, table, work, out) = pointers;
    let es = op.dtype.size_bytes() as usize;
    let buf = |name: &str, address: u64, bytes: usize| Buffer { name: name.into(), address, bytes };
    let tokens = shape.batch * shape.q_len * shape.heads_q * shape.head_dim * es;
    let table = match (page, table) {
        (Some(p), Some(t)) => Some(buf("block_table", t, shape.batch * shape.cache_len / p as usize * 4)),
        (None, None) => None,
        _ => return Err(errors::argument("flash_decode: a block table and a page size together, or neither")),
    };
    let kv = kv_bytes;
    let (qb, kb, vb) = (buf("q", q, tokens), buf("k_cache", k, kv), buf("v_cache", v, kv));
    let (lens, work, out) =
        (buf("lens", lens, shape.batch * 4), buf("work", work, op.work_bytes(&shape)), buf("out", out, tokens));
    let dev = crate::launch::gpu(device)?;
    let target = target_of(dev.arch());
    // The splits fill whole waves of the split stage's resident programs on this GPU.
    let split =
        py.detach(|| compiled(&op.key(DecodeStage::Split), &target, || op.build_split())).map_err(errors::backend)?;
    let wave = Device::resident_programs(dev.as_ref(), &split).map_err(errors::backend)?;
    let op = op.with_resident(wave);
    let plan = op.plan((&qb, &kb, &vb), scales, &lens, table.as_ref(), &work, &out, &shape).map_err(errors::backend)?;
    for (stage, grid, args) in plan {
        let art = py.detach(|| compiled(&op.key(stage), &target, || op.build(stage))).map_err(errors::backend)?;
        dev.enqueue_on(stream, &art, grid, &args, crate::launch::launch_options()).map_err(errors::backend)?;
    }
    Ok(())
}
