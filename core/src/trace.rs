//! Timelines of kernels: what a traced kernel records and how (issue 32).
//!
//! A kernel is traced by compiling it with [`instrument`]: one more parameter, the trace buffer
//! ([`PARAM`], `ptr<u64>`, the last of the kernel's own), and `LaunchAttrs::trace`. The SIMT
//! lowering then has one thread of each program (of each side of a warp-specialized region)
//! record an [`Event`] at the program's start and end, before and after each wait, after each
//! notify and at each persistent tile's epilogue; an untraced kernel has none of it (its code is
//! what it was before tracing existed).
//!
//! The buffer ([`buffer_bytes`]): [`HEADER_WORDS`] u64 words, the events reserved so far (every
//! event adds one with an atomic) and the capacity in events, written by the host ([`header`]);
//! then [`EVENT_WORDS`] u64 words per event:
//!
//! | word | bits |
//! |---|---|
//! | 0 | the clock in nanoseconds (`%globaltimer` on NVIDIA, `s_memrealtime` x 10 on AMD, the host's monotonic clock on cpu-simt) |
//! | 1 | program (linear id, low 32 bits), multiprocessor (`%smid`; AMD: the hardware id's CU, SH and SE bits) (high 32) |
//! | 2 | [`EventKind`] (bits 0..16), label (16..32: an index into [`labels`]), argument (32..64) |
//!
//! A full buffer drops the events past its capacity; the count still grows, so [`decode`] says
//! how many were dropped. A program's start and end share one reservation of two slots, both
//! stored at its end (`simt::trace`): a program that never reaches its end leaves two zero
//! slots, which [`decode`] skips (the host clears the buffer before a launch: [`header`]).
//! The argument is the signal's index from its parameter's address (a
//! chunk number, a tile's counter) for waits and notifies, the tile number for epilogues.

use crate::ir::{DType, Function, Op, OpKind, Param, Type, Value, ValueData, ValueDef};
use std::collections::HashMap;

/// Name of the trace buffer's parameter.
pub const PARAM: &str = "__trace";
/// u64 words before the first event: events reserved, capacity.
pub const HEADER_WORDS: usize = 2;
/// u64 words of one event.
pub const EVENT_WORDS: usize = 3;

/// What an event marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u16)]
pub enum EventKind {
    /// The program started (after its parameters are read).
    Start = 0,
    /// The program reached its end.
    End = 1,
    /// A wait began polling.
    WaitBegin = 2,
    /// The wait was satisfied.
    WaitEnd = 3,
    /// A notify was issued (after its release fence).
    Notify = 4,
    /// A persistent tile's epilogue began (its main loop done).
    Epilogue = 5,
}

impl EventKind {
    pub const ALL: [EventKind; 6] = [
        EventKind::Start,
        EventKind::End,
        EventKind::WaitBegin,
        EventKind::WaitEnd,
        EventKind::Notify,
        EventKind::Epilogue,
    ];

    pub fn from_code(code: u16) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| *k as u16 == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            EventKind::Start => "start",
            EventKind::End => "end",
            EventKind::WaitBegin => "wait begin",
            EventKind::WaitEnd => "wait end",
            EventKind::Notify => "notify",
            EventKind::Epilogue => "epilogue",
        }
    }
}

/// `f` compiled with a timeline: the trace buffer as its last parameter and
/// `LaunchAttrs::trace` set. A function already instrumented is returned as it is.
pub fn instrument(mut f: Function) -> Function {
    if f.attrs.trace {
        return f;
    }
    let index = f.params.len() as u32;
    let value = f.values.append(ValueData { ty: Type::ptr(DType::U64), def: ValueDef::Param(index) });
    f.params.push(Param { name: PARAM.to_string(), value, divisibility: Some(8) });
    f.attrs.trace = true;
    f
}

/// The labels of a traced kernel's events, by index: 0 is the empty label (start, end,
/// epilogue); then one per wait and notify op, in the order of the function's ops, named by
/// what it does and the parameter its signal comes from (`wait %chunk_ready`).
pub fn labels(f: &Function) -> Vec<String> {
    let mut out = vec![String::new()];
    out.extend(signal_ops(f).into_iter().map(|(_, label)| label));
    out
}

/// The label index of every wait and notify op of `f` (as [`labels`] numbers them).
pub fn label_indices(f: &Function) -> HashMap<Op, u16> {
    signal_ops(f).into_iter().enumerate().map(|(i, (op, _))| (op, (i + 1).min(u16::MAX as usize) as u16)).collect()
}

