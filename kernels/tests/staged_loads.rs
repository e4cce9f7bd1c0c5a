//! Loads that feed only `dot`s in a loop whose body is more than a K step (flash decoding's
//! online softmax) are copied by `cp.async` into a ring of shared stages where the target has
//! `cp.async` and the kernel asks for two stages or more (`core/src/simt/lower/staged.rs`);
//! the numbers are the conformance suite's (`flash_decode` variant `staged`, every cpu-simt
//! target).

use trident_core::ir::DType;
use trident_kernels::flash_decode::{DecodeShape, FlashDecode};

fn split_stage(stages: u32, target: &str) -> String {
    let shape = DecodeShape { batch: 1, q_len: 1, heads_q: 8, heads_kv: 1, head_dim: 128, cache_len: 4096 };
    let op = FlashDecode { prefetch: false, stages, ..FlashDecode::for_shape(DType::BF16, &shape) };
    let t = trident_core::target::lookup(target).unwrap();
    trident_core::simt::lower(&op.build_split().unwrap(), t).unwrap().to_string()
}

#[test]
fn flash_decodings_keys_and_values_go_to_shared_stages_by_cp_async() {
    for target in ["sm_80", "sm_90a"] {
        let staged = split_stage(3, target);
        assert!(staged.contains("staged.ring") && staged.contains("async.copy"), "{target}");
        // K and V are read in place: the only operands staged per `dot` are Q and the
        // probabilities (A of each), 16 rows each.
        assert_eq!(staged.matches("shared dot.operands").count(), 2, "{target}");
        let registers = split_stage(1, target);
        assert!(!registers.contains("staged.ring") && !registers.contains("async.copy"), "{target}");
    }
    // No `cp.async` on AMD: K and V through registers as before.
    assert!(!split_stage(3, "gfx942").contains("staged.ring"));
}
