//! The rendezvous of a world of processes (one per rank): a small TCP service the launcher runs
//! (`Server`) and every rank connects to (`Client`), for what the ranks must agree on before and
//! between launches: bounded barriers, and all-gathers of a few bytes (NVSHMEM's unique id,
//! versions, heap sizes). The vendor libraries' own host barriers cannot time out; this one can,
//! and it knows who is missing.
//!
//! Guarantees:
//! * Every operation of a rank ends within its bound: done, or a typed error
//!   ([`RendezvousError`]) saying which operation, and which ranks never came (timeout) or which
//!   rank died (its connection closed) and how.
//! * A rank that dies fails every other rank's pending and later operations at once.
//! * Ranks must call the same operations in the same order (SPMD host code): the n-th
//!   operation of every rank is matched, and a rank that calls another operation there is
//!   reported with both names.
//! * World-size and version mismatches between processes fail every rank at start-up.
//!
//! The protocol is lines of text, then raw bytes for gathered data: `HELLO rank size version`,
//! answered `READY` or `ERR message`; `OP seq kind name len` followed by `len` bytes, answered
//! `DONE` followed by each rank's bytes (`len` line, bytes) or `ERR message`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Why a rendezvous operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RendezvousError {
    #[error("rendezvous at {addr}: {message}")]
    Connect { addr: String, message: String },
    #[error("rank {rank}: {op} `{name}` timed out after {after:?}{missing}")]
    Timeout { rank: usize, op: &'static str, name: String, after: Duration, missing: String },
    #[error("rank {rank}: {op} `{name}` failed: {message}")]
    Failed { rank: usize, op: &'static str, name: String, message: String },
}

/// What the server knows of one operation (the n-th of every rank).
struct Pending {
    kind: String,
    name: String,
    data: Vec<Option<Vec<u8>>>,
}

#[derive(Default)]
struct State {
    ops: HashMap<u64, Pending>,
    /// The first failure: every operation still waiting or to come reports it.
    failure: Option<String>,
}

/// The rendezvous service of a world of `size` ranks, on a thread per connection.
pub struct Server {
    pub addr: SocketAddr,
}

impl Server {
    /// Listens on `bind` (`127.0.0.1:0` picks a free port) for the ranks of a world of `size`
    /// running `version`.
    pub fn start(bind: &str, size: usize, version: &str) -> std::io::Result<Server> {
        let listener = TcpListener::bind(bind)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let version = version.to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (shared, version) = (shared.clone(), version.clone());
                std::thread::spawn(move || serve(stream, size, &version, &shared));
            }
        });
        Ok(Server { addr })
    }
}

fn fail(shared: &(Mutex<State>, Condvar), message: String) {
    let mut s = shared.0.lock().unwrap_or_else(|e| e.into_inner());
    s.failure.get_or_insert(message);
    shared.1.notify_all();
}

/// One rank's connection: its hello, then its operations, until it closes.
fn serve(stream: TcpStream, size: usize, version: &str, shared: &(Mutex<State>, Condvar)) {
    let Ok(mut out) = stream.try_clone() else { return };
    let mut input = BufReader::new(stream);
    let mut line = String::new();
    if input.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let parts: Vec<&str> = line.split_whitespace().collect();
    let (Some(&"HELLO"), Some(rank), Some(their_size), Some(their_version)) = (
        parts.first(),
        parts.get(1).and_then(|x| x.parse::<usize>().ok()),
        parts.get(2).and_then(|x| x.parse::<usize>().ok()),
        parts.get(3),
    ) else {
        let _ = writeln!(out, "ERR malformed hello `{}`", line.trim());
        return;
    };
    // Start-up: every rank must agree on the world's size and version.
    if their_size != size || *their_version != version || rank >= size {
        let message = format!(
            "rank {rank} started with world size {their_size} and version {their_version}; the launcher's world has size {size} and version {version}"
        );
        fail(shared, message.clone());
        let _ = writeln!(out, "ERR {message}");
        return;
    }
    let _ = writeln!(out, "READY");
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => {
                fail(shared, format!("rank {rank} died (its connection to the rendezvous closed)"));
                return;
            }
            Ok(_) => {}
        }
        let p: Vec<&str> = line.split_whitespace().collect();
        let (Some(&"OP"), Some(seq), Some(kind), Some(name), Some(len)) = (
            p.first(),
            p.get(1).and_then(|x| x.parse::<u64>().ok()),
            p.get(2),
            p.get(3),
            p.get(4).and_then(|x| x.parse::<usize>().ok()),
        ) else {
            fail(shared, format!("rank {rank} sent a malformed request `{}`", line.trim()));
            return;
        };
        let mut data = vec![0u8; len];
        if input.read_exact(&mut data).is_err() {
            fail(shared, format!("rank {rank} died in the middle of {kind} `{name}`"));
            return;
        }
        let reply = {
            let mut s = shared.0.lock().unwrap_or_else(|e| e.into_inner());
            let entry = s.ops.entry(seq).or_insert_with(|| Pending {
                kind: kind.to_string(),
                name: name.to_string(),
                data: vec![None; size],
            });
            if entry.kind != *kind || entry.name != *name {
                let message = format!(
                    "rank {rank} called {kind} `{name}` where another rank called {} `{}` (operation {seq})",
                    entry.kind, entry.name
                );
                s.failure.get_or_insert(message);
                shared.1.notify_all();
            } else {
                entry.data[rank] = Some(data);
                shared.1.notify_all();
            }
            // An operation every rank reached is done, whatever happened after (a rank may
            // exit as soon as it has its answer).
            loop {
                let op = &s.ops[&seq];
                if op.kind == *kind && op.name == *name && op.data.iter().all(Option::is_some) {
                    break Ok(op.data.iter().map(|d| d.clone().unwrap_or_default()).collect::<Vec<_>>());
                }
                if let Some(f) = &s.failure {
                    break Err(f.clone());
                }
                s = shared.1.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        let ok = match reply {
            Ok(all) => {
                let mut buf = b"DONE\n".to_vec();
                for d in all {
                    buf.extend(format!("{}\n", d.len()).as_bytes());
                    buf.extend(d);
                }
                out.write_all(&buf).is_ok()
            }
            Err(message) => writeln!(out, "ERR {message}").is_ok(),
        };
        if !ok {
            return;
        }
    }
}

