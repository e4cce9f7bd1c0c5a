//! Shared-memory hazards inside one program, found as cpu-simt executes it.
//!
//! The lanes of a program run in lock-step here, so every schedule of a GPU is not tried; instead
//! each byte of shared memory remembers which lane last wrote it and which lane(s) read it since
//! the last barrier. Two different lanes touching a byte between two barriers, at least one of
//! them writing, is a hazard on a GPU whatever the order the hardware picks (what
//! compute-sanitizer's `racecheck` reports): read-after-write, write-after-read, and
//! write-after-write of a different value (replicas storing the same value are benign).
//! Asynchronous copies count as writes when issued.

use crate::interp::Fault;

const MANY: u16 = u16::MAX;

#[derive(Clone, Copy, Default)]
struct Byte {
    write_epoch: u32,
    writer: u16,
    read_epoch: u32,
    reader: u16,
}

pub struct SharedHazards {
    bytes: Vec<Byte>,
    /// Barriers passed + 1 (0 marks a byte never touched).
    epoch: u32,
}

impl SharedHazards {
    pub fn new(bytes: usize) -> SharedHazards {
        SharedHazards { bytes: vec![Byte::default(); bytes], epoch: 1 }
    }

    /// Every thread of the program met.
    pub fn barrier(&mut self) {
        self.epoch += 1;
    }

    /// `lane` writes byte `at`; `same` when the byte already holds the value written.
    pub fn write(&mut self, lane: usize, at: usize, same: bool) -> Result<(), Fault> {
        let (e, lane) = (self.epoch, lane as u16);
        let Some(b) = self.bytes.get_mut(at) else { return Ok(()) };
        if b.read_epoch == e && b.reader != lane {
            let who = if b.reader == MANY { "other threads".to_string() } else { format!("thread {}", b.reader) };
            return Err(hazard(format!(
                "write-after-read: thread {lane} writes shared byte {at}, which {who} read since the last barrier"
            )));
        }
        if b.write_epoch == e && b.writer != lane && !same {
            return Err(hazard(format!(
                "write-after-write: threads {} and {lane} write different values to shared byte {at} between two barriers",
                b.writer
            )));
        }
        b.write_epoch = e;
        b.writer = lane;
        Ok(())
    }

    /// The tensor-memory accelerator writes byte `at` for a copy whose completion an mbarrier
    /// announces: its readers order themselves by waiting on that mbarrier (checked when they
    /// wait), not by barriers, so only a read since the last barrier is a hazard here (the copy
    /// would overwrite a stage still being read).
    pub fn async_write(&mut self, at: usize) -> Result<(), Fault> {
        let Some(b) = self.bytes.get_mut(at) else { return Ok(()) };
        if b.read_epoch == self.epoch {
            return Err(hazard(format!(
                "write-after-read: a TMA copy writes shared byte {at}, which a thread read since the last barrier"
            )));
        }
        b.write_epoch = 0;
        Ok(())
    }

    /// `lane` reads byte `at`.
    pub fn read(&mut self, lane: usize, at: usize) -> Result<(), Fault> {
        let (e, lane) = (self.epoch, lane as u16);
        let Some(b) = self.bytes.get_mut(at) else { return Ok(()) };
        if b.write_epoch == e && b.writer != lane {
            return Err(hazard(format!(
                "read-after-write: thread {lane} reads shared byte {at}, which thread {} wrote since the last barrier",
                b.writer
            )));
        }
        b.reader = if b.read_epoch == e && b.reader != lane { MANY } else { lane };
        b.read_epoch = e;
        Ok(())
    }
}

fn hazard(m: String) -> Fault {
    Fault { op: None, message: format!("shared-memory race (no barrier between): {m}") }
}
