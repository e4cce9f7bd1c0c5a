//! The low-latency all-to-all over many calls: ten dispatch + combine rounds back to back on
//! the stream (no host synchronisation between them), each with its own routing and tokens,
//! each round's results copied on the stream before the next round overwrites them. A round
//! reading an earlier round's rows, counts or signals shows as a wrong sum or count.

use half::bf16;
use rand::{Rng, SeedableRng};
use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
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

/// One round's buffers on a rank: its inputs uploaded, and where its results are copied.
struct RoundBufs {
    tokens: usize,
    x: Buffer,
    topk: Buffer,
    weights: Buffer,
    out: Buffer,
    /// Per local expert: the count (low latency) or the segment's end (high throughput).
    counts: Buffer,
}

/// Every round's inputs of this rank uploaded, with room for its results.
fn upload_rounds(ctx: &dyn RankCtx, shape: EpShape) -> Result<Vec<RoundBufs>, BackendError> {
    let (h, el) = (shape.hidden, shape.experts / ctx.world_size());
    (0..ROUNDS)
        .map(|c| {
            let (tokens, topk, weights, x) = round(ctx.rank(), c, shape);
            let up = |name: &str, data: Vec<u8>| -> Result<Buffer, BackendError> {
                let b = ctx.alloc(data.len(), name)?;
                ctx.write(&b, 0, &data)?;
                Ok(b)
            };
            Ok(RoundBufs {
                tokens,
                x: up("x", bytes(&x, |v| bf16::from_f32(v).to_le_bytes().to_vec()))?,
                topk: up("topk", bytes(&topk, |v| v.to_le_bytes().to_vec()))?,
                weights: up("weights", bytes(&weights, |v| v.to_le_bytes().to_vec()))?,
                out: ctx.alloc(tokens * h * 2, "out")?,
                counts: ctx.alloc(el * 4, "counts")?,
            })
        })
        .collect()
}

/// A round's results as copied: the combined rows and the per-expert counts (or ends).
type RoundResult = (Vec<f32>, Vec<i32>);

