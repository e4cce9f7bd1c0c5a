//! Where a process stands in a world of processes, read from the environment its launcher set:
//! `trident launch` (`TRIDENT_RANK`, `TRIDENT_WORLD_SIZE`, `TRIDENT_LOCAL_RANK`,
//! `TRIDENT_RENDEZVOUS`), torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`), Slurm (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`) or Open MPI
//! (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`), first match
//! wins. The rendezvous (`crate::rendezvous`) is the launcher's under `trident launch`; under
//! the others rank 0 hosts it, at `TRIDENT_RENDEZVOUS` when set, else (torchrun) at
//! `MASTER_ADDR` and the port after `MASTER_PORT` (torch's own store has that one).

use crate::rendezvous::{Client, RendezvousError, Server};
use std::time::Duration;

/// This process's place in the world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorldEnv {
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    /// `host:port` of the rendezvous.
    pub rendezvous: Option<String>,
    /// Whether this process serves the rendezvous (rank 0 without `trident launch`).
    pub hosts_rendezvous: bool,
    /// Which launcher's variables these were.
    pub source: &'static str,
    /// How long a rendezvous operation may wait for the others: `TRIDENT_RENDEZVOUS_BOUND_MS`
    /// (`trident launch --bound-ms` sets it), else 60 s.
    pub bound: Duration,
}

/// The rendezvous bound when the environment sets none.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(60);

/// The environment does not describe a world, or describes it inconsistently.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorldEnvError {
    #[error("no launcher variables (trident launch, torchrun, Slurm or Open MPI) in the environment")]
    Absent,
    #[error("{launcher}: {message}")]
    Invalid { launcher: &'static str, message: String },
}

impl WorldEnv {
    /// This process's place, from the process environment.
    pub fn from_env() -> Result<WorldEnv, WorldEnvError> {
        Self::from_vars(&|k| std::env::var(k).ok())
    }

