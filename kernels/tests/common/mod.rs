//! Every kernel specialization the library's tests cover.

use trident_core::ir::{DType, InputPrecision};
use trident_core::Function;
use trident_kernels::{gemm::Gemm, softmax::Softmax, splitk_gemm::SplitKGemm, vector_add::VectorAdd};

pub fn all_kernels() -> Vec<Function> {
    let mut v = Vec::new();
    for d in [DType::F32, DType::BF16, DType::F16] {
        v.push(VectorAdd { dtype: d, block: 256 }.build().unwrap());
        v.push(Softmax::for_cols(d, 781).build().unwrap());
        v.push(Gemm::new(d).build().unwrap());
        v.push(SplitKGemm::new(d, 4).build().unwrap());
    }
    for p in [InputPrecision::Tf32, InputPrecision::Bf16x3] {
        v.push(Gemm::new(DType::F32).with_precision(p).build().unwrap());
    }
    // The distributed kernels (their communication ops print and parse too).
    v.extend(
        trident_kernels::catalogued().into_iter().filter(|c| c.distributed).map(|c| (c.build)(DType::F32).unwrap()),
    );
    v
}
