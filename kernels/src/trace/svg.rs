//! A [`Timeline`] drawn as an SVG: a row per track (a multiprocessor's resident slot), ranks
//! one under the other, time to the right. Each program is a bar coloured by its kernel; its
//! waits are red over it, persistent tiles are separated by ticks at their epilogues; a rank's
//! stream operations (copies, stream waits) are orange on a row per stream under its tracks.
//! Perfetto is not reachable from every machine; this is.

use super::Timeline;
use std::fmt::Write;

/// Pixels per track row, at most (the pitch).
const ROW_MAX: f64 = 6.0;
/// Height of all the rows together, at most (an 8-rank run of 132 SMs has 2000 tracks): rows
/// get thinner, down to a pixel.
const ROWS_HEIGHT: f64 = 2400.0;
/// Width of the time axis in pixels.
const WIDTH: f64 = 1400.0;
/// Left margin (rank names).
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;

const COLOURS: [&str; 8] = ["#4878d0", "#6acc64", "#956cb4", "#d5bb67", "#82c6e2", "#dc7ec0", "#8c613c", "#797979"];

/// The SVG of `timeline`, titled `title`.
pub fn render(timeline: &Timeline, title: &str) -> String {
    let (spans, tracks) = timeline.programs();
    let origin = timeline.origin_ns();
    let end = spans.iter().map(|s| s.end_ns).max().unwrap_or(origin).max(origin + 1);
    let x = |t: u64| LEFT + (t.saturating_sub(origin)) as f64 / (end - origin) as f64 * WIDTH;
    // First row of each rank, with a gap of two rows between ranks.
    // Streams with operations, per rank: rows after the rank's tracks.
    let streams = timeline.stream_spans();
    let stream_rows = |rank: usize| {
        let mut v: Vec<usize> = streams.iter().filter(|x| x.0 == rank).map(|x| x.1).collect();
        v.sort();
        v.dedup();
        v
    };
    let mut first_row = Vec::with_capacity(tracks.len());
    let mut rows = 0usize;
    for (rank, list) in tracks.iter().enumerate() {
        first_row.push(rows);
        rows += list.len() + stream_rows(rank).len() + 2;
    }
    let pitch = (ROWS_HEIGHT / rows.max(1) as f64).clamp(1.0, ROW_MAX);
    // A bar's height: a pixel between rows while they are thick enough.
    let bar = (pitch - 1.0).max(pitch * 0.8);
    let height = TOP + rows as f64 * pitch + 40.0;
    let kernels: Vec<&str> = {
        let mut k: Vec<&str> =
            timeline.launches.iter().filter(|l| l.stream_op.is_none()).map(|l| l.kernel.as_str()).collect();
        k.sort();
        k.dedup();
        k
    };
    let colour = |kernel: &str| COLOURS[kernels.iter().position(|k| *k == kernel).unwrap_or(0) % COLOURS.len()];
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"#,
        LEFT + WIDTH + 20.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{LEFT}" y="16" font-size="13">{}</text>"#, escape(title));
    // Legend: kernels, waits.
    let mut lx = LEFT;
    for k in &kernels {
        let _ = writeln!(s, r#"<rect x="{lx}" y="22" width="10" height="8" fill="{}"/>"#, colour(k));
        let _ = writeln!(s, r#"<text x="{}" y="30">{}</text>"#, lx + 13.0, escape(k));
        lx += 20.0 + 7.0 * k.len() as f64;
    }
    let _ = writeln!(s, r##"<rect x="{lx}" y="22" width="10" height="8" fill="#d62728"/><text x="{}" y="30">wait</text>"##, lx + 13.0);
    let lx = lx + 50.0;
    let _ = writeln!(
        s,
        r##"<rect x="{lx}" y="22" width="10" height="8" fill="#ff7f0e"/><text x="{}" y="30">copy / stream wait</text>"##,
        lx + 13.0
    );
    for (rank, &row) in first_row.iter().enumerate() {
        let y = TOP + row as f64 * pitch;
        let _ = writeln!(s, r#"<text x="4" y="{}">rank {rank}</text>"#, y + 10.0);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="#ddd"/>"##,
            LEFT + WIDTH,
            y - pitch,
            y - pitch
        );
    }
    for sp in &spans {
        let y = TOP + (first_row[sp.rank] + sp.track) as f64 * pitch;
        let kernel = &timeline.launches[sp.launch].kernel;
        let (x0, x1) = (x(sp.start_ns), x(sp.end_ns));
        let _ = writeln!(
            s,
            r#"<rect x="{x0:.2}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="{}"><title>{} p{} SM {}</title></rect>"#,
            (x1 - x0).max(0.5),
            bar,
            colour(kernel),
            escape(kernel),
            sp.program,
            sp.sm
        );
        for &(label, arg, from, to) in &sp.waits {
            let (a, b) = (x(from), x(to));
            let _ = writeln!(
                s,
                r##"<rect x="{a:.2}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="#d62728"><title>{} [{arg}]</title></rect>"##,
                (b - a).max(0.3),
                bar,
                escape(timeline.label(sp.launch, label))
            );
        }
        for &(_, _, at) in &sp.tiles {
            let a = x(at);
            let _ = writeln!(s, r##"<line x1="{a:.2}" x2="{a:.2}" y1="{y:.1}" y2="{:.1}" stroke="#222" stroke-width="0.6"/>"##, y + bar);
        }
    }
    for &(rank, stream, what, from, to) in &streams {
        let Some(&row) = first_row.get(rank) else { continue };
        let k = stream_rows(rank).iter().position(|&x| x == stream).unwrap_or(0);
        let y = TOP + (row + tracks[rank].len() + k) as f64 * pitch;
        let (a, b) = (x(from), x(to));
        let _ = writeln!(
            s,
            r##"<rect x="{a:.2}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="#ff7f0e"><title>stream {stream}: {}</title></rect>"##,
            (b - a).max(0.5),
            bar,
            escape(what)
        );
    }
    // Time axis.
    let axis_y = TOP + rows as f64 * pitch;
    let span_us = (end - origin) as f64 / 1e3;
    let step = nice_step(span_us / 10.0);
    let mut t = 0.0;
    while t <= span_us + 1e-9 {
        let px = LEFT + t / span_us * WIDTH;
        let _ = writeln!(s, r##"<line x1="{px:.1}" x2="{px:.1}" y1="{}" y2="{}" stroke="#888"/>"##, axis_y, axis_y + 5.0);
        let _ = writeln!(s, r#"<text x="{px:.1}" y="{}" text-anchor="middle">{t}</text>"#, axis_y + 17.0);
        t += step;
    }
    let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="end">us</text>"#, LEFT + WIDTH, axis_y + 32.0);
    s.push_str("</svg>\n");
    s
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1e-9).log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * p).find(|&v| v >= raw).unwrap_or(10.0 * p)
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::super::{Launch, Timeline};
    use trident_core::trace::{Event, EventKind, Recorded};

    #[test]
    fn a_program_and_its_wait_are_drawn() {
        let e = |t, kind| Event { time_ns: t, program: 0, sm: 0, kind, label: 1, arg: 0 };
        let events = vec![e(0, EventKind::Start), e(10, EventKind::WaitBegin), e(20, EventKind::WaitEnd), e(40, EventKind::End)];
        let l = Launch { rank: 0, index: 0, kernel: "gemm<rs>".into(), labels: vec!["".into(), "wait".into()], recorded: Recorded { events, dropped: 0 }, stream_op: None };
        let svg = super::render(&Timeline::of([vec![l]]), "t");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("gemm&lt;rs&gt; p0 SM 0"));
        assert_eq!(svg.matches("#d62728").count(), 2, "legend and one wait");
        assert_eq!(super::nice_step(3.2), 5.0);
        // 3000 programs on 3000 multiprocessors: the rows thin down to a pixel (not 6).
        let many: Vec<Event> = (0..3000u32)
            .flat_map(|p| {
                let e = move |t, kind| Event { time_ns: t, program: p, sm: p, kind, label: 0, arg: 0 };
                [e(0, EventKind::Start), e(10, EventKind::End)]
            })
            .collect();
        let l = Launch { rank: 0, index: 0, kernel: "k".into(), labels: vec!["".into()], recorded: Recorded { events: many, dropped: 0 }, stream_op: None };
        let svg = super::render(&Timeline::of([vec![l]]), "t");
        let height: f64 = svg.split("height=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        assert!(height <= super::TOP + 3002.0 + 40.0 && height > super::TOP + 2000.0, "{height}");
        assert_eq!(super::nice_step(0.11), 0.2);
    }
}
