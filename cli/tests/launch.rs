//! `trident launch` with real processes (the rendezvous probe): every rank meets the others;
//! a planted failing rank makes the launch fail naming it first, and the other ranks end through
//! the rendezvous (not by the launcher stopping them, not by hanging).

use std::process::Command;
use std::time::{Duration, Instant};

const TRIDENT: &str = env!("CARGO_BIN_EXE_trident");
/// What each rank runs: `trident rendezvous-probe`.
const PROBE: [&str; 2] = [TRIDENT, "rendezvous-probe"];

#[test]
fn every_rank_meets_the_others() {
    let out = Command::new(TRIDENT)
        .args(["launch", "-n", "4", "--bound-ms", "10000", "--", PROBE[0], PROBE[1]])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}{}", stdout, String::from_utf8_lossy(&out.stderr));
    for r in 0..4 {
        assert!(stdout.contains(&format!("probe: rank {r} of 4 met every rank")), "{stdout}");
    }
}

#[test]
fn a_failing_rank_is_named_and_the_others_end_within_the_bound() {
    let start = Instant::now();
    let out = Command::new(TRIDENT)
        .args(["launch", "-n", "3", "--bound-ms", "20000", "--grace-ms", "20000", "--", PROBE[0], PROBE[1]])
        .env("PROBE_FAIL_RANK", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rank 1 failed first (exit status: 3)"), "{stderr}");
    // The others failed on their own, told by the rendezvous that rank 1 died.
    for r in [0, 2] {
        let line = stderr.lines().find(|l| l.starts_with(&format!("probe: rank {r}: "))).unwrap_or_default();
        assert!(line.contains("rank 1 died"), "rank {r}:\n{stderr}");
    }
    assert!(start.elapsed() < Duration::from_secs(15), "ended by the rendezvous, long before the bound");
}

#[test]
fn a_program_that_cannot_start_is_a_typed_error() {
    let out = Command::new(TRIDENT).args(["launch", "-n", "2", "--", "/nonexistent/program"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("cannot start rank 0 (`/nonexistent/program`)"), "{stderr}");
}
