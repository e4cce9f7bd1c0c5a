//! `trident bench --plot REPORT.json [OTHER.json]`: a benchmark report (or two side by side: two
//! vendors, two commits) as SVG pictures, one per workload (the case names' first word): each
//! case's speed against the baseline measured in the same run (the baseline's time over
//! trident's: above 1 is faster), against Triton where the report has it, and the fraction of
//! the roofline floor reached (the floor's time over trident's), with the line at 1. SVG text
//! is written as `<text>` elements, so no font is looked up.

use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One case of a report: what the plots show.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub case: String,
    /// Times in ms: trident's, the baseline's and Triton's.
    pub ms: [Option<f64>; 3],
    /// Baseline time over trident's.
    pub vs_baseline: Option<f64>,
    pub vs_triton: Option<f64>,
    /// The roofline floor's time over trident's.
    pub of_floor: Option<f64>,
}

/// A report's device and cases (`trident bench --json`'s format).
pub fn read(path: &str) -> Result<(String, Vec<Point>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{path}: not a benchmark report: {e}"))?;
    let rows = v["results"].as_array().ok_or_else(|| format!("{path}: no `results` list"))?;
    let ratio = |r: &serde_json::Value, over: &str| {
        let (t, o) = (r["trident_ms"].as_f64()?, r[over].as_f64()?);
        (t > 0.0 && o > 0.0).then(|| o / t)
    };
    let points = rows
        .iter()
        .filter_map(|r| {
            Some(Point {
                case: r["case"].as_str()?.to_string(),
                ms: ["trident_ms", "baseline_ms", "triton_ms"].map(|k| r[k].as_f64().filter(|&t| t > 0.0)),
                vs_baseline: ratio(r, "baseline_ms"),
                vs_triton: ratio(r, "triton_ms"),
                of_floor: ratio(r, "floor_ms"),
            })
        })
        .collect();
    Ok((v["device"].as_str().unwrap_or("?").to_string(), points))
}

/// The cases of `reports` by workload (the first word of a case's name), in the order they
/// first appear; a case's later duplicates (a distributed report's variants) dropped.
fn workloads(reports: &[(String, Vec<Point>)]) -> BTreeMap<String, Vec<String>> {
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, points) in reports {
        for p in points {
            let w = p.case.split_whitespace().next().unwrap_or("?").to_string();
            let cases = by.entry(w).or_default();
            if !cases.contains(&p.case) {
                cases.push(p.case.clone());
            }
        }
    }
    by
}

const COLORS: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40)];

/// Writes `<dir>/<workload>.svg` for every workload of `reports` (one or two); returns the files.
pub fn plot(reports: &[(String, Vec<Point>)], names: &[String], dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for (workload, cases) in workloads(reports) {
        let path = dir.join(format!("{workload}.svg"));
        draw(&path, &workload, &cases, reports, names).map_err(|e| format!("{}: {e}", path.display()))?;
        files.push(path);
        if cases.iter().all(|c| gemm_flops(c).is_some()) {
            let path = dir.join(format!("{workload}-tflops.svg"));
            draw_tflops(&path, &workload, &cases, reports, names).map_err(|e| format!("{}: {e}", path.display()))?;
            files.push(path);
        }
    }
    Ok(files)
}

/// `2 M N K` of a dense GEMM case (`gemm DTYPE M N K`, `scaled_gemm ...` likewise); `None` for
/// any other case.
pub fn gemm_flops(case: &str) -> Option<f64> {
    let words: Vec<&str> = case.split_whitespace().collect();
    if !matches!(words.first(), Some(&("gemm" | "scaled_gemm"))) || words.len() < 5 {
        return None;
    }
    let dims: Option<Vec<f64>> = words[words.len() - 3..].iter().map(|w| w.parse::<f64>().ok()).collect();
    dims.map(|d| 2.0 * d[0] * d[1] * d[2])
}

