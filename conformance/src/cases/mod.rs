//! One file per operation of the catalogue, each registering itself (`crate::registry`): its
//! conformance cases (shapes per world size, inputs from a seed, the f64 reference, how it runs)
//! and, for the distributed ones, its part of the distributed benchmark. Every file here is a
//! module: adding an operation adds a file and edits none.

automod::dir!("src/cases");
