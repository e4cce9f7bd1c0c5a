//! The vendor surface a GPU world needs, and nothing more.
//!
//! A vendor crate implements [`Driver`] over its runtime (CUDA's driver API through `cudarc`,
//! HIP through `libloading`); everything above it (heaps, barrier, diagnostics, watchdog, the
//! world) is written once in this crate. Memory comes from the [`Device`] half (alloc, free,
//! synchronous write and read); the rest is streams and what is enqueued on them.

use trident_core::abi::HiddenArgs;
use trident_core::backend::{Artifact, Backend, BackendError, Device, KernelArg};
use trident_core::ir::{CmpOp, LaunchAttrs};

use crate::diagnostics::Allocations;
use crate::health::DeviceHealth;
use crate::queues::HardwareQueues;

/// A stream handle as the vendor runtime gives it (a pointer, carried as an integer so that
/// handles cross threads; only the driver that made it interprets it).
pub type RawStream = u64;

pub trait Driver: Device + Send + Sync + 'static {
    /// The backend that compiles kernels for this device.
    fn compiler(&self) -> &dyn Backend;
    /// The compile target of this device (`None`: the backend's default).
    fn target(&self) -> Option<String>;
    /// The names of this device's live allocations (diagnostics name signals with them).
    fn allocations(&self) -> &Allocations;
    /// Lets kernels on this device load and store `peer`'s memory (the peer world: one rank per
    /// GPU of a node). Drivers without it refuse worlds of several devices.
    fn enable_peer(&self, peer: &Self) -> Result<(), BackendError>
    where
        Self: Sized,
    {
        let _ = peer;
        Err(BackendError::Host(format!(
            "the {} driver has no peer access yet: worlds of several devices are refused",
            self.backend()
        )))
    }
    /// Makes this device current for the calling thread's later calls.
    fn bind(&self) -> Result<(), BackendError>;
    /// Loads `kernel`'s module now. A world loads every kernel on every rank before any rank
    /// launches it: a module loaded lazily cannot load while another rank's kernel spins.
    fn load(&self, kernel: &Artifact) -> Result<(), BackendError>;
    /// Enqueues `kernel` on `stream` with `args` followed by the `hidden` parameters, over the
    /// grid the launch policy gives ([`launch_grid`]: `sharing` ranks launch this grid on the
    /// device at the same time).
    fn launch_on(
        &self,
        stream: RawStream,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        hidden: &HiddenArgs,
        sharing: u32,
    ) -> Result<(), BackendError>;
    /// The device's name for reports ("NVIDIA H200", "AMD gfx942").
    fn device_name(&self) -> String;

    /// Programs of `kernel` resident on the device at once (per multiprocessor at the kernel's
    /// registers and shared memory, times the multiprocessors), where the driver can tell:
    /// what host code sizes a grid by so that it fills whole waves. `None` by default.
    fn resident_programs(&self, _kernel: &Artifact) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }
    /// Whether this device can still be used, or which stuck work made it unusable.
    fn health(&self) -> &DeviceHealth;
    /// The hardware work queues the device's streams share (`crate::queues`); by default every
    /// stream has its own.
    fn hardware_queues(&self) -> HardwareQueues {
        HardwareQueues::unlimited()
    }
    /// A stream outside the world's whose work does not queue behind theirs, from which the
    /// watchdog releases stuck stream waits: the legacy default stream (handle 0) of CUDA and
    /// HIP. (On the H200, a kernel on it never waited behind a blocked stream:
    /// `results/h200-issue24`.)
    fn release_stream(&self) -> RawStream {
        0
    }
    /// Device time of the work `enqueue` puts on `stream`: events recorded before and after it,
    /// waited for at most `bound` (benchmarks time host orchestration this way).
    fn time_enqueued(
        &self,
        stream: RawStream,
        bound: std::time::Duration,
        enqueue: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<std::time::Duration, BackendError>;
    /// A stream that does not synchronize with the legacy default stream.
    fn stream_create(&self) -> Result<RawStream, BackendError>;
    fn stream_destroy(&self, stream: RawStream);
    /// Whether everything enqueued on `stream` has completed (never blocks).
    fn stream_idle(&self, stream: RawStream) -> Result<bool, BackendError>;
    /// Whether `stream` is being captured into a graph (`cuStreamIsCapturing`): the watchdog
    /// must not query such a stream (a query invalidates the capture). No capture by default.
    fn stream_capturing(&self, _stream: RawStream) -> Result<bool, BackendError> {
        Ok(false)
    }
    /// Enqueues a copy-engine copy between device addresses (any rank's heap on this node).
    fn copy_async(&self, stream: RawStream, dst: u64, src: u64, bytes: usize) -> Result<(), BackendError>;
    /// Enqueues a 64-bit store of `value` at `address`, after the stream's earlier work.
    fn write_value(&self, stream: RawStream, address: u64, value: u64) -> Result<(), BackendError>;
    /// Enqueues a wait until the 64-bit word at `address` satisfies `word <cmp> value`
    /// (`ge` and `eq`; other comparisons are a typed error).
    fn wait_value(&self, stream: RawStream, address: u64, cmp: CmpOp, value: u64) -> Result<(), BackendError>;
    /// Orders what is enqueued on `waiter` from now on after what is enqueued on `on` so far (an
    /// event recorded on `on`, waited for on `waiter`: graph captures follow it). Drivers
    /// without events refuse it.
    fn stream_wait_stream(&self, waiter: RawStream, on: RawStream) -> Result<(), BackendError> {
        let _ = (waiter, on);
        Err(BackendError::Host(format!("{}: no events to order streams with", self.device_name())))
    }
    /// A timing event (an opaque handle, released by [`Driver::event_release`]); `None` for
    /// drivers without timing events.
    fn event_create(&self) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }
    /// Records `event` on `stream` after its work so far (again, where it was recorded before).
    fn event_record(&self, event: u64, stream: RawStream) -> Result<(), BackendError> {
        let _ = (event, stream);
        Err(BackendError::Host(format!("{}: no timing events", self.device_name())))
    }
    /// Milliseconds from event `from` to event `to` (both recorded by [`Driver::event_record`], complete).
    fn event_elapsed_ms(&self, from: u64, to: u64) -> Result<f64, BackendError> {
        let _ = (from, to);
        Err(BackendError::Host(format!("{}: no timing events", self.device_name())))
    }
    fn event_release(&self, event: u64) {
        let _ = event;
    }
}

