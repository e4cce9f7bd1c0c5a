//! The report of the distributed benchmark: per case, every variant's time, the vendor pipeline
//! of the same run (NCCL and cuBLAS through PyTorch, `bench/baseline_dist.py`), and the bound
//! max(compute, communication) beside them. A fused variant with a pipeline of its own in the
//! baseline file (the key `"<variant> <case line>"`, e.g. the tensor-parallel MoE block's
//! all-gather + grouped GEMMs + reduce-scatter) is compared with that one; the others with the
//! case's. A variant the benchmark compares with another of the same run
//! (`Benchmark::compared_with`) gets a line with their ratio.

use serde_json::{json, Map, Value};
use trident_conformance::dist_bench::DistCase;

/// Unidirectional NVLink bandwidth of one H200 (18 links of NVLink 4: 900 GB/s both ways), the
/// floor of a link-bound collective.
pub const NVLINK_BYTES_PER_S: f64 = 450e9;

/// What a case measured: its variants' times (ms, slowest rank, median) and the worst error.
pub type Measured = Result<(Vec<(String, f64)>, f64), String>;

/// Whether `variant` is the whole operation (the others are its parts or a pipeline of them).
fn is_fused(case: &DistCase, variant: &str) -> bool {
    case.benchmark().map_or(true, |b| b.is_fused(variant))
}

