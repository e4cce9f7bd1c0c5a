//! `trident bench --plot` of a distributed report (`trident bench --world W --json`): for each
//! collective (AllGather, AllReduce, ReduceScatter, ...: cases that differ by message size), its
//! latency by message size, every variant beside the vendor's (NCCL in the same run) and the
//! link floor, and the bus bandwidth each reached against the link's; for each overlap kernel
//! (AG-GEMM, GEMM-RS, GEMM-AR, ...), its best fused time and the vendor pipeline's against the
//! bound of perfect overlap, max(compute, communication). Two reports are drawn side by side.

use crate::dist_report::NVLINK_BYTES_PER_S;
use crate::plot::{draw, Marker, Series};
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use trident_conformance::dist_bench::DistCase;
use trident_core::ir::DType;

/// One case of a distributed report.
#[derive(Clone, Debug, PartialEq)]
pub struct WorldPoint {
    pub case: DistCase,
    /// Every variant's time (ms), in the report's order.
    pub variants: Vec<(String, f64)>,
    /// The vendor pipeline's time (NCCL, cuBLAS + NCCL) in the same run.
    pub baseline_ms: Option<f64>,
    /// max(compute, communication), each at its best in the run.
    pub bound_ms: Option<f64>,
    pub best_fused_ms: Option<f64>,
}

impl WorldPoint {
    /// Bytes of the collective's message: the case's first dimension in elements.
    fn message_bytes(&self) -> f64 {
        self.case.dims.first().copied().unwrap_or(0) as f64 * self.case.dtype.size_bytes() as f64
    }
}

/// A distributed report's title (device, GPUs, world) and cases; `None` when `v` is not one.
pub fn read(v: &serde_json::Value) -> Option<(String, Vec<WorldPoint>)> {
    let world = v["world"].as_u64()?;
    let rows = v["results"].as_array()?;
    let points = rows
        .iter()
        .filter_map(|r| {
            let case = parse_case(r["case"].as_str()?)?;
            let variants = r["variants_ms"]
                .as_object()?
                .iter()
                .filter_map(|(k, t)| Some((k.clone(), t.as_f64().filter(|&t| t > 0.0)?)))
                .collect();
            let ms = |k: &str| r[k].as_f64().filter(|&t| t > 0.0);
            Some(WorldPoint {
                case,
                variants,
                baseline_ms: ms("baseline_ms"),
                bound_ms: ms("bound_ms"),
                best_fused_ms: ms("best_fused_ms"),
            })
        })
        .collect();
    let title = format!("{} x {}, world {world}", v["gpus"].as_u64().unwrap_or(0), v["device"].as_str().unwrap_or("?"));
    Some((title, points))
}

/// A case from its key (`name dtype dims... wW`), with its registered operation's name.
fn parse_case(key: &str) -> Option<DistCase> {
    let words: Vec<&str> = key.split_whitespace().collect();
    let (name, dtype, world) = (words.first()?, words.get(1)?, words.last()?.strip_prefix('w')?);
    let op = trident_conformance::registry::find(name)?;
    let dims = words[2..words.len() - 1].iter().map(|w| w.parse().ok()).collect::<Option<Vec<usize>>>()?;
    Some(DistCase { name: op.name(), dtype: DType::parse(dtype)?, dims, world: world.parse().ok()? })
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];

