//! The CPU device's memory: buffers of atomic 64-bit words.
//!
//! Kernels race by design (flag-in-data protocols, signals), and a data race on plain Rust memory
//! is undefined behaviour, so every buffer is a slice of `AtomicU64` and every access is an
//! atomic one of the element's size inside its word. Addresses are `(slot + 1) << 40 | offset`:
//! a pointer names its buffer, so every access is checked against that buffer's bounds.
//!
//! In a world (many ranks), memory is also *versioned*: while programs run, every published
//! write keeps the word's earlier values with the global time they became visible and who wrote
//! them. A program reads the newest version published no later than its last acquire (or
//! written by itself), so a reader that skipped an acquire sees stale data, as the memory model
//! allows, instead of whatever happened to be there. The writer of a signal's value is also what
//! tells the runtime that a program waited on a sibling of its own independent launch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

/// Who published a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writer {
    /// A unique id of the program instance, stream or host (0 for the host).
    pub task: u64,
    /// The launch the writing program belongs to (0 outside launches).
    pub launch: u64,
    pub rank: u32,
    pub program: [u32; 3],
}

impl Writer {
    pub const HOST: Writer = Writer { task: 0, launch: 0, rank: u32::MAX, program: [0; 3] };
}

#[derive(Clone, Copy, Debug)]
struct Version {
    time: u64,
    word: u64,
    writer: Writer,
}

/// Versions kept per word; older ones are dropped (a reader then sees a newer value, which the
/// memory model always allows).
const MAX_VERSIONS: usize = 32;

const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// Largest buffer (1 TiB: the offset field).
pub const MAX_BUFFER_BYTES: usize = 1 << OFFSET_BITS;

pub struct Region {
    pub name: String,
    pub bytes: usize,
    words: Box<[AtomicU64]>,
    history: Mutex<HashMap<usize, Vec<Version>>>,
    has_history: AtomicBool,
}

impl Region {
    fn new(name: &str, bytes: usize) -> Region {
        let words = (0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        Region {
            name: name.to_string(),
            bytes,
            words,
            history: Mutex::new(HashMap::new()),
            has_history: AtomicBool::new(false),
        }
    }

    fn extract(word: u64, offset: usize, size: usize) -> u64 {
        if size == 8 {
            return word;
        }
        (word >> ((offset % 8) * 8)) & ((1u64 << (size * 8)) - 1)
    }

    /// The element as a program with acquire time `acquired` (task `me`) may see it.
    pub fn load_visible(&self, offset: usize, size: usize, acquired: u64, me: u64) -> u64 {
        if !self.has_history.load(Ordering::Acquire) {
            return self.load(offset, size);
        }
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        match h.get(&(offset / 8)) {
            None => self.load(offset, size),
            Some(vs) => {
                let v = vs.iter().rev().find(|v| v.time <= acquired || v.writer.task == me).unwrap_or(&vs[0]);
                Self::extract(v.word, offset, size)
            }
        }
    }

    /// Makes `size` bytes at `offset` visible at `time`, recording the version when `record`.
    pub fn publish(&self, offset: usize, size: usize, bits: u64, time: u64, writer: Writer, record: bool) {
        self.rmw_publish(offset, size, |_| bits, time, writer, record);
    }

    /// Read-modify-write on the newest value, published at `time`; returns the old element.
    pub fn rmw_publish(
        &self,
        offset: usize,
        size: usize,
        f: impl Fn(u64) -> u64,
        time: u64,
        writer: Writer,
        record: bool,
    ) -> u64 {
        let w = offset / 8;
        let before = self.words[w].load(Ordering::Acquire);
        let old = self.rmw(offset, size, f);
        let after = self.words[w].load(Ordering::Acquire);
        if record || self.has_history.load(Ordering::Acquire) {
            let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
            if record || h.contains_key(&w) {
                let vs = h.entry(w).or_insert_with(|| vec![Version { time: 0, word: before, writer: Writer::HOST }]);
                vs.push(Version { time, word: after, writer });
                if vs.len() > MAX_VERSIONS {
                    vs.remove(1);
                }
                self.has_history.store(true, Ordering::Release);
            }
        }
        old
    }

    /// Who published the word's newest value.
    pub fn writer_of(&self, offset: usize) -> Writer {
        if !self.has_history.load(Ordering::Acquire) {
            return Writer::HOST;
        }
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        h.get(&(offset / 8)).and_then(|vs| vs.last()).map_or(Writer::HOST, |v| v.writer)
    }

    /// Forgets all versions (when no program that could read them is left).
    pub fn clear_history(&self) {
        if self.has_history.swap(false, Ordering::AcqRel) {
            self.history.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// Reads `size` (1, 2, 4 or 8) bytes at an aligned in-bounds `offset`.
    pub fn load(&self, offset: usize, size: usize) -> u64 {
        let w = self.words[offset / 8].load(Ordering::Acquire);
        if size == 8 {
            return w;
        }
        (w >> ((offset % 8) * 8)) & ((1u64 << (size * 8)) - 1)
    }

    /// Writes `size` bytes at an aligned in-bounds `offset`.
    pub fn store(&self, offset: usize, size: usize, bits: u64) {
        if size == 8 {
            self.words[offset / 8].store(bits, Ordering::Release);
        } else {
            self.rmw(offset, size, |_| bits);
        }
    }

    /// Atomically replaces the element with `f(old)`; returns `old`.
    pub fn rmw(&self, offset: usize, size: usize, f: impl Fn(u64) -> u64) -> u64 {
        let word = &self.words[offset / 8];
        let shift = (offset % 8) * 8;
        let mask = if size == 8 { u64::MAX } else { ((1u64 << (size * 8)) - 1) << shift };
        let mut old_elem = 0;
        let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            old_elem = (w & mask) >> shift;
            let new = (f(old_elem) << shift) & mask;
            Some((w & !mask) | new)
        });
        old_elem
    }
}

/// All buffers of one device (or, in a world, of every rank).
#[derive(Default)]
pub struct Memory {
    slots: RwLock<Vec<Option<Arc<Region>>>>,
    /// Global publication clock (world mode).
    clock: AtomicU64,
    /// Programs currently running with a delayed view; versions are kept only while there are.
    live_views: AtomicUsize,
}

/// Why an address could not be accessed.
#[derive(Debug)]
pub struct AccessError(pub String);

/// A consistent view of the buffers for the duration of one op.
pub struct View<'a> {
    slots: RwLockReadGuard<'a, Vec<Option<Arc<Region>>>>,
}

