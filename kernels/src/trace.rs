//! Timelines of GPU kernels from host code (issue 32): a rank context that compiles every
//! kernel with tracing ([`Traced`]), and what its launches recorded ([`Timeline`]), exported as
//! a Perfetto / Chrome trace ([`perfetto`]) or drawn as an SVG ([`svg`]).
//!
//! ```text
//! let traced = Traced::new(ctx, 1 << 15, 64)?; // events per launch, launches
//! op.run(&traced, ...)?;                      // every kernel compiled with `+trace`
//! traced.synchronize()?;
//! let launches = traced.collect()?;           // this rank's launches and their events
//! ```
//!
//! Each launch gets its own buffer (`trident_core::trace` gives the format), made up front, so
//! an event is read with its kernel's labels and nothing is allocated while work is timed;
//! launches past the pool share one buffer of no capacity (their events count as dropped).
//!
//! The ranks of a loopback world share the GPU's clock. Ranks on different GPUs measure their
//! clocks against rank 0's ([`Traced::sync_clocks`], the exchange of [`clock`]), and
//! [`Timeline::of`] moves each rank's events onto rank 0's clock.

pub mod clock;
pub mod perfetto;
pub mod svg;

use std::sync::Mutex;
use trident_core::backend::{Artifact, BackendError, Buffer, KernelArg};
use trident_core::ir::CmpOp;
use trident_core::trace::{buffer_bytes, decode, header, instrument, labels, Recorded, EVENT_WORDS, HEADER_WORDS};
pub use clock::ClockOffset;
use trident_core::world::{RankCtx, StreamId};
use trident_core::{Function, VerifyError};

/// A rank context whose kernels record timelines; everything else is `inner`'s.
pub struct Traced<'a> {
    inner: &'a dyn RankCtx,
    /// The labels of every kernel compiled so far, by kernel name.
    labels: Mutex<Vec<(String, Vec<String>)>>,
    /// Buffers made up front (a launch takes the next: nothing is allocated or written while
    /// work is timed), headers written.
    pool: Vec<Buffer>,
    /// The launches so far and the buffer each took.
    launches: Mutex<Vec<(String, Buffer)>>,
    /// Stream operations: stream, what, and how they are timed.
    stream_ops: Mutex<Vec<(StreamId, String, Bracket)>>,
    /// Where the world keeps stream marks ([`RankCtx::stream_mark`]): the marker launched on
    /// stream 0 with its streams idle and the mark recorded after it, which puts the marks on
    /// the kernels' clock.
    reference: Mutex<Option<(usize, usize)>>,
    /// Where launches past the pool record nothing (a header of no capacity).
    overflow: Buffer,
    /// The marker kernel (compiled when the context is made: every rank at the same point of
    /// its host code, as worlds that compile collectively need).
    marker: Artifact,
    /// The clock exchange's state (made by the first [`Traced::measure_clocks`]).
    clock: Mutex<Option<ClockExchange>>,
}

/// Trace buffer `b` as a launch must find it: every event word zero, then the header of its
/// capacity (`trident_core::trace::header`).
fn clear(inner: &dyn RankCtx, b: &Buffer) -> Result<(), BackendError> {
    inner.fill(b, &[0])?;
    inner.write(b, 0, &header((b.bytes / 8 - HEADER_WORDS) / EVENT_WORDS))
}

/// How a stream operation is timed.
#[derive(Clone, Copy, Debug)]
enum Bracket {
    /// Timing marks (events: no multiprocessor needed) before and after it, and the launches
    /// before it (its place among them).
    Marks { at: usize, from: usize, to: usize },
    /// Marker kernels launched before and after it on its stream (worlds without marks: the
    /// CPU world).
    Markers { before: usize, after: usize },
}

/// What [`Traced::measure_clocks`] keeps between calls.
struct ClockExchange {
    kernel: Artifact,
    /// `[world]` u64 signals (symmetric).
    signals: Buffer,
    /// A trace buffer per round.
    rounds: Vec<Buffer>,
    /// The last round's epoch (what its signals carry).
    epoch: u64,
}

