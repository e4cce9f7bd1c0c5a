//! CUDA events: points in a stream that the host can wait for and time between.

use crate::runtime::CudaDevice;
use cudarc::driver::{result, sys};
use std::time::Duration;
use trident_core::backend::BackendError;

fn err(what: &str, e: result::DriverError) -> BackendError {
    BackendError::Host(format!("{what}: {e:?}"))
}

/// An event of the device's context (timing enabled), destroyed on drop.
pub struct Event {
    ev: sys::CUevent,
}

// SAFETY: a CUevent handle may be used from any thread of the process (the driver API is
// thread-safe); the context is made current before every call.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn new(dev: &CudaDevice) -> Result<Event, BackendError> {
        dev.current()?;
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(|e| err("cuEventCreate", e))?;
        Ok(Event { ev })
    }

    /// An event only for ordering streams (no timing: cheaper to record and wait on).
    pub fn ordering(dev: &CudaDevice) -> Result<Event, BackendError> {
        dev.current()?;
        let ev =
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(|e| err("cuEventCreate", e))?;
        Ok(Event { ev })
    }

    /// Makes `stream` wait for the work this event captured (`cuStreamWaitEvent`).
    pub(crate) fn wait_on(&self, stream: sys::CUstream) -> Result<(), BackendError> {
        // SAFETY: a live event and a stream of the same context.
        unsafe { sys::cuStreamWaitEvent(stream, self.ev, 0) }.result().map_err(|e| err("cuStreamWaitEvent", e))
    }

    /// Captures the work enqueued so far on the legacy default stream (where `Device::launch`
    /// runs).
    pub fn record_default(&self) -> Result<(), BackendError> {
        self.record(std::ptr::null_mut())
    }

    /// Captures the work enqueued on `stream` so far (null: the legacy default stream).
    pub(crate) fn record(&self, stream: sys::CUstream) -> Result<(), BackendError> {
        // SAFETY: a live event and a stream of the same context.
        unsafe { result::event::record(self.ev, stream) }.map_err(|e| err("cuEventRecord", e))
    }

    /// Waits until the captured work is done.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        // SAFETY: a live event.
        unsafe { result::event::synchronize(self.ev) }.map_err(|e| err("cuEventSynchronize", e))
    }

    /// True when the captured work is done (never blocks).
    pub fn done(&self) -> Result<bool, BackendError> {
        // SAFETY: a live event.
        match unsafe { sys::cuEventQuery(self.ev) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(BackendError::Host(format!("cuEventQuery: {other:?}"))),
        }
    }

    /// GPU time from `start` to this event (both recorded and complete).
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration, BackendError> {
        // SAFETY: two live events of one context.
        let ms = unsafe { result::event::elapsed(start.ev, self.ev) }.map_err(|e| err("cuEventElapsedTime", e))?;
        Ok(Duration::from_secs_f64(ms as f64 / 1e3))
    }
}

impl Event {
    /// The event as an opaque handle (`Driver::event_create`), destroyed by [`Event::from_handle`]
    /// and dropping what it returns.
    pub(crate) fn into_handle(self) -> u64 {
        let ev = self.ev;
        std::mem::forget(self);
        ev as u64
    }

    /// The event of `handle` (from [`Event::into_handle`]) back, owned.
    ///
    /// # Safety
    /// `handle` came from `into_handle` and has not been taken back since.
    pub(crate) unsafe fn from_handle(handle: u64) -> Event {
        Event { ev: handle as sys::CUevent }
    }

    /// Records the event of `handle` on `stream` (a live event and a stream of its context).
    pub(crate) fn record_handle(handle: u64, stream: sys::CUstream) -> Result<(), BackendError> {
        // SAFETY: a live event and a stream of the same context (the caller's).
        unsafe { result::event::record(handle as sys::CUevent, stream) }.map_err(|e| err("cuEventRecord", e))
    }

    /// GPU milliseconds from the event `from` to the event `to` (handles of live events of one
    /// context, both complete).
    pub(crate) fn handles_elapsed_ms(from: u64, to: u64) -> Result<f64, BackendError> {
        // SAFETY: two live events of one context (the caller's handles).
        let ms = unsafe { result::event::elapsed(from as sys::CUevent, to as sys::CUevent) }
            .map_err(|e| err("cuEventElapsedTime", e))?;
        Ok(ms as f64)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is not used after this.
        let _ = unsafe { result::event::destroy(self.ev) };
    }
}
