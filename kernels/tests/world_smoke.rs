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

/// `CopyLatest` follows the halves: after each of five AllGathers (whose inputs change per
/// call), recorded once and replayed with the gathers, the copy holds that call's result.
#[test]
fn copy_latest_follows_the_halves_through_replays() {
    use trident_kernels::epoch::{state_arg, CopyLatest};
    let run = CpuWorld::run(WorldOptions::new(3, 5), move |ctx| {
        let (chunk, w) = (777, ctx.world_size());
        let src = ctx.alloc(chunk * 4, "src")?;
        let dst = ctx.alloc(w * chunk * 4, "dst")?;
        let mut bufs = GatherBuffers::new(ctx, DType::F32, chunk)?;
        ctx.barrier()?;
        let op = AllGather::new(DType::F32);
        let copy = CopyLatest::new(DType::F32);
        let mut seen = Vec::new();
        let mut recording = None;
        for call in 1..=5u32 {
            let data: Vec<u8> = (0..chunk)
                .flat_map(|i| ((call * 100_000 + ctx.rank() as u32 * 1000 + i as u32) as f32).to_le_bytes())
                .collect();
            ctx.write(&src, 0, &data)?;
            ctx.fill(&dst, &f32::NAN.to_le_bytes())?;
            ctx.barrier()?;
            match &recording {
                None => {
                    let r = trident_core::capture::capture(ctx, |c| {
                        op.enqueue(c, 0, &mut bufs, &src)?;
                        copy.enqueue(c, 0, &bufs.out, state_arg(&bufs.epochs, 0), &dst, w * chunk, w * chunk)
                    })?;
                    r.replay(ctx)?;
                    recording = Some(r);
                }
                Some(r) => r.replay(ctx)?,
            }
            ctx.synchronize()?;
            ctx.barrier()?;
            let mut out = vec![0u8; w * chunk * 4];
            ctx.read(&dst, 0, &mut out)?;
            seen.push(out.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>());
        }
        Ok(seen)
    })
    .unwrap();
    for seen in run.results {
        for (call, out) in seen.iter().enumerate() {
            for (i, v) in out.iter().enumerate() {
                let want = ((call + 1) * 100_000 + (i / 777) * 1000 + i % 777) as f32;
                assert_eq!(*v, want, "call {} element {i}", call + 1);
            }
        }
    }
}
