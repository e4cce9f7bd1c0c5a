use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_core::ir::DType;
use trident_kernels::allgather::{AllGather, GatherBuffers};

#[test]
fn allgather_smoke() {
    // One program per block, and fewer programs than blocks (each loops over its blocks).
    for max_programs in [AllGather::MAX_PROGRAMS, 2] {
        allgather(AllGather { dtype: DType::F32, block: 128, max_programs });
    }
}

fn allgather(op: AllGather) {
    let run = CpuWorld::run(WorldOptions::new(4, 1), move |ctx| {
        let chunk = 300;
        let src = ctx.alloc(chunk * 4, "src")?;
        let data: Vec<u8> = (0..chunk).flat_map(|i| ((ctx.rank() * 1000 + i) as f32).to_le_bytes()).collect();
        ctx.write(&src, 0, &data)?;
        let mut bufs = GatherBuffers::new(ctx, DType::F32, chunk)?;
        ctx.write(&bufs.result(1), 0, &f32::NAN.to_le_bytes().repeat(4 * chunk))?;
        ctx.barrier()?;
        op.run(ctx, &mut bufs, &src)?;
        let mut out = vec![0u8; 4 * chunk * 4];
        ctx.read(&bufs.result(bufs.calls), 0, &mut out)?;
        Ok(out.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>())
    })
    .unwrap();
    for r in run.results {
        for (i, v) in r.iter().enumerate() {
            assert_eq!(*v, ((i / 300) * 1000 + i % 300) as f32);
        }
    }
}
