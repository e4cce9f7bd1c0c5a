//! What the command-line tools share: usage errors (exit code 2), seeds, backend lookup.

use std::process::ExitCode;
use trident_core::backend::{self, BackendDescriptor};

/// Prints a usage error; the tools exit with code 2 for every one of them.
pub fn usage(m: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {m}");
    ExitCode::from(2)
}

/// A seed given as decimal or 0x-hex.
pub fn parse_seed(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("--seed {s}: not a decimal or 0x-hex u64"))
}

/// `--seed`'s value, or a fresh one from the clock and the process id.
pub fn seed(given: Option<&str>) -> Result<u64, String> {
    match given {
        Some(s) => parse_seed(s),
        None => {
            let t =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
            Ok((t as u64) ^ ((t >> 64) as u64) ^ (std::process::id() as u64).rotate_left(32))
        }
    }
}

/// The registered backend `name`, checked to have `target` (`None`: its default).
pub fn backend(name: &str, target: Option<&str>) -> Result<&'static BackendDescriptor, String> {
    let d = backend::lookup(name).map_err(|e| e.to_string())?;
    d.resolve_target(target).map_err(|e| e.to_string())?;
    Ok(d)
}
