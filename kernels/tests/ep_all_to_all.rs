//! The low-latency all-to-all over many calls: ten dispatch + combine rounds back to back on
//! the stream (no host synchronisation between them), each with its own routing and tokens,
//! each round's results copied on the stream before the next round overwrites them. A round
//! reading an earlier round's rows, counts or signals shows as a wrong sum or count.

use half::bf16;
use rand::{Rng, SeedableRng};
use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_core::ir::DType;
use trident_kernels::ep_all_to_all::{EpShape, LowLatencyAllToAll, Part};

const ROUNDS: usize = 10;

/// Round `c`'s routing and tokens on rank `r`: `(tokens, topk, weights, x)`.
fn round(r: usize, c: usize, shape: EpShape) -> (usize, Vec<i32>, Vec<f32>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64((r * 1000 + c) as u64);
    // Between 1 and t_max tokens, and some rounds with none routed at all.
    let tokens = rng.gen_range(1..=shape.t_max);
    let (k, e, h) = (shape.top_k, shape.experts, shape.hidden);
    let mut topk = Vec::new();
    for _ in 0..tokens {
        let mut pool: Vec<i32> = (0..e as i32).collect();
        for _ in 0..k {
            let pick = pool.swap_remove(rng.gen_range(0..pool.len()));
            topk.push(if c % 4 == 3 || rng.gen_range(0..5) == 0 { -1 } else { pick });
        }
    }
    let weights = (0..tokens * k).map(|_| rng.gen_range(0.0..1.0f32)).collect();
    let x = (0..tokens * h).map(|_| bf16::from_f32(rng.gen_range(-1.0..1.0f32)).to_f32()).collect();
    (tokens, topk, weights, x)
}