    /// This process's place, from the variables `var` returns.
    pub fn from_vars(var: &dyn Fn(&str) -> Option<String>) -> Result<WorldEnv, WorldEnvError> {
        let schemes: [(&'static str, [&str; 3]); 4] = [
            ("trident launch", ["TRIDENT_RANK", "TRIDENT_WORLD_SIZE", "TRIDENT_LOCAL_RANK"]),
            ("torchrun", ["RANK", "WORLD_SIZE", "LOCAL_RANK"]),
            ("Slurm", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"]),
            ("Open MPI", ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"]),
        ];
        let (source, names) = schemes.into_iter().find(|(_, n)| var(n[0]).is_some()).ok_or(WorldEnvError::Absent)?;
        let invalid = |message: String| WorldEnvError::Invalid { launcher: source, message };
        let num = |name: &str, required: bool| -> Result<Option<usize>, WorldEnvError> {
            match var(name) {
                Some(v) => v.trim().parse().map(Some).map_err(|_| invalid(format!("{name}={v} is not a number"))),
                None if required => Err(invalid(format!("{name} is not set"))),
                None => Ok(None),
            }
        };
        let rank = num(names[0], true)?.unwrap_or(0);
        let size = num(names[1], true)?.unwrap_or(0);
        let local_rank = num(names[2], false)?.unwrap_or(rank);
        if size == 0 || rank >= size {
            return Err(invalid(format!("rank {rank} in a world of {size}")));
        }
        let explicit = var("TRIDENT_RENDEZVOUS");
        let rendezvous = explicit.clone().or_else(|| {
            let (addr, port) = (var("MASTER_ADDR")?, var("MASTER_PORT")?.parse::<u16>().ok()?);
            Some(format!("{addr}:{}", port.checked_add(1)?))
        });
        let hosts_rendezvous = source != "trident launch" && rank == 0;
        let bound = match var("TRIDENT_RENDEZVOUS_BOUND_MS") {
            Some(v) => match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => return Err(invalid(format!("TRIDENT_RENDEZVOUS_BOUND_MS={v} is not a positive number"))),
            },
            None => DEFAULT_BOUND,
        };
        Ok(WorldEnv { rank, size, local_rank, rendezvous, hosts_rendezvous, source, bound })
    }

    /// Joins the world's rendezvous (serving it first where this process hosts it), every
    /// operation bounded by `bound`.
    pub fn connect(&self, version: &str, bound: Duration) -> Result<Client, RendezvousError> {
        let addr = self.rendezvous.clone().ok_or_else(|| RendezvousError::Connect {
            addr: "?".into(),
            message: format!(
                "{} set no rendezvous address: set TRIDENT_RENDEZVOUS=host:port (rank 0 serves it)",
                self.source
            ),
        })?;
        if self.hosts_rendezvous {
            let bind = match addr.rsplit_once(':') {
                Some((_, port)) => format!("0.0.0.0:{port}"),
                None => addr.clone(),
            };
            Server::start(&bind, self.size, version)
                .map_err(|e| RendezvousError::Connect { addr: bind.clone(), message: format!("serving: {e}") })?;
        }
        // Other ranks may start before rank 0 serves: retry the connection within the bound.
        let start = std::time::Instant::now();
        loop {
            match Client::connect(&addr, self.rank, self.size, version, bound) {
                Err(RendezvousError::Connect { message, .. })
                    if start.elapsed() < bound && message.contains("refused") =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<WorldEnv, WorldEnvError> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        WorldEnv::from_vars(&|k| map.get(k).cloned())
    }

    #[test]
    fn launchers_variables_give_the_place_and_the_rendezvous() {
        let t = env(&[("TRIDENT_RANK", "2"), ("TRIDENT_WORLD_SIZE", "4"), ("TRIDENT_RENDEZVOUS", "10.0.0.1:5000")])
            .unwrap();
        assert_eq!((t.rank, t.size, t.local_rank, t.hosts_rendezvous), (2, 4, 2, false));
        assert_eq!(t.rendezvous.as_deref(), Some("10.0.0.1:5000"));
        assert_eq!(t.bound, DEFAULT_BOUND);
        let b = env(&[("TRIDENT_RANK", "0"), ("TRIDENT_WORLD_SIZE", "1"), ("TRIDENT_RENDEZVOUS_BOUND_MS", "1500")]);
        assert_eq!(b.unwrap().bound, Duration::from_millis(1500));
        let torch = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!((torch.source, torch.hosts_rendezvous), ("torchrun", true));
        assert_eq!(torch.rendezvous.as_deref(), Some("node0:29501"));
        let slurm = env(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "16"), ("SLURM_LOCALID", "1")]).unwrap();
        assert_eq!((slurm.rank, slurm.size, slurm.local_rank, slurm.rendezvous), (5, 16, 1, None));
        let mpi = env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap();
        assert_eq!((mpi.source, mpi.rank), ("Open MPI", 1));
    }

    #[test]
    fn inconsistent_or_missing_variables_are_typed_errors() {
        assert_eq!(env(&[]), Err(WorldEnvError::Absent));
        let e = env(&[("RANK", "4"), ("WORLD_SIZE", "4")]).unwrap_err();
        assert!(e.to_string().contains("rank 4 in a world of 4"), "{e}");
        let e = env(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")]).unwrap_err();
        assert!(e.to_string().contains("SLURM_PROCID=x"), "{e}");
        let e = env(&[("TRIDENT_RANK", "0"), ("TRIDENT_WORLD_SIZE", "1"), ("TRIDENT_RENDEZVOUS_BOUND_MS", "0")]);
        assert!(e.unwrap_err().to_string().contains("TRIDENT_RENDEZVOUS_BOUND_MS=0"));
        let e = env(&[("TRIDENT_RANK", "0")]).unwrap_err();
        assert!(e.to_string().contains("TRIDENT_WORLD_SIZE is not set"), "{e}");
        let no_addr = env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]).unwrap();
        let e = no_addr.connect("v", Duration::from_millis(100)).err().unwrap();
        assert!(e.to_string().contains("TRIDENT_RENDEZVOUS"), "{e}");
    }
}
