//! The rendezvous of a world of processes, with ranks as threads: barriers and all-gathers
//! complete with every rank's data; a rank that dies, a rank that never comes, a rank of another
//! world size or version, and ranks calling different operations each end every rank's wait
//! with a typed error naming what happened, within the bound.

use std::time::{Duration, Instant};
use trident_gpu_runtime::rendezvous::{Client, RendezvousError, Server};

const BOUND: Duration = Duration::from_secs(3);

fn world<T: Send + 'static>(size: usize, rank_fn: impl Fn(usize, String) -> T + Send + Sync + 'static) -> Vec<T> {
    let server = Server::start("127.0.0.1:0", size, "v1").unwrap();
    let addr = server.addr.to_string();
    let f = std::sync::Arc::new(rank_fn);
    let handles: Vec<_> = (0..size)
        .map(|r| {
            let (f, addr) = (f.clone(), addr.clone());
            std::thread::spawn(move || f(r, addr))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn barriers_and_gathers_complete_with_every_ranks_data() {
    let out = world(4, |r, addr| {
        let mut c = Client::connect(&addr, r, 4, "v1", BOUND).unwrap();
        let mut seen = Vec::new();
        for round in 0..3u8 {
            c.barrier("start").unwrap();
            let all = c.all_gather("id", &[r as u8, round, 7][..(1 + r % 3)]).unwrap();
            seen.push(all);
        }
        seen
    });
    for (r, seen) in out.iter().enumerate() {
        for (round, all) in seen.iter().enumerate() {
            let want: Vec<Vec<u8>> = (0..4).map(|q| [q as u8, round as u8, 7][..(1 + q % 3)].to_vec()).collect();
            assert_eq!(all, &want, "rank {r} round {round}");
        }
    }
}

#[test]
fn a_dead_rank_ends_every_other_ranks_wait() {
    let start = Instant::now();
    let out = world(3, |r, addr| {
        let mut c = Client::connect(&addr, r, 3, "v1", BOUND).unwrap();
        c.barrier("one").unwrap();
        if r == 1 {
            drop(c); // the process of rank 1 exits
            return None;
        }
        Some(c.barrier("two").unwrap_err())
    });
    for e in out.into_iter().flatten() {
        assert!(matches!(&e, RendezvousError::Failed { .. }), "{e}");
        assert!(e.to_string().contains("rank 1 died"), "{e}");
    }
    assert!(start.elapsed() < BOUND, "the failure came at once, not at the bound");
}

#[test]
fn a_rank_that_never_comes_is_a_timeout_within_the_bound() {
    let server = Server::start("127.0.0.1:0", 2, "v1").unwrap();
    let bound = Duration::from_millis(300);
    let mut c = Client::connect(&server.addr.to_string(), 0, 2, "v1", bound).unwrap();
    let start = Instant::now();
    let e = c.barrier("alone").unwrap_err();
    assert!(matches!(e, RendezvousError::Timeout { rank: 0, op: "barrier", .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn mismatched_worlds_and_operations_are_reported() {
    let server = Server::start("127.0.0.1:0", 2, "v1").unwrap();
    let e = Client::connect(&server.addr.to_string(), 0, 3, "v1", BOUND).err().unwrap();
    assert!(e.to_string().contains("world size 3") && e.to_string().contains("size 2"), "{e}");
    let server = Server::start("127.0.0.1:0", 2, "v1").unwrap();
    let e = Client::connect(&server.addr.to_string(), 1, 2, "v2", BOUND).err().unwrap();
    assert!(e.to_string().contains("version v2"), "{e}");
    let out = world(2, |r, addr| {
        let mut c = Client::connect(&addr, r, 2, "v1", BOUND).unwrap();
        if r == 0 {
            c.barrier("sync").unwrap_err()
        } else {
            c.all_gather("ids", b"x").unwrap_err()
        }
    });
    for e in out {
        assert!(e.to_string().contains("barrier `sync`") && e.to_string().contains("all_gather `ids`"), "{e}");
    }
}
