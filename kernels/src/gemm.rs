//! Tiled GEMM: `C = A @ B` with a K loop of `dot`s on `block_m x block_k` and `block_k x block_n`
//! tiles, f32 accumulation, and masks for edges that are not multiples of the tile.
//!
//! A is `[M, K]`, B is `[K, N]`, C is `[M, N]`, all row-major with the given row strides.

use crate::{cdiv, require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, DType, InputPrecision, LaunchAttrs, Literal};
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    pub dtype: DType,
    pub block_m: u32,
    pub block_n: u32,
    pub block_k: u32,
    pub warps: u32,
    pub stages: u32,
    /// How f32 inputs enter `dot` (ignored for f16/bf16, which always multiply exactly).
    pub precision: InputPrecision,
    /// Specialized for arguments divisible by 16 (like Triton's specialization on argument
    /// divisibility): the pointers 16-byte aligned, `k` and the row strides multiples of 16,
    /// declared as parameter facts (checked at launch), so vector copies need no alignment
    /// test. [`Gemm::run`] picks this variant when the arguments allow it.
    pub divisible: bool,
    /// The divisible variant reads A and B through tensor descriptors (`make_desc` /
    /// `desc_load`), which sm_90a copies with TMA. [`Gemm::for_target`] sets it where the
    /// target has TMA; elsewhere descriptor blocks are masked element loads, so the pointer
    /// form (pipelined by `cp.async` or registers) stays the default.
    pub descriptors: bool,
    /// With descriptors on a target with TMA: a producer warp issues the copies while the
    /// `warps` run `wgmma` (`LaunchAttrs::warp_specialize`).
    pub warp_specialize: bool,
    /// One program per multiprocessor walking the tiles (`LaunchAttrs::persistent`): with
    /// descriptors on a target with TMA, the next tile's copies run during this tile's
    /// epilogue.
    pub persistent: bool,
    /// With descriptors: C is written through a descriptor too (`desc_store`: a TMA store from a
    /// swizzled shared copy on sm_90a). On where the target has TMA: it won at every shape of
    /// the H200 sweep (`results/h200-issue11/store-5a9a74b`).
    pub tma_store: bool,
    /// Consumer ping-pong (`LaunchAttrs::pingpong`): two groups of `warps` consumer warps take
    /// the tiles in turn, one group's epilogue under the other's main loop. With the producer
    /// warp and the persistent loop on TMA targets; a tile of one group's `warps` (128 x 128 on
    /// 4 warps).
    pub pingpong: bool,
}

/// Rows of tiles a group of programs walks together (the grouped raster order).
const GROUP_M: i32 = 8;

/// The (row, column) of output tile `t` of a `tiles_m x tiles_n` grid in the grouped raster
/// order (as Triton's tutorial GEMM): consecutive tiles walk `GROUP_M` rows of tiles column by
/// column, so the A rows and B columns that programs running together read are shared in L2.
/// (Row by row, every row of tiles would stream all of B from HBM again: with N = 28672 that
/// doubled the time of AG-GEMM and GEMM-RS on the H200.)
pub fn grouped_tile<'b>(t: Tile<'b>, tiles_m: Tile<'b>, tiles_n: Tile<'b>) -> (Tile<'b>, Tile<'b>) {
    let width = tiles_n * GROUP_M;
    let first_m = (t / width) * GROUP_M;
    let size_m = (tiles_m - first_m).min(GROUP_M);
    (first_m + (t % width) % size_m, (t % width) / size_m)
}

impl Gemm {
    /// A reasonable specialization for `dtype`.
    pub fn new(dtype: DType) -> Gemm {
        Gemm {
            dtype,
            block_m: 64,
            block_n: 64,
            block_k: 32,
            warps: 4,
            stages: 2,
            precision: InputPrecision::Ieee,
            divisible: false,
            descriptors: false,
            warp_specialize: false,
            persistent: false,
            tma_store: false,
            pingpong: false,
        }
    }