/// The launch policy every driver applies, in one place: the grid `kernel` runs on a device of
/// `mps` multiprocessors where `sharing` ranks launch the same grid at once. A persistent
/// kernel's grid shrinks to what is resident ([`persistent_grid`]); a cooperative launch, or one
/// whose programs `wait` beside other ranks', must be resident whole ([`check_resident`]), and
/// is refused with a typed error otherwise, never started to deadlock. `occupancy` (programs of
/// this kernel per multiprocessor, the vendor's query) is asked only when needed.
pub fn launch_grid(
    kernel: &Artifact,
    grid: [u32; 3],
    waits: bool,
    sharing: u32,
    mps: u32,
    occupancy: &dyn Fn() -> Result<u64, BackendError>,
) -> Result<[u32; 3], BackendError> {
    let room = leaves_room(&kernel.attrs, waits, sharing);
    let grid = if kernel.attrs.persistent { persistent_grid(grid, sharing, occupancy()?, mps, room) } else { grid };
    if kernel.attrs.cooperative || (waits && sharing > 1) {
        check_resident(kernel, grid, sharing, occupancy()?, mps)?;
    }
    Ok(grid)
}

/// Whether a persistent launch leaves room for what it waits for ([`persistent_grid`]'s
/// `waits`): a kernel that waits does, unless every producer of its signals ran before it on
/// its stream or runs on another device (`LaunchAttrs::signalled_before`) and no other rank
/// shares the device. Measured at a581f9b on an H100: the tensor-parallel MoE block's waiting
/// gate/up GEMM ran 116 programs for 132 multiprocessors at world 1, 4-6% slower than the
/// same GEMM without the wait.
pub fn leaves_room(attrs: &LaunchAttrs, waits: bool, sharing: u32) -> bool {
    waits && (sharing > 1 || !attrs.signalled_before)
}

