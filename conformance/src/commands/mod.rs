//! The suite's commands (`trident test`, `trident ops`, `trident math`): each an `Args` the
//! `trident` command line parses and the `main` it runs.

pub mod math;
pub mod ops;
pub mod test;