    /// The meta-parameters for a GPU target (`None`: the CPU interpreter, [`Gemm::new`]). A
    /// wave-64 target (gfx90a, gfx942) gives each of 4 waves one 32 x 32 MFMA tile of the
    /// 64 x 64 output and pipelines through registers over 2 stages; targets with `cp.async`
    /// groups keep 3 stages in flight.
    pub fn for_target(dtype: DType, target: Option<&trident_core::target::TargetDesc>) -> Gemm {
        let base = Gemm::new(dtype);
        match target {
            Some(t) if t.warp_size == 64 => Gemm { warps: 4, stages: 2, ..base },
            // Two warpgroups of m64n256 on `wgmma`, 4 stages; with TMA persistent, a producer
            // warp filling the next tile's stages during this tile's epilogue, and a TMA store:
            // the fastest of the benchmark's sweep on the H200 at 4096^3, 8192x3584x8192 and
            // 8192^3 (`results/h200-issue11/ws-persistent-*`).
            Some(t) if t.has_wgmma() && matches!(dtype, DType::BF16 | DType::F16) => {
                let tma = t.has_async_copy(trident_core::target::AsyncCopy::Tma);
                Gemm {
                    block_m: 128,
                    block_n: 256,
                    block_k: 64,
                    warps: 8,
                    stages: 4,
                    descriptors: tma,
                    tma_store: tma,
                    warp_specialize: tma,
                    persistent: tma,
                    ..base
                }
            }
            Some(t) if t.has_async_copy(trident_core::target::AsyncCopy::CpAsyncGroups) => Gemm { stages: 3, ..base },
            _ => base,
        }
    }

    /// This GEMM specialized for its arguments: `divisible` when every pointer is 16-byte
    /// aligned and N and K are multiples of 16 (descriptors also need K >= 1: a tensor map has
    /// no empty extent).
    pub fn specialized(self, ptrs: [&Buffer; 3], n: usize, k: usize) -> Gemm {
        let aligned = ptrs.iter().all(|p| p.address.is_multiple_of(16));
        Gemm { divisible: aligned && n.is_multiple_of(16) && k.is_multiple_of(16) && k > 0, ..self }
    }

    /// This GEMM as consumer ping-pong runs it (`Gemm::pingpong`): 128 x 128 x 64 tiles on two
    /// groups of 4 consumer warps over `stages` stages, A and B through descriptors, with the
    /// producer warp and the persistent loop.
    pub fn with_pingpong(self, stages: u32) -> Gemm {
        Gemm {
            block_m: 128,
            block_n: 128,
            block_k: 64,
            warps: 4,
            stages,
            descriptors: true,
            warp_specialize: true,
            persistent: true,
            pingpong: true,
            ..self
        }
    }

    /// The same tiles reading A and B through descriptors where [`Gemm::for_target`] does (TMA
    /// on sm_90a), C as it says, in a plain (not persistent, no producer warp) program per tile:
    /// for the overlap kernels, whose programs wait for signals before their K loop.
    pub fn single_tile(self) -> Gemm {
        Gemm { warp_specialize: false, persistent: false, ..self }
    }

    /// The same tiles with every operand through pointers (no descriptors, no TMA store, no
    /// producer warp, not persistent): for kernels that build on [`Gemm::tile_product`].
    pub fn pointer_operands(self) -> Gemm {
        Gemm { descriptors: false, tma_store: false, warp_specialize: false, persistent: false, ..self }
    }