/// One launch's events, or one stream operation's.
#[derive(Clone, Debug)]
pub struct Launch {
    pub rank: usize,
    /// Order of the launch on its rank (a stream operation's: its first marker's).
    pub index: usize,
    /// The kernel, or what the stream operation did (`copy 4.0 MB`, `stream wait`).
    pub kernel: String,
    pub labels: Vec<String>,
    pub recorded: Recorded,
    /// A stream operation on this stream (`Start` and `End` events), not a kernel's programs:
    /// timed by the world's timing marks recorded before and after it on its stream (events:
    /// they need no multiprocessor), put on the kernels' clock by a marker kernel's end and a
    /// mark recorded right after it when the streams were idle (within a few microseconds);
    /// where the world has no marks, from the end of a marker kernel launched before it on the
    /// stream to the start of one launched after it.
    pub stream_op: Option<StreamId>,
}

/// The marker kernel's name: an empty traced kernel of one program, launched on stream 0
/// before the stream marks of a repetition (their place on the kernels' clock), or before and
/// after a copy or a stream wait where the world keeps no marks. (Marker kernels around a copy
/// need a multiprocessor: a kernel whose programs fill the GPU waiting for the copy's signal
/// would keep the second from ever running. Marks need none.)
pub const MARKER: &str = "trace_marker";

/// What every rank's launches recorded, on rank 0's clock.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub launches: Vec<Launch>,
    /// Each rank's clock against rank 0's, where it was measured (ranks on other GPUs); its
    /// events' times have been moved by it.
    pub clocks: Vec<ClockOffset>,
}

impl Timeline {
    /// The ranks' launches together (each rank's from [`Traced::collect`]): the clock
    /// exchange's launches, where [`Traced::sync_clocks`] ran them, give each rank's clock
    /// offset ([`clock::offsets`]), which is taken off its events' times; they are not kept.
    pub fn of(ranks: impl IntoIterator<Item = Vec<Launch>>) -> Timeline {
        let mut launches: Vec<Launch> = ranks.into_iter().flatten().collect();
        let clocks = clock::offsets(&launches);
        launches.retain(|l| l.kernel != clock::NAME);
        for c in &clocks {
            for l in launches.iter_mut().filter(|l| l.rank == c.rank) {
                for e in &mut l.recorded.events {
                    e.time_ns = (e.time_ns as i128 - c.offset_ns as i128).max(0) as u64;
                }
            }
        }
        Timeline { launches, clocks }
    }

    /// Events dropped by full buffers, over every launch.
    pub fn dropped(&self) -> u64 {
        self.launches.iter().map(|l| l.recorded.dropped).sum()
    }

    /// The smallest nonzero step between two event times (after alignment): an upper bound on
    /// the clock's granularity (`%globaltimer` advances in steps of its own, coarser than its
    /// nanosecond unit). `None` with fewer than two distinct times.
    pub fn clock_step_ns(&self) -> Option<u64> {
        let mut times: Vec<u64> = self.launches.iter().flat_map(|l| l.recorded.events.iter().map(|e| e.time_ns)).collect();
        times.sort_unstable();
        times.dedup();
        times.windows(2).map(|w| w[1] - w[0]).min()
    }

    /// The earliest event's time (the origin of exported times).
    pub fn origin_ns(&self) -> u64 {
        self.launches.iter().flat_map(|l| l.recorded.events.iter().map(|e| e.time_ns)).min().unwrap_or(0)
    }
}

