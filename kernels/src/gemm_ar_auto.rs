//! Which GEMM + AllReduce form to run for a problem: one-shot ([`crate::gemm_ar`]: every tile
//! pushed to every rank, `(W - 1) M N` elements out of each rank, one step after the GEMM's
//! tile) up to a size of the result, two-shot ([`crate::gemm_ar_two_shot`]: GEMM-RS then the
//! AllGather of the sums, `2 (W - 1) / W M N`, two steps) above, where M splits over the ranks.
//!
//! The crossover is per device, world size and transport (`RankCtx::topology`), read from the
//! tuning cache (operation `gemm_ar`), where `trident bench --world W` records the one it
//! measured; until then [`GemmArCrossover::DEFAULT`].

use crate::tuning::{crossover, TuningCache, TuningKey};
use serde::{Deserialize, Serialize};
use trident_core::ir::DType;
use trident_core::world::RankCtx;

/// The two forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GemmArForm {
    OneShot,
    TwoShot,
}

/// Bytes of the `M x N` result up to which one-shot is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmArCrossover {
    pub one_shot_up_to: usize,
}

impl GemmArCrossover {
    /// Until measured: one-shot up to 4 MB of result (every decode shape of issue 31: M 256 x
    /// N 5120 bf16 is 2.6 MB, whose W copies are what one-shot was made for), two-shot above
    /// (the prefill shape's 400 MB would be sent W - 1 times).
    pub const DEFAULT: GemmArCrossover = GemmArCrossover { one_shot_up_to: 4 << 20 };

    pub fn form(&self, bytes: usize) -> GemmArForm {
        if bytes <= self.one_shot_up_to {
            GemmArForm::OneShot
        } else {
            GemmArForm::TwoShot
        }
    }

    /// The crossover of measured `(bytes, form, ms)`: the largest size up to which one-shot was
    /// at least as fast at every size measured; `None` when no size has both.
    pub fn from_measurements(times: &[(usize, GemmArForm, f64)]) -> Option<GemmArCrossover> {
        let time = |s: usize, f: GemmArForm| times.iter().find(|t| t.0 == s && t.1 == f).map(|t| t.2);
        let both = |s: &usize| time(*s, GemmArForm::OneShot).is_some() && time(*s, GemmArForm::TwoShot).is_some();
        let sizes: Vec<usize> = times.iter().map(|t| t.0).filter(both).collect();
        if sizes.is_empty() {
            return None;
        }
        let one_shot_up_to = crossover(sizes, |s| time(s, GemmArForm::OneShot) <= time(s, GemmArForm::TwoShot));
        Some(GemmArCrossover { one_shot_up_to })
    }

    /// The tuning cache's key at `topology` and `world` ranks (measured in bf16; by bytes).
    pub fn tuning_key(topology: &str, world: usize) -> TuningKey {
        TuningKey { op: "gemm_ar", device: topology.to_string(), world, dtype: DType::BF16, shape: Vec::new() }
    }

    /// The crossover recorded for this world in the tuning cache, else [`Self::DEFAULT`].
    pub fn for_world(ctx: &dyn RankCtx) -> GemmArCrossover {
        let key = Self::tuning_key(&ctx.topology(), ctx.world_size());
        TuningCache::shared().get::<GemmArCrossover>(&key).map_or(Self::DEFAULT, |t| t.config)
    }
}

impl GemmArForm {
    /// The form for an `m x n` result of `dtype` in `ctx`'s world: one-shot where M does not
    /// split over the ranks (two-shot's GEMM-RS needs it to), else by the crossover.
    pub fn auto(ctx: &dyn RankCtx, dtype: DType, (m, n): (usize, usize)) -> GemmArForm {
        if !m.is_multiple_of(ctx.world_size()) {
            return GemmArForm::OneShot;
        }
        GemmArCrossover::for_world(ctx).form(m * n * dtype.size_bytes() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GemmArForm::*;

    #[test]
    fn one_shot_up_to_the_last_size_it_won() {
        let t = [(1 << 20, OneShot, 1.0), (1 << 20, TwoShot, 1.4), (8 << 20, OneShot, 2.0), (8 << 20, TwoShot, 1.5)];
        let x = GemmArCrossover::from_measurements(&t).unwrap();
        assert_eq!(x.one_shot_up_to, 1 << 20);
        assert_eq!((x.form(1 << 20), x.form((1 << 20) + 1)), (OneShot, TwoShot));
        assert_eq!(GemmArCrossover::from_measurements(&[(8, OneShot, 1.0)]), None);
        assert_eq!(GemmArCrossover::DEFAULT.form(256 * 5120 * 2), OneShot);
        assert_eq!(GemmArCrossover::DEFAULT.form(28000 * 7168 * 2), TwoShot);
    }
}