    /// [`Gemm::for_target`] adjusted to the problem's M where the target runs `wgmma`: narrower
    /// tiles for small M, so that enough programs fill the GPU (the H200 sweeps of
    /// `results/README.md`: 64x128 tiles with a K tile of 128 and 4 stages at M <= 128;
    /// 128x128x128 with 3 stages at M <= 256; from M = 512 the 128x256x64 tile). A K tile of
    /// 128 halves the per-step waits, which bound small-M tiles. At M <= 128 a producer warp
    /// issues the copies: with L2 evicted before each repetition (as the baseline is timed) it
    /// took 0.045 against 0.052 ms (`results/h200-issue11/final-ec8b124`); earlier sweeps,
    /// which reused a warm L2, disagreed from run to run. The tuning cache ([`Gemm::tuned`])
    /// takes whichever the device measured.
    pub fn for_problem(dtype: DType, target: Option<&trident_core::target::TargetDesc>, m: usize) -> Gemm {
        let g = Gemm::for_target(dtype, target);
        if g.block_n != 256 {
            return g;
        }
        // (Small M: one program per tile; see above.)
        let small = Gemm { warp_specialize: false, persistent: false, ..g };
        match m {
            0..=128 => Gemm {
                block_m: 64,
                block_n: 128,
                block_k: 128,
                warps: 4,
                stages: 4,
                warp_specialize: g.descriptors,
                ..small
            },
            129..=256 => Gemm { block_n: 128, block_k: 128, stages: 3, ..small },
            _ => g,
        }
    }

    /// The tuning cache's key of a GEMM of `m x n x k` in `dtype` on `device`.
    pub fn tuning_key(device: &str, dtype: DType, (m, n, k): (usize, usize, usize)) -> crate::tuning::TuningKey {
        crate::tuning::TuningKey { op: "gemm", device: device.to_string(), world: 1, dtype, shape: vec![m, n, k] }
    }

    /// The configuration for this problem on `l`'s device: the one `trident bench` measured
    /// fastest there (the tuning cache, `crate::tuning`), else [`Gemm::for_problem`]'s. Says
    /// on stderr, once per shape, which it took and why.
    pub fn tuned(l: &DeviceCtx, dtype: DType, mnk: (usize, usize, usize)) -> Gemm {
        use crate::tuning::TuningCache;
        use std::sync::Mutex;
        static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
        let cache = TuningCache::shared();
        let base = Gemm::for_problem(dtype, l.gpu_target(), mnk.0);
        let key = Gemm::tuning_key(&l.device.name(), dtype, mnk);
        let (g, why) = match cache.get::<GemmConfig>(&key) {
            Some(t) => (t.config.apply(base), format!("tuned ({:.3} ms when measured, {})", t.ms, cache.path.display())),
            None => (base, "the heuristic (not tuned on this device: `cargo xtask bench` tunes)".to_string()),
        };
        let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
        let text = key.text();
        if !said.contains(&text) {
            eprintln!(
                "trident: {text}: {}x{}x{}/{}w/{}s{}{}{} from {why}",
                g.block_m,
                g.block_n,
                g.block_k,
                g.warps,
                g.stages,
                if g.descriptors { " descriptors" } else { "" },
                if g.warp_specialize { " warp-specialized" } else { "" },
                if g.persistent { " persistent" } else { "" }
            );
            said.push(text);
        }
        g
    }

    pub fn with_precision(self, precision: InputPrecision) -> Gemm {
        Gemm { precision, ..self }
    }

