//! The CPU device: host memory plus launches that run programs in a seeded random order.

use crate::interp::{DirectHooks, Program, ProgramCtx};
use crate::memory::{Memory, Writer};
use crate::view::ProgramView;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use trident_core::backend::{check_launch, Artifact, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::ir::Function;

/// Most programs one launch may have (a guard against absurd grids, not a hardware limit).
pub const MAX_PROGRAMS: u64 = 1 << 24;

#[derive(Default)]
pub struct CpuDevice {
    mem: Memory,
}

impl CpuDevice {
    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    fn buffer_error(buffer: &Buffer, e: crate::memory::AccessError) -> BackendError {
        BackendError::Buffer { buffer: buffer.name.clone(), message: e.0 }
    }
}

impl Device for CpuDevice {
    fn backend(&self) -> &'static str {
        crate::NAME
    }

    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let address =
            self.mem.alloc(name, bytes).map_err(|e| BackendError::Buffer { buffer: name.to_string(), message: e.0 })?;
        Ok(Buffer { name: name.to_string(), address, bytes })
    }

    fn free(&self, buffer: &Buffer) -> Result<(), BackendError> {
        self.mem.free(buffer.address).map_err(|e| Self::buffer_error(buffer, e))
    }

    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.mem.write_bytes(buffer.address + offset as u64, data).map_err(|e| Self::buffer_error(buffer, e))
    }

    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.mem.read_bytes(buffer.address + offset as u64, out).map_err(|e| Self::buffer_error(buffer, e))
    }

    fn launch(
        &self,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        opts: &LaunchOptions,
    ) -> Result<(), BackendError> {
        let func = kernel.payload_for::<Function>(crate::NAME)?;
        check_launch(kernel, grid, args, MAX_PROGRAMS)?;
        let grid = launch_grid(kernel, grid);
        let order = program_order(grid, opts.seed);
        let hooks = DirectHooks { mem: &self.mem };
        for pid in order {
            let ctx = ProgramCtx { pid, grid, rank: 0, num_ranks: 1 };
            let view = ProgramView::immediate(Writer::HOST);
            Program::run(func, &self.mem, ctx, args, view, &hooks).map_err(|f| f.into_error(func, pid, 0))?;
        }
        Ok(())
    }
}

/// Programs along x a launch of a persistent kernel runs here, as if the device held three at
/// once (so that every program walks several tiles).
pub const PERSISTENT_PROGRAMS: u32 = 3;

/// The grid a launch of `kernel` runs: a persistent kernel's x capped at
/// [`PERSISTENT_PROGRAMS`] (`LaunchAttrs::persistent`), any other as asked.
pub fn launch_grid(kernel: &trident_core::backend::Artifact, grid: [u32; 3]) -> [u32; 3] {
    if kernel.attrs.persistent {
        [grid[0].min(PERSISTENT_PROGRAMS), grid[1], grid[2]]
    } else {
        grid
    }
}

/// Every program id of a grid in a random order (seeded, replayable): independent launches
/// promise no order, so the CPU backends never use the natural one.
pub fn program_order(grid: [u32; 3], seed: u64) -> Vec<[u32; 3]> {
    let mut order = Vec::with_capacity(grid.iter().map(|&g| g as usize).product());
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                order.push([x, y, z]);
            }
        }
    }
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    order
}
