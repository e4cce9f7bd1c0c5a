//! Every kernel's IR prints, parses back, verifies, and prints to the same text; the printed
//! form of each kernel is held as a snapshot (re-bless with `INSTA_UPDATE=always cargo test`).

mod common;

use trident_core::{text, verify};

#[test]
fn every_kernel_round_trips_through_text() {
    for f in common::all_kernels() {
        let printed = text::print(&f);
        let parsed = text::parse(&printed).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        verify(&parsed).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(text::print(&parsed), printed, "{} does not round-trip", f.name);
    }
}

#[test]
fn kernel_ir_snapshots() {
    for f in common::all_kernels() {
        insta::assert_snapshot!(f.name.clone(), text::print(&f));
    }
}
