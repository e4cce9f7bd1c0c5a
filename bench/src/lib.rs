//! trident-bench: the benchmarks of `trident bench`. Single-device kernels against cuBLAS and
//! PyTorch (`bench/baseline.py`), the distributed operations of the registry against NCCL and
//! cuBLAS under torchrun (`bench/baseline_dist.py`, their report in [`dist_report`]), and the
//! loopback overlap benchmark ([`overlap`]). How each distributed operation is checked and
//! timed is its case's (`trident_conformance::registry::Benchmark`); this crate runs them,
//! runs the baselines, and reports.

pub mod command;
pub mod dist_report;
pub mod overlap;
pub mod plot;
pub mod plot_world;
