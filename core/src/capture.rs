//! Recorded launch sequences: what a CUDA graph is to a stream, for any world.
//!
//! [`capture`] runs host code against a rank's context that records its kernel launches
//! instead of running them; [`Recording::replay`] launches them again, in order, with the same
//! grids and the same arguments. A collective can be replayed only if nothing it does changes
//! from call to call on the host: its epoch lives on the device (each kernel reads and advances
//! a counter in its buffers) and buffers alternate by the call's parity, so the same launches
//! serve every call (`trident_kernels::epoch`). What cannot be replayed is refused while
//! capturing, with a typed error: copy-engine work and stream signals (they carry values fixed
//! when enqueued), `synchronize` (nothing has run) and host barriers (the ranks' hosts do not
//! meet in a replay). Compiling and allocating are allowed: they happen once, at capture.

use crate::backend::{Artifact, BackendError, Buffer, KernelArg};
use crate::ir::CmpOp;
use crate::world::{RankCtx, StreamId};
use std::sync::Mutex;

/// One recorded launch.
#[derive(Clone)]
struct Launch {
    stream: StreamId,
    kernel: Artifact,
    grid: [u32; 3],
    args: Vec<KernelArg>,
}

/// A rank's recorded launches.
#[derive(Clone, Default)]
pub struct Recording {
    launches: Vec<Launch>,
}

impl Recording {
    /// How many launches it holds.
    pub fn len(&self) -> usize {
        self.launches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }

    /// Launches the recorded kernels again on `ctx`, in order (asynchronously, as launches are).
    pub fn replay(&self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        for l in &self.launches {
            ctx.launch(l.stream, &l.kernel, l.grid, &l.args)?;
        }
        Ok(())
    }
}

/// Runs `body` on a context of `ctx`'s rank that records launches instead of running them.
pub fn capture(
    ctx: &dyn RankCtx,
    body: impl FnOnce(&dyn RankCtx) -> Result<(), BackendError>,
) -> Result<Recording, BackendError> {
    let c = Capturing { inner: ctx, launches: Mutex::new(Vec::new()) };
    body(&c)?;
    Ok(Recording { launches: c.launches.into_inner().unwrap_or_else(|e| e.into_inner()) })
}

pub fn not_capturable(what: &str) -> BackendError {
    BackendError::Host(format!(
        "not capturable: {what} while capturing a launch sequence (only kernel launches replay; copy-engine work and stream signals carry values fixed when enqueued, and hosts do not meet in a replay)"
    ))
}

struct Capturing<'a> {
    inner: &'a dyn RankCtx,
    launches: Mutex<Vec<Launch>>,
}

impl RankCtx for Capturing<'_> {
    crate::forward_rank_ctx!(identity, memory, compile);
    fn capturing(&self) -> bool {
        true
    }
    fn launch(
        &self,
        stream: StreamId,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        crate::backend::check_launch(kernel, grid, args, u64::MAX)?;
        let l = Launch { stream, kernel: kernel.clone(), grid, args: args.to_vec() };
        self.launches.lock().unwrap_or_else(|e| e.into_inner()).push(l);
        Ok(())
    }
    fn copy(&self, _: StreamId, _: &Buffer, _: usize, _: &Buffer, _: usize, _: usize) -> Result<(), BackendError> {
        Err(not_capturable("a copy-engine copy"))
    }
    fn write_signal(&self, _: StreamId, signal: &Buffer, _: usize, _: u64) -> Result<(), BackendError> {
        Err(not_capturable(&format!("a stream write of `{}`", signal.name)))
    }
    fn wait_signal(&self, _: StreamId, signal: &Buffer, _: usize, _: CmpOp, _: u64) -> Result<(), BackendError> {
        Err(not_capturable(&format!("a stream wait on `{}`", signal.name)))
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        Err(not_capturable("synchronize"))
    }
    fn barrier(&self) -> Result<(), BackendError> {
        Err(not_capturable("a host barrier"))
    }
    fn rearm_barrier_all(&self) -> Result<(), BackendError> {
        Err(not_capturable("re-arming barrier_all"))
    }
}
