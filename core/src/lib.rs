//! trident-core: the tile IR and everything target-independent around it.
//!
//! Owns: the IR ([`ir`]), the builder API ([`builder`]), the verifier ([`verify`]), the text
//! format ([`text`]), the elementary functions every backend shares ([`math`]), the SIMT
//! lowering ([`simt`]), the backend contract with its registry ([`backend`]) and the host API of
//! multi-rank worlds ([`world`]).
//! Does not own: execution (the backends), communication semantics (`trident-shmem-abi` holds
//! that vocabulary), or any kernel (`trident-kernels`).

pub mod abi;
pub mod backend;
pub mod builder;
pub mod capture;
pub mod fp8;
pub mod ir;
pub mod math;
pub mod simt;
pub mod target;
pub mod text;
pub mod trace;
pub mod verify;
pub mod world;

pub use builder::{KernelBuilder, Tile};
pub use ir::Function;
pub use verify::{verify, VerifyError};
