//! The watchdog of stream waits.
//!
//! A stream wait (`cuStreamWaitValue64`, `hipStreamWaitValue64`) has no timeout of its own, so
//! `synchronize` is its watchdog: it polls a rank's streams up to a bound; a stream still
//! blocked then has its unsatisfied waits named (rank, stream, signal buffer and index,
//! expected, seen) and released (the host writes the awaited value from the device's release
//! stream, so the device drains and the process can go on), and the call fails with that
//! diagnostic. A stream busy with no wait to release (a kernel that never ends) is named with
//! what it was given since the last `synchronize`.

use crate::driver::{Driver, RawStream};
use std::time::{Duration, Instant};
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::CmpOp;
use trident_core::world::StreamId;

/// A `wait_signal` as the watchdog needs it.
#[derive(Clone, Debug)]
pub struct StreamWait {
    pub stream: StreamId,
    pub signal: String,
    pub index: usize,
    pub address: u64,
    pub cmp: CmpOp,
    pub value: u64,
}

/// How long [`drain`] polls without sleeping: a sleep lasts at least the kernel's timer slack
/// (50 us on Linux), which every short operation (a small AllReduce: 10-20 us of GPU time)
/// would otherwise pay (measured on the H200: 93 us per AllReduce of 8 KB at world 1, against
/// 24 us for NCCL's through PyTorch). 20 ms covers every operation of the benchmarks: with a
/// 200 us spin and naps doubling to 2 ms, a GEMM that ended at 1.25 ms was seen at 1.9 ms and
/// one that ended at 5.3 ms at 5.4 or 7.5 ms by turns (`results/h200-issue13/drain-*`), as
/// `cudaStreamSynchronize` under the spinning schedule (what PyTorch's timing sees) does not.
const SPIN: Duration = Duration::from_millis(20);

/// The nap between polls after [`SPIN`]: short, so that a long operation is seen within about
/// a tenth of a millisecond of its end, and a stuck stream (waited for up to the bound, seconds)
/// costs a few thousand wake-ups a second.
const NAP: Duration = Duration::from_micros(100);

/// Polls `s` until it is idle (true) or `deadline` passed (false): without sleeping for the
/// first [`SPIN`], then every [`NAP`].
pub fn drain(dev: &dyn Driver, s: RawStream, deadline: Instant) -> Result<bool, BackendError> {
    let start = Instant::now();
    loop {
        if dev.stream_idle(s)? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        if now - start < SPIN {
            std::thread::yield_now();
            continue;
        }
        std::thread::sleep(NAP);
    }
}

/// How long a single-device launch or a benchmark's batch may run before waiting for it gives
/// up (benchmarks enqueue batches of seconds).
pub const FINISH_BOUND: Duration = Duration::from_secs(60);

/// Waits for `stream` of `dev` at most `bound`. Work still running then (a kernel that never
/// ends) leaves the device unusable, since its later work would queue behind it, and is an
/// error naming `what` was waited for.
pub fn finish(dev: &dyn Driver, stream: RawStream, bound: Duration, what: &str) -> Result<(), BackendError> {
    dev.health().check(&dev.device_name())?;
    if drain(dev, stream, Instant::now() + bound)? {
        return Ok(());
    }
    let why = format!("{what} still running after {bound:?} (a kernel that never ends?)");
    dev.health().wedge(why.clone());
    Err(BackendError::Host(format!("{}: {why}", dev.device_name())))
}

/// The 64-bit word at `address`, read now (a synchronous copy that does not wait for a stream
/// that is stuck).
fn word(dev: &dyn Driver, address: u64) -> Result<u64, BackendError> {
    let mut raw = [0u8; 8];
    let b = Buffer { name: "(watchdog)".into(), address, bytes: 8 };
    dev.read(&b, 0, &mut raw)?;
    Ok(u64::from_le_bytes(raw))
}

/// The verdict on stream `id` of `rank`, still busy after `bound`: names its unsatisfied waits
/// among `pending` (or, with none, what the stream was given: `busy`), releases them from the
/// device's release stream, and drains `streams` (another `bound` at most).
pub fn release_stuck(
    dev: &dyn Driver,
    rank: usize,
    id: StreamId,
    pending: &[StreamWait],
    streams: &[RawStream],
    bound: Duration,
    busy: &str,
) -> BackendError {
    let mut blocked = Vec::new();
    for w in pending.iter().filter(|w| w.stream == id) {
        match word(dev, w.address) {
            Ok(v) if w.cmp.holds(v, w.value) => {}
            Ok(v) => blocked.push((w, v)),
            Err(e) => return e,
        }
    }
    let what = match blocked.first() {
        Some((w, seen)) => format!(
            "stream wait timed out after {bound:?} on rank {rank}, stream {id}: signal `{}`[{}] expected {} {}, seen {seen}; the wait was released and the stream drained",
            w.signal, w.index, w.cmp, w.value
        ),
        None => format!(
            "rank {rank}, stream {id} still busy after {bound:?} with no unsatisfied stream wait ({busy}): a kernel longer than the bound, or one that never ends"
        ),
    };
    // The release stream's work does not queue behind the world's streams, so the awaited
    // values land even when every queue of the world is blocked.
    let helper = dev.release_stream();
    for (w, _) in &blocked {
        let _ = dev.write_value(helper, w.address, w.value);
    }
    let later = Instant::now() + bound;
    let _ = drain(dev, helper, later);
    for s in streams {
        let _ = drain(dev, *s, later);
    }
    if blocked.is_empty() {
        return BackendError::Host(what);
    }
    BackendError::Execution {
        kernel: format!("stream {id} of rank {rank}"),
        program: [0; 3],
        op: "wait_signal".into(),
        loc: None,
        message: what,
    }
}