/// A rank's connection to the rendezvous.
pub struct Client {
    pub rank: usize,
    pub size: usize,
    input: BufReader<TcpStream>,
    out: TcpStream,
    seq: u64,
    /// How long an operation may wait for the others.
    pub bound: Duration,
}

impl Client {
    /// Connects rank `rank` of a world of `size` running `version`; waits (within `bound`) until
    /// the server accepted the hello.
    pub fn connect(
        addr: &str,
        rank: usize,
        size: usize,
        version: &str,
        bound: Duration,
    ) -> Result<Client, RendezvousError> {
        let err = |message: String| RendezvousError::Connect { addr: addr.to_string(), message };
        let stream = TcpStream::connect(addr).map_err(|e| err(e.to_string()))?;
        stream.set_read_timeout(Some(bound)).map_err(|e| err(e.to_string()))?;
        let out = stream.try_clone().map_err(|e| err(e.to_string()))?;
        let mut c = Client { rank, size, input: BufReader::new(stream), out, seq: 0, bound };
        writeln!(c.out, "HELLO {rank} {size} {version}").map_err(|e| err(e.to_string()))?;
        let mut line = String::new();
        c.input.read_line(&mut line).map_err(|e| err(e.to_string()))?;
        match line.trim() {
            "READY" => Ok(c),
            other => Err(err(other.strip_prefix("ERR ").unwrap_or(other).to_string())),
        }
    }

    /// Waits until every rank reached the barrier `name`.
    pub fn barrier(&mut self, name: &str) -> Result<(), RendezvousError> {
        self.op("barrier", name, &[]).map(|_| ())
    }

    /// Every rank's `data`, by rank.
    pub fn all_gather(&mut self, name: &str, data: &[u8]) -> Result<Vec<Vec<u8>>, RendezvousError> {
        self.op("all_gather", name, data)
    }

    fn op(&mut self, op: &'static str, name: &str, data: &[u8]) -> Result<Vec<Vec<u8>>, RendezvousError> {
        let name = name.replace(char::is_whitespace, "_");
        let (rank, bound) = (self.rank, self.bound);
        let failed = |message: String| RendezvousError::Failed { rank, op, name: name.clone(), message };
        let io = |e: std::io::Error| -> RendezvousError {
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                RendezvousError::Timeout {
                    rank,
                    op,
                    name: name.clone(),
                    after: bound,
                    missing: " (the other ranks did not all arrive)".into(),
                }
            } else {
                failed(format!("the rendezvous connection: {e}"))
            }
        };
        self.seq += 1;
        let mut req = format!("OP {} {op} {name} {}\n", self.seq, data.len()).into_bytes();
        req.extend_from_slice(data);
        self.out.write_all(&req).map_err(io)?;
        let mut line = String::new();
        self.input.read_line(&mut line).map_err(io)?;
        match line.trim_end() {
            "DONE" => {}
            "" => return Err(failed("the rendezvous closed the connection".into())),
            other => return Err(failed(other.strip_prefix("ERR ").unwrap_or(other).to_string())),
        }
        let mut all = Vec::with_capacity(self.size);
        for _ in 0..self.size {
            line.clear();
            self.input.read_line(&mut line).map_err(io)?;
            let len: usize = line.trim().parse().map_err(|_| failed(format!("bad length `{}`", line.trim())))?;
            let mut d = vec![0u8; len];
            self.input.read_exact(&mut d).map_err(io)?;
            all.push(d);
        }
        Ok(all)
    }
}
