//! A rank of a world that only meets the others: joins the rendezvous from the environment
//! (`WorldEnv`), passes a barrier, gathers every rank's number and checks it; prints one line.
//! `PROBE_FAIL_RANK=r` makes rank r exit with status 3 after the first barrier (a planted
//! failure: the others must fail through the rendezvous, not hang).

use std::io::Write;
use std::process::ExitCode;
use trident_gpu_runtime::world_env::WorldEnv;

/// `trident rendezvous-probe`.
pub fn main() -> ExitCode {
    let env = match WorldEnv::from_env() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("probe: {e}");
            return ExitCode::from(2);
        }
    };
    let bound = env.bound;
    let run = || -> Result<(), String> {
        let mut c = env.connect(trident_launcher::VERSION, bound).map_err(|e| e.to_string())?;
        c.barrier("start").map_err(|e| e.to_string())?;
        if std::env::var("PROBE_FAIL_RANK").ok().and_then(|v| v.parse::<usize>().ok()) == Some(env.rank) {
            std::process::exit(3);
        }
        let all = c.all_gather("ranks", &(env.rank as u32).to_le_bytes()).map_err(|e| e.to_string())?;
        for (r, d) in all.iter().enumerate() {
            if d.as_slice() != (r as u32).to_le_bytes() {
                return Err(format!("rank {r} sent {d:?}"));
            }
        }
        c.barrier("end").map_err(|e| e.to_string())
    };
    match run() {
        // One write per line: the ranks share the launcher's terminal.
        Ok(()) => {
            let line = format!("probe: rank {} of {} met every rank\n", env.rank, env.size);
            let _ = std::io::stdout().write_all(line.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = std::io::stderr().write_all(format!("probe: rank {}: {e}\n", env.rank).as_bytes());
            ExitCode::FAILURE
        }
    }
}