/// One line of a picture: legend, colour, dashed (the vendor's and floors), points.
struct Line {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// The pictures of `reports` (named `names`) in `dir`: `<op>-latency.svg` and
/// `<op>-busbw.svg` per collective, `<op>-overlap.svg` per overlap kernel.
pub fn plot(reports: &[(String, Vec<WorldPoint>)], names: &[String], dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let titles: Vec<&str> = reports.iter().map(|(t, _)| t.as_str()).collect();
    let titles = titles.join(" | ");
    let mut ops: Vec<&'static str> = reports.iter().flat_map(|(_, p)| p.iter().map(|x| x.case.name)).collect();
    ops.sort();
    ops.dedup();
    let mut files = Vec::new();
    for op in ops {
        let of_op = |k: usize| -> Vec<&WorldPoint> { reports[k].1.iter().filter(|p| p.case.name == op).collect() };
        let collective =
            (0..reports.len()).all(|k| of_op(k).iter().all(|p| p.case.dims.len() == 1 && p.case.rank_flops() == 0.0));
        if collective {
            let (mut latency, mut busbw) = (Vec::new(), Vec::new());
            for k in 0..reports.len() {
                let name = names.get(k).cloned().unwrap_or_default();
                let mut points = of_op(k);
                points.sort_by(|a, b| a.message_bytes().total_cmp(&b.message_bytes()));
                let mut variants: Vec<String> =
                    points.iter().flat_map(|p| p.variants.iter().map(|v| v.0.clone())).collect();
                variants.dedup();
                variants.sort();
                variants.dedup();
                let bw = |p: &WorldPoint, ms: f64| p.case.bus_bytes() / (ms * 1e-3) / 1e9;
                for (i, v) in variants.iter().enumerate() {
                    let at = |p: &&WorldPoint| p.variants.iter().find(|x| &x.0 == v).map(|x| x.1);
                    let color = COLORS[(i + 3 * k) % COLORS.len()];
                    let label = format!("{name} {v}").trim().to_string();
                    latency.push(Line {
                        label: label.clone(),
                        color,
                        dashed: false,
                        points: points.iter().filter_map(|p| Some((p.message_bytes(), at(p)? * 1e3))).collect(),
                    });
                    busbw.push(Line {
                        label,
                        color,
                        dashed: false,
                        points: points.iter().filter_map(|p| Some((p.message_bytes(), bw(p, at(p)?)))).collect(),
                    });
                }
                let vendor: Vec<(f64, f64)> =
                    points.iter().filter_map(|p| Some((p.message_bytes(), p.baseline_ms?))).collect();
                let color = RGBColor(214, 39, 40);
                let label = format!("{name} NCCL (same run)").trim().to_string();
                latency.push(Line {
                    label: label.clone(),
                    color,
                    dashed: true,
                    points: vendor.iter().map(|&(b, ms)| (b, ms * 1e3)).collect(),
                });
                busbw.push(Line {
                    label,
                    color,
                    dashed: true,
                    points: points.iter().filter_map(|p| Some((p.message_bytes(), bw(p, p.baseline_ms?)))).collect(),
                });
                if k == 0 {
                    let floor = |p: &&WorldPoint| p.case.bus_bytes() / NVLINK_BYTES_PER_S * 1e6;
                    latency.push(Line {
                        label: "link floor (bus bytes / 450 GB/s)".into(),
                        color: BLACK,
                        dashed: true,
                        points: points.iter().map(|p| (p.message_bytes(), floor(p))).collect(),
                    });
                    busbw.push(Line {
                        label: "link (450 GB/s)".into(),
                        color: BLACK,
                        dashed: true,
                        points: points.iter().map(|p| (p.message_bytes(), NVLINK_BYTES_PER_S / 1e9)).collect(),
                    });
                }
            }
            for (file, title, y_desc, lines, log_y) in [
                (format!("{op}-latency.svg"), format!("{op}: latency by message size ({titles})"), "us", latency, true),
                (
                    format!("{op}-busbw.svg"),
                    format!("{op}: bus bandwidth by message size ({titles})"),
                    "GB/s",
                    busbw,
                    false,
                ),
            ] {
                let path = dir.join(file);
                draw_sizes(&path, &title, y_desc, &lines, log_y).map_err(|e| format!("{}: {e}", path.display()))?;
                files.push(path);
            }
        } else {
            let path = dir.join(format!("{op}-overlap.svg"));
            let cases: Vec<String> = {
                let mut c: Vec<String> = Vec::new();
                for key in (0..reports.len()).flat_map(|k| of_op(k).into_iter().map(|p| p.case.key())) {
                    if !c.contains(&key) {
                        c.push(key);
                    }
                }
                c
            };
            let mut series = Vec::new();
            for k in 0..reports.len() {
                let name = names.get(k).cloned().unwrap_or_default();
                let points = of_op(k);
                let ratio = |f: &dyn Fn(&WorldPoint) -> Option<f64>| -> Vec<(usize, f64)> {
                    cases
                        .iter()
                        .enumerate()
                        .filter_map(|(i, c)| points.iter().find(|p| &p.case.key() == c).and_then(|p| Some((i, f(p)?))))
                        .collect()
                };
                series.push(Series {
                    label: format!("{name} trident: bound / time").trim().to_string(),
                    marker: Marker::Filled,
                    color: COLORS[k % COLORS.len()],
                    points: ratio(&|p| Some(p.bound_ms? / p.best_fused_ms?)),
                });
                series.push(Series {
                    label: format!("{name} vendor pipeline: bound / time").trim().to_string(),
                    marker: Marker::Hollow,
                    color: RGBColor(214, 39, 40),
                    points: ratio(&|p| Some(p.bound_ms? / p.baseline_ms?)),
                });
            }
            let title = format!("{op}: against perfect overlap, max(compute, communication) ({titles})");
            // Case labels in full (no workload prefix stripped), the line at 1: the bound.
            draw(&path, (&title, "bound / time (1: perfect overlap)"), ("", &cases), &series, true)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            files.push(path);
        }
    }
    Ok(files)
}

/// Lines over message sizes (bytes, log 2), `y` linear or log.
fn draw_sizes(
    path: &Path,
    title: &str,
    y_desc: &str,
    lines: &[Line],
    log_y: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let all = || lines.iter().flat_map(|l| l.points.iter());
    let (x0, x1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if x0 > x1 {
        return Err("no points".into());
    }
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder.caption(title, ("sans-serif", 15)).margin(12).x_label_area_size(50).y_label_area_size(70);
    let x_range = (x0 / 1.5..x1 * 1.5).log_scale();
    let size = |b: &f64| {
        let units = [("B", 1.0), ("KB", 1e3), ("MB", 1e6), ("GB", 1e9)];
        let (u, d) = units.iter().rev().find(|(_, d)| *b >= *d).copied().unwrap_or(("B", 1.0));
        format!("{:.0} {u}", b / d)
    };
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc("message (bytes per rank's part)")
                .x_label_formatter(&size)
                .y_desc(y_desc)
                .draw()?;
            for l in lines {
                let style = l.color.stroke_width(2);
                if l.dashed {
                    chart
                        .draw_series(DashedLineSeries::new(l.points.iter().copied(), 6, 4, style))?
                        .label(l.label.clone())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
                } else {
                    chart.draw_series(LineSeries::new(l.points.iter().copied(), style))?;
                    chart
                        .draw_series(l.points.iter().map(|&p| Circle::new(p, 3, l.color.filled())))?
                        .label(l.label.clone())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
                }
            }
            chart
                .configure_series_labels()
                .position(if log_y { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperLeft })
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
        }};
    }
    if log_y {
        finish!(builder.build_cartesian_2d(x_range, (y0 / 1.5..y1 * 1.5).log_scale())?);
    } else {
        finish!(builder.build_cartesian_2d(x_range, 0f64..y1 * 1.15)?);
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of AllGather at three sizes and one AG-GEMM: the collective's two pictures (a
    /// line per variant, NCCL and the floor) and the overlap kernel's.
    #[test]
    fn a_world_report_plots_collectives_by_size_and_overlap_against_the_bound() {
        let v = serde_json::json!({
            "device": "NVIDIA H200", "gpus": 8, "world": 8,
            "results": [
                {"case": "allgather bf16 1024 w8", "variants_ms": {"allgather/ll": 0.01, "allgather/kernel": 0.02}, "baseline_ms": 0.015},
                {"case": "allgather bf16 131072 w8", "variants_ms": {"allgather/ll": 0.03, "allgather/kernel": 0.025}, "baseline_ms": 0.03},
                {"case": "allgather bf16 4194304 w8", "variants_ms": {"allgather/kernel": 0.2}, "baseline_ms": 0.25},
                {"case": "ag_gemm bf16 8192 28672 8192 w8", "variants_ms": {"ag_gemm/kernel": 5.0},
                 "baseline_ms": 6.5, "bound_ms": 4.6, "best_fused_ms": 5.0},
                {"case": "nonsense", "variants_ms": {}},
            ]
        });
        let (title, points) = read(&v).unwrap();
        assert_eq!(title, "8 x NVIDIA H200, world 8");
        assert_eq!(points.len(), 4);
        assert_eq!(points[0].message_bytes(), 2048.0);
        assert!(read(&serde_json::json!({"results": []})).is_none(), "a single-device report");
        let dir = std::env::temp_dir().join(format!("trident-plot-world-{}", std::process::id()));
        let files = plot(&[(title, points)], &[String::new()], &dir).unwrap();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["ag_gemm-overlap.svg", "allgather-latency.svg", "allgather-busbw.svg"]);
        let latency = std::fs::read_to_string(&files[1]).unwrap();
        assert!(
            latency.contains("allgather/ll") && latency.contains("NCCL (same run)") && latency.contains("link floor")
        );
        let overlap = std::fs::read_to_string(&files[0]).unwrap();
        assert!(overlap.contains("trident: bound / time") && overlap.contains("ag_gemm bf16 8192 28672 8192 w8"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
