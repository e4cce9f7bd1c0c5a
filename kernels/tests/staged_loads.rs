//! Loads that feed only `dot`s in a loop whose body is more than a K step (flash decoding's
//! online softmax) are copied by `cp.async` into a ring of shared stages where the target has
//! `cp.async` and the kernel asks for two stages or more (`core/src/simt/lower/staged.rs`);
//! the numbers are the conformance suite's (`flash_decode` variant `staged`, every cpu-simt
//! target).

use trident_core::ir::DType;
use trident_kernels::flash_decode::{DecodeShape, FlashDecode};

fn split_stage(stages: u32, target: &str) -> String {
    split_stage_of(stages, target, None)
}

fn split_stage_of(stages: u32, target: &str, page: Option<u32>) -> String {
    let shape = DecodeShape { batch: 1, q_len: 1, heads_q: 8, heads_kv: 1, head_dim: 128, cache_len: 4096 };
    let op = FlashDecode { prefetch: false, stages, ..FlashDecode::for_shape(DType::BF16, &shape) };
    let op = match page {
        Some(p) => op.paged(p),
        None => op,
    };
    let t = trident_core::target::lookup(target).unwrap();
    trident_core::simt::lower(&op.build_split().unwrap(), t).unwrap().to_string()
}

#[test]
fn flash_decodings_keys_and_values_go_to_shared_stages_by_cp_async() {
    for target in ["sm_80", "sm_90a"] {
        let staged = split_stage(3, target);
        assert!(staged.contains("staged.ring") && staged.contains("async.copy"), "{target}");
        // K and V are read in place, Q is staged once before the loop: the only operand
        // staged per step is the probabilities (the second `dot`'s A).
        assert_eq!(staged.matches("shared dot.operands").count(), 1, "{target}");
        let registers = split_stage(1, target);
        assert!(!registers.contains("staged.ring") && !registers.contains("async.copy"), "{target}");
    }
    // A paged cache's copies read the (read-only) block table for the step ahead.
    assert!(split_stage_of(2, "sm_90a", Some(64)).contains("staged.ring"));
    // No `cp.async` on AMD: K and V through registers as before.
    assert!(!split_stage(3, "gfx942").contains("staged.ring"));
}

/// A loop of `acc += x @ y_block` over blocks of 16 rows of `y`, the block's rows at the loop
/// variable (`carried`: at an offset the loop carries instead), and a softmax-like step after
/// the `dot` so that the whole-loop pipeline does not take it.
fn loop_kernel(carried: bool) -> trident_core::Function {
    use trident_core::ir::{InputPrecision, LaunchAttrs};
    let b = trident_core::KernelBuilder::new("staged_probe", LaunchAttrs { warps: 4, ..LaunchAttrs::default() });
    let (x, y, out) = (
        b.arg_ptr_aligned("x", DType::BF16, 16),
        b.arg_ptr_aligned("y", DType::BF16, 16),
        b.arg_ptr("out", DType::F32),
    );
    let n = b.arg("n", DType::I32);
    let (r, c) = (b.arange(0, 16), b.arange(0, 64));
    let xt = b.load_or(x + (r * 16).expand_dims(1) + b.arange(0, 16).expand_dims(0), r.lt(16).expand_dims(1), 0.0);
    let acc0 = b.zeros(&[16, 64], DType::F32);
    let off0 = b.i32(0);
    let res = b.for_range(0, n, 16, &[acc0, off0], |j, v| {
        let base = if carried { v[1] } else { j };
        let rows = base + b.arange(0, 16);
        let yt = b.load_or(y + (rows * 64).expand_dims(1) + c.expand_dims(0), rows.lt(n).expand_dims(1), 0.0);
        let acc = b.dot(xt, yt, v[0], InputPrecision::Ieee);
        let acc = acc - acc.max_along(1).expand_dims(1);
        vec![acc, v[1] + 16]
    });
    b.store(out + (r * 64).expand_dims(1) + c.expand_dims(0), res[0], None);
    b.finish().unwrap()
}

#[test]
fn a_load_whose_address_the_loop_carries_is_not_staged() {
    let t = trident_core::target::lookup("sm_80").unwrap();
    let lowered = |carried| trident_core::simt::lower(&loop_kernel(carried), t).unwrap().to_string();
    assert!(lowered(false).contains("staged.ring"), "the block at the loop variable is staged");
    // Its next step's address is known only once the body has run.
    assert!(!lowered(true).contains("staged.ring"));
}
