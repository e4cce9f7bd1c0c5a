//! `out = x + y`, elementwise.

use crate::host::random;
use crate::reference;
use crate::registry::{Operation, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_kernels::vector_add::VectorAdd;
use trident_kernels::DeviceCtx;

struct VectorAddCase;

impl Operation for VectorAddCase {
    fn name(&self) -> &'static str {
        "vector_add"
    }

    fn distributed(&self) -> bool {
        false
    }

    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        [1, 100, 1024, 4099, 65536].map(|n| vec![n]).to_vec()
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (n, d) = (case.shape[0], case.dtype);
        let (x, y) = (random(n, d, rng), random(n, d, rng));
        WorldData::single(vec![x.clone(), y.clone()], reference::vector_add(&x, &y), 1)
    }

    fn run_device(&self, case: &Case, l: &DeviceCtx, ins: &[Buffer], out: &Buffer) -> Result<(), BackendError> {
        VectorAdd { dtype: case.dtype, block: 256 }.run(l, &ins[0], &ins[1], out, case.shape[0])
    }
}

inventory::submit! { Registered(&VectorAddCase) }