/// The grid a launch of a persistent kernel (`LaunchAttrs::persistent`) runs: along x, at
/// most as many programs as `per_mp` per multiprocessor times `mps` hold at once, shared by the
/// `sharing` ranks launching it on the device (at least one each); y and z as asked. A kernel
/// that `waits` leaves an eighth of the multiprocessors (at least one) to what it waits for:
/// spinning programs on every multiprocessor would keep a gather's kernels, or the copy kernels
/// a driver may run for a copy within one device, from ever starting (measured: AG-GEMM in a
/// loopback world of 4 ranks timed out waiting for a copy-engine gather). Where ranks share
/// the device, a waiting kernel's programs count as a multiprocessor each, however many fit on
/// one: the hardware spreads a grid's programs over the multiprocessors before it stacks them,
/// so the sharing ranks' spinning programs would otherwise sit on every multiprocessor, and a
/// kernel whose program needs a whole multiprocessor (a GEMM's registers), queued on a rank
/// whose peers wait for it, would never start (seen: the EP MoE block's combine at 7 tokens x
/// top-3, 21 programs on each of 7 waiting ranks, timed out in the loopback world of 8 on the
/// H100).
pub fn persistent_grid(grid: [u32; 3], sharing: u32, per_mp: u64, mps: u32, waits: bool) -> [u32; 3] {
    let per_mp = if waits && sharing > 1 { 1 } else { per_mp };
    let mps = if waits && mps > 1 { mps - (mps / 8).max(1) } else { mps };
    let fit = (per_mp * mps as u64 / sharing.max(1) as u64).max(1);
    let yz = (grid[1] as u64 * grid[2] as u64).max(1);
    let x = (fit / yz).max(1).min(grid[0] as u64) as u32;
    [x, grid[1], grid[2]]
}

/// Refuses a launch whose programs must all be resident at once (a cooperative launch, or one
/// whose programs wait while `sharing` ranks launch the same grid on the device) when
/// `per_mp` programs per multiprocessor times `mps` multiprocessors cannot hold them: a typed
/// error, never a launch started to deadlock.
pub fn check_resident(
    kernel: &Artifact,
    grid: [u32; 3],
    sharing: u32,
    per_mp: u64,
    mps: u32,
) -> Result<(), BackendError> {
    let fit = per_mp * mps as u64;
    let total = grid.iter().map(|&x| x as u64).product::<u64>();
    if total * sharing as u64 <= fit {
        return Ok(());
    }
    let why = if kernel.attrs.cooperative { "cooperative launch" } else { "launch of a waiting kernel" };
    let ranks = if sharing > 1 { format!(" x {sharing} ranks sharing the GPU") } else { String::new() };
    Err(BackendError::Launch {
        kernel: kernel.kernel.clone(),
        message: format!(
            "{why} of {total} programs{ranks}: at most {fit} can be resident ({per_mp} per multiprocessor x {mps})"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::{leaves_room, persistent_grid, LaunchAttrs};

    #[test]
    fn a_kernel_signalled_before_keeps_every_multiprocessor_on_a_device_of_its_own() {
        let (plain, before) =
            (LaunchAttrs::default(), LaunchAttrs { signalled_before: true, ..LaunchAttrs::default() });
        assert!(leaves_room(&plain, true, 1));
        assert!(!leaves_room(&before, true, 1));
        assert!(leaves_room(&before, true, 2));
        assert!(!leaves_room(&plain, false, 4));
        assert_eq!(persistent_grid([1000, 1, 1], 1, 1, 132, leaves_room(&before, true, 1)), [132, 1, 1]);
    }

    #[test]
    fn persistent_grids_share_the_device_and_leave_room_for_what_a_waiting_kernel_waits_for() {
        // One program per multiprocessor of an H200, 4 ranks sharing it.
        assert_eq!(persistent_grid([1000, 1, 1], 4, 1, 132, false), [33, 1, 1]);
        assert_eq!(persistent_grid([1000, 1, 1], 4, 1, 132, true), [29, 1, 1]);
        assert_eq!(persistent_grid([1000, 1, 1], 1, 1, 132, true), [116, 1, 1]);
        // Waiting programs of ranks sharing the device leave multiprocessors without any of
        // them, however many would fit on one; one rank's keep the occupancy.
        assert_eq!(persistent_grid([21, 1, 1], 8, 16, 132, true), [14, 1, 1]);
        assert_eq!(persistent_grid([21, 1, 1], 8, 16, 132, false), [21, 1, 1]);
        assert_eq!(persistent_grid([1000, 1, 1], 1, 16, 132, true), [1000, 1, 1]);
        // Never more programs than asked, never none.
        assert_eq!(persistent_grid([10, 1, 1], 1, 1, 132, true), [10, 1, 1]);
        assert_eq!(persistent_grid([1000, 1, 1], 8, 1, 1, true), [1, 1, 1]);
    }
}
