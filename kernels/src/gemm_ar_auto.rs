//! Which GEMM + AllReduce form to run for a problem: one-shot ([`crate::gemm_ar`]: every tile
//! pushed to every rank, `(W - 1) M N` elements out of each rank, one step after the GEMM's
//! tile) up to a size of the result, two-shot ([`crate::gemm_ar_two_shot`]: GEMM-RS then the
//! AllGather of the sums, `2 (W - 1) / W M N`, two steps) above, where M splits over the ranks.
//!
//! The same choice as the AllReduce's ([`crate::allreduce_auto`]), with the same crossover
//! type and algorithms, its own measurements: the crossover is per device, world size and
//! transport (`RankCtx::topology`), read from the tuning cache (operation `gemm_ar`, by the
//! result's bytes), where `trident bench --world W` records the one it measured; until then
//! [`DEFAULT`].

use crate::allreduce::Algorithm;
use crate::allreduce_auto::AllReduceCrossover;
use crate::tuning::{TuningCache, TuningKey};
use trident_core::ir::DType;
use trident_core::world::RankCtx;

/// Until measured: one-shot up to 4 MB of result (every decode shape of issue 31: M 256 x
/// N 5120 bf16 is 2.6 MB, whose W copies are what one-shot was made for), two-shot above (the
/// prefill shape's 400 MB would be sent W - 1 times).
pub const DEFAULT: AllReduceCrossover = AllReduceCrossover { one_shot_up_to: 4 << 20 };

/// The tuning cache's key at `topology` and `world` ranks (measured in bf16; by bytes).
pub fn tuning_key(topology: &str, world: usize) -> TuningKey {
    TuningKey { op: "gemm_ar", device: topology.to_string(), world, dtype: DType::BF16, shape: Vec::new() }
}

/// The crossover recorded for this world in the tuning cache, else [`DEFAULT`].
pub fn crossover_for_world(ctx: &dyn RankCtx) -> AllReduceCrossover {
    let key = tuning_key(&ctx.topology(), ctx.world_size());
    TuningCache::shared().get::<AllReduceCrossover>(&key).map_or(DEFAULT, |t| t.config)
}

/// The form for an `m x n` result of `dtype` in `ctx`'s world: one-shot where M does not split
/// over the ranks (two-shot's GEMM-RS needs it to), else by the crossover.
pub fn auto(ctx: &dyn RankCtx, dtype: DType, (m, n): (usize, usize)) -> Algorithm {
    if !m.is_multiple_of(ctx.world_size()) {
        return Algorithm::OneShot;
    }
    crossover_for_world(ctx).algorithm(m * n * dtype.size_bytes() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Algorithm::*;

    /// Every decode shape of issue 31 one-shot, the prefill shape two-shot, until measured.
    #[test]
    fn the_default_keeps_decode_one_shot() {
        assert_eq!(DEFAULT.algorithm(256 * 5120 * 2), OneShot);
        assert_eq!(DEFAULT.algorithm(28000 * 7168 * 2), TwoShot);
        assert_ne!(tuning_key("H200 / peer", 8).text(), AllReduceCrossover::tuning_key("H200 / peer", 8).text());
    }
}