    fn accumulator(&self) -> DType {
        if self.dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// The precision attribute `dot` gets (only f32 inputs have a choice).
    fn dot_precision(&self) -> InputPrecision {
        if self.dtype == DType::F32 {
            self.precision
        } else {
            InputPrecision::Ieee
        }
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let (bm, bn, bk) = (self.block_m, self.block_n, self.block_k);
        let div = match (self.divisible, self.descriptors) {
            (true, true) if self.warp_specialize => "_div16_desc_ws",
            (true, true) => "_div16_desc",
            (true, false) => "_div16",
            _ => "",
        };
        let persistent = match (self.persistent, self.tma_store && self.descriptors && self.divisible) {
            (true, true) => "_persistent_store",
            (true, false) => "_persistent",
            (false, true) => "_store",
            _ => "",
        };
        let pingpong = if self.pingpong { "_pingpong" } else { "" };
        let name = format!("gemm_{}_{bm}x{bn}x{bk}_{}{div}{persistent}{pingpong}", self.dtype, self.dot_precision());
        let warp_specialize = self.warp_specialize && self.descriptors && self.divisible;
        let b = KernelBuilder::new(
            &name,
            LaunchAttrs {
                warps: self.warps,
                stages: self.stages,
                warp_specialize,
                persistent: self.persistent,
                pingpong: self.pingpong && warp_specialize && self.persistent,
                ..LaunchAttrs::default()
            },
        );
        let ptr = |name: &str| {
            if self.divisible {
                b.arg_ptr_aligned(name, self.dtype, 16)
            } else {
                b.arg_ptr(name, self.dtype)
            }
        };
        let int =
            |name: &str| if self.divisible { b.arg_multiple_of(name, DType::I32, 16) } else { b.arg(name, DType::I32) };
        let (a, bp, c) = (ptr("a"), ptr("b"), ptr("c"));
        let (m, n, k) = (b.arg("m", DType::I32), int("n"), int("k"));
        let (sa, sb, sc) = (int("stride_am"), int("stride_bk"), int("stride_cm"));

        let tiles_m = (m + (bm as i32 - 1)) / bm as i32;
        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        let descs = (self.divisible && self.descriptors).then(|| {
            let one = b.constant(Literal::Int(1), DType::I32);
            let dc = b.make_desc(c, [m, n], [sc, one], [bm, bn]);
            (b.make_desc(a, [m, k], [sa, one], [bm, bk]), b.make_desc(bp, [k, n], [sb, one], [bk, bn]), dc)
        });
        // One output tile: grouped raster order (as Triton's tutorial GEMM): programs walk
        // `GROUP_M` rows of tiles column by column, so the A rows and B columns that
        // neighbouring programs read are shared in L2.
        let tile = |t: Tile| {
            let (pid_m, pid_n) = grouped_tile(t, tiles_m, tiles_n);
            let rm = pid_m * bm as i32 + b.arange(0, bm as i64);
            let rn = pid_n * bn as i32 + b.arange(0, bn as i64);
            let (rows, cols) = (rm.expand_dims(1), rn.expand_dims(0));
            match descs {
                Some((da, db, dc)) => {
                    // Blocks through descriptors: zeros outside A and B, so no edge masks in
                    // the loop; the store clips at C's edges (a TMA store on sm_90a).
                    let (row0, col0) = (pid_m * bm as i32, pid_n * bn as i32);
                    let out = self.desc_product(&b, (da, db), (row0, col0), k);
                    if self.tma_store {
                        b.desc_store(dc, [row0, col0], out.cast(self.dtype));
                    } else {
                        let c_ptrs = c + rows * sc + cols;
                        b.store(c_ptrs, out.cast(self.dtype), Some(rows.lt(m) & cols.lt(n)));
                    }
                }
                None => {
                    let acc = self.tile_product(&b, (a, sa), (bp, sb), rows, cols, (m, n, k));
                    let c_ptrs = c + rows * sc + cols;
                    b.store(c_ptrs, acc.cast(self.dtype), Some(rows.lt(m) & cols.lt(n)));
                }
            }
        };
        let pid = b.program_id_x();
        if self.persistent {
            let (tiles, programs) = (tiles_m * tiles_n, b.num_programs(Axis::X));
            b.for_range(pid, tiles, programs, &[], |t, _| {
                tile(t);
                Vec::new()
            });
        } else {
            tile(pid);
        }
        b.finish()
    }

    /// The output tile at (`row0`, `col0`) of `A B` with both read through the descriptors
    /// `da` (`[M, K]`, blocks `block_m x block_k`) and `db` (`[K, N]`, blocks `block_k x
    /// block_n`): zeros outside the tensors, so no edge masks; TMA copies on sm_90a.
    pub fn desc_product<'b>(
        &self,
        b: &'b KernelBuilder,
        (da, db): (Tile<'b>, Tile<'b>),
        (row0, col0): (Tile<'b>, Tile<'b>),
        k: Tile<'b>,
    ) -> Tile<'b> {
        let zero = b.constant(trident_core::ir::Literal::Int(0), DType::I32);
        self.desc_product_over(b, (da, db), (row0, col0), (zero, k))
    }

    /// [`Gemm::desc_product`] over the K range `lo..hi` only (`lo` a multiple of `block_k`; a
    /// slice of a split K).
    pub fn desc_product_over<'b>(
        &self,
        b: &'b KernelBuilder,
        (da, db): (Tile<'b>, Tile<'b>),
        (row0, col0): (Tile<'b>, Tile<'b>),
        (lo, hi): (Tile<'b>, Tile<'b>),
    ) -> Tile<'b> {
        let acc = b.zeros(&[self.block_m, self.block_n], self.accumulator());
        let out = b.for_range(lo, hi, self.block_k as i32, &[acc], |k0, carried: &[Tile]| {
            let (ta, tb) = (b.desc_load(da, [row0, k0]), b.desc_load(db, [k0, col0]));
            vec![b.dot(ta, tb, carried[0], self.dot_precision())]
        });
        out[0]
    }

    /// The accumulator of one output tile: `sum_k a[rows, k] * b[k, cols]` with a K loop of
    /// `block_k` steps, edge masks on every side. `rows` is `[block_m, 1]`, `cols` `[1, block_n]`;
    /// `a` and `b` come with their row strides. Shared by every GEMM-shaped kernel.
    pub fn tile_product<'b>(
        &self,
        b: &'b KernelBuilder,
        (a, sa): (Tile<'b>, Tile<'b>),
        (bp, sb): (Tile<'b>, Tile<'b>),
        rows: Tile<'b>,
        cols: Tile<'b>,
        (m, n, k): (Tile<'b>, Tile<'b>, Tile<'b>),
    ) -> Tile<'b> {
        let (bm, bn, bk) = (self.block_m, self.block_n, self.block_k);
        let rk = b.arange(0, bk as i64);
        let acc = b.zeros(&[bm, bn], self.accumulator());
        // Pointers are recomputed from k0 in every step rather than carried: index math the
        // compiler rematerializes, so no tile of 64-bit addresses stays live across the loop.
        let out = b.for_range(0, k, bk as i32, &[acc], |k0, carried: &[Tile]| {
            let kk = rk + k0;
            let pa = a + rows * sa + kk.expand_dims(0);
            let pb = bp + kk.expand_dims(1) * sb + cols;
            let ta = b.load_or(pa, rows.lt(m) & kk.expand_dims(0).lt(k), 0.0);
            let tb = b.load_or(pb, kk.expand_dims(1).lt(k) & cols.lt(n), 0.0);
            vec![b.dot(ta, tb, carried[0], self.dot_precision())]
        });
        out[0]
    }

    /// Programs for an `m x n` output.
    pub fn grid(&self, m: usize, n: usize) -> [u32; 3] {
        [(cdiv(m, self.block_m as usize) * cdiv(n, self.block_n as usize)).max(1) as u32, 1, 1]
    }

    /// The specialization and arguments of `c[m, n] = a[m, k] @ b[k, n]` (contiguous
    /// row-major), after checking the buffers and extents; `None` when the output is empty.
    fn launch_args(
        &self,
        (a, b, c): (&Buffer, &Buffer, &Buffer),
        (m, n, k): (usize, usize, usize),
    ) -> Result<Option<(Gemm, [KernelArg; 9])>, BackendError> {
        let es = self.dtype.size_bytes() as usize;
        require_bytes(a, m * k * es, "a")?;
        require_bytes(b, k * n * es, "b")?;
        require_bytes(c, m * n * es, "c")?;
        let (m32, n32, k32) = (require_i32(m, "m")?, require_i32(n, "n")?, require_i32(k, "k")?);
        if m == 0 || n == 0 {
            return Ok(None);
        }
        let args = [
            a.arg(),
            b.arg(),
            c.arg(),
            KernelArg::i32(m32),
            KernelArg::i32(n32),
            KernelArg::i32(k32),
            KernelArg::i32(k32),
            KernelArg::i32(n32),
            KernelArg::i32(n32),
        ];
        Ok(Some((self.specialized([a, b, c], n, k), args)))
    }

    /// `c[m, n] = a[m, k] @ b[k, n]` enqueued on `stream` of a rank in a world (as [`Gemm::run`]
    /// on a device): for host code that runs a GEMM beside the communication kernels.
    pub fn enqueue(
        &self,
        ctx: &dyn trident_core::world::RankCtx,
        stream: trident_core::world::StreamId,
        (a, b, c): (&Buffer, &Buffer, &Buffer),
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        let Some((spec, args)) = self.launch_args((a, b, c), (m, n, k))? else { return Ok(()) };
        let kernel = ctx.compile(&format!("{spec:?}"), &|| spec.build())?;
        ctx.launch(stream, &kernel, spec.grid(m, n), &args)
    }

    /// `c[m, n] = a[m, k] @ b[k, n]`, contiguous row-major.
    pub fn run(
        &self,
        l: &DeviceCtx,
        a: &Buffer,
        b: &Buffer,
        c: &Buffer,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        let Some((spec, args)) = self.launch_args((a, b, c), (m, n, k))? else { return Ok(()) };
        let kernel = l.compile(format!("{spec:?}"), || spec.build())?;
        l.launch(&kernel, spec.grid(m, n), &args)
    }
}

