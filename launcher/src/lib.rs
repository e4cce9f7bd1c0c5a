//! `trident launch`: starts one process per rank of a world on this node, serves the world's
//! rendezvous (`trident_gpu_runtime::rendezvous`) and passes each process its place
//! (`TRIDENT_RANK`, `TRIDENT_WORLD_SIZE`, `TRIDENT_LOCAL_RANK`, `TRIDENT_RENDEZVOUS`; read back
//! by `trident_gpu_runtime::world_env::WorldEnv`). When a rank fails, the others fail through
//! the rendezvous within their bound; whoever is still running `grace` later is stopped. The
//! launch then fails naming the rank that failed first and how.

pub mod command;

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};
use trident_gpu_runtime::rendezvous::Server;

/// The version every rank must run (checked by the rendezvous at start-up).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start the rendezvous: {0}")]
    Rendezvous(std::io::Error),
    #[error("cannot start rank {rank} (`{program}`): {error}")]
    Spawn { rank: usize, program: String, error: std::io::Error },
    #[error("rank {rank} failed first ({status}); {others}")]
    RankFailed { rank: usize, status: String, others: String },
}

/// One process per rank of a world of `ranks` running `program args`, each rank's operations on
/// the rendezvous bounded by `bound`; stragglers are stopped `grace` after the first failure.
pub fn launch(
    ranks: usize,
    program: &str,
    args: &[String],
    bound: Duration,
    grace: Duration,
) -> Result<(), LaunchError> {
    let server = Server::start("127.0.0.1:0", ranks, VERSION).map_err(LaunchError::Rendezvous)?;
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let child = Command::new(program)
            .args(args)
            .env("TRIDENT_RANK", rank.to_string())
            .env("TRIDENT_WORLD_SIZE", ranks.to_string())
            .env("TRIDENT_LOCAL_RANK", rank.to_string())
            .env("TRIDENT_RENDEZVOUS", server.addr.to_string())
            .env("TRIDENT_RENDEZVOUS_BOUND_MS", bound.as_millis().to_string())
            .spawn();
        match child {
            Ok(c) => children.push((rank, c)),
            Err(error) => {
                for (_, c) in children.iter_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(LaunchError::Spawn { rank, program: program.to_string(), error });
            }
        }
    }
    let mut status: Vec<Option<ExitStatus>> = vec![None; ranks];
    let mut first: Option<(usize, ExitStatus, Instant)> = None;
    while status.iter().any(Option::is_none) {
        for (rank, c) in children.iter_mut() {
            if status[*rank].is_none() {
                if let Ok(Some(s)) = c.try_wait() {
                    status[*rank] = Some(s);
                    if !s.success() && first.is_none() {
                        first = Some((*rank, s, Instant::now()));
                    }
                }
            }
        }
        if let Some((_, _, at)) = first {
            if at.elapsed() > grace {
                for (rank, c) in children.iter_mut() {
                    if status[*rank].is_none() {
                        let _ = c.kill();
                        status[*rank] = c.wait().ok();
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let Some((rank, s, _)) = first else { return Ok(()) };
    let others: Vec<String> = status
        .iter()
        .enumerate()
        .filter(|(r, _)| *r != rank)
        .map(|(r, s)| format!("rank {r}: {}", s.map(|s| s.to_string()).unwrap_or_else(|| "unknown".into())))
        .collect();
    Err(LaunchError::RankFailed { rank, status: s.to_string(), others: others.join(", ") })
}
