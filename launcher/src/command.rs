//! `trident launch -n N [--bound-ms B] -- PROGRAM ARGS..`: one process per rank on this node,
//! with the world's rendezvous (see the library's docs). Exits 0 when every rank did, else 1
//! after naming the rank that failed first; 2 on usage errors.

use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Ranks (processes).
    #[arg(short = 'n', long)]
    ranks: usize,
    /// Bound of every rendezvous operation of a rank (barriers, gathers), in ms.
    #[arg(long, default_value_t = 60_000)]
    bound_ms: u64,
    /// How long ranks may go on after the first failure before they are stopped, in ms.
    #[arg(long, default_value_t = 10_000)]
    grace_ms: u64,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// `trident launch`: runs PROGRAM once per rank of a world of N processes on this node.
pub fn main(a: Args) -> ExitCode {
    if a.ranks == 0 {
        eprintln!("trident launch: -n must be at least 1");
        return ExitCode::from(2);
    }
    let Some((program, args)) = a.command.split_first() else {
        eprintln!("trident launch: no program given");
        return ExitCode::from(2);
    };
    match crate::launch(a.ranks, program, args, Duration::from_millis(a.bound_ms), Duration::from_millis(a.grace_ms)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trident launch: {e}");
            ExitCode::FAILURE
        }
    }
}