impl<'a> Traced<'a> {
    /// `inner` with every kernel traced: `launches` buffers of `capacity` events each, made
    /// now; launches past them record nothing (their events count as dropped).
    pub fn new(inner: &'a dyn RankCtx, capacity: usize, launches: usize) -> Result<Traced<'a>, BackendError> {
        let made = |capacity: usize, name: &str| -> Result<Buffer, BackendError> {
            let b = inner.alloc(buffer_bytes(capacity), name)?;
            clear(inner, &b)?;
            Ok(b)
        };
        let pool = (0..launches).map(|_| made(capacity, "__trace")).collect::<Result<Vec<_>, _>>()?;
        let marker = inner.compile(&format!("{MARKER}+trace"), &|| {
            let attrs = trident_core::ir::LaunchAttrs { warps: 1, ..Default::default() };
            Ok(instrument(trident_core::KernelBuilder::new(MARKER, attrs).finish()?))
        })?;
        let traced = Traced {
            inner,
            labels: Mutex::new(vec![(MARKER.to_string(), vec![String::new()])]),
            pool,
            launches: Mutex::new(Vec::new()),
            stream_ops: Mutex::new(Vec::new()),
            reference: Mutex::new(None),
            overflow: made(0, "__trace_overflow")?,
            marker,
            clock: Mutex::new(None),
        };
        traced.mark_reference()?;
        Ok(traced)
    }

    /// With this rank's streams idle: where the world keeps stream marks, the marker kernel on
    /// stream 0 and a mark right after it (the marks' place on the kernels' clock), waited for.
    fn mark_reference(&self) -> Result<(), BackendError> {
        // (A first mark asks whether there are any: nothing is launched where there are not.)
        if self.inner.stream_mark(0)?.is_none() {
            return Ok(());
        }
        let launch = self.marker(0)?;
        let mark = self.inner.stream_mark(0)?;
        *self.reference.lock().unwrap_or_else(|e| e.into_inner()) = mark.map(|m| (launch, m));
        self.inner.synchronize()
    }

    /// Collective (every rank, at the same point of its host code): where the ranks are on more
    /// than one device, measures this rank's clock against rank 0's ([`Traced::measure_clocks`]);
    /// nothing where they all share one (one clock), unless `TRIDENT_TRACE_CLOCKS=always` (to
    /// see the exchange's bound on one GPU). Call it after the work to trace, before
    /// [`Traced::collect`].
    pub fn sync_clocks(&self) -> Result<(), BackendError> {
        let w = self.inner.world_size();
        let always = std::env::var("TRIDENT_TRACE_CLOCKS").is_ok_and(|v| v == "always");
        if w == 1 || (self.inner.ranks_sharing_device() >= w && !always) {
            return Ok(());
        }
        self.measure_clocks()
    }

    /// Collective: [`clock::ROUNDS`] launches of the clock exchange ([`clock::KERNEL`]) on
    /// stream 0, after this rank's work so far, recorded like any launch (into buffers of their
    /// own, not the pool's); returns once they are done. [`Timeline::of`] turns them into
    /// offsets.
    pub fn measure_clocks(&self) -> Result<(), BackendError> {
        let w = self.inner.world_size();
        let mut state = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        if state.is_none() {
            let f = trident_core::text::parse(clock::KERNEL)
                .map_err(|e| BackendError::Host(format!("the clock kernel: {e}")))?;
            // Traced like every kernel of this context (its labels recorded).
            let kernel = self.compile(clock::NAME, &|| Ok(f.clone()))?;
            let signals = self.inner.symm_alloc(8 * w, "__trace_clock")?;
            let rounds = (0..clock::ROUNDS)
                .map(|_| self.inner.alloc(buffer_bytes(4 * w), "__trace_clock_events"))
                .collect::<Result<Vec<_>, _>>()?;
            *state = Some(ClockExchange { kernel, signals, rounds, epoch: 0 });
        }
        let Some(x) = state.as_mut() else { return Ok(()) };
        self.inner.synchronize()?;
        for b in &x.rounds {
            clear(self.inner, b)?;
        }
        // Every rank's signals exist (zeroed) before any rank's exchange writes a peer's.
        self.inner.barrier()?;
        for b in &x.rounds {
            x.epoch += 1;
            let args = [KernelArg::Ptr(x.signals.address), KernelArg::u64(x.epoch), KernelArg::Ptr(b.address)];
            self.inner.launch(0, &x.kernel, [1, 1, 1], &args)?;
            self.launches.lock().unwrap_or_else(|e| e.into_inner()).push((x.kernel.kernel.clone(), b.clone()));
        }
        self.inner.synchronize()
    }

    /// Forgets the launches so far and empties their buffers, so that the next launches record
    /// from the pool's first buffer on (between repetitions, with this rank's streams idle).
    pub fn reset(&self) -> Result<(), BackendError> {
        let mut launches = self.launches.lock().unwrap_or_else(|e| e.into_inner());
        for b in self.pool.iter().take(launches.len()) {
            clear(self.inner, b)?;
        }
        self.inner.write(&self.overflow, 0, &header(0))?;
        launches.clear();
        drop(launches);
        self.stream_ops.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.inner.clear_marks();
        self.mark_reference()
    }

    /// Launches traced so far.
    pub fn launch_count(&self) -> usize {
        self.launches.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// This rank's launches so far with their events (after a `synchronize`): the kernels', and
    /// each stream operation's from its two markers.
    pub fn collect(&self) -> Result<Vec<Launch>, BackendError> {
        let launches = self.launches.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let labels = self.labels.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut read = Vec::with_capacity(launches.len());
        for (index, (kernel, buffer)) in launches.iter().enumerate() {
            let mut bytes = vec![0u8; buffer.bytes];
            self.inner.read(buffer, 0, &mut bytes)?;
            read.push(
                decode(&bytes).map_err(|e| BackendError::Host(format!("the trace of `{kernel}` launch {index}: {e}")))?,
            );
        }
        let rank = self.inner.rank();
        let mut out: Vec<Launch> = launches
            .iter()
            .zip(&read)
            .enumerate()
            .filter(|(_, ((kernel, _), _))| kernel != MARKER)
            .map(|(index, ((kernel, _), recorded))| Launch {
                rank,
                index,
                kernel: kernel.clone(),
                labels: labels.iter().find(|(k, _)| k == kernel).map(|(_, l)| l.clone()).unwrap_or_default(),
                recorded: recorded.clone(),
                stream_op: None,
            })
            .collect();
        use trident_core::trace::{Event, EventKind};
        let at = |launch: usize, kind: EventKind| {
            read.get(launch).and_then(|r| r.events.iter().find(|e| e.kind == kind)).cloned()
        };
        let reference = *self.reference.lock().unwrap_or_else(|e| e.into_inner());
        for (stream, what, bracket) in self.stream_ops.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let (index, from, to) = match (*bracket, reference) {
                // The marks' times from the reference mark, on the reference marker's end.
                (Bracket::Marks { at: index, from, to }, Some((launch, mark))) => {
                    let Some(origin) = at(launch, EventKind::End) else { continue };
                    let ns = |m: usize| -> Result<u64, BackendError> {
                        let ms = self.inner.marks_elapsed_ms(mark, m)?;
                        Ok((origin.time_ns as f64 + ms * 1e6).max(0.0) as u64)
                    };
                    (index, Event { time_ns: ns(from)?, ..origin.clone() }, Event { time_ns: ns(to)?, ..origin })
                }
                // From the first marker's end to the second's start, on the first's
                // multiprocessor.
                (Bracket::Markers { before, after }, _) => {
                    let (Some(from), Some(to)) = (at(before, EventKind::End), at(after, EventKind::Start)) else {
                        continue;
                    };
                    (before, from, to)
                }
                (Bracket::Marks { .. }, None) => continue,
            };
            let events = vec![
                Event { kind: EventKind::Start, ..from.clone() },
                Event { kind: EventKind::End, time_ns: to.time_ns.max(from.time_ns), ..from },
            ];
            out.push(Launch {
                rank,
                index,
                kernel: what.clone(),
                labels: vec![String::new()],
                recorded: Recorded { events, dropped: 0 },
                stream_op: Some(*stream),
            });
        }
        out.sort_by_key(|l| l.index);
        Ok(out)
    }

    /// Launches the marker kernel on `stream`; its launch's index.
    fn marker(&self, stream: StreamId) -> Result<usize, BackendError> {
        self.launch(stream, &self.marker, [1, 1, 1], &[])?;
        Ok(self.launch_count() - 1)
    }

    /// `op` on `stream` between two timing marks (or, where the world keeps none, two marker
    /// kernels), noted as `what`.
    fn bracketed(
        &self,
        stream: StreamId,
        what: String,
        op: impl FnOnce() -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let marks = self.reference.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        let bracket = match marks {
            true => {
                let at = self.launch_count();
                let from = self.inner.stream_mark(stream)?;
                op()?;
                let to = self.inner.stream_mark(stream)?;
                let (Some(from), Some(to)) = (from, to) else {
                    return Err(BackendError::Host("the world stopped keeping stream marks".into()));
                };
                Bracket::Marks { at, from, to }
            }
            false => {
                let before = self.marker(stream)?;
                op()?;
                Bracket::Markers { before, after: self.marker(stream)? }
            }
        };
        self.stream_ops.lock().unwrap_or_else(|e| e.into_inner()).push((stream, what, bracket));
        Ok(())
    }

    /// The buffer the next launch of `kernel` records into.
    fn buffer_for(&self, kernel: &str) -> Buffer {
        let mut launches = self.launches.lock().unwrap_or_else(|e| e.into_inner());
        let b = self.pool.get(launches.len()).unwrap_or(&self.overflow).clone();
        launches.push((kernel.to_string(), b.clone()));
        b
    }
}

impl RankCtx for Traced<'_> {
    trident_core::forward_rank_ctx!(identity, memory, gpu_target, capturing, write_signal);
    trident_core::forward_rank_ctx!(synchronize, barrier, rearm_barrier_all, follow_stream, join_stream);
    fn compile(&self, key: &str, build: &dyn Fn() -> Result<Function, VerifyError>) -> Result<Artifact, BackendError> {
        // The labels come from the function the artifact is built from (the artifact keeps its
        // signature, not its ops): taken as it is built, or, when the world's kernel cache
        // already held it (an earlier `Traced` of the same rank), from building it again.
        let built = Mutex::new(None);
        let artifact = self.inner.compile(&format!("{key}+trace"), &|| {
            let f = instrument(build()?);
            *built.lock().unwrap_or_else(|e| e.into_inner()) = Some(labels(&f));
            Ok(f)
        })?;
        let mut labels_of = self.labels.lock().unwrap_or_else(|e| e.into_inner());
        if !labels_of.iter().any(|(k, _)| *k == artifact.kernel) {
            let l = match built.into_inner().unwrap_or_else(|e| e.into_inner()) {
                Some(l) => l,
                None => labels(&instrument(build().map_err(|e| BackendError::Host(e.to_string()))?)),
            };
            labels_of.push((artifact.kernel.clone(), l));
        }
        Ok(artifact)
    }
    fn launch(&self, stream: StreamId, kernel: &Artifact, grid: [u32; 3], args: &[KernelArg]) -> Result<(), BackendError> {
        if !kernel.attrs.trace {
            return self.inner.launch(stream, kernel, grid, args);
        }
        let buffer = self.buffer_for(&kernel.kernel);
        let mut all = args.to_vec();
        all.push(KernelArg::Ptr(buffer.address));
        self.inner.launch(stream, kernel, grid, &all)
    }
    fn copy(
        &self,
        stream: StreamId,
        dst: &Buffer,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), BackendError> {
        let what = format!("copy {:.2} MB", bytes as f64 / 1e6);
        self.bracketed(stream, what, || self.inner.copy(stream, dst, dst_offset, src, src_offset, bytes))
    }
    fn wait_signal(
        &self,
        stream: StreamId,
        signal: &Buffer,
        offset: usize,
        cmp: CmpOp,
        value: u64,
    ) -> Result<(), BackendError> {
        self.bracketed(stream, format!("stream wait {cmp} {value}"), || {
            self.inner.wait_signal(stream, signal, offset, cmp, value)
        })
    }
}