/// The GEMM's tunable configuration, as the tuning cache keeps it (`crate::tuning`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GemmConfig {
    pub block_m: u32,
    pub block_n: u32,
    pub block_k: u32,
    pub warps: u32,
    pub stages: u32,
    pub descriptors: bool,
    pub warp_specialize: bool,
    pub persistent: bool,
    #[serde(default)]
    pub tma_store: bool,
    #[serde(default)]
    pub pingpong: bool,
}

impl GemmConfig {
    pub fn of(g: &Gemm) -> GemmConfig {
        GemmConfig {
            block_m: g.block_m,
            block_n: g.block_n,
            block_k: g.block_k,
            warps: g.warps,
            stages: g.stages,
            descriptors: g.descriptors,
            warp_specialize: g.warp_specialize,
            persistent: g.persistent,
            tma_store: g.tma_store,
            pingpong: g.pingpong,
        }
    }

    /// `base` with this configuration.
    pub fn apply(&self, base: Gemm) -> Gemm {
        Gemm {
            block_m: self.block_m,
            block_n: self.block_n,
            block_k: self.block_k,
            warps: self.warps,
            stages: self.stages,
            descriptors: self.descriptors,
            warp_specialize: self.warp_specialize,
            persistent: self.persistent,
            tma_store: self.tma_store,
            pingpong: self.pingpong,
            ..base
        }
    }
}

inventory::submit! {
    crate::Catalogued { name: "gemm", operation: "gemm", distributed: false, build: |d| Gemm::new(d).build() }
}

inventory::submit! {
    crate::GemmBased { name: "gemm", build: |g| g.build() }
}

// The divisible GEMM through tensor descriptors, C included (TMA copies and store on sm_90a).
inventory::submit! {
    crate::Catalogued {
        name: "gemm_desc",
        operation: "gemm",
        distributed: false,
        build: |d| Gemm { divisible: true, descriptors: true, tma_store: true, ..Gemm::new(d) }.build(),
    }
}