fn signal_ops(f: &Function) -> Vec<(Op, String)> {
    let name = |v: Value| match f.root_param(v, true) {
        Some(i) => format!("%{}", f.params[i as usize].name),
        None => "a signal".to_string(),
    };
    f.ops
        .iter()
        .filter_map(|(op, data)| match &data.kind {
            OpKind::Wait { sigs, .. } => Some((op, format!("wait {}", name(*sigs)))),
            OpKind::SignalWaitUntil { sig, .. } => Some((op, format!("wait {}", name(*sig)))),
            OpKind::Notify { sig, .. } => Some((op, format!("notify {}", name(*sig)))),
            _ => None,
        })
        .collect()
}

/// Bytes of a trace buffer of `capacity` events.
pub fn buffer_bytes(capacity: usize) -> usize {
    8 * (HEADER_WORDS + EVENT_WORDS * capacity)
}

/// The header a buffer of `capacity` events starts with before a launch (nothing recorded);
/// the events' words after it must be zero (a slot reserved and never stored reads as none).
pub fn header(capacity: usize) -> Vec<u8> {
    [0u64, capacity as u64].iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Event {
    pub time_ns: u64,
    /// Linear program id (`x + y nx + z nx ny`).
    pub program: u32,
    /// Multiprocessor (CU) the program ran on.
    pub sm: u32,
    pub kind: EventKind,
    /// Index into the kernel's [`labels`].
    pub label: u16,
    pub arg: u32,
}

/// What a buffer held after its launches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recorded {
    pub events: Vec<Event>,
    /// Events that did not fit.
    pub dropped: u64,
}

/// The events in a buffer read back from the device (as [`header`] and the lowering wrote it).
pub fn decode(bytes: &[u8]) -> Result<Recorded, String> {
    let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    if words.len() < HEADER_WORDS {
        return Err(format!("a trace buffer of {} bytes has no header ({} bytes)", bytes.len(), 8 * HEADER_WORDS));
    }
    let (reserved, capacity) = (words[0], words[1]);
    let fits = (words.len() - HEADER_WORDS) / EVENT_WORDS;
    if capacity as usize > fits {
        return Err(format!("the trace header says {capacity} events but the buffer holds {fits}"));
    }
    let n = reserved.min(capacity) as usize;
    let mut events = Vec::with_capacity(n);
    // (Slots reserved and never stored stay zero: a program that left before its end.)
    for e in words[HEADER_WORDS..].chunks_exact(EVENT_WORDS).take(n).filter(|e| e.iter().any(|w| *w != 0)) {
        let code = (e[2] & 0xffff) as u16;
        let kind = EventKind::from_code(code).ok_or_else(|| format!("unknown trace event kind {code}"))?;
        events.push(Event {
            time_ns: e[0],
            program: e[1] as u32,
            sm: (e[1] >> 32) as u32,
            kind,
            label: (e[2] >> 16) as u16,
            arg: (e[2] >> 32) as u32,
        });
    }
    Ok(Recorded { events, dropped: reserved.saturating_sub(capacity) })
}

/// The third word of an event (what the lowering stores, the argument added at run time).
pub fn kind_word(kind: EventKind, label: u16) -> u64 {
    kind as u64 | (label as u64) << 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_decodes_and_counts_what_it_dropped() {
        let mut bytes = header(2);
        bytes[..8].copy_from_slice(&3u64.to_le_bytes());
        let ev = |t: u64, p: u64, sm: u64, k: EventKind, l: u16, a: u64| [t, p | sm << 32, kind_word(k, l) | a << 32];
        for w in ev(100, 7, 3, EventKind::WaitBegin, 2, 5).into_iter().chain(ev(250, 7, 3, EventKind::End, 0, 0)) {
            bytes.extend(w.to_le_bytes());
        }
        assert_eq!(bytes.len(), buffer_bytes(2));
        let r = decode(&bytes).unwrap();
        assert_eq!(r.dropped, 1);
        assert_eq!(
            r.events[0],
            Event { time_ns: 100, program: 7, sm: 3, kind: EventKind::WaitBegin, label: 2, arg: 5 }
        );
        assert_eq!(r.events[1].kind, EventKind::End);
        assert!(decode(&bytes[..8]).is_err());
        assert!(decode(&header(4)).is_err());
        // A slot reserved and never stored (a program that left before its end) is no event.
        bytes[8 * HEADER_WORDS..8 * (HEADER_WORDS + EVENT_WORDS)].fill(0);
        let r = decode(&bytes).unwrap();
        assert_eq!((r.events.len(), r.events[0].kind, r.dropped), (1, EventKind::End, 1));
    }
}
