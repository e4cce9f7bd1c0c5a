//! The host side of a world: SPMD host code written once against [`RankCtx`].
//!
//! A world has N ranks; the user's host function runs once per rank with that rank's context
//! (a thread per rank on the CPU and loopback worlds, a process per rank under NVSHMEM later),
//! so host code never shares Rust state between ranks: it talks to other ranks only through
//! symmetric memory, signals and the collective calls here ([`RankCtx::symm_alloc`],
//! [`RankCtx::barrier`]). Device work is ordered per stream, as on GPUs: launches, copy-engine
//! copies, and stream-ordered signal writes and waits (`cuStreamWriteValue64` /
//! `cuStreamWaitValue64`), all asynchronous until [`RankCtx::synchronize`].

use crate::backend::{Artifact, Backend, BackendError, Buffer, KernelArg};
use crate::ir::CmpOp;
use crate::{Function, VerifyError};
use std::collections::HashMap;
use std::sync::Mutex;

/// A stream of one rank: work on one stream runs in order, streams run concurrently.
pub type StreamId = usize;

/// Every world starts each rank's copy of a symmetric buffer at a multiple of this many bytes
/// (the heaps' bases and their carving grain, or one allocation per buffer), so `symm_at`
/// keeps what is known of a pointer's alignment up to it (the lowering's vector widths and
/// bulk copies through a peer's pointer). A world that cannot promise it refuses to start.
pub const SYMMETRIC_ALIGN: usize = 256;

