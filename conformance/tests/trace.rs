//! Timelines (issue 32) through cpu-simt's lowering: a traced distributed benchmark case still
//! checks its results, and every program of every launch records its start and end, with its
//! waits paired and labelled by their signals; an untraced kernel's lowering has none of it.

use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_conformance::dist_bench::{run_traced, DistCase};
use trident_core::ir::DType;
use trident_core::trace::EventKind;
use trident_kernels::trace::Timeline;

/// AG-GEMM and GEMM-RS at their small shapes in a CPU world of 2 ranks, on sm_90a's lowering
/// (the host's clock) and on the tile interpreter (the world's virtual time); AG-GEMM also at
/// world 1 on sm_90a (a rank with its device to itself: the persistent form's own chunk on the
/// GEMM's stream, `signalled_before`).
#[test]
fn traced_overlap_kernels_record_every_program() {
    trident_conformance::link_backends();
    for (name, simt, world) in [
        ("ag_gemm", Some("sm_90a"), 2),
        ("gemm_rs", Some("sm_90a"), 2),
        ("ag_gemm", None, 2),
        ("gemm_rs", None, 2),
        ("ag_gemm", Some("sm_90a"), 1),
    ] {
        let op = trident_conformance::registry::operations().into_iter().find(|o| o.name() == name).unwrap();
        let b = op.benchmark().unwrap();
        let case = DistCase { name: op.name(), dtype: DType::BF16, dims: b.small_shape(world), world };
        let opts = WorldOptions { simt_target: simt, ..WorldOptions::new(world, rand::random()) };
        let (c, seed) = (case.clone(), rand::random());
        let out = CpuWorld::run(opts, move |ctx| run_traced(ctx, &c, (1, seed), (1 << 12, 64)))
            .unwrap_or_else(|e| panic!("{} {simt:?}: {e}", case.key()));
        let ranks: Vec<_> = out.results.iter().map(|r| r.variants.clone()).collect();
        for r in &out.results {
            assert!(r.times.error <= 1e-2, "{}: error {}", case.key(), r.times.error);
        }
        let variants = &ranks[0];
        assert!(!variants.is_empty(), "{name}: no variant traced");
        for (variant, _) in variants {
            let timeline = Timeline::of(
                ranks.iter().map(|r| r.iter().find(|(n, _)| n == variant).map(|(_, l)| l.clone()).unwrap()),
            );
            // The copy-engine gather's copies, between their markers, on their streams.
            if variant.contains("_ce") || variant == "gather" {
                let copies = timeline.stream_spans();
                assert!(copies.iter().any(|c| c.2.starts_with("copy ")), "{name} {simt:?} {variant}: {copies:?}");
                assert!(copies.iter().all(|c| c.3 <= c.4), "{copies:?}");
            }
            if timeline.launches.iter().all(|l| l.stream_op.is_some()) {
                // A copy-engine variant launches no kernel.
                continue;
            }
            assert_eq!(timeline.dropped(), 0, "{name} {variant}");
            for l in timeline.launches.iter().filter(|l| l.stream_op.is_none()) {
                let mut programs: Vec<u32> = l.recorded.events.iter().map(|e| e.program).collect();
                programs.sort();
                programs.dedup();
                assert!(!programs.is_empty(), "{name} {variant} {}: no events", l.kernel);
                for p in programs {
                    let of = |k: EventKind| l.recorded.events.iter().filter(|e| e.program == p && e.kind == k).count();
                    // In the order recorded, and within the program's start and end (both stored
                    // at its end, in the slots its start reserved).
                    let at = |k: EventKind| l.recorded.events.iter().find(|e| e.program == p && e.kind == k);
                    let (start, end) = (at(EventKind::Start).map(|e| e.time_ns), at(EventKind::End).map(|e| e.time_ns));
                    let times: Vec<u64> = l
                        .recorded
                        .events
                        .iter()
                        .filter(|e| e.program == p && !matches!(e.kind, EventKind::Start | EventKind::End))
                        .map(|e| e.time_ns)
                        .collect();
                    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{name} {simt:?} {variant} p{p}: {times:?}");
                    let (lo, hi) = (times.first().copied().or(end), times.last().copied().or(start));
                    assert!(start <= lo && hi <= end, "{name} {simt:?} {variant} p{p}: {start:?} {times:?} {end:?}");
                    // A persistent program runs on one side per region: its start and end are
                    // the uniform code's.
                    assert_eq!(
                        (of(EventKind::Start), of(EventKind::End)),
                        (1, 1),
                        "{name} {variant} {} p{p}",
                        l.kernel
                    );
                    assert_eq!(of(EventKind::WaitBegin), of(EventKind::WaitEnd), "{name} {variant} {} p{p}", l.kernel);
                }
                for e in &l.recorded.events {
                    let label = &l.labels[e.label as usize];
                    match e.kind {
                        EventKind::WaitBegin | EventKind::WaitEnd => assert!(label.starts_with("wait %"), "{label}"),
                        EventKind::Notify => assert!(label.starts_with("notify %"), "{label}"),
                        _ => assert!(label.is_empty(), "{label}"),
                    }
                }
            }
            let (spans, tracks) = timeline.programs();
            assert!(spans.iter().all(|s| s.start_ns <= s.end_ns && s.track < tracks[s.rank].len()));
            assert_eq!(tracks.len(), world, "{name} {variant}: a track list per rank");
        }
        // The fused kernel waits for its peer's data (AG-GEMM) or signals it (GEMM-RS).
        let all: Vec<EventKind> = variants
            .iter()
            .flat_map(|(_, ls)| ls.iter().flat_map(|l| l.recorded.events.iter().map(|e| e.kind)))
            .collect();
        let kind = if name == "ag_gemm" { EventKind::WaitEnd } else { EventKind::Notify };
        assert!(all.contains(&kind), "{name} {simt:?}: no {kind:?} recorded");
    }
}

