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

/// The tensor-parallel MoE block refuses buffers made by a block of the other reduction (its
/// launches would pass `parts` and `pair_row` to kernels that do not take them, or the other
/// way round), with a typed error before any launch.
#[test]
fn the_tp_moe_block_refuses_buffers_of_the_other_reduction() {
    use trident_kernels::ep_all_to_all::EpShape;
    use trident_kernels::moe_tp::{TpMoeBlock, TpReduce};
    let run = CpuWorld::run(WorldOptions::new(1, 2), move |ctx| {
        let shape = EpShape { t_max: 2, hidden: 8, experts: 2, top_k: 1 };
        let atomics = TpMoeBlock::new(DType::BF16, 128);
        let rows = atomics.reduced_by(TpReduce::Rows);
        let (x, routes) = (ctx.alloc(2 * 8 * 2, "x")?, ctx.alloc(2 * 4, "topk")?);
        let weights = ctx.alloc(2 * 4, "weights")?;
        let (w1, w2) = (ctx.alloc(2 * 2 * 128 * 8 * 2, "w1")?, ctx.alloc(2 * 8 * 128 * 2, "w2")?);
        let mut messages = Vec::new();
        for (made_by, used_by) in [(atomics, rows), (rows, atomics)] {
            let mut bufs = made_by.buffers(ctx, shape)?;
            let e = used_by.enqueue(ctx, &mut bufs, &x, &routes, &weights, (&w1, &w2), 2).unwrap_err();
            messages.push(e.to_string());
        }
        Ok(messages)
    })
    .unwrap();
    for m in &run.results[0] {
        assert!(m.contains("buffers made by a block of the other reduction"), "{m}");
    }
}
