//! Which AllReduce algorithm to run for a message: one-shot (every rank reads every peer's
//! whole input: one step, `world - 1` times the bytes) up to a size, two-shot (reduce-scatter
//! then all-gather: twice the steps, the bytes of a ring) above.
//!
//! The crossover is per device, world size and transport (`RankCtx::topology`), read from the
//! tuning cache (`crate::tuning`, operation `allreduce`, once per process), where `trident bench
//! --world W` records the one it measured; until then [`AllReduceCrossover::DEFAULT`].

use crate::allreduce::Algorithm;
use crate::tuning::{crossover, TuningCache, TuningKey};
use serde::{Deserialize, Serialize};
use trident_core::ir::DType;
use trident_core::world::RankCtx;

/// Bytes (of one rank's input) up to which one-shot is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllReduceCrossover {
    pub one_shot_up_to: usize,
}

impl AllReduceCrossover {
    /// Until measured: one-shot up to 256 KB, where serving stacks' custom all-reduces (vLLM,
    /// TensorRT-LLM) switch to two-shot at up to 8 GPUs on NVLink.
    pub const DEFAULT: AllReduceCrossover = AllReduceCrossover { one_shot_up_to: 256 << 10 };

    pub fn algorithm(&self, bytes: usize) -> Algorithm {
        if bytes <= self.one_shot_up_to {
            Algorithm::OneShot
        } else {
            Algorithm::TwoShot
        }
    }

    /// The crossover of measured `(bytes, algorithm, ms)`: the largest size up to which one-shot
    /// was at least as fast at every size measured; `None` when no size has both.
    pub fn from_measurements(times: &[(usize, Algorithm, f64)]) -> Option<AllReduceCrossover> {
        let time = |s: usize, a: Algorithm| times.iter().find(|t| t.0 == s && t.1 == a).map(|t| t.2);
        let both = |s: &usize| time(*s, Algorithm::OneShot).is_some() && time(*s, Algorithm::TwoShot).is_some();
        let sizes: Vec<usize> = times.iter().map(|t| t.0).filter(both).collect();
        if sizes.is_empty() {
            return None;
        }
        let one_shot_up_to = crossover(sizes, |s| time(s, Algorithm::OneShot) <= time(s, Algorithm::TwoShot));
        Some(AllReduceCrossover { one_shot_up_to })
    }

    /// The tuning cache's key at `topology` and `world` ranks (measured in bf16; by bytes).
    pub fn tuning_key(topology: &str, world: usize) -> TuningKey {
        TuningKey { op: "allreduce", device: topology.to_string(), world, dtype: DType::BF16, shape: Vec::new() }
    }

    /// The crossover recorded for this world in the tuning cache, else [`Self::DEFAULT`].
    pub fn for_world(ctx: &dyn RankCtx) -> AllReduceCrossover {
        let key = Self::tuning_key(&ctx.topology(), ctx.world_size());
        TuningCache::shared().get::<AllReduceCrossover>(&key).map_or(Self::DEFAULT, |t| t.config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Algorithm::*;

    #[test]
    fn the_crossover_ends_where_one_shot_stops_winning() {
        let t = [(8, OneShot, 1.0), (8, TwoShot, 2.0), (512, OneShot, 3.0), (512, TwoShot, 3.0), (4096, OneShot, 9.0), (4096, TwoShot, 5.0)];
        let x = AllReduceCrossover::from_measurements(&t).unwrap();
        assert_eq!(x.one_shot_up_to, 512);
        assert_eq!(x.algorithm(512), OneShot);
        assert_eq!(x.algorithm(513), TwoShot);
        assert_eq!(AllReduceCrossover::from_measurements(&[(8, OneShot, 1.0)]), None);
    }
}
