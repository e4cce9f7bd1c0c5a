//! Row-wise softmax.

use crate::host::random;
use crate::reference;
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_kernels::softmax::Softmax;
use trident_kernels::DeviceCtx;

struct SoftmaxCase;

impl Operation for SoftmaxCase {
    fn name(&self) -> &'static str {
        "softmax"
    }

    fn distributed(&self) -> bool {
        false
    }

    /// Rows, columns.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        [(1, 1), (4, 100), (37, 781), (128, 1024), (3, 4096)].map(|(r, c)| vec![r, c]).to_vec()
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (r, c) = (case.shape[0], case.shape[1]);
        let x: Vec<f64> = random(r * c, case.dtype, rng).iter().map(|v| v * 4.0).collect();
        let expected = reference::softmax(&x, r, c);
        WorldData::single(vec![x], expected, c)
    }

    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        let (r, c) = (case.shape[0], case.shape[1]);
        Softmax::for_cols(case.dtype, c).run(l, &ins[0], out, r, c)
    }
}

inventory::submit! { Registered(&SoftmaxCase) }
