//! A host-side log of kernel launches, for protocol hangs that depend on when each rank's host
//! thread launched (`TRIDENT_LOG_LAUNCHES=1`): one line per launch on stderr with the time since
//! the process's first launch, the rank, stream and kernel, how long its first-launch meeting
//! took and whether every rank of the device came (`crate::first_launch`), and how long the
//! driver's launch call took. Off by default; when off, a launch costs two clock reads (the
//! times it would log) and the switch's load.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

static ON: OnceLock<bool> = OnceLock::new();
static START: OnceLock<Instant> = OnceLock::new();

/// The line of one launch (`met`: the first-launch meeting's outcome, where there was one).
pub fn line(
    at: Duration,
    rank: usize,
    stream: usize,
    kernel: &str,
    met: Option<bool>,
    meet: Duration,
    call: Duration,
) -> String {
    let meeting = match met {
        Some(true) => format!(", first launch: every rank met in {:.3} ms", meet.as_secs_f64() * 1e3),
        Some(false) => format!(", first launch: went on without every rank after {:.3} ms", meet.as_secs_f64() * 1e3),
        None => String::new(),
    };
    format!(
        "launch {:>10.3} ms: rank {rank} stream {stream} `{kernel}`{meeting}, driver call {:.3} ms",
        at.as_secs_f64() * 1e3,
        call.as_secs_f64() * 1e3
    )
}

/// Logs one launch when `TRIDENT_LOG_LAUNCHES=1`.
pub fn note(rank: usize, stream: usize, kernel: &str, met: Option<bool>, meet: Duration, call: Duration) {
    if !crate::env_switch(&ON, "TRIDENT_LOG_LAUNCHES") {
        return;
    }
    let at = START.get_or_init(Instant::now).elapsed();
    eprintln!("{}", line(at, rank, stream, kernel, met, meet, call));
}

#[cfg(test)]
mod tests {
    use super::line;
    use std::time::Duration;

    #[test]
    fn a_line_names_rank_stream_kernel_meeting_and_call() {
        let ms = Duration::from_millis;
        let l = line(ms(12), 3, 0, "allgather_ll_512", Some(false), ms(200), ms(2));
        assert!(l.contains("rank 3 stream 0 `allgather_ll_512`"), "{l}");
        assert!(l.contains("went on without every rank after 200.000 ms"), "{l}");
        assert!(l.contains("driver call 2.000 ms"), "{l}");
        assert!(!line(ms(1), 0, 1, "k", None, ms(0), ms(0)).contains("first launch"));
    }
}