/// A GEMM workload's TFLOP/s by shape: trident's, the baseline's and Triton's, per report.
fn draw_tflops(
    path: &Path,
    workload: &str,
    cases: &[String],
    reports: &[(String, Vec<Point>)],
    names: &[String],
) -> Result<(), Box<dyn std::error::Error>> {
    let find = |r: &[Point], c: &str| r.iter().find(|p| p.case == c).cloned();
    let rate = |c: &str, ms: f64| gemm_flops(c).map(|f| f / ms / 1e9).unwrap_or(0.0);
    let mut top = 1.0f64;
    for (_, r) in reports {
        for c in cases {
            for ms in find(r, c).map(|p| p.ms).unwrap_or_default().into_iter().flatten() {
                top = top.max(rate(c, ms) * 1.1);
            }
        }
    }
    let n = cases.len();
    let root = SVGBackend::new(path, ((320 + 60 * n as u32).max(640), 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let devices: Vec<&str> = reports.iter().map(|(d, _)| d.as_str()).collect();
    let labels: Vec<String> = cases.iter().map(|c| c.strip_prefix(workload).unwrap_or(c).trim().to_string()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{workload}: TFLOP/s by shape ({})", devices.join(" | ")), ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(190)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n).into_segmented(), 0f64..top)?;
    chart
        .configure_mesh()
        .x_labels(n.max(1))
        .x_label_style(("sans-serif", 12).into_font().transform(FontTransform::Rotate90))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("TFLOP/s (2 M N K / time)")
        .draw()?;
    for (k, (_, r)) in reports.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let name = names.get(k).cloned().unwrap_or_default();
        for (which, what) in ["trident", "baseline", "Triton"].into_iter().enumerate() {
            let pts: Vec<(usize, f64)> = cases
                .iter()
                .enumerate()
                .filter_map(|(i, c)| find(r, c).and_then(|p| p.ms[which]).map(|ms| (i, rate(c, ms))))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let at = |i: usize, v: f64| (SegmentValue::CenterOf(i), v);
            let label = format!("{name} {what}");
            let series = match which {
                0 => chart.draw_series(pts.iter().map(|&(i, v)| Circle::new(at(i, v), 5, color.filled())))?,
                1 => chart.draw_series(pts.iter().map(|&(i, v)| Circle::new(at(i, v), 5, color.stroke_width(2))))?,
                _ => chart.draw_series(pts.iter().map(|&(i, v)| TriangleMarker::new(at(i, v), 6, color.filled())))?,
            };
            series.label(label).legend(move |(x, y)| match which {
                0 => Circle::new((x, y), 5, color.filled()).into_dyn(),
                1 => Circle::new((x, y), 5, color.stroke_width(2)).into_dyn(),
                _ => TriangleMarker::new((x, y), 6, color.filled()).into_dyn(),
            });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn draw(
    path: &Path,
    workload: &str,
    cases: &[String],
    reports: &[(String, Vec<Point>)],
    names: &[String],
) -> Result<(), Box<dyn std::error::Error>> {
    let find = |r: &[Point], c: &str| r.iter().find(|p| p.case == c).cloned();
    let mut top = 1.2f64;
    for (_, r) in reports {
        for c in cases {
            if let Some(p) = find(r, c) {
                for v in [p.vs_baseline, p.vs_triton, p.of_floor].into_iter().flatten() {
                    top = top.max(v * 1.1);
                }
            }
        }
    }
    let n = cases.len();
    let width = (320 + 60 * n as u32).max(640);
    let root = SVGBackend::new(path, (width, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let devices: Vec<&str> = reports.iter().map(|(d, _)| d.as_str()).collect();
    let title = format!("{workload}: speed against the same run's baseline ({})", devices.join(" | "));
    let labels: Vec<String> = cases.iter().map(|c| c.strip_prefix(workload).unwrap_or(c).trim().to_string()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(190)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n).into_segmented(), 0f64..top)?;
    chart
        .configure_mesh()
        .x_labels(n.max(1))
        .x_label_style(("sans-serif", 12).into_font().transform(FontTransform::Rotate90))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("time of the other / trident's time (above 1: trident faster)")
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(SegmentValue::Exact(0), 1.0), (SegmentValue::Last, 1.0)],
        BLACK.stroke_width(1),
    ))?;
    for (k, (_, r)) in reports.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let name = names.get(k).cloned().unwrap_or_default();
        let at = |i: usize, v: f64| (SegmentValue::CenterOf(i), v);
        let series = |pick: fn(&Point) -> Option<f64>| -> Vec<(usize, f64)> {
            cases.iter().enumerate().filter_map(|(i, c)| find(r, c).and_then(|p| pick(&p)).map(|v| (i, v))).collect()
        };
        let base = series(|p| p.vs_baseline);
        if !base.is_empty() {
            chart
                .draw_series(base.iter().map(|&(i, v)| Circle::new(at(i, v), 5, color.filled())))?
                .label(format!("{name} vs baseline"))
                .legend(move |(x, y)| Circle::new((x, y), 5, color.filled()));
        }
        let triton = series(|p| p.vs_triton);
        if !triton.is_empty() {
            chart
                .draw_series(triton.iter().map(|&(i, v)| TriangleMarker::new(at(i, v), 6, color.filled())))?
                .label(format!("{name} vs Triton"))
                .legend(move |(x, y)| TriangleMarker::new((x, y), 6, color.filled()));
        }
        let floor = series(|p| p.of_floor);
        if !floor.is_empty() {
            chart
                .draw_series(floor.iter().map(|&(i, v)| Circle::new(at(i, v), 5, color.stroke_width(2))))?
                .label(format!("{name} of the roofline floor"))
                .legend(move |(x, y)| Circle::new((x, y), 5, color.stroke_width(2)));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(dir: &Path, name: &str, trident: f64) -> String {
        let path = dir.join(name);
        let rows = serde_json::json!({
            "backend": "nvidia",
            "device": "NVIDIA H200",
            "results": [
                {"case": "gemm bf16 4096 4096 4096", "trident_ms": trident, "baseline_ms": 0.2, "triton_ms": 0.25, "floor_ms": 0.14},
                {"case": "gemm bf16 256 8192 8192", "trident_ms": 0.1, "baseline_ms": 0.09},
                {"case": "flash_decode bf16 1 1 32 8 128 131072", "trident_ms": 0.2, "baseline_ms": 0.19, "floor_ms": 0.17},
            ]
        });
        std::fs::write(&path, rows.to_string()).unwrap();
        path.display().to_string()
    }

    /// A report reads back its ratios (the other's time over trident's); two reports plot as one
    /// picture per workload, each case's label and every marker in it.
    #[test]
    fn reports_plot_per_workload() {
        let dir = std::env::temp_dir().join(format!("trident-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (report(&dir, "a.json", 0.16), report(&dir, "b.json", 0.32));
        let ra = read(&a).unwrap();
        assert_eq!(ra.0, "NVIDIA H200");
        let first = &ra.1[0];
        assert!((first.vs_baseline.unwrap() - 1.25).abs() < 1e-12);
        assert!((first.vs_triton.unwrap() - 0.25 / 0.16).abs() < 1e-12);
        assert!((first.of_floor.unwrap() - 0.875).abs() < 1e-12);
        assert_eq!(ra.1[1].vs_triton, None);
        let files = plot(&[ra, read(&b).unwrap()], &["A".into(), "B".into()], &dir.join("plots")).unwrap();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["flash_decode.svg", "gemm.svg", "gemm-tflops.svg"]);
        assert_eq!(gemm_flops("gemm bf16 256 8192 8192"), Some(2.0 * 256.0 * 8192.0 * 8192.0));
        assert_eq!(gemm_flops("flash_decode bf16 1 1 32 8 128 131072"), None);
        let tflops = std::fs::read_to_string(&files[2]).unwrap();
        assert!(tflops.contains("A trident") && tflops.contains("B baseline") && tflops.contains("A Triton"));
        let gemm = std::fs::read_to_string(&files[1]).unwrap();
        assert!(gemm.contains("bf16 4096 4096 4096") && gemm.contains("bf16 256 8192 8192"));
        assert!(
            gemm.contains("A vs baseline") && gemm.contains("B vs Triton") && gemm.contains("of the roofline floor")
        );
        // Markers: A and B each 2 baseline points + 1 Triton + 1 floor, plus the legend's 6.
        assert_eq!(gemm.matches("<circle").count(), 2 * (2 + 1) + 4);
        assert!(read(&dir.join("missing.json").display().to_string()).unwrap_err().contains("missing.json"));
        std::fs::write(dir.join("bad.json"), "{}").unwrap();
        assert!(read(&dir.join("bad.json").display().to_string()).unwrap_err().contains("no `results`"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