/// Every round's results as copied.
fn read_rounds(ctx: &dyn RankCtx, rounds: &[RoundBufs], shape: EpShape) -> Result<Vec<RoundResult>, BackendError> {
    let (h, el) = (shape.hidden, shape.experts / ctx.world_size());
    rounds
        .iter()
        .map(|rb| {
            let mut o = vec![0u8; rb.tokens * h * 2];
            ctx.read(&rb.out, 0, &mut o)?;
            let mut n = vec![0u8; el * 4];
            ctx.read(&rb.counts, 0, &mut n)?;
            let o = o.chunks(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
            let n = n.chunks(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            Ok((o, n))
        })
        .collect()
}

/// The (token, expert) pairs every rank routed to local expert `l` of rank `r` in round `c`.
fn routed(r: usize, l: usize, c: usize, shape: EpShape, world: usize) -> usize {
    let e = (r * (shape.experts / world) + l) as i32;
    (0..world).map(|s| round(s, c, shape).1.iter().filter(|&&x| x == e).count()).sum()
}

/// Round `c`'s combined rows on rank `r`: each token's row times its weights' sum (the test's
/// experts are the identity), within `tol` relative.
fn check_sums(out: &[f32], r: usize, c: usize, shape: EpShape, tol: f64, what: &str) {
    let (k, h) = (shape.top_k, shape.hidden);
    let (tokens, topk, weights, x) = round(r, c, shape);
    for t in 0..tokens {
        let w: f64 = (0..k).filter(|&j| topk[t * k + j] >= 0).map(|j| weights[t * k + j] as f64).sum();
        for i in 0..h {
            let (want, got) = (w * x[t * h + i] as f64, out[t * h + i] as f64);
            assert!(
                (got - want).abs() <= tol * want.abs().max(1e-3),
                "{what}, rank {r}, round {c}, token {t}, column {i}: {got} where {want}"
            );
        }
    }
}

#[test]
fn ten_rounds_back_to_back_never_read_an_earlier_round() {
    for (world, part) in [(3, Part::Whole), (4, Part::Send)] {
        let shape = EpShape { t_max: 6, hidden: 40, experts: 2 * world, top_k: 3 };
        let run = CpuWorld::run(WorldOptions::new(world, 11), move |ctx| {
            let op = LowLatencyAllToAll::new(DType::BF16);
            let mut bufs = op.buffers(ctx, shape)?;
            let el = shape.experts / world;
            let rounds = upload_rounds(ctx, shape)?;
            ctx.barrier()?;
            // Every round enqueued at once: dispatch, the experts (identity: `recv` is `y`),
            // combine, then its results copied away on the stream.
            let parts = if part == Part::Whole { vec![Part::Whole] } else { vec![Part::Send, Part::Recv] };
            for rb in &rounds {
                for &p in &parts {
                    op.dispatch(ctx, &mut bufs, &rb.x, &rb.topk, rb.tokens, p)?;
                }
                ctx.copy(0, &rb.counts, 0, &bufs.recv_count, 0, el * 4)?;
                let recv = bufs.recv.clone();
                for &p in &parts {
                    op.combine(ctx, &mut bufs, &recv, &rb.topk, &rb.weights, rb.tokens, p)?;
                }
                ctx.copy(0, &rb.out, 0, &bufs.out, 0, rb.tokens * shape.hidden * 2)?;
            }
            ctx.synchronize()?;
            ctx.barrier()?;
            read_rounds(ctx, &rounds, shape)
        })
        .unwrap();
        for (r, got) in run.results.iter().enumerate() {
            for (c, (out, counts)) in got.iter().enumerate() {
                for (l, &n) in counts.iter().enumerate() {
                    assert_eq!(
                        n as usize,
                        routed(r, l, c, shape, world),
                        "world {world}, rank {r}, round {c}, local expert {l}"
                    );
                }
                check_sums(out, r, c, shape, 1e-2, &format!("world {world}"));
            }
        }
    }
}

/// The high-throughput form over the same ten rounds: each round's segment ends (`offs`) and
/// sums, copied on the stream before the next round.
#[test]
fn high_throughput_rounds_back_to_back_never_read_an_earlier_round() {
    use trident_kernels::ep_high_throughput::HighThroughputAllToAll;
    let world = 3;
    let shape = EpShape { t_max: 6, hidden: 40, experts: 2 * world, top_k: 3 };
    let run = CpuWorld::run(WorldOptions::new(world, 12), move |ctx| {
        let op = HighThroughputAllToAll::new(DType::BF16);
        let mut bufs = op.buffers(ctx, shape)?;
        let el = shape.experts / world;
        let rounds = upload_rounds(ctx, shape)?;
        ctx.barrier()?;
        for rb in &rounds {
            op.dispatch(ctx, &mut bufs, &rb.x, &rb.topk, &rb.weights, rb.tokens)?;
            ctx.copy(0, &rb.counts, 0, &bufs.offs, 0, el * 4)?;
            let recv = bufs.recv.clone();
            op.combine(ctx, &mut bufs, &recv, rb.tokens)?;
            ctx.copy(0, &rb.out, 0, &bufs.out, 0, rb.tokens * shape.hidden * 2)?;
        }
        ctx.synchronize()?;
        ctx.barrier()?;
        read_rounds(ctx, &rounds, shape)
    })
    .unwrap();
    for (r, got) in run.results.iter().enumerate() {
        for (c, (out, offs)) in got.iter().enumerate() {
            let mut end = 0;
            for (l, &o) in offs.iter().enumerate() {
                end += routed(r, l, c, shape, world);
                assert_eq!(o as usize, end, "rank {r}, round {c}, local expert {l}");
            }
            // Partial sums per rank are rounded to bf16 before the total.
            check_sums(out, r, c, shape, 2e-2, "high throughput");
        }
    }
}
