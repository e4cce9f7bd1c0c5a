//! The registry of operations: one type per operation of the catalogue, each in its own file of
//! `cases/`, registered with `inventory::submit!`. The suite, the distributed benchmark and its
//! report iterate the registry; nothing else lists operations, so adding one touches its kernel
//! file in `kernels/`, its case file here and its Python baseline.

use crate::dist_bench::{DistCase, Timer};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::DeviceCtx;

/// Every rank's inputs and the output each must end with (one rank for a single-device case).
pub struct WorldData {
    pub inputs: Vec<Vec<Vec<f64>>>,
    pub expected: Vec<Vec<f64>>,
    /// The longest sum behind an output element (scales the error bound).
    pub reduction_len: usize,
    /// What the data lets the bound grow by beyond the operation's (`Operation::bound`), as a
    /// normwise error: where an intermediate is quantized, the roundings a correct kernel may
    /// take the other way than the f64 reference (the FP8 MoE blocks' SwiGLU output). 0 for
    /// most operations.
    pub slack: f64,
}

impl WorldData {
    /// The data of a single-device case: one rank.
    pub fn single(inputs: Vec<Vec<f64>>, expected: Vec<f64>, reduction_len: usize) -> WorldData {
        WorldData { inputs: vec![inputs], expected: vec![expected], reduction_len, slack: 0.0 }
    }
}

/// An operation's conformance cases and, where it has one, its distributed benchmark.
pub trait Operation: Sync {
    /// Its name in the suite, the reports and `--kernel`; the `operation` of its catalogue
    /// entries (`trident_kernels::Catalogued`).
    fn name(&self) -> &'static str;
    /// Its variants at `dtype` (`["-"]` when it has none).
    fn variants(&self, dtype: DType) -> &'static [&'static str] {
        let _ = dtype;
        &["-"]
    }
    /// The element types of a single-device case's `inputs` inputs, in order: the case's own
    /// by default (an FP8 GEMM's are FP8 and f32 scales; its output is the case's type).
    fn input_types(&self, case: &Case, inputs: usize) -> Vec<DType> {
        vec![case.dtype; inputs]
    }
    /// Whether it runs in a world of ranks (then at every world size the suite runs).
    fn distributed(&self) -> bool;
    /// The conformance shapes at `world` ranks (1 for single-device operations).
    fn shapes(&self, world: usize) -> Vec<Vec<usize>>;
    /// Every rank's inputs from `rng`, and the f64 reference of every rank's output (computed
    /// here, independently of the kernels).
    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData;
    /// The accepted normwise error (`suite::bound`; 0 for operations that only move data).
    fn bound(&self, case: &Case, reduction_len: usize) -> f64 {
        crate::suite::bound(case.dtype, case.variant, reduction_len)
    }
    /// A single-device operation on `l`'s device: `ins` hold the inputs, `out` (poisoned) the
    /// output of `out_len` elements.
    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        let _ = (l, ins, out);
        Err(BackendError::Host(format!("`{}` is not a single-device operation", case.kernel)))
    }
    /// A distributed operation on rank `ctx.rank()`, set up once (buffers, inputs: `inputs` its
    /// input values, `ins` them uploaded): then called, recorded and replayed by the suite
    /// (`crate::distributed`), its output `out_len` elements.
    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let _ = (ctx, inputs, ins, out_len);
        Err(BackendError::Host(format!("`{}` is not a distributed operation", case.kernel)))
    }
    /// Its part of the distributed benchmark (`trident bench --world W`), if any.
    fn benchmark(&self) -> Option<&dyn Benchmark> {
        None
    }
}

/// A distributed operation's state on one rank ([`Operation::setup_rank`]): called any number
/// of times, each call's output read back after it completed.
pub trait RankOp {
    /// Poisons the output call `call` (numbered from 1) will write.
    fn poison(&self, ctx: &dyn RankCtx, call: u64) -> Result<(), BackendError>;
    /// Enqueues the next call: kernel launches (recordable), or for the copy-engine forms
    /// copies and stream signals, which recording refuses.
    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError>;
    /// The output of call `call`, once it completed.
    fn result(&self, ctx: &dyn RankCtx, call: u64) -> Result<Vec<f64>, BackendError>;
    /// Collective: after a timed-out wait, signals and epochs back to zero on every rank, so
    /// that the next call is call 1 again (`trident_kernels::epoch::rearm`).
    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError>;
}