/// One rank's view of the world, handed to the host function.
pub trait RankCtx {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    fn backend(&self) -> &dyn Backend;
    /// The target this rank's kernels compile for (`None`: the backend's default).
    fn target(&self) -> Option<String> {
        None
    }
    /// The GPU target this rank's kernels compile for, as data (`None` on the CPU interpreter):
    /// what kernels choose their tiles by.
    fn gpu_target(&self) -> Option<&'static crate::target::TargetDesc> {
        let name = self.backend().descriptor().resolve_target(self.target().as_deref()).ok()?;
        crate::target::lookup(name).ok()
    }

    /// How many ranks of the world (this one included) run on this rank's device: 1 in a peer
    /// world or a world of processes with a GPU each, more in a loopback world. Kernels whose
    /// programs wait must all be resident beside the other ranks' (the runtime refuses a grid
    /// that is not), so operations choose their grids by it. By default every rank shares one
    /// device (the CPU world).
    fn ranks_sharing_device(&self) -> usize {
        self.world_size()
    }

    /// Where the world runs, for keys of measured choices (the tuning cache): the device's name
    /// and how ranks reach each other, `NVIDIA H200 / peer` (a GPU per rank, NVLink or PCIe),
    /// `/ loopback` (ranks sharing a GPU), `/ processes` (a world of processes, NVSHMEM).
    /// `cpu world` by default.
    fn topology(&self) -> String {
        "cpu world".into()
    }

    /// Whether launches are being recorded (`crate::capture`) rather than run: an operation
    /// whose launch arguments change from call to call refuses to be recorded.
    fn capturing(&self) -> bool {
        false
    }

    /// Programs of `kernel` this rank may count on running at once: what its device holds
    /// (`Device::resident_programs`) over the ranks sharing it, where the world can tell (a
    /// grid sized by it fills whole waves beside the other ranks' work). `None` by default.
    fn resident_programs(&self, kernel: &Artifact) -> Result<Option<u64>, BackendError> {
        let _ = kernel;
        Ok(None)
    }

    /// The artifact of the specialization `key`, built and compiled on first use on this rank.
    fn compile(&self, key: &str, build: &dyn Fn() -> Result<Function, VerifyError>) -> Result<Artifact, BackendError>;

    /// A buffer only this rank uses (contents unspecified).
    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError>;
    /// Collective: every rank calls it in the same order with the same size; returns this
    /// rank's copy of a zero-filled symmetric buffer, which kernels reach on other ranks with
    /// `symm_at`, at a multiple of [`SYMMETRIC_ALIGN`] bytes.
    fn symm_alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError>;
    /// `rank`'s copy of a symmetric buffer (a destination for copies and signal writes).
    fn peer(&self, buffer: &Buffer, rank: usize) -> Result<Buffer, BackendError>;

    /// Host writes and reads (reads see what completed before the last `synchronize`).
    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError>;
    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError>;
    fn fill(&self, buffer: &Buffer, pattern: &[u8]) -> Result<(), BackendError> {
        self.write(buffer, 0, &crate::backend::fill_bytes(buffer, pattern)?)
    }

    /// Enqueues a kernel launch on `stream`.
    fn launch(
        &self,
        stream: StreamId,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<(), BackendError>;
    /// Enqueues a copy-engine copy (either side may be a peer's symmetric buffer).
    fn copy(
        &self,
        stream: StreamId,
        dst: &Buffer,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), BackendError>;
    /// Enqueues a 64-bit signal write, ordered after the stream's earlier work.
    fn write_signal(&self, stream: StreamId, signal: &Buffer, offset: usize, value: u64) -> Result<(), BackendError>;
    /// Enqueues a wait: the stream's later work starts once `signal <cmp> value`.
    fn wait_signal(
        &self,
        stream: StreamId,
        signal: &Buffer,
        offset: usize,
        cmp: CmpOp,
        value: u64,
    ) -> Result<(), BackendError>;
    /// Waits for all of this rank's streams; returns the first error any of them met.
    fn synchronize(&self) -> Result<(), BackendError>;
    /// Collective: returns once every rank's host reached it.
    fn barrier(&self) -> Result<(), BackendError>;
    /// Collective, after a timed-out wait: clears what the world keeps for kernels'
    /// `barrier_all` (a launch that timed out leaves arrivals counted, and every later
    /// `barrier_all` would be off by them). Call it on every rank with its streams idle, between
    /// two host barriers (`trident_kernels::epoch::rearm` does).
    fn rearm_barrier_all(&self) -> Result<(), BackendError>;
    /// Orders what is enqueued from now on on every stream of this rank after what is enqueued
    /// so far on `external`, an application's stream of the rank's device (torch's current
    /// stream): a library op called from PyTorch does this first, and [`RankCtx::join_stream`]
    /// last, so that it runs in the application's stream order and a graph captured on that
    /// stream captures it. Worlds without device streams refuse it.
    fn follow_stream(&self, external: u64) -> Result<(), BackendError> {
        let _ = external;
        Err(BackendError::Host("this world has no device streams to order after an application's stream".into()))
    }
    /// Orders what is enqueued from now on on `external` after everything enqueued so far on
    /// this rank's streams.
    fn join_stream(&self, external: u64) -> Result<(), BackendError> {
        let _ = external;
        Err(BackendError::Host("this world has no device streams to order an application's stream after".into()))
    }
    /// A timing mark on `stream` after the work enqueued on it so far (a timing event, which
    /// needs no multiprocessor): its number among this rank's marks, or `None` where the world
    /// keeps no such marks (a timeline then times stream operations with marker kernels:
    /// `trident_kernels::trace`).
    fn stream_mark(&self, stream: StreamId) -> Result<Option<usize>, BackendError> {
        let _ = stream;
        Ok(None)
    }
    /// After a `synchronize`: milliseconds from mark `from` to mark `to` (negative when `to`
    /// came first).
    fn marks_elapsed_ms(&self, from: usize, to: usize) -> Result<f64, BackendError> {
        Err(BackendError::Host(format!("this world keeps no stream marks (asked for {from} to {to})")))
    }
    /// Forgets this rank's marks (with its streams idle).
    fn clear_marks(&self) {}
}

