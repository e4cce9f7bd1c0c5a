//! Which AllGather to run for a message: the low-latency protocol for small messages
//! ([`crate::allgather_ll`]: one kernel, no signal round trip, twice the bytes), the in-kernel
//! push for mid-sized ones ([`crate::allgather::AllGather`]), the copy engine for large ones
//! ([`crate::allgather::AllGatherCe`]: no SMs, the links' full bandwidth).
//!
//! The crossovers ([`GatherCrossovers`]) are per device, world size and transport between ranks
//! (`RankCtx::topology`), read from the tuning cache (`crate::tuning`, operation `allgather`,
//! once per process), where `trident bench --world W` records the ones it measured; until then
//! the defaults below.

use crate::tuning::{crossover, TuningCache, TuningKey};
use serde::{Deserialize, Serialize};
use trident_core::ir::DType;
use trident_core::world::RankCtx;

/// An AllGather form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GatherForm {
    LowLatency,
    Push,
    CopyEngine,
}

/// Gathered bytes (every rank's chunk together) up to which each form is chosen: the
/// low-latency one up to `ll_up_to`, the push up to `push_up_to`, the copy engine above.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatherCrossovers {
    pub ll_up_to: usize,
    pub push_up_to: usize,
}

impl GatherCrossovers {
    /// Until measured: the low-latency protocol up to 256 KB gathered (it doubles the bytes and
    /// wins while a round trip of signal and fence dominates: NCCL keeps LL to messages of this
    /// order), the push up to 4 MB (a kernel launch and its programs' stores beat the copy
    /// engine's per-copy setup there), the copy engine above.
    pub const DEFAULT: GatherCrossovers = GatherCrossovers { ll_up_to: 256 << 10, push_up_to: 4 << 20 };

    /// The form for `gathered` bytes; `ll_ok` says whether the low-latency form can move the
    /// chunk (4-byte words: [`crate::allgather_ll::LlBuffers`]).
    pub fn form(&self, gathered: usize, ll_ok: bool) -> GatherForm {
        if ll_ok && gathered <= self.ll_up_to {
            GatherForm::LowLatency
        } else if gathered <= self.push_up_to {
            GatherForm::Push
        } else {
            GatherForm::CopyEngine
        }
    }

    /// The crossovers of measured times: `(gathered bytes, form, ms)` of every form at several
    /// sizes. A form's range ends at the largest size up to which it was the fastest at every
    /// size measured (the low-latency form against both, the push against the copy engine);
    /// `None` when nothing was measured.
    pub fn from_measurements(times: &[(usize, GatherForm, f64)]) -> Option<GatherCrossovers> {
        if times.is_empty() {
            return None;
        }
        let sizes = || times.iter().map(|t| t.0);
        let time = |s: usize, f: GatherForm| times.iter().find(|t| t.0 == s && t.1 == f).map(|t| t.2);
        let ll_up_to = crossover(sizes(), |s| match time(s, GatherForm::LowLatency) {
            Some(ll) => [GatherForm::Push, GatherForm::CopyEngine].iter().all(|f| time(s, *f).is_none_or(|t| ll <= t)),
            None => false,
        });
        let push_up_to = crossover(sizes(), |s| match (time(s, GatherForm::Push), time(s, GatherForm::CopyEngine)) {
            (Some(p), Some(c)) => p <= c,
            (Some(_), None) => true,
            _ => false,
        });
        Some(GatherCrossovers { ll_up_to, push_up_to: push_up_to.max(ll_up_to) })
    }

    /// The tuning cache's key of the crossovers at `topology` (`RankCtx::topology`) and
    /// `world` ranks (measured in bf16; they are by bytes).
    pub fn tuning_key(topology: &str, world: usize) -> TuningKey {
        TuningKey { op: "allgather", device: topology.to_string(), world, dtype: DType::BF16, shape: Vec::new() }
    }

    /// The crossovers recorded for this world in the tuning cache, else [`Self::DEFAULT`].
    pub fn for_world(ctx: &dyn RankCtx) -> GatherCrossovers {
        let key = Self::tuning_key(&ctx.topology(), ctx.world_size());
        TuningCache::shared().get::<GatherCrossovers>(&key).map_or(Self::DEFAULT, |t| t.config)
    }
}

/// The AllGather form for a chunk of `chunk` elements of `dtype` per rank in `ctx`'s world.
pub fn auto(ctx: &dyn RankCtx, dtype: DType, chunk: usize) -> GatherForm {
    let bytes = chunk * dtype.size_bytes() as usize;
    GatherCrossovers::for_world(ctx).form(bytes * ctx.world_size(), bytes.is_multiple_of(4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use GatherForm::*;

    #[test]
    fn forms_follow_the_crossovers() {
        let c = GatherCrossovers { ll_up_to: 1000, push_up_to: 5000 };
        assert_eq!(c.form(1000, true), LowLatency);
        assert_eq!(c.form(1000, false), Push);
        assert_eq!(c.form(1001, true), Push);
        assert_eq!(c.form(5001, true), CopyEngine);
    }

    #[test]
    fn crossovers_end_where_a_form_stops_winning() {
        let t = [
            (8, LowLatency, 1.0),
            (8, Push, 2.0),
            (8, CopyEngine, 9.0),
            (64, LowLatency, 2.0),
            (64, Push, 2.5),
            (64, CopyEngine, 9.0),
            (1024, LowLatency, 5.0),
            (1024, Push, 4.0),
            (1024, CopyEngine, 6.0),
            (8192, Push, 20.0),
            (8192, CopyEngine, 15.0),
            (32768, Push, 80.0),
            (32768, CopyEngine, 50.0),
        ];
        assert_eq!(GatherCrossovers::from_measurements(&t), Some(GatherCrossovers { ll_up_to: 64, push_up_to: 1024 }));
        // The copy engine faster from the start: the push's range is the low-latency one's.
        let t = [(8, LowLatency, 3.0), (8, Push, 5.0), (8, CopyEngine, 4.0)];
        assert_eq!(GatherCrossovers::from_measurements(&t), Some(GatherCrossovers { ll_up_to: 8, push_up_to: 8 }));
        assert_eq!(GatherCrossovers::from_measurements(&[]), None);
    }

    #[test]
    fn crossovers_round_trip_through_the_tuning_cache() {
        let dir = std::env::temp_dir().join(format!("trident-gather-{}", std::process::id()));
        let path = dir.join("tuning.json");
        let _ = std::fs::remove_dir_all(&dir);
        let key = GatherCrossovers::tuning_key("NVIDIA H200 / peer", 8);
        let mut c = TuningCache::load(path.clone());
        let x = GatherCrossovers { ll_up_to: 123, push_up_to: 4567 };
        c.record(&key, &crate::tuning::Tuned { config: x, ms: 0.0 }).unwrap();
        assert_eq!(TuningCache::load(path).get::<GatherCrossovers>(&key).map(|t| t.config), Some(x));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