fn bytes<T: Copy>(v: &[T], f: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

#[test]
fn ten_rounds_back_to_back_never_read_an_earlier_round() {
    for (world, part) in [(3, Part::Whole), (4, Part::Send)] {
        let shape = EpShape { t_max: 6, hidden: 40, experts: 2 * world, top_k: 3 };
        let run = CpuWorld::run(WorldOptions::new(world, 11), move |ctx| {
            let op = LowLatencyAllToAll::new(DType::BF16);
            let mut bufs = op.buffers(ctx, shape)?;
            let (r, el, h) = (ctx.rank(), shape.experts / world, shape.hidden);
            let mut rounds = Vec::new();
            for c in 0..ROUNDS {
                let (tokens, topk, weights, x) = round(r, c, shape);
                let xb = ctx.alloc(tokens * h * 2, "x")?;
                ctx.write(&xb, 0, &bytes(&x, |v| bf16::from_f32(v).to_le_bytes().to_vec()))?;
                let tb = ctx.alloc(topk.len() * 4, "topk")?;
                ctx.write(&tb, 0, &bytes(&topk, |v| v.to_le_bytes().to_vec()))?;
                let wb = ctx.alloc(weights.len() * 4, "weights")?;
                ctx.write(&wb, 0, &bytes(&weights, |v| v.to_le_bytes().to_vec()))?;
                let out = ctx.alloc(tokens * h * 2, "out")?;
                let counts = ctx.alloc(el * 4, "counts")?;
                rounds.push((tokens, xb, tb, wb, out, counts));
            }
            ctx.barrier()?;
            // Every round enqueued at once: dispatch, the experts (identity: `recv` is `y`),
            // combine, then its results copied away on the stream.
            let parts = if part == Part::Whole { vec![Part::Whole] } else { vec![Part::Send, Part::Recv] };
            for (tokens, xb, tb, wb, out, counts) in &rounds {
                for &p in &parts {
                    op.dispatch(ctx, &mut bufs, xb, tb, *tokens, p)?;
                }
                ctx.copy(0, counts, 0, &bufs.recv_count, 0, el * 4)?;
                let recv = bufs.recv.clone();
                for &p in &parts {
                    op.combine(ctx, &mut bufs, &recv, tb, wb, *tokens, p)?;
                }
                ctx.copy(0, out, 0, &bufs.out, 0, tokens * h * 2)?;
            }
            ctx.synchronize()?;
            ctx.barrier()?;
            let mut got = Vec::new();
            for (tokens, _, _, _, out, counts) in &rounds {
                let mut o = vec![0u8; tokens * h * 2];
                ctx.read(out, 0, &mut o)?;
                let mut n = vec![0u8; el * 4];
                ctx.read(counts, 0, &mut n)?;
                let o: Vec<f32> = o.chunks(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
                let n: Vec<i32> = n.chunks(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                got.push((o, n));
            }
            Ok(got)
        })
        .unwrap();
        let (k, h, el) = (shape.top_k, shape.hidden, shape.experts / world);
        for (r, got) in run.results.iter().enumerate() {
            for (c, (out, counts)) in got.iter().enumerate() {
                // Counts: the pairs every rank routed to this rank's experts in this round.
                for (l, &n) in counts.iter().enumerate() {
                    let want: usize = (0..world)
                        .map(|s| round(s, c, shape).1.iter().filter(|&&e| e == (r * el + l) as i32).count())
                        .sum();
                    assert_eq!(n as usize, want, "world {world}, rank {r}, round {c}, local expert {l}");
                }
                let (tokens, topk, weights, x) = round(r, c, shape);
                for t in 0..tokens {
                    let w: f64 = (0..k).filter(|&j| topk[t * k + j] >= 0).map(|j| weights[t * k + j] as f64).sum();
                    for i in 0..h {
                        let want = w * x[t * h + i] as f64;
                        let got = out[t * h + i] as f64;
                        assert!(
                            (got - want).abs() <= 1e-2 * want.abs().max(1e-3),
                            "world {world}, rank {r}, round {c}, token {t}, column {i}: {got} where {want}"
                        );
                    }
                }
            }
        }
    }
}

/// The high-throughput form over the same ten rounds: each round's segment sizes (from `offs`)
/// and sums, copied on the stream before the next round.
#[test]
fn high_throughput_rounds_back_to_back_never_read_an_earlier_round() {
    use trident_kernels::ep_high_throughput::HighThroughputAllToAll;
    let world = 3;
    let shape = EpShape { t_max: 6, hidden: 40, experts: 2 * world, top_k: 3 };
    let run = CpuWorld::run(WorldOptions::new(world, 12), move |ctx| {
        let op = HighThroughputAllToAll::new(DType::BF16);
        let mut bufs = op.buffers(ctx, shape)?;
        let (r, el, h) = (ctx.rank(), shape.experts / world, shape.hidden);
        let mut rounds = Vec::new();
        for c in 0..ROUNDS {
            let (tokens, topk, weights, x) = round(r, c, shape);
            let xb = ctx.alloc(tokens * h * 2, "x")?;
            ctx.write(&xb, 0, &bytes(&x, |v| bf16::from_f32(v).to_le_bytes().to_vec()))?;
            let tb = ctx.alloc(topk.len() * 4, "topk")?;
            ctx.write(&tb, 0, &bytes(&topk, |v| v.to_le_bytes().to_vec()))?;
            let wb = ctx.alloc(weights.len() * 4, "weights")?;
            ctx.write(&wb, 0, &bytes(&weights, |v| v.to_le_bytes().to_vec()))?;
            rounds.push((tokens, xb, tb, wb, ctx.alloc(tokens * h * 2, "out")?, ctx.alloc(el * 4, "offs")?));
        }
        ctx.barrier()?;
        for (tokens, xb, tb, wb, out, offs) in &rounds {
            op.dispatch(ctx, &mut bufs, xb, tb, wb, *tokens)?;
            ctx.copy(0, offs, 0, &bufs.offs, 0, el * 4)?;
            let recv = bufs.recv.clone();
            op.combine(ctx, &mut bufs, &recv, *tokens)?;
            ctx.copy(0, out, 0, &bufs.out, 0, tokens * h * 2)?;
        }
        ctx.synchronize()?;
        ctx.barrier()?;
        let mut got = Vec::new();
        for (tokens, _, _, _, out, offs) in &rounds {
            let mut o = vec![0u8; tokens * h * 2];
            ctx.read(out, 0, &mut o)?;
            let mut n = vec![0u8; el * 4];
            ctx.read(offs, 0, &mut n)?;
            let o: Vec<f32> = o.chunks(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
            let n: Vec<i32> = n.chunks(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            got.push((o, n));
        }
        Ok(got)
    })
    .unwrap();
    let (k, h, el) = (shape.top_k, shape.hidden, shape.experts / world);
    for (r, got) in run.results.iter().enumerate() {
        for (c, (out, offs)) in got.iter().enumerate() {
            let mut end = 0;
            for (l, &o) in offs.iter().enumerate() {
                end += (0..world)
                    .map(|s| round(s, c, shape).1.iter().filter(|&&e| e == (r * el + l) as i32).count())
                    .sum::<usize>();
                assert_eq!(o as usize, end, "rank {r}, round {c}, local expert {l}");
            }
            let (tokens, topk, weights, x) = round(r, c, shape);
            for t in 0..tokens {
                let w: f64 = (0..k).filter(|&j| topk[t * k + j] >= 0).map(|j| weights[t * k + j] as f64).sum();
                for i in 0..h {
                    let (want, got) = (w * x[t * h + i] as f64, out[t * h + i] as f64);
                    // Partial sums per rank are rounded to bf16 before the total.
                    assert!(
                        (got - want).abs() <= 2e-2 * want.abs().max(1e-3),
                        "rank {r}, round {c}, token {t}: {got} where {want}"
                    );
                }
            }
        }
    }
}