/// One program of one launch, from its events: what [`perfetto`] and [`svg`] draw.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramSpan {
    pub rank: usize,
    /// Index into [`Timeline::launches`].
    pub launch: usize,
    pub program: u32,
    pub sm: u32,
    /// Track of the program on its rank: programs of one multiprocessor that overlap in time
    /// get different slots ([`Timeline::programs`] numbers the tracks per rank).
    pub track: usize,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Waits: label, argument, begun, satisfied.
    pub waits: Vec<(u16, u32, u64, u64)>,
    /// Notifies: label, argument, time.
    pub notifies: Vec<(u16, u32, u64)>,
    /// Persistent tiles: tile number, main loop begun (the previous epilogue or the start),
    /// epilogue begun.
    pub tiles: Vec<(u32, u64, u64)>,
}

/// A track of a rank: a multiprocessor's resident slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Track {
    pub rank: usize,
    pub sm: u32,
    pub slot: usize,
}

impl Timeline {
    /// Every program's span and events, and the tracks they are placed on (per rank, by
    /// multiprocessor, then slot; a program's track is its index among its rank's).
    pub fn programs(&self) -> (Vec<ProgramSpan>, Vec<Vec<Track>>) {
        use trident_core::trace::EventKind;
        let mut spans: Vec<ProgramSpan> = Vec::new();
        for (li, l) in self.launches.iter().enumerate().filter(|(_, l)| l.stream_op.is_none()) {
            let mut by_program: std::collections::BTreeMap<u32, Vec<&trident_core::trace::Event>> = Default::default();
            for e in &l.recorded.events {
                by_program.entry(e.program).or_default().push(e);
            }
            for (program, mut events) in by_program {
                events.sort_by_key(|e| e.time_ns);
                let (first, last) = (events[0].time_ns, events[events.len() - 1].time_ns);
                let start = events.iter().find(|e| e.kind == EventKind::Start).map_or(first, |e| e.time_ns);
                let end = events.iter().rev().find(|e| e.kind == EventKind::End).map_or(last, |e| e.time_ns);
                let mut span = ProgramSpan {
                    rank: l.rank,
                    launch: li,
                    program,
                    sm: events[0].sm,
                    track: 0,
                    start_ns: start,
                    end_ns: end.max(start),
                    waits: Vec::new(),
                    notifies: Vec::new(),
                    tiles: Vec::new(),
                };
                let mut open: Vec<&trident_core::trace::Event> = Vec::new();
                let mut tile_from = start;
                for e in &events {
                    match e.kind {
                        EventKind::WaitBegin => open.push(e),
                        EventKind::WaitEnd => {
                            if let Some(i) = open.iter().rposition(|b| b.label == e.label && b.arg == e.arg) {
                                let b = open.remove(i);
                                span.waits.push((e.label, e.arg, b.time_ns, e.time_ns));
                            }
                        }
                        EventKind::Notify => span.notifies.push((e.label, e.arg, e.time_ns)),
                        EventKind::Epilogue => {
                            span.tiles.push((e.arg, tile_from, e.time_ns));
                            tile_from = e.time_ns;
                        }
                        EventKind::Start | EventKind::End => {}
                    }
                }
                // A wait that never ended (the program stopped in it) lasts to the span's end.
                span.waits.extend(open.iter().map(|b| (b.label, b.arg, b.time_ns, span.end_ns)));
                spans.push(span);
            }
        }
        // Tracks: per rank and multiprocessor, the lowest slot free when the program starts.
        spans.sort_by_key(|s| (s.rank, s.sm, s.start_ns, s.launch, s.program));
        let ranks = spans.iter().map(|s| s.rank + 1).max().unwrap_or(0);
        let mut tracks: Vec<Vec<Track>> = vec![Vec::new(); ranks];
        let mut free_at: std::collections::HashMap<(usize, u32), Vec<u64>> = Default::default();
        for s in &mut spans {
            let slots = free_at.entry((s.rank, s.sm)).or_default();
            let slot = match slots.iter().position(|&t| t <= s.start_ns) {
                Some(i) => i,
                None => {
                    slots.push(0);
                    slots.len() - 1
                }
            };
            slots[slot] = s.end_ns;
            let track = Track { rank: s.rank, sm: s.sm, slot };
            s.track = match tracks[s.rank].iter().position(|t| *t == track) {
                Some(i) => i,
                None => {
                    tracks[s.rank].push(track);
                    tracks[s.rank].len() - 1
                }
            };
        }
        // Tracks in (multiprocessor, slot) order, programs renumbered to match.
        for (rank, list) in tracks.iter_mut().enumerate() {
            let mut order: Vec<usize> = (0..list.len()).collect();
            order.sort_by_key(|&i| (list[i].sm, list[i].slot));
            let mut new_index = vec![0; list.len()];
            for (new, &old) in order.iter().enumerate() {
                new_index[old] = new;
            }
            for s in spans.iter_mut().filter(|s| s.rank == rank) {
                s.track = new_index[s.track];
            }
            *list = order.iter().map(|&i| list[i].clone()).collect();
        }
        (spans, tracks)
    }

