//! A [`Timeline`] as a Chrome / Perfetto trace (the trace-event JSON format: open it in
//! <https://ui.perfetto.dev> or `chrome://tracing`): one process per rank, one thread per track
//! (a multiprocessor's resident slot), each program a slice named by its kernel with its
//! waits, persistent tiles and notifies inside it. Times are microseconds from the earliest
//! event.

use super::Timeline;
use serde_json::{json, Value};

/// The trace-event JSON of `timeline`.
pub fn to_json(timeline: &Timeline) -> Value {
    let (spans, tracks) = timeline.programs();
    let origin = timeline.origin_ns();
    let us = |t: u64| (t.saturating_sub(origin)) as f64 / 1e3;
    let mut events = Vec::new();
    for (rank, list) in tracks.iter().enumerate() {
        events.push(json!({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": format!("rank {rank}")}}));
        events.push(json!({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}}));
        for (i, t) in list.iter().enumerate() {
            let name = format!("SM {} slot {}", t.sm, t.slot);
            events.push(json!({"ph": "M", "name": "thread_name", "pid": rank, "tid": i, "args": {"name": name}}));
            events.push(json!({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": i, "args": {"sort_index": i}}));
        }
    }
    // Stream operations (copies, stream waits) on a track per stream, after the rank's
    // multiprocessor tracks.
    let streams = timeline.stream_spans();
    let mut named: Vec<(usize, usize)> = Vec::new();
    for &(rank, stream, what, from, to) in &streams {
        let tid = tracks.get(rank).map_or(0, |t| t.len()) + stream;
        if !named.contains(&(rank, stream)) {
            named.push((rank, stream));
            events.push(json!({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": format!("stream {stream}")}}));
            events.push(json!({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}}));
        }
        events.push(json!({"ph": "X", "name": what, "cat": "stream", "pid": rank, "tid": tid,
                           "ts": us(from), "dur": (to.saturating_sub(from)) as f64 / 1e3}));
    }
    for s in &spans {
        let launch = &timeline.launches[s.launch];
        let slice = |name: String, from: u64, to: u64, args: Value| {
            json!({"ph": "X", "name": name, "cat": launch.kernel, "pid": s.rank, "tid": s.track,
                   "ts": us(from), "dur": (to.saturating_sub(from)) as f64 / 1e3, "args": args})
        };
        events.push(slice(
            format!("{} p{}", launch.kernel, s.program),
            s.start_ns,
            s.end_ns,
            json!({"program": s.program, "sm": s.sm, "launch": launch.index}),
        ));
        for &(tile, from, to) in &s.tiles {
            events.push(slice(format!("tile {tile}"), from, to, json!({"tile": tile})));
        }
        for &(label, arg, from, to) in &s.waits {
            events.push(slice(timeline.label(s.launch, label).to_string(), from, to, json!({"signal": arg})));
        }
        for &(label, arg, at) in &s.notifies {
            events.push(json!({"ph": "i", "s": "t", "name": timeline.label(s.launch, label), "cat": launch.kernel,
                               "pid": s.rank, "tid": s.track, "ts": us(at), "args": {"signal": arg}}));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"dropped_events": timeline.dropped(), "launches": timeline.launches.len(),
                      "clock_offsets_ns": timeline.clocks},
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Launch, Timeline};
    use trident_core::trace::{Event, EventKind, Recorded};

    #[test]
    fn programs_are_slices_on_their_tracks() {
        let e = |t, kind, label, arg| Event { time_ns: t, program: 3, sm: 2, kind, label, arg };
        let events = vec![
            e(1000, EventKind::Start, 0, 0),
            e(1500, EventKind::WaitBegin, 1, 4),
            e(2500, EventKind::WaitEnd, 1, 4),
            e(4000, EventKind::End, 0, 0),
        ];
        let l = Launch {
            rank: 1,
            index: 0,
            kernel: "ag_gemm".into(),
            labels: vec!["".into(), "wait %ready".into()],
            recorded: Recorded { events, dropped: 2 },
            stream_op: None,
        };
        let j = super::to_json(&Timeline::of([vec![l]]));
        let ev = j["traceEvents"].as_array().unwrap();
        let x: Vec<_> = ev.iter().filter(|v| v["ph"] == "X").collect();
        assert_eq!(x.len(), 2);
        assert_eq!(x[0]["name"], "ag_gemm p3");
        assert_eq!((x[0]["pid"].as_u64(), x[0]["ts"].as_f64(), x[0]["dur"].as_f64()), (Some(1), Some(0.0), Some(3.0)));
        assert_eq!((x[1]["name"].as_str(), x[1]["ts"].as_f64(), x[1]["args"]["signal"].as_u64()), (Some("wait %ready"), Some(0.5), Some(4)));
        assert!(ev.iter().any(|v| v["name"] == "thread_name" && v["args"]["name"] == "SM 2 slot 0"));
        assert_eq!(j["otherData"]["dropped_events"], 2);
    }
}
