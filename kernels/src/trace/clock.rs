//! Clock offsets between ranks on different GPUs: each GPU's `%globaltimer` counts nanoseconds
//! on its own, and two GPUs' clocks can differ by microseconds, as much as the events a timeline
//! is meant to order. [`Traced::sync_clocks`](super::Traced::sync_clocks) measures them the way
//! NTP does, with a traced kernel ([`KERNEL`]): rank 0 exchanges a signal with every other rank
//! in turn, and both sides record, on their own clocks, when the signal arrived and when they
//! sent theirs:
//!
//! ```text
//! rank 0:  notify r at a0 ---------------------------> wait for r ends at b0
//! rank r:              wait ends at a1, notify 0 at b1 ---^
//! ```
//!
//! With `theta` rank r's clock minus rank 0's and one-way latencies `L` and `L'`:
//! `a1 - a0 = L + theta` and `b0 - b1 = L' - theta`, so `theta = ((a1 - a0) + (b1 - b0)) / 2` up
//! to half the difference of the latencies, which is at most half the round trip
//! `(b0 - a0) - (b1 - a1)`. Each event is recorded just after its operation on both sides, so
//! the recording's own delay cancels. Several rounds are run and, per rank, the one with the
//! shortest round trip is kept (the least disturbed), as NTP's clock filter does.

use super::Launch;
use trident_core::trace::EventKind;

/// The clock kernel's name.
pub const NAME: &str = "trace_clock";

/// Rounds of the exchange per synchronisation.
pub const ROUNDS: usize = 4;

/// The clock kernel: one program; rank 0 sets `sig[r]` on rank r to `epoch` and waits for
/// rank r to set its own `sig[r]` back, for r = 1 .. W-1 in turn; rank r waits for its `sig[r]`
/// and answers. Every event's argument is r (the signal's index), which pairs them up.
pub const KERNEL: &str = r#"kernel @trace_clock(%sig: !ptr<u64>, %epoch: u64) attributes {warps = 1, stages = 1, cooperative = false} {
  %me = rank : i32
  %w = num_ranks : i32
  %zero = const 0 : i32
  %one = const 1 : i32
  %leader = cmp eq %me, %zero : i1
  if %leader {
    for %r = %one to %w step %one {
      %slot = addptr %sig, %r : !ptr<u64>
      notify %slot, %r, %epoch, op set, scope intra_node
      %back = wait %slot, %one, cmp eq, %epoch, scope sys, sem relaxed : !token
    }
  } else {
    %mine = addptr %sig, %me : !ptr<u64>
    %came = wait %mine, %one, cmp eq, %epoch, scope sys, sem relaxed : !token
    notify %mine, %zero, %epoch, op set, scope intra_node
  }
  return
}
"#;

/// A rank's clock against rank 0's.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ClockOffset {
    pub rank: usize,
    /// The rank's clock minus rank 0's, in nanoseconds (subtracted from its events' times).
    pub offset_ns: i64,
    /// Half the kept round's round trip: the offset is exact to within this.
    pub uncertainty_ns: u64,
}

/// The offsets the clock kernel's launches in `launches` measured (the k-th clock launch of
/// every rank is one round), per rank other than 0 that took part; none where there were no
/// clock launches.
pub fn offsets(launches: &[Launch]) -> Vec<ClockOffset> {
    let rounds = |rank: usize| -> Vec<&Launch> {
        launches.iter().filter(|l| l.rank == rank && l.kernel == NAME && l.stream_op.is_none()).collect()
    };
    let leader = rounds(0);
    let time = |l: &Launch, kind: EventKind, arg: u32| {
        l.recorded.events.iter().find(|e| e.kind == kind && e.arg == arg).map(|e| e.time_ns as i128)
    };
    let ranks = launches.iter().map(|l| l.rank).max().unwrap_or(0);
    let mut out = Vec::new();
    for rank in 1..=ranks {
        let mut best: Option<ClockOffset> = None;
        for (zero, mine) in leader.iter().zip(rounds(rank)) {
            let r = rank as u32;
            let (Some(a0), Some(b0), Some(a1), Some(b1)) = (
                time(zero, EventKind::Notify, r),
                time(zero, EventKind::WaitEnd, r),
                time(mine, EventKind::WaitEnd, r),
                time(mine, EventKind::Notify, r),
            ) else {
                continue;
            };
            let round_trip = ((b0 - a0) - (b1 - a1)).max(0);
            let sample = ClockOffset {
                rank,
                offset_ns: (((a1 - a0) + (b1 - b0)) / 2) as i64,
                uncertainty_ns: (round_trip / 2) as u64,
            };
            if best.is_none_or(|b| sample.uncertainty_ns < b.uncertainty_ns) {
                best = Some(sample);
            }
        }
        out.extend(best);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use trident_core::trace::{Event, Recorded};

    fn launch(rank: usize, events: &[(u64, EventKind, u32)]) -> Launch {
        Launch {
            rank,
            index: 0,
            kernel: NAME.into(),
            labels: Vec::new(),
            recorded: Recorded {
                events: events
                    .iter()
                    .map(|&(time_ns, kind, arg)| Event { time_ns, program: 0, sm: 0, kind, label: 1, arg })
                    .collect(),
                dropped: 0,
            },
            stream_op: None,
        }
    }

    /// Rank 1's clock runs 5000 ns ahead of rank 0's, rank 2's 3000 behind; latencies 700 ns
    /// each way, but 900 back from rank 2 in its first round (which the second, tighter round
    /// replaces).
    #[test]
    fn offsets_come_from_the_tightest_round() {
        let (t1, t2) = (5000i64, -3000i64);
        let at = |t: i64, theta: i64| (t + theta) as u64;
        let round0 = launch(
            0,
            &[
                (10_000, EventKind::Notify, 1),
                (11_600, EventKind::WaitEnd, 1),
                (11_700, EventKind::Notify, 2),
                (13_500, EventKind::WaitEnd, 2),
            ],
        );
        // Rank 1 sees at 10_700 (rank 0's clock), answers at 10_900, arrives 11_600.
        let r1 = launch(1, &[(at(10_700, t1), EventKind::WaitEnd, 1), (at(10_900, t1), EventKind::Notify, 1)]);
        // Rank 2 sees at 12_400, answers 12_600, arrives 13_500 (900 back).
        let r2 = launch(2, &[(at(12_400, t2), EventKind::WaitEnd, 2), (at(12_600, t2), EventKind::Notify, 2)]);
        let round1 = launch(
            0,
            &[
                (20_000, EventKind::Notify, 1),
                (21_700, EventKind::WaitEnd, 1),
                (21_800, EventKind::Notify, 2),
                (23_300, EventKind::WaitEnd, 2),
            ],
        );
        // A second round with 800 ns each way for rank 1 (looser: the first is kept), 700 for
        // rank 2 (tighter: kept).
        let r1b = launch(1, &[(at(20_800, t1), EventKind::WaitEnd, 1), (at(20_900, t1), EventKind::Notify, 1)]);
        let r2b = launch(2, &[(at(22_500, t2), EventKind::WaitEnd, 2), (at(22_600, t2), EventKind::Notify, 2)]);
        let all = vec![round0, r1, r2, round1, r1b, r2b];
        let got = offsets(&all);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].rank, got[0].offset_ns, got[0].uncertainty_ns), (1, t1, 700));
        assert_eq!((got[1].rank, got[1].offset_ns, got[1].uncertainty_ns), (2, t2, 700));
        assert!(offsets(&[]).is_empty());
    }
}