/// Implements the named [`RankCtx`] methods of a wrapper by forwarding each to its field `inner`
/// (a `&dyn RankCtx`); `identity` names the rank's identity and placement (`rank`, `world_size`,
/// `backend`, `target`, `ranks_sharing_device`, `topology`, `resident_programs`), `memory` its
/// buffers (`alloc`, `symm_alloc`, `peer`, `write`, `read`). Wrappers of a rank's context
/// (capture, tracing, the suite's steering) change a few methods and pass the rest through;
/// naming the passed ones keeps each wrapper's choice visible, and a method added to the trait
/// is one arm here, not one copy per wrapper.
///
/// ```ignore
/// impl RankCtx for Wrapper<'_> {
///     trident_core::forward_rank_ctx!(identity, memory, compile, synchronize);
///     fn launch(/* ... */) -> Result<(), BackendError> { /* the wrapper's own */ }
/// }
/// ```
#[macro_export]
macro_rules! forward_rank_ctx {
    ($($method:ident),* $(,)?) => { $( $crate::forward_rank_ctx!(@ $method); )* };
    // Groups: who the rank is and where it runs; its memory.
    (@ identity) => {
        $crate::forward_rank_ctx!(rank, world_size, backend, target, ranks_sharing_device, topology, resident_programs);
    };
    (@ memory) => { $crate::forward_rank_ctx!(alloc, symm_alloc, peer, write, read); };
    (@ rank) => { fn rank(&self) -> usize { self.inner.rank() } };
    (@ world_size) => { fn world_size(&self) -> usize { self.inner.world_size() } };
    (@ backend) => { fn backend(&self) -> &dyn $crate::backend::Backend { self.inner.backend() } };
    (@ target) => { fn target(&self) -> Option<String> { self.inner.target() } };
    (@ gpu_target) => {
        fn gpu_target(&self) -> Option<&'static $crate::target::TargetDesc> { self.inner.gpu_target() }
    };
    (@ ranks_sharing_device) => { fn ranks_sharing_device(&self) -> usize { self.inner.ranks_sharing_device() } };
    (@ topology) => { fn topology(&self) -> String { self.inner.topology() } };
    (@ capturing) => { fn capturing(&self) -> bool { self.inner.capturing() } };
    (@ resident_programs) => {
        fn resident_programs(
            &self,
            kernel: &$crate::backend::Artifact,
        ) -> Result<Option<u64>, $crate::backend::BackendError> {
            self.inner.resident_programs(kernel)
        }
    };
    (@ compile) => {
        fn compile(
            &self,
            key: &str,
            build: &dyn Fn() -> Result<$crate::Function, $crate::VerifyError>,
        ) -> Result<$crate::backend::Artifact, $crate::backend::BackendError> {
            self.inner.compile(key, build)
        }
    };
    (@ alloc) => {
        fn alloc(&self, bytes: usize, name: &str) -> Result<$crate::backend::Buffer, $crate::backend::BackendError> {
            self.inner.alloc(bytes, name)
        }
    };
    (@ symm_alloc) => {
        fn symm_alloc(
            &self,
            bytes: usize,
            name: &str,
        ) -> Result<$crate::backend::Buffer, $crate::backend::BackendError> {
            self.inner.symm_alloc(bytes, name)
        }
    };
    (@ peer) => {
        fn peer(
            &self,
            buffer: &$crate::backend::Buffer,
            rank: usize,
        ) -> Result<$crate::backend::Buffer, $crate::backend::BackendError> {
            self.inner.peer(buffer, rank)
        }
    };
    (@ write) => {
        fn write(
            &self,
            buffer: &$crate::backend::Buffer,
            offset: usize,
            data: &[u8],
        ) -> Result<(), $crate::backend::BackendError> {
            self.inner.write(buffer, offset, data)
        }
    };
    (@ read) => {
        fn read(
            &self,
            buffer: &$crate::backend::Buffer,
            offset: usize,
            out: &mut [u8],
        ) -> Result<(), $crate::backend::BackendError> {
            self.inner.read(buffer, offset, out)
        }
    };
    (@ launch) => {
        fn launch(
            &self,
            stream: $crate::world::StreamId,
            kernel: &$crate::backend::Artifact,
            grid: [u32; 3],
            args: &[$crate::backend::KernelArg],
        ) -> Result<(), $crate::backend::BackendError> {
            self.inner.launch(stream, kernel, grid, args)
        }
    };
    (@ copy) => {
        fn copy(
            &self,
            stream: $crate::world::StreamId,
            dst: &$crate::backend::Buffer,
            dst_offset: usize,
            src: &$crate::backend::Buffer,
            src_offset: usize,
            bytes: usize,
        ) -> Result<(), $crate::backend::BackendError> {
            self.inner.copy(stream, dst, dst_offset, src, src_offset, bytes)
        }
    };
    (@ write_signal) => {
        fn write_signal(
            &self,
            stream: $crate::world::StreamId,
            signal: &$crate::backend::Buffer,
            offset: usize,
            value: u64,
        ) -> Result<(), $crate::backend::BackendError> {
            self.inner.write_signal(stream, signal, offset, value)
        }
    };
    (@ wait_signal) => {
        fn wait_signal(
            &self,
            stream: $crate::world::StreamId,
            signal: &$crate::backend::Buffer,
            offset: usize,
            cmp: $crate::ir::CmpOp,
            value: u64,
        ) -> Result<(), $crate::backend::BackendError> {
            self.inner.wait_signal(stream, signal, offset, cmp, value)
        }
    };
    (@ synchronize) => { fn synchronize(&self) -> Result<(), $crate::backend::BackendError> { self.inner.synchronize() } };
    (@ barrier) => { fn barrier(&self) -> Result<(), $crate::backend::BackendError> { self.inner.barrier() } };
    (@ rearm_barrier_all) => {
        fn rearm_barrier_all(&self) -> Result<(), $crate::backend::BackendError> { self.inner.rearm_barrier_all() }
    };
    (@ follow_stream) => {
        fn follow_stream(&self, external: u64) -> Result<(), $crate::backend::BackendError> {
            self.inner.follow_stream(external)
        }
    };
    (@ join_stream) => {
        fn join_stream(&self, external: u64) -> Result<(), $crate::backend::BackendError> {
            self.inner.join_stream(external)
        }
    };
}