impl View<'_> {
    /// The region and offset of an access of `size` bytes at `addr`, bounds- and alignment-checked.
    pub fn locate(&self, addr: u64, size: usize) -> Result<(&Region, usize), AccessError> {
        let slot = (addr >> OFFSET_BITS) as usize;
        let offset = (addr & OFFSET_MASK) as usize;
        let region = slot
            .checked_sub(1)
            .and_then(|s| self.slots.get(s))
            .and_then(|r| r.as_deref())
            .ok_or_else(|| AccessError(format!("address {addr:#x} is not in any live buffer")))?;
        if !offset.is_multiple_of(size) {
            return Err(AccessError(format!(
                "address {addr:#x} (buffer `{}` + {offset}) is not aligned to {size} bytes",
                region.name
            )));
        }
        if offset + size > region.bytes {
            return Err(AccessError(format!(
                "address {addr:#x} is out of bounds: byte offset {offset} of buffer `{}` ({} bytes)",
                region.name, region.bytes
            )));
        }
        Ok((region, offset))
    }
}

impl View<'_> {
    /// The region and start offset of `len` bytes at `addr` (`None` for an empty span), checked
    /// as a whole; `verb` says what the caller was doing, for the error.
    pub fn locate_span(&self, addr: u64, len: usize, verb: &str) -> Result<Option<(&Region, usize)>, AccessError> {
        if len == 0 {
            return Ok(None);
        }
        let (region, start) = self.locate(addr, 1)?;
        if start + len > region.bytes {
            return Err(AccessError(format!(
                "{verb} {len} bytes at offset {start} overruns buffer `{}` ({} bytes)",
                region.name, region.bytes
            )));
        }
        Ok(Some((region, start)))
    }
}

/// Walks `len` bytes from `start` as whole aligned words where possible, single bytes elsewhere:
/// `f(offset, index into the span, size)`.
fn for_each_word(start: usize, len: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut i = 0;
    while i < len {
        let size = if (start + i).is_multiple_of(8) && i + 8 <= len { 8 } else { 1 };
        f(start + i, i, size);
        i += size;
    }
}