/// One record per case and the printed table.
pub fn report(rows: &[(DistCase, Measured)], baseline: &Map<String, Value>, device: &str) -> (Vec<Value>, String) {
    let base = |key: String| baseline.get(&key).and_then(Value::as_f64);
    let show = |x: Option<f64>| x.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into());
    let mut text = format!(
        "device: {device}\n{:<34} {:<18} {:>9} {:>9} {:>8} {:>9} {:>8} {:>8}\n",
        "case", "variant", "ms", "base ms", "vs base", "bound ms", "of bound", "error"
    );
    let mut records = Vec::new();
    for (case, result) in rows {
        let key = case.key();
        let (variants, error) = match result {
            Ok(m) => m.clone(),
            Err(e) => {
                text += &format!("{key:<34} FAILED: {e}\n");
                records.push(json!({ "case": key, "error": e }));
                continue;
            }
        };
        let time_of = |name: &str| variants.iter().find(|(v, _)| v == name).map(|(_, ms)| *ms);
        let vendor = base(key.clone());
        let (cublas, nccl) = (base(format!("cublas {key}")), base(format!("nccl {key}")));
        // max(compute, communication): each part at its faster implementation measured in
        // this run; a collective's communication is its link floor.
        let floor = case.bus_bytes() / NVLINK_BYTES_PER_S * 1e3;
        let (compute, comm) = match case.benchmark() {
            Ok(b) => b.parts(&time_of, cublas, nccl, floor),
            Err(_) => (None, None),
        };
        let bound = match (compute, comm) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
        // A fused variant's own vendor pipeline where the baseline has one, else the case's.
        let vendor_of = |v: &str| base(format!("{v} {key}")).or(vendor);
        let best = variants.iter().filter(|(v, _)| is_fused(case, v)).map(|(_, ms)| *ms).fold(f64::INFINITY, f64::min);
        for (i, (v, ms)) in variants.iter().enumerate() {
            let (fused, own_vendor) = (is_fused(case, v), vendor_of(v));
            text += &format!(
                "{:<34} {:<18} {:>9.3} {:>9} {:>8} {:>9} {:>8} {:>8}\n",
                if i == 0 { key.as_str() } else { "" },
                v,
                ms,
                if i == 0 || own_vendor != vendor { show(own_vendor) } else { String::new() },
                match (fused, own_vendor) {
                    (true, Some(b)) => format!("{:.3}x", b / ms),
                    _ => String::new(),
                },
                if i == 0 { show(bound) } else { String::new() },
                match (fused, bound) {
                    (true, Some(b)) => format!("{:.3}", b / ms),
                    _ => String::new(),
                },
                if i == 0 { format!("{error:.1e}") } else { String::new() },
            );
        }
        let mut compared = Map::new();
        let benchmark = case.benchmark().ok();
        for (v, ms) in &variants {
            let against = benchmark.and_then(|b| b.compared_with(v));
            if let Some((other, other_ms)) = against.and_then(|o| time_of(o).map(|t| (o, t))) {
                text += &format!("{:<34} {v} vs {other}: {:.3}x\n", "", other_ms / ms);
                compared.insert(v.clone(), json!({ "of": other, "ratio": other_ms / ms }));
            }
        }
        if let (Some(c), Some(n)) = (cublas, nccl) {
            text += &format!(
                "{:<34} {:<18} {:>9.3}\n{:<34} {:<18} {:>9.3}\n",
                "", "cublas (vendor)", c, "", "nccl (vendor)", n
            );
        }
        let variants_json: Map<String, Value> = variants.iter().map(|(v, ms)| (v.clone(), json!(ms))).collect();
        let own: Map<String, Value> = variants
            .iter()
            .filter_map(|(v, ms)| {
                base(format!("{v} {key}")).map(|b| (v.clone(), json!({ "baseline_ms": b, "speedup": b / ms })))
            })
            .collect();
        records.push(json!({
            "case": key, "world": case.world, "variants_ms": variants_json, "best_fused_ms": best,
            "baseline_ms": vendor, "speedup_vs_baseline": vendor.map(|b| b / best),
            "cublas_ms": cublas, "nccl_ms": nccl, "compute_ms": compute, "communication_ms": comm,
            "bound_ms": bound, "bound_over_best": bound.map(|b| b / best), "link_floor_ms": floor,
            "rank_tflops_best": case.rank_flops() / best / 1e9, "max_error": error,
            "variant_baselines": own, "compared": compared,
        }));
    }
    (records, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trident_core::ir::DType;

    #[test]
    fn the_bound_is_the_larger_part_at_its_faster_implementation() {
        let case = DistCase { name: "ag_gemm", dtype: DType::BF16, dims: vec![8192, 28672, 8192], world: 8 };
        let key = case.key();
        let variants = vec![
            ("ag_gemm/ce".to_string(), 0.80),
            ("ag_gemm/kernel".to_string(), 0.90),
            ("gather+gemm".to_string(), 1.10),
            ("gemm".to_string(), 0.62),
            ("gather".to_string(), 0.40),
        ];
        let mut base = Map::new();
        base.insert(key.clone(), json!(1.2));
        base.insert(format!("cublas {key}"), json!(0.60));
        base.insert(format!("nccl {key}"), json!(0.45));
        let (records, text) = report(&[(case, Ok((variants, 1e-3)))], &base, "H200");
        let r = &records[0];
        assert_eq!(r["best_fused_ms"], json!(0.80));
        assert_eq!(r["bound_ms"], json!(0.60), "compute (cuBLAS, faster than trident's 0.62) over the gather's 0.40");
        assert!((r["speedup_vs_baseline"].as_f64().unwrap() - 1.5).abs() < 1e-12);
        assert!(text.contains("1.500x") && text.contains("0.750"), "{text}");
        let failed = DistCase { name: "allreduce", dtype: DType::BF16, dims: vec![4096], world: 2 };
        let (records, text) = report(&[(failed, Err("rank 1: wait timed out".into()))], &Map::new(), "H200");
        assert!(records[0]["error"].as_str().unwrap().contains("timed out") && text.contains("FAILED"));
    }

    #[test]
    fn a_variant_with_a_pipeline_of_its_own_is_compared_with_it_and_parts_with_their_plain_form() {
        trident_conformance::link_backends();
        let case = DistCase { name: "moe_block", dtype: DType::BF16, dims: vec![128, 7168, 256, 8, 2048], world: 8 };
        let key = case.key();
        let variants = vec![
            ("moe-ep/block".to_string(), 1.0),
            ("moe-tp/block".to_string(), 0.5),
            ("moe-tp/sequential".to_string(), 0.6),
        ];
        let mut base = Map::new();
        base.insert(key.clone(), json!(2.0));
        base.insert(format!("moe-tp/block {key}"), json!(0.8));
        let (records, text) = report(&[(case, Ok((variants, 1e-3)))], &base, "H200");
        let r = &records[0];
        assert_eq!(r["variant_baselines"]["moe-tp/block"]["baseline_ms"], json!(0.8));
        assert!((r["variant_baselines"]["moe-tp/block"]["speedup"].as_f64().unwrap() - 1.6).abs() < 1e-12);
        assert!((r["compared"]["moe-tp/block"]["ratio"].as_f64().unwrap() - 1.2).abs() < 1e-12);
        // The expert-parallel block against the case's pipeline, the tensor-parallel one
        // against its own, the sequential form against none.
        assert!(
            text.contains("2.000x") && text.contains("1.600x") && text.contains("vs moe-tp/sequential: 1.200x"),
            "{text}"
        );
    }
}