/// What a [`KernelCache`] entry is for: the backend's name, the target and the key.
type CacheKey = (&'static str, Option<String>, String);

/// Artifacts per backend, target and specialization key.
#[derive(Default)]
pub struct KernelCache {
    compiled: Mutex<HashMap<CacheKey, Artifact>>,
}

impl KernelCache {
    /// The artifact of `key` for `backend` and `target`, compiled from `build` the first time.
    /// (Keyed by all three: a launcher whose target changes never reuses another target's code.)
    pub fn get_or_compile(
        &self,
        backend: &dyn Backend,
        target: Option<&str>,
        key: &str,
        build: &dyn Fn() -> Result<Function, VerifyError>,
    ) -> Result<Artifact, BackendError> {
        self.get_or_make(backend.descriptor().name, target, key, &|| backend.compile(&build()?, target))
    }

    /// The artifact of `key` for `backend` (a name) and `target`, made by `make` the first
    /// time: for callers that compile otherwise than `Backend::compile` (through a disk cache).
    pub fn get_or_make(
        &self,
        backend: &'static str,
        target: Option<&str>,
        key: &str,
        make: &dyn Fn() -> Result<Artifact, BackendError>,
    ) -> Result<Artifact, BackendError> {
        let id = (backend, target.map(str::to_string), key.to_string());
        if let Some(a) = self.compiled.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
            return Ok(a.clone());
        }
        let artifact = make()?;
        self.compiled.lock().unwrap_or_else(|e| e.into_inner()).insert(id, artifact.clone());
        Ok(artifact)
    }
}