/// Little-endian bits of up to 8 bytes.
fn le_bits(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

impl Memory {
    /// A new publication time.
    pub fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The latest publication time (what an acquire now makes visible).
    pub fn now(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// Whether publications must keep versions (some program may read stale data).
    pub fn recording(&self) -> bool {
        self.live_views.load(Ordering::Acquire) > 0
    }

    pub fn view_started(&self) {
        self.live_views.fetch_add(1, Ordering::AcqRel);
    }

    /// A delayed view ended; when it was the last one, versions are dropped.
    pub fn view_ended(&self) {
        if self.live_views.fetch_sub(1, Ordering::AcqRel) == 1 {
            for r in self.view().slots.iter().flatten() {
                r.clear_history();
            }
        }
    }

    /// Writes `data` at `addr` as one publication (host copies, copy engines, puts).
    pub fn publish_bytes(&self, addr: u64, data: &[u8], writer: Writer) -> Result<(), AccessError> {
        let (time, record) = (self.tick(), self.recording());
        let view = self.view();
        let Some((region, start)) = view.locate_span(addr, data.len(), "writing")? else { return Ok(()) };
        for_each_word(start, data.len(), |off, i, size| {
            region.publish(off, size, le_bits(&data[i..i + size]), time, writer, record)
        });
        Ok(())
    }

    /// `addr` as `` `buffer`[i] `` (its 8-byte word in a live buffer), or in hex.
    pub fn describe(&self, addr: u64) -> String {
        match self.view().locate(addr, 1) {
            Ok((region, offset)) => format!("`{}`[{}]", region.name, offset / 8),
            Err(_) => format!("{addr:#x}"),
        }
    }

    /// The index of the buffer `addr` points into (its slot), if any.
    pub fn slot_of(addr: u64) -> usize {
        (addr >> OFFSET_BITS) as usize
    }

    /// The address of `offset` bytes into the buffer in `slot`.
    pub fn address(slot: usize, offset: u64) -> u64 {
        ((slot as u64) << OFFSET_BITS) | (offset & OFFSET_MASK)
    }

    pub fn view(&self) -> View<'_> {
        View { slots: self.slots.read().unwrap_or_else(|e| e.into_inner()) }
    }

    /// Allocates a zeroed buffer; returns its base address.
    pub fn alloc(&self, name: &str, bytes: usize) -> Result<u64, AccessError> {
        if bytes > MAX_BUFFER_BYTES {
            return Err(AccessError(format!("{bytes} bytes exceed the largest buffer ({MAX_BUFFER_BYTES})")));
        }
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        slots.push(Some(Arc::new(Region::new(name, bytes))));
        Ok((slots.len() as u64) << OFFSET_BITS)
    }

    pub fn free(&self, addr: u64) -> Result<(), AccessError> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let slot = ((addr >> OFFSET_BITS) as usize).checked_sub(1);
        match slot.and_then(|s| slots.get_mut(s)) {
            Some(r @ Some(_)) if addr & OFFSET_MASK == 0 => {
                *r = None;
                Ok(())
            }
            _ => Err(AccessError(format!("{addr:#x} is not the base of a live buffer"))),
        }
    }

    /// Copies host bytes into memory at `addr` (byte-granular, bounds-checked as a whole).
    pub fn write_bytes(&self, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        let view = self.view();
        let Some((region, start)) = view.locate_span(addr, data.len(), "writing")? else { return Ok(()) };
        for_each_word(start, data.len(), |off, i, size| region.store(off, size, le_bits(&data[i..i + size])));
        Ok(())
    }

    /// Copies memory at `addr` into `out`.
    pub fn read_bytes(&self, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let view = self.view();
        let Some((region, start)) = view.locate_span(addr, out.len(), "reading")? else { return Ok(()) };
        for_each_word(start, out.len(), |off, i, size| {
            out[i..i + size].copy_from_slice(&region.load(off, size).to_le_bytes()[..size])
        });
        Ok(())
    }

    /// Size of the buffer whose base is `addr`.
    pub fn size_of(&self, addr: u64) -> Option<usize> {
        let view = self.view();
        view.locate(addr, 1).ok().map(|(r, _)| r.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_word_access_and_bounds() {
        let m = Memory::default();
        let a = m.alloc("a", 12).unwrap();
        m.write_bytes(a, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]).unwrap();
        let v = m.view();
        let (r, o) = v.locate(a + 2, 2).unwrap();
        assert_eq!(r.load(o, 2), 0x0403);
        r.store(o, 2, 0xBEEF);
        assert_eq!(r.load(0, 8), 0x0807_0605_BEEF_0201);
        let (r, o) = v.locate(a + 8, 4).unwrap();
        assert_eq!(r.load(o, 4), 0x0C0B_0A09);
        assert!(v.locate(a + 12, 1).err().unwrap().0.contains("out of bounds"));
        assert!(v.locate(a + 1, 4).err().unwrap().0.contains("aligned"));
        assert!(v.locate(0, 4).is_err());
    }
}
