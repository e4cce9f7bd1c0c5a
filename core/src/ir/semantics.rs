//! The meaning of every op on every backend (the text of `docs/SEMANTICS.md`).
#![doc = include_str!("../../../docs/SEMANTICS.md")]