    /// Of every kernel's program time (start to end, summed over programs), the share spent in
    /// waits, by kernel name in order of first launch: how much of an overlap kernel's time its
    /// programs idled for peers' data.
    pub fn wait_shares(&self) -> Vec<(String, f64)> {
        let (spans, _) = self.programs();
        let mut out: Vec<(String, u64, u64)> = Vec::new();
        for s in &spans {
            let name = &self.launches[s.launch].kernel;
            let waited: u64 = s.waits.iter().map(|w| w.3.saturating_sub(w.2)).sum();
            let total = s.end_ns - s.start_ns;
            match out.iter_mut().find(|(n, _, _)| n == name) {
                Some(e) => {
                    e.1 += waited;
                    e.2 += total;
                }
                None => out.push((name.clone(), waited, total)),
            }
        }
        out.into_iter().map(|(n, w, t)| (n, if t == 0 { 0.0 } else { w as f64 / t as f64 })).collect()
    }

    /// Every stream operation: rank, stream, what, start, end (from its markers).
    pub fn stream_spans(&self) -> Vec<(usize, StreamId, &str, u64, u64)> {
        self.launches
            .iter()
            .filter_map(|l| {
                let s = l.stream_op?;
                let (a, b) = (l.recorded.events.first()?, l.recorded.events.last()?);
                Some((l.rank, s, l.kernel.as_str(), a.time_ns, b.time_ns))
            })
            .collect()
    }

