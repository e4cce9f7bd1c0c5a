//! `trident launch -n N [--bound-ms B] -- PROGRAM ARGS..`: one process per rank on this node,
//! with the world's rendezvous (see the library's docs). Exits 0 when every rank did, else 1
//! after naming the rank that failed first; 2 on usage errors.

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "trident", about = "trident's command line")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs PROGRAM once per rank of a world of N processes on this node.
    Launch {
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
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Launch { ranks, bound_ms, grace_ms, command } => {
            if ranks == 0 {
                eprintln!("trident launch: -n must be at least 1");
                return ExitCode::from(2);
            }
            let (program, args) = command.split_first().expect("clap requires the command");
            match trident_launcher::launch(
                ranks,
                program,
                args,
                Duration::from_millis(bound_ms),
                Duration::from_millis(grace_ms),
            ) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("trident launch: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
