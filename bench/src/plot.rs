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

/// How a series' points are drawn.
#[derive(Clone, Copy)]
pub(crate) enum Marker {
    Filled,
    Hollow,
    Triangle,
}

/// One series of a picture: its legend, marker, colour, and (case index, value) points.
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) marker: Marker,
    pub(crate) color: RGBColor,
    pub(crate) points: Vec<(usize, f64)>,
}

/// Writes `<dir>/<workload>.svg` for every workload of `reports` (one or two), and
/// `<workload>-tflops.svg` for dense GEMMs; returns the files.
pub fn plot(reports: &[(String, Vec<Point>)], names: &[String], dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let devices: Vec<&str> = reports.iter().map(|(d, _)| d.as_str()).collect();
    let devices = devices.join(" | ");
    let mut files = Vec::new();
    for (workload, cases) in workloads(reports) {
        let mut pictures = vec![(
            format!("{workload}.svg"),
            format!("{workload}: speed against the same run's baseline ({devices})"),
            "time of the other / trident's time (above 1: trident faster)",
            speed_series(&cases, reports, names),
            true,
        )];
        if cases.iter().all(|c| gemm_flops(c).is_some()) {
            pictures.push((
                format!("{workload}-tflops.svg"),
                format!("{workload}: TFLOP/s by shape ({devices})"),
                "TFLOP/s (2 M N K / time)",
                tflops_series(&cases, reports, names),
                false,
            ));
        }
        for (file, title, y_desc, series, unit_line) in pictures {
            let path = dir.join(file);
            draw(&path, (&title, y_desc), (&workload, &cases), &series, unit_line)
                .map_err(|e| format!("{}: {e}", path.display()))?;
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

/// The series of each report over `cases`: `value` of each case's point (skipped where `None`),
/// one series per (legend suffix, marker) of `kinds`, empty series left out.
fn series_of(
    cases: &[String],
    reports: &[(String, Vec<Point>)],
    names: &[String],
    kinds: &[(&str, Marker)],
    value: impl Fn(usize, &str, &Point) -> Option<f64>,
) -> Vec<Series> {
    let mut out = Vec::new();
    for (k, (_, r)) in reports.iter().enumerate() {
        let name = names.get(k).cloned().unwrap_or_default();
        for (which, &(suffix, marker)) in kinds.iter().enumerate() {
            let points: Vec<(usize, f64)> = cases
                .iter()
                .enumerate()
                .filter_map(|(i, c)| r.iter().find(|p| &p.case == c).and_then(|p| value(which, c, p)).map(|v| (i, v)))
                .collect();
            if !points.is_empty() {
                out.push(Series { label: format!("{name} {suffix}"), marker, color: COLORS[k % COLORS.len()], points });
            }
        }
    }
    out
}

/// Speed against the baseline and Triton, and the fraction of the roofline floor.
fn speed_series(cases: &[String], reports: &[(String, Vec<Point>)], names: &[String]) -> Vec<Series> {
    let kinds =
        [("vs baseline", Marker::Filled), ("vs Triton", Marker::Triangle), ("of the roofline floor", Marker::Hollow)];
    series_of(cases, reports, names, &kinds, |which, _, p| [p.vs_baseline, p.vs_triton, p.of_floor][which])
}

/// TFLOP/s of trident, the baseline and Triton.
fn tflops_series(cases: &[String], reports: &[(String, Vec<Point>)], names: &[String]) -> Vec<Series> {
    let kinds = [("trident", Marker::Filled), ("baseline", Marker::Hollow), ("Triton", Marker::Triangle)];
    series_of(cases, reports, names, &kinds, |which, c, p| Some(gemm_flops(c)? / p.ms[which]? / 1e9))
}

/// One picture: `series` over the `cases` of `workload` (labelled without the workload's name),
/// from 0 to a tenth above the largest value, with the line at 1 where `unit_line`.
pub(crate) fn draw(
    path: &Path,
    (title, y_desc): (&str, &str),
    (workload, cases): (&str, &[String]),
    series: &[Series],
    unit_line: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1 * 1.1))
        .fold(if unit_line { 1.2 } else { 1.0 }, f64::max);
    let n = cases.len();
    let root = SVGBackend::new(path, ((320 + 60 * n as u32).max(640), 620)).into_drawing_area();
    root.fill(&WHITE)?;
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
        .y_desc(y_desc)
        .draw()?;
    if unit_line {
        chart.draw_series(LineSeries::new(
            [(SegmentValue::Exact(0), 1.0), (SegmentValue::Last, 1.0)],
            BLACK.stroke_width(1),
        ))?;
    }
    for s in series {
        let (marker, color) = (s.marker, s.color);
        let shape = move |at: (SegmentValue<usize>, f64)| match marker {
            Marker::Filled => Circle::new(at, 5, color.filled()).into_dyn(),
            Marker::Hollow => Circle::new(at, 5, color.stroke_width(2)).into_dyn(),
            Marker::Triangle => TriangleMarker::new(at, 6, color.filled()).into_dyn(),
        };
        let legend = move |(x, y): (i32, i32)| match marker {
            Marker::Filled => Circle::new((x, y), 5, color.filled()).into_dyn(),
            Marker::Hollow => Circle::new((x, y), 5, color.stroke_width(2)).into_dyn(),
            Marker::Triangle => TriangleMarker::new((x, y), 6, color.filled()).into_dyn(),
        };
        chart
            .draw_series(s.points.iter().map(|&(i, v)| shape((SegmentValue::CenterOf(i), v))))?
            .label(s.label.clone())
            .legend(legend);
    }
    chart
        .configure_series_labels()
        .position(if unit_line { SeriesLabelPosition::UpperRight } else { SeriesLabelPosition::LowerRight })
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