/// Tracing is a compile option: the untraced lowering has no clock, multiprocessor or trace
/// store; the traced one takes one more parameter and records.
#[test]
fn an_untraced_kernel_lowers_without_tracing() {
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let op = trident_kernels::gemm_rs::GemmRs::for_target(DType::BF16, Some(sm90a));
    let f = op.build_gemm(op.gemm.block_m).unwrap();
    let plain = trident_core::simt::lower(&f, sm90a).unwrap().to_string();
    let traced_f = trident_core::trace::instrument(f.clone());
    let traced = trident_core::simt::lower(&traced_f, sm90a).unwrap().to_string();
    assert!(!plain.contains("sm_id") && !plain.contains("__trace"));
    assert!(traced.contains("sm_id") && traced.contains("__trace") && traced.contains("clock"));
    assert_eq!(traced_f.params.len(), f.params.len() + 1);
    assert!(trident_core::text::print(&traced_f).contains("trace = true"));
}

/// The clock exchange (`Traced::measure_clocks`) in a CPU world of 4, on the interpreter and
/// on sm_90a's lowering: every rank other than 0 gets an offset; the ranks share one clock, so
/// each offset is zero to within its uncertainty (half the round trip) and a scheduler tick;
/// the exchange's launches are not kept in the timeline. `sync_clocks` does nothing there (one
/// device).
#[test]
fn clock_offsets_are_measured_between_ranks() {
    use trident_core::world::RankCtx;
    use trident_kernels::trace::Traced;
    trident_conformance::link_backends();
    for simt in [None, Some("sm_90a")] {
        let world = 4;
        let opts = WorldOptions { simt_target: simt, ..WorldOptions::new(world, rand::random()) };
        let out = CpuWorld::run(opts, move |ctx| {
            let traced = Traced::new(ctx, 64, 4)?;
            traced.sync_clocks()?;
            assert_eq!(traced.launch_count(), 0, "one device: no exchange");
            traced.measure_clocks()?;
            traced.measure_clocks()?;
            traced.synchronize()?;
            traced.collect()
        })
        .unwrap_or_else(|e| panic!("{simt:?}: {e}"));
        let timeline = Timeline::of(out.results.iter().cloned());
        assert!(timeline.launches.is_empty(), "{simt:?}: {:?}", timeline.launches);
        let ranks: Vec<usize> = timeline.clocks.iter().map(|c| c.rank).collect();
        assert_eq!(ranks, vec![1, 2, 3], "{simt:?}");
        for c in &timeline.clocks {
            // The world's virtual clock ticks 1000 ns per hand-over of the baton, and an event is
            // recorded when its rank next holds the baton: a tick of slack.
            assert!(c.offset_ns.unsigned_abs() <= c.uncertainty_ns + 1000, "{simt:?}: {c:?}");
        }
    }
}