/// An operation in the distributed benchmark: its shapes, what it moves and computes, and how
/// its variants are checked and timed. The baseline script (`bench/baseline_dist.py`) times the
/// vendor's pipeline for the same case line (`DistCase::key`).
pub trait Benchmark: Sync {
    /// The benchmark's shapes at `world` ranks (bf16), as the baseline script reads them.
    fn shapes(&self, world: usize) -> Vec<Vec<usize>>;
    /// A small shape at `world` ranks that runs every variant in the CPU world (tests).
    fn small_shape(&self, world: usize) -> Vec<usize>;
    /// Symmetric heap bytes a rank needs (every variant has its own buffers).
    fn heap_bytes(&self, case: &DistCase) -> usize;
    /// The bytes each rank sends over its links in the communication alone (the collective's
    /// bus bytes, as nccl-tests counts them).
    fn bus_bytes(&self, case: &DistCase) -> f64;
    /// FLOPs of one rank's computation (0 for collectives).
    fn rank_flops(&self, case: &DistCase) -> f64 {
        let _ = case;
        0.0
    }
    /// Checks every variant on poisoned outputs, then times it (`Timer::time`).
    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError>;
    /// Whether `variant` is the whole operation (others are its parts or a pipeline of them).
    fn is_fused(&self, variant: &str) -> bool {
        let _ = variant;
        true
    }
    /// The variant of the same run `variant` is measured against (the report prints their
    /// ratio): a kernel with its overlap machinery against the plain one, or an overlapped
    /// pipeline against the same steps one after the other.
    fn compared_with(&self, variant: &str) -> Option<&'static str> {
        let _ = variant;
        None
    }
    /// Compute and communication of the bound max(compute, communication), each at its
    /// faster implementation of this run: `time_of` a variant of trident's, the vendor's
    /// `cublas` and `nccl` parts, `link_floor` the bus bytes over the links. By default a
    /// collective: no compute, the link floor.
    fn parts(
        &self,
        time_of: &dyn Fn(&str) -> Option<f64>,
        cublas: Option<f64>,
        nccl: Option<f64>,
        link_floor: f64,
    ) -> (Option<f64>, Option<f64>) {
        let _ = (time_of, cublas, nccl);
        (Some(0.0), Some(link_floor))
    }
}

/// A registered operation (`inventory::submit! { Registered(&MyOperation) }`).
pub struct Registered(pub &'static dyn Operation);

inventory::collect!(Registered);

/// Every registered operation, by name.
pub fn operations() -> Vec<&'static dyn Operation> {
    let mut all: Vec<&'static dyn Operation> = inventory::iter::<Registered>.into_iter().map(|r| r.0).collect();
    all.sort_by_key(|o| o.name());
    all
}

/// The registered operation called `name`.
pub fn find(name: &str) -> Option<&'static dyn Operation> {
    inventory::iter::<Registered>.into_iter().map(|r| r.0).find(|o| o.name() == name)
}

/// The faster of two optional times.
pub fn faster(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

#[cfg(test)]
mod tests {
    /// Every specialization of the kernel catalogue belongs to a registered operation, and
    /// every operation's kind (single-device or distributed) matches its kernels'.
    #[test]
    fn every_catalogue_kernel_has_its_conformance_case() {
        for k in trident_kernels::catalogued() {
            let op = super::find(k.operation)
                .unwrap_or_else(|| panic!("catalogue kernel `{}` (operation `{}`) has no case", k.name, k.operation));
            assert_eq!(op.distributed(), k.distributed, "{}", k.name);
        }
        let names: Vec<&str> = super::operations().iter().map(|o| o.name()).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique, "one registration per operation");
    }
}