    /// The label text of `label` in launch `launch`.
    pub fn label(&self, launch: usize, label: u16) -> &str {
        self.launches.get(launch).and_then(|l| l.labels.get(label as usize)).map_or("", |s| s.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trident_core::trace::{Event, EventKind};

    fn ev(time_ns: u64, program: u32, sm: u32, kind: EventKind, label: u16, arg: u32) -> Event {
        Event { time_ns, program, sm, kind, label, arg }
    }

    /// Two programs of one multiprocessor that overlap get two slots; a third after the first
    /// reuses its slot; waits pair up, tiles run from epilogue to epilogue.
    #[test]
    fn programs_get_tracks_and_their_phases() {
        let events = vec![
            ev(0, 0, 5, EventKind::Start, 0, 0),
            ev(10, 0, 5, EventKind::WaitBegin, 1, 3),
            ev(30, 0, 5, EventKind::WaitEnd, 1, 3),
            ev(60, 0, 5, EventKind::Epilogue, 0, 7),
            ev(90, 0, 5, EventKind::Epilogue, 0, 9),
            ev(100, 0, 5, EventKind::End, 0, 0),
            ev(50, 1, 5, EventKind::Start, 0, 0),
            ev(70, 1, 5, EventKind::Notify, 2, 1),
            ev(120, 1, 5, EventKind::End, 0, 0),
            ev(105, 2, 5, EventKind::Start, 0, 0),
            ev(110, 2, 5, EventKind::End, 0, 0),
        ];
        let launch = Launch {
            rank: 0,
            index: 0,
            kernel: "k".into(),
            labels: vec!["".into(), "wait %ready".into(), "notify %done".into()],
            recorded: trident_core::trace::Recorded { events, dropped: 0 },
            stream_op: None,
        };
        let t = Timeline::of([vec![launch]]);
        let (spans, tracks) = t.programs();
        assert_eq!(tracks[0].len(), 2);
        let p = |n: u32| spans.iter().find(|s| s.program == n).unwrap();
        assert_eq!((p(0).start_ns, p(0).end_ns, p(0).track), (0, 100, 0));
        assert_eq!(p(1).track, 1);
        assert_eq!(p(2).track, 0);
        assert_eq!(p(0).waits, vec![(1, 3, 10, 30)]);
        assert_eq!(p(0).tiles, vec![(7, 0, 60), (9, 60, 90)]);
        assert_eq!(p(1).notifies, vec![(2, 1, 70)]);
        assert_eq!(t.label(0, 1), "wait %ready");
        assert_eq!(t.clock_step_ns(), Some(5));
        // Programs 0..2 run 100 + 70 + 5 ns, of which 20 in a wait.
        let shares = t.wait_shares();
        assert_eq!(shares.len(), 1);
        assert!((shares[0].1 - 20.0 / 175.0).abs() < 1e-12, "{shares:?}");
    }
}
